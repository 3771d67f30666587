//! The ABI between credwatch's kernel programs and its agent.
//!
//! Every type here is `#[repr(C)]`, has no implicit padding (explicit `_pad` fields instead) and
//! uses integers rather than `bool` or Rust enums, so both sides agree on every byte. Event kinds
//! and flag values are permanent: a number is never reused for something else.
#![no_std]

/// Bytes kept of a path as the process passed it to a syscall.
pub const MAX_GIVEN_PATH: usize = 512;
/// Bytes of a path that the kernel resolved by walking dentries and mounts.
pub const MAX_RESOLVED_PATH: usize = 4096;
/// Path components walked before a resolved path is marked truncated.
pub const MAX_PATH_COMPONENTS: u32 = 64;
/// Bytes of argv kept at exec (NUL-separated, as in `/proc/<pid>/cmdline`).
pub const MAX_ARGS: usize = 4096;
/// Bytes of the environment kept at exec (NUL-separated). npm puts `npm_package_*` after the
/// inherited environment, so this must hold a typical developer environment and then some.
pub const MAX_ENV: usize = 16384;
/// Levels of a cgroup walked up from a process's cgroup before its path is marked truncated:
/// Kubernetes' deepest (`/kubepods.slice/<qos>.slice/<pod>.slice/<container>.scope`) is 4,
/// a container nested in a pod's container a few more.
pub const MAX_CGROUP_DEPTH: u32 = 16;
/// Bytes of one cgroup name (a kernfs name is at most NAME_MAX, 255, plus its NUL).
pub const MAX_CGROUP_NAME: usize = 256;
/// Bytes of a cgroup path (one per hierarchy read): a Kubernetes path with a 64-hex container
/// id takes about 200.
pub const MAX_CGROUP_PATH: usize = 1024;
/// [`Config::cgroup_subsys`] when no controller is mounted as a cgroup v1 hierarchy.
pub const NO_CGROUP_SUBSYS: u32 = u32::MAX;
/// Bytes of a package-manager basename used as a map key (NUL-padded).
pub const MANAGER_NAME_LEN: usize = 16;
/// Bytes of the argv words after argv[0] used to recognise `python -m pip`-style roots
/// (NUL-separated, NUL-padded).
pub const MODULE_KEY_LEN: usize = 32;

/// Stable numeric kinds of the records sent to userspace.
pub mod kind {
    pub const EXEC: u32 = 1;
    pub const FORK: u32 = 2;
    pub const EXIT: u32 = 3;
    pub const OPEN: u32 = 4;
    pub const RENAME: u32 = 5;
    pub const SYSCALL: u32 = 6;
    pub const CONNECT: u32 = 7;
    pub const DNS_QUERY: u32 = 8;
}

/// An open, connect or tamper call of a marked process whose key was reported less than this
/// ago is counted, not sent; the next record of the key (or the process's exit) carries the
/// count in its `repeats`. Keys: open = (tgid, dev, ino, mount, `O_ACCMODE`, blocked/denied/failed
/// closed); connect = (tgid, family, address, port, IPv6 scope) of an IPv4 or IPv6 address, not
/// port 53; tamper = (tgid, syscall, operation, target, flags). A failed open (no file: two may
/// have been given different paths), a held connect and any other connect are always sent.
/// Every act is still enforced: kill, deny and hold are decided before it is counted.
pub const REPEAT_WINDOW_NS: u64 = 1_000_000_000;

/// Bytes of a socket address kept from `connect`/`sendto` (`sizeof(struct sockaddr_storage)`).
pub const MAX_SOCKADDR: usize = 128;
/// Bytes of a DNS query kept: a query carries one name of at most 255 bytes, plus a 12-byte
/// header, 4 bytes of type and class, and an EDNS record.
pub const MAX_DNS_PAYLOAD: usize = 512;

/// Which syscall a [`ConnectEvent`] or [`DnsQueryEvent`] came from.
pub mod net_syscall {
    pub const CONNECT: u32 = 1;
    pub const SENDTO: u32 = 2;
    pub const SENDMSG: u32 = 3;
    pub const SENDMMSG: u32 = 4;
}

/// Which syscall an [`OpenEvent`] came from.
pub mod open_syscall {
    pub const OPEN: u32 = 1;
    pub const OPENAT: u32 = 2;
    pub const OPENAT2: u32 = 3;
    pub const CREAT: u32 = 4;
    /// No path: `dirfd` holds the mount fd; the file is known only from the new fd.
    pub const OPEN_BY_HANDLE_AT: u32 = 5;
    /// An open that no hooked syscall made (io_uring's `IORING_OP_OPENAT`), seen by the BPF LSM
    /// `file_open` hook: no given path, `flags` are the file's `f_flags`.
    pub const FILE_OPEN: u32 = 6;
}

/// Which syscall a [`RenameEvent`] came from.
pub mod rename_syscall {
    pub const RENAME: u32 = 1;
    pub const RENAMEAT: u32 = 2;
    pub const RENAMEAT2: u32 = 3;
    pub const LINK: u32 = 4;
    pub const LINKAT: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const SYMLINKAT: u32 = 7;
}

/// Which syscall (or io_uring submission) a [`SyscallEvent`] came from.
pub mod tamper_syscall {
    pub const PTRACE: u32 = 1;
    pub const PROCESS_VM_READV: u32 = 2;
    pub const PROCESS_VM_WRITEV: u32 = 3;
    pub const BPF: u32 = 4;
    pub const INIT_MODULE: u32 = 5;
    pub const FINIT_MODULE: u32 = 6;
    pub const KILL: u32 = 7;
    pub const TKILL: u32 = 8;
    pub const TGKILL: u32 = 9;
    pub const PIDFD_SEND_SIGNAL: u32 = 10;
    pub const IO_URING_SETUP: u32 = 11;
    /// The `io_uring:io_uring_submit_req` tracepoint: `operation` is the `IORING_OP_*` opcode.
    pub const IO_URING_SUBMIT_REQ: u32 = 12;
}

/// Bits of [`OpenEvent::record_flags`] and [`SyscallEvent::record_flags`].
pub mod record_flag {
    /// The opened file's (dev, ino) is in `CRED_INODES`, and so is its generation where the
    /// entry has one; `cred_index` names it.
    pub const CRED_INODE: u32 = 1;
    /// The kernel sent SIGKILL to the process (`--enforce`).
    pub const BLOCKED: u32 = 2;
    /// [`SyscallEvent::ret`] holds the result (reported at syscall exit).
    pub const HAS_RET: u32 = 4;
    /// [`SyscallEvent::target_pid`] is meaningful.
    pub const HAS_TARGET: u32 = 8;
    /// An [`OpenEvent`] whose syscall entry was not seen (the process was marked in between,
    /// or what the entry saved was lost): no given path, and `flags` are the opened file's
    /// `f_flags`, not the arguments.
    pub const NO_ENTRY: u32 = 16;
    /// A [`ConnectEvent`] whose process the kernel stopped (`SIGSTOP`) at the connect's entry
    /// under `--enforce`, because its tree opened a credential inode: the agent kills it or
    /// lets it continue once the engine has judged the destination.
    pub const HELD: u32 = 32;
    /// A [`DnsQueryEvent`] sent on a socket that was connected to port 53 (no address given).
    pub const DNS_SOCKET: u32 = 64;
    /// A BPF LSM hook refused the action with EPERM (`--enforce` with the fentry backend where
    /// the BPF LSM is active): the process lives and the open or call failed before it did
    /// anything.
    pub const DENIED: u32 = 128;
    /// The kernel refused (LSM), killed (tracepoints) or held (connect) because no agent had
    /// drained the rings for [`super::FAIL_CLOSED_AFTER_NS`] (`--enforce`), whatever the rules
    /// said of the file.
    pub const FAIL_CLOSED: u32 = 256;
}

/// Under `--enforce`, package code fails closed when the agent's last drain (`HEARTBEAT`) is
/// older than this: its credential-inode opens are refused or killed and its connects held.
/// A busy agent drains every 10 ms and writes the heartbeat at least once a second even idle;
/// the longest gap measured between two heartbeats of an agent under a flood is far below 5 s
/// (docs/src/usage.md, `--enforce`), so only a stopped, hung or dead agent gets here, and well before
/// systemd's watchdog (60 s) restarts it.
pub const FAIL_CLOSED_AFTER_NS: u64 = 5_000_000_000;

/// Bits of [`CredInode::flags`].
pub mod cred_flag {
    /// A rule with action `kill` targets this file: under `--enforce` an open of it by a
    /// marked process kills the process at the open's syscall exit.
    pub const KILL: u32 = 1;
    /// [`CredInode::generation`] is the file's `i_generation` (the agent read it): an inode with
    /// this number but another generation is another file that reuses the number, not this one.
    pub const GENERATION: u32 = 2;
}

/// Bits of [`Mark::flags`].
pub mod mark_flag {
    /// Marked by the agent (`credwatch run`, or seeded from `/proc`), not by a manager exec.
    pub const BY_AGENT: u32 = 1;
    /// Runs a [`spare_flag::VIA_MANAGER`] executable, and so did every process between it and
    /// its manager root (npm -> git -> ssh); under an agent root, those between may also be
    /// [`spare_flag::TOOL_SHELL`]s or the agent's own programs (claude -> bash -> git -> ssh).
    /// Set at exec.
    pub const ACTOR_CHAIN: u32 = 2;
    /// The parent (at fork) was a manager root or had [`ACTOR_CHAIN`].
    pub const PARENT_IN_CHAIN: u32 = 4;
}

/// `Mark::manager` of a root that no manager exec made (`credwatch run`, seeded CMD).
pub const NO_MANAGER: u32 = u32::MAX;

/// Bits of [`SparedExe::flags`].
pub mod spare_flag {
    /// A `kill` rule's actor runs this executable anywhere in a tree: never killed.
    pub const ANYWHERE: u32 = 1;
    /// Spared only in an unbroken chain from the manager ([`mark_flag::ACTOR_CHAIN`]).
    pub const VIA_MANAGER: u32 = 2;
    /// A shell agents run their tools through: under the roots of [`super::SparedExe::managers`]
    /// (the agents') it passes [`mark_flag::ACTOR_CHAIN`] on from its parent, but is no actor:
    /// never spared for this bit.
    pub const TOOL_SHELL: u32 = 4;
}

/// Bits of [`ManagerValue::flags`].
pub mod manager_flag {
    /// The basename is an interpreter (python3, ...): it becomes a root only when the argv
    /// words after argv[0] are a key of the `MANAGER_MODULES` map (`-m\0pip\0`).
    pub const NEEDS_MODULE: u32 = 1;
    /// The basename is an interpreter (node, ...): it becomes a root only when the stem of
    /// the script it runs (the first argv word after argv[0] not starting with `-`, its
    /// basename up to the first `-` or `.`) is a key of the `MANAGER_SCRIPTS` map.
    pub const NEEDS_SCRIPT: u32 = 2;
}

/// Bits of [`ResolvedPath::flags`] (and of the cgroup paths of [`ExecEvent`]).
pub mod path_flag {
    /// The walk stopped at [`MAX_PATH_COMPONENTS`] (a cgroup's at [`MAX_CGROUP_DEPTH`]) or the
    /// buffer filled: leading components are missing.
    pub const TRUNCATED: u32 = 1;
    /// No path could be resolved (failed open, no file, unreadable kernel memory).
    pub const UNRESOLVED: u32 = 2;
}

/// Bits of [`Config::flags`].
pub mod config_flag {
    /// Mark a process as a package root when it execs a known package manager (`watch`).
    /// Off in `credwatch run`, which marks CMD itself and watches nothing else.
    pub const AUTO_ROOTS: u32 = 1;
    /// `--enforce`: kill on opens of `KILL` inodes and on blockable tamper syscalls.
    pub const ENFORCE: u32 = 2;
}

/// The mark of a process inside a package tree: the value of the `MARKS` map, keyed by tgid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    /// tgid of the package root (the manager, or CMD under `credwatch run`).
    pub root_pid: u32,
    /// 0 for the root, parent's depth + 1 at fork.
    pub depth: u32,
    /// Index of the manager in the agent's manager table (the order of the rules' managers).
    pub manager: u32,
    pub flags: u32,
}

/// Value of the `MANAGERS` map, keyed by a NUL-padded basename of [`MANAGER_NAME_LEN`] bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagerValue {
    pub manager: u32,
    pub flags: u32,
}

/// Kernel struct member offsets, resolved by the agent from `/sys/kernel/btf/vmlinux` at load
/// time (Rust eBPF has no CO-RE). All are byte offsets from the start of the named struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_struct_pid: u32,
    pub task_struct_tgid: u32,
    pub task_struct_real_parent: u32,
    pub task_struct_mm: u32,
    pub task_struct_fs: u32,
    pub task_struct_files: u32,
    pub task_struct_exit_code: u32,
    pub fs_struct_pwd: u32,
    pub fs_struct_root: u32,
    pub files_struct_fdt: u32,
    pub fdtable_max_fds: u32,
    pub fdtable_fd: u32,
    pub file_f_path: u32,
    pub file_f_inode: u32,
    pub path_mnt: u32,
    pub path_dentry: u32,
    pub dentry_d_parent: u32,
    pub dentry_d_name: u32,
    pub qstr_len: u32,
    pub qstr_name: u32,
    pub inode_i_ino: u32,
    pub inode_i_sb: u32,
    /// `inode::i_generation` (a u32), which file systems that reuse inode numbers change when
    /// they do.
    pub inode_i_generation: u32,
    pub super_block_s_dev: u32,
    /// Offset of `struct vfsmount mnt` inside `struct mount` (`real_mount()` is container_of).
    pub mount_mnt: u32,
    pub mount_mnt_parent: u32,
    pub mount_mnt_mountpoint: u32,
    pub vfsmount_mnt_root: u32,
    pub mm_struct_arg_start: u32,
    pub mm_struct_arg_end: u32,
    pub mm_struct_env_start: u32,
    pub mm_struct_env_end: u32,
    pub mm_struct_exe_file: u32,
    pub linux_binprm_filename: u32,
    pub task_struct_signal: u32,
    /// `signal_struct::live`: threads of the group still running (an `atomic_t`).
    pub signal_struct_live: u32,
    /// Not an offset: 1 when the `sched_process_exit` raw tracepoint passes `group_dead` as its
    /// second argument (Linux 6.16+), else 0 and the program reads `signal->live`.
    pub exit_has_group_dead: u32,
    /// `file::private_data` (a pidfd's `struct pid`), `pid::numbers`, `upid::nr`.
    pub file_private_data: u32,
    pub pid_numbers: u32,
    pub upid_nr: u32,
    pub file_f_flags: u32,
    /// The inline name of a dentry: `d_shortname` (Linux 6.14+) or `d_iname`.
    pub dentry_d_shortname: u32,
    /// `socket::type` (a short: `SOCK_STREAM`, `SOCK_DGRAM`, ...); a socket's file has its
    /// `struct socket` in `private_data`.
    pub socket_type: u32,
    /// A process's cgroups: `task->cgroups` (a `css_set`), its `subsys[]` array (one
    /// `cgroup_subsys_state` pointer per controller) and `dfl_cgrp` (its unified cgroup); a
    /// state's `cgroup`; a cgroup's kernfs node `kn`; a node's parent (`__parent` since Linux
    /// 6.15, `parent` before; `name` follows it, the agent checks) and `name`.
    pub task_struct_cgroups: u32,
    pub css_set_subsys: u32,
    pub css_set_dfl_cgrp: u32,
    pub cgroup_subsys_state_cgroup: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_parent: u32,
    pub kernfs_node_name: u32,
    /// x86_64 `struct pt_regs` members a syscall function (`__x64_sys_*`, the fentry backend's
    /// hooks) gets its arguments from: di, si, dx, r10, r8, r9 are arguments 0 to 5, `orig_ax`
    /// the syscall number. They lie within [`PT_REGS_WINDOW`] words from `r10` (the agent
    /// checks), so one read has them all.
    pub pt_regs_r10: u32,
    pub pt_regs_r9: u32,
    pub pt_regs_r8: u32,
    pub pt_regs_dx: u32,
    pub pt_regs_si: u32,
    pub pt_regs_di: u32,
    pub pt_regs_orig_ax: u32,
}

/// Words of a `struct pt_regs` read at once from `r10`, which must hold the six argument
/// registers and `orig_ax` (the agent checks).
pub const PT_REGS_WINDOW: usize = 9;

/// Words of a `struct file` read at once from the lower of `f_inode` and `f_path`, which must
/// both lie within them (the agent checks).
pub const FILE_WINDOW: usize = 6;

/// Agent-wide settings, in the single-entry `CONFIG` array map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub offsets: KernelOffsets,
    /// [`config_flag`] bits.
    pub flags: u32,
    /// The agent's own tgid: its activity is never reported.
    pub agent_tgid: u32,
    /// Offset of `opcode` (a u8) in the `io_uring:io_uring_submit_req` record (from its tracefs
    /// format).
    pub uring_opcode_offset: u32,
    /// Bit `1 << n` for each [`tamper_syscall`] `n` that a `kill` rule names: with
    /// [`config_flag::ENFORCE`], such a call is killed at syscall entry.
    pub block_syscalls: u32,
    /// Bit `1 << manager` for each manager whose root process (depth 0) a `kill` rule's
    /// actor spares.
    pub spare_root_managers: u32,
    /// Exec records carry the process's cgroup in the v1 hierarchy of this controller (its
    /// index in the kernel's `enum cgroup_subsys_id`), or [`NO_CGROUP_SUBSYS`].
    pub cgroup_subsys: u32,
    /// 1: exec records carry the process's cgroup in the unified (v2) hierarchy (mounted).
    pub cgroup_v2: u32,
    /// Bit `1 << n` for each [`tamper_syscall`] `n` that an attached BPF LSM hook refuses (the
    /// fentry backend where the BPF LSM is active): with [`config_flag::ENFORCE`] such a call
    /// of [`Config::block_syscalls`] is refused with EPERM instead of killed.
    pub lsm_syscalls: u32,
    /// Bit `1 << root` for each root (in the manager table) that is a coding agent: in its
    /// tree a process executing the agent's own program again (codex.js's native `codex`)
    /// passes [`mark_flag::ACTOR_CHAIN`] on, as a [`spare_flag::TOOL_SHELL`] does.
    pub agent_roots: u32,
}

/// Key of the `CRED_INODES` map: a credential file as the kernel names it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InodeKey {
    /// Kernel-internal `dev_t` (`super_block::s_dev`, major << 20 | minor).
    pub dev: u64,
    pub ino: u64,
}

/// Value of the `SPARED_EXES` map (keyed by the executable's [`InodeKey`]): the executables
/// of `kill` rules' actors, which the kernel does not kill.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SparedExe {
    /// [`spare_flag`] bits.
    pub flags: u32,
    /// Bit `1 << manager` of the root managers under which it is spared (`u32::MAX`: any).
    pub managers: u32,
}

/// Value of the `CRED_INODES` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CredInode {
    /// Index into the agent's table of credential paths.
    pub index: u32,
    /// [`cred_flag`] bits.
    pub flags: u32,
    /// The file's `i_generation`, with [`cred_flag::GENERATION`].
    pub generation: u32,
}

/// Starts every record in the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// One of [`kind`].
    pub kind: u32,
    /// Total size in bytes of the record, header included.
    pub size: u32,
    /// `bpf_ktime_get_boot_ns()`: nanoseconds since boot, suspend included.
    pub boot_ns: u64,
    /// tgid of the process the record is about.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// User, group and cgroup v2 id: in [`kind::EXEC`] records only, zero in others (the agent
    /// keeps them per process; the helper calls would cost every marked open).
    pub uid: u32,
    pub gid: u32,
    pub cgroup_id: u64,
    /// The process's mark at the time of the record.
    pub mark: Mark,
}

/// A path resolved in the kernel from a `struct path` (dentry and mount walk).
///
/// `data[..len]` holds the components from the leaf up to the root, each followed by `/`
/// (`id_rsa/.ssh/alice/home/` for `/home/alice/.ssh/id_rsa`): the kernel walks upwards and
/// appends, and userspace reverses. The root itself is the empty path (`len == 0`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ResolvedPath {
    pub len: u32,
    /// [`path_flag`] bits.
    pub flags: u32,
    pub data: [u8; MAX_RESOLVED_PATH],
}

/// Kind [`kind::EXEC`]: sent for an exec by a marked process (after the mark is made, so a
/// manager's own exec is included).
///
/// Variable-length, like [`OpenEvent`]: this fixed part is followed by the path given to execve
/// (`filename_len` bytes), the NUL-separated argv (`args_len`), the NUL-separated environment
/// (`env_len`), the resolved executable (`executable_len`, leaf first as
/// [`ResolvedPath::data`]), the resolved working directory (`cwd_len`), and the process's
/// cgroup in the v1 hierarchy of [`Config::cgroup_subsys`] (`cgroup_v1_len`), then in the
/// unified hierarchy (`cgroup_v2_len`), each leaf first as [`ResolvedPath::data`] (the root
/// cgroup is the empty path); `header.size` is the whole length.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecEvent {
    pub header: EventHeader,
    /// tgid of the real parent.
    pub ppid: u32,
    /// At most [`MAX_GIVEN_PATH`] - 1 (`linux_binprm::filename`).
    pub filename_len: u32,
    /// At most [`MAX_ARGS`].
    pub args_len: u32,
    /// At most [`MAX_ENV`].
    pub env_len: u32,
    /// The executable (`mm->exe_file`): at most [`MAX_RESOLVED_PATH`], and its [`path_flag`] bits.
    pub executable_len: u32,
    pub executable_flags: u32,
    /// The working directory (`fs->pwd`): at most [`MAX_RESOLVED_PATH`], and its [`path_flag`] bits.
    pub cwd_len: u32,
    pub cwd_flags: u32,
    /// The cgroups (see above): at most [`MAX_CGROUP_PATH`] each, and their [`path_flag`]
    /// bits ([`path_flag::UNRESOLVED`]: not read, the hierarchy is not mounted, or unreadable).
    pub cgroup_v1_len: u32,
    pub cgroup_v1_flags: u32,
    pub cgroup_v2_len: u32,
    pub cgroup_v2_flags: u32,
}

/// The most bytes an [`ExecEvent`] record can take.
pub const MAX_EXEC_RECORD: usize = core::mem::size_of::<ExecEvent>()
    + MAX_GIVEN_PATH
    + MAX_ARGS
    + MAX_ENV
    + 2 * MAX_RESOLVED_PATH
    + 2 * MAX_CGROUP_PATH;

/// Kind [`kind::FORK`]: a marked process created a new process (threads are not reported).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForkEvent {
    /// `header.pid` is the parent's tgid; `header.mark` the parent's mark.
    pub header: EventHeader,
    pub child_pid: u32,
    /// The mark given to the child.
    pub child_depth: u32,
}

/// Kind [`kind::EXIT`]: the last thread of a marked process exited.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitEvent {
    pub header: EventHeader,
    /// `task->exit_code`: wait status as the parent would see it.
    pub exit_code: u32,
    /// The process's acts counted, not sent (see [`REPEAT_WINDOW_NS`]), that no later record
    /// of their key carried.
    pub repeats: u32,
}

/// Kind [`kind::OPEN`]: an open-family syscall of a marked process, sent at syscall exit.
///
/// Variable-length: this fixed part is followed by `given_len` bytes of the path as the process
/// gave it, then `path_len` bytes of the resolved path (leaf first, as [`ResolvedPath::data`]);
/// `header.size` is the whole length. Most opens need a few hundred bytes, not the few KiB the
/// limits allow, and the ring buffer holds that many more of them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenEvent {
    pub header: EventHeader,
    /// One of [`open_syscall`].
    pub syscall: u32,
    /// dirfd as given (`AT_FDCWD` is -100); -100 for `open` and `creat`.
    pub dirfd: i32,
    /// Open flags (`O_*`) as given (for `openat2`, `open_how.flags`).
    pub flags: u64,
    pub mode: u64,
    /// Syscall result: the new fd, or `-errno`.
    pub ret: i64,
    /// Kernel-internal `dev_t` (`MKDEV(major, minor)` = major << 20 | minor) of the opened file.
    pub dev: u64,
    pub ino: u64,
    /// Bytes of the given path that follow this struct (at most [`MAX_GIVEN_PATH`] - 1).
    pub given_len: u32,
    /// [`record_flag`] bits.
    pub record_flags: u32,
    /// With [`record_flag::CRED_INODE`]: the `CRED_INODES` value's index.
    pub cred_index: u32,
    /// Bytes of the resolved path that follow the given path (at most [`MAX_RESOLVED_PATH`]).
    pub path_len: u32,
    /// [`path_flag`] bits of the resolved path: [`path_flag::UNRESOLVED`] when the open failed.
    pub path_flags: u32,
    /// Identical opens (see [`REPEAT_WINDOW_NS`]) counted, not sent, since the previous record
    /// of this one's key.
    pub repeats: u32,
}

/// The most bytes an [`OpenEvent`] record can take.
pub const MAX_OPEN_RECORD: usize = core::mem::size_of::<OpenEvent>() + MAX_GIVEN_PATH + MAX_RESOLVED_PATH;

/// Kind [`kind::RENAME`]: a rename, link or symlink syscall of a marked process, sent at exit.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RenameEvent {
    pub header: EventHeader,
    /// One of [`rename_syscall`].
    pub syscall: u32,
    /// `renameat2`/`linkat` flags as given.
    pub flags: u32,
    /// 0, or `-errno`.
    pub ret: i64,
    /// dirfds as given (-100 for the cwd, and for the syscalls without one).
    pub old_dirfd: i32,
    pub new_dirfd: i32,
    pub old_len: u32,
    pub new_len: u32,
    /// The paths as given (for symlinks, `old` is the link's target text).
    pub old: [u8; MAX_GIVEN_PATH],
    pub new: [u8; MAX_GIVEN_PATH],
    /// The directory each relative path starts from (the dirfd's file, else the cwd), resolved
    /// at syscall entry; [`path_flag::UNRESOLVED`] when the path is absolute or for a
    /// symlink's target.
    pub old_dir: ResolvedPath,
    pub new_dir: ResolvedPath,
}

/// Kind [`kind::SYSCALL`]: a tamper or evasion syscall of a marked process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallEvent {
    pub header: EventHeader,
    /// One of [`tamper_syscall`].
    pub syscall: u32,
    /// [`record_flag`] bits.
    pub record_flags: u32,
    /// The process acted on (with [`record_flag::HAS_TARGET`]).
    pub target_pid: u32,
    /// Identical calls (see [`REPEAT_WINDOW_NS`]) counted, not sent, since the previous record
    /// of this one's key.
    pub repeats: u32,
    /// The ptrace request, bpf command, signal number or io_uring opcode.
    pub operation: u64,
    /// The result or `-errno` (with [`record_flag::HAS_RET`]).
    pub ret: i64,
}

/// Kind [`kind::CONNECT`]: a `connect` of a marked process, sent at syscall entry (a failed
/// attempt is still an attempt; a non-blocking connect has no result yet at exit anyway).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConnectEvent {
    pub header: EventHeader,
    /// One of [`net_syscall`] (always `CONNECT` for now).
    pub syscall: u32,
    pub fd: i32,
    /// [`record_flag`] bits ([`record_flag::HELD`]).
    pub record_flags: u32,
    /// `addrlen` as given, and how many bytes of it `addr` holds (at most [`MAX_SOCKADDR`]).
    pub addr_len: u32,
    pub copied: u32,
    /// The socket's type (`SOCK_STREAM` 1, `SOCK_DGRAM` 2, ...); 0 when it could not be read.
    pub sock_type: u32,
    /// Identical connects (see [`REPEAT_WINDOW_NS`]) counted, not sent, since the previous
    /// record of this one's key.
    pub repeats: u32,
    pub _pad: u32,
    /// The `struct sockaddr` as the process passed it (decoded in userspace).
    pub addr: [u8; MAX_SOCKADDR],
}

/// Kind [`kind::DNS_QUERY`]: the payload of a datagram (or stream write) a marked process sent
/// to port 53, by `sendto`/`sendmsg`/`sendmmsg` with that address, or on a socket it connected
/// there (then `addr` is the connect's address). Parsed in userspace.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DnsQueryEvent {
    pub header: EventHeader,
    /// One of [`net_syscall`].
    pub syscall: u32,
    pub fd: i32,
    /// [`record_flag`] bits ([`record_flag::DNS_SOCKET`]).
    pub record_flags: u32,
    /// Bytes of `addr` that hold the resolver's address.
    pub addr_len: u32,
    /// Bytes the process sent (of the first message, for `sendmmsg`), and how many of them
    /// `payload` holds (at most [`MAX_DNS_PAYLOAD`]).
    pub sent_len: u32,
    pub copied: u32,
    pub addr: [u8; DNS_SOCKADDR],
    pub payload: [u8; MAX_DNS_PAYLOAD],
    pub _pad: u32,
}

/// Bytes of a resolver's address kept with a DNS socket (`sizeof(struct sockaddr_in6)`).
pub const DNS_SOCKADDR: usize = 28;

/// Value of the kernel's `DNS_SOCKETS` map (keyed by `tgid << 32 | fd`): a socket connected to
/// port 53, and the address it was connected to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DnsSocket {
    pub addr_len: u32,
    pub addr: [u8; DNS_SOCKADDR],
}

/// Which family of hooks a syscall belongs to ([`HookedSyscall::family`]).
pub mod syscall_family {
    /// `syscall` is one of [`super::open_syscall`].
    pub const OPEN: u32 = 1;
    /// `syscall` is one of [`super::rename_syscall`].
    pub const RENAME: u32 = 2;
    /// `syscall` is one of [`super::tamper_syscall`].
    pub const TAMPER: u32 = 3;
    /// `syscall` is one of [`super::net_syscall`].
    pub const NET: u32 = 4;
}

/// Element of the `SYSCALLS` array, indexed by the architecture's syscall number (the
/// `__syscall_nr` of a syscall tracepoint record): one program serves every tracepoint of a
/// family and learns from this which syscall fired. The agent fills it from its libc's numbers;
/// `family` 0 marks a number nothing hooks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HookedSyscall {
    /// One of [`syscall_family`].
    pub family: u32,
    /// The family's own number for it ([`open_syscall`], [`rename_syscall`], [`tamper_syscall`]).
    pub syscall: u32,
}

/// Index of each failed-reserve counter in the per-CPU `LOST` array.
pub mod lost_index {
    /// The bulk ring buffer (`EVENTS`) was full.
    pub const EVENTS: u32 = 0;
    /// The `MARKS` map was full: a process of a package tree went unmarked.
    pub const MARKS_FULL: u32 = 1;
    /// The priority ring buffer (`PRIORITY`: credential inodes, blocks, tamper) was full.
    pub const PRIORITY: u32 = 2;
    pub const COUNT: u32 = 3;
}

/// Index of each count of [`LostTree::counts`]: the kind of record lost (or a mark not made).
pub mod lost_kind {
    pub const EXEC: usize = 0;
    pub const FORK: usize = 1;
    pub const EXIT: usize = 2;
    pub const OPEN: usize = 3;
    /// An open of a credential inode (or a blocked/denied/failed-closed one).
    pub const CREDENTIAL_OPEN: usize = 4;
    pub const RENAME: usize = 5;
    pub const SYSCALL: usize = 6;
    pub const CONNECT: usize = 7;
    pub const DNS_QUERY: usize = 8;
    /// A process of the tree left unmarked: `MARKS` was full.
    pub const MARK: usize = 9;
    pub const COUNT: usize = 10;
}

/// Value of the `LOST_TREES` map, keyed by a tree's root tgid: what the kernel lost of that
/// tree since the agent last read and deleted the entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LostTree {
    /// Indexed by [`lost_kind`].
    pub counts: [u32; lost_kind::COUNT],
    /// Of them, by the same index, the records that the priority ring refused (the rest, the
    /// bulk ring's overflow).
    pub priority: [u32; lost_kind::COUNT],
    /// `bpf_ktime_get_boot_ns()` of the first and last loss counted here.
    pub first_boot_ns: u64,
    pub last_boot_ns: u64,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are #[repr(C)], Copy, made only of integers and integer arrays,
    // with no implicit padding (checked by the layout tests), so any byte pattern is valid.
    unsafe impl aya::Pod for super::Mark {}
    unsafe impl aya::Pod for super::ManagerValue {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::InodeKey {}
    unsafe impl aya::Pod for super::CredInode {}
    unsafe impl aya::Pod for super::SparedExe {}
    unsafe impl aya::Pod for super::HookedSyscall {}
    unsafe impl aya::Pod for super::LostTree {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use core::mem::{align_of, offset_of, size_of};

    use super::*;

    #[test]
    fn header_has_no_padding() {
        assert_eq!(size_of::<Mark>(), 16);
        assert_eq!(size_of::<EventHeader>(), 56);
        assert_eq!(offset_of!(EventHeader, boot_ns), 8);
        assert_eq!(offset_of!(EventHeader, cgroup_id), 32);
        assert_eq!(offset_of!(EventHeader, mark), 40);
        assert_eq!(align_of::<EventHeader>(), 8);
    }

    #[test]
    fn records_have_no_padding() {
        assert_eq!(size_of::<ResolvedPath>(), 8 + MAX_RESOLVED_PATH);
        assert_eq!(size_of::<ExecEvent>(), 56 + 48);
        assert_eq!(offset_of!(ExecEvent, cwd_flags), 84);
        assert_eq!(offset_of!(ExecEvent, cgroup_v2_flags), 100);
        assert_eq!(size_of::<ForkEvent>(), 64);
        assert_eq!(size_of::<ExitEvent>(), 64);
        assert_eq!(offset_of!(ExitEvent, repeats), 60);
        assert_eq!(offset_of!(OpenEvent, repeats), 124);
        assert_eq!(offset_of!(SyscallEvent, repeats), 68);
        assert_eq!(offset_of!(OpenEvent, flags), 64);
        assert_eq!(offset_of!(OpenEvent, record_flags), 108);
        assert_eq!(offset_of!(OpenEvent, path_flags), 120);
        assert_eq!(size_of::<OpenEvent>(), 128);
        assert_eq!(align_of::<OpenEvent>(), 8);
        assert_eq!(offset_of!(RenameEvent, old), 56 + 32);
        assert_eq!(offset_of!(RenameEvent, old_dir), 56 + 32 + 2 * MAX_GIVEN_PATH);
        assert_eq!(size_of::<RenameEvent>(), 56 + 32 + 2 * MAX_GIVEN_PATH + 2 * size_of::<ResolvedPath>());
        assert_eq!(offset_of!(SyscallEvent, operation), 72);
        assert_eq!(size_of::<SyscallEvent>(), 88);
        assert_eq!(offset_of!(ConnectEvent, syscall), 56);
        assert_eq!(offset_of!(ConnectEvent, repeats), 80);
        assert_eq!(offset_of!(ConnectEvent, addr), 88);
        assert_eq!(size_of::<ConnectEvent>(), 88 + MAX_SOCKADDR);
        assert_eq!(align_of::<ConnectEvent>(), 8);
        assert_eq!(offset_of!(DnsQueryEvent, addr), 80);
        assert_eq!(offset_of!(DnsQueryEvent, payload), 80 + DNS_SOCKADDR);
        assert_eq!(size_of::<DnsQueryEvent>(), 80 + DNS_SOCKADDR + MAX_DNS_PAYLOAD + 4);
        assert_eq!(align_of::<DnsQueryEvent>(), 8);
        assert_eq!(size_of::<DnsSocket>(), 4 + DNS_SOCKADDR);
    }

    #[test]
    fn config_has_no_padding() {
        assert_eq!(size_of::<KernelOffsets>(), 57 * 4);
        assert_eq!(size_of::<Config>(), size_of::<KernelOffsets>() + 36);
        assert_eq!(size_of::<SparedExe>(), 8);
        assert_eq!(size_of::<ManagerValue>(), 8);
        assert_eq!(size_of::<InodeKey>(), 16);
        assert_eq!(size_of::<CredInode>(), 12);
        assert_eq!(size_of::<HookedSyscall>(), 8);
        assert_eq!(offset_of!(LostTree, priority), 40);
        assert_eq!(offset_of!(LostTree, first_boot_ns), 80);
        assert_eq!(size_of::<LostTree>(), 96);
    }
}
