//! The deltas of an advance read from the two recipes, their locks and
//! their trees (issue 37, "every delta in the report"): the resolved lock
//! delta ([`super::lock_delta`]), the external sources
//! ([`super::ext_delta`]), the toolchain requirements
//! ([`super::toolchain_delta`]) and the pin blocks ([`super::pin_blocks`]).
//! In the report's JSON each is a top-level key.

use serde::Serialize;

use super::ext_delta::{self, ExtDelta};
use super::lock_delta::{self, LockDelta};
use super::pin_blocks::{self, PinRow};
use super::toolchain_delta::{self, ToolchainDelta};
use crate::recipe::LoadedRecipe;
use crate::store::Store;

/// The four deltas.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct Deltas {
    /// Every package of the build and runtime locks.
    pub resolved_lock: LockDelta,
    /// What CMake fetches at each commit.
    pub ext_sources: ExtDelta,
    /// The toolchain each tree asks for.
    pub toolchain: ToolchainDelta,
    /// The recipe `pins` of each side.
    pub pin_blocks: Vec<PinRow>,
}

/// Reads the deltas of FROM and TO once both are built (their locks and
/// their commits in the store's mirrors); a side that cannot be read is
/// said in its section, never an error.
pub fn gather(store: &Store, from: &LoadedRecipe, to: &LoadedRecipe) -> Deltas {
    Deltas {
        resolved_lock: lock_delta::lock_delta(
            lock_delta::lock_of(store, from).as_ref(),
            lock_delta::lock_of(store, to).as_ref(),
        ),
        ext_sources: ext_delta::ext_delta(store, from, to),
        toolchain: toolchain_delta::toolchain_delta(store, from, to),
        pin_blocks: pin_blocks::pin_blocks(&from.recipe.pins, &to.recipe.pins),
    }
}

/// The four sections as Markdown, each after a blank line, without a
/// trailing newline.
pub fn markdown(d: &Deltas) -> String {
    let mut lines = Vec::new();
    for section in [
        lock_delta::markdown(&d.resolved_lock),
        ext_delta::markdown(&d.ext_sources),
        toolchain_delta::markdown(&d.toolchain),
        pin_blocks::markdown(&d.pin_blocks),
    ] {
        lines.push(String::new());
        lines.extend(section);
    }
    lines.join("\n")
}

/// Reads one thing of each side's commit with `read(mirror, commit,
/// target_device)`, from the side's repository mirror in `store`: FROM's,
/// TO's, and a line (`FROM: why`) for each side that could not be read
/// (its value then `T::default()`), so a section says what it lacks
/// instead of failing the report.
pub fn read_sides<T: Default>(
    store: &Store,
    from: &LoadedRecipe,
    to: &LoadedRecipe,
    read: impl Fn(&std::path::Path, &str, &str) -> anyhow::Result<T>,
) -> (T, T, Vec<String>) {
    let mut not_known = Vec::new();
    let mut side = |name: &str, lr: &LoadedRecipe| {
        let r = &lr.recipe;
        let mirror = crate::stages::source::mirror_entry(store, &r.source.repo);
        read(&mirror.path, &r.source.commit, &r.build.target_device).unwrap_or_else(|e| {
            not_known.push(format!("{name}: {e:#}"));
            T::default()
        })
    };
    let (a, b) = (side("FROM", from), side("TO", to));
    (a, b, not_known)
}

/// `N added, N removed, N changed, N same.` of rows by their `status`.
pub fn status_counts<'a>(statuses: impl Iterator<Item = &'a str>) -> String {
    let mut n = [0usize; 4];
    for st in statuses {
        if let Some(i) = ["added", "removed", "changed", "same"]
            .iter()
            .position(|k| *k == st)
        {
            n[i] += 1;
        }
    }
    format!(
        "{} added, {} removed, {} changed, {} same.",
        n[0], n[1], n[2], n[3]
    )
}
