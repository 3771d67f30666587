use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::*;
use crate::{
    engine::EngineOptions,
    event::{Connect, DnsQuery, Fork, Lost},
    pipeline::Sink as _,
    rules::RuleSet,
};

mod markup;
use markup::{tokens, ATTRIBUTES, TAGS};

/// Strings a hostile package could make the monitored system write.
const HOSTILE: &[&str] = &[
    "<script>alert(1)</script>",
    "\"><img src=x onerror=alert(1)>",
    "it's \"quoted\" ' <b>",
    "evil\u{202e}txt.exe",
    "\x1b[31mred\x1b[0m",
    "nul\0byte",
    "\u{fffd}\u{fffd}lossy</title><style>*{}</style>",
];

/// An alert with every optional part present, as its JSON.
fn full_alert() -> Value {
    json!({
        "@timestamp": "2026-12-01T12:34:56.789000000Z",
        "event": {"id": "0123456789abcdef0123456789abcdef", "kind": "alert", "action": "open", "outcome": "blocked"},
        "rule": {"id": "npm-registry-token", "name": "npm token read", "category": "registry-token",
                 "severity": "high", "description": "d"},
        "process": {"pid": 30, "executable": "/usr/bin/node", "args": ["node", "steal.js"],
                    "working_directory": "/p", "parent": {"pid": 20},
                    "ancestors": [{"pid": 10, "executable": "/usr/bin/npm", "args": ["npm", "install"]},
                                  {"pid": 20, "executable": "/bin/sh", "args": ["sh", "-c", "node steal.js"]}]},
        "file": {"path": "/home/a/.npmrc", "given_path": "../.npmrc", "flags": "O_RDONLY",
                 "same_file_as": "/home/a/.npmrc", "renamed_from": "/tmp/a"},
        "destination": {"address": "203.0.113.7", "port": 443, "domain": "exfil.example", "family": "inet",
                        "socket_type": "stream"},
        "package": {"manager": "npm", "name": "evil", "version": "1.0.0", "lifecycle": "postinstall"},
        "coding_agent": {"name": "claude", "pid": 5, "command": ["npm", "install"]},
        "host": {"name": "dev", "id": "machine"},
        "agent": {"version": "0.1.0"},
        "container": {"id": "abc", "runtime": "docker"},
        "orchestrator": {"type": "kubernetes", "namespace": "ns",
                         "resource": {"type": "pod", "id": "uid", "name": "pod"}},
        "ci": {"provider": "github", "server_url": "https://github.com", "repository": "o/r", "workflow": "CI",
               "run_id": "1", "run_attempt": "2", "job": "build", "job_id": "3", "runner": "r"},
        "user": {"id": 1000},
        "credwatch": {"root_pid": 10, "rotate": ["the npm token"], "enforcement": "userspace",
                      "count": 10, "contained": true, "selftest": true,
                      "sweep": {"categories": ["cloud", "ssh"], "rules": ["a", "b"], "files": ["/home/a/.ssh/id"],
                                "files_not_listed": 2, "folded": 1, "folded_by_category": {"ssh": 1},
                                "window_s": 30, "final": false},
                      "syscall": {"name": "ptrace", "operation": "PTRACE_ATTACH", "target_pid": 9, "ret": 0},
                      "written_file": "/tmp/w", "why": "because",
                      "credentials_touched": ["/home/a/.aws/credentials"],
                      "gap": {"down_from": "2026-12-01T12:00:00Z", "down_to": "2026-12-01T12:01:00Z",
                              "seconds": 60.0}}
    })
}

/// Every string of `value` (but the severity, which is no free text) replaced by `text`.
fn with_strings(value: &Value, text: &str, path: &str) -> Value {
    match value {
        Value::String(_) if path == "/rule/severity" => value.clone(),
        Value::String(_) => Value::String(text.to_owned()),
        Value::Array(items) => Value::Array(items.iter().map(|v| with_strings(v, text, path)).collect()),
        Value::Object(fields) => Value::Object(
            fields.iter().map(|(k, v)| (k.clone(), with_strings(v, text, &format!("{path}/{k}")))).collect(),
        ),
        other => other.clone(),
    }
}

fn alert_with(text: &str) -> Alert {
    serde_json::from_value(with_strings(&full_alert(), text, "")).unwrap()
}

fn tag_counts(page: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (name, _) in tokens(page).start_tags {
        *counts.entry(name).or_default() += 1;
    }
    counts
}

/// No element nor attribute but the renderer's, no attribute value with input in it, and
/// nothing of `text` unescaped.
fn assert_no_markup_from(page: &str, text: &str) {
    let tokens = tokens(page);
    assert_eq!(tokens.errors.first(), None, "parse errors from {text:?} ({} in all)", tokens.errors.len());
    for (tag, attributes) in &tokens.start_tags {
        assert!(TAGS.contains(&tag.as_str()), "tag {tag:?} from {text:?}");
        for (name, value) in attributes {
            assert!(!name.starts_with("on"), "{name}= on <{tag}> from {text:?}");
            assert!(ATTRIBUTES.contains(&name.as_str()), "attribute {name:?} from {text:?}");
            for marker in ["alert(", "script", "onerror", "<img", "lossy", "quoted", "evil", "[31m", "nul"] {
                assert!(!value.contains(marker), "attribute {name}={value:?} from {text:?}");
            }
        }
    }
    let lower = page.to_lowercase();
    assert!(!lower.contains("<script") && !lower.contains("<img") && !lower.contains("<b>"), "{text:?}");
    for c in ['\u{202e}', '\x1b', '\0'] {
        assert!(!page.contains(c), "{c:?} raw in the page from {text:?}");
    }
}

fn page_of_alerts(alerts: &[Alert]) -> String {
    let mut incident = Incident::default();
    for (seq, alert) in alerts.iter().enumerate() {
        incident.observe_alert(Some(seq as u64 + 1), alert);
    }
    render(&incident, &Origin::Show { seq: 1 })
}

#[test]
fn hostile_strings_in_every_field_of_an_alert_make_no_markup() {
    let benign = page_of_alerts(&[alert_with("b")]);
    let expected = tag_counts(&benign);
    assert!(expected["svg"] == 1 && expected["ol"] >= 1 && expected["input"] == 1, "{expected:?}");
    for text in HOSTILE {
        let page = page_of_alerts(&[alert_with(text)]);
        assert_no_markup_from(&page, text);
        // The same elements as the benign page, one for one: none came from the input.
        assert_eq!(tag_counts(&page), expected, "{text:?}");
    }
    let page = page_of_alerts(&[alert_with(HOSTILE[0])]);
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "shown as text");
    assert!(tokens(&page).text.contains(HOSTILE[0]), "read as text");
    let page = page_of_alerts(&[alert_with("evil\u{202e}txt\x1b[31m\0")]);
    assert!(page.contains("evil\\u{202e}txt\\u{1b}[31m\\u{0}"), "visible escapes");
}

#[test]
fn a_4_kib_path_is_cut_with_a_count_and_wraps() {
    let long = format!("/home/a/{}", "d/".repeat(2044));
    let mut alert = alert_with("b");
    alert.file.as_mut().unwrap().path = long.clone();
    let page = page_of_alerts(&[alert]);
    let shown_chars = long.chars().count() - TEXT_LIMIT_FOR_TESTS;
    assert!(page.contains(&format!("… ({shown_chars} more characters)")), "cut with its count");
    assert!(!page.contains(&long), "never whole");
    assert!(page.contains("overflow-wrap:anywhere"));
}

/// The renderer's limit, as the tests expect it.
const TEXT_LIMIT_FOR_TESTS: usize = 1_000;

#[test]
fn the_csp_allows_exactly_the_one_style_block() {
    let page = page_of_alerts(&[alert_with("b")]);
    let style = &page[page.find("<style>").unwrap() + 7..page.find("</style>").unwrap()];
    use base64::Engine as _;
    use sha2::Digest as _;
    let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(style.as_bytes()));
    let csp = format!(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'sha256-{hash}'; img-src data:\">"
    );
    assert!(page.contains(&csp), "{csp}");
    assert_eq!(page.matches("<style").count(), 1);
    for url in ["http:", "https:", "src=", "href=", "url("] {
        assert!(!page.contains(url), "{url}");
    }
}

fn exec(pid: u32, ppid: u32, args: &[&str], env: &[(&str, &str)]) -> Event {
    crate::event::test_exec(1_796_128_455_000_000_000 + u64::from(pid) * 1_000_000, pid, ppid, args, env)
}

fn at(time_ns: u64, pid: u32, data: EventData) -> Event {
    Event { time_ns: 1_796_128_456_000_000_000 + time_ns, pid, data }
}

/// A postinstall that reads the npm token, writes a file, looks up a name and connects;
/// strings from `text` in its name, its command and its paths.
fn replay_of(text: &str, extra_execs: u32) -> Incident {
    let env = [
        ("HOME", "/home/alice"),
        ("npm_package_name", text),
        ("npm_package_version", "1.0.0"),
        ("npm_lifecycle_event", "postinstall"),
    ];
    let mut events = vec![
        exec(100, 1, &["npm", "install"], &[("HOME", "/home/alice")]),
        at(1, 100, EventData::Fork(Fork { child_pid: 101 })),
        exec(101, 100, &["sh", "-c", text], &env),
        at(3, 101, EventData::Fork(Fork { child_pid: 102 })),
        exec(102, 101, &["node", text], &env),
        at(
            5,
            102,
            EventData::Open(Open {
                tid: 102,
                syscall: "openat".into(),
                dirfd: -100,
                path: "/home/alice/.npmrc".into(),
                abs_path: Some("/home/alice/.npmrc".into()),
                ret: 3,
                ..Open::default()
            }),
        ),
        at(
            6,
            102,
            EventData::Open(Open {
                tid: 102,
                syscall: "openat".into(),
                dirfd: -100,
                flags: 0o1101,
                path: format!("/tmp/{text}"),
                abs_path: Some(format!("/tmp/{text}")),
                ret: 4,
                ..Open::default()
            }),
        ),
        // The manager's own write (its lock file): not package code's.
        at(
            6,
            100,
            EventData::Open(Open {
                tid: 100,
                syscall: "openat".into(),
                dirfd: -100,
                flags: 0o1101,
                path: "/home/alice/app/package-lock.json".into(),
                abs_path: Some("/home/alice/app/package-lock.json".into()),
                ret: 5,
                ..Open::default()
            }),
        ),
        at(
            7,
            102,
            EventData::DnsQuery(DnsQuery {
                tid: 102,
                name: format!("{text}.example"),
                qtype: "A".into(),
                server: None,
            }),
        ),
        at(
            8,
            102,
            EventData::Connect(Connect {
                tid: 102,
                family: "inet".into(),
                address: Some("127.0.0.9".into()),
                port: Some(8443),
                ret: Some(0),
                ..Connect::default()
            }),
        ),
        at(9, 0, EventData::Lost(Lost { source: text.into(), count: 7 })),
    ];
    for n in 0..extra_execs {
        let pid = 1_000 + n;
        events.push(at(10 + u64::from(n), 101, EventData::Fork(Fork { child_pid: pid })));
        events.push(exec(pid, 101, &["true", text], &env));
    }
    let mut engine =
        Engine::new(RuleSet::defaults().unwrap(), EngineOptions { host_name: text.into(), ..EngineOptions::default() });
    let mut incident = Incident::default();
    incident.begin_source(0, text);
    for event in &events {
        let alerts = engine.handle(event);
        incident.event(&engine, event, &alerts).unwrap();
    }
    incident.end(&engine.flush()).unwrap();
    incident
}

#[test]
fn a_replay_puts_execs_reads_writes_lookups_connects_and_blind_spots_on_the_timeline() {
    let incident = replay_of("evil", 0);
    let tree = incident.trees.values().next().expect("the npm tree");
    let kinds: Vec<(Kind, &str, bool)> =
        tree.timeline.iter().map(|e| (e.kind, e.what.as_str(), e.severity.is_some())).collect();
    for wanted in [
        (Kind::Exec, "npm install", false),
        (Kind::Exec, "node evil", false),
        (Kind::Read, "/home/alice/.npmrc", true),
        (Kind::Write, "/tmp/evil", false),
        (Kind::Lookup, "evil.example", false),
        (Kind::Connect, "evil.example (127.0.0.9:8443)", true),
        (Kind::BlindSpot, "7 events lost (evil)", false),
    ] {
        assert!(kinds.contains(&wanted), "{wanted:?} in {kinds:?}");
    }
    assert!(!kinds.iter().any(|(_, what, _)| what.ends_with("package-lock.json")), "the manager's writes left out");
    assert_eq!(tree.processes.keys().copied().collect::<Vec<_>>(), [100, 101, 102]);
    assert_eq!(tree.processes[&102].parent, Some(101));
    assert_eq!(tree.package.as_deref(), Some("npm package evil@1.0.0"));
    let verdict = &incident.packages["npm package evil@1.0.0"].1;
    assert!(verdict.steps.contains("postinstall") && verdict.worst >= Some(Severity::High), "{verdict:?}");
    assert!(incident.files.values().any(|paths| paths.contains_key("/home/alice/.npmrc")), "{:?}", incident.files);
    let connection = &incident.connections["evil.example (127.0.0.9:8443)"];
    assert_eq!(connection.domain.as_deref(), Some("evil.example"));
    assert!(!incident.rotate.is_empty());

    let page = render(&incident, &Origin::Replay { files: 1 });
    for part in [
        "id=\"verdict\"",
        "id=\"rotate\"",
        "class=\"timeline\"",
        "class=\"process-tree\"",
        "id=\"files\"",
        "id=\"connections\"",
        "id=\"where\"",
    ] {
        assert!(page.contains(part), "{part}");
    }
    assert!(page.contains("<input type=\"checkbox\">"));
}

#[test]
fn hostile_strings_in_events_make_no_markup() {
    let expected = tag_counts(&render(&replay_of("b", 0), &Origin::Replay { files: 1 }));
    for text in HOSTILE {
        let page = render(&replay_of(text, 0), &Origin::Replay { files: 1 });
        assert_no_markup_from(&page, text);
        assert_eq!(tag_counts(&page), expected, "{text:?}");
    }
}

#[test]
fn a_tree_timeline_and_drawing_are_bounded_and_say_how_much_they_leave_out() {
    let incident = replay_of("evil", 400);
    let tree = incident.trees.values().next().unwrap();
    assert_eq!(
        tree.timeline.iter().filter(|e| e.kind == Kind::Exec && e.severity.is_none()).count(),
        Kind::Exec.limit()
    );
    assert!(tree.not_shown[Kind::Exec.index()] > 0);
    // The credential read is kept, whatever the execs.
    assert!(tree.timeline.iter().any(|e| e.kind == Kind::Read && e.severity.is_some()));
    let page = render(&incident, &Origin::Replay { files: 1 });
    let not_drawn = tree.processes.len() as u64 - 40;
    assert!(page.contains(&format!("… and {not_drawn} more processes not drawn.")), "drawing bounded");
    assert_eq!(page.matches("<circle").count(), 40);
    assert!(page.contains("more events</summary>"), "long runs folded");
    assert!(page.contains(" exec."), "the not shown count names the kind");
}

#[test]
fn trees_beyond_the_limit_are_counted_and_those_with_alerts_stay() {
    let mut incident = Incident::default();
    let mut alert = alert_with("b");
    alert.credwatch.root_pid = 1;
    incident.observe_alert(None, &alert);
    let mut engine = Engine::new(RuleSet::defaults().unwrap(), EngineOptions::default());
    for n in 0..(MAX_TREES as u32 + 10) {
        let event = exec(5_000 + n, 1, &["npm", "install"], &[]);
        let alerts = engine.handle(&event);
        incident.observe(&engine, &event, &alerts);
    }
    assert_eq!(incident.trees.len(), MAX_TREES);
    assert_eq!(incident.trees_not_shown, 11);
    assert!(incident.trees.keys().any(|k| k.root_pid == 1), "the tree with an alert stays");
}

#[test]
fn a_process_cycle_in_alerts_from_files_is_drawn_once() {
    let mut first = alert_with("b");
    first.process.pid = 7;
    first.process.ancestors = vec![crate::alert::AlertAncestor { pid: 8, executable: "a".into(), args: vec![] }];
    let mut second = first.clone();
    second.process.pid = 8;
    second.process.ancestors = vec![crate::alert::AlertAncestor { pid: 7, executable: "b".into(), args: vec![] }];
    let page = page_of_alerts(&[first, second]);
    assert_eq!(page.matches("<circle").count(), 2);
}

#[test]
fn merged_workers_keep_each_files_trees() {
    let mut one = replay_of("one", 0);
    let mut two = replay_of("two", 0);
    two.begin_source(1, "two");
    // The second worker's file index tells its trees apart from the first's.
    let trees = std::mem::take(&mut two.trees);
    two.trees = trees.into_iter().map(|(k, t)| (TreeKey { source: 1, ..k }, t)).collect();
    let alerts = one.alerts + two.alerts;
    one.merge(two);
    assert_eq!(one.trees.len(), 2);
    assert_eq!(one.alerts, alerts);
    assert_eq!(one.packages.len(), 2);
}

#[test]
fn a_sweeps_files_go_under_the_category_their_own_alert_gave_else_under_swept() {
    let mut read = alert_with("b");
    read.credwatch.sweep = None;
    read.rule.category = "registry".into();
    read.file.as_mut().unwrap().path = "/home/a/.npmrc".into();
    let mut sweep = read.clone();
    sweep.rule.category = "sweep".into();
    sweep.credwatch.sweep = Some(crate::alert::AlertSweep {
        categories: vec!["cloud".into(), "registry".into()],
        files: vec!["/home/a/.npmrc".into(), "/home/a/.aws/credentials".into()],
        ..Default::default()
    });
    let mut incident = Incident::default();
    incident.observe_alert(None, &read);
    incident.observe_alert(None, &sweep);
    let files: Vec<(&str, Vec<&str>)> =
        incident.files.iter().map(|(c, paths)| (c.as_str(), paths.keys().map(String::as_str).collect())).collect();
    assert_eq!(files, [(SWEPT, vec!["/home/a/.aws/credentials"]), ("registry", vec!["/home/a/.npmrc"])]);
    assert_eq!(incident.files["registry"]["/home/a/.npmrc"].alerts, 2);
}

#[test]
fn the_hosts_to_rotate_on_are_named_only_when_there_are_several() {
    let page = page_of_alerts(&[alert_with("b")]);
    assert!(!page.contains("class=\"hosts\">on "), "one host: not named");
    let mut other = alert_with("b");
    other.host.name = "c".into();
    let page = page_of_alerts(&[alert_with("b"), other]);
    assert!(page.contains("class=\"hosts\">on b, c<"), "two hosts: named");
}

#[test]
fn many_hosts_and_places_are_counted_not_listed() {
    let alerts: Vec<Alert> = (0..150)
        .map(|n| {
            let mut alert = alert_with("b");
            alert.host.name = format!("host-{n:03}");
            alert
        })
        .collect();
    let page = page_of_alerts(&alerts);
    assert!(page.contains("150 alerts on more than 100 hosts"), "hosts of a package, bounded");
    assert!(page.contains("… and 100 more places."), "50 places listed");
    assert!(page.contains(" and at least 90 more hosts"), "hosts to rotate on, bounded");
}

/// A postinstall whose write and connect the sensor counted again (`repeats`), some of whose
/// records were lost (the counts' kinds from `text`), and a gap while it ran.
fn replay_with_blind_spots(text: &str) -> Incident {
    use crate::event::{AgentGap, BlindCause, BlindSpot};
    let env = [("HOME", "/home/alice"), ("npm_package_name", "evil"), ("npm_lifecycle_event", "postinstall")];
    let base = 1_796_128_456_000_000_000;
    let spot = BlindSpot {
        cause: BlindCause::Lost,
        root_pid: Some(100),
        since_ns: base + 10,
        until_ns: base + 2_000_000_010,
        counts: BTreeMap::from([(text.to_owned(), 3)]),
        credential: true,
    };
    let write = Open {
        tid: 101,
        syscall: "openat".into(),
        dirfd: -100,
        flags: 0o1101,
        path: "/tmp/out".into(),
        abs_path: Some("/tmp/out".into()),
        ret: 4,
        repeats: 59,
        ..Open::default()
    };
    let connect = Connect {
        tid: 101,
        family: "inet".into(),
        address: Some("127.0.0.9".into()),
        port: Some(8443),
        repeats: 4,
        ..Connect::default()
    };
    let events = [
        exec(100, 1, &["npm", "install"], &[("HOME", "/home/alice")]),
        at(1, 100, EventData::Fork(Fork { child_pid: 101 })),
        exec(101, 100, &["node", "x.js"], &env),
        at(5, 101, EventData::Open(write)),
        at(6, 101, EventData::Connect(connect)),
        at(2_000_000_010, 0, EventData::BlindSpot(spot)),
        at(
            9_000_000_000,
            0,
            EventData::AgentGap(AgentGap { since_ns: base + 3_000_000_000, clean_stop: false, stopped: true }),
        ),
    ];
    let mut engine = Engine::new(
        RuleSet::defaults().unwrap(),
        EngineOptions { host_name: "box".into(), ..EngineOptions::default() },
    );
    let mut incident = Incident::default();
    incident.begin_source(0, "box");
    for event in &events {
        let alerts = engine.handle(event);
        incident.event(&engine, event, &alerts).unwrap();
    }
    incident.end(&engine.flush()).unwrap();
    incident
}

#[test]
fn blind_spots_and_repeated_acts_are_on_the_timeline() {
    let incident = replay_with_blind_spots("open");
    let tree = incident.trees.values().next().expect("the npm tree");
    let blind: Vec<(&str, Option<Severity>)> =
        tree.timeline.iter().filter(|e| e.kind == Kind::BlindSpot).map(|e| (e.what.as_str(), e.severity)).collect();
    assert_eq!(
        blind,
        [
            (
                "records lost from 2026-12-01T12:34:16.00000001Z to 2026-12-01T12:34:18.00000001Z (2.0 s): 3 open; one was a credential file's open",
                Some(Severity::High)
            ),
            (
                "credwatch stopped from 2026-12-01T12:34:19Z to 2026-12-01T12:34:25Z (6.0 s)",
                Some(Severity::High)
            ),
        ],
        "{:#?}",
        tree.timeline
    );
    let repeats: Vec<(Kind, u64)> =
        tree.timeline.iter().filter(|e| e.repeats > 0).map(|e| (e.kind, e.repeats)).collect();
    assert_eq!(repeats, [(Kind::Write, 59), (Kind::Connect, 4)]);
    let verdict = &incident.packages["npm package evil"].1;
    assert!(
        verdict.rules.contains_key("blind-spot-lost") && verdict.rules.contains_key("blind-spot-gap"),
        "{verdict:?}"
    );
    assert!(incident.rotate.keys().any(|item| item.contains("treat everything this tree could reach as read")));
    let page = render(&incident, &Origin::Replay { files: 1 });
    assert!(page.contains("<code>/tmp/out</code> <span class=\"repeats\">×60</span>"), "{page}");
    assert!(page.contains("<span class=\"repeats\">×5</span>"));
    assert!(
        page.contains("3 open; one was a credential file&#39;s open")
            || page.contains("3 open; one was a credential file's open")
    );
}

#[test]
fn hostile_strings_in_blind_spots_make_no_markup() {
    let expected = tag_counts(&render(&replay_with_blind_spots("b"), &Origin::Replay { files: 1 }));
    for text in HOSTILE {
        let page = render(&replay_with_blind_spots(text), &Origin::Replay { files: 1 });
        assert_no_markup_from(&page, text);
        assert_eq!(tag_counts(&page), expected, "{text:?}");
    }
}
