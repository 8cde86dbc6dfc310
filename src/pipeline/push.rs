//! The push engine of `oracle-build push <PIN> [--cache URL]`: uploads what another box needs to
//! build PIN without network beyond the cache: the source (a git bundle of
//! the commit with its history and tags), the lock, every wheelhouse
//! artifact, every staged external source, the built wheel with its
//! `build.json` and build log (signed when the cache has a `signing_key`),
//! and the pin's inputs with the oracle's record as evidence. Venvs are
//! never pushed: the pulling box installs, measures and gates its own.
//!
//! Per artifact: blobs first (skipped when the cache has them), the
//! manifest last, so a tag exists only when all its blobs do. A tag that
//! already exists is kept (content-addressed: same key, same content),
//! except that a wheel's attestations are merged; a wheel whose sha256
//! differs from the cached one for the same key is a reproducibility
//! failure and the cached one is never overwritten.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;

use crate::cache::artifact::{self, Artifact, Config, Kind, Layer};
use crate::cache::config::{self, Cache};
use crate::cache::substitute::{self, InputsRecord, SOURCE_BUNDLE};
use crate::cache::{Transport, trust};
use crate::recipe::LoadedRecipe;
use crate::stages::lock;
use crate::stages::oracle::OracleRecord;
use crate::stages::wheel::BuildRecord;
use crate::store::{Bucket, Entry, Store};

/// What happened to one artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PushState {
    /// Uploaded now.
    Pushed,
    /// The cache had it.
    Present,
    /// The cache had it; this box's signature was added.
    Signed,
}

/// One artifact of a push.
#[derive(Debug, Clone, Serialize)]
pub struct PushedArtifact {
    /// Its tag.
    pub tag: String,
    /// What happened.
    pub state: PushState,
    /// Bytes uploaded now.
    pub uploaded: u64,
}

/// What `push` reports, per cache.
#[derive(Debug, Clone, Serialize)]
pub struct PushReport {
    /// The cache.
    pub cache: String,
    /// Recipe name.
    pub recipe: String,
    /// Every artifact, in push order (the inputs last).
    pub artifacts: Vec<PushedArtifact>,
    /// Whether the wheel was signed by this box.
    pub signed: bool,
}

/// The caches a command uses: the one of `--cache`/`ORACLE_BUILD_CACHE`,
/// else every configured one.
///
/// Errors (exit 2): bad configuration; none configured.
pub fn caches_for(root: &Path, flag: Option<&str>) -> Result<Vec<Cache>> {
    let cfg = config::load(root, flag)?;
    if cfg.caches.is_empty() {
        return Err(crate::exit::bad_input(format!(
            "no cache configured: pass --cache URL, set {}, or add a [[cache]] to {}",
            config::CACHE_ENV,
            root.join(config::CONFIG_FILE).display()
        )));
    }
    Ok(cfg.caches)
}

/// The principal this box signs as: `$ORACLE_BUILD_BUILDER`, else
/// `$USER@<hostname>`.
pub fn builder_name() -> String {
    if let Ok(b) = std::env::var("ORACLE_BUILD_BUILDER")
        && !b.is_empty()
    {
        return b;
    }
    let user = std::env::var("USER").unwrap_or_else(|_| "oracle-build".into());
    let host = fs_err::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    format!("{user}@{host}")
}

/// Pushes the built oracle of `lr` in the store at `root` to the caches
/// (`cache`: the one of `--cache`, else every configured one; `lockfiles`:
/// `--lockfiles`), see the module docs. Returns one report per cache.
///
/// Errors (exit 2): bad input, no cache; errors: the pin not built in this
/// store; the cache fails; a reproducibility failure (another wheel for
/// the same key is cached).
pub fn push(
    lr: &LoadedRecipe,
    root: &Path,
    cache: Option<&str>,
    lockfiles: Option<&Path>,
) -> Result<Vec<PushReport>> {
    let r = &lr.recipe;
    let root = root.to_path_buf();
    let caches = caches_for(&root, cache)?;
    let store = Store::open_existing(&root)
        .ok_or_else(|| anyhow!("no store at {}: build {} first", root.display(), r.name))?;
    let oracle = store
        .roots()?
        .into_iter()
        .find(|x| x.name == r.name && x.live)
        .and_then(|x| x.path.canonicalize().ok())
        .ok_or_else(|| {
            anyhow!(
                "{} is not built in {}: build it first",
                r.name,
                root.display()
            )
        })?;
    let rec = OracleRecord::read(&oracle)?;
    if rec.identity.commit != r.source.commit {
        bail!(
            "the oracle of {} in {} is for commit {}, not {}: build it first",
            r.name,
            root.display(),
            rec.identity.commit,
            r.source.commit
        );
    }
    let wheel_entry = store.entry(Bucket::Wheels, &rec.wheel_key);
    let build = BuildRecord::read(&wheel_entry.path)?;
    let temp = store.temp_roots()?;
    let staging = store.stage("push")?;
    let scratch = staging.path();

    // What the pin needs: the records' `requires`, venvs and checkouts left out.
    let mut entries: Vec<Entry> = Vec::new();
    let auto = lock::auto_entry(&store, r);
    let lock_dir = lock::lock_dir(lr, lockfiles);
    let lock_from = if matches!(lock::load(&lock_dir, lr), Ok(Some(_))) {
        Some(lock_dir.clone())
    } else if auto.exists() {
        Some(auto.path.clone())
    } else {
        None
    };
    if lock_from.is_some() {
        entries.push(auto.clone());
    }
    for label in build.requires.iter().chain(rec.requires.iter()) {
        if let Some(e) = store.entry_by_label(label)
            && Kind::of_bucket(e.bucket).is_some()
            && e.bucket != Bucket::Wheels
            && !entries.contains(&e)
        {
            entries.push(e);
        }
    }
    // The pinned uv for this platform, so that a pulling box without uv
    // builds offline (issue 23).
    let uv_entry = match crate::pipeline::bundle::host_uv_wheel(&store, lr, &temp) {
        Ok(e) => {
            if !entries.contains(&e) {
                entries.push(e.clone());
            }
            Some(e)
        }
        Err(e) => {
            crate::progress::stage(
                "push",
                format!("not sending the pinned uv (a pulling box needs uv on PATH): {e:#}"),
            );
            None
        }
    };
    entries.sort_by_key(|e| e.bucket);
    entries.push(wheel_entry.clone());
    for e in &entries {
        temp.add(&store, e)?;
    }
    let mut artifacts: Vec<Artifact> = Vec::new();
    // The source: a git bundle of the commit with its history and tags.
    let bundle = scratch.join(SOURCE_BUNDLE);
    crate::pipeline::bundle::git_bundle(&store, &r.source.repo, &r.source.commit, &bundle)?;
    let bl = Layer::of_file(
        &bundle,
        SOURCE_BUNDLE,
        "application/vnd.oracle-build.git-bundle.v1",
    )?;
    artifacts.push(Artifact {
        kind: Kind::Source,
        name: r.source.commit.clone(),
        config: Config {
            format: 1,
            kind: Kind::Source,
            name: r.source.commit.clone(),
            record: serde_json::json!({"repo": r.source.repo, "commit": r.source.commit}),
            files: vec![crate::store::ManifestFile {
                path: SOURCE_BUNDLE.into(),
                size: bl.size,
                sha256: crate::cache::digest_hex(&bl.digest)?.to_string(),
            }],
            attestations: Vec::new(),
        },
        layers: vec![bl],
    });
    for e in &entries {
        let dir = if *e == auto {
            lock_from.clone().unwrap_or_else(|| e.path.clone())
        } else {
            e.path.clone()
        };
        artifacts.push(artifact::of_entry(e, &dir, &scratch.join("trees"))?);
    }
    // The inputs, with the recipe and the oracle's record as evidence.
    let key = substitute::inputs_key(lr);
    let recipe_file = scratch.join("recipe.yaml");
    fs_err::write(&recipe_file, &lr.text)?;
    let inputs = InputsRecord {
        recipe: r.name.clone(),
        commit: r.source.commit.clone(),
        repo: r.source.repo.clone(),
        platform: crate::host::platform::Platform::host().map(|p| p.spelled),
        entries: entries.iter().map(Entry::label).collect(),
        wheel_key: rec.wheel_key.clone(),
        venv_key: rec.key.clone(),
        uv: uv_entry.as_ref().map(Entry::label),
    };
    let mut layers = Vec::new();
    let mut files = Vec::new();
    for (path, title) in [
        (recipe_file.clone(), "recipe.yaml"),
        (oracle.join("oracle.json"), "oracle.json"),
    ] {
        let l = Layer::of_file(&path, title, artifact::FILE_MEDIA_TYPE)?;
        files.push(crate::store::ManifestFile {
            path: title.into(),
            size: l.size,
            sha256: crate::cache::digest_hex(&l.digest)?.to_string(),
        });
        layers.push(l);
    }
    artifacts.push(Artifact {
        kind: Kind::Inputs,
        name: key.clone(),
        config: Config {
            format: 1,
            kind: Kind::Inputs,
            name: key,
            record: serde_json::to_value(&inputs)?,
            files,
            attestations: Vec::new(),
        },
        layers,
    });

    let mut reports = Vec::new();
    for c in &caches {
        let t = crate::cache::open(c)?;
        let mut signed = false;
        let mut arts = artifacts.clone();
        if let Some(key_path) = &c.signing_key
            && let Some(w) = arts.iter_mut().find(|a| a.kind == Kind::Wheel)
        {
            let key = trust::SigningKey::load(key_path)?;
            let statement = trust::Statement {
                kind: "wheel".into(),
                key: build.key.clone(),
                inputs: build.inputs.clone(),
                files: substitute::wheel_files(&build),
                builder: builder_name(),
                time: jiff::Timestamp::now()
                    .strftime("%Y-%m-%dT%H:%M:%SZ")
                    .to_string(),
            };
            w.config.attestations.push(trust::sign(&statement, &key)?);
            signed = true;
        }
        let mut out = Vec::new();
        for a in &arts {
            crate::progress::stage("push", format!("{} -> {}", a.tag(), t.describe()));
            out.push(push_artifact(t.as_ref(), a, scratch)?);
        }
        reports.push(PushReport {
            cache: t.describe(),
            recipe: r.name.clone(),
            artifacts: out,
            signed,
        });
    }
    drop(temp);
    Ok(reports)
}

/// Fault injection for the tests: with `ORACLE_BUILD_FAULT=push-kill-<kind>`
/// (`push-kill-wheel`), the process sends itself SIGKILL after every blob of
/// that artifact is uploaded and before its manifest, the worst moment for
/// a push to die.
fn kill_point(kind: Kind) {
    if std::env::var("ORACLE_BUILD_FAULT").ok().as_deref()
        == Some(format!("push-kill-{}", kind.prefix()).as_str())
    {
        // SAFETY: raising a signal on this process has no memory effects.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

/// Reads the config blob of the cached manifest `bytes` of `kind` and `tag`.
fn cached_config(
    t: &dyn Transport,
    bytes: &[u8],
    kind: Kind,
    tag: &str,
    scratch: &Path,
) -> Result<Config> {
    let m = artifact::parse_manifest(bytes, kind, tag)?;
    let p = scratch.join(format!(
        "cached-{}.json",
        crate::cache::digest_hex(&m.config.digest)?
    ));
    t.get_blob(
        &m.config.digest,
        u64::try_from(m.config.size).unwrap_or(0),
        &p,
    )?;
    crate::store::read_json(&p).with_context(|| format!("the config of the cached {tag}"))
}

/// Pushes one artifact: blobs first (skipped when present), manifest last;
/// an existing tag is kept (a wheel's attestations merged into it).
///
/// Errors: the cache fails; a cached wheel for the same key has another
/// sha256 (a reproducibility failure; nothing is overwritten).
pub fn push_artifact(t: &dyn Transport, a: &Artifact, scratch: &Path) -> Result<PushedArtifact> {
    let tag = a.tag();
    let mut config = a.config.clone();
    let mut state = PushState::Pushed;
    if let Some(existing) = t.manifest(&tag)? {
        if a.kind != Kind::Wheel {
            let ours = a.manifest_bytes(&a.config_bytes());
            if a.kind != Kind::Inputs || ours == existing.bytes {
                return Ok(PushedArtifact {
                    tag,
                    state: PushState::Present,
                    uploaded: 0,
                });
            }
        } else {
            let cached = cached_config(t, &existing.bytes, a.kind, &tag, scratch)?;
            let sha = |c: &Config| c.record["sha256"].as_str().map(str::to_string);
            if sha(&cached) != sha(&config) {
                bail!(
                    "reproducibility failure: {} already holds wheel {} for key {} with sha256 {}, this box built sha256 {}; the cached wheel is kept (compare the two build.json files)",
                    t.describe(),
                    tag,
                    a.name,
                    sha(&cached).unwrap_or_default(),
                    sha(&config).unwrap_or_default()
                );
            }
            let mut merged = cached.clone();
            for at in &config.attestations {
                if !merged.attestations.contains(at) {
                    merged.attestations.push(at.clone());
                }
            }
            if merged == cached {
                return Ok(PushedArtifact {
                    tag,
                    state: PushState::Present,
                    uploaded: 0,
                });
            }
            // The cached files stay; only the attestations grow.
            config = merged;
            state = PushState::Signed;
            let m = artifact::parse_manifest(&existing.bytes, a.kind, &tag)?;
            let config_bytes = serde_json::to_vec_pretty(&config)?;
            let cfg_path = scratch.join(format!("{tag}.config.json"));
            fs_err::write(&cfg_path, &config_bytes)?;
            let digest = crate::cache::digest_of(&config_bytes);
            t.put_blob(&cfg_path, &digest, config_bytes.len() as u64)?;
            let mut m2 = m.clone();
            m2.config.digest = digest;
            m2.config.size = config_bytes.len() as i64;
            t.put_manifest(&tag, &serde_json::to_vec_pretty(&m2)?)?;
            return Ok(PushedArtifact {
                tag,
                state,
                uploaded: config_bytes.len() as u64,
            });
        }
    }
    let config_bytes = serde_json::to_vec_pretty(&config)?;
    let cfg_path = scratch.join(format!("{tag}.config.json"));
    fs_err::write(&cfg_path, &config_bytes)?;
    let mut uploaded = 0;
    // Blobs first, the manifest last. Two boxes pushing the same blobs at
    // once can make a registry (distribution 2.8) answer the manifest with
    // MANIFEST_BLOB_UNKNOWN while the other's upload of a blob commits; each
    // retry checks every blob again (uploading what is still unknown) before
    // the manifest, so a tag never names a missing blob.
    const ATTEMPTS: u32 = 4;
    let mut attempt = 1;
    loop {
        for l in &a.layers {
            if t.put_blob(&l.path, &l.digest, l.size)? {
                uploaded += l.size;
            }
        }
        t.put_blob(
            &cfg_path,
            &crate::cache::digest_of(&config_bytes),
            config_bytes.len() as u64,
        )?;
        kill_point(a.kind);
        match t.put_manifest(&tag, &a.manifest_bytes(&config_bytes)) {
            Ok(_) => break,
            Err(e) if attempt < ATTEMPTS => {
                crate::progress::stage(
                    "push",
                    format!("{tag}: the manifest was refused ({e:#}); checking the blobs again"),
                );
                std::thread::sleep(std::time::Duration::from_millis(500 * u64::from(attempt)));
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(PushedArtifact {
        tag,
        state,
        uploaded,
    })
}
