//! HTTP webhook: a POST of each alert's ECS JSON (one per request, or NDJSON batches), or of its
//! Falco shape for a Falcosidekick. reqwest (hyper) speaks HTTP; rustls on ring speaks TLS, with
//! the system's roots or only a given CA.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{StatusCode, Url};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::{falco, Outgoing, Transport, TransportError};

/// What goes in each request's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookFormat {
    /// The ECS alert as credwatch writes it.
    Ecs,
    /// Falco's alert (see [`crate::falco`]), one per request: Falcosidekick reads one per POST.
    Falcosidekick,
}

#[derive(Clone, Debug)]
pub struct WebhookOptions {
    pub format: WebhookFormat,
    /// Ecs only: send a batch as one NDJSON request (`application/x-ndjson`, one alert a line)
    /// instead of one request per alert.
    pub ndjson: bool,
    /// Sent as `Authorization: Bearer TOKEN`.
    pub bearer_token: Option<String>,
    /// Further headers, sent on every request.
    pub headers: Vec<(String, String)>,
    /// Trust only the CA certificates in this PEM file (a private CA, or pinning), instead of
    /// the system's roots.
    pub ca_file: Option<PathBuf>,
    pub connect_timeout: Duration,
    /// For the whole request, the answer's body included: a receiver that stalls is retried.
    pub request_timeout: Duration,
}

impl Default for WebhookOptions {
    fn default() -> Self {
        WebhookOptions {
            format: WebhookFormat::Ecs,
            ndjson: false,
            bearer_token: None,
            headers: Vec::new(),
            ca_file: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook URL {url:?}: {message}")]
    Url { url: String, message: String },
    #[error("webhook {url}: Falcosidekick reads one alert per request, so it cannot take NDJSON batches")]
    FalcoBatch { url: String },
    #[error("webhook {url}: header {name:?}: {message}")]
    Header { url: String, name: String, message: String },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("webhook {url}: {source}")]
    Client { url: String, source: reqwest::Error },
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("CA file {}: {source}", path.display())]
    CaRead { path: PathBuf, source: rustls_pki_types::pem::Error },
    #[error("CA file {}: no certificate in it (PEM `-----BEGIN CERTIFICATE-----` expected)", path.display())]
    CaEmpty { path: PathBuf },
    #[error("CA file {}: certificate {index} is not a CA certificate rustls can use: {source}", path.display())]
    CaBad { path: PathBuf, index: usize, source: rustls::Error },
    #[error("no system CA certificates found ({message}); install ca-certificates or give a CA file")]
    NoSystemRoots { message: String },
    #[error("TLS set-up: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A rustls client configuration on ring trusting `ca_file`'s certificates only, or the
/// system's roots (an error when there are none and `need_roots`). Shared with the NATS output.
pub(crate) fn tls_config(ca_file: Option<&Path>, need_roots: bool) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|source| TlsError::CaRead { path: path.to_path_buf(), source })?;
            if certs.is_empty() {
                return Err(TlsError::CaEmpty { path: path.to_path_buf() });
            }
            for (index, cert) in certs.into_iter().enumerate() {
                roots.add(cert).map_err(|source| TlsError::CaBad {
                    path: path.to_path_buf(),
                    index: index + 1,
                    source,
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() && need_roots {
                let message = found.errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
                return Err(TlsError::NoSystemRoots { message });
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

pub struct Webhook {
    name: String,
    url: Url,
    client: reqwest::Client,
    format: WebhookFormat,
    ndjson: bool,
}

impl Webhook {
    /// Checks everything that can be checked before the first alert: the URL, the headers, the
    /// CA file. The receiver itself may be down: that is the spool's business, not an error here.
    pub fn new(url: &str, options: WebhookOptions) -> Result<Webhook, WebhookError> {
        let bad_url = |message: String| WebhookError::Url { url: url.to_string(), message };
        let parsed = Url::parse(url).map_err(|e| bad_url(e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(bad_url(format!("scheme {:?}: http or https expected", parsed.scheme())));
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(bad_url("no host".into()));
        }
        if options.ndjson && options.format == WebhookFormat::Falcosidekick {
            return Err(WebhookError::FalcoBatch { url: url.to_string() });
        }
        let mut headers = HeaderMap::new();
        let header = |name: &str, value: &str| {
            let bad = |message: String| WebhookError::Header { url: url.to_string(), name: name.to_string(), message };
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| bad(e.to_string()))?;
            let mut value = HeaderValue::from_str(value).map_err(|e| bad(e.to_string()))?;
            value.set_sensitive(name == AUTHORIZATION);
            Ok::<_, WebhookError>((name, value))
        };
        for (name, value) in &options.headers {
            let (name, value) = header(name, value)?;
            headers.insert(name, value);
        }
        if let Some(token) = &options.bearer_token {
            let (name, value) = header(AUTHORIZATION.as_str(), &format!("Bearer {token}"))?;
            headers.insert(name, value);
        }
        let builder = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(options.connect_timeout)
            .timeout(options.request_timeout)
            // A redirect would turn the POST into a GET and lose the alert: answered 3xx, the
            // URL is wrong, and saying so beats following it.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("credwatch/", env!("CARGO_PKG_VERSION")));
        // reqwest wants a TLS configuration even for http, but the system's roots are needed
        // only for https: an http URL works on a host without them.
        let tls = tls_config(options.ca_file.as_deref(), parsed.scheme() == "https")?;
        let client = builder
            .tls_backend_preconfigured(tls)
            .build()
            .map_err(|source| WebhookError::Client { url: url.to_string(), source })?;
        let kind = match options.format {
            WebhookFormat::Ecs => "webhook",
            WebhookFormat::Falcosidekick => "falcosidekick",
        };
        Ok(Webhook {
            name: format!("{kind}:{}", redacted(&parsed)),
            url: parsed,
            client,
            format: options.format,
            ndjson: options.ndjson,
        })
    }

    async fn post(&self, body: Bytes, content_type: &'static str) -> Result<(), TransportError> {
        let retry = |message: String| TransportError::Retry { output: self.name.clone(), message };
        let response = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, content_type)
            .body(body)
            .send()
            .await
            .map_err(|e| retry(describe(e)))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let message = format!("answered {status}{}", body_excerpt(response).await);
        if status == StatusCode::REQUEST_TIMEOUT || status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
        {
            Err(retry(message))
        } else {
            Err(TransportError::Refused { output: self.name.clone(), message })
        }
    }
}

impl Transport for Webhook {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send(&mut self, batch: &[Outgoing]) -> Result<(), TransportError> {
        if batch.is_empty() {
            return Ok(());
        }
        if self.ndjson {
            let mut body = Vec::with_capacity(batch.iter().map(|a| a.json.len() + 1).sum());
            for alert in batch {
                body.extend_from_slice(&alert.json);
                body.push(b'\n');
            }
            return self.post(body.into(), "application/x-ndjson").await;
        }
        // One request per alert, in order. A refused alert does not hold back the ones after it;
        // a retryable failure stops here (the whole batch comes again, receivers dedup by id).
        let mut refused = Vec::new();
        for alert in batch {
            let body = match self.format {
                // The alert's own bytes, shared, not copied.
                WebhookFormat::Ecs => alert.json.clone(),
                WebhookFormat::Falcosidekick => match falco::payload(alert) {
                    Ok(payload) => {
                        serde_json::to_vec(&payload).expect("a payload of strings and numbers serialises").into()
                    }
                    Err(e) => {
                        refused.push(e.to_string());
                        continue;
                    }
                },
            };
            match self.post(body, "application/json").await {
                Ok(()) => {}
                Err(TransportError::Refused { message, .. }) => refused.push(format!("alert {}: {message}", alert.id)),
                Err(retry) => return Err(retry),
            }
        }
        match refused.first() {
            None => Ok(()),
            Some(first) => Err(TransportError::Refused {
                output: self.name.clone(),
                message: format!("{} of {} alerts refused, the first: {first}", refused.len(), batch.len()),
            }),
        }
    }
}

/// The URL without its password or query (which may carry a token), for logs and metrics.
fn redacted(url: &Url) -> String {
    let mut shown = url.clone();
    // Setting a password on an http(s) URL with a host cannot fail.
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    if shown.query().is_some() {
        shown.set_query(Some("***"));
    }
    shown.to_string()
}

/// reqwest's error with its causes (connection refused, certificate unknown, timed out, ...).
fn describe(error: reqwest::Error) -> String {
    let timed_out = error.is_timeout();
    let error = error.without_url();
    let mut text = if timed_out { format!("timed out: {error}") } else { error.to_string() };
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

/// The start of an error answer's body, escaped: it comes from the network and goes to logs.
async fn body_excerpt(response: reqwest::Response) -> String {
    const MAX: usize = 200;
    let mut response = response;
    let mut body = Vec::new();
    while body.len() < MAX {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    if body.is_empty() {
        return String::new();
    }
    let shown: String = String::from_utf8_lossy(&body[..body.len().min(MAX)])
        .chars()
        .flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] })
        .collect();
    format!(": {shown}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_headers_and_formats_are_named() {
        let error = |url: &str, options: WebhookOptions| Webhook::new(url, options).err().unwrap().to_string();
        assert!(error("ftp://x/", WebhookOptions::default()).contains("scheme \"ftp\""));
        assert!(error("not a url", WebhookOptions::default()).starts_with("webhook URL \"not a url\""));
        let options = WebhookOptions { headers: vec![("bad header".into(), "v".into())], ..Default::default() };
        assert!(error("http://127.0.0.1/", options).contains("header \"bad header\""));
        let options = WebhookOptions { format: WebhookFormat::Falcosidekick, ndjson: true, ..Default::default() };
        assert!(error("http://127.0.0.1/", options).contains("cannot take NDJSON"));
    }

    #[test]
    fn a_missing_or_bad_ca_file_is_an_error_at_construction() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let options = WebhookOptions { ca_file: Some(missing.clone()), ..Default::default() };
        let error = Webhook::new("https://127.0.0.1/", options).err().unwrap().to_string();
        assert!(error.starts_with(&format!("CA file {}:", missing.display())), "{error}");

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let options = WebhookOptions { ca_file: Some(empty.clone()), ..Default::default() };
        let error = Webhook::new("https://127.0.0.1/", options).err().unwrap().to_string();
        assert!(error.contains("no certificate in it"), "{error}");

        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap();
        let options = WebhookOptions { ca_file: Some(garbage.clone()), ..Default::default() };
        let error = Webhook::new("https://127.0.0.1/", options).err().unwrap().to_string();
        assert!(error.contains("certificate 1 is not a CA certificate"), "{error}");
    }

    #[test]
    fn the_name_hides_passwords_and_queries() {
        let webhook =
            Webhook::new("http://user:secret@example.test/hook?token=t0k", WebhookOptions::default()).unwrap();
        assert_eq!(webhook.name(), "webhook:http://user:***@example.test/hook?***");
    }
}
