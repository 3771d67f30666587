//! `cargo xtask docs [--refresh]`: the book under `docs/` (mdBook), with its rules reference
//! generated from the rule set, built into `target/book/` and every internal link checked.
//! `--refresh` (root) first runs the real commands whose outputs the book and the README show,
//! with the release binary, and writes them to `docs/src/generated/` and the README.

use std::{
    collections::{HashMap, HashSet},
    fs,
    io::{BufRead, BufReader},
    os::unix::fs::{chown, PermissionsExt},
    path::{Component, Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{bail, Context, Result};

/// The mdBook release the book is built with, installed by cargo when missing.
const MDBOOK_VERSION: &str = "0.5.4";
/// Where `cargo install` puts mdbook when the one on PATH is missing or another version.
const TOOLS_ROOT: &str = "target/tools";
const BOOK_SOURCE: &str = "docs";
/// `build-dir` of docs/book.toml.
const BOOK_OUTPUT: &str = "target/book";
/// Generated from the rule set at each build, gitignored: it cannot drift from the rules.
const RULES_REFERENCE: &str = "docs/src/reference/rules.md";
/// The real commands' outputs, committed: refreshed by `--refresh`, included by the chapters.
const GENERATED: &str = "docs/src/generated";
/// The throwaway place of `--refresh`'s runs: fake credentials only, removed before and after.
const DEMO: &str = "/tmp/credwatch-docs";
/// The pins of `--refresh`'s own `watch`, apart from a real agent's.
const DOCS_PIN_DIR: &str = "/sys/fs/bpf/credwatch-docs";

const FIRST_ALERT_BEGIN: &str = "<!-- cargo xtask docs --refresh: first-alert begin -->";
const FIRST_ALERT_END: &str = "<!-- cargo xtask docs --refresh: first-alert end -->";

pub fn docs(options: &[&str]) -> Result<()> {
    match options {
        [] => build_book(),
        ["--refresh"] => refresh().and_then(|()| build_book()),
        #[cfg(feature = "docs")]
        ["--rules-reference", path] => rules_reference::write(Path::new(path)),
        _ => bail!("usage: cargo xtask docs [--refresh]"),
    }
}

/// The rules reference, then the book, then its links: what CI runs.
pub fn build_book() -> Result<()> {
    let workspace = crate::workspace();
    let mdbook = mdbook()?;
    crate::run(
        "generate the rules reference from the rule set",
        crate::cargo()
            // The debug build of credwatch-core the tests made already; the xtask it makes
            // replaces the running one on disk only (a new file), and the next `cargo xtask` takes
            // back the one without the feature, kept beside it.
            .args(["run", "--quiet", "-p", "xtask", "--features", "docs", "--", "docs", "--rules-reference"])
            .arg(workspace.join(RULES_REFERENCE)),
    )?;
    build_with(&mdbook, &workspace.join(BOOK_SOURCE))?;
    let book = workspace.join(BOOK_OUTPUT);
    let broken = broken_links(&book)?;
    if !broken.is_empty() {
        let list: Vec<String> = broken.iter().map(ToString::to_string).collect();
        bail!("{} broken link(s) in the book ({}):\n  {}", broken.len(), book.display(), list.join("\n  "));
    }
    println!("xtask: the book is in {}; every internal link resolves", book.display());
    Ok(())
}

/// `mdbook build`, failing on its errors too: it exits 0 when an `{{#include}}` names no file,
/// leaving the directive in the page, and says so only in an `ERROR` line of its log.
fn build_with(mdbook: &Path, book: &Path) -> Result<()> {
    println!("xtask: build the book");
    // Piped, its log lines are plain (colours only on a terminal): the check reads their level.
    let output = Command::new(mdbook).arg("build").arg(book).output().context("starting mdbook")?;
    let log = String::from_utf8_lossy(&output.stderr);
    print!("{}{log}", String::from_utf8_lossy(&output.stdout));
    let errors = mdbook_errors(&log);
    if !output.status.success() || !errors.is_empty() {
        bail!("mdbook build {} failed ({}): {}", book.display(), output.status, errors.join("\n"));
    }
    Ok(())
}

fn mdbook_errors(log: &str) -> Vec<&str> {
    log.lines().filter(|line| line.trim_start().starts_with("ERROR")).collect()
}

/// mdbook of [`MDBOOK_VERSION`]: the one on PATH, else the one installed before, else installed now.
pub fn mdbook() -> Result<PathBuf> {
    let installed = crate::workspace().join(TOOLS_ROOT).join("bin/mdbook");
    for candidate in [PathBuf::from("mdbook"), installed.clone()] {
        if mdbook_version(&candidate).as_deref() == Some(MDBOOK_VERSION) {
            return Ok(candidate);
        }
    }
    crate::run(
        &format!("install mdbook {MDBOOK_VERSION}"),
        crate::cargo()
            .args(["install", "mdbook", "--version", MDBOOK_VERSION, "--locked", "--no-default-features", "--root"])
            .arg(crate::workspace().join(TOOLS_ROOT)),
    )?;
    Ok(installed)
}

fn mdbook_version(program: &Path) -> Option<String> {
    let output = Command::new(program).arg("--version").output().ok()?;
    // "mdbook v0.5.4"
    String::from_utf8(output.stdout).ok()?.trim().strip_prefix("mdbook v").map(str::to_owned)
}

/// A link of the built book that leads nowhere.
#[derive(Debug, PartialEq, Eq)]
struct BrokenLink {
    page: PathBuf,
    link: String,
    why: &'static str,
}

impl std::fmt::Display for BrokenLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {:?}: {}", self.page.display(), self.link, self.why)
    }
}

/// What the link check needs of a page: the ids it holds and the links it makes.
#[derive(Default)]
struct Page {
    ids: HashSet<String>,
    links: Vec<String>,
}

/// Every relative `href` and `src` of the HTML pages under `book` that names no file, or a
/// fragment that is no id of its page. Links with a scheme, and absolute paths, are not ours.
fn broken_links(book: &Path) -> Result<Vec<BrokenLink>> {
    let mut pages = HashMap::new();
    for path in html_files(book)? {
        let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        pages.insert(path, parse_page(&text));
    }
    let mut broken = Vec::new();
    let mut sorted: Vec<&PathBuf> = pages.keys().collect();
    sorted.sort();
    for page_path in sorted {
        for link in &pages[page_path].links {
            if let Some(why) = link_problem(page_path, link, &pages) {
                broken.push(BrokenLink {
                    page: page_path.strip_prefix(book).unwrap_or(page_path).to_owned(),
                    link: link.clone(),
                    why,
                });
            }
        }
    }
    Ok(broken)
}

fn link_problem(page: &Path, link: &str, pages: &HashMap<PathBuf, Page>) -> Option<&'static str> {
    if link.starts_with('/') || has_scheme(link) {
        return None;
    }
    let (path, fragment) = link.split_once('#').unwrap_or((link, ""));
    let path = path.split_once('?').map_or(path, |(path, _)| path);
    let mut target = if path.is_empty() {
        page.to_owned()
    } else {
        normalize(&page.parent().unwrap_or(Path::new("")).join(percent_decode(path)))
    };
    // A folder is its index page, else a folder of the repository (docs/src/x.md and
    // target/book/x.html are as deep, so `../../rules` leads to the same folder from both).
    if target.is_dir() && target.join("index.html").is_file() {
        target.push("index.html");
    }
    if !target.exists() {
        return Some("no such file");
    }
    if fragment.is_empty() {
        return None;
    }
    match pages.get(&target) {
        Some(target_page) if !target_page.ids.contains(&percent_decode(fragment)) => Some("no such id in that page"),
        Some(_) => None,
        // A fragment into a file that is not one of the book's pages (source code, an image).
        None => None,
    }
}

/// `https:`, `mailto:`, `data:`: a scheme is letters, digits, `+`, `-`, `.` before the first `:`,
/// which comes before any `/`, `?` or `#`.
fn has_scheme(link: &str) -> bool {
    link.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    })
}

/// `a/b/../c` as `a/c`, without asking the file system (a link may pass through a missing dir).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_page(text: &str) -> Page {
    let mut emitter = html5gum::DefaultEmitter::default();
    // Script and style bodies are raw text, as a browser's tree builder tells its tokenizer.
    emitter.naively_switch_states(true);
    let mut page = Page::default();
    for Ok(token) in html5gum::Tokenizer::new_with_emitter(text, emitter) {
        if let html5gum::Token::StartTag(tag) = token {
            for (name, value) in &tag.attributes {
                let value = String::from_utf8_lossy(value).into_owned();
                match &name[..] {
                    b"id" | b"name" => {
                        page.ids.insert(value);
                    }
                    b"href" | b"src" => page.links.push(value),
                    _ => {}
                }
            }
        }
    }
    page
}

fn html_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(html_files(&path)?);
        } else if path.extension().is_some_and(|ext| ext == "html") {
            files.push(path);
        }
    }
    Ok(files)
}

/// Runs the real commands whose outputs the book and the README show, and writes them.
fn refresh() -> Result<()> {
    if !crate::is_root() {
        bail!("`cargo xtask docs --refresh` runs credwatch's sensor: run it as root (`sudo -E cargo xtask docs --refresh`)");
    }
    let workspace = crate::workspace();
    let credwatch = workspace.join("target/release/credwatch");
    if !credwatch.is_file() {
        bail!("{} is missing: run `cargo xtask build` first", credwatch.display());
    }
    let demo = Path::new(DEMO);
    if demo.exists() {
        fs::remove_dir_all(demo).with_context(|| format!("removing {DEMO}"))?;
    }
    let outputs = demo_runs(&credwatch, demo, &workspace);
    fs::remove_dir_all(demo).with_context(|| format!("removing {DEMO}"))?;
    let outputs = outputs?;
    let generated = workspace.join(GENERATED);
    fs::create_dir_all(&generated).with_context(|| format!("creating {}", generated.display()))?;
    for (name, text) in &outputs {
        let path = generated.join(name);
        fs::write(&path, for_include(text)).with_context(|| format!("writing {}", path.display()))?;
        println!("xtask: wrote {}", path.display());
    }
    let first_alert = outputs.iter().find(|(name, _)| *name == "first-alert.txt").map(|(_, text)| text);
    let readme = workspace.join("README.md");
    let text = fs::read_to_string(&readme).context("reading README.md")?;
    let text =
        replace_between(&text, FIRST_ALERT_BEGIN, FIRST_ALERT_END, &fenced(first_alert.map_or("", String::as_str)))
            .context("README.md")?;
    fs::write(&readme, text).context("writing README.md")?;
    println!("xtask: wrote the first alert into README.md");
    Ok(())
}

/// The runs, in `demo`: (file name under docs/src/generated, transcript).
fn demo_runs(credwatch: &Path, demo: &Path, workspace: &Path) -> Result<Vec<(&'static str, String)>> {
    let home = demo.join("home");
    fake_home(&home)?;
    let mut outputs = vec![("help.txt", help(credwatch)?)];

    pack_telemetry_helper(demo, &home)?;
    let install = ["npm", "install", "--offline", "--no-audit", "--no-fund", "../telemetry-helper-4.1.2.tgz"];
    let project = new_project(demo, "proj")?;
    let first_alert = transcript(
        &format!("credwatch run -- {}", install.join(" ")),
        sandboxed(Command::new(credwatch), &home, demo).args(["run", "--"]).args(install).current_dir(&project),
        &[10],
    )?;
    outputs.push(("first-alert.txt", first_alert));
    let project = new_project(demo, "proj-json")?;
    let json_run = sandboxed(Command::new(credwatch), &home, demo)
        .args(["run", "--json", "--"])
        .args(install)
        .current_dir(&project)
        .output()
        .context("starting credwatch run --json")?;
    let first = String::from_utf8_lossy(&json_run.stdout)
        .lines()
        .find_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .context("credwatch run --json printed no alert")?;
    outputs.push(("first-alert.json", serde_json::to_string_pretty(&first)? + "\n"));

    let selftest = transcript(
        "credwatch selftest --attack nx",
        Command::new(credwatch)
            .args(["selftest", "--attack", "nx", "--alerts-socket"])
            // No agent answers there: the self-test runs under credwatch's own sensor.
            .arg(demo.join("no-agent.sock")),
        &[0],
    )?;
    outputs.push(("selftest.txt", selftest));

    let exposure_home = demo.join("exposure/home");
    exposure_home_of_nobody(&exposure_home)?;
    let exposure = transcript(
        &format!("runuser -u nobody -- credwatch exposure --home {}", exposure_home.display()),
        Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .arg(credwatch)
            .arg("exposure")
            .arg("--home")
            .arg(&exposure_home),
        &[0],
    )?;
    outputs.push(("exposure.txt", exposure));

    let trace = "tests/fixtures/traces/schema-2-npm-postinstall.jsonl";
    let replay = transcript(
        &format!("credwatch replay --report {trace}"),
        Command::new(credwatch).args(["replay", "--report", trace]).current_dir(workspace),
        &[10],
    )?;
    outputs.push(("replay.txt", replay));

    let doctor = transcript("credwatch doctor", Command::new(credwatch).arg("doctor"), &[0])?;
    outputs.push(("doctor.txt", doctor));

    outputs.extend(past_alerts(credwatch, demo, &home, &install)?);
    Ok(outputs)
}

/// `credwatch alerts` and `credwatch show` of what a `watch` of its own (pins, alert log and
/// socket in `demo`) kept of the first alert's install, run again beside it.
fn past_alerts(credwatch: &Path, demo: &Path, home: &Path, install: &[&str]) -> Result<Vec<(&'static str, String)>> {
    let log = demo.join("alerts.jsonl");
    // bpffs holds pins, and refuses dots in their path.
    let pins = Path::new(DOCS_PIN_DIR);
    println!("xtask: running credwatch watch (its own pins, alert log and socket in {})", demo.display());
    let mut watch = Command::new(credwatch)
        .arg("watch")
        .arg("--pin-dir")
        .arg(pins)
        .arg("--alert-log")
        .arg(&log)
        .arg("--alerts-socket")
        .arg(demo.join("alerts.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting credwatch watch")?;
    let log_lines = lines_of(watch.stderr.take().context("watch's standard error")?);
    let runs = (|| {
        wait_until_watching(&log_lines)?;
        let project = new_project(demo, "proj-watch")?;
        let status = sandboxed(Command::new(install[0]), home, demo)
            .args(&install[1..])
            .current_dir(&project)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("starting npm install")?;
        if !status.success() {
            bail!("npm install under credwatch watch failed ({status})");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let seqs = loop {
            let seqs = logged_seqs(&log, "telemetry-helper");
            if seqs.len() >= 2 {
                break seqs;
            }
            if Instant::now() > deadline {
                bail!("the agent's log {} holds {} alert(s) of telemetry-helper, not 2", log.display(), seqs.len());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let alerts = transcript(
            &format!("credwatch alerts --package telemetry-helper --alert-log {}", log.display()),
            Command::new(credwatch).args(["alerts", "--package", "telemetry-helper", "--alert-log"]).arg(&log),
            &[0],
        )?;
        let show = transcript(
            &format!("credwatch show {} --alert-log {}", seqs[0], log.display()),
            Command::new(credwatch).arg("show").arg(seqs[0].to_string()).arg("--alert-log").arg(&log),
            &[0],
        )?;
        Ok(vec![("alerts.txt", alerts), ("show.txt", show)])
    })();
    // `stop` ends the agent and detaches its programs; should it not end, it is killed.
    let stopped = Command::new(credwatch).arg("stop").arg("--pin-dir").arg(pins).output();
    let deadline = Instant::now() + Duration::from_secs(30);
    while watch.try_wait()?.is_none() {
        if Instant::now() > deadline {
            watch.kill()?;
            watch.wait()?;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let stopped = stopped.context("starting credwatch stop")?;
    if !stopped.status.success() {
        bail!("credwatch stop --pin-dir {} failed: {}", pins.display(), String::from_utf8_lossy(&stopped.stderr));
    }
    runs
}

/// The lines of the agent's log as it writes them, read to its end by a thread of their own.
fn lines_of(stderr: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (send, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = send.send(line);
        }
    });
    lines
}

/// Until the agent says it is watching; else an error with what it said.
fn wait_until_watching(log_lines: &mpsc::Receiver<String>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut said = Vec::new();
    loop {
        match log_lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("watching") => return Ok(()),
            Ok(line) => said.push(line),
            Err(_) => bail!("credwatch watch never said it was watching; it said:\n{}", said.join("\n")),
        }
    }
}

/// The seqs of the local alert log's alerts about `package`, in order.
fn logged_seqs(log: &Path, package: &str) -> Vec<u64> {
    let text = fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry.pointer("/alert/package/name").and_then(serde_json::Value::as_str) == Some(package))
        .filter_map(|entry| entry.get("seq").and_then(serde_json::Value::as_u64))
        .collect()
}

/// `credwatch --help`, then each command's.
fn help(credwatch: &Path) -> Result<String> {
    let mut text = transcript("credwatch --help", Command::new(credwatch).arg("--help"), &[0])?;
    let top = Command::new(credwatch).arg("--help").output().context("starting credwatch --help")?;
    let top = String::from_utf8_lossy(&top.stdout).into_owned();
    // The lines under "Commands:", up to the blank line: "  watch     Watch the whole machine..."
    let commands = top
        .lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|command| *command != "help");
    for command in commands {
        text.push('\n');
        text += &transcript(
            &format!("credwatch {command} --help"),
            Command::new(credwatch).args([command, "--help"]),
            &[0],
        )?;
    }
    Ok(text)
}

/// One real run as a reader sees it: `$ COMMAND`, its standard output, then its standard error.
fn transcript(shown: &str, command: &mut Command, expected_status: &[i32]) -> Result<String> {
    println!("xtask: running {shown}");
    let output = command.output().with_context(|| format!("starting {shown}"))?;
    let mut text = format!("$ {shown}\n");
    for stream in [&output.stdout, &output.stderr] {
        text += &String::from_utf8_lossy(stream);
        if !text.ends_with('\n') {
            text.push('\n');
        }
    }
    match output.status.code() {
        Some(code) if expected_status.contains(&code) => Ok(text),
        _ => bail!("{shown} ended with {} (expected {expected_status:?}):\n{text}", output.status),
    }
}

/// A command that sees only the fake home and keeps npm offline, as the e2e tests' sandbox does.
fn sandboxed(mut command: Command, home: &Path, demo: &Path) -> Command {
    command
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", home)
        .env("LANG", "C.UTF-8")
        .env("TMPDIR", demo)
        .env("npm_config_userconfig", home.join(".npmrc"))
        .env("npm_config_cache", demo.join("npm-cache"))
        .env("npm_config_offline", "true")
        .env("npm_config_audit", "false")
        .env("npm_config_fund", "false")
        .env("npm_config_update_notifier", "false");
    command
}

/// Fake credentials, as the e2e tests' sandbox writes them. None is real.
fn fake_home(home: &Path) -> Result<()> {
    write_file(
        &home.join(".npmrc"),
        "//registry.npmjs.org/:_authToken=npm_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000\n",
        0o600,
    )?;
    write_file(
        &home.join(".ssh/id_ed25519"),
        "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKE-KEY-FOR-CREDWATCH-DOCS\n-----END OPENSSH PRIVATE KEY-----\n",
        0o600,
    )
}

/// The package of the first alert: a postinstall that reads `~/.npmrc` and the SSH key, packed
/// with the real npm as `DEMO/telemetry-helper-4.1.2.tgz`.
fn pack_telemetry_helper(demo: &Path, home: &Path) -> Result<()> {
    let package = demo.join("telemetry-helper");
    write_file(
        &package.join("package.json"),
        r#"{ "name": "telemetry-helper", "version": "4.1.2", "license": "MIT", "scripts": { "postinstall": "node telemetry.js" } }
"#,
        0o644,
    )?;
    write_file(
        &package.join("telemetry.js"),
        "const fs = require('fs'), os = require('os'), path = require('path');\n\
         for (const file of ['.npmrc', '.ssh/id_ed25519']) fs.readFileSync(path.join(os.homedir(), file));\n",
        0o644,
    )?;
    let packed = sandboxed(Command::new("npm"), home, demo)
        .args(["pack", "--quiet", "--pack-destination"])
        .arg(demo)
        .current_dir(&package)
        .output()
        .context("starting npm pack")?;
    if !packed.status.success() {
        bail!("npm pack failed ({}): {}", packed.status, String::from_utf8_lossy(&packed.stderr));
    }
    Ok(())
}

fn new_project(demo: &Path, name: &str) -> Result<PathBuf> {
    let project = demo.join(name);
    write_file(&project.join("package.json"), r#"{ "name": "app", "version": "1.0.0", "private": true }"#, 0o644)?;
    Ok(project)
}

/// A home of `nobody` with credentials of several kinds and ages, one that only root can read
/// and files that look like credentials but are not, for `credwatch exposure`.
fn exposure_home_of_nobody(home: &Path) -> Result<()> {
    const DAY: u64 = 24 * 60 * 60;
    // (path under the home, days old, mode, only root's)
    let files: &[(&str, u64, u32, bool)] = &[
        (".aws/credentials", 442, 0o600, false),
        (".config/gcloud/application_default_credentials.json", 59, 0o644, false),
        (".ssh/id_ed25519", 913, 0o600, false),
        (".ssh/id_ed25519.pub", 913, 0o644, false),
        (".ssh/known_hosts", 913, 0o644, false),
        (".ethereum/keystore/UTC--2025-03-01T10-00-00.0Z--3f1c", 640, 0o600, false),
        ("src/shop/.env", 2, 0o644, false),
        ("src/shop/.env.example", 2, 0o644, false),
        ("src/shop/node_modules/dotenv/.env", 30, 0o644, false),
        (".npmrc", 11, 0o600, false),
        (".pypirc", 1422, 0o600, true),
    ];
    let nobody = 65534;
    for (relative, days, mode, root_only) in files {
        let path = home.join(relative);
        write_file(&path, "fake, for credwatch's documentation\n", *mode)?;
        fs::File::options()
            .write(true)
            .open(&path)?
            .set_modified(SystemTime::now() - Duration::from_secs(days * DAY))
            .with_context(|| format!("dating {}", path.display()))?;
        let owner = if *root_only { 0 } else { nobody };
        chown(&path, Some(owner), Some(owner))?;
    }
    // Every directory from the home down is nobody's, the way up to it searchable by all.
    let mut directories: Vec<PathBuf> = files
        .iter()
        .flat_map(|(relative, ..)| home.join(relative).ancestors().skip(1).map(Path::to_path_buf).collect::<Vec<_>>())
        .collect();
    directories.sort();
    directories.dedup();
    for directory in directories.iter().filter(|d| d.starts_with(home)) {
        chown(directory, Some(nobody), Some(nobody))?;
    }
    for directory in home.ancestors().skip(1).filter(|d| d.starts_with(DEMO)) {
        fs::set_permissions(directory, fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

fn write_file(path: &Path, text: &str, mode: u32) -> Result<()> {
    let parent = path.parent().context("a file has a parent")?;
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).with_context(|| format!("chmod {}", path.display()))
}

/// Text that mdBook's `{{#include}}` puts inside a chapter's code block: its own `{{#` escaped
/// (mdBook would expand it), no fence of three backticks (it would close the block).
fn for_include(text: &str) -> String {
    text.replace("{{#", "\\{{#").replace("```", "`\u{200b}``")
}

/// A fenced block of `text`, its fence longer than any run of backticks in it.
fn fenced(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}text\n{}{}{fence}", text, if text.ends_with('\n') { "" } else { "\n" })
}

/// `text` with what lies between the lines `begin` and `end` replaced by `content`.
fn replace_between(text: &str, begin: &str, end: &str, content: &str) -> Result<String> {
    let start = text.find(begin).with_context(|| format!("no {begin:?} marker"))? + begin.len();
    let stop = start + text[start..].find(end).with_context(|| format!("no {end:?} marker after {begin:?}"))?;
    Ok(format!("{}\n{content}\n{}", &text[..start], &text[stop..]))
}

#[cfg(feature = "docs")]
mod rules_reference {
    //! docs/src/reference/rules.md from the rule set credwatch embeds, through credwatch-core.

    use std::{fmt::Write as _, fs, path::Path};

    use anyhow::{Context, Result};
    use credwatch_core::rules::{RuleKind, RuleSet, DEFAULT_RULES};
    use serde_json::Value;

    pub fn write(path: &Path) -> Result<()> {
        let rules = RuleSet::defaults().context("loading the embedded rules")?;
        // The samples as written: the rule set keeps them parsed into steps for the engine.
        let mut samples = std::collections::HashMap::new();
        for (file, text) in DEFAULT_RULES {
            let document: Value = serde_saphyr::from_str(text).with_context(|| format!("parsing {file}"))?;
            for rule in document.get("rules").and_then(Value::as_array).into_iter().flatten() {
                if let (Some(id), Some(rule_samples)) = (rule.get("id").and_then(Value::as_str), rule.get("samples")) {
                    samples.insert(id.to_owned(), rule_samples.clone());
                }
            }
        }
        let mut out = String::new();
        writeln!(out, "# Rules reference\n")?;
        writeln!(
            out,
            "Every rule credwatch has built in, {} of them, generated by `cargo xtask docs` from the rule files \
             (`rules/*.yaml`) through credwatch-core: this page cannot drift from them. Each rule's positive \
             samples must fire it, its negative ones must not (`cargo test -p credwatch-core samples`). How to \
             write rules: [Writing rules](../rules-format.md).\n",
            rules.rules().len()
        )?;
        writeln!(out, "| id | severity | action | kind | category |\n|---|---|---|---|---|")?;
        for rule in rules.rules() {
            writeln!(
                out,
                "| [`{}`](#{}) | {} | {} | {} | {} |",
                rule.id,
                rule.id,
                rule.severity.as_str(),
                rule.action.as_str(),
                kind(rule.kind),
                escape(&rule.category)
            )?;
        }
        for rule in rules.rules() {
            writeln!(out, "\n## `{}`\n", rule.id)?;
            writeln!(out, "**{}**. {}\n", escape(&rule.name), escape(&rule.description))?;
            writeln!(
                out,
                "- severity `{}`, action `{}`, kind `{}`, category `{}`; defined in `{}`",
                rule.severity.as_str(),
                rule.action.as_str(),
                kind(rule.kind),
                rule.category,
                rule.origin
            )?;
            list(&mut out, "targets", &rule.targets)?;
            list(&mut out, "excluded", &rule.exclude)?;
            if !rule.rotate.is_empty() {
                writeln!(out, "- rotate:")?;
                for advice in &rule.rotate {
                    writeln!(out, "  - {}", escape(advice))?;
                }
            }
            if let Some(rule_samples) = samples.get(&rule.id) {
                for (key, what) in [
                    ("positive", "fires the rule"),
                    ("negative", "does not fire it"),
                    ("lowered", "fires it below its severity, saying why"),
                ] {
                    let Some(steps) = rule_samples.get(key).and_then(Value::as_array) else { continue };
                    writeln!(out, "\n{key} sample ({what}):\n\n```yaml")?;
                    for step in steps {
                        writeln!(out, "- {}", serde_json::to_string(step)?)?;
                    }
                    writeln!(out, "```")?;
                }
            }
        }
        let parent = path.parent().context("the reference has a folder")?;
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        // mdBook would expand a `{{#...}}` of the rule files' text.
        fs::write(path, out.replace("{{#", "\\{{#")).with_context(|| format!("writing {}", path.display()))
    }

    fn kind(kind: RuleKind) -> String {
        match kind {
            RuleKind::Target(access) => format!("target ({})", format!("{access:?}").to_lowercase()),
            RuleKind::Exec => "exec".into(),
            RuleKind::Syscall => "syscall".into(),
            RuleKind::Connect => "connect".into(),
            RuleKind::BlindSpot => "blind_spot".into(),
        }
    }

    fn list(out: &mut String, what: &str, patterns: &[String]) -> std::fmt::Result {
        if patterns.is_empty() {
            return Ok(());
        }
        let patterns: Vec<String> = patterns.iter().map(|p| format!("`{}`", p.replace('`', "'"))).collect();
        writeln!(out, "- {what}: {}", patterns.join(", "))
    }

    /// Markdown prose from the rule files: outside code spans, `<`, `>` and `&` as entities (mdBook
    /// passes HTML through) and `*`, `_`, `[`, `]` escaped (they would start emphasis or links);
    /// code spans as written (escapes would show there literally).
    fn escape(text: &str) -> String {
        text.split('`')
            .enumerate()
            .map(|(i, part)| {
                if i % 2 == 1 {
                    part.to_owned()
                } else {
                    let mut escaped = String::with_capacity(part.len());
                    for c in part.chars() {
                        match c {
                            '&' => escaped.push_str("&amp;"),
                            '<' => escaped.push_str("&lt;"),
                            '>' => escaped.push_str("&gt;"),
                            '*' | '_' | '[' | ']' => {
                                escaped.push('\\');
                                escaped.push(c);
                            }
                            c => escaped.push(c),
                        }
                    }
                    escaped
                }
            })
            .collect::<Vec<_>>()
            .join("`")
    }

    #[cfg(test)]
    mod tests {
        use super::escape;

        #[test]
        fn prose_is_escaped_outside_code_spans_only() {
            assert_eq!(
                escape("keys in ~/.ssh/id_* <dir> & `npm token revoke <id>` [x]"),
                "keys in ~/.ssh/id\\_\\* &lt;dir&gt; &amp; `npm token revoke <id>` \\[x\\]"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny built book: `index.html` links to a page, ids, an image and folders that exist, and
    /// to a missing page, missing ids and a missing image.
    #[test]
    fn the_link_check_finds_each_broken_link_and_names_its_page() {
        let book = std::env::temp_dir().join(format!("credwatch-xtask-book-{}", std::process::id()));
        let _ = fs::remove_dir_all(&book);
        fs::create_dir_all(book.join("sub")).unwrap();
        fs::create_dir_all(book.join("folder")).unwrap();
        fs::write(book.join("image.png"), b"png").unwrap();
        fs::write(
            book.join("index.html"),
            r##"<!DOCTYPE html><html><head><link rel="stylesheet" href="style.css?v=1"></head><body>
            <h1 id="top">Top</h1>
            <a href="sub/page.html#part-two">fine</a> <a href="#top">fine</a> <a href="sub/">fine</a> <a href="folder">fine</a>
            <img src="image.png"> <a href="https://example.invalid/x">not ours</a> <a href="/abs">not relative</a>
            <a href="mailto:x@example.invalid">not ours</a>
            <a href="missing.html">broken</a> <a href="sub/page.html#no-such-part">broken</a>
            <a href="#nowhere">broken</a> <img src="missing.png">
            <script>var s = '<a href="inside-a-script.html">';</script>
            </body></html>"##,
        )
        .unwrap();
        fs::write(book.join("style.css"), "").unwrap();
        fs::write(
            book.join("sub/page.html"),
            r#"<h2 id="part-two">Two</h2><a href="../index.html#top">fine</a><a href="../index.html#gone">broken</a>"#,
        )
        .unwrap();
        fs::write(book.join("sub/index.html"), "<p>index</p>").unwrap();

        let broken = broken_links(&book).unwrap();
        fs::remove_dir_all(&book).unwrap();
        let found: Vec<(String, &str, &str)> =
            broken.iter().map(|b| (b.page.display().to_string(), b.link.as_str(), b.why)).collect();
        assert_eq!(
            found,
            [
                ("index.html".to_owned(), "missing.html", "no such file"),
                ("index.html".to_owned(), "sub/page.html#no-such-part", "no such id in that page"),
                ("index.html".to_owned(), "#nowhere", "no such id in that page"),
                ("index.html".to_owned(), "missing.png", "no such file"),
                ("sub/page.html".to_owned(), "../index.html#gone", "no such id in that page"),
            ]
        );
        assert_eq!(broken[0].to_string(), r#"index.html: "missing.html": no such file"#);
    }

    #[test]
    fn the_first_alert_goes_between_the_markers_in_a_fence_longer_than_its_backticks() {
        let readme = format!("intro\n{FIRST_ALERT_BEGIN}\nold\n{FIRST_ALERT_END}\nrest\n");
        let block = fenced("a ``` b\n");
        assert_eq!(block, "````text\na ``` b\n````");
        let replaced = replace_between(&readme, FIRST_ALERT_BEGIN, FIRST_ALERT_END, &block).unwrap();
        assert_eq!(replaced, format!("intro\n{FIRST_ALERT_BEGIN}\n````text\na ``` b\n````\n{FIRST_ALERT_END}\nrest\n"));
        assert!(replace_between("no markers", FIRST_ALERT_BEGIN, FIRST_ALERT_END, "x").is_err());
    }

    /// mdbook 0.5.4's log of a book whose chapter includes a missing file (it exits 0).
    #[test]
    fn a_missing_include_is_an_error_of_the_build() {
        let log = " INFO Book building has started\n\
            ERROR Error updating \"{{#include ../nope.md}}\", Could not read file for link {{#include ../nope.md}} (/tmp/b/src/../nope.md)\n\
            \x20WARN Caused By: failed to read `/tmp/b/src/../nope.md`\n\
            \x20INFO HTML book written to `/tmp/b/book`\n";
        assert_eq!(mdbook_errors(log).len(), 1);
        assert!(mdbook_errors(log)[0].contains("nope.md"));
        assert!(mdbook_errors(" INFO Book building has started\n INFO Running the html backend\n").is_empty());
    }

    #[test]
    fn included_outputs_cannot_expand_or_close_their_block() {
        assert_eq!(for_include("{{#include x}} ```"), "\\{{#include x}} `\u{200b}``");
    }
}
