//! A receiver that stalls, through the dispatcher: it holds back no other output and no
//! shutdown. Each output's own hostile peers (garbage, a close mid-request, a stall) are in
//! webhook.rs, nats.rs and syslog.rs' tests.

use std::time::{Duration, Instant};

use credwatch_outputs::{DispatchOptions, Dispatcher, OutputConfig};
use support::{Hostile, Peer};
use tokio::net::TcpListener;

mod support;

fn options(spool: &std::path::Path) -> DispatchOptions {
    DispatchOptions {
        spool_dir: spool.to_owned(),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
    }
}

/// A webhook, a NATS server and a syslog receiver that accept and never answer nor read (a
/// receiver SIGSTOP'd), with long timeouts, beside a file: the file gets every alert meanwhile,
/// and the shutdown cuts the stalled deliveries off at its deadline, their alerts kept spooled.
#[test]
fn a_stalled_receiver_holds_back_no_other_output_nor_the_shutdown() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _runtime = runtime.enter();
    let stalled = |to: &dyn Fn(u16) -> String| {
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let to = to(listener.local_addr().unwrap().port());
        (Peer::start(listener, &[Hostile::Stall]), OutputConfig::to(to.parse().unwrap()))
    };
    let (webhook_peer, mut webhook) = stalled(&|port| format!("webhook:http://127.0.0.1:{port}/alerts"));
    webhook.request_timeout = Some(60.0);
    let (nats_peer, mut nats) = stalled(&|port| format!("nats:nats://127.0.0.1:{port}/credwatch"));
    nats.connect_timeout = Some(60.0);
    let (syslog_peer, mut syslog) = stalled(&|port| format!("syslog:tcp:127.0.0.1:{port}"));
    syslog.timeout = Some(60.0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("alerts.jsonl");
    let outputs = [webhook, nats, syslog, OutputConfig::to(format!("file:{}", file.display()).parse().unwrap())];
    let mut dispatcher = Dispatcher::start(options(&dir.path().join("spool")), &outputs).unwrap();
    for n in 1..=500 {
        dispatcher.dispatch(&support::alert(n));
    }

    let started = Instant::now();
    let reader = dispatcher.counts_reader();
    while reader.counts()[3].1.delivered < 500 {
        assert!(started.elapsed() < Duration::from_secs(20), "{:#?}", reader.counts());
        std::thread::sleep(Duration::from_millis(20));
    }
    let written: Vec<String> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["event"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(written, support::ids(1..=500));
    for (peer, what) in [(&webhook_peer, "webhook"), (&nats_peer, "nats"), (&syslog_peer, "syslog")] {
        assert!(!peer.served().is_empty(), "{what}: no connection");
    }
    // Still in their first attempt.
    let counts = reader.counts();
    for (name, counts) in &counts[..2] {
        assert_eq!((counts.delivered, counts.failed_attempts), (0, 0), "{name}: {counts:?}");
    }

    let started = Instant::now();
    let counts = dispatcher.shutdown(Duration::from_millis(500));
    assert!(started.elapsed() < Duration::from_secs(3), "shutdown took {:?}", started.elapsed());
    for (name, counts) in &counts[..2] {
        assert_eq!((counts.delivered, counts.spooled, counts.dropped), (0, 500, [0; 4]), "{name}: {counts:?}");
    }
    assert_eq!(counts[3].1.spooled, 0);
}
