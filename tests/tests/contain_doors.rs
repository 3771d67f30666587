//! `credwatch run --contain`: the box's side doors are shut. Real agents and daemons run outside
//! the box holding fake keys, in the test's own directories (ssh-agent, gpg-agent, a session
//! bus with gnome-keyring's Secret Service, dockerd); inside the box their sockets refuse
//! connections even when the test sets the variable naming them back, and the box has a
//! session keyring of its own.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    os::unix::{fs::PermissionsExt as _, net::UnixListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{
    servers::{signal, Dockerd},
    slow, OtherUser, Run, Sandbox,
};

/// A `connect()` to each unix socket path of its arguments: `PATH: connected`, or `PATH:` and
/// the errno's name.
const CONNECT_PROBE: &str = "import errno, socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print(path + ': connected')
    except OSError as e:
        print(path + ': ' + errno.errorcode[e.errno])
";

/// A daemon the test started in the foreground; stopped (SIGTERM, then SIGKILL) when dropped.
struct Daemon(Child);

impl Daemon {
    fn start(what: &str, command: &mut Command) -> Daemon {
        Daemon(command.stdin(Stdio::null()).spawn().unwrap_or_else(|e| panic!("starting {what}: {e}")))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            signal(&self.0, "-TERM");
            let start = Instant::now();
            while self.0.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(10) {
                thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `ready` until it holds; fails after 30 s (times [`slow`]) saying `what`.
fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < slow(Duration::from_secs(30)), "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// The sandbox's stand-in for `/run/user/UID` (XDG_RUNTIME_DIR), mode 0700 as logind makes it.
fn runtime_dir(sandbox: &Sandbox) -> PathBuf {
    let dir = sandbox.top().join("run");
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// `credwatch run --contain -- sh -c SCRIPT` with `env` added; the script's output (standard
/// output and error together), which it writes to a file so that nothing of credwatch's mixes
/// in. The connect probe is `$CONNECT_PROBE`.
fn in_the_box(sandbox: &Sandbox, env: &[(&str, &str)], script: &str) -> (Run, String) {
    let out = sandbox.work().join("box.out");
    let script = format!("exec >{} 2>&1\n{script}", out.display());
    let mut env = env.to_vec();
    env.push(("CONNECT_PROBE", CONNECT_PROBE));
    let run = sandbox.run_with(&sandbox.work(), &["--contain"], &["sh", "-c", &script], &env);
    let text = fs::read_to_string(&out).unwrap_or_else(|_| panic!("the script did not run\n{}", run.describe()));
    (run, text)
}

/// The doors credwatch said it shut, from its `contained: shut N doors (...)` line.
fn said_shut(run: &Run) -> String {
    let line = run.stderr.lines().find(|line| line.contains("contained: shut"));
    line.unwrap_or_else(|| panic!("credwatch did not say which doors it shut\n{}", run.describe())).to_owned()
}

fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn ssh_agents_are_out_of_reach_even_through_their_paths() {
    let sandbox = Sandbox::new();
    let key = sandbox.work().join("fake_ed25519");
    sandbox.setup(
        "ssh-keygen",
        sandbox
            .command("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "credwatch-e2e-fake", "-f"])
            .arg(&key),
    );
    let runtime = runtime_dir(&sandbox);
    // One agent where $SSH_AUTH_SOCK says, one at ssh-agent's own default place
    // (/tmp/ssh-XXXXXXXXXX/agent.PPID), which no variable of credwatch's names.
    let named = runtime.join("ssh-agent.sock");
    let _named_agent =
        Daemon::start("ssh-agent", sandbox.command("ssh-agent").arg("-D").arg("-a").arg(&named).stdout(Stdio::null()));
    let mut default_agent =
        Daemon::start("ssh-agent", sandbox.command("ssh-agent").arg("-D").env("TMPDIR", "/tmp").stdout(Stdio::piped()));
    // `-D` prints `SSH_AUTH_SOCK=/tmp/ssh-.../agent.N; export SSH_AUTH_SOCK;` first.
    let mut first = String::new();
    BufReader::new(default_agent.0.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let default = PathBuf::from(
        first.strip_prefix("SSH_AUTH_SOCK=").and_then(|rest| rest.split(';').next()).expect("ssh-agent's first line"),
    );
    assert!(default.starts_with("/tmp") && default.to_string_lossy().contains("/ssh-"), "{first}");
    wait_until("ssh-agent's socket", || named.exists());
    for socket in [&named, &default] {
        sandbox.setup("ssh-add", sandbox.command("ssh-add").arg("-q").arg(&key).env("SSH_AUTH_SOCK", socket));
        let listed = sandbox.setup("ssh-add -L", sandbox.command("ssh-add").arg("-L").env("SSH_AUTH_SOCK", socket));
        assert!(listed.contains("credwatch-e2e-fake"), "{listed}");
    }

    let script = format!(
        "echo \"variable: ${{SSH_AUTH_SOCK-unset}}\"
         for socket in {0} {1}; do SSH_AUTH_SOCK=$socket ssh-add -L; echo \"ssh-add: $?\"; done
         python3 -c \"$CONNECT_PROBE\" {0} {1}",
        path(&named),
        path(&default)
    );
    let (run, text) =
        in_the_box(&sandbox, &[("SSH_AUTH_SOCK", path(&named)), ("XDG_RUNTIME_DIR", path(&runtime))], &script);
    assert!(!text.contains("credwatch-e2e-fake"), "a key was listed in the box:\n{text}\n{}", run.describe());
    // 2: ssh-add could not reach an agent (1 would be an agent without keys).
    assert_eq!(text.matches("ssh-add: 2").count(), 2, "{text}\n{}", run.describe());
    assert!(text.contains("variable: unset"), "{text}");
    for socket in [&named, &default] {
        assert!(text.contains(&format!("{}: ECONNREFUSED", socket.display())), "{text}\n{}", run.describe());
    }
    assert!(said_shut(&run).contains("ssh-agent"), "{}", run.describe());
    // The connects alert as outside the box, and say that the agent signed nothing.
    let agent_alerts: Vec<_> =
        run.alerts().into_iter().filter(|alert| alert["rule"]["id"] == "ssh-agent-socket").collect();
    assert!(!agent_alerts.is_empty(), "no ssh-agent-socket alert\n{}", run.describe());
    for alert in &agent_alerts {
        assert_eq!(alert["credwatch"]["contained"], true, "{alert:#}");
        assert_eq!(alert["credwatch"]["rotate"], serde_json::json!([]), "{alert:#}");
    }
    // Outside, both agents still answer.
    for socket in [&named, &default] {
        let listed = sandbox.setup("ssh-add -L", sandbox.command("ssh-add").arg("-L").env("SSH_AUTH_SOCK", socket));
        assert!(listed.contains("credwatch-e2e-fake"), "{listed}");
    }
}

/// gpgconf's agent stopped when dropped (gpg-agent daemonizes itself).
struct GpgAgent<'a>(&'a Sandbox, PathBuf);

impl Drop for GpgAgent<'_> {
    fn drop(&mut self) {
        let _ = self.0.command("gpgconf").arg("--homedir").arg(&self.1).args(["--kill", "gpg-agent"]).status();
    }
}

#[test]
fn the_gpg_agent_is_out_of_reach() {
    let sandbox = Sandbox::new();
    let gnupg = sandbox.home().join(".gnupg");
    fs::set_permissions(&gnupg, fs::Permissions::from_mode(0o700)).unwrap();
    // The sandbox's stand-in key is no S-expression the agent can list: a real one made here
    // takes its place.
    for stand_in in fs::read_dir(gnupg.join("private-keys-v1.d")).unwrap() {
        fs::remove_file(stand_in.unwrap().path()).unwrap();
    }
    let gpg = |program: &str| {
        let mut command = sandbox.command(program);
        command.env("GNUPGHOME", &gnupg);
        command
    };
    sandbox.setup("gpg-agent", gpg("gpgconf").args(["--launch", "gpg-agent"]));
    let _agent = GpgAgent(&sandbox, gnupg.clone());
    sandbox.setup(
        "gpg --quick-gen-key",
        gpg("gpg").args(["--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key"]).args([
            "credwatch e2e <fake@credwatch.invalid>",
            "ed25519",
            "sign",
            "never",
        ]),
    );
    let socket = sandbox.setup("gpgconf", gpg("gpgconf").args(["--list-dirs", "agent-socket"])).trim().to_owned();
    let keyinfo = ["--no-autostart", "KEYINFO --list", "/bye"];
    let outside = sandbox.setup("gpg-connect-agent", gpg("gpg-connect-agent").args(keyinfo));
    assert!(outside.contains("S KEYINFO"), "{outside}");

    let script = format!(
        "gpg-connect-agent --no-autostart 'KEYINFO --list' /bye; echo \"gpg-connect-agent: $?\"
         python3 -c \"$CONNECT_PROBE\" {socket}"
    );
    let (run, text) = in_the_box(&sandbox, &[("GNUPGHOME", path(&gnupg))], &script);
    assert!(!text.contains("KEYINFO"), "the agent answered in the box:\n{text}\n{}", run.describe());
    assert!(text.contains("no gpg-agent running"), "{text}\n{}", run.describe());
    assert!(text.contains(&format!("{socket}: ECONNREFUSED")), "{text}\n{}", run.describe());
    assert!(said_shut(&run).contains("gpg-agent"), "{}", run.describe());
    let again = sandbox.setup("gpg-connect-agent", gpg("gpg-connect-agent").args(keyinfo));
    assert!(again.contains("S KEYINFO"), "{again}");
}

#[test]
fn the_session_bus_its_secret_service_and_the_user_manager_are_out_of_reach() {
    let sandbox = Sandbox::new();
    let runtime = runtime_dir(&sandbox);
    let bus = runtime.join("bus");
    let address = format!("unix:path={}", bus.display());
    let session = |program: &str| {
        let mut command = sandbox.command(program);
        command.env("XDG_RUNTIME_DIR", &runtime).env("DBUS_SESSION_BUS_ADDRESS", &address);
        command
    };
    let _bus =
        Daemon::start("dbus-daemon", session("dbus-daemon").args(["--session", "--nofork", "--address", &address]));
    wait_until("the session bus", || bus.exists());
    // gnome-keyring's Secret Service, headless: its login keyring (in the sandbox's HOME) created
    // and unlocked with the password it reads on standard input.
    let mut keyring = session("gnome-keyring-daemon");
    keyring.args(["--foreground", "--unlock", "--components=secrets"]).stdin(Stdio::piped()).stdout(Stdio::null());
    let mut keyring = Daemon(keyring.spawn().expect("starting gnome-keyring-daemon"));
    {
        use std::io::Write as _;
        let mut stdin = keyring.0.stdin.take().unwrap();
        stdin.write_all(b"fake-credwatch-e2e").unwrap();
    }
    let store = || {
        let mut command = session("secret-tool");
        command
            .args(["store", "--label=credwatch e2e", "service", "credwatch-e2e", "account", "fake"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = command.spawn().expect("starting secret-tool");
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(b"FAKE-credwatch-e2e-secret").unwrap();
        child.wait().unwrap().success()
    };
    wait_until("gnome-keyring's Secret Service on the bus", store);
    let lookup = ["lookup", "service", "credwatch-e2e", "account", "fake"];
    assert_eq!(sandbox.setup("secret-tool lookup", session("secret-tool").args(lookup)), "FAKE-credwatch-e2e-secret");
    // No user manager runs here: a socket where systemd --user listens stands for it.
    fs::create_dir_all(runtime.join("systemd")).unwrap();
    let manager = runtime.join("systemd/private");
    let _manager = UnixListener::bind(&manager).unwrap();

    let script = format!(
        "echo \"variable: ${{DBUS_SESSION_BUS_ADDRESS-unset}}\"
         export DBUS_SESSION_BUS_ADDRESS={2}
         secret-tool lookup service credwatch-e2e account fake; echo \"secret-tool: $?\"
         dbus-send --session --print-reply --dest=org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus.ListNames
         echo \"dbus-send: $?\"
         systemctl --user list-units; echo \"systemctl: $?\"
         echo \"systemd: $(ls -A {1}/systemd)\"
         python3 -c \"$CONNECT_PROBE\" {0} {1}/systemd/private",
        path(&bus),
        path(&runtime),
        address,
    );
    // The script sets the address back, as package code that knows where the bus lives would.
    let env = [("XDG_RUNTIME_DIR", path(&runtime)), ("DBUS_SESSION_BUS_ADDRESS", address.as_str())];
    let (run, text) = in_the_box(&sandbox, &env, &script);
    assert!(text.contains("variable: unset"), "{text}\n{}", run.describe());
    assert!(!text.contains("FAKE"), "the secret was read in the box:\n{text}\n{}", run.describe());
    for failed in ["secret-tool: 1", "dbus-send: 1", "systemctl: 1"] {
        assert!(text.contains(failed), "{failed}\n{text}\n{}", run.describe());
    }
    assert!(text.contains(&format!("{}: ECONNREFUSED", bus.display())), "{text}\n{}", run.describe());
    // The user manager's directory is emptied: its socket is not there at all.
    assert!(text.contains("systemd: \n"), "{text}\n{}", run.describe());
    assert!(text.contains(&format!("{}: ENOENT", manager.display())), "{text}\n{}", run.describe());
    let said = said_shut(&run);
    assert!(said.contains("session bus") && said.contains("systemd"), "{said}");
    // Outside, all is as it was.
    assert!(!run.stderr.contains("FAKE"), "{}", run.describe());
    assert_eq!(sandbox.setup("secret-tool lookup", session("secret-tool").args(lookup)), "FAKE-credwatch-e2e-secret");
}

#[test]
fn a_docker_daemon_is_out_of_reach() {
    let sandbox = Sandbox::new();
    let dockerd = Dockerd::start(&sandbox.top().join("docker"));
    let host = dockerd.host();
    let docker = dockerd.docker();
    let client = docker.get_program().to_str().unwrap().to_owned();
    let config = sandbox.top().join("docker/client");
    let version = ["version", "--format", "{{.Server.Version}}"];
    assert!(!dockerd.run(&version).is_empty());

    let script = format!(
        "DOCKER_HOST={host} DOCKER_CONFIG={config} {client} version --format '{{{{.Server.Version}}}}'
         echo \"docker: $?\"
         python3 -c \"$CONNECT_PROBE\" {socket}",
        config = path(&config),
        socket = host.trim_start_matches("unix://"),
    );
    let (run, text) = in_the_box(&sandbox, &[("DOCKER_HOST", &host)], &script);
    assert!(text.contains("Cannot connect to the Docker daemon"), "{text}\n{}", run.describe());
    assert!(text.contains("docker: 1"), "{text}\n{}", run.describe());
    assert!(text.contains(&format!("{}: ECONNREFUSED", host.trim_start_matches("unix://"))), "{text}");
    assert!(said_shut(&run).contains("docker"), "{}", run.describe());
    assert!(!dockerd.run(&version).is_empty(), "dockerd stopped answering outside");
}

#[test]
fn the_box_has_a_fresh_session_keyring() {
    let sandbox = Sandbox::new();
    // The caller's own session keyring (`keyctl session -`: not the machine's root one), holding
    // a key; credwatch runs in it.
    let script = format!(
        "exec >{out} 2>&1
         keyctl session - sh -c '
           key=$(keyctl add user credwatch-e2e FAKE-credwatch-e2e-key @s)
           echo \"outside: $(keyctl show @s | sed -n 2p)\"
           echo \"key: $key\"
           \"$0\" run --json --alerts {alerts} --contain -- sh -c \"
             echo inside: \\$(keyctl show @s | sed -n 2p)
             keyctl show @s | tail -n +3
             keyctl search @s user credwatch-e2e; echo search: \\$?
             keyctl print $key; echo print: \\$?\"
         ' {credwatch}",
        out = path(&sandbox.work().join("keyring.out")),
        alerts = path(&sandbox.alerts_file()),
        credwatch = path(&credwatch_e2e::credwatch_binary()),
    );
    let output = sandbox.command("sh").args(["-c", &script]).output().unwrap();
    let text = fs::read_to_string(sandbox.work().join("keyring.out")).unwrap();
    assert!(output.status.success(), "{}\n{text}", output.status);
    let field = |name: &str| {
        let line = text.lines().find_map(|line| line.strip_prefix(name));
        line.unwrap_or_else(|| panic!("no {name} in:\n{text}")).trim().to_owned()
    };
    // `<id> --alswrv 0 0 keyring: _ses`: another keyring inside, with nothing in it.
    let (outside, inside) = (field("outside:"), field("inside:"));
    assert!(outside.ends_with("keyring: _ses") && inside.ends_with("keyring: _ses"), "{text}");
    assert_ne!(outside.split_whitespace().next(), inside.split_whitespace().next(), "{text}");
    assert!(!text.contains("\\_ user: credwatch-e2e"), "the caller's key is in the box's keyring:\n{text}");
    assert_eq!(field("search:"), "1", "{text}");
    // Known by its id, the key is still not readable: the box possesses it no more.
    assert_eq!(field("print:"), "1", "{text}");
    assert!(!text.contains("FAKE-credwatch-e2e-key"), "the key was read in the box:\n{text}");
}

/// Another user's box (a user namespace of its own ids): its doors are shut the same way.
#[test]
fn without_root_the_doors_are_shut_too() {
    let user = OtherUser::new(64_124);
    let runtime = user.top().join("run");
    fs::create_dir(&runtime).unwrap();
    user.own(&runtime);
    fs::set_permissions(&runtime, fs::Permissions::from_mode(0o700)).unwrap();
    // The user's agent and bus: sockets it may connect to.
    let (agent, bus) = (runtime.join("ssh-agent.sock"), runtime.join("bus"));
    let _listeners: Vec<UnixListener> = [&agent, &bus]
        .into_iter()
        .map(|socket| {
            let listener = UnixListener::bind(socket).unwrap();
            user.own(socket);
            listener
        })
        .collect();
    let as_user = |program: &Path| {
        let mut command = user.command(program);
        command.env("XDG_RUNTIME_DIR", &runtime).env("SSH_AUTH_SOCK", &agent).env("PATH", "/usr/bin:/bin");
        command
    };
    // The system's python3: pyenv's lives in root's home.
    let probe = |command: &mut Command| {
        let output = command.args(["/usr/bin/python3", "-c", CONNECT_PROBE]).arg(&agent).arg(&bus).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        (output, text)
    };
    let (_, outside) = probe(&mut as_user(Path::new("env")));
    assert_eq!(outside.matches(": connected").count(), 2, "{outside}");
    let (output, inside) = probe(as_user(&user.binary).args(["run", "--contain", "--"]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}\n{inside}\n{stderr}", output.status);
    for socket in [&agent, &bus] {
        assert!(inside.contains(&format!("{}: ECONNREFUSED", socket.display())), "{inside}\n{stderr}");
    }
    // The machine's own doors (an X server's socket directory, ...) may be shut too: only the
    // user's two are asserted.
    let shut = stderr.lines().find(|line| line.contains("contained: shut")).unwrap_or_default();
    assert!(shut.contains("the session bus") && shut.contains("an ssh-agent"), "{stderr}");
}
