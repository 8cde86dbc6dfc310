//! The engine's caches and scratch confined to the gate's own run directory.
//!
//! A real engine writes wherever its libraries default to: vLLM's
//! `~/.cache/vllm`, torch inductor's `/tmp/torchinductor_<user>` (even with
//! `enforce_eager`), Triton's `~/.triton`, Hugging Face's `~/.cache/huggingface`,
//! FlashInfer's `~/.cache/flashinfer`, CUDA's `~/.nv/ComputeCache`, and
//! ZeroMQ IPC sockets in `$TMPDIR`. During every engine run of the gate
//! (the probe, each case, `--record-golden`) each of those variables points
//! at a directory of its own under `<run dir>/engine/`, `HOME` at an empty
//! directory there, `TMPDIR` (`TMP`, `TEMP`) at a fresh directory per
//! process (also its working directory), and the engine runs offline
//! (`HF_HUB_OFFLINE=1`, `TRANSFORMERS_OFFLINE=1`). Its `PATH` starts with
//! the oracle's `bin/` ([`engine_path`]).
//!
//! The per-process `TMPDIR` is `<store>/tmp/e.<pid>.<random>`, not a
//! directory of the run: vLLM binds ZeroMQ IPC sockets at
//! `$TMPDIR/<uuid4>`, and a Unix socket path has at most 107 bytes, which a
//! directory inside an oracle's staging (`tmp/venv-<key>.<pid>.<r>/scratch/smoke/...`)
//! would exceed. Named like a staging directory, a killed run's is swept
//! by the store's staging cleanup.
//!
//! The run directory is the gate's staging (inside the oracle's staging for
//! a build, a fresh one for `smoke`), so no compile cache passes from one
//! oracle, or one gate run, to another. What each process left in its
//! `TMPDIR` (sockets included) is counted and removed when it exits; what
//! the caches hold is measured once every run is done, and the whole
//! `engine/` directory is then deleted: the caches are scratch, not part of
//! the oracle (they never enter an entry's manifest). [`EngineRecord`] is
//! what `oracle.json` keeps of them (`smoke.engine`).
//!
//! The variable names come from [`crate::recipe::CONFINED_SMOKE_VARS`]
//! (which a recipe's `smoke.env` may not set); FlashInfer's is
//! `FLASHINFER_WORKSPACE_BASE` (`flashinfer/jit/env.py`: its cache is
//! `<base>/.cache/flashinfer`, its downloaded cubins below it unless
//! `FLASHINFER_CUBIN_DIR` says otherwise).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use fs_err as fs;

use super::report::{CacheUse, EngineRecord, KvCacheSpace, TmpLeft, Usage};
use crate::recipe::{LoadedRecipe, TargetDevice};

/// The directory of the engine's caches inside a gate's run directory.
pub(super) const ENGINE_DIR: &str = "engine";

/// Each cache variable and its directory under [`ENGINE_DIR`]: siblings, so
/// no cache is counted inside another.
const CACHES: &[(&str, &str)] = &[
    ("VLLM_CACHE_ROOT", "vllm"),
    ("TRITON_CACHE_DIR", "triton"),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("XDG_CACHE_HOME", "xdg-cache"),
    ("XDG_CONFIG_HOME", "xdg-config"),
    ("HF_HOME", "huggingface"),
    ("CUDA_CACHE_PATH", "cuda"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("HOME", "home"),
];

/// The temporary-directory variables, all pointed at one per-process directory.
const TMP_VARS: &[&str] = &["TMPDIR", "TMP", "TEMP"];

/// Fixed values: the engine never reaches a hub.
const OFFLINE: &[(&str, &str)] = &[("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")];

/// vLLM's CPU backend: the KV cache size in GiB (`vllm/envs.py`). Its own
/// default takes most of the machine's memory (20.7 of 23.5 GiB measured).
pub const KVCACHE_VAR: &str = "VLLM_CPU_KVCACHE_SPACE";

/// The gate's default for [`KVCACHE_VAR`] on `target_device: cpu`, in GiB:
/// ample for the gate's small models.
pub const KVCACHE_DEFAULT_GIB: &str = "1";

/// The KV cache bound of the gate for `lr` ([`KVCACHE_VAR`]): `smoke.env`'s
/// value, else the default for `target_device: cpu`; `None` for other devices.
pub(super) fn kv_cache_space(lr: &LoadedRecipe) -> Option<KvCacheSpace> {
    let r = &lr.recipe;
    if let Some(v) = r.smoke.env.get(KVCACHE_VAR) {
        return Some(KvCacheSpace {
            gib: v.clone(),
            from: "smoke.env".into(),
        });
    }
    (r.build.device() == TargetDevice::Cpu).then(|| KvCacheSpace {
        gib: KVCACHE_DEFAULT_GIB.into(),
        from: "default".into(),
    })
}

/// The `PATH` of every engine process of the gate: the oracle's `bin/`
/// (`bin`, made absolute) first, so the tools the engine runs (FlashInfer's
/// JIT runs `ninja`) are the oracle's, then `base` (the recipe's `PATH`
/// when `smoke.env` or the case's `env` sets one, else the gate's own).
pub(super) fn engine_path(bin: &Path, base: Option<&str>) -> String {
    let bin = std::path::absolute(bin).unwrap_or_else(|_| bin.to_path_buf());
    let inherited = std::env::var_os("PATH");
    let base: Vec<PathBuf> = match base {
        Some(b) => std::env::split_paths(b).collect(),
        None => inherited
            .as_deref()
            .map(|p| std::env::split_paths(p).collect())
            .unwrap_or_default(),
    };
    std::env::join_paths(std::iter::once(bin.clone()).chain(base))
        .unwrap_or_else(|_| bin.into_os_string())
        .to_string_lossy()
        .into_owned()
}

/// The engine directories of one gate run, removed when dropped.
pub(super) struct EngineDirs {
    /// `<run dir>/engine`.
    root: PathBuf,
    /// Where each process's `TMPDIR` is made (`<store>/tmp`; `None`:
    /// under `root`).
    tmp_root: Option<PathBuf>,
    /// What each process left in its `TMPDIR`, in run order.
    left: Vec<TmpLeft>,
}

/// One engine process's environment and directory.
pub(super) struct RunEnv {
    /// The confinement variables (to set over the recipe's).
    pub(super) env: BTreeMap<String, String>,
    /// Its `TMPDIR`, also its working directory.
    pub(super) tmp: PathBuf,
    /// The run's name (`probe`, `case-<name>`).
    name: String,
}

impl EngineDirs {
    /// Creates `<run_dir>/engine` with an empty directory for each cache
    /// variable (a stale one left by a killed run is removed first).
    ///
    /// Errors: a directory cannot be created.
    pub(super) fn create(run_dir: &Path, tmp_root: Option<&Path>) -> Result<EngineDirs> {
        let root = std::path::absolute(run_dir.join(ENGINE_DIR))
            .with_context(|| format!("resolving {}", run_dir.display()))?;
        remove(&root);
        for (_, dir) in CACHES {
            fs::create_dir_all(root.join(dir))?;
        }
        fs::create_dir_all(root.join("tmp"))?;
        Ok(EngineDirs {
            root,
            tmp_root: tmp_root.map(Path::to_path_buf),
            left: Vec::new(),
        })
    }

    /// The environment of the engine process `name`, with a fresh empty
    /// `TMPDIR` of its own.
    ///
    /// Errors: the directory cannot be created.
    pub(super) fn run_env(&self, name: &str) -> Result<RunEnv> {
        let tmp = match &self.tmp_root {
            Some(dir) => {
                fs::create_dir_all(dir)?;
                tempfile::Builder::new()
                    .prefix(&format!("e.{}.", std::process::id()))
                    .tempdir_in(dir)
                    .with_context(|| format!("creating a TMPDIR in {}", dir.display()))?
                    .keep()
            }
            None => {
                let tmp = self.root.join("tmp").join(name);
                remove(&tmp);
                fs::create_dir_all(&tmp)?;
                tmp
            }
        };
        let mut env = BTreeMap::new();
        for (var, dir) in CACHES {
            env.insert((*var).to_string(), path_text(&self.root.join(dir)));
        }
        for var in TMP_VARS {
            env.insert((*var).to_string(), path_text(&tmp));
        }
        for (var, value) in OFFLINE {
            env.insert((*var).to_string(), (*value).to_string());
        }
        Ok(RunEnv {
            env,
            tmp,
            name: name.to_string(),
        })
    }

    /// Counts what the process of `run` left in its `TMPDIR` and removes it.
    pub(super) fn finish_run(&mut self, run: RunEnv) {
        let usage = measure(&run.tmp);
        remove(&run.tmp);
        self.left.push(TmpLeft {
            run: run.name,
            path: path_text(&run.tmp),
            usage,
        });
    }

    /// Measures every cache directory, then deletes the engine directory.
    /// `path` is the engine's `PATH` ([`engine_path`]), recorded.
    pub(super) fn finish(
        mut self,
        kv_cache_space: Option<KvCacheSpace>,
        path: Option<String>,
    ) -> EngineRecord {
        let caches = CACHES
            .iter()
            .map(|(var, dir)| CacheUse {
                var: (*var).to_string(),
                path: format!("{ENGINE_DIR}/{dir}"),
                usage: measure(&self.root.join(dir)),
            })
            .collect();
        remove(&self.root);
        EngineRecord {
            dir: ENGINE_DIR.into(),
            kept: false,
            offline: OFFLINE
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
            kv_cache_space,
            path,
            caches,
            tmpdir: std::mem::take(&mut self.left),
        }
    }
}

impl Drop for EngineDirs {
    fn drop(&mut self) {
        remove(&self.root);
    }
}

fn path_text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Removes `dir` and everything under it, read-only files included (best effort).
fn remove(dir: &Path) {
    if std::fs::symlink_metadata(dir).is_ok() {
        crate::store::make_writable(dir);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// What is under `dir`, recursively, symlinks not followed (all zero when absent).
fn measure(dir: &Path) -> Usage {
    use std::os::unix::fs::FileTypeExt;
    let mut u = Usage::default();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            let t = meta.file_type();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                u.files += 1;
                u.bytes += meta.len();
            } else if t.is_socket() {
                u.sockets += 1;
            } else {
                u.other += 1;
            }
        }
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_confined_variable_is_set_and_refused_in_a_recipe() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = EngineDirs::create(dir.path(), None).unwrap();
        let run = dirs.run_env("probe").unwrap();
        let mut set: Vec<&str> = run.env.keys().map(String::as_str).collect();
        set.sort_unstable();
        let mut confined = crate::recipe::CONFINED_SMOKE_VARS.to_vec();
        confined.sort_unstable();
        assert_eq!(set, confined);
        for (var, value) in &run.env {
            assert!(
                OFFLINE.iter().any(|(k, _)| k == var) || value.starts_with(&path_text(&dirs.root)),
                "{var}={value}"
            );
        }
    }

    #[test]
    fn what_a_run_leaves_is_counted_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store_tmp = dir.path().join("store-tmp");
        let mut dirs = EngineDirs::create(dir.path(), Some(&store_tmp)).unwrap();
        let run = dirs.run_env("case-a").unwrap();
        assert!(run.tmp.starts_with(&store_tmp), "{}", run.tmp.display());
        let tmp = run.tmp.clone();
        fs::write(tmp.join("f"), "abc").unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(tmp.join("s.sock")).unwrap();
        fs::write(dirs.root.join("vllm/x"), "12345").unwrap();
        dirs.finish_run(run);
        assert!(!tmp.exists());
        let root = dirs.root.clone();
        let rec = dirs.finish(None, None);
        assert!(!root.exists());
        let left = &rec.tmpdir[0].usage;
        assert_eq!((left.files, left.bytes, left.sockets), (1, 3, 1));
        let vllm = rec
            .caches
            .iter()
            .find(|c| c.var == "VLLM_CACHE_ROOT")
            .unwrap();
        assert_eq!((vllm.usage.files, vllm.usage.bytes), (1, 5));
        assert_eq!(vllm.path, "engine/vllm");
    }
}
