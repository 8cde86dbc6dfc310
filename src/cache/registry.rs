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
//!
//! Reads are bounded ([`super::bounds`]): manifests and blobs are read by
//! this module's own GET (a `reqwest` client with the cache's connect and
//! idle-read timeouts, authorized by `oci-client`'s token), so a manifest
//! stops at [`MANIFEST_LIMIT`] bytes and a blob at its declared size, and
//! a response that stalls ends the request as an [`Unreachable`] error.
//! The tag list is read the same way (at most [`TAG_PAGE_LIMIT`] bytes a
//! page, [`TAG_LIST_LIMIT`] in all); a manifest `DELETE` ([`super::delete`])
//! has the same timeouts.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Mutex;

use anyhow::{Context, Result, anyhow, bail};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};

use super::bounds::{
    ERROR_BODY_LIMIT, MANIFEST_LIMIT, TAG_LIST_LIMIT, TAG_PAGE_LIMIT, Timeouts, Unreachable,
    is_unreachable,
};
use super::{Fetched, Transport, digest_of};

/// The media type of an OCI image manifest, the only one a cache writes.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// A registry repository and a client for it.
pub struct Registry {
    /// The `oci-client` client (token negotiation, pushes), made on first
    /// use: building it loads the system's TLS roots, which an anonymous
    /// pull from a plain-HTTP cache never needs.
    client: std::sync::OnceLock<Client>,
    /// The client of this module's bounded GETs (manifests, blobs).
    http: reqwest::Client,
    /// The bearer token of those GETs, once asked for (`Some(None)`: none needed).
    token: Mutex<Option<Option<String>>>,
    runtime: tokio::runtime::Runtime,
    host: String,
    repo: String,
    plain_http: bool,
    auth: RegistryAuth,
    timeouts: Timeouts,
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

impl Registry {
    /// A client for `host`/`repo` (`plain_http`: `oci+http://`), with the
    /// credentials of [`credentials`] and `timeouts` on every request;
    /// `url` is how the user named it.
    ///
    /// Errors: the Tokio runtime or the HTTP client cannot be made.
    pub fn new(
        host: &str,
        repo: &str,
        plain_http: bool,
        url: &str,
        timeouts: Timeouts,
    ) -> Result<Registry> {
        let mut http = crate::host::http::client_builder()
            .connect_timeout(timeouts.connect)
            .read_timeout(timeouts.read);
        if plain_http {
            // No TLS: no roots of its own (native-tls still reads the
            // system's bundle once as the client is made).
            http = http.tls_certs_only(Vec::<reqwest::Certificate>::new());
        }
        let http = http
            .build()
            .context("building the registry's HTTP client")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the registry client's runtime")?;
        Ok(Registry {
            client: std::sync::OnceLock::new(),
            http,
            token: Mutex::new(None),
            runtime,
            host: host.to_string(),
            repo: repo.to_string(),
            plain_http,
            auth: credentials(host),
            timeouts,
            url: url.to_string(),
        })
    }

    /// The `oci-client` client, made on first use (see [`Registry::client`]).
    fn oci(&self) -> &Client {
        self.client.get_or_init(|| {
            Client::new(ClientConfig {
                protocol: if self.plain_http {
                    ClientProtocol::Http
                } else {
                    ClientProtocol::Https
                },
                // One PUT per blob with its length: every registry takes it,
                // and a killed upload leaves nothing but an unfinished session.
                use_monolithic_push: true,
                connect_timeout: Some(self.timeouts.connect),
                read_timeout: Some(self.timeouts.read),
                ..Default::default()
            })
        })
    }

    fn reference(&self, tag: &str) -> Reference {
        Reference::with_tag(self.host.clone(), self.repo.clone(), tag.to_string())
    }

    fn context(&self, what: &str) -> String {
        format!("cache {}: {what}", self.url)
    }

    /// The URL of `/v2/<repo>/<rest>` (the distribution spec's endpoints).
    fn v2_url(&self, rest: &str) -> String {
        let scheme = if self.plain_http { "http" } else { "https" };
        format!("{scheme}://{}/v2/{}/{rest}", self.host, self.repo)
    }

    /// The error of a failed request `what`: [`Unreachable`] when the
    /// cache timed out, refused the connection or dropped it.
    fn http_error(&self, e: &reqwest::Error, what: &str) -> anyhow::Error {
        let mut message = crate::host::http::error_chain(e);
        if e.is_connect() && e.is_timeout() {
            message.push_str(&format!(" (connect_timeout {:?})", self.timeouts.connect));
        } else if e.is_timeout() {
            message.push_str(&format!(
                " (no data for read_timeout {:?})",
                self.timeouts.read
            ));
        }
        let text = self.context(&format!("{what}: {message}"));
        if e.is_timeout() || e.is_connect() || e.is_request() || e.is_body() {
            anyhow!(Unreachable(text))
        } else {
            anyhow!(text)
        }
    }

    /// The bearer token for pulls: none until the registry has answered a
    /// request with 401 (`fresh`), then asked of `oci-client` (which
    /// negotiates it from the registry's challenge) and kept; `None` when
    /// the registry needs none or takes Basic auth.
    async fn pull_token(&self, fresh: bool, what: &str) -> Result<Option<String>> {
        if !fresh {
            return Ok(self.token.lock().ok().and_then(|g| g.clone()).flatten());
        }
        let t = self
            .oci()
            .auth(
                &self.reference("latest"),
                &self.auth,
                RegistryOperation::Pull,
            )
            .await
            .map_err(|e| match e {
                OciDistributionError::RequestError(e) => self.http_error(&e, what),
                e => anyhow!(self.context(&format!("{what}: authenticating: {e}"))),
            })?;
        if let Ok(mut g) = self.token.lock() {
            *g = Some(t.clone());
        }
        Ok(t)
    }

    /// GET `url` with the pull credentials (a 401 asks for a fresh token
    /// once); the response is not read yet.
    async fn get(&self, url: &str, accept: Option<&str>, what: &str) -> Result<reqwest::Response> {
        let mut fresh = false;
        loop {
            let token = self.pull_token(fresh, what).await?;
            let mut req = self.http.get(url);
            if let Some(a) = accept {
                req = req.header(reqwest::header::ACCEPT, a);
            }
            req = match (&token, &self.auth) {
                (Some(t), _) => req.bearer_auth(t),
                (None, RegistryAuth::Basic(u, p)) => req.basic_auth(u, Some(p)),
                _ => req,
            };
            let res = req.send().await.map_err(|e| self.http_error(&e, what))?;
            if res.status() == reqwest::StatusCode::UNAUTHORIZED && !fresh {
                fresh = true;
                continue;
            }
            return Ok(res);
        }
    }

    /// `res` when its status is a success; else an error naming the status
    /// and the start of the body (at most [`ERROR_BODY_LIMIT`] bytes read).
    async fn success(&self, res: reqwest::Response, what: &str) -> Result<reqwest::Response> {
        let status = res.status();
        if status.is_success() {
            return Ok(res);
        }
        let mut body = Vec::new();
        let _ = self.body(res, ERROR_BODY_LIMIT, &mut body, what).await;
        let body = String::from_utf8_lossy(&body);
        let body = body.trim();
        let text = self.context(&format!("{what}: HTTP {status}: {body}"));
        if status.is_server_error() {
            Err(anyhow!(Unreachable(text)))
        } else {
            Err(anyhow!(text))
        }
    }

    /// `GET /v2/<name>/blobs/<digest>` into the new file `dest`, read up to
    /// `size` bytes, hashed as it arrives and checked against `digest`
    /// (`dest` removed on any error). No fsync (see `pull_pin`: an entry a
    /// power loss damaged fails its checks and is fetched again).
    async fn fetch_blob(&self, digest: &str, size: u64, dest: &Path) -> Result<()> {
        let what = format!("downloading blob {digest} ({size} bytes declared)");
        let url = self.v2_url(&format!("blobs/{digest}"));
        let result = async {
            let res = self.get(&url, None, &what).await?;
            let res = self.success(res, &what).await?;
            if let Some(n) = res.content_length()
                && n > size
            {
                bail!(
                    "{}",
                    self.context(&format!(
                        "{what}: the response declares {n} bytes, the manifest {size}"
                    ))
                );
            }
            let got = self.body_to_file(res, size, dest, &what).await?;
            if got.digest != digest || got.len != size {
                bail!(
                    "{}",
                    self.context(&format!(
                        "blob {digest} does not match its digest (got {}, {} bytes; expected {size})",
                        got.digest, got.len
                    ))
                );
            }
            Ok(())
        }
        .await;
        if result.is_err() {
            let _ = fs_err::remove_file(dest);
        }
        result
    }

    /// `GET /v2/<name>/manifests/<tag>`: `None` on 404; at most
    /// [`MANIFEST_LIMIT`] bytes read, checked against the digest the
    /// registry gives (`Docker-Content-Digest`).
    async fn fetch_manifest(&self, tag: &str) -> Result<Option<Fetched>> {
        let what = format!("reading the manifest of {tag}");
        let url = self.v2_url(&format!("manifests/{tag}"));
        let res = self.get(&url, Some(MANIFEST_MEDIA_TYPE), &what).await?;
        if res.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let res = self.success(res, &what).await?;
        let header = res
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut bytes = Vec::new();
        self.body(res, MANIFEST_LIMIT, &mut bytes, &what)
            .await
            // The limit is named when it is what failed (not a timeout).
            .map_err(|e| {
                if is_unreachable(&e) {
                    e
                } else {
                    e.context("a manifest may hold at most 4 MiB")
                }
            })?;
        let digest = digest_of(&bytes);
        if let Some(h) = header
            && h != digest
        {
            bail!(
                "{}",
                self.context(&format!(
                    "manifest of {tag} does not match its digest {h} (got {digest})"
                ))
            );
        }
        Ok(Some(Fetched { bytes, digest }))
    }

    /// Copies the body of `res` into `out` and hashes it, at most `limit`
    /// bytes (see [`Registry::chunks`]).
    async fn body(
        &self,
        res: reqwest::Response,
        limit: u64,
        out: &mut impl Write,
        what: &str,
    ) -> Result<super::bounds::Copied> {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        let len = self
            .chunks(res, limit, what, |chunk| {
                out.write_all(&chunk)?;
                hash.update(&chunk);
                Ok(())
            })
            .await?;
        Ok(super::bounds::Copied {
            len,
            digest: format!("sha256:{}", hex::encode(hash.finalize())),
        })
    }

    /// [`Registry::body`] into the new file `dest`, written and hashed by a
    /// thread of its own: the runtime's one thread only receives, so eight
    /// downloads at once hash and write on another CPU (a pull's sha256 alone
    /// is a third of its CPU time).
    ///
    /// Errors: as [`Registry::body`]; `dest` cannot be created or written.
    async fn body_to_file(
        &self,
        res: reqwest::Response,
        limit: u64,
        dest: &Path,
        what: &str,
    ) -> Result<super::bounds::Copied> {
        // A few chunks in flight: a writer that falls behind holds the
        // reader back instead of the chunks piling up in memory.
        let (tx, rx) = std::sync::mpsc::sync_channel::<bytes::Bytes>(16);
        let file = fs_err::File::create(dest)?;
        let writer = std::thread::spawn(move || -> Result<super::bounds::Copied> {
            use sha2::{Digest, Sha256};
            let mut hash = Sha256::new();
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            let mut len = 0u64;
            for chunk in rx {
                out.write_all(&chunk)?;
                hash.update(&chunk);
                len += chunk.len() as u64;
            }
            out.flush()?;
            Ok(super::bounds::Copied {
                len,
                digest: format!("sha256:{}", hex::encode(hash.finalize())),
            })
        });
        let read = self
            .chunks(res, limit, what, |chunk| {
                // Fails only when the writer stopped: its error is the one to give.
                tx.send(chunk)
                    .map_err(|_| anyhow!("the writer of {} stopped", dest.display()))
            })
            .await;
        drop(tx);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(anyhow!("the writer of {} panicked", dest.display())));
        match (read, written) {
            (Err(e), Ok(_)) => Err(e),
            // The writer's error (a read that failed because it stopped).
            (_, written) => written,
        }
    }

    /// Reads the body of `res` chunk by chunk into `take`, at most `limit`
    /// bytes (one more and it fails), each read waiting at most the
    /// idle-read timeout and all of them averaging at least
    /// [`super::bounds::MIN_BYTES_PER_SECOND`]; returns how many bytes `take` got.
    ///
    /// Errors: [`Unreachable`] on a timeout, a dropped connection or a
    /// server slower than the minimum; the body is longer than `limit`;
    /// `take` fails.
    async fn chunks(
        &self,
        mut res: reqwest::Response,
        limit: u64,
        what: &str,
        mut take: impl FnMut(bytes::Bytes) -> Result<()>,
    ) -> Result<u64> {
        let mut len = 0u64;
        let mut pace = super::bounds::Pace::new(self.timeouts.read, std::time::Instant::now());
        loop {
            let chunk = tokio::time::timeout(self.timeouts.read, res.chunk())
                .await
                .map_err(|_| {
                    anyhow!(Unreachable(self.context(&format!(
                        "{what}: no data for read_timeout {:?}",
                        self.timeouts.read
                    ))))
                })?
                .map_err(|e| self.http_error(&e, what))?;
            let Some(chunk) = chunk else { break };
            if let Err(got) = pace.add(chunk.len() as u64, std::time::Instant::now()) {
                return Err(anyhow!(Unreachable(self.context(&format!(
                    "{what}: slower than {} KiB/s ({got} bytes in read_timeout {:?})",
                    super::bounds::MIN_BYTES_PER_SECOND >> 10,
                    self.timeouts.read
                )))));
            }
            let room = limit - len;
            let keep = usize::try_from(room).map_or(chunk.len(), |r| chunk.len().min(r));
            let over = keep < chunk.len();
            take(chunk.slice(..keep))?;
            len += keep as u64;
            if over {
                bail!(
                    "{}",
                    self.context(&format!("{what}: it sends more than {limit} bytes"))
                );
            }
        }
        Ok(len)
    }
}

/// How many blob GETs [`Transport::get_blobs`] keeps in flight.
const PARALLEL_GETS: usize = 8;

impl Transport for Registry {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn manifest(&self, tag: &str) -> Result<Option<Fetched>> {
        self.runtime.block_on(self.fetch_manifest(tag))
    }

    fn manifests(&self, tags: &[String]) -> Vec<Result<Option<Fetched>>> {
        use futures_util::StreamExt;
        self.runtime.block_on(
            futures_util::stream::iter(tags.iter().map(|t| self.fetch_manifest(t)))
                .buffered(PARALLEL_GETS)
                .collect::<Vec<_>>(),
        )
    }

    fn has_blob(&self, digest: &str) -> Result<bool> {
        let r = self.reference("latest");
        self.runtime
            .block_on(async {
                self.oci()
                    .store_auth_if_needed(r.resolve_registry(), &self.auth)
                    .await;
                self.oci().blob_exists(&r, digest).await
            })
            .map_err(|e| anyhow!(e))
            .with_context(|| self.context(&format!("asking for blob {digest}")))
    }

    fn get_blob(&self, digest: &str, size: u64, dest: &Path) -> Result<()> {
        self.runtime.block_on(self.fetch_blob(digest, size, dest))
    }

    fn get_blobs(&self, blobs: &[super::BlobGet]) -> Vec<Result<()>> {
        use futures_util::StreamExt;
        self.runtime.block_on(
            futures_util::stream::iter(
                blobs
                    .iter()
                    .map(|b| self.fetch_blob(&b.digest, b.size, &b.dest)),
            )
            .buffered(PARALLEL_GETS)
            .collect::<Vec<_>>(),
        )
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
                self.oci()
                    .store_auth_if_needed(r.resolve_registry(), &self.auth)
                    .await;
                self.oci()
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
                self.oci()
                    .store_auth_if_needed(r.resolve_registry(), &self.auth)
                    .await;
                self.oci()
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

    /// Every tag, by this module's bounded GET of `tags/list` (the
    /// distribution spec's "Listing tags", pages of 1000 by `n` and `last`):
    /// a page is at most [`TAG_PAGE_LIMIT`] bytes and all pages together at
    /// most [`TAG_LIST_LIMIT`]; a repository the registry does not know has
    /// no tags.
    fn tags(&self) -> Result<Vec<String>> {
        /// A page of the answer (`tags` is `null` in some registries).
        #[derive(serde::Deserialize)]
        struct Page {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        const PAGE: usize = 1000;
        let what = "listing tags";
        let mut out: Vec<String> = Vec::new();
        let mut last: Option<String> = None;
        let mut read = 0u64;
        let mut pages = 0usize;
        loop {
            let mut url = reqwest::Url::parse(&self.v2_url("tags/list"))
                .with_context(|| self.context(what))?;
            url.query_pairs_mut().append_pair("n", &PAGE.to_string());
            if let Some(l) = &last {
                url.query_pairs_mut().append_pair("last", l);
            }
            let (limit, bound) = tag_list_bound(read, pages);
            pages += 1;
            let (bytes, next) = self
                .runtime
                .block_on(async {
                    let res = self.get(url.as_str(), None, what).await?;
                    if res.status() == reqwest::StatusCode::NOT_FOUND {
                        return Ok::<_, anyhow::Error>(None);
                    }
                    let res = self.success(res, what).await?;
                    let next = res
                        .headers()
                        .get(reqwest::header::LINK)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|l| l.contains("rel=\"next\""));
                    let mut bytes = Vec::new();
                    self.body(res, limit, &mut bytes, what).await.map_err(|e| {
                        if is_unreachable(&e) {
                            e
                        } else {
                            e.context(bound.clone())
                        }
                    })?;
                    Ok(Some((bytes, next)))
                })?
                .unwrap_or_default();
            read += bytes.len() as u64;
            if bytes.is_empty() {
                break;
            }
            let page: Page = serde_json::from_slice(&bytes)
                .with_context(|| self.context("the tag list is not the spec's JSON"))?;
            let tags = page.tags.unwrap_or_default();
            let n = tags.len();
            let end = tags.last().cloned();
            out.extend(tags);
            // A page ending on `last` again ends the listing (a
            // registry repeating itself is not followed forever).
            if (n < PAGE && !next) || end.is_none() || end == last {
                break;
            }
            last = end;
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn delete_manifest(&self, digest: &str) -> Result<()> {
        let target = super::delete::Target {
            host: &self.host,
            repo: &self.repo,
            plain_http: self.plain_http,
            auth: &self.auth,
            url: &self.url,
            timeouts: self.timeouts,
        };
        self.runtime
            .block_on(super::delete::delete_manifest(&target, digest))
    }
}

/// How much of page `pages + 1` of a tag list may be read when `read`
/// bytes came in the pages before it, and the bound that limit is, in
/// words, for the error when it is hit: [`TAG_PAGE_LIMIT`] a page, or what
/// is left of [`TAG_LIST_LIMIT`] in all (then naming the pages and bytes
/// read), whichever is smaller.
fn tag_list_bound(read: u64, pages: usize) -> (u64, String) {
    let left = TAG_LIST_LIMIT.saturating_sub(read);
    if left < TAG_PAGE_LIMIT {
        (
            left,
            format!(
                "the tag list hit its bound of {TAG_LIST_LIMIT} bytes in all ({read} bytes in the {pages} page(s) before this one)"
            ),
        )
    } else {
        (
            TAG_PAGE_LIMIT,
            format!("a page of the tag list hit its bound of {TAG_PAGE_LIMIT} bytes a page"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_list_error_names_the_bound_it_hit() {
        let (limit, why) = tag_list_bound(0, 0);
        assert_eq!(limit, TAG_PAGE_LIMIT);
        assert!(
            why.contains(&format!("bound of {TAG_PAGE_LIMIT} bytes a page")),
            "{why}"
        );
        // Endless pages under the page bound: the bound in all is hit.
        let read = TAG_LIST_LIMIT - 1000;
        let (limit, why) = tag_list_bound(read, 7);
        assert_eq!(limit, 1000);
        assert!(
            why.contains(&format!(
                "bound of {TAG_LIST_LIMIT} bytes in all ({read} bytes in the 7 page(s)"
            )),
            "{why}"
        );
        assert!(!why.contains("1000 bytes"), "{why}");
    }
}
