//! A flood into one output whose receiver is down, then the drain once it is back: what the
//! spool costs the engine's thread and how fast it fills and empties. Through the dispatcher's
//! public API only, so that two versions of the spool compare on the same harness.
//!
//! `cargo run --release -p credwatch-outputs --example spool_flood [ALERTS [QUEUE]]` (default
//! 100000 alerts, the default queue; a queue of 1 has the dispatching thread spool nearly every
//! alert itself) prints, for a flood of ALERTS distinct alerts of ~1 KiB dispatched as fast as
//! one thread can:
//! - the cost of `dispatch` per alert on the dispatching thread (the engine's, live; rendering
//!   the alert included): mean over all, mean and 99th percentile once the in-memory queue has
//!   filled (the first QUEUE alerts left out), and the slowest call;
//! - alerts spooled per second (until every alert is in the spool);
//! - the time a restarted dispatcher takes to deliver them all to an in-process receiver that
//!   takes every batch at once (the spool's read side alone), then, after the same flood again,
//!   to a `file` output (a real local receiver: JSON lines appended to a file).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use credwatch_core::alert::{
    Alert, AlertAncestor, AlertCredwatch, AlertEvent, AlertFile, AlertHost, AlertPackage, AlertParent, AlertProcess,
    AlertRule, AlertUser, Severity,
};
use credwatch_outputs::{
    filter::DEFAULT_QUEUE, transport_for, DispatchOptions, Dispatcher, Outgoing, OutputConfig, Transport,
    TransportError,
};

/// A receiver that is down.
struct Down;

impl Transport for Down {
    fn name(&self) -> &str {
        "down"
    }

    async fn send(&mut self, _: &[Outgoing]) -> Result<(), TransportError> {
        Err(TransportError::Retry { output: "down".into(), message: "connection refused".into() })
    }
}

/// A receiver that takes everything at once, counting.
struct Fast(Arc<AtomicU64>);

impl Transport for Fast {
    fn name(&self) -> &str {
        "fast"
    }

    async fn send(&mut self, batch: &[Outgoing]) -> Result<(), TransportError> {
        self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// An alert of the size and shape of a live one (a postinstall reading a key file).
fn alert(n: usize) -> Alert {
    let ancestor = |pid, exe: &str, args: &[&str]| AlertAncestor {
        pid,
        executable: exe.into(),
        args: args.iter().map(|a| (*a).into()).collect(),
    };
    let mut alert = Alert {
        timestamp: "2026-12-01T16:00:00.000000001Z".into(),
        event: AlertEvent { id: String::new(), kind: "alert".into(), action: "open".into(), outcome: "alerted".into() },
        rule: AlertRule {
            id: "ssh-private-keys".into(),
            name: "SSH private key read".into(),
            category: "ssh".into(),
            severity: [Severity::Low, Severity::Medium, Severity::High, Severity::Critical][n % 4],
            description: "Package code read an SSH private key.".into(),
        },
        process: AlertProcess {
            pid: 4242,
            executable: "/usr/bin/node".into(),
            args: vec!["node".into(), "scripts/postinstall.js".into()],
            working_directory: "/home/ci/project/node_modules/flood-package".into(),
            parent: AlertParent { pid: 4241 },
            ancestors: vec![
                ancestor(4200, "/usr/bin/npm", &["npm", "install"]),
                ancestor(4241, "/bin/sh", &["sh", "-c", "node scripts/postinstall.js"]),
            ],
        },
        file: Some(AlertFile {
            path: format!("/home/ci/.ssh/keys/id_ed25519_{n:06}"),
            given_path: format!("../../.ssh/keys/id_ed25519_{n:06}"),
            flags: "O_RDONLY|O_CLOEXEC".into(),
            ..AlertFile::default()
        }),
        destination: None,
        package: AlertPackage {
            manager: "npm".into(),
            name: Some("flood-package".into()),
            version: Some("1.0.0".into()),
            lifecycle: Some("postinstall".into()),
        },
        coding_agent: None,
        host: AlertHost { name: "ci-runner-17".into(), id: None },
        agent: None,
        container: None,
        orchestrator: None,
        ci: None,
        user: AlertUser { id: 1000 },
        credwatch: AlertCredwatch {
            root_pid: 4200,
            rotate: vec!["the SSH key pair (and where its public key is authorised)".into()],
            enforcement: "kernel".into(),
            ..AlertCredwatch::default()
        },
    };
    alert.event.id = alert.stable_id();
    alert
}

fn main() {
    let alerts: usize = std::env::args().nth(1).map_or(100_000, |n| n.parse().expect("ALERTS: a number"));
    let queue: usize = std::env::args().nth(2).map_or(DEFAULT_QUEUE, |n| n.parse().expect("QUEUE: a number"));
    let dir = tempfile::tempdir().expect("a temporary folder");
    let received = dir.path().join("received.jsonl");
    let config = OutputConfig {
        queue: Some(queue),
        // Room for the whole flood: nothing dropped, the spool's write path alone is measured.
        spool_max_bytes: Some(4 << 30),
        // The `file` receiver in one file, not rotated.
        max_bytes: Some(1 << 40),
        ..OutputConfig::to(format!("file:{}", received.display()).parse().expect("a destination"))
    };
    let options = DispatchOptions {
        spool_dir: dir.path().join("spool"),
        // Down all along: one attempt, then no retry during the flood.
        backoff_base: Duration::from_secs(3600),
        backoff_max: Duration::from_secs(3600),
    };
    let flood: Vec<Alert> = (0..alerts).map(alert).collect();
    let size = serde_json::to_vec(&flood[0]).expect("JSON").len();
    println!("{alerts} alerts of {size} bytes of JSON, queue {queue}");

    let (calls, dispatched, spooled) = spool(&options, &config, &flood);
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    let mut full: Vec<Duration> = calls.iter().skip(queue).copied().collect();
    full.sort_unstable();
    let mean_full = full.iter().sum::<Duration>().as_secs_f64() * 1e6 / full.len().max(1) as f64;
    println!(
        "dispatch per alert: mean {:.2} us; queue full: mean {mean_full:.2} us, p99 {:.1} us, max {:.0} us",
        micros(dispatched) / alerts as f64,
        full.get(full.len() * 99 / 100).map_or(0.0, |d| micros(*d)),
        full.last().map_or(0.0, |d| micros(*d)),
    );
    println!("spooled: {:.0} alerts/s ({:.2} s for all)", alerts as f64 / spooled.as_secs_f64(), spooled.as_secs_f64());

    let count = Arc::new(AtomicU64::new(0));
    let drained = drain(&options, &config, Fast(Arc::clone(&count)), alerts);
    assert_eq!(count.load(Ordering::Relaxed), alerts as u64);
    println!(
        "drained after a restart to an in-process receiver: {:.2} s ({:.0} alerts/s)",
        drained.as_secs_f64(),
        alerts as f64 / drained.as_secs_f64()
    );

    spool(&options, &config, &flood);
    let drained = drain(&options, &config, transport_for(&config).expect("the file output"), alerts);
    let lines = std::fs::read(&received).expect("the file output's file").iter().filter(|b| **b == b'\n').count();
    assert_eq!(lines, alerts);
    println!(
        "drained after a restart to a `file` output: {:.2} s ({:.0} alerts/s)",
        drained.as_secs_f64(),
        alerts as f64 / drained.as_secs_f64()
    );
}

/// The flood, with the receiver down: each `dispatch` call's time, all of them, and the time
/// until every alert was in the spool.
fn spool(options: &DispatchOptions, config: &OutputConfig, flood: &[Alert]) -> (Vec<Duration>, Duration, Duration) {
    let mut dispatcher = Dispatcher::new(options.clone()).expect("a dispatcher");
    dispatcher.add(config, Down).expect("an output");
    let reader = dispatcher.counts_reader();
    let mut calls = Vec::with_capacity(flood.len());
    let start = Instant::now();
    for alert in flood {
        let call = Instant::now();
        dispatcher.dispatch(alert);
        calls.push(call.elapsed());
    }
    let dispatched = start.elapsed();
    while reader.counts()[0].1.spooled < flood.len() as u64 {
        assert!(start.elapsed() < Duration::from_secs(600), "not all spooled: {:?}", reader.counts());
        std::thread::sleep(Duration::from_millis(1));
    }
    let spooled = start.elapsed();
    let counts = dispatcher.shutdown(Duration::from_millis(100));
    assert_eq!(counts[0].1.dropped, [0; 4], "{counts:?}");
    (calls, dispatched, spooled)
}

/// A restarted dispatcher delivering the spool to `transport`: the time until all is delivered.
fn drain<T: Transport>(options: &DispatchOptions, config: &OutputConfig, transport: T, alerts: usize) -> Duration {
    let start = Instant::now();
    let mut dispatcher = Dispatcher::new(options.clone()).expect("a dispatcher");
    dispatcher.add(config, transport).expect("an output");
    let reader = dispatcher.counts_reader();
    while reader.counts()[0].1.delivered < alerts as u64 {
        assert!(start.elapsed() < Duration::from_secs(600), "not all delivered: {:?}", reader.counts());
        std::thread::sleep(Duration::from_millis(1));
    }
    let drained = start.elapsed();
    let counts = dispatcher.shutdown(Duration::from_secs(10));
    assert_eq!((counts[0].1.delivered, counts[0].1.spooled), (alerts as u64, 0), "{counts:?}");
    drained
}
