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

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use fs_err as fs;

use crate::host::process::run_logged;
use crate::host::toolchain::Python;
use crate::progress::Progress;
use crate::store::{sha256_file, write_atomic};

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

/// Compiles the sources listed in argv[1] (NUL-separated paths) to their
/// PEP 3147 cache files, after checking that the cache tag is argv[2].
const COMPILE: &str = r#"
import os, py_compile, sys, importlib.util
if sys.implementation.cache_tag != sys.argv[2]:
    print("cache tag is %s, expected %s" % (sys.implementation.cache_tag, sys.argv[2]))
    sys.exit(3)
mode = py_compile.PycInvalidationMode.TIMESTAMP
ok = bad = 0
with open(sys.argv[1], "rb") as f:
    names = [os.fsdecode(n) for n in f.read().split(b"\0") if n]
for src in names:
    try:
        py_compile.compile(src, cfile=importlib.util.cache_from_source(src), doraise=True, invalidation_mode=mode)
        ok += 1
    except Exception as e:
        bad += 1
        print("not compiled: %s: %s" % (src, str(e).splitlines()[0] if str(e) else type(e).__name__))
print("compiled %d, failed %d" % (ok, bad))
"#;

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
    // One compiler per CPU (at least 64 sources each), as `compileall -j`
    // and uv do: a vLLM venv compiles about 13,000 sources.
    let workers = crate::host::toolchain::cpu_count()
        .min(todo.len().div_ceil(64))
        .max(1);
    let chunk = todo.len().div_ceil(workers);
    let mut jobs = Vec::new();
    for (i, part) in todo.chunks(chunk).enumerate() {
        let list = work.join(format!("bytecode-sources.{i}"));
        let mut bytes = Vec::new();
        for s in part {
            use std::os::unix::ffi::OsStrExt;
            bytes.extend_from_slice(s.py.as_os_str().as_bytes());
            bytes.push(0);
        }
        fs::write(&list, bytes)?;
        jobs.push((list, work.join(format!("bytecode-log.{i}"))));
    }
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(list, part_log)| {
                let expr = duct::cmd(
                    venv.join("bin/python"),
                    [
                        "-I".into(),
                        "-c".into(),
                        COMPILE.to_string(),
                        list.display().to_string(),
                        tag.clone(),
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
    for (_, part_log) in &jobs {
        if let Ok(text) = std::fs::read(part_log) {
            std::io::Write::write_all(&mut all, &text)?;
        }
    }
    for r in results {
        r.with_context(|| format!("compiling the venv's bytecode (log: {})", log.display()))?;
    }
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
