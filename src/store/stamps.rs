//! Stamps: the no-op's record of an entry's files, beside its manifest.
//!
//! `manifest.json` says what every file of an entry is (size, sha256);
//! proving that reads every byte (`verify --deep`), and even reading the
//! manifest is a 22 MB parse at 100,000 files. The no-op needs something far
//! cheaper that still notices any change, so every venv entry also holds
//! `manifest.stamps`, taken right after its manifest was written:
//!
//! - every directory's modification time: adding, removing or renaming
//!   anything in a directory changes it (the top directory's own time is not
//!   kept, since replacing the record renames into it; its names are compared
//!   instead);
//! - every file's size and modification time: a write in place (same inode,
//!   e.g. `echo >> f`) changes it, though its directory's time stays;
//! - every name's kind (file, directory, symlink), and the sha256 of the
//!   entry's records (`oracle.json`), which are hashed on every check;
//! - every directory's names: listed on every check and compared with the
//!   stamped ones, so a name added with its directory's time restored
//!   (`touch -r`), which no `stat` sees, is a change.
//!
//! Checking is one `fstatat` per name relative to its directory's open
//! descriptor, and one listing of that descriptor, spread over threads ([`Stamps::changes`]). A stamp that
//! differs is not a verdict: the caller checks the paths it names against the
//! manifest, so a `touch` costs a hash, never a rebuild.
//!
//! The file is a small binary format (below), so reading it costs no parse of
//! the per-file JSON. A file that cannot be read as stamps is treated as
//! absent and the caller falls back to the manifest.
//!
//! ```text
//! "oracle-build stamps 1\n"
//! u32 number of directories, then per directory:
//!   str path (relative; "" for the top), i64 mtime_ns, u32 number of names, then per name:
//!     u8 kind ('f', 'd', 'l'), str name, u64 size, i64 mtime_ns, u8 has_sha256 [32 bytes]
//! str: u32 length + UTF-8 bytes; integers little-endian
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, bail};
use fs_err as fs;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::fsutil::write_atomic;
use super::manifest::{MANIFEST, Manifest, RECORDS, STAMPS};

const MAGIC: &[u8] = b"oracle-build stamps 1\n";

/// What kind of thing a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Link,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::File => b'f',
            Kind::Dir => b'd',
            Kind::Link => b'l',
        }
    }

    fn from_byte(b: u8) -> Option<Kind> {
        match b {
            b'f' => Some(Kind::File),
            b'd' => Some(Kind::Dir),
            b'l' => Some(Kind::Link),
            _ => None,
        }
    }

    fn of(ft: FileType) -> Option<Kind> {
        match ft {
            FileType::RegularFile => Some(Kind::File),
            FileType::Directory => Some(Kind::Dir),
            FileType::Symlink => Some(Kind::Link),
            _ => None,
        }
    }
}

/// One name of a directory and what it was, read from the stamps' bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stamp<'a> {
    name: &'a str,
    kind: Kind,
    /// Size in bytes (files; 0 otherwise).
    size: u64,
    /// Modification time in ns (files and symlinks; 0 for a directory,
    /// whose own time is kept with its own names).
    mtime_ns: i64,
    /// The manifest's sha256 of a record (see [`RECORDS`]).
    sha256: Option<&'a [u8]>,
}

/// Where one directory's stamps are in [`Stamps::bytes`].
#[derive(Debug, Clone, PartialEq)]
struct DirAt {
    /// Relative to the entry; "" for the top.
    path: String,
    /// Modification time in ns (not compared for the top).
    mtime_ns: i64,
    /// Offset of its first name, and how many there are.
    names_at: usize,
    count: usize,
}

/// The stamps of one entry (see the module docs): the file's bytes, and
/// where each directory's names start in them, so that checking allocates
/// nothing per name.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamps {
    bytes: Vec<u8>,
    /// The top first, then every directory of the manifest.
    dirs: Vec<DirAt>,
}

/// A path's kind, size and modification time as `fstatat` gives them.
struct Meta {
    kind: Option<Kind>,
    size: u64,
    mtime_ns: i64,
}

#[allow(clippy::unnecessary_cast)] // the field types differ between targets
fn meta(st: &rustix::fs::Stat) -> Meta {
    Meta {
        kind: Kind::of(FileType::from_raw_mode(st.st_mode as _)),
        size: st.st_size as u64,
        mtime_ns: (st.st_mtime as i64)
            .saturating_mul(1_000_000_000)
            .saturating_add(st.st_mtime_nsec as i64),
    }
}

fn open_dir(path: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// The checks and the write of a [`Manifest`] that use its entry's stamps.
impl Manifest {
    /// The no-op's check of the entry at `dir`, which reads the manifest
    /// only when something changed. With stamps ([`Stamps`], written by
    /// [`Manifest::write_stamped`]): every directory's time and every file's
    /// size and time are compared with one `fstatat` each, and the records
    /// (`oracle.json`) hashed; when all match the entry is intact. When a
    /// stamp differs (a file rewritten in place, added, removed, replaced, a
    /// directory's time), the manifest is read and the whole entry checked
    /// as [`Manifest::check`] does, hashing every file the stamps name and
    /// every file directly in a changed directory: a `touch` costs those
    /// hashes, never a rebuild. Entries without stamps get
    /// [`Manifest::check_dirs`]. Empty means intact.
    pub fn check_quick(dir: &Path) -> Vec<String> {
        let changes = match Stamps::read(dir) {
            Ok(stamps) => stamps.changes(dir),
            Err(_) => {
                return Manifest::read(dir)
                    .map_or_else(|e| vec![format!("{e:#}")], |m| m.check_dirs(dir));
            }
        };
        if changes.is_empty() {
            return Vec::new();
        }
        match Manifest::read(dir) {
            Ok(m) => m.check_changed(dir, &changes.iter().map(String::as_str).collect()),
            Err(e) => vec![format!("{e:#}")],
        }
    }

    /// [`Manifest::check`] with sizes (what `verify` without `--deep` does),
    /// and the sha256 of every file directly in a directory whose
    /// modification time differs from [`Manifest::dirs`] and of every file
    /// the entry's stamps name as changed: a file replaced by one of the
    /// same size, or rewritten in place, is found without hashing the whole entry.
    pub fn check_sizes(&self, dir: &Path) -> Vec<String> {
        let stamped = Stamps::read(dir)
            .map(|s| s.changes(dir))
            .unwrap_or_default();
        let mut changed = self.changed_dirs(dir);
        changed.extend(stamped.iter().map(String::as_str));
        self.check_changed(dir, &changed)
    }

    /// Writes the manifest to `<dir>/manifest.json`, then the stamps of the
    /// entry's files as they are now to `<dir>/manifest.stamps` (see
    /// [`Stamps`]), for the no-op's [`Manifest::check_quick`].
    ///
    /// Errors: either file cannot be written; a listed path cannot be stat'ed.
    pub fn write_stamped(&self, dir: &Path) -> Result<()> {
        self.write(dir)?;
        Stamps::take(dir, self)?.write(dir)
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

impl Stamps {
    /// Stamps every file, symlink and directory `manifest` lists for the
    /// entry at `dir`, as they are now (call it right after writing the
    /// manifest).
    ///
    /// Errors: a listed path cannot be stat'ed, or is not a file, directory
    /// or symlink; a record's sha256 in the manifest is not one.
    pub fn take(dir: &Path, manifest: &Manifest) -> Result<Stamps> {
        struct Name<'m> {
            name: &'m str,
            kind: Kind,
            meta: Meta,
            sha256: Option<Vec<u8>>,
        }
        let mut by_dir: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        by_dir.insert("", Vec::new());
        for d in &manifest.dirs {
            by_dir.entry(d.path.as_str()).or_default();
        }
        let records: HashMap<&str, &str> = manifest
            .files
            .iter()
            .filter(|f| RECORDS.contains(&f.path.as_str()))
            .map(|f| (f.path.as_str(), f.sha256.as_str()))
            .collect();
        let listed = manifest
            .files
            .iter()
            .map(|f| f.path.as_str())
            .chain(manifest.symlinks.iter().map(|(p, _)| p.as_str()))
            .chain(manifest.dirs.iter().map(|d| d.path.as_str()));
        for path in listed {
            let parent = path.rsplit_once('/').map_or("", |(parent, _)| parent);
            by_dir.entry(parent).or_default().push(path);
        }
        // Each name stat'ed relative to its directory's descriptor, as
        // `changes` will (no path walk per file).
        let mut stamped: Vec<(&str, i64, Vec<Name<'_>>)> = Vec::with_capacity(by_dir.len());
        for (path, members) in by_dir {
            let at = dir.join(path);
            let fd = open_dir(&at).with_context(|| format!("opening {}", at.display()))?;
            let mtime_ns = if path.is_empty() {
                0
            } else {
                meta(&rustix::fs::fstat(&fd).with_context(|| format!("stat {}", at.display()))?)
                    .mtime_ns
            };
            let mut names = Vec::with_capacity(members.len());
            for rel in members {
                let name = rel.rsplit_once('/').map_or(rel, |(_, n)| n);
                let st = rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW)
                    .with_context(|| format!("stat {}", dir.join(rel).display()))?;
                let meta = meta(&st);
                let Some(kind) = meta.kind else {
                    bail!(
                        "{} is not a file, directory or symlink",
                        dir.join(rel).display()
                    );
                };
                let sha256 =
                    match records.get(rel) {
                        Some(h) => {
                            Some(hex::decode(h).ok().filter(|v| v.len() == 32).with_context(
                                || format!("the manifest's sha256 of {rel} is not one"),
                            )?)
                        }
                        None => None,
                    };
                names.push(Name {
                    name,
                    kind,
                    meta,
                    sha256,
                });
            }
            stamped.push((path, mtime_ns, names));
        }
        let mut out = Vec::with_capacity(
            MAGIC.len()
                + stamped
                    .iter()
                    .map(|(_, _, n)| 64 + 40 * n.len())
                    .sum::<usize>(),
        );
        out.extend_from_slice(MAGIC);
        put_u32(&mut out, stamped.len());
        for (path, mtime_ns, mut names) in stamped {
            names.sort_by(|a, b| a.name.cmp(b.name));
            put_str(&mut out, path);
            out.extend_from_slice(&mtime_ns.to_le_bytes());
            put_u32(&mut out, names.len());
            for n in names {
                out.push(n.kind.byte());
                put_str(&mut out, n.name);
                let size = if n.kind == Kind::File { n.meta.size } else { 0 };
                let mtime = if n.kind == Kind::Dir {
                    0
                } else {
                    n.meta.mtime_ns
                };
                out.extend_from_slice(&size.to_le_bytes());
                out.extend_from_slice(&mtime.to_le_bytes());
                match n.sha256 {
                    Some(h) => {
                        out.push(1);
                        out.extend_from_slice(&h);
                    }
                    None => out.push(0),
                }
            }
        }
        Stamps::parse(out)
    }

    /// Writes the stamps to `<dir>/manifest.stamps`, atomically.
    ///
    /// Errors: the file cannot be written.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_atomic(&dir.join(STAMPS), &self.bytes)
    }

    /// Reads `<dir>/manifest.stamps`.
    ///
    /// Errors: the file is absent or is not stamps (then use the manifest).
    pub fn read(dir: &Path) -> Result<Stamps> {
        let path = dir.join(STAMPS);
        Stamps::parse(fs::read(&path)?)
            .with_context(|| format!("{} is not an oracle-build stamps file", path.display()))
    }

    /// Checks `bytes` against the format (every length in bounds, every
    /// name one path component) and indexes its directories.
    fn parse(bytes: Vec<u8>) -> Result<Stamps> {
        let mut r = Reader {
            bytes: &bytes,
            at: 0,
        };
        if r.take(MAGIC.len())? != MAGIC {
            bail!(
                "it does not start with {:?}",
                String::from_utf8_lossy(MAGIC)
            );
        }
        let n = r.u32()?;
        // Each directory takes at least 16 bytes: a count cannot exceed that.
        let mut dirs = Vec::with_capacity(n.min(bytes.len() / 16));
        for _ in 0..n {
            let path = r.str()?;
            if path.starts_with('/') || path.split('/').any(|c| c == ".." || c == ".") {
                bail!("bad path {path:?}");
            }
            let mtime_ns = r.i64()?;
            let count = r.u32()?;
            let names_at = r.at;
            for _ in 0..count {
                r.stamp()?;
            }
            dirs.push(DirAt {
                path: path.to_string(),
                mtime_ns,
                names_at,
                count,
            });
        }
        if r.at != bytes.len() {
            bail!("trailing bytes");
        }
        Ok(Stamps { bytes, dirs })
    }

    /// The names of `d`, as [`Stamps::parse`] checked them.
    fn names<'s>(&'s self, d: &DirAt) -> impl Iterator<Item = Stamp<'s>> + 's {
        let mut r = Reader {
            bytes: &self.bytes,
            at: d.names_at,
        };
        (0..d.count).map_while(move |_| r.stamp().ok())
    }

    /// The paths (relative to the entry at `dir`) whose stamp differs now:
    /// a directory gone or of another time, a file gone or of another kind,
    /// size or time, a record whose sha256 differs, a symlink at the top
    /// replaced, a name added at the top (other than the manifest and the
    /// stamps). Sorted; empty means nothing changed since [`Stamps::take`].
    pub fn changes(&self, dir: &Path) -> Vec<String> {
        let next = AtomicUsize::new(0);
        let found = Mutex::new(Vec::new());
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 8)
            .min(self.dirs.len().div_ceil(64).max(1));
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(d) = self.dirs.get(i) else { break };
                        self.check_dir(dir, d, &mut mine);
                    }
                    if let Ok(mut all) = found.lock() {
                        all.append(&mut mine);
                    }
                });
            }
        });
        let mut out = found.into_inner().unwrap_or_default();
        out.extend(self.added_at_top(dir));
        out.sort();
        out.dedup();
        out
    }

    /// Checks one directory's stamps, pushing the paths that differ.
    fn check_dir(&self, base: &Path, d: &DirAt, out: &mut Vec<String>) {
        let top = d.path.is_empty();
        let Ok(fd) = open_dir(&base.join(&d.path)) else {
            out.push(d.path.clone());
            return;
        };
        if !top && rustix::fs::fstat(&fd).map(|st| meta(&st).mtime_ns) != Ok(d.mtime_ns) {
            out.push(d.path.clone());
        }
        for s in self.names(d) {
            // Below the top, a symlink or directory removed, added or
            // replaced changes its directory's time, and a directory is
            // checked by its own stamps (opened without following symlinks):
            // only a file can change in place. At the top, whose time is not
            // kept, a symlink is compared by its own time (a replaced one is
            // new) and a directory by its kind.
            if s.kind != Kind::File && !top {
                continue;
            }
            let same = rustix::fs::statat(&fd, s.name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
                let m = meta(&st);
                m.kind == Some(s.kind)
                    && match s.kind {
                        Kind::File => m.size == s.size && m.mtime_ns == s.mtime_ns,
                        Kind::Link => m.mtime_ns == s.mtime_ns,
                        Kind::Dir => true,
                    }
            });
            let same = same
                && s.sha256.is_none_or(|h| {
                    super::sha256_file(&base.join(&d.path).join(s.name))
                        .ok()
                        .is_some_and(|got| hex::decode(got).is_ok_and(|v| v == h))
                });
            if !same {
                out.push(join(&d.path, s.name));
            }
        }
        // Below the top, a name added with the directory's time restored
        // (`touch -r`: a `.pth` in site-packages, which Python runs at every
        // start) changes no stamp: the directory's names are listed (one
        // `getdents` for most directories) and compared with the stamped
        // ones. The top's own names are [`Stamps::added_at_top`]'s.
        if !top {
            out.extend(self.unstamped_names(d, fd));
        }
    }

    /// The names now in the directory `d` (open as `fd`) that its stamps do
    /// not list, as entry paths; `d`'s own path when it cannot be listed or
    /// when a stamped name is gone from it.
    fn unstamped_names(&self, d: &DirAt, fd: OwnedFd) -> Vec<String> {
        let Ok(mut listing) = rustix::fs::Dir::new(fd) else {
            return vec![d.path.clone()];
        };
        let mut now: Vec<Vec<u8>> = Vec::with_capacity(d.count);
        while let Some(e) = listing.read() {
            let Ok(e) = e else {
                return vec![d.path.clone()];
            };
            let name = e.file_name().to_bytes();
            if name != b"." && name != b".." {
                now.push(name.to_vec());
            }
        }
        // Both sorted by bytes (the stamps are written sorted by name, and
        // UTF-8 sorts as its bytes): one merge, no lookup per name.
        now.sort_unstable();
        let mut stamped = self.names(d).map(|s| s.name.as_bytes()).peekable();
        let mut out = Vec::new();
        let mut gone = false;
        for name in &now {
            while stamped.next_if(|s| *s < name.as_slice()).is_some() {
                gone = true;
            }
            if stamped.next_if(|s| *s == name.as_slice()).is_none() {
                out.push(join(&d.path, &String::from_utf8_lossy(name)));
            }
        }
        if stamped.next().is_some() {
            gone = true;
        }
        if out.is_empty() && gone {
            out.push(d.path.clone());
        }
        out
    }

    /// Names at the top of the entry that the stamps do not list.
    fn added_at_top(&self, dir: &Path) -> Vec<String> {
        let Some(top) = self.dirs.iter().find(|d| d.path.is_empty()) else {
            return vec![String::new()];
        };
        let known: HashSet<&str> = self.names(top).map(|s| s.name).collect();
        match std::fs::read_dir(dir) {
            Ok(rd) => rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !known.contains(n.as_str()) && n != MANIFEST && n != STAMPS)
                .collect(),
            Err(_) => vec![String::new()],
        }
    }
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    // Counts and lengths come from the file system: a name is at most 255
    // bytes, a path 4096, a directory far fewer than 2^32 names.
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// A bounds-checked reader of the format in the module docs.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).context("length overflows")?;
        let s = self.bytes.get(self.at..end).context("truncated")?;
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<usize> {
        let b: [u8; 4] = self.take(4)?.try_into()?;
        Ok(u32::from_le_bytes(b) as usize)
    }

    fn u64(&mut self) -> Result<u64> {
        let b: [u8; 8] = self.take(8)?.try_into()?;
        Ok(u64::from_le_bytes(b))
    }

    fn i64(&mut self) -> Result<i64> {
        let b: [u8; 8] = self.take(8)?.try_into()?;
        Ok(i64::from_le_bytes(b))
    }

    fn str(&mut self) -> Result<&'a str> {
        let n = self.u32()?;
        Ok(std::str::from_utf8(self.take(n)?)?)
    }

    fn stamp(&mut self) -> Result<Stamp<'a>> {
        let kind = Kind::from_byte(self.u8()?).context("unknown kind")?;
        let name = self.str()?;
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            bail!("bad name {name:?}");
        }
        let size = self.u64()?;
        let mtime_ns = self.i64()?;
        let sha256 = match self.u8()? {
            0 => None,
            1 => Some(self.take(32)?),
            _ => bail!("bad sha256 flag"),
        };
        Ok(Stamp {
            name,
            kind,
            size,
            mtime_ns,
            sha256,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn entry() -> (tempfile::TempDir, Manifest) {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("lib/pkg/sub")).unwrap();
        std::fs::write(d.join("oracle.json"), "{}").unwrap();
        std::fs::write(d.join("lib/pkg/a.py"), "A = 1\n").unwrap();
        std::fs::write(d.join("lib/pkg/sub/b.py"), "B = 2\n").unwrap();
        std::os::unix::fs::symlink("lib", d.join("lib64")).unwrap();
        let m = Manifest::build(d, &[MANIFEST]).unwrap();
        m.write(d).unwrap();
        Stamps::take(d, &m).unwrap().write(d).unwrap();
        (t, m)
    }

    /// Sets the mtime of `p` to a fixed time far from now, so that a change
    /// within the same clock tick is still seen as one.
    fn set_mtime(p: &Path, secs: u64) {
        let f = std::fs::File::options().write(true).open(p).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
            .unwrap();
    }

    #[test]
    fn round_trip_and_intact_entry_has_no_changes() {
        let (t, m) = entry();
        let read = Stamps::read(t.path()).unwrap();
        assert_eq!(read, Stamps::take(t.path(), &m).unwrap());
        assert_eq!(read.changes(t.path()), Vec::<String>::new());
    }

    #[test]
    fn a_rewrite_in_place_of_the_same_size_is_a_change() {
        let (t, _) = entry();
        let b = t.path().join("lib/pkg/sub/b.py");
        let before = std::fs::metadata(&b).unwrap().modified().unwrap();
        // Same inode, same size, the directory untouched.
        std::fs::write(&b, "B = 3\n").unwrap();
        set_mtime(&b, 1_000_000);
        assert_ne!(std::fs::metadata(&b).unwrap().modified().unwrap(), before);
        let s = Stamps::read(t.path()).unwrap();
        assert_eq!(s.changes(t.path()), vec!["lib/pkg/sub/b.py".to_string()]);
    }

    #[test]
    fn removals_additions_and_kind_changes_are_changes() {
        let (t, _) = entry();
        let d = t.path();
        std::fs::remove_file(d.join("lib/pkg/a.py")).unwrap();
        std::fs::write(d.join("sitecustomize.py"), "").unwrap();
        std::fs::remove_file(d.join("lib64")).unwrap();
        std::fs::create_dir(d.join("lib64")).unwrap();
        let c = Stamps::read(d).unwrap().changes(d);
        assert_eq!(c, ["lib/pkg", "lib/pkg/a.py", "lib64", "sitecustomize.py"]);
    }

    #[test]
    fn a_name_added_with_its_directorys_time_restored_is_a_change() {
        let (t, _) = entry();
        let d = t.path();
        let dir = d.join("lib/pkg");
        let mtime = std::fs::metadata(&dir).unwrap().modified().unwrap();
        // `touch -r`: a `.pth` planted, the directory's time put back.
        std::fs::write(dir.join("evil.pth"), "import os\n").unwrap();
        std::fs::File::open(&dir)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().modified().unwrap(), mtime);
        let c = Stamps::read(d).unwrap().changes(d);
        assert_eq!(c, ["lib/pkg/evil.pth"]);
        assert_eq!(Manifest::check_quick(d), ["added: lib/pkg/evil.pth"]);
        // One name swapped for another: the added one is named.
        std::fs::remove_file(dir.join("evil.pth")).unwrap();
        std::fs::rename(dir.join("a.py"), dir.join("b.py")).unwrap();
        std::fs::File::open(&dir)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert_eq!(
            Stamps::read(d).unwrap().changes(d),
            ["lib/pkg/a.py", "lib/pkg/b.py"]
        );
    }

    #[test]
    fn a_record_of_the_same_size_and_time_is_hashed() {
        let (t, _) = entry();
        let rec = t.path().join("oracle.json");
        let mtime = std::fs::metadata(&rec).unwrap().modified().unwrap();
        std::fs::write(&rec, "[]").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&rec)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let c = Stamps::read(t.path()).unwrap().changes(t.path());
        assert_eq!(c, ["oracle.json"]);
    }

    #[test]
    fn damaged_stamps_files_are_refused_not_trusted() {
        let (t, _) = entry();
        let p = t.path().join(STAMPS);
        let good = std::fs::read(&p).unwrap();
        for bad in [
            good[..good.len() - 1].to_vec(),
            [good.clone(), vec![0]].concat(),
            b"oracle-build stamps 2\n".to_vec(),
            [MAGIC, &u32::MAX.to_le_bytes()[..]].concat(),
        ] {
            std::fs::write(&p, &bad).unwrap();
            assert!(Stamps::read(t.path()).is_err());
        }
    }

    #[test]
    fn the_quick_check_hashes_what_the_stamps_name_so_a_touch_is_no_damage() {
        let (t, _) = entry();
        let a = t.path().join("lib/pkg/a.py");
        // Touched: the stamp differs, the content does not.
        set_mtime(&a, 2_000_000);
        assert_eq!(
            Stamps::read(t.path()).unwrap().changes(t.path()),
            ["lib/pkg/a.py"]
        );
        assert_eq!(Manifest::check_quick(t.path()), Vec::<String>::new());
        // Rewritten in place, same size: damage.
        std::fs::write(&a, "A = 2\n").unwrap();
        assert_eq!(
            Manifest::check_quick(t.path()),
            ["changed content: lib/pkg/a.py"]
        );
        // Without stamps, the directory times alone miss it (entries from before stamps).
        std::fs::remove_file(t.path().join(STAMPS)).unwrap();
        assert_eq!(Manifest::check_quick(t.path()), Vec::<String>::new());
        // The manifest and the stamps themselves are never "added".
        Manifest::read(t.path())
            .unwrap()
            .write_stamped(t.path())
            .unwrap();
        // (sizes only: the same-size rewrite is left to the hash.)
        assert!(t.path().join(STAMPS).is_file());
        assert_eq!(
            Manifest::read(t.path()).unwrap().check(t.path(), false),
            Vec::<String>::new()
        );
    }
}
