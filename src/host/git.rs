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
//! repositories. No step ever prompts (`GIT_TERMINAL_PROMPT=0`).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::host::process;

/// The git program found on PATH.
#[derive(Debug, Clone, PartialEq)]
pub struct Git {
    /// Absolute path of `git`.
    pub path: PathBuf,
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
        which::which("git").ok().map(|path| Git { path })
    }

    fn command(&self, config: Config, args: Vec<std::ffi::OsString>) -> duct::Expression {
        let mut all: Vec<std::ffi::OsString> = Vec::new();
        for setting in [
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
        ] {
            all.push("-c".into());
            all.push(setting.into());
        }
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

    /// Fetches `refspecs` from `url` into the repository at `repo` (the
    /// mirror's refspecs name every tag). On a terminal, git
    /// draws its own progress on stderr; otherwise its output is kept for the
    /// error.
    ///
    /// Errors: the fetch fails (the message names `url` and holds git's
    /// output, or points at it above on a terminal).
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
        let terminal = std::io::stderr().is_terminal();
        args.push(if terminal { "--progress" } else { "--quiet" }.into());
        args.extend(options.iter().map(Into::into));
        // After `--`, the URL is never an option.
        args.push("--".into());
        args.push(absolute_local(url).into());
        args.extend(refspecs.iter().map(Into::into));
        let cmd = self.command(Config::User, args);
        if terminal {
            let status = cmd
                .stdout_null()
                .unchecked()
                .run()
                .with_context(|| format!("cannot run {}", self.path.display()))?
                .status;
            if !status.success() {
                bail!("fetching {url}: git fetch failed ({status}); its messages are above");
            }
            return Ok(());
        }
        process::capture(&format!("git fetch {url}"), cmd)
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
        process::capture(
            &format!("git ls-remote {url}"),
            self.command(Config::User, args),
        )
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
            .run(
                Config::User,
                dir,
                &["ls-remote", "--", &absolute_local(url)],
            )
            .with_context(|| format!("listing the refs of {url}"))?;
        let has = |name: &str| {
            listed
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(name))
        };
        let is_sha = rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit());
        let named = [format!("refs/tags/{rev}"), format!("refs/heads/{rev}")]
            .into_iter()
            .find(|r| has(r));
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
            let mut args: Vec<&str> = Vec::new();
            for c in url_config {
                args.extend(["-c", c.as_str()]);
            }
            args.extend(["submodule", "update", "--init", "--recursive", "--quiet"]);
            self.run(Config::User, dir, &args)
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
    use super::absolute_local;

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
