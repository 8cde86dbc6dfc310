//! Shell completions (clap_complete) and man pages (clap_mangen), both
//! generated from the clap definitions of [`crate::cli::Cli`], so they always
//! name the commands and options the binary parses (docs/shell.md).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

use crate::exit::bad_input;
use crate::store::write_atomic;

/// The name the binary is installed under (`[[bin]]` in Cargo.toml).
pub const BIN: &str = "oracle-build";

/// The command line of [`crate::cli::Cli`] without its hidden commands
/// (`__watchdog`), which clap_complete would otherwise offer: the same name
/// ([`BIN`]), about, version (the crate's, as `#[command(version)]`), global
/// arguments and visible commands, clap's own definitions cloned.
fn visible_command() -> clap::Command {
    let full = crate::cli::Cli::command();
    let mut cmd = clap::Command::new(BIN)
        .about(full.get_about().cloned().unwrap_or_default())
        .version(env!("CARGO_PKG_VERSION"))
        .args_conflicts_with_subcommands(true)
        .subcommand_negates_reqs(true);
    for a in full.get_arguments() {
        cmd = cmd.arg(a.clone());
    }
    for s in full.get_subcommands().filter(|s| !s.is_hide_set()) {
        cmd = cmd.subcommand(s.clone());
    }
    cmd
}

/// Writes the completion script of `shell` (bash, zsh, fish, elvish,
/// powershell) for every command and option to `out`.
///
/// Errors: writing to `out` fails.
pub fn completions(shell: Shell, out: &mut dyn Write) -> Result<()> {
    let mut cmd = visible_command();
    clap_complete::generate(shell, &mut cmd, BIN, out);
    out.flush().context("writing the completion script")?;
    Ok(())
}

/// `completions SHELL`: the script on stdout. `--json` is refused (exit 2):
/// the output is a shell script, not a JSON document.
pub fn run_completions(shell: Shell, json: bool) -> Result<()> {
    if json {
        return Err(bad_input(
            "completions prints a shell script, not JSON; drop --json",
        ));
    }
    completions(shell, &mut std::io::stdout().lock())
}

/// The man pages, rendered as roff: `oracle-build.1` (the top-level page,
/// whose SUBCOMMANDS section names every command) first, then
/// `oracle-build-<command>.1` for each visible command (clap_mangen's naming,
/// as `clap_mangen::generate_to` would write them). Returns (file name, page).
///
/// Errors: rendering fails (an I/O error writing into memory).
pub fn pages() -> Result<Vec<(String, Vec<u8>)>> {
    let mut cmd = crate::cli::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    let mut todo = vec![cmd];
    while let Some(c) = todo.pop() {
        let subs: Vec<clap::Command> = c
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .cloned()
            .collect();
        let man = clap_mangen::Man::new(c);
        let mut page = Vec::new();
        man.render(&mut page).context("rendering a man page")?;
        out.push((man.get_filename(), page));
        todo.extend(subs.into_iter().rev());
    }
    Ok(out)
}

/// `man`: the top-level page on stdout; with `out_dir`, every page written
/// into it (created if needed; each file atomically) and their paths printed,
/// one a line (with `--json`, as `{"pages": [...]}`).
///
/// Errors: `--json` without `--out-dir` (exit 2: roff is not JSON); a write
/// fails (names the path).
pub fn man(out_dir: Option<&Path>, json: bool) -> Result<()> {
    let pages = pages()?;
    let Some(dir) = out_dir else {
        if json {
            return Err(bad_input(
                "man prints a roff page, not JSON; drop --json (or add --out-dir DIR)",
            ));
        }
        let mut stdout = std::io::stdout().lock();
        if let Some((_, page)) = pages.first() {
            stdout.write_all(page).context("writing the man page")?;
        }
        stdout.flush().context("writing the man page")?;
        return Ok(());
    };
    fs_err::create_dir_all(dir)?;
    let mut written: Vec<PathBuf> = Vec::new();
    for (name, page) in &pages {
        let path = dir.join(name);
        write_atomic(&path, page)?;
        written.push(path);
    }
    if json {
        crate::ops::print_json(&serde_json::json!({ "pages": written }))?;
    } else {
        for p in &written {
            println!("{}", p.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of the visible commands, from the clap definitions.
    fn commands() -> Vec<String> {
        crate::cli::Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| s.get_name().to_string())
            .collect()
    }

    /// The completions' command line has every visible command and global
    /// argument of the real one, and nothing hidden.
    #[test]
    fn completions_see_the_visible_command_line() {
        let v = visible_command();
        let subs: Vec<String> = v
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        assert_eq!(subs, commands());
        let full = crate::cli::Cli::command();
        let ids = |c: &clap::Command| -> Vec<String> {
            c.get_arguments().map(|a| a.get_id().to_string()).collect()
        };
        assert_eq!(ids(&v), ids(&full));
        assert_eq!(v.get_name(), full.get_name());
    }

    #[test]
    fn one_page_per_command() {
        let names: Vec<String> = pages().unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[0], "oracle-build.1");
        let cmds = commands();
        for want in ["build", "verify", "demo", "completions", "man"] {
            assert!(cmds.iter().any(|c| c == want), "{want} not in {cmds:?}");
        }
        for c in &cmds {
            assert!(
                names.contains(&format!("oracle-build-{c}.1")),
                "no page for {c}: {names:?}"
            );
        }
        // Subcommands of a command (`cache ls`) get pages of their own.
        let nested: Vec<String> = crate::cli::Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .flat_map(|s| {
                s.get_subcommands()
                    .filter(|n| !n.is_hide_set())
                    .map(|n| format!("{}-{}", s.get_name(), n.get_name()))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(nested.contains(&"cache-ls".to_string()), "{nested:?}");
        for c in &nested {
            assert!(
                names.contains(&format!("oracle-build-{c}.1")),
                "no page for {c}: {names:?}"
            );
        }
        assert_eq!(names.len(), cmds.len() + nested.len() + 1, "{names:?}");
    }
}
