//! The provenance engine of `verify --provenance`: the signed SLSA
//! provenance of the oracle's wheel ([`crate::cache::provenance`]), read
//! from every configured cache and checked against what this store holds:
//! the wheel's `build.json` (subject, parameters), its build lock, the
//! source commit and the staged sources' trees; and its signature against
//! each cache's `trusted_signers`.
//!
//! It passes when at least one statement is trusted and agrees everywhere,
//! and no statement found disagrees or fails its signature: a statement
//! someone changed in the cache is a failure naming the field, not
//! something to skip over.

use anyhow::{Context, Result};

use crate::cache::config;
use crate::cache::provenance::{self, Checked};
use crate::cache::trust::Policy;
use crate::exit::bad_input;
use crate::stages::identity::Check;
use crate::stages::oracle::OracleRecord;
use crate::stages::wheel::BuildRecord;
use crate::store::{Bucket, Store};

/// The checks of the provenance of the oracle whose record is `record`,
/// built from `repo`, in `store` (see the module docs), one row per
/// statement found, per field that differs, and per problem.
///
/// Errors (exit 2): no cache configured (`config.toml` of the store root,
/// the user's, `ORACLE_BUILD_CACHE`). Errors: the wheel's record cannot be
/// read; a staged source it names is missing or damaged; a cache cannot be read.
pub fn checks(store: &Store, record: &OracleRecord, repo: &str) -> Result<Vec<Check>> {
    let caches = config::load(store.root(), None)?.caches;
    if caches.is_empty() {
        return Err(bad_input(format!(
            "verify --provenance reads the provenance from the caches, and none is configured: add a [[cache]] to {} or set {}",
            store.root().join(config::CONFIG_FILE).display(),
            config::CACHE_ENV
        )));
    }
    let wheel = store.entry(Bucket::Wheels, &record.wheel_key);
    let build = BuildRecord::read(&wheel.path).with_context(|| {
        format!(
            "reading the record of the oracle's wheel {}",
            wheel.path.display()
        )
    })?;
    let expected = provenance::expected(store, &build, repo)?;
    let scratch = tempfile::tempdir()?;
    let now = jiff::Timestamp::now().as_second();
    let mut found: Vec<(String, Checked)> = Vec::new();
    for (i, c) in caches.iter().enumerate() {
        let t = crate::cache::open(c)?;
        let policy = Policy::for_cache(c)?;
        // Said before asking: an unresponsive cache is waited for up to
        // its timeouts, and the user sees which one and how long.
        crate::progress::stage(
            "provenance",
            format!(
                "reading the provenance of wheel {} from cache {} ({}; connect timeout {:?}, read timeout {:?})",
                build.key, c.name, c.url, c.timeouts.connect, c.timeouts.read
            ),
        );
        let tags = provenance::tags_for(t.as_ref(), &build.key).with_context(|| {
            format!(
                "verify --provenance: cache {} ({}) could not be read (read timeout {:?})",
                c.name, c.url, c.timeouts.read
            )
        })?;
        for tag in tags {
            let dir = scratch.path().join(format!("{i}-{tag}"));
            let checked = match provenance::fetch(t.as_ref(), &tag, &dir) {
                Ok(signed) => provenance::check(&tag, &build.key, &signed, &expected, &policy, now),
                Err(e) => Checked {
                    tag: tag.clone(),
                    signer: None,
                    untrusted: vec!["not read".into()],
                    diffs: Vec::new(),
                    problems: vec![format!("{e:#}")],
                },
            };
            found.push((c.name.clone(), checked));
        }
    }
    let mut out = Vec::new();
    out.push(Check {
        field: "provenance (wheel subject)".into(),
        expected: format!("{} sha256 {}", build.wheel, build.sha256),
        found: format!("installed wheel sha256 {}", record.wheel_sha256),
        ok: record.wheel_sha256 == build.sha256,
    });
    if found.is_empty() {
        out.push(Check {
            field: "provenance".into(),
            expected: format!("a signed provenance of wheel {} in a cache", build.key),
            found: format!(
                "none in {}",
                caches
                    .iter()
                    .map(|c| c.url.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            ok: false,
        });
        return Ok(out);
    }
    for (cache, p) in &found {
        out.push(Check {
            field: "provenance signature".into(),
            expected: format!("a trusted signer of cache {cache} ({})", p.tag),
            found: match &p.signer {
                Some(s) => format!("{} ({})", s.builder, s.fingerprint),
                None => format!("untrusted: {}", p.untrusted.join("; ")),
            },
            ok: p.signer.is_some(),
        });
        for problem in &p.problems {
            out.push(Check {
                field: "provenance statement".into(),
                expected: "canonical, in-toto v1 / SLSA v1, parameters hashing to the wheel key"
                    .into(),
                found: problem.clone(),
                ok: false,
            });
        }
        for d in &p.diffs {
            out.push(Check {
                field: format!("provenance {}", d.field),
                expected: d.expected.clone(),
                found: d.found.clone(),
                ok: false,
            });
        }
        if p.diffs.is_empty() && p.problems.is_empty() {
            out.push(Check {
                field: "provenance fields".into(),
                expected: "as this store's records say (subject, parameters, locks, sources)"
                    .into(),
                found: format!("{}: every field agrees", p.tag),
                ok: true,
            });
        }
    }
    Ok(out)
}
