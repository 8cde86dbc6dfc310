//! A restored oracle holds complete bytecode, shared through the store's
//! pool: importing every module compiles nothing, tracebacks name the
//! restored venv's own paths, and `verify --deep` still sees a changed file.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use crate::support::*;

/// Imports every module under site-packages with `source_to_code` (called
/// by CPython's SourceFileLoader only when no valid `.pyc` is found) wrapped
/// to record what it compiles; prints the compiled site-packages paths, one
/// a line, after a line `imported <n>`.
const IMPORT_ALL: &str = r#"
import importlib, importlib._bootstrap_external as be, os, sys, sysconfig
assert not sys.flags.dont_write_bytecode
compiled = []
orig = be.SourceLoader.source_to_code
def spy(self, data, path, *a, **k):
    compiled.append(path)
    return orig(self, data, path, *a, **k)
be.SourceLoader.source_to_code = spy
site = sysconfig.get_paths()["purelib"]
n = 0
for d, dirs, files in os.walk(site):
    dirs[:] = [x for x in dirs if x != "__pycache__" and not x.endswith(".dist-info")]
    for f in files:
        if not f.endswith(".py") or f == "__main__.py":
            continue
        rel = os.path.relpath(os.path.join(d, f), site)[:-3].replace(os.sep, ".")
        if rel.endswith(".__init__"):
            rel = rel[: -len(".__init__")]
        if "-" in rel:
            continue
        try:
            importlib.import_module(rel)
            n += 1
        except BaseException:
            pass
print("imported", n)
for p in compiled:
    if p.startswith(site):
        print(p)
"#;

fn py_files(site: &Path) -> Vec<PathBuf> {
    tree(site)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "py"))
        .collect()
}

#[test]
fn a_restored_oracle_imports_everything_without_compiling_and_tracebacks_name_its_own_paths() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    // Built, not smoked: not gateable (exit 4).
    let first = json(&fx.exits(&["build", r, "--no-smoke", "--json"], 4));
    let venv = PathBuf::from(first["oracle"].as_str().unwrap());

    // Restore: the venv entry deleted, rebuilt from the store offline.
    force_remove(&venv);
    let restore_start = SystemTime::now();
    let out = fx.exits(&["build", r, "--no-smoke", "--offline", "--json"], 4);
    assert!(
        text(&out).contains("linked from the store's pool"),
        "{}",
        text(&out)
    );
    let again = json(&out);
    assert_eq!(again["oracle"], first["oracle"]);
    assert!(
        again["built"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b == "venv"),
        "{again}"
    );

    // Every source has its .pyc for this Python, hard-linked from the pool.
    let site = venv.join("lib/python3.11/site-packages");
    // The pool, and the per-wheel bytecode entries (store/pyc).
    let pool = fx.store().join("bytecode/cpython-311");
    let mut pool_inodes: std::collections::HashSet<u64> = std::fs::read_dir(&pool)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().ino())
        .collect();
    pool_inodes.extend(
        tree(&fx.store().join("store/pyc"))
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().ino()),
    );
    let sources = py_files(&site);
    assert!(sources.len() > 20, "{sources:?}");
    let mut missing = Vec::new();
    let mut pooled = 0;
    for py in &sources {
        let pyc = py.parent().unwrap().join("__pycache__").join(format!(
            "{}.cpython-311.pyc",
            py.file_stem().unwrap().to_string_lossy()
        ));
        match std::fs::metadata(&pyc) {
            Ok(m) => {
                if pool_inodes.contains(&m.ino()) {
                    pooled += 1;
                }
            }
            Err(_) => missing.push(pyc),
        }
    }
    assert!(missing.is_empty(), "no .pyc for: {missing:?}");
    assert!(
        pooled * 10 >= sources.len() * 9,
        "{pooled} of {} .pyc files come from the pool",
        sources.len()
    );

    // Import every module: the venv is read-only, bytecode writing is on,
    // and no module is compiled from source.
    let meta = std::fs::metadata(&site).unwrap();
    assert_eq!(meta.mode() & 0o222, 0, "the restored venv is read-only");
    let run = Command::new(venv.join("bin/python"))
        .args(["-c", IMPORT_ALL])
        .env_remove("PYTHONDONTWRITEBYTECODE")
        .env_remove("PYTHONPYCACHEPREFIX")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(run.status.success(), "{}", text(&run));
    let mut lines = stdout.lines();
    let imported: usize = lines
        .next()
        .and_then(|l| l.strip_prefix("imported "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(imported > 20, "{stdout}");
    let compiled: Vec<&str> = lines.collect();
    assert!(compiled.is_empty(), "compiled at import: {compiled:?}");
    // ...and no .pyc is newer than the restore.
    let newer: Vec<PathBuf> = tree(&site)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "pyc"))
        .filter(|p| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > restore_start)
        })
        .collect();
    assert!(newer.is_empty(), "written since the restore: {newer:?}");

    // A traceback from a pooled module names this venv's own path.
    let tb = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import packaging.version as v\nv.Version('not a version')",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&tb.stderr).to_string();
    assert!(!tb.status.success(), "{err}");
    let frames: Vec<&str> = err
        .lines()
        .filter(|l| l.trim_start().starts_with("File \"") && l.contains("packaging"))
        .collect();
    assert!(!frames.is_empty(), "{err}");
    let own = format!("File \"{}", site.join("packaging").display());
    for f in &frames {
        assert!(
            f.trim_start().starts_with(&own),
            "frame {f} is not under {own}:\n{err}"
        );
    }

    // verify --deep still finds a changed file (same size, other bytes).
    let version_py = site.join("packaging/version.py");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&version_py, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&version_py).unwrap();
    let last = bytes.len() - 1;
    bytes[last] = if bytes[last] == b'\n' { b' ' } else { b'\n' };
    // Write a new file (not in place) so the shared uv cache file stays intact.
    let parent = version_py.parent().unwrap();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_file(&version_py).unwrap();
    std::fs::write(&version_py, &bytes).unwrap();
    let v = fx.run(&["verify", r, "--deep"]);
    assert_eq!(code(&v), 3, "{}", text(&v));
    assert!(text(&v).contains("packaging/version.py"), "{}", text(&v));
}

/// Rewrites the file at `path` in place (same inode, same size): one byte
/// changed, the file opened for writing without being replaced. Returns the
/// bytes it held before.
fn rewrite_in_place(path: &Path) -> Vec<u8> {
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::PermissionsExt;
    let before = std::fs::read(path).unwrap();
    let ino = std::fs::metadata(path).unwrap().ino();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let at = before.len() / 2;
    f.seek(SeekFrom::Start(at as u64)).unwrap();
    f.write_all(&[if before[at] == b'#' { b'%' } else { b'#' }])
        .unwrap();
    drop(f);
    let after = std::fs::metadata(path).unwrap();
    assert_eq!(after.ino(), ino, "rewritten in place");
    assert_eq!(after.len(), before.len() as u64, "same size");
    assert_ne!(std::fs::read(path).unwrap(), before);
    before
}

#[test]
fn a_file_rewritten_in_place_is_not_linked_again_into_the_rebuilt_oracle() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let first = json(&fx.exits(&["build", r, "--no-smoke", "--json"], 4));
    let venv = PathBuf::from(first["oracle"].as_str().unwrap());
    let site = venv.join("lib/python3.11/site-packages");

    // A dependency's source, hard-linked from the store's uv cache, and
    // another one's `.pyc`, hard-linked from the store's bytecode pool, both
    // rewritten in place: the uv cache's and the pool's copies change with them.
    let py = site.join("packaging/version.py");
    let pyc = site.join("idna/__pycache__/core.cpython-311.pyc");
    let pyc_src = site.join("idna/core.py");
    let pyc_src_ino = std::fs::metadata(&pyc_src).unwrap().ino();
    for f in [&py, &pyc] {
        assert!(
            std::fs::metadata(f).unwrap().nlink() > 1,
            "{} is shared",
            f.display()
        );
    }
    let py_bytes = rewrite_in_place(&py);
    rewrite_in_place(&pyc);
    let (py_ino, pyc_ino) = (
        std::fs::metadata(&py).unwrap().ino(),
        std::fs::metadata(&pyc).unwrap().ino(),
    );
    // Their directories are untouched: the entry's stamps (each file's
    // size and mtime) show the change, to `verify` without `--deep` and to
    // the next build.
    let v = fx.run(&["verify", r]);
    assert_eq!(code(&v), 3, "{}", text(&v));
    for f in [&py, &pyc] {
        let rel = f.strip_prefix(&venv).unwrap().display().to_string();
        assert!(
            text(&v).contains(&format!("changed content: {rel}")),
            "{}",
            text(&v)
        );
    }

    let out = fx.exits(&["build", r, "--no-smoke", "--json"], 4);
    let t = text(&out);
    assert!(t.contains("is damaged ("), "{t}");
    assert!(
        json(&out)["built"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b == "venv"),
        "{t}"
    );
    assert_eq!(json(&out)["oracle"], first["oracle"]);

    // The rebuilt oracle holds the wheel's bytes, in files of their own.
    assert!(
        std::fs::read(&py).unwrap() == py_bytes,
        "the rebuilt {} holds the damaged bytes, not the wheel's:\n{t}",
        py.display()
    );
    assert_ne!(std::fs::metadata(&py).unwrap().ino(), py_ino);
    assert_ne!(std::fs::metadata(&pyc).unwrap().ino(), pyc_ino);
    // idna's source is the uv cache's same file as before: only the
    // eviction of its bytecode entry keeps the damaged `.pyc` out.
    assert_eq!(std::fs::metadata(&pyc_src).unwrap().ino(), pyc_src_ino);
    // Not its length: marshal's output can differ by a byte between two
    // compiles of one source (its back-references follow reference counts),
    // so the check below compares the code itself.
    assert!(!std::fs::read(&pyc).unwrap().is_empty());
    // The .pyc was compiled again: it is what Python compiles from the source.
    let check = Command::new(venv.join("bin/python"))
        .args([
            "-I",
            "-c",
            "import importlib.util as u, sys, marshal, pathlib\n\
             src = pathlib.Path(sys.argv[1])\n\
             data = pathlib.Path(sys.argv[2]).read_bytes()\n\
             code = compile(src.read_bytes(), str(src), 'exec')\n\
             assert marshal.loads(data[16:]).co_code == code.co_code, 'stale pyc'\n",
        ])
        .arg(&pyc_src)
        .arg(&pyc)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check));
    let v = fx.run(&["verify", r, "--deep"]);
    assert_eq!(code(&v), 0, "{}", text(&v));
    // stderr said what was evicted: packaging's unpacked wheel, and idna's
    // bytecode entry, which held the damaged `.pyc` (version.py's `.pyc`
    // is checked-hash, valid for the wheel's source, and stays).
    assert!(
        t.contains("2 damaged file(s) share their inode with the store's caches; evicted packaging from uv's cache and 0 file(s) from the bytecode pool and 1 bytecode entry(ies)"),
        "{t}"
    );
}

#[test]
fn a_rewrite_that_restores_size_and_time_is_found_by_doctor_and_its_fix_rebuilds_from_clean_copies()
{
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let first = json(&fx.exits(&["build", r, "--no-smoke", "--json"], 4));
    let venv = PathBuf::from(first["oracle"].as_str().unwrap());
    let py = venv.join("lib/python3.11/site-packages/packaging/version.py");
    assert!(
        std::fs::metadata(&py).unwrap().nlink() > 1,
        "shared with uv's cache"
    );

    // Rewritten in place, then its mode and modification time put back: the
    // stamps (size, time) cannot see it, only hashing can.
    let meta = std::fs::metadata(&py).unwrap();
    let wheel_bytes = rewrite_in_place(&py);
    std::fs::File::options()
        .write(true)
        .open(&py)
        .unwrap()
        .set_modified(meta.modified().unwrap())
        .unwrap();
    std::fs::set_permissions(&py, meta.permissions()).unwrap();
    let quick = fx.exits(&["build", r, "--no-smoke", "--json"], 4);
    assert!(
        !json(&quick)["built"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b == "venv"),
        "the quick check is by stamps: {}",
        text(&quick)
    );

    // doctor hashes every file, names the damage and a fix that does not
    // relink the damaged copy kept in uv's cache.
    let out = fx.exits(&["doctor", "--json"], 1);
    let fixes: Vec<String> = json(&out)["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "files-missing")
        .map(|p| p["fix"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(fixes.len(), 1, "{}", text(&out));
    let cmd_line = fixes[0].split('`').nth(1).unwrap().to_string();
    assert!(cmd_line.contains(" --deep"), "{}", fixes[0]);
    // Run as printed: it names its store (`--store`).
    let args: Vec<&str> = cmd_line.split(' ').skip(1).collect();
    assert_eq!(args[0], "build", "{cmd_line}");
    assert!(args.contains(&"--store"), "{cmd_line}");
    let fixed = crate::support::cmd(fx.dir())
        .args(&args)
        .args(["--no-smoke", "--json"])
        .output()
        .expect("oracle-build runs");
    assert_eq!(code(&fixed), 4, "{}", text(&fixed));
    let t = text(&fixed);
    assert!(t.contains("is damaged (changed content: "), "{t}");
    assert!(t.contains("evicted packaging from uv's cache"), "{t}");
    assert!(
        std::fs::read(&py).unwrap() == wheel_bytes,
        "the rebuilt oracle holds the wheel's bytes:\n{t}"
    );
    let v = fx.run(&["verify", r, "--deep"]);
    assert_eq!(code(&v), 0, "{}", text(&v));
    fx.exits(&["doctor"], 0);
}
