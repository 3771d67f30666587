//! `credwatch exposure`, the real binary, on a throwaway home with fake credentials (never the
//! real HOME): the JSON's grouping, ages and rotation advice (the rules' own), the Markdown,
//! escaped odd bytes, `--user` resolved from passwd and group files with the other homes, and
//! errors.

use std::{
    ffi::OsStr,
    fs,
    os::unix::{ffi::OsStrExt as _, fs::PermissionsExt as _},
    path::Path,
    process::{Command, Output},
    time::{Duration, SystemTime},
};

use credwatch_core::rules::RuleSet;
use serde_json::Value;

const DAY: u64 = 86_400;

/// Writes `path` last modified `age_days` ago (and an hour, so that the whole days are exact).
fn put(path: &Path, text: &str, age_days: u64, mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
    let modified = SystemTime::now() - Duration::from_secs(age_days * DAY + 3_600);
    fs::File::options().write(true).open(path).unwrap().set_modified(modified).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn fake_home(home: &Path) {
    put(&home.join(".ssh/id_ed25519"), "fake key", 30, 0o600);
    put(&home.join(".ssh/id_ed25519.pub"), "ssh-ed25519 AAAA", 30, 0o644);
    put(&home.join(".aws/credentials"), "[default]\naws_access_key_id = AKIAFAKE\n", 200, 0o600);
    put(&home.join(".npmrc"), "//registry.npmjs.org/:_authToken=npm_fake\n", 3, 0o600);
    put(&home.join(".electrum/wallets/default_wallet"), "{}", 700, 0o600);
    put(&home.join("work/api/.env"), "STRIPE_KEY=sk_test_fake\n", 1, 0o644);
    put(&home.join("work/api/node_modules/dotenv/.env"), "X=1\n", 1, 0o644);
    put(&home.join("work").join(OsStr::from_bytes(b"odd\x1b[2J\xff")).join(".env"), "K=v\n", 1, 0o644);
}

fn credwatch(home: &Path, args: &[&str]) -> Output {
    // HOME is the throwaway one too: nothing here may look at the real home. No variable of
    // the session running the tests names a door (SSH_AUTH_SOCK), and the machine's own doors
    // (system paths, with --user) are listed but never asked.
    Command::new(env!("CARGO_BIN_EXE_credwatch"))
        .arg("exposure")
        .args(args)
        .arg("--no-probe")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .output()
        .unwrap()
}

fn rotate_of(id: &str) -> Vec<Value> {
    let rules = RuleSet::defaults().unwrap();
    rules.rules().iter().find(|r| r.id == id).unwrap().rotate.iter().map(|a| Value::from(a.as_str())).collect()
}

fn files(category: &Value) -> Vec<&Value> {
    category["files"].as_array().unwrap().iter().collect()
}

#[test]
fn a_throwaway_home_as_json_and_markdown() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    fake_home(&home);
    let home_text = home.to_str().unwrap();

    let out = credwatch(&home, &["--home", home_text, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((json["schema"].as_u64(), json["system_paths"].as_bool()), (Some(1), Some(false)));
    assert_eq!(json["home"], home_text);
    let categories: Vec<&str> =
        json["categories"].as_array().unwrap().iter().map(|c| c["category"].as_str().unwrap()).collect();
    let mut sorted = categories.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["cloud", "env-files", "registry", "ssh", "wallets"], "{json:#}");
    assert_eq!(json["summary"]["files"], 6, "{json:#}");
    let category = |name: &str| json["categories"].as_array().unwrap().iter().find(|c| c["category"] == name).unwrap();

    let ssh = files(category("ssh"));
    assert_eq!(ssh.len(), 1, "the public key is not a credential");
    assert_eq!(ssh[0]["path"], format!("{home_text}/.ssh/id_ed25519"));
    assert_eq!((ssh[0]["age_days"].as_u64(), ssh[0]["mode"].as_str()), (Some(30), Some("0600")));
    assert_eq!(ssh[0]["rules"], serde_json::json!(["ssh-private-keys"]));
    assert_eq!(category("ssh")["rotate"].as_array().unwrap(), &rotate_of("ssh-private-keys"));
    assert_eq!(files(category("cloud"))[0]["age_days"], 200);
    assert_eq!(category("cloud")["rotate"].as_array().unwrap(), &rotate_of("aws-credentials"));
    assert_eq!(files(category("wallets"))[0]["age_days"], 700);
    assert_eq!(files(category("registry"))[0]["rules"], serde_json::json!(["npm-registry-token"]));
    let envs: Vec<&str> = files(category("env-files")).iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(envs, [format!("{home_text}/work/api/.env"), format!("{home_text}/work/odd\\u{{1b}}[2J\\xff/.env")]);
    assert!(json["containment"].as_str().unwrap().contains("credwatch run --contain -- "));

    let out = credwatch(&home, &["--home", home_text]);
    assert!(out.status.success());
    let markdown = String::from_utf8(out.stdout).unwrap();
    assert!(markdown.starts_with("# credwatch exposure\n"), "{markdown}");
    assert!(markdown.contains("**6 credential files in 5 categories"), "{markdown}");
    assert!(markdown.contains("## `ssh` (critical): 1 file\n"), "{markdown}");
    assert!(markdown.contains(&format!("- `{home_text}/.aws/credentials`: 200 days old, ")), "{markdown}");
    assert!(markdown.contains(&format!("- [ ] {}\n", rotate_of("crypto-wallets")[0].as_str().unwrap())), "{markdown}");
    assert!(markdown.contains("odd\\u{1b}[2J\\xff/.env`: 1 day old"), "{markdown}");
    assert!(!markdown.contains('\x1b'), "a raw escape reached the terminal");
}

/// The uid and gid that own the test's files: 4242 when the tests run as root (which chowns
/// them), else the user running them, so that the user is never root.
fn owner() -> (u32, u32) {
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 {
        (4242, 4242)
    } else {
        (uid, gid)
    }
}

/// Every file and directory under `dir` to `owner()`, directories searchable by all.
fn own(dir: &Path) {
    let (uid, gid) = owner();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
        if path.is_dir() {
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
            stack.extend(fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
}

#[test]
fn a_user_from_passwd_and_group_files_with_the_other_homes() {
    // alice's and bob's homes are throwaway; their passwd and group files too.
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = (dir.path().join("alice"), dir.path().join("bob"));
    fake_home(&alice);
    put(&bob.join(".git-credentials"), "https://bob:tok@example.com\n", 9, 0o644);
    put(&bob.join(".aws/credentials"), "k", 9, 0o600);
    own(dir.path());
    let (uid, gid) = owner();
    let passwd = dir.path().join("passwd");
    let text = format!(
        "root:x:0:0:root:{root}:/bin/sh\nalice:x:{uid}:{gid}::{alice}:/bin/sh\nbob:x:{uid}9:{gid}9::{bob}:/bin/sh\n",
        root = dir.path().join("root").display(),
        alice = alice.display(),
        bob = bob.display()
    );
    fs::write(&passwd, text).unwrap();
    let group = dir.path().join("group");
    fs::write(&group, format!("alice:x:{gid}:\nstaff:x:50:bob,alice\n")).unwrap();
    let args = ["--user", "alice", "--passwd", passwd.to_str().unwrap(), "--group", group.to_str().unwrap()];
    let out = credwatch(dir.path(), &[&args[..], &["--json"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["user"], serde_json::json!({"name": "alice", "uid": uid, "gids": [gid, 50]}));
    assert_eq!((json["home"].as_str(), json["system_paths"].as_bool()), (alice.to_str(), Some(true)));
    assert_eq!(
        (json["walk"]["other_homes"].as_u64(), json["walk"]["other_homes_not_readable"].as_u64()),
        (Some(1), Some(0))
    );
    let all: Vec<&Value> = json["categories"].as_array().unwrap().iter().flat_map(files).collect();
    let path = |p: &Path| Value::from(p.to_str().unwrap());
    // alice owns bob's files here too (one owner for the test), so both are hers to read.
    for wanted in [alice.join(".ssh/id_ed25519"), bob.join(".git-credentials"), bob.join(".aws/credentials")] {
        let file = all.iter().find(|f| f["path"] == path(&wanted)).unwrap_or_else(|| panic!("{wanted:?}: {json:#}"));
        assert_eq!(file["readable"], true, "{file}");
    }
    // System paths are this machine's: every one listed as readable is, by alice's ids.
    for file in all.iter().filter(|f| !f["path"].as_str().unwrap().starts_with(dir.path().to_str().unwrap())) {
        let mode = u32::from_str_radix(file["mode"].as_str().unwrap(), 8).unwrap();
        let (owner, group) = (
            file["uid"].as_u64() == Some(uid.into()),
            [gid, 50].map(u64::from).contains(&file["gid"].as_u64().unwrap()),
        );
        let bits = if owner {
            mode >> 6
        } else if group {
            mode >> 3
        } else {
            mode
        };
        assert!(!file["readable"].as_bool().unwrap() || bits & 0o4 != 0, "{file}");
    }
    let by_uid = credwatch(
        dir.path(),
        &[
            "--user",
            &uid.to_string(),
            "--passwd",
            passwd.to_str().unwrap(),
            "--group",
            group.to_str().unwrap(),
            "--json",
        ],
    );
    let by_uid: Value = serde_json::from_slice(&by_uid.stdout).unwrap();
    assert_eq!(by_uid["user"]["name"], "alice");
    let markdown = String::from_utf8(credwatch(dir.path(), &args).stdout).unwrap();
    assert!(
        markdown.contains("system paths checked too, and 1 other users' homes (their files `alice` can read)"),
        "{markdown}"
    );
}

#[test]
fn errors_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let out = credwatch(dir.path(), &["--user", "no-such-user-here"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no user no-such-user-here in /etc/passwd"));
    let passwd = dir.path().join("passwd");
    fs::write(&passwd, "root:x:0:0:root:/root:/bin/sh\nbad:x:1\n").unwrap();
    let out = credwatch(dir.path(), &["--user", "bad", "--passwd", passwd.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{}:2: 3 fields", passwd.display())), "{stderr}");
    let missing = dir.path().join("missing");
    let out = credwatch(dir.path(), &["--home", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--home ") && stderr.contains("No such file"), "{stderr}");
    let out = credwatch(dir.path(), &["--user", "nobody", "--home", "/tmp"]);
    assert_eq!(out.status.code(), Some(2), "clap refuses both");
}

/// A process of the test's, killed and reaped when dropped (a failed assertion included).
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// gpg-agent, which gpg starts on its own, stopped through the throwaway GNUPGHOME when dropped.
struct GpgAgent<'a>(&'a Path);

impl Drop for GpgAgent<'_> {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf").args(["--kill", "gpg-agent"]).env("GNUPGHOME", self.0).status();
    }
}

/// Runs `command` to success, saying what failed.
fn run(command: &mut Command) -> Output {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(out.status.success(), "{command:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Waits, boundedly, until `ready` holds.
fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    for _ in 0..200 {
        if ready() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what}: not ready after 10 s");
}

#[test]
fn real_agents_and_a_real_session_bus_are_listed_as_doors_with_what_they_hold() {
    // Nothing of the real session: a throwaway home, runtime directory and GNUPGHOME, and each
    // program started with only these in its environment.
    let dir = tempfile::tempdir().unwrap();
    let (home, runtime, services) = (dir.path().join("home"), dir.path().join("run"), dir.path().join("services"));
    let gnupg = home.join(".gnupg");
    for (path, mode) in [(&home, 0o755), (&runtime, 0o700), (&services, 0o755), (&gnupg, 0o700)] {
        fs::create_dir_all(path).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }
    let agent_socket = dir.path().join("agent.sock");
    let bus_address = format!("unix:path={}", runtime.join("bus").display());
    let session = |program: &str| {
        let mut command = Command::new(program);
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &home)
            .env("GNUPGHOME", &gnupg)
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("SSH_AUTH_SOCK", &agent_socket)
            .env("DBUS_SESSION_BUS_ADDRESS", &bus_address);
        command
    };

    // A real ssh-agent holding one fake key.
    let key = dir.path().join("fake_key");
    run(session("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", "fake@example.invalid", "-f"]).arg(&key));
    let _ssh_agent = Running(session("ssh-agent").arg("-D").arg("-a").arg(&agent_socket).spawn().unwrap());
    wait_until("ssh-agent's socket", || agent_socket.exists());
    run(session("ssh-add").arg(&key));

    // A real gpg-agent with one fake key, its passphrase cached by a signature.
    let _gpg_agent = GpgAgent(&gnupg);
    let passphrase = ["--batch", "--pinentry-mode", "loopback", "--passphrase", "fake-passphrase"];
    run(session("gpg").args(passphrase).args([
        "--quick-gen-key",
        "Fake <fake@example.invalid>",
        "ed25519",
        "sign",
        "never",
    ]));
    let mut sign = session("gpg");
    sign.args(passphrase).args(["--clearsign", "--output", "-"]).arg(key.with_extension("pub"));
    run(&mut sign);
    let socket = run(session("gpgconf").args(["--list-dirs", "agent-socket"])).stdout;
    // gnupg puts its sockets in /run/user/UID when that exists: this test needs them in its home.
    assert_eq!(String::from_utf8_lossy(&socket).trim(), gnupg.join("S.gpg-agent").to_str().unwrap());

    // A real session bus (the policy of Debian's session.conf), its service directory the test's
    // own (empty for now).
    let config = dir.path().join("bus.conf");
    fs::write(
        &config,
        format!(
            "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"
 \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">
<busconfig><type>session</type><listen>{bus_address}</listen><auth>EXTERNAL</auth>
<servicedir>{}</servicedir>
<policy context=\"default\"><allow send_destination=\"*\" eavesdrop=\"true\"/>
<allow eavesdrop=\"true\"/><allow own=\"*\"/></policy></busconfig>\n",
            services.display()
        ),
    )
    .unwrap();
    let _bus = Running(
        session("dbus-daemon").arg(format!("--config-file={}", config.display())).arg("--nofork").spawn().unwrap(),
    );
    wait_until("the session bus", || runtime.join("bus").exists());

    let exposure = || {
        let mut command = session(env!("CARGO_BIN_EXE_credwatch"));
        let out = run(command.args(["exposure", "--json", "--home"]).arg(&home));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let door = |json: &Value, path: &Path| -> Value {
        let doors = json["doors"].as_array().unwrap();
        let found = doors.iter().find(|d| d["path"] == path.to_str().unwrap());
        found.unwrap_or_else(|| panic!("{} not among {json:#}", path.display())).clone()
    };
    let json = exposure();
    let agent = door(&json, &agent_socket);
    assert_eq!(
        (&agent["kind"], &agent["from_variable"], &agent["file_type"]),
        (&"ssh-agent".into(), &"SSH_AUTH_SOCK".into(), &"socket".into())
    );
    assert_eq!(agent["holds"], serde_json::json!({"answer": "ssh-agent", "keys": 1}));
    assert_eq!(agent["reachable"], true);
    let gpg = door(&json, &gnupg.join("S.gpg-agent"));
    assert_eq!(gpg["holds"], serde_json::json!({"answer": "gpg-agent", "keys": 1, "cached": 1}), "{gpg:#}");
    // gpg-agent's ssh socket is an ssh-agent too, holding none of gpg's keys (not enabled).
    let gpg_ssh = door(&json, &gnupg.join("S.gpg-agent.ssh"));
    assert_eq!(gpg_ssh["holds"], serde_json::json!({"answer": "ssh-agent", "keys": 0}));
    let bus = door(&json, &runtime.join("bus"));
    assert_eq!(bus["from_variable"], "DBUS_SESSION_BUS_ADDRESS");
    assert_eq!(bus["holds"], serde_json::json!({"answer": "session-bus", "secret_service": "absent"}));
    assert_eq!(json["summary"]["doors"], json["doors"].as_array().unwrap().len());

    // A Secret Service the bus would start on request (its service file), then a running one:
    // the real GNOME Keyring daemon, headless, on this bus.
    fs::write(
        services.join("org.freedesktop.secrets.service"),
        "[D-BUS Service]\nName=org.freedesktop.secrets\nExec=/bin/false\n",
    )
    .unwrap();
    run(session("dbus-send").args([
        "--session",
        "--print-reply",
        "--dest=org.freedesktop.DBus",
        "/org/freedesktop/DBus",
        "org.freedesktop.DBus.ReloadConfig",
    ]));
    assert_eq!(door(&exposure(), &runtime.join("bus"))["holds"]["secret_service"], "activatable");
    fs::remove_file(services.join("org.freedesktop.secrets.service")).unwrap();
    let _keyring = Running(
        session("gnome-keyring-daemon")
            .args(["--start", "--foreground", "--components=secrets"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("gnome-keyring-daemon on the bus", || {
        let out = session("dbus-send")
            .args(["--session", "--print-reply", "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus"])
            .args(["org.freedesktop.DBus.NameHasOwner", "string:org.freedesktop.secrets"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).contains("boolean true")
    });
    let json = exposure();
    assert_eq!(door(&json, &runtime.join("bus"))["holds"]["secret_service"], "running");
    assert_eq!(door(&json, &runtime.join("keyring/control"))["kind"], "gnome-keyring");

    let markdown =
        String::from_utf8(run(session(env!("CARGO_BIN_EXE_credwatch")).args(["exposure", "--home"]).arg(&home)).stdout)
            .unwrap();
    for line in [
        format!("- `{}` (an ssh-agent, `ssh`): socket, mode 0600", agent_socket.display()),
        "found through `SSH_AUTH_SOCK`: 1 key loaded\n".into(),
        format!("- `{}` (gpg-agent, `gpg`): socket, mode 0700", gnupg.join("S.gpg-agent").display()),
        ": 1 key known, 1 unlocked (cached)\n".into(),
        "found through `DBUS_SESSION_BUS_ADDRESS`: a Secret Service is running on it (org.freedesktop.secrets)\n"
            .into(),
    ] {
        assert!(markdown.contains(&line), "{line:?} not in {markdown}");
    }
    // Asked nothing: listed all the same.
    let mut quiet = session(env!("CARGO_BIN_EXE_credwatch"));
    let quiet: Value =
        serde_json::from_slice(&run(quiet.args(["exposure", "--json", "--no-probe", "--home"]).arg(&home)).stdout)
            .unwrap();
    assert_eq!(quiet["doors"].as_array().unwrap().len(), json["doors"].as_array().unwrap().len());
    assert!(quiet["doors"].as_array().unwrap().iter().all(|d| d.get("holds").is_none()), "{quiet:#}");
}
