//! What a builder signs: [`Statement`] and its RFC 8785 canonical JSON
//! bytes ([`canonical_bytes`]), the files it names ([`FileDigest`]).

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::stages::wheel::BuildRecord;

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

/// `2026-12-01T10:00:00Z` of an RFC 3339 time (`build.json`'s `started`):
/// the time a wheel statement carries, the build's, so that signing the same
/// wheel again (a re-push, an export) gives the same statement.
///
/// Errors: not an RFC 3339 time.
pub fn statement_time(started: &str) -> anyhow::Result<String> {
    use anyhow::Context;
    let t: jiff::Timestamp = started
        .parse()
        .with_context(|| format!("{started:?} is not an RFC 3339 time"))?;
    Ok(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// The statement kind of a built wheel.
pub const WHEEL: &str = "wheel";

/// The statement kind of a store lock (a lock resolved at build time,
/// `store/lockfiles/<key>`): signed like a wheel, since it decides what is
/// installed and no reviewed file pins it.
pub const LOCK: &str = "lock";

/// The statement kind of a bytecode entry (`store/pyc/<name>`, the `.pyc`
/// files of one wheel for one Python): signed like a store lock, since a
/// `.pyc` is code and nothing else pins its bytes.
pub const BYTECODE: &str = "bytecode";

impl Statement {
    /// The statement for the bytecode entry `key` (`<wheel sha256>-<cache
    /// tag>-<magic>`) holding exactly `files` (every file of its artifact,
    /// `bytecode.json` and the manifest included), signed by `builder` at
    /// `time`: kind [`BYTECODE`], its inputs the wheel, cache tag and
    /// magic number of its record (`record`).
    pub fn for_bytecode(
        key: &str,
        record: &Value,
        files: Vec<FileDigest>,
        builder: &str,
        time: &str,
    ) -> Statement {
        Statement {
            kind: BYTECODE.to_string(),
            key: key.to_string(),
            inputs: record.clone(),
            files,
            builder: builder.to_string(),
            time: time.to_string(),
        }
    }

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

/// The statement kind of the tags a source artifact or bundle carries: the
/// versions of a pin come from its history's tags (setuptools-scm), so a
/// tag is evidence that decides the oracle, taken only when signed (or
/// confirmed by this box's own fetch from the repository).
pub const TAGS: &str = "tags";

/// The key inputs of a tags statement: the repository URL as the recipe
/// names it, the pinned commit, and every tag the source carries as
/// `name -> object id` (the id the ref names directly: an annotated tag's
/// tag object, a lightweight tag's commit), as `git bundle list-heads`
/// prints them.
pub fn tags_inputs(
    repo: &str,
    commit: &str,
    tags: &std::collections::BTreeMap<String, String>,
) -> Value {
    serde_json::json!({
        "schema": 1,
        "repo": repo,
        "commit": commit,
        "tags": tags,
    })
}

impl Statement {
    /// The statement that the source of `commit` of `repo` carries exactly
    /// the tags `tags` (name -> object id): kind [`TAGS`], key the content
    /// key of [`tags_inputs`], no files (what is vouched for is in the
    /// inputs), signed by `builder` at `time`.
    pub fn for_tags(
        repo: &str,
        commit: &str,
        tags: &std::collections::BTreeMap<String, String>,
        builder: &str,
        time: &str,
    ) -> Statement {
        let inputs = tags_inputs(repo, commit, tags);
        Statement {
            kind: TAGS.to_string(),
            key: crate::store::key::content_key(&inputs),
            inputs,
            files: Vec::new(),
            builder: builder.to_string(),
            time: time.to_string(),
        }
    }
}

/// The statement kind of a crates entry (`store/crates/<sha256 of a
/// Cargo.lock>`, the vendored crates of one lock): signed like bytecode,
/// since a vendored file and its line in `.cargo-checksum.json` can be
/// rewritten together and the `.crate` archives the lock's checksums name
/// are not kept.
pub const CRATES: &str = "crates";

impl Statement {
    /// The statement for the crates entry `key` (the sha256 of its
    /// `Cargo.lock`) holding exactly `files` (its content, not its
    /// manifest), signed by `builder` at `time`: kind [`CRATES`], inputs
    /// `{"cargo_lock_sha256": key}`.
    pub fn for_crates(key: &str, files: Vec<FileDigest>, builder: &str, time: &str) -> Statement {
        Statement {
            kind: CRATES.to_string(),
            key: key.to_string(),
            inputs: serde_json::json!({ "cargo_lock_sha256": key }),
            files,
            builder: builder.to_string(),
            time: time.to_string(),
        }
    }
}

/// The statement kind of the claim that a tag (or branch) of a repository
/// names a commit, as a staged external source (`ext/`) declared by that
/// tag records it: the tree is checked against the commit on arrival, the
/// tag's commit needs a signature (or this box's own `git ls-remote`).
pub const EXT_TAG: &str = "ext-tag";

/// The key inputs of an [`EXT_TAG`] statement.
pub fn ext_tag_inputs(repo: &str, tag: &str, commit: &str) -> Value {
    serde_json::json!({"schema": 1, "repo": repo, "tag": tag, "commit": commit})
}

impl Statement {
    /// The statement that `tag` of `repo` named `commit` when the external
    /// source was staged: kind [`EXT_TAG`], key the content key of
    /// [`ext_tag_inputs`], no files, signed by `builder` at `time`.
    pub fn for_ext_tag(
        repo: &str,
        tag: &str,
        commit: &str,
        builder: &str,
        time: &str,
    ) -> Statement {
        let inputs = ext_tag_inputs(repo, tag, commit);
        Statement {
            kind: EXT_TAG.to_string(),
            key: crate::store::key::content_key(&inputs),
            inputs,
            files: Vec::new(),
            builder: builder.to_string(),
            time: time.to_string(),
        }
    }
}

/// The files a wheel statement names for `record`: the wheel alone.
pub fn wheel_files(record: &BuildRecord) -> Vec<FileDigest> {
    vec![FileDigest {
        path: record.wheel.clone(),
        sha256: record.sha256.clone(),
        size: record.size,
    }]
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
pub(super) fn canonical_into(value: &Value, out: &mut String) -> Result<()> {
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

/// The principal this box signs as: `$ORACLE_BUILD_BUILDER`, else
/// `$USER@<hostname>` (`oracle-build@<hostname>` without `USER`).
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
