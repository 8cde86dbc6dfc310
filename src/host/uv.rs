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

impl Uv {
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
