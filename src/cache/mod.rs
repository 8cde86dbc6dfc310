//! The registry cache (issue 13): a layer between [`crate::pipeline`] and
//! [`crate::stages`] that shares store entries through OCI registries and
//! OCI image layouts on disk.
//!
//! - [`config`]: which caches a site uses (`config.toml` in the store root
//!   or in `$XDG_CONFIG_HOME/oracle-build/`, `--cache`, `ORACLE_BUILD_CACHE`).
//! - [`trust`]: the signed statement a builder attaches to a wheel, SSHSIG
//!   signing and verification against an `allowed_signers` file, and the
//!   [`trust::Verdict`] a pulling box acts on.
//! - [`catalog`]: the small read/delete interface `cache ls|verify|gc`
//!   needs from a cache, with its implementation for `file://` layouts.

pub mod catalog;
pub mod config;
pub mod trust;
