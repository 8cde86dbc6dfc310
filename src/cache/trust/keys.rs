//! Keys and signing: the builder's ed25519 [`SigningKey`], SSHSIG
//! signatures ([`sign`], namespace [`NAMESPACE`]) and the signed
//! [`Attestation`].

use std::fmt;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use ssh_key::{Algorithm, HashAlg, LineEnding};

use super::*;
use crate::cache::config::Cache;
use crate::exit::bad_input;

/// The SSHSIG namespace of every oracle-build signature.
pub const NAMESPACE: &str = "oracle-build";

/// A statement with one signature over its canonical bytes, as kept in an
/// artifact's config blob (the `attestations` list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attestation {
    /// The canonical JSON text of the [`Statement`], exactly as signed.
    pub statement: String,
    /// The armored SSHSIG signature (`-----BEGIN SSH SIGNATURE-----`).
    pub signature: String,
}

/// An ed25519 private key that signs statements.
pub struct SigningKey {
    key: ssh_key::PrivateKey,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({})", self.fingerprint())
    }
}

impl SigningKey {
    /// The key in OpenSSH private key file `path`.
    ///
    /// Errors: exit 2 naming the path when the file is not an OpenSSH
    /// private key, is encrypted (a passphrase; oracle-build signs
    /// unattended, so decrypt a copy with `ssh-keygen -p`), or is not
    /// ed25519; 1 when it cannot be read.
    pub fn load(path: &Path) -> Result<SigningKey> {
        let shown = path.display().to_string();
        let text =
            crate::cache::keyfile::read(path, &shown, crate::cache::keyfile::KeyKind::PrivateKey)?;
        SigningKey::from_openssh(&text, &shown)
    }

    /// The `signing_key` of `cache`, read as [`SigningKey::load`] does, each
    /// error naming the config file, line and field; `None` without one.
    ///
    /// Errors: exit 2 as [`crate::cache::keyfile::read`] and [`SigningKey::from_openssh`].
    pub fn for_cache(cache: &Cache) -> Result<Option<SigningKey>> {
        let Some(path) = &cache.signing_key else {
            return Ok(None);
        };
        let named = cache.key_field("signing_key");
        let text =
            crate::cache::keyfile::read(path, &named, crate::cache::keyfile::KeyKind::PrivateKey)?;
        SigningKey::from_openssh(&text, &format!("{named}: {}", path.display())).map(Some)
    }

    /// The key from the text of an OpenSSH private key file; `origin` names
    /// it in errors (as [`SigningKey::load`]).
    pub fn from_openssh(text: &str, origin: &str) -> Result<SigningKey> {
        let key = ssh_key::PrivateKey::from_openssh(text).map_err(|e| {
            bad_input(format!(
                "{origin}: signing_key: not an OpenSSH private key ({e}); make one with `ssh-keygen -t ed25519 -N '' -f <file>`"
            ))
        })?;
        if key.is_encrypted() {
            return Err(bad_input(format!(
                "{origin}: signing_key: the key is encrypted with a passphrase; oracle-build signs unattended, so give it an unencrypted copy (`ssh-keygen -p -N '' -f <copy>`) kept readable only by the builder"
            )));
        }
        if key.algorithm() != Algorithm::Ed25519 {
            return Err(bad_input(format!(
                "{origin}: signing_key: the key is {}, but oracle-build signs only with ed25519 keys (`ssh-keygen -t ed25519`)",
                key.algorithm()
            )));
        }
        Ok(SigningKey { key })
    }

    /// The SHA256 fingerprint of the public key (`SHA256:...`).
    pub fn fingerprint(&self) -> String {
        self.key.fingerprint(HashAlg::Sha256).to_string()
    }

    /// An armored SSHSIG signature (namespace [`NAMESPACE`], sha512) over
    /// `bytes`, as [`sign`] makes for a statement: for other signed
    /// documents (the SLSA provenance, `cache::provenance`).
    ///
    /// Errors: signing or encoding fails.
    pub fn sign_bytes(&self, bytes: &[u8]) -> Result<String> {
        let sig = self
            .key
            .sign(NAMESPACE, HashAlg::Sha512, bytes)
            .context("signing")?;
        sig.to_pem(LineEnding::LF).context("encoding the signature")
    }

    /// The public key.
    pub fn public_key(&self) -> &ssh_key::PublicKey {
        self.key.public_key()
    }

    /// The public key as one OpenSSH line (`ssh-ed25519 AAAA... comment`).
    ///
    /// Errors: the key cannot be encoded (not expected for a loaded key).
    pub fn public_openssh(&self) -> Result<String> {
        Ok(self.key.public_key().to_openssh()?)
    }
}

/// Signs `statement` with `key`: SSHSIG over its canonical bytes.
///
/// Errors: the statement cannot be canonicalised, or signing fails.
pub fn sign(statement: &Statement, key: &SigningKey) -> Result<Attestation> {
    let bytes = statement.canonical()?;
    let sig = key
        .key
        .sign(NAMESPACE, HashAlg::Sha512, &bytes)
        .context("signing the statement")?;
    let signature = sig
        .to_pem(LineEnding::LF)
        .context("encoding the signature")?;
    let statement = String::from_utf8(bytes).context("the canonical statement is not UTF-8")?;
    Ok(Attestation {
        statement,
        signature,
    })
}
