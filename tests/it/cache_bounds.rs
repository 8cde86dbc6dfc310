//! Every read from a cache is bounded (issue 23): a proxy on 127.0.0.1,
//! written here with std::net and threads, stands in front of a real
//! `docker-registry` ([`crate::registry`]) and, for one mode at a time,
//! streams an endless blob, stalls, truncates a blob, returns garbage or an
//! endless manifest. `pull` through it ends (within the configured 2 s
//! timeouts: asserted as "it ends", never by time), exits 1 naming the cache
//! and the digest, and leaves nothing in the store; `build` reports the
//! stalled cache, stops asking it and does the work; `cache ls` ends too.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cache::{REPO, built_and_pushed, entries, ob, ok, strs};
use crate::registry::Registry;
use crate::support::*;

/// What the proxy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Forward every request.
    Pass,
    /// Blob GETs: a 200 whose body never ends.
    Endless,
    /// Blob GETs: read the request, never answer.
    Stall,
    /// Blob GETs: the registry's headers, half the body, then close.
    Truncate,
    /// Blob GETs: the registry's headers and as many bytes of garbage.
    Garbage,
    /// Blob GETs: the registry's headers, then its body a byte every 50 ms
    /// (never idle for a read timeout, 20 bytes a second).
    Drip,
    /// Manifest GETs: a 200 whose body never ends.
    EndlessManifest,
    /// Manifest GETs: the registry's headers, then no body ever.
    StallManifestBody,
    /// Tag list GETs: a 200 whose body never ends.
    EndlessTags,
    /// Every request: never answer.
    StallAll,
    /// Blob GETs: forward this many (counted from the last [`Proxy::set`]),
    /// then stall: a pull that dies half-way.
    StallAfter(usize),
}

struct Proxy {
    port: u16,
    mode: Arc<Mutex<Mode>>,
    stop: Arc<AtomicBool>,
    /// Blob GETs since the last [`Proxy::set`].
    blobs: Arc<AtomicUsize>,
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(Mutex::new(Mode::Pass));
        let stop = Arc::new(AtomicBool::new(false));
        let blobs = Arc::new(AtomicUsize::new(0));
        let (m, st, b) = (mode.clone(), stop.clone(), blobs.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(conn) = conn {
                    let (m, st, b) = (*m.lock().unwrap(), st.clone(), b.clone());
                    std::thread::spawn(move || {
                        let _ = serve(conn, upstream, m, &st, &b);
                    });
                }
            }
        });
        Proxy {
            port,
            mode,
            stop,
            blobs,
        }
    }

    fn url(&self) -> String {
        format!("oci+http://127.0.0.1:{}/{REPO}", self.port)
    }

    fn set(&self, m: Mode) {
        *self.mode.lock().unwrap() = m;
        self.blobs.store(0, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Holds the connection without answering until the proxy stops (at most
/// two minutes).
fn hold(stop: &AtomicBool) {
    let t = Instant::now();
    while !stop.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes a 200 with no length and `x` bytes until the client goes away.
fn endless(conn: &mut TcpStream, stop: &AtomicBool) -> std::io::Result<()> {
    conn.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
    )?;
    let chunk = vec![b'x'; 1 << 16];
    while !stop.load(Ordering::SeqCst) {
        conn.write_all(&chunk)?;
    }
    Ok(())
}

fn serve(
    mut conn: TcpStream,
    upstream: u16,
    mode: Mode,
    stop: &AtomicBool,
    blobs: &AtomicUsize,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        head.push(line);
    }
    let first = head.first().cloned().unwrap_or_default();
    let is_get = first.starts_with("GET ");
    let blob = is_get && first.contains("/blobs/sha256:");
    let manifest = is_get && first.contains("/manifests/");
    let tag_list = is_get && first.contains("/tags/list");
    let nth = if blob {
        blobs.fetch_add(1, Ordering::SeqCst)
    } else {
        0
    };
    match mode {
        Mode::StallAfter(n) if blob && nth >= n => {
            hold(stop);
            return Ok(());
        }
        Mode::StallAll => {
            hold(stop);
            return Ok(());
        }
        Mode::Stall if blob => {
            hold(stop);
            return Ok(());
        }
        Mode::Endless if blob => return endless(&mut conn, stop),
        Mode::EndlessManifest if manifest => return endless(&mut conn, stop),
        Mode::EndlessTags if tag_list => return endless(&mut conn, stop),
        _ => {}
    }
    // Forward, one request per connection.
    let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
    let mut length = 0usize;
    for h in &head {
        let lower = h.to_ascii_lowercase();
        if lower.starts_with("connection:") {
            continue;
        }
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        up.write_all(h.as_bytes())?;
    }
    up.write_all(b"Connection: close\r\n\r\n")?;
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    up.write_all(&body)?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp)?;
    if manifest && mode == Mode::StallManifestBody {
        let split = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(resp.len(), |p| p + 4);
        conn.write_all(&resp[..split])?;
        conn.flush()?;
        hold(stop);
        return Ok(());
    }
    if blob && matches!(mode, Mode::Truncate | Mode::Garbage | Mode::Drip) {
        let split = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(resp.len(), |p| p + 4);
        let (headers, payload) = resp.split_at(split);
        conn.write_all(headers)?;
        if mode == Mode::Drip {
            for b in payload {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                conn.write_all(std::slice::from_ref(b))?;
                conn.flush()?;
                std::thread::sleep(Duration::from_millis(50));
            }
            return Ok(());
        }
        if mode == Mode::Truncate {
            conn.write_all(&payload[..payload.len() / 2])?;
        } else {
            conn.write_all(&vec![b'g'; payload.len()])?;
        }
        return conn.flush();
    }
    conn.write_all(&resp)?;
    conn.flush()
}

/// Writes `<store>/config.toml`: the cache `team` at `url` with 2 s timeouts.
fn configure(store: &Path, url: &str, allowed: &Path) {
    std::fs::create_dir_all(store).unwrap();
    std::fs::write(
        store.join("config.toml"),
        format!(
            "[[cache]]\nname = \"team\"\nurl = \"{url}\"\ntrusted_signers = \"{}\"\nconnect_timeout = \"2s\"\nread_timeout = \"2s\"\n",
            allowed.display()
        ),
    )
    .unwrap();
}

/// Runs `c`, killing it after two minutes; panics when it did not end by itself.
fn ends(mut c: Command, what: &str) -> Output {
    let child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let killer = std::thread::spawn(move || {
        let t = Instant::now();
        while !d.load(Ordering::SeqCst) {
            if t.elapsed() > Duration::from_secs(120) {
                let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    });
    let out = child.wait_with_output().unwrap();
    done.store(true, Ordering::SeqCst);
    assert!(
        !killer.join().unwrap(),
        "{what} did not end: {}",
        text(&out)
    );
    out
}

/// Every file left under `<store>/**/tmp/` (staging of a run).
fn residue(store: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for tmp in [store.join("tmp"), store.join("store/tmp")] {
        if tmp.is_dir() {
            out.extend(tree(&tmp).into_iter().map(|p| p.display().to_string()));
        }
    }
    out
}

/// The blobs kept for a resumed pull (`<store>/downloads/sha256/`).
fn kept(store: &Path) -> Vec<String> {
    std::fs::read_dir(store.join("downloads/sha256"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_misbehaving_cache_ends_within_its_timeouts_and_leaves_nothing() {
    let reg = Registry::start(None);
    let (fx, recipe, first, allowed) = built_and_pushed(&reg.url(REPO), None);
    let r = recipe.to_str().unwrap();
    let proxy = Proxy::start(reg.port);
    let url = proxy.url();
    let b = fx.dir().join("store-b");
    configure(&b, &url, &allowed);

    for (mode, why) in [
        (Mode::Endless, "sends more than"),
        (Mode::Stall, "read_timeout"),
        (Mode::Truncate, "downloading blob sha256:"),
        (Mode::Garbage, "does not match its digest"),
        (Mode::Drip, "slower than 1 KiB/s"),
    ] {
        proxy.set(mode);
        let out = ends(fx.cmd_at(&b, &["pull", r]), &format!("pull ({mode:?})"));
        let t = text(&out);
        assert_eq!(code(&out), 1, "{mode:?}: {t}");
        assert!(t.contains(&format!("cache {url}")), "{mode:?}: {t}");
        assert!(t.contains("blob sha256:"), "{mode:?}: {t}");
        assert!(t.contains(why), "{mode:?}: {t}");
        assert!(entries(&b).is_empty(), "{mode:?}: {:?}", entries(&b));
        assert!(residue(&b).is_empty(), "{mode:?}: {:?}", residue(&b));
        assert!(kept(&b).is_empty(), "{mode:?}: {:?}", kept(&b));
    }
    proxy.set(Mode::EndlessManifest);
    let out = ends(fx.cmd_at(&b, &["pull", r]), "pull (endless manifest)");
    let t = text(&out);
    assert_eq!(code(&out), 1, "{t}");
    assert!(
        t.contains(&format!("cache {url}: reading the manifest of inputs-"))
            && t.contains("more than 4194304 bytes"),
        "{t}"
    );
    assert!(entries(&b).is_empty() && residue(&b).is_empty());
    // A manifest whose body never comes: a timeout, said as one (not as the
    // size limit).
    proxy.set(Mode::StallManifestBody);
    let out = ends(fx.cmd_at(&b, &["pull", r]), "pull (stalled manifest body)");
    let t = text(&out);
    assert_eq!(code(&out), 1, "{t}");
    assert!(
        t.contains("reading the manifest of inputs-")
            && t.contains("read_timeout")
            && !t.contains("may hold at most"),
        "{t}"
    );
    assert!(entries(&b).is_empty() && residue(&b).is_empty());
    // An endless tag list: `cache ls` stops at the page bound.
    proxy.set(Mode::EndlessTags);
    let out = ends(
        fx.cmd_at(&b, &["cache", "ls"]),
        "cache ls (endless tag list)",
    );
    let t = text(&out);
    assert_ne!(code(&out), 0, "{t}");
    assert!(
        t.contains(&format!("cache {url}: listing tags")) && t.contains("more than 4194304 bytes"),
        "{t}"
    );

    // A pull that dies after 3 blobs keeps them, checked; the next pull
    // takes them from the store instead of the cache.
    let full = fx.dir().join("store-full");
    configure(&full, &url, &allowed);
    proxy.set(Mode::Pass);
    ok(&ob(&fx, &full, None, "f@test", &["pull", r, "--json"]));
    let all = proxy.blobs.load(Ordering::SeqCst);
    proxy.set(Mode::StallAfter(3));
    let out = ends(fx.cmd_at(&b, &["pull", r]), "pull (dies after 3 blobs)");
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert_eq!(kept(&b).len(), 3, "{:?}", kept(&b));
    assert!(entries(&b).is_empty(), "{:?}", entries(&b));

    // With the proxy well-behaved again the same pull succeeds.
    proxy.set(Mode::Pass);
    let pulled = ok(&ob(&fx, &b, None, "b@test", &["pull", r, "--json"]));
    assert_eq!(pulled["resumed"], 3, "{pulled}");
    assert_eq!(proxy.blobs.load(Ordering::SeqCst), all - 3);
    assert_eq!(entries(&b), entries(&full));
    assert!(kept(&b).is_empty(), "{:?}", kept(&b));

    // SIGKILL mid-pull: the bytecode trees (downloaded first) are unpacked
    // in staging and the last blobs stall. Nothing is added; the next pull
    // removes the staging, says so, resumes from the kept blobs and brings
    // the same entries.
    let c = fx.dir().join("store-c");
    configure(&c, &url, &allowed);
    proxy.set(Mode::StallAfter(all - 2));
    let mut child = fx
        .cmd_at(&c, &["pull", r])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let trees_unpacked = || {
        std::fs::read_dir(c.join("tmp")).is_ok_and(|d| {
            d.flatten().any(|e| {
                std::fs::read_dir(e.path().join("trees")).is_ok_and(|mut t| t.next().is_some())
            })
        })
    };
    let t = Instant::now();
    while !(proxy.blobs.load(Ordering::SeqCst) > all - 2 && trees_unpacked()) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the pull never stalled with its trees unpacked"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = Command::new("kill")
        .arg("-9")
        .arg(child.id().to_string())
        .status();
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    assert!(entries(&c).is_empty(), "{:?}", entries(&c));
    assert!(!residue(&c).is_empty(), "the killed pull left its staging");
    proxy.set(Mode::Pass);
    let out = ob(&fx, &c, None, "c@test", &["pull", r, "--json"]);
    let pulled = ok(&out);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        said.contains("stale staging") && said.contains("partial download(s)"),
        "{said}"
    );
    assert!(pulled["resumed"].as_u64().unwrap() > 0, "{pulled}");
    assert_eq!(entries(&c), entries(&full));
    assert!(residue(&c).is_empty(), "{:?}", residue(&c));
    assert!(kept(&c).is_empty(), "{:?}", kept(&c));

    // A cache that stalls on every request: `cache ls` fails naming it.
    proxy.set(Mode::StallAll);
    let out = ends(fx.cmd_at(&b, &["cache", "ls"]), "cache ls (stalled)");
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(text(&out).contains(&url), "{}", text(&out));

    // `build` (the wheel gone from the store, so it asks the cache) reports
    // the stalled cache, stops asking it, and builds the wheel itself.
    let wheel = first["keys"]["wheel"].as_str().unwrap();
    force_remove(&b.join("store/wheels").join(wheel));
    let out = ends(fx.cmd_at(&b, &["build", r, "--json"]), "build (stalled)");
    let t = text(&out);
    assert_eq!(code(&out), 0, "{t}");
    assert!(
        t.contains(&format!("not substituting wheels/{wheel} from {url}"))
            && t.contains("not asking"),
        "{t}"
    );
    let report = json(&out);
    assert!(
        strs(&report["built"]).contains(&"wheel".to_string()),
        "{report}"
    );
    assert_eq!(report["key"], first["key"], "{report}");

    // A store missing its wheel and two wheelhouse entries, and a cache that
    // answers its tags and manifests but stalls every blob: the first entry
    // taken from it times out, the build says so once, asks that cache
    // nothing more, and makes every entry itself (not a read timeout per
    // entry).
    let d = fx.dir().join("store-d");
    succeeds(Command::new("cp").arg("-a").arg(&b).arg(&d));
    force_remove(&d.join("store/wheels").join(wheel));
    let mut house: Vec<_> = std::fs::read_dir(d.join("store/wheelhouse"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    house.sort();
    assert!(house.len() >= 2, "{house:?}");
    for e in &house[..2] {
        force_remove(e);
    }
    proxy.set(Mode::Stall);
    let out = ends(
        fx.cmd_at(&d, &["build", r, "--json"]),
        "build (blobs stalled)",
    );
    let t = text(&out);
    assert_eq!(code(&out), 0, "{t}");
    let skipped: Vec<&str> = t
        .lines()
        .filter(|l| l.contains("not substituting"))
        .collect();
    assert_eq!(skipped.len(), 1, "{t}");
    assert!(
        skipped[0].contains("read_timeout") && skipped[0].contains("not asking"),
        "{t}"
    );
    assert_eq!(json(&out)["key"], first["key"], "{t}");
}
