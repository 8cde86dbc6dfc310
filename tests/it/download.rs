//! The wheelhouse filled through the parallel HTTP path: a PEP 503 index
//! served on 127.0.0.1 by a small HTTP/1.1 server in this test process,
//! which can be told to misbehave for one wheel (serve other bytes, answer
//! 503 once, cut the body once, stall until the client is killed), and can
//! act as an HTTP proxy. The fixture's runtime set gets one package from that
//! index (the rest from the default index); the real binary locks it while
//! the server is well-behaved, then builds while it misbehaves.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::real::make_index;
use crate::support::*;

/// What the server does with the armed wheel.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Serve every file as it is.
    Good,
    /// Serve [`CORRUPT`] instead of the wheel.
    Corrupt,
    /// Answer 503 once, then serve it.
    FailFirst,
    /// Send half of the body and close the connection once, then serve it
    /// (with `Range` requests honoured).
    CutOnce,
    /// Send half of the body, then hold the connection until released.
    Stall,
}

/// The bytes served in [`Mode::Corrupt`].
const CORRUPT: &[u8] = b"this is not the wheel the lock names\n";

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    /// The path asked for.
    pub(crate) path: String,
    /// Whether it came in absolute form (through a proxy).
    proxied: bool,
    /// Its `Range` header, if any.
    range: Option<String>,
}

struct State {
    root: PathBuf,
    /// Mode for wheels whose name starts with `armed`.
    mode: Mutex<Mode>,
    armed: String,
    hits: Mutex<Vec<Hit>>,
    stalled: AtomicBool,
    release: AtomicBool,
}

/// The server; stops accepting when dropped.
pub(crate) struct Index {
    state: Arc<State>,
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Index {
    /// Serves `root` on a free port of 127.0.0.1; `armed` names the wheel
    /// (file name prefix) the modes apply to.
    pub(crate) fn start(root: &Path, armed: &str) -> Index {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            root: root.to_path_buf(),
            mode: Mutex::new(Mode::Good),
            armed: armed.to_string(),
            hits: Mutex::new(Vec::new()),
            stalled: AtomicBool::new(false),
            release: AtomicBool::new(false),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(conn) = conn {
                    let s = s.clone();
                    std::thread::spawn(move || {
                        let _ = serve(&s, conn);
                    });
                }
            }
        });
        Index { state, port, stop }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/simple", self.port)
    }

    /// `http://127.0.0.1:<port>/`: the root it serves.
    pub(crate) fn base(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    fn set(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = mode;
    }

    /// Requests for the armed wheel so far.
    pub(crate) fn wheel_hits(&self) -> Vec<Hit> {
        self.state
            .hits
            .lock()
            .unwrap()
            .iter()
            .filter(|h| is_armed(&self.state, &h.path))
            .cloned()
            .collect()
    }

    fn clear_hits(&self) {
        self.state.hits.lock().unwrap().clear();
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.state.release.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn is_armed(s: &State, path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or("");
    name.starts_with(&s.armed) && name.ends_with(".whl")
}

fn serve(s: &State, conn: TcpStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("/").to_string();
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("range")
        {
            range = Some(v.trim().to_string());
        }
    }
    // Absolute form (`GET http://host/path`) is what a client sends to a proxy.
    let proxied = target.starts_with("http://");
    let path = if proxied {
        let rest = &target["http://".len()..];
        rest.find('/').map_or("/", |i| &rest[i..]).to_string()
    } else {
        target.clone()
    };
    let path = path.split(['?', '#']).next().unwrap_or("/").to_string();
    s.hits.lock().unwrap().push(Hit {
        path: path.clone(),
        proxied,
        range: range.clone(),
    });
    let mut file = s.root.join(path.trim_start_matches('/'));
    if file.is_dir() {
        file = file.join("index.html");
    }
    let mut out = conn;
    let Ok(mut body) = std::fs::read(&file) else {
        return respond(
            &mut out,
            "404 Not Found",
            "text/plain",
            &[],
            b"not found\n",
            &method,
        );
    };
    let ctype = if file.extension().is_some_and(|e| e == "html") {
        "text/html"
    } else {
        "application/octet-stream"
    };
    let mut mode = Mode::Good;
    if is_armed(s, &path) {
        let mut m = s.mode.lock().unwrap();
        mode = *m;
        // The one-shot modes misbehave once.
        if matches!(*m, Mode::FailFirst | Mode::CutOnce) {
            *m = Mode::Good;
        }
    }
    match mode {
        Mode::Good => {}
        Mode::Corrupt => body = CORRUPT.to_vec(),
        Mode::FailFirst => {
            return respond(
                &mut out,
                "503 Service Unavailable",
                "text/plain",
                &[],
                b"busy\n",
                &method,
            );
        }
        Mode::CutOnce | Mode::Stall => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            out.write_all(head.as_bytes())?;
            out.write_all(&body[..body.len() / 2])?;
            out.flush()?;
            if mode == Mode::Stall {
                s.stalled.store(true, Ordering::SeqCst);
                while !s.release.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            return out.shutdown(std::net::Shutdown::Both);
        }
    }
    if let Some(start) = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|r| r.parse::<usize>().ok())
        .filter(|&n| n < body.len())
    {
        let cr = format!(
            "Content-Range: bytes {start}-{}/{}",
            body.len() - 1,
            body.len()
        );
        return respond(
            &mut out,
            "206 Partial Content",
            ctype,
            &[cr],
            &body[start..],
            &method,
        );
    }
    respond(&mut out, "200 OK", ctype, &[], &body, &method)
}

fn respond(
    out: &mut TcpStream,
    status: &str,
    ctype: &str,
    extra: &[String],
    body: &[u8],
    method: &str,
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for h in extra {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    if method != "HEAD" {
        out.write_all(body)?;
    }
    out.flush()
}

/// The package the local index serves, and its wheel.
const PKG: &str = "fxdl";
const WHEEL: &str = "fxdl-1.0-py3-none-any.whl";

/// A test directory with the index (`fxdl 1.0`), the fixture repository
/// needing `fxdl`, a recipe taking `fxdl` from the local index, locked.
/// Returns (fx, index, recipe, the wheel's sha256).
fn setup() -> (Fx, Index, PathBuf, String) {
    let fx = Fx::new();
    let root = fx.dir().join("index");
    make_index(&root, &[&format!("{PKG}==1.0")]);
    let index = Index::start(&root, "fxdl-");
    let wheel = std::fs::read(root.join("simple").join(PKG).join(WHEEL)).unwrap();
    let sha = hex(&wheel);
    let (repo, _) = fx.repo();
    let common = repo.join("requirements/common.txt");
    let mut reqs = std::fs::read_to_string(&common).unwrap();
    reqs.push_str(&format!("{PKG}\n"));
    std::fs::write(&common, reqs).unwrap();
    git(&repo, &["commit", "-qam", "needs fxdl"]);
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    // Local files carry no upload time, so no --exclude-newer cut-off here.
    let extra = format!(
        "indexes:\n  - name: local\n    url: {}\n    packages: [{PKG}]\nlock:\n  exclude_newer: none\n",
        index.url()
    );
    let recipe = fx.recipe("dl", &repo, &commit, &extra);
    let out = fx.run(&["lock", recipe.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let lock = std::fs::read_to_string(fx.dir().join("lockfiles/dl/pylock.runtime.toml")).unwrap();
    assert!(
        lock.contains(&index.url()),
        "fxdl comes from the local index:\n{lock}"
    );
    assert!(lock.contains(&sha), "{lock}");
    // `lock` filled the wheelhouse already: the builds start from an empty
    // store (the lock stays, in `lockfiles/`).
    force_remove(fx.store());
    index.clear_hits();
    (fx, index, recipe, sha)
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `build <recipe> --no-smoke` (exit 4 when built: not smoked).
fn build(fx: &Fx, recipe: &Path) -> Output {
    fx.run(&["build", recipe.to_str().unwrap(), "--no-smoke"])
}

fn built(out: &Output) {
    assert_eq!(code(out), 4, "{}", text(out));
    assert!(text(out).contains("not smoked"), "{}", text(out));
}

fn wheelhouse_entry(fx: &Fx, sha: &str) -> PathBuf {
    fx.store().join("store/wheelhouse").join(sha)
}

/// Staging directories of wheelhouse downloads left in the store.
fn stray_staging(fx: &Fx) -> Vec<PathBuf> {
    std::fs::read_dir(fx.store().join("tmp"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("wheelhouse-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_corrupted_download_is_refused_naming_both_hashes_and_leaves_nothing() {
    let (fx, index, recipe, sha) = setup();
    index.set(Mode::Corrupt);
    let out = build(&fx, &recipe);
    let t = text(&out);
    assert_eq!(code(&out), 1, "{t}");
    assert!(t.contains(WHEEL), "names the file: {t}");
    assert!(
        t.contains(&format!("the lock says {sha}")),
        "expected sha256: {t}"
    );
    assert!(
        t.contains(&format!("has sha256 {}", hex(CORRUPT))),
        "actual sha256: {t}"
    );
    assert!(!wheelhouse_entry(&fx, &sha).exists());
    assert_eq!(stray_staging(&fx), Vec::<PathBuf>::new());
    assert!(!index.wheel_hits().is_empty());

    // The same store, once the index serves the right bytes, builds.
    index.set(Mode::Good);
    built(&build(&fx, &recipe));
    let entry = wheelhouse_entry(&fx, &sha);
    assert_eq!(hex(&std::fs::read(entry.join(WHEEL)).unwrap()), sha);
    let rec = read_json(&entry.join("artifact.json"));
    assert_eq!(rec["sha256"], sha.as_str(), "{rec}");
    assert!(entry.join("manifest.json").is_file());
}

#[test]
fn a_503_is_retried_and_the_build_succeeds() {
    let (fx, index, recipe, sha) = setup();
    index.set(Mode::FailFirst);
    let out = build(&fx, &recipe);
    built(&out);
    assert!(
        text(&out).contains("HTTP 503"),
        "the retry is said: {}",
        text(&out)
    );
    assert_eq!(index.wheel_hits().len(), 2, "{:?}", index.wheel_hits());
    assert!(wheelhouse_entry(&fx, &sha).join(WHEEL).is_file());
}

#[test]
fn a_cut_download_resumes_where_it_stopped() {
    let (fx, index, recipe, sha) = setup();
    let len = std::fs::read(fx.dir().join("index/simple").join(PKG).join(WHEEL))
        .unwrap()
        .len();
    index.set(Mode::CutOnce);
    built(&build(&fx, &recipe));
    let hits = index.wheel_hits();
    assert_eq!(hits.len(), 2, "{hits:?}");
    assert_eq!(hits[0].range, None, "{hits:?}");
    assert_eq!(
        hits[1].range.as_deref(),
        Some(format!("bytes={}-", len / 2).as_str()),
        "{hits:?}"
    );
    let entry = wheelhouse_entry(&fx, &sha);
    assert_eq!(hex(&std::fs::read(entry.join(WHEEL)).unwrap()), sha);
}

#[test]
fn a_killed_download_leaves_the_store_valid_and_the_next_run_finishes_it() {
    let (fx, index, recipe, sha) = setup();
    index.set(Mode::Stall);
    let mut child = fx
        .cmd(&["build", recipe.to_str().unwrap(), "--no-smoke"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the download to be under way (half the wheel sent).
    while !index.state.stalled.load(Ordering::SeqCst) {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the build ended before the download stalled: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    index.state.release.store(true, Ordering::SeqCst);
    assert!(!wheelhouse_entry(&fx, &sha).exists());

    index.set(Mode::Good);
    let out = build(&fx, &recipe);
    built(&out);
    let entry = wheelhouse_entry(&fx, &sha);
    assert_eq!(hex(&std::fs::read(entry.join(WHEEL)).unwrap()), sha);
    // The killed run's staging directory is gone too.
    assert_eq!(stray_staging(&fx), Vec::<PathBuf>::new());
    let out = fx.run(&["verify", recipe.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

#[test]
fn downloads_go_through_the_proxy_the_environment_names() {
    let (fx, index, recipe, sha) = setup();
    // The lock names 127.0.0.1:<index>; a proxy on another port serves the
    // same files. The index stops answering directly: only the proxy works.
    let proxy = Index::start(&fx.dir().join("index"), "fxdl-");
    let lock = fx.dir().join("lockfiles/dl/pylock.runtime.toml");
    assert!(
        std::fs::read_to_string(&lock)
            .unwrap()
            .contains(&index.url())
    );
    drop(index);
    let out = fx
        .cmd(&["build", recipe.to_str().unwrap(), "--no-smoke"])
        .env("HTTP_PROXY", format!("http://127.0.0.1:{}", proxy.port))
        .env("http_proxy", format!("http://127.0.0.1:{}", proxy.port))
        .env("NO_PROXY", "pypi.org,files.pythonhosted.org")
        .env("no_proxy", "pypi.org,files.pythonhosted.org")
        .output()
        .unwrap();
    built(&out);
    let hits = proxy.wheel_hits();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(hits[0].proxied, "{hits:?}");
    assert!(wheelhouse_entry(&fx, &sha).join(WHEEL).is_file());
}

#[test]
fn a_bad_number_of_downloads_is_refused_with_exit_2() {
    let (fx, _index, recipe, _sha) = setup();
    let before = tree(fx.store());
    let out = fx
        .cmd(&["build", recipe.to_str().unwrap(), "--no-smoke"])
        .env("ORACLE_BUILD_DOWNLOADS", "lots")
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(code(&out), 2, "{t}");
    assert!(
        t.contains("ORACLE_BUILD_DOWNLOADS") && t.contains("`lots`"),
        "{t}"
    );
    assert_eq!(tree(fx.store()), before, "nothing was written");
}
