//! `oracle-build` as a library: the module tree the binary (`src/main.rs`),
//! the integration tests and the fuzz targets share.
//!
//! The layers, top to bottom (each may use only the layers below it; see
//! `docs/architecture.md`): [`cli`] -> [`ops`] -> [`pipeline`] -> [`cache`] ->
//! [`stages`] -> [`host`] -> [`store`] -> [`recipe`], with the leaf utilities
//! [`exit`], [`progress`], [`shell`], [`config_text`] and [`regular_file`]
//! usable by all.

pub mod cache;
pub mod cli;
pub mod config_text;
pub mod exit;
pub mod host;
pub mod ops;
pub mod pipeline;
pub mod progress;
pub mod recipe;
pub mod regular_file;
pub mod shell;
pub mod stages;
pub mod store;

#[cfg(test)]
mod layering;
