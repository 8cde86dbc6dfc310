//! Artifact file names and what the files say about themselves, checked
//! before a bundle's wheelhouse is trusted.
//!
//! - wheels: PEP 427 and the binary distribution format spec,
//!   `{distribution}-{version}(-{build tag})?-{python tag}-{abi tag}-{platform tag}.whl`,
//!   the name a valid PEP 508 name (`pep508_rs::PackageName`), the version a
//!   PEP 440 version (`pep440_rs::Version`), the build tag starting with a
//!   digit; the archive's `{name}-{version}.dist-info/METADATA` (core metadata
//!   `Name:` / `Version:`) and `WHEEL` must agree with the file name.
//! - sdists: the source distribution format spec, `{name}-{version}.tar.gz`
//!   (or a legacy `.zip`).

use std::io::Read;
use std::path::Path;
use std::str::FromStr;

use pep440_rs::Version;
use pep508_rs::PackageName;

/// A parsed wheel file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelName {
    /// The distribution name (normalized, PEP 503).
    pub name: PackageName,
    /// Its version.
    pub version: Version,
    /// The optional build tag.
    pub build: Option<String>,
    /// Python, ABI and platform tags (each possibly a `.`-joined set).
    pub tags: [String; 3],
}

/// A PEP 508 distribution name (`pep508_rs` accepts the empty string; a file name may not).
fn package_name(name: &str) -> Result<PackageName, String> {
    if name.is_empty() {
        return Err("the distribution name is empty".into());
    }
    PackageName::from_str(name).map_err(|e| format!("{name:?} is not a distribution name ({e})"))
}

fn is_tag(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

/// Parses `file` as a wheel file name.
///
/// Errors: the reason it is not one (the caller names the file).
pub fn parse_wheel(file: &str) -> Result<WheelName, String> {
    let stem = file
        .strip_suffix(".whl")
        .ok_or_else(|| "a wheel's name ends in .whl".to_string())?;
    let parts: Vec<&str> = stem.split('-').collect();
    let (name, version, build, tags) = match parts.as_slice() {
        [n, v, py, abi, plat] => (*n, *v, None, [*py, *abi, *plat]),
        [n, v, b, py, abi, plat] => (*n, *v, Some(*b), [*py, *abi, *plat]),
        _ => {
            return Err(format!(
                "it has {} `-`-separated fields; PEP 427 wants {{name}}-{{version}}(-{{build}})?-{{python}}-{{abi}}-{{platform}}.whl",
                parts.len()
            ));
        }
    };
    let pname = package_name(name)?;
    let ver = Version::from_str(version)
        .map_err(|e| format!("{version:?} is not a PEP 440 version ({e})"))?;
    if let Some(b) = build
        && !b.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!("build tag {b:?} does not start with a digit"));
    }
    if let Some(t) = tags.iter().find(|t| !is_tag(t)) {
        return Err(format!("{t:?} is not a compatibility tag"));
    }
    Ok(WheelName {
        name: pname,
        version: ver,
        build: build.map(str::to_string),
        tags: tags.map(str::to_string),
    })
}

/// Parses `file` as a source distribution name: (name, version).
///
/// Errors: the reason it is not one.
pub fn parse_sdist(file: &str) -> Result<(PackageName, Version), String> {
    let stem = file
        .strip_suffix(".tar.gz")
        .or_else(|| file.strip_suffix(".zip"))
        .ok_or_else(|| "an sdist's name ends in .tar.gz (or .zip)".to_string())?;
    let (name, version) = stem
        .rsplit_once('-')
        .ok_or_else(|| "an sdist's name is {name}-{version}.tar.gz".to_string())?;
    let pname = package_name(name)?;
    let ver = Version::from_str(version)
        .map_err(|e| format!("{version:?} is not a PEP 440 version ({e})"))?;
    Ok((pname, ver))
}

/// Checks a wheelhouse artifact's name: a wheel name, else an sdist name.
///
/// Errors: why it is neither.
pub fn check_artifact_name(file: &str) -> Result<(PackageName, Version), String> {
    if file.ends_with(".whl") {
        parse_wheel(file).map(|w| (w.name, w.version))
    } else if file.ends_with(".tar.gz") || file.ends_with(".zip") {
        parse_sdist(file)
    } else {
        Err("it is neither a wheel (.whl) nor an sdist (.tar.gz)".into())
    }
}

/// The value of header `key` in core metadata / WHEEL text (RFC 822 style).
fn header<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().take_while(|l| !l.is_empty()).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(key).then(|| v.trim())
    })
}

/// The most of one metadata file of a wheel ([`read_metadata`]) read: a
/// larger one is refused, not read whole.
pub const METADATA_LIMIT: u64 = 16 << 20;

/// The core metadata (`METADATA`, PEP 566) of the wheel at `path`, from the
/// one `.dist-info` directory at the top of its archive (PEP 427); at most
/// [`METADATA_LIMIT`] bytes.
///
/// Errors: the archive does not open, has no single `.dist-info`, no
/// `METADATA`, or one larger than the limit or not UTF-8 (says which).
pub fn read_metadata(path: &Path) -> Result<String, String> {
    let (mut zip, di) = open_dist_info(path)?;
    read_member(&mut zip, &format!("{di}/METADATA"))
}

/// The text of `member` of the wheel (or any zip) at `path`, without
/// installing or unpacking it; at most [`METADATA_LIMIT`] bytes.
///
/// Errors: the archive does not open, lacks the member, or it is larger
/// than the limit or not UTF-8 (says which).
pub fn read_wheel_member(path: &Path, member: &str) -> Result<String, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| format!("not a zip archive: {e}"))?;
    read_member(&mut zip, member)
}

/// The archive of the wheel at `path` and the name of its one top-level
/// `.dist-info` directory.
fn open_dist_info(path: &Path) -> Result<(zip::ZipArchive<std::fs::File>, String), String> {
    let f = std::fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let zip = zip::ZipArchive::new(f).map_err(|e| format!("not a zip archive: {e}"))?;
    let dist_infos: std::collections::BTreeSet<String> = zip
        .file_names()
        .filter_map(|n| n.ok())
        .filter_map(|n| {
            let top = n.split('/').next()?;
            top.ends_with(".dist-info").then(|| top.to_string())
        })
        .collect();
    let di = match dist_infos.len() {
        1 => dist_infos.into_iter().next().unwrap_or_default(),
        0 => return Err("it holds no .dist-info directory".into()),
        _ => {
            return Err(format!(
                "it holds several .dist-info directories ({})",
                dist_infos.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    };
    Ok((zip, di))
}

/// The text of `member` of `zip`, at most [`METADATA_LIMIT`] bytes.
fn read_member(zip: &mut zip::ZipArchive<std::fs::File>, member: &str) -> Result<String, String> {
    let mut bytes = Vec::new();
    zip.by_name(member)
        .map_err(|e| format!("{member}: {e}"))?
        .take(METADATA_LIMIT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{member}: {e}"))?;
    if bytes.len() as u64 > METADATA_LIMIT {
        return Err(format!(
            "{member} is larger than {} MiB",
            METADATA_LIMIT >> 20
        ));
    }
    String::from_utf8(bytes).map_err(|_| format!("{member} is not UTF-8"))
}

/// Opens the wheel at `path` and checks that its `.dist-info` (the one
/// directory `{name}-{version}.dist-info` at the archive's top) has a
/// `WHEEL` file and a `METADATA` whose `Name` and `Version` are the file
/// name's (names compared normalized, versions as PEP 440 versions).
///
/// Errors: the archive does not open, lacks them, or disagrees (says how).
pub fn check_wheel_metadata(path: &Path) -> Result<WheelName, String> {
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let w = parse_wheel(&file)?;
    let (mut zip, di) = open_dist_info(path)?;
    let wheel = read_member(&mut zip, &format!("{di}/WHEEL"))?;
    if header(&wheel, "Wheel-Version").is_none() {
        return Err(format!("{di}/WHEEL has no Wheel-Version"));
    }
    let meta = read_member(&mut zip, &format!("{di}/METADATA"))?;
    let name = header(&meta, "Name").ok_or_else(|| format!("{di}/METADATA has no Name"))?;
    let version =
        header(&meta, "Version").ok_or_else(|| format!("{di}/METADATA has no Version"))?;
    let mname = PackageName::from_str(name)
        .map_err(|e| format!("{di}/METADATA: Name {name:?} is invalid ({e})"))?;
    let mver = Version::from_str(version)
        .map_err(|e| format!("{di}/METADATA: Version {version:?} is invalid ({e})"))?;
    if mname != w.name || mver != w.version {
        return Err(format!(
            "its file name says {} {}, but {di}/METADATA says {name} {version}",
            w.name, w.version
        ));
    }
    // The directory is `{name}-{version}.dist-info` (binary distribution format).
    let named = di
        .strip_suffix(".dist-info")
        .and_then(|s| s.rsplit_once('-'))
        .and_then(|(n, v)| Some((package_name(n).ok()?, Version::from_str(v).ok()?)));
    if named != Some((w.name.clone(), w.version.clone())) {
        return Err(format!(
            "its file name says {} {}, but its metadata directory is {di}",
            w.name, w.version
        ));
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wheel at `dir/name` holding `members` (path, bytes).
    fn zip_with(dir: &Path, name: &str, members: &[(&str, &[u8])]) -> std::path::PathBuf {
        use std::io::Write;
        let path = dir.join(name);
        let mut z = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        for (m, bytes) in members {
            z.start_file(*m, zip::write::SimpleFileOptions::default())
                .unwrap();
            z.write_all(bytes).unwrap();
        }
        z.finish().unwrap();
        path
    }

    #[test]
    fn the_metadata_comes_from_the_one_dist_info_and_has_a_bound() {
        let t = tempfile::tempdir().unwrap();
        let meta = b"Metadata-Version: 2.1\nName: fx\nVersion: 1.0\nRequires-Dist: numpy>=2\n";
        let ok = zip_with(
            t.path(),
            "fx-1.0-py3-none-any.whl",
            &[("fx/__init__.py", b""), ("fx-1.0.dist-info/METADATA", meta)],
        );
        assert_eq!(read_metadata(&ok).unwrap().as_bytes(), meta);
        let none = zip_with(t.path(), "a.whl", &[("fx/__init__.py", b"")]);
        assert!(read_metadata(&none).unwrap_err().contains("no .dist-info"));
        let two = zip_with(
            t.path(),
            "b.whl",
            &[
                ("a-1.dist-info/METADATA", meta),
                ("b-1.dist-info/METADATA", meta),
            ],
        );
        assert!(read_metadata(&two).unwrap_err().contains("several"));
        let big = vec![b'x'; (METADATA_LIMIT + 1) as usize];
        let huge = zip_with(t.path(), "c.whl", &[("c-1.dist-info/METADATA", &big)]);
        assert!(read_metadata(&huge).unwrap_err().contains("larger than"));
        let not_zip = t.path().join("d.whl");
        std::fs::write(&not_zip, "not a zip").unwrap();
        assert!(read_metadata(&not_zip).unwrap_err().contains("not a zip"));
    }

    #[test]
    fn wheel_names_follow_pep_427() {
        let w = parse_wheel("torch-2.9.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl").unwrap();
        assert_eq!(w.name.as_ref(), "torch");
        assert_eq!(w.version.to_string(), "2.9.0+cu130");
        assert!(parse_wheel("setuptools_scm-10.3.4-1build-py3-none-any.whl").is_ok());
        assert!(
            parse_wheel("uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
                .is_ok()
        );
        for bad in [
            "tinyoracle-latest.whl",
            "tinyoracle-latest-py3-none-any.whl",
            "x-1.0-py3-none.whl",
            "x-1.0-abuild-py3-none-any.whl",
            "x-1.0-py3-none-any.zip",
            "-1.0-py3-none-any.whl",
            "x-1.0-py3--any.whl",
        ] {
            assert!(parse_wheel(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sdist_names_and_artifacts() {
        let (n, v) = parse_sdist("setuptools-scm-8.0.tar.gz").unwrap();
        assert_eq!(
            (n.as_ref(), v.to_string().as_str()),
            ("setuptools-scm", "8.0")
        );
        assert!(check_artifact_name("pkg.tar.gz").is_err());
        assert!(check_artifact_name("pkg-1.0.egg").is_err());
        assert!(check_artifact_name("-1.0.tar.gz").is_err());
        assert!(check_artifact_name("pkg-1.0-py3-none-any.whl").is_ok());
    }
}
