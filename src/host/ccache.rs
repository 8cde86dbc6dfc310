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
use std::time::Duration;

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
    /// ccache's `connect-timeout` attribute (Redis and HTTP backends;
    /// ccache's default is 100 ms); `None`: ccache's default.
    pub connect_timeout: Option<Duration>,
    /// ccache's `operation-timeout` attribute: how long one lookup or store
    /// may take (ccache's default is 10 s); `None`: ccache's default.
    pub operation_timeout: Option<Duration>,
}

/// ccache's `operation-timeout` when none is given (its manual, "Redis
/// storage backend" and "HTTP storage backend": 10000 ms).
pub const CCACHE_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

/// What [`RemoteStorage::probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The server sent something back (any answer, an error too).
    Answers,
    /// The connection was refused or failed at once: a server that is down
    /// costs a compiler call nothing, so it is not skipped.
    Refused(String),
    /// Connected (or still connecting) and nothing came back in time: a
    /// stalled server, which costs every compiler call its operation timeout.
    Silent,
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
            connect_timeout: None,
            operation_timeout: None,
        })
    }

    /// This remote with ccache's `connect-timeout` and `operation-timeout`
    /// set (`None`: ccache's default).
    ///
    /// Errors: the remote is a `file:` directory, which has neither.
    pub fn with_timeouts(
        self,
        connect: Option<Duration>,
        operation: Option<Duration>,
    ) -> Result<RemoteStorage, String> {
        if self.url.starts_with("file:") && (connect.is_some() || operation.is_some()) {
            return Err(
                "a file: remote has no timeouts (they apply to redis:// and http:// remotes)"
                    .into(),
            );
        }
        Ok(RemoteStorage {
            connect_timeout: connect,
            operation_timeout: operation,
            ..self
        })
    }

    /// How long ccache waits for one lookup or store: the configured
    /// `operation-timeout`, else ccache's default.
    pub fn operation_timeout(&self) -> Duration {
        self.operation_timeout.unwrap_or(CCACHE_OPERATION_TIMEOUT)
    }

    /// The value of `CCACHE_REMOTE_STORAGE`: the URL, with `|read-only`,
    /// `|connect-timeout=<ms>` and `|operation-timeout=<ms>` when set. Holds
    /// any credentials: for the compilers' environment only.
    pub fn ccache_value(&self) -> String {
        let mut v = self.url.clone();
        if self.read_only {
            v.push_str("|read-only");
        }
        if let Some(t) = self.connect_timeout {
            v.push_str(&format!("|connect-timeout={}", t.as_millis().max(1)));
        }
        if let Some(t) = self.operation_timeout {
            v.push_str(&format!("|operation-timeout={}", t.as_millis().max(1)));
        }
        v
    }

    /// Asks the server whether it answers at all, waiting at most `limit`
    /// to connect and as long again for a reply: a Redis server is sent
    /// `PING` (any reply counts, `-NOAUTH` too), an HTTP server a `HEAD /`.
    /// A `file:` remote always [`Probe::Answers`] (nothing to ask).
    pub fn probe(&self, limit: Duration) -> Probe {
        use std::io::{Read, Write};
        let ask: &[u8] = if self.url.starts_with("http://") {
            b"HEAD / HTTP/1.0\r\n\r\n"
        } else {
            b"PING\r\n"
        };
        fn talk<S: Read + Write>(mut s: S, ask: &[u8]) -> Probe {
            if s.write_all(ask).is_err() {
                return Probe::Refused("the connection was closed".into());
            }
            let mut b = [0u8; 1];
            match s.read(&mut b) {
                Ok(1) => Probe::Answers,
                Ok(_) => Probe::Refused("the connection was closed".into()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    Probe::Silent
                }
                Err(e) => Probe::Refused(e.to_string()),
            }
        }
        if let Some(path) = self.url.strip_prefix("redis+unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            let path = path.split('?').next().unwrap_or(path);
            return match std::os::unix::net::UnixStream::connect(path) {
                Ok(s) => {
                    let _ = s.set_read_timeout(Some(limit));
                    let _ = s.set_write_timeout(Some(limit));
                    talk(s, ask)
                }
                Err(e) => Probe::Refused(e.to_string()),
            };
        }
        let Some((host, port)) = self.host_port() else {
            return Probe::Answers;
        };
        use std::net::ToSocketAddrs;
        let addrs: Vec<std::net::SocketAddr> = match (host.as_str(), port).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => return Probe::Refused(e.to_string()),
        };
        let mut why = "no address".to_string();
        for addr in addrs {
            match std::net::TcpStream::connect_timeout(&addr, limit) {
                Ok(s) => {
                    let _ = s.set_read_timeout(Some(limit));
                    let _ = s.set_write_timeout(Some(limit));
                    return talk(s, ask);
                }
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Probe::Silent,
                Err(e) => why = e.to_string(),
            }
        }
        Probe::Refused(why)
    }

    /// The host and port of a `redis://` or `http://` remote (the scheme's
    /// default port when none is given: 6379, 80); `None` for the others.
    fn host_port(&self) -> Option<(String, u16)> {
        let (rest, default) = if let Some(r) = self.url.strip_prefix("redis://") {
            (r, 6379)
        } else if let Some(r) = self.url.strip_prefix("http://") {
            (r, 80)
        } else {
            return None;
        };
        let authority = rest.split('/').next().unwrap_or("");
        let host_port = authority.rsplit('@').next().unwrap_or("");
        let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
            let (h, after) = v6.split_once(']')?;
            (h, after.strip_prefix(':'))
        } else {
            match host_port.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (host_port, None),
            }
        };
        let port = match port {
            Some(p) => p.parse().ok()?,
            None => default,
        };
        Some((host.to_string(), port))
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
    fn timeouts_are_attributes_and_a_probe_tells_silent_from_refused() {
        let r = RemoteStorage::parse("redis://h:6379", true)
            .unwrap()
            .with_timeouts(
                Some(Duration::from_millis(200)),
                Some(Duration::from_secs(2)),
            )
            .unwrap();
        assert_eq!(
            r.ccache_value(),
            "redis://h:6379|read-only|connect-timeout=200|operation-timeout=2000"
        );
        assert_eq!(r.operation_timeout(), Duration::from_secs(2));
        assert_eq!(r.host_port(), Some(("h".to_string(), 6379)));
        assert!(
            RemoteStorage::parse("file:/x", false)
                .unwrap()
                .with_timeouts(None, Some(Duration::from_secs(1)))
                .is_err()
        );
        // A listener that never answers, and a port nobody listens on.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at =
            |port: u16| RemoteStorage::parse(&format!("redis://127.0.0.1:{port}"), false).unwrap();
        let limit = Duration::from_millis(300);
        assert_eq!(
            at(silent.local_addr().unwrap().port()).probe(limit),
            Probe::Silent
        );
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        assert!(matches!(at(port).probe(limit), Probe::Refused(_)));
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
