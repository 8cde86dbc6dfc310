//! Running external programs (python, uv, nvcc...) with their output kept.
//!
//! Every command's full output goes to a log file or into the error; long
//! commands stream their output line by line so progress can be shown.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fs_err as fs;

use crate::progress::Progress;

/// Process groups of the children running now (0: free slot), for the signal handler.
static GROUPS: [AtomicI32; 32] = [const { AtomicI32::new(0) }; 32];

/// A registered child process group; unregistered on drop.
struct Registered {
    slot: Option<usize>,
    watchdog: Option<std::process::Child>,
}

impl Registered {
    /// Registers the group led by the first of `pids` for the signal handler.
    fn new(pids: Vec<u32>) -> Registered {
        let Some(pid) = pids.first().and_then(|p| i32::try_from(*p).ok()) else {
            return Registered {
                slot: None,
                watchdog: None,
            };
        };
        let slot = GROUPS.iter().position(|g| {
            g.compare_exchange(0, pid, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
        Registered {
            slot,
            watchdog: None,
        }
    }

    /// [`Registered::new`], plus a watchdog process that terminates the group
    /// if this process dies without cleaning up (SIGKILL, OOM killer): it
    /// waits for EOF on a pipe only this process holds open. For long
    /// commands (wheel builds, installs, smoke cases), whose grandchildren
    /// `PR_SET_PDEATHSIG` does not reach.
    ///
    /// The watchdog runs in a session of its own (`setsid`), so a `kill -9`
    /// of the tool's whole process group does not take it along, and it
    /// inherits the locks of [`crate::store::held`].
    fn watched(pids: Vec<u32>) -> Registered {
        let mut r = Registered::new(pids.clone());
        if let (Some(pid), Ok(exe)) = (pids.first(), std::env::current_exe()) {
            let fds = crate::store::held::inherited();
            let mut c = std::process::Command::new(exe);
            c.args(["__watchdog", &pid.to_string()])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            // SAFETY: setsid and fcntl are async-signal-safe; `fds` was
            // allocated before the fork and is only read.
            unsafe {
                c.pre_exec(move || {
                    libc::setsid();
                    for fd in &fds {
                        libc::fcntl(*fd, libc::F_SETFD, 0);
                    }
                    Ok(())
                });
            }
            r.watchdog = c.spawn().ok();
        }
        r
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            GROUPS[i].store(0, Ordering::SeqCst);
        }
        if let Some(mut w) = self.watchdog.take() {
            // The group is done: stop the watchdog before its pgid can be reused.
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// The watchdog (`oracle-build __watchdog <pgid>`, see [`Registered::watched`]):
/// blocks until stdin reaches EOF (its parent died), then sends SIGTERM to
/// the process group `pgid`, SIGKILL after up to two seconds, and exits once
/// the group is gone (at most a minute later), releasing the locks it
/// inherited only then.
pub fn watchdog(pgid: i32) -> ! {
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    if pgid > 1 {
        // SAFETY: signals the process group the dead parent started.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        wait_group_gone(pgid, Duration::from_secs(2));
        // SAFETY: as above.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        wait_group_gone(pgid, Duration::from_secs(60));
    }
    std::process::exit(0)
}

/// Polls until no process is in group `pgid` (or `limit` passed).
fn wait_group_gone(pgid: i32, limit: Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        // SAFETY: signal 0 only checks whether the group has members.
        let rc = unsafe { libc::kill(-pgid, 0) };
        if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts every child in a process group of its own, asks the kernel to send
/// it SIGTERM if this process dies (`PR_SET_PDEATHSIG`, so a `kill -9` of the
/// tool does not leave uv running), and lets the signal handler find it.
fn isolate(expr: duct::Expression) -> duct::Expression {
    let parent = std::process::id() as i32;
    expr.before_spawn(move |c| {
        c.process_group(0);
        // SAFETY: prctl, getppid and _exit are async-signal-safe, as pre_exec requires.
        unsafe {
            c.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        Ok(())
    })
}

extern "C" fn on_signal(sig: libc::c_int) {
    for g in &GROUPS {
        let pgid = g.load(Ordering::SeqCst);
        if pgid > 0 {
            // SAFETY: kill is async-signal-safe; the group is one we started.
            unsafe { libc::kill(-pgid, libc::SIGTERM) };
        }
    }
    // SAFETY: _exit is async-signal-safe; staging left behind is removed by the next run.
    unsafe { libc::_exit(128 + sig) };
}

/// On SIGINT, SIGTERM or SIGHUP: terminate every child process group (a
/// wheel build's uv, setuptools, ninja, nvcc...) before exiting, so nothing
/// keeps writing into the store's staging after the tool is gone.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs a handler that only calls async-signal-safe functions.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// Runs `expr` to completion and returns its stdout (trimmed).
///
/// Errors: the program cannot start, or exits non-zero; the error names the
/// command (`what`) and ends with the last lines of its combined output.
pub fn capture(what: &str, expr: duct::Expression) -> Result<String> {
    let handle = isolate(expr)
        .stdout_capture()
        .stderr_capture()
        .unchecked()
        .start()
        .with_context(|| format!("cannot run {what}"))?;
    let _group = Registered::new(handle.pids());
    let out = handle
        .into_output()
        .with_context(|| format!("cannot run {what}"))?;
    stdout_of(what, &out)
}

/// The trimmed stdout of a finished `what`, or an error naming it with the
/// last lines of its combined output when it exited non-zero.
fn stdout_of(what: &str, out: &std::process::Output) -> Result<String> {
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        bail!("{what} failed ({}):\n{}", out.status, tail(&text, 30));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// [`capture`] with a wall-clock `timeout`: past it the whole process group
/// (the program and anything it started) is killed.
///
/// Errors: as [`capture`], or the program ran past `timeout` (the message
/// names the command, the limit and how to raise it: `limit_hint`).
pub fn capture_within(
    what: &str,
    expr: duct::Expression,
    timeout: Duration,
    limit_hint: &str,
) -> Result<String> {
    let handle = isolate(expr)
        .stdout_capture()
        .stderr_capture()
        .unchecked()
        .start()
        .with_context(|| format!("cannot run {what}"))?;
    let _group = Registered::watched(handle.pids());
    // Woken when it exits (not polled: a short run is not made to wait).
    let done = handle
        .wait_deadline(deadline_after(timeout))
        .with_context(|| format!("waiting for {what}"))?
        .is_some();
    if !done {
        kill_groups(&handle.pids());
        let _ = handle.kill();
        bail!(
            "{what} did not finish within {} s and was killed ({limit_hint})",
            timeout.as_secs()
        );
    }
    let out = handle
        .into_output()
        .with_context(|| format!("cannot run {what}"))?;
    stdout_of(what, &out)
}

/// How long a network command may stay silent ([`capture_watched`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silence {
    /// From the start until the first line the caller takes as the other
    /// end's answer.
    pub first: Duration,
    /// Between two lines of output after that answer.
    pub idle: Duration,
}

/// Why [`capture_watched`] killed a command: the root cause of its error
/// (`e.downcast_ref::<Stalled>()`), for callers that say it in their terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stalled {
    /// No answer within [`Silence::first`].
    NoAnswer(Duration),
    /// Nothing for [`Silence::idle`] after the answer.
    Idle(Duration),
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stalled::NoAnswer(d) => write!(f, "no answer within {} ms", d.as_millis()),
            Stalled::Idle(d) => write!(f, "silent for {} ms", d.as_millis()),
        }
    }
}

impl std::error::Error for Stalled {}

/// Runs `expr` (a command that talks to a server: git's fetches) with its
/// stdout captured and its stderr read as it comes, one line at a time
/// (a line ends at `\n` or at the `\r` of a progress meter), each given to
/// `on_line` with its end byte. The command must show that it is alive:
/// its first line that `answered` accepts within `silence.first`, then
/// some line at least every `silence.idle`; else its whole process group
/// is killed. Returns the trimmed stdout.
///
/// Errors: the program cannot start; it was killed ([`Stalled`] is the
/// root cause); it exits non-zero (the error names `what` and ends with
/// the last 30 lines `on_line` returned `true` for: the lines worth
/// showing).
pub fn capture_watched(
    what: &str,
    expr: duct::Expression,
    silence: Silence,
    answered: impl Fn(&str) -> bool,
    mut on_line: impl FnMut(&str, u8) -> bool,
) -> Result<String> {
    let (mut err_read, err_write) =
        std::io::pipe().with_context(|| format!("cannot run {what}"))?;
    let handle = isolate(expr)
        .stdout_capture()
        .stderr_file(err_write)
        .unchecked()
        .start()
        .with_context(|| format!("cannot run {what}"))?;
    let _group = Registered::new(handle.pids());
    let (tx, rx) = std::sync::mpsc::channel::<(String, u8)>();
    // Reads until every holder of the pipe's write end is gone (the
    // command and what it started), then hangs up.
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        let mut line: Vec<u8> = Vec::new();
        loop {
            let n = match std::io::Read::read(&mut err_read, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            for &b in &buf[..n] {
                if b == b'\n' || b == b'\r' {
                    let text = String::from_utf8_lossy(&line).into_owned();
                    line.clear();
                    if tx.send((text, b)).is_err() {
                        return;
                    }
                } else if line.len() < 64 * 1024 {
                    line.push(b);
                }
            }
        }
        if !line.is_empty() {
            let _ = tx.send((String::from_utf8_lossy(&line).into_owned(), b'\n'));
        }
    });
    let start = Instant::now();
    let mut answer: Option<Instant> = None;
    let mut kept: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    loop {
        let deadline = match answer {
            None => start + silence.first,
            Some(last) => last + silence.idle,
        };
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((line, end)) => {
                if answer.is_some() || answered(&line) {
                    answer = Some(Instant::now());
                }
                if on_line(&line, end) {
                    kept.push_back(line);
                    if kept.len() > 30 {
                        kept.pop_front();
                    }
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                kill_groups(&handle.pids());
                let _ = handle.kill();
                let why = match answer {
                    None => Stalled::NoAnswer(silence.first),
                    Some(_) => Stalled::Idle(silence.idle),
                };
                return Err(anyhow::Error::new(why).context(format!("{what} was killed")));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // Its stderr is closed: it is exiting (bounded all the same).
    let out = match handle
        .wait_deadline(deadline_after(silence.idle))
        .with_context(|| format!("waiting for {what}"))?
    {
        Some(out) => out.clone(),
        None => {
            kill_groups(&handle.pids());
            let _ = handle.kill();
            return Err(anyhow::Error::new(Stalled::Idle(silence.idle))
                .context(format!("{what} was killed")));
        }
    };
    if !out.status.success() {
        let text: Vec<String> = kept.into_iter().collect();
        bail!("{what} failed ({}):\n{}", out.status, text.join("\n"));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Sends SIGKILL to the process group each of `pids` leads.
fn kill_groups(pids: &[u32]) {
    for pid in pids {
        if let Ok(pid) = i32::try_from(*pid) {
            // SAFETY: signals the process group the child leads (it was
            // started with process_group(0), so its pgid is its pid).
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

/// A timeout in seconds from the environment variable `var`, else `default`.
///
/// Errors (exit 2): the variable is set but is not a whole number of seconds > 0.
pub fn timeout_from_env(var: &str, default: Duration) -> Result<Duration> {
    match std::env::var(var) {
        Err(_) => Ok(default),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(Duration::from_secs(n)),
            _ => Err(crate::exit::bad_input(format!(
                "${var} must be a whole number of seconds > 0, found {v:?}"
            ))),
        },
    }
}

/// Runs `expr` with stdout and stderr merged, appending every line to `log`
/// and feeding it to `progress` (which parses ninja's `[n/m]`).
///
/// Errors: the program cannot start, or exits non-zero; the error names the
/// command and the log, and quotes the log's last lines.
pub fn run_logged(
    what: &str,
    expr: duct::Expression,
    log: &Path,
    progress: &Progress,
) -> Result<()> {
    let mut file = fs::OpenOptions::new().create(true).append(true).open(log)?;
    writeln!(file, "$ {what}")?;
    let reader = isolate(expr)
        .stderr_to_stdout()
        .unchecked()
        .reader()
        .with_context(|| format!("cannot run {what}"))?;
    let _group = Registered::watched(reader.pids());
    let mut lines = BufReader::new(&reader);
    let mut kept: Vec<String> = Vec::new();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = lines
            .read_until(b'\n', &mut buf)
            .with_context(|| format!("reading output of {what}"))?;
        if n == 0 {
            break;
        }
        let line = String::from_utf8_lossy(&buf).trim_end().to_string();
        file.write_all(line.as_bytes())?;
        file.write_all(b"\n")?;
        progress.line(&line);
        kept.push(line);
        if kept.len() > 40 {
            kept.remove(0);
        }
    }
    let status = reader.try_wait().ok().flatten().map(|o| o.status);
    match status {
        Some(s) if s.success() => Ok(()),
        other => {
            let why = other.map_or("did not finish".to_string(), |s| s.to_string());
            bail!(
                "{what} failed ({why}); full log: {}\n{}",
                log.display(),
                kept.join("\n")
            )
        }
    }
}

/// `log` created (replaced), opened twice: for a child's stdout and stderr.
///
/// Errors: it cannot be created, naming it.
fn log_outputs(log: &Path) -> Result<(std::fs::File, std::fs::File)> {
    let file = fs::File::create(log)?.into_parts().0;
    let err = file
        .try_clone()
        .with_context(|| format!("opening {}", log.display()))?;
    Ok((file, err))
}

/// Runs `cmd` with a wall-clock `timeout`, stdout and stderr to `log`, in a
/// process group of its own. Returns `Ok(true)` when it exited 0, `Ok(false)`
/// when it exited non-zero, and `Err` when it ran past `timeout`: then the
/// whole group (the program and anything it started, such as an engine's
/// worker processes) is killed and the message says so.
pub fn run_with_timeout(cmd: duct::Expression, log: &Path, timeout: Duration) -> Result<bool> {
    let (file, err) = log_outputs(log)?;
    let handle = isolate(cmd)
        .stdout_file(file)
        .stderr_file(err)
        .unchecked()
        .start()
        .context("cannot start the smoke driver")?;
    let _group = Registered::watched(handle.pids());
    // Woken when it exits (not polled: each probe and case of a gate used
    // to wait up to 50 ms more).
    if let Some(out) = handle
        .wait_deadline(deadline_after(timeout))
        .context("waiting for the smoke driver")?
    {
        return Ok(out.status.success());
    }
    kill_groups(&handle.pids());
    let _ = handle.kill();
    bail!("timed out after {} s and was killed", timeout.as_secs());
}

/// A long-running child (a server) in a process group of its own, its
/// output in a log file; the group is stopped when this is dropped.
///
/// What stops it: [`Background::stop`] or dropping it (SIGTERM to the
/// group, SIGKILL to what is left after [`STOP_GRACE`]); the tool's
/// SIGINT/SIGTERM/SIGHUP handler (SIGTERM to every registered group); the
/// watchdog of [`Registered::watched`] when the tool dies without cleaning
/// up (SIGKILL, the OOM killer: SIGTERM, then SIGKILL to the group); and
/// `PR_SET_PDEATHSIG` (SIGTERM to the leader when the thread that started
/// it ends). A grandchild that leaves the group (`setsid`) escapes all of them.
pub struct Background {
    handle: duct::Handle,
    _group: Registered,
    stopped: std::sync::atomic::AtomicBool,
}

/// How long a stopped [`Background`] group has between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// Starts `cmd` as a [`Background`] child, stdout and stderr into `log`
/// (created, replaced).
///
/// Errors: the log cannot be created, or the program cannot be started.
pub fn start_background(cmd: duct::Expression, log: &Path) -> Result<Background> {
    let (file, err) = log_outputs(log)?;
    let handle = isolate(cmd)
        .stdout_file(file)
        .stderr_file(err)
        .stdin_null()
        .unchecked()
        .start()?;
    let group = Registered::watched(handle.pids());
    Ok(Background {
        handle,
        _group: group,
        stopped: std::sync::atomic::AtomicBool::new(false),
    })
}

impl Background {
    /// The process id of the child, which leads its process group.
    pub fn pid(&self) -> Option<u32> {
        self.handle.pids().first().copied()
    }

    /// The child's exit status once it has exited (`None` while it runs).
    pub fn exited(&self) -> Option<std::process::ExitStatus> {
        match self.handle.try_wait() {
            Ok(Some(out)) => Some(out.status),
            _ => None,
        }
    }

    /// Stops the whole group: SIGTERM, then SIGKILL to what is left after
    /// [`STOP_GRACE`]; reaps the child. Only the first call signals (a
    /// reaped group's id may be reused).
    pub fn stop(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        for pid in self.handle.pids() {
            let Ok(pgid) = i32::try_from(pid) else {
                continue;
            };
            // SAFETY: signals the process group the child leads.
            unsafe { libc::kill(-pgid, libc::SIGTERM) };
            let start = Instant::now();
            let mut gone = false;
            while !gone && start.elapsed() < STOP_GRACE {
                // Reaped, the leader stops counting as a member (a zombie would).
                let _ = self.handle.try_wait();
                // SAFETY: signal 0 only checks whether the group has members.
                let rc = unsafe { libc::kill(-pgid, 0) };
                gone =
                    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
                if !gone {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            if !gone {
                // SAFETY: the group still has members, so its id is still ours.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
            }
        }
        let _ = self.handle.kill();
        let _ = self.handle.wait();
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `timeout` from now, or a century when that overflows (an enormous
/// configured timeout waits as long as it can).
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The first line of a failed command's error `e` after its `... failed`
/// line (what the command printed first), trimmed; the first line when
/// there is no second.
pub fn failure_line(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines
        .get(1)
        .or(lines.first())
        .unwrap_or(&"")
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_background_group_is_gone_with_its_grandchildren() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let bg = start_background(
            duct::cmd!("sh", "-c", "sleep 300 & echo $!; sleep 300"),
            &log,
        )
        .unwrap();
        let pgid = i32::try_from(bg.pid().unwrap()).unwrap();
        let t0 = Instant::now();
        let child = loop {
            let text = std::fs::read_to_string(&log).unwrap();
            if let Ok(pid) = text.trim().parse::<i32>() {
                break pid;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no pid in {text:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(bg.exited().is_none());
        bg.stop();
        bg.stop();
        // SAFETY: signal 0 only checks whether the group has members.
        let rc = unsafe { libc::kill(-pgid, 0) };
        assert_ne!(rc, 0, "the group {pgid} still has members");
        // The grandchild was reparented and reaped (or is a zombie).
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty()
                || stat
                    .rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z')),
            "{stat}"
        );
        assert!(bg.exited().is_some());
    }
}
