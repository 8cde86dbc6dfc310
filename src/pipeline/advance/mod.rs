//! The pin-advance review report (docs/advance.md): what changed
//! between two oracles and what did not, as data and as Markdown.
//!
//! Everything here compares records that already exist (recipes, oracle
//! records, smoke results, installed distributions); the command layer
//! (`ops::advance`) builds and gates the oracles first.

use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;

use crate::stages::identity::Identity;
use crate::stages::smoke::golden::GoldenDiff;
use crate::stages::source::Range;

/// One side of the advance (FROM or TO).
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Recipe name.
    pub recipe: String,
    /// Where the recipe was read.
    pub origin: String,
    /// The commit.
    pub commit: String,
    /// Source repository URL.
    pub repo: String,
    /// The oracle venv.
    pub oracle: PathBuf,
    /// Measured identity.
    pub identity: Identity,
    /// `source` or `precompiled`.
    pub build_mode: String,
    /// sha256 of the installed wheel.
    pub wheel_sha256: String,
    /// Seconds the wheel build took (when it was built by this store).
    pub build_seconds: Option<f64>,
    /// What the compiler cache did in that build (`build.json`).
    #[serde(default)]
    pub compiler_cache_stats: Option<crate::stages::wheel::CacheStats>,
    /// The kernel families the tree's configure reported for its wheel
    /// (`build.json` `kernel_families`; `None`: not recorded).
    pub kernel_families: Option<Vec<crate::stages::wheel::families::KernelFamily>>,
    /// Gate verdict and reasons, under the shared smoke configuration.
    pub verdict: String,
    /// Why not gateable.
    pub reasons: Vec<String>,
}

/// A field that may differ between the two sides.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Delta {
    /// Dotted field name.
    pub field: String,
    /// FROM's value (null: absent).
    pub from: Value,
    /// TO's value (null: absent).
    pub to: Value,
    /// Whether they differ.
    pub changed: bool,
}

/// How the installed distributions differ.
#[derive(Debug, Clone, Serialize, Default)]
pub struct PackageDelta {
    /// Only in TO: (name, version).
    pub added: Vec<(String, String)>,
    /// Only in FROM: (name, version).
    pub removed: Vec<(String, String)>,
    /// In both at different versions: (name, FROM version, TO version).
    pub changed: Vec<(String, String, String)>,
    /// Distributions at the same version in both.
    pub unchanged: usize,
}

/// How the kernel families built differ between FROM and TO (as each
/// tree's configure reported them).
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct FamilyDelta {
    /// Built by TO's configure, not by FROM's: the name and TO's line.
    pub gained: Vec<String>,
    /// Built by FROM's configure, not by TO's: the name and why TO did not
    /// (its reason, or that its configure did not report it).
    pub lost: Vec<String>,
    /// Families built by both.
    pub kept: usize,
    /// Why the comparison cannot be made (a side recorded none); `None` when made.
    pub not_known: Option<String>,
}

/// The commits between the two pins.
#[derive(Debug, Clone, Serialize)]
pub struct Commits {
    /// `FROM..TO` with short ids.
    pub range: String,
    /// Counts and ancestry, when both commits are in one repository.
    pub counts: Option<Range>,
    /// The upstream repository (FROM's).
    pub upstream: String,
    /// Upstream branches and tags that contain TO (empty: none; null: TO is
    /// not in the upstream repository at all).
    pub upstream_refs: Option<Vec<String>>,
    /// Set when TO is not reachable from any upstream branch or tag (a fork
    /// or an unmerged pull request): what a reviewer must know.
    pub flag: Option<String>,
}

/// One smoke case compared between FROM and TO.
#[derive(Debug, Clone, Serialize)]
pub struct CaseComparison {
    /// Case name.
    pub name: String,
    /// `identical`, `near-tie flip` (the first divergence is under the
    /// near-tie threshold), `drifted` or `not comparable`.
    pub status: String,
    /// Why not comparable, or a one-line description of the drift.
    pub detail: String,
    /// The first divergence (drifted only): position, both tokens, gap, near-tie.
    pub divergence: Option<GoldenDiff>,
    /// FROM's output text.
    pub from_text: String,
    /// TO's output text.
    pub to_text: String,
    /// Which prompt of a case with several prompts (absent: a single-prompt case).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_index: Option<usize>,
    /// The prompt text, when the case gives text.
    pub prompt: Option<String>,
    /// TO's own determinism: whether its K runs agreed, and where not.
    pub to_runs: String,
}

/// The whole review.
#[derive(Debug, Clone, Serialize)]
pub struct AdvanceReport {
    /// The pin in force.
    pub from: Side,
    /// The candidate.
    pub to: Side,
    /// The candidate recipe written for a commit TO, if any.
    pub candidate_recipe: Option<PathBuf>,
    /// Commit range and upstream reachability.
    pub commits: Commits,
    /// Recipe fields that differ.
    pub recipe_delta: Vec<Delta>,
    /// TO's pins, per package: carried from FROM, not carried (TO's tree
    /// pins it), or the reviewer's ([`requirements::decide`]).
    pub pins: Vec<requirements::PinRow>,
    /// The trees' own requirement changes (`None`: a tree could not be read).
    pub requirements: Option<requirements::RequirementDelta>,
    /// Installed distributions that differ (the resolved lock of each oracle).
    pub package_delta: PackageDelta,
    /// The extension sources that changed from FROM to TO and the compile
    /// cost expected, worked out before TO was built.
    pub compile_cost: Option<crate::pipeline::compile_cost::CompileCost>,
    /// Identity fields side by side.
    pub identity: Vec<Delta>,
    /// Kernel families gained and lost from FROM to TO.
    pub kernel_families: FamilyDelta,
    /// Per smoke case.
    pub cases: Vec<CaseComparison>,
    /// What this comparison does not establish.
    pub does_not_establish: Vec<String>,
    /// `--accept`: where the alias now points, and the rollback root.
    pub accepted: Option<Value>,
    /// The resolved lock, external source, toolchain and pin-block deltas
    /// (each a top-level key of the JSON).
    #[serde(flatten)]
    pub deltas: deltas::Deltas,
    /// The golden campaign's outcome with `--accept`: TO's goldens recorded
    /// and the drift accepted with its reasons.
    pub goldens: Option<goldens::Campaign>,
}

pub mod compare;
pub mod deltas;
pub mod ext_delta;
pub mod goldens;
pub mod lock_delta;
pub mod pin_blocks;
pub mod plan;
pub mod report;
pub mod requirements;
pub mod toolchain_delta;

/// The compile cost of TO since FROM (see
/// [`crate::pipeline::compile_cost::for_advance`]).
pub fn compile_cost(
    store: &crate::store::Store,
    from: &crate::recipe::LoadedRecipe,
    to: &crate::recipe::LoadedRecipe,
) -> Option<crate::pipeline::compile_cost::CompileCost> {
    crate::pipeline::compile_cost::for_advance(store, from, to)
}
