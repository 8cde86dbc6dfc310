//! The team compiler cache (issue 25, docs/compiler-cache.md): the
//! `[compiler_cache]` table of the site's `config.toml`, read from the same
//! two files as the `[[cache]]` entries ([`crate::cache::config`]):
//!
//! ```toml
//! [compiler_cache]
//! remote = "redis://cache.example:6379"   # or http://..., file:/dir
//! read_only = false                       # true: this box only reads
//! connect_timeout = "100ms"               # ccache's connect-timeout (default 100ms)
//! operation_timeout = "10s"               # ccache's operation-timeout (default 10s)
//! ```
//!
//! The store root's table wins whole over the user's (as a `[[cache]]`
//! entry does); without either, builds use the store's local compiler cache
//! only. The URL may hold a Redis or HTTP password: it stays in the site
//! file and the compilers' environment, and is shown redacted everywhere
//! else ([`RemoteStorage`]'s `Display`). Recipes never name it: the cache
//! changes how long a build takes, never what it builds, so it is not part
//! of any key.
//!
//! Bad tables exit 2 with `<file>: line N: field `compiler_cache.f`: value
//! `v`: why`, and change nothing.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Deserialize;

use crate::cache::config::Sources;
use crate::exit::bad_input;
use crate::host::ccache::{RemoteStorage, redact};

/// The team compiler cache of a store, and the file that configured it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamCache {
    /// ccache's remote storage.
    pub remote: RemoteStorage,
    /// The `config.toml` it came from.
    pub file: PathBuf,
}

/// The team compiler cache configured for the store at `store_root`: the
/// store root's `config.toml` table, else the user's
/// (`$XDG_CONFIG_HOME/oracle-build/config.toml`); `None` when neither has one.
///
/// Errors: exit 2 for a bad table (see [`parse`]) or a file that is not one
/// ([`crate::host::mirror::read_config`]); 1 when a file exists but cannot
/// be read.
pub fn load(store_root: &Path) -> Result<Option<TeamCache>> {
    let sources = Sources::for_run(store_root, None);
    for file in [&sources.store_file, &sources.user_file]
        .into_iter()
        .flatten()
    {
        let Some(text) = crate::host::mirror::read_config(file)? else {
            continue;
        };
        if let Some(team) = parse(&text, file)? {
            return Ok(Some(team));
        }
    }
    Ok(None)
}

/// A configuration file as this module reads it: only `[compiler_cache]`
/// (the `[[cache]]` entries are [`crate::cache::config`]'s).
#[derive(Debug, Deserialize)]
struct RawFile {
    compiler_cache: Option<toml::Spanned<RawCompilerCache>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompilerCache {
    remote: Option<toml::Spanned<String>>,
    #[serde(default)]
    read_only: bool,
    connect_timeout: Option<toml::Spanned<String>>,
    operation_timeout: Option<toml::Spanned<String>>,
}

/// The `[compiler_cache]` table of configuration text `text` read from
/// `file`; `None` when it has none.
///
/// Errors: exit 2, naming the file, the line, the field and the value
/// (a password in it redacted): text that is not TOML, an unknown field, a
/// missing or bad `remote` (see [`RemoteStorage::parse`]), a `read_only`
/// that is not a boolean, a `connect_timeout` or `operation_timeout` that
/// is not a duration from 1 ms to 1 hour, or is given for a `file:` remote.
pub fn parse(text: &str, file: &Path) -> Result<Option<TeamCache>> {
    let origin = file.display();
    let line_of = |at: usize| crate::config_text::line_of(text, at);
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        bad_input(crate::config_text::message(
            &origin.to_string(),
            text,
            &e,
            redact_all,
        ))
    })?;
    let Some(table) = raw.compiler_cache else {
        return Ok(None);
    };
    let table_line = line_of(table.span().start);
    let table = table.into_inner();
    let Some(remote) = table.remote else {
        return Err(bad_input(format!(
            "{origin}: line {table_line}: field `compiler_cache.remote`: missing: name the team cache, e.g. remote = \"redis://cache.example:6379\""
        )));
    };
    let value = remote.get_ref();
    let at_remote = |why: String| {
        bad_input(format!(
            "{origin}: line {}: field `compiler_cache.remote`: value `{}`: {why}",
            line_of(remote.span().start),
            redact(value)
        ))
    };
    let duration = |v: &Option<toml::Spanned<String>>, field: &str| match v {
        None => Ok(None),
        Some(v) => crate::config_text::parse_duration(v.get_ref())
            .map(Some)
            .map_err(|why| {
                bad_input(format!(
                    "{origin}: line {}: field `compiler_cache.{field}`: value `{}`: {why}",
                    line_of(v.span().start),
                    v.get_ref()
                ))
            }),
    };
    let connect = duration(&table.connect_timeout, "connect_timeout")?;
    let operation = duration(&table.operation_timeout, "operation_timeout")?;
    let remote = RemoteStorage::parse(value, table.read_only)
        .and_then(|r| r.with_timeouts(connect, operation))
        .map_err(at_remote)?;
    Ok(Some(TeamCache {
        remote,
        file: file.to_path_buf(),
    }))
}

/// `text` with every `scheme://user:password@` in it redacted (a TOML
/// error message may quote the line it failed on).
fn redact_all(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            if w.contains("://") {
                redact(w)
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_parses_and_a_file_without_one_is_none() {
        let f = Path::new("/site/config.toml");
        let t = parse(
            "[[cache]]\nname = \"a\"\nurl = \"oci://r/a\"\n\n[compiler_cache]\nremote = \"redis://:pw@127.0.0.1:6379\"\nread_only = true\n",
            f,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            t.remote.ccache_value(),
            "redis://:pw@127.0.0.1:6379|read-only"
        );
        assert_eq!(
            t.remote.to_string(),
            "redis://:***@127.0.0.1:6379 (read-only)"
        );
        assert_eq!(t.file, f);
        let plain = parse("[compiler_cache]\nremote = \"file:/srv/cc\"\n", f)
            .unwrap()
            .unwrap();
        assert!(!plain.remote.read_only);
        assert_eq!(
            parse("[[cache]]\nname = \"a\"\nurl = \"oci://r/a\"\n", f).unwrap(),
            None
        );
        assert_eq!(parse("", f).unwrap(), None);
    }

    #[test]
    fn bad_tables_name_file_line_field_and_value_without_the_password() {
        let f = Path::new("/site/config.toml");
        for (text, want) in [
            (
                "\n[compiler_cache]\nremote = \"https://h/x\"\n",
                "/site/config.toml: line 3: field `compiler_cache.remote`: value `https://h/x`: ccache's HTTP backend speaks plain http:// only",
            ),
            (
                "[compiler_cache]\nremote = \"redis://:pw@h:0\"\n",
                "field `compiler_cache.remote`: value `redis://:***@h:0`: port `0`",
            ),
            (
                "[compiler_cache]\nread_only = true\n",
                "line 1: field `compiler_cache.remote`: missing",
            ),
            (
                "[compiler_cache]\nremote = \"redis://h\"\nreadonly = 1\n",
                "unknown field `readonly`",
            ),
            (
                "[compiler_cache]\nremote = \"redis://h\"\nread_only = \"yes\"\n",
                "line 3: ",
            ),
            (
                "[compiler_cache]\nremote = \"redis://h\"\noperation_timeout = \"soon\"\n",
                "line 3: field `compiler_cache.operation_timeout`: value `soon`: is not a duration",
            ),
            (
                "[compiler_cache]\nremote = \"file:/srv/cc\"\nconnect_timeout = \"1s\"\n",
                "field `compiler_cache.remote`: value `file:/srv/cc`: a file: remote has no timeouts",
            ),
        ] {
            let err = parse(text, f).unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.starts_with("/site/config.toml: "), "{msg}");
            assert!(msg.contains(want), "{text}\n=> {msg}");
            assert!(!msg.contains(":pw@"), "{msg}");
            assert_eq!(crate::exit::code_of(&err), 2);
        }
    }

    #[test]
    fn the_store_roots_table_wins_over_the_users() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(
            root.join("config.toml"),
            "[compiler_cache]\nremote = \"redis://team:6379\"\n",
        )
        .unwrap();
        let t = load(&root).unwrap().unwrap();
        assert_eq!(t.remote.ccache_value(), "redis://team:6379");
        assert_eq!(t.file, root.join("config.toml"));
    }
}
