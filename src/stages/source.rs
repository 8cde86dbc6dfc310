//! Stage 1, source: a bare mirror with full history, then a read-only checkout
//! of exactly the pinned commit.
//!
//! Full history matters: setuptools-scm derives `<package>.__version__` from
//! the last reachable tag (`0.23.1rc1.dev1511+g555967922`); a shallow clone
//! yields `0.1.dev1+g...` (setuptools-scm's fallback version, see its docs "Version number construction").

use anyhow::{Context, Result, bail};
use git2::{AutotagOption, FetchOptions, RemoteCallbacks, Repository};
use sha2::{Digest, Sha256};
use std::path::Path;

use crate::exit::bad_input;
use crate::host::git::Git;
use crate::progress::{self, Progress};
use crate::recipe::MovedTags;
use crate::store::{Bucket, Entry, Store};

pub mod history;

/// Refspecs a mirror fetches: every branch and tag, kept under their own names.
const MIRROR_REFSPECS: &[&str] = &["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"];

/// The store key of a repository URL: a readable tail plus 8 hex of its sha256,
/// e.g. `github.com-vllm-project-vllm-1a2b3c4d`.
pub fn repo_key(url: &str) -> String {
    let norm = url.trim().trim_end_matches('/').trim_end_matches(".git");
    let tail: String = norm
        .rsplit("://")
        .next()
        .unwrap_or(norm)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let tail = tail.trim_matches('-');
    let tail: String = tail[tail.len().saturating_sub(48)..].to_string();
    let digest = hex::encode(Sha256::digest(norm.as_bytes()));
    format!("{}-{}", tail.trim_start_matches('-'), &digest[..8])
}

/// The mirror entry of `url`: `store/git/<repo-key>.git`.
pub fn mirror_entry(store: &Store, url: &str) -> Entry {
    store.entry(Bucket::Git, &format!("{}.git", repo_key(url)))
}

/// The checkout entry of `commit`: `store/src/<commit>`.
pub fn checkout_entry(store: &Store, commit: &str) -> Entry {
    store.entry(Bucket::Src, commit)
}

/// Whether the mirror of `url` exists and holds `commit`: its pin ref
/// ([`pin_ref_holds`]) says so, else the repository is asked.
pub fn mirror_has(store: &Store, url: &str, commit: &str) -> bool {
    let entry = mirror_entry(store, url);
    pin_ref_holds(&entry.path, commit)
        || (entry.exists() && Backend::find().has_commit(&entry.path, commit))
}

/// Whether a cache's (or a bundle's) source of `commit` of `url` is still
/// wanted by a store: its mirror lacks the commit, or holds tags reaching
/// it that a cache or bundle brought unsigned ([`unconfirmed_tags`]),
/// which a source whose tags trusted builders signed confirms (issue 42:
/// an untrusted bundle imported first must not make a team's signed
/// source, and the wheel built from its tags, unreachable).
pub fn source_wanted(store: &Store, url: &str, commit: &str) -> bool {
    !mirror_has(store, url, commit)
        || !unconfirmed_tags(&mirror_entry(store, url).path, commit).is_empty()
}

/// How the source stage works on repositories: the git command line when it
/// is on PATH (faster for fetches and checkouts, see [`crate::host::git`]),
/// else libgit2. Reads of history (tags, ranges, resolving) always use libgit2.
enum Backend {
    /// `git` on PATH.
    Cli(Git),
    /// No `git`: libgit2 does everything.
    Libgit2,
}

impl Backend {
    /// The git command line if it is on PATH, else libgit2.
    fn find() -> Backend {
        Git::find().map_or(Backend::Libgit2, Backend::Cli)
    }

    /// [`Backend::find`] for steps that talk to a repository: under the
    /// `[git]` timeouts of the store's `config.toml`
    /// ([`crate::host::git_timeouts`]), given to git or set in libgit2.
    ///
    /// Errors: exit 2 for a bad `[git]` table.
    fn for_network(store: &Store) -> Result<Backend> {
        let timeouts = crate::host::git_timeouts::load(store.root())?;
        Ok(match Git::find() {
            Some(git) => Backend::Cli(git.with_timeouts(timeouts)),
            None => {
                timeouts.apply_to_libgit2()?;
                Backend::Libgit2
            }
        })
    }

    /// Whether the repository at `dir` holds the commit `commit`.
    fn has_commit(&self, dir: &Path, commit: &str) -> bool {
        match self {
            Backend::Cli(git) => git.has_commit(dir, commit),
            Backend::Libgit2 => Repository::open(dir)
                .ok()
                .zip(git2::Oid::from_str(commit).ok())
                .is_some_and(|(r, oid)| r.find_commit(oid).is_ok()),
        }
    }

    /// Whether a branch or tag of the repository at `dir` reaches `commit`.
    fn reached_by_branch_or_tag(&self, dir: &Path, commit: &str) -> bool {
        match self {
            Backend::Cli(git) => git.reached_from(dir, commit, &["refs/heads/", "refs/tags/"]),
            Backend::Libgit2 => Repository::open(dir)
                .ok()
                .zip(git2::Oid::from_str(commit).ok())
                .is_some_and(|(r, oid)| reached_by_branch_or_tag(&r, oid)),
        }
    }

    /// Fetches `refspecs` of `url` into the repository at `dir`, with every tag.
    fn fetch(&self, dir: &Path, url: &str, refspecs: &[&str]) -> Result<()> {
        match self {
            Backend::Cli(git) => git.fetch(dir, url, refspecs),
            Backend::Libgit2 => {
                let repo = Repository::open_bare(dir)
                    .with_context(|| format!("opening mirror {}", dir.display()))?;
                fetch(&repo, url, refspecs)
            }
        }
    }

    /// [`Backend::fetch`], removing the branches and tags the repository
    /// no longer has (`git fetch --prune`): a refresh of a mirror, whose
    /// tags follow the repository's.
    fn fetch_pruning(&self, dir: &Path, url: &str, refspecs: &[&str]) -> Result<()> {
        match self {
            Backend::Cli(git) => git.fetch_pruning(dir, url, refspecs),
            Backend::Libgit2 => {
                let repo = Repository::open_bare(dir)
                    .with_context(|| format!("opening mirror {}", dir.display()))?;
                fetch_with(&repo, url, refspecs, true)
            }
        }
    }

    /// The branches and tags of the repository `url`: full ref name and
    /// the object it names.
    fn list_remote(&self, url: &str) -> Result<Vec<(String, String)>> {
        match self {
            Backend::Cli(git) => git.list_remote(url),
            Backend::Libgit2 => {
                let mut remote = git2::Remote::create_detached(url)
                    .with_context(|| format!("invalid repository URL {url}"))?;
                remote
                    .connect(git2::Direction::Fetch)
                    .map_err(|e| anyhow::anyhow!("listing the refs of {url}: {}", e.message()))?;
                let refs = remote
                    .list()
                    .map_err(|e| anyhow::anyhow!("listing the refs of {url}: {}", e.message()))?
                    .iter()
                    .filter(|h| {
                        let n = h.name();
                        (n.starts_with("refs/heads/") || n.starts_with("refs/tags/"))
                            && !n.ends_with("^{}")
                    })
                    .map(|h| (h.name().to_string(), h.oid().to_string()))
                    .collect();
                let _ = remote.disconnect();
                Ok(refs)
            }
        }
    }

    /// Points the ref `name` of the repository at `dir` at `commit`.
    fn write_ref(&self, dir: &Path, name: &str, commit: &str) -> Result<()> {
        match self {
            Backend::Cli(git) => git.update_ref(dir, name, commit),
            Backend::Libgit2 => {
                let repo = Repository::open_bare(dir)
                    .with_context(|| format!("opening mirror {}", dir.display()))?;
                let oid = git2::Oid::from_str(commit)?;
                if repo.find_reference(name).ok().and_then(|r| r.target()) == Some(oid) {
                    return Ok(());
                }
                repo.reference(name, oid, true, "oracle-build: pinned commit")
                    .with_context(|| format!("writing {name} in {}", dir.display()))?;
                Ok(())
            }
        }
    }

    /// The tag `git describe --tags --match '*[0-9]*'` finds for `commit`
    /// in the repository at `dir` (the pattern setuptools-scm describes
    /// with), and the commit it names; `None` when no such tag reaches it.
    fn describe(&self, dir: &Path, commit: &str) -> Option<Describe> {
        match self {
            Backend::Cli(git) => {
                let (tag, target) = git.describe(dir, commit, DESCRIBE_MATCH)?;
                Some(Describe {
                    tag,
                    commit: target,
                })
            }
            Backend::Libgit2 => {
                let repo = Repository::open(dir).ok()?;
                let obj = repo
                    .find_commit(git2::Oid::from_str(commit).ok()?)
                    .ok()?
                    .into_object();
                let mut opts = git2::DescribeOptions::new();
                opts.describe_tags().pattern(DESCRIBE_MATCH);
                let d = obj.describe(&opts).ok()?;
                let mut fmt = git2::DescribeFormatOptions::new();
                fmt.abbreviated_size(0);
                let tag = d.format(Some(&fmt)).ok()?;
                let target = repo
                    .find_reference(&format!("refs/tags/{tag}"))
                    .ok()?
                    .peel_to_commit()
                    .ok()?
                    .id()
                    .to_string();
                Some(Describe {
                    tag,
                    commit: target,
                })
            }
        }
    }

    /// Makes the tags of the work tree `tree` (a copy of a checkout) exactly
    /// the tags of the mirror at `mirror`: a local fetch of
    /// `+refs/tags/*:refs/tags/*` with pruning.
    fn sync_tags(&self, tree: &Path, mirror: &Path) -> Result<()> {
        match self {
            Backend::Cli(git) => git.sync_tags(tree, mirror),
            Backend::Libgit2 => {
                let repo = Repository::open(tree)
                    .with_context(|| format!("opening {}", tree.display()))?;
                let mut opts = FetchOptions::new();
                opts.prune(git2::FetchPrune::On);
                opts.download_tags(AutotagOption::None);
                let url = mirror.to_string_lossy().into_owned();
                repo.remote_anonymous(&url)?
                    .fetch(&["+refs/tags/*:refs/tags/*"], Some(&mut opts), None)
                    .map_err(|e| anyhow::anyhow!("fetching the tags of {url}: {}", e.message()))?;
                Ok(())
            }
        }
    }

    /// Creates the bare mirror `dir` of `url` (remote `origin`, [`MIRROR_REFSPECS`]).
    fn init_mirror(&self, dir: &Path, url: &str) -> Result<()> {
        match self {
            Backend::Cli(git) => git.init_mirror(dir, url, MIRROR_REFSPECS),
            Backend::Libgit2 => {
                let repo = Repository::init_bare(dir)
                    .with_context(|| format!("creating mirror {}", dir.display()))?;
                repo.remote_with_fetch("origin", url, MIRROR_REFSPECS[0])?;
                repo.remote_add_fetch("origin", MIRROR_REFSPECS[1])?;
                Ok(())
            }
        }
    }
}

/// The URL the mirror of the recipe's repository `url` is fetched from:
/// `url` through the site's `[[mirror]]` tables
/// ([`crate::host::mirror::Mirrors::git_url`]). The mirror entry, the
/// checkout and every key keep `url`.
///
/// Errors: exit 2 for a bad `config.toml` or a mirror of `url` that is `none`.
pub fn origin_url(store: &Store, url: &str) -> Result<String> {
    crate::host::mirror::load(store.root())?.git_url(url, "the recipe's repository")
}

/// Checks that `url` answers (a connect and ref listing) through the
/// backend the fetch will use: the git command line (`git ls-remote`, every
/// transport git reads, dumb HTTP included) when it is on PATH, else
/// libgit2; each step within the `connect_timeout` of the store's `[git]`
/// table (a repository that accepts and never answers is not waited for).
///
/// Errors: a bad `[git]` table (exit 2); the repository cannot be reached
/// or did not answer in time (the message names the repository, and the
/// limit when it ran out).
pub fn check_reachable(store: &Store, url: &str) -> Result<()> {
    let t = crate::host::git_timeouts::load(store.root())?;
    let check = crate::host::git_timeouts::GitTimeouts {
        read: t.connect,
        ..t.clone()
    };
    if let Backend::Cli(git) = Backend::find() {
        return git.with_timeouts(check).ls_remote(url).map_err(|e| {
            anyhow::anyhow!("repository {url} cannot be reached: {}", first_line_of(&e))
        });
    }
    check.apply_to_libgit2()?;
    let mut remote = git2::Remote::create_detached(url)
        .with_context(|| format!("invalid repository URL {url}"))?;
    remote.connect(git2::Direction::Fetch).map_err(|e| {
        let limit = if e.code() == git2::ErrorCode::Timeout {
            format!(
                " (no answer within connect_timeout {}, set by {})",
                crate::host::git_timeouts::show(t.connect),
                t.hint("connect_timeout")
            )
        } else {
            String::new()
        };
        anyhow::anyhow!("repository {url} cannot be reached: {}{limit}", e.message())
    })?;
    let _ = remote.disconnect();
    Ok(())
}

/// The last line of `e`'s message with its causes that says something
/// (git's own error), for a one-line problem.
fn first_line_of(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default()
        .to_string()
}

/// Ensures the mirror of `url` holds `commit`, fetching what is new.
///
/// The first fetch creates the mirror in staging and renames it into place;
/// later fetches add objects to it (git writes objects and refs atomically).
/// When the branches and tags do not reach `commit`, it is fetched by id
/// into `refs/oracle-build/pins/<commit>`.
///
/// Errors: `offline` and the commit is not mirrored; the network fails (names
/// the repository); the repository does not have the commit (exit 2, names both).
pub fn ensure_mirror(store: &Store, url: &str, commit: &str, offline: bool) -> Result<Entry> {
    ensure_mirror_fetched(store, url, commit, offline).map(|(e, _)| e)
}

/// Whether this run fetched the branches and tags of the repository into
/// the mirror ([`ensure_mirror_fetched`]): only then do the mirror's
/// branches say which of them reach a commit (a mirror made from a bundle
/// or a cache has none, and older ones may lag behind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// The branches and tags were fetched from the repository now.
    Now,
    /// Not fetched now (`--offline`, a read-only store, or the repository
    /// did not answer a refresh: the reason is on stderr).
    Not,
}

/// [`ensure_mirror`], and whether the branches and tags were fetched from
/// the repository now. Online, a mirror that already holds `commit` is
/// refreshed too (every branch and tag: a tag made upstream after the
/// mirror was fetched changes the version the history gives); a refresh
/// that fails is said on stderr and the mirror is used as it is. A tag
/// moved upstream is followed ([`ensure_mirror_refreshed`] with
/// [`MovedTags::Follow`]).
///
/// Errors: as [`ensure_mirror`].
pub fn ensure_mirror_fetched(
    store: &Store,
    url: &str,
    commit: &str,
    offline: bool,
) -> Result<(Entry, Fetched)> {
    ensure_mirror_refreshed(store, url, commit, offline, MovedTags::Follow)
        .map(|r| (r.entry, r.fetched))
}

/// One tag an online refresh moved or deleted in the mirror.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TagMove {
    /// The tag's name (`v0.1.0`).
    pub tag: String,
    /// The commit it named before the refresh.
    pub from: String,
    /// The commit it names now; `None`: deleted upstream.
    pub to: Option<String>,
}

impl std::fmt::Display for TagMove {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.to {
            Some(to) => write!(
                f,
                "tag {} moved upstream from commit {} to {to}",
                self.tag, self.from
            ),
            None => write!(
                f,
                "tag {} (commit {}) was deleted upstream",
                self.tag, self.from
            ),
        }
    }
}

/// What [`ensure_mirror_refreshed`] did.
#[derive(Debug, Clone)]
pub struct Refreshed {
    /// The mirror.
    pub entry: Entry,
    /// Whether its branches and tags were fetched from the repository now.
    pub fetched: Fetched,
    /// The tags the refresh moved or deleted (empty when none, or not refreshed).
    pub moved: Vec<TagMove>,
}

/// [`ensure_mirror_fetched`], with `moved_tags` deciding what happens when
/// the refresh moves or deletes a tag the mirror had and that changes the
/// version `commit`'s history gives (the tag `git describe` finds, or its
/// commit, is another): [`MovedTags::Follow`] keeps the repository's
/// tags; [`MovedTags::Refuse`] puts the moved and deleted tags back where
/// they were (the refs as they were, annotated tags included) and fails.
/// A move that leaves `commit`'s version as it was is followed either way.
/// Every move is said on stderr, and returned.
///
/// Errors: as [`ensure_mirror`]; with `refuse`, a move that changes the
/// version (exit 3, naming each tag, both commits and both versions, and
/// the recipe field).
pub fn ensure_mirror_refreshed(
    store: &Store,
    url: &str,
    commit: &str,
    offline: bool,
    moved_tags: MovedTags,
) -> Result<Refreshed> {
    let entry = mirror_entry(store, url);
    let _lock = entry.lock()?;
    // Fetched from the site's mirror of `url`, kept under `url`'s entry.
    let from = origin_url(store, url)?;
    let from = from.as_str();
    if mirror_has(store, url, commit) {
        keep_pin(&entry.path, commit)?;
        // A read-only store is served as it is (nothing may be written).
        if offline || store.read_only() {
            return Ok(Refreshed {
                entry,
                fetched: Fetched::Not,
                moved: Vec::new(),
            });
        }
        let backend = Backend::for_network(store)?;
        progress::stage(
            "source",
            format!(
                "refreshing the tags and branches of {url}{} in {}",
                via(url, from),
                entry.label()
            ),
        );
        let before = tag_commits(&entry.path);
        let refs_before = tag_refs(&entry.path);
        let history_before = history::of(&entry.path, commit);
        let refreshed = backend
            .fetch_pruning(&entry.path, from, MIRROR_REFSPECS)
            .or_else(|e| fetch_ref_by_ref(&backend, &entry.path, url, from, true, e));
        if let Err(e) = refreshed {
            progress::stage(
                "source",
                format!(
                    "warning: the tags and branches of {url} were not refreshed ({e:#}); using the mirror's as they are"
                ),
            );
            return Ok(Refreshed {
                entry,
                fetched: Fetched::Not,
                moved: Vec::new(),
            });
        }
        // The repository has said which tags exist: what a source
        // from elsewhere brought unconfirmed is no longer needed.
        drop_unconfirmed(&entry.path, None)?;
        let after = tag_commits(&entry.path);
        for change in tag_changes(&before, &after) {
            progress::stage("source", format!("{url}: {change}"));
        }
        let moved = tag_moves(&before, &after);
        if moved_tags == MovedTags::Refuse && !moved.is_empty() {
            let history_after = history::of(&entry.path, commit);
            let was = history_before.as_ref().map(|h| &h.describe);
            if history_after.as_ref().map(|h| &h.describe) != was {
                for m in &moved {
                    if let Some(raw) = refs_before.get(&m.tag) {
                        backend.write_ref(&entry.path, &format!("refs/tags/{}", m.tag), raw)?;
                    }
                }
                let gives = |h: Option<history::History>| {
                    h.map_or("(unknown)".to_string(), |h| {
                        format!("{} ({})", h.gives(), h.from())
                    })
                };
                return Err(crate::exit::mismatch(format!(
                    "{}: this changes the version of commit {commit} from {} to {}; the recipe says `source.moved_tags: refuse`, so the mirror keeps {} as {} and nothing was built (to take the move, set `moved_tags: follow` under `source:`)",
                    moved
                        .iter()
                        .map(|m| format!("{url}: {m}"))
                        .collect::<Vec<_>>()
                        .join("; "),
                    gives(history_before),
                    gives(history_after),
                    if moved.len() == 1 {
                        "that tag"
                    } else {
                        "those tags"
                    },
                    if moved.len() == 1 {
                        "it was"
                    } else {
                        "they were"
                    },
                )));
            }
        }
        return Ok(Refreshed {
            entry,
            fetched: Fetched::Now,
            moved,
        });
    }
    if offline {
        bail!(
            "--offline: commit {commit} of {url} is not in the mirror {}",
            entry.path.display()
        );
    }
    let backend = Backend::for_network(store)?;
    with_mirror(store, &entry, url, &backend, |dir| {
        backend
            .fetch(dir, from, MIRROR_REFSPECS)
            .or_else(|e| fetch_ref_by_ref(&backend, dir, url, from, false, e))?;
        if !backend.reached_by_branch_or_tag(dir, commit) {
            // A fork-only commit: GitHub keeps pull requests under refs/pull/*.
            let _ = backend.fetch(dir, from, &[PULL_REFSPEC]);
        }
        if backend.has_commit(dir, commit) {
            return Ok(());
        }
        let spec = format!("+{commit}:{PIN_REFS}{commit}");
        let _ = backend.fetch(dir, from, &[spec.as_str()]);
        if !backend.has_commit(dir, commit) {
            return Err(bad_input(format!(
                "repository {url}{} does not have commit {commit} (fetched all branches, tags and pull requests, and asked for the commit by id)",
                via(url, from)
            )));
        }
        Ok(())
    })?;
    keep_pin(&entry.path, commit)?;
    Ok(Refreshed {
        entry,
        fetched: Fetched::Now,
        moved: Vec::new(),
    })
}

/// When one fetch of every branch and tag of `from` (the repository `url`,
/// or its site mirror) into the repository at `dir` failed with `first`:
/// fetches them again in halves, down to single refs, so that a ref the
/// repository cannot send (a fork's branch whose history misses an object:
/// `remote: fatal: unable to read <id>`) costs only that ref. Each ref left
/// out is warned about on stderr with git's reason; with `prune`, the
/// branches and tags of `dir` the repository no longer lists are removed
/// (as `git fetch --prune`). About two fetches per bad ref for each
/// halving of the ref list.
///
/// Errors: `first` when this cannot help: it was a `[git]` timeout, the
/// repository's refs cannot be listed, or no ref could be fetched.
fn fetch_ref_by_ref(
    backend: &Backend,
    dir: &Path,
    url: &str,
    from: &str,
    prune: bool,
    first: anyhow::Error,
) -> Result<()> {
    if crate::host::git::timed_out(&first) {
        return Err(first);
    }
    let Ok(listed) = backend.list_remote(from) else {
        return Err(first);
    };
    let names: Vec<String> = listed.iter().map(|(n, _)| n.clone()).collect();
    if names.is_empty() {
        return Err(first);
    }
    progress::stage(
        "source",
        format!(
            "fetching every branch and tag of {url}{} at once failed ({}); fetching them in parts",
            via(url, from),
            git_reason(&first)
        ),
    );
    let left_out = fetch_halves(backend, dir, from, &names);
    if left_out.len() == names.len() {
        return Err(first);
    }
    for (name, why) in &left_out {
        progress::stage(
            "source",
            format!(
                "warning: {name} of {url}{} cannot be fetched ({why}): left out of the mirror; the other {} branches and tags were fetched",
                via(url, from),
                names.len() - left_out.len()
            ),
        );
    }
    if prune {
        let repo = Repository::open_bare(dir)
            .with_context(|| format!("opening mirror {}", dir.display()))?;
        for glob in ["refs/heads/*", "refs/tags/*"] {
            for mut r in repo.references_glob(glob)?.flatten() {
                let name = r.name().unwrap_or_default().to_string();
                if !names.contains(&name) {
                    r.delete()
                        .with_context(|| format!("deleting {name} in {}", dir.display()))?;
                }
            }
        }
    }
    Ok(())
}

/// Fetches the refs `names` of `from` into `dir` (each under its own
/// name), halving the list while a fetch fails; returns the refs that
/// failed alone, with the first line of git's reason. A timeout ends the
/// halving: every ref of that part is returned.
fn fetch_halves(
    backend: &Backend,
    dir: &Path,
    from: &str,
    names: &[String],
) -> Vec<(String, String)> {
    let specs: Vec<String> = names.iter().map(|n| format!("+{n}:{n}")).collect();
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    match backend.fetch(dir, from, &specs) {
        Ok(()) => Vec::new(),
        Err(e) if names.len() == 1 || crate::host::git::timed_out(&e) => {
            let why = git_reason(&e);
            names.iter().map(|n| (n.clone(), why.clone())).collect()
        }
        Err(_) => {
            let (a, b) = names.split_at(names.len() / 2);
            let mut out = fetch_halves(backend, dir, from, a);
            out.extend(fetch_halves(backend, dir, from, b));
            out
        }
    }
}

/// The line of a failed git step's error `e` that says why: the
/// repository's own first `remote: fatal:` line (`remote: fatal: unable to
/// read <id>`), else git's first `fatal:` line, else the first line git
/// printed ([`crate::host::process::failure_line`]).
fn git_reason(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    let first = |needle: &str| {
        text.lines()
            .map(str::trim)
            .find(|l| l.contains(needle))
            .map(str::to_string)
    };
    first("remote: fatal:")
        .or_else(|| first("fatal:"))
        .unwrap_or_else(|| crate::host::process::failure_line(e))
}

/// ` (through <from>)` when the URL fetched is not `url`, for messages.
fn via(url: &str, from: &str) -> String {
    if url == from {
        String::new()
    } else {
        format!(" (through {from})")
    }
}

/// The pattern of the tags a version comes from: setuptools-scm describes
/// with `git describe --dirty --tags --long --match *[0-9]*` (its
/// `DEFAULT_DESCRIBE`), so only tags holding a digit count.
pub const DESCRIBE_MATCH: &str = "*[0-9]*";

/// The tag the version of a commit's history comes from: the nearest tag
/// `git describe --tags --match '*[0-9]*'` finds, and the commit it names.
/// With the commit, it fixes the version setuptools-scm derives (the
/// distance and `+g<sha>` follow from the two commits): an input of the
/// wheel key, recorded in `build.json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Describe {
    /// The tag's name (`v0.2.0`).
    pub tag: String,
    /// The commit it names (peeled).
    pub commit: String,
}

impl std::fmt::Display for Describe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tag {} at {}", self.tag, self.commit)
    }
}

/// The [`Describe`] of `commit` in the repository at `dir` (the mirror),
/// by git's command line when on PATH, else libgit2; `None` when no tag
/// holding a digit reaches it (or the repository lacks the commit).
pub fn describe(dir: &Path, commit: &str) -> Option<Describe> {
    Backend::find().describe(dir, commit)
}

/// Makes the tags of the work tree `tree` (a writable copy of a checkout)
/// the tags of the mirror at `mirror` now, so the version tool run in it
/// sees the tags the wheel key was computed from (a checkout keeps the
/// tags of the day it was made).
///
/// Errors: the local fetch fails.
pub fn sync_tags(tree: &Path, mirror: &Path) -> Result<()> {
    Backend::find().sync_tags(tree, mirror)
}

/// The refs under which every pinned commit is kept in its mirror:
/// `refs/oracle-build/pins/<sha>`, so `git gc --prune=now` never drops one.
pub const PIN_REFS: &str = "refs/oracle-build/pins/";

/// Where a mirror keeps the tags a source from elsewhere (a cache's source
/// artifact, a bundle) brought without confirmation (issue 41):
/// `refs/oracle-build/unconfirmed/tags/<name>`. Neither `git describe` nor
/// a checkout reads them (both read `refs/tags/` only), so no version comes
/// from them; a refresh from the repository removes them
/// ([`drop_unconfirmed`]), and a source whose tags trusted builders signed
/// writes them as `refs/tags/`.
pub const UNCONFIRMED_TAGS: &str = "refs/oracle-build/unconfirmed/tags/";

/// The unconfirmed tags ([`UNCONFIRMED_TAGS`]) of the mirror at `mirror`
/// that name `commit` or one of its ancestors and that no tag of the same
/// name confirms: the tags that would change the version `commit` is given
/// if they were trusted. Sorted; empty when the mirror cannot be read.
pub fn unconfirmed_tags(mirror: &Path, commit: &str) -> Vec<String> {
    let (Ok(repo), Ok(oid)) = (Repository::open_bare(mirror), git2::Oid::from_str(commit)) else {
        return Vec::new();
    };
    let Ok(refs) = repo.references_glob(&format!("{UNCONFIRMED_TAGS}*")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for r in refs.flatten() {
        let (Some(name), Ok(tip)) = (r.name(), r.peel_to_commit()) else {
            continue;
        };
        let tag = name.trim_start_matches(UNCONFIRMED_TAGS).to_string();
        if repo.find_reference(&format!("refs/tags/{tag}")).is_ok() {
            continue;
        }
        if tip.id() == oid || repo.graph_descendant_of(oid, tip.id()).unwrap_or(false) {
            out.push(tag);
        }
    }
    out.sort();
    out
}

/// Removes unconfirmed tags ([`UNCONFIRMED_TAGS`]) from the mirror at
/// `mirror` (callers hold its lock): those named in `only`, else all (a
/// refresh from the repository has just said which tags exist).
///
/// Errors: the mirror cannot be opened or a ref cannot be deleted.
pub fn drop_unconfirmed(mirror: &Path, only: Option<&[String]>) -> Result<()> {
    let repo = Repository::open_bare(mirror)
        .with_context(|| format!("opening mirror {}", mirror.display()))?;
    for mut r in repo
        .references_glob(&format!("{UNCONFIRMED_TAGS}*"))?
        .flatten()
    {
        let tag = r
            .name()
            .unwrap_or_default()
            .trim_start_matches(UNCONFIRMED_TAGS);
        if only.is_none_or(|names| names.iter().any(|n| n == tag)) {
            r.delete()
                .with_context(|| format!("deleting a ref of {}", mirror.display()))?;
        }
    }
    Ok(())
}

/// Every tag of the repository at `dir` with the commit it names (peeled);
/// empty when it cannot be read.
fn tag_commits(dir: &Path) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(repo) = Repository::open_bare(dir) else {
        return out;
    };
    if let Ok(refs) = repo.references_glob("refs/tags/*") {
        for r in refs.flatten() {
            if let (Some(name), Ok(c)) = (r.name(), r.peel_to_commit()) {
                out.insert(
                    name.trim_start_matches("refs/tags/").to_string(),
                    c.id().to_string(),
                );
            }
        }
    }
    out
}

/// Every tag ref of the bare repository at `dir` with the object it names
/// as it is (an annotated tag's tag object): what [`ensure_mirror_refreshed`]
/// puts back. Empty when it cannot be read.
fn tag_refs(dir: &Path) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(repo) = Repository::open_bare(dir) else {
        return out;
    };
    if let Ok(refs) = repo.references_glob("refs/tags/*") {
        for r in refs.flatten() {
            if let (Some(name), Some(id)) = (r.name(), r.target()) {
                out.insert(
                    name.trim_start_matches("refs/tags/").to_string(),
                    id.to_string(),
                );
            }
        }
    }
    out
}

/// The tags of `before` (tag -> commit) that `after` names another commit
/// or lacks.
pub fn tag_moves(
    before: &std::collections::BTreeMap<String, String>,
    after: &std::collections::BTreeMap<String, String>,
) -> Vec<TagMove> {
    before
        .iter()
        .filter(|(tag, old)| after.get(*tag) != Some(*old))
        .map(|(tag, old)| TagMove {
            tag: tag.clone(),
            from: old.clone(),
            to: after.get(tag).cloned(),
        })
        .collect()
}

/// What a refresh changed of the mirror's tags, for the source stage's
/// report: tags moved to another commit and tags deleted upstream (both
/// can change the version a commit is given), each named with its commits.
pub fn tag_changes(
    before: &std::collections::BTreeMap<String, String>,
    after: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (tag, old) in before {
        match after.get(tag) {
            Some(new) if new != old => out.push(format!(
                "tag {tag} moved upstream from commit {old} to {new}"
            )),
            Some(_) => {}
            None => out.push(format!(
                "tag {tag} (commit {old}) was deleted upstream: dropped from the mirror"
            )),
        }
    }
    out
}

/// Pull-request refs (GitHub: `refs/pull/<n>/head`), fetched when the
/// branches and tags do not reach a pinned commit.
const PULL_REFSPEC: &str = "+refs/pull/*:refs/pull/*";

/// Whether a branch or tag of `repo` reaches `oid`.
fn reached_by_branch_or_tag(repo: &Repository, oid: git2::Oid) -> bool {
    let Ok(refs) = repo.references() else {
        return false;
    };
    refs.flatten().any(|r| {
        let named = r
            .name()
            .is_some_and(|n| n.starts_with("refs/heads/") || n.starts_with("refs/tags/"));
        named
            && r.peel_to_commit().is_ok_and(|tip| {
                tip.id() == oid || repo.graph_descendant_of(tip.id(), oid).unwrap_or(false)
            })
    })
}

/// Points `refs/oracle-build/pins/<commit>` of the bare mirror at `mirror`
/// at `commit` (callers hold the mirror's lock).
///
/// Errors: the mirror cannot be opened, lacks the commit, or the ref cannot be written.
pub fn keep_pin(mirror: &std::path::Path, commit: &str) -> Result<()> {
    if pin_ref_holds(mirror, commit) {
        return Ok(());
    }
    Backend::find().write_ref(mirror, &format!("{PIN_REFS}{commit}"), commit)
}

/// Whether the mirror at `mirror` holds the loose ref
/// `refs/oracle-build/pins/<commit>` (written by [`keep_pin`]) naming
/// exactly `commit`: a ref names an object the repository holds, so the
/// commit is there and pinned. Read as a file (a loose ref is one line
/// holding the object id, gitrepository-layout(5)), so the no-op never
/// starts libgit2, whose start-up loads every system CA certificate (about
/// 40 ms). False when the ref was packed or is absent: callers then ask libgit2.
pub fn pin_ref_holds(mirror: &std::path::Path, commit: &str) -> bool {
    if commit.len() != 40 || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    std::fs::read_to_string(mirror.join(format!("{PIN_REFS}{commit}")))
        .is_ok_and(|line| line.trim_end() == commit)
}

/// How `commit` is reached in the mirror at `mirror`, when no branch or tag
/// of the repository reaches it (a fork-only commit): one warning naming the
/// refs it was found through (`refs/pull/<n>/head`), or saying it is held
/// only by its pin ref. `None` when a branch or tag reaches it.
pub fn fork_only_warning(mirror: &std::path::Path, url: &str, commit: &str) -> Option<String> {
    let repo = Repository::open_bare(mirror).ok()?;
    let oid = git2::Oid::from_str(commit).ok()?;
    repo.find_commit(oid).ok()?;
    let mut through = Vec::new();
    for r in repo.references().ok()?.flatten() {
        let Some(name) = r.name().map(str::to_string) else {
            continue;
        };
        if name.starts_with(PIN_REFS) {
            continue;
        }
        let Ok(tip) = r.peel_to_commit() else {
            continue;
        };
        let reaches = tip.id() == oid || repo.graph_descendant_of(tip.id(), oid).unwrap_or(false);
        if !reaches {
            continue;
        }
        if name.starts_with("refs/heads/") || name.starts_with("refs/tags/") {
            return None;
        }
        through.push(name);
    }
    through.sort();
    let how = if through.is_empty() {
        "no branch, tag or pull request reaches it; it is held only by its pin ref".to_string()
    } else {
        format!("it was found through {}", through.join(", "))
    };
    Some(format!(
        "commit {commit} is reachable from no branch or tag of {url} (a fork-only commit): {how}; kept in the mirror as {PIN_REFS}{commit}"
    ))
}

/// What `build`, `plan` and `verify` say instead of [`fork_only_warning`]
/// when the branches of `url` were not fetched from the repository (the
/// mirror came from a bundle or a cache, or the build was offline): which
/// branch reaches `commit` is not known, so nothing is claimed.
pub fn fork_check_not_made(url: &str, commit: &str) -> String {
    format!(
        "whether a branch of {url} reaches {commit} (the fork-only check) was not checked: the mirror's branches were not fetched from the repository (the mirror came from a bundle or a cache, the build was offline, or the repository did not answer); the next online fetch or build makes the check"
    )
}

/// Whether the mirror at `mirror` holds any branch (`refs/heads/*`): a
/// mirror made from a bundle or a cache holds none.
pub fn has_branches(mirror: &Path) -> bool {
    std::fs::read_dir(mirror.join("refs/heads")).is_ok_and(|mut d| d.next().is_some())
        || std::fs::read_to_string(mirror.join("packed-refs"))
            .is_ok_and(|t| t.lines().any(|l| l.contains(" refs/heads/")))
}

/// Runs `work` (fetches) on the directory of the mirror `entry` of `url`:
/// the existing one, updated in place (git writes objects and refs
/// atomically), or a new one made in staging by `backend` and renamed into
/// place only when `work` succeeds. Callers hold the mirror's lock.
fn with_mirror(
    store: &Store,
    entry: &Entry,
    url: &str,
    backend: &Backend,
    work: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    progress::stage("source", format!("fetching {url} into {}", entry.label()));
    if entry.exists() {
        return work(&entry.path);
    }
    let staging = store.stage("git")?;
    let dir = staging.path().join("mirror.git");
    backend.init_mirror(&dir, url)?;
    work(&dir)?;
    fs_err::rename(&dir, &entry.path)?;
    Ok(())
}

/// Fetches `refspecs` of `url` into `repo` through libgit2, with every tag
/// and a progress bar of received objects.
fn fetch(repo: &Repository, url: &str, refspecs: &[&str]) -> Result<()> {
    fetch_with(repo, url, refspecs, false)
}

/// [`fetch`], and with `prune` the refs the remote no longer has removed.
fn fetch_with(repo: &Repository, url: &str, refspecs: &[&str], prune: bool) -> Result<()> {
    let bar = Progress::new("fetch");
    let mut cb = RemoteCallbacks::new();
    cb.transfer_progress(|p| {
        if p.total_objects() > 0 {
            let msg = format!("objects, {} MiB", p.received_bytes() / (1 << 20));
            bar.set(p.received_objects() as u64, p.total_objects() as u64, &msg);
        }
        true
    });
    let mut opts = FetchOptions::new();
    opts.remote_callbacks(cb);
    opts.download_tags(AutotagOption::All);
    if prune {
        opts.prune(git2::FetchPrune::On);
    }
    let mut remote = repo.remote_anonymous(url)?;
    remote
        .fetch(refspecs, Some(&mut opts), None)
        .map_err(|e| anyhow::anyhow!("fetching {url}: {}", e.message()))?;
    bar.finish();
    Ok(())
}

/// Ensures `store/src/<commit>` holds a read-only checkout of exactly
/// `commit` with the full history and tags of the mirror (cloned locally,
/// objects hard-linked where the filesystem allows), by the git command line
/// when it is on PATH, else by libgit2 (which also checks the tree is clean
/// afterwards). Returns the entry and whether this call created it.
///
/// Errors: the clone or checkout fails; HEAD is not `commit`; (libgit2) the
/// tree is dirty.
pub fn ensure_checkout(store: &Store, mirror: &Entry, commit: &str) -> Result<(Entry, bool)> {
    let entry = checkout_entry(store, commit);
    if entry.exists() {
        return Ok((entry, false));
    }
    let _lock = entry.lock()?;
    if entry.exists() {
        return Ok((entry, false));
    }
    progress::stage(
        "source",
        format!("checking out {commit} into {}", entry.label()),
    );
    let staging = store.stage("src")?;
    let dir = staging.path().join("src");
    match Backend::find() {
        Backend::Cli(git) => {
            git.clone_local(&mirror.path, &dir)?;
            // git checks out the tree itself; no status pass afterwards: just
            // after a checkout every file is "racily clean" to git (written
            // in the second the index was), so a status hashes the whole
            // tree again, which took as long as the checkout. A tree that
            // still differs (an attribute's filter) shows as a dirty version
            // to the identity gate.
            git.checkout_detached(&dir, commit)?;
        }
        Backend::Libgit2 => checkout_with_libgit2(&mirror.path, &dir, commit)?,
    }
    store.persist(&dir, &entry)?;
    Ok((entry, true))
}

/// What is wrong with the checkout `entry`: the files that differ from its
/// commit (changed, removed or added), at most five named; empty when it is
/// pristine or git is not on PATH (nothing is said then).
pub fn checkout_damage(entry: &Entry) -> Vec<String> {
    let Backend::Cli(git) = Backend::find() else {
        return Vec::new();
    };
    match git.changed_files(&entry.path) {
        Ok(files) if files.is_empty() => Vec::new(),
        Ok(files) => {
            let shown: Vec<&str> = files.iter().take(5).map(String::as_str).collect();
            vec![format!(
                "{} file(s) differ from the commit: {}{}",
                files.len(),
                shown.join(", "),
                if files.len() > 5 { ", ..." } else { "" }
            )]
        }
        Err(e) => vec![format!("git cannot read it: {e:#}")],
    }
}

/// Clones the bare `mirror` into `dir` through libgit2 and checks out
/// `commit` there (detached HEAD), then checks the tree is clean.
///
/// Errors: the clone or checkout fails; HEAD is not `commit`; the tree is dirty.
fn checkout_with_libgit2(mirror: &Path, dir: &Path, commit: &str) -> Result<()> {
    let url = mirror.to_string_lossy().into_owned();
    // Objects read from our own mirror were hashed by libgit2's indexer when
    // they were fetched; hashing each blob again as the checkout reads it
    // (libgit2's default, which git itself does not do) was a third of the
    // checkout's CPU time.
    git2::opts::strict_hash_verification(false);
    let repo = git2::build::RepoBuilder::new()
        .bare(false)
        .clone_local(git2::build::CloneLocal::Local)
        // No checkout of the mirror's default branch: the one checkout below
        // writes the pinned commit's tree (a pin is rarely the branch tip).
        .with_checkout({
            let mut none = git2::build::CheckoutBuilder::new();
            none.dry_run();
            none
        })
        .remote_create(|repo, name, url| {
            repo.remote_with_fetch(name, url, "+refs/heads/*:refs/remotes/origin/*")?;
            repo.remote_add_fetch(name, "+refs/tags/*:refs/tags/*")?;
            repo.remote_add_fetch(name, "+refs/oracle-build/*:refs/oracle-build/*")?;
            repo.find_remote(name)
        })
        .clone(&url, dir)
        .with_context(|| format!("cloning {} into {}", mirror.display(), dir.display()))?;
    // The user's global configuration must not change the files (libgit2
    // reads ~/.gitconfig): line endings as committed.
    let mut config = repo.config()?;
    config.set_bool("core.autocrlf", false)?;
    config.set_str("core.eol", "lf")?;
    let oid = git2::Oid::from_str(commit)?;
    {
        let obj = repo
            .find_commit(oid)
            .with_context(|| format!("commit {commit} missing from the clone"))?;
        repo.set_head_detached(oid)?;
        repo.checkout_tree(
            obj.as_object(),
            Some(
                git2::build::CheckoutBuilder::new()
                    .force()
                    .remove_untracked(true),
            ),
        )?;
    }
    check_clean_at(&repo, commit)
}

/// Fetches every branch and tag of `url` into its mirror (creating it if
/// needed), so commits newer than any pin can be resolved. With `offline`,
/// only checks that the mirror exists.
///
/// Errors: the fetch fails (names the repository); `offline` and no mirror.
pub fn update_mirror(store: &Store, url: &str, offline: bool) -> Result<Entry> {
    let entry = mirror_entry(store, url);
    let _lock = entry.lock()?;
    if offline {
        if !entry.exists() {
            bail!("--offline: no mirror of {url} in the store");
        }
        return Ok(entry);
    }
    let from = origin_url(store, url)?;
    let backend = Backend::for_network(store)?;
    with_mirror(store, &entry, url, &backend, |dir| {
        backend.fetch(dir, &from, MIRROR_REFSPECS)
    })?;
    Ok(entry)
}

/// The full id of the commit `spec` (a full id or a unique prefix of >= 7 hex)
/// in the repository at `dir`.
///
/// Errors (exit 2): not hex, too short, unknown, or ambiguous.
pub fn resolve_commit(dir: &std::path::Path, spec: &str) -> Result<String> {
    if spec.len() < 7 || spec.len() > 40 || !spec.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad_input(format!(
            "{spec:?} is not a commit id or a prefix of at least 7 hex digits"
        )));
    }
    let repo = Repository::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let obj = repo.revparse_single(spec).map_err(|e| {
        bad_input(format!(
            "commit {spec} is not in {} ({})",
            dir.display(),
            e.message()
        ))
    })?;
    let commit = obj
        .peel_to_commit()
        .map_err(|_| bad_input(format!("{spec} is not a commit")))?;
    Ok(commit.id().to_string())
}

/// How `to` relates to `from` in the repository at `dir`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Range {
    /// Commits reachable from `to` but not from `from` (FROM..TO).
    pub ahead: usize,
    /// Commits reachable from `from` but not from `to` (TO..FROM).
    pub behind: usize,
    /// Whether `to` descends from `from`.
    pub descends: bool,
}

/// Counts FROM..TO and TO..FROM in the repository at `dir`.
///
/// Errors: either commit is missing from it.
pub fn range(dir: &std::path::Path, from: &str, to: &str) -> Result<Range> {
    let repo = Repository::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let (f, t) = (git2::Oid::from_str(from)?, git2::Oid::from_str(to)?);
    let count = |include: git2::Oid, exclude: git2::Oid| -> Result<usize> {
        let mut walk = repo.revwalk()?;
        walk.push(include)?;
        walk.hide(exclude)?;
        Ok(walk.count())
    };
    Ok(Range {
        ahead: count(t, f)?,
        behind: count(f, t)?,
        descends: f == t || repo.graph_descendant_of(t, f)?,
    })
}

/// The branches and tags of the repository at `dir` that contain `commit`
/// (`refs/heads/...`, `refs/tags/...`); `None` when it lacks the commit.
pub fn refs_containing(dir: &std::path::Path, commit: &str) -> Option<Vec<String>> {
    let repo = Repository::open(dir).ok()?;
    let oid = git2::Oid::from_str(commit).ok()?;
    repo.find_commit(oid).ok()?;
    let mut out = Vec::new();
    for r in repo.references().ok()?.flatten() {
        let Some(name) = r.name().map(str::to_string) else {
            continue;
        };
        if !(name.starts_with("refs/heads/") || name.starts_with("refs/tags/")) {
            continue;
        }
        let Ok(tip) = r.peel_to_commit() else {
            continue;
        };
        if tip.id() == oid || repo.graph_descendant_of(tip.id(), oid).unwrap_or(false) {
            out.push(name);
        }
    }
    out.sort();
    Some(out)
}

/// The nearest tag reachable from `commit` in the repository at `dir`
/// (`git describe --tags --abbrev=0`), or `None` when no tag is reachable.
pub fn nearest_tag(dir: &std::path::Path, commit: &str) -> Option<String> {
    let repo = Repository::open(dir).ok()?;
    let obj = repo
        .find_commit(git2::Oid::from_str(commit).ok()?)
        .ok()?
        .into_object();
    let mut opts = git2::DescribeOptions::new();
    opts.describe_tags();
    let d = obj.describe(&opts).ok()?;
    let mut fmt = git2::DescribeFormatOptions::new();
    fmt.abbreviated_size(0);
    d.format(Some(&fmt)).ok()
}

/// Names of the tags of the repository at `dir` (bare or not) that point at `commit`.
pub fn tags_at(dir: &std::path::Path, commit: &str) -> Vec<String> {
    let Ok(repo) = Repository::open(dir) else {
        return Vec::new();
    };
    let Ok(oid) = git2::Oid::from_str(commit) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Ok(names) = repo.tag_names(None) {
        for name in names.iter().flatten() {
            let target = repo
                .revparse_single(&format!("refs/tags/{name}"))
                .and_then(|o| o.peel_to_commit())
                .map(|c| c.id());
            if target.is_ok_and(|t| t == oid) {
                out.push(name.to_string());
            }
        }
    }
    out.sort();
    out
}

/// Checks that the work tree of `repo` has HEAD at `commit` and no changes.
pub fn check_clean_at(repo: &Repository, commit: &str) -> Result<()> {
    let head = repo.head()?.peel_to_commit()?.id().to_string();
    if head != commit {
        bail!("checkout HEAD is {head}, not {commit}");
    }
    let mut opts = git2::StatusOptions::new();
    opts.include_untracked(true).include_ignored(false);
    let statuses = repo.statuses(Some(&mut opts))?;
    if !statuses.is_empty() {
        let files: Vec<String> = statuses
            .iter()
            .take(5)
            .filter_map(|s| s.path().map(str::to_string))
            .collect();
        bail!("checkout of {commit} is not clean: {}", files.join(", "));
    }
    Ok(())
}

/// `p`, a path relative to a tree's root (a `-r` include joined to its
/// file's directory), with `.` and `..` resolved and `/`-separated, as
/// [`CommitFiles`] names files; `None` when absolute or leaving the root.
pub fn tree_relative(p: &Path) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                parts.pop()?;
            }
            _ => return None,
        }
    }
    Some(parts.join("/"))
}

/// The files of one commit of a bare mirror, read without a checkout
/// (libgit2): for what must be known of the tree before a checkout exists
/// (the requirement files that the store lock's key reads).
pub struct CommitFiles {
    repo: Repository,
    tree: git2::Oid,
}

impl CommitFiles {
    /// The tree of `commit` in the mirror at `mirror`: `None` when the
    /// mirror cannot be opened or lacks the commit.
    pub fn open(mirror: &Path, commit: &str) -> Option<CommitFiles> {
        let repo = Repository::open_bare(mirror).ok()?;
        let tree = repo
            .find_commit(git2::Oid::from_str(commit).ok()?)
            .ok()?
            .tree_id();
        Some(CommitFiles { repo, tree })
    }

    /// The text of the regular file `rel` (relative to the tree's root),
    /// invalid UTF-8 replaced: `None` when it is absent, not a regular
    /// file, or larger than `max` bytes (not read).
    pub fn read(&self, rel: &str, max: usize) -> Option<String> {
        let tree = self.repo.find_tree(self.tree).ok()?;
        let e = tree.get_path(Path::new(rel)).ok()?;
        // 0o100644 / 0o100755: a blob that is a file (not a symlink).
        if e.kind() != Some(git2::ObjectType::Blob) || e.filemode() & 0o170000 != 0o100000 {
            return None;
        }
        let (size, _) = self.repo.odb().ok()?.read_header(e.id()).ok()?;
        if size > max {
            return None;
        }
        let b = self.repo.find_blob(e.id()).ok()?;
        Some(String::from_utf8_lossy(b.content()).into_owned())
    }

    /// The paths of every regular file of the tree (relative to its root,
    /// `/`-separated), submodules and symlinks left out.
    pub fn paths(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Ok(tree) = self.repo.find_tree(self.tree) {
            let _ = tree.walk(git2::TreeWalkMode::PreOrder, |root, e| {
                if e.kind() == Some(git2::ObjectType::Blob)
                    && e.filemode() & 0o170000 == 0o100000
                    && let Some(name) = e.name()
                {
                    out.push(format!("{root}{name}"));
                }
                git2::TreeWalkResult::Ok
            });
        }
        out
    }
}

/// The committer time of `commit` in the checkout at `dir`, seconds since the epoch.
pub fn commit_time(dir: &Path, commit: &str) -> Result<i64> {
    let repo = git2::Repository::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    Ok(repo
        .find_commit(git2::Oid::from_str(commit)?)?
        .time()
        .seconds())
}

/// Whether a commit is in the history of another (`contains`), answered
/// from a repository alone: no network.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "answer", rename_all = "lowercase")]
pub enum Containment {
    /// `commit` is `head` or an ancestor of it.
    Yes {
        /// The commit asked about, in full.
        commit: String,
        /// First-parent steps from `head` back to `commit` when it lies on
        /// `head`'s first-parent chain; else back to the merge that brought
        /// it in (`merged_by`).
        first_parent_distance: usize,
        /// Whether `commit` lies on `head`'s first-parent chain.
        on_first_parent: bool,
        /// The commit of the first-parent chain whose other parent brought
        /// `commit` in (`None` when it lies on the chain).
        merged_by: Option<String>,
    },
    /// `commit` is not in `head`'s history: the repository holds it
    /// elsewhere, or does not hold it at all while it holds `head`'s whole
    /// history (it is not shallow), so no ancestor of `head` is `commit`.
    No {
        /// The commit asked about: in full when the repository holds it,
        /// else as asked.
        commit: String,
        /// Whether the repository holds `commit`.
        in_mirror: bool,
    },
    /// The repository does not hold `commit` (or no commit matches the
    /// prefix) and is shallow: `head`'s history is not all there.
    Unknown {
        /// The commit as asked.
        commit: String,
    },
}

/// Whether `spec` (a full commit id or a prefix of at least 7 hex digits) is
/// in the history of `head`, in the repository (bare mirror or checkout) at
/// `dir`: libgit2's `graph_descendant_of`, then a first-parent walk from
/// `head` for the distance (see [`Containment::Yes`]). A prefix is resolved
/// among the repository's commits.
///
/// Errors (exit 2): `spec` is not hex or too short, or the prefix is
/// ambiguous; `head` is not in the repository. Errors: the repository
/// cannot be opened.
pub fn contains(dir: &Path, head: &str, spec: &str) -> Result<Containment> {
    if spec.len() < 7 || spec.len() > 40 || !spec.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad_input(format!(
            "{spec:?} is not a commit id or a prefix of at least 7 hex digits"
        )));
    }
    let repo = Repository::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let head_id = git2::Oid::from_str(head)
        .ok()
        .and_then(|o| repo.find_commit(o).ok())
        .map(|c| c.id())
        .ok_or_else(|| {
            bad_input(format!(
                "the oracle's commit {head} is not in {}",
                dir.display()
            ))
        })?;
    let found = match repo.revparse_single(spec) {
        Ok(obj) => obj.peel_to_commit().ok(),
        Err(e) if e.code() == git2::ErrorCode::Ambiguous => {
            return Err(bad_input(format!(
                "the prefix {spec} names more than one object in {}; give more digits",
                dir.display()
            )));
        }
        Err(_) => None,
    };
    let Some(target) = found.filter(|c| c.id().to_string().starts_with(&spec.to_ascii_lowercase()))
    else {
        // Every ancestor of `head` is in a repository that is not shallow
        // (git keeps a repository's history closed), so a commit it lacks
        // is provably not one of them.
        return Ok(if repo.is_shallow() {
            Containment::Unknown {
                commit: spec.to_string(),
            }
        } else {
            Containment::No {
                commit: spec.to_string(),
                in_mirror: false,
            }
        });
    };
    let t = target.id();
    let commit = t.to_string();
    let reaches =
        |from: git2::Oid| -> Result<bool> { Ok(from == t || repo.graph_descendant_of(from, t)?) };
    if !reaches(head_id)? {
        return Ok(Containment::No {
            commit,
            in_mirror: true,
        });
    }
    // The first-parent chain from head, until the commit itself.
    let mut chain = vec![head_id];
    let mut cur = repo.find_commit(head_id)?;
    while cur.id() != t {
        match cur.parent_ids().next() {
            Some(p) => {
                chain.push(p);
                cur = repo.find_commit(p)?;
            }
            None => break,
        }
    }
    if cur.id() == t {
        return Ok(Containment::Yes {
            commit,
            first_parent_distance: chain.len() - 1,
            on_first_parent: true,
            merged_by: None,
        });
    }
    // Off the chain: reachable from chain[0], not from the root; the last
    // chain commit that still reaches it is the merge that brought it in
    // (reachability is monotone along the chain, so a binary search).
    let (mut lo, mut hi) = (0usize, chain.len() - 1);
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if reaches(chain[mid])? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Containment::Yes {
        commit,
        first_parent_distance: lo,
        on_first_parent: false,
        merged_by: Some(chain[lo].to_string()),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn repo_keys_are_readable_and_distinct() {
        let a = super::repo_key("https://github.com/vllm-project/vllm");
        let b = super::repo_key("https://github.com/vllm-project/vllm.git/");
        let c = super::repo_key("https://github.com/someone/vllm");
        assert!(a.starts_with("github.com-vllm-project-vllm-"), "{a}");
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
