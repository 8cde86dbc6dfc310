//! The host layer: what the machine provides to the stages, behind one API
//! each: the toolchain found on it ([`toolchain`]), uv ([`uv`]), child
//! processes with timeouts and process groups ([`process`]), and disk space
//! ([`disk`]), HTTP downloads ([`http`]), the git command line for fetches
//! and checkouts ([`git`]) and the limits of its network steps ([`git_timeouts`]), and the bytecode of a venv, shared through the store's pool
//! ([`bytecode`]), ccache's remote storage ([`ccache`]) and skipping it when it stalls mid-build ([`team_cache`]), the compilers a
//! build declares and uses, measured ([`compilers`]), `Python.h` of the
//! recipe's Python ([`python_headers`]), and the site's
//! `[[mirror]]` URL mapping ([`mirror`]), and the sha256 of the pinned uv's
//! wheels, compiled in ([`uv_wheels`]). It may use the store and the
//! recipe, never a stage.

pub mod bytecode;
pub mod ccache;
pub mod ccache_wrappers;
pub mod compilers;
pub mod disk;
pub mod git;
pub mod git_timeouts;
pub mod http;
pub mod memory;
pub mod mirror;
pub mod platform;
pub mod process;
pub mod python_headers;
pub mod rust;
pub mod team_cache;
pub mod toolchain;
pub mod uv;
pub mod uv_wheels;
