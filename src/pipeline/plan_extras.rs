//! What `plan` shows beside the stage plan ([`super::plan`]): what the
//! substituting caches hold for each stage a build would still do
//! ([`cache_rows`]), and the device code a `cuda` build will ask for
//! ([`planned_kernels`]). Reads only; writes nothing to the store.

use anyhow::Result;

use crate::pipeline::Plan;
use crate::recipe::LoadedRecipe;
use crate::stages::identity::coverage::{Planned, planned_build};
use crate::store::Store;

/// The device code a build of `lr` will ask for (`cuda` recipes only:
/// `None` otherwise), or why it is not known.
pub fn planned_kernels(lr: &LoadedRecipe) -> Option<Result<Planned, String>> {
    if lr.recipe.build.device() != crate::recipe::TargetDevice::Cuda {
        return None;
    }
    Some(planned_build(&lr.recipe.build.cuda_arch_list))
}

/// One stage as the caches see it.
#[derive(Debug, serde::Serialize)]
pub struct CacheRow {
    /// `source`, `lock`, `wheel`, `inputs`.
    pub stage: String,
    /// The tag looked up.
    pub tag: String,
    /// The first substituting cache that has it (`None`: none has it).
    pub cache: Option<String>,
    /// For the wheel and a store lock: the trust verdict on its signatures, as text.
    pub verdict: Option<String>,
    /// For the wheel: the trusted signers (builder names).
    pub signed_by: Vec<String>,
    /// No cache that answered has it, and these caches could not be read
    /// (timed out, refused): whether they have it is not known (`None`
    /// when every cache answered).
    pub not_known: Option<String>,
}

/// What `plan` learned from the caches: one row per stage, and each cache
/// that could not be read, named with why (a timeout, a refused
/// connection): a problem `plan` reports, not "no cache has it".
#[derive(Debug, Default, serde::Serialize)]
pub struct CacheRows {
    /// One per stage looked up.
    pub rows: Vec<CacheRow>,
    /// One line per cache that failed.
    pub problems: Vec<String>,
}

/// Looks up, for the recipe `lr` planned as `p`, in the substituting caches (`--offline`: file:// ones), the
/// stages a build would still do: the source, the lock, the wheel, and the
/// pin's inputs. Reads manifests and config blobs only; writes nothing to
/// the store (scratch files go to the system's temporary directory).
///
/// Says on stderr, before asking, which caches it waits for and how long
/// at most. A cache that cannot be read is named in
/// [`CacheRows::problems`] and in the rows it leaves unknown.
///
/// Errors (exit 2): the cache configuration is bad.
pub fn cache_rows(lr: &LoadedRecipe, p: &Plan, offline: bool) -> Result<CacheRows> {
    use crate::cache::artifact::Kind;
    use crate::cache::inputs_record::inputs_key;
    use crate::cache::substitute::Substituter;
    let Some(store) = Store::open_existing(&p.store).or_else(|| Store::at(&p.store).ok()) else {
        return Ok(CacheRows::default());
    };
    let cfg = crate::cache::config::load(&p.store, None)?;
    let caches: Vec<_> = cfg.substituters(offline).cloned().collect();
    if caches.is_empty() {
        return Ok(CacheRows::default());
    }
    for c in &caches {
        crate::progress::stage(
            "plan",
            format!(
                "asking cache {} ({}) what it holds (connect timeout {:?}, read timeout {:?})",
                c.name, c.url, c.timeouts.connect, c.timeouts.read
            ),
        );
    }
    let subs = Substituter::new(&store, &caches)?;
    let scratch = tempfile::tempdir()?;
    let mut wanted = vec![("inputs", Kind::Inputs, inputs_key(lr))];
    let cached = |stage: &str| {
        p.steps
            .iter()
            .any(|s| s.stage == stage && s.state == crate::pipeline::StepState::Cached)
    };
    if !cached("source") {
        wanted.push(("source", Kind::Source, lr.recipe.source.commit.clone()));
    }
    if p.lock.state != crate::pipeline::LockState::Locked {
        let auto = crate::stages::lock::auto_entry(&store, &lr.recipe);
        if !auto.exists() {
            wanted.push(("lock", Kind::Lock, auto.name));
        }
    }
    if let Some(w) = &p.keys.wheel
        && !cached("wheel")
    {
        wanted.push(("wheel", Kind::Wheel, w.clone()));
    }
    let rows = wanted
        .into_iter()
        .map(|(stage, kind, name)| {
            let hit = subs.lookup(kind, &name, scratch.path());
            let failed = subs.failures();
            let not_known = (hit.is_none() && !failed.is_empty()).then(|| {
                format!(
                    "not in the caches that answered; {} of {} could not be read",
                    failed.len(),
                    caches.len()
                )
            });
            let signed_by = match hit.as_ref().and_then(|h| h.verdict.as_ref()) {
                Some(crate::cache::trust::Verdict::Trusted { signers }) => {
                    signers.iter().map(|s| s.builder.clone()).collect()
                }
                _ => Vec::new(),
            };
            CacheRow {
                stage: stage.into(),
                tag: hit.as_ref().map_or_else(
                    || crate::cache::artifact::tag(kind, &name),
                    |h| h.tag.clone(),
                ),
                cache: hit.as_ref().map(|h| h.cache.clone()),
                verdict: hit.and_then(|h| h.verdict.map(|v| v.to_string())),
                signed_by,
                not_known,
            }
        })
        .collect();
    Ok(CacheRows {
        rows,
        problems: subs.failures(),
    })
}
