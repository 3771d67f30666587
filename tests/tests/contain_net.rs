//! `credwatch run --contain --contain-net registries`: the box's only way out is credwatch's
//! proxy. A real `npm install` fetches a package from the user's configured registry through it;
//! the package's postinstall (`tests/fixtures/npm/contain-net-probe`) then tries every other way
//! out, and each fails, the proxy's refusals with an alert.
//!
//! credwatch runs in a network namespace of the test's own (the lab): only loopback, with a
//! registry stand-in on 127.0.0.10, another receiver on 127.0.0.11 and an abstract unix socket.
//! To the box, that namespace is "the machine". Nothing leaves it.

use std::{
    fs::{self, File},
    io::{self, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    os::{
        fd::AsRawFd as _,
        linux::net::SocketAddrExt as _,
        unix::{net::UnixListener, process::CommandExt as _},
    },
    path::Path,
    process::Command,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    thread,
};

use credwatch_e2e::{Run, Sandbox, EXIT_ALERT};
use serde_json::Value;

const PACKAGE: &str = "contain-net-probe";
/// Longest request head the stand-in reads.
const MAX_HEAD: usize = 16 * 1024;

/// The lab: its namespace, and what its servers saw.
struct Lab {
    namespace: File,
    registry: SocketAddr,
    other: SocketAddr,
    /// A stand-in of the user's own proxy (see [`serve_upstream`]).
    upstream: SocketAddr,
    abstract_name: String,
    /// The registry stand-in's request lines.
    requests: Arc<Mutex<Vec<String>>>,
    other_connections: Arc<AtomicUsize>,
    abstract_connections: Arc<AtomicUsize>,
    /// The upstream stand-in's request lines.
    upstream_requests: Arc<Mutex<Vec<String>>>,
}

impl Lab {
    /// A new namespace with `lo` up, and its servers: the registry stand-in serves `tarball` as
    /// the one version of [`PACKAGE`].
    fn start(tarball: &Path) -> Lab {
        let abstract_name = format!("credwatch-test-contain-net-{}", std::process::id());
        let name = abstract_name.clone();
        // Namespaces are per thread: the listeners stay in this one after the thread ends.
        let (namespace, registry, other, upstream, unix) = thread::spawn(move || {
            // SAFETY: unshare(2) takes no pointer; it changes this thread only.
            let unshared = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            assert_eq!(unshared, 0, "unshare(CLONE_NEWNET): {}", io::Error::last_os_error());
            let up = Command::new("ip").args(["link", "set", "lo", "up"]).status().expect("running ip");
            assert!(up.success(), "ip link set lo up: {up}");
            let registry = TcpListener::bind("127.0.0.10:0").unwrap();
            let other = TcpListener::bind("127.0.0.11:0").unwrap();
            let upstream = TcpListener::bind("127.0.0.12:0").unwrap();
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            let unix = UnixListener::bind_addr(&address).unwrap();
            let namespace = File::open("/proc/thread-self/ns/net").unwrap();
            (namespace, registry, other, upstream, unix)
        })
        .join()
        .expect("the lab's thread");
        let lab = Lab {
            namespace,
            registry: registry.local_addr().unwrap(),
            other: other.local_addr().unwrap(),
            upstream: upstream.local_addr().unwrap(),
            abstract_name,
            requests: Arc::default(),
            other_connections: Arc::default(),
            abstract_connections: Arc::default(),
            upstream_requests: Arc::default(),
        };
        let requests = Arc::clone(&lab.upstream_requests);
        thread::spawn(move || serve_upstream(&upstream, &requests));
        let (base, bytes, requests) = (lab.registry_url(), fs::read(tarball).unwrap(), Arc::clone(&lab.requests));
        thread::spawn(move || serve_registry(&registry, &base, &bytes, &requests));
        let counted = Arc::clone(&lab.other_connections);
        thread::spawn(move || {
            for _ in other.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        let counted = Arc::clone(&lab.abstract_connections);
        thread::spawn(move || {
            for _ in unix.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        lab
    }

    fn registry_url(&self) -> String {
        format!("http://{}/", self.registry)
    }

    /// `command` runs in the lab's namespace.
    fn enter(&self, command: &mut Command) {
        let fd = self.namespace.as_raw_fd();
        // SAFETY: setns(2) only, on an fd that stays open until the exec.
        unsafe {
            command.pre_exec(move || match libc::setns(fd, libc::CLONE_NEWNET) {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            });
        }
    }

    /// What the probe needs to know of the lab, and where it reports.
    fn probe_env(&self, report: &Path) -> Vec<(String, String)> {
        [
            ("CONTAIN_NET_REPORT", report.to_string_lossy().into_owned()),
            ("CONTAIN_NET_REGISTRY", self.registry.to_string()),
            ("CONTAIN_NET_OTHER", self.other.to_string()),
            ("CONTAIN_NET_ABSTRACT", self.abstract_name.clone()),
        ]
        .map(|(name, value)| (name.to_owned(), value))
        .to_vec()
    }
}

/// A static npm registry of one package: its packument and its tarball, one request per
/// connection.
fn serve_registry(listener: &TcpListener, base: &str, tarball: &[u8], requests: &Arc<Mutex<Vec<String>>>) {
    let tarball_path = format!("/{PACKAGE}/-/{PACKAGE}-1.0.0.tgz");
    let packument = serde_json::json!({
        "name": PACKAGE,
        "dist-tags": {"latest": "1.0.0"},
        "versions": {"1.0.0": {
            "name": PACKAGE,
            "version": "1.0.0",
            "scripts": {"postinstall": "node probe.js"},
            "dist": {"tarball": format!("{}{}", base.trim_end_matches('/'), tarball_path)},
        }},
    })
    .to_string();
    for stream in listener.incoming().flatten() {
        let (tarball, packument, tarball_path) = (tarball.to_vec(), packument.clone(), tarball_path.clone());
        let requests = Arc::clone(requests);
        thread::spawn(move || {
            let mut stream: TcpStream = stream;
            let Some(line) = request_line(&mut stream) else { return };
            let path = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
            requests.lock().unwrap().push(line);
            let (status, body, kind) = if path == format!("/{PACKAGE}") {
                ("200 OK", packument.into_bytes(), "application/json")
            } else if path == tarball_path {
                ("200 OK", tarball, "application/octet-stream")
            } else {
                ("404 Not Found", b"{}".to_vec(), "application/json")
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&body));
        });
    }
}

/// The request line of the head a client sends (the head is read whole).
fn request_line(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    Some(String::from_utf8_lossy(head.split(|&b| b == b'\r').next().unwrap_or_default()).into_owned())
}

/// The user's own proxy, as a stand-in: it records each request line, accepts every CONNECT,
/// and answers the one request sent through the tunnel itself (`upstream`), reaching nothing.
fn serve_upstream(listener: &TcpListener, requests: &Arc<Mutex<Vec<String>>>) {
    for stream in listener.incoming().flatten() {
        let requests = Arc::clone(requests);
        thread::spawn(move || {
            let mut stream: TcpStream = stream;
            let Some(line) = request_line(&mut stream) else { return };
            requests.lock().unwrap().push(line);
            let _ = stream.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
            if request_line(&mut stream).is_some() {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nupstream");
            }
        });
    }
}

/// `credwatch run --contain --contain-net registries -- npm install PACKAGE` in the lab, from
/// its registry stand-in (the user's configured registry), with `env` for credwatch.
fn install_in_the_box(sandbox: &Sandbox, lab: &Lab, project: &Path, report: &Path, env: &[(&str, String)]) -> Run {
    let mut command = sandbox.credwatch("run");
    command.arg("--json").arg("--alerts").arg(sandbox.alerts_file());
    command.args(["--contain", "--contain-net", "registries", "--", "npm", "install", PACKAGE]);
    command.current_dir(project).envs(lab.probe_env(report));
    command.env("npm_config_registry", lab.registry_url()).env("npm_config_offline", "false");
    command.env("npm_config_fetch_retries", "0");
    command.envs(env.iter().map(|(name, value)| (name, value)));
    lab.enter(&mut command);
    sandbox.wait(sandbox.spawn(command))
}

/// The probe's report.
fn report(path: &Path, run: &Run) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|_| panic!("the probe did not report\n{}", run.describe()));
    serde_json::from_str(&text).unwrap()
}

#[test]
fn a_real_install_comes_through_the_proxy_and_every_other_way_out_is_shut_with_alerts() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack(&format!("npm/{PACKAGE}"));
    let project = sandbox.npm_project();
    let lab = Lab::start(&tarball);
    let report_path = sandbox.work().join("probe.json");

    let run = install_in_the_box(&sandbox, &lab, &project, &report_path, &[]);

    // The install: npm asked the configured registry for the packument and the tarball through
    // the proxy (absolute-URI requests, sent on in origin form), and the package's postinstall ran.
    run.assert_exit(EXIT_ALERT);
    let requests = lab.requests.lock().unwrap().clone();
    for wanted in [format!("GET /{PACKAGE} HTTP/1.1"), format!("GET /{PACKAGE}/-/{PACKAGE}-1.0.0.tgz HTTP/1.1")] {
        assert!(requests.contains(&wanted), "the registry stand-in got {requests:?}\n{}", run.describe());
    }
    assert!(project.join("node_modules").join(PACKAGE).join("probe.js").exists(), "{}", run.describe());
    let report = report(&report_path, &run);
    let proxy = report["proxy"].as_str().unwrap_or_else(|| panic!("no proxy in the box: {report:#}"));
    assert!(proxy.starts_with("http://127.0.0.1:"), "{report:#}");
    // The configured registry through a tunnel too.
    assert_eq!(report["registryTunnel"]["status"], 200, "{report:#}");
    assert_eq!(report["registryTunnel"]["answer"], "HTTP/1.1 200 OK", "{report:#}");
    // Elsewhere through the proxy: 403, by address and by name.
    assert_eq!(report["otherTunnel"]["status"], 403, "{report:#}");
    assert_eq!(report["namedTunnel"]["status"], 403, "{report:#}");
    // Directly: no route out of the box's namespace, where 127.0.0.11 is the box's own loopback
    // (nothing listens) and the metadata address has no route; the lab's abstract socket is not
    // in the box's namespace.
    assert_eq!(report["otherDirect"], "ECONNREFUSED", "{report:#}");
    assert_eq!(report["metadataDirect"], "ENETUNREACH", "{report:#}");
    assert_eq!(report["abstractDirect"], "ECONNREFUSED", "{report:#}");
    assert_eq!(lab.other_connections.load(Ordering::SeqCst), 0, "the other receiver was reached\n{}", run.describe());
    assert_eq!(
        lab.abstract_connections.load(Ordering::SeqCst),
        0,
        "the abstract socket was reached\n{}",
        run.describe()
    );

    // Each refusal is an alert, of the postinstall that asked.
    let refused: Vec<Value> =
        run.alerts().into_iter().filter(|alert| alert["rule"]["id"] == "contain-net-refused").collect();
    assert_eq!(refused.len(), 2, "{}", run.describe());
    let other = refused.iter().find(|alert| alert["destination"]["address"] == lab.other.ip().to_string());
    let other = other.unwrap_or_else(|| panic!("no refusal of {}\n{}", lab.other, run.describe()));
    assert_eq!(other["destination"]["port"], lab.other.port(), "{other:#}");
    let named = refused.iter().find(|alert| alert["destination"]["domain"] == "collector.exfil.invalid");
    let named = named.unwrap_or_else(|| panic!("no refusal of collector.exfil.invalid\n{}", run.describe()));
    assert_eq!(named["destination"]["port"], 443, "{named:#}");
    for alert in &refused {
        assert_eq!(alert["rule"]["severity"], "medium", "{alert:#}");
        assert_eq!(alert["event"]["outcome"], "denied", "{alert:#}");
        assert_eq!(alert["credwatch"]["enforcement"], "proxy", "{alert:#}");
        assert_eq!(alert["package"]["name"], PACKAGE, "{alert:#}");
        assert_eq!(alert["package"]["lifecycle"], "postinstall", "{alert:#}");
        assert_eq!(alert["process"]["args"], serde_json::json!(["node", "probe.js"]), "{alert:#}");
    }
}

#[test]
fn the_proxy_goes_through_the_users_own_proxy_when_credwatch_has_one() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack(&format!("npm/{PACKAGE}"));
    let project = sandbox.npm_project();
    let lab = Lab::start(&tarball);
    let report_path = sandbox.work().join("probe.json");
    let upstream = format!("http://{}", lab.upstream);
    let run = install_in_the_box(&sandbox, &lab, &project, &report_path, &[("HTTPS_PROXY", upstream.clone())]);
    run.assert_exit(EXIT_ALERT);
    let report = report(&report_path, &run);
    // The box's clients still see credwatch's proxy, not the user's.
    assert_ne!(report["proxy"], upstream.as_str(), "{report:#}");
    // The allowed tunnel went through the user's proxy (which answered it itself); the refused
    // ones never reached it.
    assert_eq!(report["registryTunnel"]["status"], 200, "{report:#}");
    assert_eq!(report["registryTunnel"]["answer"], "HTTP/1.1 200 OK", "{report:#}");
    let requests = lab.upstream_requests.lock().unwrap().clone();
    assert_eq!(requests, [format!("CONNECT {} HTTP/1.1", lab.registry)], "{report:#}\n{}", run.describe());
    assert_eq!(report["otherTunnel"]["status"], 403, "{report:#}");
}

#[test]
fn the_same_probe_outside_the_box_reaches_the_lab() {
    // The control: the probe and the lab work, so what fails in the box is the box's doing.
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack(&format!("npm/{PACKAGE}"));
    let lab = Lab::start(&tarball);
    let report_path = sandbox.work().join("probe.json");
    let probe = tarball.parent().unwrap().join("probe.js");
    let mut command = sandbox.command("node");
    command.arg(&probe).envs(lab.probe_env(&report_path));
    lab.enter(&mut command);
    let output = command.output().expect("running node");
    let run = Run {
        status: Some(output.status),
        elapsed: std::time::Duration::ZERO,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        alerts_text: String::new(),
    };
    let report = report(&report_path, &run);
    assert_eq!(report["proxy"], Value::Null, "{report:#}");
    assert_eq!(report["otherDirect"], "connected", "{report:#}");
    assert_eq!(report["abstractDirect"], "connected", "{report:#}");
    assert_eq!(report["metadataDirect"], "ENETUNREACH", "{report:#}");
    assert_eq!(lab.abstract_connections.load(Ordering::SeqCst), 1, "{report:#}");
}

#[test]
fn contain_net_without_contain_is_refused_before_anything_runs() {
    let sandbox = Sandbox::new();
    let marker = sandbox.work().join("ran");
    let output = sandbox
        .credwatch("run")
        .args(["--contain-net", "registries", "--", "touch", marker.to_str().unwrap()])
        .output()
        .expect("running credwatch");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--contain"), "{stderr}");
    assert!(!marker.exists());
}

#[test]
fn without_root_contain_net_is_refused_with_the_reason_before_anything_runs() {
    credwatch_e2e::require_root();
    const UID: u32 = 64_124;
    let top = tempfile::Builder::new().prefix("credwatch-contain-net-user-").tempdir().unwrap();
    fs::set_permissions(top.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // A copy the user can reach: the checkout may be under a home of mode 0700 (/root).
    let binary = top.path().join("credwatch");
    fs::copy(credwatch_e2e::credwatch_binary(), &binary).unwrap();
    let home = top.path().join("home");
    fs::create_dir(&home).unwrap();
    let chown = Command::new("chown").arg(format!("{UID}:{UID}")).arg(&home).status().unwrap();
    assert!(chown.success());
    let marker = top.path().join("ran");
    let output = Command::new("setpriv")
        .args(["--reuid", &UID.to_string(), "--regid", &UID.to_string(), "--clear-groups", "--"])
        .arg(&binary)
        .args(["run", "--contain", "--contain-net", "registries", "--", "touch"])
        .arg(&marker)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", std::env::var_os("PATH").unwrap())
        .current_dir(top.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("--contain-net needs root"), "{stderr}");
    assert!(!marker.exists(), "the command ran\n{stderr}");
}
