//! The site's configuration checked whole, before any work (issue 42,
//! item 6): both `config.toml` files of a store root (the store root's and
//! the user's, [`crate::host::mirror::config_files`]) read once each and
//! every table of them validated by its own reader — `[[cache]]`
//! ([`crate::cache::config::parse`], which also refuses unknown top-level
//! keys), `[compiler_cache]` ([`crate::cache::compiler::parse`]) and
//! `[[mirror]]` ([`crate::host::mirror::parse`]), `[git]`
//! ([`crate::host::git_timeouts::parse`]) — then the caches merged
//! as a run merges them (`ORACLE_BUILD_CACHE` included).
//!
//! Every command that opens a store runs [`check`] first, so a bad table is
//! reported with exit 2 before a fetch, a lock or a download, whichever
//! stage would read it; `doctor` reports the same message as `bad-config`.

use std::path::Path;

use anyhow::Result;

use crate::exit::bad_input;

/// Every error of the configuration files of the store at `store_root`:
/// for each file that exists, the first error of each of its readers
/// (`[[cache]]`, `[compiler_cache]`, `[[mirror]]`), each naming the file,
/// the line and the field; then the merged caches' error (a bad
/// `ORACLE_BUILD_CACHE`) when the files are good. Empty when all is well.
/// A root that does not exist or is not a directory has no files here (the
/// command names that itself).
///
/// A file that is not a configuration file (a FIFO, a directory, a link to
/// `/dev/zero`, more than [`crate::host::mirror::MAX_CONFIG_FILE`] bytes,
/// not UTF-8) is one problem, naming it
/// ([`crate::host::mirror::read_config`]).
///
/// Errors: a file that exists but cannot be read (exit 1).
pub fn problems(store_root: &Path) -> Result<Vec<String>> {
    let (store_file, user_file) = crate::host::mirror::config_files(store_root);
    let mut out = Vec::new();
    for file in std::iter::once(store_file).chain(user_file) {
        let text = match crate::host::mirror::read_config(&file) {
            Ok(Some(text)) => text,
            Ok(None) => continue,
            Err(e) if crate::exit::code_of(&e) == 2 => {
                out.push(format!("{e:#}"));
                continue;
            }
            Err(e) => return Err(e),
        };
        out.extend(problems_of(&text, &file));
    }
    if out.is_empty()
        && let Err(e) = crate::cache::config::load(store_root, None)
    {
        out.push(format!("{e:#}"));
    }
    Ok(out)
}

/// The errors of configuration text `text` read from `file`, one per
/// reader that refuses it (see [`problems`]). Pure.
pub fn problems_of(text: &str, file: &Path) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut note = |r: Result<()>| {
        if let Err(e) = r {
            let msg = format!("{e:#}");
            // A text that is not TOML is refused alike by every reader.
            if !out.contains(&msg) {
                out.push(msg);
            }
        }
    };
    note(crate::cache::config::parse(text, file).map(drop));
    note(crate::cache::compiler::parse(text, file).map(drop));
    note(crate::host::mirror::parse(text, file).map(drop));
    note(crate::host::git_timeouts::parse(text, file).map(drop));
    out
}

/// Checks the configuration files of the store at `store_root` whole
/// ([`problems`]).
///
/// Errors: exit 2 naming every problem (file, line, field, value), with
/// nothing changed; exit 1 when a file exists but cannot be read.
pub fn check(store_root: &Path) -> Result<()> {
    let problems = problems(store_root)?;
    match problems.as_slice() {
        [] => Ok(()),
        [one] => Err(bad_input(format!("{one}\n(nothing was done)"))),
        many => Err(bad_input(format!(
            "the site configuration has {} errors:\n  - {}\n(nothing was done)",
            many.len(),
            many.join("\n  - ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_of_a_file_is_checked_by_its_reader() {
        let f = Path::new("/s/config.toml");
        assert!(problems_of("", f).is_empty());
        for (text, want) in [
            (
                "[compiler_cache]\nremote = \"redis://127.0.0.1:99999\"\n",
                "/s/config.toml: line 2: field `compiler_cache.remote`",
            ),
            (
                "[compiler_cache]\nremote = \"redis://h\"\nread_only = \"yes\"\n",
                "/s/config.toml: line 3: field `compiler_cache.read_only`",
            ),
            (
                "[[mirror]]\nprefix = \"https://a/\"\nurl = \"file:///x/\"\nfoo = 1\n",
                "/s/config.toml: line 4: field `mirror[0].foo`",
            ),
            (
                "[[mirror]]\nprefix = \"github.com\"\nurl = \"file:///x/\"\n",
                "/s/config.toml: line 2: field `mirror[0].prefix`: value `github.com`",
            ),
            (
                "[git]\nread_timeout = \"soon\"\n",
                "/s/config.toml: line 2: field `git.read_timeout`: value `soon`",
            ),
            ("[mirrors]\n", "/s/config.toml: line 1: "),
            ("not toml = [", "/s/config.toml: line 1"),
        ] {
            let p = problems_of(text, f);
            assert_eq!(p.len(), 1, "{text}: {p:?}");
            assert!(p[0].contains(want), "{text}: {want} not in {p:?}");
        }
        // Two tables wrong: both named.
        let both = "[compiler_cache]\nremote = \"redis://h:0\"\n[[mirror]]\nprefix = \"x\"\nurl = \"none\"\n";
        assert_eq!(problems_of(both, f).len(), 2);
    }
}
