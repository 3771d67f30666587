//! The network outputs and the metrics with the real binary and the real servers, started here
//! on loopback: rsyslog over TCP and RELP, NATS JetStream, an HTTPS webhook with the test's own CA, and
//! Prometheus scraping `--metrics-listen`.

use std::{
    collections::BTreeSet,
    fs,
    path::PathBuf,
    process::Child,
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{
    credwatch_binary,
    servers::{free_port, signal, structured_data, HttpsReceiver, NatsServer, Prometheus, Rsyslog},
    Run, Sandbox,
};
use serde_json::Value;

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "{what}: not after {timeout:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// `credwatch run OPTIONS` with a package that reads the fake SSH key, to its end.
fn read_the_key(sandbox: &Sandbox, options: &[String]) -> (Run, Value) {
    let key = sandbox.credential(".ssh/id_ed25519");
    let release = sandbox.top().join("release-key");
    fs::write(&release, "").unwrap();
    let run = sandbox.wait(sandbox.spawn_reader("net-pkg", options, std::slice::from_ref(&key), &release));
    run.assert_exit(10);
    let alert = run.expect_alert(&key);
    (run, alert)
}

fn spool(sandbox: &Sandbox) -> String {
    sandbox.top().join("spool").to_string_lossy().into_owned()
}

#[test]
fn an_alert_reaches_rsyslog_over_tcp_with_its_structured_data() {
    let sandbox = Sandbox::new();
    let rsyslog = Rsyslog::start(&sandbox.top().join("rsyslog"));
    let to = format!("syslog:tcp:127.0.0.1:{}", rsyslog.port);
    let (run, alert) = read_the_key(&sandbox, &["--to".into(), to, "--spool-dir".into(), spool(&sandbox)]);
    let id = alert["event"]["id"].as_str().unwrap().to_owned();
    let mut found = None;
    wait_until("the alert in rsyslog's file", Duration::from_secs(20), || {
        found = rsyslog.messages().into_iter().find(|m| structured_data(m)["id"] == id.as_str());
        found.is_some()
    });
    let message = found.unwrap();
    let sd = structured_data(&message);
    assert_eq!(sd["rule"], alert["rule"]["id"], "{message:#}\n{}", run.describe());
    assert_eq!(sd["severity"], alert["rule"]["severity"]);
    assert_eq!(sd["package"], "net-pkg");
    assert_eq!(sd["lifecycle"], "postinstall");
    assert_eq!(sd["file"], alert["file"]["path"]);
    assert_eq!(message["app-name"], "credwatch", "{message:#}");
    assert_eq!(message["procid"], run_pid(&message), "{message:#}");
    assert!(run.stderr.contains("1 delivered"), "{}", run.describe());
}

/// rsyslog's `procid`: the agent's pid, whatever it was; a number.
fn run_pid(message: &Value) -> Value {
    let procid = message["procid"].as_str().unwrap_or_default();
    assert!(procid.parse::<u32>().is_ok(), "{message:#}");
    Value::String(procid.to_owned())
}

#[test]
fn metrics_listen_is_scraped_by_prometheus() {
    let sandbox = Sandbox::new();
    let port = free_port();
    let target = format!("127.0.0.1:{port}");
    let prometheus = Prometheus::start(&sandbox.top().join("prometheus"), &target);
    let key = sandbox.credential(".ssh/id_ed25519");
    let release = sandbox.top().join("release");
    let out = sandbox.top().join("out.jsonl");
    let options = [
        "--metrics-listen".to_owned(),
        target.clone(),
        "--to".into(),
        format!("file:{}", out.display()),
        "--spool-dir".into(),
        spool(&sandbox),
    ];
    let child = sandbox.spawn_reader("net-pkg", &options, std::slice::from_ref(&key), &release);
    let alert = sandbox.wait_for_alert(&key, Duration::from_secs(30)).expect("the key's alert");
    let rule = alert["rule"]["id"].as_str().unwrap();
    let severity = alert["rule"]["severity"].as_str().unwrap();
    let number = |s: &Value| s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    prometheus.wait_for("up{job=\"credwatch\"}", |s| s["value"][1] == "1");
    let expr = format!("credwatch_alerts_total{{rule=\"{rule}\",severity=\"{severity}\"}}");
    prometheus.wait_for(&expr, |s| number(s) > 0.0);
    prometheus.wait_for("credwatch_events_total{kind=\"open\"}", |s| s["value"][1] != "0");
    let output = format!("file:{}", out.display());
    prometheus.wait_for(&format!("credwatch_output_deliveries_total{{output=\"{output}\"}}"), |s| s["value"][1] == "1");
    prometheus.wait_for("credwatch_start_up_seconds", |s| number(s) > 0.0);
    // The sensor's figures: the command's tree is marked while it waits (the copy of sh, its
    // sh, the sleeps in turn).
    prometheus.wait_for("credwatch_marked_processes", |s| number(s) >= 2.0);
    prometheus.wait_for("credwatch_map_fill{map=\"marks\"}", |s| number(s) > 0.0 && number(s) < 1.0);
    prometheus.wait_for("credwatch_map_fill{map=\"credential_inodes\"}", |s| number(s) > 0.0);
    prometheus.wait_for("credwatch_programs_attached", |s| number(s) > 20.0);
    fs::write(&release, "").unwrap();
    sandbox.wait(child).assert_exit(10);

    // `watch`, scraped by a Prometheus of its own (nothing of the run above in it): every link
    // pinned in its directory is a program attached, and SIGHUP's reload is counted.
    let target = format!("127.0.0.1:{}", free_port());
    let prometheus = Prometheus::start(&sandbox.top().join("prometheus-watch"), &target);
    let mut command = sandbox.command(credwatch_binary());
    command.args(["watch", "--metrics-listen", &target, "--pin-dir"]).arg(sandbox.pin_dir());
    let mut watch = sandbox.spawn(command);
    wait_until("credwatch watching", Duration::from_secs(60), || {
        assert!(watch.try_wait().unwrap().is_none(), "{}", sandbox.collect(None, Duration::ZERO).describe());
        sandbox.collect(None, Duration::ZERO).stderr.contains("watching")
    });
    let links = fs::read_dir(sandbox.pin_dir())
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("link_"))
        .count();
    prometheus.wait_for("credwatch_programs_attached", |s| s["value"][1] == links.to_string().as_str());
    signal(&watch, "-HUP");
    prometheus.wait_for("credwatch_reloads_total{result=\"applied\"}", |s| s["value"][1] == "1");
    signal(&watch, "-TERM");
    sandbox.wait(watch).assert_exit(0);
}

#[test]
fn a_metrics_address_that_cannot_be_bound_is_a_start_up_error() {
    let sandbox = Sandbox::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let run = sandbox.run_with(&sandbox.work(), &["--metrics-listen", &addr], &["true"], &[]);
    run.assert_exit(1);
    assert!(run.stderr.contains(&format!("metrics listen address {addr}")), "{}", run.describe());
    let run = sandbox.run_with(&sandbox.work(), &["--metrics-listen", "localhost"], &["true"], &[]);
    run.assert_exit(2);
}

const NATS_PREFIX: &str = "credwatch.alerts";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// What the stream holds, in its order: (subject, Nats-Msg-Id, the alert).
fn read_stream(server: &NatsServer) -> Vec<(String, String, Value)> {
    use async_nats::jetstream::consumer;
    use futures_util::StreamExt as _;
    runtime().block_on(async {
        let client = async_nats::connect(server.url()).await.unwrap();
        let context = async_nats::jetstream::new(client);
        let stream = context.get_stream("CREDWATCH").await.unwrap();
        let consumer = stream
            .create_consumer(consumer::pull::Config {
                deliver_policy: consumer::DeliverPolicy::All,
                ack_policy: consumer::AckPolicy::None,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut got = Vec::new();
        loop {
            let mut messages =
                consumer.fetch().max_messages(500).expires(Duration::from_millis(500)).messages().await.unwrap();
            let before = got.len();
            while let Some(message) = messages.next().await {
                let message = message.unwrap();
                let id = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Msg-Id"))
                    .map(|v| v.to_string())
                    .unwrap_or_default();
                let alert = serde_json::from_slice(&message.payload).unwrap_or(Value::Null);
                got.push((message.subject.to_string(), id, alert));
            }
            if got.len() == before {
                return got;
            }
        }
    })
}

fn subject(host: &str) -> String {
    format!("{NATS_PREFIX}.{}", host.replace(['.', '*', '>', ' '], "_"))
}

#[test]
fn an_alert_is_in_the_nats_stream_on_its_host_subject_with_its_id() {
    let sandbox = Sandbox::new();
    let server = NatsServer::start(&sandbox.top().join("nats"));
    server.create_stream(NATS_PREFIX, Duration::from_secs(600));
    let to = format!("nats:{}/{NATS_PREFIX}", server.url());
    let (run, alert) = read_the_key(&sandbox, &["--to".into(), to, "--spool-dir".into(), spool(&sandbox)]);
    let id = alert["event"]["id"].as_str().unwrap();
    let stream = read_stream(&server);
    let ours: Vec<_> = stream.iter().filter(|(_, msg_id, _)| msg_id == id).collect();
    assert_eq!(ours.len(), 1, "{stream:#?}\n{}", run.describe());
    let (got_subject, _, payload) = ours[0];
    assert_eq!(*got_subject, subject(alert["host"]["name"].as_str().unwrap()));
    assert_eq!(*payload, alert, "the stream holds the ECS alert as written");
}

fn raised(sandbox: &Sandbox) -> Vec<Value> {
    sandbox.alerts_now().into_iter().filter(|a| a["package"]["name"] == "net-pkg").collect()
}

/// A receiver that the outage test stops, kills and brings back.
trait Receiver {
    /// The `--to` destination.
    fn to(&self) -> String;
    /// The agent's options that deliver to it: `--to` it, or a configuration file where it
    /// needs knobs of its own (a CA file).
    fn options(&self) -> Vec<String> {
        vec!["--to".to_owned(), self.to()]
    }
    fn child(&self) -> &Child;
    /// Starts it again where it was, with what it had stored.
    fn back(&mut self);
    /// In the receiver's order, the `event.id` and file path of each alert of the test's
    /// package it holds, repeats included.
    fn delivered(&self) -> Vec<(String, String)>;
}

/// The outage: 1,000 alerts raised while the receiver is stopped (SIGSTOP), then
/// killed, with the agent restarted once in between; the receiver back, every
/// alert arrives, each id exactly once after dedup, in the order raised (one host).
fn outage(sandbox: &Sandbox, receiver: &mut dyn Receiver) {
    let files = sandbox.secrets(1000);
    let options = [receiver.options(), vec!["--spool-dir".into(), spool(sandbox)]].concat();
    signal(receiver.child(), "-STOP");
    let release = sandbox.top().join("release-1");
    let first = sandbox.spawn_reader("net-pkg", &options, &files[..500], &release);
    wait_until("500 alerts raised", Duration::from_secs(120), || raised(sandbox).len() >= 500);
    fs::write(&release, "").unwrap();
    let run = sandbox.wait(first);
    run.assert_exit(10);
    eprintln!("first agent: {}", run.stderr.lines().filter(|l| l.contains("output ")).collect::<Vec<_>>().join("\n"));
    signal(receiver.child(), "-KILL");

    let release = sandbox.top().join("release-2");
    let second = sandbox.spawn_reader("net-pkg", &options, &files[500..], &release);
    wait_until("1000 alerts raised", Duration::from_secs(120), || raised(sandbox).len() >= 1000);
    receiver.back();
    let started = Instant::now();
    let unique = |got: &[(String, String)]| got.iter().map(|(id, _)| id.clone()).collect::<BTreeSet<_>>().len();
    let mut got = Vec::new();
    let deadline = Duration::from_secs(120);
    while unique(&got) < 1000 && started.elapsed() < deadline {
        thread::sleep(Duration::from_millis(200));
        got = receiver.delivered();
    }
    eprintln!(
        "{} of 1000 alerts delivered {:.1} s after the receiver came back",
        unique(&got),
        started.elapsed().as_secs_f64()
    );
    fs::write(&release, "").unwrap();
    let run = sandbox.wait(second);
    run.assert_exit(10);

    let raised = raised(sandbox);
    assert_eq!(raised.len(), 1000, "{}", run.describe());
    let raised_ids: BTreeSet<String> = raised.iter().map(|a| a["event"]["id"].as_str().unwrap().to_owned()).collect();
    let mut seen = BTreeSet::new();
    let order: Vec<String> = got.into_iter().filter(|(id, _)| seen.insert(id.clone())).map(|(_, path)| path).collect();
    let missing = raised_ids.difference(&seen).count();
    assert_eq!(missing, 0, "{missing} of 1000 alerts never arrived\n{}", run.describe());
    assert_eq!(seen, raised_ids, "delivered ids are not the raised ones");
    assert_eq!(order, files, "delivered out of order");
    assert!(run.stderr.contains("0 dropped, 0 left in the spool"), "{}", run.describe());
}

struct Nats(NatsServer);

impl Receiver for Nats {
    fn to(&self) -> String {
        format!("nats:{}/{NATS_PREFIX}", self.0.url())
    }

    fn child(&self) -> &Child {
        self.0.child.as_ref().unwrap()
    }

    fn back(&mut self) {
        self.0.kill();
        self.0.restart();
    }

    fn delivered(&self) -> Vec<(String, String)> {
        let stream = read_stream(&self.0);
        let host_subject = |alert: &Value| subject(alert["host"]["name"].as_str().unwrap_or_default());
        assert!(stream.iter().all(|(s, _, a)| *s == host_subject(a)), "a subject is not the host's");
        assert!(stream.iter().all(|(_, id, a)| a["event"]["id"] == id.as_str()), "a Nats-Msg-Id is not event.id");
        stream
            .into_iter()
            .filter(|(_, _, a)| a["package"]["name"] == "net-pkg")
            .map(|(_, id, a)| (id, a["file"]["path"].as_str().unwrap_or_default().to_owned()))
            .collect()
    }
}

#[test]
fn a_thousand_alerts_reach_nats_stopped_then_killed_across_an_agent_restart() {
    let sandbox = Sandbox::new();
    let server = NatsServer::start(&sandbox.top().join("nats"));
    server.create_stream(NATS_PREFIX, Duration::from_secs(600));
    outage(&sandbox, &mut Nats(server));
}

/// rsyslog over RELP: a plain TCP receiver loses what was written to it stopped, once killed
/// (measured with this test over `syslog:tcp:`: the first agent's 500 alerts "delivered", none
/// arrived); over RELP an alert counts as delivered once rsyslog answered for it.
struct Relp(Rsyslog);

impl Receiver for Relp {
    fn to(&self) -> String {
        format!("syslog:relp:127.0.0.1:{}", self.0.relp_port)
    }

    fn child(&self) -> &Child {
        self.0.child.as_ref().unwrap()
    }

    fn back(&mut self) {
        self.0.kill();
        self.0.run();
    }

    fn delivered(&self) -> Vec<(String, String)> {
        self.0
            .messages()
            .iter()
            .map(structured_data)
            .filter(|sd| sd["package"] == "net-pkg")
            .map(|sd| {
                (sd["id"].as_str().unwrap_or_default().to_owned(), sd["file"].as_str().unwrap_or_default().to_owned())
            })
            .collect()
    }
}

#[test]
fn a_thousand_alerts_reach_rsyslog_over_relp_stopped_then_killed_across_an_agent_restart() {
    let sandbox = Sandbox::new();
    let rsyslog = Rsyslog::start(&sandbox.top().join("rsyslog"));
    outage(&sandbox, &mut Relp(rsyslog));
}

#[test]
fn an_ecs_alert_reaches_an_https_webhook_with_a_given_ca_and_bearer_token() {
    let sandbox = Sandbox::new();
    let dir = sandbox.top().join("receiver");
    let receiver = HttpsReceiver::start(&dir);
    let (port, ca_file) = (receiver.port, receiver.ca_file.clone());
    let config = sandbox.top().join("credwatch.yaml");
    fs::write(
        &config,
        format!(
            "outputs:\n  - to: webhook:https://127.0.0.1:{port}/credwatch/alerts\n    ca_file: {}\n    bearer_token: e2e-token\n    request_timeout: 5\n",
            ca_file.display()
        ),
    )
    .unwrap();
    let options = ["--config".to_owned(), config.to_string_lossy().into_owned(), "--spool-dir".into(), spool(&sandbox)];
    let (run, alert) = read_the_key(&sandbox, &options);
    let requests: Vec<Value> = fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let id = alert["event"]["id"].as_str().unwrap();
    let ours: Vec<&Value> = requests
        .iter()
        .filter(|r| serde_json::from_str::<Value>(r["body"].as_str().unwrap()).unwrap()["event"]["id"] == id)
        .collect();
    assert_eq!(ours.len(), 1, "{requests:#?}\n{}", run.describe());
    assert_eq!(ours[0]["path"], "/credwatch/alerts");
    assert_eq!(ours[0]["authorization"], "Bearer e2e-token");
    assert_eq!(ours[0]["content_type"], "application/json");
    let body: Value = serde_json::from_str(ours[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body, alert, "the ECS alert as written");

    // A CA file that is missing is an error of the configuration, at its key; one that holds no
    // certificate stops credwatch at start-up, naming the output.
    let config = sandbox.top().join("bad-ca.yaml");
    let missing = dir.join("nope.pem");
    fs::write(
        &config,
        format!("outputs:\n  - to: webhook:https://127.0.0.1:{port}/a\n    ca_file: {}\n", missing.display()),
    )
    .unwrap();
    let run = sandbox.run_with(&sandbox.work(), &["--config", &config.to_string_lossy()], &["true"], &[]);
    assert_ne!(run.status.and_then(|s| s.code()), Some(0), "{}", run.describe());
    assert!(run.stderr.contains(&format!("`ca_file`: {} is not a file", missing.display())), "{}", run.describe());
    let empty = dir.join("empty.pem");
    fs::write(&empty, "not a certificate\n").unwrap();
    fs::write(
        &config,
        format!("outputs:\n  - to: webhook:https://127.0.0.1:{port}/a\n    ca_file: {}\n", empty.display()),
    )
    .unwrap();
    let run = sandbox.run_with(&sandbox.work(), &["--config", &config.to_string_lossy()], &["true"], &[]);
    run.assert_exit(1);
    let said = format!("output webhook:https://127.0.0.1:{port}/a: CA file {}: no certificate", empty.display());
    assert!(run.stderr.contains(&said), "{said}\n{}", run.describe());
}

#[test]
fn a_knob_of_another_kind_of_output_is_an_error_naming_it() {
    let sandbox = Sandbox::new();
    let config = sandbox.top().join("credwatch.yaml");
    fs::write(&config, "outputs:\n  - to: nats:nats://127.0.0.1:4222/credwatch\n    bearer_token: t\n").unwrap();
    let run = sandbox.run_with(&sandbox.work(), &["--config", &config.to_string_lossy()], &["true"], &[]);
    assert_ne!(run.status.and_then(|s| s.code()), Some(0), "{}", run.describe());
    assert!(run.stderr.contains("`bearer_token` is a knob of webhook and falcosidekick outputs"), "{}", run.describe());
}

/// The HTTPS receiver as a webhook (`ndjson`: ECS batches) or a Falcosidekick, trusted through
/// its CA in the agent's configuration file.
struct Webhook {
    receiver: HttpsReceiver,
    falcosidekick: bool,
    config: PathBuf,
}

impl Webhook {
    fn start(sandbox: &Sandbox, falcosidekick: bool) -> Webhook {
        let receiver = HttpsReceiver::start(&sandbox.top().join("receiver"));
        let config = sandbox.top().join("credwatch.yaml");
        let webhook = Webhook { receiver, falcosidekick, config };
        let ndjson = if falcosidekick { "" } else { "    ndjson: true\n" };
        // A stopped receiver takes the connection and never answers: retried after 2 s.
        let yaml = format!(
            "outputs:\n  - to: {}\n    ca_file: {}\n    request_timeout: 2\n{ndjson}",
            webhook.to(),
            webhook.receiver.ca_file.display()
        );
        fs::write(&webhook.config, yaml).unwrap();
        webhook
    }
}

impl Receiver for Webhook {
    fn to(&self) -> String {
        let kind = if self.falcosidekick { "falcosidekick" } else { "webhook" };
        format!("{kind}:https://127.0.0.1:{}/alerts", self.receiver.port)
    }

    fn options(&self) -> Vec<String> {
        vec!["--config".to_owned(), self.config.to_string_lossy().into_owned()]
    }

    fn child(&self) -> &Child {
        self.receiver.child.as_ref().unwrap()
    }

    fn back(&mut self) {
        self.receiver.kill();
        self.receiver.run();
    }

    /// From ECS NDJSON bodies (a batch per request), or Falco's alerts (one per request, its
    /// id and path in `output_fields`).
    fn delivered(&self) -> Vec<(String, String)> {
        let mut got = Vec::new();
        for request in self.receiver.requests() {
            let (body, content_type) = (request["body"].as_str().unwrap_or_default(), &request["content_type"]);
            if self.falcosidekick {
                assert_eq!(content_type, "application/json", "{request:#}");
                let payload: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {request:#}"));
                let fields = &payload["output_fields"];
                if fields["credwatch.package.name"] == "net-pkg" {
                    let field = |name: &str| fields[name].as_str().unwrap_or_default().to_owned();
                    got.push((field("credwatch.id"), field("fd.name")));
                }
            } else {
                assert_eq!(content_type, "application/x-ndjson", "{request:#}");
                for line in body.lines() {
                    let alert: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
                    if alert["package"]["name"] == "net-pkg" {
                        let field = |pointer: &str| alert.pointer(pointer).and_then(Value::as_str).unwrap_or_default();
                        got.push((field("/event/id").to_owned(), field("/file/path").to_owned()));
                    }
                }
            }
        }
        got
    }
}

#[test]
fn a_thousand_alerts_reach_an_ndjson_webhook_stopped_then_killed_across_an_agent_restart() {
    let sandbox = Sandbox::new();
    outage(&sandbox, &mut Webhook::start(&sandbox, false));
}

#[test]
fn a_thousand_alerts_reach_falcosidekick_stopped_then_killed_across_an_agent_restart() {
    let sandbox = Sandbox::new();
    outage(&sandbox, &mut Webhook::start(&sandbox, true));
}
