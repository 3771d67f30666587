//! strace output: `strace -f -tt -y [-v] [-s N]` in one file (each line starts with the
//! thread id) or the `-ff -o prefix` files (one per thread, the id in the file name), merged
//! by time. Unfinished calls are joined with their `<... resumed>` halves; lineage comes from
//! the results of clone, clone3, fork and vfork.

use std::collections::{HashMap, VecDeque};

use super::{join, parse_int, parse_open_flags, signal_number, EventSource, Format, ImportError, Known, Lines};
use crate::{
    event::{attribution_env, Connect, DnsQuery, Event, EventData, Exec, Exit, Fork, Open, Rename, Syscall},
    net,
};

/// Unfinished calls remembered (one per thread at most); past it the oldest is dropped.
const MAX_PENDING: usize = 4096;
/// Events of not-yet-announced children held until their parent's fork result arrives.
const MAX_HELD: usize = 4096;
/// Threads, parents and working directories remembered; past it an arbitrary one is dropped.
const MAX_TABLE: usize = 1 << 16;
const NS_PER_DAY: u64 = 86_400 * 1_000_000_000;
const AT_FDCWD: i32 = -100;
const DNS_PORT: u16 = 53;
/// Calls that rename or link files ([`Rename`] events).
const RENAMES: &[&str] = &["rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat"];
/// Calls that matter on their own ([`Syscall`] events), as the sensor reports them.
const SYSCALLS: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "bpf",
    "init_module",
    "finit_module",
    "kill",
    "tkill",
    "tgkill",
    "io_uring_setup",
];

/// Whether `line` is a line of strace output.
pub(super) fn looks_like(line: &str) -> bool {
    let (_, _, body) = split_prefix(line);
    body.starts_with("+++ ")
        || body.starts_with("--- ")
        || body.starts_with("<... ")
        || body.find('(').is_some_and(|i| i > 0 && body[..i].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Stamp {
    /// `-t`/`-tt`: time of day.
    OfDay(u64),
    /// `-ttt`: seconds since the epoch.
    Epoch(u64),
}

/// (thread id, time, rest) of a line: `[pid N] ` or `N `, then an optional timestamp.
fn split_prefix(line: &str) -> (Option<u32>, Option<Stamp>, &str) {
    let mut rest = line;
    let mut pid = None;
    if let Some(after) = rest.strip_prefix("[pid") {
        if let Some((number, tail)) = after.trim_start().split_once(']') {
            pid = number.trim().parse().ok();
            rest = tail.trim_start();
        }
    } else if let Some(end) = rest.find(' ') {
        if end > 0 && rest[..end].bytes().all(|b| b.is_ascii_digit()) {
            pid = rest[..end].parse().ok();
            rest = rest[end..].trim_start();
        }
    }
    let mut stamp = None;
    if let Some(end) = rest.find(' ') {
        if let Some(parsed) = parse_stamp(&rest[..end]) {
            stamp = Some(parsed);
            rest = rest[end..].trim_start();
        }
    }
    (pid, stamp, rest)
}

fn parse_stamp(text: &str) -> Option<Stamp> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if !fraction.bytes().all(|b| b.is_ascii_digit()) || fraction.len() > 9 {
        return None;
    }
    let nanos =
        if fraction.is_empty() { 0 } else { fraction.parse::<u64>().ok()? * 10u64.pow(9 - fraction.len() as u32) };
    let parts: Vec<&str> = whole.split(':').collect();
    if parts.iter().any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    match parts.as_slice() {
        [h, m, s] if h.len() == 2 && m.len() == 2 && s.len() == 2 => {
            let (h, m, s): (u64, u64, u64) = (h.parse().ok()?, m.parse().ok()?, s.parse().ok()?);
            (h < 24 && m < 60 && s < 61).then_some(Stamp::OfDay((h * 3600 + m * 60 + s) * 1_000_000_000 + nanos))
        }
        [secs] if !fraction.is_empty() => {
            Some(Stamp::Epoch(secs.parse::<u64>().ok()?.checked_mul(1_000_000_000)?.checked_add(nanos)?))
        }
        _ => None,
    }
}

struct FfInput {
    lines: Lines,
    /// The thread of an `-ff` file (its lines carry no id).
    pid: Option<u32>,
    peeked: Option<(u64, String)>,
    done: bool,
}

struct Pending {
    text: String,
    is_fork: bool,
    stamp: u64,
}

pub(super) struct StraceSource {
    name: String,
    inputs: Vec<FfInput>,
    midnight_ns: u64,
    /// Time of day of the latest line, to notice midnight.
    last_of_day: u64,
    days: u64,
    pending: HashMap<u32, Pending>,
    pending_order: VecDeque<(u32, u64)>,
    pending_stamp: u64,
    forks_pending: usize,
    /// Thread id to its process (thread group) id, for threads only.
    tgid: HashMap<u32, u32>,
    parent: HashMap<u32, u32>,
    cwd: HashMap<u32, String>,
    known: Known,
    /// Processes whose exit_group was seen, so the `+++ exited +++` line adds no second exit.
    group_exited: HashMap<u32, ()>,
    held: Vec<Event>,
    out: VecDeque<Event>,
    /// Sockets connected to port 53, by (process, fd): the resolver they were connected to.
    dns_sockets: HashMap<(u32, i32), Option<String>>,
}

impl StraceSource {
    pub(super) fn new(inputs: Vec<(Lines, Option<u32>)>, name: String, date: time::Date) -> StraceSource {
        let midnight = date.midnight().assume_utc().unix_timestamp_nanos().max(0) as u64;
        StraceSource {
            name,
            inputs: inputs.into_iter().map(|(lines, pid)| FfInput { lines, pid, peeked: None, done: false }).collect(),
            midnight_ns: midnight,
            last_of_day: 0,
            days: 0,
            pending: HashMap::new(),
            pending_order: VecDeque::new(),
            pending_stamp: 0,
            forks_pending: 0,
            tgid: HashMap::new(),
            parent: HashMap::new(),
            cwd: HashMap::new(),
            known: Known::default(),
            group_exited: HashMap::new(),
            held: Vec::new(),
            out: VecDeque::new(),
            dns_sockets: HashMap::new(),
        }
    }

    /// The next line of the input whose next line is earliest: (input, line number, text).
    fn next_line(&mut self) -> Result<Option<(usize, u64, String)>, ImportError> {
        for input in self.inputs.iter_mut().filter(|i| i.peeked.is_none() && !i.done) {
            match input.lines.next()? {
                Some((number, bytes)) => input.peeked = Some((number, String::from_utf8_lossy(bytes).into_owned())),
                None => input.done = true,
            }
        }
        let key = |input: &FfInput| {
            input.peeked.as_ref().map(|(_, text)| match split_prefix(text).1 {
                Some(Stamp::OfDay(t) | Stamp::Epoch(t)) => t,
                None => 0,
            })
        };
        let best =
            (0..self.inputs.len()).filter(|&i| self.inputs[i].peeked.is_some()).min_by_key(|&i| key(&self.inputs[i]));
        Ok(best.map(|i| {
            let (number, text) = self.inputs[i].peeked.take().expect("filtered");
            (i, number, text)
        }))
    }

    fn time_ns(&mut self, stamp: Option<Stamp>) -> u64 {
        match stamp {
            Some(Stamp::Epoch(ns)) => ns,
            Some(Stamp::OfDay(ns)) => {
                // A time of day half a day earlier than the last one is the next day.
                if ns + NS_PER_DAY / 2 < self.last_of_day {
                    self.days += 1;
                }
                self.last_of_day = ns;
                self.midnight_ns.saturating_add(self.days.saturating_mul(NS_PER_DAY)).saturating_add(ns)
            }
            None => {
                self.midnight_ns.saturating_add(self.days.saturating_mul(NS_PER_DAY)).saturating_add(self.last_of_day)
            }
        }
    }

    fn tgid_of(&self, tid: u32) -> u32 {
        self.tgid.get(&tid).copied().unwrap_or(tid)
    }

    fn line(&mut self, input: usize, text: &str) -> Result<(), String> {
        let (pid, stamp, body) = split_prefix(text);
        let Some(tid) = pid.or(self.inputs[input].pid) else {
            if body.is_empty() {
                return Ok(());
            }
            return Err("no process id (trace with -f, or name -ff files prefix.<pid>)".into());
        };
        let time = self.time_ns(stamp);
        if let Some(status) = body.strip_prefix("+++ ") {
            return self.status_line(time, tid, status);
        }
        if body.starts_with("--- ") || body.starts_with("????") {
            return Ok(());
        }
        if let Some(rest) = body.strip_prefix("<... ") {
            let Some((_, tail)) = rest.split_once(" resumed>") else {
                return Err("malformed <... resumed> line".into());
            };
            let Some(pending) = self.pending.remove(&tid) else {
                // The call started before strace attached, or its start was dropped.
                return Ok(());
            };
            if pending.is_fork {
                self.forks_pending -= 1;
            }
            let full = format!("{}{}", pending.text, tail.trim_start_matches(' '));
            return self.call(time, tid, &full);
        }
        if let Some(head) = body.strip_suffix("<unfinished ...>") {
            let head = head.trim_end();
            if !looks_like(head) {
                return Err("not an strace line".into());
            }
            let is_fork = matches!(call_name(head), Some("clone" | "clone3" | "fork" | "vfork"));
            self.unfinished(tid, head.to_owned(), is_fork);
            return Ok(());
        }
        if body.contains(" <detached ...>") || body.starts_with("strace: ") {
            return Ok(());
        }
        if call_name(body).is_none() {
            return Err("not an strace line".into());
        }
        self.call(time, tid, body)
    }

    fn unfinished(&mut self, tid: u32, text: String, is_fork: bool) {
        if let Some(old) = self.pending.remove(&tid) {
            self.forks_pending -= usize::from(old.is_fork);
        }
        while self.pending.len() >= MAX_PENDING {
            let Some((old, stamp)) = self.pending_order.pop_front() else { break };
            if self.pending.get(&old).is_some_and(|p| p.stamp == stamp) {
                let dropped = self.pending.remove(&old).expect("just found");
                self.forks_pending -= usize::from(dropped.is_fork);
            }
        }
        self.pending_stamp += 1;
        self.pending_order.push_back((tid, self.pending_stamp));
        if self.pending_order.len() > 2 * MAX_PENDING {
            let pending = &self.pending;
            self.pending_order.retain(|(t, s)| pending.get(t).is_some_and(|p| p.stamp == *s));
        }
        self.forks_pending += usize::from(is_fork);
        self.pending.insert(tid, Pending { text, is_fork, stamp: self.pending_stamp });
    }

    fn status_line(&mut self, time: u64, tid: u32, status: &str) -> Result<(), String> {
        let status = status.trim_end_matches('+').trim();
        let code = if let Some(code) = status.strip_prefix("exited with ") {
            let code: u32 = code.trim().parse().map_err(|_| format!("bad exit status {code:?}"))?;
            (code & 0xff) << 8
        } else if let Some(signal) = status.strip_prefix("killed by ") {
            let core = signal.contains("(core dumped)");
            let name = signal.split_whitespace().next().unwrap_or("");
            signal_number(name).unwrap_or(0) | if core { 0x80 } else { 0 }
        } else if status.starts_with("superseded by execve") {
            return Ok(());
        } else {
            return Err(format!("unknown status line {status:?}"));
        };
        let tgid = self.tgid_of(tid);
        if self.tgid.remove(&tid).is_some() && tgid != tid {
            // A thread ended, not the process.
            return Ok(());
        }
        if self.group_exited.remove(&tgid).is_none() {
            self.exit(time, tgid, code);
        }
        Ok(())
    }

    fn exit(&mut self, time: u64, tgid: u32, code: u32) {
        self.emit(Event { time_ns: time, pid: tgid, data: EventData::Exit(Exit { code, repeats: 0 }) });
        self.known.remove(tgid);
        self.parent.remove(&tgid);
        self.cwd.remove(&tgid);
    }

    /// A complete call: `name(args) = result`.
    fn call(&mut self, time: u64, tid: u32, text: &str) -> Result<(), String> {
        let Some(name) = call_name(text) else { return Err("not a system call".into()) };
        if !matches!(
            name,
            "execve"
                | "execveat"
                | "clone"
                | "clone3"
                | "fork"
                | "vfork"
                | "open"
                | "openat"
                | "openat2"
                | "creat"
                | "chdir"
                | "fchdir"
                | "exit_group"
                | "connect"
                | "sendto"
                | "sendmsg"
                | "sendmmsg"
        ) && !RENAMES.contains(&name)
            && !SYSCALLS.contains(&name)
        {
            return Ok(());
        }
        let (args, result) = split_call(&text[name.len()..])?;
        let (ret, annotation) = parse_result(result);
        let call = Call { time, tid, tgid: self.tgid_of(tid), name, args, ret, annotation };
        match name {
            "execve" | "execveat" => self.exec(call),
            "clone" | "clone3" | "fork" | "vfork" => self.fork(call),
            "open" | "openat" | "openat2" | "creat" => self.open(call),
            "chdir" | "fchdir" => self.chdir(call),
            "exit_group" => {
                let code = call.args.first().and_then(|c| parse_int(c)).unwrap_or(0) as u32;
                bounded_insert(&mut self.group_exited, call.tgid, ());
                self.exit(call.time, call.tgid, (code & 0xff) << 8);
                Ok(())
            }
            _ if RENAMES.contains(&name) => self.rename(call),
            _ if SYSCALLS.contains(&name) => self.syscall(call),
            "connect" => self.connect(call),
            _ => self.send(call),
        }
    }

    /// An `execve` or `execveat` that succeeded: the exec of the process.
    fn exec(&mut self, call: Call) -> Result<(), String> {
        let Call { time, tgid, name, args, ret, .. } = call;
        if ret != Some(0) {
            return Ok(());
        }
        let at = usize::from(name == "execveat");
        let dir = match at {
            1 => args.first().and_then(|a| fd_arg(a).1),
            _ => None,
        };
        let filename = args.get(at).and_then(|a| decode_string(a)).ok_or("execve without a file name")?;
        let argv = args.get(at + 1).map(|a| string_array(a)).unwrap_or_default();
        let env = args
            .get(at + 2)
            .filter(|a| a.starts_with('['))
            .map(|a| attribution_env(string_array(a).join("\0").as_bytes()))
            .unwrap_or_default();
        let cwd = self.cwd.get(&tgid).cloned().unwrap_or_default();
        let base = dir.or_else(|| (!cwd.is_empty()).then(|| cwd.clone()));
        let executable = join(base.as_deref(), &filename).unwrap_or_default();
        let ppid = self.parent.get(&tgid).copied().unwrap_or(0);
        self.emit(Event {
            time_ns: time,
            pid: tgid,
            data: EventData::Exec(Exec { ppid, filename, executable, args: argv, cwd, env, ..Exec::default() }),
        });
        Ok(())
    }

    /// A clone or fork that made a process (a thread is remembered as one of its process).
    fn fork(&mut self, call: Call) -> Result<(), String> {
        let Call { time, tgid, args, ret, .. } = call;
        let Some(child) = ret.filter(|&r| r > 0).and_then(|r| u32::try_from(r).ok()) else { return Ok(()) };
        if args.iter().any(|a| a.contains("CLONE_THREAD")) {
            bounded_insert(&mut self.tgid, child, tgid);
            for event in self.held.iter_mut().filter(|e| e.pid == child) {
                event.pid = tgid;
            }
            return Ok(());
        }
        bounded_insert(&mut self.parent, child, tgid);
        if let Some(cwd) = self.cwd.get(&tgid).cloned() {
            bounded_insert(&mut self.cwd, child, cwd);
        }
        self.emit(Event { time_ns: time, pid: tgid, data: EventData::Fork(Fork { child_pid: child }) });
        self.known.insert(child);
        let (mine, others): (Vec<Event>, Vec<Event>) =
            std::mem::take(&mut self.held).into_iter().partition(|e| e.pid == child);
        self.held = others;
        self.out.extend(mine);
        Ok(())
    }

    /// An open, with the absolute path of what it opened.
    fn open(&mut self, call: Call) -> Result<(), String> {
        let Call { time, tid, tgid, name, args, ret, annotation } = call;
        let at = usize::from(matches!(name, "openat" | "openat2"));
        let (dirfd, dir) = if at == 1 { fd_arg(args.first().copied().unwrap_or("")) } else { (Some(AT_FDCWD), None) };
        let dirfd = dirfd.ok_or("bad dirfd")?;
        if dirfd == AT_FDCWD {
            if let Some(dir) = &dir {
                bounded_insert(&mut self.cwd, tgid, dir.clone());
            }
        }
        let path = args.get(at).and_then(|a| decode_string(a)).ok_or("open without a path")?;
        let (flags, mode) = match name {
            "creat" => (0o1101, args.get(1).and_then(|m| parse_int(m)).unwrap_or(0) as u64),
            "openat2" => {
                let how = args.get(2).copied().unwrap_or("");
                (
                    struct_field(how, "flags").and_then(parse_open_flags).unwrap_or(0),
                    struct_field(how, "mode").and_then(parse_int).unwrap_or(0) as u64,
                )
            }
            _ => (
                args.get(at + 1).and_then(|f| parse_open_flags(f)).ok_or("bad open flags")?,
                args.get(at + 2).and_then(|m| parse_int(m)).unwrap_or(0) as u64,
            ),
        };
        let ret = ret.unwrap_or(-1);
        // `-y` shows the file the kernel opened; without it, the path joined lexically
        // with the directory strace showed or the tracked working directory.
        let abs_path = if ret >= 0 { annotation.filter(|a| a.starts_with('/')) } else { None }.or_else(|| {
            let base = if dirfd == AT_FDCWD { dir.or_else(|| self.cwd.get(&tgid).cloned()) } else { dir };
            join(base.as_deref(), &path)
        });
        self.emit(Event {
            time_ns: time,
            pid: tgid,
            data: EventData::Open(Open {
                tid,
                syscall: name.to_owned(),
                dirfd,
                flags,
                mode,
                path,
                abs_path,
                ret,
                ..Open::default()
            }),
        });
        Ok(())
    }

    /// A change of working directory, remembered to make later paths absolute.
    fn chdir(&mut self, call: Call) -> Result<(), String> {
        let Call { tgid, name, args, ret, .. } = call;
        if ret != Some(0) {
            return Ok(());
        }
        let arg = args.first().copied().unwrap_or("");
        let dir = if name == "chdir" {
            decode_string(arg).and_then(|p| join(self.cwd.get(&tgid).map(String::as_str), &p))
        } else {
            fd_arg(arg).1
        };
        match dir {
            Some(dir) => bounded_insert(&mut self.cwd, tgid, dir),
            None => {
                self.cwd.remove(&tgid);
            }
        }
        Ok(())
    }

    /// A rename or link: both paths, absolute.
    fn rename(&mut self, call: Call) -> Result<(), String> {
        let Call { time, tid, tgid, name, args, ret, .. } = call;
        let Some(ret) = ret else { return Ok(()) };
        // (dirfd index, path index) of the source and of the destination.
        let (old, new) = match name {
            "rename" | "link" | "symlink" => ((None, 0), (None, 1)),
            "symlinkat" => ((None, 0), (Some(1), 2)),
            _ => ((Some(0), 1), (Some(2), 3)),
        };
        let cwd = self.cwd.get(&tgid).cloned();
        let side = |(dirfd, path): (Option<usize>, usize)| -> Result<(String, Option<String>), String> {
            let path = args.get(path).and_then(|a| decode_string(a)).ok_or("rename without a path")?;
            let (fd, dir) = dirfd.map(|i| fd_arg(args.get(i).copied().unwrap_or(""))).unwrap_or((Some(AT_FDCWD), None));
            let base = if fd == Some(AT_FDCWD) { dir.or_else(|| cwd.clone()) } else { dir };
            let abs = join(base.as_deref(), &path);
            Ok((path, abs))
        };
        let (old_path, mut old_abs) = side(old)?;
        let (new_path, new_abs) = side(new)?;
        if name.starts_with("symlink") {
            // A symlink's source is the link's text, not a file name to resolve.
            old_abs = None;
        }
        self.emit(Event {
            time_ns: time,
            pid: tgid,
            data: EventData::Rename(Rename {
                tid,
                syscall: name.to_owned(),
                old_path,
                new_path,
                old_abs,
                new_abs,
                ret,
            }),
        });
        Ok(())
    }

    /// A call that matters on its own, with the process it targets when it has one.
    fn syscall(&mut self, call: Call) -> Result<(), String> {
        let Call { time, tid, tgid, name, args, ret, .. } = call;
        let number = |i: usize| args.get(i).and_then(|a| parse_int(a)).and_then(|n| u32::try_from(n).ok());
        let word =
            |i: usize| args.get(i).filter(|a| a.starts_with(|c: char| c.is_ascii_uppercase())).map(|a| (*a).to_owned());
        let (target_pid, operation) = match name {
            "ptrace" => (number(1), word(0)),
            "process_vm_readv" | "process_vm_writev" | "pidfd_open" => (number(0), None),
            "kill" | "tkill" => (number(0), word(1)),
            "tgkill" => (number(0), word(2)),
            "bpf" => (None, word(0)),
            _ => (None, None),
        };
        self.emit(Event {
            time_ns: time,
            pid: tgid,
            data: EventData::Syscall(Syscall {
                tid,
                name: name.to_owned(),
                target_pid,
                operation,
                ret,
                blocked: false,
                denied: false,
                repeats: 0,
            }),
        });
        Ok(())
    }

    /// A connect; a socket connected to port 53 is remembered, for the queries sent on it.
    fn connect(&mut self, call: Call) -> Result<(), String> {
        let Call { time, tid, tgid, args, ret, .. } = call;
        let (fd, socket) = fd_arg(args.first().copied().unwrap_or_default());
        let addr = args.get(1).map(|a| sockaddr(a)).unwrap_or_default();
        if let Some(fd) = fd {
            if addr.port == Some(DNS_PORT) && matches!(addr.family.as_str(), "inet" | "inet6") {
                if self.dns_sockets.len() >= MAX_TABLE {
                    self.dns_sockets.clear();
                }
                let server = addr.address.as_deref().zip(addr.port).map(|(a, p)| net::host_port(a, p));
                self.dns_sockets.insert((tgid, fd), server);
            } else {
                self.dns_sockets.remove(&(tgid, fd));
            }
        }
        self.emit(Event {
            time_ns: time,
            pid: tgid,
            data: EventData::Connect(Connect {
                tid,
                family: addr.family,
                socket_type: socket.as_deref().and_then(socket_type),
                address: addr.address,
                port: addr.port,
                path: addr.path,
                ret,
                held: false,
                fail_closed: false,
                proxy_refused: None,
                repeats: 0,
            }),
        });
        Ok(())
    }

    /// A DNS query sent with `sendto(fd, buf, len, flags, addr, addrlen)`,
    /// `sendmsg(fd, {msg_name=..., msg_iov=[...]}, flags)` or
    /// `sendmmsg(fd, [{msg_hdr={...}, ...}, ...], n, flags)` (its first message).
    fn send(&mut self, call: Call) -> Result<(), String> {
        let Call { time, tid, tgid, name, args, .. } = call;
        let (fd, _) = fd_arg(args.first().copied().unwrap_or_default());
        let (payload, to) = if name == "sendto" {
            (args.get(1).and_then(|a| quoted_bytes(a)), args.get(4).map(|a| sockaddr(a)))
        } else {
            let message = args.get(1).copied().unwrap_or_default();
            let to = message.find("msg_name={").map(|at| sockaddr(&message[at + "msg_name=".len()..]));
            (message.find("iov_base=").and_then(|at| quoted_bytes(&message[at + "iov_base=".len()..])), to)
        };
        let server = match to.filter(|to| !to.family.is_empty() && to.family != "unknown") {
            Some(to) if to.port == Some(DNS_PORT) => {
                to.address.as_deref().zip(to.port).map(|(a, p)| net::host_port(a, p))
            }
            Some(_) => return Ok(()),
            None => match fd.and_then(|fd| self.dns_sockets.get(&(tgid, fd))) {
                Some(server) => server.clone(),
                None => return Ok(()),
            },
        };
        // A payload cut by `-s` that no longer holds the whole question is no query.
        let Some(Ok((query, qtype))) = payload.map(|bytes| net::dns_question_any(&bytes)) else {
            return Ok(());
        };
        self.emit(Event {
            time_ns: time,
            pid: tgid,
            data: EventData::DnsQuery(DnsQuery { tid, name: query, qtype: net::qtype_name(qtype), server }),
        });
        Ok(())
    }

    /// Queues `event`, or holds it while its process may be a child whose fork result has not
    /// been printed yet (strace prints a child's first calls before the parent's clone returns).
    fn emit(&mut self, event: Event) {
        let child_of_fork = matches!(event.data, EventData::Fork(_));
        if child_of_fork || self.known.contains(event.pid) {
            self.out.push_back(event);
            return;
        }
        if self.forks_pending > 0 && self.held.len() < MAX_HELD {
            self.held.push(event);
            return;
        }
        self.release_held();
        self.known.insert(event.pid);
        self.out.push_back(event);
    }

    /// Gives up waiting for forks: held events go out as they are (their processes look like
    /// new roots to the engine).
    fn release_held(&mut self) {
        for event in std::mem::take(&mut self.held) {
            self.known.insert(event.pid);
            self.out.push_back(event);
        }
    }
}

impl EventSource for StraceSource {
    fn next_event(&mut self) -> Result<Option<Event>, ImportError> {
        loop {
            if let Some(event) = self.out.pop_front() {
                return Ok(Some(event));
            }
            match self.next_line()? {
                Some((input, number, text)) => {
                    if let Err(message) = self.line(input, &text) {
                        return Err(ImportError::bad_line(self.inputs[input].lines.name(), number, message));
                    }
                    if self.forks_pending == 0 && !self.held.is_empty() {
                        self.release_held();
                    }
                }
                None if !self.held.is_empty() => self.release_held(),
                None => return Ok(None),
            }
        }
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn format(&self) -> Format {
        Format::Strace
    }

    fn consumed(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.inputs[0].lines.consumed()
    }
}

fn bounded_insert<V>(map: &mut HashMap<u32, V>, key: u32, value: V) {
    if map.len() >= MAX_TABLE && !map.contains_key(&key) {
        if let Some(&victim) = map.keys().next() {
            map.remove(&victim);
        }
    }
    map.insert(key, value);
}

/// A socket address as strace prints it: `{sa_family=AF_INET, sin_port=htons(53),
/// sin_addr=inet_addr("10.0.0.2")}`, `inet_pton(AF_INET6, "::1", &sin6_addr)`,
/// `{sa_family=AF_UNIX, sun_path="/run/docker.sock"}` (abstract: `sun_path=@"name"`); `NULL` and
/// anything else give an empty family.
fn sockaddr(text: &str) -> net::SockAddr {
    let Some(family) = text.find("sa_family=").map(|at| &text[at + "sa_family=".len()..]) else {
        return net::SockAddr::default();
    };
    let family = &family[..family.find([',', '}']).unwrap_or(family.len())];
    let port = text
        .find("_port=htons(")
        .map(|at| &text[at + "_port=htons(".len()..])
        .and_then(|rest| rest[..rest.find(')').unwrap_or(rest.len())].parse::<u16>().ok());
    match family {
        "AF_INET" => net::SockAddr {
            family: "inet".into(),
            address: text.find("inet_addr(").and_then(|at| decode_string(&text[at + "inet_addr(".len()..])),
            port,
            path: None,
        },
        "AF_INET6" => net::SockAddr {
            family: "inet6".into(),
            address: text
                .find("inet_pton(AF_INET6, ")
                .and_then(|at| decode_string(&text[at + "inet_pton(AF_INET6, ".len()..])),
            port,
            path: None,
        },
        "AF_UNIX" => {
            let path = text.find("sun_path=").map(|at| &text[at + "sun_path=".len()..]).and_then(|rest| {
                match rest.strip_prefix('@') {
                    Some(name) => decode_string(name).map(|name| format!("@{name}")),
                    None => decode_string(rest),
                }
            });
            net::SockAddr { family: "unix".into(), path, ..net::SockAddr::default() }
        }
        "AF_UNSPEC" => net::SockAddr { family: "unspec".into(), ..net::SockAddr::default() },
        other => net::SockAddr { family: other.trim_start_matches("AF_").to_ascii_lowercase(), ..Default::default() },
    }
}

/// The socket type from `-yy`'s fd annotation (`TCP:[...]`, `UDPv6:[...]`, `UNIX-STREAM:[...]`).
fn socket_type(annotation: &str) -> Option<String> {
    let protocol = annotation.split(':').next()?;
    match protocol {
        "TCP" | "TCPv6" | "UNIX-STREAM" => Some("stream".into()),
        "UDP" | "UDPv6" | "UNIX-DGRAM" => Some("dgram".into()),
        "UNIX-SEQPACKET" => Some("seqpacket".into()),
        _ => None,
    }
}

/// The bytes of the quoted string `text` starts with (escapes decoded; a `-s` cut keeps what
/// was printed).
fn quoted_bytes(text: &str) -> Option<Vec<u8>> {
    let inner = text.strip_prefix('"')?;
    let end = skip_quoted(inner.as_bytes(), 0, b'"');
    Some(unescape(&inner[..end.min(inner.len())]))
}

/// One complete call, split into what the handler of its family reads.
struct Call<'a> {
    time: u64,
    tid: u32,
    /// The process of the thread.
    tgid: u32,
    name: &'a str,
    args: Vec<&'a str>,
    /// The result, when it is a number.
    ret: Option<i64>,
    /// What `-y` shows after the result: the file an fd opened.
    annotation: Option<String>,
}

/// The name of a call line (`openat(...`), if it is one.
fn call_name(text: &str) -> Option<&str> {
    let end = text.find('(')?;
    let name = &text[..end];
    (!name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')).then_some(name)
}

/// Splits `(a, b, c) = result` into the top-level arguments and the result.
fn split_call(text: &str) -> Result<(Vec<&str>, &str), String> {
    let bytes = text.as_bytes();
    if bytes.first() != Some(&b'(') {
        return Err("expected '('".into());
    }
    let mut args = Vec::new();
    let mut depth = 0usize;
    let mut start = 1;
    let mut i = 1;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => i = skip_quoted(bytes, i + 1, b'"'),
            // `3</path>`, `AT_FDCWD</path>`: a path that may hold commas and parentheses.
            b'<' if i > 0 && (bytes[i - 1].is_ascii_alphanumeric()) => i = skip_quoted(bytes, i + 1, b'>'),
            b'[' | b'{' | b'(' => depth += 1,
            b']' | b'}' => depth = depth.saturating_sub(1),
            b')' if depth == 0 => {
                let last = text[start..i].trim();
                if !last.is_empty() {
                    args.push(last);
                }
                let rest = text[i + 1..].trim_start();
                let result = rest.strip_prefix('=').ok_or("no result (' = ') after the arguments")?.trim_start();
                return Ok((args, result));
            }
            b')' => depth -= 1,
            b',' if depth == 0 => {
                args.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    Err("unbalanced parentheses (truncated line?)".into())
}

/// The index of the closing `end` from `i`, skipping backslash escapes; `bytes.len()` if none.
fn skip_quoted(bytes: &[u8], mut i: usize, end: u8) -> usize {
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b if b == end => return i,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The return value (`-errno` for failures) and the `-y` annotation of a result.
fn parse_result(result: &str) -> (Option<i64>, Option<String>) {
    let token = result.split_whitespace().next().unwrap_or("");
    let (number, annotation) = match token.find('<') {
        Some(i) => (&token[..i], Some(unescape_annotation(&result[i + 1..]))),
        None => (token, None),
    };
    let Some(mut ret) = parse_int(number) else { return (None, None) };
    if ret == -1 {
        if let Some(errno) = result.split_whitespace().nth(1).and_then(errno_number) {
            ret = -errno;
        }
    }
    (Some(ret), annotation)
}

/// The fd number (`AT_FDCWD` = -100) and `-y` path of an fd argument.
fn fd_arg(arg: &str) -> (Option<i32>, Option<String>) {
    let (number, path) = match arg.find('<') {
        Some(i) => (&arg[..i], Some(unescape_annotation(&arg[i + 1..]))),
        None => (arg, None),
    };
    let fd = if number == "AT_FDCWD" { Some(AT_FDCWD) } else { parse_int(number).and_then(|n| i32::try_from(n).ok()) };
    (fd, path)
}

/// The path inside `-y` brackets (`text` starts after `<`), escapes decoded.
fn unescape_annotation(text: &str) -> String {
    let end = skip_quoted(text.as_bytes(), 0, b'>');
    let inner = if text.as_bytes().get(end) == Some(&b'>') { &text[..end] } else { text };
    String::from_utf8_lossy(&unescape(inner)).into_owned()
}

/// A quoted string argument, decoded (a trailing `...` marks it truncated by `-s`).
fn decode_string(arg: &str) -> Option<String> {
    let inner = arg.strip_prefix('"')?;
    let end = skip_quoted(inner.as_bytes(), 0, b'"');
    (inner.as_bytes().get(end) == Some(&b'"')).then(|| String::from_utf8_lossy(&unescape(&inner[..end])).into_owned())
}

/// The strings of `["a", "b"...]`; `...` (more elements than `-s`) and non-strings are skipped.
fn string_array(arg: &str) -> Vec<String> {
    let Some(inner) = arg.strip_prefix('[') else { return Vec::new() };
    let bytes = inner.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'"' {
            let end = skip_quoted(bytes, i + 1, b'"');
            if end == bytes.len() {
                // An unterminated string: a cut line.
                break;
            }
            out.push(String::from_utf8_lossy(&unescape(&inner[i + 1..end])).into_owned());
            i = end;
        }
        i += 1;
    }
    out
}

/// Decodes strace's C escapes: `\n \t \r \v \f \\ \"`, `\xHH` and octal `\NNN`.
pub(super) fn unescape(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' || i + 1 == bytes.len() {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        let c = bytes[i + 1];
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'v' => out.push(0x0b),
            b'f' => out.push(0x0c),
            b'a' => out.push(0x07),
            b'b' => out.push(0x08),
            b'x' => {
                let digits = bytes[i..].iter().take(2).take_while(|b| b.is_ascii_hexdigit()).count();
                match u8::from_str_radix(&text[i..i + digits], 16) {
                    Ok(value) if digits > 0 => out.push(value),
                    _ => out.extend_from_slice(b"\\x"),
                }
                i += digits;
            }
            b'0'..=b'7' => {
                let digits = 1 + bytes[i..].iter().take(2).take_while(|b| (b'0'..=b'7').contains(b)).count();
                out.push(u32::from_str_radix(&text[i - 1..i - 1 + digits], 8).unwrap_or(0) as u8);
                i += digits - 1;
            }
            other => out.push(other),
        }
    }
    out
}

/// `name=value` of a struct argument (`{flags=O_RDONLY, mode=0, resolve=0}`).
fn struct_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let inner = text.strip_prefix('{')?.strip_suffix('}').unwrap_or(text);
    inner.split(", ").find_map(|part| part.trim().strip_prefix(name)?.strip_prefix('='))
}

fn errno_number(name: &str) -> Option<i64> {
    const ERRNO: &[(&str, i64)] = &[
        ("EPERM", 1),
        ("ENOENT", 2),
        ("ESRCH", 3),
        ("EINTR", 4),
        ("EIO", 5),
        ("ENXIO", 6),
        ("E2BIG", 7),
        ("ENOEXEC", 8),
        ("EBADF", 9),
        ("ECHILD", 10),
        ("EAGAIN", 11),
        ("ENOMEM", 12),
        ("EACCES", 13),
        ("EFAULT", 14),
        ("EBUSY", 16),
        ("EEXIST", 17),
        ("EXDEV", 18),
        ("ENODEV", 19),
        ("ENOTDIR", 20),
        ("EISDIR", 21),
        ("EINVAL", 22),
        ("ENFILE", 23),
        ("EMFILE", 24),
        ("ETXTBSY", 26),
        ("EFBIG", 27),
        ("ENOSPC", 28),
        ("EROFS", 30),
        ("EMLINK", 31),
        ("ENAMETOOLONG", 36),
        ("ENOSYS", 38),
        ("ELOOP", 40),
        ("EOPNOTSUPP", 95),
        ("EADDRNOTAVAIL", 99),
        ("ENETUNREACH", 101),
        ("ECONNRESET", 104),
        ("ETIMEDOUT", 110),
        ("ECONNREFUSED", 111),
        ("EHOSTUNREACH", 113),
        ("EALREADY", 114),
        ("EINPROGRESS", 115),
        ("EDQUOT", 122),
    ];
    ERRNO.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::date;

    fn events(text: &str) -> (Vec<Event>, Vec<String>) {
        let lines = Lines::from_bytes("s.txt", text.as_bytes());
        let mut source = StraceSource::new(vec![(lines, None)], "s.txt".into(), date!(2026 - 11 - 29));
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
    fn connects_and_dns_queries_to_port_53() {
        // glibc's resolver: a UDP socket connected to the nameserver, then sendmmsg (A and AAAA),
        // as strace 6 prints them (`-y -s 256`); a query cut by `-s` is no query.
        let text = r#"300 10:00:00.000001 connect(3<socket:[41]>, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110) = -1 ENOENT (No such file or directory)
300 10:00:00.000002 connect(4<UDP:[0.0.0.0:0]>, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("127.0.0.53")}, 16) = 0
300 10:00:00.000003 sendmmsg(4, [{msg_hdr={msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base="`!\1\0\0\1\0\0\0\0\0\0\tcollector\5exfil\7invalid\0\0\1\0\1", iov_len=41}], msg_iovlen=1, msg_controllen=0, msg_flags=0}, msg_len=41}, {msg_hdr={msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base="Vx\x01\x00", iov_len=41}], msg_iovlen=1, msg_controllen=0, msg_flags=0}, msg_len=41}], 2, MSG_NOSIGNAL) = 2
300 10:00:00.000004 connect(5, {sa_family=AF_INET6, sin6_port=htons(8080), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "::ffff:127.0.0.9", &sin6_addr), sin6_scope_id=0}, 28) = -1 EINPROGRESS (Operation now in progress)
300 10:00:00.000005 sendto(6, "\xab\xcd\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03pay\x07example\x00\x00\x10\x00\x01", 29, 0, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.0.0.2")}, 16) = 29
300 10:00:00.000006 sendto(7, "\xab\xcd\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03pay\x07example\x00\x00\x10\x00\x01", 29, 0, {sa_family=AF_INET, sin_port=htons(443), sin_addr=inet_addr("10.0.0.2")}, 16) = 29
300 10:00:00.000007 sendto(4, "\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00"..., 41, MSG_NOSIGNAL, NULL, 0) = 41
300 10:00:00.000008 connect(8, {sa_family=AF_UNIX, sun_path=@"/tmp/.X11-unix/X0"}, 20) = 0
"#;
        let (events, errors) = events(text);
        assert!(errors.is_empty(), "{errors:?}");
        let summary: Vec<String> = events
            .iter()
            .map(|event| match &event.data {
                EventData::Connect(c) => format!(
                    "connect {}{} {} {} {} {:?}",
                    c.family,
                    c.socket_type.as_deref().map(|t| format!("/{t}")).unwrap_or_default(),
                    c.address.as_deref().unwrap_or("-"),
                    c.port.map_or("-".into(), |p| p.to_string()),
                    c.path.as_deref().unwrap_or("-"),
                    c.ret
                ),
                EventData::DnsQuery(q) => format!("dns {} {} {}", q.name, q.qtype, q.server.as_deref().unwrap_or("-")),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            summary,
            [
                "connect unix - - /var/run/nscd/socket Some(-2)",
                "connect inet/dgram 127.0.0.53 53 - Some(0)",
                "dns collector.exfil.invalid A 127.0.0.53:53",
                "connect inet6 ::ffff:127.0.0.9 8080 - Some(-115)",
                "dns pay.example TXT 10.0.0.2:53",
                "connect unix - - @/tmp/.X11-unix/X0 Some(0)",
            ]
        );
    }

    #[test]
    fn decodes_escapes() {
        assert_eq!(unescape(r#"a\nb\t\"q\"\\\x41\101\0z\33["#), b"a\nb\t\"q\"\\AA\0z\x1b[");
        assert_eq!(decode_string(r#""/tmp/a\nb""#).unwrap(), "/tmp/a\nb");
        assert_eq!(decode_string(r#""abc"..."#).unwrap(), "abc");
        assert_eq!(string_array(r#"["sh", "-c", "echo \"a, b\""]"#), ["sh", "-c", "echo \"a, b\""]);
    }

    #[test]
    fn splits_calls_with_commas_and_brackets_in_strings_and_paths() {
        let (args, result) = split_call(r#"(AT_FDCWD</a, (b)>, "x,)y", O_RDONLY) = 3</a, (b)/x,)y>"#).unwrap();
        assert_eq!(args, [r#"AT_FDCWD</a, (b)>"#, r#""x,)y""#, "O_RDONLY"]);
        assert_eq!(parse_result(result), (Some(3), Some("/a, (b)/x,)y".into())));
        assert_eq!(parse_result("-1 ENOENT (No such file or directory)"), (Some(-2), None));
        assert_eq!(parse_result("? ERESTARTSYS (To be restarted)"), (None, None));
        assert!(split_call(r#"(AT_FDCWD, "x", O_RDONL"#).is_err());
    }

    #[test]
    fn stitches_unfinished_calls_and_forks_and_resolves_paths() {
        let text = r#"100 10:00:00.000001 execve("/tmp/bin/npm", ["npm", "install"], ["HOME=/h", "NPM_TOKEN=secret", "npm_package_name=evil"]) = 0
100 10:00:00.000002 chdir("/work/app") = 0
100 10:00:00.000003 vfork( <unfinished ...>
101 10:00:00.000004 execve("/bin/sh", ["sh", "-c", "cat ~/.npmrc"], 0x7ffd /* 12 vars */ <unfinished ...>
100 10:00:00.000005 <... vfork resumed>) = 101
101 10:00:00.000006 <... execve resumed>) = 0
101 10:00:00.000007 openat(AT_FDCWD, "../.npmrc", O_RDONLY|O_CLOEXEC) = 3
101 10:00:00.000008 openat(AT_FDCWD</work/app>, "missing", O_RDONLY) = -1 ENOENT (No such file or directory)
101 10:00:00.000009 +++ exited with 3 +++
100 10:00:00.000010 +++ killed by SIGKILL +++
"#;
        let (events, errors) = events(text);
        assert!(errors.is_empty(), "{errors:?}");
        let kinds: Vec<String> = events
            .iter()
            .map(|e| format!("{}:{}", e.pid, serde_json::to_value(&e.data).unwrap()["kind"].as_str().unwrap()))
            .collect();
        assert_eq!(kinds, ["100:exec", "100:fork", "101:exec", "101:open", "101:open", "101:exit", "100:exit"]);
        let EventData::Exec(exec) = &events[0].data else { panic!() };
        assert_eq!(exec.env.get("npm_package_name").map(String::as_str), Some("evil"));
        assert!(!exec.env.contains_key("NPM_TOKEN"), "secrets never reach events");
        assert_eq!(events[0].time_ns, 1_795_910_400_000_000_000 + 36_000_000_001_000);
        let EventData::Exec(child) = &events[2].data else { panic!() };
        assert_eq!((child.ppid, child.cwd.as_str(), child.args.len()), (100, "/work/app", 3));
        let EventData::Open(open) = &events[3].data else { panic!() };
        assert_eq!((open.tid, open.ret, open.abs_path.as_deref()), (101, 3, Some("/work/.npmrc")));
        let EventData::Open(failed) = &events[4].data else { panic!() };
        assert_eq!(failed.ret, -2);
        assert_eq!(events[5].data, EventData::Exit(Exit { code: 3 << 8, repeats: 0 }));
        assert_eq!(events[6].data, EventData::Exit(Exit { code: 9, repeats: 0 }));
    }

    #[test]
    fn holds_a_childs_calls_until_the_parents_clone_returns() {
        let text = r#"200 10:00:00.000001 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|SIGCHLD <unfinished ...>
201 10:00:00.000002 openat(AT_FDCWD</w>, "a", O_RDONLY) = 3</w/a>
200 10:00:00.000003 <... clone resumed>, child_tidptr=0x7f) = 201
200 10:00:00.000004 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM, exit_signal=0}, 88) = 202
202 10:00:00.000005 openat(AT_FDCWD</w>, "b", O_RDONLY) = 4</w/b>
202 10:00:00.000006 +++ exited with 0 +++
"#;
        let (events, errors) = events(text);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(events[0].data, EventData::Fork(Fork { child_pid: 201 }));
        assert_eq!(events[1].pid, 201);
        let EventData::Open(thread_open) = &events[2].data else { panic!("{:?}", events[2]) };
        assert_eq!((events[2].pid, thread_open.tid), (200, 202), "a thread's open belongs to its process");
        assert_eq!(events.len(), 3, "a thread's exit is not the process's");
    }

    #[test]
    fn bad_lines_are_errors_with_line_numbers_and_reading_goes_on() {
        let text = "300 10:00:00.000001 openat(AT_FDCWD, \"/a\", O_RDONLY) = 3\n\
                    300 10:00:00.000002 openat(AT_FDCWD, \"/b\n\
                    \u{0}\u{1}\u{2}binary\u{ff}garbage\n\
                    {\"processId\":1,\"eventName\":\"openat\"}\n\
                    300 10:00:00.000003 +++ frobnicated +++\n\
                    300 10:00:00.000004 openat(AT_FDCWD, \"/c\\nd\\33[2J\", O_RDONLY) = 3\n\
                    300 10:00:00.000005 openat(AT_FDCWD, \"/e\", O_RDONLY) = 3";
        let (events, errors) = events(text);
        assert_eq!(errors.len(), 5, "{errors:?}");
        for (error, line) in errors.iter().zip([2, 3, 4, 5, 7]) {
            assert!(error.starts_with(&format!("s.txt:{line}: ")), "{error}");
        }
        let paths: Vec<String> = events
            .iter()
            .map(|e| match &e.data {
                EventData::Open(o) => o.path.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(paths, ["/a", "/c\nd\x1b[2J"]);
    }

    #[test]
    fn renames_and_syscalls_that_matter() {
        let text = r#"400 10:00:00.000001 chdir("/w") = 0
400 10:00:00.000002 renameat2(AT_FDCWD</w>, "a", 3</etc>, "b", RENAME_NOREPLACE) = 0
400 10:00:00.000003 symlink("/home/u/.npmrc", "x") = 0
400 10:00:00.000004 ptrace(PTRACE_ATTACH, 123) = -1 EPERM (Operation not permitted)
400 10:00:00.000005 kill(99, SIGTERM) = 0
"#;
        let (events, errors) = events(text);
        assert!(errors.is_empty(), "{errors:?}");
        let EventData::Rename(rename) = &events[0].data else { panic!("{events:?}") };
        assert_eq!((rename.old_abs.as_deref(), rename.new_abs.as_deref()), (Some("/w/a"), Some("/etc/b")));
        let EventData::Rename(symlink) = &events[1].data else { panic!() };
        assert_eq!((symlink.old_abs.as_deref(), symlink.new_abs.as_deref()), (None, Some("/w/x")));
        let EventData::Syscall(ptrace) = &events[2].data else { panic!() };
        assert_eq!(
            (ptrace.target_pid, ptrace.operation.as_deref(), ptrace.ret),
            (Some(123), Some("PTRACE_ATTACH"), Some(-1))
        );
        let EventData::Syscall(kill) = &events[3].data else { panic!() };
        assert_eq!((kill.target_pid, kill.operation.as_deref()), (Some(99), Some("SIGTERM")));
    }

    #[test]
    fn state_stays_bounded_whatever_the_input() {
        let mut text = String::new();
        for tid in 0..(MAX_PENDING as u32 + 1000) {
            text.push_str(&format!(
                "{} 10:00:00.000001 clone(child_stack=NULL, flags=SIGCHLD <unfinished ...>\n",
                tid + 10
            ));
            text.push_str(&format!("{} 10:00:00.000002 exit_group(0) = ?\n", tid + 100_000));
        }
        let lines = Lines::from_bytes("s.txt", text.as_bytes());
        let mut source = StraceSource::new(vec![(lines, None)], "s.txt".into(), date!(2026 - 11 - 29));
        let mut events = 0;
        while source.next_event().unwrap().is_some() {
            events += 1;
            assert!(source.pending.len() <= MAX_PENDING && source.held.len() <= MAX_HELD);
            assert!(source.pending_order.len() <= 2 * MAX_PENDING + 1);
        }
        assert_eq!(events, MAX_PENDING + 1000, "every exit comes out, held or not");
    }

    #[test]
    fn a_time_of_day_going_back_is_the_next_day() {
        let text = "1 23:59:59.900000 exit_group(0) = ?\n2 00:00:00.100000 exit_group(0) = ?\n";
        let (events, _) = events(text);
        assert_eq!(events[1].time_ns - events[0].time_ns, 200_000_000);
    }
}
