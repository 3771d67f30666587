//! `credwatch fleet report` over a real `nats-server -js` started here: 20 simulated hosts (the
//! real binary replaying a recorded npm postinstall as each host, its alerts published by the
//! real `nats:` output), a few alerts delivered again past the stream's duplicate window, then
//! the report read from the stream and from the same hosts' alert files. No root needed.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use credwatch_e2e::{
    credwatch_binary,
    servers::{free_port, NatsServer},
};
use serde_json::Value;
use time::{format_description::well_known::Rfc3339, OffsetDateTime};

const PREFIX: &str = "credwatch.alerts";
const HOSTS: usize = 20;
/// The recorded trace every host replays: telemetry-helper@4.1.2's postinstall reads the
/// user's `.npmrc` and SSH key.
const TRACE: &str = "fixtures/traces/schema-2-npm-postinstall.jsonl";
/// Its two alerts' times, as recorded (host N replays it N seconds later).
const FIRST_ALERT: &str = "2026-11-29T20:56:33.100658859Z";
const LAST_ALERT: &str = "2026-11-29T20:56:33.100890993Z";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Host `n`'s name; the last one is hostile (a terminal escape sequence in its name).
fn host(n: usize) -> String {
    if n == HOSTS - 1 {
        format!("host-{n:02}\u{1b}[2J\u{1b}]0;owned\u{7}")
    } else {
        format!("host-{n:02}")
    }
}

/// Host `n`'s trace: the recorded one under its name, `n` seconds later; hosts 15 and up ran
/// version 4.1.3 of the package.
fn trace_of(n: usize, dir: &Path) -> PathBuf {
    let text = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(TRACE)).unwrap();
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let mut value: Value = serde_json::from_str(line).unwrap();
        if index == 0 {
            value["host"] = host(n).into();
        } else {
            value["time_ns"] = (value["time_ns"].as_u64().unwrap() + n as u64 * 1_000_000_000).into();
            if n >= 15 && value["env"]["npm_package_version"] == "4.1.2" {
                value["env"]["npm_package_version"] = "4.1.3".into();
            }
        }
        lines.push(value.to_string());
    }
    let path = dir.join(format!("host-{n:02}.trace.jsonl"));
    fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// `n` seconds after `at`, as the engine writes times.
fn later(at: &str, n: usize) -> String {
    let at = OffsetDateTime::parse(at, &Rfc3339).unwrap() + Duration::from_secs(n as u64);
    at.format(&Rfc3339).unwrap()
}

fn credwatch(args: &[&str]) -> Output {
    Command::new(credwatch_binary()).args(args).output().expect("running credwatch")
}

fn describe(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn json_report(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "{}", describe(output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(output)))
}

/// Publishes `payloads` on `subject` without a `Nats-Msg-Id`: delivered again after the
/// stream's duplicate window, or by a sender that does not set it. Returns their sequences.
fn publish(server: &NatsServer, subject: &str, payloads: &[Vec<u8>]) -> Vec<u64> {
    runtime().block_on(async {
        let client = async_nats::connect(server.url()).await.unwrap();
        let context = async_nats::jetstream::new(client);
        let mut sequences = Vec::new();
        for payload in payloads {
            let ack = context.publish(subject.to_owned(), payload.clone().into()).await.unwrap();
            sequences.push(ack.await.unwrap().sequence);
        }
        sequences
    })
}

fn lines(path: &Path) -> Vec<String> {
    fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect()
}

#[test]
fn twenty_hosts_on_a_nats_stream_make_one_report_per_package_version() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start(&dir.path().join("nats"));
    server.create_stream(PREFIX, Duration::from_secs(120));
    let to = format!("nats:{}/{PREFIX}", server.url());

    // Each host: the real engine over its trace, its alerts to the stream by the real output,
    // and to a file.
    let mut alert_files = Vec::new();
    for n in 0..HOSTS {
        let trace = trace_of(n, dir.path());
        let alerts = dir.path().join(format!("host-{n:02}.alerts.jsonl"));
        let spool = dir.path().join(format!("spool-{n:02}"));
        let output = credwatch(&[
            "replay",
            "--to",
            &to,
            "--spool-dir",
            spool.to_str().unwrap(),
            "--alerts",
            alerts.to_str().unwrap(),
            trace.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(10), "host {n}: {}", describe(&output));
        assert!(stderr.contains("2 delivered"), "host {n}: {}", describe(&output));
        assert_eq!(lines(&alerts).len(), 2, "host {n}");
        alert_files.push(alerts);
    }
    // Host 3's alerts once more, past the duplicate window: the stream keeps them.
    let again: Vec<Vec<u8>> = lines(&alert_files[3]).into_iter().map(String::into_bytes).collect();
    publish(&server, &format!("{PREFIX}.host-03"), &again);

    let from = format!("{}/{PREFIX}", server.url());
    let report = json_report(&credwatch(&["fleet", "report", "--from", &from, "--report-format", "json"]));
    assert_eq!(report["alerts"], 2 * HOSTS, "{report:#}");
    assert_eq!(report["repeats"], 2, "{report:#}");
    assert_eq!(report["hosts"].as_array().unwrap().len(), HOSTS);
    let packages = report["packages"].as_object().unwrap();
    assert_eq!(
        packages.keys().collect::<Vec<_>>(),
        ["npm package telemetry-helper@4.1.2", "npm package telemetry-helper@4.1.3"]
    );
    for (version, hosts) in [("4.1.2", 0..15), ("4.1.3", 15..HOSTS)] {
        let package = &packages[&format!("npm package telemetry-helper@{version}")][1];
        let expected: BTreeSet<String> = hosts.clone().map(host).collect();
        let got: BTreeSet<String> =
            package["hosts"].as_array().unwrap().iter().map(|h| h.as_str().unwrap().to_owned()).collect();
        assert_eq!(got, expected, "{version}");
        assert_eq!(package["first_seen"], later(FIRST_ALERT, hosts.start), "{version}");
        assert_eq!(package["last_seen"], later(LAST_ALERT, hosts.end - 1), "{version}");
        assert_eq!(package["alerts"], 2 * hosts.len(), "{version}: each alert once");
        assert_eq!(package["worst"], "critical");
        let places = package["places"].as_array().unwrap();
        assert_eq!(places.len(), hosts.len());
        for (place, n) in places.iter().zip(hosts) {
            assert_eq!(place["host"], host(n));
            assert_eq!(place["first_seen"], later(FIRST_ALERT, n), "{place}");
            assert_eq!(place["last_seen"], later(LAST_ALERT, n), "{place}");
            assert_eq!(place["alerts"], 2, "{place}");
            for identity in ["container", "pod", "ci_job"] {
                assert_eq!(place[identity], Value::Null, "{place}");
            }
        }
        let files: BTreeMap<String, Value> = serde_json::from_value(package["files"].clone()).unwrap();
        assert_eq!(
            files,
            BTreeMap::from([
                ("/tmp/demo/home/.npmrc".to_owned(), serde_json::json!(["npm-registry-token"])),
                ("/tmp/demo/home/.ssh/id_ed25519".to_owned(), serde_json::json!(["ssh-private-keys"])),
            ])
        );
        assert_eq!(package["commands"], serde_json::json!(["node telemetry.js"]));
        assert_eq!(package["steps"], serde_json::json!(["postinstall"]));
        let rotate = package["rotate"].as_object().unwrap();
        assert_eq!(rotate.len(), 2, "npm tokens and SSH keys: {rotate:?}");
        assert!(rotate.keys().any(|item| item.starts_with("npm tokens")), "{rotate:?}");
        assert!(rotate.values().all(|on| on.as_array().unwrap().len() == got.len()), "{rotate:?}");
    }
    assert_eq!(report["rotate"].as_object().unwrap().len(), 2);

    // The same hosts' alert files (host 3's twice) make the same report.
    let mut files: Vec<&str> = alert_files.iter().map(|f| f.to_str().unwrap()).collect();
    files.push(files[3]);
    let from_files = json_report(&credwatch(&[&["fleet", "report", "--report-format", "json"][..], &files].concat()));
    assert_eq!(from_files, report);

    // One version only: the question after a bad release.
    let one = json_report(&credwatch(&[
        "fleet",
        "report",
        "--from",
        &from,
        "--package",
        "telemetry-helper@4.1.3",
        "--report-format",
        "json",
    ]));
    assert_eq!(one["packages"].as_object().unwrap().keys().collect::<Vec<_>>(), ["npm package telemetry-helper@4.1.3"]);
    assert_eq!(
        one["packages"],
        serde_json::json!({"npm package telemetry-helper@4.1.3": packages["npm package telemetry-helper@4.1.3"]})
    );
    let hosts: Vec<String> = (15..HOSTS).map(host).collect();
    assert_eq!(one["hosts"], serde_json::json!(hosts));
    assert_eq!(one["alerts"], 2 * hosts.len());

    // Text for a terminal: the hostile host's name escaped.
    let text = credwatch(&["fleet", "report", "--from", &from]);
    assert_eq!(text.status.code(), Some(0), "{}", describe(&text));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("40 alerts (2 repeats dropped) from 20 hosts, 2 packages"), "{text}");
    assert!(text.contains("npm package telemetry-helper@4.1.3 [CRITICAL]"), "{text}");
    assert!(text.contains(&format!("  first seen {}", later(FIRST_ALERT, 15))), "{text}");
    assert!(text.contains(&format!("             host-07 | - | - | - | {}", later(FIRST_ALERT, 7))), "{text}");
    assert!(text.contains("host-19\\u{1b}[2J\\u{1b}]0;owned\\u{7} | - | - | - |"), "{text}");
    assert!(text.contains("  touched    /tmp/demo/home/.ssh/id_ed25519 (ssh-private-keys)"), "{text}");
    assert!(!text.contains('\u{1b}') && !text.contains('\u{7}'), "a raw control character: {text}");
    let markdown = credwatch(&["fleet", "report", "--from", &from, "--report-format", "md"]);
    let markdown = String::from_utf8(markdown.stdout).unwrap();
    assert!(markdown.contains("## `npm package telemetry-helper@4.1.2` (critical)"), "{markdown}");
    assert!(!markdown.contains('\u{1b}'), "{markdown}");

    // A message that is no alert is named by its subject and sequence; skipped and counted with
    // --keep-going.
    let sequence = publish(&server, &format!("{PREFIX}.intruder"), &[b"{\"hello\": 1}".to_vec()])[0];
    let bad = credwatch(&["fleet", "report", "--from", &from]);
    assert_eq!(bad.status.code(), Some(1), "{}", describe(&bad));
    let said = String::from_utf8_lossy(&bad.stderr);
    let at = format!("stream \"CREDWATCH\", subject \"{PREFIX}.intruder\", sequence {sequence}: not a credwatch alert");
    assert!(said.contains(&at), "{}", describe(&bad));
    let kept = credwatch(&["fleet", "report", "--keep-going", "--from", &from, "--report-format", "json"]);
    assert!(String::from_utf8_lossy(&kept.stderr).contains(&format!("sequence {sequence}")), "{}", describe(&kept));
    assert_eq!(json_report(&kept), report);
}

#[test]
fn a_missing_stream_an_unreachable_server_and_a_bad_line_are_errors_that_say_where() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start(&dir.path().join("nats"));
    let error = |args: &[&str], says: &str| {
        let output = credwatch(&[&["fleet", "report"][..], args].concat());
        assert_eq!(output.status.code(), Some(1), "{args:?}: {}", describe(&output));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{args:?}: expected {says:?}\n{}", describe(&output));
        assert!(!stderr.contains("panicked"), "{}", describe(&output));
    };
    let from = format!("{}/{PREFIX}", server.url());
    error(&["--from", &from], &format!("{}: no stream holds the subjects {PREFIX}.>", server.url()));
    server.create_stream(PREFIX, Duration::from_secs(120));
    error(&["--from", &from, "--stream", "NOPE"], &format!("{}: stream \"NOPE\"", server.url()));
    let nobody = format!("nats://127.0.0.1:{}/{PREFIX}", free_port());
    error(&["--from", &nobody], &nobody[..nobody.rfind('/').unwrap()]);

    // An empty stream is an empty report.
    let empty = json_report(&credwatch(&["fleet", "report", "--from", &from, "--report-format", "json"]));
    assert_eq!((empty["alerts"].as_u64(), empty["packages"].as_object().map(|p| p.len())), (Some(0), Some(0)));

    let file = dir.path().join("alerts.jsonl");
    fs::write(&file, "{\"@timestamp\": \"2026-12-01T00:00:00Z\"}\n").unwrap();
    error(&[file.to_str().unwrap()], &format!("{}:1: not a credwatch alert", file.display()));
    error(&[dir.path().join("missing.jsonl").to_str().unwrap()], "missing.jsonl");
}
