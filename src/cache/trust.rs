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

use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
        todo!()
    }

    /// The statement of canonical bytes `bytes`.
    ///
    /// Errors: not JSON of this shape, or not canonical (re-encoding gives
    /// other bytes): a statement is accepted only in the exact form signed.
    pub fn from_canonical(bytes: &[u8]) -> Result<Statement> {
        todo!()
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
        todo!()
    }

    /// The key from the text of an OpenSSH private key file; `origin` names
    /// it in errors (as [`SigningKey::load`]).
    pub fn from_openssh(text: &str, origin: &str) -> Result<SigningKey> {
        todo!()
    }

    /// The SHA256 fingerprint of the public key (`SHA256:...`).
    pub fn fingerprint(&self) -> String {
        self.key
            .public_key()
            .fingerprint(Default::default())
            .to_string()
    }

    /// The public key as one OpenSSH line (`ssh-ed25519 AAAA... comment`).
    pub fn public_openssh(&self) -> String {
        todo!()
    }
}

/// Signs `statement` with `key`: SSHSIG over its canonical bytes.
///
/// Errors: the statement cannot be canonicalised, or signing fails.
pub fn sign(statement: &Statement, key: &SigningKey) -> Result<Attestation> {
    todo!()
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
        todo!()
    }

    /// The signers of `text` read from `origin` (as [`AllowedSigners::load`]).
    pub fn parse(text: &str, origin: &str) -> Result<AllowedSigners> {
        todo!()
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
        todo!()
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
    todo!()
}

/// Whether `name` matches the OpenSSH pattern list `patterns`
/// (`match_pattern_list`: `*`, `?`, and `!` negating: a negated match
/// refuses outright).
pub fn matches_patterns(name: &str, patterns: &[String]) -> bool {
    todo!()
}

/// The distinct key fingerprints of `signers`.
pub fn distinct_keys(signers: &[Signer]) -> BTreeSet<&str> {
    signers.iter().map(|s| s.fingerprint.as_str()).collect()
}
