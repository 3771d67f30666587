//! NATS JetStream, the fleet's bus: each alert published on `<prefix>.<host>` with its id as
//! `Nats-Msg-Id` (the stream drops a repeat within its duplicate window), and delivered only
//! once the stream has acknowledged it. The official client, async-nats, speaks the protocol.
//! [`Nats::read_stream`] reads them back, for `credwatch fleet report`.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, consumer, Context};
use async_nats::{Client, ConnectOptions, ServerAddr};

use futures_util::StreamExt as _;

use crate::webhook::{tls_config, TlsError};
use crate::{Outgoing, Transport, TransportError};

/// Publishes awaiting their acknowledgement at most, per batch. The client holds at most 5,000
/// (its `max_ack_inflight`) and waits for a free one beyond: a larger window would wait on
/// acknowledgements that are only read after it.
const ACK_WINDOW: usize = 500;
/// Messages asked for at once when reading the stream back.
const READ_BATCH: usize = 500;
/// How long a fetch waits for messages that the stream said it holds.
const READ_WAIT: Duration = Duration::from_secs(2);
/// Fetches in a row that may come back empty while the stream says messages are pending.
const READ_TRIES: u32 = 5;

#[derive(Clone, Debug)]
pub struct NatsOptions {
    /// A `.creds` file (JWT and NKey seed), read at construction.
    pub credentials_file: Option<PathBuf>,
    pub token: Option<String>,
    /// Use TLS even when the URL says `nats://`.
    pub require_tls: bool,
    /// Trust only the CA certificates in this PEM file, instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    pub connect_timeout: Duration,
    /// How long to wait for the stream's acknowledgement of a publish.
    pub ack_timeout: Duration,
}

impl Default for NatsOptions {
    fn default() -> Self {
        NatsOptions {
            credentials_file: None,
            token: None,
            require_tls: false,
            ca_file: None,
            connect_timeout: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("NATS URL {url:?}: {message}")]
    Url { url: String, message: String },
    #[error("NATS subject prefix {prefix:?}: {message}")]
    Prefix { prefix: String, message: String },
    #[error("NATS credentials file {}: {source}", path.display())]
    Credentials { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] TlsError),
}

pub struct Nats {
    name: String,
    server: ServerAddr,
    prefix: String,
    options: NatsOptions,
    /// Read at construction, so that a bad file is an error at start-up rather than at the first
    /// alert.
    credentials: Option<String>,
    tls: Option<rustls::ClientConfig>,
    /// Connected at the first batch, and kept: the client reconnects by itself after an outage.
    connected: Option<(Client, Context)>,
}

impl Nats {
    /// Checks the URL, the subject prefix, the credentials and CA files. The server is reached at
    /// the first batch: one that is down at start-up is the spool's business, not an error here.
    pub fn new(url: &str, subject_prefix: &str, options: NatsOptions) -> Result<Nats, NatsError> {
        let server: ServerAddr =
            url.parse().map_err(|e: std::io::Error| NatsError::Url { url: url.to_string(), message: e.to_string() })?;
        check_prefix(subject_prefix)?;
        let credentials = match &options.credentials_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| NatsError::Credentials { path: path.clone(), source })?;
                // Parsed now for the same reason.
                ConnectOptions::with_credentials(&text)
                    .map_err(|source| NatsError::Credentials { path: path.clone(), source })?;
                Some(text)
            }
            None => None,
        };
        let tls = if options.ca_file.is_some() || options.require_tls || server.tls_required() {
            Some(tls_config(options.ca_file.as_deref(), true)?)
        } else {
            None
        };
        Ok(Nats {
            name: format!("nats:{}/{subject_prefix}", redacted(&server)),
            server,
            prefix: subject_prefix.to_string(),
            options,
            credentials,
            tls,
            connected: None,
        })
    }

    /// The subject of an alert from `host`: one token, so that `<prefix>.*` is every host and
    /// `<prefix>.<host>` exactly one. Characters NATS gives a meaning to (`.`, `*`, `>`,
    /// whitespace) become `_`.
    pub fn subject(&self, host: &str) -> String {
        let token: String = host
            .chars()
            .map(|c| if c == '.' || c == '*' || c == '>' || c.is_whitespace() || c.is_control() { '_' } else { c })
            .collect();
        let token = if token.is_empty() { "unknown".to_string() } else { token };
        format!("{}.{token}", self.prefix)
    }

    async fn connect(&mut self) -> Result<(Client, Context), TransportError> {
        if let Some(connected) = &self.connected {
            return Ok(connected.clone());
        }
        let mut options = match &self.credentials {
            // Checked at construction.
            Some(text) => ConnectOptions::with_credentials(text).map_err(|e| self.retry(e.to_string()))?,
            None => ConnectOptions::new(),
        };
        options = options.name("credwatch").connection_timeout(self.options.connect_timeout);
        if let Some(token) = &self.options.token {
            options = options.token(token.clone());
        }
        if let Some(tls) = &self.tls {
            options = options.tls_client_config(tls.clone()).require_tls(true);
        }
        let client = options.connect(self.server.clone()).await.map_err(|e| self.retry(format!("connect: {e}")))?;
        let mut context = jetstream::new(client.clone());
        context.set_timeout(self.options.ack_timeout);
        self.connected = Some((client.clone(), context.clone()));
        Ok((client, context))
    }

    fn retry(&self, message: String) -> TransportError {
        TransportError::Retry { output: self.name.clone(), message }
    }
}

impl Transport for Nats {
    fn name(&self) -> &str {
        &self.name
    }

    /// Publishes a window of the batch before waiting for its acknowledgements (one round trip
    /// per window, not per alert); they come back in order on the one connection, so the stream
    /// keeps the batch's order.
    async fn send(&mut self, batch: &[Outgoing]) -> Result<(), TransportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (client, context) = self.connect().await?;
        // While the client is reconnecting, publishes would only pile up in its buffer (and
        // block once it is full): fail now, the batch comes again.
        if client.connection_state() != State::Connected {
            return Err(self.retry("not connected (the client reconnects by itself)".into()));
        }
        for window in batch.chunks(ACK_WINDOW) {
            let mut acks = Vec::with_capacity(window.len());
            for alert in window {
                let message = PublishMessage::build().payload(alert.json.clone()).message_id(&alert.id);
                let publish = context.send_publish(self.subject(&alert.host), message);
                let ack = tokio::time::timeout(self.options.ack_timeout, publish)
                    .await
                    .map_err(|_| self.retry(format!("alert {}: publish timed out", alert.id)))?;
                acks.push((alert, ack.map_err(|e| self.publish_error(&alert.id, e))?));
            }
            for (alert, ack) in acks {
                ack.await.map_err(|e| self.publish_error(&alert.id, e))?;
            }
        }
        Ok(())
    }
}

impl Nats {
    fn publish_error(&self, id: &str, error: async_nats::jetstream::context::PublishError) -> TransportError {
        let message = format!("alert {id}: {error}");
        match error.kind() {
            // Too large for the server: it will be as large next time.
            PublishErrorKind::MaxPayloadExceeded => TransportError::Refused { output: self.name.clone(), message },
            // No stream on the subject yet, the server down or slow, ...: the alert waits in the
            // spool until the stream takes it.
            _ => self.retry(message),
        }
    }
}

/// One message of the stream, read back.
pub struct StreamMessage {
    pub subject: String,
    /// Its sequence number in the stream.
    pub sequence: u64,
    pub payload: bytes::Bytes,
}

/// Why the stream could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{server}: {message}")]
    Server { server: String, message: String },
    #[error("{server}: no stream holds the subjects {subjects} (create it, or name it with --stream): {message}")]
    NoStream { server: String, subjects: String, message: String },
    #[error("{server}: stream {stream:?}: {message}")]
    Stream { server: String, stream: String, message: String },
    /// The reader's own verdict on a message.
    #[error("{server}: stream {stream:?}, subject {subject:?}, sequence {sequence}: {message}")]
    Message { server: String, stream: String, subject: String, sequence: u64, message: String },
}

impl Nats {
    /// Reads every message on `<prefix>.>` that the stream holds now, in the stream's order,
    /// each handed to `each` (whose error stops the reading, naming the message). The stream is
    /// `stream`, or the one that holds those subjects. Read through an ephemeral consumer that
    /// takes no acknowledgements: reading changes nothing for other consumers. Returns the
    /// number of messages read. Blocking, on a runtime of its own: not for an async context.
    pub fn read_stream(
        &mut self,
        stream: Option<&str>,
        each: impl FnMut(StreamMessage) -> Result<(), String>,
    ) -> Result<u64, ReadError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ReadError::Server { server: self.name.clone(), message: format!("a runtime: {e}") })?;
        // A client lives on the runtime that connected it: none from before, none kept after.
        self.connected = None;
        let result = runtime.block_on(self.read(stream, each));
        self.connected = None;
        result
    }

    async fn read(
        &mut self,
        stream: Option<&str>,
        mut each: impl FnMut(StreamMessage) -> Result<(), String>,
    ) -> Result<u64, ReadError> {
        let server = redacted(&self.server);
        let (_, context) = self.connect().await.map_err(|e| ReadError::Server {
            server: server.clone(),
            message: match e {
                TransportError::Retry { message, .. } | TransportError::Refused { message, .. } => message,
            },
        })?;
        let subjects = format!("{}.>", self.prefix);
        let name = match stream {
            Some(name) => name.to_string(),
            None => context.stream_by_subject(subjects.clone()).await.map_err(|e| ReadError::NoStream {
                server: server.clone(),
                subjects: subjects.clone(),
                message: e.to_string(),
            })?,
        };
        let stream_error =
            |message: String| ReadError::Stream { server: server.clone(), stream: name.clone(), message };
        let handle = context.get_stream(&name).await.map_err(|e| stream_error(e.to_string()))?;
        let mut consumer = handle
            .create_consumer(consumer::pull::Config {
                deliver_policy: consumer::DeliverPolicy::All,
                ack_policy: consumer::AckPolicy::None,
                filter_subject: subjects.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| stream_error(format!("reading {subjects}: {e}")))?;
        // What the stream holds now: messages published while it is read are for the next read.
        let pending = consumer.cached_info().num_pending;
        let mut read = 0;
        let mut empty_fetches = 0;
        while read < pending {
            let want = (pending - read).min(READ_BATCH as u64) as usize;
            let mut messages = consumer
                .fetch()
                .max_messages(want)
                .expires(READ_WAIT)
                .messages()
                .await
                .map_err(|e| stream_error(format!("fetching: {e}")))?;
            let before = read;
            while let Some(message) = messages.next().await {
                let message = message.map_err(|e| stream_error(format!("fetching: {e}")))?;
                let sequence = message.info().map(|info| info.stream_sequence).unwrap_or_default();
                let subject = message.subject.to_string();
                read += 1;
                each(StreamMessage { subject: subject.clone(), sequence, payload: message.payload.clone() }).map_err(
                    |message| ReadError::Message {
                        server: server.clone(),
                        stream: name.clone(),
                        subject,
                        sequence,
                        message,
                    },
                )?;
            }
            if read > before {
                empty_fetches = 0;
                continue;
            }
            // Nothing came: the rest was removed meanwhile (limits, age), or the server is slow.
            // Not a short report without a word.
            let left = consumer.info().await.map_err(|e| stream_error(format!("fetching: {e}")))?.num_pending;
            if left == 0 {
                break;
            }
            empty_fetches += 1;
            if empty_fetches >= READ_TRIES {
                return Err(stream_error(format!(
                    "{read} of {pending} messages read, then nothing for {:?} ({left} still pending)",
                    READ_WAIT * READ_TRIES
                )));
            }
        }
        // An ephemeral consumer goes by itself after a while; no need to wait for that.
        let _ = handle.delete_consumer(&consumer.cached_info().name).await;
        Ok(read)
    }
}

fn check_prefix(prefix: &str) -> Result<(), NatsError> {
    let bad = |message: &str| NatsError::Prefix { prefix: prefix.to_string(), message: message.to_string() };
    if prefix.is_empty() {
        return Err(bad("empty"));
    }
    if prefix.split('.').any(str::is_empty) {
        return Err(bad("an empty token (a leading, trailing or doubled `.`)"));
    }
    if prefix.chars().any(|c| c == '*' || c == '>') {
        return Err(bad("a wildcard (`*`, `>`) cannot be published to"));
    }
    if prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("whitespace or a control character"));
    }
    Ok(())
}

/// The server's address without a user's password or token, for logs and metrics.
fn redacted(server: &ServerAddr) -> String {
    let url = server.clone().into_inner();
    let mut shown = url.clone();
    if !url.username().is_empty() || url.password().is_some() {
        let _ = shown.set_username("***");
        let _ = shown.set_password(None);
    }
    shown.to_string().trim_end_matches('/').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_one_token_per_host() {
        let nats = Nats::new("nats://127.0.0.1:4222", "credwatch.alerts", NatsOptions::default()).unwrap();
        assert_eq!(nats.subject("build-7"), "credwatch.alerts.build-7");
        assert_eq!(nats.subject("node1.example.com"), "credwatch.alerts.node1_example_com");
        assert_eq!(nats.subject("a *>b\n"), "credwatch.alerts.a___b_");
        assert_eq!(nats.subject(""), "credwatch.alerts.unknown");
        assert_eq!(nats.name(), "nats:nats://127.0.0.1:4222/credwatch.alerts");
    }

    #[test]
    fn bad_prefixes_urls_and_files_are_named() {
        let error =
            |url: &str, prefix: &str, options: NatsOptions| Nats::new(url, prefix, options).err().unwrap().to_string();
        for (prefix, why) in
            [("", "empty"), ("a..b", "empty token"), (".a", "empty token"), ("a.*", "wildcard"), ("a b", "whitespace")]
        {
            let error = error("nats://127.0.0.1:4222", prefix, NatsOptions::default());
            assert!(error.starts_with("NATS subject prefix") && error.contains(why), "{prefix:?}: {error}");
        }
        assert!(error("http://x:1", "p", NatsOptions::default()).starts_with("NATS URL \"http://x:1\""));
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.creds");
        let options = NatsOptions { credentials_file: Some(missing.clone()), ..Default::default() };
        let text = error("nats://127.0.0.1:4222", "p", options);
        assert!(text.starts_with(&format!("NATS credentials file {}", missing.display())), "{text}");
        let garbage = dir.path().join("garbage.creds");
        std::fs::write(&garbage, "not credentials").unwrap();
        let options = NatsOptions { credentials_file: Some(garbage.clone()), ..Default::default() };
        let text = error("nats://127.0.0.1:4222", "p", options);
        assert!(text.starts_with(&format!("NATS credentials file {}", garbage.display())), "{text}");
        let options = NatsOptions { ca_file: Some(missing.clone()), ..Default::default() };
        assert!(error("nats://127.0.0.1:4222", "p", options).starts_with("CA file"));
    }

    #[test]
    fn the_name_hides_credentials_in_the_url() {
        let nats = Nats::new("nats://user:pass@127.0.0.1:4222", "p", NatsOptions::default()).unwrap();
        assert_eq!(nats.name(), "nats:nats://***@127.0.0.1:4222/p");
    }
}
