//! The bench's receivers of the outputs (release xtask, `--features bench-outputs`): an HTTP
//! server for the webhook and Falcosidekick outputs, and a reader of a NATS JetStream stream.
//! Each prints the `event.id` of every alert it receives on a line of its own, as it receives
//! it: the bench counts and times them (see `outputs.rs`).

use std::{
    convert::Infallible,
    io::{self, BufRead as _, Write as _},
    time::Duration,
};

use anyhow::{Context, Result};
use futures_util::StreamExt as _;
use http_body_util::{BodyExt as _, Empty};
use hyper::{
    body::{Bytes, Incoming},
    server::conn::http1,
    service::service_fn,
    Request, Response,
};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// One thread: the receiver shares the machine's cores with the agent it measures.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a tokio runtime")
}

/// The alert's id: `event.id` of the ECS alert, `output_fields."credwatch.id"` of Falco's shape.
fn alert_id(alert: &Value) -> Option<&str> {
    alert.pointer("/event/id").or_else(|| alert.pointer("/output_fields/credwatch.id")).and_then(Value::as_str)
}

/// Prints the id of each alert in `body` (one JSON document, or NDJSON), `?` for a line that is
/// no alert.
fn print_ids(body: &[u8]) {
    let mut out = io::stdout().lock();
    for line in body.split(|b| *b == b'\n').filter(|line| !line.iter().all(u8::is_ascii_whitespace)) {
        let alert: Value = serde_json::from_slice(line).unwrap_or(Value::Null);
        let _ = writeln!(out, "{}", alert_id(&alert).unwrap_or("?"));
    }
    let _ = out.flush();
}

/// `bench-receive-http`: answers every request 200 on a loopback port it prints as
/// `listening PORT`, keeping connections alive as a webhook receiver does.
pub fn http() -> Result<()> {
    runtime()?.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding 127.0.0.1:0")?;
        println!("listening {}", listener.local_addr()?.port());
        io::stdout().flush()?;
        loop {
            let (stream, _) = listener.accept().await.context("accepting")?;
            tokio::spawn(async move {
                let service = service_fn(|request: Request<Incoming>| async move {
                    let body = request.into_body().collect().await.map(|body| body.to_bytes()).unwrap_or_default();
                    print_ids(&body);
                    Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    })
}

/// `bench-receive-nats URL STREAM SUBJECTS`: creates the stream (file storage, a duplicate
/// window as a fleet's operator would set), prints `ready`, then the `Nats-Msg-Id` of each
/// message stored in it, in order; at the end of its stdin deletes the stream and exits.
pub fn nats(url: &str, stream: &str, subjects: &str) -> Result<()> {
    use async_nats::jetstream::{consumer, stream as js_stream};
    runtime()?.block_on(async {
        let client = async_nats::connect(url).await.with_context(|| format!("connecting to {url}"))?;
        let context = async_nats::jetstream::new(client);
        let _ = context.delete_stream(stream).await;
        let created = context
            .create_stream(js_stream::Config {
                name: stream.to_owned(),
                subjects: vec![subjects.to_owned()],
                duplicate_window: Duration::from_secs(600),
                storage: js_stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow::anyhow!("creating stream {stream}: {e}"))?;
        let consumer = created
            .create_consumer(consumer::pull::OrderedConfig::default())
            .await
            .map_err(|e| anyhow::anyhow!("creating a consumer: {e}"))?;
        let mut messages = consumer.messages().await.map_err(|e| anyhow::anyhow!("reading the stream: {e}"))?;
        println!("ready");
        io::stdout().flush()?;
        let stdin_closed = tokio::task::spawn_blocking(|| for _ in io::stdin().lock().lines().map_while(Result::ok) {});
        tokio::pin!(stdin_closed);
        loop {
            tokio::select! {
                message = messages.next() => {
                    let Some(message) = message else { break };
                    let message = message.map_err(|e| anyhow::anyhow!("reading the stream: {e}"))?;
                    let id = message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).map(|v| v.to_string());
                    let mut out = io::stdout().lock();
                    writeln!(out, "{}", id.as_deref().unwrap_or("?"))?;
                    out.flush()?;
                }
                _ = &mut stdin_closed => break,
            }
        }
        context.delete_stream(stream).await.map_err(|e| anyhow::anyhow!("deleting stream {stream}: {e}"))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_id_in_both_shapes() {
        let ecs: Value = serde_json::json!({"event": {"id": "abc", "kind": "alert"}});
        let falco: Value = serde_json::json!({"uuid": "x", "output_fields": {"credwatch.id": "def"}});
        assert_eq!(alert_id(&ecs), Some("abc"));
        assert_eq!(alert_id(&falco), Some("def"));
        assert_eq!(alert_id(&Value::Null), None);
    }
}
