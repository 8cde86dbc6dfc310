//! Reading the key files a `[[cache]]` names (`trusted_signers`,
//! `signing_key`): a regular file of bounded size, never a directory, FIFO
//! or device (`/dev/zero` would never end), and a private key readable by
//! its owner only, as OpenSSH's `ssh` refuses an "UNPROTECTED PRIVATE KEY
//! FILE" (`sshkey_perm_ok` in OpenSSH's `authfile.c`: no group or other bits).

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use anyhow::Result;

use crate::exit::bad_input;

/// The largest key file read (an `allowed_signers` file of a few hundred
/// signers, or one private key, is far smaller).
pub const MAX_KEY_FILE: u64 = 1 << 20;

/// What a key file holds, for the checks its kind needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// `trusted_signers`: an OpenSSH `allowed_signers` file.
    AllowedSigners,
    /// `signing_key`: an OpenSSH private key.
    PrivateKey,
}

/// The text of the key file `path`; `named` says where it was set (the
/// config file, line and field) and leads every error.
///
/// Errors (exit 2, each naming the path and the fix): `path` does not
/// exist, is a directory, is not a regular file (a FIFO, a device), is
/// larger than [`MAX_KEY_FILE`], is not UTF-8; a private key that group or
/// others may read (`chmod 600`), or that holds a public key. Exit 1 when
/// an existing file cannot be read (permissions).
pub fn read(path: &Path, named: &str, kind: KeyKind) -> Result<String> {
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let fix = match kind {
                KeyKind::AllowedSigners => {
                    "write it (one `<principal> ssh-ed25519 <key>` line per trusted builder) or fix the path"
                        .to_string()
                }
                KeyKind::PrivateKey => format!(
                    "make a key (`ssh-keygen -t ed25519 -N '' -f {shown}`) or fix the path"
                ),
            };
            return Err(bad_input(format!("{named}: {shown} does not exist; {fix}")));
        }
        Err(e) => return Err(anyhow::anyhow!("{named}: {shown}: {e}")),
    };
    let ft = meta.file_type();
    if ft.is_dir() {
        return Err(bad_input(format!(
            "{named}: {shown} is a directory; give the path of the key file itself"
        )));
    }
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(bad_input(format!(
            "{named}: {shown} is {what}, not a regular file; give the path of the key file itself"
        )));
    }
    if meta.len() > MAX_KEY_FILE {
        return Err(bad_input(format!(
            "{named}: {shown} is {} bytes; a key file is at most {MAX_KEY_FILE} bytes",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_KEY_FILE + 1).read_to_end(&mut bytes))
        .map_err(|e| anyhow::anyhow!("{named}: reading {shown}: {e}"))?;
    if bytes.len() as u64 > MAX_KEY_FILE {
        return Err(bad_input(format!(
            "{named}: {shown} is more than {MAX_KEY_FILE} bytes; a key file is at most that"
        )));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| bad_input(format!("{named}: {shown} is not a text (UTF-8) key file")))?;
    if kind == KeyKind::PrivateKey {
        let first = text.trim_start();
        if first.starts_with("ssh-") || first.starts_with("ecdsa-") || first.starts_with("sk-") {
            return Err(bad_input(format!(
                "{named}: {shown} holds a public key, not a private key; give the private key file (`ssh-keygen -f` wrote it without `.pub`)"
            )));
        }
        // After what it holds: a public key's mode is no fault to fix.
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(bad_input(format!(
                "{named}: the private key {shown} may be read by other users (mode {mode:04o}); like ssh, oracle-build refuses it: `chmod 600 {shown}`"
            )));
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(path: &Path, kind: KeyKind, want: &str) {
        let e = read(path, "cfg: line 3: field `cache[0].x`", kind).unwrap_err();
        let msg = format!("{e:#}");
        assert_eq!(crate::exit::code_of(&e), 2, "{msg}");
        assert!(
            msg.starts_with("cfg: line 3: field `cache[0].x`: "),
            "{msg}"
        );
        assert!(msg.contains(want), "{want}: {msg}");
    }

    #[test]
    fn hostile_key_files_are_refused_naming_them() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        refused(
            &d.join("none"),
            KeyKind::PrivateKey,
            "does not exist; make a key",
        );
        refused(d, KeyKind::AllowedSigners, "is a directory");
        refused(Path::new("/dev/zero"), KeyKind::PrivateKey, "is a device");
        let fifo = d.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        refused(&fifo, KeyKind::AllowedSigners, "is a FIFO");
        let key = d.join("id");
        std::fs::write(&key, "-----BEGIN OPENSSH PRIVATE KEY-----\n").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        refused(
            &key,
            KeyKind::PrivateKey,
            &format!("`chmod 600 {}`", key.display()),
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read(&key, "x", KeyKind::PrivateKey).is_ok());
        let public = d.join("id.pub");
        std::fs::write(&public, "ssh-ed25519 AAAA me\n").unwrap();
        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o600)).unwrap();
        refused(&public, KeyKind::PrivateKey, "holds a public key");
        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).unwrap();
        // A `.pub` as ssh-keygen left it (0644): named for what it holds,
        // not for its mode.
        refused(&public, KeyKind::PrivateKey, "holds a public key");
        assert!(read(&public, "x", KeyKind::AllowedSigners).is_ok());
    }
}
