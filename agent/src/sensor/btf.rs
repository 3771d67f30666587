//! A small reader for the kernel's BTF (`/sys/kernel/btf/vmlinux`): just enough to find the
//! byte offset of a struct member, looking through anonymous structs and unions, because Rust
//! eBPF has no CO-RE and the programs get their offsets from the agent.
//!
//! It keeps the blob as read and an index into it (where each type starts; the named structs,
//! typedefs, enums and functions), and copies no type or name: it is parsed at every start,
//! beside aya's own parse, and what it holds adds to the start-up peak.
//!
//! Format: `include/uapi/linux/btf.h` (a header, a type section, a string section).

use std::{
    cmp::Ordering,
    fs::File,
    io::{self, Read},
    ops::{Deref, Range},
    os::fd::AsRawFd,
    path::Path,
};

use aya::{Btf as AyaBtf, Endianness};
use thiserror::Error;

const BTF_MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;
/// A type's common part: name offset, info, size or type.
const TYPE_LEN: usize = 12;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;
/// Anonymous members nest only a few levels deep in practice; the bound stops a malformed
/// (cyclic) blob from recursing forever.
const MAX_NESTING: u32 = 8;

#[derive(Debug, Error)]
pub enum BtfError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    #[error("BTF has no struct `{0}`")]
    NoStruct(String),
    #[error("BTF struct `{strukt}` has no member `{member}`")]
    NoMember { strukt: String, member: String },
    #[error("BTF has no enum `{0}`")]
    NoEnum(String),
    #[error("BTF enum `{enumeration}` has no value `{name}`")]
    NoEnumerator { enumeration: String, name: String },
    #[error("BTF has no typedef `{0}` of a function prototype")]
    NoProto(String),
    #[error("unsupported kernel struct layout: {0}")]
    Layout(&'static str),
    #[error("aya refused the BTF made for it: {0}")]
    Aya(#[source] aya::BtfError),
}

/// One type's common part, read from the blob.
#[derive(Clone, Copy, Debug)]
struct Record {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    size_or_type: u32,
    /// Where what follows the common part (members, enumerators, parameters) starts in the blob.
    rest: usize,
}

/// A blob mapped outside the heap: sysfs maps the kernel's own BTF (Linux 6.16 and later), and
/// those pages are not charged to the agent; elsewhere the file is read into an anonymous
/// mapping. Not from the heap either way: glibc raises its mmap threshold when a large heap
/// block is freed, and aya's parse of the same 5.5 MB, which follows this one at start-up,
/// then grows its types in the heap, copying them at each growth instead of remapping them.
struct Mapping {
    at: *mut libc::c_void,
    len: usize,
}

// SAFETY: a private mapping owned by this value, only read once made.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn of(file: &mut File) -> io::Result<Mapping> {
        let len = usize::try_from(file.metadata()?.len()).map_err(io::Error::other)?;
        match Mapping::new(len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd()) {
            Ok(mapping) => Ok(mapping),
            Err(_) => {
                Mapping::new(len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)?
                    .fill(file)
            }
        }
    }

    fn new(len: usize, prot: libc::c_int, flags: libc::c_int, fd: libc::c_int) -> io::Result<Mapping> {
        if len == 0 {
            return Ok(Mapping { at: std::ptr::null_mut(), len });
        }
        // SAFETY: a new mapping of `len` bytes, checked.
        let at = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
        if at == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { at, len })
    }

    /// Fills an anonymous (writable) mapping from `file`.
    fn fill(self, file: &mut File) -> io::Result<Mapping> {
        if self.len == 0 {
            return Ok(self);
        }
        // SAFETY: `len` writable bytes, which only this slice refers to meanwhile.
        let buffer = unsafe { std::slice::from_raw_parts_mut(self.at.cast::<u8>(), self.len) };
        let mut filled = 0;
        while filled < self.len {
            match file.read(&mut buffer[filled..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self)
    }
}

impl Deref for Mapping {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `len` mapped bytes, unmapped only on drop.
        unsafe { std::slice::from_raw_parts(self.at.cast::<u8>(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: our mapping, not referred to any more.
            unsafe { libc::munmap(self.at, self.len) };
        }
    }
}

/// The blob as parsed: a file's mapping or bytes handed over.
enum Data {
    Mapped(Mapping),
    Owned(Vec<u8>),
}

impl Deref for Data {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Data::Mapped(mapping) => mapping,
            Data::Owned(bytes) => bytes,
        }
    }
}

/// The kernel's BTF blob and an index into it.
pub struct Btf {
    data: Data,
    strings: Range<usize>,
    /// Where each type's record starts in `data`; index = type id (id 0 is `void`: no record).
    starts: Vec<u32>,
    /// Named structs and typedefs as (name offset, type id), sorted by name; the first
    /// definition of a name wins.
    structs: Vec<(u32, u32)>,
    typedefs: Vec<(u32, u32)>,
    /// Named enums as (name offset, type id): only one is looked up, once.
    enums: Vec<(u32, u32)>,
    /// Name offsets of the functions (the fentry backend's attach targets).
    functions: Vec<u32>,
}

fn u16_at(data: &[u8], at: usize) -> Result<u16, BtfError> {
    data.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]])).ok_or(BtfError::Malformed("truncated"))
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    data.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok_or(BtfError::Malformed("truncated"))
}

/// The NUL-terminated string at `offset` of `strings`, without its NUL.
fn str_at(strings: &[u8], offset: u32) -> Result<&[u8], BtfError> {
    let tail = strings.get(offset as usize..).ok_or(BtfError::Malformed("string offset out of range"))?;
    let end = tail.iter().position(|&b| b == 0).ok_or(BtfError::Malformed("unterminated string"))?;
    Ok(&tail[..end])
}

/// Sorts `named` by name, keeping the first definition (lowest id) of each (names checked at
/// parse).
fn sort_by_name(named: &mut Vec<(u32, u32)>, strings: &[u8]) {
    let name = |name_off: u32| str_at(strings, name_off).unwrap_or_default();
    named.sort_unstable_by(|a, b| name(a.0).cmp(name(b.0)).then(a.1.cmp(&b.1)));
    named.dedup_by(|later, first| name(later.0) == name(first.0));
}

impl Btf {
    pub fn from_sys_fs() -> Result<Btf, BtfError> {
        Self::from_file(Path::new("/sys/kernel/btf/vmlinux"))
    }

    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let read_error = |source| BtfError::Read { path: path.display().to_string(), source };
        let mapping = File::open(path).and_then(|mut file| Mapping::of(&mut file)).map_err(read_error)?;
        Self::index(Data::Mapped(mapping))
    }

    /// Indexes a little-endian BTF blob (the only byte order credwatch runs on).
    pub fn parse(data: Vec<u8>) -> Result<Btf, BtfError> {
        Self::index(Data::Owned(data))
    }

    fn index(data: Data) -> Result<Btf, BtfError> {
        if u16_at(&data, 0)? != BTF_MAGIC {
            return Err(BtfError::Malformed("bad magic"));
        }
        let hdr_len = u32_at(&data, 4)? as usize;
        let type_off = u32_at(&data, 8)? as usize;
        let type_len = u32_at(&data, 12)? as usize;
        let str_off = u32_at(&data, 16)? as usize;
        let str_len = u32_at(&data, 20)? as usize;
        let section = |off: usize, len: usize| {
            hdr_len
                .checked_add(off)
                .and_then(|start| Some(start..start.checked_add(len)?))
                .filter(|range| range.end <= data.len() && range.end <= u32::MAX as usize)
                .ok_or(BtfError::Malformed("section out of range"))
        };
        let types = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?;
        let string_data = &data[strings.clone()];

        let mut starts = vec![0];
        let (mut structs, mut typedefs, mut enums, mut functions) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut at = types.start;
        while at < types.end {
            let id = starts.len() as u32;
            starts.push(at as u32);
            let record = Self::record_at(&data, at)?;
            let name_off = record.name_off;
            at = record.rest
                + match record.kind {
                    KIND_STRUCT | KIND_UNION => {
                        if record.kind == KIND_STRUCT && name_off != 0 {
                            str_at(string_data, name_off)?;
                            structs.push((name_off, id));
                        }
                        12 * record.vlen
                    }
                    KIND_TYPEDEF => {
                        str_at(string_data, name_off)?;
                        typedefs.push((name_off, id));
                        0
                    }
                    KIND_ENUM => {
                        if name_off != 0 {
                            enums.push((name_off, id));
                        }
                        8 * record.vlen
                    }
                    KIND_FUNC => {
                        functions.push(name_off);
                        0
                    }
                    KIND_FUNC_PROTO => 8 * record.vlen,
                    KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                    KIND_ARRAY => 12,
                    KIND_DATASEC | KIND_ENUM64 => 12 * record.vlen,
                    _ => 0,
                };
        }
        if at != types.end {
            return Err(BtfError::Malformed("type section ends inside a type"));
        }
        sort_by_name(&mut structs, string_data);
        sort_by_name(&mut typedefs, string_data);
        Ok(Btf { data, strings, starts, structs, typedefs, enums, functions })
    }

    fn record_at(data: &[u8], at: usize) -> Result<Record, BtfError> {
        let info = u32_at(data, at + 4)?;
        Ok(Record {
            name_off: u32_at(data, at)?,
            kind: (info >> 24) & 0x1f,
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 == 1,
            size_or_type: u32_at(data, at + 8)?,
            rest: at + TYPE_LEN,
        })
    }

    fn record(&self, id: u32) -> Option<Record> {
        let at = *self.starts.get(id as usize).filter(|_| id != 0)?;
        Self::record_at(&self.data, at as usize).ok()
    }

    /// The `index`th (name offset, type, offset) triple or (name offset, value) pair after
    /// `record`'s common part.
    fn word(&self, record: &Record, index: usize, words: usize, word: usize) -> Option<u32> {
        u32_at(&self.data, record.rest + (index * words + word) * 4).ok()
    }

    fn strings(&self) -> &[u8] {
        &self.data[self.strings.clone()]
    }

    fn resolve(&self, mut id: u32) -> Option<Record> {
        for _ in 0..MAX_NESTING * 4 {
            let record = self.record(id)?;
            match record.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => id = record.size_or_type,
                _ => return Some(record),
            }
        }
        None
    }

    /// Whether the NUL-terminated string at `offset` is `name`.
    fn name_is(&self, offset: u32, name: &str) -> bool {
        str_at(self.strings(), offset).is_ok_and(|found| found == name.as_bytes())
    }

    /// The id of `name` in `named` (sorted by name).
    fn find_named(&self, named: &[(u32, u32)], name: &str) -> Option<u32> {
        let strings = self.strings();
        let at = named
            .binary_search_by(|&(name_off, _)| {
                str_at(strings, name_off).map_or(Ordering::Less, |found| found.cmp(name.as_bytes()))
            })
            .ok()?;
        Some(named[at].1)
    }

    fn find_member(&self, id: u32, member: &str, depth: u32) -> Option<u32> {
        if depth > MAX_NESTING {
            return None;
        }
        let record = self.resolve(id).filter(|r| matches!(r.kind, KIND_STRUCT | KIND_UNION))?;
        // (name offset, type id, offset in bits), the offset's high 8 bits a bitfield's size
        // with kind_flag.
        let members = (0..record.vlen).filter_map(|i| {
            let offset = self.word(&record, i, 3, 2)?;
            let bit_offset = if record.kind_flag { offset & 0x00ff_ffff } else { offset };
            Some((self.word(&record, i, 3, 0)?, self.word(&record, i, 3, 1)?, bit_offset))
        });
        if let Some((_, _, bit_offset)) = members.clone().find(|&(name_off, _, _)| self.name_is(name_off, member)) {
            return Some(bit_offset);
        }
        members
            .filter(|&(name_off, _, _)| name_off == 0 || self.name_is(name_off, ""))
            .find_map(|(_, type_id, bit_offset)| Some(bit_offset + self.find_member(type_id, member, depth + 1)?))
    }

    /// Byte offset of `member` in `struct strukt`, also when it sits in an anonymous struct or
    /// union.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let id = self.find_named(&self.structs, strukt).ok_or_else(|| BtfError::NoStruct(strukt.to_owned()))?;
        self.find_member(id, member, 0)
            .map(|bits| bits / 8)
            .ok_or_else(|| BtfError::NoMember { strukt: strukt.to_owned(), member: member.to_owned() })
    }

    /// The value of `name` in `enum enumeration`.
    pub fn enum_value(&self, enumeration: &str, name: &str) -> Result<i64, BtfError> {
        let no_enum = || BtfError::NoEnum(enumeration.to_owned());
        let &(_, id) =
            self.enums.iter().find(|(name_off, _)| self.name_is(*name_off, enumeration)).ok_or_else(no_enum)?;
        let record = self.record(id).ok_or_else(no_enum)?;
        (0..record.vlen)
            .find(|&i| self.word(&record, i, 2, 0).is_some_and(|name_off| self.name_is(name_off, name)))
            .and_then(|i| self.word(&record, i, 2, 1))
            // With kind_flag the values are signed.
            .map(|value| if record.kind_flag { i64::from(value as i32) } else { i64::from(value) })
            .ok_or_else(|| BtfError::NoEnumerator { enumeration: enumeration.to_owned(), name: name.to_owned() })
    }

    /// Whether the kernel has a function `name` (one an fentry program can attach to).
    pub fn has_function(&self, name: &str) -> bool {
        self.functions.iter().any(|&name_off| self.name_is(name_off, name))
    }

    /// Number of parameters of the function prototype behind typedef `name` (the raw
    /// tracepoints are `btf_trace_<name>`: a pointer to a prototype whose first parameter is
    /// the context).
    pub fn proto_params(&self, name: &str) -> Result<u32, BtfError> {
        let mut id = self.find_named(&self.typedefs, name).ok_or_else(|| BtfError::NoProto(name.to_owned()))?;
        // The typedef names a pointer to the prototype.
        for _ in 0..MAX_NESTING {
            match self.record(id) {
                Some(record) if record.kind == KIND_FUNC_PROTO => return Ok(record.vlen as u32),
                Some(record)
                    if matches!(
                        record.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG | KIND_PTR
                    ) =>
                {
                    id = record.size_or_type
                }
                _ => break,
            }
        }
        Err(BtfError::NoProto(name.to_owned()))
    }

    /// aya's view of typedef `name` (a raw tracepoint's `btf_trace_<name>`): a BTF in which it
    /// has its id of this one, the types before it placeholders (unnamed pointers to `void`),
    /// and nothing after. aya's `BtfTracePoint::load` only looks the typedef's id up by name and hands it to
    /// the kernel, so this loads fork's BTF-typed program as aya's parse of the whole kernel BTF
    /// did, which held several MB at start-up.
    pub fn aya_typedef(&self, name: &str) -> Result<AyaBtf, BtfError> {
        let id = self.find_named(&self.typedefs, name).ok_or_else(|| BtfError::NoProto(name.to_owned()))?;
        let type_len = id as usize * TYPE_LEN;
        let mut blob = Vec::with_capacity(HEADER_LEN + type_len + name.len() + 2);
        blob.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        // Version 1, no flags.
        blob.extend_from_slice(&[1, 0]);
        for word in [HEADER_LEN as u32, 0, type_len as u32, type_len as u32, name.len() as u32 + 2] {
            blob.extend_from_slice(&word.to_le_bytes());
        }
        let placeholder = [0, KIND_PTR << 24, 0];
        // The typedef, named by the string at offset 1 (of `void`: aya looks no further).
        let typedef = [1, KIND_TYPEDEF << 24, 0];
        for word in std::iter::repeat_n(placeholder, id as usize - 1).chain([typedef]).flatten() {
            blob.extend_from_slice(&u32::to_le_bytes(word));
        }
        blob.push(0);
        blob.extend_from_slice(name.as_bytes());
        blob.push(0);
        AyaBtf::parse(&blob, Endianness::Little).map_err(BtfError::Aya)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little BTF blob builder: types are (name, info, size_or_type, trailing u32s).
    struct Blob {
        types: Vec<u8>,
        strings: Vec<u8>,
    }

    impl Blob {
        fn new() -> Blob {
            Blob { types: Vec::new(), strings: vec![0] }
        }

        fn name(&mut self, name: &str) -> u32 {
            if name.is_empty() {
                return 0;
            }
            let offset = self.strings.len() as u32;
            self.strings.extend_from_slice(name.as_bytes());
            self.strings.push(0);
            offset
        }

        fn push(&mut self, name: &str, kind: u32, vlen: u32, size_or_type: u32, extra: &[u32]) {
            let name = self.name(name);
            for word in [name, kind << 24 | vlen, size_or_type].iter().chain(extra) {
                self.types.extend_from_slice(&word.to_le_bytes());
            }
        }

        /// Members as (name, type id, bit offset).
        fn composite(&mut self, name: &str, kind: u32, size: u32, members: &[(&str, u32, u32)]) {
            let extra: Vec<u32> = members.iter().flat_map(|&(n, t, o)| [self.name(n), t, o]).collect();
            self.push(name, kind, members.len() as u32, size, &extra);
        }

        fn finish(self) -> Vec<u8> {
            let mut blob = Vec::new();
            blob.extend_from_slice(&BTF_MAGIC.to_le_bytes());
            blob.extend_from_slice(&[1, 0]);
            for word in [24u32, 0, self.types.len() as u32, self.types.len() as u32, self.strings.len() as u32] {
                blob.extend_from_slice(&word.to_le_bytes());
            }
            blob.extend_from_slice(&self.types);
            blob.extend_from_slice(&self.strings);
            blob
        }
    }

    fn sample() -> Vec<u8> {
        let mut blob = Blob::new();
        blob.push("int", KIND_INT, 0, 4, &[32]); // 1
        blob.composite("", KIND_STRUCT, 8, &[("hash", 1, 0), ("len", 1, 32)]); // 2
        blob.composite("", KIND_UNION, 8, &[("", 2, 0), ("hash_len", 1, 0)]); // 3
        blob.composite("qstr", KIND_STRUCT, 16, &[("", 3, 0), ("name", 1, 64)]); // 4
        let (a, b) = (blob.name("cpu_cgrp_id"), blob.name("memory_cgrp_id"));
        blob.push("cgroup_subsys_id", KIND_ENUM, 2, 4, &[a, 0, b, 3]); // 5
        blob.push("", KIND_PTR, 0, 7, &[]); // 6
        blob.push("", KIND_FUNC_PROTO, 3, 0, &[0, 1, 0, 1, 0, 1]); // 7
        blob.push("btf_trace_x", KIND_TYPEDEF, 0, 6, &[]); // 8
                                                           // A bitfield member: with kind_flag, the top 8 bits of the offset are its size.
        let extra = [blob.name("flag"), 1, 3 << 24 | 40];
        blob.push("bits", KIND_STRUCT | 1 << 7, 1, 8, &extra); // 9
        blob.finish()
    }

    #[test]
    fn finds_members_through_anonymous_structs_and_unions() {
        let btf = Btf::parse(sample()).unwrap();
        assert_eq!(btf.member_offset("qstr", "len").unwrap(), 4);
        assert_eq!(btf.member_offset("qstr", "hash_len").unwrap(), 0);
        assert_eq!(btf.member_offset("qstr", "name").unwrap(), 8);
        assert_eq!(btf.member_offset("bits", "flag").unwrap(), 5);
        assert_eq!(btf.proto_params("btf_trace_x").unwrap(), 3);
        assert_eq!(btf.enum_value("cgroup_subsys_id", "memory_cgrp_id").unwrap(), 3);
        assert_eq!(btf.enum_value("cgroup_subsys_id", "cpu_cgrp_id").unwrap(), 0);
    }

    #[test]
    fn errors_name_the_struct_and_member() {
        let btf = Btf::parse(sample()).unwrap();
        assert_eq!(
            btf.member_offset("qstr", "nope").unwrap_err().to_string(),
            "BTF struct `qstr` has no member `nope`"
        );
        assert_eq!(btf.member_offset("dentry", "d_name").unwrap_err().to_string(), "BTF has no struct `dentry`");
        assert_eq!(
            btf.enum_value("cgroup_subsys_id", "rdma_cgrp_id").unwrap_err().to_string(),
            "BTF enum `cgroup_subsys_id` has no value `rdma_cgrp_id`"
        );
        assert_eq!(btf.enum_value("nope", "x").unwrap_err().to_string(), "BTF has no enum `nope`");
    }

    #[test]
    fn aya_finds_the_typedef_at_its_id() {
        let btf = Btf::parse(sample()).unwrap();
        // aya's types written back: the typedef at its id, nothing after it.
        let back = Btf::parse(btf.aya_typedef("btf_trace_x").unwrap().to_bytes()).unwrap();
        assert_eq!(back.find_named(&back.typedefs, "btf_trace_x"), Some(8));
        assert_eq!(back.starts.len(), 9);
        assert_eq!(
            back.proto_params("btf_trace_x").unwrap_err().to_string(),
            "BTF has no typedef `btf_trace_x` of a function prototype"
        );
        assert!(matches!(btf.aya_typedef("qstr"), Err(BtfError::NoProto(_))));
    }

    #[test]
    fn aya_numbers_this_kernels_types_as_this_reader_does() {
        let btf = Btf::from_sys_fs().expect("the test machine has /sys/kernel/btf/vmlinux");
        let name = "btf_trace_sched_process_fork";
        let id = btf.find_named(&btf.typedefs, name).unwrap();
        let aya = Btf::parse(aya::Btf::from_sys_fs().unwrap().to_bytes()).unwrap();
        assert_eq!(aya.find_named(&aya.typedefs, name), Some(id));
        let made = Btf::parse(btf.aya_typedef(name).unwrap().to_bytes()).unwrap();
        assert_eq!(made.find_named(&made.typedefs, name), Some(id));
        assert_eq!(made.starts.len(), id as usize + 1);
    }

    #[test]
    fn reads_a_file_mapped_or_into_a_mapping_of_its_own() {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &sample()).unwrap();
        let mapped = Mapping::of(&mut file).unwrap();
        assert_eq!(&*mapped, &sample()[..]);
        assert_eq!(Btf::index(Data::Mapped(mapped)).unwrap().member_offset("qstr", "name").unwrap(), 8);
        // Where the file cannot be mapped (sysfs before Linux 6.16).
        let anonymous = |len| {
            Mapping::new(len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1).unwrap()
        };
        std::io::Seek::rewind(&mut file).unwrap();
        assert_eq!(&*anonymous(sample().len()).fill(&mut file).unwrap(), &sample()[..]);
        std::io::Seek::rewind(&mut file).unwrap();
        let short = anonymous(sample().len() + 1).fill(&mut file);
        assert_eq!(short.err().map(|e| e.kind()), Some(std::io::ErrorKind::UnexpectedEof));
        assert!(Btf::index(Data::Mapped(anonymous(0).fill(&mut file).unwrap())).is_err());
    }

    #[test]
    fn rejects_malformed_blobs() {
        let blob = sample();
        assert!(matches!(Btf::parse(blob[..30].to_vec()), Err(BtfError::Malformed(_))));
        assert!(matches!(Btf::parse(vec![0; 24]), Err(BtfError::Malformed("bad magic"))));
        let mut cut = blob.clone();
        // Claim a type section one byte shorter than its types.
        cut[12] -= 1;
        assert!(Btf::parse(cut).is_err());
    }
}
