//! `pull`: everything `build <PIN> --offline` needs, from one cache, as
//! the pin's `inputs-` artifact lists it ([`pull_pin`]), and which of
//! several `inputs-` records of a recipe to take ([`inputs`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};

use super::Transport;
use super::accept::WheelPolicy;
use super::artifact::{self, Kind};
use super::fetcher::{Fetcher, damage_of};
use super::inputs_record::{InputsRecord, inputs_key};
use crate::stages::{source, wheelhouse};
use crate::store::{Bucket, Entry, Store, TempRoots};

/// What [`pull_pin`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Pulled {
    /// The cache.
    pub cache: String,
    /// The inputs the pushing box recorded.
    pub inputs: InputsRecord,
    /// Other inputs artifacts of the recipe not taken, each with why (one
    /// naming another wheel that is not trusted, for another recipe, unreadable).
    pub skipped: Vec<String>,
    /// Entries added to the store (the mirror with its commit included).
    pub added: Vec<String>,
    /// Entries already present.
    pub present: Vec<String>,
    /// Entries not taken, each with why: a store lock without trusted
    /// signatures (the box resolves its own), a wheel whose version this
    /// box's history contradicts (built here), a uv wheel whose sha256
    /// this binary does not pin (never fetched).
    pub refused: Vec<String>,
    /// Bytes downloaded.
    pub bytes: u64,
    /// Blobs taken from the store's download area, checked there by an
    /// earlier pull that did not finish.
    pub resumed: usize,
    /// Entries that were present but damaged (each with its problems):
    /// moved aside and fetched again, so they are in `added` too.
    pub repaired: Vec<String>,
    /// The pinned uv, installed into the store's tools from the pushed wheel.
    pub uv: Option<PathBuf>,
    /// What the pull could not do (the rest was done).
    pub notes: Vec<String>,
}

/// Fetches everything a `build --offline` of `lr` needs from `cache` into
/// `store`: the inputs artifact, the source (unless mirrored), the lock
/// (kept as the store's lock of the recipe when `lock_dir` has none), every
/// wheelhouse, ext and wheel entry it lists (the wheel only when `policy`
/// accepts it) and the pinned uv (installed into the store's tools, only
/// when its wheel's sha256 is one this binary pins for this host).
/// Everything is downloaded and checked before any entry is added (see the
/// module docs); a present entry is checked too and fetched again when
/// damaged; blobs an unfinished pull checked are taken from the store's
/// download area. What it brings is kept by the list root
/// `roots/imported-<recipe>`.
///
/// Errors: the cache has no inputs for this recipe and platform; any
/// download or check fails (no entry is added; checked blobs are kept for
/// the next pull); the policy refuses the wheel.
pub fn pull_pin(
    cache: &dyn Transport,
    store: &Store,
    lr: &crate::recipe::LoadedRecipe,
    lock_dir: &Path,
    policy: WheelPolicy<'_>,
    tags_policy: &super::trust::Policy,
    temp: &TempRoots,
) -> Result<Pulled> {
    let r = &lr.recipe;
    let key = inputs_key(lr);
    let ahead = super::readahead::ReadAhead::new(cache, store)?;
    let mut f = Fetcher::new(&ahead, store)?;
    f.repo = Some(r.source.repo.clone());
    f.policy = Some(tags_policy.clone());
    let Some((config, mut bytes, skipped)) = f.inputs(&key, r, policy)? else {
        bail!(
            "cache {} has no inputs for {} on this platform (tags {}-*); push it from a box that built it: oracle-build push {}",
            cache.describe(),
            r.name,
            artifact::tag(Kind::Inputs, &key),
            r.name
        );
    };
    let inputs: InputsRecord = serde_json::from_value(config.record.clone())
        .with_context(|| format!("cache {}: the record of inputs-{key}", cache.describe()))?;
    if inputs.commit != r.source.commit || inputs.recipe != r.name {
        bail!(
            "cache {}: inputs-{key} is for {} @ {}, not {} @ {}",
            cache.describe(),
            inputs.recipe,
            inputs.commit,
            r.name,
            r.source.commit
        );
    }
    let mut items = Vec::new();
    let mut present = Vec::new();
    let mut damaged: Vec<(Entry, Vec<String>)> = Vec::new();
    // The uv it names is taken only when this binary pins its wheel for
    // this host (issue 41): another one is not fetched at all.
    let uv_refused = inputs.uv.as_ref().and_then(|label| {
        let sha = store
            .entry_by_label(label)
            .filter(|e| e.bucket == Bucket::Wheelhouse)
            .map_or_else(|| label.clone(), |e| e.name);
        let what = format!("the pushed uv wheel {label} (inputs-{key})");
        crate::host::uv_wheels::check(&sha, std::env::consts::ARCH, &what)
            .err()
            .map(|e| (label.clone(), format!("{e:#}")))
    });
    let entries: Vec<String> = inputs
        .entries
        .iter()
        .filter(|l| uv_refused.as_ref().is_none_or(|(r, _)| r != *l))
        .cloned()
        .collect();
    if let Some((_, why)) = &uv_refused {
        crate::progress::stage("pull", why.clone());
        f.refused.push(why.clone());
    }
    let mut labels = entries.clone();
    let has_lock = matches!(crate::stages::lock::load(lock_dir, lr), Ok(Some(_)));
    let auto = crate::stages::lock::auto_entry(store, r);
    if !has_lock && !labels.contains(&auto.label()) {
        labels.insert(0, auto.label());
    }
    // The manifest and config of every artifact of the entries the store
    // lacks and of every attestation of their keys, many at a time; then
    // every layer the store lacks, the same way; then the entries are read
    // and checked one by one.
    let mut lacking: Vec<(Kind, String)> = labels
        .iter()
        .filter_map(|l| store.entry_by_label(l))
        .filter(|e| !e.exists())
        .filter_map(|e| Kind::of_bucket(e.bucket).map(|k| (k, e.name.clone())))
        .collect();
    let mirrored = source::mirror_has(store, &r.source.repo, &r.source.commit);
    // A mirror holding the commit with tags kept aside (an untrusted
    // bundle or cache brought them) takes the cache's source too: signed
    // tags confirm them.
    let source_wanted = source::source_wanted(store, &r.source.repo, &r.source.commit);
    if source_wanted {
        lacking.push((Kind::Source, r.source.commit.clone()));
    }
    ahead.warm(&f.read_ahead_tags(&lacking)?);
    let mut wanted: Vec<(Kind, String)> = Vec::new();
    if source_wanted {
        let src_label = format!("{}/{}", Bucket::Src.dir_name(), r.source.commit);
        if let Some(t) = inputs.tags.get(&src_label) {
            wanted.push((Kind::Source, t.clone()));
        }
    }
    for label in &entries {
        if let (Some(e), Some(t)) = (store.entry_by_label(label), inputs.tags.get(label))
            && let Some(kind) = Kind::of_bucket(e.bucket)
            && !e.exists()
        {
            wanted.push((kind, t.clone()));
        }
    }
    f.prefetch(&wanted);
    // The commits the trusted wheel's key inputs name for its staged
    // sources vouch for their tags (cache::ext_trust).
    let wheel_label = store.entry(Bucket::Wheels, &inputs.wheel_key).label();
    if let Ok(Some(t)) = f.choose_wheel(
        &inputs.wheel_key,
        policy,
        inputs.tags.get(&wheel_label).map(String::as_str),
    ) && let Ok(dir) = f.fresh_dir()
        && let Ok(Some(read)) = f.read_config(&t, Kind::Wheel, &dir)
    {
        let by = format!("the trusted wheel {t}");
        f.vouched = super::ext_trust::vouched_by(store, &read.config.record, &by);
    }
    if !mirrored {
        let src_label = format!("{}/{}", Bucket::Src.dir_name(), r.source.commit);
        let p = f
            .prepare_source(
                &r.source.repo,
                &r.source.commit,
                inputs.tags.get(&src_label).map(String::as_str),
                tags_policy,
            )?
            .ok_or_else(|| {
                anyhow!(
                    "cache {} has no source for {} ({})",
                    cache.describe(),
                    r.source.commit,
                    artifact::tag(Kind::Source, &r.source.commit)
                )
            })?;
        items.push(p);
    } else {
        if source_wanted {
            // Only a source whose tags are trusted changes such a mirror;
            // one that cannot be read leaves it as it is, said.
            let src_label = format!("{}/{}", Bucket::Src.dir_name(), r.source.commit);
            match f.prepare_source(
                &r.source.repo,
                &r.source.commit,
                inputs.tags.get(&src_label).map(String::as_str),
                tags_policy,
            ) {
                Ok(Some(p)) if p.tags.as_ref().is_some_and(|t| t.is_confirmed()) => items.push(p),
                Ok(_) => {}
                Err(e) if super::bounds::is_unreachable(&e) => return Err(e),
                Err(e) => f.notes.push(format!(
                    "the mirror's unconfirmed tags were not confirmed from cache {}: {e:#}",
                    cache.describe()
                )),
            }
        }
        present.push(source::mirror_entry(store, &r.source.repo).label());
    }
    for label in &labels {
        let entry = store
            .entry_by_label(label)
            .filter(|e| Kind::of_bucket(e.bucket).is_some())
            .ok_or_else(|| anyhow!("cache {}: inputs-{key} lists {label:?}", cache.describe()))?;
        temp.add(store, &entry)?;
        if entry.exists() {
            let problems = damage_of(&entry);
            if problems.is_empty() {
                present.push(entry.label());
                continue;
            }
            // Fetched again; the damaged one is moved aside at commit.
            damaged.push((entry.clone(), problems));
        }
        let prepared = match f.prepare(&entry, policy, inputs.tags.get(label).map(String::as_str)) {
            // A lock that is refused (untrusted, damaged) is not taken:
            // the box resolves its own; refused bytecode, it compiles its
            // own; a refused external tree, the ext stage stages its own.
            Err(e)
                if matches!(
                    entry.bucket,
                    Bucket::Locks | Bucket::Bytecode | Bucket::Ext | Bucket::Crates
                ) =>
            {
                let why = match entry.bucket {
                    Bucket::Bytecode => {
                        format!("{}: {e:#}; this box compiles its own", entry.label())
                    }
                    Bucket::Ext => {
                        format!("{}: {e:#}; the ext stage stages it here", entry.label())
                    }
                    _ => format!("{e:#}"),
                };
                let stage = match entry.bucket {
                    Bucket::Locks => "lock",
                    Bucket::Ext => "ext",
                    _ => "bytecode",
                };
                crate::progress::stage(stage, why.clone());
                f.refused.push(why);
                continue;
            }
            other => other?,
        };
        match prepared {
            Some(p) => {
                bytes += p.bytes;
                items.push(p);
            }
            None => bail!(
                "cache {} lacks {} ({}), which inputs-{key} lists",
                cache.describe(),
                label,
                artifact::tag(
                    Kind::of_bucket(entry.bucket).unwrap_or(Kind::Lock),
                    &entry.name
                )
            ),
        }
    }
    let mut repaired = Vec::new();
    for (e, problems) in &damaged {
        let _lock = e.lock()?;
        if e.exists() {
            store.quarantine(e, problems)?;
        }
        repaired.push(format!("{} (damaged: {})", e.label(), problems.join("; ")));
    }
    // No sync of the pulled bytes, as for a build's own entries (and Nix's
    // store paths): a killed pull leaves the page cache intact, the rename
    // that commits an entry is made durable (`Store::persist`), and an entry
    // a power loss damaged fails its checks (manifest sizes and hashes, the
    // wheelhouse file's sha256) and is fetched again by the next pull or
    // substituted by the next build. Syncing here cost 0.17 s of a 1 s pull.
    let added = f.commit(items, temp)?;
    // Rooted until a build of this pin roots its oracle (or `unkeep`).
    let mut kept: Vec<Entry> = vec![source::mirror_entry(store, &r.source.repo)];
    for label in &labels {
        kept.extend(store.entry_by_label(label));
    }
    store.set_list_root(
        &crate::store::imported_root_name(&r.name),
        &format!("{} {} pulled", r.name, r.source.commit),
        &kept,
    )?;
    // The pinned uv, into the tools directory, as `import` does.
    let mut notes = std::mem::take(&mut f.notes);
    let mut uv = None;
    match inputs.uv.as_deref().and_then(|l| store.entry_by_label(l)) {
        _ if uv_refused.is_some() => notes.push(
            "the pushed uv was refused: `build --offline` needs uv on PATH or the pinned uv provisioned online".into(),
        ),
        Some(e) if e.exists() => {
            let what = format!("the pushed uv wheel {}", e.label());
            match wheelhouse::file_of(&e)
                .and_then(|f| crate::host::toolchain::install_uv_wheel(store, &f, &what))
            {
                Ok(tool) => uv = Some(tool.path),
                Err(err) => notes.push(format!("the pushed uv was not installed: {err:#}")),
            }
        }
        _ => notes.push(
            "the cache carries no uv for this pin (pushed by an older oracle-build): `build --offline` needs uv on PATH".into(),
        ),
    }
    Ok(Pulled {
        cache: cache.describe(),
        inputs,
        skipped,
        added,
        present,
        refused: f.refused.clone(),
        bytes,
        resumed: f.resumed,
        repaired,
        uv,
        notes,
    })
}
