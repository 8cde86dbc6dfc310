//! The runtime set a package declares, read from its core metadata
//! (`Requires-Dist`, PEP 566 / core metadata 2.x), and the check that a
//! runtime lock meets it.
//!
//! Two places ask the tree what it installs, never a copy of its logic:
//!
//! - before a build, `oracle-build lock` calls the PEP 517 hook
//!   `prepare_metadata_for_build_wheel` of the tree's build backend in the
//!   locked build venv ([`hook_metadata`]); vLLM's `setup.py` computes
//!   `install_requires` there from `VLLM_TARGET_DEVICE`;
//! - after a build, the built wheel's own `*.dist-info/METADATA`
//!   ([`wheel_metadata`]) is what [`check`] holds the lock against, before
//!   anything is installed.
//!
//! Requirements, markers and versions are PEP 508 / PEP 440 (`pep508_rs`,
//! `pep440_rs`); markers are evaluated for the target interpreter
//! ([`marker_env`], the PEP 508 "Environment Markers" sample code run by it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use pep508_rs::{ExtraName, MarkerEnvironment, PackageName, Requirement, VersionOrUrl};
use serde::{Deserialize, Serialize};

use crate::host::process::capture;

/// PEP 508's sample code for the marker environment, printed as JSON with
/// the keys `pep508_rs::MarkerEnvironment` deserializes.
const MARKER_ENV_PY: &str = r#"
import json, os, platform, sys
def fmt(info):
    v = "{0.major}.{0.minor}.{0.micro}".format(info)
    if info.releaselevel != "final":
        v += info.releaselevel[0] + str(info.serial)
    return v
print(json.dumps({
    "implementation_name": sys.implementation.name,
    "implementation_version": fmt(sys.implementation.version),
    "os_name": os.name,
    "platform_machine": platform.machine(),
    "platform_python_implementation": platform.python_implementation(),
    "platform_release": platform.release(),
    "platform_system": platform.system(),
    "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "python_version": ".".join(platform.python_version_tuple()[:2]),
    "sys_platform": sys.platform,
}))
"#;

/// How [`MARKER_ENV_PY`] is run: isolated (`-I`: no `PYTHON*` variables,
/// no user site, so no module on a path of the user's shadows `platform`)
/// and without `site` (`-S`: its `.pth` files change no marker and took a
/// third of the run).
const MARKER_ENV_ARGS: [&str; 4] = ["-I", "-S", "-c", MARKER_ENV_PY];

/// Calls the tree's PEP 517 backend: `prepare_metadata_for_build_wheel(out)`
/// (PEP 517, optional hook), printing the METADATA it wrote. The backend is
/// `[build-system].build-backend` of pyproject.toml (setuptools' legacy
/// backend when absent, as PEP 517 says). Exit 3: the backend has no such hook.
const HOOK_PY: &str = r#"
import importlib, os, sys
try:
    import tomllib
except ImportError:
    tomllib = None
out = sys.argv[1]
backend = "setuptools.build_meta:__legacy__"
if os.path.isfile("pyproject.toml") and tomllib is not None:
    with open("pyproject.toml", "rb") as f:
        backend = tomllib.load(f).get("build-system", {}).get("build-backend", backend)
mod, _, obj = backend.partition(":")
hooks = importlib.import_module(mod)
for part in filter(None, obj.split(".")):
    hooks = getattr(hooks, part)
hook = getattr(hooks, "prepare_metadata_for_build_wheel", None)
if hook is None:
    sys.exit(3)
sys.path.insert(0, os.getcwd())
name = hook(out)
with open(os.path.join(out, name, "METADATA"), encoding="utf-8") as f:
    sys.stdout.write("\n----- METADATA -----\n" + f.read())
"#;

/// The marker environment of the interpreter `python` (the recipe's Python).
///
/// Errors: it cannot run, or prints something that is not a marker environment.
pub fn marker_env(python: &Path) -> Result<MarkerEnvironment> {
    let out = capture(
        "python (marker environment)",
        duct::cmd(python, MARKER_ENV_ARGS),
    )?;
    serde_json::from_str(&out).with_context(|| {
        format!(
            "{} printed no PEP 508 marker environment: {out}",
            python.display()
        )
    })
}

/// [`marker_env`] of `python` as seen on another target `platform`
/// (`None`: this host): `platform_machine` becomes the target's machine
/// (`x86_64`, `aarch64`), and the OS keys Linux's (`sys_platform` `linux`,
/// `platform_system` `Linux`, `os_name` `posix`); the Python keys stay the
/// interpreter's. PEP 508 "Environment Markers".
///
/// Errors: as [`marker_env`].
pub fn marker_env_on(
    python: &Path,
    platform: Option<&crate::host::platform::Platform>,
) -> Result<MarkerEnvironment> {
    let Some(p) = platform else {
        return marker_env(python);
    };
    let out = capture(
        "python (marker environment)",
        duct::cmd(python, MARKER_ENV_ARGS),
    )?;
    let mut v: serde_json::Value = serde_json::from_str(&out).with_context(|| {
        format!(
            "{} printed no PEP 508 marker environment: {out}",
            python.display()
        )
    })?;
    for (k, val) in [
        ("platform_machine", p.arch.as_str()),
        ("sys_platform", "linux"),
        ("platform_system", "Linux"),
        ("os_name", "posix"),
    ] {
        v[k] = serde_json::Value::String(val.to_string());
    }
    serde_json::from_value(v).context("the marker environment of the target platform")
}

/// The core metadata of the wheel at `wheel` (see
/// [`crate::store::wheelname::read_metadata`]).
///
/// Errors: not a wheel, or it holds no single `*.dist-info/METADATA`
/// (the message names the wheel).
pub fn wheel_metadata(wheel: &Path) -> Result<String> {
    crate::store::wheelname::read_metadata(wheel)
        .map_err(|e| anyhow::anyhow!("reading the metadata of {}: {e}", wheel.display()))
}

/// Runs the PEP 517 hook `prepare_metadata_for_build_wheel` of the tree at
/// `tree` (a writable copy: setuptools writes `*.egg-info` and setuptools-scm
/// a version file into it) with the build venv's `python` and the extra
/// environment `env`. `Ok(None)` when the backend has no such hook.
///
/// Errors: the hook fails (its output's tail is quoted: vLLM's cuda metadata,
/// for one, runs `nvcc -V`): with [`TreeDeclined`] as its cause, unless
/// its output says the disk is full.
pub fn hook_metadata(
    python: &Path,
    tree: &Path,
    out: &Path,
    env: &[(String, String)],
    remove: &[&str],
) -> Result<Option<String>> {
    fs_err::create_dir_all(out)?;
    let args = [
        std::ffi::OsStr::new("-c"),
        HOOK_PY.as_ref(),
        out.as_os_str(),
    ];
    let mut expr = duct::cmd(python, args)
        .dir(tree)
        .stdout_capture()
        .stderr_capture()
        .unchecked();
    for k in remove {
        expr = expr.env_remove(k);
    }
    for (k, v) in env {
        expr = expr.env(k, v);
    }
    let res = expr
        .run()
        .with_context(|| format!("cannot run {}", python.display()))?;
    let stdout = String::from_utf8_lossy(&res.stdout).into_owned();
    if res.status.code() == Some(3) {
        return Ok(None);
    }
    if !res.status.success() {
        let text = stdout + &String::from_utf8_lossy(&res.stderr);
        let full = format!(
            "prepare_metadata_for_build_wheel in {} failed ({}):\n{}",
            tree.display(),
            res.status,
            crate::host::process::tail(&text, 20)
        );
        if text.contains("No space left on device") {
            bail!("{full}");
        }
        let last = text
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .unwrap_or_default();
        return Err(anyhow::Error::new(TreeDeclined(format!(
            "prepare_metadata_for_build_wheel failed ({}): {last}",
            res.status
        )))
        .context(full));
    }
    match stdout.split_once("\n----- METADATA -----\n") {
        Some((_, meta)) => Ok(Some(meta.to_string())),
        None => bail!(
            "prepare_metadata_for_build_wheel in {} printed no METADATA",
            tree.display()
        ),
    }
}

/// The tree's own answer that it cannot give its metadata: its build
/// backend has no `prepare_metadata_for_build_wheel` hook, the hook failed
/// in the tree's code (vLLM's CUDA metadata runs `nvcc -V`), or the tree
/// declares no build requirements. The one failure of the lock's metadata
/// step after which the lock falls back to the requirement files (a full
/// disk never counts as one). The text is the reason recorded in
/// `lock.json`: it names no scratch path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeDeclined(pub String);

impl std::fmt::Display for TreeDeclined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TreeDeclined {}

/// One header of core metadata (RFC 822 style): the values of `field`, in
/// order, from the header block (up to the first empty line).
pub fn header_values<'a>(metadata: &'a str, field: &str) -> Vec<&'a str> {
    metadata
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(field).then(|| v.trim())
        })
        .collect()
}

/// The `Requires-Dist` requirements of `metadata` (PEP 508 each).
///
/// Errors: one does not parse (names `origin` and the line).
pub fn requires_dist(metadata: &str, origin: &str) -> Result<Vec<Requirement>> {
    header_values(metadata, "Requires-Dist")
        .into_iter()
        .map(|line| {
            Requirement::from_str(line)
                .with_context(|| format!("{origin}: Requires-Dist {line:?} is not PEP 508"))
        })
        .collect()
}

/// The requirements of `reqs` that apply in `env` with the extras `extras`
/// requested (PEP 508 marker evaluation; `extra == "x"` is true only for a
/// requested extra).
pub fn active(
    reqs: &[Requirement],
    env: &MarkerEnvironment,
    extras: &[ExtraName],
) -> Vec<Requirement> {
    reqs.iter()
        .filter(|r| r.evaluate_markers(env, extras))
        .cloned()
        .collect()
}

/// The extras `wanted` (the recipe's `install.extras`, written in
/// `origin`) as PEP 685 names, each checked against the `Provides-Extra`
/// of `metadata` (core metadata 2.1+).
///
/// Errors (exit 2): an extra is no extra name, or the package declares no
/// such extra (the message names the extras it declares).
pub fn requested_extras(metadata: &str, wanted: &[String], origin: &str) -> Result<Vec<ExtraName>> {
    let declared: Vec<ExtraName> = header_values(metadata, "Provides-Extra")
        .into_iter()
        .filter_map(|x| ExtraName::from_str(x).ok())
        .collect();
    let name = header_values(metadata, "Name")
        .first()
        .map_or_else(|| "the package".to_string(), |n| n.to_string());
    let mut out = Vec::new();
    for (i, w) in wanted.iter().enumerate() {
        let x = ExtraName::from_str(w).map_err(|e| {
            crate::exit::bad_input(format!(
                "{origin}: field `install.extras[{i}]`: {w:?} is not an extra name ({e})"
            ))
        })?;
        if !declared.contains(&x) {
            let list = if declared.is_empty() {
                "none".to_string()
            } else {
                join_extras(&declared)
            };
            return Err(crate::exit::bad_input(format!(
                "{origin}: field `install.extras[{i}]`: {name} declares no extra {w:?} (its metadata's Provides-Extra: {list})"
            )));
        }
        out.push(x);
    }
    Ok(out)
}

/// Where a lock's runtime set came from.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RuntimeSource {
    /// The tree's metadata, through the PEP 517 hook
    /// `prepare_metadata_for_build_wheel`: its active `Requires-Dist`.
    Metadata {
        /// The active requirements, as written in the metadata.
        requires_dist: Vec<String>,
    },
    /// The requirement files the tree's setup.py reads (vLLM:
    /// `requirements/<device>.txt`, `requirements/common.txt` for `empty`),
    /// because the hook could not run here.
    Files {
        /// The files, relative to the checkout.
        files: Vec<String>,
        /// Why the hook was not used.
        reason: String,
    },
    /// The runtime set was not derived by this version of the tool (a lock
    /// written before the source was recorded).
    #[default]
    Unknown,
}

impl RuntimeSource {
    /// One line for progress output and `lock`'s report.
    pub fn describe(&self) -> String {
        match self {
            RuntimeSource::Metadata { requires_dist } => format!(
                "the tree's metadata (PEP 517 prepare_metadata_for_build_wheel): {} requirement(s)",
                requires_dist.len()
            ),
            RuntimeSource::Files { files, reason } => format!(
                "the requirement file(s) {} (fallback: {reason})",
                files.join(", ")
            ),
            RuntimeSource::Unknown => "unknown (lock made by an older oracle-build)".into(),
        }
    }
}

/// One locked package as [`check`] sees it: its name and version (PEP 751
/// `[[packages]]` `name`, `version`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockedVersion {
    /// The package name as locked.
    pub name: String,
    /// The locked version (PEP 440).
    pub version: String,
}

/// A declared requirement the lock does not meet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unmet {
    /// The requirement as declared, e.g. `idna>=3` (with the extra it came
    /// through, `requests[socks]: PySocks>=1.5`).
    pub requirement: String,
    /// What the lock has instead.
    pub found: String,
}

/// Checks that every requirement of `reqs` is met by `locked` (normalized
/// names, PEP 440 specifiers), with `pins` (name -> version) overriding the
/// declared specifiers as they do at lock time. A requirement with extras is
/// followed: the extra's own requirements, read from the locked package's
/// metadata by `metadata_of(name, version)` (`None`: not available, nothing
/// more is checked for it), are checked the same way. `extras` are the
/// package's own extras requested (the recipe's `install.extras`): their
/// requirements must be met too.
pub fn check(
    reqs: &[Requirement],
    env: &MarkerEnvironment,
    extras: &[ExtraName],
    locked: &[LockedVersion],
    pins: &BTreeMap<String, String>,
    metadata_of: &dyn Fn(&LockedVersion) -> Option<String>,
) -> Vec<Unmet> {
    let by_name: BTreeMap<PackageName, &LockedVersion> = locked
        .iter()
        .filter_map(|p| PackageName::from_str(&p.name).ok().map(|n| (n, p)))
        .collect();
    let pinned: BTreeMap<PackageName, &String> = pins
        .iter()
        .filter_map(|(n, v)| PackageName::from_str(n).ok().map(|n| (n, v)))
        .collect();
    let mut unmet = Vec::new();
    let mut followed: BTreeSet<(PackageName, ExtraName)> = BTreeSet::new();
    let mut queue: Vec<(Requirement, Option<String>)> = active(reqs, env, extras)
        .into_iter()
        .map(|r| (r, None))
        .collect();
    while let Some((req, via)) = queue.pop() {
        let shown = match &via {
            Some(v) => format!("{v}: {req}"),
            None => req.to_string(),
        };
        let Some(pkg) = by_name.get(&req.name) else {
            unmet.push(Unmet {
                requirement: shown,
                found: "no such package in the lock".into(),
            });
            continue;
        };
        let version = match pep440_rs::Version::from_str(&pkg.version) {
            Ok(v) => v,
            Err(e) => {
                unmet.push(Unmet {
                    requirement: shown,
                    found: format!("{} {} (not a PEP 440 version: {e})", pkg.name, pkg.version),
                });
                continue;
            }
        };
        if let Some(pin) = pinned.get(&req.name) {
            // The recipe's pin overrides the declared specifier.
            if pep440_rs::Version::from_str(pin).ok().as_ref() != Some(&version) {
                unmet.push(Unmet {
                    requirement: format!("{shown} (pinned =={pin} by the recipe)"),
                    found: format!("{} {}", pkg.name, pkg.version),
                });
            }
        } else if let Some(VersionOrUrl::VersionSpecifier(spec)) = &req.version_or_url
            && !spec.contains(&version)
        {
            unmet.push(Unmet {
                requirement: shown.clone(),
                found: format!("{} {}", pkg.name, pkg.version),
            });
        }
        let new: Vec<ExtraName> = req
            .extras
            .iter()
            .filter(|x| followed.insert((req.name.clone(), (*x).clone())))
            .cloned()
            .collect();
        if new.is_empty() {
            continue;
        }
        let Some(meta) = metadata_of(pkg) else {
            continue;
        };
        let Ok(theirs) = requires_dist(&meta, &pkg.name) else {
            continue;
        };
        let base = active(&theirs, env, &[]);
        for r in active(&theirs, env, &new) {
            if !base.contains(&r) {
                let via = format!("{}[{}]", req.name, join_extras(&new));
                queue.push((r, Some(via)));
            }
        }
    }
    unmet.sort_by(|a, b| a.requirement.cmp(&b.requirement));
    unmet
}

fn join_extras(x: &[ExtraName]) -> String {
    x.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> MarkerEnvironment {
        serde_json::from_value(serde_json::json!({
            "implementation_name": "cpython", "implementation_version": "3.11.7",
            "os_name": "posix", "platform_machine": "x86_64",
            "platform_python_implementation": "CPython", "platform_release": "6.1",
            "platform_system": "Linux", "platform_version": "#1",
            "python_full_version": "3.11.7", "python_version": "3.11", "sys_platform": "linux",
        }))
        .unwrap()
    }

    fn pkg(name: &str, version: &str) -> LockedVersion {
        LockedVersion {
            name: name.into(),
            version: version.into(),
        }
    }

    const META: &str = "Metadata-Version: 2.4\nName: fixturellm\nVersion: 0.1\n\
Requires-Dist: packaging>=23\nRequires-Dist: Six==1.17.0\n\
Requires-Dist: tomli; python_version < \"3.11\"\n\
Requires-Dist: idna[all]>=3; sys_platform == \"linux\"\n\
Requires-Dist: pytest; extra == \"test\"\n\nRequires-Dist: body-not-a-header\n";

    #[test]
    fn reads_requires_dist_and_evaluates_markers() {
        let reqs = requires_dist(META, "METADATA").unwrap();
        assert_eq!(reqs.len(), 5);
        let names: Vec<String> = active(&reqs, &env(), &[])
            .iter()
            .map(|r| r.name.to_string())
            .collect();
        assert_eq!(names, ["packaging", "six", "idna"]);
    }

    #[test]
    fn a_missing_or_contradicting_lock_is_named_and_pins_override() {
        let reqs = requires_dist(META, "METADATA").unwrap();
        let none = |_: &LockedVersion| None;
        let lock = vec![pkg("packaging", "24.1"), pkg("six", "1.16.0")];
        let unmet = check(&reqs, &env(), &[], &lock, &BTreeMap::new(), &none);
        let shown: Vec<&str> = unmet.iter().map(|u| u.requirement.as_str()).collect();
        assert_eq!(shown.len(), 2, "{unmet:?}");
        assert!(shown[0].starts_with("idna[all]>=3"), "{unmet:?}");
        assert!(shown[1].starts_with("six==1.17.0"), "{unmet:?}");
        assert_eq!(unmet[1].found, "six 1.16.0");
        // A pin replaces the declared specifier (and must be what is locked).
        let lock = vec![
            pkg("packaging", "22.0"),
            pkg("Six", "1.17.0"),
            pkg("idna", "3.7"),
        ];
        let pins = BTreeMap::from([("packaging".to_string(), "22.0".to_string())]);
        assert!(check(&reqs, &env(), &[], &lock, &pins, &none).is_empty());
        let pins = BTreeMap::from([("packaging".to_string(), "25.0".to_string())]);
        assert_eq!(check(&reqs, &env(), &[], &lock, &pins, &none).len(), 1);
    }

    #[test]
    fn requested_extras_must_be_declared_and_add_their_requirements() {
        let meta = "Name: fixturellm\nProvides-Extra: bench\nRequires-Dist: six>=1.16; extra == \"bench\"\n";
        let x = requested_extras(meta, &["Bench".into()], "r.yaml").unwrap();
        let reqs = requires_dist(meta, "METADATA").unwrap();
        assert!(active(&reqs, &env(), &[]).is_empty());
        assert_eq!(active(&reqs, &env(), &x).len(), 1);
        let e = requested_extras(meta, &["nope".into()], "r.yaml").unwrap_err();
        assert_eq!(crate::exit::code_of(&e), 2);
        let t = format!("{e:#}");
        assert!(
            t.contains("install.extras[0]") && t.contains("bench"),
            "{t}"
        );
    }

    #[test]
    fn extras_are_followed_through_the_locked_package_metadata() {
        let reqs = requires_dist(META, "METADATA").unwrap();
        let lock = vec![
            pkg("packaging", "24.1"),
            pkg("six", "1.17.0"),
            pkg("idna", "3.7"),
        ];
        let idna = "Name: idna\nRequires-Dist: codec>=2; extra == \"all\"\nRequires-Dist: other; extra == \"x\"\n";
        let meta = |p: &LockedVersion| (p.name == "idna").then(|| idna.to_string());
        let unmet = check(&reqs, &env(), &[], &lock, &BTreeMap::new(), &meta);
        assert_eq!(unmet.len(), 1, "{unmet:?}");
        assert!(
            unmet[0].requirement.starts_with("idna[all]: codec>=2"),
            "{unmet:?}"
        );
    }
}
