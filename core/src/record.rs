//! Ring buffer records -> [`Event`]s. Every record is checked (kind, declared size, actual
//! size, every length field) before any of it is read; a bad record is an error the caller
//! counts, never a panic.

use std::mem::size_of;

use credwatch_common::{
    kind, net_syscall, open_syscall, path_flag, record_flag, rename_syscall, tamper_syscall, ConnectEvent,
    DnsQueryEvent, EventHeader, ExecEvent, ExitEvent, ForkEvent, OpenEvent, RenameEvent, ResolvedPath, SyscallEvent,
    MAX_CGROUP_PATH, MAX_ENV, MAX_EXEC_RECORD, MAX_OPEN_RECORD,
};
use thiserror::Error;

use crate::{
    event::{attribution_env, Connect, DnsQuery, Event, EventData, Exec, Exit, Fork, Open, Rename, Syscall},
    names, net,
};

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {len} bytes is shorter than its header")]
    NoHeader { len: usize },
    #[error("record kind {kind} is unknown")]
    UnknownKind { kind: u32 },
    #[error("{} record (kind {kind}) declares {declared} bytes, has {len}, expects {expected}", kind_name(.kind))]
    BadSize { kind: u32, declared: u32, len: usize, expected: usize },
    #[error(
        "exec record of pid {pid}: its {hierarchy} cgroup path is {len} bytes, more than the kernel sends ({max})"
    )]
    CgroupTooLong { pid: u32, hierarchy: &'static str, len: u32, max: usize },
    #[error("query sent to port 53: {0}")]
    Dns(#[from] net::DnsError),
}

/// What a record of `kind` is, for error messages.
fn kind_name(kind: &u32) -> &'static str {
    match *kind {
        kind::EXEC => "exec",
        kind::FORK => "fork",
        kind::EXIT => "exit",
        kind::OPEN => "open",
        kind::RENAME => "rename",
        kind::SYSCALL => "syscall",
        kind::CONNECT => "connect",
        kind::DNS_QUERY => "DNS query",
        _ => "unknown",
    }
}

/// Plain kernel records: `#[repr(C)]`, integers and integer arrays only, so every byte
/// pattern is a valid value.
///
/// # Safety
/// Implement only for such types.
unsafe trait Record: Copy {
    const KIND: u32;
}
// SAFETY: ABI records, checked padding-free by the ABI crate's layout tests.
unsafe impl Record for ExecEvent {
    const KIND: u32 = kind::EXEC;
}
// SAFETY: as above.
unsafe impl Record for ForkEvent {
    const KIND: u32 = kind::FORK;
}
// SAFETY: as above.
unsafe impl Record for ExitEvent {
    const KIND: u32 = kind::EXIT;
}
// SAFETY: as above.
unsafe impl Record for OpenEvent {
    const KIND: u32 = kind::OPEN;
}
// SAFETY: as above.
unsafe impl Record for RenameEvent {
    const KIND: u32 = kind::RENAME;
}
// SAFETY: as above.
unsafe impl Record for SyscallEvent {
    const KIND: u32 = kind::SYSCALL;
}
// SAFETY: as above.
unsafe impl Record for ConnectEvent {
    const KIND: u32 = kind::CONNECT;
}
// SAFETY: as above.
unsafe impl Record for DnsQueryEvent {
    const KIND: u32 = kind::DNS_QUERY;
}

/// Copies a `T` out of `bytes` once its kind and sizes are checked.
fn record<T: Record>(bytes: &[u8], header: &EventHeader) -> Result<Box<T>, DecodeError> {
    let expected = size_of::<T>();
    if header.size as usize != expected || bytes.len() < expected {
        return Err(DecodeError::BadSize { kind: T::KIND, declared: header.size, len: bytes.len(), expected });
    }
    let mut value = Box::<T>::new_uninit();
    // SAFETY: bytes holds at least size_of::<T>() bytes, and any bit pattern is a valid T
    // (Record). The copy is bytewise, so alignment of `bytes` does not matter.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), value.as_mut_ptr().cast::<u8>(), expected);
        Ok(value.assume_init())
    }
}

/// Turns kernel timestamps (`CLOCK_BOOTTIME`) into wall-clock time. The offset between the two
/// clocks is read at each conversion (two vDSO calls, 50 ns measured): a wall clock stepped
/// during a run (NTP, `date -s`) moves every later conversion with it, and the two ends of a
/// span converted together keep its true length.
#[derive(Clone, Copy, Debug, Default)]
pub struct Decoder;

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec; both clocks exist on every Linux credwatch runs on.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder
    }

    /// Wall-clock nanoseconds since the epoch for a `CLOCK_BOOTTIME` timestamp.
    pub fn wall_ns(&self, boot_ns: u64) -> u64 {
        let boot_to_wall_ns = clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_BOOTTIME);
        u64::try_from(i128::from(boot_ns) + boot_to_wall_ns).unwrap_or(0)
    }

    /// Decodes a record; an open of a credential inode is named by `cred_path(index)`.
    pub fn decode(&self, bytes: &[u8], cred_path: &dyn Fn(u32) -> Option<String>) -> Result<Event, DecodeError> {
        if bytes.len() < size_of::<EventHeader>() {
            return Err(DecodeError::NoHeader { len: bytes.len() });
        }
        // SAFETY: EventHeader is plain integers and the length is checked above.
        let header: EventHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let data = match header.kind {
            kind::EXEC => EventData::Exec(exec(bytes, &header)?),
            kind::FORK => EventData::Fork(Fork { child_pid: record::<ForkEvent>(bytes, &header)?.child_pid }),
            kind::EXIT => {
                let exit = record::<ExitEvent>(bytes, &header)?;
                EventData::Exit(Exit { code: exit.exit_code, repeats: exit.repeats.into() })
            }
            kind::OPEN => EventData::Open(open(bytes, &header, cred_path)?),
            kind::RENAME => EventData::Rename(rename(&*record::<RenameEvent>(bytes, &header)?)),
            kind::SYSCALL => EventData::Syscall(syscall(&*record::<SyscallEvent>(bytes, &header)?)),
            kind::CONNECT => EventData::Connect(connect(&*record::<ConnectEvent>(bytes, &header)?)),
            kind::DNS_QUERY => EventData::DnsQuery(dns_query(&*record::<DnsQueryEvent>(bytes, &header)?)?),
            kind => return Err(DecodeError::UnknownKind { kind }),
        };
        Ok(Event { time_ns: self.wall_ns(header.boot_ns), pid: header.pid, data })
    }
}

/// `bytes[..len]`, with `len` clamped to the buffer (a lying length is not trusted).
fn used(bytes: &[u8], len: u32) -> &[u8] {
    &bytes[..bytes.len().min(len as usize)]
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// NUL-separated words (argv), without the empty word after the final NUL.
pub fn words(block: &[u8]) -> Vec<String> {
    let block = block.strip_suffix(&[0]).unwrap_or(block);
    if block.is_empty() {
        return Vec::new();
    }
    block.split(|&b| b == 0).map(lossy).collect()
}

/// The absolute path of a [`ResolvedPath`] (components leaf first, each followed by `/`), or
/// `None` when unresolved. The second value says it was truncated (leading components lost).
pub fn resolved_path(path: &ResolvedPath) -> (Option<String>, bool) {
    absolute_path(used(&path.data, path.len), path.flags)
}

/// The absolute path of resolved components (leaf first, each followed by `/`) with their
/// [`path_flag`] bits; see [`resolved_path`].
fn absolute_path(leaf_first: &[u8], flags: u32) -> (Option<String>, bool) {
    if flags & path_flag::UNRESOLVED != 0 {
        return (None, false);
    }
    let mut absolute = String::new();
    for component in leaf_first.split(|&b| b == b'/').rev().filter(|c| !c.is_empty()) {
        absolute.push('/');
        absolute.push_str(&String::from_utf8_lossy(component));
    }
    if absolute.is_empty() {
        absolute.push('/');
    }
    (Some(absolute), flags & path_flag::TRUNCATED != 0)
}

/// The kernel's `dev_t` (major << 20 | minor) in userspace `st_dev` encoding.
pub fn user_dev(kernel_dev: u64) -> u64 {
    libc::makedev((kernel_dev >> 20) as u32, (kernel_dev & 0xf_ffff) as u32)
}

/// The fixed part of a variable-length record of kind `kind` and its tail (the bytes after the
/// fixed part, up to the declared size), once the declared size is checked against the bytes
/// and against the largest record the kernel sends.
fn variable<'a, T: Record>(bytes: &'a [u8], header: &EventHeader, max: usize) -> Result<(T, &'a [u8]), DecodeError> {
    let fixed = size_of::<T>();
    let declared = header.size as usize;
    if declared < fixed || declared > max || bytes.len() < declared {
        return Err(DecodeError::BadSize { kind: T::KIND, declared: header.size, len: bytes.len(), expected: fixed });
    }
    // SAFETY: T is plain integers (Record) and `bytes` holds at least `fixed` bytes; the read is
    // unaligned-safe.
    let value: T = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    Ok((value, &bytes[fixed..declared]))
}

/// Splits `tail` into parts of `lengths`, which must add up to all of it.
fn split_parts<'a, const N: usize>(
    tail: &'a [u8],
    lengths: [u32; N],
    kind: u32,
    header: &EventHeader,
    fixed: usize,
) -> Result<[&'a [u8]; N], DecodeError> {
    let total = lengths.iter().try_fold(0usize, |sum, &len| sum.checked_add(len as usize));
    if total != Some(tail.len()) {
        let expected = fixed.saturating_add(total.unwrap_or(usize::MAX));
        return Err(DecodeError::BadSize { kind, declared: header.size, len: fixed + tail.len(), expected });
    }
    let mut rest = tail;
    Ok(lengths.map(|len| {
        let (part, after) = rest.split_at(len as usize);
        rest = after;
        part
    }))
}

/// A cgroup path of an exec record (leaf first, as a resolved path): absolute, `/` for the
/// root, `None` when not read. One whose leading components were cut (deeper than
/// [`credwatch_common::MAX_CGROUP_DEPTH`] or longer than [`MAX_CGROUP_PATH`]) starts with
/// `...` instead of `/`, so that it is never taken for a whole path: its leaf, where container
/// ids are, is still there.
fn cgroup_path(leaf_first: &[u8], flags: u32) -> Option<String> {
    match absolute_path(leaf_first, flags) {
        (Some(path), true) => Some(format!("...{path}")),
        (path, false) => path,
        (None, true) => None,
    }
}

/// An exec record: [`ExecEvent`], then filename, argv, environment, executable, cwd and the
/// two cgroup paths.
fn exec(bytes: &[u8], header: &EventHeader) -> Result<Exec, DecodeError> {
    let (event, tail) = variable::<ExecEvent>(bytes, header, MAX_EXEC_RECORD)?;
    for (hierarchy, len) in [("v1", event.cgroup_v1_len), ("v2", event.cgroup_v2_len)] {
        if len as usize > MAX_CGROUP_PATH {
            return Err(DecodeError::CgroupTooLong { pid: header.pid, hierarchy, len, max: MAX_CGROUP_PATH });
        }
    }
    let lengths = [
        event.filename_len,
        event.args_len,
        event.env_len,
        event.executable_len,
        event.cwd_len,
        event.cgroup_v1_len,
        event.cgroup_v2_len,
    ];
    let [filename, args, env, executable, cwd, cgroup_v1, cgroup_v2] =
        split_parts(tail, lengths, kind::EXEC, header, size_of::<ExecEvent>())?;
    let cgroups = [(cgroup_v1, event.cgroup_v1_flags), (cgroup_v2, event.cgroup_v2_flags)]
        .into_iter()
        .filter_map(|(path, flags)| cgroup_path(path, flags))
        .collect();
    Ok(Exec {
        ppid: event.ppid,
        filename: lossy(filename),
        executable: absolute_path(executable, event.executable_flags).0.unwrap_or_default(),
        args: words(args),
        cwd: absolute_path(cwd, event.cwd_flags).0.unwrap_or_default(),
        uid: event.header.uid,
        gid: event.header.gid,
        cgroup_id: event.header.cgroup_id,
        cgroups,
        // Only a foreign trace states one; the kernel's are the cgroups.
        stated_container: None,
        env: attribution_env(whole_variables(env)),
        seeded: false,
        project: None,
        script: None,
    })
}

/// An environment the kernel cut at [`MAX_ENV`] ends inside its last variable: that one is left
/// out, as if past the cut, rather than kept with a value cut short (a CI run id, a package
/// version) that would name something else.
fn whole_variables(env: &[u8]) -> &[u8] {
    match env.iter().rposition(|&b| b == 0) {
        Some(last_end) if env.len() >= MAX_ENV => &env[..last_end],
        None if env.len() >= MAX_ENV => &[],
        _ => env,
    }
}

pub fn syscall_name(syscall: u32) -> &'static str {
    match syscall {
        open_syscall::OPEN => "open",
        open_syscall::OPENAT => "openat",
        open_syscall::OPENAT2 => "openat2",
        open_syscall::CREAT => "creat",
        open_syscall::OPEN_BY_HANDLE_AT => "open_by_handle_at",
        open_syscall::FILE_OPEN => "file_open",
        _ => "unknown",
    }
}

/// An open record: [`OpenEvent`], then `given_len` bytes of the given path, then `path_len`
/// bytes of the resolved path; the lengths must add up to the declared size.
fn open(bytes: &[u8], header: &EventHeader, cred_path: &dyn Fn(u32) -> Option<String>) -> Result<Open, DecodeError> {
    let (event, tail) = variable::<OpenEvent>(bytes, header, MAX_OPEN_RECORD)?;
    let [given, resolved] =
        split_parts(tail, [event.given_len, event.path_len], kind::OPEN, header, size_of::<OpenEvent>())?;
    // A denied open failed, but the LSM hook saw the file it refused and resolved its path.
    let denied = event.record_flags & record_flag::DENIED != 0;
    let opened = event.ret >= 0 || denied;
    let (abs_path, truncated) = if opened { absolute_path(resolved, event.path_flags) } else { (None, false) };
    let cred = event.record_flags & record_flag::CRED_INODE != 0;
    Ok(Open {
        same_file_as: if cred { cred_path(event.cred_index) } else { None },
        blocked: event.record_flags & record_flag::BLOCKED != 0,
        denied,
        fail_closed: event.record_flags & record_flag::FAIL_CLOSED != 0,
        tid: event.header.tid,
        syscall: syscall_name(event.syscall).to_owned(),
        dirfd: event.dirfd,
        flags: event.flags,
        mode: event.mode,
        path: lossy(given),
        abs_path,
        truncated,
        ret: event.ret,
        dev: if opened { user_dev(event.dev) } else { 0 },
        ino: if opened { event.ino } else { 0 },
        repeats: event.repeats.into(),
    })
}

fn rename_name(syscall: u32) -> &'static str {
    match syscall {
        rename_syscall::RENAME => "rename",
        rename_syscall::RENAMEAT => "renameat",
        rename_syscall::RENAMEAT2 => "renameat2",
        rename_syscall::LINK => "link",
        rename_syscall::LINKAT => "linkat",
        rename_syscall::SYMLINK => "symlink",
        rename_syscall::SYMLINKAT => "symlinkat",
        _ => "unknown",
    }
}

/// `given` made absolute: as is when absolute, else joined to `dir` (resolved in the kernel).
/// `.` and `..` components are left in place: the kernel did not resolve the path itself.
fn absolute(given: &str, dir: Option<&str>) -> Option<String> {
    if given.starts_with('/') {
        return Some(given.to_owned());
    }
    let dir = dir?;
    if given.is_empty() {
        return None;
    }
    Some(if dir.ends_with('/') { format!("{dir}{given}") } else { format!("{dir}/{given}") })
}

fn rename(event: &RenameEvent) -> Rename {
    let old_path = lossy(used(&event.old, event.old_len));
    let new_path = lossy(used(&event.new, event.new_len));
    let (old_dir, old_truncated) = resolved_path(&event.old_dir);
    let (new_dir, new_truncated) = resolved_path(&event.new_dir);
    // A truncated directory would give a wrong absolute path: better none.
    let new_abs = absolute(&new_path, new_dir.as_deref().filter(|_| !new_truncated));
    let symlink = matches!(event.syscall, rename_syscall::SYMLINK | rename_syscall::SYMLINKAT);
    let old_abs = if symlink {
        // A relative symlink target is relative to the link's own directory.
        let link_dir =
            new_abs.as_deref().and_then(|p| p.rsplit_once('/')).map(|(dir, _)| if dir.is_empty() { "/" } else { dir });
        absolute(&old_path, link_dir)
    } else {
        absolute(&old_path, old_dir.as_deref().filter(|_| !old_truncated))
    };
    Rename {
        tid: event.header.tid,
        syscall: rename_name(event.syscall).to_owned(),
        old_path,
        new_path,
        old_abs,
        new_abs,
        ret: event.ret,
    }
}

fn tamper_name(syscall: u32) -> &'static str {
    match syscall {
        tamper_syscall::PTRACE => "ptrace",
        tamper_syscall::PROCESS_VM_READV => "process_vm_readv",
        tamper_syscall::PROCESS_VM_WRITEV => "process_vm_writev",
        tamper_syscall::BPF => "bpf",
        tamper_syscall::INIT_MODULE => "init_module",
        tamper_syscall::FINIT_MODULE => "finit_module",
        tamper_syscall::KILL => "kill",
        tamper_syscall::TKILL => "tkill",
        tamper_syscall::TGKILL => "tgkill",
        tamper_syscall::PIDFD_SEND_SIGNAL => "pidfd_send_signal",
        tamper_syscall::IO_URING_SETUP => "io_uring_setup",
        tamper_syscall::IO_URING_SUBMIT_REQ => "io_uring_submit_req",
        _ => "unknown",
    }
}

/// The [`tamper_syscall`] number of a syscall name as [`Syscall::name`] gives it.
pub fn tamper_number(name: &str) -> Option<u32> {
    (1..=tamper_syscall::IO_URING_SUBMIT_REQ).find(|&n| tamper_name(n) == name)
}

fn syscall(event: &SyscallEvent) -> Syscall {
    let op = event.operation;
    let operation = match event.syscall {
        tamper_syscall::PTRACE => Some(names::or_number(names::ptrace_request(op), op)),
        tamper_syscall::BPF => Some(names::or_number(names::bpf_command(op), op)),
        tamper_syscall::KILL | tamper_syscall::TKILL | tamper_syscall::TGKILL | tamper_syscall::PIDFD_SEND_SIGNAL => {
            Some(names::or_number(names::signal_name(op), op))
        }
        tamper_syscall::IO_URING_SUBMIT_REQ => Some(names::or_number(names::io_uring_op(op), op)),
        _ => None,
    };
    Syscall {
        tid: event.header.tid,
        name: tamper_name(event.syscall).to_owned(),
        target_pid: (event.record_flags & record_flag::HAS_TARGET != 0).then_some(event.target_pid),
        operation,
        ret: (event.record_flags & record_flag::HAS_RET != 0).then_some(event.ret),
        blocked: event.record_flags & record_flag::BLOCKED != 0,
        denied: event.record_flags & record_flag::DENIED != 0,
        repeats: event.repeats.into(),
    }
}

fn connect(event: &ConnectEvent) -> Connect {
    let addr = net::sockaddr(used(&event.addr, event.copied));
    Connect {
        tid: event.header.tid,
        family: addr.family,
        socket_type: net::socket_type_name(event.sock_type),
        address: addr.address,
        port: addr.port,
        path: addr.path,
        ret: None,
        held: event.record_flags & record_flag::HELD != 0,
        fail_closed: event.record_flags & record_flag::FAIL_CLOSED != 0,
        proxy_refused: None,
        repeats: event.repeats.into(),
    }
}

/// The name of a [`net_syscall`].
pub fn net_name(syscall: u32) -> &'static str {
    match syscall {
        net_syscall::CONNECT => "connect",
        net_syscall::SENDTO => "sendto",
        net_syscall::SENDMSG => "sendmsg",
        net_syscall::SENDMMSG => "sendmmsg",
        _ => "unknown",
    }
}

fn dns_query(event: &DnsQueryEvent) -> Result<DnsQuery, DecodeError> {
    let (name, qtype) = net::dns_question_any(used(&event.payload, event.copied))?;
    let server = net::sockaddr(used(&event.addr, event.addr_len));
    Ok(DnsQuery {
        tid: event.header.tid,
        name,
        qtype: net::qtype_name(qtype),
        server: server.address.zip(server.port).map(|(address, port)| net::host_port(&address, port)),
    })
}

#[cfg(test)]
mod tests {
    use credwatch_common::{Mark, MAX_RESOLVED_PATH};

    use super::*;

    fn decode(decoder: &Decoder, bytes: &[u8]) -> Result<Event, DecodeError> {
        decoder.decode(bytes, &|_| None)
    }

    fn bytes_of<T: Record>(value: &T) -> Vec<u8> {
        // SAFETY: Record types are plain integers without padding.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    fn header(kind: u32, size: usize) -> EventHeader {
        EventHeader {
            kind,
            size: size as u32,
            boot_ns: 5_000,
            pid: 42,
            tid: 43,
            uid: 1000,
            gid: 1001,
            cgroup_id: 7,
            mark: Mark { root_pid: 40, depth: 2, manager: 0, flags: 0 },
        }
    }

    fn resolved(leaf_first: &[u8], flags: u32) -> ResolvedPath {
        let mut path = ResolvedPath { len: leaf_first.len() as u32, flags, data: [0; MAX_RESOLVED_PATH] };
        path.data[..leaf_first.len()].copy_from_slice(leaf_first);
        path
    }

    /// An open record as the kernel sends it: the fixed part, the given path, the resolved one.
    struct OpenRecord {
        event: OpenEvent,
        given: Vec<u8>,
        leaf_first: Vec<u8>,
    }

    impl OpenRecord {
        fn new(ret: i64) -> OpenRecord {
            let event = OpenEvent {
                syscall: open_syscall::OPENAT,
                dirfd: 3,
                flags: 0o2,
                ret,
                dev: (8 << 20) | 1,
                ino: 1234,
                ..OpenEvent::default()
            };
            OpenRecord { event, given: b"id_rsa".to_vec(), leaf_first: b"id_rsa/.ssh/alice/home/".to_vec() }
        }

        fn bytes(&self) -> Vec<u8> {
            let mut event = self.event;
            event.given_len = self.given.len() as u32;
            event.path_len = self.leaf_first.len() as u32;
            event.header = header(kind::OPEN, size_of::<OpenEvent>() + self.given.len() + self.leaf_first.len());
            let mut bytes = bytes_of(&event);
            bytes.extend_from_slice(&self.given);
            bytes.extend_from_slice(&self.leaf_first);
            bytes
        }
    }

    #[test]
    fn decodes_an_open_with_its_absolute_path() {
        let decoder = Decoder::new();
        let event = decode(&decoder, &OpenRecord::new(4).bytes()).unwrap();
        // The record was made 5 µs after boot: now minus the time since boot, plus 5 µs.
        let offset = clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_BOOTTIME);
        assert!((i128::from(event.time_ns) - (offset + 5_000)).abs() < 1_000_000, "{}", event.time_ns);
        assert_eq!(event.pid, 42);
        let EventData::Open(open) = event.data else { panic!("not an open: {event:?}") };
        assert_eq!(open.tid, 43);
        assert_eq!(open.syscall, "openat");
        assert_eq!(open.dirfd, 3);
        assert_eq!(open.path, "id_rsa");
        assert_eq!(open.abs_path.as_deref(), Some("/home/alice/.ssh/id_rsa"));
        assert!(!open.truncated);
        assert_eq!(open.dev, libc::makedev(8, 1));
        assert_eq!(open.ino, 1234);
    }

    #[test]
    fn failed_and_unresolved_opens_have_no_absolute_path() {
        let decoder = Decoder::new();
        let mut failed = OpenRecord::new(-2);
        failed.leaf_first.clear();
        let EventData::Open(open) = decode(&decoder, &failed.bytes()).unwrap().data else { panic!() };
        assert_eq!((open.abs_path, open.ret, open.dev, open.ino), (None, -2, 0, 0));
        assert_eq!(open.path, "id_rsa");

        let mut record = OpenRecord::new(3);
        record.event.path_flags = path_flag::UNRESOLVED;
        let EventData::Open(open) = decode(&decoder, &record.bytes()).unwrap().data else { panic!() };
        assert_eq!(open.abs_path, None);
    }

    #[test]
    fn open_lengths_must_add_up_to_the_record() {
        let decoder = Decoder::new();
        let mut bytes = OpenRecord::new(3).bytes();
        // given_len claims more than the record holds.
        bytes[std::mem::offset_of!(OpenEvent, given_len)] = 200;
        assert!(matches!(decode(&decoder, &bytes), Err(DecodeError::BadSize { kind: kind::OPEN, .. })));
        // A declared size past the largest record the kernel can send.
        let mut bytes = OpenRecord::new(3).bytes();
        bytes[4..8].copy_from_slice(&(MAX_OPEN_RECORD as u32 + 1).to_ne_bytes());
        assert!(matches!(decode(&decoder, &bytes), Err(DecodeError::BadSize { kind: kind::OPEN, .. })));
    }

    #[test]
    fn resolves_root_truncation_and_lying_lengths() {
        assert_eq!(resolved_path(&resolved(b"", 0)), (Some("/".into()), false));
        assert_eq!(resolved_path(&resolved(b"c/b/", path_flag::TRUNCATED)), (Some("/b/c".into()), true));
        let mut path = resolved(b"x/", 0);
        // A length past the buffer is clamped to it, not trusted.
        path.len = u32::MAX;
        assert!(resolved_path(&path).0.unwrap().ends_with("/x"));
    }

    /// An exec record as the kernel sends it: filename, argv, environment, executable, cwd,
    /// the v1 and v2 cgroups.
    fn exec_bytes(mut exec: ExecEvent, parts: [&[u8]; 7]) -> Vec<u8> {
        [
            exec.filename_len,
            exec.args_len,
            exec.env_len,
            exec.executable_len,
            exec.cwd_len,
            exec.cgroup_v1_len,
            exec.cgroup_v2_len,
        ] = parts.map(|part| part.len() as u32);
        exec.header = header(kind::EXEC, size_of::<ExecEvent>() + parts.iter().map(|p| p.len()).sum::<usize>());
        let mut bytes = bytes_of(&exec);
        parts.iter().for_each(|part| bytes.extend_from_slice(part));
        bytes
    }

    #[test]
    fn exec_lengths_must_add_up_to_the_record() {
        let decoder = Decoder::new();
        let parts: [&[u8]; 7] = [b"/bin/sh", b"sh\0", b"", b"sh/bin/", b"/", b"", b""];
        let mut bytes = exec_bytes(ExecEvent::default(), parts);
        assert!(decode(&decoder, &bytes).is_ok());
        // env_len claims bytes the record does not have.
        bytes[std::mem::offset_of!(ExecEvent, env_len)] = 9;
        assert!(matches!(decode(&decoder, &bytes), Err(DecodeError::BadSize { kind: kind::EXEC, .. })));
        let short = exec_bytes(ExecEvent::default(), parts);
        assert!(matches!(decode(&decoder, &short[..short.len() - 1]), Err(DecodeError::BadSize { .. })));
    }

    #[test]
    fn a_variable_cut_at_the_environment_limit_is_left_out() {
        let decoder = Decoder::new();
        let env_of = |block: &[u8]| {
            let parts: [&[u8]; 7] = [b"/bin/sh", b"sh\0", block, b"sh/bin/", b"/", b"", b""];
            let EventData::Exec(exec) = decode(&decoder, &exec_bytes(ExecEvent::default(), parts)).unwrap().data else {
                panic!()
            };
            exec.env
        };
        let filler = format!("FILLER={}\0", "x".repeat(MAX_ENV - 100));
        let whole = format!("{filler}GITHUB_RUN_ID=9876543210\0");
        assert_eq!(env_of(whole.as_bytes())["GITHUB_RUN_ID"], "9876543210");
        // The kernel's copy stops at MAX_ENV, inside the run id's value (`98765000...`).
        let cut = format!("{filler}GITHUB_RUN_ID=98765{}", "0".repeat(MAX_ENV));
        assert!(!env_of(&cut.as_bytes()[..MAX_ENV]).contains_key("GITHUB_RUN_ID"));
        // Below the limit the last variable is whole, with or without its NUL.
        assert_eq!(env_of(b"HOME=/home/alice")["HOME"], "/home/alice");
    }

    const CONTAINER: &str = "2f1d8c0c5a0b7e1e9d4c3b2a19080706f5e4d3c2b1a09f8e7d6c5b4a39281706";

    #[test]
    fn decodes_cgroup_paths_of_both_hierarchies() {
        let decoder = Decoder::new();
        let v1 = format!("{CONTAINER}/docker/");
        let v2 = format!(
            "cri-containerd-{CONTAINER}.scope/kubepods-besteffort-pod0f3c_9a1e.slice/kubepods-besteffort.slice/kubepods.slice/"
        );
        let parts: [&[u8]; 7] = [b"/bin/sh", b"sh\0", b"", b"sh/bin/", b"/", v1.as_bytes(), v2.as_bytes()];
        let cgroups = |exec: ExecEvent| {
            let EventData::Exec(exec) = decode(&decoder, &exec_bytes(exec, parts)).unwrap().data else { panic!() };
            exec.cgroups
        };
        assert_eq!(
            cgroups(ExecEvent::default()),
            [
                format!("/docker/{CONTAINER}"),
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f3c_9a1e.slice/cri-containerd-{CONTAINER}.scope"
                )
            ]
        );
        // A hierarchy not read (not mounted) is left out; one cut at the depth or length limit
        // keeps its leaf, marked as cut.
        let v1_only = ExecEvent { cgroup_v2_flags: path_flag::UNRESOLVED, ..ExecEvent::default() };
        assert_eq!(cgroups(v1_only), [format!("/docker/{CONTAINER}")]);
        let cut = ExecEvent {
            cgroup_v1_flags: path_flag::UNRESOLVED,
            cgroup_v2_flags: path_flag::TRUNCATED,
            ..ExecEvent::default()
        };
        let cut = cgroups(cut);
        assert_eq!(cut.len(), 1);
        assert!(cut[0].starts_with(".../kubepods.slice/") && cut[0].ends_with(".scope"), "{cut:?}");
        // Odd bytes are replaced, not trusted.
        let parts: [&[u8]; 7] = [b"", b"", b"", b"", b"", b"a\xff/", b"/"];
        let EventData::Exec(exec) = decode(&decoder, &exec_bytes(ExecEvent::default(), parts)).unwrap().data else {
            panic!()
        };
        assert_eq!(exec.cgroups, ["/a\u{fffd}", "/"]);
    }

    #[test]
    fn cgroup_lengths_are_checked() {
        let decoder = Decoder::new();
        let long = vec![b'a'; MAX_CGROUP_PATH + 1];
        let parts: [&[u8]; 7] = [b"", b"", b"", b"", b"", b"", &long];
        let error = decode(&decoder, &exec_bytes(ExecEvent::default(), parts)).unwrap_err();
        assert_eq!(
            error,
            DecodeError::CgroupTooLong {
                pid: 42,
                hierarchy: "v2",
                len: MAX_CGROUP_PATH as u32 + 1,
                max: MAX_CGROUP_PATH
            }
        );
        assert_eq!(
            error.to_string(),
            "exec record of pid 42: its v2 cgroup path is 1025 bytes, more than the kernel sends (1024)"
        );
        // At the limit it decodes.
        let parts: [&[u8]; 7] = [b"", b"", b"", b"", b"", b"", &long[..MAX_CGROUP_PATH]];
        assert!(decode(&decoder, &exec_bytes(ExecEvent::default(), parts)).is_ok());
        // A cgroup length that the record does not hold.
        let parts: [&[u8]; 7] = [b"", b"", b"", b"", b"", b"x/", b"y/"];
        let mut bytes = exec_bytes(ExecEvent::default(), parts);
        bytes[std::mem::offset_of!(ExecEvent, cgroup_v1_len)] = 3;
        let error = decode(&decoder, &bytes).unwrap_err();
        assert!(matches!(error, DecodeError::BadSize { kind: kind::EXEC, .. }));
        assert!(error.to_string().starts_with("exec record (kind 1) declares"), "{error}");
    }

    #[test]
    fn decodes_exec_fork_exit() {
        let decoder = Decoder::new();
        let exec = ExecEvent { ppid: 41, ..ExecEvent::default() };
        let parts: [&[u8]; 7] = [
            b"/bin/npm",
            b"npm\0install\0",
            b"NPM_TOKEN=secret\0npm_package_name=evil\0",
            b"node/bin/usr/",
            b"proj/",
            b"",
            b"",
        ];
        let bytes = exec_bytes(exec, parts);
        let event = decode(&decoder, &bytes).unwrap();
        let EventData::Exec(data) = event.data else { panic!() };
        assert_eq!(data.ppid, 41);
        assert_eq!(data.filename, "/bin/npm");
        assert_eq!(data.args, ["npm", "install"]);
        assert_eq!(data.executable, "/usr/bin/node");
        assert_eq!(data.cwd, "/proj");
        assert_eq!((data.uid, data.gid, data.cgroup_id), (1000, 1001, 7));
        assert_eq!(data.env.len(), 1, "secrets are dropped: {:?}", data.env);
        assert_eq!(data.env["npm_package_name"], "evil");
        // Both hierarchies read, the process in their roots.
        assert_eq!(data.cgroups, ["/", "/"]);

        let fork = ForkEvent { header: header(kind::FORK, size_of::<ForkEvent>()), child_pid: 50, child_depth: 3 };
        assert_eq!(decode(&decoder, &bytes_of(&fork)).unwrap().data, EventData::Fork(Fork { child_pid: 50 }));
        let exit = ExitEvent { header: header(kind::EXIT, size_of::<ExitEvent>()), exit_code: 256, repeats: 0 };
        assert_eq!(decode(&decoder, &bytes_of(&exit)).unwrap().data, EventData::Exit(Exit { code: 256, repeats: 0 }));
    }

    #[test]
    fn rejects_short_unknown_and_mis_sized_records() {
        let decoder = Decoder::new();
        assert_eq!(decode(&decoder, &[0; 10]), Err(DecodeError::NoHeader { len: 10 }));

        let open = OpenRecord::new(3).bytes();
        let cut = &open[..open.len() - 1];
        assert!(matches!(decode(&decoder, cut), Err(DecodeError::BadSize { kind: kind::OPEN, .. })));
        assert!(matches!(decode(&decoder, &open[..size_of::<EventHeader>()]), Err(DecodeError::BadSize { .. })));

        let mut wrong_size = ForkEvent { header: header(kind::FORK, 1000), child_pid: 1, child_depth: 1 };
        assert!(matches!(decode(&decoder, &bytes_of(&wrong_size)), Err(DecodeError::BadSize { declared: 1000, .. })));
        wrong_size.header = header(99, size_of::<ForkEvent>());
        assert_eq!(decode(&decoder, &bytes_of(&wrong_size)), Err(DecodeError::UnknownKind { kind: 99 }));
    }

    #[test]
    fn names_credential_inodes_and_blocks() {
        let decoder = Decoder::new();
        let mut record = OpenRecord::new(4);
        record.event.record_flags = record_flag::CRED_INODE | record_flag::BLOCKED;
        record.event.cred_index = 7;
        let names = |index: u32| (index == 7).then(|| "/home/alice/.ssh/id_rsa".to_owned());
        let EventData::Open(open) = decoder.decode(&record.bytes(), &names).unwrap().data else { panic!() };
        assert_eq!(open.same_file_as.as_deref(), Some("/home/alice/.ssh/id_rsa"));
        assert!(open.blocked);
        // Without the flag the index means nothing.
        record.event.record_flags = 0;
        let EventData::Open(open) = decoder.decode(&record.bytes(), &names).unwrap().data else { panic!() };
        assert_eq!((open.same_file_as, open.blocked), (None, false));
        record.event.syscall = open_syscall::OPEN_BY_HANDLE_AT;
        let EventData::Open(open) = decode(&decoder, &record.bytes()).unwrap().data else { panic!() };
        assert_eq!(open.syscall, "open_by_handle_at");
        assert!(!open.denied);
        record.event.syscall = open_syscall::FILE_OPEN;
        let EventData::Open(open) = decode(&decoder, &record.bytes()).unwrap().data else { panic!() };
        assert_eq!(open.syscall, "file_open");
    }

    #[test]
    fn a_denied_open_failed_and_names_the_file_it_refused() {
        let decoder = Decoder::new();
        let mut record = OpenRecord::new(-1);
        record.event.record_flags = record_flag::CRED_INODE | record_flag::DENIED;
        let EventData::Open(open) = decode(&decoder, &record.bytes()).unwrap().data else { panic!() };
        assert!(open.denied && !open.blocked && !open.fail_closed);
        assert_eq!((open.ret, open.abs_path.as_deref(), open.ino), (-1, Some("/home/alice/.ssh/id_rsa"), 1234));
        // Refused because no agent was reading (`--enforce` fails closed).
        record.event.record_flags = record_flag::CRED_INODE | record_flag::DENIED | record_flag::FAIL_CLOSED;
        let EventData::Open(open) = decode(&decoder, &record.bytes()).unwrap().data else { panic!() };
        assert!(open.denied && open.fail_closed);
        // An open that failed on its own resolved nothing.
        record.event.record_flags = 0;
        let EventData::Open(open) = decode(&decoder, &record.bytes()).unwrap().data else { panic!() };
        assert_eq!((open.denied, open.abs_path, open.ino), (false, None, 0));
    }

    fn rename_record(syscall: u32, old: &[u8], new: &[u8]) -> Box<RenameEvent> {
        // SAFETY: all-zero is a valid RenameEvent.
        let mut event: Box<RenameEvent> = unsafe { Box::new_zeroed().assume_init() };
        event.header = header(kind::RENAME, size_of::<RenameEvent>());
        event.syscall = syscall;
        event.old[..old.len()].copy_from_slice(old);
        event.old_len = old.len() as u32;
        event.new[..new.len()].copy_from_slice(new);
        event.new_len = new.len() as u32;
        event.old_dir = resolved(b"", path_flag::UNRESOLVED);
        event.new_dir = resolved(b"", path_flag::UNRESOLVED);
        event
    }

    #[test]
    fn decodes_renames_with_absolute_paths() {
        let decoder = Decoder::new();
        let mut record = rename_record(rename_syscall::RENAMEAT2, b"key.tmp", b"/home/alice/.ssh/id_rsa");
        record.old_dir = resolved(b"work/alice/home/", 0);
        record.ret = -17;
        let EventData::Rename(rename) = decode(&decoder, &bytes_of(&*record)).unwrap().data else { panic!() };
        assert_eq!(rename.syscall, "renameat2");
        assert_eq!((rename.old_path.as_str(), rename.new_path.as_str()), ("key.tmp", "/home/alice/.ssh/id_rsa"));
        assert_eq!(rename.old_abs.as_deref(), Some("/home/alice/work/key.tmp"));
        assert_eq!(rename.new_abs.as_deref(), Some("/home/alice/.ssh/id_rsa"));
        assert_eq!((rename.tid, rename.ret), (43, -17));

        // A truncated or unresolved directory gives no absolute path.
        let mut record = rename_record(rename_syscall::LINK, b"a", b"b");
        record.old_dir = resolved(b"x/", path_flag::TRUNCATED);
        let EventData::Rename(rename) = decode(&decoder, &bytes_of(&*record)).unwrap().data else { panic!() };
        assert_eq!((rename.old_abs, rename.new_abs), (None, None));

        // A relative symlink target is relative to the link's directory.
        let mut record = rename_record(rename_syscall::SYMLINKAT, b"../.ssh/id_rsa", b"innocent");
        record.new_dir = resolved(b"tmp/", 0);
        let EventData::Rename(rename) = decode(&decoder, &bytes_of(&*record)).unwrap().data else { panic!() };
        assert_eq!(rename.new_abs.as_deref(), Some("/tmp/innocent"));
        assert_eq!(rename.old_abs.as_deref(), Some("/tmp/../.ssh/id_rsa"));
    }

    #[test]
    fn decodes_tamper_syscalls() {
        let decoder = Decoder::new();
        let record = |syscall, record_flags, target_pid, operation, ret| SyscallEvent {
            header: header(kind::SYSCALL, size_of::<SyscallEvent>()),
            syscall,
            record_flags,
            target_pid,
            repeats: 0,
            operation,
            ret,
        };
        let decoded = |event: SyscallEvent| match decode(&decoder, &bytes_of(&event)).unwrap().data {
            EventData::Syscall(syscall) => syscall,
            other => panic!("{other:?}"),
        };
        let ptrace =
            decoded(record(tamper_syscall::PTRACE, record_flag::HAS_TARGET | record_flag::HAS_RET, 77, 16, -1));
        assert_eq!(
            ptrace,
            Syscall {
                tid: 43,
                name: "ptrace".into(),
                target_pid: Some(77),
                operation: Some("PTRACE_ATTACH".into()),
                ret: Some(-1),
                blocked: false,
                denied: false,
                repeats: 0,
            }
        );
        let bpf = decoded(record(tamper_syscall::BPF, record_flag::BLOCKED, 0, 5, 0));
        assert_eq!(
            (bpf.operation.as_deref(), bpf.ret, bpf.target_pid, bpf.blocked, bpf.denied),
            (Some("BPF_PROG_LOAD"), None, None, true, false)
        );
        // Refused by the LSM hook: the process lives and the call returned EPERM.
        let bpf = decoded(record(tamper_syscall::BPF, record_flag::DENIED | record_flag::HAS_RET, 0, 5, -1));
        assert_eq!((bpf.ret, bpf.blocked, bpf.denied), (Some(-1), false, true));
        let kill = decoded(record(tamper_syscall::KILL, record_flag::HAS_TARGET, 1, 15, 0));
        assert_eq!(kill.operation.as_deref(), Some("SIGTERM"));
        let uring = decoded(record(tamper_syscall::IO_URING_SUBMIT_REQ, 0, 0, 18, 0));
        assert_eq!(
            (uring.name.as_str(), uring.operation.as_deref()),
            ("io_uring_submit_req", Some("IORING_OP_OPENAT"))
        );
        // Unknown numbers stay numbers.
        assert_eq!(decoded(record(tamper_syscall::BPF, 0, 0, 999, 0)).operation.as_deref(), Some("999"));
        assert_eq!(decoded(record(tamper_syscall::PTRACE, 0, 0, 0x9999, 0)).operation.as_deref(), Some("39321"));
        assert_eq!(decoded(record(tamper_syscall::IO_URING_SETUP, 0, 0, 0, 0)).operation, None);
    }

    #[test]
    fn decodes_connects_and_dns_queries() {
        let decoder = Decoder::new();
        // SAFETY: ABI records are plain integers and arrays.
        let mut connect: ConnectEvent = unsafe { std::mem::zeroed() };
        connect.header = header(kind::CONNECT, size_of::<ConnectEvent>());
        connect.syscall = net_syscall::CONNECT;
        connect.record_flags = record_flag::HELD;
        connect.addr[..8].copy_from_slice(&[2, 0, 0x1f, 0x90, 127, 0, 0, 9]);
        connect.addr_len = 16;
        connect.copied = 16;
        connect.sock_type = 1;
        let EventData::Connect(decoded) = decode(&decoder, &bytes_of(&connect)).unwrap().data else { panic!() };
        assert_eq!(
            (decoded.family.as_str(), decoded.address.as_deref(), decoded.port, decoded.held),
            ("inet", Some("127.0.0.9"), Some(8080), true)
        );
        assert_eq!(decoded.socket_type.as_deref(), Some("stream"));
        assert!(!decoded.fail_closed);
        connect.record_flags = record_flag::HELD | record_flag::FAIL_CLOSED;
        let EventData::Connect(decoded) = decode(&decoder, &bytes_of(&connect)).unwrap().data else { panic!() };
        assert!(decoded.held && decoded.fail_closed);
        connect.record_flags = record_flag::HELD;
        // A lying `copied` is clamped to the buffer.
        connect.copied = u32::MAX;
        assert!(decode(&decoder, &bytes_of(&connect)).is_ok());

        // SAFETY: as above.
        let mut query: DnsQueryEvent = unsafe { std::mem::zeroed() };
        query.header = header(kind::DNS_QUERY, size_of::<DnsQueryEvent>());
        query.syscall = net_syscall::SENDMMSG;
        query.addr[..8].copy_from_slice(&[2, 0, 0, 53, 127, 0, 0, 53]);
        query.addr_len = 16;
        let mut message = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in ["collector", "exfil", "invalid"] {
            message.push(label.len() as u8);
            message.extend_from_slice(label.as_bytes());
        }
        message.extend_from_slice(&[0, 0, 1, 0, 1]);
        query.payload[..message.len()].copy_from_slice(&message);
        query.copied = message.len() as u32;
        let EventData::DnsQuery(decoded) = decode(&decoder, &bytes_of(&query)).unwrap().data else { panic!() };
        assert_eq!(decoded.name, "collector.exfil.invalid");
        assert_eq!(decoded.qtype, "A");
        assert_eq!(decoded.server.as_deref(), Some("127.0.0.53:53"));
        // A payload that is no query is an error, not a panic.
        query.copied = 5;
        assert!(matches!(decode(&decoder, &bytes_of(&query)), Err(DecodeError::Dns(_))));
        query.copied = u32::MAX;
        query.payload[2] = 0x80;
        assert!(matches!(decode(&decoder, &bytes_of(&query)), Err(DecodeError::Dns(_))));
    }

    #[test]
    fn repeats_are_decoded_and_kept_out_of_traces_when_zero() {
        let decoder = Decoder::new();
        let mut open = OpenRecord::new(3);
        open.event.repeats = 59_998;
        let EventData::Open(decoded) = decode(&decoder, &open.bytes()).unwrap().data else { panic!() };
        assert_eq!(decoded.repeats, 59_998);
        let exit = ExitEvent { header: header(kind::EXIT, size_of::<ExitEvent>()), exit_code: 0, repeats: 7 };
        assert_eq!(decode(&decoder, &bytes_of(&exit)).unwrap().data, EventData::Exit(Exit { code: 0, repeats: 7 }));
        let syscall = SyscallEvent {
            header: header(kind::SYSCALL, size_of::<SyscallEvent>()),
            syscall: tamper_syscall::BPF,
            repeats: u32::MAX,
            ..SyscallEvent::default()
        };
        let EventData::Syscall(decoded) = decode(&decoder, &bytes_of(&syscall)).unwrap().data else { panic!() };
        assert_eq!(decoded.repeats, u64::from(u32::MAX));
        // SAFETY: ABI records are plain integers and arrays.
        let mut connect: ConnectEvent = unsafe { std::mem::zeroed() };
        connect.header = header(kind::CONNECT, size_of::<ConnectEvent>());
        connect.addr[..8].copy_from_slice(&[2, 0, 0x1f, 0x90, 127, 0, 0, 9]);
        connect.copied = 16;
        connect.repeats = 9_999;
        let EventData::Connect(decoded) = decode(&decoder, &bytes_of(&connect)).unwrap().data else { panic!() };
        assert_eq!((decoded.address.as_deref(), decoded.port, decoded.repeats), (Some("127.0.0.9"), Some(8080), 9_999));

        // A trace line says `repeats` only when there were some, and one without it (an older
        // trace's) reads as none.
        let counted = serde_json::to_string(&EventData::Exit(Exit { code: 0, repeats: 7 })).unwrap();
        assert!(counted.contains(r#""repeats":7"#), "{counted}");
        let none = serde_json::to_string(&EventData::Exit(Exit { code: 0, repeats: 0 })).unwrap();
        assert!(!none.contains("repeats"), "{none}");
        let older: EventData = serde_json::from_str(&none).unwrap();
        assert_eq!(older, EventData::Exit(Exit { code: 0, repeats: 0 }));
    }

    #[test]
    fn converts_kernel_dev_t() {
        let dev = user_dev((259 << 20) | 3);
        assert_eq!((libc::major(dev), libc::minor(dev)), (259, 3));
    }
}
