//! Site mirrors (issue 27, docs/cache.md "Mirrors"): the `[[mirror]]`
//! tables of the site's `config.toml` (the same two files as `[[cache]]`,
//! [`config_files`]) and the one function every fetch passes its URL
//! through ([`Mirrors::map`]):
//!
//! ```toml
//! [[mirror]]
//! prefix = "https://github.com/"
//! url = "file:///srv/mirrors/github.com/"   # any URL git or uv reads
//!
//! [[mirror]]
//! prefix = "https://download.pytorch.org/whl/cpu"
//! url = "none"                               # indexes only: dropped
//! ```
//!
//! The longest matching `prefix` wins (the store root's file first on a
//! tie); the rest of the URL is appended to `url`. Git URLs (the recipe's
//! repository, every staged CMake source, submodules) and package indexes
//! (the recipe's and every `--index-url` / `--extra-index-url` line of the
//! tree's requirement files) go through it. The original URL stays in every
//! key and entry name; what was fetched is recorded beside it. An index
//! dropped (`none`) is the exception: the store lock's key holds it
//! (the lock stage's `dropped_indexes`), since without it a resolution
//! picks other packages.
//!
//! Bad tables exit 2 naming the file, the line, the field (`mirror[2].prefix`)
//! and the value, and change nothing.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Deserialize;

use crate::exit::bad_input;

/// The file name of a configuration file (as `cache::config::CONFIG_FILE`).
const CONFIG_FILE: &str = "config.toml";

/// Where a prefix goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Fetch from this URL instead (the rest of the original appended).
    Url(String),
    /// `none`: the URL is dropped (an index); an error for a git URL.
    None,
}

/// One `[[mirror]]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// The start of the URLs it replaces, e.g. `https://github.com/`.
    pub prefix: String,
    /// Where they go.
    pub target: Target,
    /// The `config.toml` it came from.
    pub file: PathBuf,
    /// Its index among that file's `[[mirror]]` tables.
    pub index: usize,
    /// The 1-based line of its `prefix` in that file.
    pub line: usize,
}

impl Mirror {
    /// `<file>: line N: mirror[i] (prefix "p")`, for messages.
    pub fn describe(&self) -> String {
        format!(
            "{}: line {}: mirror[{}] (prefix \"{}\")",
            self.file.display(),
            self.line,
            self.index,
            self.prefix
        )
    }
}

/// What [`Mirrors::map`] made of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapped<'a> {
    /// No `[[mirror]]` matches: the URL as it is.
    Unchanged(String),
    /// A mirror matched: the URL to fetch instead.
    Mirrored(String, &'a Mirror),
    /// A mirror with `url = "none"` matched.
    Dropped(&'a Mirror),
}

impl Mapped<'_> {
    /// The URL to fetch, `None` when dropped.
    pub fn url(&self) -> Option<&str> {
        match self {
            Mapped::Unchanged(u) | Mapped::Mirrored(u, _) => Some(u),
            Mapped::Dropped(_) => None,
        }
    }
}

/// Every `[[mirror]]` of a run, store root's file first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mirrors {
    /// The tables, in file order.
    pub entries: Vec<Mirror>,
    /// The file a new `[[mirror]]` should go to (the store root's `config.toml`).
    pub config_file: Option<PathBuf>,
}

impl Mirrors {
    /// Maps `url`: the longest matching prefix wins (the first on a tie);
    /// the rest of `url` is appended to the mirror's `url`. Pure.
    pub fn map(&self, url: &str) -> Mapped<'_> {
        let mut best: Option<&Mirror> = None;
        for m in &self.entries {
            if url.starts_with(&m.prefix) && best.is_none_or(|b| m.prefix.len() > b.prefix.len()) {
                best = Some(m);
            }
        }
        match best {
            None => Mapped::Unchanged(url.to_string()),
            Some(m) => match &m.target {
                Target::None => Mapped::Dropped(m),
                Target::Url(u) => Mapped::Mirrored(format!("{u}{}", &url[m.prefix.len()..]), m),
            },
        }
    }

    /// Whether some `[[mirror]]` drops what it matches (`url = "none"`).
    pub fn drops_any(&self) -> bool {
        self.entries.iter().any(|m| m.target == Target::None)
    }

    /// The URL git fetches for `url`, named `what` in messages (`the
    /// recipe's repository`, `CMake source cutlass`).
    ///
    /// Errors: exit 2 when the mirror of `url` is `none` (names `what`, the
    /// URL and the `[[mirror]]` entry).
    pub fn git_url(&self, url: &str, what: &str) -> Result<String> {
        match self.map(url) {
            Mapped::Unchanged(u) | Mapped::Mirrored(u, _) => Ok(u),
            Mapped::Dropped(m) => Err(bad_input(format!(
                "{what} {url} is dropped by {} (url = \"none\"); a git source cannot be dropped: give that mirror a URL, or remove it",
                m.describe()
            ))),
        }
    }

    /// Git's `-c url.<to>.insteadOf=<from>` settings for every mirror with a
    /// URL (git-config(1) `url.<base>.insteadOf`, which also picks the
    /// longest match), for the URLs git finds itself (submodules).
    pub fn git_config(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter_map(|m| match &m.target {
                Target::Url(u) => Some(format!("url.{u}.insteadOf={}", m.prefix)),
                Target::None => None,
            })
            .collect()
    }
}

/// The two `config.toml` files of a store root, in the order they are read:
/// `<store root>/config.toml`, then `$XDG_CONFIG_HOME/oracle-build/config.toml`
/// (`$HOME/.config/...` when `XDG_CONFIG_HOME` is unset, empty or relative).
pub fn config_files(store_root: &Path) -> (PathBuf, Option<PathBuf>) {
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".config"))
        });
    (
        store_root.join(CONFIG_FILE),
        xdg.map(|d| d.join("oracle-build").join(CONFIG_FILE)),
    )
}

/// The largest `config.toml` read (1 MiB): a site's tables are a few
/// KiB; a larger file is refused rather than read into memory.
pub const MAX_CONFIG_FILE: u64 = 1 << 20;

/// The text of the configuration file `file` (one of [`config_files`]),
/// the one way every reader of a `config.toml` reads it: a regular file
/// (links followed) of at most [`MAX_CONFIG_FILE`] bytes of UTF-8, opened
/// without blocking ([`crate::regular_file::read`]), so a FIFO, a link to
/// `/dev/zero` or a directory is refused at once. `None` when nothing is
/// there, or a part of its path is not a directory (a store root that is a
/// file: its command says so).
///
/// Errors: exit 2 naming the file and what is wrong (`is a FIFO, not a
/// regular file`, `is larger than 1048576 bytes, the limit`, `is not UTF-8
/// text`); exit 1 when an existing file cannot be read (permissions).
pub fn read_config(file: &Path) -> Result<Option<String>> {
    use crate::regular_file::{self, ReadError};
    let shown = file.display();
    let bytes = match regular_file::read(file, MAX_CONFIG_FILE) {
        Ok(b) => b,
        Err(ReadError::Missing) => return Ok(None),
        Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotADirectory => {
            return Ok(None);
        }
        Err(e @ (ReadError::NotRegular(_) | ReadError::TooLarge(_))) => {
            return Err(bad_input(format!(
                "{shown} {e}; a configuration file is a TOML text file (docs/cache.md)"
            )));
        }
        Err(e) => return Err(anyhow::anyhow!("{shown} {e}")),
    };
    String::from_utf8(bytes).map(Some).map_err(|_| {
        bad_input(format!(
            "{shown} is not UTF-8 text; a configuration file is a TOML text file (docs/cache.md)"
        ))
    })
}

/// The mirrors of the store at `store_root`: the store root's
/// `config.toml` tables, then the user's ([`config_files`]).
///
/// Errors: exit 2 for a bad table ([`parse`]) or a file that is not one
/// ([`read_config`]); 1 when a file exists but cannot be read.
pub fn load(store_root: &Path) -> Result<Mirrors> {
    let (store_file, user_file) = config_files(store_root);
    let mut entries = Vec::new();
    for file in std::iter::once(&store_file).chain(user_file.as_ref()) {
        let Some(text) = read_config(file)? else {
            continue;
        };
        entries.extend(parse(&text, file)?);
    }
    Ok(Mirrors {
        entries,
        config_file: Some(store_file),
    })
}

/// A configuration file as this module reads it: only `[[mirror]]`.
#[derive(Debug, Deserialize)]
struct RawFile {
    #[serde(default)]
    mirror: Vec<RawMirror>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMirror {
    prefix: toml::Spanned<String>,
    url: toml::Spanned<String>,
}

/// The `[[mirror]]` tables of configuration text `text` read from `file`.
///
/// Errors: exit 2, `<file>: line N: field `mirror[i].f`: value `v`: why`:
/// text that is not TOML, an unknown field, a missing `prefix` or `url`, an
/// empty `prefix`, a prefix or URL that is not `scheme://...` (or `url`
/// `none`), whitespace in either, a prefix given twice in the file.
pub fn parse(text: &str, file: &Path) -> Result<Vec<Mirror>> {
    let origin = file.display();
    let line_of = |at: usize| crate::config_text::line_of(text, at);
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        bad_input(crate::config_text::message(
            &origin.to_string(),
            text,
            &e,
            str::to_string,
        ))
    })?;
    let mut out: Vec<Mirror> = Vec::new();
    for (i, rm) in raw.mirror.into_iter().enumerate() {
        let at = |span: std::ops::Range<usize>, field: &str, value: &str, why: &str| {
            bad_input(format!(
                "{origin}: line {}: field `mirror[{i}].{field}`: value `{value}`: {why}",
                line_of(span.start)
            ))
        };
        let prefix = rm.prefix.get_ref();
        if let Err(why) = check_url(prefix) {
            return Err(at(rm.prefix.span(), "prefix", prefix, &why));
        }
        if let Some(first) = out.iter().find(|m| &m.prefix == prefix) {
            return Err(at(
                rm.prefix.span(),
                "prefix",
                prefix,
                &format!("is also the prefix of mirror[{}]", first.index),
            ));
        }
        let url = rm.url.get_ref();
        let target = if url == "none" {
            Target::None
        } else {
            check_url(url).map_err(|why| {
                at(
                    rm.url.span(),
                    "url",
                    url,
                    &format!("{why} (or \"none\" to drop an index)"),
                )
            })?;
            Target::Url(url.clone())
        };
        out.push(Mirror {
            prefix: prefix.clone(),
            target,
            file: file.to_path_buf(),
            index: i,
            line: line_of(rm.prefix.span().start),
        });
    }
    Ok(out)
}

/// Whether `text` is a URL a prefix or a mirror may be: `scheme://rest`,
/// no whitespace.
fn check_url(text: &str) -> std::result::Result<(), String> {
    if text.is_empty() {
        return Err("is empty".into());
    }
    if text.chars().any(char::is_whitespace) {
        return Err("contains whitespace".into());
    }
    let scheme_ok = text.split_once("://").is_some_and(|(s, rest)| {
        !s.is_empty()
            && !rest.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    });
    if !scheme_ok {
        return Err(
            "is not a URL: write scheme://..., e.g. https://github.com/ or file:///srv/mirrors/"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mirrors(text: &str) -> Mirrors {
        Mirrors {
            entries: parse(text, Path::new("/s/config.toml")).unwrap(),
            config_file: None,
        }
    }

    #[test]
    fn longest_prefix_wins_and_the_rest_is_appended() {
        let m = mirrors(
            "[[mirror]]\nprefix = \"https://github.com/\"\nurl = \"file:///srv/gh/\"\n\n[[mirror]]\nprefix = \"https://github.com/org/special\"\nurl = \"https://m.site/special\"\n\n[[mirror]]\nprefix = \"https://download.pytorch.org/whl/cpu\"\nurl = \"none\"\n",
        );
        assert_eq!(
            m.map("https://github.com/vllm-project/vllm.git").url(),
            Some("file:///srv/gh/vllm-project/vllm.git")
        );
        assert_eq!(
            m.map("https://github.com/org/special.git").url(),
            Some("https://m.site/special.git")
        );
        assert_eq!(
            m.map("https://gitlab.com/x").url(),
            Some("https://gitlab.com/x")
        );
        assert!(matches!(
            m.map("https://download.pytorch.org/whl/cpu"),
            Mapped::Dropped(_)
        ));
        let err = m
            .git_url(
                "https://download.pytorch.org/whl/cpu/x.git",
                "CMake source x",
            )
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("/s/config.toml: line 10: mirror[2]"),
            "{err:#}"
        );
        assert_eq!(
            m.git_config()[0],
            "url.file:///srv/gh/.insteadOf=https://github.com/"
        );
    }

    #[test]
    fn bad_tables_name_file_field_and_value() {
        for (text, want) in [
            (
                "[[mirror]]\nprefix = \"github.com\"\nurl = \"file:///x/\"\n",
                "line 2: field `mirror[0].prefix`: value `github.com`",
            ),
            (
                "[[mirror]]\nprefix = \"https://a/\"\nurl = \"file:///x/\"\n[[mirror]]\nprefix = \"https://b/\"\nurl = \"nowhere\"\n",
                "line 6: field `mirror[1].url`: value `nowhere`",
            ),
            (
                "[[mirror]]\nprefix = \"https://a/\"\nurl = \"file:///x/\"\n[[mirror]]\nprefix = \"https://a/\"\nurl = \"none\"\n",
                "field `mirror[1].prefix`: value `https://a/`: is also the prefix of mirror[0]",
            ),
            (
                "[[mirror]]\nprefix = \"https://a/\"\nurl = \"file:///x/\"\nurls = 1\n",
                "unknown field",
            ),
        ] {
            let err = parse(text, Path::new("/s/config.toml")).unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.starts_with("/s/config.toml: "), "{msg}");
            assert!(msg.contains(want), "{want} not in {msg}");
            assert_eq!(crate::exit::code_of(&err), 2, "{msg}");
        }
    }
}
