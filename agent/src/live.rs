//! Live modes: `watch`, `run` and `record` drive the sensor through the engine to the outputs
//! and (when recording) a trace writer, with [`pipeline::drive`] like `replay`. What is live only
//! stays here: the events the agent makes itself, `--enforce`'s verdict on a held connect,
//! when to stop (Ctrl-C, `run`'s command and its tree done, `--linger`), and `SIGHUP`'s reload of
//! the configuration and rules while the kernel programs stay attached.
//!
//! `run` and `record -- CMD`, CMD held before its exec and watched to the end of its tree, are in `run`;
//! what the agent gives back once start-up or a reload is over, in `resident`.

mod resident;
mod run;

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    os::unix::net::UnixStream,
    path::Path,
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use credwatch::sensor::{
    credentials::system_homes,
    lost_source,
    pins::{Gap, Started},
    Backend, MapSizes, Protection, Sensor, SensorError, SensorOptions,
};
use credwatch_core::{
    alert::Alert,
    engine::{Engine, EngineOptions},
    event::{Event, EventData},
    output::{escape, AlertSink},
    pipeline::{self, Control, DriveError, Pulled, Sink, SinkError, Source},
    rules::RuleSet,
    trace::{TraceHeader, TraceWriter, TRACE_SCHEMA},
};
use credwatch_outputs::{
    metrics::{self, BufferLabels, KernelFigures, KindLabels, Metrics, OutputFigures, ReloadLabels},
    Counts, DispatchOptions, Dispatcher, OutputConfig, DEFAULT_SPOOL_DIR,
};
use prometheus_client::metrics::counter::Counter;
use tracing::{info, warn};

pub use self::run::run_command;
use crate::{
    config::{Config, Layers},
    delivery::{start_outputs, stop_outputs},
    log,
};

/// How long one wait for kernel events lasts in `run`: how soon the end of CMD's tree is noticed
/// (its last processes' exits are records, but they are reaped after).
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long one wait lasts in `watch`: records and signals end it at once (see
/// [`Sensor::wake_on`]), and the sensor wakes for its own timers inside it, so an idle agent
/// sleeps for this long between two looks at the loop's control.
const IDLE_POLL_INTERVAL: Duration = Duration::from_secs(60);
/// How late a record may reach the engine after the time it carries (the bulk ring is read
/// every 10 ms while records flow; a loaded machine schedules the reader late): the live clock
/// releases an alert held for a configuration chain only this long after its window closed,
/// so that a record of the window still in a ring lowers it as a replay of the trace would.
const LATE_RECORDS: Duration = Duration::from_millis(100);
/// How old the kernel figures of the metrics may be when scraped again.
const KERNEL_FIGURES_AGE: Duration = Duration::from_secs(2);

/// systemd's service notifications (`Type=notify`, deploy/credwatch.service): `READY=1` once
/// watching, `WATCHDOG=1` from the loop, `RELOADING=1` and `STOPPING=1`. Without
/// `NOTIFY_SOCKET` (not under systemd) each is a no-op.
struct Systemd {
    /// A quarter of the unit's `WatchdogSec=` (`WATCHDOG_USEC`): the loop waits at most this
    /// long and pings when this much has passed, so two pings are at most half the timeout apart.
    ping_every: Option<Duration>,
    last_ping: Instant,
}

impl Systemd {
    fn new() -> Systemd {
        Systemd::with_watchdog(sd_notify::watchdog_enabled())
    }

    fn with_watchdog(timeout: Option<Duration>) -> Systemd {
        Systemd { ping_every: timeout.map(|timeout| timeout / 4), last_ping: Instant::now() }
    }

    /// The longest the loop may wait for records: an idle agent must still wake to ping.
    fn bound_wait(&self, wait: Duration) -> Duration {
        self.ping_every.map_or(wait, |every| wait.min(every))
    }

    fn notify(&self, states: &[sd_notify::NotifyState]) {
        if let Err(error) = sd_notify::notify(states) {
            warn!(
                "telling systemd ({}) failed: {error}",
                states.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            );
        }
    }

    /// From the loop: a ping when a quarter of the watchdog's timeout has passed since the last.
    fn tick(&mut self) {
        if self.ping_every.is_some_and(|every| self.last_ping.elapsed() >= every) {
            self.notify(&[sd_notify::NotifyState::Watchdog]);
            self.last_ping = Instant::now();
        }
    }

    fn reloading(&self) {
        // systemd wants the monotonic time with RELOADING=1 (`Type=notify-reload`).
        match sd_notify::NotifyState::monotonic_usec_now() {
            Ok(now) => self.notify(&[sd_notify::NotifyState::Reloading, now]),
            Err(_) => self.notify(&[sd_notify::NotifyState::Reloading]),
        }
    }
}

/// What a live session prints and writes.
pub struct Outputs<'a> {
    pub json: bool,
    pub rules: Option<&'a Path>,
    /// Appends every alert as a JSON line.
    pub alerts_file: Option<&'a Path>,
    /// Records every event to a trace file.
    pub trace: Option<&'a Path>,
    /// Kill package code in the kernel when it opens a `kill` rule's target or makes a
    /// blockable tamper syscall.
    pub enforce: bool,
    /// Alert on the project's own scripts and programs too.
    pub watch_project: bool,
    /// `--to`: where alerts go besides, each with its queue and spool.
    pub outputs: &'a [OutputConfig],
    pub spool_dir: Option<&'a Path>,
    /// `--metrics-listen`: where the Prometheus metrics are served.
    pub metrics_listen: Option<SocketAddr>,
    /// Machine-wide modes: where the kernel side is pinned, to outlive the agent.
    pub pin_dir: &'a Path,
    /// `--sensor`: which kernel programs.
    pub sensor: Backend,
    /// `--map-size`: kernel map sizes at load.
    pub map_sizes: MapSizes,
}

impl Outputs<'_> {
    pub fn from_config(config: &Config) -> Outputs<'_> {
        Outputs {
            json: config.json,
            rules: config.rules.as_deref(),
            alerts_file: config.alerts.as_deref(),
            trace: config.trace.as_deref(),
            enforce: config.enforce,
            watch_project: config.watch_project,
            outputs: &config.outputs,
            spool_dir: config.spool_dir.as_deref(),
            metrics_listen: config.metrics_listen,
            pin_dir: config.pin_dir(),
            sensor: config.sensor.backend(),
            map_sizes: config.map_sizes(),
        }
    }
}

pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|name| name.trim().to_owned()).unwrap_or_default()
}

/// Where the machine id is: systemd's file, else D-Bus's copy (older or systemd-less systems).
const MACHINE_ID_FILES: [&str; 2] = ["/etc/machine-id", "/var/lib/dbus/machine-id"];

/// The machine id, `host.id` of alerts and `host_id` of traces; read once (a missing one is said
/// once, not on every reload).
pub fn host_id() -> Option<String> {
    static ID: OnceLock<Option<String>> = OnceLock::new();
    ID.get_or_init(|| {
        let id = machine_id(&MACHINE_ID_FILES.map(Path::new));
        if id.is_none() {
            warn!("no machine id in {}: alerts carry no host.id", MACHINE_ID_FILES.join(" or "));
        }
        id
    })
    .clone()
}

/// The first of `files` that holds a machine id: 32 lowercase hex digits (machine-id(5)); an
/// empty or `uninitialized` file (an image not yet booted) holds none.
fn machine_id(files: &[&Path]) -> Option<String> {
    files.iter().find_map(|file| {
        let text = std::fs::read_to_string(file).ok()?;
        let id = text.trim();
        (id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then(|| id.to_owned())
    })
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|release| release.trim().to_owned()).unwrap_or_default()
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Set by SIGINT or SIGTERM: the loops finish their round and print a summary.
fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    Ok(stop)
}

/// Makes `signals` wake the sensor's wait whichever thread runs their handlers (see
/// [`Sensor::wake_on`]); their flags are set by the handlers registered beside.
fn wake_on_signals(sensor: &mut Sensor, signals: &[libc::c_int]) -> Result<()> {
    let (reader, writer) = UnixStream::pair().context("creating the signals' socket pair")?;
    for &signal in signals {
        let writer = writer.try_clone().context("creating the signals' socket pair")?;
        signal_hook::low_level::pipe::register(signal, writer).context("installing signal handlers")?;
    }
    sensor.wake_on(reader).context("creating the signals' socket pair")
}

/// The sensor as the pipeline's source: the events the agent made itself first (the trees
/// seeded from `/proc`, `run`'s root), then what the kernel sends, waiting up to `wait` for each
/// batch, and no longer than until the engine's held alerts are due. It never ends: the mode's
/// control stops it.
struct Live {
    sensor: Sensor,
    queued: Vec<Event>,
    wait: Duration,
    /// When the engine's earliest held alert is due ([`Engine::held_until`], event time).
    held_until: Option<u64>,
}

impl Source for Live {
    type Error = SensorError;

    fn pull(&mut self, batch: &mut Vec<Event>) -> Result<Pulled, SensorError> {
        if self.queued.is_empty() {
            let clock = self.clock_ns().unwrap_or_default();
            // Just past it: the clock must have gone beyond the window's end.
            let until_due = self
                .held_until
                .map(|until| Duration::from_nanos(until.saturating_sub(clock)) + Duration::from_millis(1));
            self.sensor.poll(until_due.map_or(self.wait, |due| self.wait.min(due)), batch)?;
        } else {
            batch.append(&mut self.queued);
        }
        Ok(Pulled::More)
    }

    fn clock_ns(&self) -> Option<u64> {
        Some(self.sensor.now_ns().saturating_sub(LATE_RECORDS.as_nanos() as u64))
    }
}

/// `--enforce`: the kernel stopped the process at this connect, and the engine's verdict decides
/// whether it ever runs again.
struct ConnectVerdict;

impl Sink for ConnectVerdict {
    fn event(&mut self, _: &Engine, event: &Event, alerts: &[Alert]) -> Result<(), SinkError> {
        if matches!(&event.data, EventData::Connect(connect) if connect.held) {
            let kill = alerts.iter().any(|alert| alert.event.outcome == "blocked" && alert.destination.is_some());
            let signal = if kill { libc::SIGKILL } else { libc::SIGCONT };
            // SAFETY: kill(2) on a process of a watched tree that the kernel stopped for us. It
            // cannot have exited while stopped, so the pid is still its own.
            unsafe { libc::kill(event.pid as libc::pid_t, signal) };
        }
        Ok(())
    }

    /// Held alerts are about reads, never a held connect.
    fn released(&mut self, _: &Engine, _: &[Alert]) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Says so when the kernel programs stopped reporting.
struct DetachedWarning;

impl Sink for DetachedWarning {
    fn event(&mut self, _: &Engine, event: &Event, _: &[Alert]) -> Result<(), SinkError> {
        if matches!(&event.data, EventData::Lost(lost) if lost.source == lost_source::DETACHED) {
            warn!("the kernel programs stopped reporting (detached?): events are being missed");
        }
        Ok(())
    }

    fn released(&mut self, _: &Engine, _: &[Alert]) -> Result<(), SinkError> {
        Ok(())
    }
}

/// `--metrics-listen`: the figures that the sensor, the engine and the reloads update; the
/// outputs' are read from the dispatcher at each scrape.
struct Telemetry {
    metrics: Arc<Metrics>,
    /// Events by kind, in the order of [`EventData::KINDS`]: counters looked up once, so that an event
    /// costs an increment and no label built.
    events: Vec<Counter>,
}

impl Telemetry {
    /// Binds `addr` on the outputs' runtime (an address that cannot be bound is an error now)
    /// and serves the metrics there.
    fn start(addr: SocketAddr, dispatcher: &Dispatcher) -> Result<Telemetry> {
        let mut metrics = Metrics::new();
        let counts = dispatcher.counts_reader();
        metrics.watch_outputs(move || {
            counts.counts().into_iter().map(|(name, counts)| (name, figures(&counts))).collect()
        });
        let metrics = Arc::new(metrics);
        let runtime = dispatcher.runtime();
        let listener = runtime.block_on(metrics::bind(addr)).context("serving the metrics (--metrics-listen)")?;
        runtime.spawn(metrics::serve(listener, Arc::clone(&metrics)));
        let events = EventData::KINDS
            .iter()
            .map(|kind| metrics.events.get_or_create(&KindLabels { kind: (*kind).to_owned() }).clone())
            .collect();
        Ok(Telemetry { metrics, events })
    }

    fn reload(&self, result: &str) {
        self.metrics.reloads.get_or_create(&ReloadLabels { result: result.to_owned() }).inc();
    }

    /// Serves the sensor's kernel figures, read at a scrape and at most every
    /// [`KERNEL_FIGURES_AGE`] (a syscall per map entry).
    fn watch_kernel(&self, sensor: &Sensor) -> Result<()> {
        let gauges = sensor.gauges().context("opening the kernel maps for the metrics")?;
        let last: Mutex<Option<(Instant, KernelFigures)>> = Mutex::new(None);
        self.metrics.watch_kernel(move || {
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            match &*last {
                Some((read, figures)) if read.elapsed() < KERNEL_FIGURES_AGE => figures.clone(),
                _ => {
                    let counts = gauges.read();
                    let figures = KernelFigures {
                        marked_processes: counts.marked_processes,
                        map_fill: counts.map_fill.into_iter().map(|(map, fill)| (map.to_owned(), fill)).collect(),
                        programs_attached: counts.programs_attached,
                    };
                    *last = Some((Instant::now(), figures.clone()));
                    figures
                }
            }
        });
        Ok(())
    }
}

impl Sink for Telemetry {
    fn event(&mut self, _: &Engine, event: &Event, alerts: &[Alert]) -> Result<(), SinkError> {
        self.events[event.data.kind_index()].inc();
        // The sensor reports its losses as events (by ring buffer, `marks` for a full map of
        // marked processes, `detached`): what the engine sees, replay included.
        if let EventData::Lost(lost) = &event.data {
            self.metrics.events_lost.get_or_create(&BufferLabels { buffer: lost.source.clone() }).inc_by(lost.count);
        }
        for alert in alerts {
            self.metrics.alert(&alert.rule.id, alert.rule.severity);
        }
        Ok(())
    }

    fn released(&mut self, _: &Engine, alerts: &[Alert]) -> Result<(), SinkError> {
        for alert in alerts {
            self.metrics.alert(&alert.rule.id, alert.rule.severity);
        }
        Ok(())
    }

    fn end(&mut self, alerts: &[Alert]) -> Result<(), SinkError> {
        for alert in alerts {
            self.metrics.alert(&alert.rule.id, alert.rule.severity);
        }
        Ok(())
    }
}

fn figures(counts: &Counts) -> OutputFigures {
    OutputFigures {
        delivered: counts.delivered,
        failed_attempts: counts.failed_attempts,
        refused: counts.refused,
        dropped: counts.dropped,
        unspooled: counts.unspooled,
        queued: counts.queued,
        spool_bytes: counts.spool_bytes,
    }
}

/// The sensor, the engine and the outputs, wired together.
struct Session {
    live: Live,
    engine: Engine,
    sink: AlertSink,
    /// `--to`'s outputs, when any (or `--metrics-listen`, which runs on its runtime).
    dispatcher: Option<Dispatcher>,
    telemetry: Option<Telemetry>,
    /// Alerts written by the sinks that a reload replaced.
    written_before: u64,
    recorder: Option<TraceWriter>,
    started: Instant,
    /// `watch`: set by `SIGHUP`, and what to reload from.
    reload: Option<(Arc<AtomicBool>, Reload)>,
    systemd: Systemd,
    /// `watch`: the local alert log and its socket.
    local: Option<crate::local::Local>,
}

/// What `SIGHUP` reloads from, and what is in force.
struct Reload {
    layers: Layers,
    config: Config,
}

impl Session {
    /// `command` is CMD for a `run`, empty to watch the whole machine; `contained`, the files
    /// its box replaced (`run --contain`).
    fn start(outputs: &Outputs, command: &[String], contained: BTreeSet<String>) -> Result<Session> {
        let started = Instant::now();
        let rules = RuleSet::load_without_samples(outputs.rules).context("loading rules")?;
        // Before the sensor's BTF parses, start-up's peak: what parsing the rules ran and freed.
        resident::release_after_loading();
        let recorder = outputs.trace.map(|path| open_trace(path, &rules, command)).transpose()?;
        // Before the sensor: an output that cannot start stops credwatch before it watches.
        let mut dispatcher = start_outputs(outputs.outputs, outputs.spool_dir)?;
        let telemetry = match outputs.metrics_listen {
            Some(addr) => {
                if dispatcher.is_none() {
                    // No output: a dispatcher with none, for its runtime; nothing is spooled.
                    let spool_dir = outputs.spool_dir.unwrap_or(Path::new(DEFAULT_SPOOL_DIR));
                    dispatcher =
                        Some(Dispatcher::new(DispatchOptions::new(spool_dir)).context("starting the runtime")?);
                }
                dispatcher.as_ref().map(|dispatcher| Telemetry::start(addr, dispatcher)).transpose()?
            }
            None => None,
        };
        let options = SensorOptions { backend: outputs.sensor, enforce: outputs.enforce, map_sizes: outputs.map_sizes };
        let mut sensor = if command.is_empty() {
            let (sensor, started) = Sensor::start_pinned(&rules.kernel_roots(), outputs.pin_dir, options)
                .context("starting the eBPF sensor")?;
            say_how_started(outputs.pin_dir, &started);
            sensor
        } else {
            Sensor::start(&rules.kernel_roots(), false, options).context("starting the eBPF sensor")?
        };
        say_which_sensor(&sensor, outputs.enforce);
        let rules = Arc::new(rules);
        sensor
            .protect(Protection { rules: Arc::clone(&rules), homes: system_homes(), enforce: outputs.enforce })
            .context("registering credential files with the kernel")?;
        if let Some(telemetry) = &telemetry {
            telemetry.watch_kernel(&sensor)?;
        }
        let sink = AlertSink::new(outputs.json, outputs.alerts_file, false)
            .with_context(|| format!("opening {}", outputs.alerts_file.unwrap_or(Path::new("")).display()))?;
        let engine = Engine::new(rules, EngineOptions { contained, ..engine_options(outputs) });
        let live = Live { sensor, queued: Vec::new(), wait: POLL_INTERVAL, held_until: None };
        if let Some(telemetry) = &telemetry {
            telemetry.metrics.start_up_seconds.set(started.elapsed().as_secs_f64());
        }
        Ok(Session {
            live,
            engine,
            sink,
            dispatcher,
            telemetry,
            written_before: 0,
            recorder,
            started,
            reload: None,
            systemd: Systemd::new(),
            local: None,
        })
    }

    /// Runs the pipeline until `control` stops it, then emits the engine's end-of-stream alerts.
    /// A `SIGHUP` (with [`Session::reload`] set) pauses it for a reload, then it goes on.
    fn drive(&mut self, mut control: impl FnMut(&mut Live, &Engine) -> Control) -> Result<()> {
        loop {
            let hangup = self.reload.as_ref().map(|(hangup, _)| Arc::clone(hangup));
            let systemd = &mut self.systemd;
            let mut control = |live: &mut Live, engine: &Engine| {
                systemd.tick();
                live.held_until = engine.held_until();
                if hangup.as_ref().is_some_and(|hangup| hangup.swap(false, Ordering::Relaxed)) {
                    Control::Pause
                } else {
                    control(live, engine)
                }
            };
            let (mut warning, mut verdict) = (DetachedWarning, ConnectVerdict);
            let mut sinks: Vec<&mut dyn Sink> = vec![&mut warning];
            if let Some(recorder) = &mut self.recorder {
                sinks.push(recorder);
            }
            sinks.push(&mut self.sink);
            if let Some(local) = &mut self.local {
                sinks.push(local);
            }
            if let Some(dispatcher) = &mut self.dispatcher {
                sinks.push(dispatcher);
            }
            if let Some(telemetry) = &mut self.telemetry {
                sinks.push(telemetry);
            }
            sinks.push(&mut verdict);
            let done =
                pipeline::drive(&mut self.live, &mut self.engine, &mut sinks, None, &mut control).map_err(|error| {
                    match error {
                        DriveError::Source(error) => anyhow::Error::new(error).context("reading kernel events"),
                        DriveError::Sink(error) => anyhow::Error::from(error),
                    }
                })?;
            if done != Control::Pause {
                return Ok(());
            }
            self.reload();
        }
    }

    /// `SIGHUP`: the configuration file and the rules read again and put in force, with the
    /// kernel programs attached throughout and the engine's process table kept. Anything wrong
    /// and nothing changes: the log says why.
    fn reload(&mut self) {
        let Some((_, reload)) = &self.reload else { return };
        // Whatever becomes of the reload: logrotate moved the files and waits for this.
        if let Some(dispatcher) = &self.dispatcher {
            dispatcher.reopen();
        }
        self.systemd.reloading();
        let started = Instant::now();
        let (file, old) = (reload.layers.file.clone(), reload.config.clone());
        let result = self.try_reload(&old);
        // Refused or not, the agent runs on.
        self.systemd.notify(&[sd_notify::NotifyState::Ready]);
        if let Some(telemetry) = &self.telemetry {
            telemetry.reload(if result.is_ok() { "applied" } else { "refused" });
        }
        match result {
            Ok(config) => {
                let file = file.map(|file| escape(&file.display().to_string()).into_owned());
                let (rules, ms) = (self.engine.rules().rules().len(), started.elapsed().as_millis() as u64);
                let what = file.as_ref().map(|file| format!("the configuration ({file}) and ")).unwrap_or_default();
                info!(file, rules, ms, "reloaded {what}{rules} rules in {ms} ms");
                if let Some((_, reload)) = &mut self.reload {
                    reload.config = config;
                }
                // The old rules are dropped, and the new ones were parsed with code idle otherwise.
                resident::release_after_loading();
            }
            Err(error) => {
                let error = escape(&format!("{error:#}")).into_owned();
                warn!(error, "reload refused, the running configuration and rules stay: {error}");
            }
        }
    }

    fn try_reload(&mut self, old: &Config) -> Result<Config> {
        let Some((_, reload)) = &self.reload else { anyhow::bail!("nothing to reload from") };
        let loaded = reload.layers.load()?;
        for warning in &loaded.warnings {
            warn!("{}", escape(warning));
        }
        let config = loaded.config;
        let restart = old.restart_only_changes(&config);
        if !restart.is_empty() {
            anyhow::bail!("{} cannot change while credwatch runs: restart it for that", restart.join(", "));
        }
        let outputs = Outputs::from_config(&config);
        let rules = Arc::new(RuleSet::load_without_samples(outputs.rules).context("loading rules")?);
        self.engine.check_reload(&rules)?;
        let sink = AlertSink::new(outputs.json, outputs.alerts_file, false)
            .with_context(|| format!("opening {}", outputs.alerts_file.unwrap_or(Path::new("")).display()))?;
        let protection = Protection { rules: Arc::clone(&rules), homes: system_homes(), enforce: outputs.enforce };
        if let Err(error) = self.live.sensor.protect(protection) {
            // Back to what was in force: the kernel's maps are only ever brought in line with a table.
            let running = Protection {
                rules: Arc::clone(self.engine.shared_rules()),
                homes: system_homes(),
                enforce: old.enforce,
            };
            if let Err(again) = self.live.sensor.protect(running) {
                warn!("re-registering the running rules' credential files failed too: {again}");
            }
            return Err(error).context("registering the new rules' credential files with the kernel");
        }
        self.engine.reload(rules, engine_options(&outputs))?;
        self.written_before += self.sink.written();
        self.sink = sink;
        log::set_level(config.log_level);
        Ok(config)
    }

    /// Prints the summary and closes the trace; returns the number of alerts.
    fn finish(self) -> Result<u64> {
        let sensor = self.live.sensor.stats();
        let engine = self.engine.stats();
        let (lost, alerts) =
            (sensor.lost + sensor.priority_lost + sensor.marks_full, self.written_before + self.sink.written());
        let seconds = self.started.elapsed().as_secs_f64();
        if let Some(recorder) = self.recorder {
            recorder.finish()?;
        }
        if let Some(dispatcher) = self.dispatcher {
            stop_outputs(dispatcher);
        }
        if let Some(dir) = self.live.sensor.finish().context("leaving the kernel programs pinned")? {
            let dir = escape(&dir.display().to_string()).into_owned();
            info!(
                pin_dir = dir,
                "the kernel programs stay attached and recording (pinned in {dir}) for the next `credwatch watch`; `credwatch stop --pin-dir {dir}` detaches them"
            );
        }
        // The summary is the last record.
        info!(
            events = engine.events,
            lost, alerts, seconds, "{} events, {lost} lost, {alerts} alerts in {seconds:.1}s", engine.events
        );
        Ok(alerts)
    }
}

/// Which kernel programs run, and how `--enforce` blocks with them.
fn say_which_sensor(sensor: &Sensor, enforce: bool) {
    let backend = sensor.backend().to_string();
    // Expected where fentry cannot load (lockdown, this kind of kernel): said once, not warned.
    if let Some(why) = sensor.fallback() {
        let why = escape(why).into_owned();
        info!(sensor = backend, "the fentry backend does not load here ({why}): the tracepoint backend runs");
    }
    for unwatched in sensor.unwatched() {
        let (syscall, why) = (unwatched.syscall, escape(&unwatched.why).into_owned());
        warn!(sensor = backend, syscall, "{syscall} is not watched by the {backend} backend on this kernel: {why}");
    }
    let deny = if sensor.lsm() { "lsm" } else { "kill" };
    if enforce {
        info!(sensor = backend, enforce = deny, "sensor: {backend} backend; --enforce blocks by {deny}");
    } else {
        info!(sensor = backend, "sensor: {backend} backend");
    }
}

/// One line on how the pinned kernel side was found.
fn say_how_started(dir: &Path, started: &Started) {
    let dir = escape(&dir.display().to_string()).into_owned();
    match started {
        Started::Fresh => {}
        Started::Adopted(Gap { since_ns, until_ns, clean_stop, previous_pid }) => {
            let (down_from, down_to) = (rfc3339(*since_ns), rfc3339(*until_ns));
            let seconds = until_ns.saturating_sub(*since_ns) as f64 / 1e9;
            let how = if *clean_stop { "stopped" } else { "died or was killed" };
            warn!(
                pin_dir = dir,
                down_from,
                down_to,
                seconds,
                previous_pid,
                clean_stop,
                "adopted the kernel programs pinned in {dir}: no agent read them from {down_from} to {down_to} ({seconds:.1} s; the agent before, pid {previous_pid}, {how}); what they recorded meanwhile is read first, its alerts carry `credwatch.gap`"
            );
        }
        Started::Replaced(why) => {
            warn!(pin_dir = dir, "replaced the kernel programs pinned in {dir} ({why})");
        }
        Started::Unpinned(why) => {
            warn!(pin_dir = dir, "the kernel programs are not pinned in {dir}: {why}");
        }
    }
}

fn rfc3339(time_ns: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(time_ns))
        .ok()
        .and_then(|time| time.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

fn engine_options(outputs: &Outputs) -> EngineOptions {
    EngineOptions {
        host_name: host_name(),
        host_id: host_id(),
        agent_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
        watch_project: outputs.watch_project,
        ..EngineOptions::default()
    }
}

fn open_trace(path: &Path, rules: &RuleSet, command: &[String]) -> Result<TraceWriter> {
    let start_time = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .context("formatting the start time")?;
    let header = TraceHeader {
        credwatch_trace: TRACE_SCHEMA,
        credwatch_version: env!("CARGO_PKG_VERSION").to_owned(),
        host: host_name(),
        host_id: host_id(),
        kernel: kernel_release(),
        start_time,
        rules_digest: rules.digest(),
        scope: if command.is_empty() { "machine" } else { "command" }.to_owned(),
        command: command.to_vec(),
    };
    Ok(TraceWriter::create(path, &header)?)
}

/// `watch`, or `record` without CMD: every package tree on the machine until Ctrl-C; `SIGHUP`
/// reloads `layers` (the configuration file) and the rules. `local_alerts` (`watch`): the local
/// alert log kept and served on its socket.
pub fn watch_machine(config: &Config, layers: Layers, local_alerts: bool) -> Result<ExitCode> {
    let stop = stop_flag()?;
    let hangup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&hangup))
        .context("installing signal handlers")?;
    let mut session = Session::start(&Outputs::from_config(config), &[], BTreeSet::new())?;
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    wake_on_signals(&mut session.live.sensor, &[SIGINT, SIGTERM, SIGHUP])?;
    session.live.wait = session.systemd.bound_wait(IDLE_POLL_INTERVAL);
    session.reload = Some((hangup, Reload { layers, config: config.clone() }));
    let dropped = session.telemetry.as_ref().map(|telemetry| telemetry.metrics.alert_clients_dropped.clone());
    if local_alerts {
        session.local =
            crate::local::Local::start(config.alert_log(), config.alerts_socket(), dropped.unwrap_or_default());
    }
    if let Some(local) = &session.local {
        session.engine.mark_selftests(local.selftest_roots());
    }
    let managers = session.engine.rules().kernel_roots();
    session.live.queued = session.live.sensor.seed(&managers).context("seeding running package trees from /proc")?;
    session.live.sensor.count_stops_from_now();
    let (rules, startup_ms) = (session.engine.rules().rules().len(), session.started.elapsed().as_millis() as u64);
    info!(rules, startup_ms, "watching package trees ({rules} rules) after {startup_ms} ms; Ctrl-C to stop");
    resident::release_after_loading();
    session.systemd.notify(&[sd_notify::NotifyState::Ready]);
    session.drive(|_, _| if stop.load(Ordering::Relaxed) { Control::Stop } else { Control::Continue })?;
    session.systemd.notify(&[sd_notify::NotifyState::Stopping]);
    session.finish()?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The e2e test (tests/tests/systemd.rs) sees the pings, but on a busy machine the records of
    /// other package trees wake the agent anyway: the bound on the idle wait is checked here.
    #[test]
    fn the_watchdog_bounds_the_idle_wait_to_a_quarter_of_its_timeout() {
        let systemd = Systemd::with_watchdog(Some(Duration::from_secs(2)));
        assert_eq!(systemd.bound_wait(IDLE_POLL_INTERVAL), Duration::from_millis(500));
        assert_eq!(systemd.bound_wait(POLL_INTERVAL), POLL_INTERVAL);
        assert_eq!(Systemd::with_watchdog(None).bound_wait(IDLE_POLL_INTERVAL), IDLE_POLL_INTERVAL);
    }

    #[test]
    fn the_machine_id_is_the_first_file_holding_one() {
        let dir = tempfile::tempdir().unwrap();
        let (etc, dbus, missing) = (dir.path().join("etc"), dir.path().join("dbus"), dir.path().join("none"));
        let id = "0123456789abcdef0123456789abcdef";
        std::fs::write(&dbus, format!("{id}\n")).unwrap();
        for unset in ["", "uninitialized\n", "0123456789ABCDEF0123456789ABCDEF\n", "\u{1b}[2J"] {
            std::fs::write(&etc, unset).unwrap();
            assert_eq!(machine_id(&[&missing, &etc, &dbus]).as_deref(), Some(id), "{unset:?}");
            assert_eq!(machine_id(&[&missing, &etc]), None, "{unset:?}");
        }
        std::fs::write(&etc, "fedcba9876543210fedcba9876543210\n").unwrap();
        assert_eq!(machine_id(&[&etc, &dbus]).as_deref(), Some("fedcba9876543210fedcba9876543210"));
    }
}
