//! The crates of a tree's `Cargo.lock` files, staged in the store
//! (`store/crates/<sha256 of the Cargo.lock>/`) so that the wheel stage
//! compiles the Rust frontend with no network.
//!
//! Cargo decides everything: `cargo vendor --locked --versioned-dirs` with
//! a `CARGO_HOME` of the staging directory downloads every package of the
//! lock (registry crates checked against the lock's `checksum`s by cargo as
//! it downloads them; git packages at the commit the lock pins) into
//! `vendor/<name>-<version>/`, each with cargo's `.cargo-checksum.json`, and
//! prints the source replacement that points cargo at them. The entry holds
//! `vendor/`, a copy of the `Cargo.lock`, `crates.json` ([`CratesRecord`],
//! with that replacement) and `manifest.json`.
//!
//! Site mirrors ([`crate::host::mirror`]) apply while staging: the
//! crates.io registry is the URL `https://index.crates.io/` (its sparse
//! index); a `[[mirror]]` mapping it makes cargo read that sparse index
//! instead (cargo's source replacement, `registry = "sparse+<url>"`); git
//! sources go through git's `url.<mirror>.insteadOf` with
//! `net.git-fetch-with-cli`. The entry is the same either way.
//!
//! A build ([`build_env`]) gets a `CARGO_HOME` of its own in its work
//! directory whose `config.toml` replaces crates.io and every git source of
//! the locks by the staged crates (a directory source, which cargo checks
//! file by file against `.cargo-checksum.json` and each package against the
//! lock's checksum), with `net.offline = true` and `CARGO_NET_OFFLINE=true`:
//! nothing else can be fetched.
//!
//! An entry that arrives from a bundle or a cache is checked by [`check`]:
//! its `Cargo.lock` is the one its name is the hash of, and every package
//! of that lock is vendored with the checksum the lock gives.

use std::path::Path;

use anyhow::{Context, Result, bail};
use fs_err as fs;
use serde::{Deserialize, Serialize};

use super::CargoLock;
use crate::host::rust::RustToolchain;
use crate::progress;
use crate::store::{Bucket, Entry, Manifest, Store, read_json, sha256_file, write_json};

/// The record of a crates entry.
pub const CRATES_JSON: &str = "crates.json";
/// The vendored packages of an entry, `<name>-<version>/` each.
pub const VENDOR_DIR: &str = "vendor";
/// The copy of the `Cargo.lock` an entry was staged from.
pub const LOCK_FILE: &str = "Cargo.lock";
/// The name of the directory source the build's `config.toml` defines.
const STAGED_SOURCE: &str = "oracle-build-staged";
/// The sparse index of crates.io, the URL a `[[mirror]]` maps.
pub const CRATES_IO_INDEX: &str = "https://index.crates.io/";

/// `store/crates/<sha256>/crates.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CratesRecord {
    /// The `Cargo.lock` staged, as the tree that staged it names it.
    pub lock: String,
    /// The sha256 of its bytes (the entry's name).
    pub lock_sha256: String,
    /// How many packages were vendored.
    pub packages: usize,
    /// `cargo -V` of the cargo that vendored them.
    pub cargo: String,
    /// What `cargo vendor` printed: the source replacement (every git
    /// source of the lock replaced by the vendored directory).
    pub config: String,
    /// Where crates.io was read from, when a `[[mirror]]` mapped it (not
    /// keyed; the entry is the same either way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_from: Option<String>,
}

/// The entry of the crates of `lock`.
pub fn entry(store: &Store, lock: &CargoLock) -> Entry {
    store.entry(Bucket::Crates, &lock.sha256)
}

/// One package of a `Cargo.lock`.
#[derive(Debug, Deserialize)]
struct LockedPackage {
    name: String,
    version: String,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    checksum: Option<String>,
}

#[derive(Debug, Deserialize)]
struct LockFile {
    #[serde(default)]
    package: Vec<LockedPackage>,
}

/// The packages of the lock at `path` that come from a registry or git
/// (path packages, the tree's own, have no `source`).
fn fetched_packages(path: &Path) -> Result<Vec<LockedPackage>> {
    let text = fs::read_to_string(path)?;
    let lock: LockFile =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(lock
        .package
        .into_iter()
        .filter(|p| p.source.is_some())
        .collect())
}

/// Every way the crates entry at `dir` named `name` is not what its name
/// says, one line each (empty: it is): its `Cargo.lock` has another
/// sha256; a package of the lock is not vendored, or vendored with another
/// checksum than the lock's; a vendored directory no package of the lock
/// names; no `crates.json`.
pub fn check(dir: &Path, name: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let lock = dir.join(LOCK_FILE);
    match sha256_file(&lock) {
        Ok(h) if h == name => {}
        Ok(h) => problems.push(format!("its {LOCK_FILE} has sha256 {h}, not {name}")),
        Err(e) => return vec![format!("{e:#}")],
    }
    if !dir.join(CRATES_JSON).is_file() {
        problems.push(format!("no {CRATES_JSON}"));
    }
    let packages = match fetched_packages(&lock) {
        Ok(p) => p,
        Err(e) => {
            problems.push(format!("{e:#}"));
            return problems;
        }
    };
    let vendor = dir.join(VENDOR_DIR);
    let mut expected = std::collections::BTreeSet::new();
    for p in &packages {
        let sub = format!("{}-{}", p.name, p.version);
        let sums = vendor.join(&sub).join(".cargo-checksum.json");
        expected.insert(sub.clone());
        let v: serde_json::Value = match read_json(&sums) {
            Ok(v) => v,
            Err(_) => {
                problems.push(format!("{} {} is not vendored", p.name, p.version));
                continue;
            }
        };
        if let Some(want) = &p.checksum
            && v["package"].as_str() != Some(want.as_str())
        {
            problems.push(format!(
                "{} {} is vendored with package checksum {}, the lock says {want}",
                p.name, p.version, v["package"]
            ));
        }
    }
    if let Ok(rd) = fs::read_dir(&vendor) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if !expected.contains(&n) {
                problems.push(format!("{VENDOR_DIR}/{n} is no package of the lock"));
            }
        }
    }
    problems
}

/// What [`staging_config`] gives: the `config.toml` text, git's environment
/// (name, value) and where crates.io is read from when mapped.
type StagingConfig = (String, Vec<(String, String)>, Option<String>);

/// The `config.toml` of the `CARGO_HOME` that stages crates through the
/// site's mirrors, and the environment giving git the mirrors' `insteadOf`
/// (`GIT_CONFIG_COUNT`...); and where crates.io is read from when mapped.
///
/// Errors (exit 2): crates.io mapped to `none`.
fn staging_config(store: &Store) -> Result<StagingConfig> {
    let mirrors = crate::host::mirror::load(store.root())?;
    let mut config = toml::Table::new();
    let mut registry_from = None;
    match mirrors.map(CRATES_IO_INDEX) {
        crate::host::mirror::Mapped::Unchanged(_) => {}
        crate::host::mirror::Mapped::Mirrored(url, _) => {
            let mut source = toml::Table::new();
            let mut io = toml::Table::new();
            io.insert("replace-with".into(), "oracle-build-mirror".into());
            source.insert("crates-io".into(), io.into());
            let mut m = toml::Table::new();
            m.insert("registry".into(), format!("sparse+{url}").into());
            source.insert("oracle-build-mirror".into(), m.into());
            config.insert("source".into(), source.into());
            registry_from = Some(url);
        }
        crate::host::mirror::Mapped::Dropped(m) => {
            return Err(crate::exit::bad_input(format!(
                "the crates.io registry ({CRATES_IO_INDEX}) is dropped by {} (url = \"none\"); the tree's Cargo.lock needs it: give that mirror a URL, or remove it",
                m.describe()
            )));
        }
    }
    let insteads = mirrors.git_config();
    let mut env = Vec::new();
    if !insteads.is_empty() {
        let mut net = toml::Table::new();
        net.insert("git-fetch-with-cli".into(), true.into());
        config.insert("net".into(), net.into());
        env.push(("GIT_CONFIG_COUNT".into(), insteads.len().to_string()));
        for (i, kv) in insteads.iter().enumerate() {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            env.push((format!("GIT_CONFIG_KEY_{i}"), k.to_string()));
            env.push((format!("GIT_CONFIG_VALUE_{i}"), v.to_string()));
        }
    }
    Ok((toml::to_string(&config)?, env, registry_from))
}

/// The variables of the user's environment that would change what cargo
/// fetches or where: removed from its runs here.
const CARGO_USER_ENV: &[&str] = &[
    "CARGO_HOME",
    "CARGO_NET_OFFLINE",
    "CARGO_TARGET_DIR",
    "CARGO",
    "RUSTUP_TOOLCHAIN",
];

/// Ensures the crates of the tree's `lock` (checkout at `src`) are staged,
/// vendoring them with `rust`'s cargo unless `offline`. Returns the entry
/// and its record.
///
/// Errors: `offline` and they are not staged; no `Cargo.toml` beside the
/// lock; cargo fails (a fetch, a checksum, a lock that is not up to date
/// with its manifests: `--locked`); what cargo vendored does not match the
/// lock ([`check`]).
pub fn ensure(
    store: &Store,
    rust: &RustToolchain,
    src: &Path,
    lock: &CargoLock,
    offline: bool,
) -> Result<(Entry, CratesRecord)> {
    let e = entry(store, lock);
    if e.exists() {
        return Ok((e.clone(), read_json(&e.path.join(CRATES_JSON))?));
    }
    if offline {
        bail!(
            "--offline: the crates of {} are not staged in {}",
            lock.file,
            e.label()
        );
    }
    let _lock = e.lock()?;
    if e.exists() {
        return Ok((e.clone(), read_json(&e.path.join(CRATES_JSON))?));
    }
    let lock_path = src.join(&lock.file);
    let manifest = lock_path.with_file_name("Cargo.toml");
    if !manifest.is_file() {
        bail!(
            "the tree's {} has no Cargo.toml beside it: cannot tell cargo which workspace it locks",
            lock.file
        );
    }
    progress::stage(
        "rust",
        format!("staging the crates of {} into {}", lock.file, e.label()),
    );
    let staging = store.stage("crates")?;
    let dir = staging.path().join("entry");
    let home = staging.path().join("cargo-home");
    fs::create_dir_all(&dir)?;
    fs::create_dir_all(&home)?;
    let (config, git_env, registry_from) = staging_config(store)?;
    fs::write(home.join("config.toml"), config)?;
    let vendor = dir.join(VENDOR_DIR);
    let mut cmd = duct::cmd(
        &rust.cargo.path,
        [
            "vendor".as_ref(),
            "--locked".as_ref(),
            "--versioned-dirs".as_ref(),
            "--manifest-path".as_ref(),
            manifest.as_os_str(),
            vendor.as_os_str(),
        ],
    )
    .dir(staging.path());
    let set: Vec<(String, String)> = [("CARGO_HOME".to_string(), home.display().to_string())]
        .into_iter()
        .chain(rust.env())
        .chain(git_env)
        .collect();
    // duct applies the earliest modifier last: a removal of a name set
    // here would unset it (and rustup's proxy then picks ~/.cargo).
    for k in CARGO_USER_ENV {
        if !set.iter().any(|(n, _)| n == k) {
            cmd = cmd.env_remove(k);
        }
    }
    for (k, v) in set {
        cmd = cmd.env(k, v);
    }
    let printed = crate::host::process::capture(
        &format!("cargo vendor --locked (the crates of {})", lock.file),
        cmd,
    )?;
    fs::create_dir_all(&vendor)?;
    fs::copy(&lock_path, dir.join(LOCK_FILE))?;
    let packages = fs::read_dir(&vendor)?.count();
    let rec = CratesRecord {
        lock: lock.file.clone(),
        lock_sha256: lock.sha256.clone(),
        packages,
        cargo: rust.cargo.version.clone(),
        config: printed,
        registry_from,
    };
    write_json(&dir.join(CRATES_JSON), &rec)?;
    let problems = check(&dir, &lock.sha256);
    if !problems.is_empty() {
        bail!(
            "the crates cargo vendored for {} do not match it: {}",
            lock.file,
            problems.join("; ")
        );
    }
    Manifest::build(&dir, &[crate::store::MANIFEST])?.write(&dir)?;
    store.persist(&dir, &e)?;
    progress::stage(
        "rust",
        format!("{} crate(s) of {} staged", rec.packages, lock.file),
    );
    Ok((e, rec))
}

/// What the wheel key holds of the staged crates: each lock's path and sha256.
pub fn key_inputs(staged: &[(Entry, CratesRecord)]) -> serde_json::Value {
    serde_json::Value::Array(
        staged
            .iter()
            .map(|(_, r)| serde_json::json!({"lock": r.lock, "sha256": r.lock_sha256}))
            .collect(),
    )
}

/// The build's cargo configuration for the staged crates `staged`, in
/// `work`: `<work>/cargo-vendor/` linking every vendored package of every
/// entry, `<work>/cargo-home/config.toml` replacing crates.io and each git
/// source the entries' records name by that directory, offline. Returns
/// the variables the build gets (`CARGO_HOME`, `CARGO_NET_OFFLINE=true`).
///
/// Errors: a record's configuration does not parse; the directories cannot
/// be written.
pub fn build_env(staged: &[(Entry, CratesRecord)], work: &Path) -> Result<Vec<(String, String)>> {
    let vendor = work.join("cargo-vendor");
    let home = work.join("cargo-home");
    fs::create_dir_all(&vendor)?;
    fs::create_dir_all(&home)?;
    let mut sources = toml::Table::new();
    let replace = || {
        let mut t = toml::Table::new();
        t.insert("replace-with".into(), STAGED_SOURCE.into());
        t
    };
    sources.insert("crates-io".into(), replace().into());
    for (e, rec) in staged {
        for d in fs::read_dir(e.path.join(VENDOR_DIR))?.flatten() {
            let link = vendor.join(d.file_name());
            if fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(d.path(), &link)?;
            }
        }
        let printed: toml::Table = toml::from_str(&rec.config)
            .with_context(|| format!("{}: the recorded source replacement", e.label()))?;
        let Some(toml::Value::Table(srcs)) = printed.get("source") else {
            continue;
        };
        for (name, v) in srcs {
            let Some(t) = v.as_table() else { continue };
            if name == "crates-io" || t.contains_key("directory") {
                continue;
            }
            let mut t = t.clone();
            t.insert("replace-with".into(), STAGED_SOURCE.into());
            sources.insert(name.clone(), t.into());
        }
    }
    let mut dir = toml::Table::new();
    dir.insert("directory".into(), vendor.display().to_string().into());
    sources.insert(STAGED_SOURCE.into(), dir.into());
    let mut config = toml::Table::new();
    config.insert("source".into(), sources.into());
    let mut net = toml::Table::new();
    net.insert("offline".into(), true.into());
    config.insert("net".into(), net.into());
    fs::write(home.join("config.toml"), toml::to_string(&config)?)?;
    Ok(vec![
        ("CARGO_HOME".into(), home.display().to_string()),
        ("CARGO_NET_OFFLINE".into(), "true".into()),
    ])
}

/// `<root>/cargo-target/<h>`: the `CARGO_TARGET_DIR` of wheel builds that
/// use a compiler cache, where `h` is the first 16 hex of the sha256 of the
/// staged locks' sha256s, the toolchain's key (`rustc`, commit, host,
/// cargo) and the target device. Cargo keeps its own fingerprints there and
/// locks the directory while it builds (a second build waits), so what a
/// killed or wiped build compiled is reused. It is a cache, never an input:
/// deleting it costs only compile time.
pub fn target_dir(
    store: &Store,
    staged: &[(Entry, CratesRecord)],
    toolchain: &serde_json::Value,
    device: &str,
) -> std::path::PathBuf {
    let locks: Vec<&str> = staged.iter().map(|(_, r)| r.lock_sha256.as_str()).collect();
    let id = serde_json::json!({"locks": locks, "toolchain": toolchain, "device": device});
    use sha2::Digest as _;
    let h = hex::encode(sha2::Sha256::digest(id.to_string().as_bytes()));
    store.compiler_cache_dir("cargo-target").join(&h[..16])
}

/// The records of the staged crates of `locks`, read from the store
/// without fetching (for `plan`): `None` when one is not staged.
pub fn known(store: &Store, locks: &[CargoLock]) -> Option<Vec<(Entry, CratesRecord)>> {
    locks
        .iter()
        .map(|l| {
            let e = entry(store, l);
            let rec: CratesRecord = read_json(&e.path.join(CRATES_JSON)).ok()?;
            Some((e, rec))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry directory vendoring `foo 1.0.0` (checksum `aa..`) from
    /// crates.io and `bar 0.1.0` from git; returns it and its name.
    fn staged(dir: &Path) -> String {
        let lock = "version = 4\n\n[[package]]\nname = \"app\"\nversion = \"0.1.0\"\n\n\
                    [[package]]\nname = \"foo\"\nversion = \"1.0.0\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\nchecksum = \"aaaa\"\n\n\
                    [[package]]\nname = \"bar\"\nversion = \"0.1.0\"\nsource = \"git+file:///x/bar#0123\"\n";
        fs::write(dir.join(LOCK_FILE), lock).unwrap();
        fs::write(dir.join(CRATES_JSON), "{}").unwrap();
        for (sub, package) in [("foo-1.0.0", "\"aaaa\""), ("bar-0.1.0", "null")] {
            let d = dir.join(VENDOR_DIR).join(sub);
            fs::create_dir_all(&d).unwrap();
            fs::write(
                d.join(".cargo-checksum.json"),
                format!("{{\"files\":{{}},\"package\":{package}}}"),
            )
            .unwrap();
        }
        sha256_file(&dir.join(LOCK_FILE)).unwrap()
    }

    #[test]
    fn an_entry_is_the_crates_its_cargo_lock_names() {
        let t = tempfile::tempdir().unwrap();
        let name = staged(t.path());
        assert_eq!(check(t.path(), &name), Vec::<String>::new());
        let p = check(t.path(), &"0".repeat(64));
        assert!(p[0].contains("has sha256"), "{p:?}");
        // Another package checksum than the lock's.
        fs::write(
            t.path().join("vendor/foo-1.0.0/.cargo-checksum.json"),
            "{\"files\":{},\"package\":\"bbbb\"}",
        )
        .unwrap();
        let p = check(t.path(), &name);
        assert!(
            p.iter()
                .any(|l| l.contains("foo 1.0.0") && l.contains("aaaa")),
            "{p:?}"
        );
        // A package missing, a directory the lock does not name.
        fs::rename(
            t.path().join("vendor/bar-0.1.0"),
            t.path().join("vendor/baz-0.1.0"),
        )
        .unwrap();
        let p = check(t.path(), &name);
        assert!(
            p.iter().any(|l| l.contains("bar 0.1.0 is not vendored")),
            "{p:?}"
        );
        assert!(p.iter().any(|l| l.contains("vendor/baz-0.1.0")), "{p:?}");
    }

    #[test]
    fn the_build_config_replaces_crates_io_and_every_git_source_offline() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::at(&t.path().join("root")).unwrap();
        let e = store.entry(Bucket::Crates, "abc");
        fs::create_dir_all(e.path.join(VENDOR_DIR).join("bar-0.1.0")).unwrap();
        let rec = CratesRecord {
            lock: "rust/Cargo.lock".into(),
            lock_sha256: "abc".into(),
            packages: 1,
            cargo: "cargo 1.95.0".into(),
            config: "[source.\"git+file:///x/bar\"]\ngit = \"file:///x/bar\"\nreplace-with = \"vendored-sources\"\n\n[source.vendored-sources]\ndirectory = \"/elsewhere\"\n".into(),
            registry_from: None,
        };
        let work = t.path().join("work");
        let env = build_env(&[(e, rec)], &work).unwrap();
        assert!(env.contains(&("CARGO_NET_OFFLINE".into(), "true".into())));
        let config: toml::Table =
            toml::from_str(&fs::read_to_string(work.join("cargo-home/config.toml")).unwrap())
                .unwrap();
        let src = &config["source"];
        assert_eq!(
            src["crates-io"]["replace-with"].as_str(),
            Some(STAGED_SOURCE)
        );
        assert_eq!(
            src["git+file:///x/bar"]["replace-with"].as_str(),
            Some(STAGED_SOURCE)
        );
        assert!(src.get("vendored-sources").is_none(), "{config}");
        assert_eq!(
            src[STAGED_SOURCE]["directory"].as_str(),
            Some(work.join("cargo-vendor").to_str().unwrap())
        );
        assert_eq!(config["net"]["offline"].as_bool(), Some(true));
        assert!(work.join("cargo-vendor/bar-0.1.0").is_dir());
    }
}
