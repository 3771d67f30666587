//! Where alerts go: a terminal (readable), JSON lines (for pipelines), a file (JSON lines,
//! appended). Every string that came from the monitored system is escaped before it reaches a
//! terminal: a file name can hold escape sequences.

use std::{
    borrow::Cow,
    fmt::Write as _,
    fs::{File, OpenOptions},
    io::{self, Write},
    path::Path,
};

use crate::alert::{
    Alert, AlertBlindSpot, AlertDestination, AlertPackage, BlindSpotCause, Severity, BLIND_SPOT_ACTION,
};

/// Makes `text` safe to print on a terminal: control characters (C0, DEL, C1), bidirectional
/// overrides and backslashes become visible escapes, so a hostile path cannot move the
/// cursor, recolour the screen or hide part of a line.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            '\t' => escaped.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(escaped, "\\u{{{:x}}}", c as u32);
            }
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

fn needs_escape(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
}

/// Joins argv for display, each word escaped and quoted when it holds a space.
pub fn command_line(args: &[String], fallback: &str) -> String {
    if args.is_empty() {
        return escape(fallback).into_owned();
    }
    args.iter()
        .map(|arg| {
            let arg = escape(arg);
            if arg.is_empty() || arg.contains(' ') {
                format!("'{arg}'")
            } else {
                arg.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The alert's process chain from the root down to the process, one escaped line each, drawn
/// as a tree (`[pid] command`).
pub fn process_tree(alert: &Alert) -> Vec<String> {
    let chain = alert
        .process
        .ancestors
        .iter()
        .map(|a| (a.pid, command_line(&a.args, &a.executable)))
        .chain(std::iter::once((alert.process.pid, command_line(&alert.process.args, &alert.process.executable))));
    chain
        .enumerate()
        .map(|(depth, (pid, command))| {
            let branch = if depth == 0 { String::new() } else { format!("{}└─ ", "   ".repeat(depth - 1)) };
            format!("{branch}[{pid}] {command}")
        })
        .collect()
}

/// Human rendering: what happened in one line, then the rule, the file, the process tree from
/// the root down, and what to rotate.
pub fn render(alert: &Alert, colour: bool) -> String {
    let (on, off) = if colour { (severity_colour(alert.rule.severity), "\x1b[0m") } else { ("", "") };
    let package = &alert.package;
    let mut who = format!("{} package {}", escape(&package.manager), package_text(package));
    let blind_spot = alert.credwatch.blind_spot.as_ref().filter(|_| alert.event.action == BLIND_SPOT_ACTION);
    if blind_spot.is_some() && package.manager == UNKNOWN_TREE_MANAGER {
        who = match alert.process.pid {
            0 => "a tree the kernel could not tell".to_owned(),
            pid => format!("the tree of pid {pid}"),
        };
    }
    // Under a coding agent: the agent first, then the package when a manager it ran started one.
    if let Some(agent) = &alert.coding_agent {
        let tool = package.manager == "run" && package.name.is_none();
        who = if tool {
            format!("agent {}", escape(&agent.name))
        } else {
            format!("agent {} > {who}", escape(&agent.name))
        };
    }
    let what = headline(alert);
    let blocked = match alert.event.outcome.as_str() {
        "blocked" => " [BLOCKED]",
        "denied" => " [DENIED]",
        _ => "",
    };

    let mut out = String::new();
    let _ = writeln!(out, "{on}[{}]{off}{blocked} {who} {what}", alert.rule.severity.as_str().to_uppercase());
    let _ = writeln!(
        out,
        "  rule     {} ({}): {}",
        escape(&alert.rule.id),
        escape(&alert.rule.category),
        escape(&alert.rule.name)
    );
    if let Some(agent) = &alert.coding_agent {
        let ran = match &agent.command {
            Some(command) => format!("ran {}", escape(&command.join(" "))),
            None => "acted itself".to_owned(),
        };
        let _ = writeln!(out, "  agent    {}[{}] {ran}", escape(&agent.name), agent.pid);
    }
    if let Some(why) = &alert.credwatch.why {
        let _ = writeln!(out, "  why      {}", escape(why));
    }
    if let Some(spot) = &alert.credwatch.blind_spot {
        let label = if blind_spot.is_some() { "  missed   " } else { "  unseen   " };
        let _ = writeln!(out, "{label}{}", escape(&blind_spot_text(spot)));
        if spot.packages.len() > 1 {
            let names: Vec<String> = spot.packages.iter().map(package_text).collect();
            let _ = writeln!(out, "  packages {}", names.join(", "));
        }
    }
    if let Some(gap) = &alert.credwatch.gap {
        let (how, after) = if gap.stopped { ("stopped", "when it resumed") } else { ("down", "on restart") };
        let _ = writeln!(
            out,
            "  when     credwatch was {how}, from {} to {} ({:.1} s): caught up {after}",
            gap.down_from, gap.down_to, gap.seconds
        );
    }
    if let Some(file) = &alert.file {
        let _ =
            writeln!(out, "  file     {}  (given as {}, {})", escape(&file.path), escape(&file.given_path), file.flags);
        if let Some(original) = &file.same_file_as {
            let _ = writeln!(out, "  same as  {} (same inode: a link or copy of it)", escape(original));
        }
    }
    if let Some(destination) = &alert.destination {
        let _ = writeln!(out, "  dest     {}", escape(&destination_text(destination)));
    }
    for (index, file) in alert.credwatch.credentials_touched.iter().enumerate() {
        let label = if index == 0 { "  after    " } else { "           " };
        let _ = writeln!(out, "{label}{}", escape(file));
    }
    if let Some(sweep) = &alert.credwatch.sweep {
        let _ = writeln!(out, "  sweep    {} within {} s", escape(&sweep.categories.join(", ")), sweep.window_s);
        for file in &sweep.files {
            let _ = writeln!(out, "           {}", escape(file));
        }
        if sweep.files_not_listed > 0 {
            let _ = writeln!(out, "           ... and {} more files", sweep.files_not_listed);
        }
        if sweep.folded > 0 {
            let _ = writeln!(out, "  folded   {} further credential alerts of this tree", sweep.folded);
        }
    }
    if let Some(count) = alert.credwatch.count {
        let _ = writeln!(out, "  repeated {count} times so far");
    }
    let _ = writeln!(out, "  at       {}  uid {}  host {}", alert.timestamp, alert.user.id, escape(&alert.host.name));
    if let Some(container) = &alert.container {
        let runtime = container.runtime.as_deref().map(|r| format!("{r}://")).unwrap_or_default();
        let pod = alert.orchestrator.as_ref().map(|o| format!("  pod {}", o.pod_label())).unwrap_or_default();
        let _ = writeln!(out, "  in       container {}{}{}", escape(&runtime), escape(&container.id), escape(&pod));
    }
    if let Some(ci) = &alert.ci {
        let mut job = ci.provider.clone();
        for part in [&ci.repository, &ci.workflow, &ci.job].into_iter().flatten() {
            job.push_str(" / ");
            job.push_str(part);
        }
        if let Some(run) = &ci.run_id {
            job.push_str(&format!("  run {run}"));
        }
        let _ = writeln!(out, "  ci       {}", escape(&job));
    }
    out.push_str("  tree\n");
    for line in process_tree(alert) {
        let _ = writeln!(out, "           {line}");
    }
    let _ = writeln!(out, "  cwd      {}", escape(&alert.process.working_directory));
    for item in &alert.credwatch.rotate {
        let _ = writeln!(out, "  rotate   {}", escape(item));
    }
    if alert.credwatch.contained && alert.destination.is_some() {
        out.push_str(
            "  note     contained: the box shut the socket (an empty file over it); the connection was refused\n",
        );
    } else if alert.credwatch.enforcement == crate::alert::READ_ONLY_MOUNT {
        out.push_str("  note     refused: the file system is read-only here (EROFS: run --contain's home); nothing was written\n");
    } else if alert.credwatch.contained {
        out.push_str("  note     contained: the box replaced the file (empty, or its settings without secrets); the credential was not read\n");
    } else if alert.credwatch.enforcement.ends_with(crate::alert::FAIL_CLOSED) {
        out.push_str("  note     the kernel acted on its own: no agent had read its records for a while (--enforce fails closed)\n");
    } else if blind_spot.is_none() && !matches!(alert.event.outcome.as_str(), "blocked" | "denied") {
        let what = if alert.destination.is_some() { "connection" } else { "read" };
        let _ = writeln!(out, "  note     matched in {}; the {what} was not blocked", alert.credwatch.enforcement);
    }
    out
}

/// `package.manager` of a blind-spot alert about a tree the engine could not name.
pub const UNKNOWN_TREE_MANAGER: &str = "unknown";

/// `name@version (lifecycle)` as known, escaped; `code` for code of no named package.
pub fn package_text(package: &AlertPackage) -> String {
    let mut text = match (&package.name, &package.version) {
        (Some(name), Some(version)) => format!("{}@{}", escape(name), escape(version)),
        (Some(name), None) => escape(name).into_owned(),
        _ => "code".to_owned(),
    };
    if let Some(step) = &package.lifecycle {
        let _ = write!(text, " ({})", escape(step));
    }
    text
}

/// What a blind spot missed, and when: `records lost from T1 to T2 (2.0 s): 60000 open, 1
/// credential_open; 3 reports`. Not escaped (the counts' kinds come from the input).
pub fn blind_spot_text(spot: &AlertBlindSpot) -> String {
    let what = match spot.cause {
        BlindSpotCause::Lost => "records lost",
        BlindSpotCause::Overflow => "records lost to a ring overflow",
        BlindSpotCause::MarksFull => "processes left unmarked (the kernel's table was full)",
        BlindSpotCause::Gap if spot.stopped => "credwatch stopped",
        BlindSpotCause::Gap => "credwatch down",
    };
    let mut text = format!("{what} from {} to {} ({:.1} s)", spot.since, spot.until, spot.seconds);
    if !spot.counts.is_empty() {
        let counts: Vec<String> = spot.counts.iter().map(|(kind, count)| format!("{count} {kind}")).collect();
        let _ = write!(text, ": {}", counts.join(", "));
    }
    if spot.credential {
        text.push_str("; one was a credential file's open");
    }
    if spot.reports > 1 {
        let _ = write!(text, "; {} reports", spot.reports);
    }
    if spot.is_final {
        text.push_str(" (summary)");
    }
    text
}

/// `name (address:port)`, or the address alone.
pub fn destination_text(destination: &AlertDestination) -> String {
    let address = match destination.port {
        Some(port) => crate::net::host_port(&destination.address, port),
        None => destination.address.clone(),
    };
    match &destination.domain {
        // A name the box's proxy refused is its address too.
        Some(name) if *name != destination.address => format!("{name} ({address})"),
        _ => address,
    }
}

/// What the process did, in a few words.
pub fn headline(alert: &Alert) -> String {
    let command = || command_line(&alert.process.args, &alert.process.executable);
    if let Some(spot) = alert.credwatch.blind_spot.as_ref().filter(|_| alert.event.action == BLIND_SPOT_ACTION) {
        let lost: u64 = spot.counts.values().sum();
        return match spot.cause {
            BlindSpotCause::Gap if spot.stopped => format!("ran while credwatch was stopped for {:.1} s", spot.seconds),
            BlindSpotCause::Gap => format!("ran while credwatch was down for {:.1} s", spot.seconds),
            BlindSpotCause::MarksFull => "ran a process unwatched: the kernel's table of processes was full".to_owned(),
            BlindSpotCause::Lost | BlindSpotCause::Overflow => format!("went unseen: {lost} records lost"),
        };
    }
    if let Some(sweep) = &alert.credwatch.sweep {
        let what = if sweep.is_final { "swept (summary)" } else { "swept" };
        return format!("{what} {} kinds of credentials", sweep.categories.len());
    }
    if let Some(destination) = &alert.destination {
        let verb = if alert.credwatch.enforcement == "proxy" { "asked the box's proxy for" } else { "connected to" };
        return format!("{verb} {}", escape(&destination_text(destination)));
    }
    if let Some(syscall) = &alert.credwatch.syscall {
        let mut text = format!("called {}", escape(&syscall.name));
        if let Some(operation) = &syscall.operation {
            let _ = write!(text, " {}", escape(operation));
        }
        if let Some(pid) = syscall.target_pid {
            let _ = write!(text, " on pid {pid}");
        }
        return text;
    }
    match (&alert.file, alert.event.action.as_str()) {
        (Some(file), action @ ("rename" | "link" | "symlink")) => {
            let done = if action == "rename" { "renamed" } else { "linked" };
            match (&file.renamed_from, &file.renamed_to) {
                (Some(from), _) => format!("{done} {} onto {}", escape(from), escape(&file.path)),
                (None, Some(to)) => format!("{done} {} to {}", escape(&file.path), escape(to)),
                (None, None) => format!("{done} {}", escape(&file.path)),
            }
        }
        (Some(file), _) if is_write(&file.flags) => format!("opened for writing {}", escape(&file.path)),
        (Some(file), _) => format!("opened {}", escape(&file.path)),
        (None, _) => format!("ran {}", command()),
    }
}

fn is_write(flags: &str) -> bool {
    flags.split('|').any(|flag| matches!(flag, "O_WRONLY" | "O_RDWR" | "O_CREAT" | "O_TRUNC" | "O_APPEND"))
}

/// A severity as people type it (`high`, `HIGH`), for the commands' flags; the error names the
/// text, escaped for the terminal it is shown on, and the severities. Here rather than beside
/// [`Severity`], which does not depend on this module.
impl std::str::FromStr for Severity {
    type Err = String;

    fn from_str(text: &str) -> Result<Severity, String> {
        serde_json::from_value(serde_json::Value::String(text.to_ascii_lowercase()))
            .map_err(|_| format!("{}: not a severity (low, medium, high or critical)", escape(text)))
    }
}

fn severity_colour(severity: Severity) -> &'static str {
    match severity {
        Severity::Low => "\x1b[36m",
        Severity::Medium => "\x1b[33m",
        Severity::High => "\x1b[1;31m",
        Severity::Critical => "\x1b[1;37;41m",
    }
}

/// Writes each alert to stdout (human or JSON lines) and, when asked, appends it as JSON to a file.
pub struct AlertSink {
    json: bool,
    /// Nothing to stdout (it carries something else, such as a report).
    quiet: bool,
    colour: bool,
    file: Option<File>,
    written: u64,
}

impl AlertSink {
    pub fn new(json: bool, file: Option<&Path>, quiet: bool) -> io::Result<AlertSink> {
        let file = file.map(|path| OpenOptions::new().create(true).append(true).open(path)).transpose()?;
        let colour = !json && unsafe { libc::isatty(libc::STDOUT_FILENO) } == 1;
        Ok(AlertSink { json, quiet, colour, file, written: 0 })
    }

    pub fn write(&mut self, alert: &Alert) -> io::Result<()> {
        let line = serde_json::to_string(alert).map_err(io::Error::other)?;
        if !self.quiet {
            let mut stdout = io::stdout().lock();
            if self.json {
                writeln!(stdout, "{line}")?;
            } else {
                writeln!(stdout, "{}", render(alert, self.colour))?;
            }
            stdout.flush()?;
        }
        if let Some(file) = &mut self.file {
            writeln!(file, "{line}")?;
            file.flush()?;
        }
        self.written += 1;
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::*;

    fn alert() -> Alert {
        Alert {
            timestamp: "2026-11-29T20:00:00.000000000Z".into(),
            event: AlertEvent {
                id: String::new(),
                kind: "alert".into(),
                action: "open".into(),
                outcome: "alerted".into(),
            },
            rule: AlertRule {
                id: "cred.registry.npmrc".into(),
                name: "npm registry token read by package code".into(),
                category: "registry-token".into(),
                severity: Severity::High,
                description: String::new(),
            },
            process: AlertProcess {
                pid: 30,
                executable: "/usr/bin/node".into(),
                args: vec!["node".into(), "steal\x1b[2J.js".into()],
                working_directory: "/p/node_modules/evil".into(),
                parent: AlertParent { pid: 20 },
                ancestors: vec![
                    AlertAncestor {
                        pid: 10,
                        executable: "/usr/bin/npm".into(),
                        args: vec!["npm".into(), "install".into()],
                    },
                    AlertAncestor {
                        pid: 20,
                        executable: "/bin/sh".into(),
                        args: vec!["sh".into(), "-c".into(), "node steal.js".into()],
                    },
                ],
            },
            file: Some(AlertFile {
                path: "/home/a/.npmrc".into(),
                given_path: "../../.npmrc".into(),
                flags: "O_RDONLY".into(),
                ..AlertFile::default()
            }),
            destination: None,
            package: AlertPackage {
                manager: "npm".into(),
                name: Some("evil".into()),
                version: Some("1.0.0".into()),
                lifecycle: Some("postinstall".into()),
            },
            coding_agent: None,
            host: AlertHost { name: "dev".into(), id: None },
            agent: None,
            container: None,
            orchestrator: None,
            ci: None,
            user: AlertUser { id: 1000 },
            credwatch: AlertCredwatch {
                root_pid: 10,
                rotate: vec!["the npm token in ~/.npmrc".into()],
                enforcement: "userspace".into(),
                ..AlertCredwatch::default()
            },
        }
    }

    #[test]
    fn headlines_say_what_was_done() {
        let mut write = alert();
        write.file.as_mut().unwrap().flags = "O_WRONLY|O_APPEND".into();
        assert!(render(&write, false).contains(" opened for writing /home/a/.npmrc\n"));

        let mut renamed = alert();
        renamed.event.action = "rename".into();
        renamed.file.as_mut().unwrap().renamed_from = Some("/tmp/x\u{1b}".into());
        assert!(render(&renamed, false).contains(" renamed /tmp/x\\u{1b} onto /home/a/.npmrc\n"));

        let mut syscall = alert();
        syscall.file = None;
        syscall.credwatch.syscall = Some(AlertSyscall {
            name: "ptrace".into(),
            operation: Some("PTRACE_ATTACH".into()),
            target_pid: Some(77),
            ret: Some(0),
        });
        assert!(render(&syscall, false).contains(" called ptrace PTRACE_ATTACH on pid 77\n"));

        let mut sweep = alert();
        sweep.credwatch.sweep = Some(AlertSweep {
            categories: vec!["cloud".into(), "registry".into(), "ssh".into()],
            files: vec!["/home/a/.npmrc".into()],
            folded: 4,
            window_s: 30,
            ..AlertSweep::default()
        });
        let text = render(&sweep, false);
        assert!(text.contains(" swept 3 kinds of credentials\n"), "{text}");
        assert!(text.contains("  sweep    cloud, registry, ssh within 30 s\n"), "{text}");
        assert!(text.contains("  folded   4 further credential alerts"), "{text}");

        let mut exec = alert();
        exec.file = None;
        exec.process.args = vec!["gh".into(), "auth".into(), "token".into()];
        assert!(render(&exec, false).contains(" ran gh auth token\n"));

        let mut connect = alert();
        connect.file = None;
        connect.destination = Some(AlertDestination {
            address: "127.0.0.9".into(),
            port: Some(8080),
            domain: Some("collector.exfil.invalid".into()),
            family: "inet".into(),
            socket_type: Some("stream".into()),
        });
        connect.credwatch.credentials_touched = vec!["/home/a/.npmrc".into(), "/home/a/.ssh/id\u{1b}[2J".into()];
        let text = render(&connect, false);
        assert!(text.contains(" connected to collector.exfil.invalid (127.0.0.9:8080)\n"), "{text}");
        assert!(text.contains("  after    /home/a/.npmrc\n           /home/a/.ssh/id\\u{1b}[2J\n"), "{text}");
        assert!(text.contains("the connection was not blocked"), "{text}");
        let mut unix = alert();
        unix.file = None;
        unix.destination = Some(AlertDestination {
            address: "/run/docker.sock\n".into(),
            family: "unix".into(),
            ..AlertDestination::default()
        });
        assert!(render(&unix, false).contains(" connected to /run/docker.sock\\n\n"), "{}", render(&unix, false));
    }

    #[test]
    fn escapes_terminal_controls() {
        assert_eq!(escape("plain/path"), "plain/path");
        assert_eq!(escape("a\x1b[31mb\nc\\"), "a\\u{1b}[31mb\\nc\\\\");
        assert_eq!(escape("x\u{202e}gpj.exe"), "x\\u{202e}gpj.exe");
        assert_eq!(escape("\u{9b}2J"), "\\u{9b}2J");
    }

    #[test]
    fn renders_package_file_tree_and_rotation() {
        let text = render(&alert(), false);
        assert!(text.starts_with("[HIGH] npm package evil@1.0.0 (postinstall) opened /home/a/.npmrc\n"), "{text}");
        assert!(text.contains("[10] npm install\n"), "{text}");
        assert!(text.contains("└─ [20] sh -c 'node steal.js'\n"), "{text}");
        assert!(text.contains("   └─ [30] node steal\\u{1b}[2J.js\n"), "{text}");
        assert!(text.contains("rotate   the npm token in ~/.npmrc"), "{text}");
        assert!(!text.contains('\x1b'), "raw escape reached the terminal: {text}");
        assert!(!text.contains("  in  ") && !text.contains("  ci  "), "{text}");
    }

    #[test]
    fn renders_the_container_pod_and_ci_job_escaped() {
        let mut alert = alert();
        alert.container = Some(crate::alert::AlertContainer { id: "ab".repeat(32), runtime: Some("cri-o".into()) });
        alert.orchestrator = Some(crate::alert::AlertOrchestrator {
            kind: "kubernetes".into(),
            namespace: None,
            resource: crate::alert::AlertResource {
                kind: "pod".into(),
                id: Some("0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d".into()),
                name: None,
            },
        });
        alert.ci = Some(crate::alert::AlertCi {
            provider: "github".into(),
            repository: Some("octo/app".into()),
            workflow: Some("CI\x1b[2J".into()),
            job: Some("test".into()),
            run_id: Some("42".into()),
            ..crate::alert::AlertCi::default()
        });
        let text = render(&alert, false);
        let container =
            format!("  in       container cri-o://{}  pod 0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d\n", "ab".repeat(32));
        assert!(text.contains(&container), "{text}");
        assert!(text.contains("  ci       github / octo/app / CI\\u{1b}[2J / test  run 42\n"), "{text}");
        assert!(!text.contains('\x1b'), "raw escape reached the terminal: {text}");
    }

    #[test]
    fn a_blocked_or_denied_alert_says_so_and_no_note() {
        for (outcome, tag) in [("blocked", "[BLOCKED]"), ("denied", "[DENIED]")] {
            let mut alert = alert();
            alert.event.outcome = outcome.into();
            let text = render(&alert, false);
            assert!(text.lines().next().unwrap().contains(tag), "{text}");
            assert!(!text.contains("was not blocked"), "{text}");
        }
        let text = render(&alert(), false);
        assert!(
            !text.contains("[BLOCKED]") && !text.contains("[DENIED]") && text.contains("was not blocked"),
            "{text}"
        );
    }
}
