//! Per-site cache configuration (issue 13, docs/cache.md): which registries
//! and layouts a box reads and writes, and whom it trusts.
//!
//! Caches are configured per site, never in recipes. Two files may hold
//! `[[cache]]` entries:
//!
//! 1. `<store root>/config.toml` (the store's own file: every user of the
//!    store shares it), and
//! 2. `$XDG_CONFIG_HOME/oracle-build/config.toml` (`~/.config/...` when
//!    `XDG_CONFIG_HOME` is unset or empty): one user's additions.
//!
//! Both are read. Entries are merged by `name`: the store root's entry wins
//! whole (no field-by-field merge), so a user file can add caches but never
//! weaken the trust settings of a cache the store defines. A store's policy
//! binds its caches however their URLs are spelled: a user entry whose `url`
//! names a cache the store's file names ([`CacheUrl::identity`]: the same
//! registry repository after normalising scheme, host case, default port,
//! IP literal forms and this box's names; the same layout directory) is not
//! a cache of its own, whatever its name; its name finds the store's entry,
//! read with the store's URL, `trusted_signers` and `min_signatures` (a
//! higher `min_signatures` of the user's counts; only a `signing_key` the
//! store's entry lacks is taken from it). The order is the store root's
//! entries, then the user's, and that is the order lookups try.
//!
//! For one run, `--cache VALUE` (or, without the flag, `ORACLE_BUILD_CACHE`)
//! replaces the list by one cache: the configured entry whose `name` is
//! VALUE or whose URL names the same cache as VALUE, else an ad-hoc cache
//! at the URL VALUE with the defaults
//! (`push = "manual"`, `substitute = true`, no signers, no key,
//! `min_signatures = 1`).
//!
//! Bad files exit 2 (see [`crate::exit`]) with `<file>: line N: field
//! `cache[i].f`: ...` naming the value, and change nothing.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Deserialize;

use crate::cache::identity::{self, CacheId};
use crate::config_text::line_of;
use crate::exit::bad_input;

/// The file name of a configuration file, in the store root and in
/// `$XDG_CONFIG_HOME/oracle-build/`.
pub const CONFIG_FILE: &str = "config.toml";

/// The environment variable that names one cache for one run (as `--cache`).
pub const CACHE_ENV: &str = "ORACLE_BUILD_CACHE";

/// Where a cache lives and how to talk to it.
///
/// Parsed by [`CacheUrl::parse`]; [`fmt::Display`] gives the canonical
/// spelling back (`oci://host:port/repo`, `oci+http://...`, `file:///dir`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum CacheUrl {
    /// `oci://host[:port]/repo`: an OCI distribution registry over HTTPS.
    Oci {
        /// Host name, IPv4 address or bracketed IPv6 address (`[::1]`).
        host: String,
        /// The port, when one is given.
        port: Option<u16>,
        /// The repository path (`team/oracles`), per the OCI distribution
        /// spec's `<name>` grammar.
        repo: String,
    },
    /// `oci+http://host:port/repo`: a registry over plain HTTP (a test
    /// registry on 127.0.0.1). Content is still checked by digest and
    /// signature; only credentials travel in the clear.
    OciHttp {
        /// Host name or address.
        host: String,
        /// The port, when one is given.
        port: Option<u16>,
        /// The repository path.
        repo: String,
    },
    /// `file:///dir`: an OCI image layout directory (`oci-layout`,
    /// `index.json`, `blobs/sha256/<hex>`), readable by `oras` and `skopeo`.
    File {
        /// The absolute path of the layout directory.
        dir: PathBuf,
    },
}

impl CacheUrl {
    /// Parses `text` as a cache URL, normalised: the scheme and host in
    /// lower case, an IP address in its canonical form (`127.1` and
    /// `[::ffff:127.0.0.1]` are `127.0.0.1`; [`identity::normalise_host`]),
    /// the scheme's default port (443, 80 for `oci+http://`) dropped.
    ///
    /// Errors: the reason in plain words (the caller adds file, field and
    /// value): an unknown scheme, a missing host or repository, a port that
    /// is not a number in 1..=65535, a repository name outside the OCI
    /// distribution grammar (`[a-z0-9]+([._-][a-z0-9]+)*` path components),
    /// a `file://` URL that is not absolute or has a host other than
    /// `localhost`, or `?`, `#` or `%` anywhere (not supported).
    pub fn parse(text: &str) -> std::result::Result<CacheUrl, String> {
        if text.contains(['?', '#', '%']) || text.chars().any(char::is_whitespace) {
            return Err(
                "query strings, fragments, percent-escapes and spaces are not supported in a cache URL"
                    .into(),
            );
        }
        // A scheme is case-insensitive (RFC 3986 section 3.1).
        let lowered;
        let text = match text.split_once("://") {
            Some((scheme, rest)) if scheme.chars().any(|c| c.is_ascii_uppercase()) => {
                lowered = format!("{}://{rest}", scheme.to_ascii_lowercase());
                lowered.as_str()
            }
            _ => text,
        };
        if let Some(rest) = text.strip_prefix("file://") {
            let path = match rest.get(..9) {
                Some(h) if h.eq_ignore_ascii_case("localhost") => &rest[9..],
                _ => rest,
            };
            if !path.starts_with('/') {
                return Err(
                    "a file:// URL needs an absolute path: file:///dir (three slashes)".into(),
                );
            }
            let trimmed = path.trim_end_matches('/');
            let dir = if trimmed.is_empty() { "/" } else { trimmed };
            if Path::new(dir)
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err("a file:// path may not contain `..`".into());
            }
            return Ok(CacheUrl::File {
                dir: PathBuf::from(dir),
            });
        }
        let (plain, rest) = if let Some(r) = text.strip_prefix("oci://") {
            (false, r)
        } else if let Some(r) = text.strip_prefix("oci+http://") {
            (true, r)
        } else {
            return Err(
                "unknown scheme; a cache URL is oci://host/repo, oci+http://host:port/repo or file:///dir"
                    .into(),
            );
        };
        let Some((authority, repo)) = rest.split_once('/') else {
            return Err("no repository: write oci://host/repo".into());
        };
        let repo = repo.trim_end_matches('/');
        let (host, port) = split_authority(authority)?;
        check_repo(repo)?;
        let host = identity::normalise_host(host)?;
        // The scheme's default port is no port: one spelling per cache.
        let default = if plain { 80 } else { 443 };
        let port = port.filter(|&p| p != default);
        let repo = repo.to_string();
        Ok(if plain {
            CacheUrl::OciHttp { host, port, repo }
        } else {
            CacheUrl::Oci { host, port, repo }
        })
    }

    /// Which cache this URL names, however it is spelled
    /// ([`identity`](crate::cache::identity)): what a store's policy binds,
    /// and what `cache ls` prints. A layout's directory is resolved
    /// (symbolic links) when it exists.
    pub fn identity(&self) -> CacheId {
        match self {
            CacheUrl::Oci { host, port, repo } | CacheUrl::OciHttp { host, port, repo } => {
                let default = if matches!(self, CacheUrl::OciHttp { .. }) {
                    80
                } else {
                    443
                };
                CacheId::Registry {
                    host: identity::host_identity(host),
                    port: port.unwrap_or(default),
                    repo: repo.clone(),
                }
            }
            CacheUrl::File { dir } => CacheId::Layout {
                dir: std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone()),
            },
        }
    }

    /// Whether the cache is on this machine's file system (`file://`): the
    /// only kind `--offline` allows.
    pub fn is_local(&self) -> bool {
        matches!(self, CacheUrl::File { .. })
    }
}

impl fmt::Display for CacheUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hp = |host: &str, port: &Option<u16>| match port {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        match self {
            CacheUrl::Oci { host, port, repo } => write!(f, "oci://{}/{repo}", hp(host, port)),
            CacheUrl::OciHttp { host, port, repo } => {
                write!(f, "oci+http://{}/{repo}", hp(host, port))
            }
            CacheUrl::File { dir } => write!(f, "file://{}", dir.display()),
        }
    }
}

/// `host[:port]` -> host and port.
fn split_authority(authority: &str) -> std::result::Result<(&str, Option<u16>), String> {
    if authority.contains('@') {
        return Err(
            "credentials do not belong in the URL; they come from ~/.docker/config.json".into(),
        );
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some(end) = v6.find(']') else {
            return Err("an IPv6 host needs a closing `]`".into());
        };
        let host = &authority[..end + 2];
        let after = &v6[end + 1..];
        match after.strip_prefix(':') {
            Some(p) => (host, Some(p)),
            None if after.is_empty() => (host, None),
            None => return Err(format!("unexpected `{after}` after the IPv6 host")),
        }
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let host_ok = !host.is_empty()
        && (host.starts_with('[')
            || host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'));
    if !host_ok {
        return Err(format!("`{host}` is not a host name or address"));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some(n),
            _ => return Err(format!("port `{p}` is not a number in 1..=65535")),
        },
    };
    Ok((host, port))
}

/// The OCI distribution spec's repository `<name>`: `/`-separated
/// components `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn check_repo(repo: &str) -> std::result::Result<(), String> {
    if repo.is_empty() {
        return Err("no repository: write oci://host/repo".into());
    }
    let component = regex::Regex::new(r"^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*$")
        .map_err(|e| format!("internal: {e}"))?;
    for part in repo.split('/') {
        if !component.is_match(part) {
            return Err(format!(
                "repository component `{part}` is not valid (lower-case letters, digits, and `.`, `_`, `-` between them)"
            ));
        }
    }
    if repo.len() > 255 {
        return Err("the repository name is longer than 255 characters".into());
    }
    Ok(())
}

/// When `push` uploads to a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PushPolicy {
    /// Only `oracle-build push` uploads (the default).
    #[default]
    Manual,
    /// A successful `build` that built the wheel pushes as well, after
    /// the oracle is made (`pipeline::push::auto`); a failed push is
    /// reported, never a build failure.
    Auto,
}

/// Where a cache's settings came from, for messages and `cache ls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A `[[cache]]` entry of this file.
    File(PathBuf),
    /// `--cache` on the command line.
    Flag,
    /// The `ORACLE_BUILD_CACHE` environment variable.
    Env,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::Flag => write!(f, "--cache"),
            Origin::Env => write!(f, "{CACHE_ENV}"),
        }
    }
}

/// One configured cache, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    /// The cache's name (unique in the merged list); an ad-hoc cache is
    /// named by its URL.
    pub name: String,
    /// Where it is.
    pub url: CacheUrl,
    /// When to push to it.
    pub push: PushPolicy,
    /// Whether `build` looks stage keys up in it (default true).
    pub substitute: bool,
    /// An OpenSSH `allowed_signers` file (absolute; a relative path in a
    /// file is taken relative to that file's directory); `None`: no wheel
    /// from this cache is trusted.
    pub trusted_signers: Option<PathBuf>,
    /// An unencrypted ed25519 OpenSSH private key that signs what this box
    /// pushes (absolute, as `trusted_signers`); `None`: pushes of signed
    /// kinds are refused.
    pub signing_key: Option<PathBuf>,
    /// How many distinct trusted signers a wheel needs (>= 1, default 1).
    pub min_signatures: u32,
    /// Connect and idle-read timeouts of every request to it
    /// (`connect_timeout`, `read_timeout`; default 10 s and 30 s).
    pub timeouts: crate::cache::bounds::Timeouts,
    /// Where these settings came from.
    pub origin: Origin,
    /// Where the key paths were set in `origin`, for errors that name the
    /// file, line and field ([`Cache::key_field`]).
    pub key_lines: KeyLines,
}

/// The entry index and the lines of a `[[cache]]` entry's key paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyLines {
    /// The entry's index in its file (`cache[i]`).
    pub index: usize,
    /// The line of `trusted_signers`.
    pub trusted_signers: Option<usize>,
    /// The line of `signing_key`.
    pub signing_key: Option<usize>,
}

impl Cache {
    /// Checks that a `file://` cache's directory exists, for commands that
    /// only read a cache (`cache ls`, `verify`, `gc`): a mistyped path is
    /// not an empty cache. (`push` creates the directory.)
    ///
    /// Errors (exit 2): the directory does not exist, naming the cache, its
    /// URL, where it was configured and the fix.
    pub fn check_exists(&self) -> Result<()> {
        if let CacheUrl::File { dir } = &self.url
            && !dir.exists()
        {
            return Err(bad_input(format!(
                "cache `{}` ({}): {} does not exist, so there is nothing to read; fix the url, or push to it first (`oracle-build push <PIN> --cache {}` creates it)",
                self.name,
                self.origin,
                dir.display(),
                self.url
            )));
        }
        Ok(())
    }

    /// Where the key path `field` (`trusted_signers` or `signing_key`) of
    /// this cache was set: `<file>: line N: field `cache[i].<field>``, or
    /// the cache's name and origin for one not read from a file.
    pub fn key_field(&self, field: &str) -> String {
        let line = match field {
            "trusted_signers" => self.key_lines.trusted_signers,
            "signing_key" => self.key_lines.signing_key,
            _ => None,
        };
        match (&self.origin, line) {
            (Origin::File(f), Some(l)) => format!(
                "{}: line {l}: field `cache[{}].{field}`",
                f.display(),
                self.key_lines.index
            ),
            _ => format!("cache `{}` ({}): field `{field}`", self.name, self.origin),
        }
    }

    /// An ad-hoc cache at `url` with the defaults, from `origin`.
    pub fn ad_hoc(url: CacheUrl, origin: Origin) -> Cache {
        Cache {
            name: url.to_string(),
            url,
            push: PushPolicy::Manual,
            substitute: true,
            trusted_signers: None,
            signing_key: None,
            min_signatures: 1,
            timeouts: Default::default(),
            origin,
            key_lines: KeyLines::default(),
        }
    }
}

/// The caches of one run, in lookup order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheConfig {
    /// The caches, store root's first, then the user's (or the one cache of
    /// `--cache` / `ORACLE_BUILD_CACHE`).
    pub caches: Vec<Cache>,
}

impl CacheConfig {
    /// The caches `build` may substitute from: `substitute = true`, and
    /// with `offline` only `file://` ones.
    pub fn substituters(&self, offline: bool) -> impl Iterator<Item = &Cache> {
        self.caches
            .iter()
            .filter(move |c| c.substitute && (!offline || c.url.is_local()))
    }
}

/// The places [`load_from`] reads.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// `<store root>/config.toml` (read when it exists).
    pub store_file: Option<PathBuf>,
    /// `$XDG_CONFIG_HOME/oracle-build/config.toml` (read when it exists).
    pub user_file: Option<PathBuf>,
    /// `--cache VALUE`, if given.
    pub flag: Option<String>,
    /// `ORACLE_BUILD_CACHE`, if set and not empty.
    pub env: Option<String>,
}

impl Sources {
    /// The sources of a real run: the store root's file, the user's file
    /// under `$XDG_CONFIG_HOME` (else `$HOME/.config`), the flag and the
    /// environment.
    pub fn for_run(store_root: &Path, flag: Option<&str>) -> Sources {
        let (store_file, user_file) = crate::host::mirror::config_files(store_root);
        Sources {
            store_file: Some(store_file),
            user_file,
            flag: flag.map(str::to_string),
            env: std::env::var(CACHE_ENV).ok().filter(|v| !v.is_empty()),
        }
    }
}

/// The caches of a run with store root `store_root` and `--cache` `flag`
/// (see the module docs for the rules); [`load_from`] on
/// [`Sources::for_run`].
///
/// Errors: exit 2 for a bad file or a bad `--cache` / `ORACLE_BUILD_CACHE`
/// value; 1 when a file exists but cannot be read.
pub fn load(store_root: &Path, flag: Option<&str>) -> Result<CacheConfig> {
    load_from(&Sources::for_run(store_root, flag))
}

/// The caches from `sources`: both files merged by name (the store root's
/// entry wins), then narrowed to one cache by the flag or, without it, the
/// environment variable.
///
/// Errors: exit 2 naming file, line, field and value for a file that is not
/// TOML, has unknown keys, a duplicate `name`, a bad `url`, `push`,
/// `min_signatures` (< 1) or an empty path; exit 2 for a flag or variable
/// that is neither a configured name or URL nor a valid URL.
pub fn load_from(sources: &Sources) -> Result<CacheConfig> {
    let mut caches: Vec<Cache> = Vec::new();
    // Names another file gives a URL the store's file already names: they
    // find the store's entry (its policy), never a weaker copy of it.
    let mut aliases: Vec<(String, usize)> = Vec::new();
    let store_file = sources.store_file.as_ref();
    for file in [&sources.store_file, &sources.user_file]
        .into_iter()
        .flatten()
    {
        for cache in read_file(file)? {
            if caches.iter().any(|c| c.name == cache.name) {
                continue;
            }
            let id = cache.url.identity();
            let bound = caches.iter().position(|c| {
                c.url.identity() == id
                    && store_file.is_some_and(|f| c.origin == Origin::File(f.clone()))
            });
            if let Some(i) = bound {
                bind_to_store(&mut caches[i], &cache);
                aliases.push((cache.name.clone(), i));
                continue;
            }
            caches.push(cache);
        }
    }
    let one = match (&sources.flag, &sources.env) {
        (Some(v), _) => Some((v.as_str(), Origin::Flag)),
        (None, Some(v)) => Some((v.as_str(), Origin::Env)),
        (None, None) => None,
    };
    let Some((value, origin)) = one else {
        return Ok(CacheConfig { caches });
    };
    if let Some(c) = caches.iter().find(|c| c.name == value).or_else(|| {
        aliases
            .iter()
            .find(|(n, _)| n == value)
            .map(|(_, i)| &caches[*i])
    }) {
        return Ok(CacheConfig {
            caches: vec![c.clone()],
        });
    }
    let url = CacheUrl::parse(value).map_err(|why| {
        bad_input(format!(
            "{origin}: `{value}` is neither a configured cache name nor a cache URL: {why}"
        ))
    })?;
    let id = url.identity();
    if let Some(c) = caches.iter().find(|c| c.url.identity() == id) {
        return Ok(CacheConfig {
            caches: vec![c.clone()],
        });
    }
    Ok(CacheConfig {
        caches: vec![Cache::ad_hoc(url, origin)],
    })
}

/// `store`, the store file's entry for a cache, given `other`, another
/// file's entry for the same cache however its URL is spelled
/// ([`CacheUrl::identity`]): the store's URL and policy (`trusted_signers`,
/// `substitute`, `push`) stand whatever `other` says, and `min_signatures`
/// is the higher of the two (a user may ask for more signatures, never
/// fewer); only a `signing_key` the store's entry lacks is taken from
/// `other` (signing what this box pushes trusts nothing more).
fn bind_to_store(store: &mut Cache, other: &Cache) {
    if store.signing_key.is_none() {
        store.signing_key = other.signing_key.clone();
    }
    store.min_signatures = store.min_signatures.max(other.min_signatures);
}

/// A configuration file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    cache: Vec<RawCache>,
    /// The team compiler cache: read by `cache/compiler.rs`.
    #[serde(default)]
    #[allow(dead_code)]
    compiler_cache: Option<toml::Table>,
    /// Site mirrors: read by `host/mirror.rs`.
    #[serde(default)]
    #[allow(dead_code)]
    mirror: Option<Vec<toml::Table>>,
    /// Git's network timeouts: read by `host/git_timeouts.rs`.
    #[serde(default)]
    #[allow(dead_code)]
    git: Option<toml::Table>,
}

/// One `[[cache]]` entry as written; values keep their span for messages.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    name: toml::Spanned<String>,
    url: toml::Spanned<String>,
    #[serde(default)]
    push: PushPolicy,
    #[serde(default = "yes")]
    substitute: bool,
    trusted_signers: Option<toml::Spanned<String>>,
    signing_key: Option<toml::Spanned<String>>,
    min_signatures: Option<toml::Spanned<i64>>,
    connect_timeout: Option<toml::Spanned<String>>,
    read_timeout: Option<toml::Spanned<String>>,
}

fn yes() -> bool {
    true
}

/// The validated `[[cache]]` entries of `file`; none when it does not
/// exist (or a part of its path is not a directory). Read by
/// [`crate::host::mirror::read_config`].
fn read_file(file: &Path) -> Result<Vec<Cache>> {
    // A store root that is a file has no configuration (its command says so).
    let Some(text) = crate::host::mirror::read_config(file)? else {
        return Ok(Vec::new());
    };
    parse(&text, file)
}

/// The validated `[[cache]]` entries of configuration text `text` read
/// from `file` (relative paths resolve against `file`'s directory).
///
/// Errors: exit 2, `<file>: line N: field `cache[i].f`: value `v`: why`.
pub fn parse(text: &str, file: &Path) -> Result<Vec<Cache>> {
    let origin = file.display();
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        bad_input(crate::config_text::message(
            &origin.to_string(),
            text,
            &e,
            str::to_string,
        ))
    })?;
    let base = file.parent().unwrap_or(Path::new("."));
    let mut out: Vec<Cache> = Vec::new();
    for (i, rc) in raw.cache.into_iter().enumerate() {
        let at = |span: std::ops::Range<usize>, field: &str, value: &str, why: &str| {
            bad_input(format!(
                "{origin}: line {}: field `cache[{i}].{field}`: value `{value}`: {why}",
                line_of(text, span.start)
            ))
        };
        let name = rc.name.get_ref().trim().to_string();
        if name.is_empty() {
            return Err(at(rc.name.span(), "name", rc.name.get_ref(), "is empty"));
        }
        if let Some(first) = out.iter().position(|c| c.name == name) {
            return Err(at(
                rc.name.span(),
                "name",
                &name,
                &format!("is also the name of cache[{first}]; names must be unique"),
            ));
        }
        let url = CacheUrl::parse(rc.url.get_ref())
            .map_err(|why| at(rc.url.span(), "url", rc.url.get_ref(), &why))?;
        let path = |v: &Option<toml::Spanned<String>>, field: &str| -> Result<Option<PathBuf>> {
            let Some(v) = v else { return Ok(None) };
            if v.get_ref().trim().is_empty() {
                return Err(at(
                    v.span(),
                    field,
                    v.get_ref(),
                    "is empty; remove the key instead",
                ));
            }
            let p = Path::new(v.get_ref());
            Ok(Some(if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }))
        };
        let key_line =
            |v: &Option<toml::Spanned<String>>| v.as_ref().map(|v| line_of(text, v.span().start));
        let trusted_signers = path(&rc.trusted_signers, "trusted_signers")?;
        let signing_key = path(&rc.signing_key, "signing_key")?;
        let min_signatures = match &rc.min_signatures {
            None => 1,
            Some(v) => match u32::try_from(*v.get_ref()) {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(at(
                        v.span(),
                        "min_signatures",
                        &v.get_ref().to_string(),
                        "must be a whole number of at least 1",
                    ));
                }
            },
        };
        let duration = |v: &Option<toml::Spanned<String>>,
                        field: &str,
                        default: std::time::Duration|
         -> Result<std::time::Duration> {
            let Some(v) = v else { return Ok(default) };
            parse_duration(v.get_ref()).map_err(|why| at(v.span(), field, v.get_ref(), &why))
        };
        let timeouts = crate::cache::bounds::Timeouts {
            connect: duration(
                &rc.connect_timeout,
                "connect_timeout",
                crate::cache::bounds::DEFAULT_CONNECT_TIMEOUT,
            )?,
            read: duration(
                &rc.read_timeout,
                "read_timeout",
                crate::cache::bounds::DEFAULT_READ_TIMEOUT,
            )?,
        };
        out.push(Cache {
            name,
            url,
            push: rc.push,
            substitute: rc.substitute,
            trusted_signers,
            signing_key,
            min_signatures,
            timeouts,
            origin: Origin::File(file.to_path_buf()),
            key_lines: KeyLines {
                index: i,
                trusted_signers: key_line(&rc.trusted_signers),
                signing_key: key_line(&rc.signing_key),
            },
        });
    }
    Ok(out)
}

/// A timeout as written in a `[[cache]]` entry: see
/// [`crate::config_text::parse_duration`] (from 1 ms to 1 hour).
///
/// Errors: the reason in plain words (the caller adds file, field and value).
pub fn parse_duration(text: &str) -> std::result::Result<std::time::Duration, String> {
    crate::config_text::parse_duration(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_and_bad_ones_name_file_field_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("config.toml");
        let c = parse(
            "[[cache]]\nname = \"a\"\nurl = \"file:///x\"\nconnect_timeout = \"2s\"\nread_timeout = \"1m 30s\"\n",
            &f,
        )
        .unwrap();
        assert_eq!(c[0].timeouts.connect, std::time::Duration::from_secs(2));
        assert_eq!(c[0].timeouts.read, std::time::Duration::from_secs(90));
        let d = parse("[[cache]]\nname = \"a\"\nurl = \"file:///x\"\n", &f).unwrap();
        assert_eq!(d[0].timeouts, crate::cache::bounds::Timeouts::default());
        for (value, why) in [
            ("soon", "not a duration"),
            ("0s", "from 1ms"),
            ("2h", "to 1h"),
        ] {
            let text = format!(
                "[[cache]]\nname = \"a\"\nurl = \"file:///x\"\nread_timeout = \"{value}\"\n"
            );
            let e = format!("{:#}", parse(&text, &f).unwrap_err());
            assert!(
                e.contains("config.toml: line 4: field `cache[0].read_timeout`")
                    && e.contains(&format!("value `{value}`"))
                    && e.contains(why),
                "{e}"
            );
        }
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn urls_parse_and_print_canonically() {
        let ok = [
            ("oci://ghcr.io/team/oracles", "oci://ghcr.io/team/oracles"),
            (
                "oci://reg.example:5000/a/b-c/d.e/",
                "oci://reg.example:5000/a/b-c/d.e",
            ),
            (
                "oci+http://127.0.0.1:5000/oracles",
                "oci+http://127.0.0.1:5000/oracles",
            ),
            ("oci://[::1]:5000/x", "oci://[::1]:5000/x"),
            ("file:///mnt/usb/cache/", "file:///mnt/usb/cache"),
            ("file://localhost/srv/c", "file:///srv/c"),
            // Normalised: scheme and host case, default ports, IP forms.
            ("OCI://Reg.Example:443/x", "oci://reg.example/x"),
            ("oci+http://h:80/x", "oci+http://h/x"),
            ("oci://reg.example.:5000/x", "oci://reg.example:5000/x"),
            ("oci+http://127.1:5000/x", "oci+http://127.0.0.1:5000/x"),
            (
                "oci+http://[::ffff:127.0.0.1]:5000/x",
                "oci+http://127.0.0.1:5000/x",
            ),
            ("oci://[0:0::1]/x", "oci://[::1]/x"),
            ("File://LOCALHOST/srv/c", "file:///srv/c"),
        ];
        for (text, canon) in ok {
            let url = CacheUrl::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(url.to_string(), canon);
            assert_eq!(CacheUrl::parse(canon).unwrap(), url);
        }
        assert!(matches!(
            CacheUrl::parse("oci+http://127.0.0.1:5000/o").unwrap(),
            CacheUrl::OciHttp {
                port: Some(5000),
                ..
            }
        ));
        assert!(CacheUrl::parse("file:///x").unwrap().is_local());
        assert!(!CacheUrl::parse("oci://h/x").unwrap().is_local());
        let bad = [
            ("http://h/x", "unknown scheme"),
            ("oci://host", "no repository"),
            ("oci://host/", "no repository"),
            ("oci://host/Team", "is not valid"),
            ("oci://host/a//b", "is not valid"),
            ("oci://host:0/x", "port `0`"),
            ("oci://host:99999/x", "port `99999`"),
            ("oci://u:p@host/x", "credentials"),
            ("oci://ho st/x", "spaces"),
            ("file://rel/dir", "absolute path"),
            ("file:///a/../b", "`..`"),
            ("oci://h/x?y", "query"),
            ("oci://[zz::1]/x", "not a host name or address"),
            ("oci://256.1.1.1/x", "not a host name or address"),
        ];
        for (text, want) in bad {
            let err = CacheUrl::parse(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn a_file_parses_with_defaults_and_relative_paths() {
        let dir = tempfile::tempdir().unwrap();
        let f = write(
            dir.path(),
            "config.toml",
            "[[cache]]\nname = \"team\"\nurl = \"oci://reg/team\"\ntrusted_signers = \"allowed_signers\"\nsigning_key = \"/k/id\"\nmin_signatures = 2\npush = \"auto\"\n\n[[cache]]\nname = \"usb\"\nurl = \"file:///mnt/usb\"\nsubstitute = false\n",
        );
        let caches = parse(&std::fs::read_to_string(&f).unwrap(), &f).unwrap();
        assert_eq!(caches.len(), 2);
        assert_eq!(caches[0].push, PushPolicy::Auto);
        assert_eq!(caches[0].min_signatures, 2);
        assert_eq!(
            caches[0].trusted_signers.as_deref(),
            Some(dir.path().join("allowed_signers").as_path())
        );
        assert_eq!(caches[0].signing_key.as_deref(), Some(Path::new("/k/id")));
        assert!(caches[0].substitute);
        assert_eq!(caches[1].push, PushPolicy::Manual);
        assert!(!caches[1].substitute);
        assert_eq!(caches[1].min_signatures, 1);
        assert_eq!(caches[1].trusted_signers, None);
        let config = CacheConfig { caches };
        assert_eq!(config.substituters(false).count(), 1);
        assert_eq!(config.substituters(true).count(), 0);
    }

    #[test]
    fn bad_files_name_file_line_field_and_value() {
        let f = Path::new("/site/config.toml");
        let head = "[[cache]]\nname = \"a\"\nurl = \"oci://r/a\"\n";
        let cases = [
            (
                format!("{head}min_signatures = 0\n"),
                "line 4: field `cache[0].min_signatures`: value `0`: must be a whole number of at least 1",
            ),
            (format!("{head}min_signatures = -3\n"), "value `-3`"),
            (
                "[[cache]]\nname = \"a\"\nurl = \"https://r/a\"\n".to_string(),
                "line 3: field `cache[0].url`: value `https://r/a`: unknown scheme",
            ),
            (format!("{head}push = \"always\"\n"), "line 4: "),
            (format!("{head}colour = 1\n"), "unknown field `colour`"),
            (
                format!("{head}[[cache]]\nname = \"a\"\nurl = \"file:///x\"\n"),
                "line 5: field `cache[1].name`: value `a`: is also the name of cache[0]",
            ),
            (
                format!("{head}signing_key = \"\"\n"),
                "field `cache[0].signing_key`: value ``: is empty",
            ),
            (
                "[[cache]]\nurl = \"oci://r/a\"\n".to_string(),
                "missing field `name`",
            ),
            ("[cache\n".to_string(), "line 1: "),
            ("[other]\n".to_string(), "unknown field `other`"),
        ];
        for (text, want) in cases {
            let err = parse(&text, f).unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.starts_with("/site/config.toml: "), "{msg}");
            assert!(msg.contains(want), "{text}\n=> {msg}");
            assert_eq!(crate::exit::code_of(&err), 2);
        }
        let push = parse(&format!("{head}push = \"always\"\n"), f).unwrap_err();
        assert!(format!("{push:#}").contains("always"), "{push:#}");
    }

    #[test]
    fn a_store_url_keeps_the_store_policy_under_any_other_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = write(
            dir.path(),
            "store/config.toml",
            "[[cache]]\nname = \"team\"\nurl = \"oci://reg/team\"\nmin_signatures = 2\n",
        );
        let user = write(
            dir.path(),
            "xdg/oracle-build/config.toml",
            "[[cache]]\nname = \"quick\"\nurl = \"oci://reg/team/\"\nmin_signatures = 1\nsigning_key = \"k\"\n",
        );
        let mut sources = Sources {
            store_file: Some(store.clone()),
            user_file: Some(user),
            flag: None,
            env: None,
        };
        let c = load_from(&sources).unwrap();
        assert_eq!(c.caches.len(), 1, "{c:?}");
        assert_eq!(c.caches[0].name, "team");
        assert_eq!(c.caches[0].min_signatures, 2);
        assert_eq!(c.caches[0].origin, Origin::File(store.clone()));
        // The user's key signs what this box pushes; it trusts nothing more.
        assert!(c.caches[0].signing_key.is_some());
        // The user's name finds the store's entry, with the store's policy.
        sources.flag = Some("quick".into());
        let c = load_from(&sources).unwrap();
        assert_eq!(
            (c.caches[0].name.as_str(), c.caches[0].min_signatures),
            ("team", 2)
        );
    }

    #[test]
    fn a_store_registry_binds_every_spelling_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = write(
            dir.path(),
            "store/config.toml",
            "[[cache]]\nname = \"team\"\nurl = \"oci+http://127.0.0.1:5000/team\"\nmin_signatures = 2\ntrusted_signers = \"/etc/team_signers\"\n",
        );
        let spellings = [
            "oci+http://localhost:5000/team",
            "OCI+HTTP://LocalHost.:5000/team/",
            "oci+http://127.1:5000/team",
            "oci+http://2130706433:5000/team",
            "oci+http://127.0.0.2:5000/team",
            "oci+http://[::ffff:127.0.0.1]:5000/team",
            "oci+http://[::1]:5000/team",
            "oci+http://ip6-localhost:5000/team",
            "oci+http://registry.localhost:5000/team",
            // Another scheme on the same port is the same registry.
            "oci://localhost:5000/team",
        ];
        for (i, url) in spellings.iter().enumerate() {
            let user = write(
                dir.path(),
                &format!("xdg{i}/oracle-build/config.toml"),
                &format!(
                    "[[cache]]\nname = \"quick\"\nurl = \"{url}\"\nmin_signatures = 1\ntrusted_signers = \"/home/me/mine\"\n"
                ),
            );
            let mut sources = Sources {
                store_file: Some(store.clone()),
                user_file: Some(user),
                flag: None,
                env: None,
            };
            let c = load_from(&sources).unwrap();
            assert_eq!(c.caches.len(), 1, "{url}: {c:?}");
            let team = &c.caches[0];
            assert_eq!(
                (
                    team.name.as_str(),
                    team.min_signatures,
                    team.trusted_signers.as_deref(),
                    team.url.to_string().as_str()
                ),
                (
                    "team",
                    2,
                    Some(Path::new("/etc/team_signers")),
                    "oci+http://127.0.0.1:5000/team"
                ),
                "{url}"
            );
            assert_eq!(
                team.url.identity().to_string(),
                "registry localhost:5000/team"
            );
            // By the user's name or by the spelling: the store's entry.
            for flag in ["quick", url] {
                sources.flag = Some(flag.to_string());
                let c = load_from(&sources).unwrap();
                assert_eq!(
                    (c.caches[0].name.as_str(), c.caches[0].min_signatures),
                    ("team", 2),
                    "--cache {flag}"
                );
            }
        }
        // Another port, another repository or another host is another cache.
        for url in [
            "oci+http://localhost:5001/team",
            "oci+http://localhost:5000/team2",
            "oci+http://10.0.0.1:5000/team",
            "oci+http://localhost/team",
        ] {
            let user = write(
                dir.path(),
                "other/oracle-build/config.toml",
                &format!("[[cache]]\nname = \"mine\"\nurl = \"{url}\"\n"),
            );
            let c = load_from(&Sources {
                store_file: Some(store.clone()),
                user_file: Some(user),
                flag: None,
                env: None,
            })
            .unwrap();
            assert_eq!(c.caches.len(), 2, "{url}: {c:?}");
            assert_eq!(c.caches[1].min_signatures, 1, "{url}");
        }
        // A user may ask for more signatures than the store, never fewer.
        let user = write(
            dir.path(),
            "more/oracle-build/config.toml",
            "[[cache]]\nname = \"strict\"\nurl = \"oci+http://localhost:5000/team\"\nmin_signatures = 3\n",
        );
        let c = load_from(&Sources {
            store_file: Some(store.clone()),
            user_file: Some(user),
            flag: None,
            env: None,
        })
        .unwrap();
        assert_eq!((c.caches.len(), c.caches[0].min_signatures), (1, 3));
    }

    #[test]
    fn a_layout_is_one_cache_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("layout");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let store = write(
            dir.path(),
            "store/config.toml",
            &format!(
                "[[cache]]\nname = \"usb\"\nurl = \"file://{}\"\nmin_signatures = 2\n",
                real.display()
            ),
        );
        let user = write(
            dir.path(),
            "xdg/oracle-build/config.toml",
            &format!(
                "[[cache]]\nname = \"mine\"\nurl = \"file://{}/\"\n",
                link.display()
            ),
        );
        let c = load_from(&Sources {
            store_file: Some(store),
            user_file: Some(user),
            flag: None,
            env: None,
        })
        .unwrap();
        assert_eq!(c.caches.len(), 1, "{c:?}");
        assert_eq!(
            (c.caches[0].name.as_str(), c.caches[0].min_signatures),
            ("usb", 2)
        );
    }

    #[test]
    fn store_root_wins_by_name_and_one_run_narrows_to_one_cache() {
        let dir = tempfile::tempdir().unwrap();
        let store = write(
            dir.path(),
            "store/config.toml",
            "[[cache]]\nname = \"team\"\nurl = \"oci://reg/team\"\nmin_signatures = 2\n",
        );
        let user = write(
            dir.path(),
            "xdg/oracle-build/config.toml",
            "[[cache]]\nname = \"team\"\nurl = \"oci://evil/team\"\nmin_signatures = 1\n\n[[cache]]\nname = \"mine\"\nurl = \"file:///home/me/cache\"\n",
        );
        let mut sources = Sources {
            store_file: Some(store.clone()),
            user_file: Some(user.clone()),
            flag: None,
            env: None,
        };
        let c = load_from(&sources).unwrap();
        let names: Vec<&str> = c.caches.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["team", "mine"]);
        assert_eq!(c.caches[0].url.to_string(), "oci://reg/team");
        assert_eq!(c.caches[0].min_signatures, 2);
        assert_eq!(c.caches[0].origin, Origin::File(store.clone()));

        // By name, by URL, or ad hoc; the flag beats the environment.
        sources.env = Some("mine".into());
        assert_eq!(load_from(&sources).unwrap().caches[0].name, "mine");
        sources.flag = Some("oci://reg/team".into());
        let c = load_from(&sources).unwrap();
        assert_eq!((c.caches.len(), c.caches[0].name.as_str()), (1, "team"));
        sources.flag = Some("oci+http://127.0.0.1:5000/x".into());
        let c = load_from(&sources).unwrap();
        assert_eq!(c.caches[0].origin, Origin::Flag);
        assert_eq!(c.caches[0].trusted_signers, None);
        sources.flag = Some("nonsense".into());
        let err = load_from(&sources).unwrap_err();
        assert!(
            format!("{err:#}").starts_with(
                "--cache: `nonsense` is neither a configured cache name nor a cache URL"
            ),
            "{err:#}"
        );
        assert_eq!(crate::exit::code_of(&err), 2);
        sources.flag = None;
        sources.env = Some("bad".into());
        assert!(
            format!("{:#}", load_from(&sources).unwrap_err()).starts_with("ORACLE_BUILD_CACHE: ")
        );

        // Missing files are no caches; a bad user file is still an error.
        let none = Sources {
            store_file: Some(dir.path().join("nope.toml")),
            ..Default::default()
        };
        assert!(load_from(&none).unwrap().caches.is_empty());
        std::fs::write(&user, "[[cache]]\nname = 1\n").unwrap();
        sources.env = None;
        assert!(
            format!("{:#}", load_from(&sources).unwrap_err())
                .contains("xdg/oracle-build/config.toml")
        );
    }
}
