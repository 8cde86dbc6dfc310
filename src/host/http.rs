//! HTTP: one async stack (`reqwest` on a `tokio` runtime) behind a small
//! blocking edge, so the synchronous stages call plain functions.
//!
//! - [`client_builder`] is the one place a client is configured (user agent,
//!   connect and read timeouts; proxies from `HTTP_PROXY`, `HTTPS_PROXY`,
//!   `ALL_PROXY` and `NO_PROXY`, upper or lower case, as reqwest reads them by
//!   default). Every HTTP user of the tool starts from it.
//! - [`block_on`] runs a future on a fresh multi-thread runtime: the edge.
//! - [`fetch_all`] downloads a set of files in parallel (at most
//!   [`downloads`] at once, `ORACLE_BUILD_DOWNLOADS`), each streamed to its
//!   destination with its sha256 computed on the way and checked against the
//!   expected one, and never more bytes read than its expected size when
//!   that is known; transient failures (connect errors, timeouts, a broken
//!   body, HTTP 408/425/429/5xx) are retried with exponential backoff (and
//!   `Retry-After`), resuming with a `Range` request when the server allows
//!   it; permanent ones (any other status, e.g. 404, and a hash mismatch) are
//!   not. `file://` URLs and local paths are copied the same way.
//!
//! TLS is native-tls (OpenSSL on Linux), the same library git2 links.

use std::collections::VecDeque;
use std::future::Future;
use std::io::{Read, Seek, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use sha2::{Digest, Sha256};

/// The environment variable that sets how many downloads run at once.
pub const DOWNLOADS_ENV: &str = "ORACLE_BUILD_DOWNLOADS";
/// Downloads at once when [`DOWNLOADS_ENV`] is unset.
pub const DEFAULT_DOWNLOADS: usize = 8;
/// The largest value [`DOWNLOADS_ENV`] may take.
pub const MAX_DOWNLOADS: usize = 64;
/// How long a connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a response may stay silent (between two reads) before it is a timeout.
pub const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// Tries per file, the first included.
pub const ATTEMPTS: u32 = 5;

/// The client builder every HTTP user of the tool starts from: its user
/// agent, [`CONNECT_TIMEOUT`], [`READ_TIMEOUT`], and reqwest's default proxy
/// handling (the `*_PROXY` / `NO_PROXY` environment variables), kept as is.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .user_agent(concat!("oracle-build/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
}

/// Runs `fut` to completion on a fresh multi-thread tokio runtime with
/// `threads` worker threads (at least one) and returns its output: the
/// blocking edge between the synchronous stages and the async HTTP stack.
///
/// Errors: the runtime cannot be started (no threads, no file descriptors).
pub fn block_on<F: Future>(threads: usize, fut: F) -> Result<F::Output> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("starting the async runtime for HTTP")?;
    Ok(rt.block_on(fut))
}

/// How many downloads run at once: [`DOWNLOADS_ENV`] when set, else
/// [`DEFAULT_DOWNLOADS`].
///
/// Errors (exit 2): the variable is not a whole number from 1 to [`MAX_DOWNLOADS`].
pub fn downloads() -> Result<usize> {
    parse_downloads(std::env::var(DOWNLOADS_ENV).ok().as_deref())
}

fn parse_downloads(value: Option<&str>) -> Result<usize> {
    let Some(v) = value else {
        return Ok(DEFAULT_DOWNLOADS);
    };
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_DOWNLOADS).contains(&n) => Ok(n),
        _ => Err(crate::exit::bad_input(format!(
            "environment variable {DOWNLOADS_ENV}: `{v}` is not a number of downloads from 1 to {MAX_DOWNLOADS}"
        ))),
    }
}

/// Whether a failed try is worth another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// It may succeed later: retry after a backoff.
    Transient,
    /// It will fail the same way: give up.
    Permanent,
}

/// The class of an HTTP status that is not a success (RFC 9110): 408
/// Request Timeout, 425 Too Early, 429 Too Many Requests and every 5xx are
/// transient; the rest (404, 403, 410, ...) permanent.
pub fn classify_status(status: u16) -> Retry {
    match status {
        408 | 425 | 429 | 500..=599 => Retry::Transient,
        _ => Retry::Permanent,
    }
}

/// The class of a reqwest error: a bad URL or a redirect loop is permanent,
/// a status error follows [`classify_status`], and connect errors, timeouts
/// and broken requests or bodies (a reset or closed connection) are transient.
pub fn classify_error(e: &reqwest::Error) -> Retry {
    if e.is_builder() || e.is_redirect() {
        Retry::Permanent
    } else if let Some(s) = e.status() {
        classify_status(s.as_u16())
    } else if e.is_connect() || e.is_timeout() || e.is_request() || e.is_body() || e.is_decode() {
        Retry::Transient
    } else {
        Retry::Permanent
    }
}

/// The wait before try `attempt + 1` after try `attempt` (1-based) failed:
/// 0.5 s doubled per try, at most 8 s; a server's `Retry-After` (seconds)
/// when it asks for longer, at most 60 s.
pub fn backoff(attempt: u32, retry_after: Option<u64>) -> Duration {
    let exp = Duration::from_millis(500u64 << attempt.saturating_sub(1).min(4));
    let exp = exp.min(Duration::from_secs(8));
    match retry_after {
        Some(s) => exp.max(Duration::from_secs(s.min(60))),
        None => exp,
    }
}

/// Why one download failed.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// The server answered with a status that is not a success.
    #[error("downloading {url}: HTTP {status}")]
    Status {
        /// The URL asked for.
        url: String,
        /// The status code.
        status: u16,
        /// The server's `Retry-After`, in seconds.
        retry_after: Option<u64>,
    },
    /// The transport failed (connect, timeout, a broken body).
    #[error("downloading {url}: {message}")]
    Transport {
        /// The URL asked for.
        url: String,
        /// The error and its causes.
        message: String,
        /// Its class ([`classify_error`]).
        retry: Retry,
    },
    /// The bytes received do not have the expected sha256.
    #[error("{name} ({url}) has sha256 {actual}, but the lock says {expected}; refusing it")]
    Hash {
        /// The file name.
        name: String,
        /// Where it came from.
        url: String,
        /// The expected sha256.
        expected: String,
        /// The sha256 of what was received.
        actual: String,
    },
    /// More bytes came than the file has ([`Job::size`]); the rest was not read.
    #[error("{name} ({url}) is larger than the {size} bytes expected; refusing it")]
    TooLarge {
        /// The file name.
        name: String,
        /// Where it came from.
        url: String,
        /// The expected size.
        size: u64,
    },
    /// A local file could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// `reading` or `writing`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Stopped because another download of the set failed.
    #[error("cancelled")]
    Cancelled,
}

impl DownloadError {
    /// Whether another try may succeed ([`classify_status`], [`classify_error`]);
    /// hash mismatches, local I/O errors and cancellation are permanent.
    pub fn retry(&self) -> Retry {
        match self {
            DownloadError::Status { status, .. } => classify_status(*status),
            DownloadError::Transport { retry, .. } => *retry,
            _ => Retry::Permanent,
        }
    }
}

/// The message of `e` with every cause after it (`a: b: c`): reqwest's
/// own message alone often hides why (a refused connection, a TLS error).
pub fn error_chain(e: &reqwest::Error) -> String {
    let mut message = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        message.push_str(": ");
        message.push_str(&c.to_string());
        cause = c.source();
    }
    message
}

fn transport(url: &str, e: &reqwest::Error) -> DownloadError {
    let message = error_chain(e);
    DownloadError::Transport {
        url: url.to_string(),
        message,
        retry: classify_error(e),
    }
}

/// Where a file comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An `http://` or `https://` URL.
    Http(String),
    /// A local file (a `file://` URL or a path).
    Local(PathBuf),
}

impl Source {
    /// The source a URL names: `file://` URLs become [`Source::Local`].
    ///
    /// Errors: the URL does not parse, or is a `file://` URL that names no
    /// local path, or has another scheme than http, https and file.
    pub fn from_url(url: &str) -> Result<Source> {
        let u = reqwest::Url::parse(url).with_context(|| format!("`{url}` is not a URL"))?;
        match u.scheme() {
            "http" | "https" => Ok(Source::Http(url.to_string())),
            "file" => u
                .to_file_path()
                .map(Source::Local)
                .map_err(|()| anyhow!("`{url}` names no local file")),
            other => Err(anyhow!(
                "`{url}`: scheme `{other}` is not supported (http, https, file)"
            )),
        }
    }

    fn describe(&self) -> String {
        match self {
            Source::Http(u) => u.clone(),
            Source::Local(p) => p.display().to_string(),
        }
    }
}

/// One file to fetch.
#[derive(Debug, Clone)]
pub struct Job {
    /// Its name, for messages.
    pub name: String,
    /// Where it comes from.
    pub source: Source,
    /// The file to write (created or truncated; its directory must exist).
    pub dest: PathBuf,
    /// The expected lowercase hex sha256.
    pub sha256: String,
    /// The expected size in bytes, when known (a lock's `size`, a pinned
    /// wheel's): a body that runs past it is cut there and refused
    /// ([`DownloadError::TooLarge`]), so no server makes a download
    /// unbounded.
    pub size: Option<u64>,
}

/// What a successful fetch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fetched {
    /// Bytes in the file.
    pub bytes: u64,
    /// Tries it took (1 when the first one succeeded).
    pub attempts: u32,
}

/// Moves a byte-level progress bar (a negative value when a try restarts from zero).
pub type OnBytes = Arc<dyn Fn(i64) + Send + Sync>;

/// Fetches `jobs`, at most `parallel` at once, each written to its `dest`
/// with its sha256 checked ([`DownloadError::Hash`] otherwise), and calls
/// `on_done(index, result)` on the calling thread as each one ends (the
/// index is the job's position in `jobs`). `on_bytes` is told of every chunk.
/// Once a result is an error or `on_done` returns one, no new job starts and
/// running ones stop; cancelled jobs are not reported to `on_done`.
///
/// Errors: the client or runtime cannot be made; else the errors of the
/// failed jobs (the download error, or what `on_done` returned), all named.
pub fn fetch_all(
    jobs: Vec<Job>,
    parallel: usize,
    on_bytes: OnBytes,
    mut on_done: impl FnMut(usize, Result<Fetched, DownloadError>) -> Result<()>,
) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let workers = parallel.clamp(1, MAX_DOWNLOADS).min(jobs.len());
    let client = client_builder()
        .build()
        .context("building the HTTP client")?;
    let queue: Arc<Mutex<VecDeque<(usize, Job)>>> =
        Arc::new(Mutex::new(jobs.into_iter().enumerate().collect()));
    let cancel = Arc::new(AtomicBool::new(false));
    let threads = workers.min(std::thread::available_parallelism().map_or(2, |n| n.get()));
    let errors = block_on(threads, async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..workers {
            let (client, queue, cancel, tx, on_bytes) = (
                client.clone(),
                queue.clone(),
                cancel.clone(),
                tx.clone(),
                on_bytes.clone(),
            );
            tokio::spawn(async move {
                loop {
                    if cancel.load(Ordering::SeqCst) {
                        break;
                    }
                    let next = queue.lock().ok().and_then(|mut q| q.pop_front());
                    let Some((i, job)) = next else { break };
                    let r = fetch_one(&client, job, &cancel, &on_bytes).await;
                    if tx.send((i, r)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut errors: Vec<anyhow::Error> = Vec::new();
        while let Some((i, r)) = rx.recv().await {
            if matches!(r, Err(DownloadError::Cancelled)) {
                continue;
            }
            if let Err(e) = on_done(i, r) {
                cancel.store(true, Ordering::SeqCst);
                errors.push(e);
            }
        }
        errors
    })?;
    let mut errors = errors.into_iter();
    match (errors.next(), errors.len()) {
        (None, _) => Ok(()),
        (Some(e), 0) => Err(e),
        (Some(e), more) => {
            let rest: Vec<String> = errors.map(|e| format!("{e:#}")).collect();
            Err(e.context(format!(
                "{} downloads failed; the others: {}",
                more + 1,
                rest.join("; ")
            )))
        }
    }
}

/// The file being written, its running sha256 and length.
struct Sink {
    file: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
    hasher: Sha256,
    written: u64,
}

impl Sink {
    fn create(path: PathBuf) -> Result<Sink, DownloadError> {
        let file = std::fs::File::create(&path).map_err(|source| DownloadError::Io {
            what: "writing",
            path: path.clone(),
            source,
        })?;
        Ok(Sink {
            file: std::io::BufWriter::with_capacity(1 << 20, file),
            path,
            hasher: Sha256::new(),
            written: 0,
        })
    }

    fn io(&self, source: std::io::Error) -> DownloadError {
        DownloadError::Io {
            what: "writing",
            path: self.path.clone(),
            source,
        }
    }

    fn write(&mut self, chunk: &[u8]) -> Result<(), DownloadError> {
        self.file.write_all(chunk).map_err(|e| self.io(e))?;
        self.hasher.update(chunk);
        self.written += chunk.len() as u64;
        Ok(())
    }

    /// Back to an empty file (a try that cannot continue where the last stopped).
    fn reset(&mut self, on_bytes: &OnBytes) -> Result<(), DownloadError> {
        self.file.flush().map_err(|e| self.io(e))?;
        let f = self.file.get_mut();
        let cleared = f.set_len(0).and_then(|()| f.rewind());
        cleared.map_err(|e| self.io(e))?;
        on_bytes(-(self.written as i64));
        self.hasher = Sha256::new();
        self.written = 0;
        Ok(())
    }

    fn finish(mut self) -> Result<(String, u64), DownloadError> {
        self.file.flush().map_err(|e| self.io(e))?;
        Ok((hex::encode(self.hasher.finalize()), self.written))
    }
}

async fn fetch_one(
    client: &reqwest::Client,
    job: Job,
    cancel: &AtomicBool,
    on_bytes: &OnBytes,
) -> Result<Fetched, DownloadError> {
    let name = job.name.clone();
    fetch_job(client, job, cancel, on_bytes)
        .await
        .map_err(|e| match e {
            DownloadError::TooLarge { url, size, .. } => {
                DownloadError::TooLarge { name, url, size }
            }
            e => e,
        })
}

async fn fetch_job(
    client: &reqwest::Client,
    job: Job,
    cancel: &AtomicBool,
    on_bytes: &OnBytes,
) -> Result<Fetched, DownloadError> {
    let (sha, bytes, attempts) = match &job.source {
        Source::Local(src) => {
            let (src, dest, on_bytes) = (src.clone(), job.dest.clone(), on_bytes.clone());
            let limit = job.size;
            let (sha, bytes) =
                tokio::task::spawn_blocking(move || copy_local(&src, dest, limit, &on_bytes))
                    .await
                    .map_err(|e| DownloadError::Io {
                        what: "copying",
                        path: job.dest.clone(),
                        source: std::io::Error::other(e.to_string()),
                    })??;
            (sha, bytes, 1)
        }
        Source::Http(url) => {
            let mut sink = Sink::create(job.dest.clone())?;
            let mut attempt = 0;
            loop {
                attempt += 1;
                match try_once(client, url, &mut sink, job.size, cancel, on_bytes).await {
                    Ok(()) => break,
                    Err(e) if e.retry() == Retry::Transient && attempt < ATTEMPTS => {
                        let after = match &e {
                            DownloadError::Status { retry_after, .. } => *retry_after,
                            _ => None,
                        };
                        crate::progress::stage(
                            "download",
                            format!("{e}; try {} of {ATTEMPTS} in a moment", attempt + 1),
                        );
                        tokio::time::sleep(backoff(attempt, after)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
            let (sha, bytes) = sink.finish()?;
            (sha, bytes, attempt)
        }
    };
    if sha != job.sha256 {
        return Err(DownloadError::Hash {
            name: job.name,
            url: job.source.describe(),
            expected: job.sha256,
            actual: sha,
        });
    }
    Ok(Fetched { bytes, attempts })
}

/// One try: a GET (with `Range` when `sink` holds a partial file) streamed
/// into `sink`, at most `limit` bytes in all (the rest is not read).
async fn try_once(
    client: &reqwest::Client,
    url: &str,
    sink: &mut Sink,
    limit: Option<u64>,
    cancel: &AtomicBool,
    on_bytes: &OnBytes,
) -> Result<(), DownloadError> {
    let mut req = client.get(url);
    if sink.written > 0 {
        req = req.header(reqwest::header::RANGE, format!("bytes={}-", sink.written));
    }
    let mut resp = req.send().await.map_err(|e| transport(url, &e))?;
    let status = resp.status();
    if sink.written > 0 {
        let continues = status == reqwest::StatusCode::PARTIAL_CONTENT
            && range_start(&resp) == Some(sink.written);
        if !continues {
            // The server sent the whole file (or a range we did not ask for):
            // start over.
            sink.reset(on_bytes)?;
            if status != reqwest::StatusCode::OK {
                return Err(DownloadError::Transport {
                    url: url.to_string(),
                    message: format!("HTTP {status} to a range request"),
                    retry: Retry::Transient,
                });
            }
        }
    }
    if !status.is_success() {
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        return Err(DownloadError::Status {
            url: url.to_string(),
            status: status.as_u16(),
            retry_after,
        });
    }
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport(url, &e))? {
        if cancel.load(Ordering::SeqCst) {
            return Err(DownloadError::Cancelled);
        }
        sink.write(&chunk)?;
        on_bytes(chunk.len() as i64);
        if let Some(size) = limit.filter(|l| sink.written > *l) {
            return Err(DownloadError::TooLarge {
                name: String::new(),
                url: url.to_string(),
                size,
            });
        }
    }
    Ok(())
}

/// The first byte of a `206` response's `Content-Range: bytes a-b/n`.
fn range_start(resp: &reqwest::Response) -> Option<u64> {
    let v = resp
        .headers()
        .get(reqwest::header::CONTENT_RANGE)?
        .to_str()
        .ok()?;
    let range = v.trim().strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}

fn copy_local(
    src: &std::path::Path,
    dest: PathBuf,
    limit: Option<u64>,
    on_bytes: &OnBytes,
) -> Result<(String, u64), DownloadError> {
    let mut input = std::fs::File::open(src).map_err(|source| DownloadError::Io {
        what: "reading",
        path: src.to_path_buf(),
        source,
    })?;
    let mut sink = Sink::create(dest)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = input.read(&mut buf).map_err(|source| DownloadError::Io {
            what: "reading",
            path: src.to_path_buf(),
            source,
        })?;
        if n == 0 {
            break;
        }
        sink.write(&buf[..n])?;
        on_bytes(n as i64);
        if let Some(size) = limit.filter(|l| sink.written > *l) {
            return Err(DownloadError::TooLarge {
                name: String::new(),
                url: src.display().to_string(),
                size,
            });
        }
    }
    sink.finish()
}

/// How long [`unreachable`] waits for one URL to answer.
pub const REACH_TIMEOUT: Duration = Duration::from_secs(10);

/// The URLs of `urls` that do not answer, each with why: an `http(s)://`
/// URL is asked with a GET (its body never read) and any HTTP status is an
/// answer (an index root may well say 403 or 404); a DNS, connection, TLS
/// or timeout failure ([`REACH_TIMEOUT`]) is not. A `file://` URL answers
/// when its path exists. All are asked at once.
///
/// Errors: the async runtime cannot start.
pub fn unreachable(urls: &[String]) -> Result<Vec<(String, String)>> {
    let client = client_builder()
        .connect_timeout(REACH_TIMEOUT)
        .timeout(REACH_TIMEOUT)
        .build()
        .context("building the HTTP client")?;
    block_on(4, async {
        let asks = urls.iter().map(|url| {
            let client = client.clone();
            async move {
                if let Some(path) = url.strip_prefix("file://") {
                    return (!std::path::Path::new(path).exists())
                        .then(|| (url.clone(), format!("{path} does not exist")));
                }
                match client.get(url).send().await {
                    Ok(_) => None,
                    Err(e) => Some((url.clone(), error_chain(&e))),
                }
            }
        });
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified() {
        for s in [408, 425, 429, 500, 502, 503, 504, 599] {
            assert_eq!(classify_status(s), Retry::Transient, "{s}");
        }
        for s in [400, 401, 403, 404, 410, 416, 451] {
            assert_eq!(classify_status(s), Retry::Permanent, "{s}");
        }
    }

    #[test]
    fn download_errors_are_classified() {
        let status = |status| DownloadError::Status {
            url: "u".into(),
            status,
            retry_after: None,
        };
        assert_eq!(status(503).retry(), Retry::Transient);
        assert_eq!(status(404).retry(), Retry::Permanent);
        let hash = DownloadError::Hash {
            name: "a.whl".into(),
            url: "u".into(),
            expected: "aa".into(),
            actual: "bb".into(),
        };
        assert_eq!(hash.retry(), Retry::Permanent);
        assert_eq!(DownloadError::Cancelled.retry(), Retry::Permanent);
    }

    #[test]
    fn a_refused_connection_is_transient_and_a_bad_url_permanent() {
        // A port that was just free: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let client = client_builder().no_proxy().build().unwrap();
        let (refused, bad) = block_on(1, async {
            let refused = client
                .get(format!("http://127.0.0.1:{port}/x"))
                .send()
                .await
                .unwrap_err();
            let bad = client.get("http://[::1").send().await.unwrap_err();
            (refused, bad)
        })
        .unwrap();
        assert!(refused.is_connect(), "{refused:?}");
        assert_eq!(classify_error(&refused), Retry::Transient);
        assert_eq!(classify_error(&bad), Retry::Permanent, "{bad:?}");
    }

    #[test]
    fn backoff_doubles_and_honours_retry_after() {
        assert_eq!(backoff(1, None), Duration::from_millis(500));
        assert_eq!(backoff(2, None), Duration::from_secs(1));
        assert_eq!(backoff(3, None), Duration::from_secs(2));
        assert_eq!(backoff(10, None), Duration::from_secs(8));
        assert_eq!(backoff(1, Some(5)), Duration::from_secs(5));
        assert_eq!(backoff(1, Some(3600)), Duration::from_secs(60));
    }

    #[test]
    fn the_number_of_downloads_is_checked() {
        assert_eq!(parse_downloads(None).unwrap(), DEFAULT_DOWNLOADS);
        assert_eq!(parse_downloads(Some("3")).unwrap(), 3);
        for bad in ["0", "-1", "many", "65", ""] {
            let e = parse_downloads(Some(bad)).unwrap_err();
            assert_eq!(crate::exit::code_of(&e), 2, "{bad}");
            assert!(e.to_string().contains(DOWNLOADS_ENV), "{e}");
            assert!(e.to_string().contains(&format!("`{bad}`")), "{e}");
        }
    }

    #[test]
    fn a_file_longer_than_its_expected_size_is_cut_there_and_refused() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("big.whl");
        std::fs::write(&src, vec![7u8; 3 << 20]).unwrap();
        let dest = d.path().join("out");
        let job = Job {
            name: "big.whl".into(),
            source: Source::Local(src),
            dest: dest.clone(),
            sha256: "0".repeat(64),
            size: Some(1 << 20),
        };
        let mut got = None;
        fetch_all(vec![job], 1, Arc::new(|_| {}), |_, r| {
            got = Some(r);
            Ok(())
        })
        .unwrap();
        match got {
            Some(Err(e @ DownloadError::TooLarge { .. })) => {
                assert_eq!(e.retry(), Retry::Permanent);
                let m = e.to_string();
                assert!(m.contains("big.whl") && m.contains("1048576 bytes"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        // Read no further than one buffer past the size.
        assert!(std::fs::metadata(&dest).unwrap().len() <= 2 << 20);
    }

    #[test]
    fn file_urls_are_local_sources() {
        assert_eq!(
            Source::from_url("file:///tmp/a%20b/x-1.0-py3-none-any.whl").unwrap(),
            Source::Local(PathBuf::from("/tmp/a b/x-1.0-py3-none-any.whl"))
        );
        assert_eq!(
            Source::from_url("https://files.example/x.whl").unwrap(),
            Source::Http("https://files.example/x.whl".into())
        );
        assert!(Source::from_url("ftp://h/x.whl").is_err());
        assert!(Source::from_url("not a url").is_err());
    }
}
