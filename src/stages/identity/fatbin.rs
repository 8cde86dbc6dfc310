//! The CUDA fat-binary reader: which GPU architectures a compiled extension's
//! device code targets, read from the file alone (no CUDA toolkit).
//!
//! An nvcc-built shared library keeps its device code in the ELF section
//! `.nv_fatbin` (relocatable device code in an object: `__nv_relfatbin`).
//! The section holds one or more fat binaries, each a 16-byte header
//! (`fatBinaryHeader` of the toolkit's public `fatbinary_section.h`: magic
//! `0xBA55ED50`, version 1, header size 16, size of what follows) and its
//! entries, one per cubin or PTX. The entry header is not documented by
//! NVIDIA; its layout here was read from nvcc 13.0's output (the fixtures of
//! `tests/data/fatbin/`, whose README says how they were made, checked
//! against `cuobjdump --list-elf` / `--list-ptx` / `--dump-elf`) and agrees
//! with the public reverse-engineered readers (n-eiling's
//! cuda-fatbin-decompression, the `fatbinary` crate):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 2 | kind: 1 PTX, 2 cubin (ELF) |
//! | 4 | 4 | this header's size (64, 80 for PTX, 112 for sm_100+ cubins) |
//! | 8 | 8 | payload size in the file (padded) |
//! | 16 | 4 | compressed payload size (0 when stored plain) |
//! | 28 | 4 | architecture number: 90 for sm_90 / compute_90, 121 for sm_121 |
//! | 40 | 8 | flags: 0x2000 LZ4, 0x8000 zstd, 0x10_0000 arch-specific (`a`), 0x20_0000 family (`f`) |
//! | 56 | 8 | decompressed payload size (0 when stored plain) |
//!
//! The architecture and its `a` / `f` variant come from the entry header.
//! Each payload is then checked against it, decompressing what is
//! compressed (LZ4 block format: `lz4_flex`; zstd: `ruzstd`, a PTX's first
//! [`PREFIX`] bytes only, a cubin whole): a cubin must be a CUDA ELF (`EM_CUDA`) whose
//! `e_flags` name the same SM (bits 8..15 from ELF ABI version 8, the low
//! byte before) and that is an ELF with code (read whole with the `object`
//! crate: a consistent header, sections inside the cubin, each kernel's
//! `.text.<name>`; an ELF header alone is damage), a PTX must declare
//! `.target sm_<same>[variant]`. A cubin of
//! the older layout may also say `a` in its own `e_flags`
//! (`EF_CUDA_ACCELERATORS_V1`); from ABI version 8 the cubin carries neither
//! `a` nor `f` (the fixtures show sm_90 and sm_90a cubins with equal flags).
//! Anything that does not read or does not agree is an error, never a guess.

use std::fmt;
use std::io::Read;
use std::str::FromStr;

use object::{Object, ObjectSection};
use serde::{Deserialize, Serialize};

/// The ELF sections that hold fat binaries: `.nv_fatbin` (loadable device
/// code of an executable or shared library) and `__nv_relfatbin`
/// (relocatable device code of an object built with `-rdc`).
pub const SECTIONS: [&str; 2] = [".nv_fatbin", "__nv_relfatbin"];

/// The section of the loader's device code: what coverage is judged on.
pub const LOADABLE: &str = ".nv_fatbin";

/// `fatBinaryHeader.magic` (`FATBIN_MAGIC` of `fatbinary_section.h`).
pub const MAGIC: u32 = 0xBA55_ED50;

/// How many decompressed bytes of a zstd payload are read to check it
/// against its header (an ELF header; a PTX `.target` line).
pub const PREFIX: usize = 64 * 1024;

/// The largest decompressed payload read whole: an LZ4 one (LZ4 block data
/// is decompressed whole), a zstd-compressed cubin (checked whole).
pub const MAX_LZ4: u64 = 1 << 30;

const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;
const FLAG_ARCH_SPECIFIC: u64 = 0x10_0000;
const FLAG_FAMILY: u64 = 0x20_0000;
const EM_CUDA: u16 = 190;

/// An architecture's variant suffix (CUDA 12.0+ `a`, 12.9+ `f`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Variant {
    /// No suffix: `sm_90`.
    Plain,
    /// `a`, arch-specific: `sm_90a` runs on compute capability 9.0 only.
    Specific,
    /// `f`, family-specific: `sm_100f` runs on its family (10.x, minor >= 0).
    Family,
}

impl Variant {
    fn suffix(self) -> &'static str {
        match self {
            Variant::Plain => "",
            Variant::Specific => "a",
            Variant::Family => "f",
        }
    }
}

/// A real (`sm_XY`, a cubin's) or virtual (`compute_XY`, a PTX's) architecture.
/// Serialized as that name, e.g. `"sm_90a"`, `"compute_80"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Arch {
    /// `false`: `sm_` (machine code), `true`: `compute_` (PTX).
    pub virtual_arch: bool,
    /// Major and minor as one number: 90 for 9.0, 121 for 12.1.
    pub number: u32,
    /// The suffix.
    pub variant: Variant,
}

impl Arch {
    /// The compute capability's major (`sm_121` -> 12).
    pub fn major(&self) -> u32 {
        self.number / 10
    }
    /// The compute capability's minor (`sm_121` -> 1).
    pub fn minor(&self) -> u32 {
        self.number % 10
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = if self.virtual_arch { "compute_" } else { "sm_" };
        write!(f, "{prefix}{}{}", self.number, self.variant.suffix())
    }
}

impl FromStr for Arch {
    type Err = String;
    /// Parses `sm_90`, `sm_90a`, `sm_100f`, `compute_80`, ...
    fn from_str(s: &str) -> Result<Self, String> {
        let (virtual_arch, rest) = match (s.strip_prefix("sm_"), s.strip_prefix("compute_")) {
            (Some(r), _) => (false, r),
            (_, Some(r)) => (true, r),
            _ => return Err(format!("{s:?} is not sm_XY or compute_XY")),
        };
        let (digits, variant) = match rest.strip_suffix('a') {
            Some(d) => (d, Variant::Specific),
            None => match rest.strip_suffix('f') {
                Some(d) => (d, Variant::Family),
                None => (rest, Variant::Plain),
            },
        };
        let number = (digits.len() >= 2 && digits.chars().all(|c| c.is_ascii_digit()))
            .then(|| digits.parse::<u32>().ok())
            .flatten()
            .ok_or_else(|| format!("{s:?} is not sm_XY or compute_XY"))?;
        Ok(Arch {
            virtual_arch,
            number,
            variant,
        })
    }
}

impl From<Arch> for String {
    fn from(a: Arch) -> String {
        a.to_string()
    }
}

impl TryFrom<String> for Arch {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// Machine code (an ELF cubin) for one real architecture.
    Cubin,
    /// PTX for one virtual architecture (JIT-compiled by the driver).
    Ptx,
}

/// How an entry's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Plain.
    None,
    /// LZ4 block format (nvcc `--compress-mode=speed`, CUDA 11 / 12 `-Xfatbin -compress-all`).
    Lz4,
    /// zstd (nvcc 12.8+ `--compress-mode=size|balance|default`).
    Zstd,
}

/// One entry of a fat binary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FatbinEntry {
    /// The ELF section it was read from (`.nv_fatbin`, `__nv_relfatbin`).
    pub section: String,
    /// Cubin or PTX.
    pub kind: EntryKind,
    /// `sm_XY[a|f]` for a cubin, `compute_XY[a|f]` for a PTX.
    pub arch: Arch,
    /// How the payload is stored.
    pub compression: Compression,
    /// Payload bytes in the file (compressed size when compressed).
    pub stored_bytes: u64,
    /// Payload bytes once decompressed.
    pub bytes: u64,
}

/// The device code of one file, as read from its fat binaries. `cubins` and
/// `ptx` summarise the loadable section ([`LOADABLE`]), sorted and unique;
/// `entries` lists every entry of every section in file order. When
/// `error` is set nothing else is to be trusted: the lists are empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kernels {
    /// The fat-binary sections the file has (of [`SECTIONS`]).
    pub sections: Vec<String>,
    /// The real architectures of its loadable cubins, e.g. `["sm_80", "sm_90a"]`.
    pub cubins: Vec<Arch>,
    /// The virtual architectures of its loadable PTX, e.g. `["compute_90"]`.
    pub ptx: Vec<Arch>,
    /// Every entry.
    pub entries: Vec<FatbinEntry>,
    /// Why the file's device code could not be read, if it could not.
    pub error: Option<String>,
}

impl Kernels {
    /// Whether the file holds device code (or a fat binary that did not read).
    pub fn has_device_code(&self) -> bool {
        !self.sections.is_empty() || self.error.is_some()
    }

    fn failed(sections: Vec<String>, error: String) -> Kernels {
        Kernels {
            sections,
            error: Some(error),
            ..Kernels::default()
        }
    }

    /// One line: `cubins sm_80, sm_90a; PTX compute_90`, `no device code`,
    /// or `unreadable fat binary: <why>`.
    pub fn describe(&self) -> String {
        if let Some(e) = &self.error {
            return format!("unreadable fat binary: {e}");
        }
        if !self.has_device_code() {
            return "no device code".into();
        }
        let list = |v: &[Arch]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.iter().map(Arch::to_string).collect::<Vec<_>>().join(", ")
            }
        };
        format!("cubins {}; PTX {}", list(&self.cubins), list(&self.ptx))
    }
}

/// Reads the device code of the ELF file `bytes` (a shared library, an
/// object). Never fails and never panics: a file that is not ELF, an ELF
/// without section headers (stripped of them, so it cannot be told), or a
/// fat binary that does not read gives [`Kernels::error`]; an ELF without
/// fat-binary sections gives no entries.
pub fn read_elf(bytes: &[u8]) -> Kernels {
    let file = match object::File::parse(bytes) {
        Ok(f) => f,
        Err(e) => return Kernels::failed(Vec::new(), format!("not an ELF file ({e})")),
    };
    if file.format() != object::BinaryFormat::Elf {
        return Kernels::failed(Vec::new(), "not an ELF file".into());
    }
    if file.sections().next().is_none() {
        return Kernels::failed(
            Vec::new(),
            "the ELF has no section headers, so its device code cannot be found".into(),
        );
    }
    let mut out = Kernels::default();
    for name in SECTIONS {
        let Some(section) = file.section_by_name(name) else {
            continue;
        };
        out.sections.push(name.to_string());
        let data = match section.data() {
            Ok(d) => d,
            Err(e) => {
                return Kernels::failed(out.sections, format!("section {name}: {e}"));
            }
        };
        match read_section(data, name) {
            Ok(entries) => out.entries.extend(entries),
            Err(e) => return Kernels::failed(out.sections, format!("section {name}: {e}")),
        }
    }
    if out.sections.is_empty() && file.section_by_name(".nvFatBinSegment").is_some() {
        return Kernels::failed(
            Vec::new(),
            "a .nvFatBinSegment (fat-binary wrapper) but no .nv_fatbin section".into(),
        );
    }
    let mut cubins = Vec::new();
    let mut ptx = Vec::new();
    for e in out.entries.iter().filter(|e| e.section == LOADABLE) {
        match e.kind {
            EntryKind::Cubin => cubins.push(e.arch),
            EntryKind::Ptx => ptx.push(e.arch),
        }
    }
    cubins.sort();
    cubins.dedup();
    ptx.sort();
    ptx.dedup();
    out.cubins = cubins;
    out.ptx = ptx;
    out
}

fn u16_at(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        d.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        d.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        d.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Reads every fat binary of one section's bytes `data` (named `section`
/// in the entries). Zero bytes between fat binaries (alignment) are skipped.
///
/// Errors: a header that is not a fat binary's, a fat binary or entry that
/// runs past its end (truncated), an unknown entry kind, contradictory
/// flags, a payload that does not decompress or disagrees with its header.
pub fn read_section(data: &[u8], section: &str) -> Result<Vec<FatbinEntry>, String> {
    let mut entries = Vec::new();
    let mut pos = 0usize;
    loop {
        while data.get(pos) == Some(&0) {
            pos += 1;
        }
        if pos >= data.len() {
            return Ok(entries);
        }
        let truncated = |what: &str, at: usize| {
            format!(
                "truncated: {what} at offset {at} runs past the end ({} bytes)",
                data.len()
            )
        };
        let (Some(magic), Some(version), Some(header), Some(size)) = (
            u32_at(data, pos),
            u16_at(data, pos + 4),
            u16_at(data, pos + 6),
            u64_at(data, pos + 8),
        ) else {
            return Err(truncated("a fat-binary header", pos));
        };
        if magic != MAGIC {
            return Err(format!(
                "offset {pos}: magic {magic:#010x} is not a fat binary's ({MAGIC:#010x})"
            ));
        }
        if version != 1 || header < 16 {
            return Err(format!(
                "offset {pos}: fat-binary version {version}, header size {header} (expected 1, 16)"
            ));
        }
        let start = pos + header as usize;
        let end = usize::try_from(size)
            .ok()
            .and_then(|s| start.checked_add(s))
            .filter(|&e| e <= data.len())
            .ok_or_else(|| truncated(&format!("a fat binary of {size} bytes"), pos))?;
        let mut at = start;
        while at < end {
            let (entry, next) = read_entry(&data[..end], at, section)?;
            entries.push(entry);
            at = next;
        }
        pos = end;
    }
}

/// Reads the entry at `at` of `data` (which ends where its fat binary
/// ends); returns it and where the next one starts.
fn read_entry(data: &[u8], at: usize, section: &str) -> Result<(FatbinEntry, usize), String> {
    let truncated = || {
        format!(
            "truncated: the entry at offset {at} runs past the end of its fat binary (offset {})",
            data.len()
        )
    };
    let field = |v: Option<u64>| v.ok_or_else(truncated);
    let kind_code = field(u16_at(data, at).map(u64::from))?;
    let header = field(u32_at(data, at + 4).map(u64::from))?;
    let size = field(u64_at(data, at + 8))?;
    let compressed = field(u32_at(data, at + 16).map(u64::from))?;
    let number = field(u32_at(data, at + 28).map(u64::from))?;
    let flags = field(u64_at(data, at + 40))?;
    let decompressed = field(u64_at(data, at + 56))?;
    if header < 64 {
        return Err(format!(
            "the entry at offset {at} has a header of {header} bytes (at least 64)"
        ));
    }
    let payload_at = usize::try_from(header)
        .ok()
        .and_then(|h| at.checked_add(h))
        .ok_or_else(truncated)?;
    let next = usize::try_from(size)
        .ok()
        .and_then(|s| payload_at.checked_add(s))
        .filter(|&n| n <= data.len())
        .ok_or_else(truncated)?;
    let kind = match kind_code {
        1 => EntryKind::Ptx,
        2 => EntryKind::Cubin,
        k => {
            return Err(format!(
                "the entry at offset {at} is of kind {k} (1 PTX and 2 cubin are known)"
            ));
        }
    };
    let variant = match (flags & FLAG_ARCH_SPECIFIC != 0, flags & FLAG_FAMILY != 0) {
        (false, false) => Variant::Plain,
        (true, false) => Variant::Specific,
        (false, true) => Variant::Family,
        (true, true) => {
            return Err(format!(
                "the entry at offset {at} is flagged both arch-specific and family-specific (flags {flags:#x})"
            ));
        }
    };
    let number = u32::try_from(number)
        .ok()
        .filter(|n| (10..10_000).contains(n))
        .ok_or_else(|| {
            format!(
                "the entry at offset {at} names architecture {number}, not a compute capability"
            )
        })?;
    let arch = Arch {
        virtual_arch: kind == EntryKind::Ptx,
        number,
        variant,
    };
    let compression = match (flags & FLAG_LZ4 != 0, flags & FLAG_ZSTD != 0) {
        (false, false) => Compression::None,
        (true, false) => Compression::Lz4,
        (false, true) => Compression::Zstd,
        (true, true) => {
            return Err(format!(
                "the entry at offset {at} is flagged both LZ4- and zstd-compressed (flags {flags:#x})"
            ));
        }
    };
    let stored = if compression == Compression::None {
        size
    } else {
        if compressed == 0 || compressed > size {
            return Err(format!(
                "the {arch} entry at offset {at}: compressed size {compressed} outside its payload of {size} bytes"
            ));
        }
        compressed
    };
    let payload = &data[payload_at..payload_at + stored as usize];
    // A cubin is read whole (its section headers may lie anywhere in it);
    // of a PTX only the first PREFIX bytes (its `.target` line).
    let whole = kind == EntryKind::Cubin;
    let prefix: std::borrow::Cow<'_, [u8]> = match compression {
        Compression::None if whole => std::borrow::Cow::Borrowed(payload),
        Compression::None => std::borrow::Cow::Borrowed(&payload[..payload.len().min(PREFIX)]),
        Compression::Lz4 => {
            if decompressed == 0 || decompressed > MAX_LZ4 || decompressed > 255 * stored + 64 {
                return Err(format!(
                    "the {arch} entry at offset {at}: decompressed size {decompressed} for {stored} LZ4 bytes"
                ));
            }
            let mut out = lz4_flex::block::decompress(payload, decompressed as usize)
                .map_err(|e| format!("the {arch} entry at offset {at}: LZ4: {e}"))?;
            if out.len() as u64 != decompressed {
                return Err(format!(
                    "the {arch} entry at offset {at}: LZ4 gave {} bytes, the header says {decompressed}",
                    out.len()
                ));
            }
            if !whole {
                out.truncate(PREFIX);
            }
            std::borrow::Cow::Owned(out)
        }
        Compression::Zstd => {
            if whole && (decompressed == 0 || decompressed > MAX_LZ4) {
                return Err(format!(
                    "the {arch} entry at offset {at}: decompressed size {decompressed} for {stored} zstd bytes"
                ));
            }
            let mut out = Vec::new();
            let decoder = ruzstd::decoding::StreamingDecoder::new(payload)
                .map_err(|e| format!("the {arch} entry at offset {at}: zstd: {e}"))?;
            let limit = if whole {
                decompressed + 1
            } else {
                PREFIX as u64
            };
            decoder
                .take(limit)
                .read_to_end(&mut out)
                .map_err(|e| format!("the {arch} entry at offset {at}: zstd: {e}"))?;
            if whole && out.len() as u64 != decompressed {
                return Err(format!(
                    "the {arch} entry at offset {at}: zstd gave {}{} bytes, the header says {decompressed}",
                    if out.len() as u64 > decompressed {
                        "more than "
                    } else {
                        ""
                    },
                    out.len().min(decompressed as usize)
                ));
            }
            std::borrow::Cow::Owned(out)
        }
    };
    let bytes = if compression == Compression::None {
        size
    } else {
        decompressed
    };
    let arch = check_payload(&prefix, arch)
        .map_err(|e| format!("the {arch} entry at offset {at}: {e}"))?;
    Ok((
        FatbinEntry {
            section: section.to_string(),
            kind,
            arch,
            compression,
            stored_bytes: stored,
            bytes,
        },
        next,
    ))
}

/// Checks a decompressed payload (a PTX's start, a cubin whole) against
/// the header's `arch`; a cubin must also be an ELF with code
/// ([`check_cubin_elf`]). Returns the architecture, marked arch-specific when a cubin of the older
/// ELF layout (ABI version 7) says so in its `e_flags`
/// (`EF_CUDA_ACCELERATORS_V1`, 0x800, LLVM BinaryFormat/ELF.h) and its
/// entry header does not.
fn check_payload(prefix: &[u8], arch: Arch) -> Result<Arch, String> {
    if arch.virtual_arch {
        let text = String::from_utf8_lossy(prefix);
        let target = text
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(".target"))
            .ok_or("a PTX payload without a .target line")?;
        let first = target
            .split([',', ' ', '\t'])
            .find(|t| !t.is_empty())
            .unwrap_or("");
        let named: Arch = first
            .replacen("sm_", "compute_", 1)
            .parse()
            .map_err(|_| format!("PTX .target {first:?} is not sm_XY"))?;
        if named.number != arch.number
            || (named.variant != Variant::Plain && named.variant != arch.variant)
        {
            return Err(format!("its PTX says .target {first}"));
        }
        return Ok(arch);
    }
    if prefix.len() < 64 || &prefix[..4] != b"\x7fELF" {
        return Err("a cubin payload that is not an ELF file".into());
    }
    if prefix[4] != 2 || prefix[5] != 1 {
        return Err("a cubin that is not a 64-bit little-endian ELF".into());
    }
    let machine = u16_at(prefix, 18).unwrap_or(0);
    if machine != EM_CUDA {
        return Err(format!(
            "a cubin for ELF machine {machine} (EM_CUDA is {EM_CUDA})"
        ));
    }
    let abi = prefix[8];
    let flags = u32_at(prefix, 48).unwrap_or(0);
    // ELF ABI version 8 (CUDA 12.9+ / 13) moved EF_CUDA_SM to bits 8..15
    // (LLVM BinaryFormat/ELF.h: EF_CUDA_SM_MASK 0xff00); before, the low byte.
    let sm = if abi >= 8 {
        (flags >> 8) & 0xff
    } else {
        flags & 0xff
    };
    if sm != arch.number {
        return Err(format!(
            "its ELF says sm_{sm} (e_flags {flags:#x}, ABI version {abi})"
        ));
    }
    check_cubin_elf(prefix)?;
    if abi < 8 && flags & 0x800 != 0 && arch.variant == Variant::Plain {
        return Ok(Arch {
            variant: Variant::Specific,
            ..arch
        });
    }
    Ok(arch)
}

/// Checks that the whole cubin `elf` is an ELF with code, read with the
/// `object` crate: a consistent header (ELF version 1, a 64-byte header,
/// type `ET_EXEC`, or `ET_REL` for relocatable device code; section and
/// program header tables of the right entry size inside the cubin, a
/// section-name table), sections (an ELF header alone, however right its
/// `e_machine` and `e_flags`, holds no code), every section's and
/// segment's bytes inside the cubin, every `.text.<name>` section
/// executable code (`SHT_PROGBITS`, `SHF_EXECINSTR`, not empty), and every
/// kernel the cubin describes (a `.nv.info.<name>` section) with its
/// `.text.<name>`. A cubin with no kernel at all (nvcc makes one for a
/// translation unit without any) passes.
///
/// Errors: the first thing that does not hold, in plain words.
fn check_cubin_elf(elf: &[u8]) -> Result<(), String> {
    use object::elf::{ET_EXEC, ET_REL, SHF_EXECINSTR, SHT_PROGBITS};
    use object::read::elf::{ElfFile64, FileHeader, ProgramHeader, SectionHeader};
    let file = ElfFile64::<object::LittleEndian>::parse(elf)
        .map_err(|e| format!("a cubin whose ELF does not read ({e})"))?;
    let endian = file.endian();
    let header = file.elf_header();
    let (kind, version, size) = (
        header.e_type(endian),
        header.e_version(endian),
        header.e_ehsize(endian),
    );
    if kind != ET_EXEC && kind != ET_REL {
        return Err(format!(
            "a cubin of ELF type {kind} (ET_EXEC {ET_EXEC} or ET_REL {ET_REL})"
        ));
    }
    if version != 1 || size != 64 {
        return Err(format!(
            "a cubin whose ELF header says version {version}, header size {size} (1, 64)"
        ));
    }
    let sections = file.elf_section_table();
    if sections.len() < 2 {
        return Err(
            "a cubin with no sections: an ELF header alone, without code (damaged or not a cubin)"
                .into(),
        );
    }
    let mut code = std::collections::BTreeSet::new();
    let mut described = Vec::new();
    for (i, section) in sections.iter().enumerate() {
        let name = sections
            .section_name(endian, section)
            .map_err(|e| format!("a cubin whose section {i} has no name ({e})"))?;
        let shown = String::from_utf8_lossy(name);
        section
            .data(endian, elf)
            .map_err(|_| format!("a cubin whose section {shown} lies outside it"))?;
        if let Some(kernel) = name.strip_prefix(b".text.") {
            if section.sh_type(endian) != SHT_PROGBITS
                || section.sh_flags(endian).0 & SHF_EXECINSTR.0 == 0
                || section.sh_size(endian) == 0
            {
                return Err(format!(
                    "a cubin whose section {shown} is not code (type {}, flags {:#x}, {} bytes)",
                    section.sh_type(endian),
                    section.sh_flags(endian).0,
                    section.sh_size(endian)
                ));
            }
            code.insert(kernel);
        } else if let Some(kernel) = name.strip_prefix(b".nv.info.") {
            described.push(kernel);
        }
    }
    if let Some(k) = described.iter().find(|k| !code.contains(*k)) {
        let k = String::from_utf8_lossy(k);
        return Err(format!(
            "a cubin that describes kernel {k} (.nv.info.{k}) without its code (.text.{k})"
        ));
    }
    for (i, segment) in file.elf_program_headers().iter().enumerate() {
        segment
            .data(endian, elf)
            .map_err(|_| format!("a cubin whose program header {i} lies outside it"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! On the fixtures of `tests/data/fatbin/` (nvcc 13.0; its README says
    //! how they were made), each read checked against what the committed
    //! `cuobjdump --list-elf` / `--list-ptx` listing says of the same file.
    use super::*;

    const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/fatbin");

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(format!("{DIR}/{name}")).unwrap()
    }

    fn archs(v: &[Arch]) -> Vec<String> {
        v.iter().map(Arch::to_string).collect()
    }

    fn section(bytes: &[u8], name: &str) -> (usize, usize) {
        let f = object::File::parse(bytes).unwrap();
        let s = f.section_by_name(name).unwrap();
        let (off, len) = s.file_range().unwrap();
        (off as usize, len as usize)
    }

    /// What cuobjdump listed for `file`: (cubin names, PTX names), e.g. `sm_90a`.
    fn cuobjdump(file: &str) -> (Vec<String>, Vec<String>) {
        let text = std::fs::read_to_string(format!("{DIR}/cuobjdump.txt")).unwrap();
        let block = text
            .split("== ")
            .find(|b| b.lines().next() == Some(file))
            .unwrap_or_else(|| panic!("{file} is not in cuobjdump.txt"));
        let names = |suffix: &str| -> Vec<String> {
            block
                .lines()
                .filter_map(|l| l.split(": ").nth(1))
                .filter_map(|n| n.strip_suffix(suffix))
                .map(|n| n.rsplit('.').next().unwrap().to_string())
                .collect()
        };
        (names(".cubin"), names(".ptx"))
    }

    /// The reader's entries as cuobjdump names them: a family cubin by its
    /// plain name (cuobjdump lists `sm_100f` as `sm_100`), PTX as `sm_XY`.
    fn as_cuobjdump(k: &Kernels) -> (Vec<String>, Vec<String>) {
        let mut elf = Vec::new();
        let mut ptx = Vec::new();
        for e in &k.entries {
            let mut a = e.arch;
            if e.kind == EntryKind::Cubin && a.variant == Variant::Family {
                a.variant = Variant::Plain;
            }
            let name = a.to_string().replacen("compute_", "sm_", 1);
            match e.kind {
                EntryKind::Cubin => elf.push(name),
                EntryKind::Ptx => ptx.push(name),
            }
        }
        (elf, ptx)
    }

    #[test]
    fn every_fixture_reads_as_cuobjdump_lists_it() {
        for file in [
            "multi.so",
            "ptx_only.so",
            "variants.so",
            "size.so",
            "speed.so",
            "host_only.so",
            "rdc.o",
        ] {
            let k = read_elf(&fixture(file));
            assert_eq!(k.error, None, "{file}");
            let (mut elf, mut ptx) = as_cuobjdump(&k);
            let (mut want_elf, mut want_ptx) = cuobjdump(file);
            for v in [&mut elf, &mut ptx, &mut want_elf, &mut want_ptx] {
                v.sort();
            }
            assert_eq!((elf, ptx), (want_elf, want_ptx), "{file}");
        }
    }

    #[test]
    fn several_cubins_and_a_ptx() {
        let k = read_elf(&fixture("multi.so"));
        assert_eq!(k.sections, [".nv_fatbin"]);
        assert_eq!(archs(&k.cubins), ["sm_80", "sm_86", "sm_90", "sm_90a"]);
        assert_eq!(archs(&k.ptx), ["compute_90"]);
        // nvcc 13.0's default: cubins stored plain, PTX zstd-compressed.
        let ptx = k.entries.iter().find(|e| e.kind == EntryKind::Ptx).unwrap();
        assert_eq!(
            (ptx.compression, ptx.stored_bytes, ptx.bytes),
            (Compression::Zstd, 271, 482)
        );
        assert!(
            k.entries
                .iter()
                .filter(|e| e.kind == EntryKind::Cubin)
                .all(|e| e.compression == Compression::None && e.bytes == e.stored_bytes)
        );
        assert_eq!(
            k.describe(),
            "cubins sm_80, sm_86, sm_90, sm_90a; PTX compute_90"
        );
    }

    #[test]
    fn ptx_only() {
        let k = read_elf(&fixture("ptx_only.so"));
        assert!(k.has_device_code());
        assert!(k.cubins.is_empty());
        assert_eq!(archs(&k.ptx), ["compute_80"]);
        assert_eq!(k.describe(), "cubins none; PTX compute_80");
    }

    #[test]
    fn arch_specific_and_family_variants() {
        let k = read_elf(&fixture("variants.so"));
        assert_eq!(
            archs(&k.cubins),
            ["sm_90a", "sm_100a", "sm_100f", "sm_120f", "sm_121a"]
        );
        assert_eq!(archs(&k.ptx), ["compute_90a"]);
        // sm_100+ cubins have a 112-byte entry header; all read.
        assert_eq!(k.entries.len(), 6);
    }

    #[test]
    fn compressed_entries_zstd_and_lz4() {
        let k = read_elf(&fixture("size.so"));
        assert_eq!(archs(&k.cubins), ["sm_80"]);
        assert_eq!(archs(&k.ptx), ["compute_80"]);
        let cubin = k
            .entries
            .iter()
            .find(|e| e.kind == EntryKind::Cubin)
            .unwrap();
        assert_eq!(
            (cubin.compression, cubin.stored_bytes, cubin.bytes),
            (Compression::Zstd, 815, 3240)
        );
        let k = read_elf(&fixture("speed.so"));
        let ptx = k.entries.iter().find(|e| e.kind == EntryKind::Ptx).unwrap();
        assert_eq!(
            (ptx.compression, ptx.stored_bytes, ptx.bytes),
            (Compression::Lz4, 340, 482)
        );
        assert_eq!(archs(&k.ptx), ["compute_80"]);
    }

    #[test]
    fn no_device_code() {
        let k = read_elf(&fixture("host_only.so"));
        assert_eq!(k, Kernels::default());
        assert!(!k.has_device_code());
        assert_eq!(k.describe(), "no device code");
    }

    #[test]
    fn relocatable_device_code_is_listed_but_not_loadable() {
        let k = read_elf(&fixture("rdc.o"));
        assert_eq!(k.sections, ["__nv_relfatbin"]);
        assert_eq!(k.entries.len(), 1);
        assert_eq!(k.entries[0].arch.to_string(), "sm_90");
        assert_eq!(k.entries[0].compression, Compression::Zstd);
        assert!(k.cubins.is_empty() && k.ptx.is_empty());
    }

    #[test]
    fn a_truncated_section_is_reported_at_every_cut() {
        for file in ["multi.so", "size.so", "speed.so", "variants.so"] {
            let bytes = fixture(file);
            let (off, len) = section(&bytes, LOADABLE);
            let data = &bytes[off..off + len];
            assert!(read_section(data, LOADABLE).is_ok());
            for cut in 1..len {
                // A cut inside trailing zero padding is not a truncation.
                if data[cut..].iter().all(|&b| b == 0) {
                    continue;
                }
                let err = read_section(&data[..cut], LOADABLE).unwrap_err();
                assert!(err.contains("truncated"), "{file} cut at {cut}: {err}");
            }
        }
    }

    #[test]
    fn damage_inside_the_file_is_reported_not_guessed() {
        let bytes = fixture("multi.so");
        let (off, _) = section(&bytes, LOADABLE);
        // The first entry (sm_80, stored plain) starts after the 16-byte header.
        let entry = off + 16;
        let patched = |at: usize, with: &[u8]| {
            let mut b = bytes.clone();
            b[at..at + with.len()].copy_from_slice(with);
            read_elf(&b)
        };
        let k = patched(entry + 28, &75u32.to_le_bytes());
        let err = k.error.unwrap();
        assert!(
            err.contains("sm_75") && err.contains("its ELF says sm_80"),
            "{err}"
        );
        assert!(k.cubins.is_empty() && k.entries.is_empty());
        let err = patched(entry, &7u16.to_le_bytes()).error.unwrap();
        assert!(err.contains("kind 7"), "{err}");
        let err = patched(off, &[0xde, 0xad, 0xbe, 0xef]).error.unwrap();
        assert!(err.contains("magic"), "{err}");
        // Both variant flags, both compression flags.
        let err = patched(entry + 42, &[0x30]).error.unwrap();
        assert!(err.contains("both arch-specific and family"), "{err}");
        let err = patched(entry + 41, &[0xa0]).error.unwrap();
        assert!(err.contains("both LZ4- and zstd"), "{err}");
        // A payload flagged compressed that is not.
        let err = patched(entry + 41, &[0x80]).error.unwrap();
        assert!(err.contains("compressed size"), "{err}");
        // A file that is not ELF at all, or empty.
        assert!(
            read_elf(b"not an elf")
                .error
                .unwrap()
                .contains("not an ELF")
        );
        assert!(read_elf(&[]).error.is_some());
        // Cut anywhere: an error or a read, never a panic.
        for cut in (0..bytes.len()).step_by(97) {
            let _ = read_elf(&bytes[..cut]);
        }
    }

    /// 128 bytes of cubin: an ELF header saying ET_EXEC, EM_CUDA and sm_90
    /// (ELF ABI 8, the flags nvcc 13.0 gives sm_90), then zeros: no section
    /// or program headers, no code.
    fn header_only_cubin() -> Vec<u8> {
        let mut elf = vec![0u8; 128];
        elf[..9].copy_from_slice(b"\x7fELF\x02\x01\x01\x41\x08");
        elf[16..18].copy_from_slice(&2u16.to_le_bytes());
        elf[18..20].copy_from_slice(&EM_CUDA.to_le_bytes());
        elf[20..24].copy_from_slice(&1u32.to_le_bytes());
        elf[48..52].copy_from_slice(&0x0600_5a04u32.to_le_bytes());
        elf[52..54].copy_from_slice(&64u16.to_le_bytes());
        elf
    }

    /// A `.nv_fatbin` section holding one fat binary of one plain cubin
    /// entry for `sm_<arch>`, with `cubin` as its payload.
    fn one_cubin_section(cubin: &[u8], arch: u32) -> Vec<u8> {
        let mut entry = vec![0u8; 64];
        entry[0..2].copy_from_slice(&2u16.to_le_bytes());
        entry[4..8].copy_from_slice(&64u32.to_le_bytes());
        entry[8..16].copy_from_slice(&(cubin.len() as u64).to_le_bytes());
        entry[28..32].copy_from_slice(&arch.to_le_bytes());
        let mut out = MAGIC.to_le_bytes().to_vec();
        out.extend(1u16.to_le_bytes());
        out.extend(16u16.to_le_bytes());
        out.extend(((entry.len() + cubin.len()) as u64).to_le_bytes());
        out.extend(entry);
        out.extend(cubin);
        out
    }

    #[test]
    fn a_cubin_that_is_an_elf_header_alone_is_damage() {
        // Its e_machine and e_flags say sm_90, as its entry does: without
        // sections it is no code, so no "sm_90 runs on 9.0".
        let header_only = one_cubin_section(&header_only_cubin(), 90);
        let corpus = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz/corpus/fatbin/header-only-cubin.nv_fatbin"
        );
        assert_eq!(
            std::fs::read(corpus).unwrap(),
            header_only,
            "the fuzz corpus entry is this section"
        );
        let err = read_section(&header_only, LOADABLE).unwrap_err();
        assert!(
            err.contains("the sm_90 entry at offset 16")
                && err.contains("no sections: an ELF header alone"),
            "{err}"
        );
        // A real cubin in the same wrapping reads: the wrapping is right.
        let bytes = fixture("multi.so");
        let (off, _) = section(&bytes, LOADABLE);
        let elf = off + 16 + 64;
        let size = u64_at(&bytes, off + 16 + 8).unwrap() as usize;
        let real = bytes[elf..elf + size].to_vec();
        let entries = read_section(&one_cubin_section(&real, 80), LOADABLE).unwrap();
        assert_eq!(entries[0].arch.to_string(), "sm_80");

        // In a library: multi.so's sm_80 cubin damaged in place, each way
        // reported, nothing listed.
        let cubin = object::read::elf::ElfFile64::<object::LittleEndian>::parse(&real[..]).unwrap();
        let text = cubin
            .section_by_name(".text._Z5scalePff")
            .unwrap()
            .index()
            .0;
        let text_header = elf + u64_at(&real, 40).unwrap() as usize + 64 * text;
        let damaged = |patches: &[(usize, &[u8])]| {
            let mut b = bytes.clone();
            for (at, with) in patches {
                b[*at..*at + with.len()].copy_from_slice(with);
            }
            let k = read_elf(&b);
            assert!(k.cubins.is_empty() && k.entries.is_empty(), "{k:?}");
            k.error.unwrap()
        };
        // No section headers: e_shoff, e_shnum and e_shstrndx zeroed.
        let err = damaged(&[(elf + 40, &[0; 8]), (elf + 60, &[0; 4])]);
        assert!(
            err.contains("sm_80") && err.contains("no sections"),
            "{err}"
        );
        // The kernel's code section renamed: described, no code.
        let name = u32_at(&real, text_header - elf).unwrap() as usize;
        let shstrtab = cubin
            .section_by_name(".shstrtab")
            .unwrap()
            .file_range()
            .unwrap()
            .0 as usize;
        let err = damaged(&[(elf + shstrtab + name, b".txet")]);
        assert!(
            err.contains("describes kernel _Z5scalePff (.nv.info._Z5scalePff) without its code"),
            "{err}"
        );
        // The code section not executable, or empty.
        let err = damaged(&[(text_header + 8, &[0x02])]);
        assert!(
            err.contains("section .text._Z5scalePff is not code"),
            "{err}"
        );
        let err = damaged(&[(text_header + 32, &[0; 8])]);
        assert!(err.contains("is not code"), "{err}");
        // The code section's bytes outside the cubin.
        let err = damaged(&[(text_header + 24, &[0xff, 0xff, 0xff, 0x7f])]);
        assert!(err.contains(".text._Z5scalePff lies outside it"), "{err}");
        // An ELF type that is no cubin's, a header of another size.
        let err = damaged(&[(elf + 16, &[3])]);
        assert!(err.contains("ELF type 3"), "{err}");
        let err = damaged(&[(elf + 52, &[65])]);
        assert!(err.contains("header size 65"), "{err}");
    }

    #[test]
    fn an_older_cubin_says_arch_specific_in_its_elf_flags() {
        // The sm_80 cubin of multi.so (stored plain), rewritten to ELF ABI
        // version 7 with the SM in the low byte and EF_CUDA_ACCELERATORS_V1.
        let mut bytes = fixture("multi.so");
        let (off, _) = section(&bytes, LOADABLE);
        let elf = off + 16 + 64;
        assert_eq!(&bytes[elf..elf + 4], b"\x7fELF");
        bytes[elf + 8] = 7;
        bytes[elf + 48..elf + 52].copy_from_slice(&(0x0050_0850u32).to_le_bytes());
        let k = read_elf(&bytes);
        assert_eq!(k.error, None);
        assert_eq!(archs(&k.cubins), ["sm_80a", "sm_86", "sm_90", "sm_90a"]);
        // Without the flag it stays plain; a wrong SM is refused.
        bytes[elf + 48..elf + 52].copy_from_slice(&(0x0050_0550u32).to_le_bytes());
        assert_eq!(archs(&read_elf(&bytes).cubins)[0], "sm_80");
        bytes[elf + 48..elf + 52].copy_from_slice(&(0x0050_0556u32).to_le_bytes());
        assert!(
            read_elf(&bytes)
                .error
                .unwrap()
                .contains("its ELF says sm_86")
        );
    }

    #[test]
    fn random_byte_damage_never_panics() {
        // A fixed linear congruential sequence: the same damage every run.
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 33) as usize
        };
        for file in ["multi.so", "size.so", "speed.so", "variants.so"] {
            let bytes = fixture(file);
            let (off, len) = section(&bytes, LOADABLE);
            for _ in 0..500 {
                let mut data = bytes[off..off + len].to_vec();
                for _ in 0..1 + next() % 4 {
                    let at = next() % data.len();
                    data[at] = next() as u8;
                }
                if let Ok(entries) = read_section(&data, LOADABLE) {
                    assert!(entries.iter().all(|e| e.stored_bytes <= len as u64));
                }
            }
        }
    }

    #[test]
    fn arch_names_round_trip() {
        for s in [
            "sm_80",
            "sm_90a",
            "sm_100f",
            "sm_121a",
            "compute_90",
            "compute_120f",
        ] {
            assert_eq!(s.parse::<Arch>().unwrap().to_string(), s);
        }
        let a: Arch = "sm_121a".parse().unwrap();
        assert_eq!(
            (a.major(), a.minor(), a.variant),
            (12, 1, Variant::Specific)
        );
        for bad in ["sm_", "sm_9", "sm_9x", "90", "compute_a", "sm_90af"] {
            assert!(bad.parse::<Arch>().is_err(), "{bad}");
        }
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "\"sm_121a\"");
        assert_eq!(serde_json::from_str::<Arch>(&json).unwrap(), a);
    }
}
