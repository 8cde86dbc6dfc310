//! The integration tests, as one binary (one link instead of one per file):
//! each module runs the real `oracle-build` binary against real git
//! repositories, uv, venvs and CMake made at test time; `support` holds the
//! fixture and setup helpers they share.

mod support;

mod advance;
mod build;
mod bytecode;
mod cache;
mod cache_admin;
mod cache_bounds;
mod cache_policy;
mod cache_race;
mod carry;
mod compiler_cache;
mod demo;
mod download;
mod driver;
mod edges;
mod edges_answers;
mod engine_env;
mod ext_conditions;
mod ext_trust;
mod extras;
mod gc_roots;
mod git_edges;
mod gpu;
mod hermetic;
mod identity;
mod installer;
mod jobs;
mod kernel_families;
mod loaded;
mod mirror;
mod model_identity;
mod perf;
mod pipeline_keys;
mod platform;
mod real;
mod recipes;
mod registry;
mod roots;
mod rust_frontend;
mod sbom;
mod serve;
mod smoke;
mod source;
mod store;
mod tags_trust;
mod team_golden;
mod toolchain;
mod versions;
