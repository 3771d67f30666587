//! A small reader for the kernel's BTF (`/sys/kernel/btf/vmlinux`): just enough to find the
//! byte offset of a struct member, looking through anonymous structs and unions, because Rust
//! eBPF has no CO-RE and the programs get their offsets from the agent.
//!
//! Format: `include/uapi/linux/btf.h` (a header, a type section, a string section).

use std::{collections::HashMap, path::Path};

use thiserror::Error;

const BTF_MAGIC: u16 = 0xeb9f;
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
}

#[derive(Clone, Debug)]
struct Member {
    /// Offset in the string section (names are compared there, not copied: vmlinux has
    /// hundreds of thousands of members).
    name_off: u32,
    type_id: u32,
    /// Offset in bits from the start of the containing struct or union.
    bit_offset: u32,
}

#[derive(Clone, Debug)]
enum Type {
    Composite {
        members: Vec<Member>,
    },
    /// typedef, const, volatile, restrict, type tag: look through to `type_id`.
    Alias {
        type_id: u32,
    },
    Ptr {
        type_id: u32,
    },
    FuncProto {
        params: u32,
    },
    /// Its enumerators: `Btf::enumerators[first..first + count]`.
    Enum {
        first: u32,
        count: u32,
    },
    Other,
}

/// The parsed type section of a BTF blob.
pub struct Btf {
    /// Index = type id (id 0 is `void`).
    types: Vec<Type>,
    /// struct names (and typedef names) to ids; the first definition wins.
    structs: HashMap<String, u32>,
    typedefs: HashMap<String, u32>,
    /// Named enums as (name offset, type id), and every enum's (name offset, value) in one
    /// vector: vmlinux has thousands of enums, and a vector each with a map of their names made
    /// the parse that start-up waits for a fifth slower (fastest of 15: 7.4 -> 8.8 ms; these
    /// two vectors: 7.0 ms).
    enums: Vec<(u32, u32)>,
    enumerators: Vec<(u32, i64)>,
    /// Name offsets of the functions (the fentry backend's attach targets).
    functions: Vec<u32>,
    strings: Vec<u8>,
}

fn u16_at(data: &[u8], at: usize) -> Result<u16, BtfError> {
    data.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]])).ok_or(BtfError::Malformed("truncated"))
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    data.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok_or(BtfError::Malformed("truncated"))
}

fn str_at(strings: &[u8], offset: u32) -> Result<String, BtfError> {
    let tail = strings.get(offset as usize..).ok_or(BtfError::Malformed("string offset out of range"))?;
    let end = tail.iter().position(|&b| b == 0).ok_or(BtfError::Malformed("unterminated string"))?;
    Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
}

impl Btf {
    pub fn from_sys_fs() -> Result<Btf, BtfError> {
        Self::from_file(Path::new("/sys/kernel/btf/vmlinux"))
    }

    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read { path: path.display().to_string(), source })?;
        Self::parse(&data)
    }

    /// Parses a little-endian BTF blob (the only byte order credwatch runs on).
    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        if u16_at(data, 0)? != BTF_MAGIC {
            return Err(BtfError::Malformed("bad magic"));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let section = |off: usize, len: usize| {
            hdr_len
                .checked_add(off)
                .and_then(|start| Some(start..start.checked_add(len)?))
                .and_then(|range| data.get(range))
                .ok_or(BtfError::Malformed("section out of range"))
        };
        let type_data = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?;

        let mut btf = Btf {
            types: vec![Type::Other],
            structs: HashMap::new(),
            typedefs: HashMap::new(),
            enums: Vec::new(),
            enumerators: Vec::new(),
            functions: Vec::new(),
            strings: strings.to_vec(),
        };
        let mut at = 0;
        while at < type_data.len() {
            let name_off = u32_at(type_data, at)?;
            let info = u32_at(type_data, at + 4)?;
            let size_or_type = u32_at(type_data, at + 8)?;
            at += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 == 1;
            let id = btf.types.len() as u32;
            let ty = match kind {
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let offset = u32_at(type_data, at + 8)?;
                        members.push(Member {
                            name_off: u32_at(type_data, at)?,
                            type_id: u32_at(type_data, at + 4)?,
                            // With kind_flag the high 8 bits are a bitfield size.
                            bit_offset: if kind_flag { offset & 0x00ff_ffff } else { offset },
                        });
                        at += 12;
                    }
                    if kind == KIND_STRUCT && name_off != 0 {
                        btf.structs.entry(str_at(strings, name_off)?).or_insert(id);
                    }
                    Type::Composite { members }
                }
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    if kind == KIND_TYPEDEF {
                        btf.typedefs.entry(str_at(strings, name_off)?).or_insert(id);
                    }
                    Type::Alias { type_id: size_or_type }
                }
                KIND_PTR => Type::Ptr { type_id: size_or_type },
                KIND_FUNC_PROTO => {
                    at += 8 * vlen;
                    Type::FuncProto { params: vlen as u32 }
                }
                KIND_ENUM => {
                    let first = btf.enumerators.len() as u32;
                    for _ in 0..vlen {
                        let value = u32_at(type_data, at + 4)?;
                        // With kind_flag the values are signed.
                        let value = if kind_flag { i64::from(value as i32) } else { i64::from(value) };
                        btf.enumerators.push((u32_at(type_data, at)?, value));
                        at += 8;
                    }
                    if name_off != 0 {
                        btf.enums.push((name_off, id));
                    }
                    Type::Enum { first, count: vlen as u32 }
                }
                KIND_FUNC => {
                    btf.functions.push(name_off);
                    Type::Other
                }
                _ => {
                    at += match kind {
                        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                        KIND_ARRAY => 12,
                        KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                        _ => 0,
                    };
                    Type::Other
                }
            };
            btf.types.push(ty);
        }
        if at != type_data.len() {
            return Err(BtfError::Malformed("type section ends inside a type"));
        }
        Ok(btf)
    }

    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..MAX_NESTING * 4 {
            match self.types.get(id as usize)? {
                Type::Alias { type_id } => id = *type_id,
                other => return Some(other),
            }
        }
        None
    }

    /// Whether the NUL-terminated string at `offset` is `name`.
    fn name_is(&self, offset: u32, name: &str) -> bool {
        let Some(tail) = self.strings.get(offset as usize..) else { return false };
        tail.strip_prefix(name.as_bytes()).is_some_and(|rest| rest.first() == Some(&0))
    }

    fn find_member(&self, id: u32, member: &str, depth: u32) -> Option<u32> {
        if depth > MAX_NESTING {
            return None;
        }
        let Some(Type::Composite { members }) = self.resolve(id) else { return None };
        if let Some(found) = members.iter().find(|m| self.name_is(m.name_off, member)) {
            return Some(found.bit_offset);
        }
        members
            .iter()
            .filter(|m| m.name_off == 0 || self.name_is(m.name_off, ""))
            .find_map(|m| Some(m.bit_offset + self.find_member(m.type_id, member, depth + 1)?))
    }

    /// Byte offset of `member` in `struct strukt`, also when it sits in an anonymous struct or
    /// union.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let id = *self.structs.get(strukt).ok_or_else(|| BtfError::NoStruct(strukt.to_owned()))?;
        self.find_member(id, member, 0)
            .map(|bits| bits / 8)
            .ok_or_else(|| BtfError::NoMember { strukt: strukt.to_owned(), member: member.to_owned() })
    }

    /// The value of `name` in `enum enumeration`.
    pub fn enum_value(&self, enumeration: &str, name: &str) -> Result<i64, BtfError> {
        let no_enum = || BtfError::NoEnum(enumeration.to_owned());
        let &(_, id) =
            self.enums.iter().find(|(name_off, _)| self.name_is(*name_off, enumeration)).ok_or_else(no_enum)?;
        let Some(&Type::Enum { first, count }) = self.types.get(id as usize) else { return Err(no_enum()) };
        self.enumerators[first as usize..(first + count) as usize]
            .iter()
            .find(|(name_off, _)| self.name_is(*name_off, name))
            .map(|&(_, value)| value)
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
        let mut id = *self.typedefs.get(name).ok_or_else(|| BtfError::NoProto(name.to_owned()))?;
        // The typedef names a pointer to the prototype.
        for _ in 0..MAX_NESTING {
            match self.types.get(id as usize) {
                Some(Type::FuncProto { params }) => return Ok(*params),
                Some(Type::Alias { type_id } | Type::Ptr { type_id }) => id = *type_id,
                _ => break,
            }
        }
        Err(BtfError::NoProto(name.to_owned()))
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
        let btf = Btf::parse(&sample()).unwrap();
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
        let btf = Btf::parse(&sample()).unwrap();
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
    fn rejects_malformed_blobs() {
        let blob = sample();
        assert!(matches!(Btf::parse(&blob[..30]), Err(BtfError::Malformed(_))));
        assert!(matches!(Btf::parse(&[0; 24]), Err(BtfError::Malformed("bad magic"))));
        let mut cut = blob.clone();
        // Claim a type section one byte shorter than its types.
        cut[12] -= 1;
        assert!(Btf::parse(&cut).is_err());
    }
}
