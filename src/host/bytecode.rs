//! Bytecode for a fresh venv, compiled once per (Python, source file) and
//! shared by every venv that hard-links the same source file.
//!
//! Every venv of the store hard-links its `.py` files from the store's one uv
//! cache, so the same source (same inode, same mtime and size) appears in
//! many venvs. [`ensure`] gives each `.py` under the venv's `site-packages`
//! its `__pycache__/<name>.<cache tag>.pyc` (PEP 3147), either hard-linked
//! from the store's bytecode pool (`Store::bytecode_dir`) or compiled now by
//! the venv's own Python (`py_compile`, timestamp invalidation, PEP 552) and
//! then added to the pool.
//!
//! Why a shared `.pyc` is right in every venv:
//! - A pool file is keyed by the source's device, inode, mtime (ns) and size
//!   and by the cache tag (e.g. `cpython-311`), so it is only ever linked
//!   next to the very same file for the very same Python; the tag is also in
//!   the `.pyc` name, so another Python never reads it.
//! - A timestamp `.pyc` validates against the source's mtime and size, which
//!   a hard link shares; a changed source is recompiled by Python as usual.
//! - CPython's `SourceLoader` sets `co_filename` to the path the module was
//!   actually loaded from (`_imp._fix_co_filename`), so tracebacks name the
//!   importing venv's own paths, not the venv the file was compiled in.
//!
//! Sources that are not hard links (a file uv wrote for this venv alone) are
//! compiled into the venv and not pooled. The pool keeps, beside each `.pyc`,
//! its sha256 (`<key>.sha256`), so the venv's manifest need not hash it again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use fs_err as fs;

use crate::host::process::{capture, run_logged};
use crate::host::toolchain::Python;
use crate::progress::Progress;
use crate::store::{
    Bucket, Entry, Manifest, Store, TempRoots, sha256_file, write_atomic, write_json,
};

/// What [`ensure`] did.
#[derive(Debug, Clone, Default)]
pub struct Bytecode {
    /// `.pyc` files hard-linked from the pool.
    pub linked: usize,
    /// `.pyc` files compiled now.
    pub compiled: usize,
    /// Sources `py_compile` refused (syntax errors, e.g. templates shipped as
    /// `.py`); Python compiles none of them at import either.
    pub failed: usize,
    /// sha256 of `.pyc` files known without reading them, by path relative
    /// to the venv (for the manifest).
    pub hashes: HashMap<String, String>,
}

/// The `sys.implementation.cache_tag` of `python` when it can be known
/// without running it: `cpython-<major><minor>` for CPython; `None` otherwise
/// (then nothing is pooled).
pub fn cache_tag(python: &Python) -> Option<String> {
    if python.implementation != "cpython" {
        return None;
    }
    let mut parts = python.version.split('.');
    let (major, minor) = (parts.next()?, parts.next()?);
    if major.parse::<u32>().is_err() || minor.parse::<u32>().is_err() {
        return None;
    }
    Some(format!("cpython-{major}{minor}"))
}

/// Compiles the sources listed in argv[1] (NUL-separated triples: source,
/// cache file, name recorded in the code, empty for the source's path) to
/// their cache files in the invalidation mode argv[3] (PEP 552: `timestamp`
/// or `checked-hash`), after checking that the cache tag is argv[2] and,
/// when argv[4] is not empty, that the magic number is argv[4] (hex).
const COMPILE: &str = r#"
import os, py_compile, sys, importlib.util
if sys.implementation.cache_tag != sys.argv[2]:
    print("cache tag is %s, expected %s" % (sys.implementation.cache_tag, sys.argv[2]))
    sys.exit(3)
if sys.argv[4] and importlib.util.MAGIC_NUMBER.hex() != sys.argv[4]:
    print("magic number is %s, expected %s" % (importlib.util.MAGIC_NUMBER.hex(), sys.argv[4]))
    sys.exit(3)
mode = {"timestamp": py_compile.PycInvalidationMode.TIMESTAMP,
        "checked-hash": py_compile.PycInvalidationMode.CHECKED_HASH}[sys.argv[3]]
ok = bad = 0
with open(sys.argv[1], "rb") as f:
    parts = [os.fsdecode(n) for n in f.read().split(b"\0")]
for i in range(0, len(parts) - 2, 3):
    src, cfile, dfile = parts[i], parts[i + 1], parts[i + 2]
    try:
        os.makedirs(os.path.dirname(cfile), exist_ok=True)
        py_compile.compile(src, cfile=cfile, dfile=dfile or None, doraise=True, invalidation_mode=mode)
        ok += 1
    except Exception as e:
        bad += 1
        print("not compiled: %s: %s" % (src, str(e).splitlines()[0] if str(e) else type(e).__name__))
print("compiled %d, failed %d" % (ok, bad))
"#;

/// One source to compile: the source, its cache file, and the file name the
/// code records (`None`: the source's path).
struct Job {
    src: PathBuf,
    cfile: PathBuf,
    dfile: Option<String>,
}

/// Compiles `jobs` with `python` (the venv's interpreter) in `mode`, one
/// process per CPU (at least 64 sources each), as `compileall -j` and uv
/// do; each checks the cache tag `tag` and, when given, the magic number
/// `magic`. `work` holds the lists and each compiler's log; `log` gets
/// their output, in order. A source Python refuses leaves no cache file.
///
/// Errors: a list or log cannot be written; a compiler fails to run or
/// finds another cache tag or magic number.
fn compile_jobs(
    python: &Path,
    jobs: &[Job],
    mode: &str,
    tag: &str,
    magic: &str,
    work: &Path,
    log: &Path,
) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let workers = crate::host::toolchain::cpu_count()
        .min(jobs.len().div_ceil(64))
        .max(1);
    let chunk = jobs.len().div_ceil(workers);
    let mut lists = Vec::new();
    for (i, part) in jobs.chunks(chunk).enumerate() {
        use std::os::unix::ffi::OsStrExt;
        let list = work.join(format!("bytecode-{mode}-sources.{i}"));
        let mut bytes = Vec::new();
        for j in part {
            bytes.extend_from_slice(j.src.as_os_str().as_bytes());
            bytes.push(0);
            bytes.extend_from_slice(j.cfile.as_os_str().as_bytes());
            bytes.push(0);
            bytes.extend_from_slice(j.dfile.as_deref().unwrap_or("").as_bytes());
            bytes.push(0);
        }
        fs::write(&list, bytes)?;
        lists.push((list, work.join(format!("bytecode-{mode}-log.{i}"))));
    }
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = lists
            .iter()
            .map(|(list, part_log)| {
                let expr = duct::cmd(
                    python,
                    [
                        "-I".into(),
                        "-c".into(),
                        COMPILE.to_string(),
                        list.display().to_string(),
                        tag.to_string(),
                        mode.to_string(),
                        magic.to_string(),
                    ],
                );
                scope.spawn(move || {
                    run_logged(
                        "compile bytecode",
                        expr,
                        part_log,
                        &Progress::new("bytecode"),
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a compiler thread panicked")))
            })
            .collect()
    });
    // The workers' logs, in order, into the stage's log.
    let mut all = fs::OpenOptions::new().create(true).append(true).open(log)?;
    for (_, part_log) in &lists {
        if let Ok(text) = std::fs::read(part_log) {
            std::io::Write::write_all(&mut all, &text)?;
        }
    }
    for r in results {
        r.with_context(|| format!("compiling the venv's bytecode (log: {})", log.display()))?;
    }
    Ok(())
}

struct Source {
    py: PathBuf,
    pyc: PathBuf,
    /// The pool file, when the source is a hard link (shared).
    pooled: Option<PathBuf>,
}

/// Gives every `.py` under `<venv>/lib/*/site-packages` its `.pyc` for
/// `python` (the venv's interpreter, as the toolchain found it): linked from
/// `pool` when there, else compiled by `<venv>/bin/python` (one process per
/// CPU, each given a share of the sources) and added to `pool`. `work` holds
/// the lists of sources to compile and each compiler's log; `log` gets their
/// output, in order.
///
/// Errors: the venv cannot be read, the pool cannot be written, or the
/// venv's Python cannot run or has another cache tag than `python`'s.
pub fn ensure(
    python: &Python,
    venv: &Path,
    pool: &Path,
    covered: &HashSet<PathBuf>,
    work: &Path,
    log: &Path,
) -> Result<Bytecode> {
    let lib = venv.join("lib");
    let mut sources = Vec::new();
    for e in fs::read_dir(&lib)? {
        let site = e?.path().join("site-packages");
        if site.is_dir() {
            collect_py(&site, &mut sources)?;
        }
    }
    sources.retain(|(py, _)| !covered.contains(py));
    let mut out = Bytecode::default();
    let Some(tag) = cache_tag(python) else {
        // Unknown cache tag: compileall picks the names; nothing is pooled.
        let expr = duct::cmd(
            venv.join("bin/python"),
            [
                "-I".into(),
                "-m".into(),
                "compileall".into(),
                "-q".into(),
                lib.display().to_string(),
            ],
        )
        .unchecked();
        run_logged("compileall", expr, log, &Progress::new("bytecode"))?;
        out.compiled = sources.len();
        return Ok(out);
    };
    let tag_dir = pool.join(&tag);
    fs::create_dir_all(&tag_dir)?;
    let mut todo: Vec<Source> = Vec::new();
    for (py, meta) in sources {
        let (Some(dir), Some(stem)) = (py.parent(), py.file_stem()) else {
            continue;
        };
        let cache = dir.join("__pycache__");
        let pyc = cache.join(format!("{}.{tag}.pyc", stem.to_string_lossy()));
        let pooled = (meta.nlink() > 1).then(|| tag_dir.join(pool_key(&meta)));
        if let Some(p) = &pooled
            && p.exists()
        {
            fs::create_dir_all(&cache)?;
            if std::fs::hard_link(p, &pyc).is_ok() {
                out.linked += 1;
                if let Ok(sha) = std::fs::read_to_string(p.with_extension("sha256"))
                    && sha.trim().len() == 64
                    && let Some(rel) = rel(venv, &pyc)
                {
                    out.hashes.insert(rel, sha.trim().to_string());
                }
                continue;
            }
        }
        todo.push(Source { py, pyc, pooled });
    }
    if todo.is_empty() {
        return Ok(out);
    }
    let jobs: Vec<Job> = todo
        .iter()
        .map(|s| Job {
            src: s.py.clone(),
            cfile: s.pyc.clone(),
            dfile: None,
        })
        .collect();
    compile_jobs(
        &venv.join("bin/python"),
        &jobs,
        "timestamp",
        &tag,
        "",
        work,
        log,
    )?;
    for s in &todo {
        if !s.pyc.is_file() {
            out.failed += 1;
            continue;
        }
        out.compiled += 1;
        let Some(p) = &s.pooled else { continue };
        let sha = sha256_file(&s.pyc)?;
        if let Some(rel) = rel(venv, &s.pyc) {
            out.hashes.insert(rel, sha.clone());
        }
        // The link is the commit point; the hash is written first.
        write_atomic(&p.with_extension("sha256"), sha.as_bytes())?;
        match std::fs::hard_link(&s.pyc, p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => bail!(
                "adding {} to the bytecode pool as {}: {e}",
                s.pyc.display(),
                p.display()
            ),
        }
    }
    Ok(out)
}

/// The record of a bytecode entry (`store/pyc/<name>/bytecode.json`, and
/// the config record of its artifact).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BytecodeRecord {
    /// Format version (1).
    pub format: u32,
    /// The sha256 of the wheel whose sources were compiled.
    pub wheel_sha256: String,
    /// `sys.implementation.cache_tag` of the compiling Python.
    pub cache_tag: String,
    /// `importlib.util.MAGIC_NUMBER` of the compiling Python, hex.
    pub magic: String,
    /// The PEP 552 invalidation mode of every `.pyc`: [`INVALIDATION`].
    pub invalidation: String,
    /// Sources of the wheel Python refused to compile (paths relative to
    /// site-packages): no `.pyc`, and none is compiled for them at install.
    #[serde(default)]
    pub failed: Vec<String>,
}

/// The record file of a bytecode entry.
pub const BYTECODE_JSON: &str = "bytecode.json";

/// The directory of a bytecode entry holding its `.pyc` files, laid out as
/// in site-packages (`site/<pkg>/__pycache__/<mod>.<tag>.pyc`).
pub const SITE: &str = "site";

/// The invalidation mode of the `.pyc` files of bytecode entries (PEP 552):
/// `checked-hash`. The `.pyc` records the SipHash of its source, which
/// the importing Python checks against the source it finds: a `.pyc` is
/// then valid wherever the same wheel is installed, whatever the file
/// times (a timestamp `.pyc` is not: times differ between boxes), and a
/// changed source is compiled again rather than shadowed by stale code.
/// `unchecked-hash` would skip reading the source at import (a little
/// faster) but would run stale code next to an edited source.
pub const INVALIDATION: &str = "checked-hash";

/// The cache tag and magic number of a Python.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// `sys.implementation.cache_tag` (e.g. `cpython-311`).
    pub cache_tag: String,
    /// `importlib.util.MAGIC_NUMBER`, hex (e.g. `a70d0d0a`).
    pub magic: String,
}

impl Interpreter {
    /// Asks the interpreter `python` (a venv's `bin/python`).
    ///
    /// Errors: it does not run, or has no cache tag (then nothing is made
    /// per wheel and [`ensure`] compiles as before).
    pub fn of(python: &Path) -> Result<Interpreter> {
        let out = capture(
            "asking the venv's Python for its cache tag",
            duct::cmd(
                python,
                [
                    "-I",
                    "-c",
                    "import sys, importlib.util as u; print(sys.implementation.cache_tag, u.MAGIC_NUMBER.hex())",
                ],
            ),
        )?;
        let mut parts = out.split_whitespace();
        match (parts.next(), parts.next()) {
            (Some(tag), Some(magic))
                if tag != "None"
                    && tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    && magic.len() == 8
                    && magic.chars().all(|c| c.is_ascii_hexdigit()) =>
            {
                Ok(Interpreter {
                    cache_tag: tag.to_string(),
                    magic: magic.to_string(),
                })
            }
            _ => bail!(
                "{} gave no cache tag and magic number: {out:?}",
                python.display()
            ),
        }
    }

    /// The bytecode entry name of the wheel `wheel_sha256` for this Python:
    /// `<wheel sha256>-<cache tag>-<magic>`.
    pub fn entry_name(&self, wheel_sha256: &str) -> String {
        format!("{wheel_sha256}-{}-{}", self.cache_tag, self.magic)
    }
}

/// What [`wheel_contents`] reads of a wheel.
#[derive(Debug, Clone, Default)]
pub struct WheelContents {
    /// The `.py` files it installs under site-packages, by path relative
    /// to site-packages, sorted.
    pub sources: Vec<String>,
    /// Its `<name>-<version>.dist-info/WHEEL` member: its path and bytes
    /// (installers copy it as it is, so it tells which of several wheels of
    /// one version, e.g. for two platforms, a venv holds).
    pub wheel_file: Option<(String, Vec<u8>)>,
}

/// The `.py` files a wheel installs under site-packages (PEP 427: the root,
/// and `<name>.data/purelib/` and `platlib/`), by path relative to
/// site-packages (its `.dist-info` left out), and its `WHEEL` file.
///
/// Errors: the wheel is not a readable zip.
pub fn wheel_contents(wheel: &Path) -> Result<WheelContents> {
    let file = fs::File::open(wheel)?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file))
        .with_context(|| format!("reading {} as a wheel (zip)", wheel.display()))?;
    let mut out = WheelContents::default();
    let mut wheel_member = None;
    for name in zip.file_names() {
        let name = name.with_context(|| format!("a member name of {}", wheel.display()))?;
        let name: &str = &name;
        let mut parts = name.splitn(2, '/');
        let (top, rest) = (parts.next().unwrap_or(""), parts.next());
        if top.ends_with(".dist-info") && rest == Some("WHEEL") {
            wheel_member = Some(name.to_string());
        }
        if !name.ends_with(".py") {
            continue;
        }
        let rel = if top.ends_with(".dist-info") {
            continue;
        } else if top.ends_with(".data") {
            match rest.and_then(|r| {
                r.strip_prefix("purelib/")
                    .or_else(|| r.strip_prefix("platlib/"))
            }) {
                Some(r) => r,
                None => continue,
            }
        } else {
            name
        };
        let p = Path::new(rel);
        if rel.is_empty()
            || !p
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            continue;
        }
        out.sources.push(rel.to_string());
    }
    out.sources.sort();
    out.sources.dedup();
    if let Some(m) = wheel_member {
        let mut bytes = Vec::new();
        // A WHEEL file is a few lines: read at most 64 KiB of it.
        let f = zip
            .by_name(&m)
            .with_context(|| format!("reading {m} of {}", wheel.display()))?;
        std::io::Read::read_to_end(&mut std::io::Read::take(f, 64 << 10), &mut bytes)?;
        out.wheel_file = Some((m, bytes));
    }
    Ok(out)
}

/// The cache file of the source `rel` (relative to site-packages) for
/// cache tag `tag` (PEP 3147): `<dir>/__pycache__/<stem>.<tag>.pyc`.
fn pyc_of(rel: &str, tag: &str) -> Option<String> {
    let p = Path::new(rel);
    let stem = p.file_stem()?.to_string_lossy();
    let dir = p
        .parent()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    Some(if dir.is_empty() {
        format!("__pycache__/{stem}.{tag}.pyc")
    } else {
        format!("{dir}/__pycache__/{stem}.{tag}.pyc")
    })
}

/// One wheel installed in a venv: its file and its sha256.
#[derive(Debug, Clone)]
pub struct Wheel {
    /// The wheel file (a wheelhouse artifact or a built wheel).
    pub file: PathBuf,
    /// Its sha256 (checked by uv when it was installed).
    pub sha256: String,
}

/// What [`from_wheels`] did.
#[derive(Debug, Clone, Default)]
pub struct PerWheel {
    /// `.pyc` files hard-linked into the venv from bytecode entries.
    pub linked: usize,
    /// Of the wheels, how many had their entry made now.
    pub entries_made: usize,
    /// `.pyc` files compiled now (into new entries).
    pub compiled: usize,
    /// Sources Python refused (no `.pyc`).
    pub failed: usize,
    /// The bytecode entries used, one per wheel.
    pub entries: Vec<Entry>,
    /// Every source whose bytecode an entry decides (linked or refused):
    /// [`ensure`] leaves them alone.
    pub covered: HashSet<PathBuf>,
    /// sha256 of the `.pyc` files linked, by path relative to the venv.
    pub hashes: HashMap<String, String>,
}

/// Gives the sources of every wheel of `wheels` installed in `venv` (its
/// `lib/*/site-packages`) their bytecode from the store's bytecode entries
/// (`store/pyc/<wheel sha256>-<cache tag>-<magic>`, see
/// [`Interpreter::entry_name`]): an entry the store lacks is made first,
/// compiled by the venv's Python from the installed sources in
/// [`INVALIDATION`] mode, each `.pyc` recording the source's path relative
/// to site-packages (so the bytes depend only on the source and the
/// Python, not on where the venv lies; CPython's `SourceLoader` sets
/// `co_filename` to the importing path), then persisted under the entry's
/// lock and registered in `temp`. Every `.pyc` of the entry whose source
/// is in the venv is then hard-linked next to it. `work` and `log` as in
/// [`ensure`].
///
/// Errors: the venv or a wheel cannot be read; an entry cannot be written;
/// the venv's Python does not run.
pub fn from_wheels(
    store: &Store,
    temp: &TempRoots,
    venv: &Path,
    wheels: &[Wheel],
    work: &Path,
    log: &Path,
) -> Result<PerWheel> {
    let mut out = PerWheel::default();
    let mut sites = Vec::new();
    for e in fs::read_dir(venv.join("lib"))? {
        let site = e?.path().join("site-packages");
        if site.is_dir() {
            sites.push(site);
        }
    }
    let [site] = sites.as_slice() else {
        return Ok(out);
    };
    let python = venv.join("bin/python");
    let interp = Interpreter::of(&python)?;
    // The entries to make, under their locks (taken in name order).
    let mut todo: BTreeMap<String, (Entry, &Wheel, Vec<String>)> = BTreeMap::new();
    for w in wheels {
        // Only a wheel the venv holds (a lock may list one per platform).
        let contents = wheel_contents(&w.file)?;
        let installed = contents
            .wheel_file
            .as_ref()
            .is_some_and(|(path, bytes)| std::fs::read(site.join(path)).is_ok_and(|b| b == *bytes));
        if !installed {
            continue;
        }
        let entry = store.entry(Bucket::Bytecode, &interp.entry_name(&w.sha256));
        temp.add(store, &entry)?;
        if !entry.exists() {
            todo.insert(entry.name.clone(), (entry.clone(), w, contents.sources));
        }
        if !out.entries.contains(&entry) {
            out.entries.push(entry);
        }
    }
    let mut locks = Vec::new();
    let mut making: Vec<(Entry, crate::store::Staging, BytecodeRecord, Vec<String>)> = Vec::new();
    let mut jobs = Vec::new();
    for (entry, w, sources) in todo.values() {
        locks.push(entry.lock()?);
        if entry.exists() {
            continue;
        }
        let staging = store.stage(&format!("pyc-{}", &entry.name[..16.min(entry.name.len())]))?;
        let mut rels = Vec::new();
        for rel in sources.iter().cloned() {
            let (src, Some(pyc)) = (site.join(&rel), pyc_of(&rel, &interp.cache_tag)) else {
                continue;
            };
            if !src.is_file() {
                continue;
            }
            jobs.push(Job {
                src,
                cfile: staging.path().join("entry").join(SITE).join(&pyc),
                dfile: Some(rel.clone()),
            });
            rels.push(rel);
        }
        let rec = BytecodeRecord {
            format: 1,
            wheel_sha256: w.sha256.clone(),
            cache_tag: interp.cache_tag.clone(),
            magic: interp.magic.clone(),
            invalidation: INVALIDATION.to_string(),
            failed: Vec::new(),
        };
        making.push((entry.clone(), staging, rec, rels));
    }
    compile_jobs(
        &python,
        &jobs,
        INVALIDATION,
        &interp.cache_tag,
        &interp.magic,
        work,
        log,
    )?;
    for (entry, staging, mut rec, rels) in making {
        let dir = &staging.path().join("entry");
        fs::create_dir_all(dir.join(SITE))?;
        for rel in &rels {
            let pyc = pyc_of(rel, &interp.cache_tag).unwrap_or_default();
            if dir.join(SITE).join(&pyc).is_file() {
                out.compiled += 1;
            } else {
                rec.failed.push(rel.clone());
            }
        }
        write_json(&dir.join(BYTECODE_JSON), &rec)?;
        Manifest::build(dir, &[crate::store::MANIFEST])?.write(dir)?;
        fs::create_dir_all(store.bucket_dir(Bucket::Bytecode))?;
        store.persist(dir, &entry)?;
        out.entries_made += 1;
    }
    drop(locks);
    // The entries are linked by a few threads (a venv takes thousands of
    // links), then merged in entry order, as one thread would have.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4)
        .min(out.entries.len().max(1));
    let mut linked: Vec<Option<Result<Linked>>> = Vec::new();
    linked.resize_with(out.entries.len(), || None);
    let done = std::sync::Mutex::new(linked);
    std::thread::scope(|s| {
        for worker in 0..threads {
            let (next, done, entries) = (&next, &done, &out.entries);
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(entry) = entries.get(i) else { break };
                    let got = link_entry(entry, site, venv, worker);
                    if let Ok(mut d) = done.lock() {
                        d[i] = Some(got);
                    }
                }
            });
        }
    });
    let done = done
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a thread linking bytecode panicked"))?;
    // A `.pyc` two entries both link (a file two wheels ship) is the later
    // entry's, as when one thread linked them in order: linked again from it.
    let mut linked_once: HashSet<PathBuf> = HashSet::new();
    for (entry, got) in out.entries.iter().zip(done) {
        let got = got.with_context(|| format!("linking the bytecode of {}", entry.label()))??;
        for (from, dest) in &got.links {
            if !linked_once.insert(dest.clone()) {
                link_over(from, dest, "merge")?;
            }
        }
        out.linked += got.sources.len();
        out.covered.extend(got.sources);
        out.hashes.extend(got.hashes);
        for src in got.refused {
            if out.covered.insert(src) {
                out.failed += 1;
            }
        }
    }
    Ok(out)
}

/// Replaces the file `dest` by a hard link to `from`: linked beside it as
/// `<dest>.pyc.oracle-build.<tag>` (`tag`: one per thread that may link at
/// once), then renamed over it.
///
/// Errors: the link or the rename fails (the message names both paths).
fn link_over(from: &Path, dest: &Path, tag: &str) -> Result<()> {
    let tmp = dest.with_extension(format!("pyc.oracle-build.{tag}"));
    let _ = std::fs::remove_file(&tmp);
    std::fs::hard_link(from, &tmp)
        .and_then(|()| std::fs::rename(&tmp, dest))
        .with_context(|| format!("linking {} over {}", from.display(), dest.display()))
}

/// What [`link_entry`] linked from one bytecode entry.
struct Linked {
    /// The sources whose `.pyc` was linked next to them.
    sources: Vec<PathBuf>,
    /// The sources the entry records as refused by Python.
    refused: Vec<PathBuf>,
    /// sha256 of each `.pyc` linked, by path relative to the venv.
    hashes: Vec<(String, String)>,
    /// Each link made: the entry's file and the venv's path.
    links: Vec<(PathBuf, PathBuf)>,
}

/// Hard-links every `.pyc` of the bytecode entry `entry` whose source is in
/// `site` (a venv's site-packages) next to it; returns those sources, the
/// sources the entry records as refused, and the `.pyc` hashes (from the
/// entry's manifest, by path relative to `venv`). `worker` names the
/// temporary file of a replaced `.pyc` (threads link at once).
///
/// Errors: the entry's manifest or record cannot be read; a link fails.
fn link_entry(entry: &Entry, site: &Path, venv: &Path, worker: usize) -> Result<Linked> {
    let rec: BytecodeRecord = crate::store::read_json(&entry.path.join(BYTECODE_JSON))?;
    let manifest = Manifest::read(&entry.path)?;
    let mut out = Linked {
        sources: Vec::new(),
        refused: rec.failed.iter().map(|src| site.join(src)).collect(),
        hashes: Vec::new(),
        links: Vec::new(),
    };
    let prefix = format!("{SITE}/");
    for f in &manifest.files {
        let Some(rel_pyc) = f.path.strip_prefix(&prefix) else {
            continue;
        };
        let Some(src) = source_of(rel_pyc, &rec.cache_tag) else {
            continue;
        };
        let py = site.join(&src);
        if !py.is_file() {
            continue;
        }
        let dest = site.join(rel_pyc);
        if let Some(d) = dest.parent() {
            fs::create_dir_all(d)?;
        }
        let from = entry.path.join(&f.path);
        match std::fs::hard_link(&from, &dest) {
            Ok(()) => {}
            // A `.pyc` the wheel itself ships (numpy 2.1 has one, timestamp
            // based): replaced, as a compile would replace it.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                link_over(&from, &dest, &worker.to_string())?;
            }
            Err(e) => bail!("linking {} into {}: {e}", from.display(), dest.display()),
        }
        out.sources.push(py);
        if let Some(r) = rel(venv, &dest) {
            out.hashes.push((r, f.sha256.clone()));
        }
        out.links.push((from, dest));
    }
    Ok(out)
}

/// The source (relative to site-packages) of the cache file `rel_pyc`
/// (`<dir>/__pycache__/<stem>.<tag>.pyc`), PEP 3147.
fn source_of(rel_pyc: &str, tag: &str) -> Option<String> {
    let p = Path::new(rel_pyc);
    let name = p.file_name()?.to_str()?;
    let stem = name.strip_suffix(&format!(".{tag}.pyc"))?;
    let cache = p.parent()?;
    if cache.file_name()? != "__pycache__" {
        return None;
    }
    let dir = cache.parent()?.to_str()?;
    Some(if dir.is_empty() {
        format!("{stem}.py")
    } else {
        format!("{dir}/{stem}.py")
    })
}

/// Checks the bytecode entry prepared at `dir` (from a cache) for the entry
/// name `name`: its record names the same wheel, cache tag and magic number,
/// in [`INVALIDATION`] mode, and every file under `site/` is a
/// `__pycache__/*.<tag>.pyc` whose 16-byte header (PEP 552) carries that
/// magic number and the checked-hash flags.
///
/// Errors: what does not match, naming the file.
pub fn check_entry(dir: &Path, name: &str) -> Result<()> {
    let rec: BytecodeRecord = crate::store::read_json(&dir.join(BYTECODE_JSON))?;
    let want = Interpreter {
        cache_tag: rec.cache_tag.clone(),
        magic: rec.magic.clone(),
    }
    .entry_name(&rec.wheel_sha256);
    if want != name || rec.invalidation != INVALIDATION {
        bail!(
            "its {BYTECODE_JSON} is for {want} ({}), not {name} ({INVALIDATION})",
            rec.invalidation
        );
    }
    let magic = (0..4)
        .map(|i| u8::from_str_radix(&rec.magic[2 * i..2 * i + 2], 16))
        .collect::<std::result::Result<Vec<u8>, _>>()
        .context("its magic number is not hex")?;
    let manifest = Manifest::read(dir)?;
    let prefix = format!("{SITE}/");
    for f in &manifest.files {
        let Some(rel_pyc) = f.path.strip_prefix(&prefix) else {
            continue;
        };
        if source_of(rel_pyc, &rec.cache_tag).is_none() {
            bail!("{} is not a {} cache file", f.path, rec.cache_tag);
        }
        let mut head = [0u8; 8];
        std::io::Read::read_exact(&mut fs::File::open(dir.join(&f.path))?, &mut head)
            .with_context(|| format!("reading the header of {}", f.path))?;
        // PEP 552: magic, then flags (bit 0: hash-based, bit 1: check_source).
        if head[..4] != magic[..]
            || u32::from_le_bytes([head[4], head[5], head[6], head[7]]) != 0b11
        {
            bail!(
                "{} is not a checked-hash .pyc of magic {}",
                f.path,
                rec.magic
            );
        }
    }
    Ok(())
}

/// Removes the bytecode entries of `store` that hold one of `damaged` (files
/// of a damaged venv, rewritten in place: a `.pyc` hard-linked from an
/// entry shares its bytes) by moving them aside (`Store::quarantine`); the
/// next install makes them again. Returns how many were moved aside.
///
/// Errors: an entry cannot be read or moved aside.
pub fn evict_entries(store: &Store, damaged: &[PathBuf]) -> Result<usize> {
    let inodes: HashSet<(u64, u64)> = damaged
        .iter()
        .filter_map(|p| std::fs::symlink_metadata(p).ok())
        .filter(|m| m.is_file() && m.nlink() > 1)
        .map(|m| (m.dev(), m.ino()))
        .collect();
    if inodes.is_empty() {
        return Ok(0);
    }
    let mut moved = 0;
    for entry in store.entries(Bucket::Bytecode)? {
        let Ok(m) = Manifest::read(&entry.path) else {
            continue;
        };
        let hit = m.files.iter().any(|f| {
            std::fs::metadata(entry.path.join(&f.path))
                .is_ok_and(|x| inodes.contains(&(x.dev(), x.ino())))
        });
        if hit {
            let _lock = entry.lock()?;
            if entry.exists() {
                store.quarantine(&entry, &["holds a file of a damaged venv".to_string()])?;
                moved += 1;
            }
        }
    }
    Ok(moved)
}

/// Removes from the bytecode pool at `pool` (every cache tag's directory)
/// the files that `damaged` (files of a damaged venv, rewritten in place)
/// may have spoiled: a `.pyc` that *is* a damaged file (the same device and
/// inode: a venv's `.pyc` hard-linked from the pool shares its bytes, and
/// the pool's recorded sha256 would vouch for them), and every `.pyc`
/// compiled from a damaged source (its key starts with the source's device
/// and inode, whatever mtime and size it was keyed with). Each goes with its
/// `<key>.sha256`, the `.pyc` first (its link is the entry's commit point,
/// see [`ensure`]). The next [`ensure`] compiles those sources again.
/// Paths of `damaged` that are no regular file now are skipped.
///
/// Returns how many `.pyc` files were removed.
///
/// Errors: the pool cannot be read or a file of it cannot be removed.
pub fn evict(pool: &Path, damaged: &[PathBuf]) -> Result<usize> {
    use std::collections::HashSet;
    let mut inodes: HashSet<(u64, u64)> = HashSet::new();
    let mut prefixes: Vec<String> = Vec::new();
    for p in damaged {
        if let Ok(m) = std::fs::symlink_metadata(p)
            && m.is_file()
        {
            inodes.insert((m.dev(), m.ino()));
            prefixes.push(format!("{:x}-{:x}-", m.dev(), m.ino()));
        }
    }
    if inodes.is_empty() || !pool.is_dir() {
        return Ok(0);
    }
    let mut removed = 0;
    for tag in fs::read_dir(pool)? {
        let tag = tag?;
        if !tag.file_type()?.is_dir() {
            continue;
        }
        for e in fs::read_dir(tag.path())? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".pyc") {
                continue;
            }
            let spoiled = prefixes.iter().any(|p| name.starts_with(p.as_str()))
                || e.metadata()
                    .is_ok_and(|m| inodes.contains(&(m.dev(), m.ino())));
            if !spoiled {
                continue;
            }
            let path = e.path();
            match std::fs::remove_file(&path) {
                Ok(()) => removed += 1,
                // Removed by a concurrent eviction.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => bail!("removing {} from the bytecode pool: {e}", path.display()),
            }
            match std::fs::remove_file(path.with_extension("sha256")) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    bail!(
                        "removing {} from the bytecode pool: {e}",
                        path.with_extension("sha256").display()
                    )
                }
                _ => {}
            }
        }
    }
    Ok(removed)
}

/// The pool file name of a source: `<dev>-<ino>-<mtime ns>-<size>.pyc`.
fn pool_key(meta: &std::fs::Metadata) -> String {
    let mtime = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
    format!(
        "{:x}-{:x}-{mtime}-{}.pyc",
        meta.dev(),
        meta.ino(),
        meta.size()
    )
}

fn rel(base: &Path, path: &Path) -> Option<String> {
    Some(path.strip_prefix(base).ok()?.to_string_lossy().into_owned())
}

/// Every regular `.py` file under `dir` (not under `__pycache__`), with its metadata.
fn collect_py(dir: &Path, out: &mut Vec<(PathBuf, std::fs::Metadata)>) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let ft = e.file_type()?;
        let path = e.path();
        if ft.is_dir() {
            if e.file_name() != "__pycache__" {
                collect_py(&path, out)?;
            }
        } else if ft.is_file() && path.extension().is_some_and(|x| x == "py") {
            let meta = fs::metadata(&path)?;
            out.push((path, meta));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(implementation: &str, version: &str) -> Python {
        Python {
            path: PathBuf::from("/usr/bin/python3"),
            version: version.into(),
            implementation: implementation.into(),
            platform: "linux-x86_64".into(),
        }
    }

    #[test]
    fn evict_removes_a_damaged_pyc_and_the_bytecode_of_a_damaged_source() {
        let tmp = tempfile::tempdir().unwrap();
        let (pool, venv, cache) = (
            tmp.path().join("pool"),
            tmp.path().join("venv"),
            tmp.path().join("cache"),
        );
        let tag = pool.join("cpython-311");
        for d in [&tag, &venv.join("__pycache__"), &cache] {
            std::fs::create_dir_all(d).unwrap();
        }
        // A source shared with the uv cache, its `.pyc` in the pool.
        let (cached, a) = (cache.join("a.py"), venv.join("a.py"));
        std::fs::write(&cached, "a = 1\n").unwrap();
        std::fs::hard_link(&cached, &a).unwrap();
        let pooled = |src: &Path| tag.join(pool_key(&std::fs::metadata(src).unwrap()));
        // Keyed with the mtime a had when it was compiled (an older one).
        let am = std::fs::metadata(&a).unwrap();
        let a_pool = tag.join(format!("{:x}-{:x}-1-6.pyc", am.dev(), am.ino()));
        let (b_src, c_src) = (cache.join("b.py"), cache.join("c.py"));
        std::fs::write(&b_src, "b = 2\n").unwrap();
        std::fs::write(&c_src, "c = 3\n").unwrap();
        let (b_pool, c_pool) = (pooled(&b_src), pooled(&c_src));
        for p in [&a_pool, &b_pool, &c_pool] {
            std::fs::write(p, b"pyc").unwrap();
            std::fs::write(p.with_extension("sha256"), "0".repeat(64)).unwrap();
        }
        // The venv's `.pyc` of b is the pool's file (hard link).
        let b_pyc = venv.join("__pycache__/b.cpython-311.pyc");
        std::fs::hard_link(&b_pool, &b_pyc).unwrap();

        // Damaged: the source a (rewritten in place) and b's `.pyc`.
        std::fs::write(&a, "a = 9\n").unwrap();
        let n = evict(&pool, &[a.clone(), b_pyc.clone(), venv.join("gone.py")]).unwrap();
        assert_eq!(n, 2);
        for p in [&a_pool, &b_pool] {
            assert!(
                !p.exists() && !p.with_extension("sha256").exists(),
                "{}",
                p.display()
            );
        }
        assert!(c_pool.exists() && c_pool.with_extension("sha256").exists());
        // Nothing damaged, or no pool: nothing removed.
        assert_eq!(evict(&pool, &[]).unwrap(), 0);
        assert_eq!(evict(&tmp.path().join("none"), &[a]).unwrap(), 0);
    }

    #[test]
    fn cache_files_and_sources_map_both_ways() {
        for (src, pyc) in [
            ("a.py", "__pycache__/a.cpython-311.pyc"),
            ("pkg/sub/m.py", "pkg/sub/__pycache__/m.cpython-311.pyc"),
        ] {
            assert_eq!(pyc_of(src, "cpython-311").as_deref(), Some(pyc));
            assert_eq!(source_of(pyc, "cpython-311").as_deref(), Some(src));
        }
        assert_eq!(source_of("pkg/m.cpython-311.pyc", "cpython-311"), None);
        assert_eq!(
            source_of("pkg/__pycache__/m.cpython-312.pyc", "cpython-311"),
            None
        );
    }

    #[test]
    fn a_cached_entry_is_refused_unless_every_pyc_is_checked_hash_of_its_magic() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("e");
        let pyc = dir.join(SITE).join("pkg/__pycache__/m.cpython-311.pyc");
        std::fs::create_dir_all(pyc.parent().unwrap()).unwrap();
        let rec = BytecodeRecord {
            format: 1,
            wheel_sha256: "ab".repeat(32),
            cache_tag: "cpython-311".into(),
            magic: "a70d0d0a".into(),
            invalidation: INVALIDATION.into(),
            failed: Vec::new(),
        };
        write_json(&dir.join(BYTECODE_JSON), &rec).unwrap();
        let name = format!("{}-cpython-311-a70d0d0a", "ab".repeat(32));
        let write = |flags: u32| {
            let mut b = vec![0xa7, 0x0d, 0x0d, 0x0a];
            b.extend_from_slice(&flags.to_le_bytes());
            b.extend_from_slice(&[0u8; 16]);
            std::fs::write(&pyc, b).unwrap();
            Manifest::build(&dir, &[crate::store::MANIFEST])
                .unwrap()
                .write(&dir)
                .unwrap();
        };
        write(0b11);
        check_entry(&dir, &name).unwrap();
        // Another entry's name, a timestamp .pyc, an unchecked-hash one.
        assert!(check_entry(&dir, &format!("{}-cpython-311-a70d0d0a", "cd".repeat(32))).is_err());
        for flags in [0, 0b01] {
            write(flags);
            let e = check_entry(&dir, &name).unwrap_err();
            assert!(format!("{e:#}").contains("m.cpython-311.pyc"), "{e:#}");
        }
    }

    #[test]
    fn cache_tag_of_cpython_only() {
        assert_eq!(
            cache_tag(&py("cpython", "3.11.9")).as_deref(),
            Some("cpython-311")
        );
        assert_eq!(
            cache_tag(&py("cpython", "3.12.1")).as_deref(),
            Some("cpython-312")
        );
        assert_eq!(cache_tag(&py("pypy", "3.10.14")), None);
        assert_eq!(cache_tag(&py("cpython", "x")), None);
    }
}
