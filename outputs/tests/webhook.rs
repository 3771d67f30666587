//! The webhook and Falcosidekick transports over TLS against a receiver started here on
//! loopback, with a CA and a server certificate made here: what it records, and how each of its
//! answers (2xx, 408/429/5xx, other 4xx, garbage, a close mid-request, a stall) is classified.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use credwatch_outputs::webhook::{Webhook, WebhookFormat, WebhookOptions};
use credwatch_outputs::{DispatchOptions, Dispatcher, Outgoing, OutputConfig, Transport, TransportError};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

mod support;

/// How the receiver answers the next request (or connection, for the raw ones).
#[derive(Clone, Copy, Debug)]
enum Answer {
    Status(u16),
    /// Bytes that are not HTTP.
    Garbage,
    /// Reads the start of the request, then closes the connection.
    Close,
    /// Reads the request and never answers.
    Stall,
}

#[derive(Debug)]
struct Recorded {
    content_type: String,
    authorization: String,
    fleet: String,
    body: Bytes,
}

struct Receiver {
    url: String,
    answers: Arc<Mutex<VecDeque<Answer>>>,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    _dir: tempfile::TempDir,
    /// The PEM of the CA that signed the receiver's certificate.
    ca_file: PathBuf,
}

struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let pem = params.self_signed(&key).unwrap().pem();
    Ca { params, key, pem }
}

impl Receiver {
    async fn start() -> Receiver {
        let ca = ca("credwatch test CA");
        let server_key = KeyPair::generate().unwrap();
        let server_cert = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&server_key, &Issuer::from_params(&ca.params, &ca.key))
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &ca.pem).unwrap();

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(server_cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
            )
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let answers = Arc::new(Mutex::new(VecDeque::new()));
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let (task_answers, task_recorded) = (answers.clone(), recorded.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let (answers, recorded) = (task_answers.clone(), task_recorded.clone());
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that does not trust the certificate gives up here.
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    let raw = {
                        let mut answers = answers.lock().unwrap();
                        match answers.front() {
                            Some(Answer::Status(_)) | None => None,
                            Some(_) => answers.pop_front(),
                        }
                    };
                    if let Some(raw) = raw {
                        let mut start = [0u8; 64];
                        let _ = tls.read(&mut start).await;
                        match raw {
                            Answer::Garbage => {
                                let _ = tls.write_all(b"\x00\xffSMTP ready?\r\n\r\n\x7f garbage").await;
                                let _ = tls.shutdown().await;
                            }
                            Answer::Stall => tokio::time::sleep(Duration::from_secs(60)).await,
                            Answer::Close | Answer::Status(_) => {}
                        }
                        return;
                    }
                    let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                        let (answers, recorded) = (answers.clone(), recorded.clone());
                        async move {
                            let header = |name: &str| {
                                request.headers().get(name).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default()
                            };
                            let (content_type, authorization, fleet) =
                                (header("content-type"), header("authorization"), header("x-fleet"));
                            let body = request.into_body().collect().await?.to_bytes();
                            recorded.lock().unwrap().push(Recorded { content_type, authorization, fleet, body });
                            let status = match answers.lock().unwrap().pop_front() {
                                Some(Answer::Status(status)) => status,
                                _ => 200,
                            };
                            let mut response =
                                hyper::Response::new(Full::new(Bytes::from_static(b"{\"said\":\"no\"}")));
                            *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                            Ok::<_, hyper::Error>(response)
                        }
                    });
                    let _ =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await;
                });
            }
        });
        Receiver { url: format!("https://127.0.0.1:{}/alerts", addr.port()), answers, recorded, _dir: dir, ca_file }
    }

    fn answer(&self, answers: &[Answer]) {
        self.answers.lock().unwrap().extend(answers.iter().copied());
    }

    fn take(&self) -> Vec<Recorded> {
        std::mem::take(&mut *self.recorded.lock().unwrap())
    }

    fn options(&self) -> WebhookOptions {
        WebhookOptions {
            ca_file: Some(self.ca_file.clone()),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
            ..Default::default()
        }
    }

    fn webhook(&self, options: WebhookOptions) -> Webhook {
        Webhook::new(&self.url, options).unwrap()
    }
}

fn alert(n: u32) -> Outgoing {
    credwatch_outputs::dispatch::render(&support::alert(n))
}

fn batch(n: u32) -> Vec<Outgoing> {
    (1..=n).map(alert).collect()
}

fn assert_retry(result: Result<(), TransportError>, contains: &str) {
    match result {
        Err(TransportError::Retry { message, .. }) => assert!(message.contains(contains), "{message}"),
        other => panic!("expected a retry naming {contains:?}, got {other:?}"),
    }
}

fn assert_refused(result: Result<(), TransportError>, contains: &str) {
    match result {
        Err(TransportError::Refused { message, .. }) => assert!(message.contains(contains), "{message}"),
        other => panic!("expected a refusal naming {contains:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn one_post_per_alert_in_order_with_the_bearer_token_and_headers() {
    let receiver = Receiver::start().await;
    let options = WebhookOptions {
        bearer_token: Some("t0k3n".into()),
        headers: vec![("X-Fleet".into(), "ci-runners".into())],
        ..receiver.options()
    };
    let mut webhook = receiver.webhook(options);
    let sent = batch(3);
    webhook.send(&sent).await.unwrap();
    let got = receiver.take();
    assert_eq!(got.len(), 3);
    for (recorded, alert) in got.iter().zip(&sent) {
        assert_eq!(recorded.body, alert.json);
        assert_eq!(recorded.content_type, "application/json");
        assert_eq!(recorded.authorization, "Bearer t0k3n");
        assert_eq!(recorded.fleet, "ci-runners");
    }
}

#[tokio::test]
async fn ndjson_sends_a_batch_in_one_request() {
    let receiver = Receiver::start().await;
    let mut webhook = receiver.webhook(WebhookOptions { ndjson: true, ..receiver.options() });
    let sent = batch(5);
    webhook.send(&sent).await.unwrap();
    let got = receiver.take();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].content_type, "application/x-ndjson");
    let lines: Vec<&[u8]> = got[0].body.strip_suffix(b"\n").unwrap().split(|b| *b == b'\n').collect();
    assert_eq!(lines, sent.iter().map(|a| &a.json[..]).collect::<Vec<_>>());
}

#[tokio::test]
async fn temporary_failures_are_retried_and_other_4xx_refused() {
    let receiver = Receiver::start().await;
    let mut webhook = receiver.webhook(receiver.options());
    for status in [500, 502, 503, 408, 429] {
        receiver.answer(&[Answer::Status(status)]);
        assert_retry(webhook.send(&batch(1)).await, &status.to_string());
    }
    for status in [400, 401, 403, 404, 413] {
        receiver.answer(&[Answer::Status(status)]);
        assert_refused(webhook.send(&batch(1)).await, &status.to_string());
    }
    // The answer's body is in the message, escaped.
    receiver.answer(&[Answer::Status(404)]);
    assert_refused(webhook.send(&batch(1)).await, "{\"said\":\"no\"}");
    // A 5xx stops the batch where it failed: the rest comes with the retry.
    receiver.take();
    receiver.answer(&[Answer::Status(200), Answer::Status(503)]);
    assert_retry(webhook.send(&batch(3)).await, "503");
    assert_eq!(receiver.take().len(), 2);
    // A refused alert does not hold back those after it.
    receiver.answer(&[Answer::Status(422)]);
    assert_refused(webhook.send(&batch(3)).await, "1 of 3 alerts refused, the first: alert id-1: answered 422");
    assert_eq!(receiver.take().len(), 3);
}

#[tokio::test]
async fn garbage_a_close_mid_request_and_a_stall_are_retried_and_the_next_send_works() {
    let receiver = Receiver::start().await;
    let options = WebhookOptions { request_timeout: Duration::from_millis(700), ..receiver.options() };
    for answer in [Answer::Garbage, Answer::Close, Answer::Stall] {
        // A new client for each: the raw answers apply to a new connection.
        let mut webhook = receiver.webhook(options.clone());
        receiver.answer(&[answer]);
        let started = Instant::now();
        let result = webhook.send(&batch(1)).await;
        assert!(matches!(result, Err(TransportError::Retry { .. })), "{answer:?}: {result:?}");
        if let Answer::Stall = answer {
            assert_retry(result, "timed out");
            assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        }
        webhook.send(&batch(2)).await.unwrap();
        assert_eq!(receiver.take().len(), 2, "{answer:?}");
    }
}

#[tokio::test]
async fn only_the_given_ca_is_trusted() {
    let receiver = Receiver::start().await;
    // Another CA than the one that signed the receiver's certificate.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-ca.pem");
    std::fs::write(&other, ca("some other CA").pem).unwrap();
    let mut webhook = receiver.webhook(WebhookOptions { ca_file: Some(other), ..receiver.options() });
    assert_retry(webhook.send(&batch(1)).await, "certificate");
    // The system's roots do not know the test CA either (and a host without any is told so
    // before the first alert).
    match Webhook::new(&receiver.url, WebhookOptions { ca_file: None, ..receiver.options() }) {
        Ok(mut webhook) => assert_retry(webhook.send(&batch(1)).await, "certificate"),
        Err(error) => assert!(error.to_string().starts_with("no system CA certificates found"), "{error}"),
    }
    assert!(receiver.take().is_empty());
}

#[tokio::test]
async fn an_unreachable_receiver_is_retried() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let mut webhook = Webhook::new(&format!("http://127.0.0.1:{port}/"), WebhookOptions::default()).unwrap();
    assert_retry(webhook.send(&batch(1)).await, "onnect");
}

#[tokio::test]
async fn falcosidekick_gets_falcos_shape_one_alert_per_request() {
    let receiver = Receiver::start().await;
    let mut webhook = receiver.webhook(WebhookOptions { format: WebhookFormat::Falcosidekick, ..receiver.options() });
    assert!(webhook.name().starts_with("falcosidekick:https://127.0.0.1:"), "{}", webhook.name());
    webhook.send(&batch(2)).await.unwrap();
    let got = receiver.take();
    assert_eq!(got.len(), 2);
    for (n, recorded) in got.iter().enumerate() {
        assert_eq!(recorded.content_type, "application/json");
        let payload: serde_json::Value = serde_json::from_slice(&recorded.body).unwrap();
        assert_eq!(payload["priority"], "Error");
        assert_eq!(payload["rule"], "SSH private key read by package code");
        assert_eq!(payload["source"], "credwatch");
        assert_eq!(payload["hostname"], "build-7");
        assert_eq!(payload["time"], format!("2026-12-01T16:00:{:02}.500000000Z", n + 1));
        assert_eq!(payload["output_fields"]["credwatch.id"], format!("id-{}", n + 1));
        assert_eq!(payload["output_fields"]["fd.name"], format!("/home/u/.ssh/key-{}", n + 1));
    }
    // An alert that is not an alert's JSON is refused, the others still go.
    let mut sent = batch(2);
    sent[0].json = Bytes::from_static(b"[1,2]");
    assert_refused(webhook.send(&sent).await, "alert id-1: not an alert's JSON");
    assert_eq!(receiver.take().len(), 1);
}

/// Through the dispatcher, in both formats: garbage, a close mid-request, a stall and a 503, each
/// a failed delivery, counted and retried; then the receiver answers, and every alert arrives,
/// in order.
#[test]
fn hostile_answers_are_retried_and_counted_until_the_receiver_takes_the_alerts() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for (format, kind) in [(WebhookFormat::Ecs, "webhook"), (WebhookFormat::Falcosidekick, "falcosidekick")] {
        let receiver = runtime.block_on(Receiver::start());
        receiver.answer(&[Answer::Garbage, Answer::Close, Answer::Stall, Answer::Status(503)]);
        let spool = tempfile::tempdir().unwrap();
        let mut dispatcher = Dispatcher::new(DispatchOptions {
            spool_dir: spool.path().to_owned(),
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_millis(100),
        })
        .unwrap();
        let config = OutputConfig::to(format!("{kind}:{}", receiver.url).parse().unwrap());
        let options = WebhookOptions { format, request_timeout: Duration::from_millis(700), ..receiver.options() };
        dispatcher.add(&config, receiver.webhook(options)).unwrap();
        for n in 1..=10 {
            dispatcher.dispatch(&support::alert(n));
        }
        let reader = dispatcher.counts_reader();
        let counts = support::wait_for_counts(&reader, "10 delivered", Duration::from_secs(30), |c| c.delivered == 10);
        assert_eq!((counts.failed_attempts, counts.refused, counts.spooled), (4, 0, 0), "{kind}: {counts:?}");
        let ids: Vec<String> = receiver
            .take()
            .iter()
            .map(|recorded| {
                let body: serde_json::Value = serde_json::from_slice(&recorded.body).unwrap();
                let id = if format == WebhookFormat::Ecs {
                    &body["event"]["id"]
                } else {
                    &body["output_fields"]["credwatch.id"]
                };
                id.as_str().unwrap().to_owned()
            })
            .collect();
        // The 503's alert came twice: receivers dedup by id.
        assert_eq!(ids.len(), 11, "{kind}: {ids:?}");
        assert_eq!(support::dedup(&ids), support::ids(1..=10), "{kind}");
        dispatcher.shutdown(Duration::from_secs(1));
    }
}
