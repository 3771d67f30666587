//! Foreign traces from machines whose home is not `/root` or `/home/<user>` and that carry no
//! `HOME` (issue 9, point 7): a real strace without `-v` and a real audit log of a real
//! `npm install` with `HOME=/var/lib/jenkins`, and a Tetragon export of a GitHub container job
//! (`/github/home`). Each alerts on what its package code read, through the home the engine
//! infers from npm's own per-user reads; `--home` and `--passwd` stand in when no such read is
//! in the trace. How the fixtures were made: core/tests/fixtures/import/README.md.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::Command,
};

use credwatch_core::{
    alert::Alert,
    engine::{Engine, EngineOptions},
    event::{Event, EventData},
    import::{self, passwd, ImportOptions},
    rules::RuleSet,
};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../core/tests/fixtures/import/foreign-home");

/// A fixture, the home it was recorded with, the credential its package code read, the rule
/// and the package the alert must name.
struct Case {
    file: &'static str,
    home: &'static str,
    read: &'static str,
    rule: &'static str,
    package: Option<&'static str>,
}

const CASES: [Case; 3] = [
    Case {
        file: "strace-jenkins.txt.gz",
        home: "/var/lib/jenkins",
        read: "/var/lib/jenkins/.aws/credentials",
        rule: "aws-credentials",
        package: Some("aws-peek"),
    },
    Case {
        file: "auditd-jenkins.log.gz",
        home: "/var/lib/jenkins",
        read: "/var/lib/jenkins/.aws/credentials",
        rule: "aws-credentials",
        package: Some("aws-peek"),
    },
    Case {
        file: "tetragon-github.jsonl",
        home: "/github/home",
        read: "/github/home/.docker/config.json",
        rule: "docker-config",
        // Tetragon exports no environment and `npm ci` names no archive.
        package: None,
    },
];

fn fixture(file: &str) -> PathBuf {
    Path::new(FIXTURES).join(file)
}

fn events(file: &str) -> Vec<Event> {
    let options = ImportOptions { date: Some(time::macros::date!(2026 - 12 - 01)) };
    let mut source = import::open(&fixture(file), None, &options).unwrap();
    let mut out = Vec::new();
    while let Some(event) = source.next_event().unwrap_or_else(|e| panic!("{e}")) {
        out.push(event);
    }
    out
}

/// The events without npm's own per-user reads (`<home>/.npmrc`, `<home>/.npm/...`): nothing
/// in them tells the home any more.
fn without_clues(events: &[Event], home: &str) -> Vec<Event> {
    let clue = |path: &str| path.starts_with(&format!("{home}/.npm"));
    events
        .iter()
        .filter(|e| match &e.data {
            EventData::Open(open) => !clue(&open.path) && !open.abs_path.as_deref().is_some_and(clue),
            _ => true,
        })
        .cloned()
        .collect()
}

fn alerts(events: &[Event], options: EngineOptions) -> Vec<Alert> {
    let mut engine = Engine::new(RuleSet::load(None).unwrap(), options);
    let mut alerts: Vec<Alert> = events.iter().flat_map(|e| engine.handle(e)).collect();
    alerts.extend(engine.flush());
    alerts
}

fn assert_alert(case: &Case, alerts: &[Alert], how: &str) {
    assert_eq!(alerts.len(), 1, "{} ({how}): {alerts:#?}", case.file);
    let alert = &alerts[0];
    assert_eq!(alert.rule.id, case.rule, "{} ({how})", case.file);
    assert_eq!(alert.file.as_ref().map(|f| f.path.as_str()), Some(case.read), "{} ({how})", case.file);
    assert_eq!(alert.package.manager, "npm", "{} ({how})", case.file);
    assert_eq!(alert.package.name.as_deref(), case.package, "{} ({how})", case.file);
}

#[test]
fn each_foreign_trace_alerts_where_its_manager_looked_for_its_home() {
    for case in &CASES {
        let events = events(case.file);
        assert!(
            events.iter().all(|e| !matches!(&e.data, EventData::Exec(x) if x.env.contains_key("HOME"))),
            "{}: the trace carries no HOME",
            case.file
        );
        assert_alert(case, &alerts(&events, EngineOptions::default()), "inferred");
        // What made it alert is npm's look for its per-user files.
        let blind = without_clues(&events, case.home);
        assert!(blind.len() < events.len(), "{}: no clue to remove", case.file);
        assert_eq!(alerts(&blind, EngineOptions::default()), [], "{} without clues", case.file);
    }
}

#[test]
fn home_and_passwd_stand_in_when_no_manager_read_tells_the_home() {
    let homes = passwd::read(&fixture("passwd")).unwrap();
    for case in &CASES {
        let blind = without_clues(&events(case.file), case.home);
        let home = EngineOptions { home: Some(case.home.into()), ..EngineOptions::default() };
        assert_alert(case, &alerts(&blind, home), "--home");
        let by_uid = EngineOptions { passwd: homes.clone(), ..EngineOptions::default() };
        if case.file.starts_with("strace") {
            // strace records no uid (the importer says 0): root's home from passwd is no help.
            assert_eq!(alerts(&blind, by_uid), [], "{}", case.file);
        } else {
            assert_alert(case, &alerts(&blind, by_uid), "--passwd");
        }
        // --home is the user's word: it beats what the trace suggests.
        let wrong = EngineOptions { home: Some("/srv/elsewhere".into()), ..EngineOptions::default() };
        assert_eq!(alerts(&events(case.file), wrong), [], "{} with another --home", case.file);
    }
}

/// `credwatch replay` with `args` on `file`: exit code, stdout, stderr.
fn replay(args: &[&str], file: &Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_credwatch")).arg("replay").args(args).arg(file).output().unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[test]
fn replay_takes_home_and_passwd_and_names_a_bad_passwd_line() {
    let dir = tempfile::tempdir().unwrap();
    // The Tetragon export without npm's per-user reads.
    let blind = dir.path().join("tetragon-blind.jsonl");
    let mut out = std::fs::File::create(&blind).unwrap();
    for line in BufReader::new(std::fs::File::open(fixture("tetragon-github.jsonl")).unwrap()).lines() {
        let line = line.unwrap();
        if !line.contains("/github/home/.npm") {
            writeln!(out, "{line}").unwrap();
        }
    }
    drop(out);
    let (code, stdout, _) = replay(&["--json"], &blind);
    assert_eq!((code, stdout.as_str()), (0, ""));
    let (code, stdout, stderr) = replay(&["--json", "--home", "/github/home"], &blind);
    assert_eq!(code, 10, "{stderr}");
    assert!(stdout.contains("\"path\":\"/github/home/.docker/config.json\""), "{stdout}");
    let passwd = fixture("passwd");
    let (code, stdout, stderr) = replay(&["--json", "--passwd", passwd.to_str().unwrap()], &blind);
    assert_eq!(code, 10, "{stderr}");
    assert!(stdout.contains("docker-config"), "{stdout}");
    // Inference alone, from the file as recorded.
    let (code, _, stderr) = replay(&["--json"], &fixture("tetragon-github.jsonl"));
    assert_eq!(code, 10, "{stderr}");

    let bad = dir.path().join("passwd");
    std::fs::write(&bad, "root:x:0:0:root:/root:/bin/bash\nrunner:x:1001\n").unwrap();
    let (code, stdout, stderr) = replay(&["--passwd", bad.to_str().unwrap()], &blind);
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert!(stderr.contains(&format!("{}:2: 3 fields", bad.display())), "{stderr}");
    let (code, _, stderr) = replay(&["--home", "github/home"], &blind);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("not an absolute path"), "{stderr}");
}
