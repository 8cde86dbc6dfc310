//! The pipeline layer: the only place that knows the stage order.
//!
//! [`inputs`] gathers the hermetic inputs of a build (lock, wheelhouse,
//! external sources), [`preflight`] checks the host before any work, and
//! [`advance`] compares the oracles of two pins.

pub mod advance;
pub mod inputs;
pub mod preflight;
