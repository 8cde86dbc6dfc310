//! The wheel's build as provenance others can check: an in-toto Statement
//! v1 (<https://in-toto.io/Statement/v1>, in-toto attestation framework
//! `spec/v1/statement.md`) whose predicate is SLSA Provenance v1
//! (<https://slsa.dev/provenance/v1>, `buildDefinition` + `runDetails`),
//! signed with the builder's SSH key as wheel statements are
//! ([`super::trust`]: SSHSIG, namespace [`trust::NAMESPACE`], over the
//! statement's RFC 8785 canonical bytes), and kept in a cache as its own
//! append-only artifact (docs/cache.md, docs/sbom.md).
//!
//! ```text
//! subject                      [{name: <wheel file>, digest: {sha256: <wheel sha256>}}]
//! buildDefinition.buildType    urn:oracle-build:wheel-build:v1
//!   externalParameters         the wheel key inputs the recipe sets (commit, package, mode,
//!                              target_device, cuda_arch_list, env, pins, indexes)
//!   internalParameters         the other wheel key inputs (toolchain, build requirements,
//!                              ext, build lock, schema, ...): both together hash to the key
//!   resolvedDependencies       source (git+<repo>@<commit>, gitCommit), pylock.build.toml
//!                              (sha256), each staged external source (gitCommit, sha256 of
//!                              the staged tree)
//! runDetails.builder.id        urn:oracle-build:builder:<principal>
//!   metadata                   invocationId (wheel key), startedOn, finishedOn (build.json)
//! ```
//!
//! The artifact: tag `provenance-<wheel key>-<16 hex of the statement's
//! sha256>` (content-addressed: a new statement is a new tag, none is ever
//! rewritten), `artifactType` [`ARTIFACT_TYPE`], a small JSON config, and
//! two layers: [`STATEMENT_FILE`] (the canonical statement) and
//! [`SIGNATURE_FILE`] (the armored SSHSIG), so a third party checks one with
//! `ssh-keygen -Y verify -n oracle-build -f allowed_signers -I <principal>
//! -s provenance.intoto.json.sig < provenance.intoto.json`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use ssh_key::{HashAlg, SshSig};

use super::Transport;
use super::trust::{self, Policy, Signer, SigningKey};
use crate::stages::ext;
use crate::stages::wheel::BuildRecord;
use crate::store::Store;
use crate::store::key::content_key;

/// The in-toto Statement type.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The SLSA Provenance predicate type.
pub const PREDICATE_TYPE: &str = "https://slsa.dev/provenance/v1";
/// The build type of a wheel built by oracle-build (defined in docs/sbom.md).
pub const BUILD_TYPE: &str = "urn:oracle-build:wheel-build:v1";
/// The prefix of a builder id: `urn:oracle-build:builder:<principal>`.
pub const BUILDER_PREFIX: &str = "urn:oracle-build:builder:";
/// The manifest's `artifactType`.
pub const ARTIFACT_TYPE: &str = "application/vnd.oracle-build.provenance.v1";
/// The config blob's media type.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oracle-build.provenance.config.v1+json";
/// The statement layer's name.
pub const STATEMENT_FILE: &str = "provenance.intoto.json";
/// The signature layer's name.
pub const SIGNATURE_FILE: &str = "provenance.intoto.json.sig";
/// The tag prefix of provenance artifacts.
pub const TAG_PREFIX: &str = "provenance-";
/// The most bytes a statement, signature or config may have when read from a cache.
pub const MAX_BYTES: u64 = 4 << 20;

/// The wheel key inputs a recipe sets: `externalParameters`; the others are
/// `internalParameters`.
pub const EXTERNAL: &[&str] = &[
    "commit",
    "package",
    "mode",
    "target_device",
    "cuda_arch_list",
    "env",
    "pins",
    "indexes",
];

/// A statement and its signature, as kept in a cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The statement's canonical JSON text, exactly as signed.
    pub statement: String,
    /// The armored SSHSIG signature.
    pub signature: String,
}

/// The statement (in-toto v1 with an SLSA v1 predicate) of the wheel whose
/// record is `build`, made from the pinned repository `repo`, by `builder`
/// (a principal of `allowed_signers`); the staged sources' tree digests are
/// read from `store` (see the module docs).
///
/// Errors: the record's `inputs.ext` does not parse; a staged source named
/// there is missing from `store` or damaged; `build.started` is not RFC 3339.
pub fn describe(store: &Store, build: &BuildRecord, repo: &str, builder: &str) -> Result<Value> {
    let started: jiff::Timestamp = build
        .started
        .parse()
        .with_context(|| format!("build.json started {:?} is not RFC 3339", build.started))?;
    let finished = started
        .checked_add(jiff::SignedDuration::from_millis(
            (build.duration_s.max(0.0) * 1000.0) as i64,
        ))
        .unwrap_or(started);
    let mut v = expected(store, build, repo)?;
    v["predicate"]["runDetails"] = json!({
        "builder": {
            "id": format!("{BUILDER_PREFIX}{builder}"),
            "version": {"oracle-build": env!("CARGO_PKG_VERSION")},
        },
        "metadata": {
            "invocationId": build.key,
            "startedOn": started.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            "finishedOn": finished.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        },
    });
    Ok(v)
}

/// What a statement about the wheel `build` must say as far as `store`
/// knows: everything [`describe`] writes except `runDetails` (the signer's
/// own: who and when).
///
/// Errors: as [`describe`].
pub fn expected(store: &Store, build: &BuildRecord, repo: &str) -> Result<Value> {
    let mut v = expected_parameters(build)?;
    let mut deps = dependencies(store, build, repo)?;
    // Where a box fetched the pinned commit from is not part of the wheel's
    // key (two honest boxes may name the repository differently); its
    // commit is, and is compared.
    for d in &mut deps {
        if d["name"] == "source"
            && let Some(o) = d.as_object_mut()
        {
            o.remove("uri");
        }
    }
    v["predicate"]["buildDefinition"]["resolvedDependencies"] = Value::Array(deps);
    Ok(v)
}

/// What any statement about the wheel `build` must say, known from its
/// `build.json` alone: the types, the subject, the build type and the
/// parameters (what `cache verify` checks, with no store at hand).
///
/// Errors: the record's inputs are not an object.
pub fn expected_parameters(build: &BuildRecord) -> Result<Value> {
    let inputs = build
        .inputs
        .as_object()
        .ok_or_else(|| anyhow!("build.json of {}: inputs is not an object", build.key))?;
    let (mut external, mut internal) = (serde_json::Map::new(), serde_json::Map::new());
    for (k, v) in inputs {
        if EXTERNAL.contains(&k.as_str()) {
            external.insert(k.clone(), v.clone());
        } else {
            internal.insert(k.clone(), v.clone());
        }
    }
    Ok(json!({
        "_type": STATEMENT_TYPE,
        "subject": [{"name": build.wheel, "digest": {"sha256": build.sha256}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": external,
                "internalParameters": internal,
            },
        },
    }))
}

/// The resolved dependencies of the wheel `build` (see the module docs),
/// the staged sources' tree digests read from `store`.
fn dependencies(store: &Store, build: &BuildRecord, repo: &str) -> Result<Vec<Value>> {
    let inputs = build
        .inputs
        .as_object()
        .ok_or_else(|| anyhow!("build.json of {}: inputs is not an object", build.key))?;
    let commit = inputs
        .get("commit")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut deps = vec![json!({
        "name": "source",
        "uri": format!("git+{repo}@{commit}"),
        "digest": {"gitCommit": commit},
    })];
    if let Some(sha) = inputs.get("build_lock").and_then(Value::as_str) {
        deps.push(json!({
            "name": crate::stages::lock::BUILD_LOCK,
            "digest": {"sha256": sha},
            "annotations": {"set": "build"},
        }));
    }
    for k in ext::keyed_sources(inputs.get("ext"))? {
        let entry = k.entry(store);
        if !entry.exists() {
            bail!(
                "the staged source {} ({}) of wheel {} is not in {}",
                k.name,
                ext::describe(&k.origin),
                build.key,
                store.root().display()
            );
        }
        let tree = ext::tree_digest(&entry.path)?;
        let (uri, mut digest) = match &k.origin {
            ext::Origin::Git { repo, tag } => (
                format!("git+{repo}@{tag}"),
                k.commit
                    .iter()
                    .map(|c| ("gitCommit".to_string(), json!(c)))
                    .collect::<serde_json::Map<_, _>>(),
            ),
            ext::Origin::Url { url, .. } => (url.clone(), serde_json::Map::new()),
        };
        digest.insert("sha256".into(), json!(tree));
        deps.push(json!({
            "name": format!("ext:{}", k.name),
            "uri": uri,
            "digest": digest,
            "annotations": {"variable": k.variable.name(), "entry": entry.label(), "tree": "sha256 of the staged tree (docs/sbom.md)"},
        }));
    }
    Ok(deps)
}

/// Signs `statement` with `key`: SSHSIG over its canonical bytes.
///
/// Errors: the statement holds a float; signing fails.
pub fn sign(statement: &Value, key: &SigningKey) -> Result<Signed> {
    let bytes = trust::canonical_bytes(statement)?;
    let signature = key.sign_bytes(&bytes)?;
    Ok(Signed {
        statement: String::from_utf8(bytes).context("the canonical statement is not UTF-8")?,
        signature,
    })
}

/// The tag of the provenance `statement` (canonical text) of wheel `key`.
pub fn tag(key: &str, statement: &str) -> String {
    let h = crate::cache::digest_of(statement.as_bytes());
    format!("{TAG_PREFIX}{key}-{}", &h["sha256:".len()..][..16])
}

/// The wheel key a provenance tag is for, if `tag` is one.
pub fn key_of_tag(tag: &str) -> Option<&str> {
    let rest = tag.strip_prefix(TAG_PREFIX)?;
    let (key, h) = rest.rsplit_once('-')?;
    (h.len() == 16 && !key.is_empty()).then_some(key)
}

/// Whether `tag` is a wheel artifact's tag for `key`: `wheel-<key>`, or
/// `wheel-<key>-<qualifiers>` (a layout that keeps several per key).
pub fn is_wheel_tag_of(tag: &str, key: &str) -> bool {
    tag.strip_prefix("wheel-")
        .and_then(|r| r.strip_prefix(key))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
}

/// Pushes `signed` (the provenance of wheel `key`) to `t`: both layers and
/// the config first, the manifest last; a tag already there is kept (it
/// names the same bytes). Returns the tag and whether it was pushed now.
///
/// Errors: the cache fails.
pub fn push(
    t: &dyn Transport,
    key: &str,
    signed: &Signed,
    scratch: &Path,
) -> Result<(String, bool)> {
    let tag = tag(key, &signed.statement);
    if t.manifest(&tag)?.is_some() {
        return Ok((tag, false));
    }
    let builder = serde_json::from_str::<Value>(&signed.statement)
        .ok()
        .and_then(|v| {
            v["predicate"]["runDetails"]["builder"]["id"]
                .as_str()
                .map(str::to_string)
        })
        .unwrap_or_default();
    let config = serde_json::to_vec_pretty(&json!({
        "format": 1, "kind": "provenance", "wheel_key": key, "builder": builder,
    }))?;
    fs_err::create_dir_all(scratch)?;
    let mut layers = Vec::new();
    for (name, bytes, media) in [
        (
            STATEMENT_FILE,
            signed.statement.as_bytes(),
            "application/vnd.in-toto+json",
        ),
        (
            SIGNATURE_FILE,
            signed.signature.as_bytes(),
            "application/vnd.oracle-build.sshsig.v1",
        ),
    ] {
        let p = scratch.join(name);
        fs_err::write(&p, bytes)?;
        let digest = crate::cache::digest_of(bytes);
        t.put_blob(&p, &digest, bytes.len() as u64)?;
        layers.push(OciDescriptor {
            media_type: media.to_string(),
            digest,
            size: bytes.len() as i64,
            urls: None,
            artifact_type: None,
            annotations: Some([(super::artifact::TITLE.to_string(), name.to_string())].into()),
        });
    }
    let cfg = scratch.join("provenance.config.json");
    fs_err::write(&cfg, &config)?;
    let config_digest = crate::cache::digest_of(&config);
    t.put_blob(&cfg, &config_digest, config.len() as u64)?;
    let m = OciImageManifest {
        schema_version: 2,
        media_type: Some(super::registry::MANIFEST_MEDIA_TYPE.to_string()),
        config: OciDescriptor {
            media_type: CONFIG_MEDIA_TYPE.to_string(),
            digest: config_digest,
            size: config.len() as i64,
            urls: None,
            artifact_type: None,
            annotations: None,
        },
        layers,
        subject: None,
        artifact_type: Some(ARTIFACT_TYPE.to_string()),
        annotations: Some(
            [
                (
                    "dev.oracle-build.kind".to_string(),
                    "provenance".to_string(),
                ),
                ("dev.oracle-build.name".to_string(), key.to_string()),
            ]
            .into(),
        ),
    };
    t.put_manifest(&tag, &serde_json::to_vec_pretty(&m)?)?;
    Ok((tag, true))
}

/// The provenance tags of wheel `key` in `t`, sorted.
///
/// Errors: the cache's tags cannot be listed.
pub fn tags_for(t: &dyn Transport, key: &str) -> Result<Vec<String>> {
    let mut out: Vec<String> = t
        .tags()?
        .into_iter()
        .filter(|tag| key_of_tag(tag) == Some(key))
        .collect();
    out.sort();
    Ok(out)
}

/// Reads the provenance artifact `tag` of `t` (each blob checked against its
/// digest by the transport, and at most [`MAX_BYTES`]), into `scratch`.
///
/// Errors: the tag is gone; its manifest is not a provenance artifact or
/// lacks a layer; a blob is too big or fails its digest.
pub fn fetch(t: &dyn Transport, tag: &str, scratch: &Path) -> Result<Signed> {
    let got = t
        .manifest(tag)?
        .ok_or_else(|| anyhow!("{}: tag {tag} is gone", t.describe()))?;
    let m: OciImageManifest = serde_json::from_slice(&got.bytes)
        .with_context(|| format!("the manifest of {tag} is not an OCI image manifest"))?;
    if m.artifact_type.as_deref() != Some(ARTIFACT_TYPE) {
        bail!(
            "the manifest of {tag} has artifactType {}, not {ARTIFACT_TYPE}",
            super::artifact::shown_type(m.artifact_type.as_deref())
        );
    }
    fs_err::create_dir_all(scratch)?;
    let read = |name: &str| -> Result<String> {
        let l = m
            .layers
            .iter()
            .find(|l| super::artifact::layer_title(l) == Some(name))
            .ok_or_else(|| anyhow!("{tag} has no layer {name}"))?;
        let size = u64::try_from(l.size).unwrap_or(u64::MAX);
        if size > MAX_BYTES {
            bail!(
                "{tag}: layer {name} is {} bytes, more than {MAX_BYTES}",
                l.size
            );
        }
        super::digest_hex(&l.digest)?;
        let p = scratch.join(name);
        let _ = std::fs::remove_file(&p);
        t.get_blob(&l.digest, size, &p)?;
        String::from_utf8(fs_err::read(&p)?).with_context(|| format!("{tag}: {name} is not UTF-8"))
    };
    Ok(Signed {
        statement: read(STATEMENT_FILE)?,
        signature: read(SIGNATURE_FILE)?,
    })
}

/// Reads and checks the provenance artifact `tag` of `t` as `cache verify`
/// does: against the `wheel-<key>` artifact of the same cache (its
/// `build.json`: subject, parameters; [`expected_parameters`]) and
/// `policy`, into `scratch`. A problem reading it is a problem of the
/// result, not an error.
///
/// Errors: none (the cache failing is a problem of the result).
pub fn inspect(t: &dyn Transport, tag: &str, policy: &Policy, scratch: &Path) -> Checked {
    let key = key_of_tag(tag).unwrap_or_default().to_string();
    let failed = |why: String| Checked {
        tag: tag.to_string(),
        signer: None,
        untrusted: vec!["not checked".into()],
        diffs: Vec::new(),
        problems: vec![why],
    };
    let signed = match fetch(t, tag, &scratch.join("p")) {
        Ok(s) => s,
        Err(e) => return failed(format!("{e:#}")),
    };
    // The wheel artifacts of the key (`wheel-<key>`, or `wheel-<key>-...`
    // in a layout where one key may have several): the one whose sha256 is
    // the statement's subject, else the first (its subject then differs).
    let subject = serde_json::from_str::<Value>(&signed.statement)
        .ok()
        .and_then(|v| {
            v["subject"][0]["digest"]["sha256"]
                .as_str()
                .map(str::to_string)
        });
    let read_build = |wheel_tag: &str, i: usize| -> Result<BuildRecord> {
        let m = t
            .manifest(wheel_tag)?
            .ok_or_else(|| anyhow!("tag {wheel_tag} is gone"))?;
        let m = super::artifact::parse_manifest(&m.bytes, super::artifact::Kind::Wheel, wheel_tag)?;
        let size = u64::try_from(m.config.size).unwrap_or(u64::MAX);
        if size > MAX_BYTES {
            bail!("the config of {wheel_tag} is {size} bytes, more than {MAX_BYTES}");
        }
        let p = scratch.join(format!("wheel-config-{i}.json"));
        fs_err::create_dir_all(scratch)?;
        let _ = std::fs::remove_file(&p);
        t.get_blob(&m.config.digest, size, &p)?;
        let c: super::artifact::Config = crate::store::read_json(&p)?;
        Ok(serde_json::from_value(c.record)?)
    };
    let wheel_tags: Vec<String> = match t.tags() {
        Ok(tags) => tags
            .into_iter()
            .filter(|w| is_wheel_tag_of(w, &key))
            .collect(),
        Err(e) => return failed(format!("{e:#}")),
    };
    let mut builds = Vec::new();
    for (i, w) in wheel_tags.iter().enumerate() {
        match read_build(w, i) {
            Ok(b) => builds.push(b),
            Err(e) => return failed(format!("{w}: {e:#}")),
        }
    }
    let Some(build) = builds
        .iter()
        .find(|b| Some(&b.sha256) == subject.as_ref())
        .or(builds.first())
        .cloned()
    else {
        return failed(format!(
            "the cache has no wheel-{key} artifact for it to describe"
        ));
    };
    let expected = match expected_parameters(&build) {
        Ok(v) => v,
        Err(e) => return failed(format!("{e:#}")),
    };
    check(
        tag,
        &key,
        &signed,
        &expected,
        policy,
        jiff::Timestamp::now().as_second(),
    )
}

/// One field of a statement that differs from what the checker knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldDiff {
    /// The field's path in the statement, e.g.
    /// `predicate.buildDefinition.resolvedDependencies[ext:cutlass].digest.sha256`.
    pub field: String,
    /// What it should say.
    pub expected: String,
    /// What the statement says.
    pub found: String,
}

/// The verdict on one provenance artifact.
#[derive(Debug, Clone, Serialize)]
pub struct Checked {
    /// Its tag.
    pub tag: String,
    /// The trusted signer, when the signature verifies with a trusted key
    /// whose principals admit the statement's builder.
    pub signer: Option<Signer>,
    /// Why the signature is not trusted (empty when `signer` is set).
    pub untrusted: Vec<String>,
    /// The fields that differ from what the checker knows.
    pub diffs: Vec<FieldDiff>,
    /// Problems with the statement itself (not canonical, wrong types, the
    /// parameters not hashing to the key).
    pub problems: Vec<String>,
}

impl Checked {
    /// Whether the statement is trusted, canonical, and agrees everywhere.
    pub fn is_sound(&self) -> bool {
        self.signer.is_some() && self.diffs.is_empty() && self.problems.is_empty()
    }

    /// One line: the verdict and what failed.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match &self.signer {
            Some(s) => parts.push(format!("signed by {} ({})", s.builder, s.fingerprint)),
            None => parts.push(format!("untrusted: {}", self.untrusted.join("; "))),
        }
        parts.extend(self.problems.iter().cloned());
        parts.extend(self.diffs.iter().map(|d| {
            format!(
                "field {} says {}, expected {}",
                d.field, d.found, d.expected
            )
        }));
        parts.join("; ")
    }
}

/// Checks the provenance `signed` (of wheel `key`, read from tag `tag`):
/// the statement is canonical and of the in-toto / SLSA types; its
/// parameters hash to `key`; every field `expected` holds (see [`expected`];
/// `runDetails` is never compared) agrees; the signature verifies with a
/// key of `policy`'s `allowed_signers` whose line admits the builder
/// principal (as wheel statements, [`trust::verify`]), at `now` (seconds).
pub fn check(
    tag: &str,
    key: &str,
    signed: &Signed,
    expected: &Value,
    policy: &Policy,
    now: i64,
) -> Checked {
    let mut out = Checked {
        tag: tag.to_string(),
        signer: None,
        untrusted: Vec::new(),
        diffs: Vec::new(),
        problems: Vec::new(),
    };
    let statement: Value = match serde_json::from_str(&signed.statement) {
        Ok(v) => v,
        Err(e) => {
            out.problems.push(format!("the statement is not JSON: {e}"));
            out.untrusted.push("no statement to check".into());
            return out;
        }
    };
    match trust::canonical_bytes(&statement) {
        Ok(b) if b == signed.statement.as_bytes() => {}
        _ => out.problems.push(
            "the statement is not in canonical form (RFC 8785), so it is not what was signed"
                .into(),
        ),
    }
    let params = |field: &str| {
        statement["predicate"]["buildDefinition"][field]
            .as_object()
            .cloned()
            .unwrap_or_default()
    };
    let mut inputs = params("internalParameters");
    inputs.extend(params("externalParameters"));
    let computed = content_key(&Value::Object(inputs));
    if computed != key {
        out.problems.push(format!(
            "predicate.buildDefinition: externalParameters and internalParameters hash to key {computed}, not {key}"
        ));
    }
    diff("", expected, &statement, &mut out.diffs);
    let builder = statement["predicate"]["runDetails"]["builder"]["id"]
        .as_str()
        .unwrap_or_default();
    match builder.strip_prefix(BUILDER_PREFIX) {
        None => out.untrusted.push(format!(
            "predicate.runDetails.builder.id {builder:?} is not {BUILDER_PREFIX}<principal>"
        )),
        Some(principal) => match verify_signature(signed, principal, policy, now) {
            Ok(s) => out.signer = Some(s),
            Err(why) => out.untrusted.push(why),
        },
    }
    out
}

/// Appends to `out` every leaf of `want` that `got` differs on, by path.
/// Arrays of objects with a `name` are matched by name (`[name]`), other
/// arrays by position.
fn diff(path: &str, want: &Value, got: &Value, out: &mut Vec<FieldDiff>) {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                diff(&join(k), wv, g.get(k).unwrap_or(&Value::Null), out);
            }
        }
        (Value::Array(w), Value::Array(g))
            if w.iter()
                .all(|x| x.get("name").and_then(Value::as_str).is_some()) =>
        {
            let by_name: BTreeMap<&str, &Value> = g
                .iter()
                .filter_map(|x| Some((x.get("name")?.as_str()?, x)))
                .collect();
            for wv in w {
                let name = wv["name"].as_str().unwrap_or_default();
                let p = format!("{path}[{name}]");
                match by_name.get(name) {
                    Some(gv) => diff(&p, wv, gv, out),
                    None => out.push(FieldDiff {
                        field: p,
                        expected: "present".into(),
                        found: "absent".into(),
                    }),
                }
            }
            for gv in g {
                let name = gv.get("name").and_then(Value::as_str).unwrap_or_default();
                if !w.iter().any(|x| x["name"].as_str() == Some(name)) {
                    out.push(FieldDiff {
                        field: format!("{path}[{name}]"),
                        expected: "absent".into(),
                        found: "present".into(),
                    });
                }
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                diff(&format!("{path}[{i}]"), wv, gv, out);
            }
        }
        (w, g) if w == g => {}
        (w, g) => out.push(FieldDiff {
            field: path.to_string(),
            expected: short(w),
            found: short(g),
        }),
    }
}

/// A value for a message: compact JSON, cut at 200 characters.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 200 {
        format!("{}...", s.chars().take(200).collect::<String>())
    } else {
        s
    }
}

/// Verifies the SSHSIG `signed.signature` over `signed.statement` with the
/// keys of `policy`, for the builder `principal` (as [`trust::verify`]
/// checks one attestation: namespace, key listed, principal admitted,
/// namespaces option, validity, signature).
fn verify_signature(
    signed: &Signed,
    principal: &str,
    policy: &Policy,
    now: i64,
) -> std::result::Result<Signer, String> {
    let Some(allowed) = &policy.allowed else {
        return Err("the cache has no trusted_signers, so no signature can be trusted".into());
    };
    let sig = SshSig::from_pem(signed.signature.as_bytes())
        .map_err(|e| format!("the signature is not an armored SSHSIG ({e})"))?;
    let fingerprint = sig.public_key().fingerprint(HashAlg::Sha256).to_string();
    if sig.namespace() != trust::NAMESPACE {
        return Err(format!(
            "the signature by {fingerprint} is for namespace `{}`, not `{}`",
            sig.namespace(),
            trust::NAMESPACE
        ));
    }
    let mut refusals = Vec::new();
    for line in allowed
        .signers
        .iter()
        .filter(|s| s.key.key_data() == sig.public_key())
    {
        if let Some(why) = line.refusal(&allowed.origin, principal, now) {
            refusals.push(why);
            continue;
        }
        return match line
            .key
            .verify(trust::NAMESPACE, signed.statement.as_bytes(), &sig)
        {
            Ok(()) => Ok(Signer {
                builder: principal.to_string(),
                fingerprint,
            }),
            Err(e) => Err(format!(
                "the signature by {fingerprint} (builder `{principal}`) does not verify over the statement as stored: it was changed after signing ({e})"
            )),
        };
    }
    if refusals.is_empty() {
        Err(format!(
            "key {fingerprint} (builder `{principal}`) is not in {}",
            allowed.origin
        ))
    } else {
        Err(refusals.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_carry_the_key_and_a_digest_of_the_statement() {
        let t = tag("k123", "{\"a\":1}");
        assert!(t.starts_with("provenance-k123-"), "{t}");
        assert_eq!(t.len(), "provenance-k123-".len() + 16);
        assert_eq!(key_of_tag(&t), Some("k123"));
        assert_ne!(tag("k123", "{\"a\":2}"), t);
        assert_eq!(key_of_tag("wheel-k123"), None);
        assert!(is_wheel_tag_of("wheel-k123", "k123"));
        assert!(is_wheel_tag_of("wheel-k123-abcd-ef01", "k123"));
        assert!(!is_wheel_tag_of("wheel-k1234", "k123"));
        assert!(!is_wheel_tag_of("att-wheel-k123", "k123"));
    }

    #[test]
    fn a_changed_field_is_named_by_its_path_and_dependencies_by_name() {
        let want = json!({"subject": [{"name": "w.whl", "digest": {"sha256": "aa"}}],
            "predicate": {"buildDefinition": {"resolvedDependencies": [
                {"name": "source", "digest": {"gitCommit": "c1"}},
                {"name": "ext:x", "digest": {"sha256": "t1"}}]}}});
        let mut got = want.clone();
        got["predicate"]["buildDefinition"]["resolvedDependencies"][1]["digest"]["sha256"] =
            json!("t2");
        got["predicate"]["runDetails"] = json!({"builder": {"id": "whatever"}});
        let mut out = Vec::new();
        diff("", &want, &got, &mut out);
        assert_eq!(
            out,
            vec![FieldDiff {
                field: "predicate.buildDefinition.resolvedDependencies[ext:x].digest.sha256".into(),
                expected: "\"t1\"".into(),
                found: "\"t2\"".into(),
            }]
        );
    }
}
