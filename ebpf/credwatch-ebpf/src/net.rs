//! Network egress.
//!
//! - `connect` of a marked process is reported at entry with the socket address as given (a
//!   failed attempt is an attempt). Sends (`sendto`, `sendmsg`, `sendmmsg`) are reported only
//!   when they go to port 53, by address or on a socket connected there: their payload is a DNS
//!   query, parsed in userspace. `write` on such a socket is not hooked (every process's writes
//!   would pay the lookup); glibc's resolver and c-ares use the send calls.
//! - Holding a connect (`--enforce`): when the tree has opened a credential inode, a connect to
//!   an IP address (not port 53) by package code (depth > 0) sends SIGSTOP to the process at
//!   the connect's entry. The handshake may complete, but the process stops before it returns
//!   to user space, so nothing is sent until the agent, having judged the destination, sends
//!   SIGKILL or SIGCONT. While the agent is away (see [`crate::enforce::failing_closed`]),
//!   every such connect of package code is held.

use core::{ffi::c_void, mem::size_of, ptr::addr_of_mut};

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_probe_read_kernel, bpf_probe_read_user},
    },
    macros::tracepoint,
    programs::TracePointContext,
};
use credwatch_common::{
    config_flag, kind, lost_kind, net_syscall, record_flag, syscall_family, ConnectEvent, DnsQueryEvent, DnsSocket,
    KernelOffsets, Mark, DNS_SOCKADDR, MAX_DNS_PAYLOAD, MAX_SOCKADDR,
};

use crate::{
    enforce::{failing_closed, kill_current, spared, stop_current},
    file::fd_file,
    helpers::{checked, config, current_mark, fill_header, may_be_marked, read, read_user, reserve, submit, Res},
    maps::{DNS_SOCKETS, TAINTED},
    repeats::{check, unsend},
    syscall::{enter_args, hooked_syscall},
    values::RepeatKey,
};

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const DNS_PORT: u16 = 53;

/// Every `sys_enter_*` of the net family (connect, sendto, sendmsg, sendmmsg).
#[tracepoint]
pub fn net_enter(ctx: TracePointContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    let (nr, args) = enter_args(&ctx);
    handle_net_enter(pid_tgid, mark, nr, &args);
    0
}

/// The entry of net-family syscall `nr` with arguments `args`, by a marked process.
#[inline(always)]
pub(crate) fn handle_net_enter(pid_tgid: u64, mark: Mark, nr: u32, args: &[u64; 6]) {
    if let Some(syscall) = hooked_syscall(nr, syscall_family::NET) {
        let _ = try_net_enter(args, syscall, pid_tgid, mark);
    }
}

#[inline(always)]
fn try_net_enter(arg: &[u64; 6], syscall: u32, pid_tgid: u64, mark: Mark) -> Res<()> {
    let fd = arg[0] as i32;
    match syscall {
        // connect(fd, addr, addrlen)
        net_syscall::CONNECT => report_connect(pid_tgid, mark, fd, arg[1], arg[2]),
        // sendto(fd, buf, len, flags, addr, addrlen)
        net_syscall::SENDTO => report_dns(pid_tgid, mark, syscall, fd, (arg[1], arg[2]), (arg[4], arg[5])),
        // sendmsg(fd, msghdr, flags), sendmmsg(fd, mmsghdr, vlen, flags): an mmsghdr starts with
        // its msghdr, and only the first message is looked at (glibc sends its A and AAAA
        // queries for one name together).
        _ => {
            // msg_name, msg_namelen, msg_iov, msg_iovlen
            let header: [u64; 4] = read_user(arg[1])?;
            if header[3] == 0 {
                return Ok(());
            }
            let [base, len]: [u64; 2] = read_user(header[2])?;
            report_dns(pid_tgid, mark, syscall, fd, (base, len), (header[0], header[1] & 0xffff_ffff))
        }
    }
}

/// The family and port (host order) at the start of a socket address.
#[inline(always)]
fn family_port(head: [u8; 4]) -> (u16, u16) {
    (u16::from_ne_bytes([head[0], head[1]]), u16::from_be_bytes([head[2], head[3]]))
}

#[inline(always)]
fn report_connect(pid_tgid: u64, mark: Mark, fd: i32, addr: u64, addr_len: u64) -> Res<()> {
    let config = config().ok_or(-1i64)?;
    // SAFETY: copied out at once.
    let taint_count = unsafe { TAINTED.get(&mark.root_pid).copied() }.unwrap_or(0);
    let tainted = taint_count != 0;
    let closed = failing_closed(config, mark);
    // A tainted tree's connects make alerts, and the agent must see a held one at once.
    let priority = tainted || closed;
    let want = if addr == 0 { 0 } else { addr_len };
    let (family, port) = if want >= 4 { family_port(read_user(addr).unwrap_or([0; 4])) } else { (0, 0) };
    let inet = family == AF_INET || family == AF_INET6;
    let dns = inet && port == DNS_PORT;
    let mut record_flags = 0;
    if inet && !dns {
        let by_taint = mark.depth > 0 && config.flags & config_flag::ENFORCE != 0 && tainted;
        if by_taint && !spared(config, mark) && stop_current() {
            record_flags = record_flag::HELD;
        } else if !by_taint && closed && stop_current() {
            record_flags = record_flag::HELD | record_flag::FAIL_CLOSED;
        }
    }
    // Held (or not) above; a held connect is always sent, and a connect to a DNS server keeps
    // its socket known (below). Another connect to where this process connected less than a
    // second ago, its tree having opened no credential since, is only counted (see
    // crate::repeats).
    let repeat = if inet && !dns && record_flags == 0 { connect_key(pid_tgid, family, port, addr, want) } else { None };
    let carried = match &repeat {
        Some(key) => match check(key, taint_count) {
            Some(carried) => carried,
            None => return Ok(()),
        },
        None => 0,
    };
    let Some(mut entry) = reserve::<ConnectEvent>(priority, mark.root_pid, lost_kind::CONNECT) else {
        if let Some(key) = &repeat {
            unsend(key, carried);
        }
        // No agent will hear of this hold to end it: killed rather than left stopped for ever
        // or let go unjudged (the loss is counted against its tree).
        if record_flags & record_flag::HELD != 0 {
            kill_current();
        }
        return Ok(());
    };
    let event = entry.as_mut_ptr();
    // SAFETY: event points to a reserved record of the right size; at most MAX_SOCKADDR bytes
    // into `addr`.
    let copied = unsafe { copy_user(addr_of_mut!((*event).addr) as *mut c_void, MAX_SOCKADDR, addr, want) };
    // SAFETY: kernel reads through probe helpers only.
    let sock_type = unsafe { socket_type(&config.offsets, fd) }.unwrap_or(0);
    let key = (pid_tgid & 0xffff_ffff_0000_0000) | (fd as u32 as u64);
    if dns {
        let mut socket = DnsSocket { addr_len: copied.min(DNS_SOCKADDR as u32), addr: [0; DNS_SOCKADDR] };
        // SAFETY: both buffers hold at least DNS_SOCKADDR bytes.
        unsafe {
            bpf_probe_read_kernel(
                socket.addr.as_mut_ptr() as *mut c_void,
                DNS_SOCKADDR as u32,
                addr_of_mut!((*event).addr) as *const c_void,
            );
        }
        let _ = DNS_SOCKETS.insert(&key, &socket, 0);
    } else {
        // The fd number may have been a DNS socket once (closes are not hooked).
        let _ = DNS_SOCKETS.remove(&key);
    }
    // SAFETY: event points to a reserved record of the right size.
    unsafe {
        fill_header(addr_of_mut!((*event).header), kind::CONNECT, size_of::<ConnectEvent>(), pid_tgid, mark);
        (*event).syscall = net_syscall::CONNECT;
        (*event).fd = fd;
        (*event).record_flags = record_flags;
        (*event).addr_len = addr_len as u32;
        (*event).copied = copied;
        (*event).sock_type = sock_type;
        (*event).repeats = carried;
        (*event)._pad = 0;
    }
    submit(entry, priority);
    Ok(())
}

/// What makes a connect to the IPv4 or IPv6 address at `addr` (`len` bytes) the same as another
/// of the process (see [`crate::repeats`]): the family, port and address, and an IPv6 address's
/// scope. None when the address is short or unreadable.
#[inline(always)]
fn connect_key(pid_tgid: u64, family: u16, port: u16, addr: u64, len: u64) -> Option<RepeatKey> {
    let tgid = (pid_tgid >> 32) as u32;
    if family == AF_INET {
        // sockaddr_in: family, port, 4 bytes of address.
        if len < 8 {
            return None;
        }
        let ip: u32 = read_user(addr + 4).ok()?;
        return Some(RepeatKey::connect(tgid, family, port, 0, [ip as u64, 0]));
    }
    // sockaddr_in6: family, port, flow info, 16 bytes of address, scope id.
    if len < 28 {
        return None;
    }
    let ip: [u64; 2] = read_user(addr + 8).ok()?;
    let scope: u32 = read_user(addr + 24).ok()?;
    Some(RepeatKey::connect(tgid, family, port, scope, ip))
}

/// The type of the socket behind `fd` (`file->private_data` is its `struct socket`).
#[inline(always)]
unsafe fn socket_type(off: &KernelOffsets, fd: i32) -> Res<u32> {
    if fd < 0 {
        return Err(-1);
    }
    // SAFETY: kernel reads through probe helpers only.
    let file = unsafe { fd_file(off, fd as u64) }?;
    let socket: u64 = read(file, off.file_private_data)?;
    if socket == 0 {
        return Err(-1);
    }
    Ok(read::<u16>(socket, off.socket_type)? as u32)
}

/// Reports a send as a DNS query when it goes to port 53: by the address given, or on a
/// socket connected there.
#[inline(always)]
fn report_dns(
    pid_tgid: u64,
    mark: Mark,
    syscall: u32,
    fd: i32,
    (buf, len): (u64, u64),
    (addr, addr_len): (u64, u64),
) -> Res<()> {
    let mut socket = DnsSocket { addr_len: 0, addr: [0; DNS_SOCKADDR] };
    let mut record_flags = 0;
    if addr != 0 && addr_len >= 4 {
        let (family, port) = family_port(read_user(addr)?);
        if !(family == AF_INET || family == AF_INET6) || port != DNS_PORT {
            return Ok(());
        }
        // SAFETY: at most DNS_SOCKADDR bytes into the local buffer.
        socket.addr_len = unsafe { copy_user(socket.addr.as_mut_ptr() as *mut c_void, DNS_SOCKADDR, addr, addr_len) };
    } else {
        let key = (pid_tgid & 0xffff_ffff_0000_0000) | (fd as u32 as u64);
        // SAFETY: copied out at once.
        socket = unsafe { DNS_SOCKETS.get(&key).copied() }.ok_or(-1i64)?;
        record_flags = record_flag::DNS_SOCKET;
    }
    let Some(mut entry) = reserve::<DnsQueryEvent>(false, mark.root_pid, lost_kind::DNS_QUERY) else { return Ok(()) };
    let event = entry.as_mut_ptr();
    // SAFETY: event points to a reserved record of the right size; at most MAX_DNS_PAYLOAD
    // bytes of user memory into `payload`.
    unsafe {
        let copied = copy_user(addr_of_mut!((*event).payload) as *mut c_void, MAX_DNS_PAYLOAD, buf, len);
        fill_header(addr_of_mut!((*event).header), kind::DNS_QUERY, size_of::<DnsQueryEvent>(), pid_tgid, mark);
        (*event).syscall = syscall;
        (*event).fd = fd;
        (*event).record_flags = record_flags;
        (*event).addr_len = socket.addr_len;
        (*event).sent_len = len as u32;
        (*event).copied = copied;
        (*event).addr = socket.addr;
        (*event)._pad = 0;
    }
    submit(entry, false);
    Ok(())
}

/// Copies the first `len` bytes, at most `room`, of user memory at `from` to `to`; returns how
/// many, 0 when `len` is 0 or the read fails. The size is checked after it passed through
/// [`checked`]: LLVM spills it before a check and hands the helper the unchecked reload, which
/// the 5.10 and 6.1 verifiers refuse ("R2 min value is negative").
///
/// # Safety
/// `to` points to at least `room` writable bytes.
#[inline(always)]
unsafe fn copy_user(to: *mut c_void, room: usize, from: u64, len: u64) -> u32 {
    let size = checked(len.min(room as u64) as usize) as u32;
    if size == 0 || size > room as u32 {
        return 0;
    }
    // SAFETY: the caller's `to` has `room` bytes; user memory through the probe helper.
    if unsafe { bpf_probe_read_user(to, size, from as *const c_void) } == 0 {
        size
    } else {
        0
    }
}
