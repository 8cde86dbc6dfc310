//! The one rule by which everything a cache or a bundle supplies is taken
//! (issue 41; docs/cache.md "What decides the oracle, and how each part is
//! checked"): what decides the oracle is taken only when it is
//!
//! - **(a) checkable on this box alone**: a commit's objects against their
//!   git ids, a file against a sha256 that a trusted or local record fixes;
//!   or
//! - **(b) signed**: covered by statements of at least `min_signatures`
//!   keys of `trusted_signers`.
//!
//! [`TABLE`] says which check each artifact gets; [`verdict`] is the one
//! function every reader (`pull`, `build`'s substitution, `import`, `cache
//! ls`, `cache verify`) asks for (b), whatever it judges ([`Subject`]).

use std::collections::BTreeMap;

use super::*;
use crate::stages::wheel::BuildRecord;
use crate::store::key::content_key;

/// How a reader may take an artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// (a): checkable here; how.
    Local(&'static str),
    /// (b): signed statements of this kind.
    Signed(&'static str),
    /// (a) when a local record pins it, else (b) with statements of `signed`.
    LocalElseSigned {
        /// The local check.
        local: &'static str,
        /// The statement kind.
        signed: &'static str,
    },
    /// Read as evidence only: nothing it says is taken on its word.
    Evidence(&'static str),
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Check::Local(how) => write!(f, "checked here: {how}"),
            Check::Signed(kind) => write!(f, "signed: `{kind}` statements of trusted signers"),
            Check::LocalElseSigned { local, signed } => write!(
                f,
                "checked here: {local}; else signed: `{signed}` statements of trusted signers"
            ),
            Check::Evidence(what) => write!(f, "evidence: {what}"),
        }
    }
}

/// One row of [`TABLE`]: an artifact, what it decides, its check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The artifact (its tag prefix, or what it is).
    pub artifact: &'static str,
    /// What of the oracle it decides.
    pub decides: &'static str,
    /// How it is taken.
    pub check: Check,
}

/// Every artifact a cache or a bundle supplies, with its check (the table
/// of docs/cache.md, which names the test of each row).
pub const TABLE: &[Row] = &[
    Row {
        artifact: "src (objects and history)",
        decides: "the tree",
        check: Check::Local("every object against its git id; the pinned commit must be there"),
    },
    Row {
        artifact: "src (tags)",
        decides: "the version",
        check: Check::LocalElseSigned {
            local: "this box's own fetch from the repository",
            signed: TAGS,
        },
    },
    Row {
        artifact: "lock",
        decides: "the package set",
        check: Check::LocalElseSigned {
            local: "the sha256 of a reviewed lockfile",
            signed: LOCK,
        },
    },
    Row {
        artifact: "wheelhouse",
        decides: "each package file",
        check: Check::Local("its sha256 is its name, which a trusted lock records"),
    },
    Row {
        artifact: "ext",
        decides: "an external CMake tree",
        check: Check::LocalElseSigned {
            local: "its files hash to the git tree of the commit it records, which a declaration by commit fixes, and a tag's commit this box's own `git ls-remote` confirms",
            signed: EXT_TAG,
        },
    },
    Row {
        artifact: "crates",
        decides: "the Rust crates the frontend is compiled from",
        check: Check::Signed(CRATES),
    },
    Row {
        artifact: "wheel",
        decides: "the product",
        check: Check::Signed(WHEEL),
    },
    Row {
        artifact: "pyc",
        decides: "the bytecode that runs",
        check: Check::Signed(BYTECODE),
    },
    Row {
        artifact: "uv (the wheel an inputs record names)",
        decides: "the installer of every oracle",
        check: Check::Local("its sha256 is one compiled into this binary"),
    },
    Row {
        artifact: "inputs",
        decides: "which tags `pull` takes",
        check: Check::Evidence("every entry it names is checked by its own row"),
    },
    Row {
        artifact: "provenance",
        decides: "nothing (evidence of the build)",
        check: Check::Evidence("its SSHSIG, by `verify --provenance`"),
    },
];

/// The row of `artifact` in [`TABLE`].
pub fn row(artifact: &str) -> Option<&'static Row> {
    TABLE.iter().find(|r| r.artifact == artifact)
}

/// What a reader asks [`verdict`] about: a signed kind of artifact, with
/// what it holds.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    /// A wheel, by its `build.json` (the wheel checked against it already).
    Wheel(&'a BuildRecord),
    /// A store lock of key `key` holding `files`.
    Lock {
        /// The store lock's key.
        key: &'a str,
        /// Every file of the lock.
        files: &'a [FileDigest],
    },
    /// A bytecode entry named `key` holding `files` (its content).
    Bytecode {
        /// `<wheel sha256>-<cache tag>-<magic>`.
        key: &'a str,
        /// The `.pyc` files and `bytecode.json`.
        files: &'a [FileDigest],
    },
    /// A crates entry named `key` (a Cargo.lock's sha256) holding `files`.
    Crates {
        /// The sha256 of the Cargo.lock.
        key: &'a str,
        /// Its content files.
        files: &'a [FileDigest],
    },
    /// The claim that `tag` of `repo` named `commit` (a staged external source).
    ExtTag {
        /// The declared repository.
        repo: &'a str,
        /// The declared tag or branch.
        tag: &'a str,
        /// The commit it resolved to.
        commit: &'a str,
    },
    /// The tags a source of `commit` of `repo` carries (name -> object id).
    Tags {
        /// The repository URL as the recipe names it.
        repo: &'a str,
        /// The pinned commit.
        commit: &'a str,
        /// The tags.
        tags: &'a BTreeMap<String, String>,
    },
}

/// The (b) verdict on `subject` from `attestations` (every attestation of
/// its key) under `policy`, at `now` (seconds since the epoch): the
/// statement kind, key and files each subject is judged by, then
/// [`verify`].
pub fn verdict_at(
    subject: Subject<'_>,
    attestations: &[Attestation],
    policy: &Policy,
    now: i64,
) -> Verdict {
    match subject {
        Subject::Wheel(record) => verify(
            WHEEL,
            &record.key,
            &wheel_files(record),
            attestations,
            policy,
            now,
        ),
        Subject::Lock { key, files } => verify(LOCK, key, files, attestations, policy, now),
        Subject::Bytecode { key, files } => verify(BYTECODE, key, files, attestations, policy, now),
        Subject::Crates { key, files } => verify(CRATES, key, files, attestations, policy, now),
        Subject::ExtTag { repo, tag, commit } => verify(
            EXT_TAG,
            &content_key(&ext_tag_inputs(repo, tag, commit)),
            &[],
            attestations,
            policy,
            now,
        ),
        Subject::Tags { repo, commit, tags } => verify(
            TAGS,
            &content_key(&tags_inputs(repo, commit, tags)),
            &[],
            attestations,
            policy,
            now,
        ),
    }
}

/// [`verdict_at`] now.
pub fn verdict(subject: Subject<'_>, attestations: &[Attestation], policy: &Policy) -> Verdict {
    verdict_at(
        subject,
        attestations,
        policy,
        jiff::Timestamp::now().as_second(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_signed_kind_has_a_row_and_every_row_a_check() {
        for kind in [WHEEL, LOCK, BYTECODE, TAGS, EXT_TAG, CRATES] {
            assert!(
                TABLE.iter().any(|r| matches!(
                    r.check,
                    Check::Signed(k) | Check::LocalElseSigned { signed: k, .. } if k == kind
                )),
                "{kind}"
            );
        }
        assert!(row("wheel").is_some_and(|r| r.check == Check::Signed(WHEEL)));
        let docs = include_str!("../../../docs/cache.md");
        for r in TABLE {
            let first = r.artifact.split(' ').next().unwrap_or_default();
            assert!(
                docs.contains(&format!("| `{first}")) || docs.contains(&format!("| the {first}")),
                "docs/cache.md's table has no row for {}",
                r.artifact
            );
        }
    }
}
