//! What the outputs' tests through the dispatcher share: alerts as the engine raises them, peers
//! that are not the receiver they should be, and waiting on the outputs' counts.

// Each test file that includes this module uses its own part of it.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use credwatch_core::alert::Alert;
use credwatch_outputs::{Counts, CountsReader};
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
