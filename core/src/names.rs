//! Names of syscall operations as the kernel numbers them (x86_64): ptrace requests, bpf
//! commands, signals and io_uring opcodes. The sensor and the importers share them, so an
//! operation has one name whatever the source.

const PTRACE_REQUESTS: &[(u64, &str)] = &[
    (0, "PTRACE_TRACEME"),
    (1, "PTRACE_PEEKTEXT"),
    (2, "PTRACE_PEEKDATA"),
    (3, "PTRACE_PEEKUSER"),
    (4, "PTRACE_POKETEXT"),
    (5, "PTRACE_POKEDATA"),
    (6, "PTRACE_POKEUSER"),
    (7, "PTRACE_CONT"),
    (8, "PTRACE_KILL"),
    (9, "PTRACE_SINGLESTEP"),
    (12, "PTRACE_GETREGS"),
    (13, "PTRACE_SETREGS"),
    (16, "PTRACE_ATTACH"),
    (17, "PTRACE_DETACH"),
    (24, "PTRACE_SYSCALL"),
    (0x4200, "PTRACE_SETOPTIONS"),
    (0x4201, "PTRACE_GETEVENTMSG"),
    (0x4202, "PTRACE_GETSIGINFO"),
    (0x4203, "PTRACE_SETSIGINFO"),
    (0x4204, "PTRACE_GETREGSET"),
    (0x4205, "PTRACE_SETREGSET"),
    (0x4206, "PTRACE_SEIZE"),
    (0x4207, "PTRACE_INTERRUPT"),
    (0x4208, "PTRACE_LISTEN"),
    (0x4209, "PTRACE_PEEKSIGINFO"),
];

const BPF_COMMANDS: &[&str] = &[
    "BPF_MAP_CREATE",
    "BPF_MAP_LOOKUP_ELEM",
    "BPF_MAP_UPDATE_ELEM",
    "BPF_MAP_DELETE_ELEM",
    "BPF_MAP_GET_NEXT_KEY",
    "BPF_PROG_LOAD",
    "BPF_OBJ_PIN",
    "BPF_OBJ_GET",
    "BPF_PROG_ATTACH",
    "BPF_PROG_DETACH",
    "BPF_PROG_TEST_RUN",
    "BPF_PROG_GET_NEXT_ID",
    "BPF_MAP_GET_NEXT_ID",
    "BPF_PROG_GET_FD_BY_ID",
    "BPF_MAP_GET_FD_BY_ID",
    "BPF_OBJ_GET_INFO_BY_FD",
    "BPF_PROG_QUERY",
    "BPF_RAW_TRACEPOINT_OPEN",
    "BPF_BTF_LOAD",
    "BPF_BTF_GET_FD_BY_ID",
    "BPF_TASK_FD_QUERY",
    "BPF_MAP_LOOKUP_AND_DELETE_ELEM",
    "BPF_MAP_FREEZE",
    "BPF_BTF_GET_NEXT_ID",
    "BPF_MAP_LOOKUP_BATCH",
    "BPF_MAP_LOOKUP_AND_DELETE_BATCH",
    "BPF_MAP_UPDATE_BATCH",
    "BPF_MAP_DELETE_BATCH",
    "BPF_LINK_CREATE",
    "BPF_LINK_UPDATE",
    "BPF_LINK_GET_FD_BY_ID",
    "BPF_LINK_GET_NEXT_ID",
    "BPF_ENABLE_STATS",
    "BPF_ITER_CREATE",
    "BPF_LINK_DETACH",
    "BPF_PROG_BIND_MAP",
    "BPF_TOKEN_CREATE",
];

const SIGNALS: &[&str] = &[
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPWR",
    "SIGSYS",
];

const IORING_OPS: &[&str] = &[
    "IORING_OP_NOP",
    "IORING_OP_READV",
    "IORING_OP_WRITEV",
    "IORING_OP_FSYNC",
    "IORING_OP_READ_FIXED",
    "IORING_OP_WRITE_FIXED",
    "IORING_OP_POLL_ADD",
    "IORING_OP_POLL_REMOVE",
    "IORING_OP_SYNC_FILE_RANGE",
    "IORING_OP_SENDMSG",
    "IORING_OP_RECVMSG",
    "IORING_OP_TIMEOUT",
    "IORING_OP_TIMEOUT_REMOVE",
    "IORING_OP_ACCEPT",
    "IORING_OP_ASYNC_CANCEL",
    "IORING_OP_LINK_TIMEOUT",
    "IORING_OP_CONNECT",
    "IORING_OP_FALLOCATE",
    "IORING_OP_OPENAT",
    "IORING_OP_CLOSE",
    "IORING_OP_FILES_UPDATE",
    "IORING_OP_STATX",
    "IORING_OP_READ",
    "IORING_OP_WRITE",
    "IORING_OP_FADVISE",
    "IORING_OP_MADVISE",
    "IORING_OP_SEND",
    "IORING_OP_RECV",
    "IORING_OP_OPENAT2",
    "IORING_OP_EPOLL_CTL",
    "IORING_OP_SPLICE",
    "IORING_OP_PROVIDE_BUFFERS",
    "IORING_OP_REMOVE_BUFFERS",
    "IORING_OP_TEE",
    "IORING_OP_SHUTDOWN",
    "IORING_OP_RENAMEAT",
    "IORING_OP_UNLINKAT",
    "IORING_OP_MKDIRAT",
    "IORING_OP_SYMLINKAT",
    "IORING_OP_LINKAT",
];

pub fn ptrace_request(request: u64) -> Option<&'static str> {
    PTRACE_REQUESTS.iter().find(|(value, _)| *value == request).map(|(_, name)| *name)
}

pub fn bpf_command(command: u64) -> Option<&'static str> {
    indexed(BPF_COMMANDS, command)
}

/// `SIGTERM` for 15; none for 0 (the existence check) or an unknown number.
pub fn signal_name(number: u64) -> Option<&'static str> {
    indexed(SIGNALS, number.checked_sub(1)?)
}

/// 15 for `SIGTERM`.
pub fn signal_number(name: &str) -> Option<u32> {
    SIGNALS.iter().position(|signal| *signal == name).and_then(|i| u32::try_from(i + 1).ok())
}

pub fn io_uring_op(opcode: u64) -> Option<&'static str> {
    indexed(IORING_OPS, opcode)
}

/// The name, or the number itself when it has none.
pub fn or_number(name: Option<&str>, value: u64) -> String {
    name.map_or_else(|| value.to_string(), str::to_owned)
}

fn indexed(names: &'static [&'static str], value: u64) -> Option<&'static str> {
    usize::try_from(value).ok().and_then(|i| names.get(i)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_agree() {
        assert_eq!(ptrace_request(16), Some("PTRACE_ATTACH"));
        assert_eq!(ptrace_request(0x4206), Some("PTRACE_SEIZE"));
        assert_eq!(bpf_command(5), Some("BPF_PROG_LOAD"));
        assert_eq!(signal_name(15), Some("SIGTERM"));
        assert_eq!(signal_name(0), None);
        assert_eq!(signal_number("SIGKILL"), Some(9));
        assert_eq!(io_uring_op(18), Some("IORING_OP_OPENAT"));
        assert_eq!(or_number(signal_name(0), 0), "0");
        assert_eq!(or_number(bpf_command(999), 999), "999");
    }
}
