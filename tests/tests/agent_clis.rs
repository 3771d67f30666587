//! The real coding-agent CLIs (tests/agent-clis.txt: Claude Code, Codex and Gemini CLI from npm,
//! installed by `cargo xtask test`) under `credwatch watch`, offline, in a throwaway HOME of fake
//! credentials that holds each agent's own token too. Each is started the way a developer starts
//! it, outside every watched tree: `--version`, `--help` and a prompt, answered by a model API of
//! the test's own on loopback (every other destination is a closed port on loopback, through the
//! proxy variables). That start-up raises nothing at medium or above, and under
//! `--enforce` nothing of it is killed. Then a hook and an MCP server of the agent, each reading
//! an SSH key, alert at critical and name the agent (and under `--enforce` are killed).
//! Privileged: run as root with `cargo xtask test`.

use std::{
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{agent_cli, credwatch_binary, detached, slow, AgentCli, Run, Sandbox};
use serde_json::{json, Value};

/// The model's whole answer to every prompt.
const REPLY: &str = "hello from the loopback model";

/// A model API on loopback that answers the three CLIs' requests with [`REPLY`]: Anthropic's
/// Messages (`/v1/messages`, streamed or not), OpenAI's Responses (`/v1/responses`, streamed)
/// and Gemini's `generateContent` (`alt=sse` streamed or not); anything else gets `{}`. Nothing
/// leaves the machine, and each prompt ends after one answer.
fn start_model_api() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the model API on loopback");
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            thread::spawn(move || {
                // A client that hangs up early is its own business.
                let _ = answer(stream);
            });
        }
    });
    port
}

/// Answers one request and closes the connection.
fn answer(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut length = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let body = String::from_utf8_lossy(&body);
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let sse = |events: &[(&str, Value)]| -> String {
        events
            .iter()
            .map(|(event, data)| match event {
                &"" => format!("data: {data}\n\n"),
                event => format!("event: {event}\ndata: {data}\n\n"),
            })
            .collect()
    };
    let message = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "loopback",
        "content": [{"type": "text", "text": REPLY}], "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 1, "output_tokens": 1}});
    let candidate = json!({"candidates": [{"content": {"parts": [{"text": REPLY}], "role": "model"},
        "finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 1,
        "candidatesTokenCount": 1, "totalTokenCount": 2}});
    let (content_type, reply) = if path.starts_with("/v1/messages") && body.contains("\"stream\":true") {
        let mut start = message.clone();
        start["content"] = json!([]);
        start["stop_reason"] = Value::Null;
        let events = sse(&[
            ("message_start", json!({"type": "message_start", "message": start})),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": REPLY}}),
            ),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                    "usage": {"output_tokens": 1}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ]);
        ("text/event-stream", events)
    } else if path.starts_with("/v1/messages") {
        ("application/json", message.to_string())
    } else if path.starts_with("/v1/responses") {
        let usage = json!({"input_tokens": 1, "input_tokens_details": null, "output_tokens": 1,
            "output_tokens_details": null, "total_tokens": 2});
        let events = sse(&[
            ("response.created", json!({"type": "response.created", "response": {"id": "resp_1"}})),
            (
                "response.output_item.done",
                json!({"type": "response.output_item.done", "item": {"type": "message", "role": "assistant",
                    "id": "msg_1", "content": [{"type": "output_text", "text": REPLY}]}}),
            ),
            ("response.completed", json!({"type": "response.completed", "response": {"id": "resp_1", "usage": usage}})),
        ]);
        ("text/event-stream", events)
    } else if path.contains("enerateContent") && path.contains("alt=sse") {
        ("text/event-stream", sse(&[("", candidate)]))
    } else if path.contains("enerateContent") {
        ("application/json", candidate.to_string())
    } else {
        ("application/json", "{}".to_owned())
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        reply.len()
    );
    stream.write_all(head.as_bytes())?;
    if !request_line.starts_with("HEAD ") {
        stream.write_all(reply.as_bytes())?;
    }
    stream.flush()
}

/// One agent CLI set up in a sandbox: its bin, its environment and configuration (a fake key,
/// the loopback model API), the prompt, and its hook and MCP server that read a key.
struct Agent {
    name: &'static str,
    cli: AgentCli,
    /// How it is started: its bin (or an interpreter and its script).
    command: Vec<String>,
    env: Vec<(&'static str, String)>,
    /// `-p hi` and the like: a non-interactive prompt.
    prompt: Vec<String>,
    /// Files written into HOME (relative path, text) before the hooked prompt: the hook and the
    /// MCP server.
    hooked_files: Vec<(&'static str, String)>,
    /// Arguments the hooked prompt adds (claude's `--mcp-config FILE`).
    hooked_args: Vec<String>,
}

/// Every other destination goes to a closed port on loopback through the proxy variables that
/// the CLIs' HTTP clients and git honour: their telemetry, update checks and Codex's plugin
/// sync fail at once, without even a DNS query leaving the machine (measured with strace).
fn offline_env() -> Vec<(&'static str, String)> {
    let proxies = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"];
    let direct = ["NO_PROXY", "no_proxy"];
    let proxies = proxies.into_iter().map(|name| (name, "http://127.0.0.1:9".to_owned()));
    proxies.chain(direct.into_iter().map(|name| (name, "127.0.0.1,localhost".to_owned()))).collect()
}

/// The key the hook reads, and the one the MCP server reads.
const HOOK_KEY: &str = ".ssh/id_ed25519";
const MCP_KEY: &str = ".ssh/id_rsa";

/// `cat KEY >/dev/null; touch MARKER`: the marker shows the hook or server ran (under
/// `--enforce` the `cat` is killed, not the shell).
fn key_reader(sandbox: &Sandbox, key: &str, marker: &str) -> String {
    format!("cat {} >/dev/null; touch {}", sandbox.credential(key), sandbox.top().join(marker).display())
}

fn claude(sandbox: &Sandbox, api: u16) -> Agent {
    write(
        sandbox,
        ".claude/.credentials.json",
        r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-FAKE-credwatch-e2e"}}"#,
    );
    let hook = key_reader(sandbox, HOOK_KEY, "ran-hook");
    let server = key_reader(sandbox, MCP_KEY, "ran-mcp");
    let mcp = sandbox.top().join("mcp.json");
    fs::write(&mcp, json!({"mcpServers": {"keyreader": {"command": "sh", "args": ["-c", server]}}}).to_string())
        .unwrap();
    Agent {
        name: "claude",
        cli: agent_cli("claude"),
        command: vec![agent_cli("claude").bin.to_string_lossy().into_owned()],
        env: vec![
            ("ANTHROPIC_API_KEY", "sk-ant-api03-FAKE-credwatch-e2e".into()),
            ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{api}")),
        ],
        prompt: words(&["-p", "hi"]),
        hooked_files: vec![(
            ".claude/settings.json",
            json!({"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": hook}]}]}}).to_string(),
        )],
        hooked_args: vec!["--mcp-config".into(), mcp.to_string_lossy().into_owned()],
    }
}

fn codex(sandbox: &Sandbox, api: u16) -> Agent {
    write(sandbox, ".codex/auth.json", r#"{"OPENAI_API_KEY":"sk-proj-FAKE-credwatch-e2e"}"#);
    // A provider of its own: the built-in one ignores OPENAI_BASE_URL.
    let config = |hooks: &str| {
        format!(
            "model = \"loopback\"\nmodel_provider = \"loopback\"\n{hooks}\n[model_providers.loopback]\nname = \"loopback\"\n\
             base_url = \"http://127.0.0.1:{api}/v1\"\nenv_key = \"OPENAI_API_KEY\"\nwire_api = \"responses\"\n"
        )
    };
    write(sandbox, ".codex/config.toml", &config(""));
    // `notify` runs after each turn: the hook Codex runs for `exec` too.
    let notify = json!(["sh", "-c", key_reader(sandbox, HOOK_KEY, "ran-hook")]);
    let server = json!(["-c", key_reader(sandbox, MCP_KEY, "ran-mcp")]);
    Agent {
        name: "codex",
        cli: agent_cli("codex"),
        command: vec![agent_cli("codex").bin.to_string_lossy().into_owned()],
        env: vec![("OPENAI_API_KEY", "sk-proj-FAKE-credwatch-e2e".into())],
        prompt: words(&["exec", "--skip-git-repo-check", "hi"]),
        hooked_files: vec![(
            ".codex/config.toml",
            config(&format!("notify = {notify}\n[mcp_servers.keyreader]\ncommand = \"sh\"\nargs = {server}\n")),
        )],
        hooked_args: Vec::new(),
    }
}

fn gemini(sandbox: &Sandbox, api: u16) -> Agent {
    let auth = json!({"security": {"auth": {"selectedType": "gemini-api-key"}}});
    write(sandbox, ".gemini/settings.json", &auth.to_string());
    let mut hooked = auth;
    hooked["hooks"] = json!({"SessionStart": [{"matcher": "*", "hooks": [{"type": "command",
        "command": key_reader(sandbox, HOOK_KEY, "ran-hook")}]}]});
    hooked["mcpServers"] =
        json!({"keyreader": {"command": "sh", "args": ["-c", key_reader(sandbox, MCP_KEY, "ran-mcp")]}});
    Agent {
        name: "gemini",
        cli: agent_cli("gemini"),
        command: vec![agent_cli("gemini").bin.to_string_lossy().into_owned()],
        env: vec![
            ("GEMINI_API_KEY", "AIzaFAKE-credwatch-e2e".into()),
            ("GOOGLE_GEMINI_BASE_URL", format!("http://127.0.0.1:{api}")),
            ("GEMINI_CLI_TRUST_WORKSPACE", "true".into()),
        ],
        // A model named: without one, a router model is asked first, and wants JSON.
        prompt: words(&["-m", "gemini-2.5-flash", "-p", "hi"]),
        hooked_files: vec![(".gemini/settings.json", hooked.to_string())],
        hooked_args: Vec::new(),
    }
}

fn words(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

/// Writes `text` to `HOME/relative`.
fn write(sandbox: &Sandbox, relative: &str, text: &str) {
    let path = sandbox.home().join(relative);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// `'word'` for sh.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// What the agent's runs printed and returned, by step.
struct Steps<'a> {
    dir: &'a Path,
}

impl Steps<'_> {
    fn status(&self, step: &str) -> Option<i32> {
        fs::read_to_string(self.dir.join(format!("rc-{step}"))).ok()?.trim().parse().ok()
    }

    fn output(&self, step: &str) -> String {
        let read = |name: String| fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        format!("{}{}", read(format!("out-{step}")), read(format!("err-{step}")))
    }

    fn describe(&self) -> String {
        STEPS
            .iter()
            .map(|step| format!("--- {step}: exit {:?}\n{}", self.status(step), self.output(step)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The runs of the agent, in order: its start-up, then the prompt with its hook and MCP server.
const STEPS: &[&str] = &["version", "help", "prompt", "hooked"];

/// Sets the agent up in `sandbox`, starts `credwatch watch` with `options`, runs the agent's
/// steps from a shell started before watch (outside every watched tree, as a developer's
/// shell is), and returns once the hook's and the MCP server's key reads have alerted (or
/// after a minute), with watch stopped.
fn run_agent(sandbox: &Sandbox, agent: impl Fn(&Sandbox, u16) -> Agent, options: &[&str]) -> (Agent, Run) {
    let api = start_model_api();
    let agent = agent(sandbox, api);
    let project = sandbox.work().join("app");
    fs::create_dir_all(&project).unwrap();
    fs::write(project.join("README.md"), "# app\n").unwrap();
    for git in [
        &["init", "-q"][..],
        &["add", "README.md"],
        &["-c", "user.name=e2e", "-c", "user.email=e2e@example.invalid", "commit", "-qm", "init"],
    ] {
        sandbox.setup("git", sandbox.command("git").args(git).current_dir(&project));
    }
    let hooked = sandbox.top().join("hooked");
    for (relative, text) in &agent.hooked_files {
        let path = hooked.join(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
    let bin: Vec<String> = agent.command.iter().map(|w| quote(w)).collect();
    let bin = bin.join(" ");
    let prompt: Vec<String> = agent.prompt.iter().map(|w| quote(w)).collect();
    let hooked_args: Vec<String> = agent.hooked_args.iter().map(|w| quote(w)).collect();
    let top = sandbox.top().display();
    // Each step bounded: a CLI waiting on something that never comes fails the test, it does not
    // stall it.
    let timeout = slow(Duration::from_secs(120)).as_secs();
    let script = format!(
        "[ -e {top}/abandon ] && exit 0\n\
         step() {{ s=$1; shift; timeout {timeout} \"$@\" </dev/null >{top}/out-$s 2>{top}/err-$s; echo $? >{top}/rc-$s; }}\n\
         step version {bin} --version\n\
         step help {bin} --help\n\
         step prompt {bin} {prompt}\n\
         cp -R {hooked}/. \"$HOME\"/\n\
         step hooked {bin} {prompt} {hooked_args}\n\
         touch {top}/steps-done\n\
         i=0; while [ ! -e {top}/stop-watch ] && [ $i -lt 12000 ]; do sleep 0.05; i=$((i+1)); done\n\
         {credwatch} stop --pin-dir {pins} >{top}/out-stop 2>&1; echo $? >{top}/rc-stop",
        credwatch = quote(&credwatch_binary().to_string_lossy()),
        pins = quote(&sandbox.pin_dir().to_string_lossy()),
        prompt = prompt.join(" "),
        hooked_args = hooked_args.join(" "),
        hooked = quote(&hooked.to_string_lossy()),
    );
    let env = [agent.env.clone(), offline_env()].concat();
    let launcher = Launcher {
        go: Box::new(detached(sandbox, &project, agent.name, &env, &script)),
        abandon: Some(sandbox.top().join("abandon")),
    };
    let watch = sandbox.watch_with(options);
    launcher.start();
    let done = sandbox.top().join("steps-done");
    let start = Instant::now();
    while !done.exists() && start.elapsed() < slow(Duration::from_secs(600)) {
        thread::sleep(Duration::from_millis(100));
    }
    // The alerts of the last step's key reads may still be on their way.
    let keys = [sandbox.credential(HOOK_KEY), sandbox.credential(MCP_KEY)];
    let start = Instant::now();
    while !keys.iter().all(|key| sandbox.alerts_now().iter().any(|a| a["file"]["path"] == *key))
        && start.elapsed() < slow(Duration::from_secs(10))
    {
        thread::sleep(Duration::from_millis(100));
    }
    let run = watch.stop();
    // The kernel side is detached by the shell that ran the steps: under --enforce, a process
    // of the tree the test runs in (cargo's) is killed when it touches the pinned programs.
    fs::write(sandbox.top().join("stop-watch"), "").unwrap();
    let steps = Steps { dir: sandbox.top() };
    let start = Instant::now();
    while steps.status("stop").is_none() && start.elapsed() < slow(Duration::from_secs(60)) {
        thread::sleep(Duration::from_millis(100));
    }
    assert!(done.exists(), "the {} steps did not finish\n{}\n{}", agent.name, steps.describe(), run.describe());
    assert_eq!(steps.status("stop"), Some(0), "credwatch stop: {}\n{}", steps.output("stop"), run.describe());
    assert!(!sandbox.pin_dir().exists(), "credwatch stop left {}", sandbox.pin_dir().display());
    (agent, run)
}

/// The shell that runs the steps, waiting for its go; dropped without [`Launcher::start`] (watch
/// failed to start), it is let go to exit at once rather than wait forever.
struct Launcher {
    go: Box<dyn Fn()>,
    abandon: Option<std::path::PathBuf>,
}

impl Launcher {
    fn start(mut self) {
        self.abandon = None;
        (self.go)();
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if let Some(abandon) = &self.abandon {
            fs::write(abandon, "").unwrap();
            (self.go)();
        }
    }
}

/// The alerts about this sandbox's runs (watch sees the whole machine).
fn ours(sandbox: &Sandbox, agent: &Agent, run: &Run) -> Vec<Value> {
    let top = sandbox.top().to_string_lossy().into_owned();
    let install = agent.cli.bin.parent().unwrap().parent().unwrap().to_string_lossy().into_owned();
    run.alerts()
        .into_iter()
        .filter(|alert| {
            let text = alert.to_string();
            text.contains(&top) || text.contains(&install)
        })
        .collect()
}

fn severity(alert: &Value) -> &str {
    alert["rule"]["severity"].as_str().unwrap_or_default()
}

/// The checks of one agent's run (see the module's comment); `enforce`: watch had `--enforce`.
fn check(sandbox: &Sandbox, agent: &Agent, run: &Run, enforce: bool) {
    let steps = Steps { dir: sandbox.top() };
    let context = || format!("{}\n{}", steps.describe(), run.describe());
    for step in STEPS {
        assert_eq!(steps.status(step), Some(0), "{} {step} did not exit 0\n{}", agent.name, context());
    }
    assert!(
        steps.output("version").contains(&agent.cli.version),
        "{} --version does not say {}\n{}",
        agent.name,
        agent.cli.version,
        context()
    );
    assert!(
        steps.output("prompt").contains(REPLY),
        "{}'s prompt did not reach the model API\n{}",
        agent.name,
        context()
    );
    for marker in ["ran-hook", "ran-mcp"] {
        assert!(
            sandbox.top().join(marker).exists(),
            "{}: {marker} missing, its config was not used\n{}",
            agent.name,
            context()
        );
    }
    let keys = [sandbox.credential(HOOK_KEY), sandbox.credential(MCP_KEY)];
    let alerts = ours(sandbox, agent, run);
    // The start-up is quiet: what alerts at medium or above is the hook's and the server's read.
    let loud: Vec<&Value> = alerts
        .iter()
        .filter(|a| matches!(severity(a), "medium" | "high" | "critical"))
        .filter(|a| !keys.iter().any(|key| a["file"]["path"] == *key))
        .collect();
    assert!(loud.is_empty(), "{}'s start-up alerted at medium or above: {loud:#?}\n{}", agent.name, context());
    // Nothing but the key reads was killed or refused.
    let stopped: Vec<&Value> = alerts
        .iter()
        .filter(|a| matches!(a["event"]["outcome"].as_str(), Some("blocked" | "denied")))
        .filter(|a| !keys.iter().any(|key| a["file"]["path"] == *key))
        .collect();
    assert!(stopped.is_empty(), "{}'s own work was stopped: {stopped:#?}\n{}", agent.name, context());
    for key in &keys {
        let alert = alerts
            .iter()
            .find(|a| a["file"]["path"] == *key)
            .unwrap_or_else(|| panic!("no alert for {key} read by {}'s hook or MCP server\n{}", agent.name, context()));
        assert_eq!(alert["rule"]["id"], "ssh-private-keys", "{alert:#}\n{}", context());
        assert_eq!(severity(alert), "critical", "{alert:#}\n{}", context());
        assert_eq!(alert["coding_agent"]["name"], agent.name, "{alert:#}\n{}", context());
        let outcome = alert["event"]["outcome"].as_str().unwrap_or_default();
        if enforce {
            assert!(matches!(outcome, "blocked" | "denied"), "{alert:#}\n{}", context());
        } else {
            assert_eq!(outcome, "alerted", "{alert:#}\n{}", context());
        }
    }
    // The figures: what the agent's runs raised, one JSON alert a line.
    println!("{}: {} alerts of its own runs", agent.name, alerts.len());
    for alert in &alerts {
        println!("{alert}");
    }
}

fn test_agent(agent: impl Fn(&Sandbox, u16) -> Agent, enforce: bool) {
    let sandbox = Sandbox::new();
    let options: &[&str] = if enforce { &["--enforce"] } else { &[] };
    let (agent, run) = run_agent(&sandbox, agent, options);
    check(&sandbox, &agent, &run, enforce);
}

#[test]
fn claude_starts_quietly_and_its_hook_and_mcp_server_reading_a_key_name_it() {
    test_agent(claude, false);
}

#[test]
fn claude_under_enforce_keeps_its_start_up_and_loses_the_key_readers() {
    test_agent(claude, true);
}

#[test]
fn codex_starts_quietly_and_its_notify_hook_and_mcp_server_reading_a_key_name_it() {
    test_agent(codex, false);
}

#[test]
fn codex_under_enforce_keeps_its_start_up_and_loses_the_key_readers() {
    test_agent(codex, true);
}

#[test]
fn gemini_starts_quietly_and_its_hook_and_mcp_server_reading_a_key_name_it() {
    test_agent(gemini, false);
}

#[test]
fn gemini_under_enforce_keeps_its_start_up_and_loses_the_key_readers() {
    test_agent(gemini, true);
}

/// Started as `node .../bundle/gemini.js` (what pnpm's and bun's bin shims run), Gemini CLI
/// roots its agent tree too.
#[test]
fn gemini_run_by_node_roots_its_tree() {
    let sandbox = Sandbox::new();
    let gemini_js = fs::canonicalize(agent_cli("gemini").bin).unwrap();
    assert!(gemini_js.ends_with("bundle/gemini.js"), "{}", gemini_js.display());
    let by_node = move |sandbox: &Sandbox, api: u16| {
        let mut agent = gemini(sandbox, api);
        agent.command = vec!["node".into(), gemini_js.to_string_lossy().into_owned()];
        agent
    };
    let (agent, run) = run_agent(&sandbox, by_node, &[]);
    let key = sandbox.credential(HOOK_KEY);
    let alert = ours(&sandbox, &agent, &run)
        .into_iter()
        .find(|a| a["file"]["path"] == key)
        .unwrap_or_else(|| panic!("no alert for {key}\n{}", run.describe()));
    assert_eq!(alert["coding_agent"]["name"], "gemini", "{alert:#}\n{}", run.describe());
}
