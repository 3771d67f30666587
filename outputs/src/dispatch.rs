//! The dispatcher: a pipeline [`Sink`] that renders each alert once and hands it to every
//! output whose filter takes it, without ever waiting for one; and, on a tokio runtime of its
//! own thread, one task per output that delivers.
//!
//! Per output: the engine's thread puts the alert in a bounded queue (`try_send`); the output's
//! task takes it into the output's [`Spool`] on disk, then delivers from the spool, oldest
//! first, in batches, and forgets an alert only once its transport said the receiver has it
//! (at-least-once; receivers dedup on `event.id`). When the queue is full (a flood faster than
//! the task takes it), the engine's thread appends the alert to the spool itself: into the
//! spool's buffered writer, under its lock (a write(2) per 64 KiB, no file per alert; measured
//! 2-7 µs per alert with the queue full, rendering included, against 40-600 µs with a file per
//! alert: `examples/spool_flood.rs`), and the task writes out what the writers hold as soon
//! as it wakes. Not a bigger queue or a hand-over to the task alone: once that is full, the
//! engine would have to wait or drop alerts, and the spool's cap is the one place alerts are
//! dropped. Each alert gets its sequence number when it is handed over, and the task takes
//! from the spool only once it has taken every alert queued before, so delivery keeps the
//! engine's order either way.
//!
//! A failed delivery is retried after an exponential backoff with jitter, for as long as it
//! takes; meanwhile alerts go on piling up in the spool, up to its cap, past which the least
//! severe are dropped first ([`Spool::put`]), each drop counted and logged. A spool whose
//! folder cannot be written (full, read-only) keeps them in memory meanwhile, counted
//! (`unspooled`), and the log says so once when it starts and once when it ends. At shutdown, the
//! tasks get a short time to deliver what is left; what is still undelivered stays in the
//! spool, and the next agent delivers it first.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Duration,
};

use bytes::Bytes;
use credwatch_core::{
    alert::Alert,
    engine::Engine,
    event::Event,
    pipeline::{Sink, SinkError},
};
use tokio::{
    sync::{mpsc, watch, Notify},
    task::JoinHandle,
    time::Instant,
};
use tracing::{error, info, warn};

use crate::{
    destination::Destination,
    file::FileOutput,
    filter::{Filter, OutputConfig, DEFAULT_FILE_KEEP, DEFAULT_FILE_MAX_BYTES, DEFAULT_QUEUE, DEFAULT_SPOOL_MAX_BYTES},
    nats::Nats,
    spool::{self, Change, Spool, SpoolError, Spooled, MAX_MEMORY_ONLY, RETRY_UNWRITABLE, SEVERITIES},
    syslog::Syslog,
    transport::{Outgoing, Transport, TransportError},
    webhook::{Webhook, WebhookFormat},
};

/// Where spools go by default.
pub const DEFAULT_SPOOL_DIR: &str = "/var/lib/credwatch/spool";
/// Most alerts handed to a transport at once.
const MAX_BATCH: usize = 256;
/// How long a transport may take to end its session at shutdown when the grace is spent.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("output {output}: {source}")]
    Spool { output: String, source: SpoolError },
    #[error("output {output}: opening it")]
    Open { output: String, source: std::io::Error },
    /// The output's own settings are wrong (a CA file that cannot be read, a bad URL, ...).
    #[error("output {output}: {source}")]
    Transport { output: String, source: Box<dyn std::error::Error + Send + Sync> },
    #[error("output {0} is given twice")]
    Twice(String),
    #[error("starting the outputs' runtime")]
    Runtime(#[source] std::io::Error),
}

/// Every transport the agent builds, as one type: a match the destinations add to.
pub enum AnyTransport {
    File(FileOutput),
    Syslog(Syslog),
    /// `webhook` and `falcosidekick`: one transport, two body formats.
    Webhook(Webhook),
    /// Boxed: its client's TLS configuration makes it ~1 KiB, 6 times the others.
    Nats(Box<Nats>),
}

impl Transport for AnyTransport {
    fn name(&self) -> &str {
        match self {
            AnyTransport::File(file) => file.name(),
            AnyTransport::Syslog(syslog) => syslog.name(),
            AnyTransport::Webhook(webhook) => webhook.name(),
            AnyTransport::Nats(nats) => nats.name(),
        }
    }

    async fn send(&mut self, batch: &[Outgoing]) -> Result<(), TransportError> {
        match self {
            AnyTransport::File(file) => file.send(batch).await,
            AnyTransport::Syslog(syslog) => syslog.send(batch).await,
            AnyTransport::Webhook(webhook) => webhook.send(batch).await,
            AnyTransport::Nats(nats) => nats.send(batch).await,
        }
    }

    fn reopen(&mut self) {
        match self {
            AnyTransport::File(file) => file.reopen(),
            AnyTransport::Syslog(syslog) => syslog.reopen(),
            AnyTransport::Webhook(webhook) => webhook.reopen(),
            AnyTransport::Nats(nats) => nats.reopen(),
        }
    }

    async fn close(&mut self) {
        match self {
            AnyTransport::File(file) => file.close().await,
            AnyTransport::Syslog(syslog) => syslog.close().await,
            AnyTransport::Webhook(webhook) => webhook.close().await,
            AnyTransport::Nats(nats) => nats.close().await,
        }
    }
}

/// The transport of one configured output, ready (a file opened, ...), or why not.
pub fn transport_for(config: &OutputConfig) -> Result<AnyTransport, OutputError> {
    match &config.to {
        Destination::File(path) => FileOutput::open(
            path,
            config.max_bytes.unwrap_or(DEFAULT_FILE_MAX_BYTES),
            config.keep.unwrap_or(DEFAULT_FILE_KEEP),
        )
        .map(AnyTransport::File)
        .map_err(|source| OutputError::Open { output: config.to.to_string(), source }),
        Destination::Syslog(target) => {
            Syslog::new(target.clone(), config.syslog_options()).map(AnyTransport::Syslog).map_err(bad(config))
        }
        Destination::Webhook(url) => Webhook::new(url, config.webhook_options(WebhookFormat::Ecs))
            .map(AnyTransport::Webhook)
            .map_err(bad(config)),
        Destination::Falcosidekick(url) => Webhook::new(url, config.webhook_options(WebhookFormat::Falcosidekick))
            .map(AnyTransport::Webhook)
            .map_err(bad(config)),
        Destination::Nats { url, subject_prefix } => Nats::new(url, subject_prefix, config.nats_options())
            .map(|nats| AnyTransport::Nats(Box::new(nats)))
            .map_err(bad(config)),
    }
}

fn bad<E: std::error::Error + Send + Sync + 'static>(config: &OutputConfig) -> impl FnOnce(E) -> OutputError + '_ {
    |source| OutputError::Transport { output: config.to.to_string(), source: Box::new(source) }
}

/// Exponential backoff with jitter: the n-th wait is drawn in `[d/2, d]`, with `d` doubling
/// from `base` up to `max`, so that many agents whose receiver came back do not retry in step.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff { base, max, attempt: 0 }
    }

    pub fn next_wait(&mut self) -> Duration {
        let ceiling = self.base.saturating_mul(1 << self.attempt.min(20)).min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        ceiling / 2 + ceiling.mul_f64(fastrand::f64() / 2.0)
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// How the dispatcher runs (the defaults, but for tests).
#[derive(Clone, Debug)]
pub struct DispatchOptions {
    pub spool_dir: PathBuf,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl DispatchOptions {
    pub fn new(spool_dir: &Path) -> DispatchOptions {
        DispatchOptions {
            spool_dir: spool_dir.to_owned(),
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
        }
    }
}

/// One output's counts, for the log and the metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub delivered: u64,
    /// Deliveries that failed and will be retried.
    pub failed_attempts: u64,
    /// Alerts the receiver refused for good (not retried).
    pub refused: u64,
    /// Alerts dropped because the spool was full, or could not be written and the memory kept
    /// meanwhile was full, by severity (low, medium, high, critical).
    pub dropped: [u64; 4],
    /// Alerts that could not be written to the spool (kept in memory, or dropped).
    pub unspooled: u64,
    /// Alerts in the queue, not yet taken to the spool.
    pub queued: u64,
    /// Alerts in the spool, not yet delivered, and their bytes.
    pub spooled: u64,
    pub spool_bytes: u64,
}

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    failed_attempts: AtomicU64,
    refused: AtomicU64,
    dropped: [AtomicU64; 4],
    unspooled: AtomicU64,
    queued: AtomicU64,
    spooled: AtomicU64,
    spool_bytes: AtomicU64,
}

/// What an output's two sides share.
struct Shared {
    name: String,
    spool: Mutex<Spool>,
    counters: Counters,
    /// One past the sequence number of the last alert put in the queue.
    queued_upto: AtomicU64,
    /// Set by `SIGHUP`: the transport reopens before its next delivery.
    reopen: AtomicBool,
    /// The engine's thread spooled an alert itself.
    spooled: Notify,
}

impl Shared {
    fn spool(&self) -> MutexGuard<'_, Spool> {
        // A panic while holding it left the spool's index as it was between two calls.
        self.spool.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn put(&self, seq: u64, item: Outgoing) {
        let mut spool = self.spool();
        let put = spool.put(seq, item);
        for (severity, dropped) in SEVERITIES.into_iter().zip(put.dropped).filter(|(_, n)| *n > 0) {
            self.counters.dropped[severity as usize].fetch_add(dropped, Ordering::Relaxed);
            warn!(
                output = self.name,
                severity = severity.as_str(),
                dropped,
                "output {}: spool full, {dropped} {} alerts dropped",
                self.name,
                severity.as_str()
            );
        }
        // Said once, when the spool is written again.
        for (severity, dropped) in SEVERITIES.into_iter().zip(put.unwritable) {
            self.counters.dropped[severity as usize].fetch_add(dropped, Ordering::Relaxed);
        }
        self.sync(&mut spool);
    }

    /// Writes out what the spool's writers hold (what the task took from the queue, or the
    /// engine's thread put), so that it survives the agent.
    fn flush(&self) {
        let mut spool = self.spool();
        spool.flush();
        self.sync(&mut spool);
    }

    /// Removes the segments the spool let go (delivered, or dropped for room by either side).
    fn reclaim(&self) {
        let doomed = self.spool().take_doomed();
        remove(doomed);
    }

    /// The counts from `spool`, and whether its folder stopped or started again taking alerts
    /// (one line each way, not one per alert).
    fn sync(&self, spool: &mut Spool) {
        self.counters.spooled.store(spool.len() as u64, Ordering::Relaxed);
        self.counters.spool_bytes.store(spool.bytes(), Ordering::Relaxed);
        self.counters.unspooled.store(spool.unspooled(), Ordering::Relaxed);
        for change in spool.take_changes() {
            match change {
                Change::Unwritable(error) => error!(
                    output = self.name,
                    "output {}: {error} ({}); alerts are kept in memory (up to {} MiB, the least severe dropped \
                     first past it) until it can be written, tried again every {} s",
                    self.name,
                    error.source,
                    MAX_MEMORY_ONLY >> 20,
                    RETRY_UNWRITABLE.as_secs()
                ),
                Change::Writable { kept, dropped } => warn!(
                    output = self.name,
                    kept,
                    dropped,
                    "output {}: the spool is written again; meanwhile {kept} alerts were kept in memory only \
                     (lost if the agent stops before delivering them) and {dropped} dropped for want of room",
                    self.name
                ),
            }
        }
    }

    fn counts(&self) -> Counts {
        let c = &self.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Counts {
            delivered: load(&c.delivered),
            failed_attempts: load(&c.failed_attempts),
            refused: load(&c.refused),
            dropped: [load(&c.dropped[0]), load(&c.dropped[1]), load(&c.dropped[2]), load(&c.dropped[3])],
            unspooled: load(&c.unspooled),
            queued: load(&c.queued),
            spooled: load(&c.spooled),
            spool_bytes: load(&c.spool_bytes),
        }
    }
}

struct Output {
    filter: Filter,
    queue: Option<mpsc::Sender<(u64, Outgoing)>>,
    shared: Arc<Shared>,
    next_seq: u64,
    task: Option<JoinHandle<()>>,
}

impl Output {
    /// Never waits: into the queue, else into the spool.
    fn offer(&mut self, item: Outgoing) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let Some(queue) = &self.queue else { return };
        match queue.try_send((seq, item)) {
            Ok(()) => {
                self.shared.counters.queued.fetch_add(1, Ordering::Relaxed);
                self.shared.queued_upto.store(seq + 1, Ordering::Release);
            }
            Err(mpsc::error::TrySendError::Full((seq, item)) | mpsc::error::TrySendError::Closed((seq, item))) => {
                self.shared.put(seq, item);
                self.shared.spooled.notify_one();
            }
        }
    }
}

/// The outputs' counts, read from any thread while the dispatcher runs.
#[derive(Clone)]
pub struct CountsReader(Vec<Arc<Shared>>);

impl CountsReader {
    /// Each output's name and counts.
    pub fn counts(&self) -> Vec<(String, Counts)> {
        self.0.iter().map(|shared| (shared.name.clone(), shared.counts())).collect()
    }
}

/// Every output, and the runtime their tasks run on.
pub struct Dispatcher {
    runtime: tokio::runtime::Runtime,
    options: DispatchOptions,
    outputs: Vec<Output>,
    names: BTreeSet<String>,
    stop: watch::Sender<Option<Instant>>,
}

impl Dispatcher {
    /// No outputs yet: [`Dispatcher::add`] them.
    pub fn new(options: DispatchOptions) -> Result<Dispatcher, OutputError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("credwatch-outputs")
            .enable_all()
            .build()
            .map_err(OutputError::Runtime)?;
        let (stop, _) = watch::channel(None);
        Ok(Dispatcher { runtime, options, outputs: Vec::new(), names: BTreeSet::new(), stop })
    }

    /// The configured outputs, each with its transport ([`transport_for`]) and its spool.
    pub fn start(options: DispatchOptions, outputs: &[OutputConfig]) -> Result<Dispatcher, OutputError> {
        let mut dispatcher = Dispatcher::new(options)?;
        for config in outputs {
            let transport = transport_for(config)?;
            dispatcher.add(config, transport)?;
        }
        Ok(dispatcher)
    }

    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    /// Starts delivering to `transport` as `config` says, with what its spool holds from before first.
    pub fn add<T: Transport>(&mut self, config: &OutputConfig, transport: T) -> Result<(), OutputError> {
        let name = config.to.to_string();
        if !self.names.insert(name.clone()) {
            return Err(OutputError::Twice(name));
        }
        let dir = self.options.spool_dir.join(spool_name(&name));
        // Shown in the log and the metrics as the transport says, without a URL's password or
        // query (a token); the spool's folder stays named after the destination as given.
        let name = transport.name().to_owned();
        let (spool, recovered) = Spool::open(&dir, config.spool_max_bytes.unwrap_or(DEFAULT_SPOOL_MAX_BYTES))
            .map_err(|source| OutputError::Spool { output: name.clone(), source })?;
        for problem in recovered {
            if problem.is_loss() {
                error!(output = name, "output {name}: {problem}");
            } else {
                warn!(output = name, "output {name}: {problem}");
            }
        }
        let next_seq = spool.next_seq();
        if !spool.is_empty() {
            info!(
                output = name,
                alerts = spool.len(),
                "output {name}: {} alerts spooled before, sent first",
                spool.len()
            );
        }
        let (queue, receiver) = mpsc::channel(config.queue.unwrap_or(DEFAULT_QUEUE));
        let shared = Arc::new(Shared {
            name,
            spool: Mutex::new(spool),
            counters: Counters::default(),
            queued_upto: AtomicU64::new(next_seq),
            reopen: AtomicBool::new(false),
            spooled: Notify::new(),
        });
        shared.sync(&mut shared.spool());
        let task = Task {
            transport,
            queue: Some(receiver),
            shared: Arc::clone(&shared),
            stop: self.stop.subscribe(),
            received_upto: next_seq,
            backoff: Backoff::new(self.options.backoff_base, self.options.backoff_max),
        };
        let task = self.runtime.spawn(task.run());
        self.outputs.push(Output { filter: config.filter(), queue: Some(queue), shared, next_seq, task: Some(task) });
        Ok(())
    }

    /// Hands `alert` to every output that takes it, rendered once.
    pub fn dispatch(&mut self, alert: &Alert) {
        let mut item = None;
        for output in self.outputs.iter_mut().filter(|output| output.filter.takes(alert)) {
            let item = item.get_or_insert_with(|| render(alert));
            output.offer(item.clone());
        }
    }

    /// `SIGHUP`: each output reopens what it opened by name before its next delivery.
    pub fn reopen(&self) {
        for output in &self.outputs {
            output.shared.reopen.store(true, Ordering::Relaxed);
            output.shared.spooled.notify_one();
        }
    }

    /// Each output's name and counts.
    pub fn counts(&self) -> Vec<(String, Counts)> {
        self.counts_reader().counts()
    }

    /// What reads the outputs' counts from another thread (the metrics endpoint's scrapes).
    pub fn counts_reader(&self) -> CountsReader {
        CountsReader(self.outputs.iter().map(|output| Arc::clone(&output.shared)).collect())
    }

    /// The runtime the outputs' tasks run on, for the agent's other I/O (the metrics endpoint).
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }

    /// Delivers what it can within `grace`, then stops; the rest stays spooled for the next
    /// start. Returns the counts then.
    pub fn shutdown(mut self, grace: Duration) -> Vec<(String, Counts)> {
        for output in &mut self.outputs {
            output.queue = None;
        }
        let deadline = Instant::now() + grace;
        self.stop.send_replace(Some(deadline));
        let tasks: Vec<JoinHandle<()>> = self.outputs.iter_mut().filter_map(|output| output.task.take()).collect();
        self.runtime.block_on(async {
            for task in tasks {
                // Every task ends at the deadline, once it has spooled what was queued; one stuck
                // in a blocking call past that is cut off with the runtime (what it had taken from
                // the queue is spooled already).
                let _ = tokio::time::timeout_at(deadline + Duration::from_secs(5), task).await;
            }
        });
        // Written out and tidied even when a task was cut off: the spool is whole for the next agent.
        for output in &self.outputs {
            output.shared.flush();
            output.shared.reclaim();
        }
        let counts = self.counts();
        for (name, counts) in &counts {
            if counts.spooled > 0 {
                warn!(
                    output = name,
                    alerts = counts.spooled,
                    "output {name}: {} alerts left in the spool, sent at the next start",
                    counts.spooled
                );
            }
        }
        self.runtime.shutdown_timeout(Duration::from_millis(100));
        counts
    }
}

/// The alert as its ECS JSON document, shared by every output.
pub fn render(alert: &Alert) -> Outgoing {
    // An `Alert` is strings, numbers and lists: serialising it cannot fail.
    let json = serde_json::to_vec(alert).unwrap_or_default();
    Outgoing {
        id: alert.event.id.clone(),
        severity: alert.rule.severity,
        host: alert.host.name.clone(),
        json: Bytes::from(json),
    }
}

/// A folder name for an output's spool: the name, readable, with a digest of it (two names
/// that read the same once sanitised still get two folders).
fn spool_name(name: &str) -> String {
    use sha2::Digest as _;
    let readable: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' })
        .take(80)
        .collect();
    let digest = sha2::Sha256::digest(name.as_bytes());
    format!("{readable}-{}", hex::encode(&digest[..6]))
}

/// Removes the segments a spool let go (delivered or dropped).
fn remove(doomed: Vec<Arc<Path>>) {
    for segment in doomed {
        let _ = std::fs::remove_file(segment);
    }
}

/// One output's delivery loop.
struct Task<T> {
    transport: T,
    queue: Option<mpsc::Receiver<(u64, Outgoing)>>,
    shared: Arc<Shared>,
    stop: watch::Receiver<Option<Instant>>,
    /// One past the last alert taken from the queue.
    received_upto: u64,
    backoff: Backoff,
}

impl<T: Transport> Task<T> {
    async fn run(mut self) {
        self.deliver().await;
        // What is left stays for the next agent, whole.
        self.take_queued();
        let deadline = *self.stop.borrow();
        if let Some(deadline) = deadline {
            let _ = tokio::time::timeout_at(deadline.max(Instant::now() + CLOSE_GRACE), self.transport.close()).await;
        }
    }

    async fn deliver(&mut self) {
        loop {
            self.take_queued();
            let deadline = *self.stop.borrow();
            let taken = {
                let mut spool = self.shared.spool();
                // Read under the spool's lock: the engine's thread queues an alert before it
                // spools later ones itself, each under the lock, so an alert seen in the spool
                // means every alert queued before it is counted here.
                if self.received_upto < self.shared.queued_upto.load(Ordering::Acquire) {
                    None
                } else {
                    let taken = spool.oldest(MAX_BATCH);
                    self.shared.sync(&mut spool);
                    Some(taken)
                }
            };
            let Some(taken) = taken else {
                // An alert queued before some in the spool is still on its way.
                self.receive().await;
                continue;
            };
            let batch = self.load(taken);
            if batch.is_empty() {
                if deadline.is_some() {
                    return;
                }
                self.wait(None).await;
                continue;
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return;
            }
            if self.shared.reopen.swap(false, Ordering::Relaxed) {
                self.transport.reopen();
            }
            let items: Vec<Outgoing> = batch.iter().map(|(_, item)| item.clone()).collect();
            // A delivery under way when the shutdown comes is cut off at its deadline.
            let mut stop = self.stop.clone();
            let shutdown = async {
                loop {
                    let deadline = *stop.borrow_and_update();
                    if let Some(deadline) = deadline {
                        tokio::time::sleep_until(deadline).await;
                        return;
                    }
                    if stop.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            };
            let result = tokio::select! {
                result = self.transport.send(&items) => result,
                () = shutdown => {
                    Err(TransportError::Retry { output: self.shared.name.clone(), message: "shutting down".into() })
                }
            };
            let done = match &result {
                Ok(()) => {
                    self.shared.counters.delivered.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    self.backoff.reset();
                    true
                }
                Err(TransportError::Refused { .. }) => {
                    self.shared.counters.refused.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    error!(
                        output = self.shared.name,
                        alerts = batch.len(),
                        "{} alerts refused: {}",
                        batch.len(),
                        result.as_ref().unwrap_err()
                    );
                    true
                }
                Err(error @ TransportError::Retry { .. }) => {
                    let attempts = self.shared.counters.failed_attempts.fetch_add(1, Ordering::Relaxed) + 1;
                    let wait = self.backoff.next_wait();
                    warn!(
                        output = self.shared.name,
                        attempts,
                        "delivery failed, retried in {:.1}s: {error}",
                        wait.as_secs_f64()
                    );
                    self.wait(Some(Instant::now() + wait)).await;
                    false
                }
            };
            if done {
                self.forget(batch.iter().map(|(seq, _)| *seq));
            }
        }
    }

    /// The alerts of a batch, read from disk outside the spool's lock. One that cannot be read
    /// is forgotten: when its segment is gone because it was dropped for room meanwhile, that
    /// was counted and logged then; otherwise (removed by hand, damaged) it is logged as lost now.
    fn load(&self, taken: Vec<(u64, Spooled)>) -> Vec<(u64, Outgoing)> {
        let mut batch = Vec::with_capacity(taken.len());
        let mut unreadable = Vec::new();
        for (seq, loaded) in spool::load(taken) {
            match loaded {
                Ok(item) => batch.push((seq, item)),
                Err(error) => unreadable.push((seq, error)),
            }
        }
        if !unreadable.is_empty() {
            let doomed = {
                let mut spool = self.shared.spool();
                for (seq, error) in unreadable {
                    if spool.forget([seq]) == 1 {
                        error!(
                            output = self.shared.name,
                            "output {}: a spooled alert is lost: {error}", self.shared.name
                        );
                    }
                }
                self.shared.sync(&mut spool);
                spool.take_doomed()
            };
            remove(doomed);
        }
        batch
    }

    /// Forgets delivered alerts, removing the segments left with nothing to deliver outside
    /// the lock.
    fn forget(&self, seqs: impl Iterator<Item = u64>) {
        let doomed = {
            let mut spool = self.shared.spool();
            spool.forget(seqs);
            self.shared.sync(&mut spool);
            spool.take_doomed()
        };
        remove(doomed);
    }

    /// Everything in the queue, into the spool, written out.
    fn take_queued(&mut self) {
        while let Some(Ok((seq, item))) = self.queue.as_mut().map(mpsc::Receiver::try_recv) {
            self.spool_one(seq, item);
        }
        self.shared.flush();
        self.shared.reclaim();
    }

    fn spool_one(&mut self, seq: u64, item: Outgoing) {
        self.shared.counters.queued.fetch_sub(1, Ordering::Relaxed);
        self.received_upto = seq + 1;
        self.shared.put(seq, item);
    }

    async fn receive(&mut self) {
        match self.queue.as_mut() {
            Some(queue) => match queue.recv().await {
                Some((seq, item)) => self.spool_one(seq, item),
                None => self.queue = None,
            },
            // Closed: everything queued was received.
            None => self.received_upto = self.shared.queued_upto.load(Ordering::Acquire),
        }
    }

    /// Until `until` (else until there is something new), or the shutdown's deadline, taking
    /// what is queued into the spool meanwhile.
    async fn wait(&mut self, until: Option<Instant>) {
        loop {
            let deadline = *self.stop.borrow();
            let until = match (until, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let sleep = async {
                match until {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending().await,
                }
            };
            let open = self.queue.is_some();
            tokio::select! {
                () = sleep => return,
                received = async { self.queue.as_mut().expect("open").recv().await }, if open => {
                    match received {
                        Some((seq, item)) => {
                            self.spool_one(seq, item);
                            self.take_queued();
                        }
                        None => self.queue = None,
                    }
                    if until.is_none() {
                        return;
                    }
                }
                () = self.shared.spooled.notified() => {
                    self.shared.flush();
                    self.shared.reclaim();
                    if until.is_none() {
                        return;
                    }
                }
                changed = self.stop.changed() => if changed.is_err() || until.is_none() { return },
            }
        }
    }
}

impl Sink for Dispatcher {
    fn event(&mut self, _: &Engine, _: &Event, alerts: &[Alert]) -> Result<(), SinkError> {
        alerts.iter().for_each(|alert| self.dispatch(alert));
        Ok(())
    }

    fn released(&mut self, _: &Engine, alerts: &[Alert]) -> Result<(), SinkError> {
        alerts.iter().for_each(|alert| self.dispatch(alert));
        Ok(())
    }

    fn end(&mut self, alerts: &[Alert]) -> Result<(), SinkError> {
        alerts.iter().for_each(|alert| self.dispatch(alert));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use credwatch_core::alert::Severity;

    use super::*;
    use crate::tests::alert;

    /// A receiver that fails its first `failures` deliveries (all of them with `usize::MAX`),
    /// then takes every batch.
    struct Flaky {
        failures: usize,
        received: Arc<Mutex<Vec<String>>>,
    }

    impl Transport for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }

        async fn send(&mut self, batch: &[Outgoing]) -> Result<(), TransportError> {
            if self.failures > 0 {
                self.failures -= 1;
                return Err(TransportError::Retry { output: "flaky".into(), message: "down".into() });
            }
            self.received.lock().unwrap().extend(batch.iter().map(|item| item.id.clone()));
            Ok(())
        }
    }

    fn options(dir: &Path) -> DispatchOptions {
        DispatchOptions {
            spool_dir: dir.to_owned(),
            backoff_base: Duration::from_millis(5),
            backoff_max: Duration::from_millis(20),
        }
    }

    fn config() -> OutputConfig {
        OutputConfig::to("file:/test/double".parse().unwrap())
    }

    fn start(dir: &Path, config: &OutputConfig, failures: usize) -> (Dispatcher, Arc<Mutex<Vec<String>>>) {
        let received = Arc::new(Mutex::new(Vec::new()));
        let mut dispatcher = Dispatcher::new(options(dir)).unwrap();
        dispatcher.add(config, Flaky { failures, received: Arc::clone(&received) }).unwrap();
        (dispatcher, received)
    }

    fn raise(dispatcher: &mut Dispatcher, ids: std::ops::Range<usize>, severity: Severity) {
        for n in ids {
            let mut alert = alert("ssh-private-key", "ssh", severity);
            alert.event.id = format!("{n:04}");
            dispatcher.dispatch(&alert);
        }
    }

    fn expected(ids: std::ops::Range<usize>) -> Vec<String> {
        ids.map(|n| format!("{n:04}")).collect()
    }

    #[test]
    fn a_receiver_that_fails_then_accepts_gets_everything_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        // A queue of 4: most of the 500 go to the spool from this thread, in between the queued ones.
        let config = OutputConfig { queue: Some(4), ..config() };
        let (mut dispatcher, received) = start(dir.path(), &config, 3);
        raise(&mut dispatcher, 0..500, Severity::High);
        let counts = dispatcher.shutdown(Duration::from_secs(10));
        assert_eq!(*received.lock().unwrap(), expected(0..500));
        let (_, counts) = &counts[0];
        assert_eq!((counts.delivered, counts.failed_attempts, counts.spooled, counts.spool_bytes), (500, 3, 0, 0));
        assert_eq!(counts.dropped, [0; 4]);
    }

    #[test]
    fn what_is_undelivered_at_shutdown_is_delivered_first_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (mut dispatcher, received) = start(dir.path(), &config(), usize::MAX);
        raise(&mut dispatcher, 0..20, Severity::Medium);
        // Retried, with the backoff, for as long as it runs (read as the metrics read it).
        let reader = dispatcher.counts_reader();
        while reader.counts()[0].1.failed_attempts < 3 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let counts = dispatcher.shutdown(Duration::from_millis(100));
        // The reader shares the spool, which one agent at a time may hold.
        drop(reader);
        assert!(received.lock().unwrap().is_empty());
        assert_eq!(counts[0].1.spooled, 20);
        // Meanwhile one alert was damaged on disk: said, left out, the others delivered.
        let spool = dir.path().join(spool_name(&config().to.to_string()));
        let segment = spool.join(format!("{:020}-medium.seg", 0));
        let mut data = std::fs::read(&segment).unwrap();
        let at = data.windows(11).position(|w| w == br#""id":"0004""#).unwrap();
        data[at + 7] = b'X';
        std::fs::write(&segment, data).unwrap();
        let (mut dispatcher, received) = start(dir.path(), &config(), 0);
        raise(&mut dispatcher, 20..30, Severity::Medium);
        let counts = dispatcher.shutdown(Duration::from_secs(10));
        let mut delivered = expected(0..30);
        delivered.remove(4);
        assert_eq!(*received.lock().unwrap(), delivered);
        assert_eq!((counts[0].1.delivered, counts[0].1.spooled, counts[0].1.spool_bytes), (29, 0, 0));
        // Delivered is reclaimed and not sent again by the next agent.
        let segments = std::fs::read_dir(&spool)
            .unwrap()
            .filter(|f| f.as_ref().unwrap().path().extension().is_some_and(|e| e == "seg"));
        assert_eq!(segments.count(), 0);
        let (dispatcher, received) = start(dir.path(), &config(), 0);
        assert_eq!(dispatcher.shutdown(Duration::from_secs(10))[0].1.delivered, 0);
        assert!(received.lock().unwrap().is_empty());
    }

    #[test]
    fn a_full_spool_drops_low_severity_first_and_counts_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut sized = alert("ssh-private-key", "ssh", Severity::High);
        sized.event.id = "0000".into();
        let size = spool::record_size(&render(&sized));
        let config = OutputConfig { spool_max_bytes: Some(10 * size), ..config() };
        let (mut dispatcher, _) = start(dir.path(), &config, usize::MAX);
        raise(&mut dispatcher, 0..8, Severity::Low);
        raise(&mut dispatcher, 8..14, Severity::High);
        raise(&mut dispatcher, 14..16, Severity::Low);
        let counts = dispatcher.shutdown(Duration::from_millis(100));
        // 16 alerts, room for 10: the 6 high ones pushed out 4 low ones; then the 2 new low
        // ones were the least.
        assert_eq!(counts[0].1.dropped, [6, 0, 0, 0], "{counts:?}");
        assert_eq!(counts[0].1.spooled, 10);
        let (dispatcher, received) = start(dir.path(), &config, 0);
        dispatcher.shutdown(Duration::from_secs(10));
        let mut kept = expected(0..4);
        kept.extend(expected(8..14));
        assert_eq!(*received.lock().unwrap(), kept);
    }

    #[test]
    fn each_output_takes_what_its_filter_lets_through() {
        let dir = tempfile::tempdir().unwrap();
        let mut dispatcher = Dispatcher::new(options(dir.path())).unwrap();
        let (high, everything) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let high_only = OutputConfig { min_severity: Some(Severity::High), ..config() };
        dispatcher.add(&high_only, Flaky { failures: 0, received: Arc::clone(&high) }).unwrap();
        let error = dispatcher.add(&config(), Flaky { failures: 0, received: Arc::clone(&everything) }).unwrap_err();
        assert!(matches!(error, OutputError::Twice(_)), "{error}");
        let all = OutputConfig::to("file:/test/other".parse().unwrap());
        dispatcher.add(&all, Flaky { failures: 0, received: Arc::clone(&everything) }).unwrap();
        raise(&mut dispatcher, 0..2, Severity::Low);
        raise(&mut dispatcher, 2..3, Severity::Critical);
        dispatcher.shutdown(Duration::from_secs(10));
        assert_eq!(*high.lock().unwrap(), ["0002"]);
        assert_eq!(*everything.lock().unwrap(), expected(0..3));
    }

    #[test]
    fn an_output_whose_settings_are_wrong_is_named_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut webhook = OutputConfig::to("webhook:https://127.0.0.1:9/alerts".parse().unwrap());
        webhook.ca_file = Some(dir.path().join("missing-ca.pem"));
        let error = Dispatcher::start(options(dir.path()), &[webhook]).err().unwrap().to_string();
        assert!(error.starts_with("output webhook:https://127.0.0.1:9/alerts: CA file "), "{error}");
        assert!(error.contains("missing-ca.pem"), "{error}");
        let mut syslog = OutputConfig::to("syslog:tcp:127.0.0.1:514".parse().unwrap());
        syslog.max_message = Some(10);
        let error = Dispatcher::start(options(dir.path()), &[syslog]).err().unwrap().to_string();
        assert!(error.starts_with("output syslog:tcp:127.0.0.1:514: "), "{error}");
        assert!(error.contains("max_message 10"), "{error}");
    }

    #[test]
    fn every_kind_of_destination_starts() {
        let dir = tempfile::tempdir().unwrap();
        let outputs: Vec<OutputConfig> = [
            "syslog:tcp:127.0.0.1:9",
            "syslog:udp:127.0.0.1:9",
            "nats:nats://127.0.0.1:9/credwatch",
            "falcosidekick:http://127.0.0.1:9/",
            "webhook:http://127.0.0.1:9/alerts",
        ]
        .iter()
        .map(|to| OutputConfig::to(to.parse().unwrap()))
        .collect();
        let dispatcher = Dispatcher::start(options(dir.path()), &outputs).unwrap();
        let names: Vec<String> = dispatcher.counts().into_iter().map(|(name, _)| name).collect();
        assert_eq!(names.len(), 5, "{names:?}");
        dispatcher.shutdown(Duration::from_millis(10));
        // The log and the metrics never show a URL's password or query.
        let secret = OutputConfig::to("webhook:https://user:secret@127.0.0.1:9/a?token=t0k".parse().unwrap());
        let dispatcher = Dispatcher::start(options(dir.path()), &[secret]).unwrap();
        assert_eq!(dispatcher.counts()[0].0, "webhook:https://user:***@127.0.0.1:9/a?***");
        dispatcher.shutdown(Duration::from_millis(10));
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_its_cap() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        for ceiling in [100, 200, 400, 800, 1000, 1000] {
            let wait = backoff.next_wait();
            let ceiling = Duration::from_millis(ceiling);
            assert!(wait >= ceiling / 2 && wait <= ceiling, "{wait:?} not in [{:?}, {ceiling:?}]", ceiling / 2);
        }
        backoff.reset();
        assert!(backoff.next_wait() <= Duration::from_millis(100));
        // Jitter: many agents do not all wait the same.
        let waits: BTreeSet<Duration> =
            (0..20).map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_wait()).collect();
        assert!(waits.len() > 1);
    }
}
