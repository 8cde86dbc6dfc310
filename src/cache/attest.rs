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
//! listing tags (`listing::TagList::attestations`), which works on
//! every registry, with or without the referrers API.
//!
//! The artifact is generic over what it signs: any kind whose content is
//! named by a key (a wheel today; a lock or a provenance statement the same
//! way) is signed with [`crate::cache::trust::sign`], pushed as
//! [`artifact`], read back with `listing::attestations` and judged with
//! [`crate::cache::trust::verify`] over every attestation found.
//! Re-pushing from the same box changes nothing: the statement carries the
//! build's time, and ed25519 signatures are deterministic, so the artifact
//! and its tag are byte-identical.

use std::path::Path;

use anyhow::{Context, Result};
use fs_err as fs;

use super::artifact::{Artifact, Config, FILE_MEDIA_TYPE, Kind, Layer};
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

pub use super::artifact::{qualifier_of_attestation as qualifier, signer_hex, subject_digest};

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
        assert!(
            super::super::artifact::tag(Kind::Attestation, &signed_name("wheel", "abc"))
                .starts_with("att-wheel-abc")
        );
    }
}
