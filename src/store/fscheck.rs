//! The store's file system, tried once before any work (issue 43): a
//! lease workspace on CIFS drops symlinks and exec bits, and a build found
//! out hours later. [`ensure`] refuses a store on a file system of the
//! CIFS/SMB/FAT family (read from `/proc/self/mountinfo`, proc(5)) and
//! tries, under the store's `tmp/`, what the store relies on: symlinks
//! (GC roots, aliases), hard links (downloads, wheelhouse links, bytecode),
//! exec bits (a script made executable runs, its mode kept) and a rename
//! over an existing file (every atomic write). The verdict is kept in
//! `<root>/fs-check.json`, keyed by the file system's device id, so a
//! store moved to another mount is tried again.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::exit::bad_input;

/// The verdict file's name in the store root.
pub const VERDICT: &str = "fs-check.json";

/// File system types refused outright: they drop symlinks, hard links or
/// exec bits (CIFS/SMB, the FAT family, NTFS through FUSE or ntfs3).
pub const REFUSED_TYPES: &[&str] = &[
    "cifs", "smb3", "smbfs", "vfat", "msdos", "fat", "exfat", "ntfs", "ntfs3", "fuseblk",
];

/// One mount: where, and its type (`fuse.<name>` kept whole).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// The mount point.
    pub point: PathBuf,
    /// The file system type (mountinfo's field after ` - `).
    pub fstype: String,
}

/// The remembered verdict (`<root>/fs-check.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// `st_dev` of the store root when tried.
    pub dev: u64,
    /// The mount it was on.
    pub mount: Option<Mount>,
    /// What was tried, all passed.
    pub tried: Vec<String>,
}

/// Unescapes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount of `path` (absolute, symlinks resolved) in the text of a
/// `/proc/self/mountinfo`: the longest mount point that contains it, the
/// last listed among equals (it is mounted over the others). `None` when
/// no line parses.
pub fn mount_of(mountinfo: &str, path: &Path) -> Option<Mount> {
    let mut best: Option<Mount> = None;
    for line in mountinfo.lines() {
        // id parent major:minor root mountpoint options [optional...] - type source super
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(point) = fields.get(4).map(|p| PathBuf::from(unescape(p))) else {
            continue;
        };
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let Some(fstype) = fields.get(dash + 1) else {
            continue;
        };
        if !path.starts_with(&point) {
            continue;
        }
        let longer = best
            .as_ref()
            .is_none_or(|b| point.as_os_str().len() >= b.point.as_os_str().len());
        if longer {
            best = Some(Mount {
                point,
                fstype: fstype.to_string(),
            });
        }
    }
    best
}

/// Whether a store may not live on `mount`: its type is one of
/// [`REFUSED_TYPES`]. Returns the refusal's reason.
pub fn refused(mount: &Mount) -> Option<String> {
    REFUSED_TYPES.contains(&mount.fstype.as_str()).then(|| {
        format!(
            "{} is mounted as {}, which does not keep symlinks, hard links or exec bits a store needs",
            mount.point.display(),
            mount.fstype
        )
    })
}

/// The nearest existing ancestor of `path` (itself when it exists).
fn existing(path: &Path) -> PathBuf {
    path.ancestors()
        .find(|p| p.exists())
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// The mount of `path` (or of its nearest existing ancestor), read from
/// `/proc/self/mountinfo`; `None` where that cannot be read.
pub fn mount_of_path(path: &Path) -> Option<Mount> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open("/proc/self/mountinfo")
        .ok()?
        .take(16 << 20)
        .read_to_string(&mut text)
        .ok()?;
    mount_of(&text, &existing(path))
}

/// Tries, in a fresh directory under `dir`, a symlink, a hard link, a file
/// made executable (it keeps its mode and runs) and a rename over an
/// existing file. Returns what was tried, or what failed (each with why).
pub fn probe(dir: &Path) -> Result<Vec<String>, Vec<String>> {
    let t = match tempfile::Builder::new().prefix("fs-check-").tempdir_in(dir) {
        Ok(t) => t,
        Err(e) => {
            return Err(vec![format!(
                "creating a directory under {}: {e}",
                dir.display()
            )]);
        }
    };
    let d = t.path();
    let mut failed = Vec::new();
    let file = d.join("file");
    if let Err(e) = std::fs::write(&file, "#!/bin/sh\nexit 0\n") {
        return Err(vec![format!("writing a file: {e}")]);
    }
    let link = d.join("link");
    match std::os::unix::fs::symlink("file", &link).and_then(|()| std::fs::read_link(&link)) {
        Ok(t) if t == Path::new("file") && link.is_file() => {}
        Ok(t) => failed.push(format!(
            "symlinks (a link to `file` reads back as {})",
            t.display()
        )),
        Err(e) => failed.push(format!("symlinks ({e})")),
    }
    let hard = d.join("hard");
    match std::fs::hard_link(&file, &hard).and_then(|()| std::fs::metadata(&file)) {
        Ok(m) if m.nlink() == 2 => {}
        Ok(m) => failed.push(format!(
            "hard links (the file has {} links, not 2)",
            m.nlink()
        )),
        Err(e) => failed.push(format!("hard links ({e})")),
    }
    let exe = d.join("exe");
    let exec = std::fs::write(&exe, "#!/bin/sh\nexit 0\n")
        .and_then(|()| std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o750)))
        .and_then(|()| std::fs::metadata(&exe));
    match exec {
        Ok(m) if m.permissions().mode() & 0o777 == 0o750 => {
            match std::process::Command::new(&exe).status() {
                Ok(s) if s.success() => {}
                Ok(s) => failed.push(format!("exec bits (a script made executable exits {s})")),
                Err(e) => failed.push(format!(
                    "exec bits (a script made executable does not run: {e})"
                )),
            }
        }
        Ok(m) => failed.push(format!(
            "exec bits (mode 0750 set, {:o} kept)",
            m.permissions().mode() & 0o777
        )),
        Err(e) => failed.push(format!("exec bits ({e})")),
    }
    let new = d.join("new");
    let renamed = std::fs::write(&new, "new")
        .and_then(|()| std::fs::rename(&new, &file))
        .and_then(|()| std::fs::read_to_string(&file));
    match renamed {
        Ok(s) if s == "new" => {}
        Ok(_) => failed.push("atomic rename (the file replaced reads its old content)".into()),
        Err(e) => failed.push(format!("atomic rename over an existing file ({e})")),
    }
    if failed.is_empty() {
        Ok(vec![
            "symlinks".into(),
            "hard links".into(),
            "exec bits".into(),
            "atomic rename".into(),
        ])
    } else {
        Err(failed)
    }
}

/// The remembered verdict of the store at `root`, if it is for the file
/// system `root` is on now.
fn remembered(root: &Path) -> Option<Verdict> {
    let dev = std::fs::metadata(root).ok()?.dev();
    let v: Verdict = crate::store::read_json(&root.join(VERDICT)).ok()?;
    (v.dev == dev).then_some(v)
}

/// What is wrong with the file system of the store at `root` (which
/// exists), or `None`; writes nothing but the probe's scratch under
/// `root/tmp` (removed). For `doctor`: the remembered verdict, else the
/// mount type, else the probe when the store is writable.
pub fn problem(root: &Path) -> Option<String> {
    if remembered(root).is_some() {
        return None;
    }
    let mount = mount_of_path(root);
    if let Some(why) = mount.as_ref().and_then(refused) {
        return Some(why);
    }
    let tmp = root.join("tmp");
    if !tmp.is_dir() || super::dir_read_only(&tmp) {
        return None;
    }
    probe(&tmp).err().map(|failed| failure(&mount, &failed))
}

/// The message of a failed probe.
fn failure(mount: &Option<Mount>, failed: &[String]) -> String {
    format!(
        "its file system ({}) fails what a store needs: {}",
        mount.as_ref().map_or_else(
            || "mount unknown".to_string(),
            |m| format!("{} mounted as {}", m.point.display(), m.fstype)
        ),
        failed.join("; ")
    )
}

/// Checks the file system of the store at `root` once per device: a
/// refused mount type, else the [`probe`] under `root/tmp` (created if
/// missing, and removed again with any other directory this made when it
/// fails); a pass is remembered in `root/fs-check.json`. A read-only
/// store is not tried (nothing will be written to it).
///
/// Errors (exit 2, like the other refusals of a store root: the fix is
/// another `--store`): the mount type is refused, or a probe fails;
/// each names the store, the mount point and type, and what failed.
pub fn ensure(root: &Path) -> Result<()> {
    if remembered(root).is_some() || super::dir_read_only(root) {
        return Ok(());
    }
    let mount = mount_of_path(root);
    let refuse = |why: String| {
        bad_input(format!(
            "the store {} cannot be used: {why}; choose a store on a local Linux file system (ext4, xfs, btrfs, tmpfs, NFS) with --store or ORACLE_BUILD_HOME (nothing was written)",
            root.display()
        ))
    };
    if let Some(why) = mount.as_ref().and_then(refused) {
        return Err(refuse(why));
    }
    let first_new = root
        .join("tmp")
        .ancestors()
        .filter(|p| !p.exists())
        .last()
        .map(Path::to_path_buf);
    fs_err::create_dir_all(root.join("tmp"))?;
    match probe(&root.join("tmp")) {
        Ok(tried) => {
            let v = Verdict {
                dev: std::fs::metadata(root)?.dev(),
                mount,
                tried,
            };
            crate::store::write_json(&root.join(VERDICT), &v)?;
            Ok(())
        }
        Err(failed) => {
            if let Some(dir) = first_new {
                let _ = std::fs::remove_dir_all(dir);
            }
            Err(refuse(failure(&mount, &failed)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
40 27 0:50 / /mnt/lease rw,relatime shared:20 - cifs //fs/share rw,vers=3.0
41 40 7:0 / /mnt/lease/usb\\040stick rw,relatime - vfat /dev/loop0 rw
42 27 0:51 / /mnt rw - tmpfs tmpfs rw
";

    #[test]
    fn the_store_s_mount_is_the_longest_mount_point_containing_it_and_cifs_and_fat_are_refused() {
        let m = |p: &str| mount_of(MOUNTINFO, Path::new(p)).unwrap();
        assert_eq!(m("/home/me/store").fstype, "ext4");
        assert_eq!(m("/mnt/lease/work/store").point, Path::new("/mnt/lease"));
        assert_eq!(m("/mnt/lease/work/store").fstype, "cifs");
        // `\040` is a space; a sibling with a common prefix is not inside.
        assert_eq!(m("/mnt/lease/usb stick/s").fstype, "vfat");
        assert_eq!(m("/mnt/leased/s").fstype, "tmpfs");
        let why = refused(&m("/mnt/lease/work/store")).unwrap();
        assert!(why.contains("/mnt/lease is mounted as cifs"), "{why}");
        assert!(
            refused(&m("/mnt/lease/usb stick/s"))
                .unwrap()
                .contains("vfat")
        );
        assert!(refused(&m("/home/me/store")).is_none());
        assert!(refused(&m("/mnt/x")).is_none());
        assert_eq!(mount_of("garbage\n", Path::new("/x")), None);
    }

    #[test]
    fn a_local_store_passes_the_probe_and_the_verdict_is_kept_for_its_device() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("new/store");
        ensure(&root).unwrap();
        let v: Verdict = crate::store::read_json(&root.join(VERDICT)).unwrap();
        assert_eq!(v.tried.len(), 4);
        assert!(remembered(&root).is_some());
        // Another device id (a store moved to another mount): tried again.
        crate::store::write_json(
            &root.join(VERDICT),
            &Verdict {
                dev: v.dev ^ 1,
                ..v
            },
        )
        .unwrap();
        assert!(remembered(&root).is_none());
        ensure(&root).unwrap();
        assert!(remembered(&root).is_some());
        assert_eq!(problem(&root), None);
        // The probe's scratch is gone.
        assert_eq!(std::fs::read_dir(root.join("tmp")).unwrap().count(), 0);
    }
}
