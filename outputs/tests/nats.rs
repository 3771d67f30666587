//! The NATS output against a real `nats-server -js` (Debian's package; `cargo xtask test`
//! installs it) started here on a free loopback port with its store in a temporary directory:
//! the stream's acknowledgement, what lands in the stream, dedup by `Nats-Msg-Id`, and an outage.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use credwatch_core::alert::Severity;
use credwatch_outputs::nats::{Nats, NatsOptions};
use credwatch_outputs::{Outgoing, Transport, TransportError};
use futures_util::StreamExt;
use support::{Hostile, Peer};

mod support;

const PREFIX: &str = "credwatch.alerts";

struct Server {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
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

/// Starts nats-server and waits until it says it is ready; `Err` with its log when it exits
/// first (the port taken meanwhile, say).
fn spawn(port: u16, dir: &Path, extra: &[String]) -> Result<Child, String> {
    let log_path = dir.join("server.log");
    let ready = |log: &str| log.matches("Server is ready").count();
    let before = ready(&server_log(dir));
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).unwrap();
    let mut child = Command::new(nats_server())
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir.join("store"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while ready(&server_log(dir)) == before {
        if child.try_wait().unwrap().is_some() {
            return Err(server_log(dir));
        }
        assert!(Instant::now() < deadline, "nats-server not ready on {port} after 20 s: {}", server_log(dir));
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child)
}

fn server_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
}

impl Server {
    fn start() -> Server {
        Server::start_with(tempfile::tempdir().unwrap(), Vec::new())
    }

    /// With further options (TLS, a token), their files in `dir`. The free port may be taken
    /// by another test before the server binds it: then another port.
    fn start_with(dir: tempfile::TempDir, extra: Vec<String>) -> Server {
        let mut log = String::new();
        for _ in 0..5 {
            let port = free_port();
            match spawn(port, dir.path(), &extra) {
                Ok(child) => return Server { child, port, dir, extra },
                Err(text) => log = text,
            }
        }
        panic!("nats-server did not start: {log}");
    }

    /// On `port`, which a peer of the test's held until now (the port may take a moment to be free).
    fn start_on(port: u16) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut log = String::new();
        for _ in 0..10 {
            match spawn(port, dir.path(), &[]) {
                Ok(child) => return Server { child, port, dir, extra: Vec::new() },
                Err(text) => log = text,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("nats-server did not start on {port}: {log}");
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
        let mut log = String::new();
        for _ in 0..10 {
            match spawn(self.port, self.dir.path(), &self.extra) {
                Ok(child) => {
                    self.child = child;
                    return;
                }
                Err(text) => log = text,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("nats-server did not restart on {}: {log}", self.port);
    }

    /// The stream on `<prefix>.>` that a fleet's operator creates, with a duplicate window.
    async fn create_stream(&self) -> jetstream::Context {
        self.create_stream_with(async_nats::ConnectOptions::new()).await
    }

    async fn create_stream_with(&self, options: async_nats::ConnectOptions) -> jetstream::Context {
        let client = options
            .connect(self.url())
            .await
            .unwrap_or_else(|e| panic!("{}: {e}; the server said: {}", self.url(), server_log(self.dir.path())));
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
        .create_consumer(consumer::pull::Config {
            deliver_policy: consumer::DeliverPolicy::All,
            // Read only: no acks, so no limit of unacknowledged messages to hit.
            ack_policy: consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .unwrap();
    // Until a fetch comes back empty, so that a message beyond the count would be seen.
    let mut got = Vec::new();
    loop {
        let mut messages =
            consumer.fetch().max_messages(500).expires(Duration::from_millis(500)).messages().await.unwrap();
        let before = got.len();
        while let Some(message) = messages.next().await {
            let message = message.unwrap();
            let id =
                message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).map(|v| v.to_string()).unwrap_or_default();
            got.push((message.subject.to_string(), id, message.payload.to_vec()));
        }
        if got.len() == before {
            break;
        }
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
async fn a_batch_beyond_the_clients_in_flight_limit_is_delivered() {
    let server = Server::start();
    let context = server.create_stream().await;
    let mut nats = Nats::new(&server.url(), PREFIX, options()).unwrap();
    // async-nats holds at most 5,000 publishes awaiting their acknowledgement.
    let sent: Vec<Outgoing> = (1..=6_000).map(|n| alert(n, "build-7")).collect();
    nats.send(&sent).await.unwrap();
    assert_eq!(read_back(&context).await, expected(&sent));
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

    // Down while connected: no acknowledgement (or, once the client has noticed, not even a
    // publish), so not delivered, and said within the acknowledgement's timeout.
    server.kill();
    let during: Vec<Outgoing> = (6..=10).map(|n| alert(n, "build-7")).collect();
    for _ in 0..3 {
        let started = Instant::now();
        let result = nats.send(&during).await;
        assert!(matches!(result, Err(TransportError::Retry { .. })), "{result:?}");
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    }

    // Back: the client reconnects by itself, and the retried batch is acknowledged.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match nats.send(&during).await {
            Ok(()) => break,
            Err(TransportError::Retry { message, .. }) => {
                assert!(Instant::now() < deadline, "not delivered 30 s after the restart: {message}");
                // The dispatcher's backoff, in short.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(refused) => panic!("{refused}"),
        }
    }
    let client = async_nats::connect(server.url()).await.unwrap();
    let all: Vec<Outgoing> = (1..=10).map(|n| alert(n, "build-7")).collect();
    assert_eq!(read_back(&jetstream::new(client)).await, expected(&all));
}

struct Ca {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
}

fn ca(name: &str, pem: &Path) -> Ca {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    std::fs::write(pem, params.self_signed(&key).unwrap().pem()).unwrap();
    Ca { params, key }
}

#[tokio::test]
async fn over_tls_with_a_token_and_only_the_given_ca_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    let test_ca = ca("credwatch test CA", &ca_file);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &rcgen::Issuer::from_params(&test_ca.params, &test_ca.key))
        .unwrap();
    let (cert_file, key_file) = (dir.path().join("server.pem"), dir.path().join("server.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let extra = ["--tls", "--tlscert", cert_file.to_str().unwrap(), "--tlskey", key_file.to_str().unwrap()];
    let extra = extra.iter().map(ToString::to_string).chain(["--auth".into(), "s3cret".into()]).collect();
    let server = Server::start_with(dir, extra);
    let context = server
        .create_stream_with(
            async_nats::ConnectOptions::with_token("s3cret".into())
                .add_root_certificates(ca_file.clone())
                .require_tls(true),
        )
        .await;

    let tls = |token: &str, ca_file: &Path| NatsOptions {
        token: Some(token.into()),
        require_tls: true,
        ca_file: Some(ca_file.to_path_buf()),
        ..options()
    };
    let sent: Vec<Outgoing> = (1..=3).map(|n| alert(n, "build-7")).collect();
    let mut nats = Nats::new(&server.url(), PREFIX, tls("s3cret", &ca_file)).unwrap();
    nats.send(&sent).await.unwrap();
    assert_eq!(read_back(&context).await, expected(&sent));

    let mut nats = Nats::new(&server.url(), PREFIX, tls("wrong", &ca_file)).unwrap();
    assert_retry(nats.send(&sent).await, "connect");

    let other_ca = server.dir.path().join("other-ca.pem");
    ca("some other CA", &other_ca);
    let mut nats = Nats::new(&server.url(), PREFIX, tls("s3cret", &other_ca)).unwrap();
    assert_retry(nats.send(&sent).await, "connect");
    assert_eq!(read_back(&context).await.len(), 3);
}

#[tokio::test]
async fn a_peer_that_answers_garbage_closes_or_stalls_is_a_retry_within_the_connect_timeout() {
    for mode in [Hostile::Garbage, Hostile::Close, Hostile::Stall] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("nats://{}", listener.local_addr().unwrap());
        let peer = Peer::start(listener, &[mode]);
        let options = NatsOptions { connect_timeout: Duration::from_millis(500), ..options() };
        let mut nats = Nats::new(&url, PREFIX, options).unwrap();
        for _ in 0..2 {
            let started = Instant::now();
            let result = nats.send(&[alert(1, "build-7")]).await;
            assert!(
                matches!(&result, Err(TransportError::Retry { message, .. }) if message.starts_with("connect")),
                "{mode:?}: {result:?}"
            );
            assert!(started.elapsed() < Duration::from_secs(3), "{mode:?}: {:?}", started.elapsed());
        }
        assert_eq!(peer.served(), [mode, mode]);
        peer.stop().await;
    }
}

/// Where the NATS server should be, a peer that answers garbage, then one that closes before
/// answering, then one that never answers: each delivery a retry, counted, the alerts kept in
/// the spool; the real server there at last, they reach the stream, in order, each once.
#[test]
fn hostile_peers_are_retried_and_counted_until_the_server_is_there() {
    let run = support::after_hostile_peers(
        |port| format!("nats:nats://127.0.0.1:{port}/{PREFIX}"),
        |config| {
            config.connect_timeout = Some(0.5);
            config.ack_timeout = Some(1.0);
        },
    );
    let server = Server::start_on(run.port);
    let context = run.runtime.block_on(server.create_stream());
    let counts = support::wait_for_counts(&run.reader, "20 delivered", Duration::from_secs(30), |c| c.delivered == 20);
    assert_eq!((counts.spooled, counts.dropped), (0, [0; 4]), "{counts:?}");
    let stream = run.runtime.block_on(read_back(&context));
    let got: Vec<String> = stream.into_iter().map(|(_, id, _)| id).collect();
    assert_eq!(got, support::ids(1..=20));
    run.dispatcher.shutdown(Duration::from_secs(1));
}

/// `read_stream` (for `credwatch fleet report`): every message on `<prefix>.>` in the stream's
/// order, past several fetches; nothing else; the reader's error names the message.
#[test]
fn the_stream_is_read_back_in_order_past_several_fetches_and_a_bad_message_is_named() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let context = runtime.block_on(server.create_stream());
    let mut nats = Nats::new(&server.url(), PREFIX, options()).unwrap();
    let sent: Vec<Outgoing> = (1..=1_234).map(|n| alert(n, &format!("host-{}", n % 20))).collect();
    runtime.block_on(nats.send(&sent)).unwrap();
    // The stream's own read-back agrees with what was sent; read_stream must give the same.
    let stored = runtime.block_on(read_back(&context));
    assert_eq!(stored, expected(&sent));

    let mut got = Vec::new();
    let read = nats
        .read_stream(None, |message| {
            got.push((message.subject, message.sequence, message.payload.to_vec()));
            Ok(())
        })
        .unwrap();
    assert_eq!(read, 1_234);
    let want: Vec<(String, u64, Vec<u8>)> =
        stored.into_iter().zip(1..).map(|((subject, _, payload), sequence)| (subject, sequence, payload)).collect();
    assert_eq!(got, want);

    // Read again by name, stopping at the 700th.
    let error = nats
        .read_stream(
            Some("CREDWATCH"),
            |message| {
                if message.sequence == 700 {
                    Err("not an alert".into())
                } else {
                    Ok(())
                }
            },
        )
        .unwrap_err()
        .to_string();
    let url = server.url();
    assert_eq!(error, format!("{url}: stream \"CREDWATCH\", subject \"{PREFIX}.host-0\", sequence 700: not an alert"));

    let error = nats.read_stream(Some("NOPE"), |_| Ok(())).unwrap_err().to_string();
    assert!(error.starts_with(&format!("{url}: stream \"NOPE\": ")), "{error}");
    let mut other = Nats::new(&url, "elsewhere", options()).unwrap();
    let error = other.read_stream(None, |_| Ok(())).unwrap_err().to_string();
    assert!(error.starts_with(&format!("{url}: no stream holds the subjects elsewhere.>")), "{error}");
}
