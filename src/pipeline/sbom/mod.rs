//! The bill-of-materials engine of `oracle-build sbom <PIN|VENV>`: what a
//! built oracle is made of, as a CycloneDX 1.6 document ([`cdx`],
//! docs/sbom.md), read from the records the build left in the store (no
//! network, nothing measured again):
//!
//! - the oracle itself (`metadata.component`): recipe, venv key, identity,
//!   smoke verdict, and whatever kernel coverage `oracle.json` records;
//! - the package built from the pinned commit (its wheel's sha256, the
//!   commit and repository as `pedigree` and a `vcs` reference), with its
//!   compiled extensions (sha256 from the venv's manifest) inside;
//! - every staged external source the wheel was built with (`build.json`
//!   `inputs.ext`, enriched by `store/ext/<entry>`: the sha256 of the staged
//!   tree, [`crate::stages::ext::tree_digest`]);
//! - every installed distribution (`*.dist-info` of the venv), with the
//!   sha256 and URL of the wheelhouse artifact it was installed from (the
//!   oracle's `requires`) and the index the runtime lock (PEP 751
//!   `packages.index`, `lock.json` `artifact_index`) says it came from;
//!   a package the recipe added (`install.with`, `install.extras`) says so
//!   (`added_by`);
//! - the toolchains of the wheel build and of the venv (`formulation`).

pub mod cdx;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::Value;

use crate::host::toolchain::Toolchain;
use crate::recipe::Recipe;
use crate::stages::ext::{self, ExtRecord, Origin};
use crate::stages::lock::pylock::Artifact;
use crate::stages::lock::{LOCK_JSON, LockInfo, RUNTIME_LOCK};
use crate::stages::oracle::{ORACLE_JSON, OracleRecord};
use crate::stages::wheel::BuildRecord;
use crate::stages::wheelhouse::ARTIFACT_JSON;
use crate::store::{Bucket, Manifest, Store, read_json};
use cdx::{
    Bom, Commit, Component, Dependency, ExternalReference, Formula, Hash, Lifecycle, Metadata,
    Pedigree, Property, Tools,
};

/// The oracle an SBOM describes and where to look for its lock.
#[derive(Debug)]
pub struct Subject<'a> {
    /// The oracle venv (canonical).
    pub venv: &'a Path,
    /// Its `oracle.json`.
    pub record: &'a OracleRecord,
    /// Its recipe.
    pub recipe: &'a Recipe,
    /// The store holding it.
    pub store: &'a Store,
    /// Lock directories that may hold its runtime lock besides the store's
    /// own (the recipe's `lockfiles/<name>/`): each, and each of its
    /// platform subdirectories, is taken when its `pylock.runtime.toml`
    /// has the sha256 the oracle recorded.
    pub lock_dirs: Vec<PathBuf>,
}

/// One `[[packages]]` of a PEP 751 lock, for its `index` (PEP 751:
/// "packages.index", the index the artifacts were found on).
#[derive(Debug, Deserialize)]
struct PylockIndex {
    name: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    index: Option<String>,
}

#[derive(Debug, Deserialize)]
struct PylockIndexes {
    #[serde(default)]
    packages: Vec<PylockIndex>,
}

/// The runtime lock an oracle was installed from, as the SBOM reads it.
struct RuntimeLock {
    dir: PathBuf,
    info: LockInfo,
    /// (normalized name, version) -> index URL.
    index: BTreeMap<(String, String), String>,
}

/// An installed distribution (`<site-packages>/<name>-<version>.dist-info/METADATA`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Installed {
    name: String,
    version: String,
}

/// The CycloneDX 1.6 document of the oracle `s` (see the module docs).
///
/// Errors: the oracle's wheel record (`store/wheels/<key>/build.json`) or
/// a staged source's record cannot be read, a staged source is damaged, or
/// the venv's `site-packages` cannot be read (each names the file).
pub fn bom(s: &Subject<'_>) -> Result<Bom> {
    let rec = s.record;
    let r = s.recipe;
    let raw: Value = read_json(&s.venv.join(ORACLE_JSON))?;
    let wheel_dir = s.store.entry(Bucket::Wheels, &rec.wheel_key).path;
    let build = BuildRecord::read(&wheel_dir).with_context(|| {
        format!(
            "reading the record of the oracle's wheel {} (the bill of materials names the sources it was built from)",
            wheel_dir.display()
        )
    })?;
    let id = &rec.identity;

    // The package built from the pin, with its compiled extensions.
    let pkg_ref = format!("pkg:{}", r.source.package);
    let mut pkg = Component {
        kind: "library",
        bom_ref: Some(pkg_ref.clone()),
        name: r.source.package.clone(),
        version: id.distribution_version.clone(),
        description: Some(format!(
            "{} built from {} at {} (wheel {})",
            r.source.package, r.source.repo, id.commit, build.wheel
        )),
        hashes: vec![Hash::sha256(&rec.wheel_sha256)],
        purl: id
            .distribution_version
            .as_deref()
            .map(|v| purl(&r.source.package, v, None)),
        external_references: vec![ExternalReference {
            kind: "vcs",
            url: r.source.repo.clone(),
            comment: Some(format!("commit {}", id.commit)),
        }],
        pedigree: Some(Pedigree {
            commits: vec![Commit {
                uid: id.commit.clone(),
                url: Some(r.source.repo.clone()),
            }],
        }),
        properties: vec![
            Property::new("commit", &id.commit),
            Property::new("repository", &r.source.repo),
            Property::new("wheel", &build.wheel),
            Property::new("wheel_key", &rec.wheel_key),
            Property::new("build_mode", &id.build_mode),
        ],
        components: extensions(s.venv, id.package_dir.as_deref(), &raw)?,
    };
    if let Some(h) = &build.history_version {
        pkg.properties.push(Property::new("history_version", h));
    }
    if let Some(v) = &id.runtime_version {
        pkg.properties.push(Property::new("runtime_version", v));
    }
    // The kernel families the tree's configure reported, one property each.
    match build.kernel_families(&wheel_dir) {
        Some(families) => pkg.properties.extend(families.iter().map(family_property)),
        None => pkg
            .properties
            .push(Property::new("kernel_families", "not recorded")),
    }

    // The staged external sources.
    let mut ext_refs = Vec::new();
    let mut components = vec![pkg];
    for c in ext_sources(s.store, &build)? {
        // A declaration the configure did not take is no part of the wheel.
        let untaken = c
            .properties
            .iter()
            .any(|p| p.name == "oracle-build:taken" && p.value == "false");
        if !untaken {
            ext_refs.push(c.bom_ref.clone().unwrap_or_default());
        }
        components.push(c);
    }

    // The gate's models, as the last gate hashed them.
    components.extend(models(&rec.smoke.cases));

    // The installed distributions.
    let lock = find_runtime_lock(s);
    let artifacts = artifacts_of(s.store, &rec.requires);
    let mut dist_refs = Vec::new();
    for d in installed(s.venv)? {
        if normalize(&d.name) == normalize(&r.source.package) {
            continue;
        }
        let mut c = distribution(&d, &artifacts, lock.as_ref(), r);
        // A package the recipe added (`install.with`, `install.extras`).
        if let Some(a) = rec
            .added
            .iter()
            .find(|a| normalize(&a.name) == normalize(&d.name))
        {
            c.properties.push(Property::new("added_by", &a.via));
        }
        dist_refs.push(c.bom_ref.clone().unwrap_or_default());
        components.push(c);
    }

    let mut oracle_props = vec![
        Property::new("recipe", &rec.recipe),
        Property::new("recipe_origin", &rec.recipe_origin),
        Property::new("venv", s.venv.display().to_string()),
        Property::new("venv_key", &rec.key),
        Property::new("commit", &id.commit),
        Property::new("repository", &r.source.repo),
        Property::new("python_version", &id.python_version),
        Property::new("platform", &id.platform),
        Property::new("editable", id.editable.to_string()),
        Property::new(
            "smoke_verdict",
            serde_json::to_value(rec.smoke.verdict)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
        ),
    ];
    for (name, v) in [
        ("runtime_version", &id.runtime_version),
        ("distribution_version", &id.distribution_version),
        ("torch_version", &id.torch_version),
        ("torch_cuda", &id.torch_cuda),
        ("flashinfer_version", &id.flashinfer_version),
    ] {
        if let Some(v) = v {
            oracle_props.push(Property::new(name, v));
        }
    }
    // The identity checks recorded at build time (kernel coverage among them).
    for c in &rec.checks {
        oracle_props.push(Property::new(
            &format!("check:{}", c.field),
            if c.ok {
                format!("ok: {}", c.found)
            } else {
                format!("FAILED: expected {}, found {}", c.expected, c.found)
            },
        ));
    }
    // Kernel coverage, in whatever form oracle.json records it.
    for field in ["kernels", "kernel_coverage", "coverage"] {
        if let Some(v) = raw.get(field).filter(|v| !v.is_null()) {
            oracle_props.push(Property::new(field, value_text(v)));
        }
    }
    match &lock {
        Some(l) => oracle_props.push(Property::new(
            "runtime_lock",
            l.dir.join(RUNTIME_LOCK).display().to_string(),
        )),
        None => oracle_props.push(Property::new(
            "runtime_lock",
            "not found (indexes are told from the artifact URLs and the recipe's indexes)",
        )),
    }
    if let Some(sha) = rec.inputs.get("runtime_lock").and_then(Value::as_str) {
        oracle_props.push(Property::new("runtime_lock_sha256", sha));
    }

    let oracle = Component {
        kind: "application",
        bom_ref: Some("oracle".into()),
        name: rec.recipe.clone(),
        version: Some(rec.key.clone()),
        description: Some(format!(
            "the oracle venv of recipe {} (vLLM-style package {} at {})",
            rec.recipe, r.source.package, id.commit
        )),
        properties: oracle_props,
        ..Component::default()
    };
    let mut depends = vec![pkg_ref.clone()];
    depends.extend(dist_refs);
    let dependencies = vec![
        Dependency {
            reference: "oracle".into(),
            depends_on: depends,
        },
        Dependency {
            reference: pkg_ref,
            depends_on: ext_refs,
        },
    ];
    let mut wheel_props = vec![Property::new("scrubbed_env", build.scrubbed_env.join(","))];
    for (k, v) in &build.env {
        wheel_props.push(Property::new(&format!("env:{k}"), v));
    }
    let mut wheel_tools = tools("wheel", &build.tools);
    if let Some(cc) = &build.compiler_cache {
        wheel_tools.push(tool("wheel", "compiler-cache", &cc.version, &cc.path));
    }
    let formulation = vec![
        Formula {
            bom_ref: "formula:wheel".into(),
            components: wheel_tools,
            properties: wheel_props,
        },
        Formula {
            bom_ref: "formula:venv".into(),
            components: tools("venv", &rec.tools),
            properties: Vec::new(),
        },
    ];
    let mut bom = Bom {
        bom_format: "CycloneDX",
        spec_version: cdx::SPEC_VERSION,
        serial_number: String::new(),
        version: 1,
        metadata: Metadata {
            timestamp: rec.created.clone(),
            lifecycles: vec![Lifecycle { phase: "build" }],
            tools: Tools {
                components: vec![Component {
                    kind: "application",
                    name: "oracle-build".into(),
                    version: Some(env!("CARGO_PKG_VERSION").into()),
                    ..Component::default()
                }],
            },
            component: oracle,
            properties: Vec::new(),
        },
        components,
        dependencies,
        formulation,
    };
    bom.serial_number = serial(&serde_json::to_vec(&bom)?);
    Ok(bom)
}

/// A kernel family as a property: `oracle-build:kernel_family:<name>`,
/// `built for <archs>` or `not built: <reason>`, then where the tree says so.
fn family_property(f: &crate::stages::wheel::families::KernelFamily) -> Property {
    let text = f.describe();
    let value = text.strip_prefix(&format!("{}: ", f.name)).unwrap_or(&text);
    Property::new(&format!("kernel_family:{}", f.name), value)
}

/// The compiled extensions of `oracle.json` (`identity.compiled_extensions`,
/// read as JSON so that fields added by later versions, such as kernel
/// coverage, pass through as properties), each with its sha256 from the
/// venv's manifest.
fn extensions(venv: &Path, package_dir: Option<&str>, raw: &Value) -> Result<Vec<Component>> {
    let manifest = Manifest::read(venv).ok();
    let sha_of = |rel: &str| -> Option<String> {
        manifest
            .as_ref()?
            .files
            .iter()
            .find(|f| f.path == rel)
            .map(|f| f.sha256.clone())
    };
    let pkg_rel = package_dir
        .and_then(|d| Path::new(d).strip_prefix(venv).ok())
        .map(Path::to_path_buf);
    let mut out = Vec::new();
    let list = raw["identity"]["compiled_extensions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for e in list {
        let Some(path) = e["path"].as_str() else {
            continue;
        };
        let rel = pkg_rel
            .as_ref()
            .map(|p| p.join(path).to_string_lossy().into_owned());
        let sha = e["sha256"]
            .as_str()
            .map(str::to_string)
            .or_else(|| rel.as_deref().and_then(sha_of));
        let mut properties = vec![];
        if let Some(rel) = &rel {
            properties.push(Property::new("path_in_venv", rel));
        }
        if let Some(obj) = e.as_object() {
            for (k, v) in obj {
                match v {
                    _ if k == "path" || k == "sha256" || v.is_null() => {}
                    // An object (the kernel coverage read from the fat
                    // binary: sections, cubins, ptx, entries, error): one
                    // property per member.
                    Value::Object(members) => {
                        for (m, mv) in members {
                            if !mv.is_null() {
                                properties.push(Property::new(&format!("{k}:{m}"), list_text(mv)));
                            }
                        }
                    }
                    _ => properties.push(Property::new(k, value_text(v))),
                }
            }
        }
        out.push(Component {
            kind: "file",
            bom_ref: Some(format!("file:{path}")),
            name: path.to_string(),
            hashes: sha.iter().map(|h| Hash::sha256(h)).collect(),
            properties,
            ..Component::default()
        });
    }
    Ok(out)
}

/// The staged external sources of the wheel `build` (its key's `inputs.ext`),
/// each with the sha256 of its staged tree when the store holds it.
///
/// A staged git source's files are checked against the commit the key
/// names (its git tree, [`ext::proof::check_staged`]): property `git_tree`
/// and `commit_checked` `true`, or `false: <why>` for one that cannot be
/// checked (an entry staged before commit objects were recorded, a URL
/// source).
///
/// Errors: `inputs.ext` is not the key inputs' shape; a staged entry's
/// record cannot be read or the entry is damaged; its files are not the
/// tree of the commit the key names.
fn ext_sources(store: &Store, build: &BuildRecord) -> Result<Vec<Component>> {
    let items = ext::keyed_sources(build.inputs.get("ext"))?;
    let mut out = Vec::new();
    for k in items {
        let entry = k.entry(store);
        let label = entry.label();
        let taken = Taken::of(&k, &label, build);
        let mut properties = Vec::new();
        match &taken {
            Taken::Target => properties.push(Property::new("variable", k.variable.name())),
            // No variable was passed: the dependency provider handed CMake
            // the copy of the declaration it evaluated.
            Taken::Yes(at) => {
                properties.push(Property::new("variable", "none: the dependency provider"));
                properties.push(Property::new("decided", "configure"));
                properties.push(Property::new("taken", "true"));
                properties.push(Property::new("declared", at));
            }
            Taken::No(other) => {
                properties.push(Property::new("decided", "configure"));
                properties.push(Property::new("taken", "false"));
                properties.push(Property::new("configure_took", other));
            }
            Taken::Unknown => {
                properties.push(Property::new("decided", "configure"));
                properties.push(Property::new(
                    "taken",
                    "unknown: the build record names no declaration of it taken",
                ));
            }
        }
        properties.push(Property::new("entry", &label));
        let mut hashes = Vec::new();
        if entry.exists() {
            let er: ExtRecord = read_json(&entry.path.join("ext.json"))?;
            properties.push(Property::new("declared_in", &er.source.file));
            hashes.push(Hash::sha256(&ext::tree_digest(&entry.path)?));
            properties.push(Property::new("staged", "true"));
            // The commit named below is the one the staged files are.
            let scratch = tempfile::tempdir()?;
            match ext::proof::check_staged(store, &k, &scratch.path().join("git"))
                .with_context(|| format!("the staged source {} is not its commit's tree", k.name))?
            {
                ext::proof::Staged::Checked { tree, .. } => {
                    properties.push(Property::new("git_tree", &tree));
                    properties.push(Property::new("commit_checked", "true"));
                }
                ext::proof::Staged::Unchecked(why) => {
                    properties.push(Property::new("commit_checked", format!("false: {why}")));
                }
                ext::proof::Staged::Absent => {}
            }
        } else {
            properties.push(Property::new("staged", "false (not in this store)"));
        }
        if let Some(sub) = &k.subdir {
            properties.push(Property::new("subdir", sub));
        }
        for (path, commit) in &k.submodules {
            properties.push(Property::new(&format!("submodule:{path}"), commit));
        }
        let (version, reference, commits) = match &k.origin {
            Origin::Git { repo, tag } => {
                if let Some(c) = &k.commit {
                    properties.push(Property::new("commit", c));
                }
                (
                    tag.clone(),
                    ExternalReference {
                        kind: "vcs",
                        url: repo.clone(),
                        comment: Some(format!("GIT_TAG {tag}")),
                    },
                    k.commit
                        .iter()
                        .map(|c| Commit {
                            uid: c.clone(),
                            url: Some(repo.clone()),
                        })
                        .collect::<Vec<_>>(),
                )
            }
            Origin::Url { url, sha256 } => {
                let archive = k.archive_sha256.clone().or_else(|| sha256.clone());
                if let Some(a) = &archive {
                    properties.push(Property::new("archive_sha256", a));
                }
                (
                    archive
                        .as_deref()
                        .map_or_else(|| "url".to_string(), |a| a.chars().take(16).collect()),
                    ExternalReference {
                        kind: "distribution",
                        url: url.clone(),
                        comment: archive.map(|a| format!("archive sha256 {a}")),
                    },
                    Vec::new(),
                )
            }
        };
        // One name declared twice: the declaration the configure took is
        // `ext:<name>`; every other one its own reference, by its entry.
        let (bom_ref, description) = match &taken {
            Taken::Target | Taken::Yes(_) => (
                format!("ext:{}", k.name),
                format!("FetchContent source {} staged as {label}", k.name),
            ),
            Taken::No(other) => (
                format!("ext:{}@{label}", k.name),
                format!(
                    "FetchContent source {} staged as {label} and keyed, but NOT TAKEN: the tree's configure took the declaration at {other}; not a part of the wheel",
                    k.name
                ),
            ),
            Taken::Unknown => (
                format!("ext:{}@{label}", k.name),
                format!(
                    "FetchContent source {} staged as {label}, one of the declarations the tree's configure chooses between",
                    k.name
                ),
            ),
        };
        out.push(Component {
            kind: "library",
            bom_ref: Some(bom_ref),
            name: k.name.clone(),
            version: Some(version),
            description: Some(description),
            hashes,
            external_references: vec![reference],
            pedigree: (!commits.is_empty()).then_some(Pedigree { commits }),
            properties,
            ..Component::default()
        });
    }
    Ok(out)
}

/// The models the gate ran (`oracle.json` `smoke.cases[].model_manifest`):
/// one `machine-learning-model` component per model directory and manifest
/// (its `bom-ref` `model:<dir>@<16 hex of the manifest digest>`), the
/// manifest's sha256 as its hash, the hub repository and revision of a hub
/// snapshot, the cases that ran it, and every file inside as a `file`
/// component with its sha256.
fn models(cases: &[crate::stages::smoke::CaseResult]) -> Vec<Component> {
    let mut out: Vec<Component> = Vec::new();
    for c in cases {
        let Some(m) = &c.model_manifest else {
            continue;
        };
        let bom_ref = format!("model:{}@{}", m.dir, &m.digest[..m.digest.len().min(16)]);
        let check = c
            .model_check
            .and_then(|x| serde_json::to_value(x).ok())
            .and_then(|v| v.as_str().map(str::to_string));
        if let Some(seen) = out
            .iter_mut()
            .find(|x| x.bom_ref.as_ref() == Some(&bom_ref))
        {
            seen.properties.push(Property::new("case", &c.name));
            if let Some(check) = check {
                seen.properties.push(Property::new(
                    &format!("golden_model_check:{}", c.name),
                    check,
                ));
            }
            continue;
        }
        let name = m.hub.as_ref().map_or_else(
            || {
                Path::new(&m.dir)
                    .file_name()
                    .map_or_else(|| m.dir.clone(), |n| n.to_string_lossy().into_owned())
            },
            |h| h.repo.clone(),
        );
        let mut properties = vec![
            Property::new("path", &m.dir),
            Property::new("manifest_sha256", &m.digest),
            Property::new("files", m.files.len().to_string()),
            Property::new("bytes", m.bytes.to_string()),
            Property::new("case", &c.name),
        ];
        if let Some(check) = check {
            properties.push(Property::new(
                &format!("golden_model_check:{}", c.name),
                check,
            ));
        }
        if let Some(h) = &m.hub {
            properties.push(Property::new("hub_repo", &h.repo));
            properties.push(Property::new("hub_revision", &h.revision));
            if !h.refs.is_empty() {
                properties.push(Property::new("hub_refs", h.refs.join(",")));
            }
        }
        let files = m
            .files
            .iter()
            .map(|f| {
                let mut properties = vec![Property::new("size", f.size.to_string())];
                if let Some(b) = &f.blob {
                    properties.push(Property::new("hub_blob", b));
                }
                Component {
                    kind: "file",
                    bom_ref: Some(format!("{bom_ref}/{}", f.path)),
                    name: f.path.clone(),
                    hashes: vec![Hash::sha256(&f.sha256)],
                    properties,
                    ..Component::default()
                }
            })
            .collect();
        out.push(Component {
            kind: "machine-learning-model",
            bom_ref: Some(bom_ref),
            name,
            version: m.hub.as_ref().map(|h| h.revision.clone()),
            description: Some(format!(
                "the model directory {} the gate ran ({} files); its hash is the sha256 of its manifest (docs/sbom.md)",
                m.dir,
                m.files.len()
            )),
            hashes: vec![Hash::sha256(&m.digest)],
            properties,
            components: files,
            ..Component::default()
        });
    }
    out
}

/// Whether the build took a staged source (`build.json` `ext_taken`).
enum Taken {
    /// Decided before the build, for the target: passed through its variable.
    Target,
    /// One of several declarations, and the one the configure took (its `file:line`).
    Yes(String),
    /// One of several, not taken: the configure took the declaration at this `file:line`.
    No(String),
    /// One of several, and the record names none of its name taken.
    Unknown,
}

impl Taken {
    fn of(k: &ext::KeyedSource, label: &str, build: &BuildRecord) -> Taken {
        if k.decided != ext::Decided::Configure {
            return Taken::Target;
        }
        let mut of_name = build
            .ext_taken
            .iter()
            .filter(|t| t.name == k.name && t.decided == ext::Decided::Configure);
        match of_name.clone().find(|t| t.entry == label) {
            Some(t) => Taken::Yes(t.declared.clone()),
            None => of_name
                .next()
                .map_or(Taken::Unknown, |t| Taken::No(t.declared.clone())),
        }
    }
}

/// The wheelhouse artifacts among `requires` (`wheelhouse/<sha256>`), by
/// (normalized name, version).
fn artifacts_of(store: &Store, requires: &[String]) -> BTreeMap<(String, String), Artifact> {
    let mut out = BTreeMap::new();
    for label in requires {
        let Some(e) = store.entry_by_label(label) else {
            continue;
        };
        if e.bucket != Bucket::Wheelhouse {
            continue;
        }
        if let Ok(a) = read_json::<Artifact>(&e.path.join(ARTIFACT_JSON)) {
            out.insert((normalize(&a.package), a.version.clone()), a);
        }
    }
    out
}

/// The component of the installed distribution `d`.
fn distribution(
    d: &Installed,
    artifacts: &BTreeMap<(String, String), Artifact>,
    lock: Option<&RuntimeLock>,
    r: &Recipe,
) -> Component {
    let key = (normalize(&d.name), d.version.clone());
    let a = artifacts.get(&key);
    let mut properties = Vec::new();
    let mut refs = Vec::new();
    let mut index_url = lock.and_then(|l| l.index.get(&key).cloned());
    if let Some(a) = a {
        properties.push(Property::new("file", &a.filename));
        if let Some(u) = &a.url {
            refs.push(ExternalReference {
                kind: "distribution",
                url: u.clone(),
                comment: Some(format!("the locked artifact {}", a.filename)),
            });
        }
        let named = lock
            .and_then(|l| l.info.artifact_index.get(&a.filename).cloned())
            .or_else(|| {
                a.url
                    .as_deref()
                    .map(|u| crate::host::uv::index_of(&r.indexes, u))
            });
        if let Some(n) = named {
            if index_url.is_none()
                && let Some(i) = r.indexes.iter().find(|i| match i {
                    crate::recipe::Index::Explicit { name, .. } => *name == n,
                    crate::recipe::Index::Url(u) => *u == n,
                })
            {
                index_url = Some(i.url().to_string());
            }
            properties.push(Property::new("index", n));
        }
    } else {
        properties.push(Property::new(
            "artifact",
            "not among the oracle's wheelhouse entries",
        ));
    }
    if let Some(u) = &index_url {
        properties.push(Property::new("index_url", u));
        refs.push(ExternalReference {
            kind: "distribution",
            url: u.clone(),
            comment: Some("the package index it came from".into()),
        });
    }
    let repository = index_url
        .as_deref()
        .filter(|u| !u.trim_end_matches('/').ends_with("pypi.org/simple"));
    Component {
        kind: "library",
        bom_ref: Some(format!("dist:{}", key.0)),
        name: d.name.clone(),
        version: Some(d.version.clone()),
        hashes: a.iter().map(|a| Hash::sha256(&a.sha256)).collect(),
        purl: Some(purl(&d.name, &d.version, repository)),
        external_references: refs,
        properties,
        ..Component::default()
    }
}

/// The runtime lock with the sha256 the oracle recorded
/// (`inputs.runtime_lock`), among the store's lock entries the oracle
/// requires and `s.lock_dirs` (each and its platform subdirectories).
fn find_runtime_lock(s: &Subject<'_>) -> Option<RuntimeLock> {
    let want = s.record.inputs.get("runtime_lock")?.as_str()?.to_string();
    let mut dirs: Vec<PathBuf> = s
        .record
        .requires
        .iter()
        .filter_map(|l| s.store.entry_by_label(l))
        .filter(|e| e.bucket == Bucket::Locks)
        .map(|e| e.path)
        .collect();
    for d in &s.lock_dirs {
        dirs.push(d.clone());
        if let Ok(rd) = std::fs::read_dir(d) {
            let mut subs: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
            subs.sort();
            dirs.extend(subs);
        }
    }
    for dir in dirs {
        let Ok(info) = read_json::<LockInfo>(&dir.join(LOCK_JSON)) else {
            continue;
        };
        if info.files.get(RUNTIME_LOCK) != Some(&want)
            || crate::store::sha256_file(&dir.join(RUNTIME_LOCK)).ok() != Some(want.clone())
        {
            continue;
        }
        let text = std::fs::read_to_string(dir.join(RUNTIME_LOCK)).ok()?;
        let parsed: PylockIndexes = toml::from_str(&text).ok()?;
        let index = parsed
            .packages
            .into_iter()
            .filter_map(|p| Some(((normalize(&p.name), p.version?), p.index?)))
            .collect();
        return Some(RuntimeLock { dir, info, index });
    }
    None
}

/// Every distribution installed in `venv` (`lib/*/site-packages/*.dist-info/METADATA`
/// `Name` and `Version`, core metadata), sorted.
///
/// Errors: `lib` cannot be read.
fn installed(venv: &Path) -> Result<Vec<Installed>> {
    let mut out = Vec::new();
    for e in fs_err::read_dir(venv.join("lib"))? {
        let site = e?.path().join("site-packages");
        let Ok(rd) = std::fs::read_dir(&site) else {
            continue;
        };
        for d in rd.flatten() {
            if !d.file_name().to_string_lossy().ends_with(".dist-info") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(d.path().join("METADATA")) else {
                continue;
            };
            let field = |name: &str| {
                text.lines()
                    .take_while(|l| !l.is_empty())
                    .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
            };
            if let (Some(name), Some(version)) = (field("Name:"), field("Version:")) {
                out.push(Installed { name, version });
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The normalized name (PEP 503) of `name`.
fn normalize(name: &str) -> String {
    pep508_rs::PackageName::from_str(name)
        .map(|n| n.to_string())
        .unwrap_or_else(|_| name.to_ascii_lowercase())
}

/// The package URL (purl-spec, type `pypi`) of `name` at `version`, with a
/// `repository_url` qualifier for an index other than PyPI.
fn purl(name: &str, version: &str, repository: Option<&str>) -> String {
    let mut p = format!("pkg:pypi/{}@{}", normalize(name), pct(version));
    if let Some(u) = repository {
        p.push_str(&format!("?repository_url={}", pct(u)));
    }
    p
}

/// Percent-encodes everything but `A-Za-z0-9.-_~` (purl-spec).
fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The toolchain `tc` as components (`bom-ref` `tool:<step>:<name>`).
fn tools(step: &str, tc: &Toolchain) -> Vec<Component> {
    let mut out = vec![tool(
        step,
        &format!("python ({})", tc.python.implementation),
        &tc.python.version,
        &tc.python.path,
    )];
    out.push(tool(step, "uv", &tc.uv.version, &tc.uv.path));
    for (name, t) in [("gcc", &tc.gcc), ("nvcc", &tc.nvcc), ("git", &tc.git)] {
        if let Some(t) = t {
            out.push(tool(step, name, &t.version, &t.path));
        }
    }
    out.push(Component {
        kind: "library",
        bom_ref: Some(format!("tool:{step}:libgit2")),
        name: "libgit2".into(),
        version: Some(tc.libgit2.clone()),
        ..Component::default()
    });
    out
}

fn tool(step: &str, name: &str, version: &str, path: &Path) -> Component {
    Component {
        kind: "application",
        bom_ref: Some(format!("tool:{step}:{name}")),
        name: name.to_string(),
        version: Some(version.to_string()),
        properties: vec![Property::new("path", path.display().to_string())],
        ..Component::default()
    }
}

/// A property value: a list of strings joined by `,`, else [`value_text`].
fn list_text(v: &Value) -> String {
    match v.as_array() {
        Some(items) if items.iter().all(Value::is_string) => items
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        _ => value_text(v),
    }
}

/// A property value: a string as is, anything else as compact JSON.
fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The BOM's serial number: a UUID (RFC 9562 version 8, custom) from the
/// sha256 of the document `body` (serialized with an empty serial), so the
/// same document always gets the same serial and two documents that differ
/// in anything (one venv key re-gated, another tool version) get two.
fn serial(body: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut b: [u8; 16] = [0; 16];
    let mut h = Sha256::new();
    h.update(b"oracle-build sbom ");
    h.update(body);
    b.copy_from_slice(&h.finalize()[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "urn:uuid:{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiled_extensions_carry_their_sha256_and_kernel_coverage_when_recorded() {
        let venv = Path::new("/v");
        let sha = "a".repeat(64);
        let raw = serde_json::json!({"identity": {"compiled_extensions": [
            {"path": "_C.abi3.so", "size": 10, "sha256": sha, "kernels": {
                "sections": [".nv_fatbin"], "cubins": ["sm_80", "sm_90a"], "ptx": [],
                "entries": [{"kind": "cubin", "arch": "sm_80"}], "error": null}},
            {"path": "_old.so", "size": 3}
        ]}});
        let c = extensions(venv, Some("/v/lib/python3.11/site-packages/pkg"), &raw).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].hashes[0].content, sha);
        let props: BTreeMap<&str, &str> = c[0]
            .properties
            .iter()
            .map(|p| (p.name.as_str(), p.value.as_str()))
            .collect();
        assert_eq!(props["oracle-build:kernels:cubins"], "sm_80,sm_90a");
        assert_eq!(props["oracle-build:kernels:sections"], ".nv_fatbin");
        assert_eq!(props["oracle-build:kernels:ptx"], "");
        assert!(!props.contains_key("oracle-build:kernels:error"));
        assert_eq!(
            props["oracle-build:path_in_venv"],
            "lib/python3.11/site-packages/pkg/_C.abi3.so"
        );
        // A record without them (written before they were measured): no hash, no failure.
        assert!(c[1].hashes.is_empty());
    }

    #[test]
    fn a_kernel_family_is_one_property_saying_built_or_why_not() {
        let f = crate::stages::wheel::families::parse(
            "-- Not building SM12x NVFP4 as no compatible archs were found.\n-- Building moe_data for archs: 12.0f\n",
        );
        let p = family_property(&f[0]);
        assert_eq!(p.name, "oracle-build:kernel_family:SM12x NVFP4");
        assert_eq!(p.value, "not built: no compatible archs were found");
        assert_eq!(family_property(&f[1]).value, "built for 12.0f");
    }

    #[test]
    fn purls_are_percent_encoded_and_serials_are_uuids() {
        assert_eq!(
            purl("Foo_Bar", "1.0+g1234", None),
            "pkg:pypi/foo-bar@1.0%2Bg1234"
        );
        assert_eq!(
            purl(
                "torch",
                "2.9.0",
                Some("https://download.pytorch.org/whl/cu130")
            ),
            "pkg:pypi/torch@2.9.0?repository_url=https%3A%2F%2Fdownload.pytorch.org%2Fwhl%2Fcu130"
        );
        let s = serial(b"abc");
        assert_eq!(s, serial(b"abc"));
        assert_ne!(s, serial(b"abd"));
        let re = regex::Regex::new(
            "^urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$",
        )
        .unwrap();
        assert!(re.is_match(&s), "{s}");
    }
}
