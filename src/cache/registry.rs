//! An `oci://` / `oci+http://` cache: a registry speaking the OCI
//! distribution spec (distribution, Harbor, GHCR, ECR, Artifactory, zot),
//! through `oci-client` (reqwest, TLS by the system's OpenSSL).
//!
//! Credentials come from the Docker and Podman config files as every
//! registry client reads them (`docker_credential`: `$DOCKER_CONFIG` or
//! `~/.docker/config.json`, its `auths` and credential helpers, then
//! `$REGISTRY_AUTH_FILE` / Podman's `auth.json`); none means anonymous.
//! Basic and Bearer token auth are negotiated by `oci-client` from the
//! registry's `WWW-Authenticate` challenge.
//!
//! The async client runs on a current-thread Tokio runtime behind this
//! blocking edge: each [`Transport`] call is one `block_on`.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::{Fetched, Transport, digest_of};
use crate::store::sha256_file;

/// The media type of an OCI image manifest, the only one a cache writes.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// A registry repository and a client for it.
pub struct Registry {
    client: Client,
    runtime: tokio::runtime::Runtime,
    host: String,
    repo: String,
    auth: RegistryAuth,
    url: String,
}

/// The credentials for `host` from the Docker config (`$DOCKER_CONFIG`,
/// `~/.docker/config.json`, credential helpers) or Podman's auth file;
/// anonymous when neither has any.
pub fn credentials(host: &str) -> RegistryAuth {
    let found = docker_credential::get_credential(host)
        .or_else(|_| docker_credential::get_podman_credential(host));
    match found {
        Ok(docker_credential::DockerCredential::UsernamePassword(u, p)) => {
            RegistryAuth::Basic(u, p)
        }
        Ok(docker_credential::DockerCredential::IdentityToken(t)) => RegistryAuth::Bearer(t),
        Err(_) => RegistryAuth::Anonymous,
    }
}

fn not_found(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|x| {
            matches!(
                x.code,
                OciErrorCode::ManifestUnknown
                    | OciErrorCode::NameUnknown
                    | OciErrorCode::BlobUnknown
            )
        }),
        OciDistributionError::ServerError { code: 404, .. } => true,
        _ => false,
    }
}

impl Registry {
    /// A client for `host`/`repo` (`plain_http`: `oci+http://`), with the
    /// credentials of [`credentials`]; `url` is how the user named it.
    ///
    /// Errors: the Tokio runtime cannot be made.
    pub fn new(host: &str, repo: &str, plain_http: bool, url: &str) -> Result<Registry> {
        let config = ClientConfig {
            protocol: if plain_http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            // One PUT per blob with its length: every registry takes it,
            // and a killed upload leaves nothing but an unfinished session.
            use_monolithic_push: true,
            ..Default::default()
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the registry client's runtime")?;
        Ok(Registry {
            client: Client::new(config),
            runtime,
            host: host.to_string(),
            repo: repo.to_string(),
            auth: credentials(host),
            url: url.to_string(),
        })
    }

    fn reference(&self, tag: &str) -> Reference {
        Reference::with_tag(self.host.clone(), self.repo.clone(), tag.to_string())
    }

    fn context(&self, what: &str) -> String {
        format!("cache {}: {what}", self.url)
    }
}

impl Transport for Registry {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn manifest(&self, tag: &str) -> Result<Option<Fetched>> {
        let r = self.reference(tag);
        let got = self.runtime.block_on(self.client.pull_manifest_raw(
            &r,
            &self.auth,
            &[MANIFEST_MEDIA_TYPE],
        ));
        match got {
            Ok((bytes, digest)) => {
                let mine = digest_of(&bytes);
                if mine != digest {
                    bail!(
                        "{}",
                        self.context(&format!(
                            "manifest of {tag} does not match its digest {digest} (got {mine})"
                        ))
                    );
                }
                Ok(Some(Fetched {
                    bytes: bytes.to_vec(),
                    digest,
                }))
            }
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(anyhow!(e))
                .with_context(|| self.context(&format!("reading the manifest of {tag}"))),
        }
    }

    fn has_blob(&self, digest: &str) -> Result<bool> {
        let r = self.reference("latest");
        self.runtime
            .block_on(async {
                self.client
                    .store_auth_if_needed(r.resolve_registry(), &self.auth)
                    .await;
                self.client.blob_exists(&r, digest).await
            })
            .map_err(|e| anyhow!(e))
            .with_context(|| self.context(&format!("asking for blob {digest}")))
    }

    fn get_blob(&self, digest: &str, size: u64, dest: &Path) -> Result<()> {
        let r = self.reference("latest");
        let result = (|| {
            self.runtime
                .block_on(async {
                    self.client
                        .store_auth_if_needed(r.resolve_registry(), &self.auth)
                        .await;
                    let file = tokio::fs::File::create(dest).await?;
                    self.client.pull_blob(&r, digest, file).await
                })
                .map_err(|e| anyhow!(e))
                .with_context(|| self.context(&format!("downloading blob {digest}")))?;
            let len = fs_err::metadata(dest)?.len();
            let got = format!("sha256:{}", sha256_file(dest)?);
            if got != digest || len != size {
                bail!(
                    "{}",
                    self.context(&format!(
                        "blob {digest} does not match its digest (got {got}, {len} bytes; expected {size})"
                    ))
                );
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = fs_err::remove_file(dest);
        }
        result
    }

    fn put_blob(&self, src: &Path, digest: &str, size: u64) -> Result<bool> {
        if self.has_blob(digest)? {
            return Ok(false);
        }
        let r = self.reference("latest");
        let file =
            std::fs::File::open(src).with_context(|| format!("opening {}", src.display()))?;
        let chunks = futures_util::stream::unfold(file, |mut f| async move {
            let mut buf = vec![0u8; 1 << 20];
            match f.read(&mut buf) {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(bytes::Bytes::from(buf)), f))
                }
                Err(e) => Some((Err(OciDistributionError::IoError(e)), f)),
            }
        });
        self.runtime
            .block_on(async {
                self.client
                    .store_auth_if_needed(r.resolve_registry(), &self.auth)
                    .await;
                self.client
                    .push_blob_stream(&r, chunks, digest, Some(size))
                    .await
            })
            .map_err(|e| anyhow!(e))
            .with_context(|| {
                self.context(&format!("uploading blob {digest} ({})", src.display()))
            })?;
        Ok(true)
    }

    fn put_manifest(&self, tag: &str, bytes: &[u8]) -> Result<String> {
        let r = self.reference(tag);
        let body = bytes.to_vec();
        self.runtime
            .block_on(async {
                self.client
                    .store_auth_if_needed(r.resolve_registry(), &self.auth)
                    .await;
                self.client
                    .push_manifest_raw(
                        &r,
                        body,
                        http::HeaderValue::from_static(MANIFEST_MEDIA_TYPE),
                    )
                    .await
            })
            .map_err(|e| anyhow!(e))
            .with_context(|| self.context(&format!("pushing the manifest of {tag}")))?;
        Ok(digest_of(bytes))
    }

    fn tags(&self) -> Result<Vec<String>> {
        let r = self.reference("latest");
        let mut out = Vec::new();
        let mut last: Option<String> = None;
        loop {
            let page = self.runtime.block_on(self.client.list_tags(
                &r,
                &self.auth,
                Some(1000),
                last.as_deref(),
            ));
            let page = match page {
                Ok(p) => p,
                Err(e) if not_found(&e) => break,
                Err(e) => return Err(anyhow!(e)).with_context(|| self.context("listing tags")),
            };
            let n = page.tags.len();
            last = page.tags.last().cloned();
            out.extend(page.tags);
            if n < 1000 {
                break;
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn delete_manifest(&self, digest: &str) -> Result<()> {
        let target = super::delete::Target {
            host: &self.host,
            repo: &self.repo,
            plain_http: self.url.starts_with("oci+http://"),
            auth: &self.auth,
            url: &self.url,
        };
        self.runtime
            .block_on(super::delete::delete_manifest(&target, digest))
    }
}
