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
