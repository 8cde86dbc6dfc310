//! Thin wrapper over the `uv` CLI: venv creation and installs.
//!
//! uv is the resolver and installer; this tool decides what goes in and keeps
//! the logs. Python downloads are always disabled: the interpreter is the one
//! the toolchain found and recorded.

use std::path::Path;

use anyhow::Result;

use crate::process::run_logged;
use crate::progress::Progress;
use crate::toolchain::Tool;

/// uv with the recipe's package indexes.
#[derive(Debug, Clone)]
pub struct Uv {
    /// The uv binary that ran.
    pub tool: Tool,
    /// Extra indexes, highest priority first (`--index`).
    pub indexes: Vec<String>,
    /// No network at all (`--offline`).
    pub offline: bool,
}

impl Uv {
    fn cmd(&self, args: Vec<String>) -> duct::Expression {
        duct::cmd(&self.tool.path, args)
            .env("UV_PYTHON_DOWNLOADS", "never")
            .env("UV_NO_PROGRESS", "1")
            .env_remove("VIRTUAL_ENV")
            .env_remove("UV_PROJECT_ENVIRONMENT")
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

/// Requirement lines `name==version` for each pin, sorted by name.
pub fn pin_lines(pins: &std::collections::BTreeMap<String, String>) -> String {
    pins.iter().map(|(n, v)| format!("{n}=={v}\n")).collect()
}
