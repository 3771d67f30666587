//! Support for the privileged end-to-end tests: a throwaway HOME full of fake credentials, an
//! environment that keeps npm, cargo and pip offline and away from the real HOME, and a runner
//! for `target/release/credwatch` that reads back the JSON alerts.
//!
//! The tests need root (they load eBPF programs) and the release binary: `cargo xtask test`.

pub mod scenarios;
pub mod servers;

use std::{
    fs,
    os::unix::{fs::PermissionsExt as _, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::OnceLock,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use tempfile::TempDir;

/// `credwatch run` exits with this when an alert fired.
pub const EXIT_ALERT: i32 = 10;
/// No fixture takes this long; a hung run is killed and reported instead of stalling CI.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// `d` times the slowdown factor `CREDWATCH_E2E_SLOW` (an integer, 1 when unset): the kernel
/// matrix runs the tests in qemu guests without KVM, 5-20 times slower, and sets it. Every
/// timeout of the tests goes through here; no assertion depends on a sleep.
pub fn slow(d: Duration) -> Duration {
    static FACTOR: OnceLock<u32> = OnceLock::new();
    let factor = *FACTOR.get_or_init(|| match std::env::var("CREDWATCH_E2E_SLOW") {
        Err(_) => 1,
        Ok(text) => text
            .trim()
            .parse()
            .ok()
            .filter(|n| *n >= 1)
            .unwrap_or_else(|| panic!("CREDWATCH_E2E_SLOW={text:?}: expected an integer factor >= 1")),
    });
    d * factor
}

/// The sensor backend every `watch`, `run` and `record` of a [`Sandbox`] uses: the value of
/// `CREDWATCH_E2E_SENSOR` (`tracepoint` or `fentry`, set by the kernel matrix in its guests),
/// else none (credwatch picks).
pub fn sensor_from_env() -> Option<String> {
    std::env::var("CREDWATCH_E2E_SENSOR").ok().filter(|s| !s.is_empty())
}

/// Fake credentials, relative to the fake HOME. None of them is real.
pub const FAKE_CREDENTIALS: &[(&str, &str)] = &[
    // `package-lock=false` has a visible effect: no package-lock.json proves npm read this file.
    (".npmrc", "//registry.npmjs.org/:_authToken=npm_FAKEcredwatchE2E0000000000000000000000\npackage-lock=false\n"),
    (
        ".ssh/id_ed25519",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKE-credwatch-e2e-not-a-key\n-----END OPENSSH PRIVATE KEY-----\n",
    ),
    (".ssh/id_rsa", "-----BEGIN RSA PRIVATE KEY-----\nFAKE-credwatch-e2e-not-a-key\n-----END RSA PRIVATE KEY-----\n"),
    (
        ".aws/credentials",
        "[default]\naws_access_key_id = AKIAFAKECREDWATCHE2E\naws_secret_access_key = fake/credwatch/e2e\n",
    ),
    (".cargo/credentials.toml", "[registry]\ntoken = \"cio_FAKEcredwatchE2E\"\n"),
    (".pypirc", "[pypi]\nusername = __token__\npassword = pypi-FAKEcredwatchE2E\n"),
    (
        ".gnupg/private-keys-v1.d/0C5A33B8A1C8D09F9B8E1E4D2E3F4A5B6C7D8E9F.key",
        "Created: 20260101T000000\nKey: (private-key (ecc (curve Ed25519)(q #FAKE#)(d #FAKE-credwatch-e2e-not-a-key#)))\n",
    ),
    (".terraform.d/credentials.tfrc.json", "{\"credentials\":{\"app.terraform.io\":{\"token\":\"FAKE.atlasv1.credwatchE2E\"}}}\n"),
    (".terraformrc", "credentials \"tfe.example.invalid\" {\n  token = \"FAKE.atlasv1.credwatchE2E\"\n}\n"),
    (".gem/credentials", "---\n:rubygems_api_key: rubygems_FAKEcredwatchE2E\n"),
    (
        ".m2/settings.xml",
        "<settings><servers><server><id>central</id><username>alice</username><password>FAKE-credwatch-e2e</password></server></servers></settings>\n",
    ),
    (".m2/settings-security.xml", "<settingsSecurity><master>{FAKEcredwatchE2E=}</master></settingsSecurity>\n"),
    (".gradle/gradle.properties", "signing.password=FAKE-credwatch-e2e\nmavenCentralPassword=FAKE-credwatch-e2e\n"),
    (".config/github-copilot/hosts.json", "{\"github.com\":{\"user\":\"alice\",\"oauth_token\":\"ghu_FAKEcredwatchE2E\"}}\n"),
    (".config/op/config", "{\"latest_signin\":\"alice\",\"accounts\":[{\"shorthand\":\"alice\",\"email\":\"alice@example.invalid\"}]}\n"),
    (".config/rclone/rclone.conf", "[s3]\ntype = s3\naccess_key_id = AKIAFAKECREDWATCHE2E\nsecret_access_key = fake/credwatch/e2e\n"),
    (".s3cfg", "[default]\naccess_key = AKIAFAKECREDWATCHE2E\nsecret_key = fake/credwatch/e2e\n"),
    (".local/share/keyrings/login.keyring", "GnomeKeyring\n FAKE-credwatch-e2e-not-a-keyring\n"),
    (".password-store/email/work.gpg", "FAKE-credwatch-e2e-not-a-gpg-message\n"),
    (".config/glab-cli/config.yml", "hosts:\n  gitlab.com:\n    token: glpat-FAKEcredwatchE2E\n"),
];

/// The string at `pointer` in `alert` is `expected`; the failure shows the alert and the run.
#[track_caller]
pub fn assert_field(alert: &Value, pointer: &str, expected: &str, run: &Run) {
    assert_eq!(
        alert.pointer(pointer).and_then(Value::as_str),
        Some(expected),
        "{pointer} in {alert:#}\n{}",
        run.describe()
    );
}

/// The checked-in fixtures.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// A real coding-agent CLI pinned in tests/agent-clis.txt, as `cargo xtask test` installs it.
pub struct AgentCli {
    /// The npm package (`@openai/codex`).
    pub package: String,
    pub version: String,
    /// Its bin as npm links it: `target/agent-clis/<name>@<version>/node_modules/.bin/<bin>`.
    pub bin: PathBuf,
}

/// The pinned CLI whose bin is named `bin` (`claude`, `codex`, `gemini`); fails the test, saying
/// how to install it, when it is not installed.
pub fn agent_cli(bin: &str) -> AgentCli {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ lives in the workspace");
    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("agent-clis.txt");
    let text = fs::read_to_string(&list).unwrap_or_else(|e| panic!("{}: {e}", list.display()));
    let (package, version) = text
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default().split_whitespace().collect::<Vec<_>>())
        .find_map(|words| match words[..] {
            [package, version, name] if name == bin => Some((package.to_owned(), version.to_owned())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{} pins no CLI whose bin is {bin}", list.display()));
    let name = package.rsplit('/').next().unwrap_or(&package);
    let path =
        workspace.join("target/agent-clis").join(format!("{name}@{version}")).join("node_modules/.bin").join(bin);
    assert!(path.exists(), "{} is missing: `cargo xtask test` installs {package}@{version}", path.display());
    AgentCli { package, version, bin: path }
}

/// The binary under test: `cargo xtask build` leaves it here.
pub fn credwatch_binary() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ lives in the workspace");
    let binary = workspace.join("target/release/credwatch");
    assert!(binary.is_file(), "{} is missing: run `cargo xtask build` (or `cargo xtask test`)", binary.display());
    binary
}

/// A user with ids of its own and no passwd entry, for `credwatch run --contain` without root:
/// a top directory anyone may enter, holding its home and a copy of credwatch it can run (the
/// checkout may be under a home of mode 0700, as /root is).
pub struct OtherUser {
    pub uid: u32,
    top: TempDir,
    pub home: PathBuf,
    pub binary: PathBuf,
}

impl OtherUser {
    /// Its home is made, empty; [`OtherUser::own`] gives it the files written there.
    pub fn new(uid: u32) -> OtherUser {
        require_root();
        let top = tempfile::Builder::new().prefix("credwatch-e2e-user-").tempdir().unwrap();
        fs::set_permissions(top.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let home = top.path().join("home");
        fs::create_dir(&home).unwrap();
        let binary = top.path().join("credwatch");
        fs::copy(credwatch_binary(), &binary).unwrap();
        let mode = fs::metadata(&binary).unwrap().permissions().mode();
        assert!(mode & 0o001 != 0, "the copy of credwatch is not executable by others");
        let user = OtherUser { uid, top, home, binary };
        user.own(&user.home);
        user
    }

    pub fn top(&self) -> &Path {
        self.top.path()
    }

    /// `path` and everything below it becomes the user's.
    pub fn own(&self, path: &Path) {
        let ids = format!("{0}:{0}", self.uid);
        let chown = Command::new("chown").args(["-R", &ids]).arg(path).status().unwrap();
        assert!(chown.success(), "chown -R {ids} {}", path.display());
    }

    /// `program` run as the user (its own group, no other), with `HOME` and the test's `PATH`
    /// alone in its environment, in the top directory.
    pub fn command(&self, program: &Path) -> Command {
        let uid = self.uid.to_string();
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid", &uid, "--regid", &uid, "--clear-groups", "--"])
            .arg(program)
            .env_clear()
            .env("HOME", &self.home)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .current_dir(self.top());
        command
    }
}

/// Fails the test at once, with the reason, when it is not root: nothing here works without it.
pub fn require_root() {
    let status = fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    let euid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .expect("Uid: line in /proc/self/status");
    assert_eq!(euid, "0", "the end-to-end tests load eBPF programs: run them as root (`cargo xtask test`)");
}

/// Directories of the real tools, put first on PATH: rustup's and pyenv's shims look in HOME,
/// which the tests replace.
fn tool_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        // cargo sets CARGO for the tests it runs: the toolchain's own cargo, next to its rustc.
        let cargo = PathBuf::from(std::env::var_os("CARGO").expect("run the tests through cargo (CARGO is unset)"));
        let python = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("running python3");
        assert!(python.status.success(), "python3 -c 'import sys' failed");
        let python = PathBuf::from(String::from_utf8_lossy(&python.stdout).trim());
        vec![
            cargo.parent().expect("cargo has a directory").to_path_buf(),
            python.parent().expect("python3 has a directory").to_path_buf(),
        ]
    })
}

/// A throwaway HOME with fake credentials, a work directory, and the alerts file.
pub struct Sandbox {
    dir: TempDir,
    /// `--sensor` of its credwatch commands (see [`sensor_from_env`]).
    sensor: Option<String>,
}

impl Sandbox {
    pub fn new() -> Sandbox {
        Sandbox::with_sensor(sensor_from_env())
    }

    /// A sandbox whose `watch`, `run` and `record` use the sensor backend `sensor` (None:
    /// credwatch picks), whatever `CREDWATCH_E2E_SENSOR` says.
    pub fn with_sensor(sensor: Option<String>) -> Sandbox {
        require_root();
        let dir = tempfile::Builder::new().prefix("credwatch-e2e-").tempdir().expect("creating a temp dir");
        let sandbox = Sandbox { dir, sensor };
        for (relative, text) in FAKE_CREDENTIALS {
            let path = sandbox.home().join(relative);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, text).unwrap();
        }
        fs::create_dir_all(sandbox.work()).unwrap();
        sandbox
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The sensor backend its credwatch commands ask for, if any.
    pub fn sensor(&self) -> Option<&str> {
        self.sensor.as_deref()
    }

    /// `credwatch SUBCOMMAND` in the sandbox's environment, with `--sensor` when the sandbox
    /// has one and the subcommand starts the sensor.
    pub fn credwatch(&self, subcommand: &str) -> Command {
        let mut command = self.command(credwatch_binary());
        command.arg(subcommand);
        if let (Some(sensor), "watch" | "run" | "record") = (&self.sensor, subcommand) {
            command.args(["--sensor", sensor]);
        }
        command
    }

    /// Scratch space for projects, tarballs, build outputs and reports.
    pub fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    pub fn alerts_file(&self) -> PathBuf {
        self.dir.path().join("alerts.jsonl")
    }

    /// The local alert log of `watch` run by this sandbox (`--alert-log`; its socket is
    /// `alerts.sock` beside), not the machine's.
    pub fn alert_log(&self) -> PathBuf {
        self.dir.path().join("local-alerts.jsonl")
    }

    /// Where `credwatch watch` run by this sandbox pins its kernel side (`--pin-dir`): its own,
    /// on bpffs, so that tests neither adopt each other's programs nor leave them attached
    /// (dropping the sandbox runs `credwatch stop` on it).
    pub fn pin_dir(&self) -> PathBuf {
        let name = self.dir.path().file_name().expect("a temp dir has a name").to_string_lossy();
        // bpffs refuses names with a dot.
        PathBuf::from("/sys/fs/bpf").join(name.replace('.', "_"))
    }

    /// `credwatch stop --pin-dir PIN_DIR`: stops a `watch` of this sandbox that is still
    /// running, detaches its programs and removes the pins.
    pub fn stop_pinned(&self) -> std::process::Output {
        Command::new(credwatch_binary())
            .arg("stop")
            .arg("--pin-dir")
            .arg(self.pin_dir())
            .output()
            .expect("running credwatch stop")
    }

    /// `home/<relative>`, absolute, as credwatch should report it.
    pub fn credential(&self, relative: &str) -> String {
        self.home().join(relative).to_string_lossy().into_owned()
    }

    /// A command with a clean environment: only PATH and what keeps the tools in the sandbox
    /// and offline. Nothing from the real environment (tokens, the real HOME) leaks in.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        let mut path: Vec<PathBuf> = tool_dirs().to_vec();
        path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
        let home = self.home();
        let scratch = self.dir.path();
        command
            .env_clear()
            .env("PATH", std::env::join_paths(path).unwrap())
            .env("HOME", &home)
            .env("LANG", "C.UTF-8")
            .env("TMPDIR", scratch)
            .env("npm_config_userconfig", home.join(".npmrc"))
            .env("npm_config_cache", scratch.join("npm-cache"))
            .env("npm_config_offline", "true")
            .env("npm_config_audit", "false")
            .env("npm_config_fund", "false")
            .env("npm_config_update_notifier", "false")
            .env("CARGO_HOME", home.join(".cargo"))
            .env("CARGO_NET_OFFLINE", "true")
            .env("PIP_CONFIG_FILE", "/dev/null")
            .env("PIP_NO_INDEX", "1")
            .env("PIP_NO_CACHE_DIR", "1")
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .env("PYTHONNOUSERSITE", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            // Every `watch` of the sandbox pins in its own directory (see `pin_dir`), and keeps
            // its local alert log and socket in the sandbox (see `alert_log`).
            .env("CREDWATCH_PIN_DIR", self.pin_dir())
            .env("CREDWATCH_ALERT_LOG", self.alert_log())
            .env("CREDWATCH_ALERTS_SOCKET", self.dir.path().join("alerts.sock"))
            .current_dir(self.work());
        command
    }

    /// Runs a set-up command (not under credwatch) and insists that it succeeds.
    pub fn setup(&self, what: &str, command: &mut Command) -> String {
        succeeding(what, command)
    }

    /// Copies a fixture directory into the work directory (builds never touch the checkout).
    pub fn copy_fixture(&self, relative: &str) -> PathBuf {
        let to = self.work().join(Path::new(relative).file_name().unwrap());
        copy_dir(&fixtures().join(relative), &to);
        to
    }

    /// `npm pack` of a fixture package; returns the tarball's path.
    pub fn npm_pack(&self, relative: &str) -> PathBuf {
        let package = self.copy_fixture(relative);
        let name = self.setup("npm pack", self.command("npm").args(["pack", "--silent"]).current_dir(&package));
        package.join(name.trim())
    }

    /// An empty npm project to install into.
    pub fn npm_project(&self) -> PathBuf {
        let project = self.work().join("app");
        fs::create_dir_all(&project).unwrap();
        fs::write(project.join("package.json"), r#"{ "name": "e2e-app", "version": "1.0.0", "private": true }"#)
            .unwrap();
        project
    }

    /// `credwatch run --json --alerts FILE -- CMD...` in `cwd`, waiting for it to finish.
    pub fn run(&self, cwd: &Path, cmd: &[&str]) -> Run {
        self.run_with_env(cwd, cmd, &[])
    }

    /// [`Sandbox::run`] with extra environment variables (for the fixtures' reports).
    pub fn run_with_env(&self, cwd: &Path, cmd: &[&str], env: &[(&str, &str)]) -> Run {
        let child = self.spawn_run_with_env(cwd, cmd, env);
        self.wait(child)
    }

    /// `credwatch run --json --alerts FILE OPTIONS... -- CMD...` in `cwd`, with extra
    /// environment variables, waiting for it to finish.
    pub fn run_with(&self, cwd: &Path, options: &[&str], cmd: &[&str], env: &[(&str, &str)]) -> Run {
        let mut command = self.credwatch("run");
        command.arg("--json").arg("--alerts").arg(self.alerts_file()).args(options).arg("--").args(cmd);
        command.current_dir(cwd).envs(env.iter().copied());
        self.wait(self.spawn(command))
    }

    /// Starts `credwatch run` without waiting (see [`Sandbox::wait`]).
    pub fn spawn_run(&self, cwd: &Path, cmd: &[&str]) -> Child {
        self.spawn_run_with_env(cwd, cmd, &[])
    }

    fn spawn_run_with_env(&self, cwd: &Path, cmd: &[&str], env: &[(&str, &str)]) -> Child {
        let mut command = self.credwatch("run");
        command.arg("--json").arg("--alerts").arg(self.alerts_file()).arg("--").args(cmd);
        command.current_dir(cwd).envs(env.iter().copied());
        self.spawn(command)
    }

    /// Starts any credwatch command with its stdout and stderr captured in the sandbox.
    pub fn spawn(&self, mut command: Command) -> Child {
        let stdout = fs::File::create(self.dir.path().join("credwatch.stdout")).unwrap();
        let stderr = fs::File::create(self.dir.path().join("credwatch.stderr")).unwrap();
        // Its own process group, so that a hung run is killed with CMD's whole tree.
        command.stdin(Stdio::null()).stdout(stdout).stderr(stderr).process_group(0);
        command.spawn().expect("starting credwatch")
    }

    /// Waits for a child started by [`Sandbox::spawn`], killing it past [`RUN_TIMEOUT`] (times
    /// [`slow`]).
    pub fn wait(&self, mut child: Child) -> Run {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if start.elapsed() > slow(RUN_TIMEOUT) {
                let group = format!("-{}", child.id());
                let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
                let _ = child.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(50));
        };
        self.collect(status, start.elapsed())
    }

    /// What credwatch printed and wrote so far.
    pub fn collect(&self, status: Option<ExitStatus>, elapsed: Duration) -> Run {
        let read = |name: &str| fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        Run {
            status,
            elapsed,
            stdout: read("credwatch.stdout"),
            stderr: read("credwatch.stderr"),
            alerts_text: fs::read_to_string(self.alerts_file()).unwrap_or_default(),
        }
    }

    /// The alerts written so far, parsed.
    pub fn alerts_now(&self) -> Vec<Value> {
        parse_alerts(&fs::read_to_string(self.alerts_file()).unwrap_or_default())
    }

    /// Polls until an alert for `path` is in the alerts file; None after `timeout` (times [`slow`]).
    pub fn wait_for_alert(&self, path: &str, timeout: Duration) -> Option<Value> {
        self.wait_for(|a| a["file"]["path"] == path, timeout)
    }

    /// Polls until an alert that `wanted` accepts is in the alerts file; None after `timeout`
    /// (times [`slow`]).
    pub fn wait_for(&self, wanted: impl Fn(&Value) -> bool, timeout: Duration) -> Option<Value> {
        let start = Instant::now();
        let timeout = slow(timeout);
        while start.elapsed() < timeout {
            if let Some(alert) = self.alerts_now().into_iter().find(|a| wanted(a)) {
                return Some(alert);
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox::new()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.pin_dir().exists() {
            let _ = self.stop_pinned();
        }
    }
}

/// One finished (or killed) credwatch command.
pub struct Run {
    /// None when it was killed for running past the timeout.
    pub status: Option<ExitStatus>,
    pub elapsed: Duration,
    pub stdout: String,
    pub stderr: String,
    pub alerts_text: String,
}

impl Run {
    pub fn alerts(&self) -> Vec<Value> {
        parse_alerts(&self.alerts_text)
    }

    /// The alerts whose `file.path` is `path`.
    pub fn alerts_for(&self, path: &str) -> Vec<Value> {
        self.alerts().into_iter().filter(|a| a["file"]["path"] == path).collect()
    }

    /// Everything needed to understand a failure.
    pub fn describe(&self) -> String {
        format!(
            "credwatch exit: {}, after {:.1}s\n--- stderr ---\n{}\n--- stdout ---\n{}\n--- alerts file ---\n{}",
            self.status.map_or("killed after the timeout".into(), |s| s.to_string()),
            self.elapsed.as_secs_f64(),
            self.stderr,
            self.stdout,
            self.alerts_text
        )
    }

    #[track_caller]
    pub fn assert_exit(&self, code: i32) {
        assert_eq!(self.status.and_then(|s| s.code()), Some(code), "expected exit status {code}\n{}", self.describe());
    }

    /// The first alert for `path`; fails with the whole run described when there is none.
    #[track_caller]
    pub fn expect_alert(&self, path: &str) -> Value {
        self.alerts_for(path).into_iter().next().unwrap_or_else(|| panic!("no alert for {path}\n{}", self.describe()))
    }
}

/// Parses JSON lines; a line that is not JSON fails the test (the format is a contract).
/// Runs `command` (`what` names it in a failure) and insists that it succeeds: its standard
/// output.
pub fn succeeding(what: &str, command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn parse_alerts(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("alert line is not JSON ({e}): {line}")))
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A copy of `/bin/true` under each name in `names`, in `dir` (created): stand-ins for tools
/// (`gh`, `sudo`, `docker`, ...) that do nothing but exist, so that their execs can be seen.
/// Real binaries, not scripts, as the real tools are: a script's exec shows `/bin/sh` as argv[0].
pub fn fake_tools(dir: &Path, names: &[&str]) {
    fs::create_dir_all(dir).unwrap();
    for name in names {
        fs::copy("/bin/true", dir.join(name)).unwrap_or_else(|e| panic!("copying /bin/true to {name}: {e}"));
    }
}

/// Writes an executable file.
pub fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Starts `sh -c SCRIPT` in `dir` detached from this test's process tree before credwatch
/// starts (its parent exits at once, so it is reparented and the /proc seed does not put it in
/// the tree of the `cargo` running the tests). SCRIPT runs once the file `go-NAME` exists in
/// `dir`, after writing its pid to `pid-NAME`; the returned closure creates `go-NAME`.
pub fn detached(sandbox: &Sandbox, dir: &Path, name: &str, env: &[(&str, String)], script: &str) -> impl Fn() {
    // Gone with its folder: a test that failed before saying go leaves no waiter behind.
    let script = format!(
        "while [ ! -e go-{name} ]; do [ -d \"$PWD\" ] || exit 0; sleep 0.05; done; echo $$ >pid-{name}; {script}"
    );
    let outer = format!("setsid sh -c '{}' >detached-{name}.log 2>&1 </dev/null &", script.replace('\'', r"'\''"));
    let mut command = sandbox.command("sh");
    command.args(["-c", &outer]).current_dir(dir).envs(env.iter().map(|(k, v)| (k, v)));
    sandbox.setup("starting a detached command", &mut command);
    let go = dir.join(format!("go-{name}"));
    move || fs::write(&go, "").unwrap()
}

/// The pid a [`detached`] command wrote.
pub fn detached_pid(dir: &Path, name: &str) -> u32 {
    let start = Instant::now();
    loop {
        let pid = fs::read_to_string(dir.join(format!("pid-{name}"))).ok().and_then(|p| p.trim().parse().ok());
        if let Some(pid) = pid {
            return pid;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the detached command {name} never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `alert` belongs to the package tree rooted at `root`.
pub fn in_tree(alert: &Value, root: u32) -> bool {
    alert["credwatch"]["root_pid"] == root
}

/// A fake package manager: a script named `npm` (the name of the exec makes it the root of a
/// tree under `credwatch run`) that runs one lifecycle script, `sh -c SCRIPT`, as npm would:
/// with `npm_package_name` and `npm_lifecycle_event` set. `npm PACKAGE SCRIPT [ARGS...]`; ARGS
/// are the script's `$1`...
pub const FAKE_MANAGER: &str = r#"#!/bin/sh
npm_package_name=$1 npm_package_version=1.0.0 npm_lifecycle_event=postinstall
export npm_package_name npm_package_version npm_lifecycle_event
script=$2
shift 2
sh -c "$script" sh "$@"
"#;

impl Sandbox {
    /// `n` distinct files of one credential rule (`~/.password-store/**`, one category: no
    /// sweep folds them), so that reading them raises `n` alerts.
    pub fn secrets(&self, n: usize) -> Vec<String> {
        let dir = self.home().join(".password-store/e2e");
        fs::create_dir_all(&dir).unwrap();
        (0..n)
            .map(|i| {
                let path = dir.join(format!("{i:04}.gpg"));
                fs::write(&path, "FAKE-credwatch-e2e-not-a-gpg-message\n").unwrap();
                path.to_string_lossy().into_owned()
            })
            .collect()
    }

    /// `credwatch run OPTIONS -- npm-copy SCRIPT` started, where the script (a child of a copy
    /// of sh named npm, package `package`) reads `files` in order and then waits for `release`
    /// to exist. One process opens them all, in order: quick, and one order to check against.
    pub fn spawn_reader(&self, package: &str, options: &[String], files: &[String], release: &Path) -> Child {
        let manager = self.top().join("bin/npm");
        if !manager.exists() {
            fs::create_dir_all(manager.parent().unwrap()).unwrap();
            fs::copy(fs::canonicalize("/bin/sh").unwrap(), &manager).unwrap();
        }
        let list = self.top().join(format!("list-{}", release.file_name().unwrap().to_string_lossy()));
        fs::write(&list, files.join("\n") + "\n").unwrap();
        // `; true`: sh would exec the last command in its own process, not in a child.
        let script = format!(
            "sh -c 'while read -r f; do : < \"$f\"; done < {}; i=0; while [ ! -e {} ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done'; true",
            list.display(),
            release.display()
        );
        let mut command = self.credwatch("run");
        command
            .args(["--json", "--alerts"])
            .arg(self.alerts_file())
            .args(options)
            .arg("--")
            .arg(&manager)
            .args(["-c", &script])
            .envs([("npm_package_name", package), ("npm_lifecycle_event", "postinstall")]);
        self.spawn(command)
    }

    /// The sandbox's top directory (HOME, work and the alerts file are in it; it is TMPDIR).
    pub fn top(&self) -> &Path {
        self.dir.path()
    }

    /// PATH for commands run in the sandbox, with `dir` first.
    pub fn path_with(&self, dir: &Path) -> String {
        let mut path = vec![dir.to_path_buf()];
        path.extend(tool_dirs().iter().cloned());
        path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
        std::env::join_paths(path).unwrap().to_string_lossy().into_owned()
    }

    /// The fake package manager (see [`FAKE_MANAGER`]), outside PATH so that a real `npm` run
    /// by package code is the real one.
    pub fn fake_manager(&self) -> PathBuf {
        let path = self.dir.path().join("fake-manager/npm");
        if !path.exists() {
            write_executable(&path, FAKE_MANAGER);
        }
        path
    }

    /// Repeats `action` (`what`, made by `command`) under the spawned `credwatch watch`
    /// `watcher` until an alert that `wanted` matches shows (attaching takes a moment) or 60 s
    /// pass, then stops watch with SIGTERM (it detaches cleanly and prints a summary); returns
    /// the alert and the run, which exited 0.
    pub fn repeat_under_watch(
        &self,
        mut watcher: Child,
        what: &str,
        command: impl Fn() -> Command,
        wanted: impl Fn(&Value) -> bool,
    ) -> (Value, Run) {
        let start = Instant::now();
        let mut alert = None;
        while alert.is_none() && start.elapsed() < Duration::from_secs(60) {
            if let Some(status) = watcher.try_wait().unwrap() {
                panic!("credwatch watch exited early\n{}", self.collect(Some(status), start.elapsed()).describe());
            }
            self.setup(what, &mut command());
            alert = self.wait_for(&wanted, Duration::from_secs(2));
        }
        let stopped = Command::new("kill").args(["-TERM", &watcher.id().to_string()]).status().unwrap();
        assert!(stopped.success());
        let run = self.wait(watcher);
        run.assert_exit(0);
        let alert = alert.unwrap_or_else(|| panic!("no alert from watch within 60 s\n{}", run.describe()));
        (alert, run)
    }

    /// Starts `credwatch watch --json --output ALERTS --pin-dir PIN_DIR` and waits until it
    /// says it is watching. Mind that whatever the test itself starts is in the tree of the
    /// `cargo` running it.
    pub fn watch(&self) -> Watch<'_> {
        self.watch_with(&[])
    }

    /// [`Sandbox::watch`] with more options (`--enforce`, ...).
    pub fn watch_with(&self, options: &[&str]) -> Watch<'_> {
        let mut command = self.credwatch("watch");
        command.args(["--json", "--output"]).arg(self.alerts_file()).arg("--pin-dir").arg(self.pin_dir()).args(options);
        let child = self.spawn(command);
        let mut watch = Watch { sandbox: self, child: Some(child), started: Instant::now() };
        while !self.collect(None, Duration::ZERO).stderr.contains("watching") {
            if let Some(status) = watch.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "credwatch watch exited early\n{}",
                    self.collect(Some(status), watch.started.elapsed()).describe()
                );
            }
            assert!(watch.started.elapsed() < slow(RUN_TIMEOUT), "credwatch watch never said it was watching");
            thread::sleep(Duration::from_millis(20));
        }
        watch
    }
}

/// A running `credwatch watch` (see [`Sandbox::watch`]); stopped with SIGTERM when dropped.
pub struct Watch<'a> {
    sandbox: &'a Sandbox,
    child: Option<Child>,
    started: Instant,
}

impl Watch<'_> {
    /// Stops credwatch with SIGTERM (it flushes and prints its summary) and collects the run.
    pub fn stop(mut self) -> Run {
        self.stop_child()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Waits for credwatch to exit by itself (or be killed) and collects the run.
    pub fn wait(mut self) -> Run {
        let child = self.child.take().expect("waited once");
        self.sandbox.wait(child)
    }

    fn stop_child(&mut self) -> Run {
        let child = self.child.take().expect("stopped once");
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        self.sandbox.wait(child)
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop_child();
        }
    }
}

/// A process outside every watched tree, for payloads to spy on; killed when dropped.
pub struct Sleeper(Child);

impl Sleeper {
    pub fn start(sandbox: &Sandbox) -> Sleeper {
        Sleeper(sandbox.command("sleep").arg("120").stdin(Stdio::null()).spawn().expect("starting sleep"))
    }

    pub fn pid(&self) -> String {
        self.0.id().to_string()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
