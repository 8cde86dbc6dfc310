//! How long a git network operation may wait (issue 42, item 1;
//! docs/offline.md "Git timeouts"): the `[git]` table of the site's
//! `config.toml`, read from the same two files as `[[cache]]` and
//! `[[mirror]]` ([`crate::host::mirror::config_files`]):
//!
//! ```toml
//! [git]
//! connect_timeout = "30s"   # until the repository's first answer
//! read_timeout = "2m"       # the longest silence after it
//! ```
//!
//! The store root's table wins whole over the user's (as
//! `[compiler_cache]` does); without either, the defaults
//! ([`DEFAULT_CONNECT_TIMEOUT`], [`DEFAULT_READ_TIMEOUT`]). Every fetch,
//! ref listing and submodule update of the source and ext stages, and the
//! pre-build reachability check, runs under these limits
//! (`host::git::Git` for the command line, [`GitTimeouts::apply_to_libgit2`]
//! for libgit2). Timeouts never change what is built, so they are part of
//! no key.
//!
//! Bad tables exit 2 with `<file>: line N: field `git.f`: value `v`: why`,
//! and change nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use serde::Deserialize;

use crate::exit::bad_input;

/// [`GitTimeouts::connect`] when no `[git]` table sets it: a repository
/// that has not answered in 30 s is not going to (GitHub answers a ref
/// listing in about a second).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// [`GitTimeouts::read`] when no `[git]` table sets it: long enough for the
/// silent steps of a large fetch (the server preparing a pack of vLLM's
/// history, git checking the connectivity of what it received).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(120);

/// The limits of git's network operations, and where they were set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitTimeouts {
    /// From the start of the operation until the repository's first answer
    /// (a TCP connect, TLS, an HTTP response, ssh's handshake included).
    pub connect: Duration,
    /// The longest silence after that: no byte from the repository and no
    /// progress of git's own (an idle timeout: a long transfer that keeps
    /// arriving never times out).
    pub read: Duration,
    /// The `config.toml` whose `[git]` table set them; `None`: defaults.
    pub file: Option<PathBuf>,
    /// The file a `[git]` table should go to (the store root's
    /// `config.toml`), for the hint of a timeout's message.
    pub config_file: Option<PathBuf>,
}

impl Default for GitTimeouts {
    fn default() -> GitTimeouts {
        GitTimeouts {
            connect: DEFAULT_CONNECT_TIMEOUT,
            read: DEFAULT_READ_TIMEOUT,
            file: None,
            config_file: None,
        }
    }
}

impl GitTimeouts {
    /// Where to change a limit, for messages: `` `[git] <field>` in <file> ``.
    pub fn hint(&self, field: &str) -> String {
        match self.file.as_ref().or(self.config_file.as_ref()) {
            Some(f) => format!("`[git] {field}` in {}", f.display()),
            None => format!("`[git] {field}` in the store's config.toml"),
        }
    }

    /// Makes libgit2's network operations of this process use these limits
    /// (`GIT_OPT_SET_SERVER_CONNECT_TIMEOUT` and `GIT_OPT_SET_SERVER_TIMEOUT`,
    /// libgit2 1.7 and later: the connect timeout and the timeout of each
    /// read and write on the socket of its HTTP and git transports).
    ///
    /// Errors: libgit2 refuses the value (named).
    pub fn apply_to_libgit2(&self) -> Result<()> {
        let ms = |d: Duration| libc::c_int::try_from(d.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: libgit2's global options; set before the operation that
        // reads them, and the same values for every operation of a run.
        unsafe {
            git2::opts::set_server_connect_timeout_in_milliseconds(ms(self.connect))
                .map_err(|e| anyhow::anyhow!("setting libgit2's connect timeout: {e}"))?;
            git2::opts::set_server_timeout_in_milliseconds(ms(self.read))
                .map_err(|e| anyhow::anyhow!("setting libgit2's read timeout: {e}"))?;
        }
        Ok(())
    }
}

/// `d` as a config value reads: `30s`, `1500ms`.
pub fn show(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The git timeouts of the store at `store_root`: the store root's
/// `config.toml` table, else the user's; the defaults when neither has one.
///
/// Errors: exit 2 for a bad table ([`parse`]) or a file that is not one
/// ([`crate::host::mirror::read_config`]); 1 when a file exists but cannot
/// be read.
pub fn load(store_root: &Path) -> Result<GitTimeouts> {
    let (store_file, user_file) = crate::host::mirror::config_files(store_root);
    for file in std::iter::once(&store_file).chain(user_file.as_ref()) {
        let Some(text) = crate::host::mirror::read_config(file)? else {
            continue;
        };
        if let Some(mut t) = parse(&text, file)? {
            t.config_file = Some(store_file.clone());
            return Ok(t);
        }
    }
    Ok(GitTimeouts {
        config_file: Some(store_file),
        ..GitTimeouts::default()
    })
}

/// A configuration file as this module reads it: only `[git]`.
#[derive(Debug, Deserialize)]
struct RawFile {
    git: Option<RawGit>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGit {
    connect_timeout: Option<toml::Spanned<String>>,
    read_timeout: Option<toml::Spanned<String>>,
}

/// The `[git]` table of configuration text `text` read from `file`
/// (missing fields take the defaults); `None` when it has none.
///
/// Errors: exit 2, `<file>: line N: field `git.f`: value `v`: why`: text
/// that is not TOML, an unknown field, a value that is not a duration from
/// 1 ms to 1 hour ([`crate::config_text::parse_duration`]).
pub fn parse(text: &str, file: &Path) -> Result<Option<GitTimeouts>> {
    let origin = file.display().to_string();
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        bad_input(crate::config_text::message(
            &origin,
            text,
            &e,
            str::to_string,
        ))
    })?;
    let Some(table) = raw.git else {
        return Ok(None);
    };
    let read = |v: Option<toml::Spanned<String>>, field: &str, default: Duration| match v {
        None => Ok(default),
        Some(v) => crate::config_text::parse_duration(v.get_ref()).map_err(|why| {
            bad_input(format!(
                "{origin}: line {}: field `git.{field}`: value `{}`: {why}",
                crate::config_text::line_of(text, v.span().start),
                v.get_ref()
            ))
        }),
    };
    Ok(Some(GitTimeouts {
        connect: read(
            table.connect_timeout,
            "connect_timeout",
            DEFAULT_CONNECT_TIMEOUT,
        )?,
        read: read(table.read_timeout, "read_timeout", DEFAULT_READ_TIMEOUT)?,
        file: Some(file.to_path_buf()),
        config_file: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_git_table_parses_beside_other_tables_and_defaults_fill_it() {
        let f = Path::new("/site/config.toml");
        let t = parse(
            "[[cache]]\nname = \"a\"\nurl = \"file:///x\"\n\n[git]\nconnect_timeout = \"2s\"\nread_timeout = \"1m 30s\"\n",
            f,
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.connect, Duration::from_secs(2));
        assert_eq!(t.read, Duration::from_secs(90));
        assert_eq!(
            t.hint("read_timeout"),
            "`[git] read_timeout` in /site/config.toml"
        );
        let half = parse("[git]\nread_timeout = \"500ms\"\n", f)
            .unwrap()
            .unwrap();
        assert_eq!(half.connect, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(show(half.read), "500ms");
        assert_eq!(show(DEFAULT_READ_TIMEOUT), "120s");
        assert_eq!(
            parse("[[mirror]]\nprefix = \"a\"\nurl = \"b\"\n", f).unwrap(),
            None
        );
    }

    #[test]
    fn bad_tables_name_file_line_field_and_value() {
        let f = Path::new("/site/config.toml");
        for (text, want) in [
            (
                "[git]\nconnect_timeout = \"soon\"\n",
                "/site/config.toml: line 2: field `git.connect_timeout`: value `soon`: is not a duration",
            ),
            (
                "\n[git]\nread_timeout = \"0s\"\n",
                "/site/config.toml: line 3: field `git.read_timeout`: value `0s`: must be from 1ms",
            ),
            ("[git]\ntimeout = \"2s\"\n", "unknown field `timeout`"),
            (
                "[git]\nread_timeout = 2\n",
                "line 2: field `git.read_timeout`",
            ),
        ] {
            let err = parse(text, f).unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.contains(want), "{text}\n=> {msg}");
            assert_eq!(crate::exit::code_of(&err), 2);
        }
    }

    #[test]
    fn the_store_roots_table_wins_whole_over_the_users() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("config.toml"), "[git]\nread_timeout = \"3s\"\n").unwrap();
        let t = load(&root).unwrap();
        assert_eq!(t.read, Duration::from_secs(3));
        assert_eq!(t.connect, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(t.file.as_deref(), Some(root.join("config.toml").as_path()));
        let empty = dir.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let d = load(&empty).unwrap();
        assert_eq!(
            (d.connect, d.read),
            (DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT)
        );
    }
}
