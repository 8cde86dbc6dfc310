//! ccache's remote storage (a team compiler cache): the URL forms ccache
//! accepts, how one is passed to it, and how it is shown without its
//! credentials.
//!
//! Source: ccache's manual (`doc/MANUAL.adoc`, "Remote storage", "Storage
//! interaction", "Remote storage backends", ccache 4.4 and later): the
//! `remote_storage` setting (`CCACHE_REMOTE_STORAGE`) holds a URL with
//! optional `|attribute=value` parts, among them `read-only`; the backends
//! are `file:` (a directory, possibly on a network file system), `http://`
//! (a WebDAV-like server) and `redis://` / `redis+unix:` (a Redis server).
//! A URL's user information (`redis://[[USER:]PASSWORD@]HOST[:PORT][/DB]`,
//! `http://USER:PASSWORD@HOST/...`) is a secret: it is only ever put in the
//! environment of the compilers, never in a record or a message. A Redis
//! password alone is `redis://PASSWORD@HOST`: ccache 4.7 reads
//! `redis://:PASSWORD@HOST` as an empty user name, which Redis refuses.

use std::fmt;

/// The environment variable that gives ccache its remote storage.
pub const REMOTE_STORAGE_VAR: &str = "CCACHE_REMOTE_STORAGE";

/// One ccache remote storage, validated (see [`RemoteStorage::parse`]).
///
/// Its `Debug` and `Display` are the redacted form: the URL with any
/// password replaced by `***`, and ` (read-only)` when so.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteStorage {
    url: String,
    /// Whether this box only reads from it (ccache's `|read-only`).
    pub read_only: bool,
}

impl RemoteStorage {
    /// Parses the remote storage URL `text`; `read_only`: never write to it.
    ///
    /// Accepted (ccache's backends): `redis://[[USER:]PASSWORD@]HOST[:PORT][/DB]`,
    /// `redis+unix:/SOCKET[?db=N]`, `http://[USER:PASSWORD@]HOST[:PORT][/PATH]`,
    /// `file:/DIR` and `file:///DIR`.
    ///
    /// Errors: the reason in plain words (the caller names file, field and
    /// value): empty, whitespace or `|` in it (attributes are this tool's
    /// fields, e.g. `read_only`), an unknown scheme (`https://` included:
    /// ccache's HTTP backend speaks plain HTTP only), no host, a port that
    /// is not 1..=65535, or a `file:` / `redis+unix:` path that is not absolute.
    pub fn parse(text: &str, read_only: bool) -> Result<RemoteStorage, String> {
        if text.is_empty() {
            return Err("is empty".into());
        }
        if text.chars().any(char::is_whitespace) || text.contains('|') {
            return Err(
                "one URL without spaces or `|` attributes (read-only is the `read_only` field)"
                    .into(),
            );
        }
        if let Some(path) = text.strip_prefix("file:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if !path.starts_with('/') {
                return Err("a file: URL needs an absolute directory: file:/dir".into());
            }
        } else if let Some(path) = text.strip_prefix("redis+unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if !path.starts_with('/') {
                return Err("a redis+unix: URL needs an absolute socket path".into());
            }
        } else if let Some(rest) = text
            .strip_prefix("redis://")
            .or_else(|| text.strip_prefix("http://"))
        {
            let authority = rest.split('/').next().unwrap_or("");
            let host_port = authority.rsplit('@').next().unwrap_or("");
            let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
                match v6.split_once(']') {
                    Some((h, after)) => (h, after.strip_prefix(':')),
                    None => return Err("an IPv6 host needs a closing `]`".into()),
                }
            } else {
                match host_port.split_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (host_port, None),
                }
            };
            if host.is_empty() {
                return Err("no host".into());
            }
            if let Some(p) = port
                && !matches!(p.parse::<u16>(), Ok(n) if n > 0)
            {
                return Err(format!("port `{p}` is not a number in 1..=65535"));
            }
        } else if text.starts_with("https://") {
            return Err("ccache's HTTP backend speaks plain http:// only (no TLS)".into());
        } else {
            return Err(
                "unknown scheme; ccache's remote storage is redis://host:port, redis+unix:/socket, http://host/path or file:/dir"
                    .into(),
            );
        }
        Ok(RemoteStorage {
            url: text.to_string(),
            read_only,
        })
    }

    /// The value of `CCACHE_REMOTE_STORAGE`: the URL, with `|read-only`
    /// when so. Holds any credentials: for the compilers' environment only.
    pub fn ccache_value(&self) -> String {
        if self.read_only {
            format!("{}|read-only", self.url)
        } else {
            self.url.clone()
        }
    }

    /// The URL with any password replaced by `***` (see [`redact`]).
    pub fn redacted_url(&self) -> String {
        redact(&self.url)
    }
}

impl fmt::Display for RemoteStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.redacted_url())?;
        if self.read_only {
            write!(f, " (read-only)")?;
        }
        Ok(())
    }
}

impl fmt::Debug for RemoteStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteStorage({self})")
    }
}

/// `url` with the secret of its user information replaced by `***`:
/// `scheme://USER:PASSWORD@host` -> `scheme://USER:***@host`, and
/// `scheme://PASSWORD@host` (Redis's password-only form) -> `scheme://***@host`.
/// URLs without user information come back unchanged.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let (userinfo, host) = authority.split_at(at);
    let shown = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_string(),
    };
    format!("{scheme}://{shown}{host}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_ccache_accepts_parse_and_others_are_refused() {
        for ok in [
            "redis://127.0.0.1:6379",
            "redis://cache.example",
            "redis://:s3cret@cache.example:6379/2",
            "redis://user:s3cret@[::1]:6379",
            "redis+unix:/run/redis.sock",
            "http://cache.example:8080/ccache",
            "file:/mnt/shared/ccache",
            "file:///mnt/shared/ccache",
        ] {
            let r = RemoteStorage::parse(ok, false).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert_eq!(r.ccache_value(), ok);
        }
        for (bad, why) in [
            ("", "empty"),
            ("https://h/x", "plain http"),
            ("s3://bucket", "unknown scheme"),
            ("redis://", "no host"),
            ("redis://h:0", "port `0`"),
            ("redis://h:99999", "port `99999`"),
            ("redis://h|read-only", "`|`"),
            ("redis://h redis://g", "spaces"),
            ("file:rel/dir", "absolute"),
        ] {
            let e = RemoteStorage::parse(bad, false).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn passwords_never_show_and_read_only_is_an_attribute() {
        let r = RemoteStorage::parse("redis://:s3cret@h:6379/1", true).unwrap();
        assert_eq!(r.ccache_value(), "redis://:s3cret@h:6379/1|read-only");
        assert_eq!(r.to_string(), "redis://:***@h:6379/1 (read-only)");
        assert!(!format!("{r:?}").contains("s3cret"));
        assert_eq!(redact("redis://u:p@h"), "redis://u:***@h");
        assert_eq!(redact("redis://p@h:1"), "redis://***@h:1");
        assert_eq!(redact("http://u:p@h/a@b"), "http://u:***@h/a@b");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("file:/x@y"), "file:/x@y");
    }
}
