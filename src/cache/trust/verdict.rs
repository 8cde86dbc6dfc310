//! The verdict on an entry from its attestations under a cache's
//! [`Policy`] (`trusted_signers`, `min_signatures`): [`verify`],
//! [`Verdict`].

use std::collections::BTreeSet;
use std::fmt;

use anyhow::Result;
use serde::Serialize;
use ssh_key::{HashAlg, SshSig};

use super::*;
use crate::cache::config::Cache;
use crate::stages::wheel::BuildRecord;
use crate::store::key::content_key;

/// The verdict on the wheel whose `build.json` is `record` (its wheel
/// already checked against `record.sha256`) from `attestations` under
/// `policy`, now: [`verify`] with kind `wheel`, the record's key and
/// [`wheel_files`].
pub fn verify_wheel(
    record: &BuildRecord,
    attestations: &[Attestation],
    policy: &Policy,
) -> Verdict {
    rule::verdict(rule::Subject::Wheel(record), attestations, policy)
}

impl Policy {
    /// The policy of `cache`: its `trusted_signers` file read and parsed,
    /// its `min_signatures`.
    ///
    /// Errors: exit 2 naming the file and line for an allowed_signers file
    /// that does not parse, or naming the cache when the file is missing.
    pub fn for_cache(cache: &Cache) -> Result<Policy> {
        let allowed = match &cache.trusted_signers {
            None => None,
            Some(path) => {
                let named = cache.key_field("trusted_signers");
                let text = crate::cache::keyfile::read(
                    path,
                    &named,
                    crate::cache::keyfile::KeyKind::AllowedSigners,
                )?;
                Some(AllowedSigners::parse(&text, &path.display().to_string())?)
            }
        };
        Ok(Policy {
            allowed,
            min_signatures: cache.min_signatures,
        })
    }
}

/// A trusted signer that vouched for an entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Signer {
    /// The statement's `builder` (matched a principal of the signer's line).
    pub builder: String,
    /// The SHA256 fingerprint of the key.
    pub fingerprint: String,
}

/// Two trusted statements for one key that disagree on the files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disagreement {
    /// The entry kind and key both statements name.
    pub kind: String,
    /// The key.
    pub key: String,
    /// One side: the signers and the files they vouch for.
    pub one: (Vec<Signer>, Vec<FileDigest>),
    /// The other side.
    pub other: (Vec<Signer>, Vec<FileDigest>),
}

/// What a pulling box concludes about an entry from its attestations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    /// At least `min_signatures` distinct trusted keys signed statements
    /// that name exactly the entry's files.
    Trusted {
        /// The trusted signers, sorted.
        signers: Vec<Signer>,
    },
    /// No valid trusted signature vouches for these files.
    Untrusted {
        /// Why, in plain words (no trusted_signers configured, unknown key,
        /// bad signature, builder not a principal of the key, statement for
        /// another key or other files ...), one reason per attestation.
        why: Vec<String>,
    },
    /// Some trusted signers, but fewer than required.
    NotEnough {
        /// Distinct trusted keys that signed.
        have: u32,
        /// `min_signatures`.
        need: u32,
        /// Those signers.
        signers: Vec<Signer>,
    },
    /// Trusted signers disagree on the files built for one key: builds are
    /// reproducible, so this is a reproducibility failure, never resolved by
    /// taking one side.
    Reproducibility(Disagreement),
}

impl Verdict {
    /// Whether the entry may be used.
    pub fn is_trusted(&self) -> bool {
        matches!(self, Verdict::Trusted { .. })
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |signers: &[Signer]| {
            signers
                .iter()
                .map(|s| format!("{} ({})", s.builder, s.fingerprint))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let files = |files: &[FileDigest]| {
            files
                .iter()
                .map(|f| format!("{} sha256 {}", f.path, f.sha256))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Verdict::Trusted { signers } => write!(f, "trusted: signed by {}", names(signers)),
            Verdict::Untrusted { why } => write!(f, "untrusted: {}", why.join("; ")),
            Verdict::NotEnough {
                have,
                need,
                signers,
            } => {
                let by = if signers.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", names(signers))
                };
                write!(
                    f,
                    "not enough signatures: {have} trusted signer(s){by}, min_signatures is {need}"
                )
            }
            Verdict::Reproducibility(d) => write!(
                f,
                "reproducibility failure for {} {}: {} signed [{}], {} signed [{}]",
                d.kind,
                d.key,
                names(&d.one.0),
                files(&d.one.1),
                names(&d.other.0),
                files(&d.other.1)
            ),
        }
    }
}

/// The verdict on the store lock `key` holding `files` from `attestations`
/// under `policy`, now: [`verify`] with kind [`LOCK`], the same rules,
/// `trusted_signers` and `min_signatures` as a wheel.
pub fn verify_lock(
    key: &str,
    files: &[FileDigest],
    attestations: &[Attestation],
    policy: &Policy,
) -> Verdict {
    rule::verdict(rule::Subject::Lock { key, files }, attestations, policy)
}

/// The verdict on the bytecode entry `key` holding `files` from
/// `attestations` under `policy`, now: [`verify`] with kind [`BYTECODE`],
/// the same rules, `trusted_signers` and `min_signatures` as a store lock.
pub fn verify_bytecode(
    key: &str,
    files: &[FileDigest],
    attestations: &[Attestation],
    policy: &Policy,
) -> Verdict {
    rule::verdict(rule::Subject::Bytecode { key, files }, attestations, policy)
}

/// The verdict on the tags `tags` (name -> object id) that a source of
/// `commit` of `repo` carries, from `attestations` under `policy`, now:
/// [`verify`] with kind [`TAGS`] and the key of [`tags_inputs`], so a
/// statement vouches for exactly this set of tags (one tag more, less or
/// moved is another key, which no trusted builder signed).
pub fn verify_tags(
    repo: &str,
    commit: &str,
    tags: &std::collections::BTreeMap<String, String>,
    attestations: &[Attestation],
    policy: &Policy,
) -> Verdict {
    rule::verdict(
        rule::Subject::Tags { repo, commit, tags },
        attestations,
        policy,
    )
}

/// The content files among `files` of an entry whose statement leaves its
/// manifest out (bytecode, crates): all but its
/// `manifest.json` and `manifest.stamps`, which record the directory times
/// of the box that made the entry. Two boxes compiling the same wheel with
/// the same Python write the same `.pyc` bytes (PEP 552 checked-hash) and
/// the same `bytecode.json`, but never the same directory times: were the
/// manifest signed, every second builder would read as a reproducibility
/// failure. What the statement leaves out is still pinned by the
/// artifact's digest and checked against the files on arrival.
pub fn entry_content(files: Vec<FileDigest>) -> Vec<FileDigest> {
    files
        .into_iter()
        .filter(|f| f.path != crate::store::MANIFEST && f.path != crate::store::STAMPS)
        .collect()
}

/// The trust settings of one cache.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The trusted keys; `None` when the cache has no `trusted_signers`.
    pub allowed: Option<AllowedSigners>,
    /// How many distinct trusted keys must sign (>= 1).
    pub min_signatures: u32,
}

/// The verdict on an entry of `kind` and `key` whose files are `files`,
/// from its `attestations`, under `policy`; `now` (seconds since the epoch)
/// checks `valid-after` / `valid-before`.
///
/// Every attestation is checked on its own: the statement is canonical, its
/// kind and key are the entry's, its signature verifies in [`NAMESPACE`]
/// with a key of an allowed_signers line whose namespaces and validity
/// admit it, and the statement's `builder` matches a principal of that line.
/// The valid ones are grouped by their files: two groups -> `Reproducibility`;
/// one group naming other files than `files` -> `Untrusted`; else `Trusted`
/// when it has `min_signatures` distinct keys, `NotEnough` when fewer.
pub fn verify(
    kind: &str,
    key: &str,
    files: &[FileDigest],
    attestations: &[Attestation],
    policy: &Policy,
    now: i64,
) -> Verdict {
    let Some(allowed) = &policy.allowed else {
        return Verdict::Untrusted {
            why: vec![
                "the cache has no trusted_signers, so no signature can be trusted".to_string(),
            ],
        };
    };
    let mut why = Vec::new();
    // Valid attestations grouped by the files they vouch for.
    let mut groups: Vec<(Vec<FileDigest>, Vec<Signer>)> = Vec::new();
    for (i, att) in attestations.iter().enumerate() {
        match check_one(kind, key, att, allowed, now) {
            Ok((signed, signer)) => {
                let mut signed = if kind == BYTECODE {
                    // Statements made before the manifest was left out.
                    entry_content(signed)
                } else {
                    signed
                };
                signed.sort();
                match groups.iter_mut().find(|(f, _)| *f == signed) {
                    Some((_, signers)) => signers.push(signer),
                    None => groups.push((signed, vec![signer])),
                }
            }
            Err(e) => why.push(format!("attestation {}: {e}", i + 1)),
        }
    }
    if attestations.is_empty() {
        why.push("the entry carries no signed statement".to_string());
    }
    for (_, signers) in &mut groups {
        signers.sort();
        signers.dedup();
    }
    if groups.len() > 1 {
        let (one, other) = (&groups[0], &groups[1]);
        return Verdict::Reproducibility(Disagreement {
            kind: kind.to_string(),
            key: key.to_string(),
            one: (one.1.clone(), one.0.clone()),
            other: (other.1.clone(), other.0.clone()),
        });
    }
    let Some((signed, signers)) = groups.pop() else {
        return Verdict::Untrusted { why };
    };
    let mut have_files = files.to_vec();
    have_files.sort();
    if signed != have_files {
        let names: Vec<String> = signers.iter().map(|s| s.builder.clone()).collect();
        return Verdict::Untrusted {
            why: vec![format!(
                "the statement signed by {} names other files than the entry holds (signed: {}; held: {})",
                names.join(", "),
                describe_files(&signed),
                describe_files(&have_files)
            )],
        };
    }
    let have = u32::try_from(distinct_keys(&signers).len()).unwrap_or(u32::MAX);
    if have >= policy.min_signatures {
        Verdict::Trusted { signers }
    } else {
        Verdict::NotEnough {
            have,
            need: policy.min_signatures,
            signers,
        }
    }
}

/// `path sha256 size` of each file, for messages.
fn describe_files(files: &[FileDigest]) -> String {
    files
        .iter()
        .map(|f| format!("{} sha256 {} ({} bytes)", f.path, f.sha256, f.size))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks one attestation; returns the files it vouches for and its signer.
fn check_one(
    kind: &str,
    key: &str,
    att: &Attestation,
    allowed: &AllowedSigners,
    now: i64,
) -> std::result::Result<(Vec<FileDigest>, Signer), String> {
    let statement =
        Statement::from_canonical(att.statement.as_bytes()).map_err(|e| format!("{e:#}"))?;
    if statement.kind != kind || statement.key != key {
        return Err(format!(
            "the statement is for {} {}, not {kind} {key}",
            statement.kind, statement.key
        ));
    }
    // A bytecode entry is named by what it was compiled from, not by a
    // content key: its inputs must spell its name.
    let computed = if kind == CRATES {
        // The crates of one Cargo.lock are named by its sha256.
        statement.inputs["cargo_lock_sha256"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    } else if kind == BYTECODE {
        let i = &statement.inputs;
        format!(
            "{}-{}-{}",
            i["wheel_sha256"].as_str().unwrap_or(""),
            i["cache_tag"].as_str().unwrap_or(""),
            i["magic"].as_str().unwrap_or("")
        )
    } else {
        content_key(&statement.inputs)
    };
    if computed != key {
        return Err(format!(
            "the statement's inputs hash to key {computed}, not {key}"
        ));
    }
    let sig = SshSig::from_pem(att.signature.as_bytes())
        .map_err(|e| format!("the signature is not an armored SSHSIG ({e})"))?;
    let fingerprint = sig.public_key().fingerprint(HashAlg::Sha256).to_string();
    if sig.namespace() != NAMESPACE {
        return Err(format!(
            "the signature by {fingerprint} is for namespace `{}`, not `{NAMESPACE}`",
            sig.namespace()
        ));
    }
    let lines: Vec<&AllowedSigner> = allowed
        .signers
        .iter()
        .filter(|s| s.key.key_data() == sig.public_key())
        .collect();
    if lines.is_empty() {
        return Err(format!(
            "key {fingerprint} (builder `{}`) is not in {}",
            statement.builder, allowed.origin
        ));
    }
    let mut refusals = Vec::new();
    for line in lines {
        if let Some(why) = line.refusal(&allowed.origin, &statement.builder, now) {
            refusals.push(why);
            continue;
        }
        if let Err(e) = line.key.verify(NAMESPACE, att.statement.as_bytes(), &sig) {
            return Err(format!(
                "the signature by {fingerprint} (builder `{}`) does not verify: {e}",
                statement.builder
            ));
        }
        return Ok((
            statement.files,
            Signer {
                builder: statement.builder,
                fingerprint,
            },
        ));
    }
    Err(refusals.join("; "))
}

/// Why `policy` would not admit a signature by `key` for builder `builder`
/// at `now` (seconds since the epoch, UTC), or `None` when it would: a
/// line of its `trusted_signers` holds the key and admits the builder as
/// [`AllowedSigner::refusal`] says. A push checks its own signature with
/// this before anything is uploaded, so a builder whose signatures the
/// cache's own policy ignores hears so at once.
pub fn refusal_of(policy: &Policy, key: &SigningKey, builder: &str, now: i64) -> Option<String> {
    let Some(allowed) = &policy.allowed else {
        return Some("the cache has no trusted_signers".to_string());
    };
    let lines: Vec<&AllowedSigner> = allowed
        .signers
        .iter()
        .filter(|s| s.key.key_data() == key.public_key().key_data())
        .collect();
    if lines.is_empty() {
        return Some(format!(
            "key {} is not in {}",
            key.fingerprint(),
            allowed.origin
        ));
    }
    let refusals: Vec<String> = lines
        .iter()
        .filter_map(|l| l.refusal(&allowed.origin, builder, now))
        .collect();
    if refusals.len() < lines.len() {
        None
    } else {
        Some(refusals.join("; "))
    }
}

/// The distinct key fingerprints of `signers`.
pub fn distinct_keys(signers: &[Signer]) -> BTreeSet<&str> {
    signers.iter().map(|s| s.fingerprint.as_str()).collect()
}
