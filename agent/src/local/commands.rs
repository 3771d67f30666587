//! `credwatch alerts` and `credwatch show`: the local alert log from the terminal.

use std::{
    fs,
    io::{self, Write as _},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::Args;
use credwatch_core::{
    alert::{Alert, Severity},
    fleet::PackageFilter,
    output::{escape, headline, render},
};
use serde_json::{Map, Value};
use time::{format_description::well_known::Rfc3339, OffsetDateTime};

use super::{client, protocol::Logged};

/// How far from an alert `show` looks for the other alerts of its tree.
const SAME_TREE_WITHIN: Duration = Duration::from_secs(24 * 3600);

/// `watch`'s flags for the local alert log and its socket.
#[derive(Args)]
pub struct WatchLocalArgs {
    /// Append every alert, with its seq, to FILE: the local alert log of `credwatch alerts` and
    /// `show` [default: /var/lib/credwatch/alerts.jsonl]
    #[arg(long, value_name = "FILE")]
    alert_log: Option<PathBuf>,
    /// Serve the local alert log and the live alerts on this Unix socket, to each user their
    /// own (root and group `credwatch`: all) [default: /run/credwatch/alerts.sock]
    #[arg(long, value_name = "PATH")]
    alerts_socket: Option<PathBuf>,
}

impl WatchLocalArgs {
    /// The `alert_log` and `alerts_socket` keys, when their flags are given.
    pub fn add_to(&self, flags: &mut Map<String, Value>) {
        for (key, path) in [("alert_log", &self.alert_log), ("alerts_socket", &self.alerts_socket)] {
            if let Some(path) = path {
                flags.insert(key.into(), Value::String(path.to_string_lossy().into_owned()));
            }
        }
    }
}

/// Where the local alerts are: the agent's socket, and its log for root.
#[derive(Args)]
pub struct Source {
    /// The running agent's socket (`watch --alerts-socket`).
    #[arg(long, value_name = "PATH", default_value = client::DEFAULT_SOCKET)]
    alerts_socket: PathBuf,
    /// The agent's log, read directly when readable (root), else through the socket
    /// (`watch --alert-log`).
    #[arg(long, value_name = "FILE", default_value = client::DEFAULT_LOG)]
    alert_log: PathBuf,
}

impl Source {
    fn logged(&self) -> Result<Vec<(u64, Alert)>> {
        Ok(client::logged_alerts(&self.alerts_socket, &self.alert_log)?)
    }
}

#[derive(Args)]
pub struct AlertsArgs {
    /// Only alerts from T on: an RFC 3339 time, or a time ago (`90s`, `30m`, `2h`, `7d`).
    #[arg(long, value_name = "T", value_parser = parse_since)]
    since: Option<Since>,
    /// Only alerts of this severity or above: low, medium, high, critical.
    #[arg(long, value_name = "S", value_parser = <Severity as std::str::FromStr>::from_str)]
    severity: Option<Severity>,
    /// Only this package (`NAME`, or `NAME@VERSION`; `@scope/name@1.0.0`).
    #[arg(long, value_name = "NAME[@VERSION]")]
    package: Option<PackageFilter>,
    /// The log's lines as they are: `{"seq": N, "alert": {...}}`.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    source: Source,
}

#[derive(Args)]
pub struct ShowArgs {
    /// The alert: its seq (the first column of `credwatch alerts`), or 8 or more hex digits
    /// from the start of its `event.id`.
    #[arg(value_name = "ID")]
    id: String,
    /// The incident page of the alert's tree instead: one self-contained HTML file.
    #[arg(long)]
    html: bool,
    /// Write the page to FILE rather than to standard output.
    #[arg(long, value_name = "FILE", requires = "html")]
    output: Option<PathBuf>,
    #[command(flatten)]
    source: Source,
}

/// `--since`: a time, or how long ago.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Since {
    At(OffsetDateTime),
    Ago(Duration),
}

impl Since {
    fn cutoff(self, now: OffsetDateTime) -> OffsetDateTime {
        match self {
            Since::At(at) => at,
            Since::Ago(ago) => now - ago,
        }
    }
}

fn parse_since(text: &str) -> Result<Since, String> {
    if let Ok(at) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(Since::At(at));
    }
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => 0,
    };
    match number.parse::<u64>() {
        Ok(n) if seconds > 0 => n.checked_mul(seconds).map(|s| Since::Ago(Duration::from_secs(s))),
        _ => None,
    }
    .ok_or_else(|| format!("{text:?} is neither an RFC 3339 time (2026-12-05T18:00:00Z) nor a time ago (30m, 2h, 7d)"))
}

fn package_matches(filter: &PackageFilter, alert: &Alert) -> bool {
    alert.package.name.as_deref() == Some(filter.name.as_str())
        && filter.version.as_ref().is_none_or(|version| alert.package.version.as_ref() == Some(version))
}

fn time_of(alert: &Alert) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(&alert.timestamp, &Rfc3339).ok()
}

/// `credwatch alerts`.
pub fn alerts(args: &AlertsArgs) -> Result<ExitCode> {
    let cutoff = args.since.map(|since| since.cutoff(OffsetDateTime::now_utc()));
    let logged = args.source.logged()?;
    let total = logged.len();
    let mut out = io::stdout().lock();
    let mut shown = 0;
    for (seq, alert) in logged {
        if cutoff.is_some_and(|cutoff| time_of(&alert).is_none_or(|time| time < cutoff))
            || args.severity.is_some_and(|least| alert.rule.severity < least)
            || args.package.as_ref().is_some_and(|filter| !package_matches(filter, &alert))
        {
            continue;
        }
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&Logged { seq, alert })?)?;
        } else {
            writeln!(out, "{}", one_line(seq, &alert))?;
        }
        shown += 1;
    }
    out.flush()?;
    if shown == 0 && !args.json {
        let why = if total == 0 { "no alerts are logged" } else { "no logged alert matches" };
        tracing::info!("{why} ({total} logged that you may see)");
    }
    Ok(ExitCode::SUCCESS)
}

/// `SEQ  TIME  SEVERITY  PACKAGE  WHAT`, escaped.
pub fn one_line(seq: u64, alert: &Alert) -> String {
    let package = &alert.package;
    let who = match (&package.name, &package.version) {
        (Some(name), Some(version)) => format!("{}@{}", escape(name), escape(version)),
        (Some(name), None) => escape(name).into_owned(),
        _ => format!("({} code)", escape(&package.manager)),
    };
    let selftest = if alert.credwatch.selftest { " [self-test]" } else { "" };
    format!(
        "{seq:>6}  {}  {:<8}  {who}  {}{selftest}",
        escape(&alert.timestamp),
        alert.rule.severity.as_str(),
        headline(alert)
    )
}

/// `credwatch show ID`.
pub fn show(args: &ShowArgs) -> Result<ExitCode> {
    let wanted = Wanted::parse(&args.id)?;
    let logged = args.source.logged()?;
    let (seq, alert) = find(&logged, &wanted)?;
    let tree = tree_of(&logged, alert);
    if args.html {
        let page = credwatch_core::incident::page_of_tree(seq, &tree);
        match &args.output {
            Some(path) => fs::write(path, page).with_context(|| format!("writing {}", path.display()))?,
            None => io::stdout().lock().write_all(page.as_bytes())?,
        }
        return Ok(ExitCode::SUCCESS);
    }
    let colour = unsafe { libc::isatty(libc::STDOUT_FILENO) } == 1;
    let mut out = io::stdout().lock();
    writeln!(out, "alert {seq} ({})", escape(&alert.event.id))?;
    if alert.credwatch.selftest {
        writeln!(out, "a self-test's alert (`credwatch selftest`): fake credentials, nothing to rotate")?;
    }
    write!(out, "{}", render(alert, colour))?;
    let others: Vec<&(u64, Alert)> = tree.iter().filter(|(other, _)| *other != seq).copied().collect();
    if !others.is_empty() {
        let root = alert.credwatch.root_pid;
        writeln!(out, "\nthe tree's other alerts (root pid {root} on {}):", escape(&alert.host.name))?;
        for (seq, alert) in others {
            writeln!(out, "{}", one_line(*seq, alert))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How `show` names an alert.
#[derive(Debug, PartialEq, Eq)]
pub enum Wanted {
    Seq(u64),
    IdPrefix(String),
}

impl Wanted {
    fn parse(id: &str) -> Result<Wanted> {
        if let Ok(seq) = id.parse() {
            return Ok(Wanted::Seq(seq));
        }
        let hex = id.to_ascii_lowercase();
        anyhow::ensure!(
            hex.len() >= 8 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
            "{:?} is no alert id: give its seq (a number, the first column of `credwatch alerts`) or 8 or more hex digits of its event.id",
            escape(id)
        );
        Ok(Wanted::IdPrefix(hex))
    }
}

pub fn find<'a>(logged: &'a [(u64, Alert)], wanted: &Wanted) -> Result<(u64, &'a Alert)> {
    let found: Vec<&(u64, Alert)> = logged
        .iter()
        .filter(|(seq, alert)| match wanted {
            Wanted::Seq(wanted) => seq == wanted,
            Wanted::IdPrefix(prefix) => alert.event.id.starts_with(prefix.as_str()),
        })
        .collect();
    match (found.as_slice(), wanted) {
        ([(seq, alert)], _) => Ok((*seq, alert)),
        ([], Wanted::Seq(seq)) => {
            anyhow::bail!("no alert {seq} among the {} logged that you may see", logged.len())
        }
        ([], Wanted::IdPrefix(prefix)) => {
            anyhow::bail!("no alert whose id starts with {prefix} among the {} logged that you may see", logged.len())
        }
        (many, Wanted::IdPrefix(prefix)) => {
            let seqs: Vec<String> = many.iter().map(|(seq, _)| seq.to_string()).collect();
            anyhow::bail!(
                "{} alerts have ids starting with {prefix} (seq {}): give more digits",
                many.len(),
                seqs.join(", ")
            )
        }
        // The same seq twice: a log copied onto another; the latest is this agent's.
        (many, Wanted::Seq(_)) => {
            let (seq, alert) = many[many.len() - 1];
            Ok((*seq, alert))
        }
    }
}

/// The alerts of `alert`'s tree (same host and root pid) within a day of it, `alert` too,
/// oldest first.
pub fn tree_of<'a>(logged: &'a [(u64, Alert)], alert: &Alert) -> Vec<&'a (u64, Alert)> {
    let at = time_of(alert);
    logged
        .iter()
        .filter(|(_, other)| {
            other.host.name == alert.host.name
                && other.credwatch.root_pid == alert.credwatch.root_pid
                && match (at, time_of(other)) {
                    (Some(at), Some(time)) => (time - at).unsigned_abs() <= SAME_TREE_WITHIN,
                    _ => false,
                }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(seq: u64, id: &str, root_pid: u32, time: &str) -> (u64, Alert) {
        let mut alert: Alert = serde_json::from_value(serde_json::json!({
            "@timestamp": time,
            "event": {"id": id, "kind": "alert", "action": "open", "outcome": "alerted"},
            "rule": {"id": "npm-registry-token", "name": "npm token", "category": "npm", "severity": "high", "description": "d"},
            "process": {"pid": 7, "executable": "/usr/bin/node", "args": ["node", "x.js"], "working_directory": "/", "parent": {"pid": 1}, "ancestors": []},
            "file": {"path": "/home/a/.npmrc\u{1b}[2J", "given_path": "~/.npmrc", "flags": "O_RDONLY"},
            "package": {"manager": "npm", "name": "evil\u{202e}", "version": "1.0.0", "lifecycle": "postinstall"},
            "host": {"name": "dev"},
            "user": {"id": 1000},
            "credwatch": {"root_pid": root_pid, "rotate": [], "enforcement": "userspace"}
        }))
        .unwrap();
        alert.credwatch.selftest = seq == 3;
        (seq, alert)
    }

    #[test]
    fn since_takes_a_time_or_a_time_ago_and_says_what_it_wants() {
        assert_eq!(parse_since("30m"), Ok(Since::Ago(Duration::from_secs(1800))));
        assert_eq!(parse_since("7d"), Ok(Since::Ago(Duration::from_secs(7 * 86_400))));
        assert!(matches!(parse_since("2026-12-05T18:00:00Z"), Ok(Since::At(_))));
        for bad in ["", "10", "m", "5w", "-5m", "99999999999999999999d", "yesterday"] {
            let error = parse_since(bad).unwrap_err();
            assert!(error.contains("RFC 3339") && error.contains("30m"), "{bad}: {error}");
        }
        assert_eq!("HIGH".parse::<Severity>(), Ok(Severity::High));
        assert!("urgent".parse::<Severity>().unwrap_err().contains("low, medium, high or critical"));
    }

    #[test]
    fn ids_are_a_seq_or_a_hex_prefix_and_bad_ones_say_what_is_wanted() {
        let logged = [
            alert(1, "aaaabbbb00", 10, "2026-12-05T10:00:00Z"),
            alert(2, "aaaabbbb11", 10, "2026-12-05T10:00:01Z"),
            alert(3, "ccccdddd00", 20, "2026-12-05T10:00:02Z"),
            alert(4, "eeeeffff00", 10, "2026-12-07T10:00:00Z"),
        ];
        assert_eq!(find(&logged, &Wanted::parse("3").unwrap()).unwrap().0, 3);
        assert_eq!(find(&logged, &Wanted::parse("CCCCDDDD").unwrap()).unwrap().0, 3);
        let error = find(&logged, &Wanted::parse("aaaabbbb").unwrap()).unwrap_err().to_string();
        assert!(error.contains("2 alerts") && error.contains("seq 1, 2"), "{error}");
        let error = find(&logged, &Wanted::parse("9").unwrap()).unwrap_err().to_string();
        assert!(error.contains("no alert 9 among the 4"), "{error}");
        for bad in ["abc", "zzzzzzzzz", "-1", "\u{1b}[2J"] {
            let error = Wanted::parse(bad).unwrap_err().to_string();
            assert!(error.contains("no alert id") && !error.contains('\u{1b}'), "{error}");
        }
        let tree: Vec<u64> = tree_of(&logged, &logged[0].1).iter().map(|(seq, _)| *seq).collect();
        assert_eq!(tree, [1, 2], "same root, within a day");
    }

    #[test]
    fn one_line_escapes_what_came_from_the_system() {
        let (seq, alert) = alert(3, "ccccdddd00", 20, "2026-12-05T10:00:02Z");
        let line = one_line(seq, &alert);
        assert!(!line.contains('\u{1b}') && !line.contains('\u{202e}'), "{line}");
        assert!(line.contains("     3  2026-12-05T10:00:02Z  high      evil\\u{202e}@1.0.0  opened /home/a/.npmrc\\u{1b}[2J [self-test]"), "{line}");
    }
}
