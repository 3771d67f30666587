//! The one thing every destination implements: deliver a batch, in order, and say whether the
//! receiver has it.

use std::future::Future;

use bytes::Bytes;
use credwatch_core::alert::Severity;

/// One alert on its way to an output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The alert's stable id (`event.id`): the same on every retry, so receivers can dedup.
    pub id: String,
    pub severity: Severity,
    /// The host it happened on (NATS subjects, per-host order).
    pub host: String,
    /// The alert as its ECS JSON document (one line, no newline): the form outputs send or
    /// translate from, shared between outputs without copies.
    pub json: Bytes,
}

/// A destination's delivery: a file, syslog, a webhook, NATS.
pub trait Transport: Send + 'static {
    /// What the output is called in logs and metrics (`webhook:https://...`).
    fn name(&self) -> &str;

    /// Delivers `batch` in order. `Ok` only once the receiver has every alert of it (written,
    /// acknowledged); on `Err` the caller retries the whole batch later, so a receiver may see an
    /// alert twice (at-least-once) and dedups by id.
    fn send(&mut self, batch: &[Outgoing]) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// `SIGHUP`: reopen what was opened by name (the `file` output's file, after logrotate).
    /// Nothing by default.
    fn reopen(&mut self) {}

    /// The agent is stopping: end the session politely (RELP's `close`, so that the receiver
    /// logs no broken session). Nothing by default.
    fn close(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Worth retrying: the receiver is down, slow, or answered with a temporary failure.
    #[error("{output}: {message}")]
    Retry { output: String, message: String },
    /// Retrying cannot help (the receiver refuses this alert: a 4xx other than 408/429): the
    /// batch is dropped and counted.
    #[error("{output}: {message} (not retried)")]
    Refused { output: String, message: String },
}
