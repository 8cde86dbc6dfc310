//! `oracle-build push <PIN> [--cache URL]`: options in, one call to
//! `pipeline::push`, the report rendered (text or `--json`). What is pushed
//! and in which order: see `pipeline::push` and docs/cache.md.

use anyhow::Result;

use crate::ops::{Session, print_json};
use crate::pipeline::push::{self as engine, PushState};

/// Options of `push`.
#[derive(Debug, Clone, Default)]
pub struct PushOptions {
    /// `--cache URL|NAME` (else the configured caches).
    pub cache: Option<String>,
}

/// `push`: uploads PIN's built oracle's inputs to the caches and prints
/// what happened per cache.
///
/// Errors: as `pipeline::push::push`.
pub fn push(s: &Session, pin_arg: &str, opts: &PushOptions) -> Result<()> {
    let lr = s.recipe(pin_arg)?;
    let root = s.root()?;
    let reports = engine::push(&lr, &root, opts.cache.as_deref(), s.lockfiles())?;
    if s.json {
        return print_json(&reports);
    }
    for rep in &reports {
        let n = |s: PushState| rep.artifacts.iter().filter(|a| a.state == s).count();
        let bytes: u64 = rep.artifacts.iter().map(|a| a.uploaded).sum();
        println!(
            "pushed {} to {}: {} artifacts uploaded ({:.1} MiB), {} already there, {} signed now{}",
            rep.recipe,
            rep.cache,
            n(PushState::Pushed),
            bytes as f64 / (1u64 << 20) as f64,
            n(PushState::Present),
            n(PushState::Signed),
            if rep.signed {
                ""
            } else {
                " (no signing_key: the wheel carries no signature of this box)"
            }
        );
    }
    Ok(())
}
