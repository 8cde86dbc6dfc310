//! `oracle-build verify <PIN|VENV> [--pin PIN] [--pin-file FILE] [--deep] [--emit-pin-block]`:
//! measure the identity now and check each field against its own expected
//! value (docs/identity.md).
//!
//! Expected values come from, each in its own check:
//! - the recipe: commit (`+g<sha>` prefix), clean tree, non-editable, imported
//!   from inside the venv, compiled extensions, build mode, Python version,
//!   `pins.torch` / `pins.flashinfer-*`, and the `expect` block;
//! - the oracle's own `oracle.json` (`recorded <field>`), when it has one;
//! - the entry's manifest (`files (manifest)`) and the package's `RECORD`
//!   (`files (RECORD)`): present with their sizes, or with `--deep` their hashes;
//! - the users' pin record (`--pin-file`): `vllm_commit`,
//!   `vllm_runtime_version`, `vllm_distribution_version`, `flashinfer_version`.
//!
//! Exit 0 when every check passes, 3 when any fails, 2 for bad input (a
//! malformed pin file is refused before anything is measured).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};

use crate::exit::{bad_input, mismatch};
use crate::ops::{Session, print_json};
use crate::pipeline::verify::first_line;
pub use crate::pipeline::verify::{Deep, Depth, Verification, verify_venv};
use crate::recipe::{self, Recipe};
use crate::stages::identity;
use crate::stages::identity::pin_block::{self, PinRecord};
use crate::stages::oracle::{ORACLE_JSON, OracleRecord};
use crate::store::Store;
use crate::store::alias::{self, Registry};

/// What `verify` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// `--pin PIN`: check a venv target against this recipe instead of its own.
    pub pin: Option<String>,
    /// `--deep`: re-hash every file against `RECORD` and the entry manifest.
    pub deep: bool,
    /// `--pin-file FILE`: compare with the users' ```` ```parity-pin ```` record.
    pub pin_file: Option<PathBuf>,
    /// `--emit-pin-block`: print the block measured from the oracle.
    pub emit_pin_block: bool,
    /// `--write-pin-block FILE`: replace the block in FILE with the measured one.
    pub write_pin_block: Option<PathBuf>,
    /// `--provenance`: also check the signed provenance of the oracle's
    /// wheel in the configured caches ([`crate::cache::provenance`]).
    pub provenance: bool,
}

/// The venv and the recipe to check it against.
struct Located {
    venv: PathBuf,
    recipe: Recipe,
    against: String,
    /// The store that owns the venv (or whose registry named it), for the
    /// tags at the commit when the oracle's record does not carry them.
    store: Option<Store>,
}

/// Finds the venv and recipe for `target`: a venv directory (or a symlink to
/// one, such as an alias) or a PIN (its root `roots/<name>` names the venv).
///
/// A venv is checked against `--pin` when given, else against the recipe of
/// the alias registered at that path (or at any link on the way to the venv)
/// in the store of `--store` / `$ORACLE_BUILD_HOME` / the default, or in the
/// store that owns the venv (`<X>/store/venvs/<key>`: X's `aliases.json`),
/// else against its own `oracle.json`.
fn locate(s: &Session, target: &str, pin_arg: Option<&str>) -> Result<Located> {
    let p = Path::new(target);
    if p.join("pyvenv.cfg").is_file() {
        let venv = p.canonicalize()?;
        let default = s.root()?;
        let owner = alias::owning_root(&venv).and_then(|r| Store::open_existing(&r));
        if let Some(pin_arg) = pin_arg {
            let lr = s.recipe(pin_arg)?;
            return Ok(Located {
                venv,
                recipe: lr.recipe,
                against: format!("--pin {pin_arg}"),
                store: owner.or_else(|| Store::open_existing(&default)),
            });
        }
        let mut stores: Vec<Store> = Store::open_existing(&default).into_iter().collect();
        let same = |a: &Store, b: &Store| match (a.root().canonicalize(), b.root().canonicalize()) {
            (Ok(x), Ok(y)) => x == y,
            _ => a.root() == b.root(),
        };
        if let Some(o) = owner
            .as_ref()
            .filter(|o| !stores.iter().any(|s| same(s, o)))
        {
            stores.push(o.clone());
        }
        for store in stores {
            let registry = Registry::load(&store).with_context(|| {
                format!(
                    "reading the alias registry of {} (to tell whether {} is an alias)",
                    store.root().display(),
                    p.display()
                )
            })?;
            if let Some(a) = registry.find(p) {
                let lr = alias::recipe_of(a)?;
                return Ok(Located {
                    venv,
                    recipe: lr.recipe,
                    against: format!(
                        "the alias registry ({} is an alias of recipe {})",
                        a.path.display(),
                        a.recipe
                    ),
                    store: Some(store),
                });
            }
        }
        let rec = OracleRecord::read(&venv).map_err(|e| {
            if venv.join(ORACLE_JSON).exists() {
                bad_input(format!(
                    "{} has an oracle.json that cannot be read ({}): the record is damaged, so name the recipe to check it against: `oracle-build verify {} --pin PIN`",
                    p.display(),
                    first_line(&format!("{e:#}")),
                    p.display()
                ))
            } else {
                bad_input(format!(
                    "{} has no oracle.json: it was not built by oracle-build, so name the recipe to check it against: `oracle-build verify {} --pin PIN`",
                    p.display(),
                    p.display()
                ))
            }
        })?;
        let r = recipe::parse(
            &rec.recipe_text,
            &format!("{}/oracle.json recipe", venv.display()),
        )?;
        return Ok(Located {
            venv,
            recipe: r,
            against: "its oracle.json".into(),
            store: owner,
        });
    }
    if p.is_dir() {
        return Err(bad_input(format!(
            "{} is a directory but not a venv (no pyvenv.cfg)",
            p.display()
        )));
    }
    if let Ok(to) = std::fs::read_link(p)
        && !p.exists()
    {
        return Err(dangling(s, p, &to));
    }
    if pin_arg.is_some() {
        return Err(bad_input(
            "--pin names the recipe to check a venv against; with a PIN target, leave it out",
        ));
    }
    let lr = s.recipe(target)?;
    let root = s.root()?;
    let link = root.join("roots").join(&lr.recipe.name);
    if !link.exists() {
        return Err(anyhow!(
            "no oracle of {} in {} (run `{}`)",
            lr.recipe.name,
            root.display(),
            crate::shell::command_at(&format!("build {}", crate::recipe::shell_arg(&lr)), &root)
        ));
    }
    Ok(Located {
        venv: link.canonicalize()?,
        recipe: lr.recipe,
        against: format!("recipe {}", lr.origin),
        store: Store::open_existing(&root),
    })
}

/// The error for `verify PATH` of a symlink whose target is gone (exit 1):
/// names the link, its target and, for a registered alias, how to rebuild
/// and re-activate it.
fn dangling(s: &Session, p: &Path, to: &Path) -> anyhow::Error {
    let alias = s
        .root()
        .ok()
        .and_then(|r| Store::open_existing(&r))
        .and_then(|store| {
            let registry = Registry::load(&store).ok()?;
            let a = registry.find(p)?;
            Some((store, a.recipe.clone(), a.recipe_file.clone()))
        });
    let fix = match alias {
        Some((store, recipe, file)) => {
            let pin = file.map_or(recipe.clone(), |f| f.display().to_string());
            format!(
                "it is the alias of recipe {recipe}: rebuild and point it at the new oracle with `oracle-build build {} --store {} --activate {}`",
                crate::shell::shell_quote(&pin),
                crate::shell::shell_quote(&store.root().display().to_string()),
                crate::shell::shell_quote(&p.display().to_string())
            )
        }
        None => "rebuild the oracle it named, or remove the link".to_string(),
    };
    anyhow!(
        "{} is a symlink to {}, which does not exist (its oracle was deleted); there is nothing to verify: {fix}",
        p.display(),
        to.display()
    )
}

/// Locates and verifies the oracle named by `target` (see [`VerifyOptions`]).
///
/// Errors: exit 2 for a malformed pin file or a bad target (checked before
/// anything is measured); exit 1 when the oracle cannot be found or measured.
pub fn verify(s: &Session, target: &str, opts: &VerifyOptions) -> Result<Verification> {
    let pin_file = match &opts.pin_file {
        Some(p) => Some((p.clone(), pin_block::read(p)?)),
        None => None,
    };
    let loc = locate(s, target, opts.pin.as_deref())?;
    let mut v = verify_venv(
        &loc.venv,
        &loc.recipe,
        &loc.against,
        if opts.deep { Depth::Deep } else { Depth::Sizes },
        pin_file.as_ref().map(|(p, r)| (p.as_path(), r)),
        loc.store.as_ref(),
    )?;
    if opts.provenance {
        let store = loc.store.as_ref().ok_or_else(|| {
            anyhow!(
                "verify --provenance: {} lies in no store, so its wheel's record cannot be found",
                loc.venv.display()
            )
        })?;
        let rec = OracleRecord::read(&loc.venv)?;
        let rows = crate::pipeline::provenance::checks(store, &rec, &loc.recipe.source.repo)?;
        v.ok = v.ok && rows.iter().all(|c| c.ok);
        v.checks.extend(rows);
    }
    if (opts.emit_pin_block || opts.write_pin_block.is_some()) && v.ok {
        v.pin_block =
            Some(PinRecord::from_identity(&loc.recipe.source.commit, &v.identity).render());
    }
    Ok(v)
}

/// Prints the checks, one line each, and a summary line.
pub fn print_checks(v: &Verification, to_stderr: bool) {
    let mut lines = vec![format!(
        "oracle {} (recipe {}, checked against {})",
        v.venv.display(),
        v.recipe,
        v.checked_against
    )];
    for c in &v.checks {
        lines.push(format!(
            "  {:<6} {:<30} expected {}  found {}",
            if c.ok { "[ok]" } else { "[FAIL]" },
            c.field,
            c.expected,
            c.found
        ));
    }
    for w in &v.warnings {
        lines.push(format!("  warning (recorded at build): {w}"));
    }
    for n in &v.notes {
        lines.push(format!("  not checked (recorded at build): {n}"));
    }
    match &v.kernel_families {
        Some(fs) if fs.is_empty() => {
            lines.push("  kernel families: the tree's configure reported none (build.json)".into())
        }
        Some(fs) => {
            lines.push(
                "  kernel families, as the tree's configure reported them (build.json):".into(),
            );
            for f in fs {
                lines.push(format!("    {}", f.describe()));
            }
        }
        None => lines.push(
            "  kernel families: not known (no readable build.json of the oracle's wheel)".into(),
        ),
    }
    match &v.kernel_coverage {
        Some(cov) => {
            lines.push(format!(
                "  kernel coverage, as the recorded gate's engines loaded it ({}):",
                cov.target
                    .as_ref()
                    .map_or("not judged: no GPU".to_string(), |t| format!(
                        "judged against {}",
                        t.described
                    ))
            ));
            for l in &cov.loaded {
                lines.push(format!(
                    "    loaded      {} (case {}): {}",
                    l.path,
                    l.cases.join(", "),
                    l.verdict
                ));
            }
            for n in &cov.not_loaded {
                lines.push(format!("    not loaded  {} (holds {})", n.path, n.holds));
            }
            lines.push(format!(
                "    {} other shared object(s) of the venv loaded",
                cov.device_libraries.len()
            ));
        }
        None => lines.push(format!(
            "  kernel coverage: {}",
            crate::stages::identity::NO_GATE_RUN
        )),
    }
    let failed = v.checks.iter().filter(|c| !c.ok).count();
    lines.push(if failed == 0 {
        format!("verified: all {} checks pass", v.checks.len())
    } else {
        format!("REFUSED: {failed} of {} checks fail", v.checks.len())
    });
    for l in lines {
        if to_stderr {
            crate::progress::line(l);
        } else {
            println!("{l}");
        }
    }
}

/// Replaces the ```` ```parity-pin ```` record in `file` with `block`
/// (see [`pin_block::replace_block`]): written to a temporary file beside it
/// and renamed over it, so a reader sees the old file or the new one. A new
/// file is created when `file` is absent; an existing file keeps its mode.
///
/// Errors: exit 2 when `file` holds an unclosed block or is not UTF-8 text
/// (it is left unchanged); exit 1 when it cannot be read or written.
pub fn write_pin_block(file: &Path, block: &str) -> Result<()> {
    use std::io::Write;
    // A symlink is written through: its target gets the new text (by
    // rename beside it) and the link stays a link.
    let target = follow_links(file)?;
    let file = target.as_path();
    let (text, perms) = match std::fs::read(file) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes).map_err(|_| {
                bad_input(format!(
                    "{} is not UTF-8 text; refusing to write a pin block into it",
                    file.display()
                ))
            })?;
            (text, Some(fs_err::metadata(file)?.permissions()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), None),
        Err(e) => return Err(anyhow!("cannot read {}: {e}", file.display())),
    };
    let new = pin_block::replace_block(&text, block, &file.display().to_string())?;
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".pin-block.")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(new.as_bytes())
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    if let Some(p) = perms {
        fs_err::set_permissions(tmp.path(), p)?;
    }
    tmp.persist(file)
        .map_err(|e| anyhow!("replacing {}: {}", file.display(), e.error))?;
    Ok(())
}

/// The file `path` names once every symlink on it is followed (the path
/// itself when it is no link; a dangling link's target, to be created).
///
/// Errors: more than 40 links in a row (a loop).
fn follow_links(path: &Path) -> Result<std::path::PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(bad_input(format!(
        "{}: too many levels of symbolic links; point it at the file to write",
        path.display()
    )))
}

/// `verify`: prints every check; with `--emit-pin-block`, the checks go to
/// stderr and stdout gets only the block, and only when every check passes
/// (so `>> SYNC.md` never appends anything else); `--write-pin-block FILE`
/// replaces the block in FILE instead. Exit 3 when any check fails (then no
/// block is printed or written).
pub fn run(s: &Session, target: &str, opts: &VerifyOptions) -> Result<()> {
    let json = s.json;
    if let Some(file) = &opts.write_pin_block {
        crate::ops::check_output_file(
            "--write-pin-block",
            file,
            "SYNC.md",
            "nothing was verified or written",
        )?;
    }
    let v = verify(s, target, opts)?;
    if let (Some(file), Some(block)) = (&opts.write_pin_block, &v.pin_block) {
        write_pin_block(file, block)?;
        if !json {
            crate::progress::line(format!("wrote the pin block into {}", file.display()));
        }
    }
    if json {
        print_json(&v)?;
    } else if opts.emit_pin_block {
        print_checks(&v, true);
        if let Some(block) = &v.pin_block {
            print!("{block}");
        }
    } else {
        print_checks(&v, false);
    }
    if v.ok {
        Ok(())
    } else {
        Err(mismatch(format!(
            "{} is not the pin{}:\n{}",
            v.venv.display(),
            if opts.emit_pin_block || opts.write_pin_block.is_some() {
                "; no pin block emitted or written"
            } else {
                ""
            },
            identity::describe_failures(&v.checks)
        )))
    }
}
