//! What a notification says about an alert. Every string from the monitored system goes
//! through [`escape`] (control characters, bidi overrides), and the body, which notification
//! servers read as a subset of HTML, through [`markup`] as well.

use std::path::Path;

use credwatch_core::{
    alert::{Alert, Severity},
    output::{command_line, destination_text, escape},
};

/// A body line longer than this is cut (a 4 KiB path would fill the screen).
const MAX_LINE_CHARS: usize = 240;
/// The files of a sweep the body names.
const SWEEP_FILES_SHOWN: usize = 3;

/// One notification: its text, ready to send, its urgency and what "Details" opens.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    /// Plain text, escaped.
    pub summary: String,
    /// Escaped, then markup-escaped.
    pub body: String,
    pub critical: bool,
    /// The alert (`seq`) whose incident page "Details" opens; none for a count.
    pub details: Option<u64>,
}

/// `<`, `>` and `&` as entities: notification servers read the body as markup.
pub fn markup(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` cut to [`MAX_LINE_CHARS`] characters, with an ellipsis when cut.
fn clip(text: &str) -> String {
    match text.char_indices().nth(MAX_LINE_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Who acted, escaped: `name@version`, the manager's code when the package is not known, and
/// the coding agent first when one ran it.
pub fn who(alert: &Alert) -> String {
    let package = &alert.package;
    let code = match (&package.name, &package.version) {
        (Some(name), Some(version)) => format!("{}@{}", escape(name), escape(version)),
        (Some(name), None) => escape(name).into_owned(),
        _ => format!("{} code", escape(&package.manager)),
    };
    match &alert.coding_agent {
        Some(agent) if package.manager == "run" && package.name.is_none() => format!("agent {}", escape(&agent.name)),
        Some(agent) => format!("agent {} > {code}", escape(&agent.name)),
        None => code,
    }
}

/// What it did, in a few words, escaped: the kind of credential rather than the path, which
/// the body gives.
pub fn what(alert: &Alert) -> String {
    if let Some(sweep) = &alert.credwatch.sweep {
        return format!("swept {} kinds of credentials", sweep.categories.len());
    }
    if let Some(destination) = &alert.destination {
        let host = destination.domain.as_deref().unwrap_or(&destination.address);
        return format!("connected to {}", escape(host));
    }
    if let Some(syscall) = &alert.credwatch.syscall {
        return format!("called {}", escape(&syscall.name));
    }
    let rule = escape(&alert.rule.name);
    match (&alert.file, alert.event.action.as_str()) {
        (Some(_), "rename" | "link" | "symlink") => format!("moved {rule}"),
        (Some(file), _) if writes(&file.flags) => format!("wrote {rule}"),
        (Some(_), _) => format!("read {rule}"),
        (None, _) => {
            let program = Path::new(&alert.process.executable).file_name().map(|name| name.to_string_lossy());
            format!("ran {}", escape(program.as_deref().unwrap_or(&alert.process.executable)))
        }
    }
}

fn writes(flags: &str) -> bool {
    flags.split('|').any(|flag| matches!(flag, "O_WRONLY" | "O_RDWR" | "O_CREAT" | "O_TRUNC" | "O_APPEND"))
}

/// Whether the alert is about reading a credential (what a sweep folds), not a write, an exec,
/// a connect or a syscall.
pub fn reads_a_credential(alert: &Alert) -> bool {
    alert.destination.is_none()
        && alert.credwatch.syscall.is_none()
        && alert.file.as_ref().is_some_and(|file| !writes(&file.flags))
}

/// `CRITICAL name@version read SSH private keys`, plus the outcome when the kernel stopped it.
pub fn summary(alert: &Alert) -> String {
    let outcome = match alert.event.outcome.as_str() {
        "blocked" => " (blocked)",
        "denied" => " (denied)",
        _ => "",
    };
    format!("{} {} {}{outcome}", alert.rule.severity.as_str().to_uppercase(), who(alert), what(alert))
}

/// The notification of `alert`: the file, command or destination and the first thing to
/// rotate; `others` more alerts of its tree (folded into it) are counted at the end.
pub fn alert_notice(seq: u64, alert: &Alert, others: u64) -> Notice {
    let mut lines = Vec::new();
    if let Some(sweep) = &alert.credwatch.sweep {
        let mut files: Vec<String> =
            sweep.files.iter().take(SWEEP_FILES_SHOWN).map(|f| escape(f).into_owned()).collect();
        let more = (sweep.files.len().saturating_sub(SWEEP_FILES_SHOWN) as u64) + sweep.files_not_listed;
        if more > 0 {
            files.push(format!("{more} more files"));
        }
        lines.push(format!("files: {}", files.join(", ")));
        lines.push(format!("kinds: {}", escape(&sweep.categories.join(", "))));
        if sweep.folded > 0 {
            lines.push(format!("{} more credential reads folded in", sweep.folded));
        }
    } else if let Some(destination) = &alert.destination {
        lines.push(format!("to: {}", escape(&destination_text(destination))));
    } else if let Some(file) = &alert.file {
        lines.push(format!("file: {}", escape(&file.path)));
    } else {
        lines.push(format!("command: {}", command_line(&alert.process.args, &alert.process.executable)));
    }
    if let Some(first) = alert.credwatch.rotate.first() {
        lines.push(format!("rotate: {}", escape(first)));
    }
    if others > 0 {
        let s = if others == 1 { "" } else { "s" };
        lines.push(format!("+{others} more alert{s} of the same package and tree"));
    }
    Notice {
        summary: clip(&summary(alert)),
        body: lines.iter().map(|line| markup(&clip(line))).collect::<Vec<_>>().join("\n"),
        critical: alert.rule.severity == Severity::Critical,
        details: Some(seq),
    }
}

/// The notification counting alerts not shown one by one: `count` of them, the first few
/// described in `examples` (summaries, escaped).
pub fn count_notice(summary: String, examples: &[String], more: u64, critical: bool) -> Notice {
    let mut lines: Vec<String> = examples.iter().map(|example| markup(&clip(example))).collect();
    if more > 0 {
        lines.push(format!("and {more} more"));
    }
    lines.push("`credwatch alerts` lists them".to_owned());
    Notice { summary, body: lines.join("\n"), critical, details: None }
}

/// The alert as one line for the log: `seq`, time, summary and the body's first line, escaped.
pub fn log_line(seq: u64, alert: &Alert) -> String {
    let detail = if let Some(destination) = &alert.destination {
        escape(&destination_text(destination)).into_owned()
    } else if let Some(file) = &alert.file {
        escape(&file.path).into_owned()
    } else {
        command_line(&alert.process.args, &alert.process.executable)
    };
    format!("alert {seq} at {}: {} ({detail})", escape(&alert.timestamp), summary(alert))
}

#[cfg(test)]
pub(crate) mod tests {
    use credwatch_core::alert::*;

    use super::*;

    /// A critical read of `path` by `package@1.0.0`'s postinstall, in tree `root`.
    pub(crate) fn read_alert(package: &str, path: &str, root: u32) -> Alert {
        Alert {
            timestamp: "2026-12-05T18:00:00.000Z".into(),
            event: AlertEvent {
                id: "0".into(),
                kind: "alert".into(),
                action: "open".into(),
                outcome: "alerted".into(),
            },
            rule: AlertRule {
                id: "ssh-private-keys".into(),
                name: "SSH private keys".into(),
                category: "ssh".into(),
                severity: Severity::Critical,
                description: String::new(),
            },
            process: AlertProcess {
                pid: root + 2,
                executable: "/usr/bin/node".into(),
                args: vec!["node".into(), "index.js".into()],
                working_directory: "/w".into(),
                parent: AlertParent { pid: root + 1 },
                ancestors: Vec::new(),
            },
            file: Some(AlertFile {
                path: path.into(),
                given_path: path.into(),
                flags: "O_RDONLY".into(),
                ..Default::default()
            }),
            destination: None,
            package: AlertPackage {
                manager: "npm".into(),
                name: Some(package.into()),
                version: Some("1.0.0".into()),
                lifecycle: Some("postinstall".into()),
            },
            coding_agent: None,
            host: AlertHost { name: "desk".into(), id: None },
            agent: None,
            container: None,
            orchestrator: None,
            ci: None,
            user: AlertUser { id: 1000 },
            credwatch: AlertCredwatch {
                root_pid: root,
                rotate: vec!["the SSH key pair (and remove it from servers' authorized_keys)".into()],
                enforcement: "userspace".into(),
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_read_names_severity_package_and_what_then_the_file_and_rotation() {
        let notice = alert_notice(7, &read_alert("evil-pkg", "/home/u/.ssh/id_rsa", 100), 0);
        assert_eq!(notice.summary, "CRITICAL evil-pkg@1.0.0 read SSH private keys");
        assert_eq!(
            notice.body,
            "file: /home/u/.ssh/id_rsa\nrotate: the SSH key pair (and remove it from servers' authorized_keys)"
        );
        assert!(notice.critical);
        assert_eq!(notice.details, Some(7));
    }

    #[test]
    fn hostile_strings_are_escaped_in_summary_and_body() {
        let mut alert = read_alert("x\u{202e}gnp.exe", "/h/<b>bold</b>&amp;\x1b[31m\nline2", 1);
        alert.credwatch.rotate = vec!["<a href='x'>click</a>".into()];
        let notice = alert_notice(1, &alert, 2);
        assert!(notice.summary.contains("x\\u{202e}gnp.exe@1.0.0"), "{}", notice.summary);
        assert!(!notice.summary.contains('\u{202e}'));
        assert_eq!(
            notice.body,
            "file: /h/&lt;b&gt;bold&lt;/b&gt;&amp;amp;\\u{1b}[31m\\nline2\n\
             rotate: &lt;a href='x'&gt;click&lt;/a&gt;\n+2 more alerts of the same package and tree"
        );
    }

    #[test]
    fn a_long_path_is_cut() {
        let path = format!("/h/{}", "a".repeat(4096));
        let notice = alert_notice(1, &read_alert("p", &path, 1), 0);
        let first = notice.body.lines().next().unwrap();
        assert_eq!(first.chars().count(), MAX_LINE_CHARS + 1);
        assert!(first.ends_with('…'));
    }

    #[test]
    fn a_sweep_lists_its_first_files_and_kinds() {
        let mut alert = read_alert("stealer", "/h/.aws/credentials", 5);
        alert.file = None;
        alert.credwatch.sweep = Some(AlertSweep {
            categories: vec!["cloud".into(), "npm".into(), "ssh".into()],
            files: vec![
                "/h/.ssh/id_rsa".into(),
                "/h/.npmrc".into(),
                "/h/.aws/credentials".into(),
                "/h/.kube/config".into(),
            ],
            files_not_listed: 2,
            folded: 9,
            ..Default::default()
        });
        let notice = alert_notice(3, &alert, 0);
        assert_eq!(notice.summary, "CRITICAL stealer@1.0.0 swept 3 kinds of credentials");
        assert!(
            notice.body.starts_with(
                "files: /h/.ssh/id_rsa, /h/.npmrc, /h/.aws/credentials, 3 more files\nkinds: cloud, npm, ssh\n\
                 9 more credential reads folded in\n"
            ),
            "{}",
            notice.body
        );
    }

    #[test]
    fn a_connect_and_an_exec_say_where_and_what() {
        let mut alert = read_alert("p", "/x", 1);
        alert.file = None;
        alert.destination = Some(AlertDestination {
            address: "203.0.113.9".into(),
            port: Some(443),
            domain: Some("exfil.example".into()),
            family: "inet".into(),
            socket_type: None,
        });
        let notice = alert_notice(1, &alert, 0);
        assert_eq!(notice.summary, "CRITICAL p@1.0.0 connected to exfil.example");
        assert!(notice.body.starts_with("to: exfil.example (203.0.113.9:443)"), "{}", notice.body);
        alert.destination = None;
        alert.process.executable = "/usr/bin/curl".into();
        alert.process.args = vec!["curl".into(), "-d".into(), "@/h/.npmrc".into()];
        let notice = alert_notice(1, &alert, 0);
        assert_eq!(notice.summary, "CRITICAL p@1.0.0 ran curl");
        assert!(notice.body.starts_with("command: curl -d @/h/.npmrc"), "{}", notice.body);
    }
}
