//! The metrics endpoint scraped by a real Prometheus (Debian's package; `cargo xtask test`
//! installs it) started here on loopback, and the figures read back through Prometheus' HTTP API.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use credwatch_core::alert::Severity;
use credwatch_outputs::metrics::{self, Metrics, OutputFigures};

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn prometheus() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("prometheus"))
        .find(|path| path.is_file())
        .expect("prometheus is not installed (Debian's package prometheus; `cargo xtask test` installs it)")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The value of an instant query's only sample, once Prometheus has one.
async fn query(client: &reqwest::Client, api: &str, expr: &str) -> Option<String> {
    let mut url = reqwest::Url::parse(&format!("{api}/api/v1/query")).unwrap();
    url.query_pairs_mut().append_pair("query", expr);
    let body = client.get(url).send().await.ok()?.bytes().await.ok()?;
    let json: serde_json::Value = serde_json::from_slice(&body).ok()?;
    let result = json["data"]["result"].as_array()?;
    assert!(result.len() <= 1, "{expr}: {json}");
    Some(result.first()?["value"][1].as_str()?.to_string())
}

async fn wait_for(client: &reqwest::Client, api: &str, expr: &str, want: &str, log: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = query(client, api, expr).await;
        if got.as_deref() == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{expr}: {got:?}, not {want:?}, after 60 s; Prometheus said:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn prometheus_scrapes_the_metrics() {
    let mut metrics = Metrics::new();
    metrics.watch_outputs(|| {
        let figures = OutputFigures { spool_bytes: 4096, ..Default::default() };
        vec![("webhook:https://siem.example/alerts".to_string(), figures)]
    });
    let metrics = Arc::new(metrics);
    metrics.alert("ssh-private-key", Severity::High);
    metrics.alert("ssh-private-key", Severity::High);
    metrics.start_up_seconds.set(0.25);
    let listener = metrics::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let target = listener.local_addr().unwrap();
    tokio::spawn(metrics::serve(listener, metrics.clone()));

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: credwatch\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let web = format!("127.0.0.1:{}", free_port());
    let log = dir.path().join("prometheus.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let _prometheus = Prometheus(
        Command::new(prometheus())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={web}"))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap(),
    );
    let api = format!("http://{web}");
    let client = reqwest::Client::builder().tls_backend_preconfigured(rustls_config()).build().unwrap();

    wait_for(&client, &api, "up{job=\"credwatch\"}", "1", &log).await;
    wait_for(&client, &api, "credwatch_alerts_total{rule=\"ssh-private-key\",severity=\"high\"}", "2", &log).await;
    wait_for(
        &client,
        &api,
        "credwatch_output_spool_bytes{output=\"webhook:https://siem.example/alerts\"}",
        "4096",
        &log,
    )
    .await;
    wait_for(&client, &api, "credwatch_start_up_seconds", "0.25", &log).await;
    // A later figure reaches Prometheus at the next scrape.
    metrics.alert("ssh-private-key", Severity::High);
    wait_for(&client, &api, "credwatch_alerts_total{rule=\"ssh-private-key\",severity=\"high\"}", "3", &log).await;
}

/// reqwest is built without a TLS provider of its own (the outputs bring theirs); plain http
/// here needs one all the same.
fn rustls_config() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}
