//! `cargo xtask corpus --workflows`: a developer's day rather than an install. Real source trees
//! (crates from crates.io, npm tarballs, PyPI sdists) and projects as developers write them
//! (xtask/corpus/workflows/) are driven through the commands developers run every day (`cargo
//! test`, `npm start`, `npx` of the project's own bin, `uv run`, `bundle exec rake`, ...) under
//! one `credwatch watch` per project, each in the tool's default layout (no target-dir or cache
//! variables) with a throwaway HOME of fake credentials and a `.env` of fake secrets. A
//! measurement like the package corpus (it uses the registries), not a test.
//!
//! Output in target/workflows (target/<the list's name> for another `--list`): workflows.md and
//! workflows.json (per project and command: exit status and alerts by rule; totals by rule; the
//! medium-or-higher alerts in full), alerts/<project>.jsonl (each project's alerts as credwatch
//! wrote them; alerts of other trees on the machine, which a system-wide watch sees too, in
//! <project>.other.jsonl) and logs/<project>.log (each command's output). Positive controls, where
//! a dependency's install or build code reads the fake credentials:
//! `--list xtask/corpus/workflows-controls.txt`.

use std::{
    collections::{BTreeMap, BTreeSet},
    env,
    fmt::Write as _,
    fs,
    io::{Read, Seek, SeekFrom},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::corpus::{self, AlertLine};

/// The list checked in beside xtask, used without `--list`.
const DEFAULT_LIST: &str = "xtask/corpus/workflows.txt";
/// The projects that `fixture:DIR` names.
const FIXTURES: &str = "xtask/corpus/workflows";
/// One command (a release build, a crate's whole test suite) may take minutes on 2 shared cores.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// How long `credwatch watch` may take to attach before the project counts as failed.
const WATCH_START: Duration = Duration::from_secs(120);
/// Alerts reach the file a moment after the event: a command's alerts are those written until
/// the file has stayed the same this long after it ended (at most [`SETTLE_MAX`]).
const SETTLE: Duration = Duration::from_millis(1500);
const SETTLE_MAX: Duration = Duration::from_secs(10);
/// The package managers the machine lacks, from the registries into target/workflows/tools.
const YARN_VERSION: &str = "1.22.22";
const PNPM_VERSION: &str = "10.34.8";
const POETRY_VERSION: &str = "2.5.1";
/// Ruby from Debian (rubygems.org is not reachable): bundler and the gems the fixture uses.
const RUBY_PACKAGES: &[&str] = &["ruby", "bundler", "rake", "ruby-minitest"];
/// The project's own `.env`: fake secrets, and a version requirement the workspace fixture reads.
const FAKE_DOTENV: &str = "# Fake secrets of the credwatch workflow corpus; none is real.\n\
    API_TOKEN=FAKEcredwatchWORKFLOW0000000000\n\
    DATABASE_URL=postgres://app:FAKEcredwatchWORKFLOW@127.0.0.1:5432/app\n\
    NODE_VERSION=^20\n";
/// The download caches of the managers, at their default places under HOME: each project's are
/// filled (hard links) from target/workflows/cache/home and what it downloaded goes back there,
/// so that a re-run downloads little. The projects' own state (npx's `_npx`, virtualenvs) is not
/// shared.
const SHARED_CACHES: &[&str] = &[
    ".cargo/registry",
    ".npm/_cacache",
    ".cache/yarn",
    ".local/share/pnpm/store",
    ".cache/pip",
    ".cache/uv",
    ".cache/pypoetry/cache",
    ".cache/pypoetry/artifacts",
];

/// Where a project's files come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `cargo:NAME@VERSION`: the crate as published on crates.io.
    Crate { name: String, version: String },
    /// `npm:NAME@VERSION`: the package's tarball.
    Npm { name: String, version: String },
    /// `pip:NAME==VERSION`: the sdist.
    Sdist { name: String, version: String },
    /// `fixture:DIR`: a directory of xtask/corpus/workflows.
    Fixture(String),
    /// `empty`: the first command creates the project.
    Empty,
}

impl Source {
    fn parse(text: &str) -> std::result::Result<Source, String> {
        if text == "empty" {
            return Ok(Source::Empty);
        }
        let Some((kind, spec)) = text.split_once(':') else {
            return Err(format!("unknown source {text:?} (expected cargo:, npm:, pip:, fixture: or empty)"));
        };
        let pinned = |separator: &str, skip: usize| -> std::result::Result<(String, String), String> {
            let split = spec
                .get(skip..)
                .and_then(|rest| rest.find(separator))
                .map(|at| at + skip)
                .ok_or_else(|| format!("{text:?} is not pinned (expected {kind}:NAME{separator}VERSION)"))?;
            let (name, version) = (&spec[..split], &spec[split + separator.len()..]);
            if version.is_empty() {
                return Err(format!("empty version in {text:?}"));
            }
            if let Some(bad) = version.chars().find(|c| !(c.is_ascii_alphanumeric() || ".-+_".contains(*c))) {
                return Err(format!("character {bad:?} in version {version:?}"));
            }
            Ok((name.to_owned(), version.to_owned()))
        };
        let source = match kind {
            "cargo" => pinned("@", 0).map(|(name, version)| Source::Crate { name, version })?,
            // An npm scope starts with `@`: the version's `@` comes after the first character.
            "npm" => pinned("@", 1).map(|(name, version)| Source::Npm { name, version })?,
            "pip" => pinned("==", 0).map(|(name, version)| Source::Sdist { name, version })?,
            "fixture" => Source::Fixture(spec.to_owned()),
            other => return Err(format!("unknown source kind {other:?} (expected cargo, npm, pip, fixture)")),
        };
        let (name, valid) = match &source {
            Source::Npm { name, .. } => (name, npm_name(name)),
            Source::Crate { name, .. } | Source::Sdist { name, .. } | Source::Fixture(name) => (name, plain(name)),
            Source::Empty => return Ok(source),
        };
        if !valid {
            return Err(format!("invalid name {name:?} in {text:?}"));
        }
        Ok(source)
    }

    /// As the list spells it.
    fn text(&self) -> String {
        match self {
            Source::Crate { name, version } => format!("cargo:{name}@{version}"),
            Source::Npm { name, version } => format!("npm:{name}@{version}"),
            Source::Sdist { name, version } => format!("pip:{name}=={version}"),
            Source::Fixture(dir) => format!("fixture:{dir}"),
            Source::Empty => "empty".to_owned(),
        }
    }
}

fn plain(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && name.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

fn npm_name(name: &str) -> bool {
    match name.strip_prefix('@') {
        Some(scoped) => scoped.split_once('/').is_some_and(|(scope, base)| plain(scope) && plain(base)),
        None => plain(name),
    }
}

/// One project of the list and the commands run in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Project {
    pub name: String,
    pub source: Source,
    pub line: usize,
    pub commands: Vec<String>,
}

/// Parses the workflow list; an error names `file:line` and what is wrong there.
pub fn parse_list(text: &str, file: &str) -> Result<Vec<Project>> {
    let mut projects: Vec<Project> = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let at = |what: String| anyhow::anyhow!("{file}:{line}: {what}");
        let content = raw.trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        if raw.starts_with([' ', '\t']) {
            let project = projects.last_mut().ok_or_else(|| at("a command before any project".to_owned()))?;
            if let Some(bad) = content.chars().find(|c| c.is_control()) {
                return Err(at(format!("control character {bad:?} in the command")));
            }
            project.commands.push(content.to_owned());
            continue;
        }
        if let Some(last) = projects.last().filter(|p| p.commands.is_empty()) {
            return Err(at(format!("project {} (line {}) has no command", last.name, last.line)));
        }
        let words: Vec<&str> = content.split_whitespace().collect();
        let [name, source] = words.as_slice() else {
            return Err(at(format!(
                "expected `NAME SOURCE` (two words), or an indented command; found {} word(s): {content:?}",
                words.len()
            )));
        };
        if !plain(name) {
            return Err(at(format!("invalid project name {name:?} (letters, digits, `-`, `.`, `_`)")));
        }
        let source = Source::parse(source).map_err(&at)?;
        if let Some(first) = seen.insert((*name).to_owned(), line) {
            return Err(at(format!("project {name} is listed already, at line {first}")));
        }
        projects.push(Project { name: (*name).to_owned(), source, line, commands: Vec::new() });
    }
    if let Some(last) = projects.last().filter(|p| p.commands.is_empty()) {
        bail!("{file}:{}: project {} has no command", last.line, last.name);
    }
    Ok(projects)
}

/// What became of one command.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandOutcome {
    pub command: String,
    /// `exit 0`, `exit 101`, `signal 9`, `timed out`, `not run` (the project's set-up failed).
    pub status: String,
    pub reason: Option<String>,
    pub seconds: f64,
    pub alerts: Vec<Alert>,
}

impl CommandOutcome {
    fn succeeded(&self) -> bool {
        self.status == "exit 0"
    }
}

/// One alert: the parts the tables show, and the line as credwatch wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    pub line: AlertLine,
    /// `credwatch.why`: what credwatch found that lowered the alert's severity.
    pub why: Option<String>,
    pub json: String,
}

impl Alert {
    /// Reads one line of the watch's file; `places` as in [`corpus::parse_alert`].
    fn parse(json: &str, places: &[(String, &str)]) -> Result<Alert> {
        let mut line = corpus::parse_alert(json, places)?;
        line.target = without_random_suffixes(&line.target);
        let value: Value = serde_json::from_str(json).context("not JSON")?;
        let why = value.pointer("/credwatch/why").and_then(Value::as_str).map(|why| shorten_places(why, places));
        Ok(Alert { line, why, json: shorten_places(json, places) })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProjectOutcome {
    pub name: String,
    pub source: String,
    pub commands: Vec<CommandOutcome>,
    /// Why the project's set-up (its source, `credwatch watch`) failed, if it did.
    pub error: Option<String>,
    /// Alerts about other process trees on the machine while its watch ran (not counted).
    pub other_trees: usize,
}

/// Alerts of one rule at one severity over the run.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleTotal {
    pub rule: String,
    pub severity: String,
    pub count: usize,
    /// `project: command` of each command that raised it.
    pub commands: BTreeSet<String>,
}

/// Alerts of one rule, severity and file or command, in one command of one project.
#[derive(Clone, Debug, PartialEq)]
pub struct AlertRow {
    pub rule: String,
    pub severity: String,
    pub project: String,
    pub command: String,
    pub package: String,
    pub target: String,
    pub count: usize,
    /// The first alert's `credwatch.why`.
    pub why: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tables {
    pub projects: usize,
    pub commands: usize,
    pub succeeded: usize,
    pub commands_medium_or_higher: usize,
    pub alerts_medium_or_higher: usize,
    pub totals: Vec<RuleTotal>,
    pub rows: Vec<AlertRow>,
}

fn by_severity_then_rule(a: (&str, &str), b: (&str, &str)) -> std::cmp::Ordering {
    corpus::severity_rank(b.1).cmp(&corpus::severity_rank(a.1)).then_with(|| a.0.cmp(b.0))
}

/// The figures of a run: the headline, totals by rule, and the alerts grouped by command and file.
pub fn aggregate(outcomes: &[ProjectOutcome]) -> Tables {
    let mut totals: BTreeMap<(String, String), RuleTotal> = BTreeMap::new();
    let mut rows: BTreeMap<(String, String, String, String, String, String), AlertRow> = BTreeMap::new();
    let (mut commands, mut succeeded, mut commands_medium) = (0, 0, 0);
    let mut alerts_medium = 0;
    for project in outcomes {
        for command in &project.commands {
            commands += 1;
            succeeded += usize::from(command.succeeded());
            let medium = command.alerts.iter().filter(|a| corpus::medium_or_higher(&a.line.severity)).count();
            alerts_medium += medium;
            commands_medium += usize::from(medium > 0);
            for Alert { line, why, .. } in &command.alerts {
                let total = totals.entry((line.rule.clone(), line.severity.clone())).or_insert_with(|| RuleTotal {
                    rule: line.rule.clone(),
                    severity: line.severity.clone(),
                    count: 0,
                    commands: BTreeSet::new(),
                });
                total.count += 1;
                total.commands.insert(format!("{}: {}", project.name, command.command));
                let key = (
                    line.rule.clone(),
                    line.severity.clone(),
                    project.name.clone(),
                    command.command.clone(),
                    line.package.clone(),
                    line.target.clone(),
                );
                rows.entry(key)
                    .or_insert_with(|| AlertRow {
                        rule: line.rule.clone(),
                        severity: line.severity.clone(),
                        project: project.name.clone(),
                        command: command.command.clone(),
                        package: line.package.clone(),
                        target: line.target.clone(),
                        count: 0,
                        why: why.clone(),
                    })
                    .count += 1;
            }
        }
    }
    let mut totals: Vec<RuleTotal> = totals.into_values().collect();
    totals.sort_by(|a, b| by_severity_then_rule((&a.rule, &a.severity), (&b.rule, &b.severity)));
    // In the order of the run within a severity and rule: BTreeMap's order is by name.
    let order: Vec<(String, String)> =
        outcomes.iter().flat_map(|p| p.commands.iter().map(move |c| (p.name.clone(), c.command.clone()))).collect();
    let position = |row: &AlertRow| order.iter().position(|(p, c)| *p == row.project && *c == row.command);
    let mut rows: Vec<AlertRow> = rows.into_values().collect();
    rows.sort_by(|a, b| {
        by_severity_then_rule((&a.rule, &a.severity), (&b.rule, &b.severity))
            .then_with(|| position(a).cmp(&position(b)))
            .then_with(|| b.count.cmp(&a.count))
    });
    Tables {
        projects: outcomes.len(),
        commands,
        succeeded,
        commands_medium_or_higher: commands_medium,
        alerts_medium_or_higher: alerts_medium,
        totals,
        rows,
    }
}

/// `rule (severity) ×count` of each rule that a command raised, most severe first.
fn rules_cell<'a>(alerts: impl IntoIterator<Item = &'a Alert>) -> String {
    let mut counts: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for alert in alerts {
        *counts.entry((&alert.line.rule, &alert.line.severity)).or_default() += 1;
    }
    let mut counts: Vec<((&str, &str), usize)> = counts.into_iter().collect();
    counts.sort_by(|a, b| by_severity_then_rule(a.0, b.0));
    let cells: Vec<String> = counts
        .iter()
        .map(|((rule, severity), n)| format!("{} ({}) ×{n}", corpus::md(rule), corpus::md(severity)))
        .collect();
    if cells.is_empty() {
        "none".to_owned()
    } else {
        cells.join(", ")
    }
}

/// `1 alert`, `2 alerts`.
fn alerts(count: usize) -> String {
    format!("{count} alert{}", if count == 1 { "" } else { "s" })
}

/// Text in a markdown table cell as code: backticks and cell breaks cannot end it.
fn code(text: &str) -> String {
    format!("`{}`", text.replace('`', "'").replace('|', "\\|").chars().filter(|c| !c.is_control()).collect::<String>())
}

pub fn markdown(tables: &Tables, outcomes: &[ProjectOutcome], header: &[String]) -> String {
    let mut text = String::from("# credwatch workflow corpus\n\n");
    for line in header {
        let _ = writeln!(text, "{line}  ");
    }
    let _ = writeln!(
        text,
        "\n**Commands with medium-or-higher alerts: {} of {} ({} at medium or above).** \
         {} projects; {} of the commands exited 0.\n",
        tables.commands_medium_or_higher,
        tables.commands,
        alerts(tables.alerts_medium_or_higher),
        tables.projects,
        tables.succeeded
    );
    text += "| project | source | command | status | alerts by rule (severity) |\n|---|---|---|---|---|\n";
    for project in outcomes {
        for command in &project.commands {
            let status = match &command.reason {
                Some(reason) => format!("{}: {}", command.status, corpus::md(reason)),
                None => command.status.clone(),
            };
            let _ = writeln!(
                text,
                "| {} | {} | {} | {status} | {} |",
                corpus::md(&project.name),
                corpus::md(&project.source),
                code(&command.command),
                rules_cell(&command.alerts)
            );
        }
    }
    text += "\n## By project\n\n| project | source | commands (the status of those that did not exit 0) | alerts by rule (severity) |\n|---|---|---|---|\n";
    for project in outcomes {
        let commands: Vec<String> = project
            .commands
            .iter()
            .map(|c| if c.succeeded() { code(&c.command) } else { format!("{} ({})", code(&c.command), c.status) })
            .collect();
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} |",
            corpus::md(&project.name),
            corpus::md(&project.source),
            commands.join(", "),
            rules_cell(project.commands.iter().flat_map(|c| &c.alerts))
        );
    }
    let errors: Vec<&ProjectOutcome> = outcomes.iter().filter(|p| p.error.is_some()).collect();
    if !errors.is_empty() {
        text += "\nProjects whose set-up failed (their commands did not run):\n\n";
        for project in errors {
            let _ = writeln!(
                text,
                "- {}: {}",
                corpus::md(&project.name),
                corpus::md(project.error.as_deref().unwrap_or(""))
            );
        }
    }
    text += "\n## Alerts by rule\n\n";
    if tables.totals.is_empty() {
        text += "No alerts.\n";
    } else {
        text += "| rule | severity | alerts | commands |\n|---|---|---|---|\n";
        for total in &tables.totals {
            let commands: Vec<String> = total.commands.iter().map(|c| code(c)).collect();
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} |",
                corpus::md(&total.rule),
                corpus::md(&total.severity),
                total.count,
                commands.join("<br>")
            );
        }
        text += "\n## Each alert's file or command\n\n";
        text += "| rule | severity | project | command | package (as the alert names it) | file or command | count | why (credwatch.why) |\n";
        text += "|---|---|---|---|---|---|---|---|\n";
        for row in &tables.rows {
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                corpus::md(&row.rule),
                corpus::md(&row.severity),
                corpus::md(&row.project),
                code(&row.command),
                corpus::md(&row.package),
                code(&row.target),
                row.count,
                corpus::md(row.why.as_deref().unwrap_or(""))
            );
        }
    }
    let _ = writeln!(text, "\n## Medium-or-higher alerts in full ({})\n", tables.alerts_medium_or_higher);
    for project in outcomes {
        for command in &project.commands {
            let medium: Vec<&Alert> =
                command.alerts.iter().filter(|a| corpus::medium_or_higher(&a.line.severity)).collect();
            if medium.is_empty() {
                continue;
            }
            let _ = writeln!(
                text,
                "{}: {} ({} at medium or above)\n\n```json",
                corpus::md(&project.name),
                code(&command.command),
                alerts(medium.len())
            );
            for alert in medium {
                // serde_json escapes control characters; a fence inside a string would end the block.
                let _ = writeln!(text, "{}", alert.json.replace("```", "`\\u0060`"));
            }
            text += "```\n\n";
        }
    }
    let other: usize = outcomes.iter().map(|p| p.other_trees).sum();
    let _ = writeln!(
        text,
        "\nAlerts about other process trees on the machine while the watches ran (not counted above): {other}."
    );
    text
}

pub fn to_json(tables: &Tables, outcomes: &[ProjectOutcome], header: &[String]) -> Value {
    let alert = |a: &Alert| {
        json!({
            "rule": a.line.rule, "severity": a.line.severity, "package": a.line.package, "target": a.line.target,
            "why": a.why,
        })
    };
    json!({
        "header": header,
        "headline": {
            "projects": tables.projects, "commands": tables.commands, "succeeded": tables.succeeded,
            "commands_medium_or_higher": tables.commands_medium_or_higher,
            "alerts_medium_or_higher": tables.alerts_medium_or_higher,
        },
        "alerts_by_rule": tables.totals.iter().map(|t| json!({
            "rule": t.rule, "severity": t.severity, "count": t.count, "commands": t.commands,
        })).collect::<Vec<_>>(),
        "projects": outcomes.iter().map(|p| json!({
            "name": p.name, "source": p.source, "error": p.error, "other_trees": p.other_trees,
            "alerts_file": format!("alerts/{}.jsonl", p.name),
            "commands": p.commands.iter().map(|c| json!({
                "command": c.command, "status": c.status, "reason": c.reason,
                "seconds": (c.seconds * 10.0).round() / 10.0,
                "alerts": c.alerts.iter().map(alert).collect::<Vec<_>>(),
                "medium_or_higher": c.alerts.iter().filter(|a| corpus::medium_or_higher(&a.line.severity))
                    .map(|a| serde_json::from_str::<Value>(&a.json).unwrap_or(Value::Null)).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

struct Options {
    only: Option<Vec<String>>,
    list: PathBuf,
    binary: PathBuf,
    timeout: Duration,
}

const USAGE: &str =
    "cargo xtask corpus --workflows [--only PROJECT,...] [--list FILE] [--binary PATH] [--timeout SECS]";

fn parse_options(args: &[&str]) -> Result<Options> {
    let workspace = crate::workspace();
    let mut options = Options {
        only: None,
        list: workspace.join(DEFAULT_LIST),
        binary: workspace.join("target/release/credwatch"),
        timeout: DEFAULT_TIMEOUT,
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let mut value = || rest.next().copied().with_context(|| format!("{arg} needs a value\nusage: {USAGE}"));
        match *arg {
            "--only" => options.only = Some(value()?.split(',').map(|p| p.trim().to_owned()).collect()),
            "--list" => options.list = PathBuf::from(value()?),
            "--binary" => options.binary = PathBuf::from(value()?),
            "--timeout" => {
                let secs: u64 =
                    value()?.parse().ok().filter(|secs| *secs > 0).context("--timeout takes seconds ≥ 1")?;
                options.timeout = Duration::from_secs(secs);
            }
            other => bail!("unknown option {other:?}\nusage: {USAGE}"),
        }
    }
    Ok(options)
}

/// What the projects share.
struct Ctx {
    out: PathBuf,
    cache: PathBuf,
    work: PathBuf,
    binary: PathBuf,
    pin_dir: PathBuf,
    /// PATH for the set-up: the real tools first (rustup's and pyenv's shims look in HOME).
    path: Vec<PathBuf>,
    rustup: Option<Rustup>,
    timeout: Duration,
}

/// rustup as a developer has it: its proxies (`cargo`, `rustc`, ...) in `~/.cargo/bin`, its
/// toolchains in `~/.rustup`. Each project's HOME gets the proxies and a link to the machine's
/// toolchains, so that `cargo` runs as rustup's proxy executing the toolchain's cargo.
struct Rustup {
    proxy: PathBuf,
    home: PathBuf,
    /// The toolchain's bin directory, which the set-up's PATH has and the developer's has not.
    toolchain_bin: PathBuf,
}

/// The names under which rustup installs its proxy in `~/.cargo/bin`.
const RUSTUP_PROXIES: &[&str] =
    &["cargo", "cargo-clippy", "cargo-fmt", "clippy-driver", "rustc", "rustdoc", "rustfmt", "rustup"];

/// rustup, when the cargo running xtask is one of its toolchains.
fn find_rustup(cargo: &Path) -> Option<Rustup> {
    let proxy = fs::canonicalize(crate::toolchain::find_in_path("rustup")?).ok()?;
    let home = match env::var_os("RUSTUP_HOME") {
        Some(home) => PathBuf::from(home),
        None => PathBuf::from(env::var_os("HOME")?).join(".rustup"),
    };
    let toolchain_bin = cargo.parent()?.to_path_buf();
    toolchain_bin.starts_with(&home).then_some(Rustup { proxy, home, toolchain_bin })
}

pub fn workflows(args: &[&str]) -> Result<()> {
    let options = parse_options(args)?;
    if !crate::is_root() {
        bail!("credwatch watch loads eBPF programs: run `sudo -E cargo xtask corpus --workflows`");
    }
    if !options.binary.is_file() {
        bail!("{} is missing: run `cargo xtask build` or give --binary PATH", options.binary.display());
    }
    let list_text = fs::read_to_string(&options.list)
        .with_context(|| format!("reading the workflow list {}", options.list.display()))?;
    let mut projects = parse_list(&list_text, &options.list.display().to_string())?;
    if let Some(only) = &options.only {
        if let Some(unknown) = only.iter().find(|name| !projects.iter().any(|p| &p.name == *name)) {
            bail!("--only: no project {unknown:?} in {}", options.list.display());
        }
        projects.retain(|p| only.contains(&p.name));
    }

    let workspace = crate::workspace();
    // Named after the list (target/workflows, target/workflows-controls); one cache for all.
    let stem = options.list.file_stem().map_or_else(|| "workflows".into(), |stem| stem.to_string_lossy());
    let out = workspace.join("target").join(stem.as_ref());
    let cache = workspace.join("target/workflows/cache");
    for dir in ["alerts", "logs"] {
        let _ = fs::remove_dir_all(out.join(dir));
        fs::create_dir_all(out.join(dir)).with_context(|| format!("creating {}/{dir}", out.display()))?;
    }
    let work = env::temp_dir().join(format!("credwatch-workflows-{}", std::process::id()));
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;

    let python = corpus::python_executable()?;
    let cargo = PathBuf::from(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let cargo = if cargo.is_absolute() {
        cargo
    } else {
        crate::toolchain::find_in_path("cargo").context("cargo is not on PATH")?
    };
    let npm = crate::toolchain::find_in_path("npm").context("npm is not on PATH")?;
    let tools = cache.join("tools");
    let rustup = find_rustup(&cargo);
    // A copy: a `cargo xtask build` during the run must not change the binary between projects.
    let binary = work.join("credwatch");
    fs::copy(&options.binary, &binary)
        .with_context(|| format!("copying {} to {}", options.binary.display(), binary.display()))?;
    // rustup's and pyenv's shims look in HOME, which each project replaces: the real tools first.
    let mut path: Vec<PathBuf> = vec![tools.join("bin")];
    path.extend([&cargo, &python, &npm].iter().filter_map(|p| p.parent().map(Path::to_path_buf)));
    path.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    let ctx = Ctx {
        out: out.clone(),
        cache: cache.clone(),
        work: work.clone(),
        binary: binary.clone(),
        // bpffs refuses names with a dot.
        pin_dir: PathBuf::from(format!("/sys/fs/bpf/credwatch_workflows_{}", std::process::id())),
        path,
        rustup,
        timeout: options.timeout,
    };
    set_up_tools(&ctx, &projects, &python, &npm)?;

    let version = Command::new(&ctx.binary)
        .arg("--version")
        .output()
        .map_or_else(|e| format!("({e})"), |o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(&workspace)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let started = Instant::now();
    let started_at = corpus::utc_now();
    let header = |done: usize, elapsed: Duration| {
        vec![
            format!(
                "Run started {started_at}, {:.0} min, {done} of {} projects done; main at {commit}",
                elapsed.as_secs_f64() / 60.0,
                projects.len()
            ),
            format!("Binary: {} ({version}), one `credwatch watch` per project", options.binary.display()),
            format!("List: {}; timeout {} s per command", options.list.display(), ctx.timeout.as_secs()),
        ]
    };
    let total_commands: usize = projects.iter().map(|p| p.commands.len()).sum();
    println!("workflows: {} projects, {total_commands} commands; output in {}", projects.len(), out.display());
    let mut outcomes: Vec<ProjectOutcome> = Vec::new();
    for (index, project) in projects.iter().enumerate() {
        println!("workflows: [{}/{}] {} ({})", index + 1, projects.len(), project.name, project.source.text());
        let outcome = run_project(&ctx, project);
        if let Some(error) = &outcome.error {
            println!("workflows:   set-up failed: {}", error.escape_debug());
        }
        for command in &outcome.commands {
            let worst =
                command.alerts.iter().map(|a| a.line.severity.as_str()).max_by_key(|s| corpus::severity_rank(s));
            println!(
                "workflows:   {}: {} in {:.0}s, {} alert(s){}",
                command.command.escape_debug(),
                command.status,
                command.seconds,
                command.alerts.len(),
                worst.map(|w| format!(", worst {w}")).unwrap_or_default()
            );
        }
        outcomes.push(outcome);
        // Written after every project so that a long run can be read while it goes.
        write_outputs(&out, &outcomes, &header(outcomes.len(), started.elapsed()))?;
    }
    let _ = fs::remove_dir_all(&work);
    let tables = aggregate(&outcomes);
    println!(
        "workflows: commands with medium-or-higher alerts: {} of {} ({}); {} written in {:.0} min",
        tables.commands_medium_or_higher,
        tables.commands,
        alerts(tables.alerts_medium_or_higher),
        out.join("workflows.md").display(),
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

fn write_outputs(out: &Path, outcomes: &[ProjectOutcome], header: &[String]) -> Result<()> {
    let tables = aggregate(outcomes);
    let md_path = out.join("workflows.md");
    fs::write(&md_path, markdown(&tables, outcomes, header))
        .with_context(|| format!("writing {}", md_path.display()))?;
    let json_path = out.join("workflows.json");
    let text =
        serde_json::to_string_pretty(&to_json(&tables, outcomes, header)).context("serialising workflows.json")?;
    fs::write(&json_path, text + "\n").with_context(|| format!("writing {}", json_path.display()))
}

/// A clean environment as a developer's shell has it: PATH, HOME and the locale, nothing that
/// moves a tool's target or cache directory, and only the machine's CA bundle and proxy from the
/// real environment.
fn developer_env(command: &mut Command, path: &[PathBuf], home: &Path) {
    command
        .env_clear()
        .env("PATH", env::join_paths(path).expect("PATH entries have no colon"))
        .env("HOME", home)
        .env("USER", "root")
        .env("LOGNAME", "root")
        .env("SHELL", "/bin/sh")
        .env("LANG", "C.UTF-8")
        .env("NO_COLOR", "1");
    for name in corpus::PASSED_THROUGH {
        if let Some(value) = env::var_os(name) {
            command.env(name, value);
        }
    }
}

/// Runs `command` to completion (set-up, not measured), its output in the error when it fails.
fn set_up(what: &str, command: &mut Command) -> Result<String> {
    let output = command.stdin(Stdio::null()).output().with_context(|| format!("{what}: starting"))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!("{what}: {}: {}", corpus::exit_text(output.status), corpus::first_error(&text));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// yarn and pnpm (npm registry), uv and poetry (PyPI) into target/workflows/tools/bin, Ruby and
/// bundler from Debian, when a project uses them and the machine lacks them.
fn set_up_tools(ctx: &Ctx, projects: &[Project], python: &Path, npm: &Path) -> Result<()> {
    let uses =
        |tool: &str| projects.iter().any(|p| p.commands.iter().any(|c| c.split_whitespace().any(|word| word == tool)));
    let tools = ctx.cache.join("tools");
    let bin = tools.join("bin");
    fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    let home = ctx.work.join("setup-home");
    fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
    let link = |target: &Path, name: &str| -> Result<()> {
        let path = bin.join(name);
        let _ = fs::remove_file(&path);
        std::os::unix::fs::symlink(target, &path).with_context(|| format!("linking {}", path.display()))
    };
    for (tool, version, script) in [("yarn", YARN_VERSION, "bin/yarn.js"), ("pnpm", PNPM_VERSION, "bin/pnpm.cjs")] {
        let package = tools.join("node/node_modules").join(tool);
        if !uses(tool) || crate::toolchain::find_in_path(tool).is_some() {
            continue;
        }
        if !package.join(script).is_file() {
            let mut command = Command::new(npm);
            command.args(["install", "--no-audit", "--no-fund", "--prefix"]).arg(tools.join("node"));
            command.arg(format!("{tool}@{version}"));
            developer_env(&mut command, &ctx.path, &home);
            set_up(&format!("installing {tool} {version} from the npm registry"), &mut command)?;
        }
        link(&package.join(script), tool)?;
    }
    for (tool, version) in [("uv", corpus::UV_VERSION), ("poetry", POETRY_VERSION)] {
        if !uses(tool) || crate::toolchain::find_in_path(tool).is_some() {
            continue;
        }
        let venv = tools.join(tool);
        if !venv.join("bin").join(tool).is_file() {
            let mut command = Command::new(python);
            command.args(["-m", "venv"]).arg(&venv);
            set_up(&format!("creating a virtualenv for {tool}"), &mut command)?;
            let mut command = Command::new(venv.join("bin/python"));
            command.args(["-m", "pip", "install", "--quiet", &format!("{tool}=={version}")]);
            developer_env(&mut command, &ctx.path, &home);
            set_up(&format!("installing {tool} {version} from PyPI"), &mut command)?;
        }
        link(&venv.join("bin").join(tool), tool)?;
    }
    if uses("bundle") && crate::toolchain::find_in_path("bundle").is_none() {
        set_up("refreshing the package lists", Command::new("apt-get").args(["update", "-q"]))?;
        set_up(
            &format!("installing {} from Debian", RUBY_PACKAGES.join(" ")),
            Command::new("apt-get").args(["install", "-y", "-q", "--no-install-recommends"]).args(RUBY_PACKAGES),
        )?;
    }
    Ok(())
}

/// The project's source tree in target/workflows/cache/sources, fetched once (set-up, outside
/// the watch).
fn source_tree(ctx: &Ctx, source: &Source) -> Result<Option<PathBuf>> {
    let sources = ctx.cache.join("sources");
    let dir = match source {
        Source::Empty => return Ok(None),
        Source::Fixture(name) => {
            let dir = crate::workspace().join(FIXTURES).join(name);
            if !dir.is_dir() {
                bail!("no fixture {}", dir.display());
            }
            return Ok(Some(dir));
        }
        Source::Crate { name, version } => sources.join("cargo").join(format!("{name}-{version}")),
        Source::Npm { name, version } => sources.join("npm").join(format!("{}-{version}", name.replace('/', "__"))),
        Source::Sdist { name, version } => sources.join("pip").join(format!("{name}-{version}")),
    };
    if !dir.is_dir() {
        let scratch = ctx.work.join("fetch");
        let _ = fs::remove_dir_all(&scratch);
        fs::create_dir_all(scratch.join("home"))?;
        let partial = dir.with_extension("partial");
        let _ = fs::remove_dir_all(&partial);
        fs::create_dir_all(&partial)?;
        fetch_source(ctx, source, &partial, &scratch)?;
        fs::rename(&partial, &dir).with_context(|| format!("renaming {}", partial.display()))?;
        let _ = fs::remove_dir_all(&scratch);
    }
    Ok(Some(dir))
}

/// Unpacks a registry's source of the package into `dest`, downloading in `scratch`.
fn fetch_source(ctx: &Ctx, source: &Source, dest: &Path, scratch: &Path) -> Result<()> {
    match source {
        Source::Crate { name, version } => fetch_crate(ctx, name, version, dest, scratch),
        Source::Npm { name, version } => {
            let spec = format!("{name}@{version}");
            let mut command = Command::new("npm");
            command.args(["pack", "--silent", &spec, "--pack-destination"]).arg(scratch).current_dir(scratch);
            developer_env(&mut command, &ctx.path, &scratch.join("home"));
            let stdout = set_up(&format!("npm pack {spec}"), &mut command)?;
            let file = stdout.lines().last().context("npm pack printed no file name")?.trim();
            untar(&scratch.join(file), dest)
        }
        Source::Sdist { name, version } => {
            let spec = format!("{name}=={version}");
            let mut command = Command::new("python3");
            // The sdist of the package alone: its build dependencies as wheels, as a developer's.
            command.args(["-m", "pip", "download", "--no-deps", "--no-binary"]).arg(name).arg("-d");
            command.arg(scratch).arg(&spec);
            developer_env(&mut command, &ctx.path, &scratch.join("home"));
            set_up(&format!("pip download {spec}"), &mut command)?;
            let sdist = fs::read_dir(scratch)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.to_string_lossy().ends_with(".tar.gz"))
                .context("pip download left no .tar.gz")?;
            untar(&sdist, dest)
        }
        // Nothing to fetch.
        Source::Fixture(_) | Source::Empty => Ok(()),
    }
}

fn untar(archive: &Path, dest: &Path) -> Result<()> {
    let mut command = Command::new("tar");
    command.arg("-xzf").arg(archive).arg("-C").arg(dest).arg("--strip-components=1").arg("--no-same-owner");
    set_up(&format!("unpacking {}", archive.display()), &mut command).map(drop)
}

/// The crate's published source: cargo fetches it as a dependency of a scratch project, into a
/// scratch CARGO_HOME whose registry/src holds it unpacked.
fn fetch_crate(ctx: &Ctx, name: &str, version: &str, dest: &Path, scratch: &Path) -> Result<()> {
    let probe = scratch.join("probe");
    fs::create_dir_all(probe.join("src"))?;
    fs::write(
        probe.join("Cargo.toml"),
        format!(
            "[package]\nname = \"credwatch-workflow-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
             [dependencies]\n{name} = \"={version}\"\n\n[workspace]\n"
        ),
    )?;
    fs::write(probe.join("src/lib.rs"), "")?;
    let mut command = Command::new("cargo");
    command.arg("fetch").current_dir(&probe);
    developer_env(&mut command, &ctx.path, &scratch.join("home"));
    set_up(&format!("cargo fetch {name}@{version}"), &mut command)?;
    let registry = scratch.join("home/.cargo/registry/src");
    let unpacked = fs::read_dir(&registry)
        .with_context(|| format!("reading {}", registry.display()))?
        .filter_map(|e| e.ok().map(|e| e.path().join(format!("{name}-{version}"))))
        .find(|p| p.is_dir())
        .with_context(|| format!("cargo fetch left no {name}-{version} in {}", registry.display()))?;
    copy_tree(&unpacked, dest, false)
}

/// `cp -a FROM/. TO/`; with `link`, hard links instead of copies and existing files kept
/// (`cp -al --no-clobber`), for the shared download caches.
fn copy_tree(from: &Path, to: &Path, link: bool) -> Result<()> {
    fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    let mut command = Command::new("cp");
    command.arg(if link { "-aln" } else { "-a" }).arg(from.join(".")).arg(to);
    set_up(&format!("copying {} to {}", from.display(), to.display()), &mut command).map(drop)
}

fn run_project(ctx: &Ctx, project: &Project) -> ProjectOutcome {
    let mut outcome = ProjectOutcome {
        name: project.name.clone(),
        source: project.source.text(),
        commands: Vec::new(),
        error: None,
        other_trees: 0,
    };
    let dir = ctx.work.join(&project.name);
    let result = drive(ctx, project, &dir, &mut outcome);
    if let Err(error) = result {
        outcome.error = Some(format!("{error:#}"));
    }
    // Commands that a failed set-up kept from running are rows too.
    for command in project.commands.iter().skip(outcome.commands.len()) {
        outcome.commands.push(CommandOutcome {
            command: command.clone(),
            status: "not run".to_owned(),
            reason: None,
            seconds: 0.0,
            alerts: Vec::new(),
        });
    }
    let _ = fs::remove_dir_all(&dir);
    outcome
}

/// The project's directory, its watch and its commands.
fn drive(ctx: &Ctx, project: &Project, dir: &Path, outcome: &mut ProjectOutcome) -> Result<()> {
    let _ = fs::remove_dir_all(dir);
    let home = dir.join("home");
    let tree = dir.join("project");
    for (relative, text) in corpus::FAKE_CREDENTIALS {
        let path = home.join(relative);
        fs::create_dir_all(path.parent().expect("credential files are under HOME"))?;
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    for shared in SHARED_CACHES {
        let from = ctx.cache.join("home").join(shared);
        if from.is_dir() {
            copy_tree(&from, &home.join(shared), true)?;
        }
    }
    match source_tree(ctx, &project.source)? {
        Some(source) => copy_tree(&source, &tree, false)?,
        None => fs::create_dir_all(&tree).with_context(|| format!("creating {}", tree.display()))?,
    }
    let dotenv = tree.join(".env");
    if !dotenv.exists() {
        fs::write(&dotenv, FAKE_DOTENV).with_context(|| format!("writing {}", dotenv.display()))?;
    }
    // `cargo install` puts the developer's binaries there, and the developer runs them.
    let mut path = vec![home.join(".cargo/bin")];
    path.extend(ctx.path.iter().cloned());
    if let Some(rustup) = &ctx.rustup {
        let bin = home.join(".cargo/bin");
        fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
        for name in RUSTUP_PROXIES {
            std::os::unix::fs::symlink(&rustup.proxy, bin.join(name)).context("linking rustup's proxies")?;
        }
        std::os::unix::fs::symlink(&rustup.home, home.join(".rustup")).context("linking ~/.rustup")?;
        path.retain(|dir| *dir != rustup.toolchain_bin);
    }

    let alerts_file = dir.join("alerts.jsonl");
    let log_path = ctx.out.join("logs").join(format!("{}.log", project.name));
    // Appending, as the commands do: each write lands after their output.
    let mut log = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let watch = start_watch(ctx, dir, &alerts_file)?;
    let mut reader = AlertReader { file: alerts_file.clone(), offset: 0, pending: String::new() };
    let places = [
        (home.display().to_string(), "~"),
        (tree.display().to_string(), "$PROJECT"),
        (dir.display().to_string(), "$DIR"),
    ];
    let mine = |line: &str| line.contains(&dir.display().to_string());
    let mut other_lines: Vec<String> = Vec::new();
    let mut own_lines: Vec<String> = Vec::new();
    for command in &project.commands {
        use std::io::Write as _;
        let _ = writeln!(log, "\n$ {command}");
        let started = Instant::now();
        let status = run_command(ctx, command, &tree, &path, &home, &log_path);
        let seconds = started.elapsed().as_secs_f64();
        let (status, reason) = match status {
            Ok(Some(status)) if status.success() => ("exit 0".to_owned(), None),
            Ok(Some(status)) => {
                let text = fs::read_to_string(&log_path).unwrap_or_default();
                let own = text.rsplit_once(&format!("\n$ {command}\n")).map_or(text.as_str(), |(_, tail)| tail);
                (corpus::exit_text(status), Some(corpus::first_error(own)))
            }
            Ok(None) => ("timed out".to_owned(), Some(format!("killed after {} s", ctx.timeout.as_secs()))),
            Err(error) => ("not started".to_owned(), Some(format!("{error:#}"))),
        };
        let _ = writeln!(log, "[{status} in {seconds:.1} s]");
        let lines = reader.settle();
        let mut alerts = Vec::new();
        for line in lines {
            if !mine(&line) {
                other_lines.push(line);
                continue;
            }
            match Alert::parse(&line, &places) {
                Ok(alert) => alerts.push(alert),
                Err(error) => eprintln!("workflows: {}: {error:#}: {line}", alerts_file.display()),
            }
            own_lines.push(line);
        }
        outcome.commands.push(CommandOutcome { command: command.clone(), status, reason, seconds, alerts });
    }
    stop_watch(ctx, watch, dir)?;
    // Alerts that arrived after the last command settled are the last command's.
    for line in reader.read_new() {
        if !mine(&line) {
            other_lines.push(line);
        } else if let (Ok(alert), Some(last)) = (Alert::parse(&line, &places), outcome.commands.last_mut()) {
            last.alerts.push(alert);
            own_lines.push(line);
        }
    }
    outcome.other_trees = other_lines.len();
    let alerts_dir = ctx.out.join("alerts");
    let jsonl = |lines: &[String]| lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    fs::write(alerts_dir.join(format!("{}.jsonl", project.name)), jsonl(&own_lines))?;
    if !other_lines.is_empty() {
        fs::write(alerts_dir.join(format!("{}.other.jsonl", project.name)), jsonl(&other_lines))?;
    }
    for shared in SHARED_CACHES {
        let from = home.join(shared);
        if from.is_dir() {
            copy_tree(&from, &ctx.cache.join("home").join(shared), true)?;
        }
    }
    Ok(())
}

/// Temporary directories named with a random suffix (rustdoc's doctests, tempfile's): one name
/// for all, so that the same file in each run of a command is one row.
const RANDOM_SUFFIXED: &[&str] = &["rustdoctest", ".tmp"];

fn without_random_suffixes(target: &str) -> String {
    let components: Vec<String> = target
        .split('/')
        .map(|component| {
            RANDOM_SUFFIXED
                .iter()
                .find_map(|prefix| {
                    let suffix = component.strip_prefix(prefix)?;
                    (suffix.len() >= 6 && suffix.chars().all(|c| c.is_ascii_alphanumeric()))
                        .then(|| format!("{prefix}*"))
                })
                .unwrap_or_else(|| component.to_owned())
        })
        .collect();
    components.join("/")
}

/// The JSON line with the throwaway directories as `~`, `$PROJECT`, `$DIR`.
fn shorten_places(line: &str, places: &[(String, &str)]) -> String {
    places.iter().fold(line.to_owned(), |text, (from, to)| text.replace(from.as_str(), to))
}

/// Reads the alert lines appended to the watch's file since the last read.
struct AlertReader {
    file: PathBuf,
    offset: u64,
    /// A line not finished yet.
    pending: String,
}

impl AlertReader {
    fn read_new(&mut self) -> Vec<String> {
        let Ok(mut file) = fs::File::open(&self.file) else { return Vec::new() };
        let mut text = String::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err() || file.read_to_string(&mut text).is_err() {
            return Vec::new();
        }
        self.offset += text.len() as u64;
        self.pending += &text;
        let complete = match self.pending.rfind('\n') {
            Some(end) => {
                let rest = self.pending.split_off(end + 1);
                std::mem::replace(&mut self.pending, rest)
            }
            None => return Vec::new(),
        };
        complete.lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect()
    }

    /// The new lines once the file has stopped growing for [`SETTLE`].
    fn settle(&mut self) -> Vec<String> {
        let started = Instant::now();
        let mut lines = Vec::new();
        let mut quiet_since = Instant::now();
        while started.elapsed() < SETTLE_MAX {
            thread::sleep(Duration::from_millis(250));
            let new = self.read_new();
            if new.is_empty() && self.pending.is_empty() {
                if quiet_since.elapsed() >= SETTLE {
                    break;
                }
            } else {
                quiet_since = Instant::now();
            }
            lines.extend(new);
        }
        lines
    }
}

fn start_watch(ctx: &Ctx, dir: &Path, alerts_file: &Path) -> Result<Child> {
    let log_path = dir.join("watch.log");
    let log = fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut command = Command::new(&ctx.binary);
    command
        .args(["watch", "--json", "--alerts"])
        .arg(alerts_file)
        .arg("--pin-dir")
        .arg(&ctx.pin_dir)
        .stdin(Stdio::null())
        // With --json the alerts go to standard output too: the file is what counts.
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0);
    developer_env(&mut command, &ctx.path, &dir.join("home"));
    let mut child = command.spawn().with_context(|| format!("starting {} watch", ctx.binary.display()))?;
    let started = Instant::now();
    loop {
        let text = fs::read_to_string(&log_path).unwrap_or_default();
        if text.contains("watching") {
            return Ok(child);
        }
        if let Some(status) = child.try_wait()? {
            bail!(
                "credwatch watch exited ({}) before watching: {}",
                corpus::exit_text(status),
                corpus::first_error(&text)
            );
        }
        if started.elapsed() > WATCH_START {
            let _ = child.kill();
            let _ = child.wait();
            bail!("credwatch watch did not say it was watching within {} s", WATCH_START.as_secs());
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// SIGTERM (watch flushes and prints its summary), then `credwatch stop` detaches the programs
/// it left pinned.
fn stop_watch(ctx: &Ctx, mut watch: Child, dir: &Path) -> Result<()> {
    // SAFETY: kill(2) on the watch we started.
    unsafe { libc::kill(watch.id() as libc::pid_t, libc::SIGTERM) };
    let started = Instant::now();
    let status = loop {
        if let Some(status) = watch.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = watch.kill();
            let _ = watch.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let stopped = Command::new(&ctx.binary).arg("stop").arg("--pin-dir").arg(&ctx.pin_dir).output();
    let log = fs::read_to_string(dir.join("watch.log")).unwrap_or_default();
    let summary = log.lines().last().unwrap_or("").to_owned();
    match status {
        Some(status) if status.success() => {}
        Some(status) => bail!("credwatch watch ended with {}: {summary}", corpus::exit_text(status)),
        None => bail!("credwatch watch did not stop within 60 s of SIGTERM"),
    }
    if let Ok(output) = stopped {
        if !output.status.success() && ctx.pin_dir.exists() {
            bail!(
                "credwatch stop --pin-dir {}: {}",
                ctx.pin_dir.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
    }
    Ok(())
}

/// `sh -c COMMAND` in the project as the developer's shell runs it, in its own process group (a
/// timeout, and whatever it leaves running, end with it); None when it timed out.
fn run_command(
    ctx: &Ctx,
    command: &str,
    tree: &Path,
    path: &[PathBuf],
    home: &Path,
    log_path: &Path,
) -> Result<Option<std::process::ExitStatus>> {
    let log = fs::OpenOptions::new().append(true).open(log_path)?;
    let mut shell = Command::new("sh");
    shell
        .args(["-c", command])
        .current_dir(tree)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    developer_env(&mut shell, path, home);
    let mut child = shell.spawn().context("starting sh")?;
    let group = -(child.id() as libc::pid_t);
    let deadline = Instant::now() + ctx.timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        thread::sleep(Duration::from_millis(100));
    };
    // SAFETY: kill(2) on the process group created for this command.
    unsafe { libc::kill(group, libc::SIGKILL) };
    if status.is_none() {
        let _ = child.wait();
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_projects_sources_and_commands() {
        let text = "# header\n\nitoa cargo:itoa@1.0.15\n    cargo build\n\tcargo test --doc\n\
                    types npm:@types/node@22.15.3\n    npm install\nsix pip:six==1.17.0\n    python3 -m venv .venv\n\
                    app fixture:rust-app\n    cargo run\nvite empty\n    npm create vite@9.3.0 app\n    cd app && npm install\n";
        let projects = parse_list(text, "w.txt").unwrap();
        let summary: Vec<(&str, Source, usize, Vec<&str>)> = projects
            .iter()
            .map(|p| (p.name.as_str(), p.source.clone(), p.line, p.commands.iter().map(String::as_str).collect()))
            .collect();
        let pinned = |name: &str, version: &str| (name.to_owned(), version.to_owned());
        let (itoa, types, six) = (pinned("itoa", "1.0.15"), pinned("@types/node", "22.15.3"), pinned("six", "1.17.0"));
        assert_eq!(
            summary,
            [
                ("itoa", Source::Crate { name: itoa.0, version: itoa.1 }, 3, vec!["cargo build", "cargo test --doc"]),
                ("types", Source::Npm { name: types.0, version: types.1 }, 6, vec!["npm install"]),
                ("six", Source::Sdist { name: six.0, version: six.1 }, 8, vec!["python3 -m venv .venv"]),
                ("app", Source::Fixture("rust-app".into()), 10, vec!["cargo run"]),
                ("vite", Source::Empty, 12, vec!["npm create vite@9.3.0 app", "cd app && npm install"]),
            ]
        );
        for project in &projects {
            assert_eq!(Source::parse(&project.source.text()), Ok(project.source.clone()));
        }
    }

    fn error(text: &str) -> String {
        format!("{:#}", parse_list(text, "xtask/corpus/w.txt").unwrap_err())
    }

    #[test]
    fn errors_name_file_and_line() {
        assert_eq!(error("# c\n    cargo build\n"), "xtask/corpus/w.txt:2: a command before any project");
        assert_eq!(
            error("a cargo:a@1\nb cargo:b@1\n  cargo test\n"),
            "xtask/corpus/w.txt:2: project a (line 1) has no command"
        );
        assert_eq!(error("a cargo:a@1\n  x\nb empty\n"), "xtask/corpus/w.txt:3: project b has no command");
        assert!(error("a\n").starts_with("xtask/corpus/w.txt:1: expected `NAME SOURCE` (two words)"));
        assert_eq!(
            error("a cargo:itoa\n  x\n"),
            "xtask/corpus/w.txt:1: \"cargo:itoa\" is not pinned (expected cargo:NAME@VERSION)"
        );
        assert_eq!(
            error("a npm:@types/node\n  x\n"),
            "xtask/corpus/w.txt:1: \"npm:@types/node\" is not pinned (expected npm:NAME@VERSION)"
        );
        assert_eq!(
            error("a pip:six@1.0\n  x\n"),
            "xtask/corpus/w.txt:1: \"pip:six@1.0\" is not pinned (expected pip:NAME==VERSION)"
        );
        assert_eq!(error("a cargo:a@1;rm\n  x\n"), "xtask/corpus/w.txt:1: character ';' in version \"1;rm\"");
        assert_eq!(error("a cargo:a@\n  x\n"), "xtask/corpus/w.txt:1: empty version in \"cargo:a@\"");
        assert_eq!(
            error("a gem:rake@13\n  x\n"),
            "xtask/corpus/w.txt:1: unknown source kind \"gem\" (expected cargo, npm, pip, fixture)"
        );
        assert_eq!(
            error("a rake\n  x\n"),
            "xtask/corpus/w.txt:1: unknown source \"rake\" (expected cargo:, npm:, pip:, fixture: or empty)"
        );
        assert_eq!(error("a fixture:../x\n  x\n"), "xtask/corpus/w.txt:1: invalid name \"../x\" in \"fixture:../x\"");
        assert_eq!(
            error("../a empty\n  x\n"),
            "xtask/corpus/w.txt:1: invalid project name \"../a\" (letters, digits, `-`, `.`, `_`)"
        );
        assert_eq!(
            error("a empty\n  x\na empty\n  y\n"),
            "xtask/corpus/w.txt:3: project a is listed already, at line 1"
        );
        assert_eq!(error("a empty\n  x\x1b[0m\n"), "xtask/corpus/w.txt:2: control character '\\u{1b}' in the command");
    }

    #[test]
    fn the_checked_in_controls_parse_and_their_fixtures_exist() {
        let file = "xtask/corpus/workflows-controls.txt";
        let projects = parse_list(&fs::read_to_string(crate::workspace().join(file)).unwrap(), file).unwrap();
        assert!(projects.len() >= 5, "{} controls", projects.len());
        for project in &projects {
            let Source::Fixture(dir) = &project.source else { panic!("{}: a control is a fixture", project.name) };
            assert!(crate::workspace().join(FIXTURES).join(dir).is_dir(), "{}: no fixture {dir}", project.name);
        }
    }

    #[test]
    fn the_checked_in_list_parses_covers_the_four_ecosystems_and_its_fixtures_exist() {
        let path = crate::workspace().join(DEFAULT_LIST);
        let projects = parse_list(&fs::read_to_string(&path).unwrap(), DEFAULT_LIST).unwrap();
        let commands: Vec<&str> = projects.iter().flat_map(|p| p.commands.iter().map(String::as_str)).collect();
        assert!(
            projects.len() >= 15 && commands.len() >= 40,
            "{} projects, {} commands",
            projects.len(),
            commands.len()
        );
        for tool in ["cargo", "npm", "npx", "yarn", "pnpm", "pip", "uv", "poetry", "bundle"] {
            assert!(commands.iter().any(|c| c.split_whitespace().any(|w| w == tool)), "no command runs {tool}");
        }
        for project in &projects {
            if let Source::Fixture(dir) = &project.source {
                assert!(crate::workspace().join(FIXTURES).join(dir).is_dir(), "{}: no fixture {dir}", project.name);
            }
        }
    }

    fn alert(rule: &str, severity: &str, target: &str) -> Alert {
        Alert {
            line: AlertLine {
                rule: rule.into(),
                severity: severity.into(),
                package: "(cargo tree, no package)".into(),
                target: target.into(),
            },
            why: (severity == "low").then(|| "the project's own .env".to_owned()),
            json: format!(r#"{{"rule":{{"id":"{rule}","severity":"{severity}"}}}}"#),
        }
    }

    fn command(command: &str, status: &str, alerts: Vec<Alert>) -> CommandOutcome {
        CommandOutcome { command: command.into(), status: status.into(), reason: None, seconds: 1.0, alerts }
    }

    #[test]
    fn aggregates_per_command_and_rule() {
        let doctest = || alert("exec-of-written-file", "high", "exec: /tmp/rustdoctestX/rust_out");
        let outcomes = vec![
            ProjectOutcome {
                name: "num-traits".into(),
                source: "cargo:num-traits@0.2.19".into(),
                commands: vec![
                    command("cargo check", "exit 0", vec![]),
                    command(
                        "cargo test",
                        "exit 0",
                        vec![doctest(), doctest(), alert("aws-credentials", "critical", "~/.aws/credentials")],
                    ),
                ],
                error: None,
                other_trees: 2,
            },
            ProjectOutcome {
                name: "express-app".into(),
                source: "fixture:express-app".into(),
                commands: vec![
                    command("npm start", "exit 1", vec![alert("dotenv-files", "low", "$PROJECT/.env")]),
                    command("npx express-app-env", "exit 0", vec![alert("dotenv-files", "high", "$PROJECT/.env")]),
                ],
                error: None,
                other_trees: 0,
            },
        ];
        let tables = aggregate(&outcomes);
        assert_eq!(
            (
                tables.projects,
                tables.commands,
                tables.succeeded,
                tables.commands_medium_or_higher,
                tables.alerts_medium_or_higher
            ),
            (2, 4, 3, 2, 4)
        );
        let totals: Vec<(&str, &str, usize, usize)> =
            tables.totals.iter().map(|t| (t.rule.as_str(), t.severity.as_str(), t.count, t.commands.len())).collect();
        assert_eq!(
            totals,
            [
                ("aws-credentials", "critical", 1, 1),
                ("dotenv-files", "high", 1, 1),
                ("exec-of-written-file", "high", 2, 1),
                ("dotenv-files", "low", 1, 1)
            ]
        );
        assert_eq!(tables.rows[2].count, 2);
        assert_eq!(tables.rows[2].command, "cargo test");

        let text = markdown(&tables, &outcomes, &["run".to_owned()]);
        assert!(
            text.contains("**Commands with medium-or-higher alerts: 2 of 4 (4 alerts at medium or above).**"),
            "{text}"
        );
        assert!(
            text.contains("| num-traits | cargo:num-traits@0.2.19 | `cargo test` | exit 0 | aws-credentials (critical) ×1, exec-of-written-file (high) ×2 |"),
            "{text}"
        );
        assert!(text.contains("| `cargo check` | exit 0 | none |"), "{text}");
        assert!(text.contains("| dotenv-files | low | 1 | `express-app: npm start` |"), "{text}");
        assert!(
            text.contains("num-traits: `cargo test` (3 alerts at medium or above)\n\n```json\n{\"rule\""),
            "{text}"
        );
        assert!(text.contains("(not counted above): 2."), "{text}");
        assert!(
            text.contains("| express-app | fixture:express-app | `npm start` (exit 1), `npx express-app-env` | dotenv-files (high) ×1, dotenv-files (low) ×1 |"),
            "{text}"
        );
        assert!(
            text.contains("| `npm start` | (cargo tree, no package) | `$PROJECT/.env` | 1 | the project's own .env |"),
            "{text}"
        );
        let json = to_json(&tables, &outcomes, &[]);
        assert_eq!(json["headline"]["alerts_medium_or_higher"], 4);
        assert_eq!(json["projects"][0]["commands"][1]["medium_or_higher"][2]["rule"]["id"], "aws-credentials");
        assert_eq!(json["projects"][1]["commands"][0]["alerts"][0]["target"], "$PROJECT/.env");
    }

    #[test]
    fn cells_from_the_monitored_system_are_escaped() {
        assert_eq!(code("a|b`c\x1b[0m"), "`a\\|b'c[0m`");
        let alerts = [alert("x|y", "low", "t")];
        assert_eq!(rules_cell(&alerts), "x\\|y (low) ×1");
    }

    #[test]
    fn random_temporary_names_are_one_name() {
        assert_eq!(
            without_random_suffixes("exec: /tmp/rustdoctest7N1IRg/rust_out"),
            "exec: /tmp/rustdoctest*/rust_out"
        );
        assert_eq!(without_random_suffixes("$PROJECT/target/.tmpAb12Cd/x"), "$PROJECT/target/.tmp*/x");
        // Not random: short, or not letters and digits.
        assert_eq!(without_random_suffixes("/tmp/rustdoctest/a.tmpfile-x"), "/tmp/rustdoctest/a.tmpfile-x");
        assert_eq!(without_random_suffixes("~/.tmp-123456"), "~/.tmp-123456");
    }

    #[test]
    fn reads_only_complete_alert_lines() {
        let dir = env::temp_dir().join(format!("credwatch-workflows-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("alerts.jsonl");
        let mut reader = AlertReader { file: file.clone(), offset: 0, pending: String::new() };
        assert!(reader.read_new().is_empty());
        fs::write(&file, "{\"a\":1}\n{\"b\"").unwrap();
        assert_eq!(reader.read_new(), ["{\"a\":1}"]);
        fs::write(&file, "{\"a\":1}\n{\"b\":2}\n\n").unwrap();
        assert_eq!(reader.read_new(), ["{\"b\":2}"]);
        assert!(reader.read_new().is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
