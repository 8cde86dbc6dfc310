//! The git command line, for the two heavy steps of the source stage: a
//! fetch into the store's mirror and the checkout of one commit.
//!
//! Why the command line and not libgit2 for these: measured on a 3,000-file,
//! 3,000-commit repository (`scripts/bench`, second pin), libgit2's local
//! transport searches deltas to build a pack where git's `upload-pack` reuses
//! the ones it has, and libgit2's checkout looks up `.gitattributes` for every
//! file through `realpath`; together they made a second pin 2.5x slower than
//! `git fetch` + `git worktree add`. The reads (resolving a commit, tags,
//! ranges) stay in libgit2, and so does everything on a box without git
//! (`stages::source` falls back to it).
//!
//! Local steps (clone from the mirror, checkout, reads) run with the user's
//! and the system's git configuration ignored (`GIT_CONFIG_GLOBAL=/dev/null`,
//! `GIT_CONFIG_NOSYSTEM`, git-config(1) "ENVIRONMENT"), so a global
//! `core.autocrlf`, filter or template directory cannot change the files of
//! a checkout. A fetch from the network keeps that configuration: proxies,
//! credential helpers and `url.<base>.insteadOf` are how users reach their
//! repositories. No step ever prompts (`GIT_TERMINAL_PROMPT=0`), and no
//! step that talks to a repository waits longer than the site's `[git]`
//! timeouts allow ([`Git::network`], [`crate::host::git_timeouts`]).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::host::git_timeouts::{GitTimeouts, show};
use crate::host::process::{self, Silence, Stalled};

/// The git program found on PATH, and the limits of its network operations.
#[derive(Debug, Clone, PartialEq)]
pub struct Git {
    /// Absolute path of `git`.
    pub path: PathBuf,
    /// How long a fetch, a ref listing or a submodule update may wait for
    /// the repository ([`Git::network`]); the defaults unless
    /// [`Git::with_timeouts`] was given the site's `[git]` table.
    pub timeouts: GitTimeouts,
}

/// Whether a git command may read the user's and the system's configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Config {
    /// Network fetches: proxies, credentials and URL rewrites apply.
    User,
    /// Local steps: git's defaults only.
    Hermetic,
}

impl Git {
    /// `git` on PATH, or `None` (the caller uses libgit2). Starts no process.
    pub fn find() -> Option<Git> {
        which::which("git").ok().map(|path| Git {
            path,
            timeouts: GitTimeouts::default(),
        })
    }

    /// This git with the network limits `timeouts` (the site's `[git]`
    /// table, [`crate::host::git_timeouts::load`]).
    pub fn with_timeouts(self, timeouts: GitTimeouts) -> Git {
        Git { timeouts, ..self }
    }

    fn command(&self, config: Config, args: Vec<std::ffi::OsString>) -> duct::Expression {
        let mut all = settings(&[
            // No hook of the user's runs (`core.hooksPath` in their
            // configuration would apply to the store's repositories too).
            "core.hooksPath=/dev/null",
            // Only the plain transports for a recipe's URL, never a remote
            // helper such as `ext::<command>` (git-config(1) `protocol.allow`).
            "protocol.allow=never",
            "protocol.file.allow=always",
            "protocol.git.allow=always",
            "protocol.http.allow=always",
            "protocol.https.allow=always",
            "protocol.ssh.allow=always",
        ]);
        all.extend(args);
        let mut cmd = duct::cmd(&self.path, all)
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("LC_ALL", "C");
        if config == Config::Hermetic {
            // HOME and XDG_CONFIG_HOME too, for a git older than 2.32,
            // which ignores GIT_CONFIG_GLOBAL.
            cmd = cmd
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("HOME", "/nonexistent")
                .env("XDG_CONFIG_HOME", "/nonexistent");
        }
        cmd
    }

    /// Runs git with `args` in `dir` and returns its trimmed stdout.
    ///
    /// Errors: git cannot start or exits non-zero; the error names the
    /// command and ends with git's output.
    fn run(&self, config: Config, dir: &Path, args: &[&str]) -> Result<String> {
        let mut all: Vec<std::ffi::OsString> = vec!["-C".into(), dir.into()];
        all.extend(args.iter().map(Into::into));
        let what = format!("git -C {} {}", dir.display(), args.join(" "));
        process::capture(&what, self.command(config, all))
    }

    /// Runs git with `args` (a step that talks to the repository `url`:
    /// a fetch, `ls-remote`, a submodule update) under [`Git::timeouts`], and
    /// returns its trimmed stdout. git traces the protocol's packets on
    /// stderr (`GIT_TRACE_PACKET=2`): its first received packet (`fetch<`,
    /// `ls-remote<`...) is the repository's answer, which must come within
    /// `connect_timeout`; after it, git's output (the packets, its
    /// `--progress` meters and the repository's `remote:` lines) may stop
    /// for at most `read_timeout`; else git's process group is killed
    /// ([`process::capture_watched`]): this covers every transport (`git://`
    /// and ssh too, which git gives no timeout of its own). Over HTTP, curl
    /// also ends a transfer idle that long (`http.lowSpeedLimit=1`,
    /// `http.lowSpeedTime`). On a terminal, git's progress is shown as it
    /// comes.
    ///
    /// Errors: git fails (the message names `what` and ends with git's
    /// own lines, the trace left out); the repository did not answer or
    /// fell silent (the message names `what`, the limit, and where to set it).
    fn network(&self, what: &str, args: Vec<std::ffi::OsString>) -> Result<String> {
        let t = &self.timeouts;
        let speed_time = t.read.as_secs_f64().ceil().max(1.0).to_string();
        let mut all: Vec<std::ffi::OsString> = vec![
            "-c".into(),
            "http.lowSpeedLimit=1".into(),
            "-c".into(),
            format!("http.lowSpeedTime={speed_time}").into(),
        ];
        all.extend(args);
        let cmd = self
            .command(Config::User, all)
            .env("GIT_TRACE_PACKET", "2")
            .env("GIT_HTTP_LOW_SPEED_LIMIT", "1")
            .env("GIT_HTTP_LOW_SPEED_TIME", &speed_time);
        let terminal = std::io::stderr().is_terminal();
        let silence = Silence {
            first: t.connect,
            idle: t.read,
        };
        process::capture_watched(what, cmd, silence, received_packet, |line, end| {
            if packet_trace(line).is_some() {
                return false;
            }
            if terminal {
                eprint!("{line}{}", end as char);
            }
            end == b'\n' && !line.trim().is_empty()
        })
        .map_err(|e| match e.downcast_ref::<Stalled>() {
            Some(Stalled::NoAnswer(_)) => anyhow::Error::new(TimedOut(format!(
                "{what}: the repository did not answer within connect_timeout {} (set by {}); git was stopped",
                show(t.connect),
                t.hint("connect_timeout")
            ))),
            Some(Stalled::Idle(_)) => anyhow::Error::new(TimedOut(format!(
                "{what}: the repository sent nothing for read_timeout {} (set by {}); git was stopped",
                show(t.read),
                t.hint("read_timeout")
            ))),
            None => e,
        })
    }

    /// The branches and tags of the repository `url` (`git ls-remote
    /// --heads --tags`, under [`Git::timeouts`]): each ref's full name and
    /// the object it names, peeled entries (`^{}`) left out.
    ///
    /// Errors: git fails or the repository does not answer in time (named).
    pub fn list_remote(&self, url: &str) -> Result<Vec<(String, String)>> {
        let out = self
            .network(
                "git ls-remote",
                vec![
                    "ls-remote".into(),
                    "--heads".into(),
                    "--tags".into(),
                    "--".into(),
                    absolute_local(url).into(),
                ],
            )
            .with_context(|| format!("listing the refs of {url}"))?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let (id, name) = l.split_once('\t')?;
                (!name.ends_with("^{}")).then(|| (name.to_string(), id.to_string()))
            })
            .collect())
    }

    /// Fetches `refspecs` from `url` into the repository at `repo` (the
    /// mirror's refspecs name every tag). On a terminal, git
    /// draws its own progress on stderr; otherwise its output is kept for the
    /// error.
    ///
    /// Errors: the fetch fails, or the repository does not answer in time
    /// ([`Git::network`]); the message names `url` and holds git's output.
    pub fn fetch(&self, repo: &Path, url: &str, refspecs: &[&str]) -> Result<()> {
        self.fetch_with(repo, url, refspecs, &[])
    }

    /// [`Git::fetch`], removing the refs the refspecs cover that `url` no
    /// longer has (`git fetch --prune`).
    ///
    /// Errors: as [`Git::fetch`].
    pub fn fetch_pruning(&self, repo: &Path, url: &str, refspecs: &[&str]) -> Result<()> {
        self.fetch_with(repo, url, refspecs, &["--prune"])
    }

    /// [`Git::fetch`] with `options` (`--depth=1`, `--no-tags`) given to
    /// `git fetch` before the URL.
    ///
    /// Errors: as [`Git::fetch`].
    fn fetch_with(
        &self,
        repo: &Path,
        url: &str,
        refspecs: &[&str],
        options: &[&str],
    ) -> Result<()> {
        let mut args: Vec<std::ffi::OsString> = vec![
            "-C".into(),
            repo.into(),
            // No background `gc`/`maintenance` after the fetch: it would
            // repack the store's mirror outside the caller's lock.
            "-c".into(),
            "gc.auto=0".into(),
            "-c".into(),
            "maintenance.auto=false".into(),
            "fetch".into(),
            "--no-write-fetch-head".into(),
        ];
        // Progress even off a terminal: it is how a long transfer shows it
        // is alive ([`Git::network`]).
        args.push("--progress".into());
        args.extend(options.iter().map(Into::into));
        // After `--`, the URL is never an option.
        args.push("--".into());
        args.push(absolute_local(url).into());
        args.extend(refspecs.iter().map(Into::into));
        self.network("git fetch", args)
            .map(|_| ())
            .with_context(|| format!("fetching {url}"))
    }

    /// Asks the repository at `url` for its `HEAD` (`git ls-remote -- <url>
    /// HEAD`: one line of output), through every transport the fetch uses
    /// (dumb HTTP included, which libgit2 lacks) and the user's
    /// configuration (proxies, credentials, `insteadOf`), as the fetch will.
    ///
    /// Errors: git cannot start or the repository does not answer; the
    /// message holds git's.
    pub fn ls_remote(&self, url: &str) -> Result<()> {
        let args: Vec<std::ffi::OsString> = vec![
            "ls-remote".into(),
            "--".into(),
            absolute_local(url).into(),
            "HEAD".into(),
        ];
        // Under the connect and idle limits of every network step.
        self.network(&format!("git ls-remote {url}"), args)
            .map(|_| ())
    }

    /// Whether the repository at `repo` holds the commit `commit` (an object
    /// of type commit: an annotated tag's id is not one).
    pub fn has_commit(&self, repo: &Path, commit: &str) -> bool {
        self.run(Config::Hermetic, repo, &["cat-file", "-t", commit])
            .is_ok_and(|t| t == "commit")
    }

    /// Whether a ref under one of `prefixes` (`refs/heads/`, `refs/tags/`) of
    /// the repository at `repo` reaches `commit` (`git for-each-ref --contains`).
    pub fn reached_from(&self, repo: &Path, commit: &str, prefixes: &[&str]) -> bool {
        let contains = format!("--contains={commit}");
        let mut args = vec!["for-each-ref", "--count=1", contains.as_str()];
        args.extend(prefixes.iter().map(|p| p.trim_end_matches('/')));
        self.run(Config::Hermetic, repo, &args)
            .is_ok_and(|out| !out.is_empty())
    }

    /// The nearest tag matching `pattern` that reaches `commit` in the
    /// repository at `repo` (`git describe --tags --abbrev=0 --match`), and
    /// the commit it names; `None` when none does.
    pub fn describe(&self, repo: &Path, commit: &str, pattern: &str) -> Option<(String, String)> {
        let matching = format!("--match={pattern}");
        let tag = self
            .run(
                Config::Hermetic,
                repo,
                &["describe", "--tags", "--abbrev=0", &matching, commit],
            )
            .ok()
            .filter(|t| !t.is_empty())?;
        let peeled = format!("refs/tags/{tag}^{{commit}}");
        let target = self
            .run(
                Config::Hermetic,
                repo,
                &["rev-parse", "--verify", "--quiet", &peeled],
            )
            .ok()?;
        Some((tag, target))
    }

    /// Makes the tags of the repository at `tree` those of the local
    /// repository `mirror` (`git fetch --prune` of `+refs/tags/*:refs/tags/*`).
    ///
    /// Errors: git fails (named, with its output).
    pub fn sync_tags(&self, tree: &Path, mirror: &Path) -> Result<()> {
        self.run(
            Config::Hermetic,
            tree,
            &[
                "-c",
                "gc.auto=0",
                "fetch",
                "--quiet",
                "--prune",
                "--no-tags",
                "--no-write-fetch-head",
                "--",
                &mirror.to_string_lossy(),
                "+refs/tags/*:refs/tags/*",
            ],
        )?;
        Ok(())
    }

    /// Points the ref `name` of the repository at `repo` at `commit`
    /// (`git update-ref`, which writes it atomically through a lock file).
    ///
    /// Errors: git fails, e.g. the repository lacks the commit (named, with its output).
    pub fn update_ref(&self, repo: &Path, name: &str, commit: &str) -> Result<()> {
        self.run(
            Config::Hermetic,
            repo,
            &[
                "update-ref",
                "-m",
                "oracle-build: pinned commit",
                name,
                commit,
            ],
        )?;
        Ok(())
    }

    /// Creates the bare repository `dir` with an `origin` remote at `url`
    /// fetching `refspecs` (the mirror's layout).
    ///
    /// Errors: git fails (named, with its output).
    pub fn init_mirror(&self, dir: &Path, url: &str, refspecs: &[&str]) -> Result<()> {
        let parent = dir.parent().unwrap_or(Path::new("."));
        let name = dir.as_os_str().to_string_lossy();
        self.run(
            Config::Hermetic,
            parent,
            &["init", "--quiet", "--bare", "--template=", &name],
        )?;
        self.run(
            Config::Hermetic,
            dir,
            &["config", "remote.origin.url", &absolute_local(url)],
        )?;
        for spec in refspecs {
            self.run(
                Config::Hermetic,
                dir,
                &["config", "--add", "remote.origin.fetch", spec],
            )?;
        }
        Ok(())
    }

    /// Clones the bare `mirror` into `dir` with no checkout: objects
    /// hard-linked where the filesystem allows (`--local`), branches under
    /// `refs/remotes/origin/`, every tag, and `refs/oracle-build/*` (the pins).
    ///
    /// Errors: git fails (named, with its output).
    pub fn clone_local(&self, mirror: &Path, dir: &Path) -> Result<()> {
        let parent = dir.parent().unwrap_or(Path::new("."));
        self.run(
            Config::Hermetic,
            parent,
            &[
                "clone",
                "--quiet",
                "--local",
                "--no-checkout",
                "--template=",
                "--config",
                "remote.origin.fetch=+refs/oracle-build/*:refs/oracle-build/*",
                &mirror.to_string_lossy(),
                &dir.to_string_lossy(),
            ],
        )?;
        Ok(())
    }

    /// The paths of the work tree `dir` that differ from its HEAD, added
    /// files included (`git status --porcelain --untracked-files=all`,
    /// without taking the index lock: a store checkout is read-only).
    ///
    /// Errors: git fails (not a work tree).
    pub fn changed_files(&self, dir: &Path) -> Result<Vec<String>> {
        let out = self.run(
            Config::Hermetic,
            dir,
            &[
                "--no-optional-locks",
                "status",
                "--porcelain",
                "--untracked-files=all",
            ],
        )?;
        Ok(out
            .lines()
            .filter(|l| l.len() > 3)
            .map(|l| l[3..].to_string())
            .collect())
    }

    /// Checks out `commit` in the work tree `dir` with a detached HEAD, and
    /// checks that HEAD is `commit` afterwards. HEAD is read as a file: a
    /// detached HEAD holds the commit's id itself (gitrepository-layout(5)),
    /// which saves starting git once more.
    ///
    /// Errors: the checkout fails; HEAD is another commit or not detached.
    pub fn checkout_detached(&self, dir: &Path, commit: &str) -> Result<()> {
        // One worker per CPU (git-config(1) `checkout.workers`; the default
        // is one): 0.6x the sequential checkout's time for 3,000 files on 2
        // CPUs here, and store disks are SSDs, where git says it helps.
        self.run(
            Config::Hermetic,
            dir,
            &[
                "-c",
                "checkout.workers=0",
                "checkout",
                "--quiet",
                "--detach",
                commit,
            ],
        )?;
        let head_file = dir.join(".git/HEAD");
        let head = fs_err::read_to_string(&head_file)?;
        if head.trim_end() != commit {
            bail!(
                "after checking out {commit}, {} holds {:?}, not {commit}",
                head_file.display(),
                head.trim_end()
            );
        }
        Ok(())
    }
}

/// A git step that talks to a repository ended because the repository did
/// not answer within a `[git]` timeout ([`Git::network`]): the message says
/// which and where it is set. Found in an error's chain by [`timed_out`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut(pub String);

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TimedOut {}

/// Whether `e` (or an error it wraps) is a [`TimedOut`].
pub fn timed_out(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<TimedOut>().is_some())
}

/// `-c <setting>` for each of `settings`: git configuration given on its
/// command line, over any file's.
fn settings(settings: &[&str]) -> Vec<std::ffi::OsString> {
    settings
        .iter()
        .flat_map(|s| ["-c".into(), std::ffi::OsString::from(s)])
        .collect()
}

/// Whether `s` is a full commit id (40 hex digits, SHA-1), as a pin or a
/// `GIT_TAG` may name one, rather than a tag or branch name.
pub fn is_full_id(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// How many refs a git bundle may list before it is refused: far above any
/// repository's tags (vLLM has a few hundred), and a bound on what a
/// bundle from elsewhere makes this box read.
pub const MAX_BUNDLE_REFS: usize = 1_000_000;

/// The tags the git bundle `bundle` carries, as `git bundle list-heads`
/// prints them: tag name (without `refs/tags/`) -> the object id the ref
/// names (an annotated tag's tag object, a lightweight tag's commit). Reads
/// only the bundle's header; needs no repository.
///
/// Errors: git is not on PATH or cannot read the bundle (named); it lists
/// more than [`MAX_BUNDLE_REFS`] refs.
pub fn bundle_tags(bundle: &Path) -> Result<std::collections::BTreeMap<String, String>> {
    let git = which::which("git").context("reading a git bundle needs the git command line")?;
    let heads = process::capture(
        &format!("git bundle list-heads {}", bundle.display()),
        duct::cmd(
            &git,
            ["bundle".as_ref(), "list-heads".as_ref(), bundle.as_os_str()],
        )
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1"),
    )?;
    let mut tags = std::collections::BTreeMap::new();
    for (n, line) in heads.lines().enumerate() {
        if n >= MAX_BUNDLE_REFS {
            bail!(
                "the git bundle {} lists more than {MAX_BUNDLE_REFS} refs",
                bundle.display()
            );
        }
        let mut words = line.split_whitespace();
        if let (Some(id), Some(name)) = (words.next(), words.next())
            && let Some(tag) = name.strip_prefix("refs/tags/")
        {
            tags.insert(tag.to_string(), id.to_string());
        }
    }
    Ok(tags)
}

impl Git {
    /// The tree of `rev` (a tag, a branch or a 40-hex commit, as CMake's
    /// `GIT_TAG`) of the repository at `url`, checked out into the new
    /// directory `dir` with a detached HEAD, and with `submodules` every
    /// submodule, recursively (`git submodule update --init --recursive`)
    /// with `url_config` (`url.<to>.insteadOf=<from>` settings: the site's
    /// mirrors, [`crate::host::mirror::Mirrors::git_config`]) applied to
    /// their URLs. The ext stage's one fetch (the source stage's mirror
    /// uses [`Git::fetch`] too).
    ///
    /// Only `rev` is fetched, at depth 1: the staged tree is all that is
    /// kept, and a site mirror that is a partial clone (`git clone
    /// --filter=blob:none`) holding the blobs of `rev` but not of its history
    /// serves it (a fetch of every branch would ask for the missing blobs).
    /// A commit the server refuses to send by id is looked for in every
    /// branch and tag, with their history.
    ///
    /// Returns the commit `rev` resolved to and each submodule's path and commit.
    ///
    /// Errors: git fails (the message names `url` and holds git's output);
    /// `url` has no tag, branch or commit `rev`.
    pub fn fetch_tree(
        &self,
        url: &str,
        rev: &str,
        submodules: bool,
        dir: &Path,
        url_config: &[String],
    ) -> Result<(String, std::collections::BTreeMap<String, String>)> {
        const WANT: &str = "refs/oracle-build/ext";
        fs_err::create_dir_all(dir)?;
        self.run(Config::Hermetic, dir, &["init", "--quiet", "--template="])?;
        // Relative submodule URLs resolve against the remote's URL.
        self.run(
            Config::Hermetic,
            dir,
            &["config", "remote.origin.url", &absolute_local(url)],
        )?;
        let listed = self
            .network(
                "git ls-remote",
                vec![
                    "-C".into(),
                    dir.into(),
                    "ls-remote".into(),
                    "--".into(),
                    absolute_local(url).into(),
                ],
            )
            .with_context(|| format!("listing the refs of {url}"))?;
        let is_sha = is_full_id(rev);
        let named = named_ref(&listed, rev).map(|(r, _)| r);
        let spec = match (&named, is_sha) {
            (Some(r), _) => format!("+{r}:{WANT}"),
            (None, true) => format!("+{rev}:{WANT}"),
            (None, false) => bail!("{url} has no tag, branch or commit {rev}"),
        };
        let shallow = self.fetch_with(dir, url, &[&spec], &["--depth=1", "--no-tags"]);
        if let Err(e) = shallow {
            if named.is_some() {
                return Err(e);
            }
            // A server that refuses a fetch by id: every branch and tag.
            self.fetch(
                dir,
                url,
                &[
                    "+refs/heads/*:refs/remotes/origin/*",
                    "+refs/tags/*:refs/tags/*",
                ],
            )
            .with_context(|| format!("{url} would not send commit {rev} by id"))?;
        }
        let peel = if self.has_ref(dir, WANT) {
            format!("{WANT}^{{commit}}")
        } else {
            format!("{rev}^{{commit}}")
        };
        let commit = self
            .run(
                Config::Hermetic,
                dir,
                &["rev-parse", "--verify", "--quiet", &peel],
            )
            .ok()
            .filter(|c| !c.is_empty())
            .with_context(|| format!("{url} has no tag, branch or commit {rev}"))?;
        self.checkout_detached(dir, &commit)?;
        let mut subs = std::collections::BTreeMap::new();
        if submodules && dir.join(".gitmodules").is_file() {
            let mut args: Vec<std::ffi::OsString> = vec!["-C".into(), dir.into()];
            for c in url_config {
                args.extend(["-c".into(), c.into()]);
            }
            for a in ["submodule", "update", "--init", "--recursive", "--progress"] {
                args.push(a.into());
            }
            self.network("git submodule update", args)
                .with_context(|| format!("fetching the submodules of {url} @ {rev}"))?;
            let status = self.run(
                Config::Hermetic,
                dir,
                &["submodule", "status", "--recursive"],
            )?;
            for line in status.lines() {
                // `<status><sha> <path> (<describe>)`, the status a space,
                // `-`, `+` or `U` (the output's first space is trimmed).
                let mut words = line.split_whitespace();
                if let (Some(id), Some(path)) = (words.next(), words.next()) {
                    let id = id.trim_start_matches(['-', '+', 'U']);
                    subs.insert(path.to_string(), id.to_string());
                }
            }
        }
        Ok((commit, subs))
    }

    /// Whether the repository at `repo` has the ref `name`.
    fn has_ref(&self, repo: &Path, name: &str) -> bool {
        self.run(
            Config::Hermetic,
            repo,
            &["rev-parse", "--verify", "--quiet", name],
        )
        .is_ok_and(|out| !out.is_empty())
    }

    /// The commit the tag or branch `rev` names at `url` now, as
    /// [`Git::fetch_tree`] resolves it (the tag `refs/tags/<rev>` first,
    /// peeled when annotated, else the branch `refs/heads/<rev>`), read
    /// with `git ls-remote` (the user's configuration applies: proxies,
    /// credentials, `insteadOf`); `None` when `url` has neither. Nothing is
    /// fetched.
    ///
    /// Errors: `git ls-remote` fails (the message names `url`).
    pub fn remote_commit(&self, url: &str, rev: &str) -> Result<Option<String>> {
        let listed = self
            .run(
                Config::User,
                Path::new("/"),
                &["ls-remote", "--", &absolute_local(url)],
            )
            .with_context(|| format!("listing the refs of {url}"))?;
        Ok(named_ref(&listed, rev).map(|(_, c)| c))
    }

    /// A new bare repository at `dir` (which must not exist) with its own
    /// index, in which a staged tree's git ids are computed
    /// ([`ScratchRepo::tree_of_files`]).
    ///
    /// Errors: `git init` fails.
    pub fn scratch_repo(&self, dir: &Path) -> Result<ScratchRepo> {
        fs_err::create_dir_all(dir)?;
        self.run(
            Config::Hermetic,
            dir,
            &["init", "--quiet", "--bare", "--template=", "repo"],
        )?;
        Ok(ScratchRepo {
            git: self.clone(),
            repo: dir.join("repo"),
            index: dir.join("index"),
        })
    }
}

/// The ref `rev` names among the lines of `git ls-remote` (`listed`) and
/// the commit it points at: `refs/tags/<rev>` (its peeled `^{}` line when
/// the tag is annotated), else `refs/heads/<rev>`; `None` when neither is
/// listed.
fn named_ref(listed: &str, rev: &str) -> Option<(String, String)> {
    let id_of = |name: &str| {
        listed.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            let id = w.next()?;
            (w.next() == Some(name)).then(|| id.to_string())
        })
    };
    let tag = format!("refs/tags/{rev}");
    if let Some(id) = id_of(&tag) {
        let peeled = id_of(&format!("{tag}^{{}}")).unwrap_or(id);
        return Some((tag, peeled));
    }
    let head = format!("refs/heads/{rev}");
    id_of(&head).map(|id| (head, id))
}

/// A submodule of a staged tree, for [`ScratchRepo::tree_of_files`]: the
/// gitlink at `path` (relative to the tree, `/`-separated) naming
/// `commit`. `tree`: the tree the files under `path` must hash to (the
/// submodule's commit's tree) when it was fetched; `None` when it was left
/// unfetched (`GIT_SUBMODULES ""`), and then no file may lie under `path`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gitlink {
    /// Its path in the tree.
    pub path: String,
    /// The commit the gitlink names.
    pub commit: String,
    /// The tree of `commit`, when its files were fetched.
    pub tree: Option<String>,
}

/// A bare scratch repository with its own index ([`Git::scratch_repo`]):
/// git's own ids of commit objects and of a directory of files, computed
/// by git, never by this crate. Every command runs with git's defaults
/// only (no user or system configuration) and no attributes but the
/// tree's own `.gitattributes`.
#[derive(Debug)]
pub struct ScratchRepo {
    git: Git,
    repo: PathBuf,
    index: PathBuf,
}

impl ScratchRepo {
    /// Runs git plumbing with the scratch repository, its index and, when
    /// given, the work tree `work` (and `-C work`).
    fn plumbing(&self, work: Option<&Path>, args: &[&str]) -> Result<String> {
        self.plumbing_with(work, args, None)
    }

    /// [`ScratchRepo::plumbing`] with `stdin` given to git.
    fn plumbing_with(
        &self,
        work: Option<&Path>,
        args: &[&str],
        stdin: Option<Vec<u8>>,
    ) -> Result<String> {
        let mut all = settings(&[
            "core.autocrlf=false",
            "core.filemode=true",
            "core.symlinks=true",
            "core.safecrlf=false",
            "core.fsmonitor=false",
            "core.untrackedCache=false",
        ]);
        if let Some(w) = work {
            all.push("-C".into());
            all.push(w.into());
        }
        all.extend(args.iter().map(Into::into));
        let mut cmd = self
            .git
            .command(Config::Hermetic, all)
            .env("GIT_DIR", &self.repo)
            .env("GIT_INDEX_FILE", &self.index);
        cmd = match work {
            Some(w) => cmd.env("GIT_WORK_TREE", w),
            None => cmd.env_remove("GIT_WORK_TREE"),
        };
        if let Some(bytes) = stdin {
            cmd = cmd.stdin_bytes(bytes);
        }
        process::capture(&format!("git {}", args.join(" ")), cmd)
    }

    /// Writes the raw commit object in the file `file` into the scratch
    /// repository (`git hash-object -t commit -w`, which refuses a malformed
    /// commit) and returns its id and the id of the tree it names.
    ///
    /// Errors: git refuses the object; it names no tree.
    pub fn hash_commit(&self, file: &Path) -> Result<(String, String)> {
        let file = file.to_string_lossy();
        let id = self.plumbing(None, &["hash-object", "-t", "commit", "-w", "--", &file])?;
        let text = self.plumbing(None, &["cat-file", "commit", &id])?;
        // fsck (run by hash-object) requires the first header to be the tree.
        let tree = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("tree "))
            .filter(|t| t.len() >= 40 && t.chars().all(|c| c.is_ascii_hexdigit()))
            .with_context(|| format!("commit object {id} names no tree"))?;
        Ok((id, tree.to_string()))
    }

    /// git's own tree id of the files under `dir`: every regular file and
    /// symlink, each hashed by `git update-index --add --info-only` as `git
    /// add` hashes it (the executable bit, symlinks, and the tree's own
    /// `.gitattributes` conversions as git applies them; no object is
    /// written, so the trees are written with `--missing-ok`; empty
    /// directories are no part of a git tree), with each of `gitlinks`
    /// (deepest first) in place of the files under its path: a fetched
    /// one's files must first hash to its `tree`, under an unfetched one
    /// there must be nothing. Uses this repository's index, once.
    ///
    /// Errors: a directory cannot be read; git fails (a path git refuses);
    /// a fetched submodule's files hash to another tree; files lie under an
    /// unfetched submodule.
    pub fn tree_of_files(&self, dir: &Path, gitlinks: &[Gitlink]) -> Result<String> {
        let mut paths = Vec::new();
        list_paths(dir, Path::new(""), &mut paths)?;
        self.plumbing_with(
            Some(dir),
            &["update-index", "--add", "--info-only", "-z", "--stdin"],
            Some(paths),
        )?;
        let mut links: Vec<&Gitlink> = gitlinks.iter().collect();
        links.sort_by_key(|g| std::cmp::Reverse(g.path.matches('/').count()));
        for g in links {
            let literal = format!(":(literal){}", g.path);
            match &g.tree {
                Some(want) => {
                    let prefix = format!("--prefix={}/", g.path);
                    let got = self
                        .plumbing(Some(dir), &["write-tree", "--missing-ok", &prefix])
                        .with_context(|| format!("submodule {}: no files", g.path))?;
                    if &got != want {
                        bail!(
                            "submodule {}: its files hash to git tree {got}, the tree of its commit {} is {want}",
                            g.path,
                            g.commit
                        );
                    }
                }
                None => {
                    let under = self.plumbing(Some(dir), &["ls-files", "--", &literal])?;
                    if !under.is_empty() {
                        bail!(
                            "submodule {} was not fetched, but files lie under it ({})",
                            g.path,
                            under.lines().next().unwrap_or_default()
                        );
                    }
                }
            }
            self.plumbing(
                Some(dir),
                &[
                    "rm",
                    "-r",
                    "-q",
                    "--cached",
                    "--ignore-unmatch",
                    "--",
                    &literal,
                ],
            )?;
            let info = format!("160000,{},{}", g.commit, g.path);
            self.plumbing(Some(dir), &["update-index", "--add", "--cacheinfo", &info])?;
        }
        self.plumbing(Some(dir), &["write-tree", "--missing-ok"])
    }
}

/// Appends the path (relative to the walk's root, `rel` here) of every
/// regular file and symlink under `dir` to `out`, each ended by NUL (the
/// input of `git update-index -z --stdin`), directories followed, symlinks
/// not.
fn list_paths(dir: &Path, rel: &Path, out: &mut Vec<u8>) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    for e in fs_err::read_dir(dir)? {
        let e = e?;
        let ft = e.file_type()?;
        let r = rel.join(e.file_name());
        if ft.is_dir() {
            list_paths(&e.path(), &r, out)?;
        } else if ft.is_file() || ft.is_symlink() {
            out.extend_from_slice(r.as_os_str().as_bytes());
            out.push(0);
        } else {
            bail!("{} is not a file, directory or symlink", e.path().display());
        }
    }
    Ok(())
}

/// The direction and payload of a line of git's packet trace
/// (`GIT_TRACE_PACKET`): `12:00:00.000000 pkt-line.c:86  packet:  fetch< version 2`
/// gives `("fetch<", "version 2")`; `None` for any other line.
fn packet_trace(line: &str) -> Option<(&str, &str)> {
    let (_, rest) = line.split_once(" packet: ")?;
    let rest = rest.trim_start();
    Some(rest.split_once(' ').unwrap_or((rest, "")))
}

/// Whether `line` traces a packet git received (`fetch<`, `ls-remote<`,
/// `git<`): the repository has answered.
fn received_packet(line: &str) -> bool {
    packet_trace(line).is_some_and(|(who, _)| who.ends_with('<'))
}

/// `url` as git should get it when it runs in another directory (`-C`): a
/// relative local path made absolute against the current directory (as
/// libgit2 reads it); URLs (`scheme://`), absolute paths and scp-like
/// `host:path` unchanged.
fn absolute_local(url: &str) -> String {
    let scp_like = url
        .find(':')
        .is_some_and(|colon| url.find('/').is_none_or(|slash| colon < slash));
    if url.contains("://") || url.starts_with('/') || scp_like {
        return url.to_string();
    }
    std::path::absolute(url).map_or_else(|_| url.to_string(), |p| p.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::{absolute_local, packet_trace, received_packet};

    #[test]
    fn packet_traces_are_told_from_git_messages() {
        let got = "13:32:35.257843 pkt-line.c:86           packet:        fetch< version 2";
        assert_eq!(packet_trace(got), Some(("fetch<", "version 2")));
        assert!(received_packet(got));
        let sent = "13:32:35.257910 pkt-line.c:86           packet:        fetch> command=ls-refs";
        assert!(packet_trace(sent).is_some() && !received_packet(sent));
        for plain in ["remote: Counting objects: 3", "fatal: unable to access 'x'"] {
            assert_eq!(packet_trace(plain), None);
        }
    }

    #[test]
    fn only_relative_local_paths_are_made_absolute() {
        for url in [
            "https://github.com/vllm-project/vllm",
            "file:///srv/vllm.git",
            "/srv/vllm.git",
            "git@github.com:vllm-project/vllm.git",
        ] {
            assert_eq!(absolute_local(url), url);
        }
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            absolute_local("./repo"),
            cwd.join("repo").display().to_string()
        );
        assert_eq!(
            absolute_local("repo"),
            cwd.join("repo").display().to_string()
        );
    }
}
