//! What the outputs' tests through the dispatcher share: alerts as the engine raises them, peers
//! that are not the receiver they should be, and waiting on the outputs' counts.

// Each test file that includes this module uses its own part of it.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use credwatch_core::alert::Alert;
use credwatch_outputs::{Counts, CountsReader, DispatchOptions, Dispatcher, OutputConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Alert `n` of package `evil-pkg` on host `build-7`: id `id-<n>`, file `/home/u/.ssh/key-<n>`.
pub fn alert(n: u32) -> Alert {
    let json = serde_json::json!({
        "@timestamp": format!("2026-12-01T16:00:{:02}.5Z", n % 60),
        "event": {"kind": "alert", "action": "open", "outcome": "alerted", "id": format!("id-{n}")},
        "rule": {"id": "ssh-private-key", "name": "SSH private key read by package code",
                 "category": "ssh", "severity": "high", "description": "d"},
        "process": {"pid": 4000 + n, "executable": "/usr/bin/node", "args": ["node", "x.js"],
                    "working_directory": "/tmp/pkg", "parent": {"pid": 3999}, "ancestors": []},
        "file": {"path": format!("/home/u/.ssh/key-{n}"), "given_path": "~/.ssh/key", "flags": "O_RDONLY"},
        "package": {"manager": "npm", "name": "evil-pkg", "version": "1.0.0", "lifecycle": "postinstall"},
        "host": {"name": "build-7"},
        "user": {"id": 1000},
        "credwatch": {"root_pid": 3990, "rotate": [], "enforcement": "userspace"}
    });
    serde_json::from_value(json).expect("an alert's JSON")
}

/// The ids `id-<n>` for `ns`, in order.
pub fn ids(ns: impl IntoIterator<Item = u32>) -> Vec<String> {
    ns.into_iter().map(|n| format!("id-{n}")).collect()
}

/// `ids` without repeats, each where it first came: what a receiver that dedups keeps.
pub fn dedup(ids: &[String]) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    ids.iter().filter(|id| seen.insert(id.to_string())).cloned().collect()
}

/// How a peer that is not a good receiver treats a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hostile {
    /// Answers at once with bytes that are no protocol, then closes.
    Garbage,
    /// Reads what the client sends first (if anything within 200 ms), then closes.
    Close,
    /// Accepts and never reads nor writes a byte.
    Stall,
}

/// A hostile peer, serving until stopped.
pub struct Peer {
    served: Arc<Mutex<Vec<Hostile>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Peer {
    /// Serves `listener` (on the current runtime) as a hostile peer: its n-th connection as
    /// `modes[n]`, the ones past the list as its last.
    pub fn start(listener: TcpListener, modes: &[Hostile]) -> Peer {
        let served = Arc::new(Mutex::new(Vec::new()));
        let (modes, log) = (modes.to_vec(), Arc::clone(&served));
        let task = tokio::spawn(async move {
            let mut stalled = Vec::new();
            for n in 0.. {
                let Ok((mut stream, _)) = listener.accept().await else { return };
                let mode = modes[n.min(modes.len() - 1)];
                log.lock().unwrap().push(mode);
                match mode {
                    Hostile::Garbage => {
                        let _ = stream.write_all(b"\x00\xff-ERR \x7fgarbage\r\nHTTP/9.9 ???\r\n\r\n\x16\x03").await;
                        let _ = stream.shutdown().await;
                    }
                    Hostile::Close => {
                        let mut start = [0; 64];
                        let _ = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut start)).await;
                    }
                    // Held, unread, until the peer stops.
                    Hostile::Stall => stalled.push(stream),
                }
            }
        });
        Peer { served, task }
    }

    /// The modes it served so far, in order, a connection each.
    pub fn served(&self) -> Vec<Hostile> {
        self.served.lock().unwrap().clone()
    }

    /// Closes its listener and every connection it holds, and waits until it has.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Polls `reader`'s first output's counts until `ok` takes them; fails the test after `timeout`.
pub fn wait_for_counts(reader: &CountsReader, what: &str, timeout: Duration, ok: impl Fn(&Counts) -> bool) -> Counts {
    let start = Instant::now();
    loop {
        let counts = reader.counts().remove(0).1;
        if ok(&counts) {
            return counts;
        }
        assert!(start.elapsed() < timeout, "{what}: not after {timeout:?}: {counts:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A dispatcher holding alerts 1 to 20 for an output whose receiver's port has been served by
/// hostile peers only, so far.
pub struct HostileRun {
    pub runtime: tokio::runtime::Runtime,
    /// Where the real receiver is to be started now.
    pub port: u16,
    pub dispatcher: Dispatcher,
    pub reader: CountsReader,
    _spool: tempfile::TempDir,
}

/// Raises alerts 1 to 20 to `output(port)` while the port is served by a peer that answers
/// garbage, then one that closes before answering, then one that never answers: each delivery
/// is a retry, counted, and every alert stays spooled. `configure` sets the output's timeouts
/// (the stall is cut off by one of them).
pub fn after_hostile_peers(output: impl Fn(u16) -> String, configure: impl FnOnce(&mut OutputConfig)) -> HostileRun {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let port = listener.local_addr().unwrap().port();
    let modes = [Hostile::Garbage, Hostile::Close, Hostile::Stall];
    let peer = {
        let _runtime = runtime.enter();
        Peer::start(listener, &modes)
    };
    let spool = tempfile::tempdir().unwrap();
    let mut config = OutputConfig::to(output(port).parse().unwrap());
    configure(&mut config);
    let options = DispatchOptions {
        spool_dir: spool.path().to_owned(),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
    };
    let mut dispatcher = Dispatcher::start(options, &[config]).unwrap();
    for n in 1..=20 {
        dispatcher.dispatch(&alert(n));
    }
    let reader = dispatcher.counts_reader();
    let counts = wait_for_counts(&reader, "4 failed attempts", Duration::from_secs(20), |c| c.failed_attempts >= 4);
    assert_eq!((counts.delivered, counts.refused, counts.spooled), (0, 0, 20), "{counts:?}");
    assert_eq!(peer.served()[..3], modes, "{:?}", peer.served());
    runtime.block_on(peer.stop());
    HostileRun { runtime, port, dispatcher, reader, _spool: spool }
}
