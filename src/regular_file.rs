//! Reading a file a user or a teammate names (a golden, a prompts file, a
//! team capture): only a regular file (links followed), never more than a
//! limit, and never blocking on the open itself.
//!
//! `File::open` of a FIFO blocks until a writer comes, and `/dev/zero` or a
//! sparse file of many GiB reads without end or fills memory. Opening with
//! `O_NONBLOCK` returns at once whatever the path is; `fstat` of the open
//! file (not of the path, which may be swapped in between) then decides.
//! Source: open(2) (`O_NONBLOCK` on FIFOs), fstat(2).

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Why [`read`] gave no bytes.
#[derive(Debug)]
pub enum ReadError {
    /// Nothing at the path (or a link to nothing).
    Missing,
    /// Something that is not a regular file: its kind (`a directory`,
    /// `a FIFO`, `a character device`, ...).
    NotRegular(&'static str),
    /// It holds more than the limit (bytes).
    TooLarge(u64),
    /// The open or a read failed.
    Io(std::io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Missing => write!(f, "does not exist"),
            ReadError::NotRegular(kind) => write!(f, "is {kind}, not a regular file"),
            ReadError::TooLarge(limit) => write!(f, "is larger than {limit} bytes, the limit"),
            ReadError::Io(e) => write!(f, "cannot be read: {e}"),
        }
    }
}

/// The kind of a file type that is not a regular file, in words.
pub fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

/// Opens `path` (links followed) for reading when it is a regular file,
/// without blocking on a FIFO.
///
/// Errors: [`ReadError::Missing`], [`ReadError::NotRegular`],
/// [`ReadError::Io`].
pub fn open(path: &Path) -> Result<std::fs::File, ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ReadError::Missing,
            _ => ReadError::Io(e),
        })?;
    let ft = file.metadata().map_err(ReadError::Io)?.file_type();
    if !ft.is_file() {
        return Err(ReadError::NotRegular(kind_of(ft)));
    }
    Ok(file)
}

/// All bytes of the regular file at `path` when it holds at most `limit`.
///
/// Errors: see [`open`]; [`ReadError::TooLarge`] when it holds more: said
/// by its size before any read (a 2 GiB sparse file costs nothing), and
/// the read stops at `limit + 1` bytes, so a file that grows or lies about
/// its size costs no more.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let file = open(path)?;
    if file.metadata().map_err(ReadError::Io)?.len() > limit {
        return Err(ReadError::TooLarge(limit));
    }
    let mut out = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(ReadError::Io)?;
    if out.len() as u64 > limit {
        return Err(ReadError::TooLarge(limit));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_within_the_limit_is_read_and_nothing_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"abc").unwrap();
        assert_eq!(read(&f, 3).unwrap(), b"abc");
        assert!(matches!(read(&f, 2), Err(ReadError::TooLarge(2))));
        assert!(matches!(
            read(&dir.path().join("none"), 9),
            Err(ReadError::Missing)
        ));
        assert!(matches!(
            read(dir.path(), 9),
            Err(ReadError::NotRegular("a directory"))
        ));
        // A FIFO with no writer: a plain open would block for ever.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            read(&fifo, 9),
            Err(ReadError::NotRegular("a FIFO"))
        ));
        // A link to a device is judged by what it points at.
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(matches!(
            read(&zero, 9),
            Err(ReadError::NotRegular("a character device"))
        ));
        assert_eq!(
            read(&dir.path().join("fifo"), 9).unwrap_err().to_string(),
            "is a FIFO, not a regular file"
        );
    }
}
