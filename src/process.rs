//! Running external programs (python, uv, nvcc...) with their output kept.
//!
//! Every command's full output goes to a log file or into the error; long
//! commands stream their output line by line so progress can be shown.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fs_err as fs;

use crate::progress::Progress;

/// Runs `expr` to completion and returns its stdout (trimmed).
///
/// Errors: the program cannot start, or exits non-zero; the error names the
/// command (`what`) and ends with the last lines of its combined output.
pub fn capture(what: &str, expr: duct::Expression) -> Result<String> {
    let out = expr
        .stdout_capture()
        .stderr_capture()
        .unchecked()
        .run()
        .with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        bail!("{what} failed ({}):\n{}", out.status, tail(&text, 30));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
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
    let reader = expr
        .stderr_to_stdout()
        .unchecked()
        .reader()
        .with_context(|| format!("cannot run {what}"))?;
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

/// Runs `cmd` with a wall-clock `timeout`, stdout and stderr to `log`, in a
/// process group of its own. Returns `Ok(true)` when it exited 0, `Ok(false)`
/// when it exited non-zero, and `Err` when it ran past `timeout`: then the
/// whole group (the program and anything it started, such as an engine's
/// worker processes) is killed and the message says so.
pub fn run_with_timeout(cmd: duct::Expression, log: &Path, timeout: Duration) -> Result<bool> {
    use std::os::unix::process::CommandExt;
    let file = fs::File::create(log)?.into_parts().0;
    let err = file
        .try_clone()
        .with_context(|| format!("opening {}", log.display()))?;
    let handle = cmd
        .stdout_file(file)
        .stderr_file(err)
        .unchecked()
        .before_spawn(|c| {
            c.process_group(0);
            Ok(())
        })
        .start()
        .context("cannot start the smoke driver")?;
    let start = Instant::now();
    loop {
        if let Some(out) = handle.try_wait().context("waiting for the smoke driver")? {
            return Ok(out.status.success());
        }
        if start.elapsed() >= timeout {
            for pid in handle.pids() {
                if let Ok(pid) = i32::try_from(pid) {
                    // SAFETY: signals the process group the child leads (it was
                    // started with process_group(0), so its pgid is its pid).
                    unsafe { libc::kill(-pid, libc::SIGKILL) };
                }
            }
            let _ = handle.kill();
            bail!("timed out after {} s and was killed", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
