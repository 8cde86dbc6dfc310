//! Whether a staged external source (an `ext/<name>-<rev>-<h>` entry)
//! that arrives from a cache (`pull`, `build`'s substitution) or a bundle
//! (`import`) is taken: the one rule for external trees.
//!
//! Its files must be the tree of the commit it records, checked on this
//! box by git from the files and the recorded commit objects
//! ([`crate::stages::ext::proof::check_received`]). A source declared by a
//! 40-hex commit is then proven. One declared by a tag or branch names its
//! commit only by the claim of the box that staged it, which is taken when
//! a statement this box trusts vouches for it (the key inputs of a wheel
//! whose signatures the policy trusts name that commit for that
//! declaration: [`vouched_by`]), or when this box's own `git ls-remote` of
//! the repository (through its `[[mirror]]` tables) confirms that the tag
//! names that commit now. A box that may not reach the network
//! (`--offline`, `import`), or cannot reach the repository, refuses an
//! unvouched one, and the ext stage stages it here. Everything refused says
//! why, naming the artifact.

use std::path::Path;

use anyhow::{Result, bail};
use serde_json::Value;

use crate::stages::ext::keyed_sources;
use crate::stages::ext::proof::{self, Received};
use crate::store::Store;

/// Whether a tag or branch may be confirmed over the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// `git ls-remote` of the declared repository may run.
    Online,
    /// No network (`build --offline`, `import`): a tag is not confirmed.
    Offline,
}

/// A commit a trusted statement vouches for: the store entry name of a
/// declaration (`<name>-<rev>-<h>`) and the commit it resolved to, as the
/// key inputs of a trusted wheel name them; `by` says which wheel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vouched {
    /// The ext entry's name.
    pub entry: String,
    /// The commit.
    pub commit: String,
    /// The statement that vouches for it, for messages.
    pub by: String,
}

/// What the record `record` (a wheel's `build.json`, as JSON) of a wheel
/// whose signatures this box's policy trusts vouches for: each staged git
/// source of its key inputs (`inputs.ext`) with the commit it was built
/// from. The builder signed those inputs (its statement's inputs hash to
/// the key); the record's are taken only when they hash to its key too.
/// Empty when they do not, or name no staged source. `by` names the wheel
/// and its signers.
pub fn vouched_by(store: &Store, record: &Value, by: &str) -> Vec<Vouched> {
    let key = record["key"].as_str().unwrap_or_default();
    let inputs = &record["inputs"];
    if key.is_empty() || crate::store::key::content_key(inputs) != key {
        return Vec::new();
    }
    let Ok(items) = keyed_sources(inputs.get("ext")) else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|k| {
            Some(Vouched {
                entry: k.entry(store).name,
                commit: k.commit?.to_ascii_lowercase(),
                by: by.to_string(),
            })
        })
        .collect()
}

/// Checks the ext entry at `dir` (received for the store entry `name`)
/// and says how it was proven. A tag's commit is taken when one of
/// `vouched` names it for this entry, else when `reach` lets this box
/// confirm it itself ([`proof::confirm`]). `scratch` is a new directory
/// for git's scratch repository.
///
/// Errors (why it is refused): see [`proof::check_received`]; a tag or
/// branch no trusted statement vouches for and that `reach` does not let
/// this box confirm, or that the repository does not confirm.
pub fn judge(
    store: &Store,
    dir: &Path,
    name: &str,
    scratch: &Path,
    reach: Reach,
    vouched: &[Vouched],
) -> Result<String> {
    match proof::check_received(dir, name, scratch)? {
        Received::Pinned => Ok("its tree is the declared commit's".to_string()),
        Received::Claimed { repo, tag, commit } => {
            if let Some(v) = vouch(vouched, name, &commit) {
                return Ok(format!("{tag} at commit {commit}, vouched for by {}", v.by));
            }
            if reach == Reach::Offline {
                bail!(
                    "its tree is commit {commit}'s, which it says {tag} of {repo} names; no trusted signature vouches for that, and with no network this box cannot confirm it (the ext stage stages it online)"
                );
            }
            proof::confirm(store, &repo, &tag, &commit).map_err(|e| {
                anyhow::anyhow!(
                    "its tree is commit {commit}'s, which it says {tag} of {repo} names, unconfirmed: {e:#}"
                )
            })?;
            Ok(format!("{tag} at commit {commit}, confirmed by this box"))
        }
    }
}

/// The tag claim of the ext entry at `dir` (its `ext.json`): the declared
/// repository and tag and the commit it records; `None` for a source
/// declared by commit or URL, or a record that does not read.
pub fn claim_of(dir: &Path) -> Option<(String, String, String)> {
    claim_of_record(&crate::store::read_json(&dir.join("ext.json")).ok()?)
}

/// The tag claim of the ext record `rec` (see [`claim_of`]).
pub fn claim_of_record(rec: &crate::stages::ext::ExtRecord) -> Option<(String, String, String)> {
    let crate::stages::ext::Origin::Git { repo, tag } = &rec.source.origin else {
        return None;
    };
    if crate::host::git::is_full_id(tag) {
        return None;
    }
    Some((repo.clone(), tag.clone(), rec.commit.clone()?))
}

/// The [`Vouched`] of the ext entry `name` at `dir` when `attestations`
/// (its `ext-tag` statements) are trusted by one of `policies`: the
/// statement names its claim ([`claim_of`]) exactly.
pub fn signed_claim(
    dir: &Path,
    name: &str,
    attestations: &[crate::cache::trust::Attestation],
    policies: &[crate::cache::trust::Policy],
) -> Option<Vouched> {
    let (repo, tag, commit) = claim_of(dir)?;
    policies.iter().find_map(|p| {
        let v = crate::cache::trust::rule::verdict(
            crate::cache::trust::rule::Subject::ExtTag {
                repo: &repo,
                tag: &tag,
                commit: &commit,
            },
            attestations,
            p,
        );
        v.is_trusted().then(|| Vouched {
            entry: name.to_string(),
            commit: commit.clone(),
            by: format!("the statement that {tag} of {repo} named it, {v}"),
        })
    })
}

/// The statement of `vouched` that names `commit` for the entry `name`.
pub fn vouch<'v>(vouched: &'v [Vouched], name: &str, commit: &str) -> Option<&'v Vouched> {
    vouched
        .iter()
        .find(|v| v.entry == name && v.commit.eq_ignore_ascii_case(commit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stages::ext::{Decided, ExtRecord, ExtSource, Origin, Variable};
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "protocol.file.allow=always",
            ])
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A source repository with a submodule, a symlink, an executable and
    /// an ignored file; staged as the ext stage stages it.
    fn staged(d: &Path, rev: Option<&str>) -> (std::path::PathBuf, String, String) {
        let sub = d.join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        git(&sub, &["init", "-q"]);
        std::fs::write(sub.join("s.txt"), "s\n").unwrap();
        git(&sub, &["add", "-A"]);
        git(&sub, &["commit", "-qm", "s"]);
        let up = d.join("up");
        std::fs::create_dir_all(up.join("d")).unwrap();
        git(&up, &["init", "-q"]);
        std::fs::write(up.join("d/y.txt"), "y\n").unwrap();
        std::fs::write(up.join(".gitignore"), "*.o\n").unwrap();
        std::fs::write(up.join("f.o"), "o\n").unwrap();
        std::fs::write(up.join("x.sh"), "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(up.join("x.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("x.sh", up.join("link")).unwrap();
        git(&up, &["add", "-A", "-f"]);
        git(
            &up,
            &["submodule", "add", "-q", sub.to_str().unwrap(), "third/sub"],
        );
        git(&up, &["commit", "-qm", "up"]);
        git(&up, &["tag", "v1"]);
        let commit = git(&up, &["rev-parse", "HEAD"]);
        let tag = rev.map_or_else(|| commit.clone(), str::to_string);
        let src = ExtSource {
            name: "lib".into(),
            file: "CMakeLists.txt".into(),
            origin: Origin::Git {
                repo: format!("file://{}", up.display()),
                tag: tag.clone(),
            },
            submodules: true,
            variable: Variable::Env("X".into()),
            subdir: None,
            condition: None,
            line: 1,
            decided: Decided::Target,
        };
        let entry = d.join("entry");
        let tree = entry.join("src");
        let g = crate::host::git::Git::find().unwrap();
        let (c, subs) = g
            .fetch_tree(
                &format!("file://{}", up.display()),
                &tag,
                true,
                &tree,
                &["protocol.file.allow=always".to_string()],
            )
            .unwrap();
        let p = proof::record(&tree, &c, &subs).unwrap();
        assert_eq!(p.commits.len(), 2, "{p:?}");
        let rec = ExtRecord {
            source: src.clone(),
            commit: Some(c.clone()),
            archive_sha256: None,
            submodules: subs,
            fetched_from: None,
            git: Some(p),
        };
        for e in ["src/.git", "src/third/sub/.git"] {
            let p = entry.join(e);
            if p.is_dir() {
                std::fs::remove_dir_all(&p).unwrap();
            } else {
                std::fs::remove_file(&p).unwrap();
            }
        }
        crate::store::write_json(&entry.join("ext.json"), &rec).unwrap();
        (entry, src.entry_name(), commit)
    }

    #[test]
    fn a_staged_tree_is_checked_against_its_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let (entry, name, _) = staged(d, None);
        assert_eq!(
            proof::check_received(&entry, &name, &d.join("s1")).unwrap(),
            Received::Pinned
        );
        // Another entry's name.
        let e = proof::check_received(&entry, "lib-x-00000000", &d.join("s2")).unwrap_err();
        assert!(format!("{e:#}").contains("not lib-x-00000000"), "{e:#}");
        // One byte of a file in a submodule.
        std::fs::write(entry.join("src/third/sub/s.txt"), "S\n").unwrap();
        let e = proof::check_received(&entry, &name, &d.join("s3")).unwrap_err();
        assert!(format!("{e:#}").contains("submodule third/sub"), "{e:#}");
        std::fs::write(entry.join("src/third/sub/s.txt"), "s\n").unwrap();
        // The executable bit.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            entry.join("src/x.sh"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let e = proof::check_received(&entry, &name, &d.join("s4")).unwrap_err();
        assert!(format!("{e:#}").contains("hash to git tree"), "{e:#}");
        std::fs::set_permissions(
            entry.join("src/x.sh"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        // A file added, and a directory named .git.
        std::fs::write(entry.join("src/extra.h"), "#define X 1\n").unwrap();
        assert!(proof::check_received(&entry, &name, &d.join("s5")).is_err());
        std::fs::remove_file(entry.join("src/extra.h")).unwrap();
        std::fs::create_dir_all(entry.join("src/d/.git")).unwrap();
        let e = proof::check_received(&entry, &name, &d.join("s6")).unwrap_err();
        assert!(format!("{e:#}").contains(".git"), "{e:#}");
        std::fs::remove_dir_all(entry.join("src/d/.git")).unwrap();
        assert_eq!(
            proof::check_received(&entry, &name, &d.join("s7")).unwrap(),
            Received::Pinned
        );
    }

    #[test]
    fn a_tag_is_a_claim_and_an_unfetched_submodule_must_stay_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let (entry, name, commit) = staged(d, Some("v1"));
        let got = proof::check_received(&entry, &name, &d.join("s1")).unwrap();
        assert!(
            matches!(&got, Received::Claimed { tag, commit: c, .. } if tag == "v1" && *c == commit),
            "{got:?}"
        );
        // Recorded as left unfetched: files under it are refused.
        let mut rec: ExtRecord = crate::store::read_json(&entry.join("ext.json")).unwrap();
        let sub = rec.submodules.remove("third/sub").unwrap();
        let p = rec.git.as_mut().unwrap();
        p.commits.remove(&sub);
        p.unfetched.insert("third/sub".into(), sub);
        crate::store::write_json(&entry.join("ext.json"), &rec).unwrap();
        let e = proof::check_received(&entry, &name, &d.join("s2")).unwrap_err();
        assert!(format!("{e:#}").contains("was not fetched"), "{e:#}");
        std::fs::remove_file(entry.join("src/third/sub/s.txt")).unwrap();
        assert!(proof::check_received(&entry, &name, &d.join("s3")).is_ok());
    }

    /// A tag claim is taken on a signed `ext-tag` statement of exactly it
    /// (what `push` and `export` sign), by a trusted key only; a source
    /// declared by commit makes no claim.
    #[test]
    fn a_signed_tag_claim_vouches_for_its_commit_under_a_trusting_policy_only() {
        use crate::cache::trust::{AllowedSigners, Policy, SigningKey, Statement, sign};
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let (entry, name, commit) = staged(d, Some("v1"));
        let (repo, tag, c) = claim_of(&entry).unwrap();
        assert_eq!((tag.as_str(), c.as_str()), ("v1", commit.as_str()));
        let keygen = |name: &str| {
            let path = d.join(name);
            let out = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
            (SigningKey::load(&path).unwrap(), public.trim().to_string())
        };
        let (key, public) = keygen("a");
        let (_, public_b) = keygen("b");
        let policy = |line: &str| Policy {
            allowed: Some(AllowedSigners::parse(line, "allowed_signers").unwrap()),
            min_signatures: 1,
        };
        let trusting = policy(&format!("a@box {public}"));
        let other = policy(&format!("b@box {public_b}"));
        let st = Statement::for_ext_tag(&repo, &tag, &commit, "a@box", "2026-12-07T00:00:00Z");
        let att = sign(&st, &key).unwrap();
        let got = signed_claim(
            &entry,
            &name,
            std::slice::from_ref(&att),
            std::slice::from_ref(&trusting),
        );
        assert!(got.is_some_and(|v| v.commit == commit && v.entry == name));
        assert!(signed_claim(&entry, &name, std::slice::from_ref(&att), &[other]).is_none());
        // A statement of another commit for the same tag vouches for nothing.
        let wrong = Statement::for_ext_tag(
            &repo,
            &tag,
            &"0".repeat(40),
            "a@box",
            "2026-12-07T00:00:00Z",
        );
        let wrong = sign(&wrong, &key).unwrap();
        assert!(signed_claim(&entry, &name, &[wrong], std::slice::from_ref(&trusting)).is_none());
        // Declared by commit: no claim to sign.
        let (pinned, pinned_name, _) = staged(&d.join("p"), None);
        assert!(claim_of(&pinned).is_none());
        assert!(signed_claim(&pinned, &pinned_name, &[att], &[trusting]).is_none());
    }
}
