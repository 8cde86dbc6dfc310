//! `oracle-build doctor [--venv PATH]... [--pin PIN]`: the options, one call
//! to [`crate::pipeline::doctor::diagnose`], and the report rendered (text or
//! `--json`). Exit 0 when healthy, 1 when any problem is found.

use anyhow::{Result, anyhow};

use crate::ops::{Session, print_json};
pub use crate::pipeline::doctor::DoctorOptions;
use crate::pipeline::doctor::diagnose;

/// `doctor`: prints the problems and their fixes; exit 1 when there are any.
pub fn run(s: &Session, opts: &DoctorOptions) -> Result<()> {
    let root = s.root()?;
    // A root that is a file, or inside a checkout, is refused (exit 2).
    s.store()?;
    let report = diagnose(&root, opts)?;
    if s.json {
        print_json(&report)?;
    } else {
        println!(
            "store {}{}: {} entries, {} roots, {} aliases; {} venvs measured",
            report.store.display(),
            if report.store_exists {
                ""
            } else {
                " (none yet)"
            },
            report.entries,
            report.roots,
            report.aliases,
            report.venvs.len()
        );
        for c in &report.engine_caches {
            println!(
                "engine cache {} ({:.1} MiB) of {}",
                c.entry,
                c.bytes as f64 / (1u64 << 20) as f64,
                c.oracle
            );
        }
        for i in &report.imported {
            println!("kept for an import or pull until a build roots its oracle: roots/{i}");
        }
        if report.healthy {
            println!("healthy: no problems found");
        } else {
            println!("{} problem(s):", report.problems.len());
            for p in &report.problems {
                println!("  [{}] {}", p.kind, p.subject);
                for line in p.message.lines() {
                    println!("      {line}");
                }
                println!("      fix: {}", p.fix);
            }
        }
    }
    if report.healthy {
        Ok(())
    } else {
        Err(anyhow!("doctor found {} problem(s)", report.problems.len()))
    }
}
