//! The NATS output against a real `nats-server -js` (Debian's package; `cargo xtask test`
//! installs it) started here on a free loopback port with its store in a temporary directory:
//! the stream's acknowledgement, what lands in the stream, dedup by `Nats-Msg-Id`, and an outage.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use credwatch_core::alert::Severity;
use credwatch_outputs::nats::{Nats, NatsOptions};
use credwatch_outputs::{Outgoing, Transport, TransportError};
use futures_util::StreamExt;

const PREFIX: &str = "credwatch.alerts";

struct Server {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

fn nats_server() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("nats-server"))
        .find(|path| path.is_file());
    on_path.expect("nats-server is not installed (Debian's package nats-server; `cargo xtask test` installs it)")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn(port: u16, dir: &Path) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("server.log")).unwrap();
    let child = Command::new(nats_server())
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir.join("store"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not listen on {port}: {}", server_log(dir));
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn server_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        Server { child: spawn(port, dir.path()), port, dir }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// On the same port and store: what the stream held is still there.
    fn restart(&mut self) {
        self.child = spawn(self.port, self.dir.path());
    }

    /// The stream on `<prefix>.>` that a fleet's operator creates, with a duplicate window.
    async fn create_stream(&self) -> jetstream::Context {
        let client = async_nats::connect(self.url()).await.unwrap();
        let context = jetstream::new(client);
        context
            .create_stream(stream::Config {
                name: "CREDWATCH".into(),
                subjects: vec![format!("{PREFIX}.>")],
                duplicate_window: Duration::from_secs(120),
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .unwrap();
        context
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the stream holds, in its order: (subject, Nats-Msg-Id, payload).
async fn read_back(context: &jetstream::Context) -> Vec<(String, String, Vec<u8>)> {
    let mut stream = context.get_stream("CREDWATCH").await.unwrap();
    let count = stream.info().await.unwrap().state.messages as usize;
    let consumer = stream
        .create_consumer(consumer::pull::Config { deliver_policy: consumer::DeliverPolicy::All, ..Default::default() })
        .await
        .unwrap();
    // One more than the stream holds, so that a message too many would be seen.
    let mut messages =
        consumer.fetch().max_messages(count + 1).expires(Duration::from_secs(2)).messages().await.unwrap();
    let mut got = Vec::new();
    while let Some(message) = messages.next().await {
        let message = message.unwrap();
        let id = message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).map(|v| v.to_string()).unwrap_or_default();
        got.push((message.subject.to_string(), id, message.payload.to_vec()));
    }
    assert_eq!(got.len(), count);
    got
}

fn alert(n: u32, host: &str) -> Outgoing {
    let json = serde_json::json!({"event": {"id": format!("id-{n}")}, "host": {"name": host}, "n": n});
    Outgoing {
        id: format!("id-{n}"),
        severity: Severity::High,
        host: host.into(),
        json: serde_json::to_vec(&json).unwrap().into(),
    }
}

fn expected(alerts: &[Outgoing]) -> Vec<(String, String, Vec<u8>)> {
    let subject = |host: &str| format!("{PREFIX}.{}", host.replace('.', "_"));
    alerts.iter().map(|a| (subject(&a.host), a.id.clone(), a.json.to_vec())).collect()
}

fn options() -> NatsOptions {
    NatsOptions { connect_timeout: Duration::from_secs(2), ack_timeout: Duration::from_secs(1), ..Default::default() }
}

fn assert_retry(result: Result<(), TransportError>, contains: &str) {
    match result {
        Err(TransportError::Retry { message, .. }) => assert!(message.contains(contains), "{message}"),
        other => panic!("expected a retry naming {contains:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_batch_lands_in_the_stream_in_order_per_host_subject_and_a_resend_is_not_duplicated() {
    let server = Server::start();
    let mut nats = Nats::new(&server.url(), PREFIX, options()).unwrap();
    let hosts = ["build-7", "node1.example.com"];
    let first: Vec<Outgoing> = (1..=20).map(|n| alert(n, hosts[n as usize % 2])).collect();

    // No stream on the subjects yet: kept for later, not dropped.
    assert_retry(nats.send(&first).await, "alert id-1: no stream found");

    let context = server.create_stream().await;
    nats.send(&first).await.unwrap();
    assert_eq!(read_back(&context).await, expected(&first));

    // The same alerts again (a retry after a lost acknowledgement, or from the spool after a
    // restart), with new ones: only the new ones are added.
    let second: Vec<Outgoing> = (11..=30).map(|n| alert(n, hosts[n as usize % 2])).collect();
    nats.send(&second).await.unwrap();
    let all: Vec<Outgoing> = (1..=30).map(|n| alert(n, hosts[n as usize % 2])).collect();
    assert_eq!(read_back(&context).await, expected(&all));
}

#[tokio::test]
async fn a_killed_server_is_retried_and_delivery_resumes_once_it_is_back() {
    let mut server = Server::start();
    let context = server.create_stream().await;
    drop(context);

    // The server is down before the first alert: nothing connected yet.
    server.kill();
    let mut nats = Nats::new(&server.url(), PREFIX, options()).unwrap();
    assert_retry(nats.send(&[alert(1, "build-7")]).await, "connect");

    server.restart();
    let before: Vec<Outgoing> = (1..=5).map(|n| alert(n, "build-7")).collect();
    nats.send(&before).await.unwrap();

    // Down while connected: no acknowledgement, so not delivered.
    server.kill();
    let during: Vec<Outgoing> = (6..=10).map(|n| alert(n, "build-7")).collect();
    let started = Instant::now();
    assert_retry(nats.send(&during).await, "alert id-6: timed out");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());

    // Back: the client reconnects by itself, and the retried batch is acknowledged.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match nats.send(&during).await {
            Ok(()) => break,
            Err(TransportError::Retry { message, .. }) => {
                assert!(Instant::now() < deadline, "not delivered 30 s after the restart: {message}")
            }
            Err(refused) => panic!("{refused}"),
        }
    }
    let client = async_nats::connect(server.url()).await.unwrap();
    let all: Vec<Outgoing> = (1..=10).map(|n| alert(n, "build-7")).collect();
    assert_eq!(read_back(&jetstream::new(client)).await, expected(&all));
}
