//! The registry cache (issue 13): a layer between [`crate::pipeline`] and
//! [`crate::stages`] that shares store entries through OCI registries
//! (`oci://host/repo`, `oci+http://host:port/repo`) and OCI image layouts on
//! disk (`file:///dir`).
//!
//! - [`Transport`]: the few operations of the OCI distribution spec a cache
//!   needs (blobs by digest, manifests by tag), with two implementations:
//!   [`registry`] (`oci-client`) and [`layout`] (an OCI image layout).
//! - [`artifact`]: one OCI artifact per store entry, named by its content
//!   key in the tag (`wheel-<key>`, `src-<commit>`, `inputs-<key>`, ...).
//! - [`substitute`]: taking an entry from a cache instead of doing the work,
//!   every blob checked on arrival and the entry made by one rename; what
//!   `pull` and `build` share.
//!
//! Every blob and manifest is checked against its digest on arrival: by
//! the transport (the sha256 of what was received) and again by
//! [`substitute`] before anything is renamed into the store.

pub mod artifact;
pub mod layout;
pub mod registry;
pub mod substitute;

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::exit::bad_input;

/// Where a cache lives, parsed from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// `oci://host[:port]/repo` (HTTPS) or `oci+http://host:port/repo`
    /// (plain HTTP, for a registry on a trusted network or 127.0.0.1).
    Registry {
        /// `host[:port]`.
        host: String,
        /// The repository path inside the registry (`team/oracles`).
        repo: String,
        /// Whether it speaks plain HTTP.
        plain_http: bool,
    },
    /// `file:///dir`: an OCI image layout on disk (NFS, USB, air gaps).
    Layout(PathBuf),
}

impl Location {
    /// Parses `oci://host/repo`, `oci+http://host:port/repo` or `file:///dir`.
    ///
    /// Errors (exit 2): any other scheme, an empty host or repository, a
    /// relative `file://` path, or a repository name the OCI distribution
    /// spec does not allow (`[a-z0-9]+([._-][a-z0-9]+)*(/...)*`).
    pub fn parse(url: &str) -> Result<Location> {
        let bad = |why: &str| bad_input(format!("cache URL {url:?}: {why}"));
        if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(bad("a file:// URL needs an absolute path (file:///dir)"));
            }
            return Ok(Location::Layout(PathBuf::from(path)));
        }
        let (rest, plain_http) = if let Some(r) = url.strip_prefix("oci+http://") {
            (r, true)
        } else if let Some(r) = url.strip_prefix("oci://") {
            (r, false)
        } else {
            return Err(bad("the scheme must be oci://, oci+http:// or file://"));
        };
        let Some((host, repo)) = rest.split_once('/') else {
            return Err(bad("no repository after the host (oci://host/repo)"));
        };
        let repo = repo.trim_end_matches('/');
        if host.is_empty() || repo.is_empty() {
            return Err(bad("empty host or repository"));
        }
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && c.as_bytes()[0].is_ascii_alphanumeric()
                && c.as_bytes()[c.len() - 1].is_ascii_alphanumeric()
        };
        if !repo.split('/').all(component_ok) {
            return Err(bad(
                "the repository must be lowercase letters, digits and . _ - between / (OCI distribution spec)",
            ));
        }
        Ok(Location::Registry {
            host: host.to_string(),
            repo: repo.to_string(),
            plain_http,
        })
    }
}

/// A manifest as received: its bytes and their digest (`sha256:<hex>`,
/// already checked against the bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The manifest's bytes, exactly as stored.
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
}

/// The operations of the OCI distribution spec (or an image layout) a cache
/// needs. Implementations check every blob and manifest they receive
/// against its digest and fail naming it.
pub trait Transport {
    /// The cache's URL, for messages.
    fn describe(&self) -> String;
    /// The manifest tagged `tag`, or `None` when there is no such tag.
    ///
    /// Errors: the cache cannot be reached or refuses; the bytes do not
    /// match the digest the cache gives.
    fn manifest(&self, tag: &str) -> Result<Option<Fetched>>;
    /// Whether the blob `digest` is present.
    fn has_blob(&self, digest: &str) -> Result<bool>;
    /// Downloads the blob `digest` of `size` bytes into the new file `dest`.
    ///
    /// Errors: the cache fails; what arrived has another digest or size
    /// (the message names the digest; `dest` is removed).
    fn get_blob(&self, digest: &str, size: u64, dest: &Path) -> Result<()>;
    /// Uploads the file `src` as the blob `digest` (skipped when present).
    fn put_blob(&self, src: &Path, digest: &str, size: u64) -> Result<()>;
    /// Stores `bytes` (an OCI image manifest) under `tag`; returns its digest.
    fn put_manifest(&self, tag: &str, bytes: &[u8]) -> Result<String>;
    /// Every tag of the cache.
    fn tags(&self) -> Result<Vec<String>>;
}

/// Opens the cache at `url` (see [`Location::parse`]).
///
/// Errors (exit 2): a bad URL; errors: the registry client cannot be made.
pub fn open(url: &str) -> Result<Box<dyn Transport>> {
    Ok(match Location::parse(url)? {
        Location::Layout(dir) => Box::new(layout::Layout::open(&dir, url)?),
        Location::Registry {
            host,
            repo,
            plain_http,
        } => Box::new(registry::Registry::new(&host, &repo, plain_http, url)?),
    })
}

/// `sha256:<hex>` of `bytes`.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The hex part of a `sha256:<hex>` digest.
///
/// Errors: another algorithm or not 64 lowercase hex digits.
pub fn digest_hex(digest: &str) -> Result<&str> {
    match digest.strip_prefix("sha256:") {
        Some(h)
            if h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(h)
        }
        _ => bail!("digest {digest:?} is not sha256:<64 hex digits>"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_urls_parse_and_bad_ones_are_refused() {
        assert_eq!(
            Location::parse("oci+http://127.0.0.1:5000/team/oracles").unwrap(),
            Location::Registry {
                host: "127.0.0.1:5000".into(),
                repo: "team/oracles".into(),
                plain_http: true
            }
        );
        assert_eq!(
            Location::parse("file:///mnt/cache").unwrap(),
            Location::Layout("/mnt/cache".into())
        );
        for bad in [
            "http://x/y",
            "oci://host",
            "oci://host/Upper",
            "file://rel/dir",
            "oci:///r",
        ] {
            assert!(Location::parse(bad).is_err(), "{bad}");
        }
    }
}
