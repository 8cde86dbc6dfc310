//! The engine caches kept between an oracle's gate runs:
//! `<root>/engine-cache/<venv key>-<device>`, one directory per oracle and
//! device (docs/smoke.md, "Warm engine caches").
//!
//! A cache entry is scratch the engine writes in place (vLLM's compile
//! cache, torch inductor's, Triton's, FlashInfer's, CUDA's): it is not a
//! store entry (no manifest, not under `store/`, never in a bundle or the
//! cache registry), only ever used by the oracle whose venv key names it,
//! under its lock (`locks/engine-cache-<name>.lock`, taken without
//! waiting: a second gate of the same oracle at once runs with scratch
//! caches instead). `gc` removes a cache entry together with its oracle's
//! venv entry ([`EngineCache::orphaned`]).

use std::path::PathBuf;

use anyhow::{Context, Result};
use fs_err as fs;
use serde::Serialize;

use super::lock::try_lock_file;
use super::{Bucket, Lock, LockName, Store, disk_usage, make_writable};

/// The directory of the engine caches under a store's root.
pub const ENGINE_CACHE_DIR: &str = "engine-cache";

/// One oracle's engine caches on one device (which may not exist yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineCache {
    /// `<venv key>-<device>`.
    pub name: String,
    /// The venv key of the oracle it belongs to.
    pub venv_key: String,
    /// The device it was made on (e.g. `cpu-x86_64`, `sm90-nvidia-h100-80gb-hbm3`).
    pub device: String,
    /// `<root>/engine-cache/<name>`.
    pub path: PathBuf,
}

/// One engine cache as `status` and `doctor` list it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct EngineCacheRow {
    /// `engine-cache/<venv key>-<device>`.
    pub entry: String,
    /// Its path.
    pub path: PathBuf,
    /// Its size on disk in bytes.
    pub bytes: u64,
    /// `venvs/<venv key>`: the oracle it belongs to.
    pub oracle: String,
    /// The device it was made on.
    pub device: String,
    /// Its oracle's venv entry is gone and nothing is using it
    /// ([`EngineCache::busy`]): `gc` removes it.
    pub orphaned: bool,
}

/// A device name made safe for a file name: lowercase ASCII letters,
/// digits, `.` and `_`; every other run of characters one `-`; at most 64
/// bytes; `unknown` when nothing is left.
pub fn device_slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let mut out = out.trim_end_matches('-').to_string();
    out.truncate(64);
    let out = out.trim_end_matches('-').to_string();
    if out.is_empty() {
        "unknown".into()
    } else {
        out
    }
}

impl Store {
    /// `<root>/engine-cache`: the engine caches of the oracles' gates.
    pub fn engine_cache_dir(&self) -> PathBuf {
        self.root().join(ENGINE_CACHE_DIR)
    }

    /// The engine cache of the oracle with venv key `venv_key` on `device`
    /// (made safe with [`device_slug`]).
    pub fn engine_cache(&self, venv_key: &str, device: &str) -> EngineCache {
        let device = device_slug(device);
        let name = format!("{venv_key}-{device}");
        EngineCache {
            path: self.engine_cache_dir().join(&name),
            venv_key: venv_key.to_string(),
            device,
            name,
        }
    }

    /// Every engine cache of the store, by name; directories whose name is
    /// not `<key>-<device>` are skipped.
    ///
    /// Errors: the directory cannot be read.
    pub fn engine_caches(&self) -> Result<Vec<EngineCache>> {
        let dir = self.engine_cache_dir();
        let mut out = Vec::new();
        if !dir.is_dir() {
            return Ok(out);
        }
        for e in fs::read_dir(&dir)? {
            let e = e?;
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((key, device)) = name.split_once('-') else {
                continue;
            };
            if key.is_empty() || device.is_empty() {
                continue;
            }
            out.push(EngineCache {
                venv_key: key.to_string(),
                device: device.to_string(),
                path: e.path(),
                name,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

impl EngineCache {
    /// `engine-cache/<name>`, the short form used in messages and reports.
    pub fn label(&self) -> String {
        format!("{ENGINE_CACHE_DIR}/{}", self.name)
    }

    /// `venvs/<venv key>`: the label of the oracle it belongs to.
    pub fn venv_label(&self) -> String {
        format!("{}/{}", Bucket::Venvs.dir_name(), self.venv_key)
    }

    /// Its size on disk in bytes (0 when absent).
    pub fn bytes(&self) -> u64 {
        disk_usage(&self.path)
    }

    /// Whether its oracle's venv entry is gone from `store`.
    pub fn orphaned(&self, store: &Store) -> bool {
        !store.entry(Bucket::Venvs, &self.venv_key).exists()
    }

    /// Whether another process holds its lock now (a gate using it, `gc`
    /// removing it); nothing is created.
    pub fn in_use(&self, store: &Store) -> bool {
        let path = store
            .locks_dir()
            .join(LockName::EngineCache(self.name.clone()).file_name());
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(f) => f.try_lock().is_err(),
            Err(_) => false,
        }
    }

    /// Whether another process uses it or its oracle now: its own lock
    /// held (a gate, `gc`), or its oracle's venv entry's (a build producing
    /// that oracle, whose gate runs before the venv entry lands; `smoke`).
    pub fn busy(&self, store: &Store) -> bool {
        self.in_use(store) || store.entry(Bucket::Venvs, &self.venv_key).is_locked()
    }

    /// What `status` and `doctor` list of it.
    pub fn row(&self, store: &Store) -> EngineCacheRow {
        EngineCacheRow {
            entry: self.label(),
            path: self.path.clone(),
            bytes: self.bytes(),
            oracle: self.venv_label(),
            device: self.device.clone(),
            orphaned: self.orphaned(store) && !self.busy(store),
        }
    }

    /// Takes its lock when no other process holds it; `Ok(None)` without
    /// waiting when one does (a gate of the same oracle running, or `gc`
    /// removing it). A read-only store is never locked: `Ok(None)`.
    ///
    /// Errors: the lock file cannot be created or locked.
    pub fn try_lock(&self, store: &Store) -> Result<Option<Lock>> {
        if store.read_only() {
            return Ok(None);
        }
        fs::create_dir_all(store.locks_dir())?;
        try_lock_file(
            &store.locks_dir(),
            &LockName::EngineCache(self.name.clone()),
        )
    }

    /// Removes it (held under its lock by the caller): renamed into the
    /// store's `tmp/` first, so it vanishes at once and what a killed
    /// removal leaves is swept as staging.
    ///
    /// Errors: it cannot be moved or removed.
    pub fn remove(&self, store: &Store) -> Result<()> {
        if std::fs::symlink_metadata(&self.path).is_err() {
            return Ok(());
        }
        fs::create_dir_all(store.tmp_dir())?;
        let aside = store.tmp_dir().join(format!(
            "gc-engine-cache-{}.{}",
            self.name,
            std::process::id()
        ));
        fs::rename(&self.path, &aside)
            .with_context(|| format!("moving {} aside", self.path.display()))?;
        make_writable(&aside);
        fs::remove_dir_all(&aside)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_are_safe_file_names() {
        assert_eq!(device_slug("cpu-x86_64"), "cpu-x86_64");
        assert_eq!(
            device_slug("sm9.0 NVIDIA H100 80GB HBM3"),
            "sm9.0-nvidia-h100-80gb-hbm3"
        );
        assert_eq!(device_slug("/../x"), "..-x");
        assert_eq!(device_slug("  "), "unknown");
        assert!(device_slug(&"a".repeat(300)).len() <= 64);
    }

    #[test]
    fn a_cache_is_listed_locked_once_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path()).unwrap();
        store.init().unwrap();
        let c = store.engine_cache("k1", "cpu-x86_64");
        assert_eq!(c.name, "k1-cpu-x86_64");
        assert_eq!(c.venv_label(), "venvs/k1");
        fs::create_dir_all(c.path.join("vllm")).unwrap();
        fs::write(c.path.join("vllm/x"), "abc").unwrap();
        let listed = store.engine_caches().unwrap();
        assert_eq!(listed, vec![c.clone()]);
        assert!(c.orphaned(&store));
        let held = c.try_lock(&store).unwrap().expect("free");
        assert!(c.try_lock(&store).unwrap().is_none(), "held once");
        c.remove(&store).unwrap();
        drop(held);
        assert!(!c.path.exists());
        assert!(store.engine_caches().unwrap().is_empty());
        assert!(c.try_lock(&store).unwrap().is_some());
    }
}
