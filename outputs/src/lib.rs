//! Where alerts go beyond the terminal. The sensor and the engine never wait for an output: each
//! alert is rendered once into an [`Outgoing`] and queued per output; each output's
//! [`Transport`] delivers from its queue and its spool at its own pace (see [`dispatch`]).
//!
//! The modules:
//! - `transport`: what every output implements ([`Transport`]) and what it carries ([`Outgoing`]).
//! - `destination`: the `--to DEST` and `to:` spellings of an output.
//! - `filter`: an output's configuration, and which alerts it takes.
//! - `dispatch`: the sink that queues each alert for every output, never waiting for one.
//! - `spool`: an output's alerts not delivered yet, on disk.
//! - `file`: JSON lines appended to a file, rotated by size.
//! - `syslog`: RFC 5424 (or 3164) messages to a local socket, over UDP, TCP or RELP.
//! - `relp`: the RELP client, syslog with acknowledgements.
//! - `timed`: socket I/O that gives up when it makes no progress.
//! - `webhook`: HTTP POSTs of each alert (ECS JSON, NDJSON batches, or Falco's shape).
//! - `falco`: the alert in Falco's shape.
//! - `nats`: NATS JetStream, the fleet's bus.
//! - `metrics`: the agent's Prometheus metrics and the endpoint that serves them.

pub mod destination;
pub mod dispatch;
pub mod falco;
pub mod file;
pub mod filter;
pub mod metrics;
pub mod nats;
mod relp;
pub mod spool;
pub mod syslog;
mod timed;
mod transport;
pub mod webhook;

pub use destination::{Destination, DestinationError};
pub use dispatch::{transport_for, Counts, CountsReader, DispatchOptions, Dispatcher, OutputError, DEFAULT_SPOOL_DIR};
pub use filter::{Filter, OutputConfig};
pub use transport::{Outgoing, Transport, TransportError};

#[cfg(test)]
mod tests {
    use credwatch_core::alert::{
        Alert, AlertCredwatch, AlertEvent, AlertHost, AlertPackage, AlertParent, AlertProcess, AlertRule, AlertUser,
        Severity,
    };

    /// An alert of `rule` with the severity given.
    pub fn alert(rule: &str, category: &str, severity: Severity) -> Alert {
        Alert {
            timestamp: "2026-12-01T16:00:00.000000001Z".into(),
            event: AlertEvent {
                id: format!("id-{rule}"),
                kind: "alert".into(),
                action: "open".into(),
                outcome: "alerted".into(),
            },
            rule: AlertRule {
                id: rule.into(),
                name: rule.into(),
                category: category.into(),
                severity,
                description: String::new(),
            },
            process: AlertProcess {
                pid: 42,
                executable: "/usr/bin/node".into(),
                args: vec!["node".into()],
                working_directory: "/".into(),
                parent: AlertParent { pid: 1 },
                ancestors: Vec::new(),
            },
            file: None,
            destination: None,
            package: AlertPackage::default(),
            coding_agent: None,
            host: AlertHost { name: "box".into(), id: None },
            agent: None,
            container: None,
            orchestrator: None,
            ci: None,
            user: AlertUser { id: 1000 },
            credwatch: AlertCredwatch::default(),
        }
    }

    /// An alert ready to send, with id `id`.
    pub fn outgoing(id: &str, severity: Severity) -> crate::Outgoing {
        let mut alert = alert("ssh-private-key", "ssh", severity);
        alert.event.id = id.into();
        crate::dispatch::render(&alert)
    }
}
