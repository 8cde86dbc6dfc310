//! Bounds on every read from a cache (issue 23, docs/cache.md "Bounds and
//! timeouts"): a cache is a server of another team or a disk anyone can
//! write, so nothing it sends may fill this box's memory or disk, or hang a
//! run.
//!
//! - A blob is read up to the size its manifest declares and no further:
//!   [`copy_bounded`] stops at `size + 1` bytes and the read fails.
//! - A manifest is at most [`MANIFEST_LIMIT`] bytes, a config blob at most
//!   [`CONFIG_LIMIT`], an image layout's `index.json` at most [`INDEX_LIMIT`],
//!   a registry's tag list at most [`TAG_PAGE_LIMIT`] a page and
//!   [`TAG_LIST_LIMIT`] in all.
//! - Every request to a registry has a connect timeout and an idle-read
//!   timeout ([`Timeouts`], `connect_timeout` / `read_timeout` of a
//!   `[[cache]]` entry); a read that times out or a connection that drops
//!   is an [`Unreachable`] error, after which `build` stops asking that
//!   cache for the rest of the run.

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{Result, bail};
use sha2::{Digest, Sha256};

/// The largest manifest a cache may send (4 MiB, the limit distribution
/// itself puts on a manifest it accepts).
pub const MANIFEST_LIMIT: u64 = 4 << 20;
/// The largest config blob a manifest may declare (1 MiB: an entry's record
/// and file list; a vLLM wheel's config is a few KiB).
pub const CONFIG_LIMIT: u64 = 1 << 20;
/// The largest `index.json` of a `file://` layout (64 MiB: about 300,000 tags).
pub const INDEX_LIMIT: u64 = 64 << 20;
/// How much of an error response's body is read for its message.
pub const ERROR_BODY_LIMIT: u64 = 4 << 10;
/// The largest page of a registry's tag list (`GET /v2/<name>/tags/list`,
/// 1000 tags of at most 128 characters are about 130 KiB).
pub const TAG_PAGE_LIMIT: u64 = 4 << 20;
/// The most bytes all pages of a registry's tag list may take together
/// (as [`INDEX_LIMIT`]: about 300,000 tags).
pub const TAG_LIST_LIMIT: u64 = INDEX_LIMIT;

/// How long a request to a cache may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// To open a connection (TCP and TLS).
    pub connect: Duration,
    /// Between two reads of a response (its headers included): an idle
    /// timeout, so a large blob that keeps arriving never times out.
    pub read: Duration,
}

/// [`Timeouts::connect`] when a cache sets none.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// [`Timeouts::read`] when a cache sets none.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            connect: DEFAULT_CONNECT_TIMEOUT,
            read: DEFAULT_READ_TIMEOUT,
        }
    }
}

/// The slowest a response may arrive, in bytes a second, measured over each
/// window of `read_timeout` (curl's `--speed-limit`, with `--speed-time` the
/// idle timeout): 1 KiB/s. A server that trickles a byte now and then is
/// never idle long enough for [`Timeouts::read`], and would hold a 4 MiB tag
/// page for weeks; one slower than this is ended as [`Unreachable`].
pub const MIN_BYTES_PER_SECOND: u64 = 1 << 10;

/// The pace of one response: how many bytes arrived in the current window
/// of `window` (a cache's `read_timeout`), for [`MIN_BYTES_PER_SECOND`].
#[derive(Debug, Clone)]
pub struct Pace {
    window: Duration,
    start: std::time::Instant,
    bytes: u64,
}

impl Pace {
    /// A pace measured in windows of `window`, the first starting at `now`.
    pub fn new(window: Duration, now: std::time::Instant) -> Pace {
        Pace {
            window,
            start: now,
            bytes: 0,
        }
    }

    /// Counts `n` bytes that arrived at `now`. Errors (the bytes that came
    /// in the window that just closed) when a whole window has passed with
    /// fewer than [`MIN_BYTES_PER_SECOND`] a second; a window that closes
    /// at its pace starts the next.
    pub fn add(&mut self, n: u64, now: std::time::Instant) -> std::result::Result<(), u64> {
        self.bytes = self.bytes.saturating_add(n);
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed < self.window {
            return Ok(());
        }
        let want = (MIN_BYTES_PER_SECOND as f64 * elapsed.as_secs_f64()) as u64;
        if self.bytes < want {
            return Err(self.bytes);
        }
        self.start = now;
        self.bytes = 0;
        Ok(())
    }
}

/// A cache that did not answer in time or dropped the connection: the
/// message names the cache and the request. `build` skips such a cache for
/// the rest of the run (see `cache::substitute::Substituter`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreachable(pub String);

/// Whether `e` (or one of its causes) is an [`Unreachable`].
pub fn is_unreachable(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Unreachable>())
}

/// What [`copy_bounded`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Bytes written (at most the declared size).
    pub len: u64,
    /// `sha256:<hex>` of them.
    pub digest: String,
}

/// Copies `from` into `to`, at most `size` bytes, hashing them; reads at
/// most `size + 1` bytes from `from`.
///
/// Errors: `from` holds more than `size` bytes (the message says so;
/// nothing past `size` is written); a read or write fails.
pub fn copy_bounded(from: impl Read, to: &mut impl Write, size: u64) -> Result<Copied> {
    let mut from = from.take(size.saturating_add(1));
    let mut hash = Sha256::new();
    let mut len = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        let keep = usize::try_from(size - len).map_or(n, |room| n.min(room));
        to.write_all(&buf[..keep])?;
        hash.update(&buf[..keep]);
        len += keep as u64;
        if keep < n {
            bail!("it holds more than its declared {size} bytes");
        }
    }
    Ok(Copied {
        len,
        digest: format!("sha256:{}", hex::encode(hash.finalize())),
    })
}

/// Reads all of `from` when it holds at most `limit` bytes.
///
/// Errors: it holds more (`what` names it in the message); a read fails.
pub fn read_bounded(from: impl Read, limit: u64, what: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    from.take(limit.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        bail!("{what} is larger than {limit} bytes, the limit");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_slower_than_the_pace_ends_once_a_window_has_passed() {
        let t0 = std::time::Instant::now();
        let w = Duration::from_secs(2);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // A byte every 100 ms: never idle, but 20 bytes in 2 s.
        let mut drip = Pace::new(w, t0);
        for i in 1..20 {
            assert_eq!(drip.add(1, at(100 * i)), Ok(()));
        }
        assert_eq!(drip.add(1, at(2000)), Err(20));
        // 4 KiB a second keeps going, window after window.
        let mut steady = Pace::new(w, t0);
        for i in 1..=10 {
            assert_eq!(steady.add(4096, at(1000 * i)), Ok(()), "second {i}");
        }
        // A small response that ends within its first window is never judged.
        let mut small = Pace::new(w, t0);
        assert_eq!(small.add(3, at(1900)), Ok(()));
    }

    /// An endless reader: what a misbehaving cache streams.
    struct Endless(u64);
    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            buf.fill(b'x');
            Ok(buf.len())
        }
    }

    #[test]
    fn bounded_copy_stops_at_the_declared_size() {
        let mut out = Vec::new();
        let mut src = Endless(0);
        let e = copy_bounded(&mut src, &mut out, 100_000).unwrap_err();
        assert!(
            format!("{e}").contains("more than its declared 100000 bytes"),
            "{e}"
        );
        assert_eq!(out.len(), 100_000);
        assert!(src.0 <= 100_001 + (1 << 16), "read {} bytes", src.0);

        let mut out = Vec::new();
        let got = copy_bounded(&b"hello"[..], &mut out, 5).unwrap();
        assert_eq!((got.len, out.as_slice()), (5, &b"hello"[..]));
        assert_eq!(got.digest, crate::cache::digest_of(b"hello"));
        // Shorter than declared is not this function's error: the caller
        // compares the length and digest.
        assert_eq!(copy_bounded(&b"hi"[..], &mut Vec::new(), 5).unwrap().len, 2);
    }

    #[test]
    fn bounded_read_refuses_past_the_limit() {
        assert_eq!(read_bounded(&b"abc"[..], 3, "x").unwrap(), b"abc");
        let e = read_bounded(Endless(0), 1000, "the manifest of t").unwrap_err();
        assert!(
            format!("{e}").contains("the manifest of t is larger than 1000"),
            "{e}"
        );
    }
}
