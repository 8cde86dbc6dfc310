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
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
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
    /// The vendored crates of one `Cargo.lock` (`store/crates/<sha256>`).
    Crates,
    /// A built wheel with `build.json` and `build.log`.
    Wheel,
    /// What a pin needs: the list of the other artifacts, its recipe and
    /// the oracle record of the box that pushed it.
    Inputs,
    /// One signed statement about another artifact's content (see
    /// `cache::attest`): its own small artifact, so signing never
    /// rewrites what it signs.
    Attestation,
    /// The bytecode of one wheel for one Python (`store/pyc/<name>`):
    /// hash-based `.pyc` files, signed like a store lock.
    Bytecode,
}

impl Kind {
    /// The tag prefix: `src`, `lock`, `wheelhouse`, `ext`, `wheel`, `inputs`.
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Source => "src",
            Kind::Lock => "lock",
            Kind::Wheelhouse => "wheelhouse",
            Kind::Ext => "ext",
            Kind::Crates => "crates",
            Kind::Wheel => "wheel",
            Kind::Inputs => "inputs",
            Kind::Attestation => "att",
            Kind::Bytecode => "pyc",
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

    /// The kind's name in artifact types, annotations and statements
    /// (`source`, `lock`, `wheelhouse`, `ext`, `wheel`, `inputs`,
    /// `attestation`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Source => "source",
            Kind::Lock => "lock",
            Kind::Wheelhouse => "wheelhouse",
            Kind::Ext => "ext",
            Kind::Crates => "crates",
            Kind::Wheel => "wheel",
            Kind::Inputs => "inputs",
            Kind::Attestation => "attestation",
            Kind::Bytecode => "bytecode",
        }
    }

    /// The length of the qualifier between an entry's name and the
    /// manifest digest in its tag: 16 hex digits of the wheel's sha256 for
    /// a wheel, `<16 hex of the subject>-<16 hex of the signer's key>` for
    /// an attestation, none for the rest.
    pub fn qualifier_len(self) -> usize {
        match self {
            Kind::Wheel => TAG_HEX,
            Kind::Attestation => 2 * TAG_HEX + 1,
            _ => 0,
        }
    }

    /// The kind of a store bucket's entries (`None`: never pushed, as venvs
    /// and checkouts; a mirror is pushed as [`Kind::Source`] of a commit).
    pub fn of_bucket(b: Bucket) -> Option<Kind> {
        match b {
            Bucket::Locks => Some(Kind::Lock),
            Bucket::Wheelhouse => Some(Kind::Wheelhouse),
            Bucket::Ext => Some(Kind::Ext),
            Bucket::Crates => Some(Kind::Crates),
            Bucket::Wheels => Some(Kind::Wheel),
            Bucket::Bytecode => Some(Kind::Bytecode),
            Bucket::Git | Bucket::Src | Bucket::Venvs => None,
        }
    }
}

/// The tag of the present layout's `kind` `name` prefix, and the whole
/// tag of the layout before issue 23 (`wheel-<key>`, read but never
/// written): `<prefix>-<name>` when that is at most 128 characters of
/// `[A-Za-z0-9_.-]`, else `<prefix>-h<sha256 of name>`.
pub fn tag(kind: Kind, name: &str) -> String {
    base_tag(kind, name, 0)
}

/// How many hex digits of a digest a tag quotes (the manifest's, a
/// wheel's, a signer's key's).
pub const TAG_HEX: usize = 16;

/// [`tag`] leaving `reserve` of the 128 characters for what follows it.
fn base_tag(kind: Kind, name: &str, reserve: usize) -> String {
    let t = format!("{}-{name}", kind.prefix());
    let ok = t.len() + reserve <= 128
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

/// The tag of an artifact in the append-only layout (docs/cache.md):
/// `<prefix>-<name>[-<qualifier>]-<first 16 hex digits of the manifest's
/// sha256>`, e.g. `wheel-<key>-<wheel sha256[..16]>-<manifest[..16]>`. A
/// tag names one manifest forever, so pushing never changes what a tag
/// names; two boxes pushing different content for one entry push two tags.
///
/// Errors: `manifest_digest` is not a sha256 digest.
pub fn content_tag(
    kind: Kind,
    name: &str,
    qualifier: Option<&str>,
    manifest_digest: &str,
) -> Result<String> {
    let hex = digest_hex(manifest_digest)?;
    let q = qualifier.map(|q| format!("-{q}")).unwrap_or_default();
    let base = base_tag(kind, name, q.len() + 1 + TAG_HEX);
    Ok(format!("{base}{q}-{}", &hex[..TAG_HEX]))
}

/// How a tag names an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagForm {
    /// The append-only layout: its qualifier (wheels, attestations) and
    /// the manifest digest prefix it ends with.
    Content {
        /// The qualifier (`None` for kinds without one).
        qualifier: Option<String>,
        /// The 16 hex digits of the manifest's sha256.
        manifest: String,
    },
    /// The layout before issue 23: exactly [`tag`] of kind and name.
    Legacy,
}

/// How `tag` names the entry `kind` `name` (`None`: it names another).
pub fn tag_form(t: &str, kind: Kind, name: &str) -> Option<TagForm> {
    if t == tag(kind, name) {
        return Some(TagForm::Legacy);
    }
    let qlen = kind.qualifier_len();
    let base = base_tag(
        kind,
        name,
        if qlen > 0 { qlen + 1 } else { 0 } + 1 + TAG_HEX,
    );
    let rest = t.strip_prefix(base.as_str())?.strip_prefix('-')?;
    let is_hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let (qualifier, manifest) = if qlen > 0 {
        if rest.len() != qlen + 1 + TAG_HEX {
            return None;
        }
        let (q, m) = rest.split_at(qlen);
        let ok = q.split('-').all(|p| p.len() == TAG_HEX && is_hex(p));
        if !ok {
            return None;
        }
        (Some(q.to_string()), m.strip_prefix('-')?.to_string())
    } else {
        (None, rest.to_string())
    };
    (manifest.len() == TAG_HEX && is_hex(&manifest)).then_some(TagForm::Content {
        qualifier,
        manifest,
    })
}

/// The qualifier the tag of an artifact of `kind` with config `config`
/// carries: the wheel's sha256 (its `build.json`'s), or an attestation's
/// subject and signer ([`qualifier_of_attestation`]); `None` for the other kinds.
///
/// Errors: a wheel's record has no sha256; an attestation does not parse.
pub fn qualifier(kind: Kind, config: &Config) -> Result<Option<String>> {
    match kind {
        Kind::Wheel => {
            let sha = config.record["sha256"]
                .as_str()
                .filter(|s| s.len() >= TAG_HEX)
                .ok_or_else(|| anyhow!("the wheel's record has no sha256"))?;
            Ok(Some(sha[..TAG_HEX].to_string()))
        }
        Kind::Attestation => {
            let att: super::trust::Attestation = serde_json::from_value(config.record.clone())
                .context("the attestation's record is not a statement and signature")?;
            Ok(Some(qualifier_of_attestation(&att)?))
        }
        _ => Ok(None),
    }
}

/// Whether the artifact read from tag `t` (manifest `manifest_digest`,
/// config `config`) is what the tag says: the tag names `config`'s entry,
/// and in the append-only layout it quotes the manifest's digest and the
/// qualifier of the config. A legacy tag is accepted as is.
///
/// Errors: why not (naming the tag).
pub fn check_tag(t: &str, kind: Kind, config: &Config, manifest_digest: &str) -> Result<TagForm> {
    let form = tag_form(t, kind, &config.name).ok_or_else(|| {
        anyhow!(
            "its config names {} {}, whose tags start {}, not {t}",
            kind.name(),
            config.name,
            tag(kind, &config.name)
        )
    })?;
    if let TagForm::Content {
        qualifier: q,
        manifest,
    } = &form
    {
        let hex = digest_hex(manifest_digest)?;
        if !hex.starts_with(manifest.as_str()) {
            bail!("tag {t} names manifest {manifest}..., but it holds {manifest_digest}");
        }
        let want = qualifier(kind, config)?;
        if *q != want {
            bail!(
                "tag {t} quotes {}, but its content gives {}",
                q.as_deref().unwrap_or("nothing"),
                want.as_deref().unwrap_or("nothing")
            );
        }
    }
    Ok(form)
}

/// The hex sha256 a statement's tag quotes as its subject: the sha256 of
/// its one file (a wheel), else of the canonical JSON of its `files`
/// (a lock's several files).
///
/// Errors: the files cannot be encoded canonically.
pub fn subject_digest(statement: &super::trust::Statement) -> Result<String> {
    if let [one] = statement.files.as_slice() {
        return Ok(one.sha256.clone());
    }
    use sha2::{Digest, Sha256};
    let bytes = crate::store::key::canonical_json(&statement.files);
    Ok(hex::encode(Sha256::digest(bytes.as_bytes())))
}

/// The hex SHA256 fingerprint of the key that made the armored SSHSIG
/// `signature`.
///
/// Errors: not an armored SSHSIG.
pub fn signer_hex(signature: &str) -> Result<String> {
    let sig = ssh_key::SshSig::from_pem(signature.as_bytes())
        .map_err(|e| anyhow!("the signature is not an armored SSHSIG ({e})"))?;
    Ok(hex::encode(
        sig.public_key()
            .fingerprint(ssh_key::HashAlg::Sha256)
            .as_bytes(),
    ))
}

/// The tag qualifier of the attestation `att`: `<subject[..16]>-<signer[..16]>`.
///
/// Errors: the statement or the signature does not parse.
pub fn qualifier_of_attestation(att: &super::trust::Attestation) -> Result<String> {
    let statement: super::trust::Statement =
        serde_json::from_str(&att.statement).context("the statement is not a statement's JSON")?;
    let subject = subject_digest(&statement)?;
    let signer = signer_hex(&att.signature)?;
    if subject.len() < TAG_HEX {
        return Err(anyhow!(
            "the statement's subject digest {subject:?} is too short"
        ));
    }
    Ok(format!("{}-{}", &subject[..TAG_HEX], &signer[..TAG_HEX]))
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
    /// Its tag in the append-only layout ([`content_tag`]).
    ///
    /// Errors: a wheel's record has no sha256; an attestation does not parse.
    pub fn tag(&self) -> Result<String> {
        let config = self.config_bytes();
        let manifest = self.manifest_bytes(&config);
        content_tag(
            self.kind,
            &self.name,
            qualifier(self.kind, &self.config)?.as_deref(),
            &super::digest_of(&manifest),
        )
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

/// An `artifactType` as a message shows it: the value, or `none` when the
/// manifest has none (never Rust's `Some("...")`).
pub fn shown_type(t: Option<&str>) -> String {
    t.map_or_else(|| "none".to_string(), str::to_string)
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
            "the manifest of {tag} has artifactType {}, not {}",
            shown_type(m.artifact_type.as_deref()),
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

/// Whether `l` is an entry's tree layer: the tar titled [`TREE_LAYER`]
/// that holds a directory entry's files (unpacked by [`unpack_tree`]).
pub fn is_tree_layer(l: &OciDescriptor) -> bool {
    layer_title(l) == Some(TREE_LAYER) && l.media_type == TAR_MEDIA_TYPE
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
        Bucket::Crates => Some(crate::stages::rust::crates::CRATES_JSON),
        Bucket::Locks => Some(crate::stages::lock::LOCK_JSON),
        Bucket::Bytecode => Some(crate::host::bytecode::BYTECODE_JSON),
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
/// Returns the sha256 of every regular file written, hashed as it is
/// written, by its path under `dest`. Files are created read-only, mode
/// 0444 or 0555 from the member's executable bit (no times, no owners), as
/// the store keeps them: making an entry read-only then changes only its
/// directories (a bytecode tree holds thousands of files).
///
/// Errors: why the layer is refused (nothing of it is kept).
pub fn unpack_tree(file: &Path, dest: &Path) -> Result<std::collections::HashMap<PathBuf, String>> {
    use std::collections::BTreeSet;
    use std::path::Component;
    fs::create_dir_all(dest)?;
    let mut ar = tar::Archive::new(std::io::BufReader::with_capacity(
        1 << 20,
        fs::File::open(file)?,
    ));
    let mut seen = BTreeSet::new();
    let mut links: Vec<String> = Vec::new();
    let mut dirs: std::collections::HashSet<PathBuf> = std::collections::HashSet::new();
    let mut hashes = std::collections::HashMap::new();
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
        let out = dest.join(&path);
        match m.header().entry_type() {
            tar::EntryType::Directory => {
                fs::create_dir_all(&out)?;
                dirs.insert(out);
                continue;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                // Written here, not by `unpack_in` (which canonicalizes
                // every parent and sets times and modes one call each): the
                // path is plain and under no symlink, checked above.
                use sha2::{Digest, Sha256};
                if let Some(parent) = out.parent()
                    && !dirs.contains(parent)
                {
                    fs::create_dir_all(parent)?;
                    dirs.insert(parent.to_path_buf());
                }
                use std::os::unix::fs::OpenOptionsExt;
                let exec = m.header().mode().unwrap_or(0o644) & 0o111 != 0;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(if exec { 0o555 } else { 0o444 })
                    .open(&out)
                    .with_context(|| format!("writing member {path:?}"))?;
                let mut hash = Sha256::new();
                let mut buf = vec![0u8; 1 << 16];
                loop {
                    let n = std::io::Read::read(&mut m, &mut buf)?;
                    if n == 0 {
                        break;
                    }
                    hash.update(&buf[..n]);
                    std::io::Write::write_all(&mut f, &buf[..n])?;
                }
                hashes.insert(out, hex::encode(hash.finalize()));
                continue;
            }
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
    Ok(hashes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_of_another_artifact_type_is_named_plainly() {
        let m = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "artifactType": Kind::Lock.artifact_type(),
            "config": {"mediaType": "application/json", "digest": format!("sha256:{}", "a".repeat(64)), "size": 2},
            "layers": []
        });
        let err = parse_manifest(m.to_string().as_bytes(), Kind::Wheel, "wheel-x").unwrap_err();
        let msg = format!("{err:#}");
        assert_eq!(
            msg,
            format!(
                "the manifest of wheel-x has artifactType {}, not {}",
                Kind::Lock.artifact_type(),
                Kind::Wheel.artifact_type()
            )
        );
        assert!(!msg.contains("Some("), "{msg}");
        assert_eq!(shown_type(None), "none");
    }

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
    fn content_tags_quote_the_manifest_and_are_told_apart_from_other_entries() {
        let m = format!("sha256:{}", "ab".repeat(32));
        let key = "0".repeat(32);
        let w = content_tag(Kind::Wheel, &key, Some(&"c".repeat(16)), &m).unwrap();
        assert_eq!(
            w,
            format!("wheel-{key}-{}-{}", "c".repeat(16), "ab".repeat(8))
        );
        assert!(matches!(
            tag_form(&w, Kind::Wheel, &key),
            Some(TagForm::Content { qualifier: Some(q), .. }) if q == "c".repeat(16)
        ));
        assert_eq!(
            tag_form(&format!("wheel-{key}"), Kind::Wheel, &key),
            Some(TagForm::Legacy)
        );
        assert_eq!(tag_form(&w, Kind::Wheel, &"1".repeat(32)), None);
        // An ext entry whose name extends another's is not the other's.
        let e = content_tag(Kind::Ext, "foo-bar", None, &m).unwrap();
        assert_eq!(tag_form(&e, Kind::Ext, "foo"), None);
        assert!(tag_form(&e, Kind::Ext, "foo-bar").is_some());
        // Long names stay within 128 characters with their suffix.
        let long = content_tag(
            Kind::Attestation,
            &"x".repeat(120),
            Some(&format!("{}-{}", "a".repeat(16), "b".repeat(16))),
            &m,
        )
        .unwrap();
        assert!(long.len() <= 128, "{long}");
        assert!(tag_form(&long, Kind::Attestation, &"x".repeat(120)).is_some());
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
