//! The agent's Prometheus metrics and the `/metrics` endpoint that serves them. prometheus-client
//! keeps the counters and writes the OpenMetrics text; hyper serves it on tokio. Whoever knows a
//! figure updates it here: the sensor its events and losses, the engine its alerts. The outputs'
//! figures (deliveries, failures, drops, queue, spool) are the dispatcher's own counts, read at
//! each scrape rather than kept twice (see [`Metrics::watch_outputs`]).

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use credwatch_core::alert::Severity;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `exec`, `fork`, `open`, `connect`, ...
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BufferLabels {
    /// The kernel ring buffer: `bulk`, `priority`, ...
    pub buffer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AlertLabels {
    pub rule: String,
    pub severity: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutputLabels {
    /// The output's name (`webhook:https://...`, `nats:...`), as its transport gives it.
    pub output: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    pub output: String,
    /// The dropped alerts' severity.
    pub severity: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabels {
    /// The kernel map (`marks`, `credential_inodes`, ...).
    pub map: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `applied`, or `refused` (a bad configuration or rule set; the old one kept running).
    pub result: String,
}

/// Every figure the agent exports, all named `credwatch_*`.
pub struct Metrics {
    registry: Registry,
    pub events: Family<KindLabels, Counter>,
    pub events_lost: Family<BufferLabels, Counter>,
    pub alerts: Family<AlertLabels, Counter>,
    pub marked_processes: Gauge,
    /// Entries in use over capacity, 0 to 1.
    pub map_fill: Family<MapLabels, Gauge<f64, AtomicU64>>,
    pub programs_attached: Gauge,
    pub reloads: Family<ReloadLabels, Counter>,
    pub start_up_seconds: Gauge<f64, AtomicU64>,
    /// Clients of the local alerts socket dropped because they stopped reading.
    pub alert_clients_dropped: Counter,
    /// Reads the kernel's figures at a scrape (see [`Metrics::watch_kernel`]).
    kernel: OnceLock<KernelSource>,
}

/// The kernel's figures at a scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelFigures {
    pub marked_processes: u64,
    /// Map name, entries in use over capacity (0 to 1).
    pub map_fill: Vec<(String, f64)>,
    pub programs_attached: u64,
}

type KernelSource = Box<dyn Fn() -> KernelFigures + Send + Sync>;

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("credwatch");
        let metrics = Metrics {
            events: Family::default(),
            events_lost: Family::default(),
            alerts: Family::default(),
            marked_processes: Gauge::default(),
            map_fill: Family::default(),
            programs_attached: Gauge::default(),
            reloads: Family::default(),
            start_up_seconds: Gauge::default(),
            alert_clients_dropped: Counter::default(),
            registry: Registry::default(),
            kernel: OnceLock::new(),
        };
        registry.register("events", "Events from the sensor, by kind", metrics.events.clone());
        registry.register(
            "events_lost",
            "Kernel records lost (a full ring buffer), by buffer",
            metrics.events_lost.clone(),
        );
        registry.register("alerts", "Alerts raised, by rule and severity", metrics.alerts.clone());
        registry.register(
            "marked_processes",
            "Processes marked as package code in the kernel",
            metrics.marked_processes.clone(),
        );
        registry.register("map_fill", "Kernel map entries in use over capacity (0 to 1)", metrics.map_fill.clone());
        registry.register("programs_attached", "Kernel programs attached", metrics.programs_attached.clone());
        registry.register("reloads", "Reloads (SIGHUP), by result", metrics.reloads.clone());
        registry.register_with_unit(
            "start_up",
            "Time from the agent's start to watching",
            Unit::Seconds,
            metrics.start_up_seconds.clone(),
        );
        registry.register(
            "alert_clients_dropped",
            "Clients of the local alerts socket dropped for not reading",
            metrics.alert_clients_dropped.clone(),
        );
        Metrics { registry, ..metrics }
    }

    /// Exports the outputs' figures, read from `source` at each scrape: the dispatcher's own
    /// counts, so that they are never out of step with what it logs.
    pub fn watch_outputs(&mut self, source: impl Fn() -> Vec<(String, OutputFigures)> + Send + Sync + 'static) {
        self.registry.register_collector(Box::new(OutputsCollector(Box::new(source))));
    }

    /// Sets the kernel's gauges (marked processes, map fill, programs attached) from `source`
    /// at each scrape: they are read from the kernel's maps, a syscall per entry, so only when
    /// someone looks (and `source` may answer from a recent reading). Once the sensor runs,
    /// which is after the metrics are served: the first source stays.
    pub fn watch_kernel(&self, source: impl Fn() -> KernelFigures + Send + Sync + 'static) {
        let _ = self.kernel.set(Box::new(source));
    }

    /// Counts an alert raised by the engine.
    pub fn alert(&self, rule: &str, severity: Severity) {
        self.alerts
            .get_or_create(&AlertLabels { rule: rule.to_string(), severity: severity.as_str().to_string() })
            .inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        if let Some(kernel) = self.kernel.get() {
            let figures = kernel();
            self.marked_processes.set(i64::try_from(figures.marked_processes).unwrap_or(i64::MAX));
            for (map, fill) in figures.map_fill {
                self.map_fill.get_or_create(&MapLabels { map }).set(fill);
            }
            self.programs_attached.set(i64::try_from(figures.programs_attached).unwrap_or(i64::MAX));
        }
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// One output's figures at a scrape.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputFigures {
    /// Alerts its receiver took.
    pub delivered: u64,
    /// Deliveries that failed and will be tried again.
    pub failed_attempts: u64,
    /// Alerts its receiver refused (not retried).
    pub refused: u64,
    /// Alerts dropped (a full spool), by severity: low, medium, high, critical.
    pub dropped: [u64; 4],
    /// Alerts it could not write to its spool (kept in memory, or dropped).
    pub unspooled: u64,
    /// Alerts waiting in its memory queue.
    pub queued: u64,
    /// Size of its disk spool.
    pub spool_bytes: u64,
}

type OutputSource = Box<dyn Fn() -> Vec<(String, OutputFigures)> + Send + Sync>;

/// One of an output's figures.
type Figure = fn(&OutputFigures) -> u64;

struct OutputsCollector(OutputSource);

impl fmt::Debug for OutputsCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OutputsCollector")
    }
}

impl Collector for OutputsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let outputs = (self.0)();
        let labels = |name: &str| OutputLabels { output: name.to_string() };
        let counters: [(&str, &str, Figure); 4] = [
            ("output_deliveries", "Alerts an output's receiver took", |f| f.delivered),
            ("output_failures", "Deliveries that failed and are tried again", |f| f.failed_attempts),
            ("output_refused", "Alerts an output's receiver refused (not retried)", |f| f.refused),
            ("output_unspooled", "Alerts an output could not write to its spool (kept in memory, or dropped)", |f| {
                f.unspooled
            }),
        ];
        for (name, help, value) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (output, figures) in &outputs {
                ConstCounter::new(value(figures)).encode(family.encode_family(&labels(output))?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "output_dropped",
            "Alerts an output dropped (its spool full), by severity: drops start with the lowest",
            None,
            MetricType::Counter,
        )?;
        for (output, figures) in &outputs {
            let severities = [Severity::Low, Severity::Medium, Severity::High, Severity::Critical];
            for (severity, dropped) in severities.iter().zip(figures.dropped) {
                let labels = DropLabels { output: output.clone(), severity: severity.as_str().to_string() };
                ConstCounter::new(dropped).encode(family.encode_family(&labels)?)?;
            }
        }
        let gauges: [(&str, &str, Option<&Unit>, Figure); 2] = [
            ("output_queue_depth", "Alerts waiting in an output's memory queue", None, |f| f.queued),
            ("output_spool", "Size of an output's disk spool", Some(&Unit::Bytes), |f| f.spool_bytes),
        ];
        for (name, help, unit, value) in gauges {
            let mut family = encoder.encode_descriptor(name, help, unit, MetricType::Gauge)?;
            for (output, figures) in &outputs {
                // Beyond i64 is beyond any queue or disk.
                let value = i64::try_from(value(figures)).unwrap_or(i64::MAX);
                ConstGauge::new(value).encode(family.encode_family(&labels(output))?)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("metrics listen address {addr}: {source}")]
pub struct MetricsError {
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

/// Binds the metrics address, so that a bad or taken one is an error at start-up.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, MetricsError> {
    TcpListener::bind(addr).await.map_err(|source| MetricsError { addr, source })
}

/// Serves `GET /metrics` on `listener` until the task is dropped. A client that misbehaves
/// loses its own connection only.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of file descriptors, say: the next accept may work.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let metrics = metrics.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&request, &metrics)) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

fn answer<B>(request: &Request<B>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, body, content_type) = if request.uri().path() != "/metrics" {
        (StatusCode::NOT_FOUND, Bytes::from_static(b"not found: the metrics are at /metrics\n"), "text/plain")
    } else if request.method() != Method::GET && request.method() != Method::HEAD {
        (StatusCode::METHOD_NOT_ALLOWED, Bytes::from_static(b"GET /metrics\n"), "text/plain")
    } else {
        (StatusCode::OK, Bytes::from(metrics.encode()), "application/openmetrics-text; version=1.0.0; charset=utf-8")
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::Ordering;

    #[tokio::test]
    async fn metrics_are_served_at_metrics() {
        let mut metrics = Metrics::new();
        let delivered = Arc::new(AtomicU64::new(7));
        let counted = delivered.clone();
        metrics.watch_outputs(move || {
            let figures = OutputFigures {
                delivered: counted.load(Ordering::Relaxed),
                failed_attempts: 3,
                refused: 1,
                dropped: [5, 0, 0, 0],
                unspooled: 6,
                queued: 2,
                spool_bytes: 4096,
            };
            vec![("nats:nats://127.0.0.1:4222/credwatch".to_string(), figures)]
        });
        let marked = Arc::new(AtomicU64::new(4));
        let marked_now = marked.clone();
        metrics.watch_kernel(move || KernelFigures {
            marked_processes: marked_now.load(Ordering::Relaxed),
            map_fill: vec![("marks".to_string(), 0.25)],
            programs_attached: 60,
        });
        let metrics = Arc::new(metrics);
        metrics.events.get_or_create(&KindLabels { kind: "open".into() }).inc_by(3);
        metrics.alert("ssh-private-key", Severity::High);
        metrics.start_up_seconds.set(0.5);
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, metrics.clone()));

        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(crate::webhook::tls_config(None, false).unwrap())
            .build()
            .unwrap();
        let response = client.get(format!("http://{addr}/metrics")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(response.headers()[CONTENT_TYPE].to_str().unwrap().starts_with("application/openmetrics-text"));
        let text = response.text().await.unwrap();
        for line in [
            "credwatch_events_total{kind=\"open\"} 3",
            "credwatch_alerts_total{rule=\"ssh-private-key\",severity=\"high\"} 1",
            "credwatch_output_deliveries_total{output=\"nats:nats://127.0.0.1:4222/credwatch\"} 7",
            "credwatch_output_failures_total{output=\"nats:nats://127.0.0.1:4222/credwatch\"} 3",
            "credwatch_output_refused_total{output=\"nats:nats://127.0.0.1:4222/credwatch\"} 1",
            "credwatch_output_dropped_total{output=\"nats:nats://127.0.0.1:4222/credwatch\",severity=\"low\"} 5",
            "credwatch_output_unspooled_total{output=\"nats:nats://127.0.0.1:4222/credwatch\"} 6",
            "credwatch_output_dropped_total{output=\"nats:nats://127.0.0.1:4222/credwatch\",severity=\"critical\"} 0",
            "credwatch_output_queue_depth{output=\"nats:nats://127.0.0.1:4222/credwatch\"} 2",
            "credwatch_output_spool_bytes{output=\"nats:nats://127.0.0.1:4222/credwatch\"} 4096",
            "credwatch_map_fill{map=\"marks\"} 0.25",
            "credwatch_marked_processes 4",
            "credwatch_programs_attached 60",
            "credwatch_start_up_seconds 0.5",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
        }
        // Read at each scrape.
        delivered.store(8, Ordering::Relaxed);
        marked.store(9, Ordering::Relaxed);
        let text = client.get(format!("http://{addr}/metrics")).send().await.unwrap().text().await.unwrap();
        for line in [
            "credwatch_output_deliveries_total{output=\"nats:nats://127.0.0.1:4222/credwatch\"} 8",
            "credwatch_marked_processes 9",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
        }
        let response = client.get(format!("http://{addr}/")).send().await.unwrap();
        assert_eq!(response.status(), 404);
        let response = client.post(format!("http://{addr}/metrics")).send().await.unwrap();
        assert_eq!(response.status(), 405);
        server.abort();
    }

    #[tokio::test]
    async fn a_taken_address_is_an_error_naming_it() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let error = bind(addr).await.unwrap_err().to_string();
        assert!(error.starts_with(&format!("metrics listen address {addr}: ")), "{error}");
    }
}
