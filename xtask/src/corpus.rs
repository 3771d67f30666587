//! `cargo xtask corpus`: install real packages from the registries (npm packages with install
//! scripts, PyPI sdists with pip and uv, crates with build scripts or proc-macros) one by one
//! under `credwatch run`, each in its own project with a throwaway HOME of fake credentials, and
//! tabulate the alerts. A measurement like the bench (it uses the network), not a test.
//!
//! Output in target/corpus (target/<the list's name> for another `--list`): corpus.md and
//! corpus.json (the tables), alerts/<eco>/<pkg>.jsonl (each install's alerts as credwatch wrote
//! them), logs/<eco>/<pkg>.log (each install's output) and packages.pinned.txt (the list with the
//! versions this run resolved). With `--contain`, each install runs under `run --contain`, and
//! the output goes to target/corpus-contain; with `--contain-net`, under `run --contain
//! --contain-net registries` (the box's only way out is credwatch's proxy to the registries),
//! output in target/corpus-contain-net.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    env,
    ffi::OsString,
    fmt::Write as _,
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// The list checked in beside xtask, used without `--list`.
const DEFAULT_LIST: &str = "xtask/corpus/packages.txt";
/// Install jobs at once: the machine has 2 cores, shared.
const DEFAULT_JOBS: usize = 2;
/// A native build from sources can take minutes; one that hangs must not stall the run.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long `credwatch run` waits for the tree after the install exits (daemons left behind).
const LINGER_SECS: &str = "10";
/// uv is installed from PyPI into target/corpus/tools when it is not on PATH.
pub(crate) const UV_VERSION: &str = "0.13.9";
/// `credwatch run` exits with this when an alert fired, whatever the install did.
const EXIT_ALERT: i32 = 10;
/// Distinct file/command examples kept per table row.
const EXAMPLES_PER_ROW: usize = 3;
/// A failure reason is one line of the install's output, cut to this many characters.
const REASON_CHARS: usize = 160;

/// Fake credentials written into every install's HOME; none of them is real. The same set as
/// the end-to-end tests (tests/src/lib.rs), plus a few more kinds, except that the npm token is
/// scoped to a registry that does not exist: npm would send a token for registry.npmjs.org with
/// every request of the run.
pub(crate) const FAKE_CREDENTIALS: &[(&str, &str)] = &[
    (".npmrc", "//registry.credwatch-corpus.invalid/:_authToken=npm_FAKEcredwatchCORPUS000000000000000000\n"),
    (
        ".ssh/id_ed25519",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKE-credwatch-corpus-not-a-key\n-----END OPENSSH PRIVATE KEY-----\n",
    ),
    (
        ".ssh/id_rsa",
        "-----BEGIN RSA PRIVATE KEY-----\nFAKE-credwatch-corpus-not-a-key\n-----END RSA PRIVATE KEY-----\n",
    ),
    (
        ".aws/credentials",
        "[default]\naws_access_key_id = AKIAFAKECREDWATCHCORPUS\naws_secret_access_key = fake/credwatch/corpus\n",
    ),
    (".cargo/credentials.toml", "[registry]\ntoken = \"cio_FAKEcredwatchCORPUS\"\n"),
    (".pypirc", "[pypi]\nusername = __token__\npassword = pypi-FAKEcredwatchCORPUS\n"),
    (".git-credentials", "https://corpus:ghp_FAKEcredwatchCORPUS@git.credwatch-corpus.invalid\n"),
    (".config/gh/hosts.yml", "git.credwatch-corpus.invalid:\n    oauth_token: gho_FAKEcredwatchCORPUS\n"),
    (".docker/config.json", "{\"auths\":{\"registry.credwatch-corpus.invalid\":{\"auth\":\"RkFLRTpGQUtF\"}}}\n"),
    (".kube/config", "apiVersion: v1\nkind: Config\nusers:\n- name: fake\n  user:\n    token: FAKEcredwatchCORPUS\n"),
    (".netrc", "machine git.credwatch-corpus.invalid login corpus password FAKEcredwatchCORPUS\n"),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Eco {
    Npm,
    Pip,
    Uv,
    Cargo,
}

impl Eco {
    const ALL: [Eco; 4] = [Eco::Npm, Eco::Pip, Eco::Uv, Eco::Cargo];

    pub fn key(self) -> &'static str {
        match self {
            Eco::Npm => "npm",
            Eco::Pip => "pip",
            Eco::Uv => "uv",
            Eco::Cargo => "cargo",
        }
    }

    fn parse(word: &str) -> Option<Eco> {
        Eco::ALL.into_iter().find(|eco| eco.key() == word)
    }
}

/// One line of the package list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub eco: Eco,
    pub name: String,
    pub version: Option<String>,
    pub line: usize,
}

impl Entry {
    fn spec(&self) -> String {
        match &self.version {
            Some(version) => format!("{}@{version}", self.name),
            None => self.name.clone(),
        }
    }

    /// A file name for the package: npm scopes have a slash.
    fn slug(&self) -> String {
        self.name.replace('/', "__")
    }
}

/// Parses the package list; an error names `file:line` and what is wrong there.
pub fn parse_list(text: &str, file: &str) -> Result<Vec<Entry>> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut seen: HashMap<(Eco, String), usize> = HashMap::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let at = |what: String| anyhow::anyhow!("{file}:{line}: {what}");
        let words: Vec<&str> = content.split_whitespace().collect();
        let [eco, spec] = words.as_slice() else {
            return Err(at(format!(
                "expected `ECOSYSTEM NAME[@VERSION]` (two words), found {} word(s): {:?}",
                words.len(),
                content
            )));
        };
        let eco = Eco::parse(eco)
            .ok_or_else(|| at(format!("unknown ecosystem {eco:?} (expected one of npm, pip, uv, cargo)")))?;
        // An npm scope starts with `@`: the version separator is an `@` after the first character.
        let (name, version) = match spec.char_indices().skip(1).find(|(_, c)| *c == '@') {
            Some((split, _)) => (&spec[..split], Some(&spec[split + 1..])),
            None => (*spec, None),
        };
        check_name(eco, name).map_err(&at)?;
        if let Some(version) = version {
            if version.is_empty() {
                return Err(at(format!("empty version after `@` in {spec:?}")));
            }
            if let Some(bad) = version.chars().find(|c| !(c.is_ascii_alphanumeric() || ".-+_".contains(*c))) {
                return Err(at(format!("character {bad:?} in version {version:?}")));
            }
        }
        let key = (eco, normalise_name(eco, name));
        if let Some(first) = seen.get(&key) {
            return Err(at(format!("{} {name} is listed already, at line {first}", eco.key())));
        }
        seen.insert(key, line);
        entries.push(Entry { eco, name: name.to_owned(), version: version.map(str::to_owned), line });
    }
    Ok(entries)
}

fn check_name(eco: Eco, name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("empty package name".to_owned());
    }
    let plain = |part: &str| !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
    let valid = match (eco, name.strip_prefix('@')) {
        (Eco::Npm, Some(scoped)) => scoped.split_once('/').is_some_and(|(scope, base)| plain(scope) && plain(base)),
        _ => plain(name),
    };
    if valid {
        Ok(())
    } else {
        Err(format!("invalid {} package name {name:?}", eco.key()))
    }
}

/// PyPI and crates.io treat `-`, `_` (and PyPI `.`) and case as the same name.
fn normalise_name(eco: Eco, name: &str) -> String {
    match eco {
        Eco::Npm => name.to_owned(),
        Eco::Pip | Eco::Uv => name.to_ascii_lowercase().replace(['_', '.'], "-"),
        Eco::Cargo => name.replace('_', "-"),
    }
}

/// The list with each entry pinned to the version a run resolved; everything else as it was.
pub fn pin_list(text: &str, entries: &[Entry], resolved: &HashMap<(Eco, String), String>) -> String {
    let by_line: HashMap<usize, &Entry> = entries.iter().map(|entry| (entry.line, entry)).collect();
    let mut out = String::new();
    for (index, raw) in text.lines().enumerate() {
        match by_line
            .get(&(index + 1))
            .and_then(|entry| Some((*entry, resolved.get(&(entry.eco, entry.name.clone()))?)))
        {
            Some((entry, version)) => {
                let _ = writeln!(out, "{} {}@{version}", entry.eco.key(), entry.name);
            }
            None => {
                out += raw;
                out.push('\n');
            }
        }
    }
    out
}

struct Options {
    only: Vec<Eco>,
    jobs: usize,
    list: PathBuf,
    binary: PathBuf,
    timeout: Duration,
    /// Each install under `run --contain`, its reports in target/corpus-contain.
    contain: bool,
    /// And `--contain-net registries` (implies `contain`), its reports in target/corpus-contain-net.
    contain_net: bool,
}

const USAGE: &str =
    "cargo xtask corpus [--only npm,pip,uv,cargo] [--jobs N] [--list FILE] [--binary PATH] [--timeout SECS] [--contain] [--contain-net]
       cargo xtask corpus --workflows [--only PROJECT,...] [--list FILE] [--binary PATH] [--timeout SECS]";

fn parse_options(args: &[&str]) -> Result<Options> {
    let workspace = crate::workspace();
    let mut options = Options {
        only: Eco::ALL.to_vec(),
        jobs: DEFAULT_JOBS,
        list: workspace.join(DEFAULT_LIST),
        binary: workspace.join("target/release/credwatch"),
        timeout: DEFAULT_TIMEOUT,
        contain: false,
        contain_net: false,
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let mut value = || rest.next().copied().with_context(|| format!("{arg} needs a value\nusage: {USAGE}"));
        match *arg {
            "--only" => {
                options.only = value()?
                    .split(',')
                    .map(|word| {
                        Eco::parse(word.trim())
                            .with_context(|| format!("--only: unknown ecosystem {word:?} (npm, pip, uv, cargo)"))
                    })
                    .collect::<Result<_>>()?;
            }
            "--jobs" => {
                options.jobs = value()?.parse().ok().filter(|jobs| *jobs > 0).context("--jobs takes a number ≥ 1")?;
            }
            "--list" => options.list = PathBuf::from(value()?),
            "--binary" => options.binary = PathBuf::from(value()?),
            "--contain" => options.contain = true,
            "--contain-net" => (options.contain, options.contain_net) = (true, true),
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

/// What became of one install.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub eco: Eco,
    pub name: String,
    pub requested: Option<String>,
    pub version: Option<String>,
    pub status: Status,
    pub reason: Option<String>,
    pub seconds: f64,
    /// npm only: whether the package itself has install scripts or a binding.gyp (its
    /// dependencies' scripts run too, and their alerts count for it).
    pub install_code: Option<bool>,
    pub alerts: Vec<AlertLine>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Installed,
    Failed,
    TimedOut,
}

impl Status {
    fn key(self) -> &'static str {
        match self {
            Status::Installed => "installed",
            Status::Failed => "failed",
            Status::TimedOut => "timed out",
        }
    }
}

/// The parts of one JSON alert that the tables show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlertLine {
    pub rule: String,
    pub severity: String,
    /// The package as the alert names it: `name@version (step)`, or the manager's tree.
    pub package: String,
    /// The file (`~` for the fake HOME, `$INSTALL` for the install's directory), the destination
    /// of a connection, or the command.
    pub target: String,
}

/// Severities from the lowest; anything else ranks below them.
const SEVERITIES: [&str; 4] = ["low", "medium", "high", "critical"];

pub(crate) fn severity_rank(severity: &str) -> usize {
    SEVERITIES.iter().position(|s| *s == severity).map_or(0, |i| i + 1)
}

pub(crate) fn medium_or_higher(severity: &str) -> bool {
    severity_rank(severity) >= severity_rank("medium")
}

/// Reads one alert line; `places` maps the install's directories to short names so that the
/// same file reads the same in every install.
pub fn parse_alert(line: &str, places: &[(String, &str)]) -> Result<AlertLine> {
    let alert: Value = serde_json::from_str(line).context("not JSON")?;
    let text = |pointer: &str| alert.pointer(pointer).and_then(Value::as_str);
    let rule = text("/rule/id").context("no rule.id")?.to_owned();
    let severity = text("/rule/severity").context("no rule.severity")?.to_owned();
    let manager = text("/package/manager").unwrap_or("?");
    let mut package = match (text("/package/name"), text("/package/version")) {
        (Some(name), Some(version)) if !name.is_empty() => format!("{name}@{version}"),
        (Some(name), _) if !name.is_empty() => name.to_owned(),
        _ => format!("({manager} tree, no package)"),
    };
    if let Some(step) = text("/package/lifecycle").filter(|step| !step.is_empty()) {
        let _ = write!(package, " ({step})");
    }
    let target = match (text("/file/path"), alert.get("destination")) {
        (Some(path), _) => shorten(path, places),
        (None, Some(destination)) => {
            let field =
                |key: &str| destination.get(key).map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned));
            let address = field("address").or_else(|| field("path")).unwrap_or_default();
            let port = field("port").map(|port| format!(":{port}")).unwrap_or_default();
            match field("domain") {
                Some(domain) => format!("connect: {domain} ({address}{port})"),
                None => format!("connect: {address}{port}"),
            }
        }
        (None, None) => {
            let args: Vec<&str> = alert
                .pointer("/process/args")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            format!("exec: {}", shorten(&args.join(" "), places))
        }
    };
    Ok(AlertLine { rule, severity, package, target })
}

fn shorten(text: &str, places: &[(String, &str)]) -> String {
    let mut text = text.to_owned();
    for (from, to) in places {
        if !from.is_empty() {
            text = text.replace(from.as_str(), to);
        }
    }
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// One row of the alerts table: a rule firing on one package (as the alert names it).
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub rule: String,
    pub severity: String,
    pub package: String,
    /// The corpus entries whose installs raised it (`eco name`).
    pub installs: BTreeSet<String>,
    pub count: usize,
    pub examples: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct EcoSummary {
    pub tried: usize,
    pub installed: usize,
    pub failed: usize,
    pub timed_out: usize,
    /// npm: packages that have install scripts or a binding.gyp themselves.
    pub with_install_code: usize,
    /// Packages by the highest severity of their alerts.
    pub by_severity: BTreeMap<String, usize>,
    pub medium_or_higher: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tables {
    pub ecosystems: BTreeMap<Eco, EcoSummary>,
    pub rows: Vec<Row>,
    pub medium_or_higher: usize,
    pub tried: usize,
}

/// The figures of a run: per ecosystem, per (rule, package), and the headline.
pub fn aggregate(outcomes: &[Outcome]) -> Tables {
    let mut ecosystems: BTreeMap<Eco, EcoSummary> = BTreeMap::new();
    let mut rows: BTreeMap<(String, String, String), Row> = BTreeMap::new();
    for outcome in outcomes {
        let summary = ecosystems.entry(outcome.eco).or_default();
        summary.tried += 1;
        match outcome.status {
            Status::Installed => summary.installed += 1,
            Status::Failed => summary.failed += 1,
            Status::TimedOut => summary.timed_out += 1,
        }
        summary.with_install_code += usize::from(outcome.install_code == Some(true));
        if let Some(worst) = outcome.alerts.iter().map(|a| a.severity.as_str()).max_by_key(|s| severity_rank(s)) {
            *summary.by_severity.entry(worst.to_owned()).or_default() += 1;
            summary.medium_or_higher += usize::from(medium_or_higher(worst));
        }
        for alert in &outcome.alerts {
            let key = (alert.rule.clone(), alert.severity.clone(), alert.package.clone());
            let row = rows.entry(key).or_insert_with(|| Row {
                rule: alert.rule.clone(),
                severity: alert.severity.clone(),
                package: alert.package.clone(),
                installs: BTreeSet::new(),
                count: 0,
                examples: Vec::new(),
            });
            row.count += 1;
            row.installs.insert(format!("{} {}", outcome.eco.key(), outcome.name));
            if row.examples.len() < EXAMPLES_PER_ROW && !row.examples.contains(&alert.target) {
                row.examples.push(alert.target.clone());
            }
        }
    }
    let mut rows: Vec<Row> = rows.into_values().collect();
    rows.sort_by(|a, b| {
        severity_rank(&b.severity)
            .cmp(&severity_rank(&a.severity))
            .then_with(|| a.rule.cmp(&b.rule))
            .then_with(|| b.count.cmp(&a.count))
            .then_with(|| a.package.cmp(&b.package))
    });
    let medium = ecosystems.values().map(|s| s.medium_or_higher).sum();
    Tables { ecosystems, rows, medium_or_higher: medium, tried: outcomes.len() }
}

/// Text from the monitored system inside a markdown table cell: no cell breaks, no markup, no
/// control characters.
pub(crate) fn md(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '|' => out += "\\|",
            '`' => out += "'",
            '<' => out += "&lt;",
            '>' => out += "&gt;",
            '*' | '_' | '[' | ']' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

pub fn markdown(tables: &Tables, outcomes: &[Outcome], header: &[String]) -> String {
    let mut text = String::from("# credwatch corpus\n\n");
    for line in header {
        let _ = writeln!(text, "{line}  ");
    }
    let _ = writeln!(
        text,
        "\n**Packages with medium-or-higher alerts: {} of {}.**\n",
        tables.medium_or_higher, tables.tried
    );
    text += "| ecosystem | tried | installed | failed | timed out | with alerts: critical | high | medium | low | medium or higher |\n";
    text += "|---|---|---|---|---|---|---|---|---|---|\n";
    for (eco, s) in &tables.ecosystems {
        let severity = |key: &str| s.by_severity.get(key).copied().unwrap_or(0);
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            eco.key(),
            s.tried,
            s.installed,
            s.failed,
            s.timed_out,
            severity("critical"),
            severity("high"),
            severity("medium"),
            severity("low"),
            s.medium_or_higher
        );
    }
    let npm: Vec<Option<bool>> = outcomes.iter().filter(|o| o.eco == Eco::Npm).map(|o| o.install_code).collect();
    if !npm.is_empty() {
        let count = |value: Option<bool>| npm.iter().filter(|code| **code == value).count();
        let _ = writeln!(
            text,
            "\nnpm: {} packages have install scripts or a binding.gyp of their own, {} have none (only their \
             dependencies may), {} could not be checked (the install failed).",
            count(Some(true)),
            count(Some(false)),
            count(None)
        );
    }
    text += "\n## Alerts by rule and package\n\n";
    if tables.rows.is_empty() {
        text += "No alerts.\n";
    } else {
        text += "| rule | severity | package (as the alert names it) | count | installs | file or command |\n";
        text += "|---|---|---|---|---|---|\n";
        for row in &tables.rows {
            let installs: Vec<String> = row.installs.iter().map(|i| md(i)).collect();
            let examples: Vec<String> =
                row.examples.iter().map(|e| format!("`{}`", e.replace('`', "'").replace('|', "\\|"))).collect();
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} | {} | {} |",
                md(&row.rule),
                md(&row.severity),
                md(&row.package),
                row.count,
                installs.join(", "),
                examples.join("<br>")
            );
        }
    }
    let failures: Vec<&Outcome> = outcomes.iter().filter(|o| o.status != Status::Installed).collect();
    let _ = writeln!(text, "\n## Installs that did not succeed ({})\n", failures.len());
    if !failures.is_empty() {
        text += "| ecosystem | package | status | reason (from its log) |\n|---|---|---|---|\n";
        for outcome in failures {
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} |",
                outcome.eco.key(),
                md(&outcome.name),
                outcome.status.key(),
                md(outcome.reason.as_deref().unwrap_or(""))
            );
        }
    }
    text
}

pub fn to_json(tables: &Tables, outcomes: &[Outcome], header: &[String]) -> Value {
    json!({
        "header": header,
        "headline": { "medium_or_higher": tables.medium_or_higher, "tried": tables.tried },
        "ecosystems": tables.ecosystems.iter().map(|(eco, s)| (eco.key().to_owned(), json!({
            "tried": s.tried, "installed": s.installed, "failed": s.failed, "timed_out": s.timed_out,
            "with_install_code": s.with_install_code, "packages_by_severity": s.by_severity,
            "medium_or_higher": s.medium_or_higher,
        }))).collect::<serde_json::Map<_, _>>(),
        "alerts_by_rule_and_package": tables.rows.iter().map(|row| json!({
            "rule": row.rule, "severity": row.severity, "package": row.package, "count": row.count,
            "installs": row.installs, "examples": row.examples,
        })).collect::<Vec<_>>(),
        "installs": outcomes.iter().map(|o| json!({
            "ecosystem": o.eco.key(), "name": o.name, "requested": o.requested, "version": o.version,
            "status": o.status.key(), "reason": o.reason, "seconds": (o.seconds * 10.0).round() / 10.0,
            "install_code": o.install_code, "alerts": o.alerts.len(),
            "alerts_file": format!("alerts/{}/{}.jsonl", o.eco.key(), o.name.replace('/', "__")),
        })).collect::<Vec<_>>(),
    })
}

/// Everything the installs share.
struct Ctx {
    out: PathBuf,
    cache: PathBuf,
    work: PathBuf,
    binary: PathBuf,
    python: PathBuf,
    npm: PathBuf,
    cargo: PathBuf,
    uv: Option<PathBuf>,
    path: OsString,
    node_dir: Option<PathBuf>,
    build_jobs: usize,
    timeout: Duration,
    contain: bool,
    contain_net: bool,
}

impl Ctx {
    /// The run's tools (python, cargo and npm; uv is added when a uv install is selected) and
    /// settings from `options`.
    fn new(options: &Options, out: PathBuf, cache: PathBuf, work: PathBuf) -> Result<Ctx> {
        let python = python_executable()?;
        let cargo = PathBuf::from(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        let cargo = if cargo.is_absolute() {
            cargo
        } else {
            crate::toolchain::find_in_path("cargo").context("cargo is not on PATH")?
        };
        let npm = crate::toolchain::find_in_path("npm").context("npm is not on PATH")?;
        // rustup's and pyenv's shims look in HOME, which each install replaces: the real tools
        // first.
        let mut dirs: Vec<PathBuf> =
            [&cargo, &python, &npm].iter().filter_map(|p| p.parent().map(Path::to_path_buf)).collect();
        dirs.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
        let path = env::join_paths(dirs).context("building PATH")?;
        let cores = thread::available_parallelism().map_or(1, usize::from);
        Ok(Ctx {
            out,
            cache,
            work,
            binary: fs::canonicalize(&options.binary)
                .with_context(|| format!("resolving {}", options.binary.display()))?,
            python,
            npm,
            cargo,
            uv: None,
            path,
            // node-gyp fetches Node's headers from outside the registries unless it is given them.
            node_dir: Path::new("/usr/include/node/node.h").is_file().then(|| PathBuf::from("/usr")),
            build_jobs: (cores / options.jobs).max(1),
            timeout: options.timeout,
            contain: options.contain,
            contain_net: options.contain_net,
        })
    }
}

/// target/corpus, or the name of another `--list` (target/contain-sample), so that a subset's run
/// leaves the whole list's report alone; `-contain` or `-contain-net` after it for a boxed run.
fn out_dir_name(options: &Options) -> String {
    let real = |path: &Path| fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let base = match options.list.file_stem() {
        Some(stem) if real(&options.list) != real(&crate::workspace().join(DEFAULT_LIST)) => {
            stem.to_string_lossy().into_owned()
        }
        _ => "corpus".to_owned(),
    };
    let suffix = match (options.contain, options.contain_net) {
        (_, true) => "-contain-net",
        (true, false) => "-contain",
        (false, false) => "",
    };
    base + suffix
}

pub fn corpus(args: &[&str]) -> Result<()> {
    let options = parse_options(args)?;
    if !crate::is_root() {
        bail!("credwatch loads eBPF programs: run `sudo -E cargo xtask corpus`");
    }
    if !options.binary.is_file() {
        bail!("{} is missing: run `cargo xtask build` or give --binary PATH", options.binary.display());
    }
    let list_text = fs::read_to_string(&options.list)
        .with_context(|| format!("reading the package list {}", options.list.display()))?;
    let entries = parse_list(&list_text, &options.list.display().to_string())?;
    let selected: Vec<Entry> = entries.iter().filter(|e| options.only.contains(&e.eco)).cloned().collect();
    if selected.is_empty() {
        bail!(
            "no package of {:?} in {}",
            options.only.iter().map(|e| e.key()).collect::<Vec<_>>(),
            options.list.display()
        );
    }

    let out = crate::workspace().join("target").join(out_dir_name(&options));
    // One cache for both kinds of run: a contained run downloads nothing the other has.
    let cache = crate::workspace().join("target/corpus/cache");
    let work = prepare_dirs(&out, &cache)?;
    let mut ctx = Ctx::new(&options, out.clone(), cache, work.clone())?;
    if selected.iter().any(|e| e.eco == Eco::Uv) {
        ctx.uv = Some(ensure_uv(&ctx)?);
    }

    let version = Command::new(&ctx.binary)
        .arg("--version")
        .output()
        .map_or_else(|e| format!("({e})"), |o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let started = Instant::now();
    let started_at = utc_now();
    let header = |done: usize, elapsed: Duration| {
        vec![
            format!(
                "Run started {started_at}, {:.0} min, {done} of {} installs done",
                elapsed.as_secs_f64() / 60.0,
                selected.len()
            ),
            format!(
                "Binary: {} ({version}){}",
                ctx.binary.display(),
                match (ctx.contain, ctx.contain_net) {
                    (_, true) => ", each install under `run --contain --contain-net registries`",
                    (true, false) => ", each install under `run --contain`",
                    (false, false) => "",
                }
            ),
            format!(
                "List: {} ({}); {} jobs, timeout {} s per install",
                options.list.display(),
                options.only.iter().map(|e| e.key()).collect::<Vec<_>>().join(","),
                options.jobs,
                options.timeout.as_secs()
            ),
        ]
    };
    println!("corpus: {} installs, {} at a time; output in {}", selected.len(), options.jobs, out.display());

    let outcomes = install_all(&ctx, &selected, options.jobs, |snapshot| {
        write_outputs(&out, snapshot, &header(snapshot.len(), started.elapsed()))
    });
    write_outputs(&out, &outcomes, &header(outcomes.len(), started.elapsed()))?;
    let resolved: HashMap<(Eco, String), String> =
        outcomes.iter().filter_map(|o| Some(((o.eco, o.name.clone()), o.version.clone()?))).collect();
    let pinned = out.join("packages.pinned.txt");
    fs::write(&pinned, pin_list(&list_text, &entries, &resolved))
        .with_context(|| format!("writing {}", pinned.display()))?;
    let _ = fs::remove_dir_all(&work);
    let tables = aggregate(&outcomes);
    println!(
        "corpus: packages with medium-or-higher alerts: {} of {}; {} and {} written in {:.0} min",
        tables.medium_or_higher,
        tables.tried,
        out.join("corpus.md").display(),
        out.join("corpus.json").display(),
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

/// Empties the run's alerts and logs, makes the cache's folders, and returns this run's work
/// folder (in the system's temporary folder), made.
fn prepare_dirs(out: &Path, cache: &Path) -> Result<PathBuf> {
    for dir in ["alerts", "logs"] {
        let _ = fs::remove_dir_all(out.join(dir));
    }
    for eco in Eco::ALL {
        for dir in ["alerts", "logs"] {
            fs::create_dir_all(out.join(dir).join(eco.key()))
                .with_context(|| format!("creating {}/{dir}", out.display()))?;
        }
    }
    for dir in ["npm", "pip", "uv", "cargo/registry", "cargo/git"] {
        fs::create_dir_all(cache.join(dir)).with_context(|| format!("creating {}", cache.join(dir).display()))?;
    }
    forget_built_wheels(cache)?;
    let work = env::temp_dir().join(format!("credwatch-corpus-{}", std::process::id()));
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    Ok(work)
}

/// Installs `selected`, `jobs` at a time, printing a line per install and handing `report` what
/// is done after each one (the report is written as the run goes, so that a long run can be
/// read while it goes). The outcomes come in the list's order.
fn install_all(
    ctx: &Ctx,
    selected: &[Entry],
    jobs: usize,
    report: impl Fn(&[Outcome]) -> Result<()> + Sync,
) -> Vec<Outcome> {
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<Outcome>>> = Mutex::new(vec![None; selected.len()]);
    let report_lock = Mutex::new(());
    thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| loop {
                let index = {
                    let mut next = next.lock().expect("no worker panics holding the index");
                    let index = *next;
                    *next += 1;
                    index
                };
                let Some(entry) = selected.get(index) else { break };
                let outcome = install(ctx, entry);
                let alerts = outcome.alerts.len();
                let worst = outcome.alerts.iter().map(|a| a.severity.as_str()).max_by_key(|s| severity_rank(s));
                println!(
                    "corpus: [{}/{}] {} {} {}: {} in {:.0}s, {alerts} alert(s){}{}",
                    index + 1,
                    selected.len(),
                    entry.eco.key(),
                    entry.spec(),
                    outcome.version.as_deref().map(|v| format!("-> {v}")).unwrap_or_default(),
                    outcome.status.key(),
                    outcome.seconds,
                    worst.map(|w| format!(", worst {w}")).unwrap_or_default(),
                    outcome.reason.as_deref().map(|r| format!(" ({})", r.escape_debug())).unwrap_or_default(),
                );
                let snapshot: Vec<Outcome> = {
                    let mut results = results.lock().expect("no worker panics holding the results");
                    results[index] = Some(outcome);
                    results.iter().flatten().cloned().collect()
                };
                let _guard = report_lock.lock().expect("no worker panics holding the report");
                if let Err(error) = report(&snapshot) {
                    eprintln!("corpus: writing the report: {error:#}");
                }
            });
        }
    });
    results.into_inner().expect("workers finished").into_iter().flatten().collect()
}

fn write_outputs(out: &Path, outcomes: &[Outcome], header: &[String]) -> Result<()> {
    let tables = aggregate(outcomes);
    let md_path = out.join("corpus.md");
    fs::write(&md_path, markdown(&tables, outcomes, header))
        .with_context(|| format!("writing {}", md_path.display()))?;
    let json_path = out.join("corpus.json");
    let text = serde_json::to_string_pretty(&to_json(&tables, outcomes, header)).context("serialising corpus.json")?;
    fs::write(&json_path, text + "\n").with_context(|| format!("writing {}", json_path.display()))
}

/// Packages built from sdists are cached as wheels by pip and uv: a re-run would install the
/// cached wheel and build nothing. Downloads (sdists, build dependencies) stay cached.
fn forget_built_wheels(cache: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(cache.join("pip/wheels"));
    let uv = cache.join("uv");
    for entry in fs::read_dir(&uv).with_context(|| format!("reading {}", uv.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("sdists-") || name.starts_with("built-wheels-") {
            fs::remove_dir_all(entry.path()).with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    Ok(())
}

pub(crate) fn python_executable() -> Result<PathBuf> {
    let output = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .context("running python3 (needed for the pip and uv installs)")?;
    if !output.status.success() {
        bail!("python3 -c 'import sys' failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
}

/// uv from PATH, else from PyPI into target/corpus/tools (set-up, not measured).
fn ensure_uv(ctx: &Ctx) -> Result<PathBuf> {
    if let Some(uv) = crate::toolchain::find_in_path("uv") {
        return Ok(uv);
    }
    let tools = crate::workspace().join("target/corpus/tools/uv");
    let uv = tools.join("bin/uv");
    if uv.is_file() {
        return Ok(uv);
    }
    let home = ctx.work.join("setup-home");
    fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
    let mut command = Command::new(&ctx.python);
    command
        .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
        .arg(&tools)
        .arg(format!("uv=={UV_VERSION}"));
    sandbox_env(&mut command, ctx, &home, &ctx.work);
    crate::run(&format!("install uv {UV_VERSION} from PyPI into {}", tools.display()), &mut command)?;
    if !uv.is_file() {
        bail!("installing uv left no {}", uv.display());
    }
    Ok(uv)
}

/// A clean environment: PATH, a throwaway HOME and XDG dirs, package caches under
/// target/corpus/cache, and nothing from the real environment (tokens, the real HOME).
fn sandbox_env(command: &mut Command, ctx: &Ctx, home: &Path, tmp: &Path) {
    command
        .env_clear()
        .env("PATH", &ctx.path)
        .env("HOME", home)
        .env("USER", "root")
        .env("LANG", "C.UTF-8")
        .env("TMPDIR", tmp)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_STATE_HOME", home.join(".local/state"))
        .env("npm_config_userconfig", home.join(".npmrc"))
        .env("npm_config_cache", ctx.cache.join("npm"))
        .env("npm_config_audit", "false")
        .env("npm_config_fund", "false")
        .env("npm_config_update_notifier", "false")
        // npm ≥ 11.12 runs dependencies' install scripts only when allowed; the corpus is about them.
        .env("npm_config_dangerously_allow_all_scripts", "true")
        .env("CARGO_HOME", home.join(".cargo"))
        .env("CARGO_BUILD_JOBS", ctx.build_jobs.to_string())
        .env("CARGO_TERM_COLOR", "never")
        .env("PIP_CONFIG_FILE", "/dev/null")
        .env("PIP_CACHE_DIR", ctx.cache.join("pip"))
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("PIP_NO_INPUT", "1")
        .env("PYTHONNOUSERSITE", "1")
        .env("UV_CACHE_DIR", ctx.cache.join("uv"))
        .env("UV_NO_CONFIG", "1")
        .env("UV_PYTHON_DOWNLOADS", "never")
        .env("NO_COLOR", "1")
        .env("MAKEFLAGS", format!("-j{}", ctx.build_jobs));
    if let Some(dir) = &ctx.node_dir {
        command.env("npm_config_nodedir", dir);
    }
    // The machine's trust store and proxy: the registries may be reached only through them.
    for name in PASSED_THROUGH {
        if let Some(value) = env::var_os(name) {
            command.env(name, value);
        }
    }
}

/// Environment variables kept from the real environment (paths to CA bundles, proxies).
pub(crate) const PASSED_THROUGH: &[&str] = &[
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
];

fn install(ctx: &Ctx, entry: &Entry) -> Outcome {
    let started = Instant::now();
    let mut outcome = Outcome {
        eco: entry.eco,
        name: entry.name.clone(),
        requested: entry.version.clone(),
        version: None,
        status: Status::Failed,
        reason: None,
        seconds: 0.0,
        install_code: None,
        alerts: Vec::new(),
    };
    let dir = ctx.work.join(entry.eco.key()).join(entry.slug());
    let alerts_file = ctx.out.join("alerts").join(entry.eco.key()).join(format!("{}.jsonl", entry.slug()));
    let log = ctx.out.join("logs").join(entry.eco.key()).join(format!("{}.log", entry.slug()));
    match run_install(ctx, entry, &dir, &alerts_file, &log, &mut outcome) {
        Ok(()) => {}
        Err(error) => {
            outcome.status = Status::Failed;
            outcome.reason = Some(format!("{error:#}"));
        }
    }
    let places = [
        (dir.join("home").display().to_string(), "~"),
        (dir.display().to_string(), "$INSTALL"),
        (ctx.cache.display().to_string(), "$CACHE"),
    ];
    if let Ok(text) = fs::read_to_string(&alerts_file) {
        for (number, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            match parse_alert(line, &places) {
                Ok(alert) => outcome.alerts.push(alert),
                Err(error) => eprintln!("corpus: {}:{}: {error:#}", alerts_file.display(), number + 1),
            }
        }
    }
    let _ = fs::remove_dir_all(&dir);
    outcome.seconds = started.elapsed().as_secs_f64();
    outcome
}

fn run_install(
    ctx: &Ctx,
    entry: &Entry,
    dir: &Path,
    alerts_file: &Path,
    log: &Path,
    outcome: &mut Outcome,
) -> Result<()> {
    let _ = fs::remove_dir_all(dir);
    let _ = fs::remove_file(alerts_file);
    let home = dir.join("home");
    let project = dir.join("project");
    let tmp = dir.join("tmp");
    for (relative, text) in FAKE_CREDENTIALS {
        let path = home.join(relative);
        fs::create_dir_all(path.parent().expect("credential files are under HOME"))?;
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    fs::create_dir_all(&project)?;
    fs::create_dir_all(&tmp)?;
    // The fake HOME's cargo uses the shared registry cache.
    for shared in ["registry", "git"] {
        std::os::unix::fs::symlink(ctx.cache.join("cargo").join(shared), home.join(".cargo").join(shared))
            .context("linking the cargo cache into the fake HOME")?;
    }
    let version = entry.version.as_deref();
    let install: Vec<OsString> = match entry.eco {
        Eco::Npm => {
            fs::write(
                project.join("package.json"),
                r#"{ "name": "credwatch-corpus-probe", "version": "1.0.0", "private": true }"#,
            )?;
            vec![ctx.npm.clone().into(), "install".into(), "--no-audit".into(), "--no-fund".into(), entry.spec().into()]
        }
        Eco::Pip => {
            let requirement = version.map_or_else(|| entry.name.clone(), |v| format!("{}=={v}", entry.name));
            // Only the package itself from its sdist; its build dependencies come as wheels, as
            // a user's would.
            let mut args: Vec<OsString> = vec![ctx.python.clone().into(), "-m".into(), "pip".into(), "install".into()];
            args.extend(["--no-binary", &entry.name, "--no-deps", "--target"].map(OsString::from));
            args.push(project.join("site-packages").into());
            args.push(requirement.into());
            args
        }
        Eco::Uv => {
            let uv = ctx.uv.as_ref().context("uv was not set up")?;
            let venv = project.join(".venv");
            let mut setup = Command::new(uv);
            setup.arg("venv").arg(&venv).arg("--python").arg(&ctx.python).current_dir(&project);
            sandbox_env(&mut setup, ctx, &home, &tmp);
            let output = setup.output().context("running uv venv")?;
            if !output.status.success() {
                bail!("set-up: uv venv failed: {}", first_error(&String::from_utf8_lossy(&output.stderr)));
            }
            let requirement = version.map_or_else(|| entry.name.clone(), |v| format!("{}=={v}", entry.name));
            let mut args: Vec<OsString> = vec![uv.clone().into(), "pip".into(), "install".into(), "--python".into()];
            args.push(venv.join("bin/python").into());
            args.extend(["--no-binary", &entry.name, "--no-deps", &requirement].map(OsString::from));
            args
        }
        Eco::Cargo => {
            let requirement = version.map_or_else(|| "*".to_owned(), |v| format!("={v}"));
            fs::write(
                project.join("Cargo.toml"),
                format!(
                    "[package]\nname = \"credwatch-corpus-probe\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
                     [dependencies]\n\"{}\" = \"{requirement}\"\n\n# Its own workspace, wherever it is.\n[workspace]\n",
                    entry.name
                ),
            )?;
            fs::create_dir_all(project.join("src"))?;
            fs::write(project.join("src/lib.rs"), "")?;
            vec![ctx.cargo.clone().into(), "build".into()]
        }
    };

    let log_file = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut command = Command::new(&ctx.binary);
    command
        .args(["run", "--json", "--linger", LINGER_SECS, "--alerts"])
        .arg(alerts_file)
        .args(ctx.contain.then_some("--contain"))
        .args(ctx.contain_net.then_some(["--contain-net", "registries"]).into_iter().flatten())
        .arg("--")
        .args(&install)
        .current_dir(&project)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        // Its own process group, so that a timeout kills the whole install.
        .process_group(0);
    sandbox_env(&mut command, ctx, &home, &tmp);
    let mut child = command.spawn().with_context(|| format!("starting {}", ctx.binary.display()))?;
    let deadline = Instant::now() + ctx.timeout;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the install")? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            // SAFETY: kill(2) on the process group we created for this install.
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(200));
    };
    let text = fs::read_to_string(log).unwrap_or_default();
    outcome.version = resolved_version(entry, &project, &text);
    if entry.eco == Eco::Npm {
        outcome.install_code = npm_install_code(&project.join("node_modules").join(&entry.name));
    }
    let Some(status) = status else {
        outcome.status = Status::TimedOut;
        outcome.reason = Some(format!("killed after {} s", ctx.timeout.as_secs()));
        return Ok(());
    };
    let succeeded = match status.code() {
        Some(0) => true,
        // An alert hides the install's own status: look at what the tool said.
        Some(EXIT_ALERT) => install_succeeded(entry, &project, &text),
        _ => false,
    };
    outcome.status = if succeeded { Status::Installed } else { Status::Failed };
    if !succeeded {
        outcome.reason = Some(format!("{}: {}", exit_text(status), first_error(&text)));
    }
    Ok(())
}

pub(crate) fn exit_text(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        _ => "ended".to_owned(),
    }
}

/// Whether the install went through, from what the package manager printed (and left behind).
pub fn install_succeeded(entry: &Entry, project: &Path, log: &str) -> bool {
    match entry.eco {
        Eco::Npm => {
            !log.lines().any(|l| l.starts_with("npm error") || l.starts_with("npm ERR!"))
                && project.join("node_modules").join(&entry.name).join("package.json").is_file()
        }
        Eco::Pip => log.lines().any(|l| l.starts_with("Successfully installed")),
        Eco::Uv => log.lines().any(|l| l.trim_start().starts_with("+ ")),
        Eco::Cargo => log.lines().any(|l| l.trim_start().starts_with("Finished ")),
    }
}

/// What a failed install's output says went wrong, most telling first: a compiler's fatal
/// error, node-gyp's configure error, an `Error:` line, rustc/pip/uv `error:` lines, npm's lines.
const ERROR_MARKS: &[&str] =
    &["fatal error", "gyp: ", "Error: ", "error: ", "error[", "ERR! stack Error", "npm error ", "ERROR"];
/// Lines that say that something failed without saying what.
const UNTELLING: &[&str] = &[
    "npm error code",
    "npm error path",
    "npm error command",
    "npm error gyp info",
    "npm error A complete log",
    "subprocess-exited-with-error",
    "This error originates from a subprocess",
    "ERROR: Failed building wheel",
    "ERROR: Could not build wheels",
    "error: failed-wheel-build-for-install",
];

/// The most telling error line of the output, else its last line.
pub fn first_error(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("credwatch: ") && !UNTELLING.iter().any(|u| l.contains(u)))
        .collect();
    let line = ERROR_MARKS
        .iter()
        .find_map(|mark| lines.iter().find(|l| l.contains(mark)))
        .or(lines.last())
        .copied()
        .unwrap_or("no output");
    match line.char_indices().nth(REASON_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

fn resolved_version(entry: &Entry, project: &Path, log: &str) -> Option<String> {
    match entry.eco {
        Eco::Npm => {
            let manifest =
                fs::read_to_string(project.join("node_modules").join(&entry.name).join("package.json")).ok()?;
            let manifest: Value = serde_json::from_str(&manifest).ok()?;
            manifest.get("version")?.as_str().map(str::to_owned)
        }
        Eco::Pip => pip_version(&entry.name, log),
        Eco::Uv => uv_version(&entry.name, log),
        Eco::Cargo => cargo_lock_version(&entry.name, &fs::read_to_string(project.join("Cargo.lock")).ok()?),
    }
}

/// `Successfully installed name-1.2.3` (pip normalises the name).
pub fn pip_version(name: &str, log: &str) -> Option<String> {
    let wanted = normalise_name(Eco::Pip, name);
    log.lines().filter_map(|l| l.strip_prefix("Successfully installed ")).flat_map(str::split_whitespace).find_map(
        |item| {
            let (installed, version) = item.rsplit_once('-')?;
            (normalise_name(Eco::Pip, installed) == wanted).then(|| version.to_owned())
        },
    )
}

/// ` + name==1.2.3`.
pub fn uv_version(name: &str, log: &str) -> Option<String> {
    let wanted = normalise_name(Eco::Uv, name);
    log.lines().filter_map(|l| l.trim_start().strip_prefix("+ ")).find_map(|item| {
        let (installed, version) = item.trim().split_once("==")?;
        (normalise_name(Eco::Uv, installed) == wanted).then(|| version.to_owned())
    })
}

/// The version of `name` in a Cargo.lock (`[[package]]` tables of `name = "..."`, `version = "..."`).
pub fn cargo_lock_version(name: &str, lock: &str) -> Option<String> {
    let quoted = |line: &str, key: &str| {
        line.strip_prefix(key)?
            .trim_start()
            .strip_prefix('=')?
            .trim()
            .strip_prefix('"')?
            .strip_suffix('"')
            .map(str::to_owned)
    };
    let mut current: Option<String> = None;
    for line in lock.lines() {
        if line.starts_with("[[package]]") {
            current = None;
        } else if let Some(found) = quoted(line, "name") {
            current = Some(found);
        } else if let Some(version) = quoted(line, "version") {
            if current.as_deref() == Some(name) {
                return Some(version);
            }
        }
    }
    None
}

/// Whether an installed npm package has install scripts or a binding.gyp of its own.
fn npm_install_code(package: &Path) -> Option<bool> {
    let manifest: Value = serde_json::from_str(&fs::read_to_string(package.join("package.json")).ok()?).ok()?;
    let scripts = manifest.get("scripts");
    let has_script = ["preinstall", "install", "postinstall"].iter().any(|s| scripts.and_then(|x| x.get(s)).is_some());
    Some(
        has_script
            || manifest.get("gypfile").and_then(Value::as_bool) == Some(true)
            || package.join("binding.gyp").is_file(),
    )
}

pub(crate) fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_versions_and_npm_scopes() {
        let text = "# header\n\nnpm esbuild@0.28.2\nnpm @swc/core@1.15.3\nnpm @swc/helpers\npip PyYAML\ncargo serde_derive@1.0.228\n";
        let entries = parse_list(text, "list.txt").unwrap();
        let specs: Vec<(Eco, &str, Option<&str>, usize)> =
            entries.iter().map(|e| (e.eco, e.name.as_str(), e.version.as_deref(), e.line)).collect();
        assert_eq!(
            specs,
            [
                (Eco::Npm, "esbuild", Some("0.28.2"), 3),
                (Eco::Npm, "@swc/core", Some("1.15.3"), 4),
                (Eco::Npm, "@swc/helpers", None, 5),
                (Eco::Pip, "PyYAML", None, 6),
                (Eco::Cargo, "serde_derive", Some("1.0.228"), 7),
            ]
        );
    }

    fn error(text: &str) -> String {
        format!("{:#}", parse_list(text, "xtask/corpus/p.txt").unwrap_err())
    }

    #[test]
    fn errors_name_file_and_line() {
        assert_eq!(
            error("# ok\nnpm a\ngem rails\n"),
            "xtask/corpus/p.txt:3: unknown ecosystem \"gem\" (expected one of npm, pip, uv, cargo)"
        );
        assert!(error("npm\n").starts_with("xtask/corpus/p.txt:1: expected `ECOSYSTEM NAME[@VERSION]` (two words)"));
        assert!(error("\n\npip a b\n").starts_with("xtask/corpus/p.txt:3: expected"));
        assert_eq!(error("npm esbuild@\n"), "xtask/corpus/p.txt:1: empty version after `@` in \"esbuild@\"");
        assert_eq!(error("cargo a@1;rm\n"), "xtask/corpus/p.txt:1: character ';' in version \"1;rm\"");
        assert_eq!(error("npm @scope\n"), "xtask/corpus/p.txt:1: invalid npm package name \"@scope\"");
        assert_eq!(error("pip ../x\n"), "xtask/corpus/p.txt:1: invalid pip package name \"../x\"");
        assert_eq!(error("cargo @a/b\n"), "xtask/corpus/p.txt:1: invalid cargo package name \"@a/b\"");
        // PyPI and crates.io names compare normalised.
        assert_eq!(
            error("pip PyYAML\nuv pyyaml\npip pyyaml\n"),
            "xtask/corpus/p.txt:3: pip pyyaml is listed already, at line 1"
        );
        assert_eq!(error("cargo a-b\ncargo a_b\n"), "xtask/corpus/p.txt:2: cargo a_b is listed already, at line 1");
    }

    #[test]
    fn the_checked_in_list_parses_and_is_large_enough() {
        let path = crate::workspace().join(DEFAULT_LIST);
        let entries = parse_list(&fs::read_to_string(&path).unwrap(), DEFAULT_LIST).unwrap();
        let count = |eco| entries.iter().filter(|e| e.eco == eco).count();
        assert!(entries.len() >= 300, "{} packages", entries.len());
        assert!(count(Eco::Npm) >= 150 && count(Eco::Pip) + count(Eco::Uv) >= 100 && count(Eco::Cargo) >= 60);
    }

    #[test]
    fn the_contain_sample_is_a_subset_of_the_list_at_its_versions() {
        let read = |list: &str| {
            let text = fs::read_to_string(crate::workspace().join(list)).unwrap();
            parse_list(&text, list).unwrap().into_iter().map(|e| (e.eco, e.name, e.version))
        };
        let all: BTreeSet<_> = read(DEFAULT_LIST).collect();
        let sample: Vec<_> = read("xtask/corpus/contain-sample.txt").collect();
        assert!((70..=100).contains(&sample.len()), "{} packages", sample.len());
        for eco in Eco::ALL {
            assert!(sample.iter().filter(|(e, _, _)| *e == eco).count() >= 8, "{}", eco.key());
        }
        let strays: Vec<_> = sample.iter().filter(|entry| !all.contains(entry)).collect();
        assert!(strays.is_empty(), "not in {DEFAULT_LIST} at that version: {strays:?}");
    }

    #[test]
    fn contain_net_is_a_contained_run_with_its_own_report() {
        let run = |args: &[&str]| {
            let options = parse_options(args).unwrap();
            (options.contain, options.contain_net, out_dir_name(&options))
        };
        assert_eq!(run(&[]), (false, false, "corpus".to_owned()));
        assert_eq!(run(&["--contain"]), (true, false, "corpus-contain".to_owned()));
        assert_eq!(run(&["--contain-net"]), (true, true, "corpus-contain-net".to_owned()));
        assert_eq!(run(&["--contain", "--contain-net"]), (true, true, "corpus-contain-net".to_owned()));
        let sample = crate::workspace().join("xtask/corpus/contain-sample.txt");
        let sample = sample.to_str().unwrap();
        assert_eq!(run(&["--list", sample]).2, "contain-sample");
        assert_eq!(run(&["--contain-net", "--list", sample]).2, "contain-sample-contain-net");
    }

    #[test]
    fn pins_resolved_versions_and_keeps_the_rest() {
        let text = "# h\nnpm a\nnpm @s/b@1\n\npip c\n";
        let entries = parse_list(text, "l").unwrap();
        let resolved = HashMap::from([
            ((Eco::Npm, "a".to_owned()), "2.0.0".to_owned()),
            ((Eco::Npm, "@s/b".to_owned()), "1.4.0".to_owned()),
        ]);
        assert_eq!(pin_list(text, &entries, &resolved), "# h\nnpm a@2.0.0\nnpm @s/b@1.4.0\n\npip c\n");
    }

    fn alert(rule: &str, severity: &str, package: &str, target: &str) -> AlertLine {
        AlertLine { rule: rule.into(), severity: severity.into(), package: package.into(), target: target.into() }
    }

    fn outcome(eco: Eco, name: &str, status: Status, alerts: Vec<AlertLine>) -> Outcome {
        Outcome {
            eco,
            name: name.into(),
            requested: None,
            version: None,
            status,
            reason: None,
            seconds: 1.0,
            install_code: (eco == Eco::Npm).then_some(true),
            alerts,
        }
    }

    #[test]
    fn aggregates_per_ecosystem_rule_and_package() {
        let npmrc = || alert("npm-registry-token", "high", "gifsicle@7.0.1 (postinstall)", "~/.npmrc");
        let outcomes = vec![
            outcome(
                Eco::Npm,
                "gifsicle",
                Status::Installed,
                vec![npmrc(), npmrc(), alert("x", "low", "p@1", "exec: a")],
            ),
            outcome(Eco::Npm, "imagemin-gifsicle", Status::Failed, vec![npmrc()]),
            outcome(Eco::Npm, "esbuild", Status::Installed, vec![]),
            outcome(
                Eco::Pip,
                "markupsafe",
                Status::Installed,
                vec![
                    alert("python-pth-write", "medium", "(pip tree, no package)", "$INSTALL/a.pth"),
                    alert("python-pth-write", "medium", "(pip tree, no package)", "$INSTALL/b.pth"),
                ],
            ),
            outcome(Eco::Pip, "six", Status::TimedOut, vec![alert("y", "low", "six@1", "exec: b")]),
            outcome(Eco::Cargo, "ring", Status::Installed, vec![]),
        ];
        let tables = aggregate(&outcomes);
        assert_eq!((tables.medium_or_higher, tables.tried), (3, 6));
        let npm = &tables.ecosystems[&Eco::Npm];
        assert_eq!((npm.tried, npm.installed, npm.failed, npm.timed_out, npm.with_install_code), (3, 2, 1, 0, 3));
        assert_eq!(npm.by_severity, BTreeMap::from([("high".to_owned(), 2)]));
        let pip = &tables.ecosystems[&Eco::Pip];
        assert_eq!((pip.timed_out, pip.medium_or_higher), (1, 1));
        assert_eq!(pip.by_severity, BTreeMap::from([("medium".to_owned(), 1), ("low".to_owned(), 1)]));
        assert_eq!(tables.ecosystems[&Eco::Cargo].by_severity.len(), 0);

        // Highest severity first; one row per (rule, severity, package), its installs counted.
        let rows: Vec<(&str, &str, usize, usize)> =
            tables.rows.iter().map(|r| (r.rule.as_str(), r.severity.as_str(), r.count, r.installs.len())).collect();
        assert_eq!(
            rows,
            [
                ("npm-registry-token", "high", 3, 2),
                ("python-pth-write", "medium", 2, 1),
                ("x", "low", 1, 1),
                ("y", "low", 1, 1)
            ]
        );
        assert_eq!(tables.rows[0].examples, ["~/.npmrc"]);
        assert_eq!(tables.rows[1].examples, ["$INSTALL/a.pth", "$INSTALL/b.pth"]);

        let text = markdown(&tables, &outcomes, &["run".to_owned()]);
        assert!(text.contains("**Packages with medium-or-higher alerts: 3 of 6.**"), "{text}");
        assert!(text.contains("| npm | 3 | 2 | 1 | 0 | 0 | 2 | 0 | 0 | 2 |"), "{text}");
        assert!(text.contains("| pip | six | timed out |"), "{text}");
        assert!(
            text.contains("npm: 3 packages have install scripts or a binding.gyp of their own, 0 have none"),
            "{text}"
        );
        let json = to_json(&tables, &outcomes, &[]);
        assert_eq!(json["headline"], json!({ "medium_or_higher": 3, "tried": 6 }));
        assert_eq!(json["ecosystems"]["pip"]["timed_out"], 1);
    }

    #[test]
    fn reads_an_alert_with_short_places() {
        let line = r#"{"rule":{"id":"npm-registry-token","severity":"high"},"package":{"manager":"npm","name":"gifsicle","version":"7.0.1","lifecycle":"postinstall"},"file":{"path":"/tmp/c/npm/gifsicle/home/.npmrc"},"process":{"args":["node","x"]}}"#;
        let places = [("/tmp/c/npm/gifsicle/home".to_owned(), "~"), ("/tmp/c/npm/gifsicle".to_owned(), "$INSTALL")];
        assert_eq!(
            parse_alert(line, &places).unwrap(),
            alert("npm-registry-token", "high", "gifsicle@7.0.1 (postinstall)", "~/.npmrc")
        );
        let exec = r#"{"rule":{"id":"exec-of-written-file","severity":"medium"},"package":{"manager":"pip","name":null},"process":{"args":["./conftest","/tmp/c/npm/gifsicle/project"]}}"#;
        assert_eq!(
            parse_alert(exec, &places).unwrap(),
            alert("exec-of-written-file", "medium", "(pip tree, no package)", "exec: ./conftest $INSTALL/project")
        );
        let connect = r#"{"rule":{"id":"exfiltration","severity":"critical"},"package":{"manager":"npm","name":"gif2webp-bin","version":"5.0.0"},"destination":{"address":"127.0.0.1","port":80,"domain":"raw.github.com"},"process":{"args":["node","lib/install.js"]}}"#;
        assert_eq!(parse_alert(connect, &places).unwrap().target, "connect: raw.github.com (127.0.0.1:80)");
        assert_eq!(format!("{:#}", parse_alert("{}", &places).unwrap_err()), "no rule.id");
        assert!(parse_alert("nope", &places).is_err());
    }

    #[test]
    fn table_cells_are_escaped() {
        assert_eq!(md("a|b`c<d>\x1b[0m_*"), "a\\|b'c&lt;d&gt;\\u{1b}\\[0m\\_\\*");
    }

    #[test]
    fn versions_and_errors_from_the_managers_output() {
        assert_eq!(pip_version("PyYAML", "x\nSuccessfully installed PyYAML-6.0.3\n").as_deref(), Some("6.0.3"));
        assert_eq!(
            pip_version("ruamel.yaml.clib", "Successfully installed ruamel.yaml.clib-0.2.14").as_deref(),
            Some("0.2.14")
        );
        assert_eq!(
            uv_version("markupsafe", "Installed 1 package in 3ms\n + markupsafe==3.0.3\n").as_deref(),
            Some("3.0.3")
        );
        let lock = "[[package]]\nname = \"libc\"\nversion = \"0.2.177\"\n\n[[package]]\nname = \"ring\"\nversion = \"0.17.14\"\nsource = \"x\"\n";
        assert_eq!(cargo_lock_version("ring", lock).as_deref(), Some("0.17.14"));
        assert_eq!(cargo_lock_version("serde", lock), None);
        assert_eq!(first_error("npm error code 1\nnpm error path /x\nnpm error it broke\nmore"), "npm error it broke");
        let gyp = "npm error gyp info spawn\nnpm error Package pixman-1 was not found\nnpm error gyp: Call to 'pkg-config pixman-1' failed\nnpm error gyp ERR! stack Error: `gyp` failed";
        assert_eq!(first_error(gyp), "npm error gyp: Call to 'pkg-config pixman-1' failed");
        let pip = "error: subprocess-exited-with-error\n  x.c:1:10: fatal error: pixman.h: No such file\nERROR: Failed building wheel for x\n";
        assert_eq!(first_error(pip), "x.c:1:10: fatal error: pixman.h: No such file");
        assert_eq!(first_error("compiling\nerror: linker `cc` not found\n"), "error: linker `cc` not found");
        assert_eq!(first_error("a\nlast line\n\n"), "last line");
        let pip = Entry { eco: Eco::Pip, name: "six".into(), version: None, line: 1 };
        assert!(install_succeeded(&pip, Path::new("/nonexistent"), "Successfully installed six-1.17.0"));
        assert!(!install_succeeded(&pip, Path::new("/nonexistent"), "ERROR: Failed building wheel"));
    }
}
