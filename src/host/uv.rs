//! Thin wrapper over the `uv` CLI: venv creation and installs.
//!
//! uv is the resolver and installer; this tool decides what goes in and keeps
//! the logs. Python downloads are always disabled: the interpreter is the one
//! the toolchain found and recorded.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::host::process::run_logged;
use crate::host::toolchain::Tool;
use crate::progress::Progress;

/// uv with the recipe's package indexes.
#[derive(Debug, Clone)]
pub struct Uv {
    /// The uv binary that ran.
    pub tool: Tool,
    /// Extra indexes, highest priority first (`--index`).
    pub indexes: Vec<String>,
    /// No network at all (`--offline`).
    pub offline: bool,
    /// uv's cache (`UV_CACHE_DIR`): the store's own `<root>/uv-cache`, so
    /// venvs can hard-link from it without touching the user's uv cache.
    /// `None`: uv's default cache, and installs copy instead of linking.
    pub cache_dir: Option<PathBuf>,
    /// uv's scratch (`TMPDIR`: its build locks, its unpacked source
    /// distributions): the store's `<root>/uv-tmp`, so nothing is left in
    /// the machine's `/tmp`. `None`: the caller's `TMPDIR`.
    pub tmp_dir: Option<PathBuf>,
}

impl Uv {
    fn cmd(&self, args: Vec<String>) -> duct::Expression {
        let expr = duct::cmd(&self.tool.path, args)
            .env("UV_PYTHON_DOWNLOADS", "never")
            .env("UV_NO_PROGRESS", "1")
            .env_remove("VIRTUAL_ENV")
            .env_remove("UV_PROJECT_ENVIRONMENT")
            .env_remove("UV_EXCLUDE_NEWER")
            .env_remove("UV_INDEX_URL")
            .env_remove("UV_EXTRA_INDEX_URL")
            .env_remove("UV_FIND_LINKS");
        let expr = match &self.tmp_dir {
            Some(dir) => expr.env("TMPDIR", dir),
            None => expr,
        };
        match &self.cache_dir {
            Some(dir) => expr
                .env("UV_CACHE_DIR", dir)
                .env("UV_LINK_MODE", "hardlink"),
            None => expr.env("UV_LINK_MODE", "copy"),
        }
    }

    fn common(&self) -> Vec<String> {
        let mut args = Vec::new();
        for index in &self.indexes {
            args.push("--index".into());
            args.push(index.clone());
        }
        if self.offline {
            args.push("--offline".into());
        }
        args
    }

    /// `uv venv [--relocatable] --python <python> <dir>`, logged to `log`.
    pub fn venv(&self, python: &Path, dir: &Path, relocatable: bool, log: &Path) -> Result<()> {
        let mut args: Vec<String> = vec![
            "venv".into(),
            "--no-project".into(),
            "--python".into(),
            python.display().to_string(),
        ];
        if relocatable {
            args.push("--relocatable".into());
        }
        args.push(dir.display().to_string());
        run_logged("uv venv", self.cmd(args), log, &Progress::new("venv"))?;
        // The store is not a cache: backup tools must not skip an oracle.
        for marker in ["CACHEDIR.TAG", ".lock"] {
            let path = dir.join(marker);
            if path.exists() {
                fs_err::remove_file(path)?;
            }
        }
        Ok(())
    }

    /// `uv pip install --python <venv python> <args...>` with the indexes, logged to `log`.
    pub fn pip_install(&self, venv: &Path, args: &[String], log: &Path) -> Result<()> {
        let mut all: Vec<String> = vec![
            "pip".into(),
            "install".into(),
            "--python".into(),
            venv.join("bin/python").display().to_string(),
        ];
        all.extend(self.common());
        all.extend(args.iter().cloned());
        run_logged(
            "uv pip install",
            self.cmd(all),
            log,
            &Progress::new("install"),
        )
    }

    /// `uv build --wheel --no-build-isolation --python <venv python> --out-dir <out> <src>`
    /// with extra environment `env` (and `remove` unset), logged to `log`.
    #[allow(clippy::too_many_arguments)]
    pub fn build_wheel(
        &self,
        venv: &Path,
        src: &Path,
        out: &Path,
        env: &[(String, String)],
        remove: &[String],
        log: &Path,
        progress: &Progress,
    ) -> Result<()> {
        let mut args: Vec<String> = vec![
            "build".into(),
            "--wheel".into(),
            "--no-build-isolation".into(),
            "--python".into(),
            venv.join("bin/python").display().to_string(),
            "--out-dir".into(),
            out.display().to_string(),
        ];
        args.extend(self.common());
        args.push(src.display().to_string());
        let mut expr = self.cmd(args).dir(src);
        for k in remove {
            expr = expr.env_remove(k);
        }
        for (k, v) in env {
            expr = expr.env(k, v);
        }
        run_logged("uv build --wheel --no-build-isolation", expr, log, progress)
    }
}

/// What [`Uv::cache_clean`] removes from uv's cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheClean {
    /// Every cache entry of these distributions (`uv cache clean <name>...`):
    /// their unpacked wheels, so the next install unpacks them again.
    Packages(Vec<String>),
    /// The whole cache (`uv cache clean`).
    Everything,
}

impl Uv {
    /// Removes `what` from uv's cache with uv's own `uv cache clean`, so
    /// the next install unpacks those wheels again into new files: a file
    /// of a venv hard-linked from the cache and rewritten in place has
    /// changed the cache's copy too, and linking it again would carry the
    /// damage into the rebuilt venv. uv 0.13.9 removes the unpacked
    /// archives of the named packages (`archive-v0/`), whether they came
    /// from `--find-links` or a direct `file://` wheel; a later install from
    /// the same local wheel unpacks it again (checked by experiment:
    /// `--refresh`/`--refresh-package` are refused together with
    /// `--offline`, which every locked install uses). uv waits while
    /// another uv process uses the cache. Logged to `log`.
    ///
    /// Does nothing when this uv has no cache of the store's
    /// (`cache_dir` is `None`: installs copy, so no venv shares a file
    /// with that cache) or when `what` names no package.
    ///
    /// Errors: uv fails (the error quotes its output and names the log).
    pub fn cache_clean(&self, what: &CacheClean, log: &Path) -> Result<()> {
        if self.cache_dir.is_none() {
            return Ok(());
        }
        let mut args: Vec<String> = vec!["cache".into(), "clean".into()];
        match what {
            CacheClean::Packages(names) if names.is_empty() => return Ok(()),
            CacheClean::Packages(names) => args.extend(names.iter().cloned()),
            CacheClean::Everything => {}
        }
        run_logged(
            "uv cache clean",
            self.cmd(args),
            log,
            &Progress::new("venv"),
        )
    }

    /// `uv pip compile <args...>` with the indexes (and `--offline` when set),
    /// logged to `log`. The caller passes the inputs, `--format`, `-o` and
    /// the flags that make the output byte-stable (`--no-header`, `--no-annotate`).
    ///
    /// Errors: resolution fails (the error quotes uv's output and names the log).
    pub fn pip_compile(&self, args: &[String], log: &Path) -> Result<()> {
        let mut all: Vec<String> = vec!["pip".into(), "compile".into(), "--quiet".into()];
        all.extend(self.common());
        all.extend(args.iter().cloned());
        run_logged("uv pip compile", self.cmd(all), log, &Progress::new("lock"))
    }

    /// Whether one requirement (`name==version`, PEP 508) can be found on
    /// this uv's indexes for Python `python_version` on this host: `uv pip
    /// compile - --no-deps` of that line, its output thrown away, within
    /// `timeout`. Returns `None` when uv resolves it, else the last lines
    /// uv printed (why it could not). Used by the preflight to ask whether
    /// a package still has a source once the site drops an index (issue
    /// 43): uv decides, with its own index rules (the default index, each
    /// `--index`), not a copy of them.
    ///
    /// Errors: uv cannot be started.
    pub fn finds(
        &self,
        requirement: &str,
        python_version: &str,
        timeout: std::time::Duration,
    ) -> Result<Option<String>> {
        let mut all: Vec<String> = vec![
            "pip".into(),
            "compile".into(),
            "-".into(),
            "--quiet".into(),
            "--no-deps".into(),
            "--no-header".into(),
            "--python-version".into(),
            python_version.into(),
        ];
        all.extend(self.common());
        let expr = self.cmd(all).stdin_bytes(format!("{requirement}\n"));
        match crate::host::process::capture_within(
            "uv pip compile",
            expr,
            timeout,
            "the preflight's index question",
        ) {
            Ok(_) => Ok(None),
            Err(e) => {
                let text = format!("{e:#}");
                if text.starts_with("cannot run") {
                    return Err(e);
                }
                let why: Vec<&str> = text
                    .lines()
                    .skip(1)
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect();
                Ok(Some(if why.is_empty() { text } else { why.join(" ") }))
            }
        }
    }

    /// Installs exactly a hash-pinned requirements file from local files only:
    /// `uv pip install --python <venv python> --offline --no-index
    /// --require-hashes --find-links <links> -r <requirements> <extra...>`.
    /// No index is consulted, whatever the recipe's indexes (the artifacts were
    /// fetched into the wheelhouse beforehand).
    ///
    /// Errors: an artifact is missing from `links`, a hash differs, or the
    /// set is incomplete (uv names the package).
    pub fn pip_install_locked(
        &self,
        venv: &Path,
        requirements: &Path,
        links: &Path,
        extra: &[String],
        log: &Path,
    ) -> Result<()> {
        let mut all: Vec<String> = vec![
            "pip".into(),
            "install".into(),
            "--python".into(),
            venv.join("bin/python").display().to_string(),
            "--offline".into(),
            "--no-index".into(),
            "--require-hashes".into(),
            "--find-links".into(),
            links.display().to_string(),
            "-r".into(),
            requirements.display().to_string(),
        ];
        all.extend(extra.iter().cloned());
        run_logged(
            "uv pip install (locked, from the wheelhouse)",
            self.cmd(all),
            log,
            &Progress::new("install"),
        )
    }
}

/// Requirement lines `name==version` for each pin, sorted by name.
pub fn pin_lines(pins: &std::collections::BTreeMap<String, String>) -> String {
    pins.iter().map(|(n, v)| format!("{n}=={v}\n")).collect()
}

/// The URLs of the recipe's plain indexes, in order (`--index <url>`);
/// explicit indexes are given to uv through a generated project instead
/// (see [`explicit_project`]).
pub fn plain_indexes(indexes: &[crate::recipe::Index]) -> Vec<String> {
    indexes
        .iter()
        .filter_map(|i| match i {
            crate::recipe::Index::Url(u) => Some(u.clone()),
            crate::recipe::Index::Explicit { .. } => None,
        })
        .collect()
}

/// A `pyproject.toml` that makes uv take each package of an explicit index
/// only from it: the packages as dependencies, one `[[tool.uv.index]]`
/// (`explicit = true`) per index and a `[tool.uv.sources]` entry per package
/// (uv docs, "Package indexes": pinning a package to an index). `None` when
/// the recipe has no explicit index. Passed as an input to `uv pip compile`,
/// it adds those packages to the locked set, as a pin does.
pub fn explicit_project(indexes: &[crate::recipe::Index]) -> Option<String> {
    use toml::{Table, Value};
    let mut deps = Vec::new();
    let mut idx = Vec::new();
    let mut sources = Table::new();
    for i in indexes {
        if let crate::recipe::Index::Explicit {
            name,
            url,
            packages,
        } = i
        {
            let mut t = Table::new();
            t.insert("name".into(), Value::String(name.clone()));
            t.insert("url".into(), Value::String(url.clone()));
            t.insert("explicit".into(), Value::Boolean(true));
            idx.push(Value::Table(t));
            for p in packages {
                deps.push(Value::String(p.clone()));
                let mut src = Table::new();
                src.insert("index".into(), Value::String(name.clone()));
                sources.insert(p.clone(), Value::Table(src));
            }
        }
    }
    if idx.is_empty() {
        return None;
    }
    let mut project = Table::new();
    project.insert(
        "name".into(),
        Value::String("oracle-build-locked-set".into()),
    );
    project.insert("version".into(), Value::String("0".into()));
    project.insert("dependencies".into(), Value::Array(deps));
    let mut uv = Table::new();
    uv.insert("index".into(), Value::Array(idx));
    uv.insert("sources".into(), Value::Table(sources));
    let mut tool = Table::new();
    tool.insert("uv".into(), Value::Table(uv));
    let mut doc = Table::new();
    doc.insert("project".into(), Value::Table(project));
    doc.insert("tool".into(), Value::Table(tool));
    toml::to_string(&doc).ok()
}

/// The index an artifact URL was served from: the name of the explicit
/// index (or the URL of the plain index) whose URL, without a trailing
/// `/simple` and `/`, starts it; else `default` (the default index, whose
/// files live on another host, e.g. files.pythonhosted.org for PyPI).
pub fn index_of(indexes: &[crate::recipe::Index], artifact_url: &str) -> String {
    for i in indexes {
        let base = i.url().trim_end_matches('/');
        let base = base.strip_suffix("/simple").unwrap_or(base);
        if !base.is_empty() && artifact_url.starts_with(base) {
            return match i {
                crate::recipe::Index::Explicit { name, .. } => name.clone(),
                crate::recipe::Index::Url(u) => u.clone(),
            };
        }
    }
    "default".into()
}
