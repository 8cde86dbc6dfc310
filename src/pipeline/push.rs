//! The push engine of `oracle-build push <PIN> [--cache URL]`: uploads what another box needs to
//! build PIN without network beyond the cache: the source (a git bundle of
//! the commit with its history and tags), the lock, every wheelhouse
//! artifact, every staged external source, the built wheel with its
//! `build.json` and build log (signed when the cache has a `signing_key`),
//! and the pin's inputs with the oracle's record as evidence. Venvs are
//! never pushed: the pulling box installs, measures and gates its own.
//!
//! The cache is append-only (issue 23, docs/cache.md): every tag quotes
//! its manifest's digest ([`artifact::content_tag`]), so a tag names one
//! manifest forever and nothing in the cache is read, changed and written
//! back. Per artifact: blobs first (skipped when the cache has them), the
//! manifest last, so a tag exists only when all its blobs do; a tag the
//! cache lists already is left as it is. The wheel's signature is its own
//! artifact ([`crate::cache::attest`]), so two boxes signing at once both
//! keep their signatures. A wheel whose sha256 differs from another the
//! cache holds for the same key is pushed too (both stay visible to every
//! reader) and the push then fails: a reproducibility failure.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;

use crate::cache::accept;
use crate::cache::artifact::{self, Artifact, Config, Kind, Layer, TagForm};
use crate::cache::config::{self, Cache};
use crate::cache::fetcher::SOURCE_BUNDLE;
use crate::cache::inputs_record::{self, InputsRecord};
use crate::cache::listing::{self, TagList};
use crate::cache::{Transport, attest, trust};
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
    /// This box's signature (an attestation artifact) was pushed now.
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

pub use crate::cache::trust::builder_name;

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
    let caches = caches_for(root, cache)?;
    push_to(lr, root, &caches, &lock::lock_dir(lr, lockfiles))
}

/// [`push`] to the caches `caches`, the recipe's lock taken from `lock_dir`
/// (a lock directory, as `stages::lock::lock_dir` gives) when it holds one:
/// what `push = "auto"` runs after a build.
///
/// Errors: as [`push`].
pub fn push_to(
    lr: &LoadedRecipe,
    root: &Path,
    caches: &[Cache],
    lock_dir: &Path,
) -> Result<Vec<PushReport>> {
    let r = &lr.recipe;
    let root = root.to_path_buf();
    let store = Store::open_existing(&root)
        .ok_or_else(|| {
            anyhow!(
                "no store at {}: point --store (or ORACLE_BUILD_HOME) at the store that built {}, or build it there first (`oracle-build build {} --store {}`)",
                root.display(),
                r.name,
                r.name,
                root.display()
            )
        })?;
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
    // What killed pushes left (a source bundle each: large for vLLM).
    crate::store::report_stale_staging(&store, "push")?;
    let staging = store.stage("push")?;
    let scratch = staging.path();

    // What the pin needs: the records' `requires`, venvs and checkouts left out.
    let mut entries: Vec<Entry> = Vec::new();
    let auto = lock::auto_entry(&store, r);
    let lock_from = if matches!(lock::load(lock_dir, lr), Ok(Some(_))) {
        Some(lock_dir.to_path_buf())
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
    let uv_entry = match crate::pipeline::bundle::host_uv_wheel(&store, &temp) {
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
    let source_tags = crate::host::git::bundle_tags(&bundle)?;
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
            // The tags the bundle carries, so `cache ls` judges them
            // against their signatures without downloading the bundle (a
            // reader takes the bundle's own, `git bundle list-heads`).
            record: serde_json::json!({"repo": r.source.repo, "commit": r.source.commit, "tags": source_tags}),
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
        if dir == e.path {
            check_intact(e, &root)?;
        }
        artifacts.push(artifact::of_entry(e, &dir, &scratch.join("trees"))?);
    }
    // The inputs, with the recipe and the oracle's record as evidence, and
    // the tag of every artifact above, so `pull` takes exactly those.
    let mut tags = std::collections::BTreeMap::new();
    for a in &artifacts {
        let label = match a.kind {
            Kind::Source => format!("{}/{}", Bucket::Src.dir_name(), a.name),
            _ => match entries
                .iter()
                .find(|e| e.name == a.name && Kind::of_bucket(e.bucket) == Some(a.kind))
            {
                Some(e) => e.label(),
                None => continue,
            },
        };
        tags.insert(label, a.tag()?);
    }
    let key = inputs_record::inputs_key(lr);
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
        tags,
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

    // The statement carries the build's time (build.json's `started`), not
    // the push's: a re-push signs the same bytes, so its attestation
    // artifact, and tag, are the same.
    let time = trust::statement_time(&build.started).with_context(|| {
        format!(
            "the `started` of {}",
            wheel_entry.path.join("build.json").display()
        )
    })?;
    let statement = trust::Statement::for_wheel(&build, &builder_name(), &time);
    // Every cache's signing key and trusted_signers are read before
    // anything is pushed: a bad one (exit 2, naming file, line and field)
    // leaves every cache untouched, as `pull` and `cache ls` refuse it.
    let mut keys = Vec::new();
    for c in caches {
        let policy = match c.trusted_signers {
            Some(_) => Some(trust::Policy::for_cache(c)?),
            None => None,
        };
        keys.push((trust::SigningKey::for_cache(c)?, policy));
    }
    let mut reports = Vec::new();
    for (i, (c, (signing_key, policy))) in caches.iter().zip(keys).enumerate() {
        let t = crate::cache::open(c)?;
        if let (Some(key), Some(policy)) = (&signing_key, &policy)
            && let Some(why) = trust::refusal_of(
                policy,
                key,
                &statement.builder,
                jiff::Timestamp::now().as_second(),
            )
        {
            crate::progress::stage(
                "push",
                format!(
                    "warning: {}'s own trusted_signers does not admit this signature ({why}), so boxes reading it with this policy will not trust it: set ORACLE_BUILD_BUILDER to a principal of the key's line, or add the key (`{}`) there",
                    t.describe(),
                    key.public_openssh().unwrap_or_default().trim()
                ),
            );
        }
        let listed = TagList::read(t.as_ref())?;
        let mut signed = false;
        let mut out = Vec::new();
        let (body, inputs) = artifacts.split_at(artifacts.len() - 1);
        for a in body {
            out.push(push_one(t.as_ref(), a, &listed, scratch)?);
            // The wheel, the store lock (it decides what is installed) and
            // bytecode (code that nothing else pins) are signed: each
            // signature its own attestation artifact, with the build's time.
            let Some(key) = &signing_key else {
                continue;
            };
            let to_sign = match a.kind {
                Kind::Lock => Some((
                    trust::Statement::for_lock(
                        &a.name,
                        &lock::auto_key_inputs(&store, r),
                        accept::lock_files(&a.config),
                        &statement.builder,
                        &statement.time,
                    ),
                    format!("att-lock-{i}"),
                )),
                Kind::Bytecode => Some((
                    trust::Statement::for_bytecode(
                        &a.name,
                        &a.config.record,
                        accept::bytecode_files(&a.config),
                        &statement.builder,
                        &statement.time,
                    ),
                    format!("att-pyc-{i}-{}", &a.name[..16.min(a.name.len())]),
                )),
                Kind::Wheel => Some((statement.clone(), format!("att-{i}"))),
                Kind::Crates => Some((
                    trust::Statement::for_crates(
                        &a.name,
                        accept::crates_files(&a.config),
                        &statement.builder,
                        &statement.time,
                    ),
                    format!("att-crates-{i}"),
                )),
                // The source's tags decide the version a pin is given: the
                // set the bundle carries, signed (none: nothing to sign).
                // An external source declared by a tag: the commit it
                // named when staged (its tree is checked on arrival).
                Kind::Ext => crate::cache::ext_trust::claim_of(
                    &store.entry(crate::store::Bucket::Ext, &a.name).path,
                )
                .map(|(repo, tag, commit)| {
                    (
                        trust::Statement::for_ext_tag(
                            &repo,
                            &tag,
                            &commit,
                            &statement.builder,
                            &statement.time,
                        ),
                        format!("att-ext-{i}-{}", &a.name[..16.min(a.name.len())]),
                    )
                }),
                Kind::Source if !source_tags.is_empty() => Some((
                    trust::Statement::for_tags(
                        &r.source.repo,
                        &r.source.commit,
                        &source_tags,
                        &statement.builder,
                        &statement.time,
                    ),
                    format!("att-tags-{i}"),
                )),
                _ => None,
            };
            if let Some((st, dir)) = to_sign {
                out.push(push_attestation(
                    t.as_ref(),
                    &st,
                    key,
                    &listed,
                    &scratch.join(dir),
                    scratch,
                )?);
            }
            if a.kind == Kind::Wheel {
                signed = true;
                // The signed SLSA provenance of the wheel, its own artifact.
                out.push(push_provenance(
                    t.as_ref(),
                    &store,
                    &build,
                    r,
                    key,
                    scratch,
                )?);
            }
        }
        for a in inputs {
            out.push(push_one(t.as_ref(), a, &listed, scratch)?);
        }
        // Checked after writing, so of two boxes racing with different
        // wheels at least the later one sees the other's.
        let mut others = other_wheels(t.as_ref(), &build, scratch)?;
        // Under a trust policy, a wheel no trusted key vouches for is an
        // untrusted pusher's, not a second build of this key: readers with
        // this policy never take it. Said, and not a reproducibility failure.
        if let Some(policy) = &policy
            && !others.is_empty()
        {
            for (tag, verdict) in untrusted_wheels(t.as_ref(), &build, policy, &others, scratch)? {
                crate::progress::stage(
                    "push",
                    format!(
                        "warning: {} also holds wheel {tag} for key {}, which this store's trusted_signers does not trust ({verdict}); readers with this policy ignore it",
                        t.describe(),
                        build.key
                    ),
                );
                others.retain(|(t, _)| *t != tag);
            }
        }
        if !others.is_empty() {
            bail!(
                "reproducibility failure: {} holds wheel {} for key {} with sha256 {}, this box built sha256 {}; both are in the cache now and no reader trusts either (compare the two build.json files)",
                t.describe(),
                others
                    .iter()
                    .map(|(t, _)| t.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                build.key,
                others
                    .iter()
                    .map(|(_, s)| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                build.sha256
            );
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

/// What `push = "auto"` did for one cache.
#[derive(Debug, Clone, Serialize)]
pub struct AutoPushed {
    /// The cache.
    pub cache: String,
    /// Artifacts uploaded now (0 when the push failed).
    pub uploaded: usize,
    /// Why the push failed (`None`: it did not).
    pub error: Option<String>,
}

/// `push = "auto"`: pushes the oracle of `lr` just built in the store at
/// `root` to each of `caches` ([`push_to`]), one cache at a time. A push
/// that fails is reported on stderr and in the result, never as an error:
/// the build it follows stands.
pub fn auto(lr: &LoadedRecipe, root: &Path, caches: &[Cache], lock_dir: &Path) -> Vec<AutoPushed> {
    let mut out = Vec::new();
    for c in caches {
        let shown = c.url.to_string();
        match push_to(lr, root, std::slice::from_ref(c), lock_dir) {
            Ok(reports) => {
                let uploaded = reports
                    .iter()
                    .flat_map(|r| &r.artifacts)
                    .filter(|a| a.state != PushState::Present)
                    .count();
                crate::progress::stage(
                    "push",
                    format!("push = \"auto\": pushed to {shown} ({uploaded} artifact(s) uploaded)"),
                );
                out.push(AutoPushed {
                    cache: shown,
                    uploaded,
                    error: None,
                });
            }
            Err(e) => {
                crate::progress::stage(
                    "push",
                    format!(
                        "push = \"auto\": pushing to {shown} failed (the build stands; run `oracle-build push` again): {e:#}"
                    ),
                );
                out.push(AutoPushed {
                    cache: shown,
                    uploaded: 0,
                    error: Some(format!("{e:#}")),
                });
            }
        }
    }
    out
}

/// The wheel artifacts `t` holds for the key of `build` with another
/// sha256 than its wheel's: (tag, sha256).
fn other_wheels(
    t: &dyn Transport,
    build: &BuildRecord,
    scratch: &Path,
) -> Result<Vec<(String, String)>> {
    let tags = TagList::read(t)?;
    let mut out = Vec::new();
    for (i, tag) in tags.of(Kind::Wheel, &build.key).into_iter().enumerate() {
        if let Some(TagForm::Content {
            qualifier: Some(q), ..
        }) = artifact::tag_form(&tag, Kind::Wheel, &build.key)
            && build.sha256.starts_with(&q)
        {
            continue;
        }
        let dir = scratch.join(format!("other-{i}"));
        let sha = match listing::read_config(t, &tag, Kind::Wheel, &dir) {
            Ok(Some(r)) => r.config.record["sha256"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            Ok(None) => continue,
            Err(e) => format!("(unreadable: {e:#})"),
        };
        if sha != build.sha256 {
            out.push((tag, sha));
        }
    }
    Ok(out)
}

/// The wheels among `others` (tag, sha256; from [`other_wheels`]) that
/// `policy` finds untrusted (no trusted key vouches for their files), each
/// with its verdict; every attestation of `build`'s key in the cache is read.
/// A wheel some trusted key signed (enough keys or not) is not among them:
/// trusted builders disagreeing is a reproducibility failure.
///
/// Errors: the cache cannot be read.
fn untrusted_wheels(
    t: &dyn Transport,
    build: &BuildRecord,
    policy: &trust::Policy,
    others: &[(String, String)],
    scratch: &Path,
) -> Result<Vec<(String, trust::Verdict)>> {
    let tags = TagList::read(t)?;
    let signed = listing::wheels(t, &tags, &build.key, &scratch.join("judge-others"))?;
    Ok(signed
        .candidates
        .iter()
        .filter(|c| others.iter().any(|(tag, _)| *tag == c.tag))
        .map(|c| (c.tag.clone(), signed.verdict(c, policy)))
        .filter(|(_, v)| matches!(v, trust::Verdict::Untrusted { .. }))
        .collect())
}

/// Refuses to push the store entry `e` (of the store at `root`) with a
/// manifest unless every file of it has the sha256 its manifest records and nothing was
/// added: a damaged entry pushed and signed would stay in the append-only
/// cache for good. Runs before anything is uploaded.
///
/// Errors: the manifest cannot be read; the entry is damaged (naming what
/// differs, and `doctor` for the fix).
fn check_intact(e: &Entry, root: &Path) -> Result<()> {
    // A store lock directory has no manifest: its files are checked by
    // their own hashes when it is loaded.
    if !e.path.join(crate::store::MANIFEST).is_file() {
        return Ok(());
    }
    let problems = crate::store::Manifest::read(&e.path)?.check(&e.path, true);
    if problems.is_empty() {
        return Ok(());
    }
    bail!(
        "{} in {} is damaged ({}); nothing was pushed: run `oracle-build doctor --store {}` and its fix, then push again",
        e.label(),
        root.display(),
        problems.join("; "),
        crate::shell::shell_quote(&root.display().to_string())
    )
}

/// Signs `statement` with `key` and pushes the signature as its own
/// attestation artifact (made in `dir`) to `t`, unless `listed` shows it
/// there already: [`PushState::Signed`] when pushed now.
///
/// Errors: signing fails; the cache fails.
fn push_attestation(
    t: &dyn Transport,
    statement: &trust::Statement,
    key: &trust::SigningKey,
    listed: &TagList,
    dir: &Path,
    scratch: &Path,
) -> Result<PushedArtifact> {
    let att = trust::sign(statement, key)?;
    let art = attest::artifact(&att, dir)?;
    let mut p = push_one(t, &art, listed, scratch)?;
    if p.state == PushState::Pushed {
        p.state = PushState::Signed;
    }
    Ok(p)
}

/// Signs the provenance of the wheel `build` of `r` with `key` and pushes
/// it to `t` ([`crate::cache::provenance`]).
///
/// Errors: a staged source is missing; the cache fails.
fn push_provenance(
    t: &dyn Transport,
    store: &Store,
    build: &BuildRecord,
    r: &crate::recipe::Recipe,
    key: &trust::SigningKey,
    scratch: &Path,
) -> Result<PushedArtifact> {
    use crate::cache::provenance;
    let statement = provenance::describe(store, build, &r.source.repo, &builder_name())?;
    let signed = provenance::sign(&statement, key)?;
    let (tag, pushed) = provenance::push(t, &build.key, &signed, &scratch.join("provenance"))?;
    crate::progress::stage("push", format!("{tag} -> {}", t.describe()));
    Ok(PushedArtifact {
        tag,
        state: if pushed {
            PushState::Pushed
        } else {
            PushState::Present
        },
        uploaded: if pushed {
            (signed.statement.len() + signed.signature.len()) as u64
        } else {
            0
        },
    })
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

/// Pushes one artifact under its content tag ([`Artifact::tag`]): nothing
/// when `listed` has the tag (it names this very manifest); else blobs
/// first (skipped when present) and the manifest last.
///
/// Errors: the cache fails.
pub fn push_one(
    t: &dyn Transport,
    a: &Artifact,
    listed: &TagList,
    scratch: &Path,
) -> Result<PushedArtifact> {
    let tag = a.tag()?;
    crate::progress::stage("push", format!("{tag} -> {}", t.describe()));
    if listed.contains(&tag) {
        return Ok(PushedArtifact {
            tag,
            state: PushState::Present,
            uploaded: 0,
        });
    }
    let config_bytes = a.config_bytes();
    let cfg_path = scratch.join(format!("{tag}.config.json"));
    fs_err::write(&cfg_path, &config_bytes)?;
    let mut uploaded = 0;
    // Blobs first, the manifest last. Two boxes pushing the same blobs at
    // once can make a registry (distribution 2.8) answer the manifest with
    // MANIFEST_BLOB_UNKNOWN while the other's upload of a blob commits, or
    // answer the check of a blob with a 500; each retry checks every blob
    // again (uploading what is still unknown) before the manifest, so a tag
    // never names a missing blob.
    const ATTEMPTS: u32 = 4;
    let mut attempt = 1;
    loop {
        let mut tried = || -> Result<()> {
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
            t.put_manifest(&tag, &a.manifest_bytes(&config_bytes))
                .map(|_| ())
        };
        match tried() {
            Ok(()) => break,
            Err(e) if attempt < ATTEMPTS => {
                crate::progress::stage(
                    "push",
                    format!("{tag}: the cache refused the push ({e:#}); checking the blobs again"),
                );
                std::thread::sleep(std::time::Duration::from_millis(500 * u64::from(attempt)));
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(PushedArtifact {
        tag,
        state: PushState::Pushed,
        uploaded,
    })
}
