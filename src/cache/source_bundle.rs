//! A source from elsewhere into the mirror: the git bundle of a source
//! artifact (`pull`, `build`'s substitution) or of a bundle (`import`),
//! fetched so that nothing it carries rewrites a ref, and so that its tags
//! decide versions only when they are trusted (issue 41, docs/cache.md
//! "What decides the oracle, and how each part is checked").
//!
//! A commit and its history prove themselves: git ids are hashes of the
//! content. A tag does not: it is a name pointing at a commit, and the
//! version setuptools-scm gives a pin comes from the nearest tag of its
//! history. So a bundle contributes its objects and its pin ref always, and
//! its tags as `refs/tags/<name>` only when they are confirmed
//! ([`TagTrust::Confirmed`]: a trusted signed statement names exactly this
//! set of tags, or the store names no trust policy at all); otherwise they
//! are kept as evidence under [`source::UNCONFIRMED_TAGS`], which neither
//! `git describe` nor a checkout reads, until this box's own fetch from the
//! repository replaces them.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use fs_err as fs;

use crate::host::process::capture;
use crate::stages::source;
use crate::store::{Bucket, Store};

/// Whether the tags a source bundle carries may decide versions on this box.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagTrust {
    /// They may: why (signed by trusted builders, the bundle carries no
    /// tag, or no trust policy is configured to check them by).
    Confirmed(String),
    /// They may not: why (unsigned, untrusted signers, not enough of
    /// them). Kept aside under [`source::UNCONFIRMED_TAGS`].
    Unconfirmed(String),
}

impl TagTrust {
    /// Whether the tags go to `refs/tags/`.
    pub fn is_confirmed(&self) -> bool {
        matches!(self, TagTrust::Confirmed(_))
    }
}

/// The trust of `tags` (a bundle's tags, [`crate::host::git::bundle_tags`])
/// for the source of `commit` of `repo`, by the verdict of `policy` over
/// `attestations` (every `att-tags-<key>` attestation found for them):
/// confirmed when the bundle carries no tag or the verdict is trusted.
pub fn tag_trust(
    repo: &str,
    commit: &str,
    tags: &BTreeMap<String, String>,
    attestations: &[super::trust::Attestation],
    policy: &super::trust::Policy,
) -> TagTrust {
    if tags.is_empty() {
        return TagTrust::Confirmed("the source carries no tag".into());
    }
    let v = super::trust::verify_tags(repo, commit, tags, attestations, policy);
    if v.is_trusted() {
        TagTrust::Confirmed(format!("its tags are {v}"))
    } else {
        TagTrust::Unconfirmed(format!("its tags are not signed by trusted builders ({v})"))
    }
}

/// What [`fetch_bundle`] did to the mirror.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundleRefs {
    /// The refs it added (pin refs, confirmed tags, unconfirmed tags under
    /// [`source::UNCONFIRMED_TAGS`]); empty when the mirror held them all.
    pub added: Vec<String>,
    /// The tags it kept aside as unconfirmed, by name.
    pub unconfirmed: Vec<String>,
    /// Unconfirmed tags it did not keep, each with why (one that would
    /// contradict a tag the mirror holds).
    pub ignored: Vec<String>,
}

impl BundleRefs {
    /// The notes a command prints about the bundle's tags from `from` (a
    /// cache's or a bundle's name), when some were not confirmed: which
    /// tags, why, and what confirms them.
    pub fn notes(&self, from: &str, trust: &TagTrust) -> Vec<String> {
        let mut out = Vec::new();
        if let TagTrust::Unconfirmed(why) = trust
            && !self.unconfirmed.is_empty()
        {
            out.push(format!(
                "the tags of the source from {from} ({}) are not used for versions: {why}; they are kept aside in the mirror until a build that reaches the repository (or a source whose tags trusted builders signed) confirms them",
                self.unconfirmed.join(", ")
            ));
        }
        for i in &self.ignored {
            out.push(format!("the source from {from}: {i}"));
        }
        out
    }
}

/// Fetches the git bundle `bundle` (the commit under
/// `refs/oracle-build/pins/` and its tags) into the mirror of `repo`,
/// creating the mirror in `scratch` and renaming it into place when absent;
/// its tags as `tags` says (see the module docs).
///
/// What arrives never rewrites a ref: the bundle is first fetched into a
/// scratch repository that borrows the mirror's objects (git alternates),
/// its refs are compared with the mirror's, and only refs the mirror lacks
/// are then fetched into it: pin refs (`refs/oracle-build/pins/<sha>`
/// naming `<sha>`), and the tags, under `refs/tags/` when confirmed, else
/// under [`source::UNCONFIRMED_TAGS`]. A confirmed tag the mirror holds for
/// another commit is an error naming the tag and both commits, and nothing
/// is written; an unconfirmed one is ignored and said ([`BundleRefs::ignored`]).
///
/// Errors: git fails; a confirmed tag of the bundle moves one of the
/// mirror's (exit 2); a pin ref of the bundle names another commit than its
/// name; a bundle that brings no tag and no pin ref into a store without
/// the mirror.
pub fn fetch_bundle(
    store: &Store,
    repo: &str,
    bundle: &Path,
    scratch: &Path,
    tags: &TagTrust,
) -> Result<BundleRefs> {
    let git =
        which::which("git").context("taking a source from a cache needs the git command line")?;
    let mirror = source::mirror_entry(store, repo);
    let _lock = mirror.lock()?;
    let bundle_arg = bundle.display().to_string();
    let fetch = |dir: &Path, refspecs: &[String]| -> Result<()> {
        if refspecs.is_empty() {
            return Ok(());
        }
        let mut args = vec![
            "-C".to_string(),
            dir.display().to_string(),
            "fetch".into(),
            "--quiet".into(),
            "--no-write-fetch-head".into(),
            // Only the refspecs: git's tag following would write every tag
            // pointing into the fetched history as `refs/tags/`.
            "--no-tags".into(),
            bundle_arg.clone(),
        ];
        args.extend(refspecs.iter().cloned());
        capture("git fetch <bundle>", duct::cmd(&git, args)).map(|_| ())
    };
    // 1. Everything the bundle carries, into a scratch repository.
    let incoming = scratch.join("incoming.git");
    if incoming.exists() {
        fs::remove_dir_all(&incoming)?;
    }
    git2::Repository::init_bare(&incoming)?;
    if mirror.exists() {
        fs::write(
            incoming.join("objects/info/alternates"),
            format!("{}\n", mirror.path.join("objects").display()),
        )?;
    }
    fetch(
        &incoming,
        &[
            "+refs/tags/*:refs/tags/*".to_string(),
            "+refs/oracle-build/pins/*:refs/oracle-build/pins/*".to_string(),
        ],
    )?;
    // 2. What it would add, and what it would move.
    let plan = incoming_refs(
        &git2::Repository::open_bare(&incoming)?,
        mirror
            .exists()
            .then(|| git2::Repository::open_bare(&mirror.path))
            .transpose()?
            .as_ref(),
        bundle,
        repo,
        tags.is_confirmed(),
    )?;
    // 3. Only new refs, never forced.
    if mirror.exists() {
        let specs: Vec<String> = plan.refs.iter().map(|(s, d)| format!("{s}:{d}")).collect();
        fetch(&mirror.path, &specs)?;
        if tags.is_confirmed() {
            // Confirmed now: what an earlier source kept aside is a tag.
            let names: Vec<String> = plan
                .refs
                .iter()
                .filter_map(|(_, d)| d.strip_prefix("refs/tags/").map(str::to_string))
                .collect();
            source::drop_unconfirmed(&mirror.path, Some(&names))?;
        }
    } else {
        // A bundle that brings no tag or pin ref gives no commit a ref:
        // refused, as its empty mirror would have been.
        if plan.refs.is_empty() {
            bail!(
                "the source bundle {} brings no tag and no {}<commit> ref: nothing would keep its commits in a new mirror",
                bundle.display(),
                source::PIN_REFS
            );
        }
        // No mirror yet: the scratch repository, its refs renamed as
        // planned and the others deleted, becomes the mirror (a second
        // `git fetch` saved).
        let repo = git2::Repository::open_bare(&incoming)?;
        // Names first: deleting while iterating skips refs.
        let mut all = Vec::new();
        for r in repo.references()?.flatten() {
            if let Some(name) = r.name() {
                all.push((name.to_string(), r.target()));
            }
        }
        let mut keep = Vec::new();
        for (name, target) in all {
            if let Some((_, dst)) = plan.refs.iter().find(|(s, _)| *s == name)
                && let Some(target) = target
            {
                keep.push((dst.clone(), target));
            }
            repo.find_reference(&name)?.delete()?;
        }
        for (name, target) in keep {
            repo.reference(&name, target, false, "oracle-build: from a source bundle")?;
        }
        drop(repo);
        fs::create_dir_all(store.bucket_dir(Bucket::Git))?;
        fs::rename(&incoming, &mirror.path)?;
    }
    Ok(BundleRefs {
        added: plan.refs.into_iter().map(|(_, d)| d).collect(),
        unconfirmed: plan.unconfirmed,
        ignored: plan.ignored,
    })
}

/// What [`incoming_refs`] plans: refs to fetch (source in the bundle's
/// scratch repository -> name in the mirror), the unconfirmed tags among
/// them, and the unconfirmed tags left out with why.
struct Plan {
    refs: Vec<(String, String)>,
    unconfirmed: Vec<String>,
    ignored: Vec<String>,
}

/// The refs of `incoming` (a bundle fetched into a scratch repository) that
/// `mirror` lacks: its pin refs and its tags (under `refs/tags/` when
/// `confirmed`, else under [`source::UNCONFIRMED_TAGS`]). A confirmed tag
/// `mirror` holds with another commit, or a pin ref naming another commit
/// than its name, is an error (exit 2) naming each such ref; an unconfirmed
/// tag that contradicts one of the mirror's is left out and named.
fn incoming_refs(
    incoming: &git2::Repository,
    mirror: Option<&git2::Repository>,
    bundle: &Path,
    repo: &str,
    confirmed: bool,
) -> Result<Plan> {
    let peel = |r: &git2::Repository, name: &str| -> Option<git2::Oid> {
        r.find_reference(name)
            .ok()?
            .peel_to_commit()
            .ok()
            .map(|c| c.id())
    };
    let mut plan = Plan {
        refs: Vec::new(),
        unconfirmed: Vec::new(),
        ignored: Vec::new(),
    };
    let mut moved = Vec::new();
    for r in incoming.references()?.flatten() {
        let Some(name) = r.name().map(str::to_string) else {
            continue;
        };
        let Some(theirs) = peel(incoming, &name) else {
            continue;
        };
        if let Some(sha) = name.strip_prefix(source::PIN_REFS) {
            if sha != theirs.to_string() {
                moved.push(format!("{name} names commit {theirs}, not {sha}"));
                continue;
            }
            if mirror.and_then(|m| peel(m, &name)).is_none() {
                plan.refs.push((name.clone(), name));
            }
            continue;
        }
        let Some(tag) = name.strip_prefix("refs/tags/") else {
            continue;
        };
        let ours = mirror.and_then(|m| peel(m, &name));
        if confirmed {
            match ours {
                Some(ours) if ours == theirs => {}
                Some(ours) => moved.push(format!(
                    "tag {tag} is commit {ours} in the mirror of {repo}, commit {theirs} in the bundle"
                )),
                None => plan.refs.push((name.clone(), name)),
            }
            continue;
        }
        let aside = format!("{}{tag}", source::UNCONFIRMED_TAGS);
        match (ours, mirror.and_then(|m| peel(m, &aside))) {
            (Some(ours), _) if ours == theirs => {}
            (Some(ours), _) => plan.ignored.push(format!(
                "its unconfirmed tag {tag} (commit {theirs}) contradicts the mirror's tag {tag} (commit {ours}): ignored"
            )),
            (None, Some(kept)) if kept == theirs => plan.unconfirmed.push(tag.to_string()),
            (None, Some(kept)) => plan.ignored.push(format!(
                "its unconfirmed tag {tag} (commit {theirs}) differs from the unconfirmed tag {tag} (commit {kept}) an earlier source brought: ignored"
            )),
            (None, None) => {
                plan.unconfirmed.push(tag.to_string());
                plan.refs.push((name, aside));
            }
        }
    }
    if !moved.is_empty() {
        return Err(crate::exit::bad_input(format!(
            "refusing the source bundle {}: it would move refs of the mirror ({}); a ref that arrives never rewrites one the box holds; nothing was written",
            bundle.display(),
            moved.join("; ")
        )));
    }
    plan.refs.sort();
    plan.unconfirmed.sort();
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::{TagTrust, fetch_bundle};

    /// `git` in `dir`, which must succeed; its stdout.
    fn git(dir: &std::path::Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .expect("git runs");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The refs of the repository at `dir`, sorted.
    fn refs(dir: &std::path::Path) -> Vec<String> {
        let mut refs: Vec<String> = git(dir, &["for-each-ref", "--format=%(refname)"])
            .lines()
            .map(str::to_string)
            .collect();
        refs.sort();
        refs
    }

    /// Commits what is staged in `work` with message `msg`.
    fn commit(work: &std::path::Path, msg: &str) {
        let id = ["-c", "user.name=t", "-c", "user.email=t@t"];
        git(work, &[&id[..], &["commit", "-q", "-m", msg]].concat());
    }

    /// A work repository with one commit tagged `v1.0.0`, its pin ref and
    /// another oracle-build ref: (work dir, head).
    fn work(tmp: &std::path::Path) -> (std::path::PathBuf, String) {
        let work = tmp.join("work");
        std::fs::create_dir_all(&work).unwrap();
        git(&work, &["init", "-q", "-b", "main"]);
        std::fs::write(work.join("f"), "1").unwrap();
        git(&work, &["add", "f"]);
        commit(&work, "one");
        let head = git(&work, &["rev-parse", "HEAD"]).trim().to_string();
        git(&work, &["tag", "v1.0.0"]);
        git(
            &work,
            &[
                "update-ref",
                &format!("refs/oracle-build/pins/{head}"),
                &head,
            ],
        );
        git(&work, &["update-ref", "refs/oracle-build/other", &head]);
        (work, head)
    }

    fn store(tmp: &std::path::Path, name: &str) -> crate::store::Store {
        let store = crate::store::Store::at(&tmp.join(name)).unwrap();
        store.init().unwrap();
        store
    }

    fn confirmed() -> TagTrust {
        TagTrust::Confirmed("test".into())
    }

    #[test]
    fn a_bundle_into_a_store_without_the_mirror_brings_its_tags_and_pins_only() {
        let tmp = tempfile::tempdir().unwrap();
        let (work, head) = work(tmp.path());
        let pin = format!("refs/oracle-build/pins/{head}");
        let bundle = tmp.path().join("src.bundle");
        git(
            &work,
            &["bundle", "create", bundle.to_str().unwrap(), "--all"],
        );
        let store = store(tmp.path(), "store");
        let scratch = tmp.path().join("scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        let got = fetch_bundle(&store, "file:///repo", &bundle, &scratch, &confirmed()).unwrap();
        assert_eq!(got.added, vec![pin.clone(), "refs/tags/v1.0.0".to_string()]);
        assert!(got.unconfirmed.is_empty());
        let mirror = crate::stages::source::mirror_entry(&store, "file:///repo").path;
        // Not the branch, not an oracle-build ref that is not a pin.
        assert_eq!(refs(&mirror), vec![pin.clone(), "refs/tags/v1.0.0".into()]);
        assert!(mirror.join("objects").is_dir());
        assert!(!scratch.join("incoming.git").exists());
        git(&mirror, &["cat-file", "-e", &head]);
        // The same bundle again (a second pull of the pin): nothing added.
        let again = fetch_bundle(&store, "file:///repo", &bundle, &scratch, &confirmed()).unwrap();
        assert!(again.added.is_empty(), "{again:?}");

        // Refused into a new store, naming `why`: no mirror is made.
        let refused = |name: &str, bundle: &std::path::Path, why: &str| {
            let fresh = self::store(tmp.path(), name);
            let err =
                fetch_bundle(&fresh, "file:///repo", bundle, &scratch, &confirmed()).unwrap_err();
            assert!(format!("{err:#}").contains(why), "{err:#}");
            assert!(!crate::stages::source::mirror_entry(&fresh, "file:///repo").exists());
        };

        // A bundle of a branch alone (no tag, no pin ref).
        let branch_only = tmp.path().join("branch.bundle");
        git(
            &work,
            &["bundle", "create", branch_only.to_str().unwrap(), "main"],
        );
        refused("store3", &branch_only, "brings no tag");

        // A pin ref naming another commit.
        git(
            &work,
            &[
                "update-ref",
                &format!("refs/oracle-build/pins/{}", "0".repeat(40)),
                &head,
            ],
        );
        git(
            &work,
            &["bundle", "create", bundle.to_str().unwrap(), "--all"],
        );
        refused("store2", &bundle, "names commit");
    }

    /// Issue 41, item 1: an unconfirmed bundle's tags never become
    /// `refs/tags/` (so no version is computed from them), whether the
    /// mirror is new or not; one that contradicts the mirror's is ignored
    /// instead of stopping the source; a confirmed bundle moving a tag
    /// still is refused.
    #[test]
    fn unconfirmed_tags_are_kept_aside_and_never_describe_a_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let (work, head) = work(tmp.path());
        let pin = format!("refs/oracle-build/pins/{head}");
        let aside = format!("{}v1.0.0", crate::stages::source::UNCONFIRMED_TAGS);
        let bundle = tmp.path().join("src.bundle");
        git(
            &work,
            &["bundle", "create", bundle.to_str().unwrap(), "--all"],
        );
        let scratch = tmp.path().join("scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        let untrusted = TagTrust::Unconfirmed("unsigned".into());

        // A new mirror.
        let a = store(tmp.path(), "a");
        let got = fetch_bundle(&a, "file:///repo", &bundle, &scratch, &untrusted).unwrap();
        assert_eq!(got.unconfirmed, vec!["v1.0.0".to_string()]);
        let mirror = crate::stages::source::mirror_entry(&a, "file:///repo").path;
        assert_eq!(refs(&mirror), vec![pin.clone(), aside.clone()]);
        assert_eq!(crate::stages::source::describe(&mirror, &head), None);
        assert_eq!(
            crate::stages::source::unconfirmed_tags(&mirror, &head),
            vec!["v1.0.0".to_string()]
        );

        // An existing mirror (made from a bundle of the pin ref alone).
        let b = store(tmp.path(), "b");
        let pin_only = tmp.path().join("pin.bundle");
        git(
            &work,
            &["bundle", "create", pin_only.to_str().unwrap(), &pin],
        );
        fetch_bundle(&b, "file:///repo", &pin_only, &scratch, &confirmed()).unwrap();
        let got = fetch_bundle(&b, "file:///repo", &bundle, &scratch, &untrusted).unwrap();
        assert_eq!(got.added, vec![aside.clone()]);
        let mirror = crate::stages::source::mirror_entry(&b, "file:///repo").path;
        assert_eq!(refs(&mirror), vec![pin.clone(), aside.clone()]);
        assert_eq!(crate::stages::source::describe(&mirror, &head), None);

        // The same tag confirmed later (a signed source): a real tag.
        let got = fetch_bundle(&b, "file:///repo", &bundle, &scratch, &confirmed()).unwrap();
        assert_eq!(got.added, vec!["refs/tags/v1.0.0".to_string()]);
        assert_eq!(
            crate::stages::source::describe(&mirror, &head).map(|d| d.tag),
            Some("v1.0.0".to_string())
        );
        assert!(crate::stages::source::unconfirmed_tags(&mirror, &head).is_empty());

        // A tag moved by a later commit: unconfirmed, ignored and said;
        // confirmed, refused with nothing written.
        std::fs::write(work.join("f"), "2").unwrap();
        git(&work, &["add", "f"]);
        commit(&work, "two");
        git(&work, &["tag", "-f", "v1.0.0"]);
        git(
            &work,
            &["bundle", "create", bundle.to_str().unwrap(), "--all"],
        );
        let got = fetch_bundle(&b, "file:///repo", &bundle, &scratch, &untrusted).unwrap();
        assert!(
            got.ignored[0].contains("contradicts the mirror's tag v1.0.0"),
            "{got:?}"
        );
        let err = fetch_bundle(&b, "file:///repo", &bundle, &scratch, &confirmed()).unwrap_err();
        assert!(format!("{err:#}").contains("would move refs"), "{err:#}");
        assert_eq!(
            crate::stages::source::describe(&mirror, &head).map(|d| d.commit),
            Some(head.clone())
        );
    }
}
