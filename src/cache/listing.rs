//! What a cache holds for one entry, found by listing its tags (issue 23):
//! the OCI distribution tag list (`GET /v2/<name>/tags/list`), which every
//! registry serves, or a layout's `index.json`.
//!
//! In the append-only layout (docs/cache.md) an entry may have several
//! artifacts: two boxes that built one reproducible wheel push two wheel
//! artifacts with the same wheel and their own `build.json`; two boxes
//! that built different wheels for one key push both, and every reader
//! sees both. [`TagList::of`] gives an entry's tags (the present layout's
//! first, then the tag of the layout before, which is still read);
//! [`wheels`] reads every wheel artifact of a key with every attestation
//! of it, so the verdict ([`Wheels::verdict`]) is the same for every reader:
//! `pull`, `build`'s substitution, `plan`, `cache ls` and `cache verify`.

use std::path::Path;

use anyhow::{Context, Result};
use fs_err as fs;
use oci_client::manifest::OciImageManifest;

use super::Transport;
use super::artifact::{self, Config, Kind, TagForm};
use super::attest;
use super::trust::{Attestation, FileDigest, Policy, Verdict};

/// Every tag of a cache, sorted, as listed once.
#[derive(Debug, Clone, Default)]
pub struct TagList {
    tags: Vec<String>,
}

impl TagList {
    /// Lists the tags of `cache`.
    ///
    /// Errors: the cache cannot be read.
    pub fn read(cache: &dyn Transport) -> Result<TagList> {
        let mut tags = cache.tags()?;
        tags.sort();
        tags.dedup();
        Ok(TagList { tags })
    }

    /// The list `tags` (for tests and callers that listed already).
    pub fn from_tags(mut tags: Vec<String>) -> TagList {
        tags.sort();
        tags.dedup();
        TagList { tags }
    }

    /// Every tag.
    pub fn all(&self) -> &[String] {
        &self.tags
    }

    /// Whether `tag` is listed.
    pub fn contains(&self, tag: &str) -> bool {
        self.tags.binary_search_by(|t| t.as_str().cmp(tag)).is_ok()
    }

    /// The tags of the entry `kind` `name`: the append-only layout's, in
    /// tag order, then the legacy tag when there is one.
    pub fn of(&self, kind: Kind, name: &str) -> Vec<String> {
        let mut content = Vec::new();
        let mut legacy = Vec::new();
        let prefix = artifact::tag(kind, name);
        let hashed = format!("{}-h", kind.prefix());
        for t in &self.tags {
            // Cheap filter first: the tag starts with the entry's name or
            // with the hashed form a long name takes.
            if !t.starts_with(&prefix) && !t.starts_with(&hashed) {
                continue;
            }
            match artifact::tag_form(t, kind, name) {
                Some(TagForm::Legacy) => legacy.push(t.clone()),
                Some(TagForm::Content { .. }) => content.push(t.clone()),
                None => {}
            }
        }
        content.extend(legacy);
        content
    }

    /// The tags of the attestations of entry `kind` `key` (kind as in
    /// statements: `wheel`).
    pub fn attestations(&self, kind: &str, key: &str) -> Vec<String> {
        self.of(Kind::Attestation, &attest::signed_name(kind, key))
            .into_iter()
            .filter(|t| {
                matches!(
                    artifact::tag_form(t, Kind::Attestation, &attest::signed_name(kind, key)),
                    Some(TagForm::Content { .. })
                )
            })
            .collect()
    }
}

/// The attestations found for one entry: those that could be read, and
/// what was wrong with the others (an unreadable attestation vouches for
/// nothing; it is reported, never counted).
#[derive(Debug, Clone, Default)]
pub struct Found {
    /// Every attestation read, in tag order.
    pub attestations: Vec<Attestation>,
    /// `<tag>: <why>` for each one that could not be read.
    pub problems: Vec<String>,
}

/// Every attestation `cache` holds for entry `kind` `key` (kind as in
/// statements: `wheel`), found in `tags`; config blobs go through the new
/// directory `scratch`.
///
/// Errors: the cache cannot be read (a refused or garbled artifact is a
/// [`Found::problems`] line instead).
pub fn attestations(
    cache: &dyn Transport,
    tags: &TagList,
    kind: &str,
    key: &str,
    scratch: &Path,
) -> Result<Found> {
    let mut found = Found::default();
    for (i, tag) in tags.attestations(kind, key).into_iter().enumerate() {
        let dir = scratch.join(format!("att{i}"));
        match read_config(cache, &tag, Kind::Attestation, &dir) {
            Ok(Some(read)) => match attest::of_config(&read.config) {
                Ok(att) if read.config.name == attest::signed_name(kind, key) => {
                    found.attestations.push(att)
                }
                Ok(_) => found.problems.push(format!(
                    "{tag}: its config names {}, not {}",
                    read.config.name,
                    attest::signed_name(kind, key)
                )),
                Err(e) => found.problems.push(format!("{tag}: {e:#}")),
            },
            Ok(None) => {}
            Err(e) => found.problems.push(format!("{tag}: {e:#}")),
        }
        let _ = fs::remove_dir_all(&dir);
    }
    Ok(found)
}

/// An artifact's manifest and config, read and checked.
#[derive(Debug, Clone)]
pub struct Read {
    /// Its tag.
    pub tag: String,
    /// The manifest's digest.
    pub digest: String,
    /// The manifest.
    pub manifest: OciImageManifest,
    /// The config blob.
    pub config: Config,
}

/// Reads the manifest of `tag` (an artifact of `kind`) and its config blob
/// (through the new directory `scratch`, removed afterwards) and checks
/// that the tag names them ([`artifact::check_tag`]). `None` when the tag
/// is gone.
///
/// Errors: the cache fails; the manifest or config is not one of `kind`,
/// or the tag does not name them (naming the cache and the tag).
pub fn read_config(
    cache: &dyn Transport,
    tag: &str,
    kind: Kind,
    scratch: &Path,
) -> Result<Option<Read>> {
    read_config_with(cache, tag, kind, scratch, &mut |digest, size, dest| {
        cache.get_blob(digest, size, dest)
    })
}

/// [`read_config`], the config blob fetched by `get_blob` (digest, declared
/// size, new file; it must check the blob as [`Transport::get_blob`] does):
/// how `pull` takes a config an unfinished pull checked from the store's
/// download area.
///
/// Errors: as [`read_config`].
pub fn read_config_with(
    cache: &dyn Transport,
    tag: &str,
    kind: Kind,
    scratch: &Path,
    get_blob: &mut dyn FnMut(&str, u64, &Path) -> Result<()>,
) -> Result<Option<Read>> {
    let url = cache.describe();
    let Some(got) = cache.manifest(tag)? else {
        return Ok(None);
    };
    let manifest =
        artifact::parse_manifest(&got.bytes, kind, tag).with_context(|| format!("cache {url}"))?;
    fs::create_dir_all(scratch)?;
    let p = scratch.join("config.json");
    let size = u64::try_from(manifest.config.size).unwrap_or(0);
    let config: Result<Config> =
        get_blob(&manifest.config.digest, size, &p).and_then(|()| crate::store::read_json(&p));
    let _ = fs::remove_file(&p);
    let config = config.with_context(|| format!("cache {url}: the config of {tag}"))?;
    if config.kind != kind {
        anyhow::bail!(
            "cache {url}: {tag} carries a {} entry, not a {} entry",
            config.kind.name(),
            kind.name()
        );
    }
    artifact::check_tag(tag, kind, &config, &got.digest)
        .with_context(|| format!("cache {url}: refusing {tag}"))?;
    Ok(Some(Read {
        tag: tag.to_string(),
        digest: got.digest,
        manifest,
        config,
    }))
}

/// Every artifact a cache holds for one signed entry (a wheel today; a
/// lock, or any kind whose content a statement vouches for, the same way)
/// and every attestation of its key.
#[derive(Debug, Clone)]
pub struct Signed {
    /// The artifact kind.
    pub kind: Kind,
    /// The entry's key.
    pub key: String,
    /// Each artifact read (tag order; the legacy tag last).
    pub candidates: Vec<Read>,
    /// Every attestation: the attestation artifacts', then those embedded
    /// in a legacy artifact's config.
    pub attestations: Vec<Attestation>,
    /// What could not be read (`<tag>: <why>`): an unreadable artifact is
    /// reported and never counts.
    pub problems: Vec<String>,
    /// The files a statement about a candidate must name (for a wheel:
    /// [`attest::wheel_files`], the wheel alone).
    pub files_of: fn(&Config) -> Vec<FileDigest>,
}

/// The wheels of a key: [`Signed`] of kind wheel.
pub type Wheels = Signed;

/// Reads every artifact of entry `kind` `key` in `cache` and every
/// attestation of it (statement kind [`Kind::name`]), through the new
/// directory `scratch`; `files_of` gives the files a statement about a
/// candidate must name.
///
/// Errors: the cache cannot be read.
pub fn signed(
    cache: &dyn Transport,
    tags: &TagList,
    kind: Kind,
    key: &str,
    files_of: fn(&Config) -> Vec<FileDigest>,
    scratch: &Path,
) -> Result<Signed> {
    let found = attestations(cache, tags, kind.name(), key, scratch)?;
    let mut out = Signed {
        kind,
        key: key.to_string(),
        candidates: Vec::new(),
        attestations: found.attestations,
        problems: found.problems,
        files_of,
    };
    for (i, tag) in tags.of(kind, key).into_iter().enumerate() {
        match read_config(cache, &tag, kind, &scratch.join(format!("c{i}"))) {
            Ok(Some(r)) => {
                for a in &r.config.attestations {
                    if !out.attestations.contains(a) {
                        out.attestations.push(a.clone());
                    }
                }
                out.candidates.push(r);
            }
            Ok(None) => {}
            Err(e) => out.problems.push(format!("{e:#}")),
        }
    }
    Ok(out)
}

/// Every wheel artifact of `key` and every attestation of it: [`signed`]
/// with kind wheel and [`attest::wheel_files`].
///
/// Errors: the cache cannot be read.
pub fn wheels(cache: &dyn Transport, tags: &TagList, key: &str, scratch: &Path) -> Result<Wheels> {
    signed(cache, tags, Kind::Wheel, key, attest::wheel_files, scratch)
}

impl Signed {
    /// The verdict of `policy`, now, on the content of `candidate`, from
    /// every attestation of the key: two trusted statements naming
    /// different files give the reproducibility failure whichever artifact
    /// is asked.
    pub fn verdict(&self, candidate: &Read, policy: &Policy) -> Verdict {
        super::trust::verify(
            self.kind.name(),
            &self.key,
            &(self.files_of)(&candidate.config),
            &self.attestations,
            policy,
            jiff::Timestamp::now().as_second(),
        )
    }

    /// The distinct contents the candidates hold (the sha256 of each
    /// candidate's first signed file: for wheels, the wheel's).
    pub fn shas(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .candidates
            .iter()
            .filter_map(|c| (self.files_of)(&c.config).first().map(|f| f.sha256.clone()))
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// The verdict of `policy`, now, on the wheel whose artifact config is
/// `config` from `attestations` (every attestation of its key).
pub fn verdict(config: &Config, attestations: &[Attestation], policy: &Policy) -> Verdict {
    super::trust::verify(
        Kind::Wheel.name(),
        &config.name,
        &attest::wheel_files(config),
        attestations,
        policy,
        jiff::Timestamp::now().as_second(),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cache::artifact::Artifact;
    use crate::cache::layout::Layout;

    /// Pushes `a` (config only, no layers) to `t` under `tag`.
    pub(crate) fn put(t: &Layout, a: &Artifact, tag: &str, dir: &Path) {
        let bytes = a.config_bytes();
        let p = dir.join(format!("{tag}.json"));
        std::fs::write(&p, &bytes).unwrap();
        t.put_blob(&p, &crate::cache::digest_of(&bytes), bytes.len() as u64)
            .unwrap();
        t.put_manifest(tag, &a.manifest_bytes(&bytes)).unwrap();
    }

    /// A wheel artifact of key `key` for a wheel of sha256 `sha`, with
    /// `embedded` attestations in its config (the layout before issue 23).
    pub(crate) fn wheel(key: &str, sha: &str, embedded: Vec<Attestation>) -> Artifact {
        Artifact {
            kind: Kind::Wheel,
            name: key.to_string(),
            config: Config {
                format: 1,
                kind: Kind::Wheel,
                name: key.to_string(),
                record: serde_json::json!({ "sha256": sha }),
                files: Vec::new(),
                attestations: embedded,
            },
            layers: Vec::new(),
        }
    }

    #[test]
    fn a_legacy_wheel_is_read_with_its_embedded_attestations_beside_new_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let t = Layout::open(&tmp.path().join("layout"), "file:///layout").unwrap();
        let key = "e".repeat(32);
        let old = Attestation {
            statement: "{\"old\":true}".into(),
            signature: "sig".into(),
        };
        // The layout before issue 23: `wheel-<key>`, signatures in the config.
        put(
            &t,
            &wheel(&key, &"1".repeat(64), vec![old.clone()]),
            &format!("wheel-{key}"),
            tmp.path(),
        );
        // The append-only layout: another wheel for the key, under its content tag.
        let new = wheel(&key, &"2".repeat(64), Vec::new());
        let new_tag = new.tag().unwrap();
        put(&t, &new, &new_tag, tmp.path());
        // A tag that quotes another manifest than it holds is refused.
        let liar = format!("{}-{}", &new_tag[..new_tag.len() - 17], "0".repeat(16));
        put(&t, &new, &liar, tmp.path());

        let tags = TagList::read(&t).unwrap();
        let w = wheels(&t, &tags, &key, &tmp.path().join("scratch")).unwrap();
        let read: Vec<&str> = w.candidates.iter().map(|c| c.tag.as_str()).collect();
        assert_eq!(read, [new_tag.as_str(), format!("wheel-{key}").as_str()]);
        assert_eq!(w.attestations, vec![old]);
        let shas: Vec<&str> = w
            .candidates
            .iter()
            .map(|c| c.config.record["sha256"].as_str().unwrap())
            .collect();
        assert_eq!(shas, ["2".repeat(64), "1".repeat(64)]);
        assert_eq!(w.problems.len(), 1, "{:?}", w.problems);
        assert!(w.problems[0].contains("names manifest"), "{:?}", w.problems);
    }

    #[test]
    fn an_entry_s_tags_are_its_own_content_tags_then_its_legacy_tag() {
        let key = "a".repeat(32);
        let m = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let w1 = artifact::content_tag(Kind::Wheel, &key, Some(&"1".repeat(16)), &m('b')).unwrap();
        let w2 = artifact::content_tag(Kind::Wheel, &key, Some(&"2".repeat(16)), &m('c')).unwrap();
        let other =
            artifact::content_tag(Kind::Wheel, &"f".repeat(32), Some(&"1".repeat(16)), &m('b'))
                .unwrap();
        let att = artifact::content_tag(
            Kind::Attestation,
            &attest::signed_name("wheel", &key),
            Some(&format!("{}-{}", "1".repeat(16), "9".repeat(16))),
            &m('d'),
        )
        .unwrap();
        let legacy = format!("wheel-{key}");
        let list = TagList::from_tags(vec![
            legacy.clone(),
            w2.clone(),
            other,
            att.clone(),
            w1.clone(),
            "latest".into(),
        ]);
        assert_eq!(list.of(Kind::Wheel, &key), vec![w1, w2, legacy]);
        assert_eq!(list.attestations("wheel", &key), vec![att]);
        assert!(list.attestations("lock", &key).is_empty());
    }
}
