//! Command-line definition (DESIGN.md, "Commands"), parsed by clap.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Turn a vLLM parity pin into a verified, immutable, gateable oracle venv.
#[derive(Debug, Parser)]
#[command(
    name = "oracle-build",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
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
    /// Parallel compile jobs (overrides the recipe's build.max_jobs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs: Option<u32>,
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
    },
    /// Recipes, store entries, roots and their health.
    Status,
    /// Measure an oracle's identity and check it against its recipe (exit 3 on mismatch).
    Verify {
        /// A PIN, or the path of an oracle venv.
        target: String,
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
    /// Resolve PIN's build and runtime sets into hash-pinned lockfiles (PEP 751).
    Lock {
        /// The PIN.
        pin: String,
    },
    /// Write everything an offline box needs to rebuild PIN's oracle into one archive.
    Export {
        /// The PIN.
        pin: String,
        /// The archive to write (.tar.gz).
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
    },
    /// Verify an archive made by `export` and add its contents to the store.
    Import {
        /// The archive.
        file: PathBuf,
    },
}
