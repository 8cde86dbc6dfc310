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
//! The real caches (vLLM's, inductor's, Triton's, `XDG_CACHE_HOME`,
//! FlashInfer's and CUDA's: [`CACHES`] marked warm) are the oracle's own
//! and kept warm between its gate runs: they live in the store's engine
//! cache of the oracle's venv key and the device the gate runs on
//! (`<store>/engine-cache/<venv key>-<device>`, `store::engine_cache`),
//! taken under its lock without waiting. No other oracle (another venv
//! key) sees them. A gate that finds the lock held (another gate of the
//! same oracle running), a gate without a venv key (`advance`'s FROM
//! run) and a read-only store run with cold scratch caches under
//! `<run dir>/engine/`, deleted after the run, and the record says why.
//! `smoke --cold` empties the kept caches first (under the lock), so its
//! run starts cold and leaves them warm for the next. `HOME`,
//! `XDG_CONFIG_HOME` and `HF_HOME` stay per gate run (emptied before it
//! and deleted after it): they hold state and configuration, not
//! compiled code, and the engine runs offline. With a kept engine cache
//! they are at the same paths every run (`<engine cache>/fresh/<dir>`):
//! vLLM keys its compile cache with paths derived from them
//! (`VLLM_CONFIG_ROOT` defaults to `$XDG_CONFIG_HOME/vllm`, and
//! `vllm/envs.py` `compile_factors()` hashes it), so a new path per run
//! would miss the warm cache every time (measured on a real CPU oracle:
//! two `torch_aot_compile/<hash>` directories, one per run).
//!
//! What each process left in its `TMPDIR` (sockets included) is counted
//! and removed when it exits; what the caches hold is measured once every
//! run is done, and the run's `engine/` directory is then deleted. No
//! cache ever enters an entry's manifest: a killed gate leaves the engine
//! cache as the engine left it (its libraries write their caches
//! atomically) and the oracle's entry untouched. [`EngineRecord`] is what
//! `oracle.json` keeps of them (`smoke.engine`).
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
use crate::store::{Lock, Store};

/// The directory of the engine's caches inside a gate's run directory.
pub(super) const ENGINE_DIR: &str = "engine";

/// The per-run directories inside a held engine cache (emptied before
/// and after each run; see the module's docs).
const FRESH_DIR: &str = "fresh";

/// Each cache variable, its directory (siblings, so no cache is counted
/// inside another) and whether it is kept warm in the oracle's engine
/// cache (else it lives under [`ENGINE_DIR`] for one gate run).
const CACHES: &[(&str, &str, bool)] = &[
    ("VLLM_CACHE_ROOT", "vllm", true),
    ("TRITON_CACHE_DIR", "triton", true),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor", true),
    ("XDG_CACHE_HOME", "xdg-cache", true),
    ("XDG_CONFIG_HOME", "xdg-config", false),
    ("HF_HOME", "huggingface", false),
    ("CUDA_CACHE_PATH", "cuda", true),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer", true),
    ("HOME", "home", false),
];

/// Where a gate's warm caches are kept: the store and the oracle's venv
/// key (`smoke::Options::engine_cache`).
#[derive(Debug, Clone)]
pub struct CacheRequest {
    /// The store holding the engine cache.
    pub store: Store,
    /// The oracle's venv key.
    pub venv_key: String,
    /// `smoke --cold`: empty the kept caches before the run.
    pub cold: bool,
}

/// The short stable name of the device a gate runs on, for its engine
/// cache: `cpu-<arch>` for `target_device: cpu`; for CUDA the first GPU
/// `nvidia-smi` lists, `sm<major><minor>-<name>` (`cuda-none` without
/// one); else `<target device>-<arch>`.
pub(super) fn device_name(lr: &LoadedRecipe, gpus: &[crate::host::toolchain::Gpu]) -> String {
    let arch = std::env::consts::ARCH;
    match lr.recipe.build.device() {
        TargetDevice::Cpu => format!("cpu-{arch}"),
        TargetDevice::Cuda => gpus.first().map_or("cuda-none".into(), |g| {
            format!("sm{}-{}", g.compute_cap.replace('.', ""), g.name)
        }),
        _ => format!("{}-{arch}", lr.recipe.build.target_device),
    }
}

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

/// The engine directories of one gate run, removed when dropped (the
/// kept engine cache stays).
pub(super) struct EngineDirs {
    /// `<run dir>/engine`.
    root: PathBuf,
    /// Where the per-run directories (`HOME`, `XDG_CONFIG_HOME`,
    /// `HF_HOME`) are: `<engine cache>/fresh` while the cache is held
    /// (one path for every run of the oracle), else `root`.
    fresh_root: PathBuf,
    /// Where the warm caches are: the engine cache entry, or `root`.
    cache_root: PathBuf,
    /// The engine cache entry's lock, held for the run (`None`: scratch).
    _lock: Option<Lock>,
    /// `Some(path)` when the warm caches are kept in the engine cache `path`.
    entry: Option<PathBuf>,
    /// The device name of the engine cache.
    device: String,
    /// What the kept caches held when the run started.
    before: Usage,
    /// Why the run is cold, when it is.
    cold_reason: Option<String>,
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
    /// Creates `<run_dir>/engine` with an empty directory for each per-run
    /// cache variable (a stale one left by a killed run is removed first),
    /// and takes the warm caches: the engine cache of `cache` on `device`
    /// when its lock is free (emptied first with `cache.cold`), else empty
    /// scratch directories under `<run_dir>/engine` (`cache` `None`, or the
    /// lock held by another gate).
    ///
    /// Errors: a directory cannot be created or emptied, the lock file
    /// cannot be made.
    pub(super) fn create(
        run_dir: &Path,
        tmp_root: Option<&Path>,
        cache: Option<&CacheRequest>,
        device: &str,
    ) -> Result<EngineDirs> {
        let root = std::path::absolute(run_dir.join(ENGINE_DIR))
            .with_context(|| format!("resolving {}", run_dir.display()))?;
        remove(&root);
        let mut lock = None;
        let mut entry = None;
        let mut cold_reason = None;
        let mut device = crate::store::engine_cache::device_slug(device);
        // Whether the kept engine cache existed before this run: only its
        // absence says no gate of this oracle kept one here before.
        let mut existed = false;
        match cache {
            None => {
                cold_reason =
                    Some("no engine cache for this run: scratch caches, deleted after it".into())
            }
            Some(req) => {
                let c = req.store.engine_cache(&req.venv_key, &device);
                device = c.device.clone();
                match c.try_lock(&req.store)? {
                    Some(l) => {
                        existed = std::fs::symlink_metadata(&c.path).is_ok();
                        if req.cold {
                            c.remove(&req.store)?;
                            cold_reason = Some("--cold: the kept caches were emptied first".into());
                        }
                        lock = Some(l);
                        entry = Some(c.path);
                    }
                    None => {
                        let why = format!(
                            "the engine cache {} is in use by another gate of this oracle (or `gc`): scratch caches, deleted after the run",
                            c.path.display()
                        );
                        crate::progress::stage("smoke", why.clone());
                        cold_reason = Some(why);
                    }
                }
            }
        }
        let cache_root = entry.clone().unwrap_or_else(|| root.clone());
        let fresh_root = match &entry {
            Some(e) => e.join(FRESH_DIR),
            None => root.clone(),
        };
        if fresh_root != root {
            // Emptied: what a killed run left is not this run's state.
            remove(&fresh_root);
        }
        let before = match &entry {
            Some(e) => measure(e),
            None => Usage::default(),
        };
        // Said as far as the store knows it: an empty cache that was there
        // is not a first run (an engine that writes nothing leaves it empty
        // at every run).
        if entry.is_some() && cold_reason.is_none() && before.files == 0 {
            cold_reason = Some(if existed {
                "the kept engine cache was empty".into()
            } else {
                "the first gate run of this oracle on this device (no engine cache of it was kept here)"
                    .into()
            });
        }
        for (_, dir, warm) in CACHES {
            let base = if *warm { &cache_root } else { &fresh_root };
            fs::create_dir_all(base.join(dir))?;
        }
        fs::create_dir_all(root.join("tmp"))?;
        Ok(EngineDirs {
            root,
            fresh_root,
            cache_root,
            _lock: lock,
            entry,
            device,
            before,
            cold_reason,
            tmp_root: tmp_root.map(Path::to_path_buf),
            left: Vec::new(),
        })
    }

    /// The directory of the cache `dir`, warm or not.
    fn cache_dir(&self, dir: &str, warm: bool) -> PathBuf {
        if warm {
            self.cache_root.join(dir)
        } else {
            self.fresh_root.join(dir)
        }
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
        for (var, dir, warm) in CACHES {
            env.insert((*var).to_string(), path_text(&self.cache_dir(dir, *warm)));
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

    /// Measures every cache directory, then deletes the run's engine
    /// directory (the kept engine cache stays, and its lock is released).
    /// `path` is the engine's `PATH` ([`engine_path`]), recorded.
    pub(super) fn finish(
        mut self,
        kv_cache_space: Option<KvCacheSpace>,
        path: Option<String>,
    ) -> EngineRecord {
        let caches = CACHES
            .iter()
            .map(|(var, dir, warm)| {
                let kept = *warm && self.entry.is_some();
                CacheUse {
                    var: (*var).to_string(),
                    path: if kept || self.fresh_root != self.root {
                        path_text(&self.cache_dir(dir, *warm))
                    } else {
                        format!("{ENGINE_DIR}/{dir}")
                    },
                    kept,
                    usage: measure(&self.cache_dir(dir, *warm)),
                }
            })
            .collect();
        remove(&self.fresh_root);
        remove(&self.root);
        EngineRecord {
            dir: ENGINE_DIR.into(),
            kept: self.entry.is_some(),
            warm: self.cold_reason.is_none(),
            cache_entry: self.entry.as_deref().map(path_text),
            device: Some(self.device.clone()),
            cold_reason: self.cold_reason.take(),
            before: self.entry.is_some().then_some(self.before),
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
        remove(&self.fresh_root);
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
        let dirs = EngineDirs::create(dir.path(), None, None, "cpu-x").unwrap();
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
        let mut dirs = EngineDirs::create(dir.path(), Some(&store_tmp), None, "cpu-x").unwrap();
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
        assert!(!rec.kept && !rec.warm && rec.cache_entry.is_none());
    }

    #[test]
    fn warm_caches_are_kept_per_oracle_emptied_by_cold_and_scratch_when_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(&dir.path().join("store")).unwrap();
        store.init().unwrap();
        let req = |key: &str, cold: bool| CacheRequest {
            store: store.clone(),
            venv_key: key.into(),
            cold,
        };
        let run_dir = dir.path().join("run");
        let gate = |r: &CacheRequest| {
            let dirs = EngineDirs::create(&run_dir, None, Some(r), "cpu-x").unwrap();
            let run = dirs.run_env("case-a").unwrap();
            let vllm = PathBuf::from(&run.env["VLLM_CACHE_ROOT"]);
            // HOME is per run: empty at its start, at one path for every
            // run of this oracle while its cache is held (vLLM hashes paths
            // derived from it into its compile-cache key), else scratch.
            let home = PathBuf::from(&run.env["HOME"]);
            let held = dirs.entry.clone();
            match &held {
                Some(e) => assert_eq!(home, e.join(FRESH_DIR).join("home")),
                None => assert!(home.starts_with(&run_dir), "{}", home.display()),
            }
            assert_eq!(fs::read_dir(&home).unwrap().count(), 0, "HOME starts empty");
            fs::write(home.join("state"), "x").unwrap();
            let found = vllm.join("marker").exists();
            fs::write(vllm.join("marker"), "x").unwrap();
            let rec = dirs.finish(None, None);
            assert!(!home.exists(), "HOME is emptied after the run");
            (found, rec)
        };
        let (found, first) = gate(&req("k1", false));
        assert!(!found && first.kept && !first.warm, "{first:?}");
        assert!(
            first
                .cold_reason
                .as_deref()
                .is_some_and(|w| w.starts_with("the first gate run")),
            "{first:?}"
        );
        let entry = store.engine_cache("k1", "cpu-x").path;
        assert_eq!(
            first.cache_entry.as_deref(),
            Some(path_text(&entry).as_str())
        );
        let (found, second) = gate(&req("k1", false));
        assert!(found && second.warm, "{second:?}");
        assert_eq!(second.before.unwrap().files, 1);
        let (found, other) = gate(&req("k2", false));
        assert!(!found && !other.warm, "another oracle never sees it");
        let (found, cold) = gate(&req("k1", true));
        assert!(!found && !cold.warm && cold.cold_reason.unwrap().contains("--cold"));
        // Held by another gate: scratch, deleted after the run.
        let held = store
            .engine_cache("k1", "cpu-x")
            .try_lock(&store)
            .unwrap()
            .unwrap();
        let (found, busy) = gate(&req("k1", false));
        assert!(!found && !busy.kept && busy.cold_reason.unwrap().contains("in use"));
        drop(held);
        assert!(entry.join("vllm/marker").is_file());
        assert!(!run_dir.join(ENGINE_DIR).exists());
    }

    #[test]
    fn an_engine_cache_left_empty_is_said_empty_not_a_first_run_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(&dir.path().join("store")).unwrap();
        store.init().unwrap();
        let req = CacheRequest {
            store: store.clone(),
            venv_key: "k".into(),
            cold: false,
        };
        let run_dir = dir.path().join("run");
        // An engine that writes only to the per-run directories.
        let gate = || {
            let dirs = EngineDirs::create(&run_dir, None, Some(&req), "cpu-x").unwrap();
            let run = dirs.run_env("case-a").unwrap();
            fs::write(PathBuf::from(&run.env["HOME"]).join("state"), "x").unwrap();
            dirs.finish(None, None)
        };
        let first = gate();
        assert!(
            first
                .cold_reason
                .as_deref()
                .unwrap()
                .starts_with("the first gate run"),
            "{first:?}"
        );
        for _ in 0..2 {
            let again = gate();
            assert!(!again.warm, "{again:?}");
            assert_eq!(
                again.cold_reason.as_deref(),
                Some("the kept engine cache was empty")
            );
            assert_eq!(again.before.unwrap().files, 0, "fresh/ is not counted");
            let home = again.caches.iter().find(|c| c.var == "HOME").unwrap();
            assert!(!home.kept && home.usage.files == 1, "{home:?}");
        }
    }
}
