//! Ring buffer records -> [`Event`]s. Every record is checked (kind, declared size, actual
//! size, every length field) before any of it is read; a bad record is an error the caller
//! counts, never a panic.

use std::mem::size_of;

use credwatch_common::{
    kind, open_syscall, path_flag, EventHeader, ExecEvent, ExitEvent, ForkEvent, OpenEvent, ResolvedPath,
};
use thiserror::Error;

use crate::event::{attribution_env, Event, EventData, Exec, Exit, Fork, Open};

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {len} bytes is shorter than its header")]
    NoHeader { len: usize },
    #[error("record kind {kind} is unknown")]
    UnknownKind { kind: u32 },
    #[error("record kind {kind} declares {declared} bytes, has {len}, expects {expected}")]
    BadSize { kind: u32, declared: u32, len: usize, expected: usize },
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

/// Turns kernel timestamps (`CLOCK_BOOTTIME`) into wall-clock time.
#[derive(Clone, Copy, Debug)]
pub struct Decoder {
    /// CLOCK_REALTIME - CLOCK_BOOTTIME, in nanoseconds, taken at start.
    boot_to_wall_ns: i128,
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec; both clocks exist on every Linux credwatch runs on.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder { boot_to_wall_ns: clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_BOOTTIME) }
    }

    #[cfg(test)]
    fn with_offset(boot_to_wall_ns: i128) -> Decoder {
        Decoder { boot_to_wall_ns }
    }

    /// Wall-clock nanoseconds since the epoch for a `CLOCK_BOOTTIME` timestamp.
    pub fn wall_ns(&self, boot_ns: u64) -> u64 {
        u64::try_from(i128::from(boot_ns) + self.boot_to_wall_ns).unwrap_or(0)
    }

    pub fn decode(&self, bytes: &[u8]) -> Result<Event, DecodeError> {
        if bytes.len() < size_of::<EventHeader>() {
            return Err(DecodeError::NoHeader { len: bytes.len() });
        }
        // SAFETY: EventHeader is plain integers and the length is checked above.
        let header: EventHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let data = match header.kind {
            kind::EXEC => EventData::Exec(exec(&*record::<ExecEvent>(bytes, &header)?)),
            kind::FORK => EventData::Fork(Fork { child_pid: record::<ForkEvent>(bytes, &header)?.child_pid }),
            kind::EXIT => EventData::Exit(Exit { code: record::<ExitEvent>(bytes, &header)?.exit_code }),
            kind::OPEN => EventData::Open(open(&*record::<OpenEvent>(bytes, &header)?)),
            kind => return Err(DecodeError::UnknownKind { kind }),
        };
        Ok(Event { time_ns: self.wall_ns(header.boot_ns), pid: header.pid, data })
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
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
pub(crate) fn words(block: &[u8]) -> Vec<String> {
    let block = block.strip_suffix(&[0]).unwrap_or(block);
    if block.is_empty() {
        return Vec::new();
    }
    block.split(|&b| b == 0).map(lossy).collect()
}

/// The absolute path of a [`ResolvedPath`] (components leaf first, each followed by `/`), or
/// `None` when unresolved. The second value says it was truncated (leading components lost).
pub fn resolved_path(path: &ResolvedPath) -> (Option<String>, bool) {
    if path.flags & path_flag::UNRESOLVED != 0 {
        return (None, false);
    }
    let mut absolute = String::new();
    for component in used(&path.data, path.len).split(|&b| b == b'/').rev().filter(|c| !c.is_empty()) {
        absolute.push('/');
        absolute.push_str(&String::from_utf8_lossy(component));
    }
    if absolute.is_empty() {
        absolute.push('/');
    }
    (Some(absolute), path.flags & path_flag::TRUNCATED != 0)
}

/// The kernel's `dev_t` (major << 20 | minor) in userspace `st_dev` encoding.
pub fn user_dev(kernel_dev: u64) -> u64 {
    libc::makedev((kernel_dev >> 20) as u32, (kernel_dev & 0xf_ffff) as u32)
}

fn exec(event: &ExecEvent) -> Exec {
    Exec {
        ppid: event.ppid,
        filename: lossy(used(&event.filename, event.filename_len)),
        executable: resolved_path(&event.executable).0.unwrap_or_default(),
        args: words(used(&event.args, event.args_len)),
        cwd: resolved_path(&event.cwd).0.unwrap_or_default(),
        uid: event.header.uid,
        gid: event.header.gid,
        cgroup_id: event.header.cgroup_id,
        env: attribution_env(used(&event.env, event.env_len)),
        seeded: false,
    }
}

pub fn syscall_name(syscall: u32) -> &'static str {
    match syscall {
        open_syscall::OPEN => "open",
        open_syscall::OPENAT => "openat",
        open_syscall::OPENAT2 => "openat2",
        open_syscall::CREAT => "creat",
        _ => "unknown",
    }
}

fn open(event: &OpenEvent) -> Open {
    let (abs_path, truncated) = if event.ret >= 0 { resolved_path(&event.path) } else { (None, false) };
    Open {
        same_file_as: None,
        blocked: false,
        tid: event.header.tid,
        syscall: syscall_name(event.syscall).to_owned(),
        dirfd: event.dirfd,
        flags: event.flags,
        mode: event.mode,
        path: lossy(used(&event.given, event.given_len)),
        abs_path,
        truncated,
        ret: event.ret,
        dev: if event.ret >= 0 { user_dev(event.dev) } else { 0 },
        ino: if event.ret >= 0 { event.ino } else { 0 },
    }
}

#[cfg(test)]
mod tests {
    use credwatch_common::{Mark, MAX_RESOLVED_PATH};

    use super::*;

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

    fn open_record(ret: i64) -> OpenEvent {
        // SAFETY: all-zero is a valid OpenEvent (plain integers).
        let mut event: OpenEvent = unsafe { std::mem::zeroed() };
        event.header = header(kind::OPEN, size_of::<OpenEvent>());
        event.syscall = open_syscall::OPENAT;
        event.dirfd = 3;
        event.flags = 0o2;
        event.ret = ret;
        event.dev = (8 << 20) | 1;
        event.ino = 1234;
        event.given[..6].copy_from_slice(b"id_rsa");
        event.given_len = 6;
        event.path = resolved(b"id_rsa/.ssh/alice/home/", 0);
        event
    }

    #[test]
    fn decodes_an_open_with_its_absolute_path() {
        let decoder = Decoder::with_offset(1_000_000);
        let event = decoder.decode(&bytes_of(&open_record(4))).unwrap();
        assert_eq!(event.time_ns, 1_005_000);
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
        let decoder = Decoder::with_offset(0);
        let EventData::Open(open) = decoder.decode(&bytes_of(&open_record(-2))).unwrap().data else { panic!() };
        assert_eq!((open.abs_path, open.ret, open.dev, open.ino), (None, -2, 0, 0));

        let mut record = open_record(3);
        record.path.flags = path_flag::UNRESOLVED;
        let EventData::Open(open) = decoder.decode(&bytes_of(&record)).unwrap().data else { panic!() };
        assert_eq!(open.abs_path, None);
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

    #[test]
    fn decodes_exec_fork_exit() {
        let decoder = Decoder::with_offset(0);
        // SAFETY: all-zero is a valid ExecEvent.
        let mut exec: Box<ExecEvent> = unsafe { Box::new_zeroed().assume_init() };
        exec.header = header(kind::EXEC, size_of::<ExecEvent>());
        exec.ppid = 41;
        exec.filename[..8].copy_from_slice(b"/bin/npm");
        exec.filename_len = 8;
        let args = b"npm\0install\0";
        exec.args[..args.len()].copy_from_slice(args);
        exec.args_len = args.len() as u32;
        let env = b"NPM_TOKEN=secret\0npm_package_name=evil\0";
        exec.env[..env.len()].copy_from_slice(env);
        exec.env_len = env.len() as u32;
        exec.executable = resolved(b"node/bin/usr/", 0);
        exec.cwd = resolved(b"proj/", 0);
        let event = decoder.decode(&bytes_of(&*exec)).unwrap();
        let EventData::Exec(data) = event.data else { panic!() };
        assert_eq!(data.ppid, 41);
        assert_eq!(data.filename, "/bin/npm");
        assert_eq!(data.args, ["npm", "install"]);
        assert_eq!(data.executable, "/usr/bin/node");
        assert_eq!(data.cwd, "/proj");
        assert_eq!((data.uid, data.gid, data.cgroup_id), (1000, 1001, 7));
        assert_eq!(data.env.len(), 1, "secrets are dropped: {:?}", data.env);
        assert_eq!(data.env["npm_package_name"], "evil");

        let fork = ForkEvent { header: header(kind::FORK, size_of::<ForkEvent>()), child_pid: 50, child_depth: 3 };
        assert_eq!(decoder.decode(&bytes_of(&fork)).unwrap().data, EventData::Fork(Fork { child_pid: 50 }));
        let exit = ExitEvent { header: header(kind::EXIT, size_of::<ExitEvent>()), exit_code: 256, _pad: 0 };
        assert_eq!(decoder.decode(&bytes_of(&exit)).unwrap().data, EventData::Exit(Exit { code: 256 }));
    }

    #[test]
    fn rejects_short_unknown_and_mis_sized_records() {
        let decoder = Decoder::with_offset(0);
        assert_eq!(decoder.decode(&[0; 10]), Err(DecodeError::NoHeader { len: 10 }));

        let open = bytes_of(&open_record(3));
        let cut = &open[..open.len() - 1];
        assert!(matches!(decoder.decode(cut), Err(DecodeError::BadSize { kind: kind::OPEN, .. })));
        assert!(matches!(decoder.decode(&open[..size_of::<EventHeader>()]), Err(DecodeError::BadSize { .. })));

        let mut wrong_size = ForkEvent { header: header(kind::FORK, 1000), child_pid: 1, child_depth: 1 };
        assert!(matches!(decoder.decode(&bytes_of(&wrong_size)), Err(DecodeError::BadSize { declared: 1000, .. })));
        wrong_size.header = header(99, size_of::<ForkEvent>());
        assert_eq!(decoder.decode(&bytes_of(&wrong_size)), Err(DecodeError::UnknownKind { kind: 99 }));
    }

    #[test]
    fn converts_kernel_dev_t() {
        let dev = user_dev((259 << 20) | 3);
        assert_eq!((libc::major(dev), libc::minor(dev)), (259, 3));
    }
}
