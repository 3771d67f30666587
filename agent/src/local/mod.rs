//! The agent's local alert log and its socket (issue 26; docs/src/usage.md, "Past alerts"): `watch`
//! appends every alert to the log with a sequence number and serves the log, and the live
//! alerts, on a Unix socket to the users of this machine, each seeing only their own unless
//! root or of group `credwatch`. `credwatch alerts`, `show`, `notify` and `selftest` are its
//! clients.

pub mod client;
pub mod commands;
pub mod log;
pub mod protocol;
pub mod server;

use std::path::Path;

use anyhow::{Context as _, Result};
use credwatch_core::{
    alert::Alert,
    engine::{Engine, SelftestRoots},
    event::Event,
    pipeline::{Sink, SinkError},
};
use prometheus_client::metrics::counter::Counter;
use tracing::{info, warn};

use self::{log::AlertLog, server::Server};

/// `watch`'s sink: every alert into the log, then to the socket's clients.
pub struct Local {
    log: AlertLog,
    server: Server,
    roots: SelftestRoots,
    /// A failed append was said: said again only after one succeeded.
    failing: bool,
}

impl Local {
    /// Opens the log at `log` and serves `socket`; `dropped` counts the clients dropped for not
    /// reading (`credwatch_alert_clients_dropped_total`). When either cannot be, the log says
    /// why and the agent watches without them: its other outputs still alert.
    pub fn start(log: &Path, socket: &Path, dropped: Counter) -> Option<Local> {
        Local::try_start(log, socket, dropped)
            .inspect_err(|error| {
                let error = credwatch_core::output::escape(&format!("{error:#}")).into_owned();
                warn!("{error}: `credwatch alerts`, `show` and `notify` get nothing from this agent");
            })
            .ok()
    }

    fn try_start(log: &Path, socket: &Path, dropped: Counter) -> Result<Local> {
        let alert_log = AlertLog::open(log).context("the local alert log (--alert-log)")?;
        let roots = SelftestRoots::default();
        let server = Server::start(socket, log, alert_log.last_seq(), roots.clone(), dropped)
            .context("the local alerts socket (--alerts-socket)")?;
        let (log, socket) = (shown(log), shown(socket));
        info!(
            alert_log = log,
            alerts_socket = socket,
            last_seq = alert_log.last_seq(),
            "alerts are logged to {log} and served on {socket}"
        );
        Ok(Local { log: alert_log, server, roots, failing: false })
    }

    /// The self-test trees the socket registers, for [`Engine::mark_selftests`].
    pub fn selftest_roots(&self) -> SelftestRoots {
        self.roots.clone()
    }

    fn write(&mut self, alerts: &[Alert]) {
        for alert in alerts {
            match self.log.append(alert) {
                Ok((seq, line)) => {
                    self.failing = false;
                    self.server.publish(seq, alert, &line);
                }
                // The agent goes on alerting through its other outputs.
                Err(error) if !self.failing => {
                    self.failing = true;
                    warn!("{error:#}: alerts are not logged locally until it works again");
                }
                Err(_) => {}
            }
        }
    }
}

fn shown(path: &Path) -> String {
    credwatch_core::output::escape(&path.display().to_string()).into_owned()
}

impl Sink for Local {
    fn event(&mut self, _: &Engine, _: &Event, alerts: &[Alert]) -> Result<(), SinkError> {
        self.write(alerts);
        Ok(())
    }

    fn released(&mut self, _: &Engine, alerts: &[Alert]) -> Result<(), SinkError> {
        self.write(alerts);
        Ok(())
    }

    fn end(&mut self, alerts: &[Alert]) -> Result<(), SinkError> {
        self.write(alerts);
        Ok(())
    }
}
