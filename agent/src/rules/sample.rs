//! Turns a rule's sample steps into the `Event`s the engine consumes, and replays them.

use std::collections::HashSet;

use super::{
    schema::{ConnectStep, OpenStep, RenameStep, Step, SyscallStep},
    RuleSet,
};
use crate::{
    alert::Alert,
    engine::{Engine, EngineOptions},
    event::{Connect, DnsQuery, Event, EventData, Exec, Exit, Fork, Open, Rename, Root, Syscall},
};

/// Samples start at this (arbitrary, fixed) time so that alerts are reproducible.
const SAMPLE_EPOCH_NS: u64 = 1_767_225_600_000_000_000;

/// The events of a sample, in order.
pub fn events(steps: &[Step]) -> Vec<Event> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(steps.len() + 2);
    let push = |out: &mut Vec<Event>, pid: u32, data: EventData| {
        let time_ns = SAMPLE_EPOCH_NS + out.len() as u64 * 1_000_000;
        out.push(Event { time_ns, pid, data });
    };
    for step in steps {
        match step {
            Step::Exec(exec) => {
                if !seen.contains(&exec.pid) && seen.contains(&exec.ppid) {
                    push(&mut out, exec.ppid, EventData::Fork(Fork { child_pid: exec.pid }));
                }
                let filename = exec.file.clone().unwrap_or_else(|| exec.args.0[0].clone());
                push(
                    &mut out,
                    exec.pid,
                    EventData::Exec(Exec {
                        ppid: exec.ppid,
                        executable: filename.clone(),
                        filename,
                        args: exec.args.0.clone(),
                        cwd: exec.cwd.clone(),
                        uid: exec.uid,
                        gid: exec.uid,
                        env: exec.env.clone(),
                        ..Exec::default()
                    }),
                );
                seen.insert(exec.pid);
            }
            Step::Fork(fork) => {
                push(&mut out, fork.pid, EventData::Fork(Fork { child_pid: fork.child }));
                seen.insert(fork.child);
            }
            Step::Exit(exit) => push(&mut out, exit.pid, EventData::Exit(Exit { code: 0 })),
            Step::Root(root) => {
                push(&mut out, root.pid, EventData::Root(Root { reason: "run".into() }));
                seen.insert(root.pid);
            }
            Step::Open(open) => push(&mut out, open.pid, EventData::Open(open_event(open))),
            Step::Rename(rename) => push(&mut out, rename.pid, EventData::Rename(rename_event(rename))),
            Step::Syscall(syscall) => push(&mut out, syscall.pid, EventData::Syscall(syscall_event(syscall))),
            Step::Connect(connect) => push(&mut out, connect.pid, EventData::Connect(connect_event(connect))),
            Step::Dns(dns) => push(
                &mut out,
                dns.pid,
                EventData::DnsQuery(DnsQuery {
                    tid: dns.pid,
                    name: dns.name.to_ascii_lowercase(),
                    qtype: dns.qtype.clone().unwrap_or_else(|| "A".into()),
                    server: Some("127.0.0.53:53".into()),
                }),
            ),
            Step::Event(event) => {
                seen.insert(event.pid);
                if let EventData::Fork(fork) = &event.data {
                    seen.insert(fork.child_pid);
                }
                out.push((**event).clone());
            }
        }
    }
    out
}

fn open_event(open: &OpenStep) -> Open {
    let ok = open.ret >= 0;
    Open {
        same_file_as: open.same_file_as.clone(),
        blocked: open.blocked,
        tid: open.pid,
        syscall: open.syscall.clone().unwrap_or_else(|| "openat".into()),
        dirfd: -100,
        flags: open.flags.0,
        mode: 0,
        path: open.given.clone().unwrap_or_else(|| open.path.clone()),
        abs_path: (ok && open.path.starts_with('/')).then(|| open.path.clone()),
        truncated: false,
        ret: open.ret,
        dev: 0,
        ino: 0,
    }
}

fn connect_event(connect: &ConnectStep) -> Connect {
    let family = match (&connect.address, &connect.path) {
        (Some(std::net::IpAddr::V4(_)), _) => "inet",
        (Some(std::net::IpAddr::V6(_)), _) => "inet6",
        (None, Some(_)) => "unix",
        (None, None) => "unspec",
    };
    Connect {
        tid: connect.pid,
        family: family.into(),
        socket_type: None,
        address: connect.address.map(|address| address.to_string()),
        port: connect.port,
        path: connect.path.clone(),
        ret: None,
        held: connect.held,
    }
}

fn rename_event(rename: &RenameStep) -> Rename {
    let syscall = rename.syscall.clone().unwrap_or_else(|| "renameat2".into());
    let symlink = syscall.starts_with("symlink");
    Rename {
        tid: rename.pid,
        old_abs: (!symlink).then(|| rename.old.clone()),
        new_abs: Some(rename.new.clone()),
        syscall,
        old_path: rename.old.clone(),
        new_path: rename.new.clone(),
        ret: rename.ret,
    }
}

fn syscall_event(syscall: &SyscallStep) -> Syscall {
    Syscall {
        tid: syscall.pid,
        name: syscall.name.clone(),
        target_pid: syscall.target,
        operation: syscall.operation.clone(),
        ret: syscall.ret,
        blocked: syscall.blocked,
    }
}

/// Replays `steps` through a fresh engine over `rules`, end of stream included.
pub fn replay(rules: &RuleSet, steps: &[Step]) -> Vec<Alert> {
    let mut engine =
        Engine::new(rules.clone(), EngineOptions { host_name: "sample".into(), ..EngineOptions::default() });
    let mut alerts: Vec<Alert> = events(steps).iter().flat_map(|event| engine.handle(event)).collect();
    alerts.extend(engine.flush());
    alerts
}
