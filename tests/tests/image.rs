//! Issue 12: the container image (`cargo xtask image`, deploy/Dockerfile, FROM scratch) and the
//! Kubernetes DaemonSet (deploy/daemonset.yaml). The manifest is read as data and checked for
//! what the sensor needs, its configuration goes through the real binary's `config check`; then
//! a dockerd of the test's own builds the image and runs it as the DaemonSet would (privileged,
//! the host's PID namespace and network, the manifest's mounts and arguments), and the agent in
//! it catches a package tree started on the host and one started inside another container.
//! Run as root with `cargo xtask test` (it builds the static binary first).

use std::{
    collections::BTreeMap,
    fs,
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{
    credwatch_binary, parse_alerts,
    servers::{free_port, Dockerd},
    write_executable, Sandbox, FAKE_MANAGER,
};
use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ lives in the workspace").to_path_buf()
}

/// The manifest's documents, by kind.
fn manifest() -> BTreeMap<String, Value> {
    let path = workspace().join("deploy/daemonset.yaml");
    let text = fs::read_to_string(&path).unwrap();
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut kinds = BTreeMap::new();
    for document in documents {
        let kind = document["kind"].as_str().unwrap_or_else(|| panic!("a document without a kind: {document}"));
        assert!(kinds.insert(kind.to_owned(), document.clone()).is_none(), "two documents of kind {kind}");
    }
    kinds
}

/// The DaemonSet's pod as the tests read it: its container, and each volume by name.
struct Pod {
    spec: Value,
    container: Value,
    volumes: BTreeMap<String, Value>,
}

impl Pod {
    fn of(manifest: &BTreeMap<String, Value>) -> Pod {
        let spec = manifest["DaemonSet"]["spec"]["template"]["spec"].clone();
        let containers = spec["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "one container: {spec:#}");
        let volumes = spec["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .map(|v| (v["name"].as_str().expect("a volume's name").to_owned(), v.clone()))
            .collect();
        Pod { container: containers[0].clone(), spec, volumes }
    }

    fn args(&self) -> Vec<String> {
        let args = self.container["args"].as_array().expect("args");
        args.iter().map(|a| a.as_str().expect("an argument is a string").to_owned()).collect()
    }

    /// The container's mounts: (mount path, its volume, the mount itself).
    fn mounts(&self) -> Vec<(String, Value, Value)> {
        let mounts = self.container["volumeMounts"].as_array().expect("volumeMounts");
        mounts
            .iter()
            .map(|m| {
                let name = m["name"].as_str().expect("a mount's volume");
                let volume = self.volumes.get(name).unwrap_or_else(|| panic!("no volume {name}")).clone();
                (m["mountPath"].as_str().expect("mountPath").to_owned(), volume, m.clone())
            })
            .collect()
    }

    /// The mount at `path`: its volume and the mount.
    fn mount(&self, path: &str) -> (Value, Value) {
        let found = self.mounts().into_iter().find(|(at, _, _)| at == path);
        let (_, volume, mount) = found.unwrap_or_else(|| panic!("nothing is mounted at {path}: {:#}", self.container));
        (volume, mount)
    }

    /// The configuration file the arguments name, and the ConfigMap key it is.
    fn config_file(&self) -> (String, String) {
        let args = self.args();
        let at = args.iter().position(|a| a == "--config").expect("the arguments name a --config");
        let path = args[at + 1].clone();
        let (dir, key) = path.rsplit_once('/').expect("an absolute path");
        let (volume, _) = self.mount(dir);
        let map = volume["configMap"]["name"].as_str().unwrap_or_else(|| panic!("{dir} is no ConfigMap: {volume:#}"));
        assert_eq!(map, "credwatch", "{volume:#}");
        (path.clone(), key.to_owned())
    }
}

/// The configuration of the ConfigMap, as a YAML document and as text.
fn configuration(manifest: &BTreeMap<String, Value>, key: &str) -> (Value, String) {
    let text = manifest["ConfigMap"]["data"][key].as_str().unwrap_or_else(|| panic!("no {key} in the ConfigMap"));
    let value = serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("the ConfigMap's {key}: {e}"));
    (value, text.to_owned())
}

/// Whether `path` lies in `dir`.
fn under(path: &str, dir: &str) -> bool {
    Path::new(path).starts_with(dir)
}

#[test]
fn the_daemonset_gives_the_sensor_what_it_needs_and_its_configuration_loads() {
    let manifest = manifest();
    for kind in ["Namespace", "ConfigMap", "DaemonSet"] {
        assert!(manifest.contains_key(kind), "no {kind} in deploy/daemonset.yaml");
    }
    let pod = Pod::of(&manifest);
    let spec = &pod.spec;
    // The host's processes (and /proc); its UTS namespace (host.name) and network (the probe).
    assert_eq!(spec["hostPID"], true, "{spec:#}");
    assert_eq!(spec["hostNetwork"], true, "{spec:#}");
    // Every node: one toleration of every taint.
    let tolerations = spec["tolerations"].as_array().expect("tolerations");
    assert!(
        tolerations.iter().any(|t| t["operator"] == "Exists" && t.get("key").is_none() && t.get("effect").is_none()),
        "no toleration of every taint: {tolerations:#?}"
    );
    let container = &pod.container;
    assert_eq!(container["image"], format!("credwatch:{VERSION}"), "the image `cargo xtask image` tags");
    assert_eq!(container["securityContext"]["privileged"], true, "{container:#}");
    for bound in ["requests", "limits"] {
        assert!(container["resources"][bound]["memory"].is_string(), "no memory {bound}: {container:#}");
    }
    assert!(container["resources"]["requests"]["cpu"].is_string(), "no cpu request: {container:#}");

    // What the sensor reads and writes on the node, each the host's own path.
    let host_paths = [
        ("/sys/kernel/btf", true),
        ("/sys/kernel/tracing", true),
        ("/sys/fs/bpf", false),
        ("/etc/machine-id", true),
        ("/var/lib/credwatch", false),
        ("/var/log/credwatch", false),
    ];
    for (path, read_only) in host_paths {
        let (volume, mount) = pod.mount(path);
        assert_eq!(volume["hostPath"]["path"], path, "{path} is not the node's: {volume:#}");
        assert_eq!(mount["readOnly"].as_bool().unwrap_or(false), read_only, "{path} read-only: {mount:#}");
    }
    // A bpffs the agent mounts is the node's, so that the pins outlive the pod.
    assert_eq!(pod.mount("/sys/fs/bpf").1["mountPropagation"], "Bidirectional");

    // The arguments: `watch` with the ConfigMap's configuration.
    let args = pod.args();
    assert_eq!(args.first().map(String::as_str), Some("watch"), "{args:?}");
    let (config_path, key) = pod.config_file();
    let (config, text) = configuration(&manifest, &key);
    // What it writes lands on the node's folders.
    let alerts = config["alerts"].as_str().expect("alerts to a file");
    assert!(under(alerts, "/var/log/credwatch"), "alerts {alerts} are not on the node");
    let spool = config["spool_dir"].as_str().expect("spool_dir");
    assert!(under(spool, "/var/lib/credwatch"), "the spool {spool} is not on the node");
    // The liveness probe asks the metrics endpoint, on the port it listens on.
    let probe = &container["livenessProbe"]["httpGet"];
    assert_eq!(probe["path"], "/metrics", "{probe:#}");
    let listen = config["metrics_listen"].as_str().expect("metrics_listen");
    let port: u64 = listen.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).expect("metrics_listen's port");
    let ports = container["ports"].as_array().expect("ports");
    let named =
        ports.iter().find(|p| p["name"] == probe["port"]).unwrap_or_else(|| panic!("no port {}", probe["port"]));
    assert_eq!(named["containerPort"], port, "the probe's port is not metrics_listen's ({listen})");
    // On the host network the kubelet reaches the pod at the node's address: not loopback.
    assert!(listen.starts_with("0.0.0.0:"), "metrics_listen {listen} is not reachable by the probe");

    // The real binary accepts the configuration as the pod has it.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(&key);
    fs::write(&file, &text).unwrap();
    let checked = Command::new(credwatch_binary()).args(["config", "check"]).arg(&file).output().unwrap();
    assert!(
        checked.status.success(),
        "credwatch config check of the ConfigMap's {key} ({config_path} in the pod):\n{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// The alerts written so far to `file` (by root, inside the container).
fn alerts_in(file: &Path) -> Vec<Value> {
    parse_alerts(&fs::read_to_string(file).unwrap_or_default())
}

fn wait_for_alert(file: &Path, wanted: impl Fn(&Value) -> bool, timeout: Duration) -> Option<Value> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Some(alert) = alerts_in(file).into_iter().find(|a| wanted(a)) {
            return Some(alert);
        }
        thread::sleep(Duration::from_millis(50));
    }
    None
}

/// `GET PATH` on 127.0.0.1:`port`: the status line and the body (the liveness probe's request).
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

/// Debian's busybox-static: the other container's only program (nothing can be pulled).
fn static_busybox() -> PathBuf {
    let busybox = PathBuf::from("/bin/busybox");
    let headers = Command::new("readelf").arg("-lW").arg(&busybox).output().expect("running readelf");
    assert!(
        headers.status.success() && !String::from_utf8_lossy(&headers.stdout).contains("INTERP"),
        "{} is missing or not static: install Debian's busybox-static (`cargo xtask test` does)",
        busybox.display()
    );
    busybox
}

/// The other container: a static busybox, the fake npm of the other tests as /usr/bin/npm (a
/// manager by its name, not in /tmp), and fake credentials in its own /root.
fn build_package_image(sandbox: &Sandbox, dockerd: &Dockerd) -> &'static str {
    let context = sandbox.top().join("npm-image");
    fs::create_dir_all(&context).unwrap();
    fs::copy(static_busybox(), context.join("busybox")).unwrap();
    write_executable(&context.join("npm"), FAKE_MANAGER);
    fs::create_dir_all(context.join("root/.ssh")).unwrap();
    fs::copy(sandbox.home().join(".ssh/id_ed25519"), context.join("root/.ssh/id_ed25519")).unwrap();
    fs::write(
        context.join("Dockerfile"),
        "FROM scratch\n\
         COPY busybox /bin/busybox\n\
         RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n\
         COPY npm /usr/bin/npm\n\
         COPY root/ /root/\n\
         ENV HOME=/root PATH=/usr/bin:/bin\n",
    )
    .unwrap();
    let tag = "credwatch-e2e-npm:latest";
    dockerd.run(&["build", "--tag", tag, context.to_str().unwrap()]);
    tag
}

/// The agent's log records (JSON lines on its standard error, `log_format: json`).
fn log_records(dockerd: &Dockerd, container: &str) -> Vec<Value> {
    let output = dockerd.docker().args(["logs", container]).output().expect("docker logs");
    String::from_utf8_lossy(&output.stderr).lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

#[test]
fn the_image_run_as_its_pod_catches_package_trees_on_the_host_and_in_another_container() {
    let sandbox = Sandbox::new();
    let manifest = manifest();
    let pod = Pod::of(&manifest);

    // On the host first, for comparison: spawn to `watching`, and the agent's own figure.
    let started = Instant::now();
    let watch = sandbox.watch();
    let host_ready = started.elapsed();
    let host_run = watch.stop();
    let stopped = sandbox.stop_pinned();
    assert!(stopped.status.success(), "credwatch stop: {}", String::from_utf8_lossy(&stopped.stderr));

    let dockerd = Dockerd::start(&sandbox.top().join("docker"));
    let built = Command::new(workspace().join("target/debug/xtask"))
        .args(["image", "--no-build"])
        .env("DOCKER_HOST", dockerd.host())
        .env("DOCKER_CONFIG", sandbox.top().join("docker/client"))
        .output()
        .expect("running target/debug/xtask (cargo xtask builds it)");
    assert!(
        built.status.success(),
        "xtask image --no-build: {}{}\n--- dockerd ---\n{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr),
        dockerd.log()
    );
    let image = pod.container["image"].as_str().unwrap();
    let size: u64 = dockerd.run(&["image", "inspect", "--format", "{{.Size}}", image]).parse().unwrap();
    assert_eq!(
        dockerd.run(&["image", "inspect", "--format", "{{.Id}}", image]),
        dockerd.run(&["image", "inspect", "--format", "{{.Id}}", "credwatch:latest"]),
        "credwatch:latest is not the image just built"
    );
    // FROM scratch: the one layer of its one COPY.
    assert_eq!(dockerd.run(&["image", "inspect", "--format", "{{len .RootFS.Layers}}", image]), "1");
    let packages = build_package_image(&sandbox, &dockerd);

    // The node's folders and the ConfigMap, in the sandbox; the rest of the mounts are the host's.
    let node = sandbox.top().join("node");
    let mut run = dockerd.docker();
    run.args(["run", "--detach", "--name", "credwatch"]);
    assert_eq!(pod.container["securityContext"]["privileged"], true);
    run.args(privileged());
    assert_eq!(pod.spec["hostPID"], true);
    assert_eq!(pod.spec["hostNetwork"], true);
    // A pod on the host network shares the node's UTS namespace too.
    run.args(["--pid=host", "--network=host", "--uts=host"]);
    for (path, volume, mount) in pod.mounts() {
        let source = if let Some(map) = volume["configMap"]["name"].as_str() {
            let dir = node.join("configmaps").join(map);
            fs::create_dir_all(&dir).unwrap();
            for (key, text) in manifest["ConfigMap"]["data"].as_object().unwrap() {
                fs::write(dir.join(key), text.as_str().unwrap()).unwrap();
            }
            dir
        } else {
            let host = volume["hostPath"]["path"].as_str().unwrap_or_else(|| panic!("{volume:#}"));
            if host.starts_with("/var/") {
                // What the agent writes on the node goes to the sandbox here.
                let dir = node.join(host.trim_start_matches('/'));
                fs::create_dir_all(&dir).unwrap();
                dir
            } else {
                PathBuf::from(host)
            }
        };
        // `Bidirectional` (rshared) needs the node's mount to be shared, as systemd makes
        // every mount; the test machines' are private, so the bind is plain here.
        let suffix = if mount["readOnly"] == true { ":ro" } else { "" };
        run.arg("--volume").arg(format!("{}:{path}{suffix}", source.display()));
    }
    // This run's own pins (the sandbox detaches them) and a free port for the metrics, through
    // the configuration's environment variables.
    let metrics_port = free_port();
    run.arg("--env").arg(format!("CREDWATCH_PIN_DIR={}", sandbox.pin_dir().display()));
    run.arg("--env").arg(format!("CREDWATCH_METRICS_LISTEN=127.0.0.1:{metrics_port}"));
    run.arg(image).args(pod.args());
    let started = Instant::now();
    let output = run.output().unwrap();
    assert!(output.status.success(), "docker run: {}\n{}", String::from_utf8_lossy(&output.stderr), dockerd.log());
    let watching = |records: &[Value]| {
        records.iter().find(|r| r["message"].as_str().is_some_and(|m| m.starts_with("watching package trees"))).cloned()
    };
    let ready = loop {
        let records = log_records(&dockerd, "credwatch");
        if let Some(record) = watching(&records) {
            break record;
        }
        let state = dockerd.run(&["inspect", "--format", "{{.State.Status}}", "credwatch"]);
        let logs = dockerd.docker().args(["logs", "credwatch"]).output().unwrap();
        assert!(
            state == "running" && started.elapsed() < Duration::from_secs(60),
            "the agent in the container is {state} and not watching after {:?}:\n{}",
            started.elapsed(),
            String::from_utf8_lossy(&logs.stderr)
        );
        thread::sleep(Duration::from_millis(20));
    };
    let container_ready = started.elapsed();
    let metrics = http_get(metrics_port, "/metrics").unwrap_or_default();
    assert!(metrics.starts_with("HTTP/1.1 200"), "the liveness probe's GET /metrics: {metrics}");
    assert!(metrics.contains("credwatch_programs_attached"), "{metrics}");
    let alerts = node.join("var/log/credwatch/alerts.jsonl");

    // (a) A package tree started on the host, reading a fake key of its (the sandbox's) home.
    let key = sandbox.credential(".ssh/id_ed25519");
    sandbox.setup(
        "the fake npm's postinstall, on the host",
        sandbox.command(sandbox.fake_manager()).args(["on-the-host", "cat \"$HOME/.ssh/id_ed25519\" > /dev/null"]),
    );
    let logs =
        || String::from_utf8_lossy(&dockerd.docker().args(["logs", "credwatch"]).output().unwrap().stderr).into_owned();
    let on_host = wait_for_alert(
        &alerts,
        |a| a["package"]["name"] == "on-the-host" && a["file"]["path"] == key.as_str(),
        Duration::from_secs(20),
    )
    .unwrap_or_else(|| panic!("no alert for the host's package tree in {}:\n{}", alerts.display(), logs()));
    assert_eq!(on_host["rule"]["id"], "ssh-private-keys", "{on_host:#}");
    assert_eq!(on_host["package"]["lifecycle"], "postinstall", "{on_host:#}");
    // The node's name, from the UTS namespace the pod shares with it on the host network.
    let host_name = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(on_host["host"]["name"], host_name.trim(), "{on_host:#}");

    // (b) The same inside another container: its own root and fake key, no network.
    dockerd.run(&[
        "run",
        "--name",
        "npm-in-a-container",
        "--network=none",
        packages,
        "/usr/bin/npm",
        "in-a-container",
        "cat /root/.ssh/id_ed25519 > /dev/null",
    ]);
    let id = dockerd.run(&["inspect", "--format", "{{.Id}}", "npm-in-a-container"]);
    let in_container = wait_for_alert(
        &alerts,
        |a| a["package"]["name"] == "in-a-container" && a["file"]["path"] == "/root/.ssh/id_ed25519",
        Duration::from_secs(20),
    )
    .unwrap_or_else(|| panic!("no alert for the container's package tree in {}:\n{}", alerts.display(), logs()));
    assert_eq!(in_container["rule"]["id"], "ssh-private-keys", "{in_container:#}");
    assert_ne!(on_host["container"]["id"], Value::String(id.clone()), "{on_host:#}");

    println!(
        "image {image}: {:.1} MB; ready (spawn to `watching`): on the host {} ms (agent's figure {} ms), in the container {} ms (`docker run` included; agent's figure {} ms)",
        size as f64 / 1e6,
        host_ready.as_millis(),
        startup_ms(&host_run.stderr),
        container_ready.as_millis(),
        ready["startup_ms"]
    );

    // The node's machine-id (mounted read-only), and the container's identity from the
    // process's cgroup (issue 12, point 1).
    let machine_id = fs::read_to_string("/etc/machine-id").unwrap();
    assert_eq!(on_host["host"]["id"], machine_id.trim(), "{on_host:#}");
    assert_eq!(in_container["container"]["id"], Value::String(id), "{in_container:#}");
    assert_eq!(in_container["container"]["runtime"], "docker", "{in_container:#}");

    let stopped = dockerd.docker().args(["stop", "--time", "20", "credwatch"]).output().unwrap();
    assert!(stopped.status.success(), "docker stop: {}", String::from_utf8_lossy(&stopped.stderr));
    let exit = dockerd.run(&["inspect", "--format", "{{.State.ExitCode}}", "credwatch"]);
    assert_eq!(exit, "0", "SIGTERM stops the agent cleanly:\n{}", logs());
}

/// Capabilities by number, as docker names them (the ones docker 20.10 knows: up to
/// CAP_AUDIT_READ; it cannot name CAP_PERFMON, CAP_BPF or CAP_CHECKPOINT_RESTORE).
const CAPABILITIES: [&str; 38] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
];

/// `privileged: true` as far as this test may grant it: every capability of its own bounding
/// set, no seccomp filter, no AppArmor profile, /proc and /sys unmasked. `--privileged` itself
/// asks runc for every capability, which fails where the test's bounding set lacks one (these
/// machines withhold CAP_SYS_RESOURCE: "unable to apply caps: operation not permitted").
fn privileged() -> Vec<String> {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let bounding = status.lines().find_map(|line| line.strip_prefix("CapBnd:")).expect("CapBnd in /proc/self/status");
    let bounding = u64::from_str_radix(bounding.trim(), 16).expect("CapBnd is hexadecimal");
    let mut args: Vec<String> =
        ["--cap-add=ALL", "--security-opt=seccomp=unconfined", "--security-opt=apparmor=unconfined"]
            .map(str::to_owned)
            .into();
    args.push("--security-opt=systempaths=unconfined".into());
    for (bit, name) in CAPABILITIES.iter().enumerate() {
        if bounding & (1 << bit) == 0 {
            args.push(format!("--cap-drop={name}"));
        }
    }
    args
}

/// The agent's own start-up figure in a text log (`... after N ms; ...`).
fn startup_ms(log: &str) -> String {
    log.lines()
        .find_map(|line| line.split(" after ").nth(1)?.split(" ms").next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}
