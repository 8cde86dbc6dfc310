//! A reader for the integer `.npy` files users keep their goldens in
//! (`greedy_ids.npy`, int32 `[N, T]`), written by hand so the tool needs no numpy.
//!
//! Format (numpy's `format.py`, "NPY format"): the magic `\x93NUMPY`, a major
//! and minor version byte, the header length (u16 little-endian for 1.0, u32
//! for 2.0 and 3.0), then a Python dict literal such as
//! `{'descr': '<i4', 'fortran_order': False, 'shape': (2, 16), }` padded
//! with spaces and a newline, then the raw data.
//!
//! [`write_i32`] writes the same format (version 1.0, `<i4`, C order), as
//! `numpy.save` does for an int32 array.

/// An integer array read from a `.npy` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyArray {
    /// The array's shape, e.g. `[N, T]`.
    pub shape: Vec<usize>,
    /// The elements in C (row-major) order, widened to i64.
    pub data: Vec<i64>,
}

impl NpyArray {
    /// The array as rows: `[N, T]` gives N rows, `[T]` one row, `[]` one row
    /// of one element. Errors for three or more dimensions.
    pub fn rows(&self) -> Result<Vec<Vec<i64>>, String> {
        match self.shape.as_slice() {
            [] | [_] => Ok(vec![self.data.clone()]),
            [_, t] if *t == 0 => Ok(vec![Vec::new(); self.shape[0]]),
            [_, t] => Ok(self.data.chunks(*t).map(<[i64]>::to_vec).collect()),
            s => Err(format!(
                "has shape {s:?}; a golden is [N, T] (N prompts, T tokens)"
            )),
        }
    }
}

const MAGIC: &[u8] = b"\x93NUMPY";

/// Parses `.npy` bytes holding little-endian signed integers (`<i4` or `<i8`).
///
/// Errors (as text, for the caller to prefix with the path): a wrong magic,
/// an unknown version, a header that is not a dict with `descr`,
/// `fortran_order` and `shape`, another dtype, or a data length that does
/// not match the shape.
pub fn parse(bytes: &[u8]) -> Result<NpyArray, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("is not a .npy file (no \\x93NUMPY magic)".into());
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (header_len, start): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        _ => return Err(format!("has an unsupported .npy version {major}.{minor}")),
    };
    let end = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or("is truncated inside its header")?;
    let header = std::str::from_utf8(&bytes[start..end])
        .map_err(|_| "has a header that is not text".to_string())?;
    let descr = header_string(header, "descr")?;
    let fortran = header_bool(header, "fortran_order")?;
    let shape = header_shape(header)?;
    let size = match descr.as_str() {
        "<i4" => 4,
        "<i8" => 8,
        other => {
            return Err(format!(
                "has dtype {other:?}; a token-id golden is little-endian int32 ('<i4') or int64 ('<i8')"
            ));
        }
    };
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or("has a shape too large to hold")?;
    let raw = &bytes[end..];
    if Some(raw.len()) != count.checked_mul(size) {
        return Err(format!(
            "holds {} bytes of data, but shape {shape:?} of {descr} needs {}",
            raw.len(),
            count.saturating_mul(size)
        ));
    }
    let mut data: Vec<i64> = raw
        .chunks_exact(size)
        .map(|c| match c {
            [a, b, c, d] => i64::from(i32::from_le_bytes([*a, *b, *c, *d])),
            _ => {
                let mut w = [0u8; 8];
                w.copy_from_slice(c);
                i64::from_le_bytes(w)
            }
        })
        .collect();
    if fortran && shape.len() == 2 {
        // Column-major [N, T]: element (i, j) sits at i + j*N.
        let (n, t) = (shape[0], shape[1]);
        data = (0..n * t).map(|k| data[(k % t) * n + k / t]).collect();
    } else if fortran && shape.len() > 2 {
        return Err("is Fortran-ordered with more than two dimensions".into());
    }
    Ok(NpyArray { shape, data })
}

/// Encodes `data` (C order) as a `.npy` file (format version 1.0) holding
/// little-endian int32 (`'<i4'`) with `shape`: the magic, the version, the
/// header length (u16 LE), then the header dict as `numpy.save` writes it,
/// padded with spaces and a newline so the data starts at a multiple of 64.
///
/// Errors: `data` does not have the shape's element count.
pub fn write_i32(shape: &[usize], data: &[i32]) -> Result<Vec<u8>, String> {
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or("shape too large")?;
    if count != data.len() {
        return Err(format!(
            "shape {shape:?} holds {count} elements, the data {}",
            data.len()
        ));
    }
    let dims = match shape {
        [one] => format!("{one},"),
        _ => shape
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    };
    let mut header = format!("{{'descr': '<i4', 'fortran_order': False, 'shape': ({dims}), }}");
    while !(MAGIC.len() + 4 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let len = u16::try_from(header.len()).map_err(|_| "shape too long for a 1.0 header")?;
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + header.len() + 4 * data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    Ok(out)
}

/// The text right after `'key':` in the header dict.
fn after_key<'a>(header: &'a str, key: &str) -> Result<&'a str, String> {
    for quote in ['\'', '"'] {
        let needle = format!("{quote}{key}{quote}");
        if let Some(i) = header.find(&needle) {
            let rest = header[i + needle.len()..].trim_start();
            if let Some(rest) = rest.strip_prefix(':') {
                return Ok(rest.trim_start());
            }
        }
    }
    Err(format!("has no {key:?} in its header {:?}", header.trim()))
}

fn header_string(header: &str, key: &str) -> Result<String, String> {
    let rest = after_key(header, key)?;
    let quote = rest
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"')
        .ok_or_else(|| format!("has a non-string {key:?} in its header"))?;
    let body = &rest[1..];
    let close = body
        .find(quote)
        .ok_or_else(|| format!("has an unterminated {key:?} in its header"))?;
    Ok(body[..close].to_string())
}

fn header_bool(header: &str, key: &str) -> Result<bool, String> {
    let rest = after_key(header, key)?;
    if rest.starts_with("True") {
        Ok(true)
    } else if rest.starts_with("False") {
        Ok(false)
    } else {
        Err(format!("has a non-boolean {key:?} in its header"))
    }
}

fn header_shape(header: &str) -> Result<Vec<usize>, String> {
    let rest = after_key(header, "shape")?;
    let body = rest
        .strip_prefix('(')
        .and_then(|r| r.split_once(')'))
        .map(|(inside, _)| inside)
        .ok_or("has a shape that is not a tuple")?;
    body.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| format!("has a shape entry {s:?} that is not a size"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str, data: &[u8]) -> Vec<u8> {
        let mut h = header.to_string();
        while !(10 + h.len() + 1).is_multiple_of(64) {
            h.push(' ');
        }
        h.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(h.len() as u16).to_le_bytes());
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out
    }

    fn i4(v: &[i32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn reads_int32_rows() {
        let b = npy(
            "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }",
            &i4(&[1, 2, 3, 4, 5, -1]),
        );
        let a = parse(&b).unwrap();
        assert_eq!(a.shape, [2, 3]);
        assert_eq!(a.rows().unwrap(), [vec![1, 2, 3], vec![4, 5, -1]]);
    }

    #[test]
    fn reads_fortran_order_as_rows() {
        // [[1, 2, 3], [4, 5, 6]] stored column by column.
        let b = npy(
            "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }",
            &i4(&[1, 4, 2, 5, 3, 6]),
        );
        assert_eq!(
            parse(&b).unwrap().rows().unwrap(),
            [vec![1, 2, 3], vec![4, 5, 6]]
        );
    }

    #[test]
    fn one_dimension_is_one_row() {
        let b = npy(
            "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
            &i4(&[7, 8, 9]),
        );
        assert_eq!(parse(&b).unwrap().rows().unwrap(), [vec![7, 8, 9]]);
    }

    #[test]
    fn refuses_floats_bad_magic_and_short_data() {
        let f = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
            &[0; 4],
        );
        assert!(parse(&f).unwrap_err().contains("'<i4'"));
        assert!(
            parse(b"PK\x03\x04 not numpy")
                .unwrap_err()
                .contains("magic")
        );
        let short = npy(
            "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }",
            &i4(&[1, 2]),
        );
        assert!(parse(&short).unwrap_err().contains("needs 24"));
    }

    #[test]
    fn writes_what_it_reads_with_numpys_header_layout() {
        for (shape, data) in [
            (vec![2usize, 3], vec![1, 2, 3, 4, 5, -1]),
            (vec![3], vec![7, 8, 9]),
            (vec![1, 2, 2], vec![5, 5, 6, -1]),
            (vec![0, 4], vec![]),
        ] {
            let b = write_i32(&shape, &data).unwrap();
            assert_eq!(&b[..8], b"\x93NUMPY\x01\x00");
            let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
            assert_eq!((10 + hlen) % 64, 0, "{shape:?}");
            assert_eq!(b[10 + hlen - 1], b'\n');
            let a = parse(&b).unwrap();
            assert_eq!(a.shape, shape);
            assert_eq!(
                a.data,
                data.iter().map(|&x| i64::from(x)).collect::<Vec<_>>()
            );
        }
        let one = write_i32(&[3], &[7, 8, 9]).unwrap();
        assert!(String::from_utf8_lossy(&one).contains("'shape': (3,), }"));
        assert!(write_i32(&[2, 2], &[1]).unwrap_err().contains("4 elements"));
    }
}
