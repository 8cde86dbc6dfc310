//! The installed files of a distribution, checked against its `RECORD`.
//!
//! An installer writes `<name>-<version>.dist-info/RECORD` (PEP 376, kept by
//! PEP 627 and the wheel spec, PEP 427): one CSV row per installed file,
//! `path,hash,size`, where `path` is relative to the directory holding the
//! `.dist-info` (site-packages), `hash` is `<algorithm>=<urlsafe base64 of the
//! digest, no padding>` and may be empty (the `RECORD` itself, files the
//! installer made), and `size` is in bytes. [`check`] reports every listed file
//! that is missing or no longer matches.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use sha2::{Digest, Sha256, Sha384, Sha512};

/// One row of a `RECORD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordRow {
    /// Path as written (relative to site-packages, `/`-separated).
    pub path: String,
    /// `(algorithm, urlsafe-b64 digest)`, absent for unhashed rows.
    pub hash: Option<(String, String)>,
    /// Size in bytes, when given.
    pub size: Option<u64>,
}

/// The result of checking a distribution's files.
#[derive(Debug, Clone, Serialize)]
pub struct RecordCheck {
    /// The `RECORD` file read.
    pub record: PathBuf,
    /// Rows checked.
    pub files: usize,
    /// Whether hashes were recomputed (`--deep`) or only existence and sizes checked.
    pub hashed: bool,
    /// One line per problem (`missing: <path>`, `changed: <path> (...)`).
    pub problems: Vec<String>,
}

/// PEP 503 normalization with `_` as separator (the form used in
/// `.dist-info` directory names by PEP 427): lowercase, runs of `-_.` -> `_`.
fn normalize(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('_') {
                out.push('_');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// The `site-packages` directories of the venv at `venv` (`lib*/python*/site-packages`).
pub fn site_packages(venv: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(rd) = std::fs::read_dir(venv.join(lib)) else {
            continue;
        };
        for e in rd.flatten() {
            let site = e.path().join("site-packages");
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("python") && site.is_dir() {
                let canon = site.canonicalize().unwrap_or(site);
                if !out.contains(&canon) {
                    out.push(canon);
                }
            }
        }
    }
    out.sort();
    out
}

/// The `.dist-info` directory of distribution `package` in the venv at `venv`.
///
/// Errors: none, or more than one, is found.
pub fn find_dist_info(venv: &Path, package: &str) -> Result<PathBuf> {
    let want = normalize(package);
    let mut found = Vec::new();
    for site in site_packages(venv) {
        for e in fs_err::read_dir(&site)? {
            let name = e?.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".dist-info") else {
                continue;
            };
            let dist = stem.split('-').next().unwrap_or(stem);
            if normalize(dist) == want {
                found.push(site.join(&name));
            }
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => bail!(
            "no {package} *.dist-info in the site-packages of {}",
            venv.display()
        ),
        _ => bail!(
            "several {package} *.dist-info in {}: {}",
            venv.display(),
            found
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Splits one CSV line (RFC 4180 quoting, as Python's `csv` module writes it).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let field = fields.last_mut().expect("fields is never empty");
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(String::new()),
            _ => field.push(c),
        }
    }
    fields
}

/// Parses the text of a `RECORD`.
///
/// Errors: a row without a path, a hash without `=`, or a size that is not a number.
pub fn parse(text: &str) -> Result<Vec<RecordRow>> {
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f = csv_fields(line);
        let path = f.first().cloned().unwrap_or_default();
        if path.is_empty() {
            bail!("RECORD line {}: no path", n + 1);
        }
        let hash = match f.get(1).map(String::as_str) {
            None | Some("") => None,
            Some(h) => {
                let (alg, digest) = h
                    .split_once('=')
                    .with_context(|| format!("RECORD line {}: hash {h:?} has no `=`", n + 1))?;
                Some((alg.to_string(), digest.to_string()))
            }
        };
        let size = match f.get(2).map(String::as_str) {
            None | Some("") => None,
            Some(s) => Some(
                s.parse::<u64>()
                    .with_context(|| format!("RECORD line {}: size {s:?}", n + 1))?,
            ),
        };
        rows.push(RecordRow { path, hash, size });
    }
    Ok(rows)
}

/// Urlsafe base64 without padding (RFC 4648 section 5), the digest encoding of RECORD.
pub fn urlsafe_b64_nopad(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let emit = chunk.len() + 1;
        for i in 0..emit {
            out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// The RECORD-style digest of the file at `path` with `algorithm`
/// (`sha256`, `sha384` or `sha512`, the algorithms the wheel spec allows).
///
/// Errors: an unsupported algorithm, or the file cannot be read.
pub fn digest_file(path: &Path, algorithm: &str) -> Result<String> {
    fn run<D: Digest>(path: &Path) -> Result<Vec<u8>> {
        let mut f = fs_err::File::open(path)?;
        let mut h = D::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        Ok(h.finalize().to_vec())
    }
    let raw = match algorithm {
        "sha256" => run::<Sha256>(path)?,
        "sha384" => run::<Sha384>(path)?,
        "sha512" => run::<Sha512>(path)?,
        other => bail!("unsupported RECORD hash algorithm {other:?}"),
    };
    Ok(urlsafe_b64_nopad(&raw))
}

/// Checks every file listed in the `RECORD` of distribution `package` in the
/// venv at `venv`: present, of the recorded size, and, when `deep`, with the
/// recorded hash. Unhashed rows are only checked for presence.
///
/// Errors: the `.dist-info` or its `RECORD` cannot be found or parsed (the
/// caller reports that as a failed check).
pub fn check(venv: &Path, package: &str, deep: bool) -> Result<RecordCheck> {
    let dist_info = find_dist_info(venv, package)?;
    let record = dist_info.join("RECORD");
    let text = fs_err::read_to_string(&record)?;
    let rows = parse(&text).with_context(|| format!("parsing {}", record.display()))?;
    let base = dist_info
        .parent()
        .context("a .dist-info has a parent")?
        .to_path_buf();
    let mut problems = Vec::new();
    for row in &rows {
        let path = base.join(&row.path);
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(_) => {
                problems.push(format!("missing: {}", row.path));
                continue;
            }
        };
        if let Some(size) = row.size
            && meta.len() != size
        {
            problems.push(format!(
                "changed: {} (size {} in RECORD, now {})",
                row.path,
                size,
                meta.len()
            ));
            continue;
        }
        if deep && let Some((alg, want)) = &row.hash {
            match digest_file(&path, alg) {
                Ok(got) if got == *want => {}
                Ok(got) => problems.push(format!(
                    "changed: {} ({alg}={want} in RECORD, now {alg}={got})",
                    row.path
                )),
                Err(e) => problems.push(format!("unreadable: {}: {e:#}", row.path)),
            }
        }
    }
    Ok(RecordCheck {
        record,
        files: rows.len(),
        hashed: deep,
        problems,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_wheel_spec_examples() {
        // sha256 of the empty string, as pip writes it in RECORD.
        let empty = Sha256::digest(b"");
        assert_eq!(
            urlsafe_b64_nopad(&empty),
            "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
        );
        assert_eq!(urlsafe_b64_nopad(b"f"), "Zg");
        assert_eq!(urlsafe_b64_nopad(b"fo"), "Zm8");
        assert_eq!(urlsafe_b64_nopad(b"foo"), "Zm9v");
        assert_eq!(urlsafe_b64_nopad(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn parses_quoted_rows_and_empty_hashes() {
        let rows =
            parse("a/b.py,sha256=Zm9v,3\n\"we,ird\"\"name.py\",,\npkg-1.dist-info/RECORD,,\n")
                .unwrap();
        assert_eq!(rows[0].hash, Some(("sha256".into(), "Zm9v".into())));
        assert_eq!(rows[0].size, Some(3));
        assert_eq!(rows[1].path, "we,ird\"name.py");
        assert_eq!(rows[1].hash, None);
        assert!(parse("x,nohash,1\n").is_err());
    }

    #[test]
    fn normalizes_names_like_pep_503() {
        assert_eq!(normalize("Flashinfer-Python"), "flashinfer_python");
        assert_eq!(normalize("a.-_b"), "a_b");
    }
}
