//! Which cache a URL names, however it is spelled (issue 41, docs/cache.md
//! "Configuring a cache"): the identity a store's policy binds.
//!
//! A store's `[[cache]]` entry binds every user entry that names the same
//! cache (`config::load_from`), so the user's file cannot read it with a
//! weaker policy. "The same cache" is decided here, on the normalised URL:
//!
//! - the host as the WHATWG URL parser reads it (`url::Host`, the parser
//!   reqwest connects with): lower-case, one trailing dot dropped, an IPv4
//!   address in any form `inet_aton` takes (`127.1`, `0x7f.0.0.1`,
//!   `2130706433`) as its dotted quad, an IPv6 address compressed, and an
//!   IPv4-mapped IPv6 address (`[::ffff:127.0.0.1]`) as its IPv4 address;
//! - the port, the scheme's default when none is given (`oci://` 443,
//!   `oci+http://` 80): the scheme is not part of the identity, so one
//!   registry reached over HTTPS and over plain HTTP on the same port is one
//!   cache;
//! - this box itself as one host, whatever it is called: `localhost`, any
//!   `*.localhost` (RFC 6761), `localhost.localdomain`, `ip6-localhost`,
//!   `ip6-loopback`, every address of 127.0.0.0/8, `::1`, and the
//!   unspecified addresses `0.0.0.0` and `::` (which Linux connects to this
//!   box), shown as `localhost`;
//! - for a `file://` layout, the directory with symbolic links resolved when
//!   it exists.
//!
//! Names are not looked up in DNS (no lookup at configuration time, which
//! every command does): a DNS alias of a registry, or a proxy in front of
//! it, is another cache to this module.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

/// The host part of an identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Host {
    /// This box: a loopback or unspecified address, or a loopback name.
    Local,
    /// Any other IP address (IPv4-mapped IPv6 addresses as IPv4).
    Ip(IpAddr),
    /// Any other name, lower-case, without a trailing dot.
    Name(String),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Local => write!(f, "localhost"),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Host::Ip(a) => write!(f, "{a}"),
            Host::Name(n) => write!(f, "{n}"),
        }
    }
}

/// The cache a URL names (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CacheId {
    /// A repository of a registry.
    Registry {
        /// The registry's host.
        host: Host,
        /// Its port (the scheme's default when the URL gives none).
        port: u16,
        /// The repository path.
        repo: String,
    },
    /// An OCI image layout directory.
    Layout {
        /// The directory, links resolved when it exists.
        dir: PathBuf,
    },
}

impl fmt::Display for CacheId {
    /// `registry localhost:5000/team/oracles` (as a registry client names a
    /// repository), or `file:///dir`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheId::Registry { host, port, repo } => {
                write!(f, "registry {host}:{port}/{repo}")
            }
            CacheId::Layout { dir } => write!(f, "file://{}", dir.display()),
        }
    }
}

/// The canonical spelling of a URL's host `raw` (without a port; an IPv6
/// address in brackets): what a cache URL is printed and connected with.
/// Lower-case, one trailing dot dropped, IP addresses in their canonical
/// form, an IPv4-mapped IPv6 address as the IPv4 address. Loopback names are
/// kept as written (they may name IPv4 or IPv6): [`host_identity`] folds
/// them.
///
/// Errors: the reason in plain words, when the WHATWG host parser refuses
/// `raw` (an IPv6 literal that does not parse, an IPv4 number out of range).
pub fn normalise_host(raw: &str) -> Result<String, String> {
    let trimmed = raw.strip_suffix('.').unwrap_or(raw);
    if trimmed.is_empty() || trimmed.ends_with('.') {
        return Err(format!("`{raw}` is not a host name or address"));
    }
    let parsed = url::Host::parse(trimmed)
        .map_err(|e| format!("`{raw}` is not a host name or address ({e})"))?;
    Ok(match parsed {
        url::Host::Domain(d) => d,
        url::Host::Ipv4(a) => a.to_string(),
        url::Host::Ipv6(a) => match a.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => format!("[{a}]"),
        },
    })
}

/// The identity of the canonical host `host` ([`normalise_host`]'s output).
pub fn host_identity(host: &str) -> Host {
    let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
        None => host.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
    };
    match ip {
        Some(a) if a.is_loopback() || a.is_unspecified() => Host::Local,
        Some(a) => Host::Ip(a),
        None if is_loopback_name(host) => Host::Local,
        None => Host::Name(host.to_string()),
    }
}

/// Names that always name this box: `localhost` and its subdomains (RFC
/// 6761 section 6.3), and the loopback names Debian's `/etc/hosts` gives.
fn is_loopback_name(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || matches!(
            name,
            "localhost.localdomain" | "ip6-localhost" | "ip6-loopback"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_normalise_to_one_spelling() {
        for (raw, want) in [
            ("Registry.Example.", "registry.example"),
            ("127.1", "127.0.0.1"),
            ("0x7f.0.0.1", "127.0.0.1"),
            ("2130706433", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("[::ffff:127.0.0.1]", "127.0.0.1"),
            ("[::FFFF:7f00:1]", "127.0.0.1"),
            ("[0:0:0:0:0:0:0:1]", "[::1]"),
            ("[::1]", "[::1]"),
            ("LOCALHOST", "localhost"),
            ("10.1.2.3", "10.1.2.3"),
        ] {
            assert_eq!(normalise_host(raw).as_deref(), Ok(want), "{raw}");
        }
        for bad in ["[::1", "[zz::1]", "256.0.0.1", ".", "a..", "1.2.3.4.5.6"] {
            assert!(normalise_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_name_of_this_box_is_one_host() {
        for raw in [
            "localhost",
            "LocalHost.",
            "registry.localhost",
            "localhost.localdomain",
            "ip6-localhost",
            "ip6-loopback",
            "127.0.0.1",
            "127.1",
            "127.8.9.10",
            "[::1]",
            "[::ffff:127.0.0.1]",
            "0.0.0.0",
            "[::]",
        ] {
            let host = normalise_host(raw).unwrap();
            assert_eq!(host_identity(&host), Host::Local, "{raw}");
        }
        for (raw, want) in [
            ("10.0.0.1", Host::Ip("10.0.0.1".parse().unwrap())),
            ("[fe80::1]", Host::Ip("fe80::1".parse().unwrap())),
            ("localhost-not", Host::Name("localhost-not".into())),
            ("mylocalhost", Host::Name("mylocalhost".into())),
        ] {
            let host = normalise_host(raw).unwrap();
            assert_eq!(host_identity(&host), want, "{raw}");
        }
        assert_eq!(Host::Local.to_string(), "localhost");
        assert_eq!(
            Host::Ip("fe80::1".parse().unwrap()).to_string(),
            "[fe80::1]"
        );
    }
}
