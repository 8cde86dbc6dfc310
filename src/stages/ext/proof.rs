//! What a staged git source proves about itself, and the check of one that
//! arrives from elsewhere (a cache, a bundle).
//!
//! At staging, the ext stage records in `ext.json` ([`GitProof`]) the raw
//! commit object of the resolved commit and of every fetched submodule's
//! commit, and the gitlinks it left unfetched. A commit object hashes to
//! its id (git's `commit <len>\0` header) and names its tree, so these few
//! bytes fix the whole tree: [`check_tree`] has git hash the staged files
//! (`git add -A` into a scratch index, `git write-tree`; each submodule's
//! files against its own commit's tree, then replaced by its gitlink) and
//! compares the result with the tree of the recorded commit. Nothing but
//! the files and the recorded objects is read: it runs offline.
//!
//! What the files alone cannot show is that the declaration resolves to
//! that commit. A declaration by a 40-hex commit does itself
//! ([`Received::Pinned`]); a tag or branch is only a claim of the box that
//! staged it ([`Received::Claimed`]), which the reader confirms with its own
//! `git ls-remote` of the repository ([`confirm`]) or refuses.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use fs_err as fs;
use git2::Repository;
use serde::{Deserialize, Serialize};

use super::{ExtRecord, Origin};
use crate::host::git::{Git, Gitlink};
use crate::store::{Store, read_json};

/// What a staged git source records to prove its tree (`ext.json`'s
/// `git`): absent in entries staged before it was recorded, which are then
/// taken from no cache or bundle.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct GitProof {
    /// The raw commit objects (as `git cat-file commit` prints them,
    /// lower-case hex of the bytes) by commit id: the resolved commit's and
    /// every fetched submodule's.
    pub commits: BTreeMap<String, String>,
    /// The gitlinks of the tree left unfetched (`GIT_SUBMODULES ""`), path ->
    /// commit: an empty directory in the staged tree.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unfetched: BTreeMap<String, String>,
}

/// Reads the proof of the checkout at `dir` (its `.git` still there) whose
/// HEAD is `commit`, with the submodules `subs` (path -> commit) fetched:
/// every commit object from the repositories themselves (libgit2), and the
/// gitlinks of each index that were not fetched.
///
/// Errors: a repository or an object cannot be read.
pub fn record(dir: &Path, commit: &str, subs: &BTreeMap<String, String>) -> Result<GitProof> {
    let mut proof = GitProof::default();
    read_repo(dir, "", commit, subs, &mut proof)?;
    Ok(proof)
}

fn read_repo(
    dir: &Path,
    prefix: &str,
    commit: &str,
    subs: &BTreeMap<String, String>,
    proof: &mut GitProof,
) -> Result<()> {
    let repo = Repository::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let odb = repo.odb()?;
    let obj = odb
        .read(git2::Oid::from_str(commit)?)
        .with_context(|| format!("reading commit {commit} in {}", dir.display()))?;
    if obj.kind() != git2::ObjectType::Commit {
        bail!("{commit} in {} is not a commit", dir.display());
    }
    proof
        .commits
        .insert(commit.to_string(), hex::encode(obj.data()));
    let index = repo.index()?;
    for e in index.iter() {
        if e.mode != 0o160000 {
            continue;
        }
        let rel = String::from_utf8_lossy(&e.path).into_owned();
        let path = format!("{prefix}{rel}");
        let id = e.id.to_string();
        match subs.get(&path) {
            Some(c) => read_repo(&dir.join(&rel), &format!("{path}/"), c, subs, proof)?,
            None => {
                proof.unfetched.insert(path, id);
            }
        }
    }
    Ok(())
}

/// What a staged source from elsewhere proved ([`check_received`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    /// Declared by the commit itself, and its files are that commit's tree.
    Pinned,
    /// Its files are the tree of `commit`, which the box that staged it
    /// says `tag` of `repo` resolved to: to be confirmed ([`confirm`]).
    Claimed {
        /// The declared repository.
        repo: String,
        /// The declared tag or branch.
        tag: String,
        /// The commit it claims.
        commit: String,
    },
}

/// Checks the ext entry at `dir`, received from a cache or a bundle for
/// the store entry named `name` (`<name>-<rev>-<h>`), against what it
/// claims: its `ext.json` declares the source that name is made of, and its
/// `src/` is the tree of the commit it records ([`check_tree`]); a
/// declaration by commit must be that commit. `scratch` is a new directory
/// for git's scratch repository (removed afterwards).
///
/// Errors (why it is refused): its record does not read or is for another
/// entry; a URL source (the entry keeps no archive, so its tree cannot be
/// checked: the ext stage fetches it and checks `URL_HASH`); no commit
/// objects recorded (staged by an older oracle-build); the tree differs;
/// the commit is not the declared one; git is not on PATH.
pub fn check_received(dir: &Path, name: &str, scratch: &Path) -> Result<Received> {
    let rec: ExtRecord = read_json(&dir.join("ext.json")).context("its ext.json")?;
    let declared = rec.source.entry_name();
    if declared != name {
        bail!("its ext.json declares the source of entry {declared}, not {name}");
    }
    let Origin::Git { repo, tag } = &rec.source.origin else {
        bail!(
            "it is a URL source, whose staged tree cannot be checked here (no archive is kept to check against URL_HASH)"
        );
    };
    let (commit, _) = check_tree(dir, &rec, scratch)?;
    let is_sha = crate::host::git::is_full_id(tag);
    if is_sha && commit.eq_ignore_ascii_case(tag) {
        return Ok(Received::Pinned);
    }
    if is_sha {
        bail!("it is declared as commit {tag}, but records commit {commit}");
    }
    Ok(Received::Claimed {
        repo: repo.clone(),
        tag: tag.clone(),
        commit,
    })
}

/// Checks that the files of the staged git source at `dir` (its `src/`)
/// are the tree of the commit its record `rec` names: each recorded commit
/// object is hashed by git (it must hash to its id), the staged files are
/// hashed by git with every submodule in place ([`Gitlink`]), and the
/// result must be the tree the commit names. Returns the commit and its
/// tree. `scratch`
/// is a new directory, removed afterwards.
///
/// Errors: git is not on PATH; no commit or proof recorded; a path named
/// `.git` in the tree; a commit object that does not hash to its id or is
/// missing; the files hash to another tree (naming both).
pub fn check_tree(dir: &Path, rec: &ExtRecord, scratch: &Path) -> Result<(String, String)> {
    let git = Git::find().context("checking a staged source's tree needs the git command line")?;
    let commit = rec
        .commit
        .clone()
        .context("its ext.json records no commit")?;
    let proof = rec.git.as_ref().context(
        "its ext.json records no commit objects (staged by an oracle-build that did not record them), so its tree cannot be checked",
    )?;
    let src = dir.join("src");
    no_git_dirs(&src, &src)?;
    let result = (|| {
        let repo = git.scratch_repo(scratch)?;
        let mut trees = BTreeMap::new();
        for (i, (id, hex_bytes)) in proof.commits.iter().enumerate() {
            let bytes = hex::decode(hex_bytes)
                .with_context(|| format!("the recorded commit object {id} is not hex"))?;
            let file = scratch.join(format!("commit-{i}"));
            fs::write(&file, bytes)?;
            let (got, tree) = repo
                .hash_commit(&file)
                .with_context(|| format!("the recorded commit object {id}"))?;
            if !got.eq_ignore_ascii_case(id) {
                bail!("the recorded commit object {id} hashes to {got}");
            }
            trees.insert(id.to_ascii_lowercase(), tree);
        }
        let tree_of = |c: &str| {
            trees
                .get(&c.to_ascii_lowercase())
                .cloned()
                .with_context(|| format!("no commit object is recorded for commit {c}"))
        };
        let want = tree_of(&commit)?;
        let mut links = Vec::new();
        for (path, c) in &rec.submodules {
            links.push(Gitlink {
                path: safe_path(path)?,
                commit: hex_id(c)?,
                tree: Some(tree_of(c)?),
            });
        }
        for (path, c) in &proof.unfetched {
            links.push(Gitlink {
                path: safe_path(path)?,
                commit: hex_id(c)?,
                tree: None,
            });
        }
        let got = repo.tree_of_files(&src, &links)?;
        if got != want {
            bail!("its files hash to git tree {got}, but the tree of commit {commit} is {want}");
        }
        Ok((commit.clone(), want))
    })();
    let _ = fs::remove_dir_all(scratch);
    result
}

/// `path` when it is a plain relative path (`/`-separated, no empty, `.`
/// or `..` component).
fn safe_path(path: &str) -> Result<String> {
    if path.is_empty()
        || path.starts_with('/')
        || path.contains(['\0', '\n'])
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        bail!("its record names the submodule path {path:?}");
    }
    Ok(path.to_string())
}

/// `id` when it is a 40-hex commit id.
fn hex_id(id: &str) -> Result<String> {
    if id.len() != 40 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("its record names the submodule commit {id:?}");
    }
    Ok(id.to_ascii_lowercase())
}

/// Errors on a file or directory named `.git` (any case) under `dir`: a
/// git tree holds none, and git would read one as a repository.
fn no_git_dirs(base: &Path, dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let p = e.path();
        if e.file_name().to_string_lossy().eq_ignore_ascii_case(".git") {
            bail!(
                "its tree holds {}, which no git tree does",
                p.strip_prefix(base).unwrap_or(&p).display()
            );
        }
        if e.file_type()?.is_dir() {
            no_git_dirs(base, &p)?;
        }
    }
    Ok(())
}

/// Confirms, with this box's own `git ls-remote` of `repo` (through the
/// site's `[[mirror]]` tables of `store`), that `tag` names `commit` there
/// now.
///
/// Errors: the repository cannot be listed (unreachable, mapped to
/// `none`); it has no such tag or branch; it names another commit; git is
/// not on PATH.
pub fn confirm(store: &Store, repo: &str, tag: &str, commit: &str) -> Result<()> {
    let git = Git::find().context("confirming a tag needs the git command line")?;
    let mirrors = crate::host::mirror::load(store.root())?;
    let from = mirrors.git_url(repo, &format!("the tag {tag} of {repo}"))?;
    match git.remote_commit(&from, tag)? {
        Some(c) if c.eq_ignore_ascii_case(commit) => Ok(()),
        Some(c) => bail!("{from} has {tag} at commit {c}, not the recorded {commit}"),
        None => bail!("{from} has no tag or branch {tag}"),
    }
}

/// What [`check_staged`] found of a staged source a wheel was built with.
#[derive(Debug, Clone, PartialEq)]
pub enum Staged {
    /// Its files are the tree `tree` of `commit`, the commit the wheel's
    /// key names (and, for a declaration by commit, that commit).
    Checked {
        /// The commit.
        commit: String,
        /// Its tree, computed from the files.
        tree: String,
    },
    /// Not checkable: why (a URL source; an entry staged before commit
    /// objects were recorded).
    Unchecked(String),
    /// This store does not hold the entry.
    Absent,
}

/// Checks the staged source `keyed` (an item of a wheel's `inputs.ext`)
/// in `store` against the commit the wheel's key names: the entry records
/// that commit, and its files are that commit's tree ([`check_tree`]). For
/// `verify --deep` and the bill of materials. `scratch`: a new directory.
///
/// Errors: the entry's record cannot be read; it records another commit
/// than the key; its files are not the commit's tree; a declaration by
/// commit records another.
pub fn check_staged(store: &Store, keyed: &super::KeyedSource, scratch: &Path) -> Result<Staged> {
    let e = keyed.entry(store);
    if !e.exists() {
        return Ok(Staged::Absent);
    }
    let rec: ExtRecord = read_json(&e.path.join("ext.json"))?;
    let Origin::Git { tag, .. } = &rec.source.origin else {
        return Ok(Staged::Unchecked(
            "a URL source (its archive was checked against URL_HASH when staged)".into(),
        ));
    };
    if rec.commit != keyed.commit {
        bail!(
            "{} records commit {}, the wheel was built with {}",
            e.label(),
            rec.commit.as_deref().unwrap_or("none"),
            keyed.commit.as_deref().unwrap_or("none")
        );
    }
    if rec.git.is_none() {
        return Ok(Staged::Unchecked(
            "staged before oracle-build recorded commit objects (stage it again to check it: remove the entry and build online)".into(),
        ));
    }
    let (commit, tree) = check_tree(&e.path, &rec, scratch).with_context(|| e.label())?;
    let is_sha = crate::host::git::is_full_id(tag);
    if is_sha && !commit.eq_ignore_ascii_case(tag) {
        bail!(
            "{} is declared as commit {tag} but records {commit}",
            e.label()
        );
    }
    Ok(Staged::Checked { commit, tree })
}
