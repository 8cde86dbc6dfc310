//! Command-line definition (README.md, "Commands"), parsed by clap.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub mod manual;

/// Turn a vLLM parity pin into a verified, immutable, gateable oracle venv.
#[derive(Debug, Parser)]
#[command(name = "oracle-build", version, subcommand_negates_reqs = true)]
pub struct Cli {
    /// Store root (default: $ORACLE_BUILD_HOME, else $XDG_DATA_HOME/oracle-build).
    #[arg(long, global = true, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// Print one JSON document on stdout instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Directory of lock directories (default: `lockfiles/` beside the recipe's `recipes/` dir).
    #[arg(long, global = true, value_name = "DIR")]
    pub lockfiles: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `oracle-build <PIN>` is `oracle-build build <PIN>`.
    #[command(flatten)]
    pub build: BuildArgs,
}

/// Arguments of `build`.
#[derive(Debug, Args, Clone)]
pub struct BuildArgs {
    /// A recipe name, a recipe file, or a commit prefix (>= 7 hex) of exactly one recipe.
    #[arg(value_name = "PIN")]
    pub pin: Option<String>,
    /// No network: sources, wheels and external sources from the store only.
    #[arg(long)]
    pub offline: bool,
    /// Build and verify, but do not run the smoke gate.
    #[arg(long)]
    pub no_smoke: bool,
    /// Hash every file of an existing oracle before trusting it (as `verify
    /// --deep` does); a damaged one is moved aside, its damaged files dropped
    /// from the store's caches, and rebuilt.
    #[arg(long)]
    pub deep: bool,
    /// Parallel compile jobs (overrides the recipe's build.max_jobs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs: Option<u32>,
    /// After a gateable build, point the symlink PATH at the oracle (see `activate`).
    #[arg(long, value_name = "PATH")]
    pub activate: Option<PathBuf>,
    /// Substitute from this one cache (a configured name, or oci://host/repo,
    /// oci+http://host:port/repo, file:///dir) instead of the configured ones.
    #[arg(long, value_name = "URL")]
    pub cache: Option<String>,
    /// Never take a stage from a cache: do all the work here.
    #[arg(long)]
    pub no_substitute: bool,
}

impl BuildArgs {
    /// The first of these build arguments given (`PIN`, `--offline`, ...),
    /// for refusing them before another command's name, where they would do
    /// nothing (`oracle-build --offline status`).
    pub fn first_given(&self) -> Option<String> {
        let flags = [
            (self.offline, "--offline"),
            (self.no_smoke, "--no-smoke"),
            (self.deep, "--deep"),
            (self.jobs.is_some(), "--jobs"),
            (self.activate.is_some(), "--activate"),
            (self.cache.is_some(), "--cache"),
            (self.no_substitute, "--no-substitute"),
        ];
        if let Some(pin) = &self.pin {
            return Some(format!("the PIN {pin:?}"));
        }
        flags
            .iter()
            .find(|(given, _)| *given)
            .map(|(_, name)| name.to_string())
    }
}

/// Arguments of `verify`.
#[derive(Debug, Args, Clone)]
pub struct VerifyArgs {
    /// A PIN, or the path of a venv (an oracle, an alias, or any venv with --pin).
    pub target: String,
    /// Check a venv target against this recipe (required for venvs not built by oracle-build).
    #[arg(long, value_name = "PIN")]
    pub pin: Option<String>,
    /// Also re-hash every installed file against the package's RECORD and the entry's manifest.
    #[arg(long)]
    pub deep: bool,
    /// Compare each field of the ```parity-pin block in FILE with its measured value.
    #[arg(long, value_name = "FILE")]
    pub pin_file: Option<PathBuf>,
    /// Print only the ```parity-pin block measured from the oracle on stdout
    /// (only if every check passes; the checks go to stderr).
    #[arg(long)]
    pub emit_pin_block: bool,
    /// Replace the ```parity-pin block in FILE with the measured one, atomically
    /// (appended when FILE has none; created when FILE is absent); only if every check passes.
    #[arg(long, value_name = "FILE")]
    pub write_pin_block: Option<PathBuf>,
    /// Also check the signed SLSA provenance of the oracle's wheel in the configured caches.
    #[arg(long)]
    pub provenance: bool,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build the oracle of PIN (source, wheel, venv, identity, gate).
    Build(BuildArgs),
    /// Show each stage of PIN: cached or to do, and the disk needed. Changes nothing.
    Plan {
        /// The PIN.
        pin: String,
        /// Plan an `--offline` build: no network check; what it would miss is a problem.
        #[arg(long)]
        offline: bool,
        /// Parallel compile jobs, as `build --jobs N` (overrides the recipe's build.max_jobs).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        jobs: Option<u32>,
    },
    /// Recipes, store entries, roots and their health.
    Status,
    /// Only the source stage: fetch PIN's commit into the mirror and check it out.
    Fetch {
        /// The PIN.
        pin: String,
        /// No network: the commit must already be mirrored.
        #[arg(long)]
        offline: bool,
    },
    /// Measure an oracle's identity and check it against its recipe (exit 3 on mismatch).
    Verify(VerifyArgs),
    /// Point the symlink PATH at the verified, gateable oracle of PIN, atomically; PATH becomes a GC root.
    Activate {
        /// The PIN.
        pin: String,
        /// The alias to create or switch (a symlink; never a real directory).
        path: PathBuf,
        /// Replace PATH even when it is a symlink that is neither a registered
        /// alias nor points into the store (someone else's link).
        #[arg(long)]
        force: bool,
    },
    /// Find every known way an oracle goes wrong (store, aliases, named venvs) and say how to fix it.
    Doctor {
        /// Also inspect this venv (repeatable; need not be built by oracle-build).
        #[arg(long, value_name = "PATH")]
        venv: Vec<PathBuf>,
        /// Check the --venv venvs against this recipe (default: their oracle.json).
        #[arg(long, value_name = "PIN")]
        pin: Option<String>,
    },
    /// Delete every store entry no root reaches (and no running build uses).
    Gc {
        /// List what would be deleted and the bytes freed; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Root the oracle of PIN (and everything it was built from) against `gc`.
    Keep {
        /// The PIN.
        pin: String,
    },
    /// Remove the root of PIN; `gc` may then delete its entries.
    Unkeep {
        /// The PIN.
        pin: String,
    },
    /// Smoke-run the oracle of PIN: probe, determinism, goldens; exit 4 when not gateable.
    Smoke {
        /// The PIN.
        pin: String,
        /// Run only this case (the oracle's recorded verdict is not changed).
        #[arg(long, value_name = "NAME")]
        case: Option<String>,
        /// Write each case's output as its golden (JSON), then gate against it.
        #[arg(long)]
        record_golden: bool,
        /// With --record-golden: replace goldens the new output disagrees with.
        #[arg(long, requires = "record_golden")]
        force: bool,
        /// Empty the oracle's kept engine caches first: the run starts cold
        /// (and leaves them warm for the next).
        #[arg(long)]
        cold: bool,
    },
    /// A case's golden in the team's files: `greedy_ids.npy`, `greedy_dist.npy`, `p<i>_prompt.i32`.
    Golden {
        /// What to do.
        #[command(subcommand)]
        action: GoldenCommand,
    },
    /// Build TO beside FROM, gate both alike, and write a review report.
    Advance {
        /// The pin in force (a PIN).
        from: String,
        /// The candidate: a commit (full, or a prefix in FROM's mirror) or a PIN.
        to: String,
        /// Where to write the Markdown report (default: <store>/reports/).
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
        /// Move the alias to TO if TO is gateable and verified (FROM becomes its rollback).
        #[arg(long, requires = "alias")]
        accept: bool,
        /// The alias (symlink) that --accept moves (only with --accept).
        #[arg(long, value_name = "PATH")]
        alias: Option<PathBuf>,
        /// Override a pin in the candidate recipe of a commit TO (repeatable).
        #[arg(long = "pin", value_name = "NAME=VERSION")]
        pins: Vec<String>,
        /// No network: both pins' sources and wheels from the store.
        #[arg(long)]
        offline: bool,
        /// With --accept: record TO's golden of CASE although it drifted
        /// from FROM (repeatable; each needs its --reason, in order).
        #[arg(long = "accept-drift", value_name = "CASE")]
        accept_drift: Vec<String>,
        /// Why the drift of the --accept-drift at the same position is
        /// accepted (into the report and the golden's record).
        #[arg(long = "reason", value_name = "TEXT")]
        reasons: Vec<String>,
        /// Build nothing: write only the tree-level sections (commits, recipe
        /// delta, TO's pin table, requirement delta) and the candidate recipe.
        #[arg(long, conflicts_with = "accept")]
        plan: bool,
    },
    /// Point an alias back at its rollback oracle (atomically).
    Rollback {
        /// The alias path.
        path: PathBuf,
    },
    /// Resolve PIN's build and runtime sets into hash-pinned lockfiles (PEP 751).
    Lock {
        /// The PIN.
        pin: String,
        /// Lock for the box that will build it (uv's `--python-platform` value,
        /// e.g. x86_64-manylinux_2_28, aarch64-manylinux_2_28), into
        /// `lockfiles/<name>/<P>/`; default: this host, into `lockfiles/<name>/`.
        #[arg(long, value_name = "P")]
        platform: Option<String>,
        /// Resolve nothing: check that the lock a build on P (default: this host)
        /// would use is there and current (exit 2 when not).
        #[arg(long)]
        check: bool,
    },
    /// Write everything an offline box needs to rebuild PIN's oracle into one archive.
    Export {
        /// The PIN.
        pin: String,
        /// The archive to write (.tar.gz).
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// The platform of the box that will build it (uv's `--python-platform`
        /// value, e.g. x86_64-manylinux_2_28, aarch64-manylinux_2_28; default: this host).
        #[arg(long, value_name = "P")]
        platform: Option<String>,
    },
    /// Upload what another box needs to build PIN (source, lock, wheelhouse,
    /// external sources, the signed wheel) to a cache; venvs are never pushed.
    Push {
        /// The PIN (built in this store).
        pin: String,
        /// The cache (a configured name or a URL; default: every configured cache).
        #[arg(long, value_name = "URL")]
        cache: Option<String>,
    },
    /// Fetch from a cache everything `build PIN --offline` needs, every digest
    /// checked, the wheel only when trusted signers vouch for it.
    Pull {
        /// The PIN.
        pin: String,
        /// The cache (a configured name or a URL; default: the configured caches in order).
        #[arg(long, value_name = "URL")]
        cache: Option<String>,
    },
    /// The registry caches: list, verify or garbage-collect their artifacts.
    Cache {
        /// What to do.
        #[command(subcommand)]
        action: CacheCommand,
    },
    /// Verify an archive made by `export` and add its contents to the store.
    Import {
        /// The archive.
        file: PathBuf,
    },
    /// Build, verify and gate the built-in demo package (no GPU needed; see docs/demo.md).
    Demo {
        /// The Python `major.minor` to build for (default: the newest Python 3.10+ found).
        #[arg(long, value_name = "X.Y")]
        python: Option<String>,
    },
    /// Print a shell completion script for SHELL to stdout.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout, or write one page per command into DIR.
    Man {
        /// Write `oracle-build.1` and `oracle-build-<command>.1` into DIR instead.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Write the oracle's bill of materials (CycloneDX 1.6 JSON) to stdout or --out FILE.
    Sbom {
        /// A PIN, or the path of an oracle venv (or an alias of one).
        target: String,
        /// Write the document to FILE (atomically) instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Whether COMMIT is in the oracle's history, from the store's mirror (exit 0 yes, 1 no, 2 unknown).
    Contains {
        /// A PIN, or the path of an oracle venv (or an alias of one).
        target: String,
        /// A commit id, or a prefix of at least 7 hex digits.
        commit: String,
    },
    /// Internal: terminate process group PGID when stdin closes (see process.rs).
    #[command(name = "__watchdog", hide = true)]
    Watchdog {
        /// The process group to terminate.
        pgid: i32,
    },
}

/// The subcommands of `golden` (docs/smoke.md, "Goldens in the team's files").
#[derive(Debug, Subcommand)]
pub enum GoldenCommand {
    /// Write the case's JSON golden into DIR as the team's files, with a copy of the JSON.
    Export {
        /// The PIN.
        pin: String,
        /// The case.
        #[arg(long, value_name = "NAME")]
        case: String,
        /// The directory to write (created when absent; files of the same names are replaced).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Record the team's files in DIR as the case's JSON golden, which the gate then compares with.
    Import {
        /// The PIN.
        pin: String,
        /// The case.
        #[arg(long, value_name = "NAME")]
        case: String,
        /// The directory holding `greedy_ids.npy`, `p<I>_prompt.i32` and (checked when there) `greedy_dist.npy`.
        dir: PathBuf,
        /// Which prompt (row) of the files is this case (required when they hold several).
        #[arg(long, value_name = "I")]
        row: Option<usize>,
        /// Replace a golden the imported one disagrees with.
        #[arg(long)]
        force: bool,
    },
}

/// The subcommands of `cache`.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// List every artifact of the caches: tag, kind, size, and who signed it.
    Ls {
        /// Only this cache (a configured name or a URL; default: every configured cache).
        #[arg(long, value_name = "URL")]
        cache: Option<String>,
    },
    /// Download every artifact and re-check digests, files and signatures (exit 1 on a failure).
    Verify {
        /// Only this cache (a configured name or a URL; default: every configured cache).
        #[arg(long, value_name = "URL")]
        cache: Option<String>,
    },
    /// Delete the tags no root of this store reaches, then unreferenced blobs (file:// caches).
    Gc {
        /// Only this cache (a configured name or a URL; default: every configured cache).
        #[arg(long, value_name = "URL")]
        cache: Option<String>,
        /// List what would be deleted and what each root keeps; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Delete every tag of a cache even when this store's roots keep none of them (without it, such a gc is refused).
        #[arg(long)]
        allow_empty_roots: bool,
    },
}
