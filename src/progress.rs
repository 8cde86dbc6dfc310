//! Progress on stderr: stage messages always, bars only on a terminal.
//!
//! Bars are indicatif's, drawn to stderr and hidden when stderr is not a
//! terminal, so logs and `--json` output stay clean.

use std::sync::OnceLock;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use regex::Regex;

/// Prints one stage message to stderr (`==> stage: message`).
pub fn stage(stage: &str, message: impl AsRef<str>) {
    line(format!("==> {stage}: {}", message.as_ref()));
}

/// Prints `text` and a newline to stderr, best effort: a closed or full
/// stderr (`build 2>&1 >/dev/null | head -1`, `2>/dev/full`) loses the
/// message, never the run (`eprintln!` would panic and abandon a build
/// midway).
pub fn line(text: impl std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// A progress bar for one long step; a spinner until a total is known.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A spinner labelled `label`, drawn on stderr when it is a terminal.
    pub fn new(label: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {prefix} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_prefix(label.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar }
    }

    /// A byte-level bar labelled `label` for a transfer of `total` bytes
    /// (bytes, rate and eta), or a byte counter when the total is unknown;
    /// drawn on stderr when it is a terminal.
    pub fn bytes(label: &str, total: Option<u64>) -> Progress {
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
        let template = if total.is_some() {
            "{prefix} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} (eta {eta}) {msg}"
        } else {
            "{spinner} {prefix} {bytes} {binary_bytes_per_sec} {msg}"
        };
        bar.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(label.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar }
    }

    /// A handle that moves this bar from other threads ([`Counter::add`]).
    pub fn counter(&self) -> Counter {
        Counter(self.bar.clone())
    }

    /// Sets the position and total (e.g. received objects of a git fetch).
    pub fn set(&self, pos: u64, total: u64, msg: &str) {
        if self.bar.length() != Some(total) {
            self.bar.set_length(total);
            self.bar.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
        }
        self.bar.set_position(pos);
        self.bar.set_message(msg.to_string());
    }

    /// Feeds one line of build output: ninja's `[n/m]` moves the bar,
    /// anything else becomes the message.
    pub fn line(&self, line: &str) {
        if let Some((n, m)) = parse_ninja(line) {
            self.set(n, m, "");
        } else {
            let short: String = line.chars().take(60).collect();
            self.bar.set_message(short);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Moves a [`Progress`] bar from any thread; dropping it leaves the bar.
#[derive(Clone)]
pub struct Counter(ProgressBar);

impl Counter {
    /// Moves the position by `delta` (negative: back, e.g. a restarted download).
    pub fn add(&self, delta: i64) {
        if delta >= 0 {
            self.0.inc(delta.unsigned_abs());
        } else {
            self.0.dec(delta.unsigned_abs());
        }
    }
}

/// Parses ninja's `[n/m] ...` status prefix into `(n, m)`.
pub fn parse_ninja(line: &str) -> Option<(u64, u64)> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let re = RE
        .get_or_init(|| Regex::new(r"^\s*\[(\d+)/(\d+)\]").ok())
        .as_ref()?;
    let caps = re.captures(line)?;
    Some((caps[1].parse().ok()?, caps[2].parse().ok()?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_ninja_status() {
        assert_eq!(
            super::parse_ninja("[12/380] Building CUDA object"),
            Some((12, 380))
        );
        assert_eq!(super::parse_ninja("running build_ext"), None);
    }
}
