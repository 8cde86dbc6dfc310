//! Store entries as OCI artifacts (OCI image spec 1.1, "artifacts"
//! guidance): one image manifest per entry, tagged by the entry's content
//! key, with its own `artifactType`, a JSON config blob holding the entry's
//! record, and one layer per file.
//!
//! ```text
//! tag                      artifactType                               layers
//! src-<commit>             application/vnd.oracle-build.source.v1     source.bundle (git bundle with history and tags)
//! lock-<key>               application/vnd.oracle-build.lock.v1       lock.json, pylock.*.toml
//! wheelhouse-<sha256>      application/vnd.oracle-build.wheelhouse.v1 the artifact (layer digest = the lock's sha256), artifact.json
//! ext-<name>-<rev>-<h>     application/vnd.oracle-build.ext.v1        entry.tar (deterministic tar of the staged source)
//! wheel-<key>              application/vnd.oracle-build.wheel.v1      the wheel, build.json, build.log, manifest.json
//! inputs-<key>             application/vnd.oracle-build.inputs.v1     recipe.yaml, oracle.json (evidence)
//! ```
//!
//! Tags are at most 128 characters (distribution spec); a longer name is
//! replaced by `<prefix>-h<sha256 of the name>`. Manifests are built
//! deterministically from the entry's bytes, so two boxes pushing one entry
//! push one manifest.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use fs_err as fs;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::digest_hex;
use crate::store::{Bucket, Entry, ManifestFile, sha256_file};

/// The kind of an artifact: which store entry (or pin summary) it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A commit with its history: a git bundle for the mirror.
    Source,
    /// A lock (`lock.json` and the PEP 751 files).
    Lock,
    /// One locked artifact of the wheelhouse.
    Wheelhouse,
    /// A staged external source.
    Ext,
    /// A built wheel with `build.json` and `build.log`.
    Wheel,
    /// What a pin needs: the list of the other artifacts, its recipe and
    /// the oracle record of the box that pushed it.
    Inputs,
}

impl Kind {
    /// The tag prefix: `src`, `lock`, `wheelhouse`, `ext`, `wheel`, `inputs`.
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Source => "src",
            Kind::Lock => "lock",
            Kind::Wheelhouse => "wheelhouse",
            Kind::Ext => "ext",
            Kind::Wheel => "wheel",
            Kind::Inputs => "inputs",
        }
    }

    /// The manifest's `artifactType`.
    pub fn artifact_type(self) -> String {
        format!("application/vnd.oracle-build.{}.v1", self.name())
    }

    /// The config blob's media type.
    pub fn config_media_type(self) -> String {
        format!(
            "application/vnd.oracle-build.{}.config.v1+json",
            self.name()
        )
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Source => "source",
            Kind::Lock => "lock",
            Kind::Wheelhouse => "wheelhouse",
            Kind::Ext => "ext",
            Kind::Wheel => "wheel",
            Kind::Inputs => "inputs",
        }
    }

    /// The kind of a store bucket's entries (`None`: never pushed, as venvs
    /// and checkouts; a mirror is pushed as [`Kind::Source`] of a commit).
    pub fn of_bucket(b: Bucket) -> Option<Kind> {
        match b {
            Bucket::Locks => Some(Kind::Lock),
            Bucket::Wheelhouse => Some(Kind::Wheelhouse),
            Bucket::Ext => Some(Kind::Ext),
            Bucket::Wheels => Some(Kind::Wheel),
            Bucket::Git | Bucket::Src | Bucket::Venvs => None,
        }
    }
}

/// The tag of the artifact of `kind` named `name` (`wheel-<key>`): at most
/// 128 characters, `[A-Za-z0-9_.-]`, else `<prefix>-h<sha256 of name>`.
pub fn tag(kind: Kind, name: &str) -> String {
    let t = format!("{}-{name}", kind.prefix());
    let ok = t.len() <= 128
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        t
    } else {
        use sha2::{Digest, Sha256};
        format!(
            "{}-h{}",
            kind.prefix(),
            hex::encode(Sha256::digest(name.as_bytes()))
        )
    }
}

/// The media type of a layer holding one file.
pub const FILE_MEDIA_TYPE: &str = "application/vnd.oracle-build.file.v1";
/// The media type of a layer holding a deterministic tar of a directory.
pub const TAR_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
/// The annotation naming a layer's file (OCI image spec, `annotations.md`).
pub const TITLE: &str = "org.opencontainers.image.title";
/// The name of the tar layer of an entry that is a tree.
pub const TREE_LAYER: &str = "entry.tar";

/// The config blob of an artifact.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Config {
    /// Format version (1).
    pub format: u32,
    /// What it carries.
    pub kind: Kind,
    /// The store entry's name (a key, a sha256, a commit).
    pub name: String,
    /// The entry's record (`build.json`, `artifact.json`, `ext.json`,
    /// `lock.json`, or the inputs of a pin), as JSON.
    pub record: Value,
    /// Every file the artifact restores, path relative to the entry, with
    /// size and sha256 (for a tree entry: what its tar holds).
    pub files: Vec<ManifestFile>,
    /// Signed statements of the key -> content mapping (wheels; see
    /// [`super::trust`]), kept in the config so no referrers API is needed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attestations: Vec<super::trust::Attestation>,
}

/// One layer to upload: a local file.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    /// Its file name on the other side (the title annotation).
    pub title: String,
    /// Its media type.
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Bytes.
    pub size: u64,
    /// The local file.
    pub path: PathBuf,
}

impl Layer {
    /// The layer of the file `path`, called `title` on the other side.
    ///
    /// Errors: the file cannot be read.
    pub fn of_file(path: &Path, title: &str, media_type: &str) -> Result<Layer> {
        Ok(Layer {
            title: title.to_string(),
            media_type: media_type.to_string(),
            digest: format!("sha256:{}", sha256_file(path)?),
            size: fs::metadata(path)?.len(),
            path: path.to_path_buf(),
        })
    }
}

/// An artifact ready to push: config bytes and layers.
#[derive(Debug, Clone)]
pub struct Artifact {
    /// Its kind.
    pub kind: Kind,
    /// The entry name (the tag is [`tag`] of kind and name).
    pub name: String,
    /// The config.
    pub config: Config,
    /// The layers, in order.
    pub layers: Vec<Layer>,
}

impl Artifact {
    /// Its tag.
    pub fn tag(&self) -> String {
        tag(self.kind, &self.name)
    }

    /// The config blob's bytes (pretty JSON, deterministic).
    pub fn config_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(&self.config).unwrap_or_default()
    }

    /// The OCI image manifest's bytes for config bytes `config`
    /// (deterministic: the same entry gives the same manifest).
    pub fn manifest_bytes(&self, config: &[u8]) -> Vec<u8> {
        let m = OciImageManifest {
            schema_version: 2,
            media_type: Some(super::registry::MANIFEST_MEDIA_TYPE.to_string()),
            config: OciDescriptor {
                media_type: self.kind.config_media_type(),
                digest: super::digest_of(config),
                size: config.len() as i64,
                urls: None,
                artifact_type: None,
                annotations: None,
            },
            layers: self
                .layers
                .iter()
                .map(|l| OciDescriptor {
                    media_type: l.media_type.clone(),
                    digest: l.digest.clone(),
                    size: l.size as i64,
                    urls: None,
                    artifact_type: None,
                    annotations: Some([(TITLE.to_string(), l.title.clone())].into()),
                })
                .collect(),
            subject: None,
            artifact_type: Some(self.kind.artifact_type()),
            annotations: Some(
                [
                    (
                        "dev.oracle-build.kind".to_string(),
                        self.kind.name().to_string(),
                    ),
                    ("dev.oracle-build.name".to_string(), self.name.clone()),
                ]
                .into(),
            ),
        };
        serde_json::to_vec_pretty(&m).unwrap_or_default()
    }
}

/// Reads a manifest received from a cache: an OCI image manifest of the
/// artifact type of `kind`, every digest a sha256 and every layer titled by
/// a plain file name.
///
/// Errors: anything else (the message names the tag).
pub fn parse_manifest(bytes: &[u8], kind: Kind, tag: &str) -> Result<OciImageManifest> {
    let m: OciImageManifest = serde_json::from_slice(bytes)
        .with_context(|| format!("the manifest of {tag} is not an OCI image manifest"))?;
    if m.artifact_type.as_deref() != Some(kind.artifact_type().as_str()) {
        bail!(
            "the manifest of {tag} has artifactType {:?}, not {}",
            m.artifact_type,
            kind.artifact_type()
        );
    }
    digest_hex(&m.config.digest)?;
    if !(0..=super::bounds::CONFIG_LIMIT as i64).contains(&m.config.size) {
        bail!(
            "the manifest of {tag} declares a config of {} bytes (at most {} are read)",
            m.config.size,
            super::bounds::CONFIG_LIMIT
        );
    }
    for l in &m.layers {
        digest_hex(&l.digest)?;
        let title = layer_title(l).ok_or_else(|| anyhow!("a layer of {tag} has no title"))?;
        if !plain_name(title) {
            bail!("a layer of {tag} is titled {title:?}, not a plain file name");
        }
        if l.size < 0 {
            bail!("a layer of {tag} has a negative size");
        }
    }
    Ok(m)
}

/// The title annotation of a layer.
pub fn layer_title(l: &OciDescriptor) -> Option<&str> {
    l.annotations.as_ref()?.get(TITLE).map(String::as_str)
}

/// Whether `s` is a plain file name: not empty, no `/`, not `.` or `..`, no NUL.
pub fn plain_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

/// The record file of a pushed entry of `bucket` (its config's `record`).
fn record_file(bucket: Bucket) -> Option<&'static str> {
    match bucket {
        Bucket::Wheels => Some("build.json"),
        Bucket::Wheelhouse => Some(crate::stages::wheelhouse::ARTIFACT_JSON),
        Bucket::Ext => Some("ext.json"),
        Bucket::Locks => Some(crate::stages::lock::LOCK_JSON),
        _ => None,
    }
}

/// The artifact of the store entry `entry` (a lock, wheelhouse, ext or
/// wheel entry; `dir` holds its files, which for a lock may be a lock
/// directory outside the store). A flat entry gets one layer per file; an
/// entry with subdirectories or symlinks one deterministic tar written into
/// `scratch`.
///
/// Errors: the entry cannot be read; its bucket is not pushed.
pub fn of_entry(entry: &Entry, dir: &Path, scratch: &Path) -> Result<Artifact> {
    let kind = Kind::of_bucket(entry.bucket)
        .ok_or_else(|| anyhow!("{} entries are not pushed", entry.bucket.dir_name()))?;
    let mut names: Vec<_> = fs::read_dir(dir)?.flatten().collect();
    names.sort_by_key(|e| e.file_name());
    let mut flat = true;
    for e in &names {
        if !e.file_type()?.is_file() {
            flat = false;
        }
    }
    let record = match record_file(entry.bucket) {
        Some(f) if dir.join(f).is_file() => crate::store::read_json::<Value>(&dir.join(f))?,
        _ => Value::Null,
    };
    let mut files = Vec::new();
    let mut layers = Vec::new();
    if flat {
        for e in &names {
            let name = e.file_name().to_string_lossy().into_owned();
            let l = Layer::of_file(&e.path(), &name, FILE_MEDIA_TYPE)?;
            files.push(ManifestFile {
                path: name,
                size: l.size,
                sha256: digest_hex(&l.digest)?.to_string(),
            });
            layers.push(l);
        }
    } else {
        fs::create_dir_all(scratch)?;
        let tar_path = scratch.join(format!("{}.tar", entry.name));
        files = write_tree_tar(dir, &tar_path)?;
        layers.push(Layer::of_file(&tar_path, TREE_LAYER, TAR_MEDIA_TYPE)?);
    }
    Ok(Artifact {
        kind,
        name: entry.name.clone(),
        config: Config {
            format: 1,
            kind,
            name: entry.name.clone(),
            record,
            files,
            attestations: Vec::new(),
        },
        layers,
    })
}

/// Writes a deterministic tar of the tree `dir` (sorted, mtime 0, uid/gid
/// 0, modes 0644/0755, symlinks as symlinks) to `out`; returns its regular
/// files with size and sha256.
///
/// Errors: the tree cannot be read or the tar written.
pub fn write_tree_tar(dir: &Path, out: &Path) -> Result<Vec<ManifestFile>> {
    let mut files = Vec::new();
    let mut b = tar::Builder::new(fs::File::create(out)?);
    b.follow_symlinks(false);
    fn walk(
        base: &Path,
        d: &Path,
        b: &mut tar::Builder<fs::File>,
        files: &mut Vec<ManifestFile>,
    ) -> Result<()> {
        let mut names: Vec<_> = fs::read_dir(d)?.flatten().collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap_or(&p).to_path_buf();
            let ft = e.file_type()?;
            let mut h = tar::Header::new_gnu();
            h.set_mtime(0);
            h.set_uid(0);
            h.set_gid(0);
            if ft.is_symlink() {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, &rel, fs::read_link(&p)?)?;
            } else if ft.is_dir() {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, &rel, std::io::empty())?;
                walk(base, &p, b, files)?;
            } else {
                use std::os::unix::fs::PermissionsExt;
                let meta = fs::metadata(&p)?;
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(if meta.permissions().mode() & 0o111 != 0 {
                    0o755
                } else {
                    0o644
                });
                h.set_size(meta.len());
                b.append_data(&mut h, &rel, fs::File::open(&p)?)?;
                files.push(ManifestFile {
                    path: rel.to_string_lossy().into_owned(),
                    size: meta.len(),
                    sha256: sha256_file(&p)?,
                });
            }
        }
        Ok(())
    }
    walk(dir, dir, &mut b, &mut files)?;
    b.into_inner()?.sync_all()?;
    Ok(files)
}

/// Unpacks the tar `file` (an artifact's tree layer) into the new
/// directory `dest`, refusing what `import` refuses in a bundle: absolute
/// paths, `..`, members other than files, directories and symlinks,
/// symlinks leaving the entry, members under a symlink, duplicates.
///
/// Errors: why the layer is refused (nothing of it is kept).
pub fn unpack_tree(file: &Path, dest: &Path) -> Result<()> {
    use std::collections::BTreeSet;
    use std::path::Component;
    fs::create_dir_all(dest)?;
    let mut ar = tar::Archive::new(fs::File::open(file)?);
    let mut seen = BTreeSet::new();
    let mut links: Vec<String> = Vec::new();
    for m in ar.entries()? {
        let mut m = m?;
        let raw = m.path_bytes();
        let path = std::str::from_utf8(&raw)
            .map_err(|_| anyhow!("a member path is not UTF-8"))?
            .trim_end_matches('/')
            .to_string();
        if path.is_empty()
            || path.starts_with('/')
            || !Path::new(&path)
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
        {
            bail!("member {path:?} is not a plain relative path");
        }
        if !seen.insert(path.clone()) {
            bail!("member {path:?} appears twice");
        }
        if links
            .iter()
            .any(|l| path.starts_with(l.as_str()) && path.as_bytes().get(l.len()) == Some(&b'/'))
        {
            bail!("member {path:?} lies under a symlink");
        }
        match m.header().entry_type() {
            tar::EntryType::Directory | tar::EntryType::Regular | tar::EntryType::Continuous => {}
            tar::EntryType::Symlink => {
                let target = m
                    .link_name_bytes()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                let mut depth: i64 = path.matches('/').count() as i64;
                let mut inside = !target.is_empty() && !target.starts_with('/');
                for c in Path::new(&target).components() {
                    match c {
                        Component::Normal(_) => depth += 1,
                        Component::CurDir => {}
                        Component::ParentDir => {
                            depth -= 1;
                            inside &= depth >= 0;
                        }
                        _ => inside = false,
                    }
                }
                if !inside {
                    bail!("symlink {path:?} -> {target:?} leaves the entry");
                }
                links.push(path.clone());
            }
            other => bail!("member {path:?} is a {other:?}"),
        }
        if !m.unpack_in(dest)? {
            bail!("member {path:?} escapes the entry");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_stay_within_128_characters_and_the_allowed_alphabet() {
        assert_eq!(tag(Kind::Wheel, "abc"), "wheel-abc");
        let long = "x".repeat(200);
        let t = tag(Kind::Ext, &long);
        assert!(t.len() <= 128 && t.starts_with("ext-h"), "{t}");
        assert!(tag(Kind::Ext, "a/b").starts_with("ext-h"));
        assert_eq!(
            tag(Kind::Wheelhouse, &"a".repeat(64)).len(),
            "wheelhouse-".len() + 64
        );
    }

    #[test]
    fn a_tree_round_trips_and_a_link_out_of_the_entry_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        fs::create_dir_all(src.join("a/b")).unwrap();
        fs::write(src.join("a/b/f.txt"), "x").unwrap();
        std::os::unix::fs::symlink("b/f.txt", src.join("a/l")).unwrap();
        let tar = t.path().join("e.tar");
        let files = write_tree_tar(&src, &tar).unwrap();
        assert_eq!(files.len(), 1);
        let again = t.path().join("again.tar");
        write_tree_tar(&src, &again).unwrap();
        assert_eq!(fs::read(&tar).unwrap(), fs::read(&again).unwrap());
        unpack_tree(&tar, &t.path().join("out")).unwrap();
        assert_eq!(fs::read_to_string(t.path().join("out/a/l")).unwrap(), "x");
        let bad_src = t.path().join("bad");
        fs::create_dir_all(&bad_src).unwrap();
        std::os::unix::fs::symlink("../../etc", bad_src.join("l")).unwrap();
        let bad = t.path().join("bad.tar");
        write_tree_tar(&bad_src, &bad).unwrap();
        assert!(unpack_tree(&bad, &t.path().join("out2")).is_err());
    }
}
