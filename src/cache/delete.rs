//! `DELETE /v2/<name>/manifests/<digest>` (OCI distribution spec,
//! "Deleting manifests"), which `oci-client` does not offer: one request,
//! answered 202; on a 401 the registry's `WWW-Authenticate` challenge is
//! met once, `Basic` with the Docker/Podman credentials, or `Bearer` with a
//! token asked of its realm for scope `repository:<name>:delete`
//! (distribution's token spec), then the request is sent again.
//!
//! Every request has the cache's connect and idle-read timeouts
//! ([`super::bounds::Timeouts`]) and a whole-request timeout, and every
//! body read is bounded.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use oci_client::secrets::RegistryAuth;

/// The most bytes of an error or token body read.
const BODY_LIMIT: usize = 64 * 1024;

/// Where to delete: a registry's repository.
pub struct Target<'a> {
    /// `host[:port]`.
    pub host: &'a str,
    /// The repository (`team/oracles`).
    pub repo: &'a str,
    /// `oci+http://`: plain HTTP.
    pub plain_http: bool,
    /// The credentials (`registry::credentials`).
    pub auth: &'a RegistryAuth,
    /// The cache's URL, for messages.
    pub url: &'a str,
    /// The cache's connect and idle-read timeouts.
    pub timeouts: super::bounds::Timeouts,
}

/// The longest a `DELETE` (or the token request before it) may take in
/// all: both answers are a few bytes.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Deletes manifest `digest` of `target` (a 404 counts as deleted: the
/// manifest is gone either way).
///
/// Errors: the registry refuses (405: deletes are not enabled; the message
/// says how to enable them in distribution), or cannot be reached.
pub async fn delete_manifest(target: &Target<'_>, digest: &str) -> Result<()> {
    super::digest_hex(digest)?;
    let scheme = if target.plain_http { "http" } else { "https" };
    let url = format!(
        "{scheme}://{}/v2/{}/manifests/{digest}",
        target.host, target.repo
    );
    let client = crate::host::http::client_builder()
        .connect_timeout(target.timeouts.connect)
        .read_timeout(target.timeouts.read)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("making the HTTP client")?;
    let ctx = || format!("cache {}: DELETE {url}", target.url);
    let mut resp = client.delete(&url).send().await.with_context(ctx)?;
    if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
        let challenge = resp
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let header = authorization(&client, target, &challenge)
            .await
            .with_context(ctx)?;
        resp = client
            .delete(&url)
            .header(reqwest::header::AUTHORIZATION, header)
            .send()
            .await
            .with_context(ctx)?;
    }
    let status = resp.status();
    if status.is_success() || status == reqwest::StatusCode::NOT_FOUND {
        return Ok(());
    }
    let body = bounded_text(resp).await;
    if status == reqwest::StatusCode::METHOD_NOT_ALLOWED {
        bail!(
            "{}: the registry does not allow deletes (405 {body}); enable them (distribution: `storage: delete: enabled: true`) or delete with the registry's own tools",
            ctx()
        );
    }
    bail!("{}: {status} {body}", ctx())
}

/// The first [`BODY_LIMIT`] bytes of a response body, as text.
async fn bounded_text(mut resp: reqwest::Response) -> String {
    let mut out = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        out.extend_from_slice(&chunk);
        if out.len() >= BODY_LIMIT {
            out.truncate(BODY_LIMIT);
            break;
        }
    }
    String::from_utf8_lossy(&out).trim().to_string()
}

/// The `Authorization` value that meets `challenge` (`Basic realm=...` or
/// `Bearer realm="...",service="...",scope="..."`).
async fn authorization(
    client: &reqwest::Client,
    target: &Target<'_>,
    challenge: &str,
) -> Result<String> {
    use base64::Engine;
    let basic = match target.auth {
        RegistryAuth::Basic(u, p) => Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
        )),
        _ => None,
    };
    let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return basic.ok_or_else(|| {
            anyhow!("the registry asks for credentials and none are configured (docker login)")
        });
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        bail!("the registry's challenge {challenge:?} is neither Basic nor Bearer");
    }
    if let RegistryAuth::Bearer(t) = target.auth {
        return Ok(format!("Bearer {t}"));
    }
    let param = |name: &str| -> Option<String> {
        params.split(',').find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            k.eq_ignore_ascii_case(name)
                .then(|| v.trim_matches('"').to_string())
        })
    };
    let realm = param("realm").ok_or_else(|| anyhow!("the Bearer challenge has no realm"))?;
    let mut req = client
        .get(&realm)
        .query(&[("scope", format!("repository:{}:delete", target.repo))]);
    if let Some(service) = param("service") {
        req = req.query(&[("service", service)]);
    }
    if let Some(b) = &basic {
        req = req.header(reqwest::header::AUTHORIZATION, b);
    }
    let resp = req.send().await.context("asking for a token")?;
    let status = resp.status();
    let body = bounded_text(resp).await;
    if !status.is_success() {
        bail!("the token realm {realm} answered {status} {body}");
    }
    let v: serde_json::Value = serde_json::from_str(&body)
        .with_context(|| format!("the token from {realm} is not JSON"))?;
    let token = v["token"]
        .as_str()
        .or_else(|| v["access_token"].as_str())
        .ok_or_else(|| anyhow!("the answer of {realm} holds no token"))?;
    Ok(format!("Bearer {token}"))
}
