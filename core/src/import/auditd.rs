//! Raw `audit.log` (RAW or ENRICHED): the records of one event (SYSCALL, EXECVE, CWD, PATH,
//! PROCTITLE, ...) share the serial of `msg=audit(<secs>.<ms>:<serial>)`. They are joined by
//! serial; an event is complete at its PROCTITLE or EOE record (the kernel writes PROCTITLE
//! last), or when too many newer events have started.

use std::collections::{BTreeMap, VecDeque};

use super::signal_name;
use super::{join, makedev, normalize_path, EventSource, Format, ImportError, Known, Lines};
use crate::event::{Event, EventData, Exec, Exit, Fork, Open, Rename, Syscall};
use crate::names::{bpf_command, ptrace_request};

/// Events being assembled at once; past it the oldest is finished as it is.
const MAX_OPEN_EVENTS: usize = 64;
/// PATH records kept per event (the kernel writes a handful).
const MAX_PATHS: usize = 64;
/// Bytes of EXECVE arguments kept per event.
const MAX_ARGS_BYTES: usize = 1 << 20;
const AT_FDCWD: i32 = -100;
const CLONE_THREAD: u64 = 0x10000;
const ARCH_X86_64: &str = "c000003e";
const ARCH_AARCH64: &str = "c00000b7";

/// Whether `line` is an audit record.
pub(super) fn looks_like(line: &str) -> bool {
    let line = strip_node(line);
    line.starts_with("type=") && line.contains(" msg=audit(")
}

/// The `node=` of a record written with `name_format` set.
pub(super) fn node_name(line: &[u8]) -> Option<String> {
    let rest = line.strip_prefix(b"node=")?;
    let end = rest.iter().position(|&b| b == b' ')?;
    Some(String::from_utf8_lossy(&rest[..end]).into_owned())
}

fn strip_node(line: &str) -> &str {
    match line.strip_prefix("node=") {
        Some(rest) => rest.split_once(' ').map_or(rest, |(_, r)| r),
        None => line,
    }
}

#[derive(Default)]
struct Partial {
    time_ns: u64,
    syscall: Option<BTreeMap<String, String>>,
    cwd: Option<String>,
    /// PATH records: (item, name, nametype, dev, inode).
    paths: Vec<(u32, String, String, u64, u64)>,
    args: BTreeMap<u32, Vec<u8>>,
    args_bytes: usize,
    proctitle: Option<Vec<u8>>,
}

pub(super) struct AuditdSource {
    lines: Lines,
    /// Events being assembled, by serial.
    open: BTreeMap<u64, Partial>,
    known: Known,
    host: Option<String>,
    out: VecDeque<Event>,
    done: bool,
}

impl AuditdSource {
    pub(super) fn new(lines: Lines, host: Option<String>) -> AuditdSource {
        AuditdSource { lines, open: BTreeMap::new(), known: Known::default(), host, out: VecDeque::new(), done: false }
    }

    fn record(&mut self, line: &str) -> Result<(), String> {
        if self.host.is_none() {
            self.host = node_name(line.as_bytes());
        }
        let line = strip_node(line);
        let Some(rest) = line.strip_prefix("type=") else { return Err("not an audit record (no type=)".into()) };
        let (kind, rest) = rest.split_once(' ').ok_or("no msg=audit(...) after the type")?;
        let rest = rest.strip_prefix("msg=audit(").ok_or("no msg=audit(...) after the type")?;
        let (stamp, fields) = rest.split_once("):").ok_or("unterminated msg=audit(...)")?;
        let (time, serial) = stamp.split_once(':').ok_or("msg=audit(...) without a serial")?;
        let serial: u64 = serial.parse().map_err(|_| format!("bad serial {serial:?}"))?;
        let time_ns = parse_time(time).ok_or_else(|| format!("bad time {time:?}"))?;
        // ENRICHED adds interpreted fields after a 0x1d separator.
        let (raw, enriched) = fields.split_once('\u{1d}').unwrap_or((fields, ""));
        if kind == "EOE" {
            if let Some(partial) = self.open.remove(&serial) {
                self.finish(partial);
            }
            return Ok(());
        }
        if !matches!(kind, "SYSCALL" | "EXECVE" | "CWD" | "PATH" | "PROCTITLE") {
            // Other records (BPRM_FCAPS, SOCKADDR, LOGIN, USER_*, ...) carry nothing we use.
            return Ok(());
        }
        let mut fields = parse_fields(raw)?;
        if !self.open.contains_key(&serial) {
            while self.open.len() >= MAX_OPEN_EVENTS {
                let (_, oldest) = self.open.pop_first().expect("not empty");
                self.finish(oldest);
            }
        }
        let partial = self.open.entry(serial).or_insert_with(|| Partial { time_ns, ..Partial::default() });
        match kind {
            "SYSCALL" => {
                for (key, value) in parse_fields(enriched)? {
                    if key == "SYSCALL" {
                        fields.insert("SYSCALL".into(), value);
                    }
                }
                partial.syscall = Some(fields);
            }
            "CWD" => partial.cwd = fields.get("cwd").map(|v| untrusted(v)),
            "PATH" => {
                let item = fields.get("item").and_then(|i| i.parse().ok()).unwrap_or(0);
                let name = fields.get("name").map(|v| untrusted(v)).unwrap_or_default();
                let nametype = fields.get("nametype").cloned().unwrap_or_default();
                let dev = fields.get("dev").and_then(|d| d.split_once(':')).and_then(|(major, minor)| {
                    Some(makedev(u64::from_str_radix(major, 16).ok()?, u64::from_str_radix(minor, 16).ok()?))
                });
                let inode = fields.get("inode").and_then(|i| i.parse().ok()).unwrap_or(0);
                if partial.paths.len() < MAX_PATHS {
                    partial.paths.push((item, name, nametype, dev.unwrap_or(0), inode));
                }
            }
            "EXECVE" => {
                for (key, value) in &fields {
                    let Some(index) = key.strip_prefix('a') else { continue };
                    // `a2_len=N` announces `a2[0]=.. a2[1]=..` pieces, always hex.
                    let (index, piece) = match index.split_once('[') {
                        Some((i, _)) => (i, true),
                        None if index.bytes().all(|b| b.is_ascii_digit()) => (index, false),
                        None => continue,
                    };
                    let Ok(index) = index.parse::<u32>() else { continue };
                    let bytes = if piece {
                        hex::decode(value).unwrap_or_else(|_| value.as_bytes().to_vec())
                    } else {
                        untrusted_bytes(value)
                    };
                    if partial.args_bytes + bytes.len() > MAX_ARGS_BYTES {
                        continue;
                    }
                    partial.args_bytes += bytes.len();
                    partial.args.entry(index).or_default().extend_from_slice(&bytes);
                }
            }
            "PROCTITLE" => {
                partial.proctitle = fields.get("proctitle").map(|v| untrusted_bytes(v));
                let partial = self.open.remove(&serial).expect("just inserted");
                self.finish(partial);
            }
            _ => unreachable!("filtered above"),
        }
        Ok(())
    }

    /// Turns a complete event into credwatch events.
    fn finish(&mut self, partial: Partial) {
        let Some(call) = Call::of(&partial) else { return };
        // The first record of a process announces it as its parent's child: for vfork and
        // clone the child's records are often written before the parent's.
        if let Some(fork) = self.known.announce(call.time, call.ppid, call.pid) {
            self.out.push_back(fork);
        }
        let event = match call.name.as_str() {
            "execve" | "execveat" if call.success => Some(call.exec()),
            "clone" | "clone3" | "fork" | "vfork" if call.success => {
                // clone3's flags are behind a pointer: its children are announced by their
                // own first record instead, so that a thread is never taken for a process.
                let thread = call.name == "clone3"
                    || (call.name == "clone" && call.hex_arg("a0").is_some_and(|f| f & CLONE_THREAD != 0));
                let child = call.exit.filter(|&c| c > 0).map(|c| c as u32);
                match (thread, child) {
                    (false, Some(child)) if !self.known.contains(child) => {
                        self.known.insert(child);
                        Some(Event {
                            time_ns: call.time,
                            pid: call.pid,
                            data: EventData::Fork(Fork { child_pid: child }),
                        })
                    }
                    _ => None,
                }
            }
            "exit_group" => {
                let code = call.hex_arg("a0").unwrap_or(0) as u32;
                self.known.remove(call.pid);
                Some(Event {
                    time_ns: call.time,
                    pid: call.pid,
                    data: EventData::Exit(Exit { code: (code & 0xff) << 8, repeats: 0 }),
                })
            }
            "open" | "openat" | "openat2" | "creat" => call.open(),
            "rename" | "renameat" | "renameat2" | "link" | "linkat" | "symlink" | "symlinkat" => Some(call.rename()),
            "ptrace" | "process_vm_readv" | "process_vm_writev" | "bpf" | "init_module" | "finit_module" | "kill"
            | "tkill" | "tgkill" | "io_uring_setup" => Some(call.syscall()),
            _ => None,
        };
        self.out.extend(event);
    }
}

/// The system call of a complete event: its SYSCALL record's fields, and the other records.
struct Call<'a> {
    partial: &'a Partial,
    fields: &'a BTreeMap<String, String>,
    name: String,
    pid: u32,
    ppid: u32,
    time: u64,
    /// The call's result.
    exit: Option<i64>,
    success: bool,
}

impl<'a> Call<'a> {
    /// None without a SYSCALL record, or when it names no call or no process.
    fn of(partial: &'a Partial) -> Option<Call<'a>> {
        let fields = partial.syscall.as_ref()?;
        let mut call = Call {
            partial,
            fields,
            name: String::new(),
            pid: 0,
            ppid: 0,
            time: partial.time_ns,
            exit: None,
            success: false,
        };
        call.name = call
            .field("SYSCALL")
            .map(str::to_owned)
            .or_else(|| syscall_name(call.field("arch")?, call.number("syscall")?))?;
        call.pid = call.number("pid")? as u32;
        call.ppid = call.number("ppid")? as u32;
        call.exit = call.number("exit");
        call.success = call.field("success") != Some("no");
        Some(call)
    }

    fn field(&self, name: &str) -> Option<&'a str> {
        self.fields.get(name).map(String::as_str)
    }

    fn number(&self, name: &str) -> Option<i64> {
        self.field(name).and_then(|v| v.parse::<i64>().ok())
    }

    /// An argument of the call (`a0` to `a3`), which audit writes in hex.
    fn hex_arg(&self, name: &str) -> Option<u64> {
        self.field(name).and_then(|v| u64::from_str_radix(v, 16).ok())
    }

    /// The exec of the process.
    fn exec(&self) -> Event {
        let &Call { partial, pid, ppid, time, .. } = self;
        let args: Vec<String> = if partial.args.is_empty() {
            partial
                .proctitle
                .as_deref()
                .unwrap_or_default()
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        } else {
            partial.args.values().map(|a| String::from_utf8_lossy(a).into_owned()).collect()
        };
        let cwd = partial.cwd.clone().unwrap_or_default();
        let filename = partial.paths.iter().find(|p| p.0 == 0).map(|p| p.1.clone()).unwrap_or_default();
        let executable = self
            .field("exe")
            .map(untrusted)
            .filter(|e| e.starts_with('/'))
            .or_else(|| join(Some(&cwd), &filename))
            .unwrap_or_default();
        Event {
            time_ns: time,
            pid,
            data: EventData::Exec(Exec {
                ppid,
                filename,
                executable,
                args,
                cwd,
                uid: self.number("uid").unwrap_or(0) as u32,
                gid: self.number("gid").unwrap_or(0) as u32,
                ..Exec::default()
            }),
        }
    }

    /// An open, with its absolute path when the record tells it; none without a PATH record.
    fn open(&self) -> Option<Event> {
        let &Call { partial, ref name, pid, time, exit, .. } = self;
        // The file is the last PATH that is not the parent directory of a create.
        let (_, path, _, dev, ino) = partial.paths.iter().rev().find(|p| p.2 != "PARENT").cloned()?;
        let dirfd = match name.as_str() {
            "openat" | "openat2" => self.hex_arg("a0").map(|d| d as u32 as i32).unwrap_or(AT_FDCWD),
            _ => AT_FDCWD,
        };
        let (flags, mode) = match name.as_str() {
            "open" => (self.hex_arg("a1").unwrap_or(0), self.hex_arg("a2").unwrap_or(0)),
            "openat" => (self.hex_arg("a2").unwrap_or(0), self.hex_arg("a3").unwrap_or(0)),
            "creat" => (0o1101, self.hex_arg("a1").unwrap_or(0)),
            // openat2's flags are in a struct behind a pointer.
            _ => (0, 0),
        };
        let ret = exit.unwrap_or(-1);
        let abs_path = if path.starts_with('/') {
            Some(normalize_path(&path))
        } else if dirfd == AT_FDCWD {
            join(partial.cwd.as_deref(), &path)
        } else {
            None
        };
        Some(Event {
            time_ns: time,
            pid,
            data: EventData::Open(Open {
                same_file_as: None,
                blocked: false,
                denied: false,
                fail_closed: false,
                tid: pid,
                syscall: name.clone(),
                dirfd,
                flags,
                mode,
                path,
                abs_path,
                truncated: false,
                ret,
                dev: if ret >= 0 { dev } else { 0 },
                ino: if ret >= 0 { ino } else { 0 },
                repeats: 0,
            }),
        })
    }

    /// A rename or link, with both paths absolute when the records tell them.
    fn rename(&self) -> Event {
        let &Call { partial, ref name, pid, time, exit, .. } = self;
        // The kernel logs the source as a DELETE item (NORMAL for links) and the
        // destination as CREATE; a symlink's text is behind a pointer.
        let item = |kind: &str| partial.paths.iter().find(|p| p.2 == kind).map(|p| p.1.clone());
        let old_path = if name.starts_with("link") {
            item("NORMAL")
        } else if name.starts_with("symlink") {
            None
        } else {
            item("DELETE")
        };
        let new_path = item("CREATE");
        let at = name.ends_with("at") || name == "renameat2";
        let old_dirfd = if at { self.hex_arg("a0").map(|d| d as u32 as i32) } else { Some(AT_FDCWD) };
        let new_dirfd = match name.as_str() {
            "symlinkat" => self.hex_arg("a1").map(|d| d as u32 as i32),
            _ if at => self.hex_arg("a2").map(|d| d as u32 as i32),
            _ => Some(AT_FDCWD),
        };
        let resolve = |path: &Option<String>, dirfd: Option<i32>| {
            let path = path.as_deref()?;
            if path.starts_with('/') {
                Some(normalize_path(path))
            } else if dirfd == Some(AT_FDCWD) {
                join(partial.cwd.as_deref(), path)
            } else {
                None
            }
        };
        let (old_abs, new_abs) = (resolve(&old_path, old_dirfd), resolve(&new_path, new_dirfd));
        Event {
            time_ns: time,
            pid,
            data: EventData::Rename(Rename {
                tid: pid,
                syscall: name.clone(),
                old_path: old_path.unwrap_or_default(),
                new_path: new_path.unwrap_or_default(),
                old_abs,
                new_abs,
                ret: exit.unwrap_or(-1),
            }),
        }
    }

    /// A call that matters on its own, with the process it targets when it has one.
    fn syscall(&self) -> Event {
        let &Call { ref name, pid, time, exit, .. } = self;
        let pid_arg = |a: &str| self.hex_arg(a).and_then(|p| u32::try_from(p).ok());
        let (target_pid, operation) = match name.as_str() {
            "ptrace" => (pid_arg("a1"), self.hex_arg("a0").and_then(ptrace_request).map(str::to_owned)),
            "process_vm_readv" | "process_vm_writev" => (pid_arg("a0"), None),
            "kill" | "tkill" => (pid_arg("a0"), self.hex_arg("a1").and_then(signal_name).map(str::to_owned)),
            "tgkill" => (pid_arg("a0"), self.hex_arg("a2").and_then(signal_name).map(str::to_owned)),
            "bpf" => (None, self.hex_arg("a0").and_then(bpf_command).map(str::to_owned)),
            _ => (None, None),
        };
        Event {
            time_ns: time,
            pid,
            data: EventData::Syscall(Syscall {
                tid: pid,
                name: name.clone(),
                target_pid,
                operation,
                ret: exit,
                blocked: false,
                denied: false,
                repeats: 0,
            }),
        }
    }
}

impl EventSource for AuditdSource {
    fn next_event(&mut self) -> Result<Option<Event>, ImportError> {
        loop {
            if let Some(event) = self.out.pop_front() {
                return Ok(Some(event));
            }
            if self.done {
                return Ok(None);
            }
            match self.lines.next() {
                Ok(Some((number, bytes))) => {
                    let line = String::from_utf8_lossy(bytes).into_owned();
                    if line.trim().is_empty() {
                        continue;
                    }
                    if let Err(message) = self.record(&line) {
                        return Err(ImportError::bad_line(self.lines.name(), number, message));
                    }
                }
                Ok(None) => {
                    self.done = true;
                    while let Some((_, partial)) = self.open.pop_first() {
                        self.finish(partial);
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn name(&self) -> &str {
        self.lines.name()
    }

    fn format(&self) -> Format {
        Format::Auditd
    }

    fn consumed(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.lines.consumed()
    }

    fn host(&self) -> Option<String> {
        self.host.clone()
    }
}

/// `1364481363.243` to nanoseconds.
fn parse_time(text: &str) -> Option<u64> {
    let (secs, millis) = text.split_once('.').unwrap_or((text, "0"));
    let secs: u64 = secs.parse().ok()?;
    let fraction: u64 = millis.parse().ok()?;
    let scale = 10u64.checked_pow(9u32.checked_sub(millis.len() as u32)?)?;
    secs.checked_mul(1_000_000_000)?.checked_add(fraction.checked_mul(scale)?)
}

/// `key=value` pairs; values are bare, `"quoted"` or `'quoted'` (quotes kept, see [`untrusted`]).
fn parse_fields(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut fields = BTreeMap::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let eq = rest.find('=').ok_or_else(|| format!("field without '=' near {:?}", truncate(rest)))?;
        let key = &rest[..eq];
        if key.contains(' ') {
            return Err(format!("field without '=' near {:?}", truncate(rest)));
        }
        let value_start = &rest[eq + 1..];
        let end = match value_start.as_bytes().first() {
            Some(&q @ (b'"' | b'\'')) => {
                value_start[1..].find(q as char).map(|i| i + 2).ok_or_else(|| format!("unterminated quote in {key}"))?
            }
            _ => value_start.find(' ').unwrap_or(value_start.len()),
        };
        fields.insert(key.to_owned(), value_start[..end].to_owned());
        rest = value_start[end..].trim_start();
    }
    Ok(fields)
}

fn truncate(text: &str) -> String {
    text.chars().take(40).collect()
}

/// A string field the kernel logs quoted when plain and hex-encoded otherwise (`name`, `cwd`,
/// `exe`, `a0`, `proctitle`, ...). `(null)` is empty.
fn untrusted_bytes(value: &str) -> Vec<u8> {
    if let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        return inner.as_bytes().to_vec();
    }
    if value == "(null)" {
        return Vec::new();
    }
    hex::decode(value).unwrap_or_else(|_| value.as_bytes().to_vec())
}

fn untrusted(value: &str) -> String {
    String::from_utf8_lossy(&untrusted_bytes(value)).into_owned()
}

/// The syscalls used, by number, for the architectures audit logs as `arch=`.
fn syscall_name(arch: &str, number: i64) -> Option<String> {
    let table: &[(i64, &str)] = match arch {
        ARCH_X86_64 => &[
            (2, "open"),
            (85, "creat"),
            (257, "openat"),
            (437, "openat2"),
            (59, "execve"),
            (322, "execveat"),
            (56, "clone"),
            (435, "clone3"),
            (57, "fork"),
            (58, "vfork"),
            (231, "exit_group"),
            (82, "rename"),
            (264, "renameat"),
            (316, "renameat2"),
            (86, "link"),
            (265, "linkat"),
            (88, "symlink"),
            (266, "symlinkat"),
            (101, "ptrace"),
            (310, "process_vm_readv"),
            (311, "process_vm_writev"),
            (321, "bpf"),
            (175, "init_module"),
            (313, "finit_module"),
            (62, "kill"),
            (200, "tkill"),
            (234, "tgkill"),
            (425, "io_uring_setup"),
        ],
        ARCH_AARCH64 => &[
            (56, "openat"),
            (437, "openat2"),
            (221, "execve"),
            (281, "execveat"),
            (220, "clone"),
            (435, "clone3"),
            (94, "exit_group"),
            (38, "renameat"),
            (276, "renameat2"),
            (37, "linkat"),
            (36, "symlinkat"),
            (117, "ptrace"),
            (270, "process_vm_readv"),
            (271, "process_vm_writev"),
            (280, "bpf"),
            (105, "init_module"),
            (273, "finit_module"),
            (129, "kill"),
            (130, "tkill"),
            (131, "tgkill"),
            (425, "io_uring_setup"),
        ],
        _ => &[],
    };
    table.iter().find(|(n, _)| *n == number).map(|(_, name)| (*name).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(text: &str) -> (Vec<Event>, Vec<String>) {
        let mut source = AuditdSource::new(Lines::from_bytes("audit.log", text.as_bytes()), None);
        let (mut events, mut errors) = (Vec::new(), Vec::new());
        loop {
            match source.next_event() {
                Ok(Some(event)) => events.push(event),
                Ok(None) => return (events, errors),
                Err(error) => {
                    assert!(error.recoverable, "{error}");
                    errors.push(error.to_string());
                }
            }
        }
    }

    #[test]
    fn decodes_hex_and_quoted_values() {
        assert_eq!(untrusted("\"/etc/ssh/sshd_config\""), "/etc/ssh/sshd_config");
        assert_eq!(untrusted("2F746D702F61206220630A64"), "/tmp/a b c\nd");
        assert_eq!(untrusted("(null)"), "");
        assert_eq!(parse_time("1364481363.243"), Some(1_364_481_363_243_000_000));
    }

    // Records of two events interleaved, an argument split in pieces, hex names, a vfork whose
    // child's exec was logged first, the ENRICHED separator, EOE.
    const LOG: &str = concat!(
        "type=SYSCALL msg=audit(1700000000.100:10): arch=c000003e syscall=59 success=yes exit=0 a0=1 a1=2 a2=3 a3=4 items=2 ppid=99 pid=100 auid=1000 uid=1000 gid=1000 euid=1000 comm=\"npm\" exe=\"/usr/bin/node\" key=\"cw\"\u{1d}ARCH=x86_64 SYSCALL=execve AUID=\"alice\"\n",
        "type=EXECVE msg=audit(1700000000.100:10): argc=3 a0=\"npm\" a1=\"install\" a2=2E2F6576696C2D312E302E302E74677A\n",
        "type=SYSCALL msg=audit(1700000000.101:11): arch=c000003e syscall=59 success=yes exit=0 a0=1 a1=2 a2=3 a3=4 items=2 ppid=100 pid=101 auid=1000 uid=1000 gid=1000 comm=\"sh\" exe=\"/usr/bin/dash\" key=\"cw\"\n",
        "type=CWD msg=audit(1700000000.100:10): cwd=\"/home/alice/app\"\n",
        "type=EXECVE msg=audit(1700000000.101:11): argc=3 a0=\"sh\" a1=\"-c\" a2_len=20 a2[0]=636174207E2F2E6E a2[1]=706D7263202620\n",
        "type=PATH msg=audit(1700000000.100:10): item=0 name=\"/usr/bin/npm\" inode=5 dev=fe:00 mode=0100755 nametype=NORMAL\n",
        "type=PROCTITLE msg=audit(1700000000.100:10): proctitle=6E706D00696E7374616C6C\n",
        "type=EOE msg=audit(1700000000.100:10): \n",
        "type=CWD msg=audit(1700000000.101:11): cwd=\"/home/alice/app\"\n",
        "type=PATH msg=audit(1700000000.101:11): item=0 name=\"/bin/sh\" inode=6 dev=fe:00 nametype=NORMAL\n",
        "type=PROCTITLE msg=audit(1700000000.101:11): proctitle=7368002D63\n",
        "type=SYSCALL msg=audit(1700000000.102:12): arch=c000003e syscall=58 success=yes exit=101 a0=0 a1=0 a2=0 a3=0 items=0 ppid=99 pid=100 uid=1000 gid=1000 comm=\"npm\" exe=\"/usr/bin/node\" key=\"cw\"\n",
        "type=SYSCALL msg=audit(1700000000.103:13): arch=c000003e syscall=257 success=yes exit=3 a0=ffffff9c a1=7ffc a2=80000 a3=0 items=1 ppid=100 pid=101 uid=1000 gid=1000 comm=\"cat\" exe=\"/usr/bin/cat\" key=\"cw\"\n",
        "type=CWD msg=audit(1700000000.103:13): cwd=\"/home/alice/app\"\n",
        "type=PATH msg=audit(1700000000.103:13): item=0 name=2E2E2F2E6E706D72630A78 inode=77 dev=fe:01 mode=0100600 nametype=NORMAL\n",
        "type=PROCTITLE msg=audit(1700000000.103:13): proctitle=636174\n",
        "type=SYSCALL msg=audit(1700000000.104:14): arch=c000003e syscall=231 a0=2 a1=e7 items=0 ppid=100 pid=101 uid=1000 gid=1000 comm=\"cat\" exe=\"/usr/bin/cat\" key=\"cw\"\n",
    );

    #[test]
    fn joins_records_by_serial() {
        let (events, errors) = events(LOG);
        assert!(errors.is_empty(), "{errors:?}");
        let kinds: Vec<String> = events
            .iter()
            .map(|e| format!("{}:{}", e.pid, serde_json::to_value(&e.data).unwrap()["kind"].as_str().unwrap()))
            .collect();
        assert_eq!(
            kinds,
            ["99:fork", "100:exec", "100:fork", "101:exec", "101:open", "101:exit"],
            "the late vfork record adds nothing"
        );
        let EventData::Exec(npm) = &events[1].data else { panic!() };
        assert_eq!(npm.args, ["npm", "install", "./evil-1.0.0.tgz"]);
        assert_eq!(
            (npm.filename.as_str(), npm.executable.as_str(), npm.cwd.as_str(), npm.uid),
            ("/usr/bin/npm", "/usr/bin/node", "/home/alice/app", 1000)
        );
        let EventData::Exec(sh) = &events[3].data else { panic!() };
        assert_eq!(sh.args, ["sh", "-c", "cat ~/.npmrc & "]);
        assert_eq!(sh.ppid, 100);
        let EventData::Open(open) = &events[4].data else { panic!() };
        assert_eq!(open.path, "../.npmrc\nx");
        assert_eq!(open.abs_path.as_deref(), Some("/home/alice/.npmrc\nx"));
        assert_eq!((open.dirfd, open.flags, open.ret, open.ino, open.dev), (-100, 0o2000000, 3, 77, makedev(0xfe, 1)));
        assert_eq!(events[5].data, EventData::Exit(Exit { code: 2 << 8, repeats: 0 }));
    }

    #[test]
    fn renames_and_syscalls_that_matter() {
        let text = concat!(
            "type=SYSCALL msg=audit(1.000:1): arch=c000003e syscall=82 success=yes exit=0 a0=1 a1=2 items=4 ppid=1 pid=5\n",
            "type=CWD msg=audit(1.000:1): cwd=\"/home/u\"\n",
            "type=PATH msg=audit(1.000:1): item=0 name=\"/home/u/\" nametype=PARENT\n",
            "type=PATH msg=audit(1.000:1): item=1 name=\"/tmp/\" nametype=PARENT\n",
            "type=PATH msg=audit(1.000:1): item=2 name=\".npmrc\" nametype=DELETE\n",
            "type=PATH msg=audit(1.000:1): item=3 name=\"/tmp/x\" nametype=CREATE\n",
            "type=PROCTITLE msg=audit(1.000:1): proctitle=6D76\n",
            "type=SYSCALL msg=audit(1.000:2): arch=c000003e syscall=101 success=yes exit=0 a0=10 a1=7b items=0 ppid=1 pid=5\n",
            "type=SYSCALL msg=audit(1.000:3): arch=c000003e syscall=62 success=yes exit=0 a0=63 a1=f items=0 ppid=1 pid=5\n",
        );
        let (events, errors) = events(text);
        assert!(errors.is_empty(), "{errors:?}");
        let EventData::Rename(rename) = &events[1].data else { panic!("{events:?}") };
        assert_eq!((rename.old_abs.as_deref(), rename.new_abs.as_deref()), (Some("/home/u/.npmrc"), Some("/tmp/x")));
        let EventData::Syscall(ptrace) = &events[2].data else { panic!() };
        assert_eq!((ptrace.target_pid, ptrace.operation.as_deref()), (Some(123), Some("PTRACE_ATTACH")));
        let EventData::Syscall(kill) = &events[3].data else { panic!() };
        assert_eq!((kill.target_pid, kill.operation.as_deref()), (Some(99), Some("SIGTERM")));
    }

    #[test]
    fn events_being_joined_stay_bounded() {
        let mut text = String::new();
        for serial in 0..1000 {
            text.push_str(&format!(
                "type=SYSCALL msg=audit(1.000:{serial}): arch=c000003e syscall=231 a0=0 ppid=1 pid={}\n",
                serial + 10
            ));
        }
        let mut source = AuditdSource::new(Lines::from_bytes("audit.log", text.as_bytes()), None);
        let mut exits = 0;
        while let Some(event) = source.next_event().unwrap() {
            assert!(source.open.len() <= MAX_OPEN_EVENTS);
            exits += usize::from(matches!(event.data, EventData::Exit(_)));
        }
        assert_eq!(exits, 1000, "events without PROCTITLE or EOE still come out");
    }

    #[test]
    fn bad_records_are_errors_with_line_numbers() {
        let text = "type=SYSCALL msg=audit(1.0:1): arch=c000003e syscall=231 a0=0 ppid=1 pid=2\n\
                    garbage \u{1}\u{2}\n\
                    type=PATH msg=audit(1.0:2): item=0 name=\"unterminated\n\
                    type=PATH msg=audit(x:2): item=0\n\
                    type=FUTURE_THING msg=audit(1.0:3): whatever=1\n\
                    12 10:00:00.000001 openat(AT_FDCWD, \"x\", O_RDONLY) = 3\n\
                    type=SYSCALL msg=audit(1.0:4): arch=c000003e syscall=231 a0=0 ppid=1 pid=3";
        let (events, errors) = events(text);
        let lines: Vec<&str> = errors.iter().map(|e| e.split(": ").next().unwrap()).collect();
        assert_eq!(lines, ["audit.log:2", "audit.log:3", "audit.log:4", "audit.log:6", "audit.log:7"], "{errors:?}");
        assert_eq!(events.iter().filter(|e| matches!(e.data, EventData::Exit(_))).count(), 1);
    }
}
