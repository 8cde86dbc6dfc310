//! What a reader accepts of a cache's signed kinds (a wheel, a store lock,
//! bytecode): the files each statement names, how a lock is pinned by a
//! reviewed lockfile or trusted by its signatures ([`LockTrust`]), and
//! [`accept`], the policy `pull` and `build`'s substitution hand the
//! fetcher. The verdicts themselves come from [`super::trust::rule`].

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use fs_err as fs;

use super::artifact::{Config, Kind};
use super::listing;
use super::trust::Attestation;
use crate::stages::wheel;
use crate::store::sha256_file;

/// What the trust policy says of the config of a signed kind (a wheel, a
/// store lock) and every attestation of its key the cache holds
/// ([`listing::signed`]): `Ok` to accept it, an error naming why not (see
/// [`accept`]).
pub type WheelPolicy<'a> = &'a dyn Fn(&Config, &[Attestation]) -> Result<()>;

/// How a lock from a cache is trusted (`cache ls`, `pull`, `build`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "lock_trust", rename_all = "kebab-case")]
pub enum LockTrust {
    /// Its lock files are exactly those of a reviewed lockfile on this box
    /// (same sha256): the digests are enough.
    Lockfile,
    /// A store lock: the policy's verdict on its signed statements.
    Signed {
        /// The verdict.
        verdict: super::trust::Verdict,
    },
}

impl LockTrust {
    /// Whether the lock may decide what is installed.
    pub fn is_trusted(&self) -> bool {
        match self {
            LockTrust::Lockfile => true,
            LockTrust::Signed { verdict } => verdict.is_trusted(),
        }
    }
}

impl std::fmt::Display for LockTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockTrust::Lockfile => write!(f, "pinned (lockfile)"),
            LockTrust::Signed { verdict } if verdict.is_trusted() => {
                write!(f, "{}", verdict.to_string().trim_start_matches("trusted: "))
            }
            LockTrust::Signed { verdict } => write!(f, "{verdict}"),
        }
    }
}

/// The files a lock statement names for the lock artifact `config`: every
/// file of the lock (`pylock.*.toml`, `lock.json`) with sha256 and size.
pub fn lock_files(config: &Config) -> Vec<super::trust::FileDigest> {
    config
        .files
        .iter()
        .map(|f| super::trust::FileDigest {
            path: f.path.clone(),
            sha256: f.sha256.clone(),
            size: f.size,
        })
        .collect()
}

/// Whether the lock artifact `config` holds exactly the lock files
/// (`pylock.build.toml`, `pylock.runtime.toml`) of a reviewed lockfile
/// under `lockfiles` (a lockfiles root: see [`pinned_by_lockfile_files`]).
pub fn pinned_by_lockfile(config: &Config, lockfiles: Option<&Path>) -> bool {
    use crate::stages::lock::{BUILD_LOCK, RUNTIME_LOCK};
    let theirs = |name: &str| {
        config
            .files
            .iter()
            .find(|f| f.path == name)
            .map(|f| f.sha256.clone())
    };
    pinned_by_lockfile_files((theirs(BUILD_LOCK), theirs(RUNTIME_LOCK)), lockfiles)
}

/// How many recipe directories of a lockfiles root are looked through.
const LOCKFILE_DIRS_LIMIT: usize = 10_000;

/// Whether `wanted`, the sha256 of a lock's `pylock.build.toml` and
/// `pylock.runtime.toml` (`None`: absent), are exactly those of a reviewed
/// lockfile under `lockfiles`: a lockfiles root, whose recipe directories
/// `<root>/<recipe>/` and their platform directories `<root>/<recipe>/<P>/`
/// hold lockfiles (at most [`LOCKFILE_DIRS_LIMIT`] recipe directories).
/// Any recipe's: a lock is pinned by its bytes, whichever recipe name the
/// box that made it used (a lock names none). Also for a bundle's lock, by
/// `import`.
pub fn pinned_by_lockfile_files(
    wanted: (Option<String>, Option<String>),
    lockfiles: Option<&Path>,
) -> bool {
    use crate::stages::lock::{BUILD_LOCK, LOCK_JSON, LockInfo, RUNTIME_LOCK};
    let Some(root) = lockfiles else {
        return false;
    };
    if wanted.0.is_none() && wanted.1.is_none() {
        return false;
    }
    let subdirs = |d: &Path| -> Vec<PathBuf> {
        fs::read_dir(d).map_or_else(
            |_| Vec::new(),
            |rd| {
                rd.flatten()
                    .take(LOCKFILE_DIRS_LIMIT)
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            },
        )
    };
    let mut dirs = Vec::new();
    for recipe in subdirs(root) {
        dirs.extend(subdirs(&recipe));
        dirs.push(recipe);
    }
    dirs.iter().any(|d| {
        let Ok(info) = crate::store::read_json::<LockInfo>(&d.join(LOCK_JSON)) else {
            return false;
        };
        let claimed = (
            info.files.get(BUILD_LOCK).cloned(),
            info.files.get(RUNTIME_LOCK).cloned(),
        );
        if claimed != wanted {
            return false;
        }
        // The files on disk, not only what their lock.json claims.
        let on_disk = |name: &str| {
            let f = d.join(name);
            f.is_file().then(|| sha256_file(&f).ok()).flatten()
        };
        (on_disk(BUILD_LOCK), on_disk(RUNTIME_LOCK)) == wanted
    })
}

/// How the lock artifact `config` is trusted under `policy`, with the
/// reviewed lockfiles under `lockfiles` ([`pinned_by_lockfile`]), else from
/// `attestations`, every attestation of its key the cache holds (the
/// attestation artifacts `att-lock-<key>-...` and any its config embeds, as
/// [`listing::signed`] with [`Kind::Lock`] reads them): the verdict
/// [`listing::Signed::verdict`] gives, the same for every reader.
pub fn lock_trust(
    config: &Config,
    attestations: &[Attestation],
    policy: &super::trust::Policy,
    lockfiles: Option<&Path>,
) -> LockTrust {
    if pinned_by_lockfile(config, lockfiles) {
        return LockTrust::Lockfile;
    }
    LockTrust::Signed {
        verdict: super::trust::verify_lock(&config.name, &lock_files(config), attestations, policy),
    }
}

/// The files a bytecode statement names for the bytecode artifact
/// `config`: the content it restores (the `.pyc` files and
/// `bytecode.json`), with sha256 and size; not the entry's manifest, which
/// records the building box's directory times
/// ([`super::trust::entry_content`]).
pub fn bytecode_files(config: &Config) -> Vec<super::trust::FileDigest> {
    super::trust::entry_content(lock_files(config))
}

/// The trust policy on the config of a signed kind, given `attestations`
/// (every attestation of its key the cache holds): a wheel needs a trusted
/// verdict ([`wheel_verdict`]); a lock is pinned by a reviewed lockfile
/// under `lockfiles` or needs a trusted verdict ([`lock_trust`]); other
/// kinds are pinned by their names. `Ok` to accept, else an error naming why.
pub fn accept(
    config: &Config,
    attestations: &[Attestation],
    policy: &super::trust::Policy,
    lockfiles: Option<&Path>,
) -> Result<()> {
    match config.kind {
        Kind::Wheel => {
            let v = wheel_verdict(config, attestations, policy);
            if v.is_trusted() {
                Ok(())
            } else {
                Err(anyhow!("the wheel is not trusted: {v}"))
            }
        }
        Kind::Lock => {
            let t = lock_trust(config, attestations, policy, lockfiles);
            if t.is_trusted() {
                Ok(())
            } else {
                Err(anyhow!(
                    "the store lock is not trusted ({t}); this box resolves its own"
                ))
            }
        }
        Kind::Bytecode => {
            let v = super::trust::verify_bytecode(
                &config.name,
                &bytecode_files(config),
                attestations,
                policy,
            );
            if v.is_trusted() {
                Ok(())
            } else {
                Err(anyhow!("the bytecode is not trusted ({v})"))
            }
        }
        Kind::Crates => {
            let v = super::trust::rule::verdict(
                super::trust::rule::Subject::Crates {
                    key: &config.name,
                    files: &crates_files(config),
                },
                attestations,
                policy,
            );
            if v.is_trusted() {
                Ok(())
            } else {
                Err(anyhow!(
                    "the crates are not trusted ({v}); this box vendors its own"
                ))
            }
        }
        _ => Ok(()),
    }
}

/// The files a crates statement names for the crates artifact `config`:
/// its content, not the entry's manifest (the directory times of the box
/// that vendored it), as for bytecode.
pub fn crates_files(config: &Config) -> Vec<super::trust::FileDigest> {
    super::trust::entry_content(lock_files(config))
}

/// The statement's view of a wheel entry: only the wheel file (its
/// `build.json` and `build.log` name paths and times of the box that built
/// it; the reproducible part is the wheel).
pub fn wheel_files(record: &wheel::BuildRecord) -> Vec<super::trust::FileDigest> {
    vec![super::trust::FileDigest {
        path: record.wheel.clone(),
        sha256: record.sha256.clone(),
        size: record.size,
    }]
}

/// The trust settings of `cache` (its `allowed_signers` loaded).
///
/// Errors: the allowed_signers file cannot be read or parsed.
pub fn policy_of(cache: &super::config::Cache) -> Result<super::trust::Policy> {
    // One reading of the key file, whose errors name the config line.
    super::trust::Policy::for_cache(cache)
}

/// The verdict of `policy` on the wheel artifact config `config` from
/// `attestations`, every attestation of its key ([`listing::verdict`]).
pub fn wheel_verdict(
    config: &Config,
    attestations: &[Attestation],
    policy: &super::trust::Policy,
) -> super::trust::Verdict {
    listing::verdict(config, attestations, policy)
}

/// The store lock's trust as every reader sees it, over a real `file://`
/// layout ([`listing::signed`] and [`lock_trust`] agree).
#[cfg(test)]
mod lock_trust_tests {
    use crate::cache::artifact::{Artifact, Config, Kind};
    use crate::cache::attest;
    use crate::cache::layout::Layout;
    use crate::cache::listing::tests::put;
    use crate::cache::listing::{TagList, signed};
    use crate::cache::trust::Policy;

    /// A lock artifact under its content tag, with `runtime` as the sha256
    /// of its `pylock.runtime.toml`.
    fn lock(key: &str, runtime: &str) -> Artifact {
        let file = |path: &str, sha: &str| crate::store::ManifestFile {
            path: path.into(),
            size: 1,
            sha256: sha.into(),
        };
        Artifact {
            kind: Kind::Lock,
            name: key.to_string(),
            config: Config {
                format: 1,
                kind: Kind::Lock,
                name: key.to_string(),
                record: serde_json::json!({ "recipe": "fx" }),
                files: vec![
                    file("lock.json", &"1".repeat(64)),
                    file("pylock.build.toml", &"2".repeat(64)),
                    file("pylock.runtime.toml", runtime),
                ],
                attestations: Vec::new(),
            },
            layers: Vec::new(),
        }
    }

    #[test]
    fn a_store_lock_is_judged_by_its_own_attestation_artifacts() {
        use crate::cache::accept::{LockTrust, lock_files, lock_trust};
        use crate::cache::trust::{self, AllowedSigners, SigningKey, Statement};
        let tmp = tempfile::tempdir().unwrap();
        let t = Layout::open(&tmp.path().join("layout"), "file:///layout").unwrap();
        let key_path = tmp.path().join("k");
        let out = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "b", "-f"])
            .arg(&key_path)
            .output()
            .expect("ssh-keygen runs (openssh-client)");
        assert!(out.status.success(), "{out:?}");
        let public = std::fs::read_to_string(key_path.with_extension("pub")).unwrap();
        let policy = Policy {
            allowed: Some(
                AllowedSigners::parse(
                    &format!("b@box namespaces=\"oracle-build\" {}", public.trim()),
                    "allowed_signers",
                )
                .unwrap(),
            ),
            min_signatures: 1,
        };
        let inputs = serde_json::json!({ "stage": "autolock", "host": "x" });
        let key = crate::store::key::content_key(&inputs);
        // The signed lock, and its signature as its own artifact.
        let good = lock(&key, &"3".repeat(64));
        put(&t, &good, &good.tag().unwrap(), tmp.path());
        let st = Statement::for_lock(
            &key,
            &inputs,
            lock_files(&good.config),
            "b@box",
            "2026-12-01T10:00:00Z",
        );
        let att = trust::sign(&st, &SigningKey::load(&key_path).unwrap()).unwrap();
        let art = attest::artifact(&att, &tmp.path().join("att")).unwrap();
        put(&t, &art, &art.tag().unwrap(), tmp.path());
        assert!(art.tag().unwrap().starts_with(&format!("att-lock-{key}-")));
        // The same lock edited (the runtime set changed): the statement is
        // not about its files.
        let edited = lock(&key, &"4".repeat(64));
        put(&t, &edited, &edited.tag().unwrap(), tmp.path());

        let tags = TagList::read(&t).unwrap();
        let s = signed(
            &t,
            &tags,
            Kind::Lock,
            &key,
            lock_files,
            &tmp.path().join("scratch"),
        )
        .unwrap();
        assert_eq!(s.candidates.len(), 2, "{:?}", s.problems);
        assert_eq!(s.attestations, vec![att]);
        assert_eq!(trust::LOCK, Kind::Lock.name());
        for c in &s.candidates {
            let v = s.verdict(c, &policy);
            // Every reader's verdict (cache ls, pull, build) is this one.
            assert_eq!(
                lock_trust(&c.config, &s.attestations, &policy, None),
                LockTrust::Signed { verdict: v.clone() }
            );
            let is_good = c.config.files == good.config.files;
            assert_eq!(v.is_trusted(), is_good, "{}: {v}", c.tag);
        }
    }
}
