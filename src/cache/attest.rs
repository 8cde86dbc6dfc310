//! Signed statements as their own artifacts (issue 23, docs/cache.md
//! "Layout"): signing never rewrites what it signs.
//!
//! A statement ([`Statement`]: kind, key, inputs, files, builder, time)
//! signed by one key is pushed as one small artifact of kind
//! [`Kind::Attestation`], tagged
//!
//! ```text
//! att-<kind>-<key>-<subject[..16]>-<signer[..16]>-<manifest[..16]>
//! ```
//!
//! where `subject` is [`subject_digest`] of the statement (for a wheel: the
//! wheel's sha256), `signer` the hex SHA256 fingerprint of the signing key
//! and `manifest` the artifact's own manifest digest. Its config's `record`
//! is the [`Attestation`] (statement text and armored SSHSIG); its two
//! layers are the same as files, `statement.json` and `statement.sig`, for
//! `ssh-keygen -Y verify`. Readers find every attestation of an entry by
//! listing tags ([`super::listing::TagList::attestations`]), which works on
//! every registry, with or without the referrers API.
//!
//! The artifact is generic over what it signs: any kind whose content is
//! named by a key (a wheel today; a lock or a provenance statement the same
//! way) is signed with [`crate::cache::trust::sign`], pushed as
//! [`artifact`], read back with [`read`] and judged with
//! [`crate::cache::trust::verify`] over every attestation found.
//! Re-pushing from the same box changes nothing: the statement carries the
//! build's time, and ed25519 signatures are deterministic, so the artifact
//! and its tag are byte-identical.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use fs_err as fs;
use ssh_key::{HashAlg, SshSig};

use super::Transport;
use super::artifact::{Artifact, Config, FILE_MEDIA_TYPE, Kind, Layer, TAG_HEX};
use super::listing::TagList;
use super::trust::{Attestation, FileDigest, Statement};
use crate::store::ManifestFile;

/// The layer holding the canonical statement (the signed bytes).
pub const STATEMENT_FILE: &str = "statement.json";
/// The layer holding the armored SSHSIG signature.
pub const SIGNATURE_FILE: &str = "statement.sig";

/// The artifact name of the attestations of entry `kind` `key`
/// (`wheel-<key>`): the part of their tags after `att-`.
pub fn signed_name(kind: &str, key: &str) -> String {
    format!("{kind}-{key}")
}

/// The hex sha256 a statement's tag quotes as its subject: the sha256 of
/// its one file (a wheel), else of the canonical JSON of its `files`
/// (a lock's several files).
///
/// Errors: the files cannot be encoded canonically.
pub fn subject_digest(statement: &Statement) -> Result<String> {
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
    let sig = SshSig::from_pem(signature.as_bytes())
        .map_err(|e| anyhow!("the signature is not an armored SSHSIG ({e})"))?;
    Ok(hex::encode(
        sig.public_key().fingerprint(HashAlg::Sha256).as_bytes(),
    ))
}

/// The tag qualifier of `att`: `<subject[..16]>-<signer[..16]>`.
///
/// Errors: the statement or the signature does not parse.
pub fn qualifier(att: &Attestation) -> Result<String> {
    let statement: Statement =
        serde_json::from_str(&att.statement).context("the statement is not a statement's JSON")?;
    let subject = subject_digest(&statement)?;
    let signer = signer_hex(&att.signature)?;
    if subject.len() < TAG_HEX {
        return Err(anyhow!("the statement's subject digest {subject:?} is too short"));
    }
    Ok(format!("{}-{}", &subject[..TAG_HEX], &signer[..TAG_HEX]))
}

/// The artifact of `att` (see the module docs), its two layer files written
/// into the new directory `scratch`.
///
/// Errors: the statement is not canonical; the files cannot be written.
pub fn artifact(att: &Attestation, scratch: &Path) -> Result<Artifact> {
    let statement = Statement::from_canonical(att.statement.as_bytes())?;
    fs::create_dir_all(scratch)?;
    let mut layers = Vec::new();
    let mut files = Vec::new();
    for (title, text) in [
        (STATEMENT_FILE, &att.statement),
        (SIGNATURE_FILE, &att.signature),
    ] {
        let p = scratch.join(title);
        fs::write(&p, text)?;
        let l = Layer::of_file(&p, title, FILE_MEDIA_TYPE)?;
        files.push(ManifestFile {
            path: title.to_string(),
            size: l.size,
            sha256: super::digest_hex(&l.digest)?.to_string(),
        });
        layers.push(l);
    }
    let name = signed_name(&statement.kind, &statement.key);
    Ok(Artifact {
        kind: Kind::Attestation,
        name: name.clone(),
        config: Config {
            format: 1,
            kind: Kind::Attestation,
            name,
            record: serde_json::to_value(att)?,
            files,
            attestations: Vec::new(),
        },
        layers,
    })
}

/// The attestation an attestation artifact's config carries.
///
/// Errors: the record is not an attestation.
pub fn of_config(config: &Config) -> Result<Attestation> {
    serde_json::from_value(config.record.clone())
        .context("its record is not a statement and a signature")
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
pub fn read(
    cache: &dyn Transport,
    tags: &TagList,
    kind: &str,
    key: &str,
    scratch: &Path,
) -> Result<Found> {
    let mut found = Found::default();
    for (i, tag) in tags.attestations(kind, key).into_iter().enumerate() {
        let dir = scratch.join(format!("att{i}"));
        match super::listing::read_config(cache, &tag, Kind::Attestation, &dir) {
            Ok(Some(read)) => match of_config(&read.config) {
                Ok(att) if read.config.name == signed_name(kind, key) => {
                    found.attestations.push(att)
                }
                Ok(_) => found.problems.push(format!(
                    "{tag}: its config names {}, not {}",
                    read.config.name,
                    signed_name(kind, key)
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

/// The files a statement of this artifact kind names for the wheel whose
/// record is `config.record` (its `build.json`): the wheel alone.
pub fn wheel_files(config: &Config) -> Vec<FileDigest> {
    serde_json::from_value::<crate::stages::wheel::BuildRecord>(config.record.clone())
        .map(|r| super::trust::wheel_files(&r))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_names_are_kind_and_key() {
        assert_eq!(signed_name("wheel", "abc"), "wheel-abc");
        assert!(super::super::artifact::tag(Kind::Attestation, &signed_name("wheel", "abc")).starts_with("att-wheel-abc"));
    }
}
