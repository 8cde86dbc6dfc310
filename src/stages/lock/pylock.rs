//! The PEP 751 lock file (`pylock.*.toml`) as this tool reads it: the
//! packages of one environment with the artifacts (wheels, sdist) each may
//! install, their URLs and sha256, and the hash-pinned requirement lines an
//! install is given. Source: PEP 751, "A file format to record Python
//! dependencies for installation reproducibility"
//! (<https://peps.python.org/pep-0751/>), as written by
//! `uv pip compile --format pylock.toml`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use fs_err as fs;
use serde::{Deserialize, Serialize};

/// One file of a locked package (PEP 751 `[[packages.wheels]]` or `packages.sdist`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Artifact {
    /// Normalized name of the package it belongs to.
    pub package: String,
    /// Its version.
    pub version: String,
    /// File name (`name`, else the last segment of the URL or path, percent-decoded).
    pub filename: String,
    /// Where it is downloaded from (`url`), if remote.
    pub url: Option<String>,
    /// A local path (`path`, relative to the lock file's directory), if local.
    pub path: Option<String>,
    /// Lowercase hex sha256 (PEP 751 requires hashes; only sha256 is used).
    pub sha256: String,
    /// Size in bytes, when the lock says.
    pub size: Option<u64>,
}

/// One package of a PEP 751 lock.
#[derive(Debug, Clone, PartialEq)]
pub struct LockedPackage {
    /// Package name as written in the lock.
    pub name: String,
    /// Exact version.
    pub version: String,
    /// Environment marker, if the lock has one.
    pub marker: Option<String>,
    /// Its wheels (for a single-environment lock: the ones that install there).
    pub wheels: Vec<Artifact>,
    /// Its sdist, if any.
    pub sdist: Option<Artifact>,
}

impl LockedPackage {
    /// The artifacts the wheelhouse keeps for this package: its wheels, or
    /// the sdist when it has no wheel.
    pub fn wanted(&self) -> Vec<&Artifact> {
        if self.wheels.is_empty() {
            self.sdist.iter().collect()
        } else {
            self.wheels.iter().collect()
        }
    }

    /// The hash-pinned requirement line uv installs it from:
    /// `name==version [; marker] --hash=sha256:...` (every wanted artifact's hash).
    pub fn requirement_line(&self) -> String {
        let mut line = format!("{}=={}", self.name, self.version);
        if let Some(m) = &self.marker {
            line.push_str(&format!(" ; {m}"));
        }
        for a in self.wanted() {
            line.push_str(&format!(" --hash=sha256:{}", a.sha256));
        }
        line
    }
}

#[derive(Deserialize)]
struct PylockFile {
    #[serde(default)]
    packages: Vec<PylockPackage>,
}

#[derive(Deserialize)]
struct PylockPackage {
    name: String,
    version: Option<String>,
    marker: Option<String>,
    #[serde(default)]
    wheels: Vec<PylockArtifact>,
    sdist: Option<PylockArtifact>,
    vcs: Option<toml::Value>,
    directory: Option<toml::Value>,
    archive: Option<toml::Value>,
}

#[derive(Deserialize)]
struct PylockArtifact {
    name: Option<String>,
    url: Option<String>,
    path: Option<String>,
    size: Option<u64>,
    #[serde(default)]
    hashes: BTreeMap<String, String>,
}

/// Reads the packages of the PEP 751 lock at `path`.
///
/// Errors: the file does not parse; a package is a VCS, directory or archive
/// source (not installable from a wheelhouse), has no version, or an artifact
/// has no sha256.
pub fn parse_pylock(path: &Path) -> Result<Vec<LockedPackage>> {
    let text = fs::read_to_string(path)?;
    parse_pylock_str(&text, path)
}

/// Reads the packages of the PEP 751 lock `text`; `path` names it in errors
/// (the pure part of [`parse_pylock`], also what the `pylock` fuzz target runs).
///
/// Errors: as [`parse_pylock`], except reading the file.
pub fn parse_pylock_str(text: &str, path: &Path) -> Result<Vec<LockedPackage>> {
    let lock: PylockFile =
        toml::from_str(text).with_context(|| format!("parsing {}", path.display()))?;
    let mut out = Vec::new();
    for p in lock.packages {
        if p.vcs.is_some() || p.directory.is_some() || p.archive.is_some() {
            bail!(
                "{}: package {} comes from a VCS, directory or archive source; only index artifacts can be kept in the wheelhouse",
                path.display(),
                p.name
            );
        }
        let version = p
            .version
            .with_context(|| format!("{}: package {} has no version", path.display(), p.name))?;
        let conv = |a: PylockArtifact| -> Result<Artifact> {
            let sha256 = a.hashes.get("sha256").cloned().with_context(|| {
                format!(
                    "{}: an artifact of {} has no sha256",
                    path.display(),
                    p.name
                )
            })?;
            let source = a.url.as_deref().or(a.path.as_deref()).unwrap_or("");
            let filename = a
                .name
                .clone()
                .unwrap_or_else(|| percent_decode(source.rsplit('/').next().unwrap_or("")));
            if filename.is_empty() || filename.contains('/') || filename.starts_with('.') {
                bail!(
                    "{}: an artifact of {} has no usable file name",
                    path.display(),
                    p.name
                );
            }
            Ok(Artifact {
                package: p.name.clone(),
                version: version.clone(),
                filename,
                url: a.url,
                path: a.path,
                sha256: sha256.to_ascii_lowercase(),
                size: a.size,
            })
        };
        let wheels = p.wheels.into_iter().map(conv).collect::<Result<Vec<_>>>()?;
        let sdist = p.sdist.map(conv).transpose()?;
        if wheels.is_empty() && sdist.is_none() {
            bail!("{}: package {} lists no artifact", path.display(), p.name);
        }
        out.push(LockedPackage {
            name: p.name,
            version,
            marker: p.marker,
            wheels,
            sdist,
        });
    }
    Ok(out)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(h) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(h, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The hash-pinned requirements text for `packages` (one line each, sorted as locked).
pub fn requirements_text(packages: &[LockedPackage]) -> String {
    packages
        .iter()
        .map(|p| p.requirement_line() + "\n")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_uv_pylock_and_writes_hash_pinned_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pylock.test.toml");
        fs::write(
            &p,
            r#"lock-version = "1.0"
created-by = "uv"
requires-python = ">=3.11"

[[packages]]
name = "torch"
version = "2.9.0+cu130"
wheels = [{ url = "https://example.invalid/whl/torch-2.9.0%2Bcu130-cp311-cp311-manylinux_2_28_x86_64.whl", upload-time = 2024-11-23T00:18:21Z, size = 3, hashes = { sha256 = "AB12" } }]

[[packages]]
name = "onlysdist"
version = "1.0"
sdist = { url = "https://example.invalid/onlysdist-1.0.tar.gz", hashes = { sha256 = "cd34" } }
"#,
        )
        .unwrap();
        let pkgs = parse_pylock(&p).unwrap();
        assert_eq!(pkgs.len(), 2);
        assert_eq!(
            pkgs[0].wheels[0].filename,
            "torch-2.9.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
        );
        assert_eq!(
            requirements_text(&pkgs),
            "torch==2.9.0+cu130 --hash=sha256:ab12\nonlysdist==1.0 --hash=sha256:cd34\n"
        );
    }

    #[test]
    fn a_package_without_a_version_or_a_sha256_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pylock.bad.toml");
        fs::write(
            &p,
            r#"lock-version = "1.0"
[[packages]]
name = "nover"
wheels = [{ url = "https://example.invalid/nover-1-py3-none-any.whl", hashes = { sha256 = "ab" } }]
"#,
        )
        .unwrap();
        let e = format!("{:#}", parse_pylock(&p).unwrap_err());
        assert!(e.contains("nover") && e.contains("no version"), "{e}");
        fs::write(
            &p,
            r#"lock-version = "1.0"
[[packages]]
name = "nohash"
version = "1"
wheels = [{ url = "https://example.invalid/nohash-1-py3-none-any.whl", hashes = { md5 = "ab" } }]
"#,
        )
        .unwrap();
        let e = format!("{:#}", parse_pylock(&p).unwrap_err());
        assert!(e.contains("nohash"), "{e}");
        assert!(e.contains("sha256"), "{e}");
    }
}
