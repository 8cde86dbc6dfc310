//! `oracle-build` as a library: the module tree the binary (`src/main.rs`),
//! the integration tests and the fuzz targets share.
//!
//! `main` only parses the command line, dispatches to [`ops`], and maps errors
//! to the exit codes of the contract (see [`exit`]).

pub mod advance;
pub mod alias;
pub mod cli;
pub mod disk;
pub mod dist_record;
pub mod exit;
pub mod gc;
pub mod key;
pub mod ops;
pub mod pin;
pub mod pinfile;
pub mod platform;
pub mod process;
pub mod progress;
pub mod recipe;
pub mod stages;
pub mod store;
pub mod toolchain;
pub mod uv;
pub mod wheelhouse;
pub mod wheelname;
