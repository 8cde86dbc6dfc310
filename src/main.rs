//! `oracle-build`: turn a vLLM parity pin into an oracle venv that is provably the pin.
//!
//! `main` only parses the command line, dispatches to [`ops`], and maps errors
//! to the exit codes of the contract (see [`exit`]).

use clap::{CommandFactory, FromArgMatches};

use oracle_build::host::{disk, process};
use oracle_build::{exit, ops, progress};

use oracle_build::cli::{Cli, Command};

fn main() {
    // The matches give the command's name as typed (for the message below).
    let parsed = Cli::command().try_get_matches().and_then(|m| {
        let name = m.subcommand_name().map(str::to_string);
        Ok((Cli::from_arg_matches(&m)?, name))
    });
    let (cli, command_name) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            if let Some(msg) = pin_before_command(&e) {
                progress::line(format!("error: {msg}"));
                if std::env::args_os().any(|a| a == "--json") {
                    let doc = ops::error_document(&exit::bad_input(msg), 2);
                    println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
                }
                std::process::exit(2);
            }
            // Usage errors exit 2; with --json stdout still gets one document.
            let usage = e.use_stderr();
            if usage && std::env::args_os().any(|a| a == "--json") {
                let msg = e.render().to_string();
                let msg = msg.trim().trim_start_matches("error: ");
                let doc = serde_json::json!({
                    "error": msg,
                    "exit": 2,
                    "causes": [msg],
                    "disk_full": false,
                });
                println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
            }
            e.exit()
        }
    };
    let json = cli.json;
    process::install_signal_handlers();
    quiet_on_closed_stdout();
    let result = dispatch(cli, command_name.as_deref());
    // Ended normally (every child finished): leave no run lock behind.
    oracle_build::store::release_run_lock();
    if let Err(err) = result {
        let code = exit::code_of(&err);
        progress::line(format!("error: {}", ops::error_text(&err)));
        if disk::is_disk_full(&err) {
            progress::line(
                "hint: the disk is full (ENOSPC). Finished store entries are intact and the partial work was discarded; free space (`oracle-build gc`) and rerun.",
            );
        }
        if json && !ops::json_printed() {
            let doc = ops::error_document(&err, code);
            println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        }
        std::process::exit(code);
    }
}

fn dispatch(cli: Cli, command_name: Option<&str>) -> anyhow::Result<()> {
    // The global options, opened the same way by every command.
    let s = ops::Session {
        store: cli.store.clone(),
        lockfiles: cli.lockfiles.clone(),
        json: cli.json,
    };
    // Only the global options (`--store`, `--json`, `--lockfiles`) may come
    // before a command's name; a build's own would be ignored there.
    if let Some(name) = command_name
        && let Some(arg) = cli.build.first_given()
    {
        return Err(exit::bad_input(format!(
            "{arg} is given before the command `{name}`, where it does nothing: only --store, --json and --lockfiles may come before a command; put the others after it (`oracle-build {name} ...`)"
        )));
    }
    // Every `config.toml` of the store root is checked whole before any
    // work (exit 2): not by the commands that open no store, nor by
    // `doctor`, which reports a bad file as a problem (`bad-config`).
    if !matches!(
        cli.command,
        Some(
            Command::Completions { .. }
                | Command::Man { .. }
                | Command::Watchdog { .. }
                | Command::Doctor { .. }
        )
    ) {
        s.check_config()?;
    }
    let build_args = match cli.command {
        Some(Command::Plan { pin, offline, jobs }) => {
            return ops::plan::run(&s, &pin, offline, jobs.map(|j| j as usize));
        }
        Some(Command::Advance {
            from,
            to,
            report,
            accept,
            alias,
            pins,
            offline,
            accept_drift,
            reasons,
            plan,
        }) => {
            let opts = ops::advance::AdvanceOptions {
                from,
                to,
                report,
                accept,
                alias,
                pins,
                offline,
                accept_drift,
                reasons,
                plan,
            };
            return ops::advance::run(&s, &opts);
        }
        Some(Command::Rollback { path }) => return ops::advance::rollback(&s, &path),
        Some(Command::Watchdog { pgid }) => process::watchdog(pgid),
        Some(Command::Status) => return ops::status::run(&s),
        Some(Command::Gc { dry_run }) => return ops::gc::run(&s, dry_run),
        Some(Command::Keep { pin }) => return ops::gc::keep(&s, &pin, true),
        Some(Command::Unkeep { pin }) => return ops::gc::keep(&s, &pin, false),
        Some(Command::Fetch { pin, offline }) => return ops::fetch::run(&s, &pin, offline),
        Some(Command::Smoke {
            pin,
            case,
            record_golden,
            force,
            cold,
        }) => {
            let opts = ops::smoke::SmokeArgs {
                pin,
                case,
                record_golden,
                force,
                cold,
            };
            return ops::smoke::run(&s, &opts);
        }
        Some(Command::Verify(a)) => {
            let opts = ops::verify::VerifyOptions {
                pin: a.pin,
                deep: a.deep,
                pin_file: a.pin_file,
                emit_pin_block: a.emit_pin_block,
                write_pin_block: a.write_pin_block,
                provenance: a.provenance,
            };
            return ops::verify::run(&s, &a.target, &opts);
        }
        Some(Command::Activate { pin, path, force }) => {
            return ops::activate::run(&s, &pin, &path, force);
        }
        Some(Command::Doctor { venv, pin }) => {
            let opts = ops::doctor::DoctorOptions { venvs: venv, pin };
            return ops::doctor::run(&s, &opts);
        }
        Some(Command::Lock {
            pin,
            platform,
            check,
        }) => {
            let opts = ops::lock::LockOptions { platform, check };
            return ops::lock::run(&s, &pin, &opts);
        }
        Some(Command::Export {
            pin,
            output,
            platform,
        }) => {
            let opts = ops::bundle::ExportOptions { output, platform };
            return ops::bundle::export(&s, &pin, &opts);
        }
        Some(Command::Push { pin, cache }) => {
            return ops::push::push(&s, &pin, &ops::push::PushOptions { cache });
        }
        Some(Command::Pull { pin, cache }) => {
            let opts = ops::pull::PullOptions {
                cache,
                lockfiles: s.lockfiles.clone(),
                json: s.json,
            };
            return ops::pull::pull(&pin, s.store_arg(), &opts);
        }
        Some(Command::Golden { action }) => {
            use oracle_build::cli::GoldenCommand as G;
            return match action {
                G::Export { pin, case, out } => ops::golden::export(&s, &pin, &case, &out),
                G::Import {
                    pin,
                    case,
                    dir,
                    row,
                    force,
                } => ops::golden::import(&s, &pin, &case, &dir, row, force),
            };
        }
        Some(Command::Cache { action }) => {
            use ops::cache::Action;
            use oracle_build::cli::CacheCommand as C;
            let (action, cache) = match action {
                C::Ls { cache } => (Action::Ls, cache),
                C::Verify { cache } => (Action::Verify, cache),
                C::Gc {
                    cache,
                    dry_run,
                    allow_empty_roots,
                } => (
                    Action::Gc {
                        dry_run,
                        allow_empty_roots,
                    },
                    cache,
                ),
            };
            return ops::cache::run(
                action,
                cache.as_deref(),
                s.store_arg(),
                s.lockfiles(),
                s.json,
            );
        }
        Some(Command::Sbom { target, out }) => {
            return ops::sbom::run(&s, &target, out.as_deref());
        }
        Some(Command::Contains { target, commit }) => {
            return ops::contains::run(&s, &target, &commit);
        }
        Some(Command::Import { file }) => return ops::bundle::import(&s, &file),
        Some(Command::Demo { python }) => {
            let opts = ops::demo::DemoOptions { python };
            return ops::demo::run(&s, &opts).map(|_| ());
        }
        Some(Command::Completions { shell }) => {
            return oracle_build::cli::manual::run_completions(shell, cli.json);
        }
        Some(Command::Man { out_dir }) => {
            return oracle_build::cli::manual::man(out_dir.as_deref(), cli.json);
        }
        Some(Command::Build(args)) => args,
        None => cli.build,
    };
    let Some(pin) = build_args.pin else {
        return Err(exit::bad_input(
            "missing PIN: `oracle-build <PIN>` or `oracle-build build <PIN>` (see --help)",
        ));
    };
    let opts = ops::build::BuildOptions {
        pin,
        offline: build_args.offline,
        no_smoke: build_args.no_smoke,
        deep: build_args.deep,
        jobs: build_args.jobs.map(|j| j as usize),
        activate: build_args.activate,
        cache: build_args.cache,
        no_substitute: build_args.no_substitute,
    };
    ops::build::run(&s, &opts).map(|_| ())
}

/// The answer to a command line whose PIN came before a command that
/// needs an argument of its own (`oracle-build fx.yaml verify`): clap
/// would say only that `<TARGET>` is missing; this says where the PIN went
/// and how to write it. `None` for any other parse error.
fn pin_before_command(e: &clap::Error) -> Option<String> {
    if e.kind() != clap::error::ErrorKind::MissingRequiredArgument {
        return None;
    }
    let m = Cli::command().ignore_errors(true).try_get_matches().ok()?;
    let name = m.subcommand_name()?;
    let pin = m.try_get_one::<String>("pin").ok().flatten()?;
    Some(format!(
        "the PIN {pin:?} is given before the command `{name}`, where it does nothing: only --store, --json and --lockfiles may come before a command; put it after the command's name (`oracle-build {name} {} ...`)",
        oracle_build::shell::shell_quote(pin)
    ))
}

/// Makes a closed stdout (`oracle-build status | head -1`) end the process
/// quietly with 141 (128 + SIGPIPE, what a shell reports for a tool killed by
/// it) instead of a panic and a backtrace: Rust ignores SIGPIPE, so
/// `println!` panics with "failed printing to stdout". Any other failure to
/// write stdout (a full disk, `>/dev/full`) ends it with exit 1 and says
/// so. Every other panic keeps the default report.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") {
            oracle_build::store::release_run_lock();
            if msg.contains("Broken pipe") {
                std::process::exit(141);
            }
            progress::line(format!(
                "error: cannot write the output to stdout: {}",
                msg.trim_start_matches("failed printing to stdout: ")
            ));
            std::process::exit(1);
        }
        default(info);
    }));
}
