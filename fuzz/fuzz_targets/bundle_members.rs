#![no_main]
//! The bundle checks of `import`, on structured input: the target writes a
//! tar.gz from a list of members (paths made of bundle-like components,
//! including `..`, empty and absolute ones) and a manifest that lists them
//! truthfully and then is edited (a file dropped, a size or sha256 changed,
//! a symlink added, ...), so the fuzzer reaches the manifest comparison and
//! the place checks as well as the hostile-member checks. Header fields are
//! written raw, so `tar::Builder`'s own path checks do not filter anything.
//!
//! Whatever `check_archive` accepts must be safe to extract: every member
//! path relative with only normal components, every symlink relative and
//! inside the archive root.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Component, Path};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

const COMMIT: &str = "5559679229bc961848b121ccdeaa8fa5d79bec98";

#[derive(Arbitrary, Debug)]
enum Comp {
    Store,
    Wheelhouse,
    Ext,
    Wheels,
    Lockfiles,
    Recipe,
    RecipeName,
    RecipeYaml,
    SourceBundle,
    Manifest,
    Dot,
    DotDot,
    Empty,
    Word(String),
}

#[derive(Arbitrary, Debug)]
struct PathSpec {
    absolute: bool,
    trailing_slash: bool,
    comps: Vec<Comp>,
}

#[derive(Arbitrary, Debug)]
enum Kind {
    File(Vec<u8>),
    Dir,
    Symlink(PathSpec),
    Hardlink(PathSpec),
    Other(u8),
}

#[derive(Arbitrary, Debug)]
struct Member {
    path: PathSpec,
    kind: Kind,
}

#[derive(Arbitrary, Debug)]
enum Edit {
    DropFile(u8),
    WrongSize(u8),
    WrongSha(u8),
    ExtraFile(PathSpec),
    DropLink(u8),
    ExtraLink(PathSpec, PathSpec),
    Format(u32),
    Recipe(String),
    Commit(String),
    NoManifest,
    RawManifest(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    recipe: String,
    members: Vec<Member>,
    edits: Vec<Edit>,
}

const RECIPE: &str = "vllm-555967922";

fn render(p: &PathSpec, recipe: &str) -> String {
    let parts: Vec<String> = p
        .comps
        .iter()
        .map(|c| match c {
            Comp::Store => "store".into(),
            Comp::Wheelhouse => "wheelhouse".into(),
            Comp::Ext => "ext".into(),
            Comp::Wheels => "wheels".into(),
            Comp::Lockfiles => "lockfiles".into(),
            Comp::Recipe => "recipe".into(),
            Comp::RecipeName => recipe.into(),
            Comp::RecipeYaml => format!("{recipe}.yaml"),
            Comp::SourceBundle => "source.bundle".into(),
            Comp::Manifest => "oracle-bundle.json".into(),
            Comp::Dot => ".".into(),
            Comp::DotDot => "..".into(),
            Comp::Empty => String::new(),
            Comp::Word(w) => w.clone(),
        })
        .collect();
    let mut s = parts.join("/");
    if p.absolute {
        s.insert(0, '/');
    }
    if p.trailing_slash {
        s.push('/');
    }
    s
}

/// A header with `path` (and `link`) written raw into the ustar fields.
fn header(path: &str, link: Option<&str>, kind: tar::EntryType, size: u64) -> Option<tar::Header> {
    let mut h = tar::Header::new_ustar();
    let name = path.as_bytes();
    let u = h.as_ustar_mut()?;
    if name.len() > u.name.len() {
        return None;
    }
    u.name[..name.len()].copy_from_slice(name);
    if let Some(l) = link {
        let l = l.as_bytes();
        if l.len() > u.linkname.len() {
            return None;
        }
        u.linkname[..l.len()].copy_from_slice(l);
    }
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    Some(h)
}

fn plain(p: &str) -> bool {
    let p = p.trim_end_matches('/');
    !p.is_empty()
        && !p.starts_with('/')
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

fuzz_target!(|input: Input| {
    let recipe = if input.recipe.is_empty() {
        RECIPE.to_string()
    } else {
        input.recipe.clone()
    };
    let mut tar = tar::Builder::new(Vec::new());
    let mut files: BTreeMap<String, (u64, String)> = BTreeMap::new();
    let mut links: BTreeMap<String, String> = BTreeMap::new();
    let mut written: Vec<(String, Option<String>)> = Vec::new();
    for m in &input.members {
        let path = render(&m.path, &recipe);
        let (h, data, link) = match &m.kind {
            Kind::File(d) => (
                header(&path, None, tar::EntryType::Regular, d.len() as u64),
                d.clone(),
                None,
            ),
            Kind::Dir => (
                header(&path, None, tar::EntryType::Directory, 0),
                Vec::new(),
                None,
            ),
            Kind::Symlink(t) => {
                let t = render(t, &recipe);
                (
                    header(&path, Some(&t), tar::EntryType::Symlink, 0),
                    Vec::new(),
                    Some(t),
                )
            }
            Kind::Hardlink(t) => {
                let t = render(t, &recipe);
                (
                    header(&path, Some(&t), tar::EntryType::Link, 0),
                    Vec::new(),
                    Some(t),
                )
            }
            Kind::Other(b) => (
                header(&path, None, tar::EntryType::new(*b), 0),
                Vec::new(),
                None,
            ),
        };
        let Some(h) = h else { continue };
        if tar.append(&h, &data[..]).is_err() {
            return;
        }
        let key = path.trim_end_matches('/').to_string();
        match &m.kind {
            Kind::File(d) => {
                files.insert(
                    key.clone(),
                    (d.len() as u64, hex::encode(Sha256::digest(d))),
                );
            }
            Kind::Symlink(_) => {
                links.insert(key.clone(), link.clone().unwrap_or_default());
            }
            _ => {}
        }
        written.push((key, link));
    }
    files.remove("oracle-bundle.json");
    let mut manifest = serde_json::json!({
        "format": 1,
        "recipe": recipe,
        "commit": COMMIT,
        "repo": "https://github.com/vllm-project/vllm",
        "files": files.iter().map(|(p, (s, h))| serde_json::json!({"path": p, "size": s, "sha256": h})).collect::<Vec<_>>(),
        "symlinks": links.iter().map(|(p, t)| serde_json::json!([p, t])).collect::<Vec<_>>(),
    });
    let mut raw: Option<String> = None;
    let mut with_manifest = true;
    for e in &input.edits {
        let pick = |arr: &mut serde_json::Value, i: u8| {
            let a = arr.as_array_mut()?;
            if a.is_empty() {
                return None;
            }
            let n = i as usize % a.len();
            Some(n)
        };
        match e {
            Edit::DropFile(i) => {
                if let Some(n) = pick(&mut manifest["files"], *i) {
                    manifest["files"].as_array_mut().unwrap().remove(n);
                }
            }
            Edit::WrongSize(i) => {
                if let Some(n) = pick(&mut manifest["files"], *i) {
                    let s = manifest["files"][n]["size"].as_u64().unwrap_or(0);
                    manifest["files"][n]["size"] = (s ^ 1).into();
                }
            }
            Edit::WrongSha(i) => {
                if let Some(n) = pick(&mut manifest["files"], *i) {
                    manifest["files"][n]["sha256"] = "0".repeat(64).into();
                }
            }
            Edit::ExtraFile(p) => {
                let p = render(p, &recipe);
                manifest["files"].as_array_mut().unwrap().push(serde_json::json!({"path": p, "size": 0, "sha256": hex::encode(Sha256::digest(b""))}));
            }
            Edit::DropLink(i) => {
                if let Some(n) = pick(&mut manifest["symlinks"], *i) {
                    manifest["symlinks"].as_array_mut().unwrap().remove(n);
                }
            }
            Edit::ExtraLink(p, t) => {
                let (p, t) = (render(p, &recipe), render(t, &recipe));
                manifest["symlinks"]
                    .as_array_mut()
                    .unwrap()
                    .push(serde_json::json!([p, t]));
            }
            Edit::Format(f) => manifest["format"] = (*f).into(),
            Edit::Recipe(r) => manifest["recipe"] = r.clone().into(),
            Edit::Commit(c) => manifest["commit"] = c.clone().into(),
            Edit::NoManifest => with_manifest = false,
            Edit::RawManifest(s) => raw = Some(s.clone()),
        }
    }
    if with_manifest {
        let bytes = raw
            .map(String::into_bytes)
            .unwrap_or_else(|| serde_json::to_vec(&manifest).unwrap());
        let Some(h) = header(
            "oracle-bundle.json",
            None,
            tar::EntryType::Regular,
            bytes.len() as u64,
        ) else {
            return;
        };
        if tar.append(&h, &bytes[..]).is_err() {
            return;
        }
    }
    let Ok(tar) = tar.into_inner() else { return };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    if oracle_build::store::bundle::check_archive(&gz[..]).is_ok() {
        for (path, link) in &written {
            assert!(plain(path), "accepted member path {path:?}");
            if let Some(l) = link {
                assert!(
                    !l.starts_with('/') && !l.is_empty(),
                    "accepted link {path:?} -> {l:?}"
                );
            }
        }
    }
});
