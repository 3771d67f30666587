//! Rule samples: turns a rule's sample steps into the `Event`s the engine consumes, replays
//! them, and checks each rule does what its samples promise. It sits above both `rules` and
//! `engine`, which know nothing of each other.

use std::{collections::HashSet, fmt, path::Path};

use crate::{
    alert::Alert,
    engine::{Engine, EngineOptions},
    event::{AgentGap, BlindSpot, Connect, DnsQuery, Event, EventData, Exec, Exit, Fork, Open, Rename, Root, Syscall},
    rules::{
        load_dir_over_defaults,
        schema::{ConnectStep, OpenStep, RenameStep, Step, SyscallStep},
        RuleSet, RulesError,
    },
};

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Rules(#[from] RulesError),
    /// Samples that did not do what they promise.
    #[error("{} sample(s) failed:\n{}", failures.len(), failures.join("\n"))]
    Samples { failures: Vec<String> },
}

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
            Step::Exit(exit) => push(&mut out, exit.pid, EventData::Exit(Exit { code: 0, repeats: 0 })),
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
            Step::BlindSpot(spot) => {
                let until_ns = SAMPLE_EPOCH_NS + out.len() as u64 * 1_000_000;
                let spot = BlindSpot {
                    cause: spot.cause,
                    root_pid: spot.root,
                    since_ns: until_ns - spot.seconds * 1_000_000_000,
                    until_ns,
                    counts: spot.counts.clone(),
                    credential: spot.credential,
                };
                push(&mut out, 0, EventData::BlindSpot(spot));
            }
            Step::Gap(gap) => {
                let until_ns = SAMPLE_EPOCH_NS + out.len() as u64 * 1_000_000;
                let since_ns = until_ns - gap.seconds * 1_000_000_000;
                push(&mut out, 0, EventData::AgentGap(AgentGap { since_ns, clean_stop: false, stopped: gap.stopped }));
            }
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
        denied: false,
        fail_closed: false,
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
        repeats: 0,
    }
}

fn connect_event(connect: &ConnectStep) -> Connect {
    let family = match (&connect.address, &connect.path) {
        (Some(std::net::IpAddr::V4(_)), _) => "inet",
        (Some(std::net::IpAddr::V6(_)), _) => "inet6",
        (None, Some(_)) => "unix",
        (None, None) if connect.proxy_refused.is_some() => "inet",
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
        fail_closed: false,
        proxy_refused: connect.proxy_refused.clone(),
        repeats: 0,
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
        denied: false,
        repeats: 0,
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

/// Replays every rule's samples over `set`; the failures, one line each.
pub fn failures(set: &RuleSet) -> Vec<String> {
    let mut failures = Vec::new();
    for rule in set.rules() {
        let samples = [
            ("positive", &rule.samples.positive),
            ("negative", &rule.samples.negative),
            ("lowered", &rule.samples.lowered),
        ];
        for (kind, steps) in samples {
            if steps.is_empty() {
                continue;
            }
            let alerts = replay(set, steps);
            let own: Vec<_> = alerts.iter().filter(|alert| alert.rule.id == rule.id).collect();
            let full = |alert: &&Alert| alert.rule.severity == rule.severity;
            let wrong = match kind {
                "positive" if own.is_empty() => Some("did not fire the rule".to_owned()),
                "positive" if !own.iter().any(full) => {
                    Some(format!("fired the rule only below its severity ({})", rule.severity.as_str()))
                }
                "negative" if !own.is_empty() => Some("fired the rule".to_owned()),
                "lowered" if own.is_empty() => Some("did not fire the rule".to_owned()),
                "lowered" if own.iter().any(|a| a.rule.severity >= rule.severity || a.credwatch.why.is_none()) => {
                    Some("fired the rule at its own severity, or without saying why".to_owned())
                }
                _ => None,
            };
            if let Some(what) = wrong {
                let others: Vec<&str> = alerts.iter().map(|a| a.rule.id.as_str()).collect();
                failures.push(format!(
                    "{}: rule {}: the {kind} sample {what} (alerts: {})",
                    rule.origin,
                    rule.id,
                    if others.is_empty() { "none".to_owned() } else { others.join(", ") }
                ));
            }
        }
    }
    failures.extend(crate::doors::sample_failures(set));
    failures
}

/// What `credwatch rules check` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// Rule files read from the directory.
    pub files: usize,
    /// Managers and rules defined in the directory.
    pub managers: usize,
    pub rules: usize,
    /// Samples replayed (defaults and the directory's, as merged), all passing.
    pub samples: usize,
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} file(s): {} manager(s), {} rule(s); {} sample(s) replayed over the merged rules, all passed",
            self.files, self.managers, self.rules, self.samples
        )
    }
}

/// `credwatch rules check DIR`: parses and validates `dir`, merges it over the defaults as
/// `--rules DIR` would, and replays every rule's samples.
pub fn check_dir(dir: &Path) -> Result<CheckReport, CheckError> {
    let loaded = load_dir_over_defaults(dir)?;
    let failures = failures(&loaded.merged);
    if !failures.is_empty() {
        return Err(CheckError::Samples { failures });
    }
    Ok(CheckReport {
        files: loaded.files,
        managers: loaded.managers,
        rules: loaded.rules,
        samples: loaded.merged.rules().len() * 2,
    })
}

#[cfg(test)]
mod tests;
