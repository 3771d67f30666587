//! The incident page as one HTML file: inline CSS and SVG, no script, nothing fetched. A
//! Content-Security-Policy allows the one style block (by its hash) and nothing else.
//!
//! Markup is written only from `&'static str` ([`Html::markup`]); anything else reaches the
//! page through [`Html::text`] (every string from the monitored system, cut and escaped by
//! [`visible`]) or [`Html::number`]. So no string from the traced system can become an element
//! or an attribute, whatever it holds.

use std::{collections::BTreeSet, fmt::Write as _};

use base64::Engine as _;
use sha2::Digest as _;
use time::OffsetDateTime;

use super::{Connection, Entry, Incident, Kind, Tree, TreeKey, Verdict};
use crate::{alert::Severity, output::escape};

/// Characters of one string shown before it is cut with a count of the rest (a 4 KiB path
/// shows its first 1,000).
const TEXT_LIMIT: usize = 1_000;
/// Characters of a process's label drawn in the SVG (the timeline has the whole command).
const SVG_LABEL_LIMIT: usize = 48;
/// Packages with alerts given a verdict card; the rest are counted.
const VERDICTS_SHOWN: usize = 12;
/// Packages without alerts named; the rest are counted.
const QUIET_SHOWN: usize = 20;
/// Trees drawn with their timelines (those with alerts first, worst first).
const TREES_SHOWN: usize = 6;
/// Processes drawn per tree: those that alerted and their ancestors first, then the rest in
/// tree order; the others are counted.
const PROCESSES_DRAWN: usize = 40;
/// Deepest indentation drawn: deeper processes are drawn at this depth.
const DEPTH_DRAWN: usize = 12;
/// A run of entries without an alert longer than this is folded after its first few.
const FOLD_AFTER: usize = 8;
/// Entries shown before a fold.
const FOLD_SHOWN: usize = 4;
/// Places (host, container, pod, CI job) listed; the rest are counted.
const PLACES_SHOWN: usize = 50;
/// Hosts named after an item to rotate.
const HOSTS_SHOWN: usize = 10;

/// The SVG's geometry: one row per process, indented by depth.
const ROW: f64 = 26.0;
const INDENT: f64 = 20.0;
const PAD: f64 = 10.0;
/// The width of a character of the labels' monospace font at 12px (0.6 em), with room for a
/// browser that rounds glyphs up when the drawing is scaled down to fit a phone.
const CHAR_WIDTH: f64 = 7.8;

/// What the page was made from, for its first lines.
pub enum Origin {
    /// `replay --report --report-format html` of `files` trace files.
    Replay { files: usize },
    /// `fleet report --format html`: the report's repeats dropped and hosts.
    Fleet { repeats: u64, hosts: usize },
    /// `show SEQ --html`: alert `seq` of the local alert log and its tree's others.
    Show { seq: u64 },
}

const STYLE: &str = r#"
:root{color-scheme:light dark;--bg:#f4f6f8;--card:#fff;--fg:#1a1e23;--muted:#5c6670;--line:#d9dee4;--soft:#eef1f4;--accent:#0b63ce;--critical:#b3001e;--high:#d1430b;--medium:#9a6700;--low:#1f7a74;--node:#8a95a1}
@media (prefers-color-scheme:dark){:root{--bg:#0e1114;--card:#171b20;--fg:#e4e8ec;--muted:#9aa5b1;--line:#2b323a;--soft:#20262d;--accent:#6db3ff;--critical:#ff5470;--high:#ff8747;--medium:#e7b545;--low:#4fc4bc;--node:#6c7783}.badge{color:#0e1114}}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%;text-size-adjust:100%}
body{margin:0;background:var(--bg);color:var(--fg);font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans",sans-serif;overflow-wrap:anywhere}
header,main,footer{max-width:1120px;margin:0 auto;padding:0 16px}
header{padding-top:28px}
.brand{margin:0;color:var(--muted);font-size:12px;font-weight:600;letter-spacing:.09em;text-transform:uppercase}
h1{font-size:26px;line-height:1.25;margin:8px 0 6px}
h2{font-size:18px;margin:0 0 12px}
h3{font-size:15px;margin:18px 0 8px}
p{margin:6px 0}
.lede{color:var(--muted);margin:0 0 8px}
section{background:var(--card);border:1px solid var(--line);border-radius:12px;padding:18px 20px;margin:18px 0}
code,.mono,.pid,time{font-family:ui-monospace,"SF Mono",Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:13px}
code{background:var(--soft);border-radius:4px;padding:1px 5px}
.muted,.more{color:var(--muted)}
.more{font-size:13px}
.badge{display:inline-block;border-radius:5px;padding:0 7px;font-size:11.5px;font-weight:700;line-height:19px;text-transform:uppercase;letter-spacing:.04em;color:#fff;background:var(--node);vertical-align:2px;white-space:nowrap}
.badge.sev-critical{background:var(--critical)}.badge.sev-high{background:var(--high)}.badge.sev-medium{background:var(--medium)}.badge.sev-low{background:var(--low)}
.badge.selftest{background:var(--accent)}
.verdicts{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,320px),1fr));gap:14px}
.verdict{border:1px solid var(--line);border-left:5px solid var(--node);border-radius:10px;padding:12px 14px;background:var(--card)}
.verdict.sev-critical{border-left-color:var(--critical)}.verdict.sev-high{border-left-color:var(--high)}.verdict.sev-medium{border-left-color:var(--medium)}.verdict.sev-low{border-left-color:var(--low)}
.verdict h3{margin:6px 0;font-size:17px}
.manager{color:var(--muted);font-size:13px;margin-left:6px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:3px 12px;margin:8px 0 0}
dt{color:var(--muted);font-size:13px}
dd{margin:0;min-width:0}
.checklist{list-style:none;padding:0;margin:0}
.checklist li{border-top:1px solid var(--line)}
.checklist li:first-child{border-top:0}
.checklist label{display:flex;gap:12px;align-items:flex-start;padding:9px 2px;cursor:pointer}
.checklist input{width:19px;height:19px;margin:2px 0 0;flex:none;accent-color:var(--accent)}
.checklist input:checked+span{text-decoration:line-through;color:var(--muted)}
.hosts{display:block;color:var(--muted);font-size:13px}
.tree{border-top:1px solid var(--line);padding-top:8px;margin-top:8px}
.tree:first-of-type{border-top:0;margin-top:0;padding-top:0}
.process-tree{margin:8px 0 14px;padding:8px;background:var(--soft);border-radius:8px;overflow:hidden}
.process-tree svg{display:block;max-width:100%;height:auto}
.process-tree text{font-family:ui-monospace,"SF Mono",Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12px;fill:var(--fg);text-rendering:geometricPrecision}
.process-tree .edge{fill:none;stroke:var(--node);stroke-width:1.4}
.process-tree circle{fill:var(--card);stroke:var(--node);stroke-width:2}
.process-tree .sev-critical circle{fill:var(--critical);stroke:var(--critical)}.process-tree .sev-high circle{fill:var(--high);stroke:var(--high)}.process-tree .sev-medium circle{fill:var(--medium);stroke:var(--medium)}.process-tree .sev-low circle{fill:var(--low);stroke:var(--low)}
.process-tree .sev-critical text,.process-tree .sev-high text{font-weight:700}
.timeline{list-style:none;margin:0;padding:0}
.timeline li.entry{display:grid;grid-template-columns:6.6em 6.2em minmax(0,1fr);gap:0 12px;padding:5px 0 5px 12px;border-left:3px solid var(--line);margin-left:2px}
.timeline li.sev-critical{border-left-color:var(--critical)}.timeline li.sev-high{border-left-color:var(--high)}.timeline li.sev-medium{border-left-color:var(--medium)}.timeline li.sev-low{border-left-color:var(--low)}
.timeline li.sev-critical,.timeline li.sev-high{background:var(--soft)}
.timeline time{color:var(--muted);padding-top:1px}
.kind{font-size:12px;font-weight:600;text-transform:uppercase;letter-spacing:.04em;color:var(--muted);padding-top:2px}
.kind-read .kind,.kind-connect .kind{color:var(--accent)}
.kind-blind .kind{color:var(--critical)}
.what{min-width:0}
.what code{background:none;padding:0}
.detail{grid-column:3;color:var(--muted);font-size:13px}
.timeline li.fold{list-style:none;padding:3px 0 3px 12px;border-left:3px dotted var(--line);margin-left:2px}
summary{cursor:pointer;color:var(--muted);font-size:13px}
.paths,.connections,.places{list-style:none;padding:0;margin:0}
.paths li,.connections li,.places li{padding:7px 0;border-top:1px solid var(--line)}
.paths li:first-child,.connections li:first-child,.places li:first-child{border-top:0}
.dest{font-weight:600}
footer{color:var(--muted);font-size:12.5px;padding-bottom:28px}
@media (min-width:900px){.verdict-grid{display:grid;grid-template-columns:minmax(0,2fr) minmax(0,3fr);gap:22px;align-items:start}#rotate h3{margin-top:0}.verdicts{grid-template-columns:1fr}}
@media (max-width:640px){body{font-size:14.5px}h1{font-size:21px}section{padding:14px 12px;border-radius:10px}header,main,footer{padding-left:10px;padding-right:10px}header{padding-top:16px}.timeline li.entry{grid-template-columns:auto minmax(0,1fr);gap:0 8px}.timeline .what,.timeline .detail{grid-column:1/-1}}
"#;

/// How a cut string says it was cut.
#[derive(Clone, Copy)]
enum Cut {
    /// `… (N more characters)`.
    Counted,
    /// `…` alone: a label of the drawing (its tooltip and the timeline have the whole string).
    Ellipsis,
}

/// The one way a string from the monitored system reaches the page: its first `limit`
/// characters, escaped as the terminal shows them ([`escape`]: control characters, ANSI, NUL,
/// bidi overrides become visible `\u{..}`), then HTML-escaped.
fn visible(text: &str, limit: usize, cut: Cut) -> String {
    html_escape(&shown(text, limit, cut))
}

/// `text` cut and terminal-escaped, not yet HTML-escaped.
fn shown(text: &str, limit: usize, cut: Cut) -> String {
    match (text.char_indices().nth(limit), cut) {
        (Some((at, _)), Cut::Counted) => {
            let rest = text[at..].chars().count();
            format!("{}… ({rest} more characters)", escape(&text[..at]))
        }
        (Some((at, _)), Cut::Ellipsis) => format!("{}…", escape(&text[..at])),
        (None, _) => escape(text).into_owned(),
    }
}

fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page being written. See the module's notes: markup only from literals.
#[derive(Default)]
struct Html(String);

impl Html {
    fn markup(&mut self, markup: &'static str) -> &mut Html {
        self.0.push_str(markup);
        self
    }

    fn text(&mut self, text: &str) -> &mut Html {
        self.text_cut(text, TEXT_LIMIT, Cut::Counted)
    }

    fn text_cut(&mut self, text: &str, limit: usize, cut: Cut) -> &mut Html {
        self.0.push_str(&visible(text, limit, cut));
        self
    }

    fn number(&mut self, number: impl Number) -> &mut Html {
        number.write(&mut self.0);
        self
    }

    /// `n word` or `n words`.
    fn count(&mut self, n: u64, one: &'static str, many: &'static str) -> &mut Html {
        self.number(n).markup(" ").markup(if n == 1 { one } else { many })
    }
}

/// What [`Html::number`] writes: digits, a sign and a point, nothing else.
trait Number {
    fn write(self, out: &mut String);
}

macro_rules! integer {
    ($($t:ty),*) => {$(impl Number for $t {
        fn write(self, out: &mut String) {
            let _ = write!(out, "{self}");
        }
    })*};
}
integer!(u16, u32, u64, usize, i64);

impl Number for f64 {
    fn write(self, out: &mut String) {
        let _ = write!(out, "{self:.1}");
    }
}

fn severity_class(severity: Option<Severity>) -> &'static str {
    match severity {
        Some(Severity::Critical) => "sev-critical",
        Some(Severity::High) => "sev-high",
        Some(Severity::Medium) => "sev-medium",
        Some(Severity::Low) => "sev-low",
        None => "sev-none",
    }
}

fn kind_class(kind: Kind) -> &'static str {
    match kind {
        Kind::Exec => "kind-exec",
        Kind::Read => "kind-read",
        Kind::Write => "kind-write",
        Kind::Connect => "kind-connect",
        Kind::Lookup => "kind-lookup",
        Kind::Syscall => "kind-syscall",
        Kind::BlindSpot => "kind-blind",
    }
}

fn verb(kind: Kind) -> &'static str {
    match kind {
        Kind::Exec => "ran",
        Kind::Read => "read",
        Kind::Write => "wrote",
        Kind::Connect => "connected to",
        Kind::Lookup => "looked up",
        Kind::Syscall => "called",
        Kind::BlindSpot => "",
    }
}

fn badge(html: &mut Html, severity: Severity) {
    html.markup("<span class=\"badge ").markup(severity_class(Some(severity))).markup("\">");
    html.markup(severity.as_str()).markup("</span>");
}

/// The CSP's hash of [`STYLE`], base64.
fn style_hash() -> String {
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(STYLE.as_bytes()))
}

/// The page. Every string of `incident` is escaped on the way (see the module's notes).
pub fn render(incident: &Incident, origin: &Origin) -> String {
    let mut html = Html::default();
    let verdicts = ordered_verdicts(incident);
    let top = verdicts.iter().find(|(_, _, v)| v.worst.is_some());

    html.markup("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    html.markup("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    html.markup("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'sha256-");
    // The hash's characters are base64's own, of a literal: no input.
    html.0.push_str(&style_hash());
    html.markup("'; img-src data:\">\n<meta name=\"referrer\" content=\"no-referrer\">\n<title>credwatch incident");
    if let Some((id, _, _)) = top {
        html.markup(": ").text(id);
    }
    html.markup("</title>\n<style>").markup(STYLE).markup("</style>\n</head>\n<body>\n");

    header(&mut html, incident, origin, top.map(|(id, _, v)| (id.as_str(), *v)));
    html.markup("<main>\n");
    verdict_section(&mut html, incident, &verdicts);
    timeline_section(&mut html, incident);
    files_section(&mut html, incident);
    connections_section(&mut html, incident);
    where_section(&mut html, incident);
    html.markup("</main>\n<footer><p>Made by credwatch ").markup(env!("CARGO_PKG_VERSION"));
    html.markup(". What the monitored system wrote is shown escaped: control characters, terminal escapes and ");
    html.markup(
        "direction overrides as <code>\\u{..}</code>, a backslash as <code>\\\\</code>; a long string is cut with ",
    );
    html.markup("the count of what was left out. Lists past their limits say how much they leave out.</p></footer>\n");
    html.markup("</body>\n</html>\n");
    html.0
}

/// Packages with alerts, worst first then by name; then the others.
fn ordered_verdicts(incident: &Incident) -> Vec<(&String, &super::PackageKey, &Verdict)> {
    let mut all: Vec<_> = incident.packages.iter().map(|(id, (key, verdict))| (id, key, verdict)).collect();
    all.sort_by(|a, b| b.2.worst.cmp(&a.2.worst).then_with(|| a.0.cmp(b.0)));
    all
}

fn header(html: &mut Html, incident: &Incident, origin: &Origin, top: Option<(&str, &Verdict)>) {
    html.markup("<header id=\"summary\">\n<p class=\"brand\">credwatch · incident");
    if incident.selftest {
        html.markup(" <span class=\"badge selftest\">self-test</span>");
    }
    html.markup("</p>\n<h1>");
    match top {
        Some((id, verdict)) => {
            if let Some(worst) = verdict.worst {
                badge(html, worst);
                html.markup(" ");
            }
            html.text(id);
            if let Some((kind, what)) = &verdict.headline {
                html.markup(" ").markup(verb(*kind)).markup(" ").text_cut(what, 160, Cut::Counted);
            }
        }
        None => {
            html.markup("No alerts");
        }
    }
    html.markup("</h1>\n<p class=\"lede\">");
    match origin {
        Origin::Replay { files } => {
            html.markup("A replay of ").count(*files as u64, "trace file", "trace files").markup(": ");
            html.count(incident.events, "event", "events").markup(", ");
        }
        Origin::Fleet { repeats, hosts } => {
            html.markup("The fleet's alerts, from ").count(*hosts as u64, "host", "hosts").markup(" (");
            html.count(*repeats, "repeat", "repeats").markup(" dropped): ");
        }
        Origin::Show { seq } => {
            html.markup("Alert ").number(*seq).markup(" of the local alert log, with its tree's others: ");
        }
    }
    html.count(incident.alerts, "alert", "alerts").markup(", ");
    html.count(incident.packages.len() as u64, "package", "packages").markup(".");
    if incident.selftest {
        html.markup(" A self-test: a rehearsal on fake credentials, not an incident.");
    }
    html.markup("</p>\n</header>\n");
}

fn verdict_section(html: &mut Html, incident: &Incident, verdicts: &[(&String, &super::PackageKey, &Verdict)]) {
    html.markup("<section id=\"verdict\">\n<h2>Verdict</h2>\n<div class=\"verdict-grid\">\n<div>\n");
    let (alerted, quiet): (Vec<_>, Vec<_>) = verdicts.iter().partition(|(_, _, v)| v.worst.is_some());
    if alerted.is_empty() {
        html.markup("<p>No alerts: nothing the rules watch for was done.</p>\n");
    } else {
        html.markup("<div class=\"verdicts\">\n");
        for (_, key, verdict) in alerted.iter().take(VERDICTS_SHOWN) {
            verdict_card(html, key, verdict);
        }
        html.markup("</div>\n");
        if alerted.len() > VERDICTS_SHOWN {
            html.markup("<p class=\"more\">… and ").count(
                (alerted.len() - VERDICTS_SHOWN) as u64,
                "more package",
                "more packages",
            );
            html.markup(" with alerts.</p>\n");
        }
    }
    if !quiet.is_empty() {
        html.markup("<p class=\"more\">Ran without alerts: ");
        for (index, (id, _, _)) in quiet.iter().take(QUIET_SHOWN).enumerate() {
            if index > 0 {
                html.markup(", ");
            }
            html.markup("<code>").text(id).markup("</code>");
        }
        if quiet.len() > QUIET_SHOWN {
            html.markup(" and ").number(quiet.len() - QUIET_SHOWN).markup(" more");
        }
        html.markup(".</p>\n");
    }
    if incident.packages_not_shown > 0 {
        html.markup("<p class=\"more\">… and ").count(incident.packages_not_shown, "package", "packages");
        html.markup(" past the page's limit.</p>\n");
    }
    html.markup("</div>\n<div id=\"rotate\">\n<h3>Rotate now</h3>\n");
    if incident.rotate.is_empty() {
        html.markup("<p>Nothing to rotate: no credential was touched.</p>\n");
    } else {
        // Which hosts, only when there are several.
        let hosts: BTreeSet<&String> = incident.rotate.values().flatten().collect();
        let one_host = hosts.len() <= 1;
        html.markup("<ul class=\"checklist\">\n");
        for (item, hosts) in &incident.rotate {
            html.markup("<li><label><input type=\"checkbox\"><span>").text(item);
            if !hosts.is_empty() && !one_host {
                html.markup("<span class=\"hosts\">on ");
                hosts_list(html, hosts);
                html.markup("</span>");
            }
            html.markup("</span></label></li>\n");
        }
        html.markup("</ul>\n");
    }
    html.markup("</div>\n</div>\n</section>\n");
}

fn hosts_list(html: &mut Html, hosts: &BTreeSet<String>) {
    for (index, host) in hosts.iter().take(HOSTS_SHOWN).enumerate() {
        if index > 0 {
            html.markup(", ");
        }
        html.text(host);
    }
    if hosts.len() >= super::MAX_HOSTS {
        html.markup(" and at least ").number(hosts.len() - HOSTS_SHOWN).markup(" more hosts");
    } else if hosts.len() > HOSTS_SHOWN {
        html.markup(" and ").number(hosts.len() - HOSTS_SHOWN).markup(" more hosts");
    }
}

fn verdict_card(html: &mut Html, key: &super::PackageKey, verdict: &Verdict) {
    html.markup("<div class=\"verdict ").markup(severity_class(verdict.worst)).markup("\">\n<p>");
    if let Some(worst) = verdict.worst {
        badge(html, worst);
    }
    html.markup("<span class=\"manager\">").text(&key.manager).markup(" package</span></p>\n<h3 class=\"package\">");
    match (&key.name, &key.version) {
        (Some(name), Some(version)) => {
            html.text(name).markup("@").text(version);
        }
        (Some(name), None) => {
            html.text(name).markup(" <span class=\"muted\">(version unknown)</span>");
        }
        _ => {
            html.text(&key.manager).markup(" <span class=\"muted\">(no package named)</span>");
        }
    }
    html.markup("</h3>\n<dl>\n<dt>step</dt><dd>");
    if verdict.steps.is_empty() {
        html.markup("<span class=\"muted\">not known</span>");
    }
    for (index, step) in verdict.steps.iter().enumerate() {
        if index > 0 {
            html.markup(", ");
        }
        html.markup("<code>").text(step).markup("</code>");
    }
    html.markup("</dd>\n");
    if let Some((kind, what)) = &verdict.headline {
        html.markup("<dt>did</dt><dd>").markup(verb(*kind)).markup(" <code>").text(what).markup("</code></dd>\n");
    }
    html.markup("<dt>rules</dt><dd>");
    for (index, (id, (name, count))) in verdict.rules.iter().enumerate() {
        if index > 0 {
            html.markup("<br>");
        }
        html.text(name).markup(" <span class=\"muted\">(").text(id);
        if *count > 1 {
            html.markup(", ×").number(*count);
        }
        html.markup(")</span>");
    }
    html.markup("</dd>\n<dt>alerts</dt><dd>").count(verdict.alerts, "alert", "alerts").markup(" on ");
    if verdict.more_hosts {
        html.markup("more than ");
    }
    html.count(verdict.hosts.len() as u64, "host", "hosts").markup("</dd>\n");
    if let (Some(first), Some(last)) = (&verdict.first_seen, &verdict.last_seen) {
        html.markup("<dt>seen</dt><dd><time>");
        moment(html, first);
        html.markup("</time>");
        // To the second: an alert's time has nanoseconds.
        let second = |time: &str| time.get(..19).unwrap_or(time).to_owned();
        if second(first) != second(last) {
            html.markup(" → <time>");
            moment(html, last);
            html.markup("</time>");
        }
        html.markup("</dd>\n");
    }
    html.markup("</dl>\n</div>\n");
}

fn timeline_section(html: &mut Html, incident: &Incident) {
    html.markup("<section id=\"timeline\">\n<h2>What happened</h2>\n");
    let mut trees: Vec<(&TreeKey, &Tree)> = incident.trees.iter().collect();
    trees.sort_by(|a, b| b.1.worst.cmp(&a.1.worst).then(a.1.order.cmp(&b.1.order)));
    let with_alerts = trees.iter().filter(|(_, t)| t.alerts > 0).count();
    let shown = if with_alerts > 0 { with_alerts.min(TREES_SHOWN) } else { trees.len().min(TREES_SHOWN) };
    if trees.is_empty() {
        html.markup("<p>No package tree was seen.</p>\n");
    }
    for (key, tree) in trees.iter().take(shown) {
        tree_article(html, key, tree);
    }
    let not_shown = (trees.len() - shown) as u64 + incident.trees_not_shown;
    if not_shown > 0 {
        html.markup("<p class=\"more\">… and ").count(not_shown, "more tree", "more trees");
        html.markup(" not shown (trees without alerts give way first).</p>\n");
    }
    html.markup("</section>\n");
}

/// `HH:MM:SS.mmm` (UTC) of an entry, or the time as the alert gave it.
fn clock(html: &mut Html, entry: &Entry) {
    match entry.at_ns.and_then(|ns| OffsetDateTime::from_unix_timestamp_nanos(ns).ok()) {
        Some(at) => {
            two(html, at.hour()).markup(":");
            two(html, at.minute()).markup(":");
            two(html, at.second()).markup(".");
            let millis = at.millisecond();
            html.number(millis / 100).number(millis / 10 % 10).number(millis % 10);
        }
        None => {
            html.text_cut(&entry.time_text, 40, Cut::Counted);
        }
    }
}

/// An RFC 3339 time from an alert as `YYYY-MM-DD HH:MM:SS UTC`, or as given when it is not one.
fn moment(html: &mut Html, text: &str) {
    match super::rfc3339_ns(text).and_then(|ns| OffsetDateTime::from_unix_timestamp_nanos(ns).ok()) {
        Some(at) => {
            day(html, at);
            html.markup(" ");
            two(html, at.hour()).markup(":");
            two(html, at.minute()).markup(":");
            two(html, at.second()).markup(" UTC");
        }
        None => {
            html.text_cut(text, 40, Cut::Counted);
        }
    }
}

/// A number below 100 in two digits.
fn two(html: &mut Html, n: u8) -> &mut Html {
    html.number(u32::from(n) / 10).number(u32::from(n) % 10)
}

fn day(html: &mut Html, at: OffsetDateTime) {
    html.number(i64::from(at.year())).markup("-");
    two(html, u8::from(at.month())).markup("-");
    two(html, at.day());
}

/// The date (UTC) of the tree's first entry.
fn date(html: &mut Html, entries: &[&Entry]) {
    let first = entries.iter().find_map(|e| e.at_ns).and_then(|ns| OffsetDateTime::from_unix_timestamp_nanos(ns).ok());
    if let Some(at) = first {
        html.markup(" · started ");
        day(html, at);
        html.markup(" UTC");
    }
}

fn tree_article(html: &mut Html, key: &TreeKey, tree: &Tree) {
    html.markup("<article class=\"tree ").markup(severity_class(tree.worst)).markup("\">\n<h3>");
    if let Some(worst) = tree.worst {
        badge(html, worst);
        html.markup(" ");
    }
    match &tree.package {
        Some(package) => html.text(package),
        None => html.markup("A package tree"),
    };
    html.markup("</h3>\n<p class=\"muted\">root pid ").number(key.root_pid);
    html.markup(" on <code>").text(&key.host).markup("</code>");
    if let Some(uid) = tree.user {
        html.markup(" · uid ").number(uid);
    }
    let mut entries: Vec<&Entry> = tree.timeline.iter().collect();
    entries.sort_by_key(|e| e.at_ns.unwrap_or(i128::MAX));
    date(html, &entries);
    html.markup(" · ").count(tree.alerts, "alert", "alerts").markup("</p>\n");
    process_svg(html, tree);
    html.markup("<ol class=\"timeline\">\n");
    let mut index = 0;
    while index < entries.len() {
        let run = entries[index..].iter().take_while(|e| e.severity.is_none()).count();
        if run > FOLD_AFTER {
            for entry in &entries[index..index + FOLD_SHOWN] {
                timeline_entry(html, entry);
            }
            html.markup("<li class=\"fold\"><details><summary>");
            html.count((run - FOLD_SHOWN) as u64, "more event", "more events")
                .markup("</summary>\n<ol class=\"timeline\">\n");
            for entry in &entries[index + FOLD_SHOWN..index + run] {
                timeline_entry(html, entry);
            }
            html.markup("</ol>\n</details></li>\n");
            index += run;
        } else {
            timeline_entry(html, entries[index]);
            index += 1;
        }
    }
    html.markup("</ol>\n");
    let mut not_shown = Vec::new();
    for kind in Kind::ALL {
        if tree.not_shown[kind.index()] > 0 {
            not_shown.push((tree.not_shown[kind.index()], kind.as_str()));
        }
    }
    if tree.alerts_not_shown > 0 || !not_shown.is_empty() {
        html.markup("<p class=\"more\">Not shown, past the timeline's limits: ");
        if tree.alerts_not_shown > 0 {
            html.count(tree.alerts_not_shown, "alert", "alerts");
        }
        for (index, (count, kind)) in not_shown.into_iter().enumerate() {
            if index > 0 || tree.alerts_not_shown > 0 {
                html.markup(", ");
            }
            html.number(count).markup(" ").markup(kind);
        }
        html.markup(".</p>\n");
    }
    html.markup("</article>\n");
}

fn timeline_entry(html: &mut Html, entry: &Entry) {
    html.markup("<li class=\"entry ").markup(kind_class(entry.kind)).markup(" ").markup(severity_class(entry.severity));
    html.markup("\"><time>");
    clock(html, entry);
    html.markup("</time><span class=\"kind\">").markup(entry.kind.as_str()).markup("</span><span class=\"what\">");
    html.markup("<span class=\"pid\">[")
        .number(entry.pid)
        .markup("]</span> <code>")
        .text(&entry.what)
        .markup("</code>");
    if entry.repeats > 0 {
        // The sensor counted the same act again rather than sending it (within a second).
        html.markup(" <span class=\"repeats\">×").number(entry.repeats + 1).markup("</span>");
    }
    html.markup("</span>");
    if entry.detail.is_some() || entry.severity.is_some() || entry.seq.is_some() {
        html.markup("<span class=\"detail\">");
        if let Some(severity) = entry.severity {
            badge(html, severity);
            html.markup(" ");
        }
        if let Some(detail) = &entry.detail {
            html.text(detail);
        }
        if let Some(seq) = entry.seq {
            html.markup(" · alert ").number(seq);
        }
        html.markup("</span>");
    }
    html.markup("</li>\n");
}

/// The processes to draw: those that alerted and their ancestors first, then the rest in
/// order of appearance, each with its depth, in drawing (depth-first) order.
fn drawn(tree: &Tree) -> Vec<(u32, usize)> {
    let processes = &tree.processes;
    let mut keep: BTreeSet<u32> = BTreeSet::new();
    let mut alerted: Vec<(&u32, &super::Process)> = processes.iter().filter(|(_, p)| p.worst.is_some()).collect();
    alerted.sort_by_key(|(_, p)| (std::cmp::Reverse(p.worst), p.order));
    for (pid, _) in alerted {
        let mut chain = vec![*pid];
        let mut at = processes[pid].parent;
        // A cycle (reused pids in alerts from files) ends the walk.
        while let Some(parent) = at.filter(|p| processes.contains_key(p) && !chain.contains(p)) {
            chain.push(parent);
            at = processes[&parent].parent;
        }
        if keep.len() + chain.iter().filter(|p| !keep.contains(p)).count() > PROCESSES_DRAWN {
            break;
        }
        keep.extend(chain);
    }
    let mut by_order: Vec<(&u32, &super::Process)> = processes.iter().collect();
    by_order.sort_by_key(|(_, p)| p.order);
    for (pid, process) in &by_order {
        if keep.len() >= PROCESSES_DRAWN {
            break;
        }
        // Only under a process already kept, so the drawing stays connected.
        if process.parent.is_none_or(|p| keep.contains(&p) || !processes.contains_key(&p)) {
            keep.insert(**pid);
        }
    }
    let children = |parent: u32| -> Vec<u32> {
        let mut kids: Vec<(u64, u32)> = by_order
            .iter()
            .filter(|(pid, p)| p.parent == Some(parent) && keep.contains(pid) && **pid != parent)
            .map(|(pid, p)| (p.order, **pid))
            .collect();
        kids.sort();
        kids.into_iter().map(|(_, pid)| pid).collect()
    };
    let mut out = Vec::new();
    let mut visited = BTreeSet::new();
    let roots: Vec<u32> = by_order
        .iter()
        .filter(|(pid, p)| {
            keep.contains(pid) && p.parent.is_none_or(|parent| !keep.contains(&parent) || parent == **pid)
        })
        .map(|(pid, _)| **pid)
        .collect();
    // Then any kept process only a cycle reaches.
    let others: Vec<u32> = by_order.iter().map(|(pid, _)| **pid).filter(|pid| keep.contains(pid)).collect();
    for root in roots.into_iter().chain(others) {
        let mut stack = vec![(root, 0usize)];
        while let Some((pid, depth)) = stack.pop() {
            if !visited.insert(pid) {
                continue;
            }
            out.push((pid, depth));
            for child in children(pid).into_iter().rev() {
                stack.push((child, depth + 1));
            }
        }
    }
    out
}

fn process_svg(html: &mut Html, tree: &Tree) {
    let rows = drawn(tree);
    if rows.is_empty() {
        return;
    }
    let position = |row: usize, depth: usize| {
        (PAD + 6.0 + depth.min(DEPTH_DRAWN) as f64 * INDENT, PAD + row as f64 * ROW + ROW / 2.0)
    };
    let labels: Vec<String> = rows.iter().map(|(pid, _)| format!("[{pid}] {}", tree.processes[pid].command)).collect();
    let width = rows
        .iter()
        .zip(&labels)
        .enumerate()
        .map(|(row, ((_, depth), label))| {
            position(row, *depth).0
                + 12.0
                + shown(label, SVG_LABEL_LIMIT, Cut::Ellipsis).chars().count() as f64 * CHAR_WIDTH
        })
        .fold(0.0, f64::max)
        + PAD;
    let height = PAD * 2.0 + rows.len() as f64 * ROW;
    html.markup("<figure class=\"process-tree\"><svg role=\"img\" aria-label=\"process tree\" viewBox=\"0 0 ");
    html.number(width.ceil()).markup(" ").number(height.ceil()).markup("\" width=\"").number(width.ceil());
    html.markup("\" height=\"").number(height.ceil()).markup("\">\n");
    let row_of: std::collections::HashMap<u32, (usize, usize)> =
        rows.iter().enumerate().map(|(row, (pid, depth))| (*pid, (row, *depth))).collect();
    for (row, (pid, depth)) in rows.iter().enumerate() {
        let Some(&(parent_row, parent_depth)) = tree.processes[pid].parent.and_then(|p| row_of.get(&p)) else {
            continue;
        };
        if parent_row >= row {
            continue;
        }
        let (px, py) = position(parent_row, parent_depth);
        let (x, y) = position(row, *depth);
        html.markup("<path class=\"edge\" d=\"M").number(px).markup(" ").number(py + 6.0).markup(" V").number(y);
        html.markup(" H").number(x - 6.0).markup("\"/>\n");
    }
    for (row, ((pid, depth), label)) in rows.iter().zip(&labels).enumerate() {
        let (x, y) = position(row, *depth);
        let process = &tree.processes[pid];
        html.markup("<g class=\"node ").markup(severity_class(process.worst)).markup("\"><title>").text(label);
        html.markup("</title><circle cx=\"").number(x).markup("\" cy=\"").number(y).markup("\" r=\"5\"/>");
        html.markup("<text x=\"").number(x + 12.0).markup("\" y=\"").number(y + 4.0).markup("\">");
        html.text_cut(label, SVG_LABEL_LIMIT, Cut::Ellipsis).markup("</text></g>\n");
    }
    html.markup("</svg></figure>\n");
    let not_drawn = (tree.processes.len() - rows.len()) as u64 + tree.processes_not_shown;
    if not_drawn > 0 {
        html.markup("<p class=\"more\">… and ").count(not_drawn, "more process", "more processes");
        html.markup(" not drawn.</p>\n");
    }
}

fn files_section(html: &mut Html, incident: &Incident) {
    html.markup("<section id=\"files\">\n<h2>Credential files</h2>\n");
    if incident.files.is_empty() {
        html.markup("<p>No credential file was touched.</p>\n");
    }
    for (category, paths) in &incident.files {
        html.markup("<h3 class=\"category\">").text(category).markup("</h3>\n<ul class=\"paths\">\n");
        for (path, seen) in paths {
            html.markup("<li class=\"").markup(severity_class(seen.worst)).markup("\">");
            if let Some(worst) = seen.worst {
                badge(html, worst);
                html.markup(" ");
            }
            html.markup("<code>").text(path).markup("</code> <span class=\"muted\">");
            for (index, rule) in seen.rules.iter().enumerate() {
                if index > 0 {
                    html.markup(", ");
                }
                html.text(rule);
            }
            html.markup(" · ").count(seen.alerts, "alert", "alerts").markup("</span></li>\n");
        }
        html.markup("</ul>\n");
    }
    if incident.files_not_shown > 0 {
        html.markup("<p class=\"more\">… and ").count(incident.files_not_shown, "alert", "alerts");
        html.markup(" about files past the page's limit.</p>\n");
    }
    html.markup("</section>\n");
}

fn connections_section(html: &mut Html, incident: &Incident) {
    html.markup("<section id=\"connections\">\n<h2>Connections</h2>\n");
    if incident.connections.is_empty() {
        html.markup("<p>No connection was seen.</p>\n");
    } else {
        let mut connections: Vec<&Connection> = incident.connections.values().collect();
        connections.sort_by_key(|c| std::cmp::Reverse(c.worst));
        html.markup("<ul class=\"connections\">\n");
        for connection in connections {
            html.markup("<li class=\"").markup(severity_class(connection.worst)).markup("\">");
            if let Some(worst) = connection.worst {
                badge(html, worst);
                html.markup(" ");
            }
            html.markup("<span class=\"dest\">");
            match &connection.domain {
                Some(domain) => html.text(domain),
                None if connection.address.starts_with(['/', '@']) => html.markup("unix socket"),
                None => html.markup("<span class=\"muted\">no name looked up</span>"),
            };
            html.markup("</span> <code>").text(&connection.address).markup("</code>");
            html.markup("<span class=\"hosts\">by <code>").text(&connection.by).markup("</code> · ");
            html.count(connection.connects, "connect", "connects");
            if let Some(outcome) = &connection.outcome {
                html.markup(" · ").text(outcome);
            }
            html.markup("</span></li>\n");
        }
        html.markup("</ul>\n");
    }
    if incident.connections_not_shown > 0 {
        html.markup("<p class=\"more\">… and ").count(incident.connections_not_shown, "more connect", "more connects");
        html.markup(" to other destinations.</p>\n");
    }
    html.markup("</section>\n");
}

fn where_section(html: &mut Html, incident: &Incident) {
    html.markup("<section id=\"where\">\n<h2>Where it ran</h2>\n<ul class=\"places\">\n");
    for (place, seen) in incident.places.iter().take(PLACES_SHOWN) {
        html.markup("<li><dl>\n<dt>host</dt><dd><code>").text(&place.host).markup("</code></dd>\n");
        let optional: [(&'static str, &Option<String>); 3] =
            [("container", &place.container), ("pod", &place.pod), ("CI job", &place.ci_job)];
        for (name, value) in optional {
            if let Some(value) = value {
                html.markup("<dt>").markup(name).markup("</dt><dd><code>").text(value).markup("</code></dd>\n");
            }
        }
        html.markup("<dt>seen</dt><dd><time>");
        moment(html, &seen.first_seen);
        html.markup("</time>");
        if seen.first_seen != seen.last_seen {
            html.markup(" → <time>");
            moment(html, &seen.last_seen);
            html.markup("</time>");
        }
        html.markup(" · ").count(seen.alerts, "alert", "alerts").markup("</dd>\n</dl></li>\n");
    }
    if incident.places.is_empty() {
        for host in &incident.hosts {
            html.markup("<li><dl>\n<dt>host</dt><dd><code>").text(host).markup("</code></dd>\n</dl></li>\n");
        }
    }
    html.markup("</ul>\n");
    if incident.places.is_empty() && incident.hosts.is_empty() {
        html.markup("<p>Not known: no alert named a host.</p>\n");
    }
    if incident.places.len() > PLACES_SHOWN {
        let more = (incident.places.len() - PLACES_SHOWN) as u64;
        html.markup("<p class=\"more\">… and ").count(more, "more place", "more places").markup(".</p>\n");
    }
    if incident.places_not_shown > 0 {
        html.markup("<p class=\"more\">… and ").count(incident.places_not_shown, "alert", "alerts");
        html.markup(" from places past the page's limit.</p>\n");
    }
    html.markup("</section>\n");
}
