//! Issue 26: `watch`'s local alert log and its socket, with the real binary. The log keeps every
//! alert with its seq (across restarts); `credwatch alerts` and `show` read it; the socket gives
//! each user only the alerts about their own processes (root and group `credwatch` all), drops a
//! client that stops reading without slowing the agent, and gives a client what it missed. Run
//! as root with `cargo xtask test`.

use std::{
    fs,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    os::unix::{fs::PermissionsExt as _, net::UnixStream},
    path::Path,
    process::{Command, Output, Stdio},
    sync::{mpsc, Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{slow, write_executable, OtherUser, Sandbox, FAKE_MANAGER};
use serde_json::{json, Value};

/// The local alert log's lines, parsed (a torn line is left out).
fn logged(log: &Path) -> Vec<Value> {
    fs::read_to_string(log).unwrap_or_default().lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

/// Polls `found` until it gives something, for at most `timeout` (times [`slow`]).
fn wait_until<T>(what: &str, timeout: Duration, mut found: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(start.elapsed() < slow(timeout), "{what}: not within {timeout:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// The logged line of the alert about `path` (by the process of uid `uid` when given).
fn wait_logged(log: &Path, path: &str) -> Value {
    wait_until(&format!("an alert about {path} in {}", log.display()), Duration::from_secs(30), || {
        logged(log).into_iter().find(|line| line["alert"]["file"]["path"] == path)
    })
}

/// One request to the agent's socket: every line it answers until it closes.
fn ask(socket: &Path, request: &str) -> Vec<Value> {
    let mut stream = UnixStream::connect(socket).unwrap_or_else(|e| panic!("{}: {e}", socket.display()));
    stream.set_read_timeout(Some(slow(Duration::from_secs(30)))).unwrap();
    stream.write_all(format!("{request}\n").as_bytes()).unwrap();
    BufReader::new(stream)
        .lines()
        .map(|line| {
            let line = line.unwrap();
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
        })
        .collect()
}

fn seqs(lines: &[Value]) -> Vec<u64> {
    lines.iter().filter_map(|line| line["seq"].as_u64()).collect()
}

/// `credwatch alerts` or `show` as root, on the sandbox's log and socket.
fn local(sandbox: &Sandbox, args: &[&str]) -> Output {
    sandbox
        .credwatch(args[0])
        .args(&args[1..])
        .arg("--alert-log")
        .arg(sandbox.alert_log())
        .arg("--alerts-socket")
        .arg(sandbox.top().join("alerts.sock"))
        .output()
        .unwrap()
}

fn text(output: &Output) -> (String, String) {
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// `alerts --json`'s lines.
fn json_lines(output: &Output) -> Vec<Value> {
    let (stdout, stderr) = text(output);
    assert!(output.status.success(), "{}\n{stdout}\n{stderr}", output.status);
    stdout.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"))).collect()
}

/// The fake npm's postinstall, package `package`, running `script` (in the sandbox's HOME).
fn postinstall(sandbox: &Sandbox, package: &str, script: &str) {
    let manager = sandbox.fake_manager();
    sandbox.setup("the fake npm's postinstall", sandbox.command(&manager).args([package, script]));
}

#[test]
fn alerts_and_show_read_the_logged_alert_and_bad_ids_and_a_torn_line_are_told() {
    let sandbox = Sandbox::new();
    let npmrc = sandbox.credential(".npmrc");
    let watch = sandbox.watch();
    postinstall(&sandbox, "evil-pkg", r#"cat "$HOME/.npmrc" >/dev/null"#);
    let line = wait_logged(&sandbox.alert_log(), &npmrc);
    let run = watch.stop();
    let (seq, alert) = (line["seq"].as_u64().unwrap_or_else(|| panic!("no seq: {line}")), &line["alert"]);
    assert!(seq >= 1, "{line}");
    let id = alert["event"]["id"].as_str().unwrap();
    let printed = run.alerts_for(&npmrc);
    assert!(
        printed.iter().any(|a| a["event"]["id"] == id),
        "the log holds the alert the agent wrote\n{}",
        run.describe()
    );
    assert!(run.stderr.contains("alerts are logged to"), "{}", run.describe());
    let mode = fs::metadata(sandbox.alert_log()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "root reads the log; users go through the socket");

    let (stdout, stderr) = text(&local(&sandbox, &["alerts"]));
    let row = stdout.lines().find(|row| row.contains(&npmrc)).unwrap_or_else(|| panic!("{stdout}\n{stderr}"));
    assert!(row.starts_with(&format!("{seq:>6}  ")), "{row}");
    assert!(row.contains("evil-pkg@1.0.0") && row.contains(&format!("opened {npmrc}")), "{row}");
    assert!(row.contains(alert["rule"]["severity"].as_str().unwrap()), "{row}");

    let listed = json_lines(&local(&sandbox, &["alerts", "--json"]));
    assert!(listed.contains(&line), "alerts --json gives the log's line as it is: {listed:#?}");
    let severity = alert["rule"]["severity"].as_str().unwrap();
    let above = match severity {
        "low" => "medium",
        "medium" => "high",
        _ => "critical",
    };
    let future = "2999-01-01T00:00:00Z";
    for (filter, listed) in [
        (vec!["--severity", severity], true),
        (vec!["--package", "evil-pkg"], true),
        (vec!["--package", "evil-pkg@1.0.0"], true),
        (vec!["--package", "evil-pkg@2.0.0"], false),
        (vec!["--package", "other-pkg"], false),
        (vec!["--since", "10m"], true),
        (vec!["--since", "2000-01-01T00:00:00Z"], true),
        (vec!["--since", future], false),
    ] {
        let args = [&["alerts", "--json"][..], &filter].concat();
        let found = json_lines(&local(&sandbox, &args)).iter().any(|l| l["seq"] == seq);
        assert_eq!(found, listed, "{filter:?}");
    }
    if severity != "critical" {
        let found = json_lines(&local(&sandbox, &["alerts", "--json", "--severity", above]));
        assert!(!found.iter().any(|l| l["seq"] == seq), "--severity {above}");
    }
    // `credwatch alerts | head`: a reader that went away is no error.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut piped = sandbox.credwatch("alerts");
    piped.arg("--alert-log").arg(sandbox.alert_log()).stdout(writer);
    let piped = piped.output().unwrap();
    assert!(piped.status.success() && piped.stderr.is_empty(), "{}", text(&piped).1);
    let bad = local(&sandbox, &["alerts", "--since", "yesterday"]);
    assert!(!bad.status.success() && text(&bad).1.contains("neither an RFC 3339 time"), "{}", text(&bad).1);

    for by in [seq.to_string(), id[..12].to_owned(), id.to_ascii_uppercase()] {
        let shown = local(&sandbox, &["show", &by]);
        let (stdout, stderr) = text(&shown);
        assert!(shown.status.success(), "show {by}: {stderr}");
        assert!(stdout.starts_with(&format!("alert {seq} ({id})\n")), "show {by}: {stdout}");
        assert!(stdout.contains(&npmrc) && stdout.contains("evil-pkg@1.0.0"), "show {by}: {stdout}");
        assert!(stdout.contains(&format!("[{}]", severity.to_ascii_uppercase())), "show {by}: {stdout}");
    }
    for (bad, said) in [
        ("zzzz", "is no alert id"),
        ("abc", "is no alert id"),
        ("99999999", "no alert 99999999 among"),
        ("ffffffffffffffff", "no alert whose id starts with ffffffffffffffff"),
    ] {
        let shown = local(&sandbox, &["show", bad]);
        let (_, stderr) = text(&shown);
        assert_eq!(shown.status.code(), Some(1), "show {bad}: {stderr}");
        assert!(stderr.contains(said) && !stderr.contains("panicked"), "show {bad}: {stderr}");
    }

    // A kill -9 mid-write: half a line at the end.
    let whole = fs::read_to_string(sandbox.alert_log()).unwrap();
    let last = whole.lines().last().unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(sandbox.alert_log())
        .unwrap()
        .write_all(&last.as_bytes()[..last.len() / 2])
        .unwrap();
    let output = local(&sandbox, &["alerts", "--json"]);
    let (_, stderr) = text(&output);
    assert_eq!(json_lines(&output).len(), whole.lines().count(), "{stderr}");
    assert!(stderr.contains("skipped a line that is no logged alert") && !stderr.contains("panicked"), "{stderr}");
    let shown = local(&sandbox, &["show", &seq.to_string()]);
    assert!(shown.status.success(), "{}", text(&shown).1);
}

/// A directory anyone may enter, for a socket other users connect to (the sandbox's is root's).
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("credwatch-e2e-socket-").tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A user of its own with a fake npm token and the fake npm in its top directory.
fn user_with_token(uid: u32) -> (OtherUser, String) {
    let user = OtherUser::new(uid);
    fs::write(user.home.join(".npmrc"), "//registry.npmjs.org/:_authToken=npm_FAKEcredwatchE2Eother\n").unwrap();
    user.own(&user.home);
    write_executable(&user.top().join("npm"), FAKE_MANAGER);
    let npmrc = user.home.join(".npmrc").to_string_lossy().into_owned();
    (user, npmrc)
}

/// Follows the socket (a Python client run as another user) until killed; prints each line.
const FOLLOW: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b'{"alerts": {"since": 0, "follow": true}}\n')
while True:
    data = s.recv(65536)
    if not data:
        break
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
"#;

#[test]
fn a_user_sees_only_their_own_alerts_and_root_and_group_credwatch_all() {
    let sandbox = Sandbox::new();
    let dir = open_dir();
    let socket = dir.path().join("alerts.sock");
    let log = sandbox.alert_log();
    let (alice, alice_npmrc) = user_with_token(64_131);
    let (bob, bob_npmrc) = user_with_token(64_132);
    let carol = OtherUser::new(64_133);
    let _watch = sandbox.watch_with(&["--alerts-socket", socket.to_str().unwrap()]);

    let follower = dir.path().join("follow.py");
    fs::write(&follower, FOLLOW).unwrap();
    let mut bob_follows = bob
        // Debian's: the test's PATH may lead to a Python under root's home.
        .command(Path::new("/usr/bin/python3"))
        .arg(&follower)
        .arg(&socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut followed = BufReader::new(bob_follows.stdout.take().unwrap());
    let mut first = String::new();
    followed.read_line(&mut first).unwrap();
    assert!(first.starts_with("{\"caught_up\":"), "{first}");

    let read_token = r#"cat "$HOME/.npmrc" >/dev/null"#;
    for (user, package) in [(&alice, "alice-pkg"), (&bob, "bob-pkg")] {
        let status = user.command(&user.top().join("npm")).args([package, read_token]).status().unwrap();
        assert!(status.success(), "{package}'s install");
    }
    let alice_line = wait_logged(&log, &alice_npmrc);
    let bob_line = wait_logged(&log, &bob_npmrc);
    assert_eq!(
        (alice_line["alert"]["user"]["id"].as_u64(), bob_line["alert"]["user"]["id"].as_u64()),
        (Some(64_131), Some(64_132))
    );

    // Bob's follower got his alert live, and none of Alice's.
    let (lines, receive) = mpsc::channel();
    thread::spawn(move || {
        for line in followed.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut live = Vec::new();
    wait_until("bob's alert on bob's follower", Duration::from_secs(20), || {
        live.extend(receive.try_iter().map(|line| serde_json::from_str::<Value>(&line).unwrap()));
        live.iter().any(|l| l["seq"] == bob_line["seq"]).then_some(())
    });
    // Alice's alert came first (it was logged before Bob's): had it been sent, it is here.
    bob_follows.kill().unwrap();
    bob_follows.wait().unwrap();
    live.extend(receive.iter().map(|line| serde_json::from_str::<Value>(&line).unwrap()));
    assert!(live.iter().all(|l| l["alert"]["user"]["id"] == 64_132), "bob's follower: {live:#?}");

    let as_user = |user: &OtherUser, args: &[&str]| {
        user.command(&user.binary)
            .args(args)
            .arg("--alerts-socket")
            .arg(&socket)
            .arg("--alert-log")
            .arg(&log)
            .output()
            .unwrap()
    };
    let uids = |lines: Vec<Value>| {
        let mut uids: Vec<u64> = lines.iter().filter_map(|l| l["alert"]["user"]["id"].as_u64()).collect();
        uids.dedup();
        uids
    };
    // Bob cannot read the log: the socket answers him.
    assert_eq!(uids(json_lines(&as_user(&bob, &["alerts", "--json"]))), [64_132]);
    assert_eq!(uids(json_lines(&as_user(&alice, &["alerts", "--json"]))), [64_131]);
    let alice_seq = alice_line["seq"].to_string();
    let shown = as_user(&bob, &["show", &alice_seq]);
    let (stdout, stderr) = text(&shown);
    assert!(!shown.status.success() && stderr.contains(&format!("no alert {alice_seq} among")), "{stdout}\n{stderr}");
    assert!(!stdout.contains(&alice_npmrc) && !stderr.contains(&alice_npmrc), "{stdout}\n{stderr}");
    let everyone = json_lines(&local(&sandbox, &["alerts", "--json"]));
    assert!(everyone.contains(&alice_line) && everyone.contains(&bob_line), "root: {everyone:#?}");

    // Carol, of group credwatch, sees both.
    let made = Command::new("groupadd").args(["--force", "--system", "credwatch"]).status().unwrap();
    assert!(made.success(), "groupadd credwatch");
    let group = fs::read_to_string("/etc/group").unwrap();
    let gid = group
        .lines()
        .find_map(|line| line.strip_prefix("credwatch:x:"))
        .and_then(|rest| rest.split(':').next())
        .unwrap()
        .to_owned();
    let output = Command::new("setpriv")
        .args(["--reuid", "64133", "--regid", "64133", "--groups", &gid, "--"])
        .arg(&carol.binary)
        .args(["alerts", "--json", "--alerts-socket"])
        .arg(&socket)
        .arg("--alert-log")
        .arg(&log)
        .env_clear()
        .env("HOME", &carol.home)
        .current_dir(carol.top())
        .output()
        .unwrap();
    let seen = json_lines(&output);
    assert!(seen.contains(&alice_line) && seen.contains(&bob_line), "carol: {seen:#?}");
    // Without the group, Carol sees nothing.
    assert!(json_lines(&as_user(&carol, &["alerts", "--json"])).is_empty());
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn scrape(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// A follower that reads every line at once: the seqs it received so far. It returns once the
/// agent has registered it (its `caught_up` line), so that it gets every alert raised after.
fn reader(socket: &Path) -> Arc<Mutex<Vec<u64>>> {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.write_all(b"{\"alerts\": {\"since\": null, \"follow\": true}}\n").unwrap();
    let mut lines = BufReader::new(stream).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(first.starts_with("{\"caught_up\""), "the agent's first reply: {first:?}");
    let received = Arc::new(Mutex::new(Vec::new()));
    let seqs = Arc::clone(&received);
    // Ends when the agent closes the connection (it stops).
    thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            // The seq alone, `{"seq":N,...`: parsing whole alerts would make this reader slow.
            let seq: Option<u64> = line.strip_prefix("{\"seq\":").and_then(|rest| rest.split(',').next()?.parse().ok());
            seqs.lock().unwrap().extend(seq);
        }
    });
    received
}

#[test]
fn a_client_that_stops_reading_is_dropped_while_a_reading_one_gets_every_alert() {
    let sandbox = Sandbox::new();
    let socket = sandbox.top().join("alerts.sock");
    let log = sandbox.alert_log();
    // One alert each, more than the client's queue (1,024) and its socket's buffer hold.
    let secrets = sandbox.secrets(3000);
    let list = sandbox.top().join("secrets.list");
    fs::write(&list, secrets.join("\n") + "\n").unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let watch = sandbox.watch_with(&["--metrics-listen", &metrics]);

    let mut stuck = UnixStream::connect(&socket).unwrap();
    stuck.write_all(b"{\"alerts\": {\"since\": null, \"follow\": true}}\n").unwrap();
    let received = reader(&socket);
    postinstall(&sandbox, "many-secrets", &format!(r#"while read -r f; do : < "$f"; done < {}"#, list.display()));
    let said = sandbox.top().join("credwatch.stderr");
    wait_until("the warning that the client was dropped", Duration::from_secs(60), || {
        fs::read_to_string(&said).unwrap_or_default().contains("dropped an alerts client").then_some(())
    });
    // Every file's alert is logged (or the log stopped growing: the agent keeps up or says so).
    let mut last = (0, Instant::now());
    wait_until("the reads' alerts logged", Duration::from_secs(60), || {
        let count = logged(&log).len();
        if count != last.0 {
            last = (count, Instant::now());
        }
        (count >= secrets.len() || last.1.elapsed() > Duration::from_secs(3)).then_some(())
    });
    // The agent goes on alerting and serving after the drop.
    postinstall(&sandbox, "after-the-drop", r#"cat "$HOME/.npmrc" >/dev/null"#);
    let after = wait_logged(&log, &sandbox.credential(".npmrc"));
    let after = after["seq"].as_u64().unwrap();
    let start = Instant::now();
    while !received.lock().unwrap().contains(&after) && start.elapsed() < slow(Duration::from_secs(20)) {
        thread::sleep(Duration::from_millis(50));
    }
    let received = received.lock().unwrap().clone();
    // What was logged up to the last it received (a held alert may come after).
    let all: Vec<u64> =
        seqs(&logged(&log)).into_iter().filter(|seq| received.last().is_some_and(|last| seq <= last)).collect();
    if !received.contains(&after) || received != all {
        let run = watch.stop();
        let missed: Vec<&u64> = all.iter().filter(|seq| !received.contains(seq)).collect();
        let extra: Vec<&u64> = received.iter().filter(|seq| !all.contains(seq)).collect();
        panic!(
            "the reading client got {} of {} alerts (seq {after} last): missed {missed:?}, extra {extra:?}\n{}",
            received.len(),
            all.len(),
            run.stderr
        );
    }
    assert!(all.len() > 1500, "{} alerts logged", all.len());

    // The stuck client's connection was closed by the agent.
    stuck.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = Vec::new();
    let closed = stuck.read_to_end(&mut rest);
    assert!(closed.is_ok(), "the dropped client's connection ends: {closed:?}");

    let scraped = scrape(&metrics);
    assert!(scraped.contains("credwatch_alert_clients_dropped_total 1\n"), "{scraped}");
    let run = watch.stop();
    let pid = std::process::id();
    assert!(
        run.stderr.contains(&format!("dropped an alerts client (pid {pid}, uid 0)")),
        "one warning naming the test's pid\n{}",
        run.describe()
    );
    assert_eq!(run.stderr.matches("dropped an alerts client").count(), 1, "{}", run.describe());
}

#[test]
fn a_client_gets_the_alerts_after_its_last_seq_across_a_restart_and_bad_requests_are_told() {
    let sandbox = Sandbox::new();
    let socket = sandbox.top().join("alerts.sock");
    let log = sandbox.alert_log();
    let watch = sandbox.watch();
    postinstall(&sandbox, "first", r#"cat "$HOME/.npmrc" >/dev/null"#);
    wait_logged(&log, &sandbox.credential(".npmrc"));
    let answer = ask(&socket, r#"{"alerts": {"since": 0, "follow": false}}"#);
    let caught_up = answer.last().unwrap()["caught_up"]["last_seq"].as_u64().unwrap_or_else(|| panic!("{answer:#?}"));
    assert_eq!(seqs(&answer), seqs(&logged(&log)));
    assert_eq!(caught_up, *seqs(&answer).last().unwrap());

    postinstall(&sandbox, "second", r#"cat "$HOME/.aws/credentials" >/dev/null"#);
    wait_logged(&log, &sandbox.credential(".aws/credentials"));
    let since = |seq: u64| ask(&socket, &format!(r#"{{"alerts": {{"since": {seq}, "follow": false}}}}"#));
    let after: Vec<Value> = logged(&log).into_iter().filter(|l| l["seq"].as_u64() > Some(caught_up)).collect();
    let missed = since(caught_up);
    assert_eq!(missed[..missed.len() - 1], after[..], "exactly the alerts after {caught_up}");

    // Bad requests get an error line, and the connection ends.
    for (request, said) in [
        ("not json".to_owned(), "bad request"),
        (r#"{"delete": {"seq": 1}}"#.to_owned(), "unknown variant `delete`"),
        ("x".repeat(2 << 20), "longer than 1048576 bytes"),
    ] {
        let mut stream = UnixStream::connect(&socket).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = stream.write_all(format!("{request}\n").as_bytes());
        let mut answer = String::new();
        let _ = BufReader::new(stream).read_to_string(&mut answer);
        let error: Value = serde_json::from_str(answer.lines().next().unwrap_or("null")).unwrap();
        assert!(error["error"].as_str().is_some_and(|why| why.contains(said)), "{answer}");
        assert_eq!(answer.lines().count(), 1, "{answer}");
    }
    watch.stop();

    let watch = sandbox.watch();
    postinstall(&sandbox, "third", r#"cat "$HOME/.ssh/id_ed25519" >/dev/null"#);
    wait_logged(&log, &sandbox.credential(".ssh/id_ed25519"));
    let run = watch.stop();
    let all = seqs(&logged(&log));
    assert_eq!(all, (1..=all.len() as u64).collect::<Vec<_>>(), "seq goes on across the restart\n{}", run.describe());
    // The agent is stopped: the log itself is what the next one serves; start it again to ask.
    // (Starting again may add alerts of its own: the gap since the last agent, for the test's
    // own cargo tree, which lived through it.)
    let watch = sandbox.watch();
    let missed = since(caught_up);
    let served =
        missed.last().and_then(|l| l["caught_up"]["last_seq"].as_u64()).unwrap_or_else(|| panic!("{missed:#?}"));
    let none = ask(&socket, r#"{"alerts": {"since": null, "follow": false}}"#);
    watch.stop();
    let logged_now = seqs(&logged(&log));
    assert!(served >= *all.last().unwrap(), "{missed:#?}");
    let expected: Vec<u64> = logged_now.iter().copied().filter(|seq| *seq > caught_up && *seq <= served).collect();
    assert_eq!(seqs(&missed), expected, "{missed:#?}");
    assert!(missed.iter().any(|l| l["alert"]["package"]["name"] == "third"), "{missed:#?}");
    let last = none.first().and_then(|l| l["caught_up"]["last_seq"].as_u64()).unwrap_or_else(|| panic!("{none:#?}"));
    assert!(none.len() == 1 && last >= served && logged_now.contains(&last), "{none:#?}");
}

#[test]
fn a_tree_registered_as_a_self_test_has_its_alerts_marked_and_only_its_owner_or_root_may_register_it() {
    let sandbox = Sandbox::new();
    let dir = open_dir();
    let socket = dir.path().join("alerts.sock");
    let log = sandbox.alert_log();
    let manager = sandbox.fake_manager();
    let work = sandbox.work();
    // The fake npm is the tree's root (exec keeps the pid it wrote); it reads once `go-read` is there.
    let script = format!(
        r#"exec {} rehearsal 'while [ ! -e go-read ]; do sleep 0.05; done; cat "$HOME/.npmrc" >/dev/null; sleep 0.5'"#,
        manager.display()
    );
    let start = credwatch_e2e::detached(&sandbox, &work, "selftest", &[], &script);
    let watch = sandbox.watch_with(&["--alerts-socket", socket.to_str().unwrap()]);
    start();
    let root = credwatch_e2e::detached_pid(&work, "selftest");

    let stranger = OtherUser::new(64_134);
    let client = dir.path().join("register.py");
    fs::write(
        &client,
        "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.sendall(sys.argv[2].encode() + b'\\n')\nprint(s.makefile().readline(), end='')\n",
    )
    .unwrap();
    let register = |pid: u32| format!(r#"{{"selftest": {{"pid": {pid}}}}}"#);
    let refused =
        stranger.command(Path::new("/usr/bin/python3")).arg(&client).arg(&socket).arg(register(root)).output().unwrap();
    let refused = String::from_utf8_lossy(&refused.stdout).into_owned();
    assert!(refused.contains(&format!("process {root} is not yours")), "{refused}");
    assert_eq!(ask(&socket, &register(u32::MAX)), [json!({"error": format!("no process {}", u32::MAX)})]);
    assert_eq!(ask(&socket, &register(root)), [json!({"selftest": {"ok": true}})]);

    fs::write(work.join("go-read"), "").unwrap();
    let line = wait_logged(&log, &sandbox.credential(".npmrc"));
    let run = watch.stop();
    assert_eq!(line["alert"]["credwatch"]["root_pid"], root, "{line:#}\n{}", run.describe());
    assert_eq!(line["alert"]["credwatch"]["selftest"], true, "{line:#}");
    let printed = run.alerts_for(&sandbox.credential(".npmrc"));
    assert!(printed.iter().all(|a| a["credwatch"]["selftest"] == true), "every output has the mark: {printed:#?}");
    let (stdout, _) = text(&local(&sandbox, &["show", &line["seq"].to_string()]));
    assert!(stdout.contains("a self-test's alert"), "{stdout}");
}

#[test]
fn past_64_clients_a_new_one_is_told_and_a_client_that_closed_frees_its_place() {
    let sandbox = Sandbox::new();
    let socket = sandbox.top().join("alerts.sock");
    let _watch = sandbox.watch();
    let follow = || {
        let mut stream = UnixStream::connect(&socket).unwrap();
        // A refused client may find the connection closed before it sends.
        let _ = stream.write_all(b"{\"alerts\": {\"since\": null, \"follow\": true}}\n");
        let mut reader = BufReader::new(stream);
        let mut first = String::new();
        reader.read_line(&mut first).unwrap();
        (reader, first)
    };
    let mut followers: Vec<_> = (0..64)
        .map(|_| {
            let (reader, first) = follow();
            assert!(first.starts_with("{\"caught_up\":"), "{first}");
            reader
        })
        .collect();
    let (_, refused) = follow();
    assert_eq!(refused.trim_end(), r#"{"error":"too many clients"}"#);
    // One that only stops sending still follows; one that closes is let go within a few seconds.
    followers[0].get_ref().shutdown(std::net::Shutdown::Write).unwrap();
    drop(followers.pop());
    let taken = wait_until("a place freed by the closed client", Duration::from_secs(10), || {
        let (reader, first) = follow();
        first.starts_with("{\"caught_up\":").then_some(reader)
    });
    followers.push(taken);
    let (_, refused) = follow();
    assert_eq!(refused.trim_end(), r#"{"error":"too many clients"}"#, "the half-closed one kept its place");
    postinstall(&sandbox, "to-all", r#"cat "$HOME/.npmrc" >/dev/null"#);
    let line = wait_logged(&sandbox.alert_log(), &sandbox.credential(".npmrc"));
    for (index, reader) in followers.iter_mut().enumerate() {
        let mut got = String::new();
        reader.get_ref().set_read_timeout(Some(slow(Duration::from_secs(10)))).unwrap();
        reader.read_line(&mut got).unwrap();
        let got: Value = serde_json::from_str(&got).unwrap_or_else(|e| panic!("follower {index}: {got:?}: {e}"));
        assert_eq!(got["seq"], line["seq"], "follower {index}");
    }
}
