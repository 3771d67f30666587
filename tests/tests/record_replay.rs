//! Issue 3: a live run recorded to a trace and replayed through the same rules gives the same
//! alerts, field for field; old trace schemas stay readable.

use std::{fs, path::Path};

use credwatch_e2e::{credwatch_binary, fixtures, parse_alerts, require_root, Run, Sandbox, EXIT_ALERT};
use serde_json::Value;

fn credwatch(sandbox: &Sandbox, cwd: &Path, args: &[&str]) -> Run {
    let mut command = sandbox.command(credwatch_binary());
    command.args(args).current_dir(cwd);
    sandbox.wait(sandbox.spawn(command))
}

fn alerts_in(path: &Path) -> Vec<Value> {
    parse_alerts(&fs::read_to_string(path).unwrap_or_default())
}

#[test]
fn replaying_a_recorded_npm_install_gives_the_same_alerts() {
    require_root();
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/telemetry-helper");
    let project = sandbox.npm_project();
    let work = sandbox.work();
    let trace = work.join("install.jsonl.zst");
    let (live, replayed) = (work.join("live.jsonl"), work.join("replayed.jsonl"));

    let recording = credwatch(
        &sandbox,
        &project,
        &[
            "record",
            "-o",
            trace.to_str().unwrap(),
            "--json",
            "--alerts",
            live.to_str().unwrap(),
            "--",
            "npm",
            "install",
            tarball.to_str().unwrap(),
        ],
    );
    recording.assert_exit(EXIT_ALERT);
    let live_alerts = alerts_in(&live);
    let npmrc = sandbox.credential(".npmrc");
    let key = sandbox.credential(".ssh/id_ed25519");
    for path in [&npmrc, &key] {
        assert!(
            live_alerts
                .iter()
                .any(|a| a["file"]["path"] == path.as_str() && a["package"]["name"] == "telemetry-helper"),
            "no live alert for {path}\n{}",
            recording.describe()
        );
    }

    let replay = credwatch(
        &sandbox,
        &work,
        &["replay", "--json", "--alerts", replayed.to_str().unwrap(), trace.to_str().unwrap()],
    );
    replay.assert_exit(EXIT_ALERT);
    assert_eq!(alerts_in(&replayed), live_alerts, "replay differs from live\n{}", replay.describe());

    let report = credwatch(&sandbox, &work, &["replay", "--report", "--report-format", "md", trace.to_str().unwrap()]);
    report.assert_exit(EXIT_ALERT);
    for wanted in
        ["## `npm package telemetry-helper@4.1.2` (critical)", "`postinstall`", npmrc.as_str(), "## Rotate these"]
    {
        assert!(report.stdout.contains(wanted), "report lacks {wanted:?}\n{}", report.describe());
    }
}

/// A trace of every schema this credwatch has written stays readable and gives its alerts.
#[test]
fn checked_in_traces_of_every_schema_replay() {
    let sandbox = Sandbox::new();
    let traces = fixtures().join("traces");
    let mut seen = 0;
    for entry in fs::read_dir(&traces).unwrap() {
        let trace = entry.unwrap().path();
        let run = credwatch(&sandbox, &traces, &["replay", "--json", trace.to_str().unwrap()]);
        run.assert_exit(EXIT_ALERT);
        let alerts = parse_alerts(&run.stdout);
        // Schemas 1 and 2: telemetry-helper's postinstall reads ~/.npmrc; schema 3 (egress):
        // egress-probe's reads it and posts it to an invented host.
        assert!(
            alerts.iter().any(|a| a["rule"]["id"] == "npm-registry-token"
                && (a["package"]["name"] == "telemetry-helper" || a["package"]["name"] == "egress-probe")
                && a["package"]["lifecycle"] == "postinstall"),
            "{}: no npm alert\n{}",
            trace.display(),
            run.describe()
        );
        if trace.file_name().is_some_and(|name| name.to_string_lossy().starts_with("schema-3-")) {
            assert!(
                alerts.iter().any(|a| a["rule"]["id"] == "exfiltration"
                    && a["destination"]["domain"] == "collector.exfil.invalid"
                    && a["destination"]["port"] == 8080),
                "{}: no exfiltration alert\n{}",
                trace.display(),
                run.describe()
            );
        }
        // Schema 5: recorded under GitHub-Actions-like variables; the identity is the recording's.
        if trace.file_name().is_some_and(|name| name.to_string_lossy().starts_with("schema-5-")) {
            assert!(
                alerts.iter().all(|a| a["ci"]["run_id"] == "9876543210"
                    && a["ci"]["job"] == "install"
                    && a["host"]["id"] == "3d1219c7c4c5404aaa1f6d2a48adfda4"
                    && a["agent"]["version"] == "0.1.0"),
                "{}: alerts without the recording's identity\n{}",
                trace.display(),
                run.describe()
            );
        }
        seen += 1;
    }
    assert!(seen >= 4, "expected a trace for schemas 1, 2, 3 and 5 in {}", traces.display());
}

/// Bad lines stop a replay with the file and line named, or with `--keep-going` are skipped and
/// counted; hostile strings reach the terminal escaped; nothing panics.
#[test]
fn bad_input_is_named_skipped_on_request_and_escaped() {
    let sandbox = Sandbox::new();
    let work = sandbox.work();
    let good = fs::read_to_string(fixtures().join("traces/schema-2-npm-postinstall.jsonl")).unwrap();
    let mut lines: Vec<String> = good.lines().map(str::to_owned).collect();
    // A path with a newline and a terminal escape, as a hostile package could create.
    for line in &mut lines {
        *line = line.replace("/.ssh/id_ed25519", "/.ssh/id_ed25519\\n\\u001b[2Jx");
    }
    lines.insert(3, "{\"time_ns\":1,\"pid\":7,\"kind\":\"open\",\"tid\":".to_owned());
    lines.insert(5, "\u{0}\u{1}\u{7f}ELF garbage".to_owned());
    let bad = work.join("bad.jsonl");
    fs::write(&bad, lines.join("\n") + "\n").unwrap();

    let stop = credwatch(&sandbox, &work, &["replay", bad.to_str().unwrap()]);
    stop.assert_exit(1);
    assert!(stop.stderr.contains("bad.jsonl:4: "), "the first bad line is not named\n{}", stop.describe());

    let skip = credwatch(&sandbox, &work, &["replay", "--keep-going", bad.to_str().unwrap()]);
    skip.assert_exit(EXIT_ALERT);
    assert!(skip.stderr.contains("2 bad lines skipped"), "{}", skip.describe());
    assert!(
        skip.stdout.contains("id_ed25519\\n\\u{1b}[2Jx"),
        "the hostile path is not shown escaped\n{}",
        skip.describe()
    );
    assert!(
        !skip.stdout.contains('\u{1b}') && !skip.stderr.contains('\u{1b}'),
        "a raw escape reached the terminal\n{}",
        skip.describe()
    );

    let unknown = work.join("future.jsonl");
    fs::write(&unknown, good.replacen("\"credwatch_trace\":2", "\"credwatch_trace\":99", 1)).unwrap();
    let future = credwatch(&sandbox, &work, &["replay", unknown.to_str().unwrap()]);
    future.assert_exit(1);
    assert!(future.stderr.contains("trace schema 99 is not supported"), "{}", future.describe());
}
