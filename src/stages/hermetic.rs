//! The hermetic inputs of the wheel and venv stages: locked installs from
//! the wheelhouse, staged external sources, and the compiler cache.
//!
//! `ops::build` fills these before the wheel and venv stages run; the stages
//! read them from their plans ([`crate::stages::wheel::WheelPlan::hermetic`],
//! [`crate::stages::venv::VenvPlan::hermetic`]). [`apply_wheel`] and
//! [`apply_venv`] put what changes the result into the stage's key: the
//! sha256 of the lock file used and the resolved revision of every staged
//! source.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use fs_err as fs;
use serde_json::Value;

use crate::store::key::content_key;
use crate::stages::ext::{ExtSource, Variable};
use crate::stages::venv::VenvPlan;
use crate::stages::wheel::WheelPlan;
use crate::store::{Bucket, Entry, Store};
use crate::host::toolchain::Tool;
use crate::host::uv::Uv;
use crate::stages::wheelhouse::{self, LockedPackage};

/// A hash-pinned install of a locked set from wheelhouse entries.
#[derive(Debug, Clone, Default)]
pub struct LockedInstall {
    /// The locked packages.
    pub packages: Vec<LockedPackage>,
    /// The wheelhouse entries that hold their artifacts.
    pub entries: Vec<Entry>,
    /// sha256 of the lock file they come from.
    pub lock_sha256: String,
}

impl LockedInstall {
    /// Installs exactly the set into `venv` from the wheelhouse only (`--offline
    /// --no-index --require-hashes --no-deps`); `extra_lines` are appended to the
    /// requirements (e.g. the built wheel by path with its hash) and
    /// `extra_args` to the command. Scratch files go to `work`.
    ///
    /// Errors: uv fails (an artifact missing, a hash mismatch, an incomplete set).
    pub fn install(
        &self,
        uv: &Uv,
        venv: &Path,
        work: &Path,
        extra_lines: &[String],
        extra_args: &[String],
        log: &Path,
    ) -> Result<()> {
        // One store-wide directory of links: uv keys its cache of local
        // wheels by path, so the same wheel at the same path is unpacked once
        // and every venv hard-links the same files (two oracles sharing their
        // dependencies cost little more than one). A file-name clash with
        // another artifact falls back to a private directory.
        let shared = self.entries.first().and_then(|e| {
            e.path
                .ancestors()
                .nth(3)
                .map(|root| root.join("wheelhouse-links"))
        });
        let links = match shared {
            Some(dir) if wheelhouse::link_dir(&self.entries, &dir).is_ok() => dir,
            _ => {
                let dir = work.join("wheelhouse-links");
                wheelhouse::link_dir(&self.entries, &dir)?;
                dir
            }
        };
        let reqs = work.join("locked-requirements.txt");
        let mut text = wheelhouse::requirements_text(&self.packages);
        for l in extra_lines {
            text.push_str(l);
            text.push('\n');
        }
        fs::write(&reqs, text)?;
        // The lock is the complete resolution (pins applied as overrides when
        // it was made): install exactly it, without resolving again.
        let mut args = vec!["--no-deps".to_string()];
        args.extend(extra_args.iter().cloned());
        uv.pip_install_locked(venv, &reqs, &links, &args, log)
    }

    /// The labels of its wheelhouse entries (for `requires`).
    pub fn labels(&self) -> Vec<String> {
        self.entries.iter().map(Entry::label).collect()
    }
}

/// A compiler cache (sccache or ccache) and its directory inside the store root.
#[derive(Debug, Clone)]
pub struct CompilerCache {
    /// The program found.
    pub tool: Tool,
    /// `CCACHE_DIR` / `SCCACHE_DIR`.
    pub dir: PathBuf,
    /// Which variable points at `dir`.
    pub var: &'static str,
}

impl CompilerCache {
    /// sccache, else ccache, on PATH; its directory is `<root>/sccache` or
    /// `<root>/ccache`, so a rebuild after a reboot reuses compiled objects.
    /// vLLM's setup.py uses whichever it finds as the compiler launcher.
    pub fn find(store: &Store) -> Option<CompilerCache> {
        for (prog, var, dir) in [
            ("sccache", "SCCACHE_DIR", "sccache"),
            ("ccache", "CCACHE_DIR", "ccache"),
        ] {
            if let Ok(path) = which::which(prog)
                && let Ok(out) = crate::host::process::capture(prog, duct::cmd(&path, ["--version"]))
            {
                return Some(CompilerCache {
                    tool: Tool {
                        path,
                        version: out.lines().next().unwrap_or("").trim().to_string(),
                    },
                    dir: store.root().join(dir),
                    var,
                });
            }
        }
        None
    }
}

/// What the wheel stage takes beyond its own plan.
#[derive(Debug, Clone, Default)]
pub struct WheelHermetic {
    /// The build set, installed into the build venv.
    pub build_lock: Option<LockedInstall>,
    /// Staged external sources: the source and its store entry.
    pub ext: Vec<(ExtSource, Entry)>,
    /// The key inputs of the staged sources ([`crate::stages::ext::key_inputs`]).
    pub ext_key: Value,
    /// sccache / ccache, when found.
    pub compiler_cache: Option<CompilerCache>,
}

impl WheelHermetic {
    /// Labels of every store entry these inputs come from (for `requires`).
    pub fn labels(&self) -> Vec<String> {
        let mut out: Vec<String> = self.ext.iter().map(|(_, e)| e.label()).collect();
        if let Some(l) = &self.build_lock {
            out.extend(l.labels());
        }
        out
    }

    /// The extra build environment: the staged sources (copied into
    /// `work`), `CMAKE_ARGS` merged with `base_cmake_args`, and the compiler
    /// cache directory (created).
    pub fn env(
        &self,
        work: &Path,
        base_cmake_args: Option<&str>,
    ) -> Result<BTreeMap<String, String>> {
        let mut env = crate::stages::ext::build_env(&self.ext, work, base_cmake_args)?;
        if let Some(c) = &self.compiler_cache {
            fs::create_dir_all(&c.dir)?;
            env.insert(c.var.into(), c.dir.display().to_string());
        }
        Ok(env)
    }

    /// Names of the variables the staged sources are passed through.
    pub fn variables(&self) -> Vec<String> {
        self.ext
            .iter()
            .map(|(s, _)| match &s.variable {
                Variable::Env(v) => v.clone(),
                Variable::Cmake(v) => format!("CMAKE_ARGS -D{v}"),
            })
            .collect()
    }
}

/// The wheel stage's work directory, `<root>/tmp/build-<wheel key>`: the
/// same path for every build of a key (the build holds the key's lock), so
/// the compiler command lines, and with them ccache/sccache hits, survive a
/// reboot. Removed when dropped, and before use if a killed build left it.
#[derive(Debug)]
pub struct StableWorkDir(PathBuf);

impl StableWorkDir {
    /// Creates (after clearing) `<root>/tmp/build-<key>`.
    pub fn create(store: &Store, key: &str) -> Result<StableWorkDir> {
        let dir = store.tmp_dir().join(format!("build-{key}"));
        if fs::symlink_metadata(&dir).is_ok() {
            crate::store::make_writable(&dir);
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir)?;
        Ok(StableWorkDir(dir))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Removes the work directories of builds that no longer run (a build
    /// killed at any moment, even between persisting its wheel and cleaning
    /// up): those whose wheel lock nobody holds. Returns how many.
    pub fn clean_stale(store: &Store) -> usize {
        let Ok(rd) = fs::read_dir(store.tmp_dir()) else {
            return 0;
        };
        let mut removed = 0;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(key) = name.strip_prefix("build-") else {
                continue;
            };
            let lock = store.root().join("locks").join(format!("wheel-{key}.lock"));
            let free = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&lock)
            {
                Ok(f) => f.try_lock().is_ok(),
                Err(_) => true,
            };
            if free {
                crate::store::make_writable(&e.path());
                if std::fs::remove_dir_all(e.path()).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}

impl Drop for StableWorkDir {
    fn drop(&mut self) {
        crate::store::make_writable(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the venv stage takes beyond its own plan.
#[derive(Debug, Clone, Default)]
pub struct VenvHermetic {
    /// The runtime set, installed with the wheel.
    pub runtime_lock: Option<LockedInstall>,
}

/// Sets the hermetic inputs of `plan` and puts the build lock's sha256 and
/// the staged sources into its key (recomputing key and entry).
pub fn apply_wheel(store: &Store, mut plan: WheelPlan, h: WheelHermetic) -> WheelPlan {
    if let Value::Object(m) = &mut plan.inputs {
        let ext = if h.ext_key.is_null() {
            Value::Array(Vec::new())
        } else {
            h.ext_key.clone()
        };
        m.insert("ext".into(), ext);
        m.insert(
            "build_lock".into(),
            h.build_lock
                .as_ref()
                .map_or(Value::Null, |l| Value::String(l.lock_sha256.clone())),
        );
    }
    plan.key = content_key(&plan.inputs);
    plan.entry = store.entry(Bucket::Wheels, &plan.key);
    plan.hermetic = h;
    plan
}

/// Sets the hermetic inputs of `plan` and puts the runtime lock's sha256
/// into its key (recomputing key and entry).
pub fn apply_venv(store: &Store, mut plan: VenvPlan, h: VenvHermetic) -> VenvPlan {
    if let Value::Object(m) = &mut plan.inputs {
        m.insert(
            "runtime_lock".into(),
            h.runtime_lock
                .as_ref()
                .map_or(Value::Null, |l| Value::String(l.lock_sha256.clone())),
        );
    }
    plan.key = content_key(&plan.inputs);
    plan.entry = store.entry(Bucket::Venvs, &plan.key);
    plan.hermetic = h;
    plan
}
