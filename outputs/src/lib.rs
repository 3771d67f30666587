//! Where alerts go beyond the terminal. The sensor and the engine never wait for an output: each
//! alert is rendered once into an [`Outgoing`] and queued per output; each output's
//! [`Transport`] delivers from its queue and its spool at its own pace (see [`dispatch`]).

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
