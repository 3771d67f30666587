//! The real servers the outputs' end-to-end tests deliver to, each started on loopback in a
//! directory of the test's: rsyslogd (TCP and RELP in, rsyslog's JSON with the structured data
//! parsed out), `nats-server -js` (its store kept across a restart), Prometheus, and an HTTPS
//! receiver of webhooks. As in credwatch-outputs' own tests, which they follow.

use std::{
    fs,
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

/// A program from Debian's package, wherever it put it (`/usr/sbin` is not on every PATH).
fn program(name: &str, package: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("{name} not found: install Debian's {package} package (`cargo xtask test` does)"))
}

/// A loopback port free right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_for(what: &str, log: &Path, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}; it said: {}",
            fs::read_to_string(log).unwrap_or_default()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `signal` (`-STOP`, `-KILL`, ...) to `child`.
pub fn signal(child: &Child, signal: &str) {
    assert!(Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap().success());
}

/// Whether something listens on TCP `port` of 127.0.0.1, asked of the kernel: a connection
/// that sends nothing is an error in imrelp's log.
fn listening(port: u16) -> bool {
    let local = format!("0100007F:{port:04X}");
    fs::read_to_string("/proc/net/tcp").unwrap().lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A")
    })
}

/// rsyslogd with a TCP input (octet-counting, as credwatch frames) and a RELP one, every message
/// written to `messages.jsonl` as rsyslog's own JSON (`%jsonmesg%`) after mmpstrucdata. RELP's
/// messages go through a queue on disk checkpointed at each message, so that what imrelp
/// acknowledged survives a `kill -9` (its default queue, in memory, does not: see
/// credwatch-outputs' syslog_rsyslog tests).
pub struct Rsyslog {
    dir: PathBuf,
    pub port: u16,
    pub relp_port: u16,
    pub child: Option<Child>,
}

impl Rsyslog {
    pub fn start(dir: &Path) -> Rsyslog {
        fs::create_dir_all(dir.join("work")).unwrap();
        let (port, relp_port) = loop {
            let (tcp, relp) = (free_port(), free_port());
            if tcp != relp {
                break (tcp, relp);
            }
        };
        let d = dir.display();
        let conf = format!(
            r#"global(workDirectory="{d}/work")
module(load="imtcp")
module(load="imrelp")
module(load="mmpstrucdata")
input(type="imtcp" address="127.0.0.1" port="{port}")
input(type="imrelp" address="127.0.0.1" port="{relp_port}" ruleset="relp")
template(name="everything" type="string" string="%jsonmesg%\n")
ruleset(name="out") {{
  action(type="mmpstrucdata")
  action(type="omfile" file="{d}/messages.jsonl" template="everything")
}}
ruleset(name="relp" queue.type="Disk" queue.filename="relp" queue.checkpointInterval="1") {{
  call out
}}
call out
"#
        );
        fs::write(dir.join("rsyslog.conf"), conf).unwrap();
        let mut rsyslog = Rsyslog { dir: dir.to_owned(), port, relp_port, child: None };
        rsyslog.run();
        rsyslog
    }

    /// Starts it (again), on the same port and file.
    pub fn run(&mut self) {
        let log = self.dir.join("rsyslogd.log");
        let child = Command::new(program("rsyslogd", "rsyslog"))
            .arg("-n")
            .arg("-f")
            .arg(self.dir.join("rsyslog.conf"))
            .arg("-i")
            .arg(self.dir.join("rsyslogd.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting rsyslogd");
        self.child = Some(child);
        let (port, relp_port) = (self.port, self.relp_port);
        wait_for("rsyslogd to listen", &log, || {
            TcpStream::connect(("127.0.0.1", port)).is_ok() && listening(relp_port)
        });
        let said = fs::read_to_string(&log).unwrap_or_default();
        assert!(!said.contains("error"), "rsyslogd: {said}");
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// What rsyslog wrote so far, as rsyslog's JSON records.
    pub fn messages(&self) -> Vec<Value> {
        fs::read_to_string(self.dir.join("messages.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        self.kill();
    }
}

/// credwatch's structured data in one of rsyslog's records.
pub fn structured_data(message: &Value) -> &Value {
    &message["$!"]["rfc5424-sd"]["credwatch@32473"]
}

/// `nats-server -js`, its store in `dir/store`, kept across [`NatsServer::restart`].
pub struct NatsServer {
    dir: PathBuf,
    pub port: u16,
    pub child: Option<Child>,
}

impl NatsServer {
    /// The file-stored stream `CREDWATCH` on `<prefix>.>` that a fleet's operator creates, with
    /// a duplicate window (JetStream drops a repeated `Nats-Msg-Id` within it).
    pub fn create_stream(&self, prefix: &str, duplicate_window: Duration) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let client = async_nats::connect(self.url()).await.unwrap();
            async_nats::jetstream::new(client)
                .create_stream(async_nats::jetstream::stream::Config {
                    name: "CREDWATCH".into(),
                    subjects: vec![format!("{prefix}.>")],
                    duplicate_window,
                    storage: async_nats::jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .unwrap();
        });
    }

    pub fn start(dir: &Path) -> NatsServer {
        fs::create_dir_all(dir).unwrap();
        let mut server = NatsServer { dir: dir.to_owned(), port: free_port(), child: None };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts it (again) on the same port and store, until it says it is ready.
    pub fn restart(&mut self) {
        let log_path = self.dir.join("server.log");
        let ready = || fs::read_to_string(&log_path).unwrap_or_default().matches("Server is ready").count();
        let before = ready();
        let log = fs::OpenOptions::new().create(true).append(true).open(&log_path).unwrap();
        let child = Command::new(program("nats-server", "nats-server"))
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(self.dir.join("store"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting nats-server");
        self.child = Some(child);
        wait_for("nats-server to be ready", &log_path, || ready() > before);
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Prometheus scraping `target` every second.
pub struct Prometheus {
    child: Child,
    pub api: String,
    log: PathBuf,
}

impl Prometheus {
    pub fn start(dir: &Path, target: &str) -> Prometheus {
        fs::create_dir_all(dir).unwrap();
        let config = dir.join("prometheus.yml");
        fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: credwatch\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let web = format!("127.0.0.1:{}", free_port());
        let log = dir.join("prometheus.log");
        let file = fs::File::create(&log).unwrap();
        let child = Command::new(program("prometheus", "prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={web}"))
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("starting prometheus");
        Prometheus { child, api: format!("http://{web}"), log }
    }

    /// The samples of an instant query through Prometheus' HTTP API (with python3's urllib,
    /// which the end-to-end tests need anyway: no HTTP client in this crate for one GET).
    pub fn query(&self, expr: &str) -> Vec<Value> {
        const GET: &str = "import sys, urllib.parse, urllib.request\n\
                           url = sys.argv[1] + '/api/v1/query?' + urllib.parse.urlencode({'query': sys.argv[2]})\n\
                           sys.stdout.buffer.write(urllib.request.urlopen(url, timeout=5).read())";
        let output = Command::new("python3").args(["-c", GET, &self.api, expr]).output().expect("running python3");
        let json: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        json["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until `expr` has a sample that `ok` takes; returns it.
    pub fn wait_for(&self, expr: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            if let Some(sample) = self.query(expr).into_iter().find(|sample| ok(sample)) {
                return sample;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{expr}: {:?} after 60 s; Prometheus said:\n{}",
                self.query(expr),
                fs::read_to_string(&self.log).unwrap_or_default()
            );
            thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The HTTPS receiver (Python's http.server behind its ssl module): each POST's path,
/// Authorization and Content-Type headers and body as one JSON line in `requests.jsonl`, written
/// before it answers 200.
const HTTPS_RECEIVER: &str = r#"
import http.server, json, ssl, sys
dir, port = sys.argv[1], int(sys.argv[2])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(dir + "/requests.jsonl", "a") as out:
            out.write(json.dumps({"path": self.path, "authorization": self.headers.get("Authorization", ""),
                                  "content_type": self.headers.get("Content-Type", ""),
                                  "body": body.decode()}) + "\n")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(dir + "/server.pem", dir + "/server.key")
server = http.server.HTTPServer(("127.0.0.1", port), Handler)
server.socket = context.wrap_socket(server.socket, server_side=True)
open(dir + "/ready", "w").close()
server.serve_forever()
"#;

/// An HTTPS receiver of webhooks on 127.0.0.1, its certificate signed by a CA of the test's
/// (`ca_file`). A process of its own, so that a test can stop it (SIGSTOP), kill it and start it
/// again on the same port with what it had recorded.
pub struct HttpsReceiver {
    dir: PathBuf,
    pub port: u16,
    /// The PEM of the CA that signed the receiver's certificate.
    pub ca_file: PathBuf,
    pub child: Option<Child>,
}

impl HttpsReceiver {
    pub fn start(dir: &Path) -> HttpsReceiver {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        fs::create_dir_all(dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "credwatch e2e CA");
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &Issuer::from_params(&ca, &ca_key))
            .unwrap();
        let ca_file = dir.join("ca.pem");
        fs::write(&ca_file, ca_pem).unwrap();
        fs::write(dir.join("server.pem"), cert.pem()).unwrap();
        fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
        crate::write_executable(&dir.join("receiver.py"), HTTPS_RECEIVER);
        let mut receiver = HttpsReceiver { dir: dir.to_owned(), port: free_port(), ca_file, child: None };
        receiver.run();
        receiver
    }

    /// Starts it (again), on the same port and file, until it listens.
    pub fn run(&mut self) {
        let (ready, log) = (self.dir.join("ready"), self.dir.join("receiver.log"));
        let _ = fs::remove_file(&ready);
        let child = Command::new("python3")
            .arg(self.dir.join("receiver.py"))
            .arg(&self.dir)
            .arg(self.port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting python3");
        self.child = Some(child);
        wait_for("the HTTPS receiver to listen", &log, || ready.exists());
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Every request so far, in the order it came: `path`, `authorization`, `content_type`, `body`.
    pub fn requests(&self) -> Vec<Value> {
        fs::read_to_string(self.dir.join("requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

impl Drop for HttpsReceiver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Where dockerd 20.10 keeps its trust key whatever its flags say (its configuration folder):
/// removed after the test when the test's daemon made it.
const DOCKERD_TRUST_KEY: &str = "/etc/docker/key.json";

/// A dockerd of the test's own (Debian's docker.io), apart from any other on the machine: its
/// own data and exec roots (its containerd's too), pid file, configuration and socket in `dir`,
/// no iptables rules and no bridge (its containers run with `--network=none` or on the host's
/// network). Dropped (also when the test fails), its containers are removed and it stops; its
/// folder is the caller's to remove.
pub struct Dockerd {
    dir: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
    made_trust_key: bool,
}

impl Dockerd {
    pub fn start(dir: &Path) -> Dockerd {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("daemon.json"), "{}\n").unwrap();
        let socket = dir.join("docker.sock");
        let log = dir.join("dockerd.log");
        let made_trust_key = !Path::new(DOCKERD_TRUST_KEY).exists();
        let child = Command::new(program("dockerd", "docker.io"))
            .arg("--config-file")
            .arg(dir.join("daemon.json"))
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .arg("--host")
            .arg(format!("unix://{}", socket.display()))
            .args(["--iptables=false", "--ip6tables=false", "--bridge=none", "--log-level=warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting dockerd");
        let dockerd = Dockerd { dir: dir.to_owned(), socket, child: Some(child), made_trust_key };
        wait_for("dockerd to answer", &log, || {
            dockerd
                .docker()
                .args(["version", "--format", "{{.Server.Version}}"])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        dockerd
    }

    /// `unix://SOCKET`: DOCKER_HOST for a client of this daemon.
    pub fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The docker client, talking to this daemon only.
    pub fn docker(&self) -> Command {
        let mut command = Command::new(program("docker", "docker.io"));
        command.env("DOCKER_HOST", self.host()).env("DOCKER_CONFIG", self.dir.join("client"));
        command
    }

    /// `docker ARGS...`, which must succeed; its standard output, trimmed.
    pub fn run(&self, args: &[&str]) -> String {
        let output = self.docker().args(args).output().expect("starting docker");
        assert!(
            output.status.success(),
            "docker {} failed ({}): {}\n--- dockerd ---\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
            self.log()
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// What dockerd logged.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default()
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let containers = self.docker().args(["ps", "--all", "--quiet"]).output();
        if let Ok(containers) = containers {
            let ids =
                String::from_utf8_lossy(&containers.stdout).split_whitespace().map(str::to_owned).collect::<Vec<_>>();
            if !ids.is_empty() {
                let _ = self.docker().args(["rm", "--force", "--volumes"]).args(&ids).output();
            }
        }
        if let Some(mut child) = self.child.take() {
            // SIGTERM: dockerd stops its containerd and unmounts its layers.
            signal(&child, "-TERM");
            let start = Instant::now();
            while child.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(30) {
                thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // A daemon that had to be killed leaves its layers' and netns' mounts: gone too, so that
        // the folder can be removed.
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let prefix = format!("{}/", self.dir.display());
        let mut left: Vec<&str> =
            mounts.lines().filter_map(|line| line.split(' ').nth(1)).filter(|m| m.starts_with(&prefix)).collect();
        left.reverse();
        for mount in left {
            let _ = Command::new("umount").args(["--lazy", mount]).status();
        }
        if self.made_trust_key {
            let _ = fs::remove_file(DOCKERD_TRUST_KEY);
        }
    }
}
