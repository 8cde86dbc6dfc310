//! The trust policy of the cache (issue 13, docs/cache.md).
//!
//! Content pinned by reviewed files (a commit, a lock's hashes, a
//! `URL_HASH`) needs only its digest. The mapping key -> built wheel needs a
//! signature, as a Nix narinfo does: the box that built it signs a
//! [`Statement`] (kind, key, the full key inputs, the files with sha256 and
//! size, builder, time) and the pulling box accepts it only with
//! `min_signatures` valid signatures from its `trusted_signers`.
//!
//! - The statement is signed as canonical JSON ([`Statement::canonical`]):
//!   RFC 8785 (JCS) for the subset emitted here: objects with members sorted
//!   by the UTF-16 code units of their names, no whitespace, strings escaped
//!   as JSON.stringify does (only `"`, `\`, and control characters, which
//!   become `\b \t \n \f \r` or `\u00xx`), integers in plain decimal with at
//!   most 2^53 magnitude; floats are refused (never emitted).
//! - Signatures are SSHSIG (OpenSSH `PROTOCOL.sshsig`), namespace
//!   [`NAMESPACE`], hash sha512, ed25519 keys, armored as
//!   `-----BEGIN SSH SIGNATURE-----`, so an operator checks one with
//!   `ssh-keygen -Y verify -n oracle-build -f allowed_signers -I <builder>
//!   -s statement.sig < statement.json`.
//! - Trusted keys come from an OpenSSH `allowed_signers` file (ssh-keygen(1),
//!   "ALLOWED SIGNERS"): `principals [options] keytype base64 [comment]`.
//!   A statement's `builder` must match one of the principals of the line
//!   whose key made the signature, as `-I` must for `ssh-keygen -Y verify`.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use ssh_key::{Algorithm, HashAlg, LineEnding, SshSig};

use super::config::Cache;
use crate::exit::bad_input;
use crate::stages::wheel::BuildRecord;
use crate::store::key::content_key;

/// The SSHSIG namespace of every oracle-build signature.
pub const NAMESPACE: &str = "oracle-build";

/// One file of a signed entry: its path inside the entry, sha256 and size.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FileDigest {
    /// The path relative to the entry directory, `/`-separated.
    pub path: String,
    /// Lower-case hex sha256 of the file's bytes.
    pub sha256: String,
    /// The size in bytes.
    pub size: u64,
}

/// What a builder signs: "the entry of `kind` with `key`, made from
/// `inputs`, consists of exactly `files`".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    /// The entry kind (`wheel`, the store bucket's lock prefix).
    pub kind: String,
    /// The entry's content key (32 hex digits).
    pub key: String,
    /// The full key inputs whose canonical JSON hashes to `key` (see
    /// [`crate::store::key::content_key`]).
    pub inputs: Value,
    /// Every file of the entry, sorted by path.
    pub files: Vec<FileDigest>,
    /// Who built it: the principal the signing key is listed under in
    /// `allowed_signers` (`user@host`).
    pub builder: String,
    /// When, RFC 3339 UTC (`2026-12-01T10:00:00Z`).
    pub time: String,
}

impl Statement {
    /// The RFC 8785 canonical JSON bytes of the statement: what is signed.
    ///
    /// Errors: the inputs hold a float or an integer beyond 2^53 (not in
    /// the subset we emit).
    pub fn canonical(&self) -> Result<Vec<u8>> {
        let value = serde_json::to_value(self).context("encoding the statement")?;
        let mut out = String::new();
        canonical_into(&value, &mut out)?;
        Ok(out.into_bytes())
    }

    /// The statement of canonical bytes `bytes`.
    ///
    /// Errors: not JSON of this shape, or not canonical (re-encoding gives
    /// other bytes): a statement is accepted only in the exact form signed.
    pub fn from_canonical(bytes: &[u8]) -> Result<Statement> {
        let statement: Statement =
            serde_json::from_slice(bytes).context("the statement is not a statement's JSON")?;
        if statement.canonical()? != bytes {
            bail!(
                "the statement is not in canonical form (RFC 8785), so it is not what was signed"
            );
        }
        Ok(statement)
    }
}

/// A statement with one signature over its canonical bytes, as kept in an
/// artifact's config blob (the `attestations` list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attestation {
    /// The canonical JSON text of the [`Statement`], exactly as signed.
    pub statement: String,
    /// The armored SSHSIG signature (`-----BEGIN SSH SIGNATURE-----`).
    pub signature: String,
}

/// An ed25519 private key that signs statements.
pub struct SigningKey {
    key: ssh_key::PrivateKey,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({})", self.fingerprint())
    }
}

impl SigningKey {
    /// The key in OpenSSH private key file `path`.
    ///
    /// Errors: exit 2 naming the path when the file is not an OpenSSH
    /// private key, is encrypted (a passphrase; oracle-build signs
    /// unattended, so decrypt a copy with `ssh-keygen -p`), or is not
    /// ed25519; 1 when it cannot be read.
    pub fn load(path: &Path) -> Result<SigningKey> {
        let text = fs_err::read_to_string(path)?;
        SigningKey::from_openssh(&text, &path.display().to_string())
    }

    /// The key from the text of an OpenSSH private key file; `origin` names
    /// it in errors (as [`SigningKey::load`]).
    pub fn from_openssh(text: &str, origin: &str) -> Result<SigningKey> {
        let key = ssh_key::PrivateKey::from_openssh(text).map_err(|e| {
            bad_input(format!(
                "{origin}: signing_key: not an OpenSSH private key ({e}); make one with `ssh-keygen -t ed25519 -N '' -f <file>`"
            ))
        })?;
        if key.is_encrypted() {
            return Err(bad_input(format!(
                "{origin}: signing_key: the key is encrypted with a passphrase; oracle-build signs unattended, so give it an unencrypted copy (`ssh-keygen -p -N '' -f <copy>`) kept readable only by the builder"
            )));
        }
        if key.algorithm() != Algorithm::Ed25519 {
            return Err(bad_input(format!(
                "{origin}: signing_key: the key is {}, but oracle-build signs only with ed25519 keys (`ssh-keygen -t ed25519`)",
                key.algorithm()
            )));
        }
        Ok(SigningKey { key })
    }

    /// The SHA256 fingerprint of the public key (`SHA256:...`).
    pub fn fingerprint(&self) -> String {
        self.key.fingerprint(HashAlg::Sha256).to_string()
    }

    /// An armored SSHSIG signature (namespace [`NAMESPACE`], sha512) over
    /// `bytes`, as [`sign`] makes for a statement: for other signed
    /// documents (the SLSA provenance, `cache::provenance`).
    ///
    /// Errors: signing or encoding fails.
    pub fn sign_bytes(&self, bytes: &[u8]) -> Result<String> {
        let sig = self
            .key
            .sign(NAMESPACE, HashAlg::Sha512, bytes)
            .context("signing")?;
        sig.to_pem(LineEnding::LF).context("encoding the signature")
    }

    /// The public key as one OpenSSH line (`ssh-ed25519 AAAA... comment`).
    ///
    /// Errors: the key cannot be encoded (not expected for a loaded key).
    pub fn public_openssh(&self) -> Result<String> {
        Ok(self.key.public_key().to_openssh()?)
    }
}

impl Statement {
    /// The statement for the wheel whose `build.json` is `record`: kind
    /// `wheel`, its key and inputs, the wheel file (name, sha256, size) as
    /// the only file, signed by `builder` at `time` (RFC 3339 UTC).
    ///
    /// `build.json` and `build.log` are evidence, not product: they differ
    /// between boxes (times, paths), so two boxes agree or disagree on the
    /// wheel's bytes alone.
    pub fn for_wheel(record: &BuildRecord, builder: &str, time: &str) -> Statement {
        Statement {
            kind: WHEEL.to_string(),
            key: record.key.clone(),
            inputs: record.inputs.clone(),
            files: wheel_files(record),
            builder: builder.to_string(),
            time: time.to_string(),
        }
    }
}

/// The statement kind of a built wheel.
pub const WHEEL: &str = "wheel";

/// The statement kind of a store lock (a lock resolved at build time,
/// `store/lockfiles/<key>`): signed like a wheel, since it decides what is
/// installed and no reviewed file pins it.
pub const LOCK: &str = "lock";

impl Statement {
    /// The statement for the store lock `key` made from `inputs` (the key
    /// inputs whose content key is `key`) holding exactly `files`, signed by
    /// `builder` at `time`: kind [`LOCK`], otherwise as [`Statement::for_wheel`].
    pub fn for_lock(
        key: &str,
        inputs: &Value,
        files: Vec<FileDigest>,
        builder: &str,
        time: &str,
    ) -> Statement {
        Statement {
            kind: LOCK.to_string(),
            key: key.to_string(),
            inputs: inputs.clone(),
            files,
            builder: builder.to_string(),
            time: time.to_string(),
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
    verify(
        LOCK,
        key,
        files,
        attestations,
        policy,
        jiff::Timestamp::now().as_second(),
    )
}

/// The files a wheel statement names for `record`: the wheel alone.
pub fn wheel_files(record: &BuildRecord) -> Vec<FileDigest> {
    vec![FileDigest {
        path: record.wheel.clone(),
        sha256: record.sha256.clone(),
        size: record.size,
    }]
}

/// The verdict on the wheel whose `build.json` is `record` (its wheel
/// already checked against `record.sha256`) from `attestations` under
/// `policy`, now: [`verify`] with kind `wheel`, the record's key and
/// [`wheel_files`].
pub fn verify_wheel(
    record: &BuildRecord,
    attestations: &[Attestation],
    policy: &Policy,
) -> Verdict {
    let now = jiff::Timestamp::now().as_second();
    verify(
        WHEEL,
        &record.key,
        &wheel_files(record),
        attestations,
        policy,
        now,
    )
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
                if !path.is_file() {
                    return Err(bad_input(format!(
                        "cache `{}` ({}): trusted_signers {} does not exist",
                        cache.name,
                        cache.origin,
                        path.display()
                    )));
                }
                Some(AllowedSigners::load(path)?)
            }
        };
        Ok(Policy {
            allowed,
            min_signatures: cache.min_signatures,
        })
    }
}

/// Signs `statement` with `key`: SSHSIG over its canonical bytes.
///
/// Errors: the statement cannot be canonicalised, or signing fails.
pub fn sign(statement: &Statement, key: &SigningKey) -> Result<Attestation> {
    let bytes = statement.canonical()?;
    let sig = key
        .key
        .sign(NAMESPACE, HashAlg::Sha512, &bytes)
        .context("signing the statement")?;
    let signature = sig
        .to_pem(LineEnding::LF)
        .context("encoding the signature")?;
    let statement = String::from_utf8(bytes).context("the canonical statement is not UTF-8")?;
    Ok(Attestation {
        statement,
        signature,
    })
}

/// One line of an `allowed_signers` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedSigner {
    /// The principal patterns (`*` and `?` wildcards, `!` negation), as
    /// ssh-keygen matches `-I`.
    pub principals: Vec<String>,
    /// `namespaces="..."`, when given: the patterns the namespace must match.
    pub namespaces: Option<Vec<String>>,
    /// `valid-after="..."` as seconds since the epoch (UTC), when given.
    pub valid_after: Option<i64>,
    /// `valid-before="..."` as seconds since the epoch (UTC), when given.
    pub valid_before: Option<i64>,
    /// The public key.
    pub key: ssh_key::PublicKey,
    /// The 1-based line number in the file.
    pub line: usize,
}

/// The trusted keys of an `allowed_signers` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedSigners {
    /// The lines, in file order.
    pub signers: Vec<AllowedSigner>,
    /// The file they came from (for messages).
    pub origin: String,
}

impl AllowedSigners {
    /// The signers of file `path`.
    ///
    /// Errors: exit 2 naming the path and line for a line that cannot be
    /// parsed (unknown option, `cert-authority`, which is not supported, a
    /// key type other than `ssh-ed25519`, a bad key or time); 1 when it
    /// cannot be read.
    pub fn load(path: &Path) -> Result<AllowedSigners> {
        let text = fs_err::read_to_string(path)?;
        AllowedSigners::parse(&text, &path.display().to_string())
    }

    /// The signers of `text` read from `origin` (as [`AllowedSigners::load`]).
    pub fn parse(text: &str, origin: &str) -> Result<AllowedSigners> {
        let mut signers = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let body = raw.trim();
            if body.is_empty() || body.starts_with('#') {
                continue;
            }
            let signer = parse_signer_line(body, line)
                .map_err(|why| bad_input(format!("{origin}: line {line}: {why}")))?;
            signers.push(signer);
        }
        Ok(AllowedSigners {
            signers,
            origin: origin.to_string(),
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
            Ok((mut signed, signer)) => {
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
    let computed = content_key(&statement.inputs);
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
        if !matches_patterns(&statement.builder, &line.principals) {
            refusals.push(format!(
                "{} line {}: builder `{}` is not one of its principals ({})",
                allowed.origin,
                line.line,
                statement.builder,
                line.principals.join(",")
            ));
            continue;
        }
        if let Some(ns) = &line.namespaces
            && !matches_patterns(NAMESPACE, ns)
        {
            refusals.push(format!(
                "{} line {}: namespaces=\"{}\" does not admit `{NAMESPACE}`",
                allowed.origin,
                line.line,
                ns.join(",")
            ));
            continue;
        }
        if line.valid_after.is_some_and(|t| now < t) || line.valid_before.is_some_and(|t| now > t) {
            refusals.push(format!(
                "{} line {}: the key is not valid now (valid-after / valid-before)",
                allowed.origin, line.line
            ));
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

/// Parses one non-comment line of an allowed_signers file.
fn parse_signer_line(body: &str, line: usize) -> std::result::Result<AllowedSigner, String> {
    let (principals, rest) = split_token(body);
    if principals.is_empty() {
        return Err("no principals".into());
    }
    let principals: Vec<String> = principals.split(',').map(str::to_string).collect();
    if principals.iter().any(String::is_empty) {
        return Err("an empty principal in the list".into());
    }
    let rest = rest.trim_start();
    let (options, key_text) = if starts_with_key_type(rest) {
        ("", rest)
    } else {
        let (opts, after) = split_token(rest);
        (opts, after.trim_start())
    };
    let mut namespaces = None;
    let mut valid_after = None;
    let mut valid_before = None;
    for opt in split_options(options)? {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(unquote(v)?)),
            None => (opt.as_str(), None),
        };
        match (name.to_ascii_lowercase().as_str(), value) {
            ("namespaces", Some(v)) => {
                namespaces = Some(v.split(',').map(str::to_string).collect())
            }
            ("valid-after", Some(v)) => valid_after = Some(parse_time(&v)?),
            ("valid-before", Some(v)) => valid_before = Some(parse_time(&v)?),
            ("cert-authority", None) => {
                return Err(
                    "cert-authority lines (certificate signers) are not supported; list the signing keys themselves"
                        .into(),
                );
            }
            _ => return Err(format!("unknown or malformed option `{opt}`")),
        }
    }
    let key_type = key_text.split_whitespace().next().unwrap_or("");
    if key_type.is_empty() {
        return Err("no public key after the principals".into());
    }
    if key_type != "ssh-ed25519" {
        return Err(format!(
            "key type `{key_type}` is not supported; oracle-build signatures are ssh-ed25519"
        ));
    }
    let key = ssh_key::PublicKey::from_openssh(key_text)
        .map_err(|e| format!("the ssh-ed25519 key does not parse ({e})"))?;
    Ok(AllowedSigner {
        principals,
        namespaces,
        valid_after,
        valid_before,
        key,
        line,
    })
}

/// Whether `text` begins with an OpenSSH public key type.
fn starts_with_key_type(text: &str) -> bool {
    let first = text.split_whitespace().next().unwrap_or("");
    first.starts_with("ssh-")
        || first.starts_with("ecdsa-sha2-")
        || first.starts_with("sk-")
        || first.contains("-cert-v01@")
}

/// The first whitespace-delimited token of `text` (double quotes protect
/// whitespace) and the rest.
fn split_token(text: &str) -> (&str, &str) {
    let mut quoted = false;
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => return (&text[..i], &text[i..]),
            _ => {}
        }
    }
    (text, "")
}

/// The comma-separated options (commas inside double quotes do not split).
fn split_options(text: &str) -> std::result::Result<Vec<String>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    if quoted {
        return Err(format!("unterminated quote in the options `{text}`"));
    }
    out.push(cur);
    Ok(out)
}

/// An option value without its double quotes.
fn unquote(v: &str) -> std::result::Result<String, String> {
    match v.strip_prefix('"') {
        Some(inner) => inner
            .strip_suffix('"')
            .map(str::to_string)
            .ok_or_else(|| format!("unterminated quote in `{v}`")),
        None => Ok(v.to_string()),
    }
}

/// A `valid-after` / `valid-before` time (`YYYYMMDD[HHMM[SS]]`, `Z` for
/// UTC, otherwise the system's local time, as ssh-keygen(1)) as seconds
/// since the epoch.
fn parse_time(v: &str) -> std::result::Result<i64, String> {
    let (digits, utc) = match v.strip_suffix(['Z', 'z']) {
        Some(d) => (d, true),
        None => (v, false),
    };
    let bad = || format!("time `{v}` is not YYYYMMDD[HHMM[SS]][Z]");
    if !digits.chars().all(|c| c.is_ascii_digit()) || ![8, 12, 14].contains(&digits.len()) {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| digits.get(r).and_then(|s| s.parse::<i16>().ok());
    let year = num(0..4).ok_or_else(bad)?;
    let month = num(4..6).ok_or_else(bad)?;
    let day = num(6..8).ok_or_else(bad)?;
    let hour = if digits.len() >= 12 {
        num(8..10).ok_or_else(bad)?
    } else {
        0
    };
    let minute = if digits.len() >= 12 {
        num(10..12).ok_or_else(bad)?
    } else {
        0
    };
    let second = if digits.len() == 14 {
        num(12..14).ok_or_else(bad)?
    } else {
        0
    };
    let dt = jiff::civil::DateTime::new(
        year,
        i8::try_from(month).map_err(|_| bad())?,
        i8::try_from(day).map_err(|_| bad())?,
        i8::try_from(hour).map_err(|_| bad())?,
        i8::try_from(minute).map_err(|_| bad())?,
        i8::try_from(second).map_err(|_| bad())?,
        0,
    )
    .map_err(|_| bad())?;
    let tz = if utc {
        jiff::tz::TimeZone::UTC
    } else {
        jiff::tz::TimeZone::system()
    };
    let zoned = dt.to_zoned(tz).map_err(|_| bad())?;
    Ok(zoned.timestamp().as_second())
}

/// The RFC 8785 canonical JSON bytes of `value` (the subset documented in
/// the module docs), as [`Statement::canonical`] signs them.
///
/// Errors: `value` holds a float or an integer beyond 2^53.
pub fn canonical_bytes(value: &Value) -> Result<Vec<u8>> {
    let mut out = String::new();
    canonical_into(value, &mut out)?;
    Ok(out.into_bytes())
}

/// Appends the RFC 8785 form of `value` to `out` (the subset documented in
/// the module docs).
fn canonical_into(value: &Value, out: &mut String) -> Result<()> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            const LIMIT: u64 = 1 << 53;
            let ok = n.as_u64().is_some_and(|v| v <= LIMIT)
                || n.as_i64().is_some_and(|v| v.unsigned_abs() <= LIMIT);
            if !ok {
                bail!("number {n} is outside the canonical subset (integers of at most 2^53)");
            }
            out.push_str(&n.to_string());
        }
        Value::String(s) => out.push_str(&serde_json::to_string(s)?),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_into(item, out)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k)?);
                out.push(':');
                canonical_into(v, out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// Whether `name` matches the OpenSSH pattern list `patterns`
/// (`match_pattern_list`: `*`, `?`, and `!` negating: a negated match
/// refuses outright).
pub fn matches_patterns(name: &str, patterns: &[String]) -> bool {
    let mut matched = false;
    for p in patterns {
        if let Some(neg) = p.strip_prefix('!') {
            if glob(name.as_bytes(), neg.as_bytes()) {
                return false;
            }
        } else if glob(name.as_bytes(), p.as_bytes()) {
            matched = true;
        }
    }
    matched
}

/// OpenSSH `match_pattern`: `*` any run, `?` one character, else literal.
fn glob(s: &[u8], p: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, _) => s.is_empty(),
        (Some(b'*'), _) => (0..=s.len()).any(|i| glob(&s[i..], &p[1..])),
        (Some(b'?'), Some(_)) => glob(&s[1..], &p[1..]),
        (Some(c), Some(d)) if c == d => glob(&s[1..], &p[1..]),
        _ => false,
    }
}

/// The distinct key fingerprints of `signers`.
pub fn distinct_keys(signers: &[Signer]) -> BTreeSet<&str> {
    signers.iter().map(|s| s.fingerprint.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::PathBuf;
    use std::process::Command;

    /// A fresh ed25519 key made by the real ssh-keygen: (private path, public line).
    fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
        let path = dir.join(name);
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
            .arg(&path)
            .output()
            .expect("ssh-keygen runs (openssh-client)");
        assert!(out.status.success(), "{out:?}");
        let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
        (path, public.trim().to_string())
    }

    fn inputs() -> Value {
        json!({"schema": 1, "commit": "abc", "nested": {"z": [1, "é\n"], "a": null}})
    }

    fn statement(builder: &str, wheel_sha: &str) -> Statement {
        let inputs = inputs();
        Statement {
            kind: "wheel".into(),
            key: content_key(&inputs),
            inputs,
            files: vec![FileDigest {
                path: "pkg-1.0-py3-none-any.whl".into(),
                sha256: wheel_sha.into(),
                size: 42,
            }],
            builder: builder.into(),
            time: "2026-12-01T10:00:00Z".into(),
        }
    }

    fn policy(allowed: &str, min: u32) -> Policy {
        Policy {
            allowed: Some(AllowedSigners::parse(allowed, "allowed_signers").unwrap()),
            min_signatures: min,
        }
    }

    const NOW: i64 = 1_796_000_000;

    #[test]
    fn canonical_form_is_sorted_compact_and_escaped_as_rfc8785() {
        let mut out = String::new();
        let v = json!({"b": 1, "a": [true, null, "x\"\\\u{1}é/"], "\u{e000}": 0, "\u{10000}": 0});
        canonical_into(&v, &mut out).unwrap();
        // U+10000 is the surrogate pair D800 DC00, which sorts before U+E000 in UTF-16.
        assert_eq!(
            out,
            "{\"a\":[true,null,\"x\\\"\\\\\\u0001é/\"],\"b\":1,\"\u{10000}\":0,\"\u{e000}\":0}"
        );
        let mut out = String::new();
        assert!(canonical_into(&json!({"f": 1.5}), &mut out).is_err());
        assert!(canonical_into(&json!(9_007_199_254_740_993u64), &mut String::new()).is_err());
    }

    #[test]
    fn statement_round_trips_only_in_canonical_form() {
        let s = statement("alice@box", &"a".repeat(64));
        let bytes = s.canonical().unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with("{\"builder\":\"alice@box\",\"files\":[{\"path\":"));
        assert!(!text.contains(' ') && !text.contains('\n'));
        assert_eq!(Statement::from_canonical(&bytes).unwrap(), s);
        let pretty = serde_json::to_vec_pretty(&s).unwrap();
        let err = Statement::from_canonical(&pretty).unwrap_err();
        assert!(
            format!("{err:#}").contains("not in canonical form"),
            "{err:#}"
        );
    }

    #[test]
    fn our_signature_verifies_with_ssh_keygen() {
        let dir = tempfile::tempdir().unwrap();
        let (key_path, public) = keygen(dir.path(), "alice");
        let key = SigningKey::load(&key_path).unwrap();
        let att = sign(&statement("alice@box", &"a".repeat(64)), &key).unwrap();
        let stmt = dir.path().join("statement.json");
        let sig = dir.path().join("statement.json.sig");
        std::fs::write(&stmt, &att.statement).unwrap();
        std::fs::write(&sig, &att.signature).unwrap();
        let allowed = dir.path().join("allowed_signers");
        std::fs::write(
            &allowed,
            format!("alice@box namespaces=\"oracle-build\" {public}\n"),
        )
        .unwrap();
        let verify = |ns: &str, id: &str| {
            Command::new("ssh-keygen")
                .args(["-Y", "verify", "-n", ns, "-I", id, "-f"])
                .arg(&allowed)
                .arg("-s")
                .arg(&sig)
                .stdin(std::fs::File::open(&stmt).unwrap())
                .output()
                .unwrap()
        };
        let ok = verify(NAMESPACE, "alice@box");
        assert!(ok.status.success(), "{ok:?}");
        assert!(String::from_utf8_lossy(&ok.stdout).contains("Good \"oracle-build\" signature"));
        assert!(!verify("file", "alice@box").status.success());
        assert!(!verify(NAMESPACE, "mallory@box").status.success());
        // A changed statement no longer verifies.
        std::fs::write(&stmt, att.statement.replace("alice@box", "alice@box2")).unwrap();
        assert!(!verify(NAMESPACE, "alice@box").status.success());
    }

    #[test]
    fn ssh_keygen_signature_verifies_with_us() {
        let dir = tempfile::tempdir().unwrap();
        let (key_path, public) = keygen(dir.path(), "bob");
        let s = statement("bob@gb10", &"b".repeat(64));
        let stmt = dir.path().join("statement.json");
        std::fs::write(&stmt, s.canonical().unwrap()).unwrap();
        let out = Command::new("ssh-keygen")
            .args(["-Y", "sign", "-n", NAMESPACE, "-f"])
            .arg(&key_path)
            .arg(&stmt)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let att = Attestation {
            statement: std::fs::read_to_string(&stmt).unwrap(),
            signature: std::fs::read_to_string(dir.path().join("statement.json.sig")).unwrap(),
        };
        let files = s.files.clone();
        let verdict = verify(
            "wheel",
            &s.key,
            &files,
            std::slice::from_ref(&att),
            &policy(&format!("bob@* {public}"), 1),
            NOW,
        );
        let Verdict::Trusted { signers } = &verdict else {
            panic!("{verdict}")
        };
        assert_eq!(signers.len(), 1);
        assert_eq!(signers[0].builder, "bob@gb10");
        assert!(signers[0].fingerprint.starts_with("SHA256:"));
        // Signed in another namespace: refused.
        std::fs::remove_file(dir.path().join("statement.json.sig")).unwrap();
        let out = Command::new("ssh-keygen")
            .args(["-Y", "sign", "-n", "file", "-f"])
            .arg(&key_path)
            .arg(&stmt)
            .output()
            .unwrap();
        assert!(out.status.success());
        let other = Attestation {
            signature: std::fs::read_to_string(dir.path().join("statement.json.sig")).unwrap(),
            ..att
        };
        let v = verify(
            "wheel",
            &s.key,
            &files,
            &[other],
            &policy(&format!("bob@* {public}"), 1),
            NOW,
        );
        assert!(v.to_string().contains("namespace `file`"), "{v}");
    }

    #[test]
    fn verdicts_untrusted_not_enough_trusted_and_reproducibility() {
        let dir = tempfile::tempdir().unwrap();
        let (a_path, a_pub) = keygen(dir.path(), "a");
        let (b_path, b_pub) = keygen(dir.path(), "b");
        let (m_path, _) = keygen(dir.path(), "m");
        let (a, b, m) = (
            SigningKey::load(&a_path).unwrap(),
            SigningKey::load(&b_path).unwrap(),
            SigningKey::load(&m_path).unwrap(),
        );
        let good = "c".repeat(64);
        let s_a = statement("a@one", &good);
        let key = s_a.key.clone();
        let files = s_a.files.clone();
        let att_a = sign(&s_a, &a).unwrap();
        let att_b = sign(&statement("b@two", &good), &b).unwrap();
        let allowed = format!("# team\n\na@one {a_pub}\nb@two {b_pub}\n");

        // An unknown key is untrusted.
        let att_m = sign(&statement("a@one", &good), &m).unwrap();
        let v = verify(
            "wheel",
            &key,
            &files,
            std::slice::from_ref(&att_m),
            &policy(&allowed, 1),
            NOW,
        );
        assert!(
            matches!(&v, Verdict::Untrusted { why } if why[0].contains("is not in allowed_signers")),
            "{v}"
        );

        // No trusted_signers at all: untrusted.
        let none = Policy {
            allowed: None,
            min_signatures: 1,
        };
        assert!(matches!(
            verify(
                "wheel",
                &key,
                &files,
                std::slice::from_ref(&att_a),
                &none,
                NOW
            ),
            Verdict::Untrusted { .. }
        ));

        // One of two needed.
        let v = verify(
            "wheel",
            &key,
            &files,
            &[att_a.clone(), att_m],
            &policy(&allowed, 2),
            NOW,
        );
        assert!(
            matches!(
                &v,
                Verdict::NotEnough {
                    have: 1,
                    need: 2,
                    ..
                }
            ),
            "{v}"
        );
        // The same key twice is still one signer.
        let again = sign(
            &Statement {
                time: "2026-12-02T00:00:00Z".into(),
                ..s_a.clone()
            },
            &a,
        )
        .unwrap();
        let v = verify(
            "wheel",
            &key,
            &files,
            &[att_a.clone(), again],
            &policy(&allowed, 2),
            NOW,
        );
        assert!(matches!(&v, Verdict::NotEnough { have: 1, .. }), "{v}");
        // Two distinct trusted keys.
        let v = verify(
            "wheel",
            &key,
            &files,
            &[att_a.clone(), att_b.clone()],
            &policy(&allowed, 2),
            NOW,
        );
        assert!(
            matches!(&v, Verdict::Trusted { signers } if signers.len() == 2),
            "{v}"
        );

        // A second trusted builder with another wheel sha256: reproducibility failure.
        let att_b_other = sign(&statement("b@two", &"d".repeat(64)), &b).unwrap();
        let v = verify(
            "wheel",
            &key,
            &files,
            &[att_a.clone(), att_b_other],
            &policy(&allowed, 1),
            NOW,
        );
        let Verdict::Reproducibility(d) = &v else {
            panic!("{v}")
        };
        assert_eq!(d.one.1[0].sha256, good);
        assert_eq!(d.other.1[0].sha256, "d".repeat(64));
        assert!(v.to_string().contains("reproducibility failure"));

        // Signed, but the entry holds other bytes.
        let mut held = files.clone();
        held[0].sha256 = "e".repeat(64);
        let v = verify(
            "wheel",
            &key,
            &held,
            std::slice::from_ref(&att_a),
            &policy(&allowed, 1),
            NOW,
        );
        assert!(v.to_string().contains("names other files"), "{v}");

        // Builder not a principal of the signing key's line.
        let att_wrong = sign(&statement("b@two", &good), &a).unwrap();
        let v = verify(
            "wheel",
            &key,
            &files,
            &[att_wrong],
            &policy(&allowed, 1),
            NOW,
        );
        assert!(
            v.to_string().contains("is not one of its principals"),
            "{v}"
        );

        // A statement for another key, and inputs that do not hash to the key.
        let v = verify(
            "wheel",
            &"0".repeat(32),
            &files,
            std::slice::from_ref(&att_a),
            &policy(&allowed, 1),
            NOW,
        );
        assert!(v.to_string().contains("not wheel 000"), "{v}");
        let forged = Statement {
            inputs: json!({"other": true}),
            ..s_a.clone()
        };
        let v = verify(
            "wheel",
            &key,
            &files,
            &[sign(&forged, &a).unwrap()],
            &policy(&allowed, 1),
            NOW,
        );
        assert!(v.to_string().contains("hash to key"), "{v}");

        // A tampered statement.
        let tampered = Attestation {
            statement: att_a.statement.replace("2026-12-01", "2026-12-09"),
            ..att_a.clone()
        };
        let v = verify(
            "wheel",
            &key,
            &files,
            &[tampered],
            &policy(&allowed, 1),
            NOW,
        );
        assert!(v.to_string().contains("does not verify"), "{v}");

        // Namespaces and validity on the line.
        let ns = format!("a@one namespaces=\"git,file\" {a_pub}");
        let v = verify(
            "wheel",
            &key,
            &files,
            std::slice::from_ref(&att_a),
            &policy(&ns, 1),
            NOW,
        );
        assert!(v.to_string().contains("does not admit"), "{v}");
        let expired = format!("a@one valid-before=\"20200101Z\" {a_pub}");
        let v = verify(
            "wheel",
            &key,
            &files,
            std::slice::from_ref(&att_a),
            &policy(&expired, 1),
            NOW,
        );
        assert!(v.to_string().contains("not valid now"), "{v}");
        let fine =
            format!("a@one valid-after=\"20200101Z\",namespaces=\"oracle-*\" {a_pub} comment");
        assert!(verify("wheel", &key, &files, &[att_a], &policy(&fine, 1), NOW).is_trusted());
    }

    #[test]
    fn allowed_signers_refuses_what_it_cannot_parse_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let (_, public) = keygen(dir.path(), "k");
        let cases = [
            (format!("a@b cert-authority {public}"), "cert-authority"),
            (
                format!("a@b no-such-option {public}"),
                "unknown or malformed option",
            ),
            (
                "a@b ssh-rsa AAAAB3NzaC1yc2E".to_string(),
                "key type `ssh-rsa` is not supported",
            ),
            ("a@b ssh-ed25519 bm90IGEga2V5".to_string(), "does not parse"),
            ("a@b".to_string(), "no public key"),
            (
                format!("a@b valid-after=\"2020\" {public}"),
                "is not YYYYMMDD",
            ),
        ];
        for (line, want) in cases {
            let text = format!("# comment\n\n{line}\n");
            let err = AllowedSigners::parse(&text, "/etc/allowed").unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.starts_with("/etc/allowed: line 3: "), "{msg}");
            assert!(msg.contains(want), "{line}: {msg}");
            assert_eq!(crate::exit::code_of(&err), 2);
        }
    }

    #[test]
    fn signing_key_refuses_encrypted_and_non_ed25519_keys() {
        let dir = tempfile::tempdir().unwrap();
        let enc = dir.path().join("enc");
        let st = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "secret", "-f"])
            .arg(&enc)
            .status()
            .unwrap();
        assert!(st.success());
        let err = SigningKey::load(&enc).unwrap_err();
        assert!(
            format!("{err:#}").contains("encrypted with a passphrase"),
            "{err:#}"
        );
        assert_eq!(crate::exit::code_of(&err), 2);
        let ec = dir.path().join("ec");
        let st = Command::new("ssh-keygen")
            .args(["-q", "-t", "ecdsa", "-N", "", "-f"])
            .arg(&ec)
            .status()
            .unwrap();
        assert!(st.success());
        let err = SigningKey::load(&ec).unwrap_err();
        assert!(format!("{err:#}").contains("only with ed25519"), "{err:#}");
        let err = SigningKey::from_openssh("hello", "k").unwrap_err();
        assert!(format!("{err:#}").contains("k: signing_key: not an OpenSSH private key"));
    }

    #[test]
    fn patterns_follow_openssh_match_pattern_list() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(matches_patterns("alice@gb10", &p(&["alice@*"])));
        assert!(matches_patterns("alice@gb10", &p(&["bob", "alice@gb1?"])));
        assert!(!matches_patterns("alice@gb10", &p(&["alice@gb1"])));
        assert!(!matches_patterns("alice@gb10", &p(&["*", "!alice@*"])));
        assert!(!matches_patterns("x", &p(&["!y"])));
    }
}
