//! Stage 6, venv: install the wheel non-editably into a content-addressed,
//! relocatable venv (uv's `--relocatable`), in staging.
//!
//! [`plan`] computes the venv key once from complete inputs (Python, package,
//! commit, the wheel's sha256, pins, indexes, the checkout's runtime
//! requirements file and the runtime lock's sha256); [`install`] makes the
//! venv in a staging directory. The identity check, the gate and the record
//! that turn it into the entry `store/venvs/<key>/` are
//! the oracle stage's (`stages::oracle`, which runs after this one).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use fs_err as fs;
use serde_json::{Value, json};

use crate::host::toolchain::Toolchain;
use crate::host::uv::pin_lines;
use crate::progress;
use crate::recipe::LoadedRecipe;
use crate::stages::Ctx;
use crate::stages::lock::runtime_requirements;
use crate::stages::wheel::BuildRecord;
use crate::stages::wheelhouse::LockedInstall;
use crate::store::key::{KEY_SCHEMA, content_key};
use crate::store::{Bucket, Entry, Store, sha256_file};

/// What the venv stage takes beyond its own plan.
#[derive(Debug, Clone, Default)]
pub struct VenvHermetic {
    /// The runtime set, installed with the wheel.
    pub runtime_lock: Option<LockedInstall>,
}

/// The venv stage's key and entry, known before any work.
#[derive(Debug, Clone)]
pub struct VenvPlan {
    /// Content key.
    pub key: String,
    /// The hashed inputs.
    pub inputs: Value,
    /// `store/venvs/<key>`.
    pub entry: Entry,
    /// The checkout's runtime requirements file, if any.
    pub runtime: Option<String>,
    /// The locked runtime set.
    pub hermetic: VenvHermetic,
}

/// The venv plan for installing `wheel` (built from the checkout at `src`)
/// with `tc` and the locked runtime set of `hermetic`: the key is computed
/// once, from every input (see [`crate::store::key`]).
pub fn plan(
    store: &Store,
    lr: &LoadedRecipe,
    tc: &Toolchain,
    wheel: &BuildRecord,
    src: &Path,
    hermetic: VenvHermetic,
) -> VenvPlan {
    let r = &lr.recipe;
    let runtime = runtime_requirements(src, &r.build.target_device);
    let inputs = json!({
        "schema": KEY_SCHEMA,
        "stage": "venv",
        "python": {"version": tc.python.version, "implementation": tc.python.implementation, "platform": tc.python.platform},
        "package": r.source.package,
        "commit": r.source.commit,
        "wheel_sha256": wheel.sha256,
        "pins": r.pins,
        "indexes": r.indexes,
        "runtime_requirements": runtime,
        "runtime_lock": hermetic.runtime_lock.as_ref().map(|l| l.lock_sha256.clone()),
    });
    let key = content_key(&inputs);
    VenvPlan {
        entry: store.entry(Bucket::Venvs, &key),
        key,
        inputs,
        runtime,
        hermetic,
    }
}

/// A venv installed in staging by [`install`].
#[derive(Debug, Clone)]
pub struct Installed {
    /// The venv (`<staging>/venv`).
    pub venv: PathBuf,
    /// Scratch files and logs that travel with the entry (`<staging>/scratch`).
    pub scratch: PathBuf,
    /// The install log (`<root>/logs/install-<key>.log`).
    pub log: PathBuf,
    /// When the install started (RFC 3339).
    pub created: String,
    /// Seconds spent creating and installing the venv.
    pub install_s: f64,
}

/// Installs the wheel of `wheel_entry` (checked against `wheel`'s sha256)
/// into a fresh relocatable venv under `staging`: exactly the locked runtime
/// set plus the wheel when `plan` has one, else the checkout's runtime
/// requirements with the recipe's pins as overrides.
///
/// Errors: the wheel's sha256 differs from its record; uv fails.
pub fn install(
    cx: &Ctx<'_>,
    wheel_entry: &Entry,
    wheel: &BuildRecord,
    src: &Entry,
    plan: &VenvPlan,
    staging: &Path,
) -> Result<Installed> {
    let Ctx { store, lr, tc, uv } = *cx;
    let r = &lr.recipe;
    let (key, entry, runtime) = (plan.key.as_str(), &plan.entry, plan.runtime.as_deref());
    progress::stage(
        "install",
        format!("installing {} into {}", wheel.wheel, entry.label()),
    );
    let t0 = Instant::now();
    let created = jiff::Timestamp::now().to_string();
    let venv = staging.join("venv");
    let scratch = staging.join("scratch");
    fs::create_dir_all(&scratch)?;
    let log = store.stage_log(&format!("install-{key}"))?;
    let wheel_path = wheel.wheel_path(&wheel_entry.path);
    let sha = sha256_file(&wheel_path)?;
    if sha != wheel.sha256 {
        bail!(
            "wheel {} has sha256 {sha}, but build.json records {}",
            wheel_path.display(),
            wheel.sha256
        );
    }
    uv.venv(&tc.python.path, &venv, true, &log)?;
    let overrides = scratch.join("overrides.txt");
    fs::write(&overrides, pin_lines(&r.pins))?;
    let mut args: Vec<String> = vec![
        "--compile-bytecode".into(),
        "--override".into(),
        overrides.display().to_string(),
    ];
    if let Some(locked) = &plan.hermetic.runtime_lock {
        // Exactly the locked runtime set plus the wheel, by path and sha256.
        let wheel_line = format!(
            "{} @ file://{} --hash=sha256:{}",
            r.source.package,
            wheel_path.display(),
            wheel.sha256
        );
        // The lock already applied the pins; only bytecode compilation is added.
        locked
            .install(
                uv,
                &venv,
                &scratch,
                &[wheel_line],
                &["--compile-bytecode".into()],
                &log,
            )
            .context("installing the oracle venv from the locked runtime set")?;
    } else {
        if let Some(rel) = runtime {
            args.extend(["-r".into(), src.path.join(rel).display().to_string()]);
        }
        args.extend(r.pins.iter().map(|(n, v)| format!("{n}=={v}")));
        args.push(wheel_path.display().to_string());
        uv.pip_install(&venv, &args, &log)
            .context("installing the oracle venv")?;
    }
    Ok(Installed {
        venv,
        scratch,
        log,
        created,
        install_s: t0.elapsed().as_secs_f64(),
    })
}
