//! The command layer: one module per command. Each takes its options, makes
//! one call down (into [`crate::pipeline`], a stage or the store) and renders
//! the result as text or `--json`. See `docs/architecture.md`.

pub mod activate;
pub mod advance;
pub mod build;
pub mod bundle;
pub mod demo;
pub mod doctor;
pub mod fetch;
pub mod gc;
pub mod lock;
pub mod plan;
pub mod smoke;
pub mod status;
pub mod verify;

/// Prints `value` as one JSON document on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
