//! Blind spots (issue 27 point 3): what the sensor missed of a tree, and the agent's gaps, are
//! alerts naming the tree's package, the window and the counts; a tree's repeated reports fold.

use super::*;
use crate::{
    alert::{BlindSpotCause, BLIND_SPOT_ACTION},
    event::{AgentGap, BlindCause, BlindSpot, Connect, DnsQuery},
};

const SECOND: u64 = 1_000_000_000;

fn ids(alerts: &[Alert]) -> Vec<&str> {
    alerts.iter().map(|a| a.rule.id.as_str()).collect()
}

fn spot(cause: BlindCause, root_pid: Option<u32>, counts: &[(&str, u64)], credential: bool) -> BlindSpot {
    BlindSpot {
        cause,
        root_pid,
        since_ns: 0,
        until_ns: 0,
        counts: counts.iter().map(|(kind, count)| ((*kind).to_owned(), *count)).collect(),
        credential,
    }
}

impl Run {
    /// The sensor's report of `spot`, its window the second up to now.
    fn report(&mut self, mut spot: BlindSpot) -> &mut Run {
        // `send` moves the clock on by a microsecond: the report comes at its window's end.
        self.time_ns += 10_000_000 - 1_000;
        spot.until_ns = self.time_ns + 1_000;
        spot.since_ns = spot.until_ns - SECOND;
        self.send(0, EventData::BlindSpot(spot))
    }

    /// The agent was down (or `stopped`) for `seconds` up to now, as the sensor tells it.
    fn gap(&mut self, seconds: u64, stopped: bool) -> &mut Run {
        self.time_ns += seconds * SECOND - 1_000;
        let gap = AgentGap { since_ns: self.time_ns + 1_000 - seconds * SECOND, clean_stop: false, stopped };
        self.send(0, EventData::AgentGap(gap))
    }

    fn connect(&mut self, pid: u32, address: &str, port: u16) -> &mut Run {
        let connect = Connect {
            tid: pid,
            family: "inet".into(),
            address: Some(address.into()),
            port: Some(port),
            ..Connect::default()
        };
        self.send(pid, EventData::Connect(connect))
    }

    /// npm (100, in alice's home) and the postinstall of evil-pkg@1.2.3 (101) under it.
    fn npm_evil() -> Run {
        let mut run = Run::new();
        run.exec(100, 1, &["npm", "install"], &[("HOME", "/home/alice")]);
        run.spawn(101, 100, &["node", "install.js"], POSTINSTALL);
        assert!(run.take().is_empty());
        run
    }
}

#[test]
fn lost_records_name_the_trees_package_window_and_counts() {
    let mut run = Run::npm_evil();
    run.report(spot(BlindCause::Lost, Some(100), &[("open", 60_000), ("credential_open", 1)], true));
    let (since, until) = (crate::alert::rfc3339(run.time_ns - SECOND), crate::alert::rfc3339(run.time_ns));
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("blind-spot-lost", Severity::High));
    assert_eq!(alert.event.action, BLIND_SPOT_ACTION);
    assert_eq!((alert.package.name.as_deref(), alert.package.version.as_deref()), (Some("evil-pkg"), Some("1.2.3")));
    assert_eq!((alert.process.pid, alert.credwatch.root_pid), (100, 100));
    let missed = alert.credwatch.blind_spot.as_ref().unwrap();
    assert_eq!(missed.cause, BlindSpotCause::Lost);
    assert_eq!(missed.counts, BTreeMap::from([("open".into(), 60_000), ("credential_open".into(), 1)]));
    assert!(missed.credential && !missed.stopped && missed.reports == 1);
    assert_eq!(missed.seconds, 1.0);
    assert_eq!((&missed.since, &missed.until), (&since, &until));
    assert_eq!(alert.timestamp, missed.until);
    // A credential's open was lost: everything the tree could reach counts as read, and the
    // advice names the kinds of credentials of the home.
    assert!(
        alert.credwatch.rotate[0].contains("treat everything this tree could reach as read"),
        "{:?}",
        alert.credwatch.rotate
    );
    let kinds = &alert.credwatch.rotate[1];
    assert!(kinds.contains("(/home/alice)") && kinds.contains("ssh") && kinds.contains("cloud"), "{kinds}");
    let text = crate::output::render(&alert, false);
    assert!(
        text.starts_with("[HIGH] npm package evil-pkg@1.2.3 (postinstall) went unseen: 60001 records lost\n"),
        "{text}"
    );
    let missed = format!("  missed   records lost from {since} to {until} (1.0 s): 1 credential_open, 60000 open; one was a credential file's open\n");
    assert!(text.contains(&missed), "{text}");
    assert!(!text.contains("note"), "{text}");
    // Without a credential among them, the advice is the rule's alone.
    let mut run = Run::npm_evil();
    run.report(spot(BlindCause::Lost, Some(100), &[("open", 5)], false));
    let alert = run.one();
    assert!(
        alert.credwatch.rotate.iter().all(|item| !item.contains("could reach as read")),
        "{:?}",
        alert.credwatch.rotate
    );
}

#[test]
fn losses_of_another_tree_do_not_name_this_one() {
    let mut run = Run::npm_evil();
    run.exec(200, 1, &["pip", "install", "fine"], &[]);
    run.report(spot(BlindCause::Lost, Some(200), &[("exec", 2)], false));
    let alert = run.one();
    assert_eq!((alert.credwatch.root_pid, alert.process.pid, alert.package.manager.as_str()), (200, 200, "pip"));
    assert_eq!(alert.package.name, None);
    assert!(serde_json::to_string(&alert).unwrap().find("evil").is_none());
}

#[test]
fn losses_no_tree_explains_alert_with_their_counts() {
    let mut run = Run::npm_evil();
    run.report(spot(BlindCause::Overflow, None, &[("open", 120)], false));
    let alert = run.one();
    assert_eq!(alert.rule.id, "blind-spot-overflow");
    assert_eq!((alert.process.pid, alert.credwatch.root_pid, alert.package.manager.as_str()), (0, 0, "unknown"));
    let text = crate::output::render(&alert, false);
    assert!(text.starts_with("[HIGH] a tree the kernel could not tell went unseen: 120 records lost\n"), "{text}");
    // A root the table never held (its exec was lost too) is named by its pid.
    run.report(spot(BlindCause::Lost, Some(4242), &[("exec", 1)], false));
    let alert = run.one();
    assert_eq!((alert.process.pid, alert.credwatch.root_pid), (4242, 4242));
    assert!(crate::output::render(&alert, false).starts_with("[HIGH] the tree of pid 4242 went unseen"));
}

#[test]
fn a_tree_that_ended_before_its_losses_were_reported_is_still_named() {
    let mut run = Run::npm_evil();
    run.exit(101).exit(100);
    assert_eq!(run.engine.stats().processes, 0);
    run.report(spot(BlindCause::Lost, Some(100), &[("open", 3)], false));
    let alert = run.one();
    assert_eq!((alert.package.name.as_deref(), alert.credwatch.root_pid), (Some("evil-pkg"), 100));
}

#[test]
fn a_flood_reported_every_10_ms_is_one_alert_then_its_sum() {
    let mut run = Run::npm_evil();
    // 10 s of reports, one per poll.
    for _ in 0..1000 {
        run.report(spot(BlindCause::Lost, Some(100), &[("open", 60)], false));
    }
    let during = run.take();
    assert_eq!(ids(&during), ["blind-spot-lost"]);
    assert_eq!(during[0].credwatch.blind_spot.as_ref().unwrap().reports, 1);
    // The tree ends: the sum goes out, marked final, with its own id.
    run.exit(101).exit(100);
    let summary = run.one();
    let sum = summary.credwatch.blind_spot.as_ref().unwrap();
    assert_eq!((sum.reports, sum.counts["open"], sum.is_final), (1000, 60_000, true));
    assert!((sum.seconds - 10.99).abs() < 0.01, "{}", sum.seconds);
    assert_ne!(summary.event.id, during[0].event.id);
    assert!(crate::output::render(&summary, false).contains("; 1000 reports (summary)"));
    assert!(run.engine.flush().is_empty(), "told once");
}

#[test]
fn a_folded_blind_spot_goes_out_again_when_a_credential_was_lost_or_a_minute_passed() {
    let mut run = Run::npm_evil();
    run.report(spot(BlindCause::Lost, Some(100), &[("open", 1)], false));
    run.report(spot(BlindCause::Lost, Some(100), &[("open", 1)], false));
    assert_eq!(run.take().len(), 1);
    run.report(spot(BlindCause::Lost, Some(100), &[("credential_open", 1)], true));
    let alert = run.one();
    let spot_now = alert.credwatch.blind_spot.as_ref().unwrap();
    assert!(spot_now.credential && spot_now.reports == 3 && !spot_now.is_final);
    assert!(alert.credwatch.rotate[0].contains("could reach as read"));
    run.time_ns += 61 * SECOND;
    run.report(spot(BlindCause::Lost, Some(100), &[("open", 1)], false));
    let alert = run.one();
    assert_eq!(alert.credwatch.blind_spot.as_ref().unwrap().reports, 4);
    // Nothing since: nothing at the end.
    assert!(run.engine.flush().is_empty());
    // Each cause and each tree is its own.
    let mut run = Run::npm_evil();
    run.exec(200, 1, &["npm", "ci"], &[]);
    run.report(spot(BlindCause::Lost, Some(100), &[("open", 1)], false));
    run.report(spot(BlindCause::MarksFull, Some(100), &[("mark", 1)], false));
    run.report(spot(BlindCause::Lost, Some(200), &[("open", 1)], false));
    assert_eq!(ids(&run.take()), ["blind-spot-lost", "blind-spot-marks-full", "blind-spot-lost"]);
}

#[test]
fn a_gap_alerts_once_for_each_tree_live_in_it_and_not_without_one() {
    // No tree: quiet.
    let mut run = Run::new();
    run.gap(30, false);
    assert!(run.take().is_empty());
    // A tree that ended before the gap: quiet too.
    let mut run = Run::npm_evil();
    run.exit(101).exit(100).gap(30, false);
    assert!(run.take().is_empty());
    // Two trees alive at its start: one alert each, whatever they do in it.
    let mut run = Run::npm_evil();
    run.exec(200, 1, &["pip", "install", "x"], &[]);
    run.gap(120, true);
    let alerts = run.take();
    assert_eq!(ids(&alerts), ["blind-spot-gap", "blind-spot-gap"]);
    assert_eq!((alerts[0].credwatch.root_pid, alerts[1].credwatch.root_pid), (100, 200));
    assert_eq!(alerts[0].package.name.as_deref(), Some("evil-pkg"));
    let missed = alerts[0].credwatch.blind_spot.as_ref().unwrap();
    assert_eq!((missed.cause, missed.stopped, missed.seconds), (BlindSpotCause::Gap, true, 120.0));
    assert!(missed.counts.is_empty() && !missed.credential);
    let text = crate::output::render(&alerts[0], false);
    assert!(
        text.starts_with(
            "[HIGH] npm package evil-pkg@1.2.3 (postinstall) ran while credwatch was stopped for 120.0 s\n"
        ),
        "{text}"
    );
    assert!(text.contains("  missed   credwatch stopped from "), "{text}");
    run.open(101, "/home/alice/.npmrc").exit(101).exit(100);
    assert!(run.take().iter().all(|alert| alert.rule.id != "blind-spot-gap"));
}

#[test]
fn a_tree_with_an_event_timed_inside_the_gap_alerts_and_a_later_one_does_not() {
    let mut run = Run::new();
    run.gap(10, false);
    let (since, until) = (run.time_ns - 10 * SECOND, run.time_ns);
    assert!(run.take().is_empty());
    // Records that waited in the rings: a tree that started and ran inside the gap.
    let exec = |args: &[&str]| {
        EventData::Exec(Exec {
            ppid: 1,
            filename: args[0].into(),
            executable: args[0].into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: "/home/alice/app".into(),
            ..Exec::default()
        })
    };
    // Its alert waits for the gap's events to be over (here: the tree's end), to name it.
    let inside = run.engine.handle(&Event { time_ns: since + SECOND, pid: 300, data: exec(&["npm", "install"]) });
    assert!(inside.is_empty(), "{inside:#?}");
    let exit = Event { time_ns: since + 2 * SECOND, pid: 300, data: EventData::Exit(Exit::default()) };
    let ended = run.engine.handle(&exit);
    assert_eq!(ids(&ended), ["blind-spot-gap"]);
    assert_eq!(ended[0].credwatch.root_pid, 300);
    // A tree that starts after the gap is none of its business.
    let after = run.engine.handle(&Event { time_ns: until + SECOND, pid: 400, data: exec(&["npm", "install"]) });
    assert!(after.is_empty(), "{after:#?}");
    assert!(run.engine.flush().is_empty(), "once per tree");
}

#[test]
fn an_adopting_agents_seeded_execs_after_the_gap_alert_for_their_trees() {
    let mut run = Run::new();
    // A new agent adopts the pins: the gap, then the execs it kept of trees still running,
    // timed at their exec (before the gap began).
    let started = run.time_ns;
    run.gap(60, false);
    let seeded = |ppid: u32, args: &[&str], env: &[(&str, &str)]| {
        EventData::Exec(Exec {
            ppid,
            filename: args[0].into(),
            executable: args[0].into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: "/home/alice/app".into(),
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            seeded: true,
            ..Exec::default()
        })
    };
    let root = run.engine.handle(&Event { time_ns: started, pid: 100, data: seeded(1, &["npm", "install"], &[]) });
    run.engine.handle(&Event { time_ns: started + 1, pid: 100, data: EventData::Fork(Fork { child_pid: 101 }) });
    let child = seeded(100, &["node", "x.js"], POSTINSTALL);
    let child = run.engine.handle(&Event { time_ns: started + 2, pid: 101, data: child });
    assert!(root.is_empty() && child.is_empty(), "until the seeds are over");
    // The first live event past the gap: the tree's alert, naming the package its seeds ran.
    let query = DnsQuery { tid: 100, name: "x.invalid".into(), qtype: "A".into(), server: None };
    run.send(100, EventData::DnsQuery(query));
    let told = run.take();
    assert_eq!(ids(&told), ["blind-spot-gap"]);
    assert_eq!((told[0].credwatch.root_pid, told[0].package.name.as_deref()), (100, Some("evil-pkg")));
    // Once live events come, a seeded exec is no longer the gap's.
    let later = run.engine.handle(&Event { time_ns: run.time_ns, pid: 500, data: seeded(1, &["npm", "ci"], &[]) });
    assert!(later.is_empty() && run.engine.flush().is_empty(), "{later:#?}");
}

#[test]
fn the_developers_own_project_command_gets_no_gap_alert_but_a_package_tree_in_it_does() {
    let mut run = Run::new();
    run.exec(100, 1, &["cargo", "test"], &[]);
    run.spawn(101, 100, &["/home/alice/app/target/debug/deps/app-1234"], &[]);
    run.spawn(102, 101, &["npm", "install"], &[]);
    run.spawn(103, 102, &["node", "install.js"], POSTINSTALL);
    assert!(run.take().is_empty());
    run.gap(5, true);
    let alerts = run.take();
    assert_eq!(ids(&alerts), ["blind-spot-gap"]);
    assert_eq!((alerts[0].process.pid, alerts[0].credwatch.root_pid), (102, 100));
    assert_eq!(alerts[0].package.name.as_deref(), Some("evil-pkg"));
}

#[test]
fn a_tree_that_filled_the_marks_counts_as_having_touched_credentials() {
    // Without: a connect elsewhere of a tree that read nothing is fine.
    let mut run = Run::npm_evil();
    run.connect(101, "203.0.113.5", 443);
    assert!(run.take().is_empty());
    let mut run = Run::npm_evil();
    run.report(spot(BlindCause::MarksFull, Some(100), &[("mark", 1)], false));
    assert_eq!(ids(&run.take()), ["blind-spot-marks-full"]);
    run.connect(101, "203.0.113.5", 443);
    let alert = run.one();
    assert_eq!(alert.rule.id, "exfiltration");
    assert!(alert.credwatch.credentials_touched.is_empty());
    assert_eq!(alert.credwatch.blind_spot.as_ref().unwrap().cause, BlindSpotCause::MarksFull);
    let text = crate::output::render(&alert, false);
    assert!(text.contains("  unseen   processes left unmarked (the kernel's table was full) from "), "{text}");
    // Another tree's full marks taint only that tree.
    let mut run = Run::npm_evil();
    run.exec(200, 1, &["npm", "ci"], &[]);
    run.report(spot(BlindCause::MarksFull, Some(200), &[("mark", 1)], false));
    run.take();
    run.connect(101, "203.0.113.5", 443);
    assert!(run.take().is_empty());
}

#[test]
fn a_blind_spot_of_a_package_in_a_tree_names_all_its_packages() {
    let mut run = Run::npm_evil();
    run.spawn(
        102,
        100,
        &["node", "other.js"],
        &[("npm_package_name", "other-pkg"), ("npm_lifecycle_event", "install")],
    );
    run.take();
    run.report(spot(BlindCause::Lost, Some(100), &[("open", 1)], false));
    let alert = run.one();
    assert_eq!(alert.package.name.as_deref(), Some("other-pkg"), "the latest");
    let names: Vec<_> =
        alert.credwatch.blind_spot.as_ref().unwrap().packages.iter().map(|p| p.name.clone().unwrap()).collect();
    assert_eq!(names, ["evil-pkg", "other-pkg"]);
    let text = crate::output::render(&alert, false);
    assert!(text.contains("  packages evil-pkg@1.2.3 (postinstall), other-pkg (install)\n"), "{text}");
}

#[test]
fn what_the_kernel_did_failing_closed_alerts_as_blocked_and_says_why() {
    let mut run = Run::npm_evil();
    let open = |denied: bool| {
        EventData::Open(Open {
            tid: 101,
            syscall: "openat".into(),
            dirfd: AT_FDCWD,
            path: "/home/alice/.npmrc".into(),
            abs_path: Some("/home/alice/.npmrc".into()),
            ret: -1,
            blocked: !denied,
            denied,
            fail_closed: true,
            ..Open::default()
        })
    };
    run.send(101, open(false));
    let alert = run.one();
    assert_eq!((alert.event.outcome.as_str(), alert.credwatch.enforcement.as_str()), ("blocked", "kernel-fail-closed"));
    let text = crate::output::render(&alert, false);
    assert!(
        text.starts_with("[HIGH] [BLOCKED] npm package evil-pkg@1.2.3 (postinstall) opened /home/alice/.npmrc"),
        "{text}"
    );
    assert!(
        text.contains("  note     the kernel acted on its own: no agent had read its records for a while"),
        "{text}"
    );
    // The BPF LSM refused it: the process lives.
    run.send(101, open(true));
    let alert = run.one();
    assert_eq!((alert.event.outcome.as_str(), alert.credwatch.enforcement.as_str()), ("denied", "lsm-fail-closed"));
    // A connect held failing closed, after a credential read: the kill rule's verdict, saying why.
    let mut run = Run::npm_evil();
    run.open(101, "/home/alice/.aws/credentials").take();
    let connect = Connect {
        tid: 101,
        family: "inet".into(),
        address: Some("203.0.113.5".into()),
        port: Some(443),
        held: true,
        fail_closed: true,
        ..Connect::default()
    };
    run.send(101, EventData::Connect(connect));
    let alert = run.one();
    assert_eq!(alert.rule.id, "exfiltration");
    assert_eq!(
        (alert.event.outcome.as_str(), alert.credwatch.enforcement.as_str()),
        ("blocked", "kernel-hold-fail-closed")
    );
}

/// A header of trace `schema`, and `events` as its lines.
fn trace_text(schema: u32, events: &[Event]) -> String {
    let header = crate::trace::TraceHeader {
        credwatch_trace: schema,
        credwatch_version: "0.1.0".into(),
        host: "box".into(),
        host_id: None,
        kernel: "6.18.0".into(),
        start_time: "2023-11-14T22:13:20Z".into(),
        rules_digest: String::new(),
        scope: "machine".into(),
        command: Vec::new(),
    };
    let mut text = serde_json::to_string(&header).unwrap();
    for event in events {
        text.push('\n');
        text.push_str(&serde_json::to_string(event).unwrap());
    }
    text.push('\n');
    text
}

/// Every alert of `events` through a fresh engine, the end of the stream included.
fn alerts_of(events: &[Event]) -> Vec<Alert> {
    let mut engine = Engine::new(
        RuleSet::defaults().unwrap(),
        EngineOptions { host_name: "box".into(), ..EngineOptions::default() },
    );
    let mut alerts: Vec<Alert> = events.iter().flat_map(|event| engine.handle(event)).collect();
    alerts.extend(engine.flush());
    alerts
}

fn read_trace(text: String) -> Vec<Event> {
    let mut reader = crate::trace::TraceReader::new("t.jsonl".into(), Box::new(std::io::Cursor::new(text))).unwrap();
    std::iter::from_fn(|| reader.next_event().unwrap()).collect()
}

#[test]
fn a_trace_with_blind_spots_and_gaps_replays_to_the_live_alerts() {
    let t0 = 1_700_000_000_000_000_000;
    let at = |ms: u64, pid: u32, data: EventData| Event { time_ns: t0 + ms * 1_000_000, pid, data };
    let exec = |ppid: u32, args: &[&str], env: &[(&str, &str)]| {
        EventData::Exec(Exec {
            ppid,
            filename: args[0].into(),
            executable: args[0].into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: "/home/alice/app".into(),
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            ..Exec::default()
        })
    };
    let lost = |ms: u64, credential: bool| {
        let mut spot = spot(BlindCause::Lost, Some(100), &[("open", 600)], credential);
        (spot.since_ns, spot.until_ns) = (t0 + (ms - 10) * 1_000_000, t0 + ms * 1_000_000);
        at(ms, 0, EventData::BlindSpot(spot))
    };
    let mut events = vec![
        at(0, 100, exec(1, &["npm", "install"], &[("HOME", "/home/alice")])),
        at(1, 100, EventData::Fork(Fork { child_pid: 101 })),
        at(2, 101, exec(100, &["node", "install.js"], POSTINSTALL)),
    ];
    events.extend((1..=300).map(|i| lost(10 + i * 10, i == 200)));
    let gap = AgentGap { since_ns: t0 + 4_000_000_000, clean_stop: false, stopped: true };
    events.push(at(9_000, 0, EventData::AgentGap(gap)));
    let mut open = Open { tid: 101, syscall: "openat".into(), dirfd: AT_FDCWD, ret: 3, ..Open::default() };
    open.path = "/home/alice/.ssh/id_ed25519".into();
    open.abs_path = Some(open.path.clone());
    events.push(at(5_000, 101, EventData::Open(open)));
    let mut marks = spot(BlindCause::MarksFull, None, &[("mark", 1)], false);
    (marks.since_ns, marks.until_ns) = (t0 + 9_100_000_000, t0 + 9_100_000_000);
    events.push(at(9_100, 0, EventData::BlindSpot(marks)));
    events.push(at(9_200, 101, EventData::Exit(Exit::default())));
    events.push(at(9_300, 100, EventData::Exit(Exit::default())));

    let live = alerts_of(&events);
    let rules: Vec<&str> = ids(&live);
    assert_eq!(
        rules,
        [
            "blind-spot-lost",
            "blind-spot-lost",
            "blind-spot-gap",
            "ssh-private-keys",
            "blind-spot-marks-full",
            "blind-spot-lost"
        ],
        "the first report, the credential's, the gap, the key read in it, the unknown tree's marks, the sum"
    );
    let read_in_gap = &live[3];
    assert!(read_in_gap.credwatch.gap.as_ref().is_some_and(|gap| gap.stopped && gap.seconds == 5.0));
    let text = crate::output::render(read_in_gap, false);
    assert!(text.contains("  when     credwatch was stopped, from 2023-11-14T22:13:24Z to "), "{text}");
    assert!(text.contains(" (5.0 s): caught up when it resumed\n"), "{text}");
    assert!(live[5].credwatch.blind_spot.as_ref().is_some_and(|spot| spot.is_final && spot.reports == 300));
    // Through a trace file and back: the same alerts, ids included.
    let replayed = alerts_of(&read_trace(trace_text(crate::trace::TRACE_SCHEMA, &events)));
    assert_eq!(replayed, live);
}

#[test]
fn an_old_trace_without_the_new_fields_still_reads() {
    // Schema 6: agent_gap without `stopped`, open without `fail_closed`.
    let text = [
        r#"{"credwatch_trace":6,"credwatch_version":"0.1.0","host":"box","kernel":"6.12.0","start_time":"2023-11-14T22:13:20Z","rules_digest":"","scope":"machine"}"#,
        r#"{"time_ns":1700000000000000000,"pid":100,"kind":"exec","ppid":1,"filename":"npm","executable":"npm","args":["npm","install"],"cwd":"/home/alice/app","uid":1000,"gid":1000}"#,
        r#"{"time_ns":1700000010000000000,"pid":0,"kind":"agent_gap","since_ns":1700000005000000000}"#,
        r#"{"time_ns":1700000010000000001,"pid":100,"kind":"open","tid":100,"syscall":"openat","dirfd":-100,"flags":0,"mode":0,"path":"/root/.ssh/id_rsa","abs_path":"/root/.ssh/id_rsa","ret":-1,"blocked":true}"#,
    ]
    .join("\n");
    let events = read_trace(text);
    let EventData::AgentGap(gap) = &events[1].data else { panic!("{events:?}") };
    assert!(!gap.stopped && !gap.clean_stop);
    let EventData::Open(open) = &events[2].data else { panic!() };
    assert!(open.blocked && !open.fail_closed);
    let alerts = alerts_of(&events);
    assert_eq!(ids(&alerts), ["blind-spot-gap", "ssh-private-keys"]);
    assert!(!alerts[0].credwatch.blind_spot.as_ref().unwrap().stopped);
    assert_eq!(alerts[1].credwatch.enforcement, "kernel");
}

#[test]
fn a_gap_alert_put_off_goes_out_on_the_live_clock_or_at_the_end() {
    let mut run = Run::new();
    run.gap(10, true);
    let since = run.time_ns - 10 * SECOND;
    let exec = EventData::Exec(Exec {
        ppid: 1,
        filename: "npm".into(),
        executable: "npm".into(),
        args: vec!["npm".into(), "install".into()],
        ..Exec::default()
    });
    assert!(run.engine.handle(&Event { time_ns: since + SECOND, pid: 300, data: exec.clone() }).is_empty());
    // An idle machine: the clock inside the gap keeps it, past it lets it go.
    assert!(run.engine.tick(since + 2 * SECOND).is_empty());
    assert_eq!(ids(&run.engine.tick(run.time_ns + 1)), ["blind-spot-gap"]);
    // A replay's end of stream lets it go too.
    let mut run = Run::new();
    run.gap(10, false);
    assert!(run.engine.handle(&Event { time_ns: since + SECOND, pid: 300, data: exec }).is_empty());
    assert_eq!(ids(&run.engine.flush()), ["blind-spot-gap"]);
}

#[test]
fn past_sixteen_packages_the_alert_still_names_the_latest() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]);
    for n in 0..20u32 {
        let name = format!("pkg-{n}");
        run.spawn(200 + n, 100, &["node", "x.js"], &[("npm_package_name", name.as_str())]);
    }
    run.take();
    run.report(spot(BlindCause::Lost, Some(100), &[("open", 1)], false));
    let alert = run.one();
    assert_eq!(alert.package.name.as_deref(), Some("pkg-19"));
    let packages = &alert.credwatch.blind_spot.as_ref().unwrap().packages;
    assert_eq!((packages.len(), packages[0].name.as_deref()), (16, Some("pkg-0")));
}

#[test]
fn an_open_the_kernel_stopped_of_a_process_whose_start_was_lost_is_still_told() {
    let mut run = Run::new();
    // Alice's npm is known (its HOME names the home); the postinstall's fork and exec were lost.
    run.exec(100, 1, &["npm", "install"], &[("HOME", "/home/alice")]).take();
    let open = |blocked: bool, fail_closed: bool| {
        EventData::Open(Open {
            tid: 4242,
            syscall: "openat".into(),
            dirfd: AT_FDCWD,
            path: "../.ssh/id_ed25519".into(),
            abs_path: Some("/home/alice/.ssh/id_ed25519".into()),
            ret: -1,
            blocked,
            fail_closed,
            ..Open::default()
        })
    };
    run.send(4242, open(true, true));
    let alert = run.one();
    assert_eq!(alert.rule.id, "ssh-private-keys");
    assert_eq!((alert.process.pid, alert.credwatch.root_pid, alert.package.manager.as_str()), (4242, 0, "unknown"));
    assert_eq!((alert.event.outcome.as_str(), alert.credwatch.enforcement.as_str()), ("blocked", "kernel-fail-closed"));
    assert!(alert.credwatch.why.as_deref().is_some_and(|why| why.contains("whose start credwatch did not see")));
    assert!(alert.credwatch.blind_spot.is_none() && !alert.credwatch.rotate.is_empty());
    assert!(crate::output::render(&alert, false)
        .starts_with("[CRITICAL] [BLOCKED] unknown package code opened /home/alice/.ssh/id_ed25519\n"));
    // What it did not stop, of a process outside every tree, is none of credwatch's business.
    run.send(4242, open(false, false));
    assert!(run.take().is_empty());
}
