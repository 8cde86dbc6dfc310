//! The Rust toolchain of a tree whose build needs Rust (setuptools-rust or
//! maturin among its build requirements, or a `rust-toolchain.toml`): `rustc`
//! and `cargo` found on PATH and run once each (`rustc -vV`, `cargo -V`),
//! measured outside any source tree so that no tree's toolchain file picks
//! them, and held against the channel the tree declares.
//!
//! rustup reads a tree's `rust-toolchain.toml` (or `rust-toolchain`) and,
//! when no installed toolchain has that exact name, stops (`toolchain
//! '1.95-x86_64-unknown-linux-gnu' is not installed`) or downloads one. A
//! declared channel is therefore matched against what is installed: a
//! toolchain of exactly that name first, else the default one when its
//! release satisfies the channel (`1.95` by `stable` at 1.95.0). The build
//! then runs cargo and rustc with `RUSTUP_TOOLCHAIN` naming it
//! ([`RustToolchain::env`]), so rustup never installs anything; the name is
//! recorded, the release and commit are keyed. A channel nothing installed
//! satisfies is refused before any work ([`Mismatch`], exit 2).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::host::process::{capture, failure_line};

/// A program that ran: its path and the first line it printed (the same
/// shape as `host::toolchain::Tool`, which uses this module).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Tool {
    /// Absolute path of the program.
    pub path: PathBuf,
    /// The first line of its version output.
    pub version: String,
}

/// A toolchain file of the tree and the channel it declares.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Declared {
    /// The file, relative to the tree (`rust-toolchain.toml`).
    pub file: String,
    /// `[toolchain] channel` (or the legacy file's one line), e.g. `1.95`;
    /// `None` when the file names none (a `path` toolchain, or only
    /// components): nothing to hold the toolchain against.
    pub channel: Option<String>,
}

/// The Rust toolchain a build runs, measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RustToolchain {
    /// `rustc`: its path on PATH (a rustup proxy, or a plain rustc) and
    /// the first line of `rustc -vV`.
    pub rustc: Tool,
    /// `cargo`: its path and `cargo -V`.
    pub cargo: Tool,
    /// `rustc -vV` `release:` (e.g. `1.95.0`, `1.97.0-nightly`). Keyed.
    pub release: String,
    /// `rustc -vV` `commit-hash:` (`unknown` for some distribution builds). Keyed.
    pub commit: String,
    /// `rustc -vV` `host:` (e.g. `x86_64-unknown-linux-gnu`). Keyed.
    pub host: String,
    /// The rustup toolchain the build runs (`stable-x86_64-unknown-linux-gnu`),
    /// passed as `RUSTUP_TOOLCHAIN`; `None` without rustup (a rustc that
    /// reads no toolchain file). Recorded, not keyed (a name, not content).
    pub toolchain: Option<String>,
    /// The tree's toolchain files and the channels they declare, each
    /// satisfied by this toolchain.
    #[serde(default)]
    pub declared: Vec<Declared>,
}

impl RustToolchain {
    /// The version number of `cargo -V` (`cargo 1.95.0 (f2d3ce0bd ...)` -> `1.95.0`).
    pub fn cargo_version(&self) -> &str {
        self.cargo
            .version
            .split_whitespace()
            .nth(1)
            .unwrap_or(&self.cargo.version)
    }

    /// The environment every cargo and rustc of the build runs with:
    /// `RUSTUP_TOOLCHAIN` naming the measured toolchain (rustup then reads
    /// no toolchain file and installs nothing; `RUSTUP_AUTO_INSTALL=0`
    /// says so to a rustup that would), and `CARGO`, the cargo measured
    /// (setuptools-rust runs `$CARGO`, else `cargo`).
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("CARGO".to_string(), self.cargo.path.display().to_string())];
        if let Some(t) = &self.toolchain {
            env.push(("RUSTUP_TOOLCHAIN".into(), t.clone()));
            env.push(("RUSTUP_AUTO_INSTALL".into(), "0".into()));
        }
        env
    }

    /// What the wheel key holds of it: release, commit, host and cargo's
    /// version, and the channels declared (never paths or the toolchain's name).
    pub fn key(&self) -> serde_json::Value {
        serde_json::json!({
            "rustc": self.release, "commit": self.commit, "host": self.host,
            "cargo": self.cargo_version(), "declared": self.declared,
        })
    }

    /// `rustc 1.95.0 (toolchain stable-x86_64-unknown-linux-gnu)`, for messages.
    pub fn describe(&self) -> String {
        match &self.toolchain {
            Some(t) => format!("rustc {} (rustup toolchain {t})", self.release),
            None => format!("rustc {} ({})", self.release, self.rustc.path.display()),
        }
    }
}

/// Why no toolchain can build the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// No working `rustc` or `cargo` (exit 1: the machine lacks a tool).
    Missing(String),
    /// A declared channel that no installed toolchain satisfies (exit 2:
    /// names the file and both versions).
    Mismatch(String),
}

/// The channel of a toolchain file's text `text` (`rust-toolchain.toml`, or
/// the legacy `rust-toolchain`: the same TOML, or one line naming the
/// channel). `None` when it names none.
///
/// Errors: TOML that does not parse, or a channel that is not a string
/// (the message names why; the caller names the file).
pub fn parse_toolchain_file(text: &str) -> Result<Option<String>, String> {
    let trimmed = text.trim();
    if !trimmed.is_empty()
        && !trimmed.contains('\n')
        && !trimmed.contains('=')
        && !trimmed.starts_with('[')
    {
        return Ok(Some(trimmed.to_string()));
    }
    let doc: toml::Table = toml::from_str(text).map_err(|e| e.message().to_string())?;
    match doc.get("toolchain").and_then(|t| t.get("channel")) {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s.trim().to_string())),
        Some(other) => Err(format!("toolchain.channel is {other}, not a string")),
    }
}

/// Whether a toolchain of `release` (`rustc -vV` `release:`) satisfies the
/// declared `channel`: `stable`, `beta`, `nightly` by a release of that
/// kind; `X.Y` by a stable `X.Y.*`; `X.Y.Z` by exactly that stable release.
/// A dated or otherwise named channel (`nightly-2026-01-01`) is satisfied
/// only by an installed toolchain of that name ([`measure`]), never here. Pure.
pub fn satisfies(channel: &str, release: &str) -> bool {
    let (number, kind) = match release.split_once('-') {
        Some((n, k)) => (n, Some(k)),
        None => (release, None),
    };
    match channel {
        "stable" => kind.is_none(),
        "beta" => kind.is_some_and(|k| k.starts_with("beta")),
        "nightly" => kind == Some("nightly"),
        c => {
            let parts: Vec<&str> = c.split('.').collect();
            let numeric = (2..=3).contains(&parts.len())
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
            if !numeric || kind.is_some() {
                return false;
            }
            if parts.len() == 3 {
                number == c
            } else {
                number.starts_with(&format!("{c}."))
            }
        }
    }
}

/// A neutral working directory for the probes: no toolchain file above it.
fn neutral_dir() -> PathBuf {
    PathBuf::from("/")
}

/// Runs `prog args` from [`neutral_dir`] with `RUSTUP_TOOLCHAIN` set to
/// `toolchain` when given (else the user's own setting or rustup's
/// default); stdout, trimmed.
fn run(prog: &Path, args: &[&str], toolchain: Option<&str>) -> anyhow::Result<String> {
    let mut cmd = duct::cmd(prog, args)
        .dir(neutral_dir())
        .env("RUSTUP_AUTO_INSTALL", "0");
    if let Some(t) = toolchain {
        cmd = cmd.env("RUSTUP_TOOLCHAIN", t);
    }
    capture(&format!("{} {}", prog.display(), args.join(" ")), cmd)
}

/// rustc's and cargo's identity under `toolchain` (`None`: the default).
fn probe(rustc: &Path, cargo: &Path, toolchain: Option<&str>) -> Result<RustToolchain, Problem> {
    let vv = run(rustc, &["-vV"], toolchain).map_err(|e| {
        Problem::Missing(format!(
            "{} -vV does not run: {}",
            rustc.display(),
            failure_line(&e)
        ))
    })?;
    let field = |name: &str| {
        vv.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let release = field("release:").ok_or_else(|| {
        Problem::Missing(format!("{} -vV printed no release: {vv}", rustc.display()))
    })?;
    let cargo_v = run(cargo, &["-V"], toolchain).map_err(|e| {
        Problem::Missing(format!(
            "{} -V does not run: {}",
            cargo.display(),
            failure_line(&e)
        ))
    })?;
    Ok(RustToolchain {
        rustc: Tool {
            path: rustc.to_path_buf(),
            version: vv.lines().next().unwrap_or("").trim().to_string(),
        },
        cargo: Tool {
            path: cargo.to_path_buf(),
            version: cargo_v.lines().next().unwrap_or("").trim().to_string(),
        },
        release,
        commit: field("commit-hash:").unwrap_or_else(|| "unknown".into()),
        host: field("host:").unwrap_or_default(),
        toolchain: toolchain.map(str::to_string),
        declared: Vec::new(),
    })
}

/// The first word of each line of `rustup toolchain list` (`stable-x86_64-...
/// (default)` -> `stable-x86_64-...`).
fn installed(rustup: &Path) -> Vec<String> {
    run(rustup, &["toolchain", "list"], None)
        .map(|out| {
            out.lines()
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Finds the Rust toolchain for a tree declaring `declared` (see the
/// module docs): `rustc` and `cargo` on PATH; with rustup, the installed
/// toolchain named exactly by every declared channel (`<channel>` or
/// `<channel>-<host>`), else the default one (`rustup show
/// active-toolchain` outside any tree, which honours a `RUSTUP_TOOLCHAIN`
/// the user set) when its release satisfies every channel ([`satisfies`]).
///
/// Errors: [`Problem::Missing`] when rustc or cargo is absent or does not
/// run; [`Problem::Mismatch`] naming the file, its channel and the
/// toolchain measured when a channel is not satisfied.
pub fn measure(declared: &[Declared]) -> Result<RustToolchain, Problem> {
    let find = |name: &str| {
        which::which(name).map_err(|_| {
            Problem::Missing(format!(
                "no {name} on PATH: the tree builds Rust (setuptools-rust, maturin or a rust-toolchain file); install Rust (https://rustup.rs)"
            ))
        })
    };
    let (rustc, cargo) = (find("rustc")?, find("cargo")?);
    let channels: Vec<(&Declared, &str)> = declared
        .iter()
        .filter_map(|d| d.channel.as_deref().map(|c| (d, c)))
        .collect();
    let rustup = which::which("rustup").ok();
    let default_name = rustup.as_ref().and_then(|r| {
        run(r, &["show", "active-toolchain"], None)
            .ok()
            .and_then(|o| o.split_whitespace().next().map(str::to_string))
    });
    let default = probe(&rustc, &cargo, default_name.as_deref())?;
    // An installed toolchain of exactly the declared name, when every
    // declared channel is the same one.
    let mut picked = None;
    if let (Some(r), Some((_, first))) = (&rustup, channels.first())
        && channels.iter().all(|(_, c)| c == first)
    {
        let full = format!("{first}-{}", default.host);
        if let Some(name) = installed(r).into_iter().find(|n| *n == full || n == first) {
            picked = Some(probe(&rustc, &cargo, Some(&name))?);
        }
    }
    let mut tc = match picked {
        Some(t) => t,
        None => {
            let unmet: Vec<String> = channels
                .iter()
                .filter(|(_, c)| !satisfies(c, &default.release))
                .map(|(d, c)| {
                    format!(
                        "{} declares channel {c}, but this machine's Rust is {} (release {}), which does not satisfy it, and no installed toolchain is named {c}",
                        d.file,
                        default.describe(),
                        default.release
                    )
                })
                .collect();
            if !unmet.is_empty() {
                return Err(Problem::Mismatch(format!(
                    "{}; install it (`rustup toolchain install {}`) or build a tree that declares what is installed",
                    unmet.join("; "),
                    channels[0].1
                )));
            }
            default
        }
    };
    tc.declared = declared.to_vec();
    Ok(tc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_is_satisfied_by_the_releases_it_names() {
        assert!(satisfies("1.95", "1.95.0"));
        assert!(satisfies("1.95", "1.95.2"));
        assert!(satisfies("1.95.0", "1.95.0"));
        assert!(!satisfies("1.95.1", "1.95.0"));
        assert!(!satisfies("1.9", "1.95.0"), "1.9 is not a prefix of 1.95");
        assert!(!satisfies("1.95", "1.96.0"));
        assert!(!satisfies("1.95", "1.95.0-nightly"));
        assert!(satisfies("stable", "1.95.0"));
        assert!(!satisfies("stable", "1.97.0-nightly"));
        assert!(satisfies("nightly", "1.97.0-nightly"));
        assert!(satisfies("beta", "1.96.0-beta.3"));
        assert!(!satisfies("nightly-2026-01-01", "1.97.0-nightly"));
        assert!(!satisfies("1", "1.95.0"));
        assert!(!satisfies("", "1.95.0"));
    }

    #[test]
    fn toolchain_files_name_their_channel() {
        assert_eq!(
            parse_toolchain_file("[toolchain]\nchannel = \"1.95\"\ncomponents = [\"clippy\"]\n"),
            Ok(Some("1.95".into()))
        );
        assert_eq!(
            parse_toolchain_file("nightly-2026-01-01\n"),
            Ok(Some("nightly-2026-01-01".into()))
        );
        assert_eq!(
            parse_toolchain_file("[toolchain]\npath = \"/opt/rust\"\n"),
            Ok(None)
        );
        assert!(parse_toolchain_file("[toolchain]\nchannel = 195\n").is_err());
        assert!(parse_toolchain_file("[toolchain\n").is_err());
    }
}
