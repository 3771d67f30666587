//! Section 2: offline install workloads, wall time under each configuration: `npm install` of a
//! generated project of local tarballs (some with install scripts) and `cargo build` of a
//! generated workspace of crates with build scripts.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::{
    cpu_seconds, fmt, median, say, start_watch,
    syscalls::{nan_null, Audit},
    timed_with_own_cpu, Background, Ctx, Section,
};

const NPM_PACKAGES: usize = 300;
const NPM_SCRIPTED: usize = 50;
const CRATES: usize = 50;
/// Rounds under `strace -f`, whose cost is far from the targets and whose runs are long.
const STRACE_ROUNDS: usize = 3;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Config {
    Nothing,
    Run,
    Watch,
    Bpftrace,
    Auditd,
    Strace,
}

const CONFIGS: &[Config] =
    &[Config::Nothing, Config::Run, Config::Watch, Config::Bpftrace, Config::Auditd, Config::Strace];

impl Config {
    fn label(self) -> &'static str {
        match self {
            Config::Nothing => "nothing",
            Config::Run => "`credwatch run -- …`",
            Config::Watch => "`credwatch watch`",
            Config::Bpftrace => "bpftrace (as in 1e)",
            Config::Auditd => "auditd (as in 1f)",
            Config::Strace => "`strace -f`",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Config::Nothing => "nothing",
            Config::Run => "credwatch_run",
            Config::Watch => "credwatch_watch",
            Config::Bpftrace => "bpftrace",
            Config::Auditd => "auditd",
            Config::Strace => "strace",
        }
    }
}

struct Workload {
    name: &'static str,
    /// The directory it runs in, cleaned before each run.
    dir: PathBuf,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, PathBuf)>,
    clean: Vec<PathBuf>,
}

/// `npm install` of NPM_PACKAGES local tarballs, NPM_SCRIPTED of them with an install script.
fn npm_project(ctx: &Ctx) -> Result<Workload> {
    let root = ctx.work.join("npm");
    let tarballs = root.join("tarballs");
    let app = root.join("app");
    fs::create_dir_all(&tarballs)?;
    fs::create_dir_all(&app)?;
    let mut dependencies = serde_json::Map::new();
    for index in 0..NPM_PACKAGES {
        let name = format!("bench-pkg-{index:03}");
        let source = root.join("src").join(&name);
        let package = source.join("package");
        fs::create_dir_all(package.join("lib"))?;
        let mut manifest = json!({ "name": name, "version": "1.0.0", "main": "lib/index.js", "license": "MIT" });
        if index < NPM_SCRIPTED {
            // A little harmless work, as a native-module or download step would do.
            manifest["scripts"] = json!({
                "install": "node -e \"require('fs').writeFileSync('built.txt', require('crypto').createHash('sha256').update(String(Date.now())).digest('hex'))\""
            });
        }
        fs::write(package.join("package.json"), serde_json::to_string_pretty(&manifest)?)?;
        fs::write(package.join("lib/index.js"), format!("module.exports = () => {index};\n"))?;
        fs::write(package.join("README.md"), format!("# {name}\n\nGenerated for credwatch's bench.\n"))?;
        let tarball = tarballs.join(format!("{name}-1.0.0.tgz"));
        let status = Command::new("tar").arg("-czf").arg(&tarball).arg("-C").arg(&source).arg("package").status()?;
        if !status.success() {
            bail!("tar of {name} failed");
        }
        dependencies.insert(name.clone(), json!(format!("file:../tarballs/{name}-1.0.0.tgz")));
    }
    let manifest = json!({ "name": "bench-app", "version": "1.0.0", "private": true, "dependencies": dependencies });
    fs::write(app.join("package.json"), serde_json::to_string_pretty(&manifest)?)?;
    Ok(Workload {
        name: "npm install (300 local packages, 50 install scripts)",
        clean: vec![app.join("node_modules"), app.join("package-lock.json")],
        dir: app,
        program: PathBuf::from("npm"),
        args: ["install", "--offline", "--no-audit", "--no-fund", "--loglevel=error"].map(str::to_owned).to_vec(),
        env: vec![("npm_config_cache".into(), root.join("cache"))],
    })
}

/// `cargo build --offline` of a workspace of CRATES crates, each with a build script.
fn cargo_workspace(ctx: &Ctx) -> Result<Workload> {
    let root = ctx.work.join("cargo");
    let members: Vec<String> = (0..CRATES).map(|i| format!("crates/c{i:03}")).collect();
    fs::create_dir_all(&root)?;
    fs::write(
        root.join("Cargo.toml"),
        format!("[workspace]\nresolver = \"2\"\nmembers = {:?}\n\n[profile.dev]\ndebug = 0\n", members),
    )?;
    for (index, member) in members.iter().enumerate() {
        let dir = root.join(member);
        fs::create_dir_all(dir.join("src"))?;
        fs::write(
            dir.join("Cargo.toml"),
            format!(
                "[package]\nname = \"c{index:03}\"\nversion = \"0.1.0\"\nedition = \"2021\"\nbuild = \"build.rs\"\n"
            ),
        )?;
        // A build script that does what real ones do: read a file, write generated code.
        fs::write(
            dir.join("build.rs"),
            "use std::{env, fs, path::Path};\n\
             fn main() {\n\
             \x20   let manifest = fs::read_to_string(\"Cargo.toml\").unwrap();\n\
             \x20   let out = Path::new(&env::var(\"OUT_DIR\").unwrap()).join(\"generated.rs\");\n\
             \x20   fs::write(out, format!(\"pub const MANIFEST_BYTES: usize = {};\", manifest.len())).unwrap();\n\
             \x20   println!(\"cargo:rerun-if-changed=build.rs\");\n\
             }\n",
        )?;
        fs::write(
            dir.join("src/lib.rs"),
            format!(
                "include!(concat!(env!(\"OUT_DIR\"), \"/generated.rs\"));\n\
                 pub fn id() -> usize {{ {index} + MANIFEST_BYTES }}\n"
            ),
        )?;
    }
    let cargo = env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
    Ok(Workload {
        name: "cargo build --offline (50 crates with build scripts)",
        clean: vec![root.join("target")],
        dir: root.clone(),
        program: cargo,
        args: ["build", "--offline", "--quiet"].map(str::to_owned).to_vec(),
        env: vec![("CARGO_TARGET_DIR".into(), root.join("target"))],
    })
}

/// Wall seconds of one run, and the agent's CPU seconds meanwhile (credwatch configurations).
fn once(ctx: &Ctx, workload: &Workload, config: Config, script: &Path) -> Result<(f64, f64)> {
    for path in &workload.clean {
        if path.is_dir() {
            fs::remove_dir_all(path)?;
        } else if path.exists() {
            fs::remove_file(path)?;
        }
    }
    let running = match config {
        Config::Watch => Some(start_watch(ctx)?.0),
        Config::Bpftrace => {
            let bpftrace = Background::start(&mut super::syscalls::bpftrace_command(script), libc::SIGINT)?;
            bpftrace.stdout.as_ref().context("bpftrace stdout")?.wait_for("attached", Duration::from_secs(60))?;
            Some(bpftrace)
        }
        _ => None,
    };
    let audit = if config == Config::Auditd { Some(Audit::start(ctx)?) } else { None };
    let mut command = match config {
        Config::Run => {
            let mut command = Command::new(&ctx.credwatch);
            command.args(["run", "--"]).arg(&workload.program);
            command
        }
        Config::Strace => {
            let mut command = Command::new("strace");
            command.args(["-f", "-o", "/dev/null"]).arg(&workload.program);
            command
        }
        _ => Command::new(&workload.program),
    };
    command.args(&workload.args).current_dir(&workload.dir).env("HOME", &ctx.home);
    for (key, value) in &workload.env {
        command.env(key, value);
    }
    let watch_cpu =
        running.as_ref().filter(|_| config == Config::Watch).map(|agent| (agent.pid(), cpu_seconds(agent.pid())));
    let (seconds, output, own_cpu) = timed_with_own_cpu(&mut command)?;
    let agent_cpu = match (config, watch_cpu) {
        (Config::Watch, Some((pid, before))) => cpu_seconds(pid) - before,
        (Config::Run, _) => own_cpu,
        _ => f64::NAN,
    };
    if let Some(process) = running {
        process.stop()?;
    }
    if let Some(audit) = audit {
        audit.stop()?;
    }
    if !output.status.success() {
        bail!(
            "{} under {} failed ({}): {}",
            workload.name,
            config.label(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim().lines().last().unwrap_or("")
        );
    }
    Ok((seconds, agent_cpu))
}

pub fn run(ctx: &mut Ctx) -> Result<Section> {
    let script = ctx.work.join("credwatch-equivalent.bt");
    if !script.is_file() {
        fs::write(&script, super::syscalls::bpftrace_script(&ctx.home))?;
    }
    let workloads = [npm_project(ctx)?, cargo_workspace(ctx)?];
    // Five rounds: an install's wall time on two shared cores varies by several percent from run
    // to run, and the targets are a few percent. strace, slow and far off, gets three.
    let rounds = ctx.rounds(5);
    let mut section = Section::new(
        "install",
        "2. Install workloads, offline (wall seconds, median of rounds)",
        &["workload", "configuration", "wall s", "× nothing", "agent CPU s", "rounds (s)"],
    );
    let mut figures = serde_json::Map::new();
    for workload in &workloads {
        // A first run, not counted, warms caches (npm's, the page cache).
        once(ctx, workload, Config::Nothing, &script).with_context(|| format!("warm-up of {}", workload.name))?;
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); CONFIGS.len()];
        let mut agent_cpu: Vec<Vec<f64>> = vec![Vec::new(); CONFIGS.len()];
        let mut errors: Vec<Option<String>> = CONFIGS
            .iter()
            .map(|c| match c {
                Config::Bpftrace => ctx.bpftrace.clone().err(),
                Config::Auditd => ctx.auditd.clone().err(),
                Config::Strace => ctx.strace.clone().err(),
                _ => None,
            })
            .collect();
        for round in 0..rounds {
            say(&format!("bench: install: {}: round {}/{rounds}", workload.name, round + 1));
            for offset in 0..CONFIGS.len() {
                let index = (round + offset) % CONFIGS.len();
                if errors[index].is_some() || (CONFIGS[index] == Config::Strace && round >= STRACE_ROUNDS) {
                    continue;
                }
                match once(ctx, workload, CONFIGS[index], &script) {
                    Ok((seconds, cpu)) => {
                        times[index].push(seconds);
                        agent_cpu[index].push(cpu);
                    }
                    Err(error) => errors[index] = Some(format!("{error:#}")),
                }
            }
        }
        let nothing = median(&times[0]);
        let mut per_config = serde_json::Map::new();
        for (index, config) in CONFIGS.iter().enumerate() {
            let wall = median(&times[index]);
            let rounds_text = match &errors[index] {
                Some(error) if times[index].is_empty() => format!("n/a: {}", error.replace('|', "/")),
                _ => times[index].iter().map(|t| format!("{t:.2}")).collect::<Vec<_>>().join(", "),
            };
            section.rows.push(vec![
                workload.name.to_owned(),
                config.label().to_owned(),
                fmt(wall, 2),
                fmt(wall / nothing, 3),
                fmt(median(&agent_cpu[index]), 2),
                rounds_text,
            ]);
            per_config.insert(
                config.key().to_owned(),
                json!({ "median_s": nan_null(wall), "rounds_s": times[index], "agent_cpu_s": nan_null(median(&agent_cpu[index])), "ratio_to_nothing": nan_null(wall / nothing), "error": errors[index] }),
            );
        }
        if workload.name.starts_with("npm") {
            for config in [Config::Run, Config::Watch] {
                let index = CONFIGS.iter().position(|c| *c == config).expect("listed");
                let ratio = median(&times[index]) / nothing;
                ctx.target(
                    &format!("npm install wall, {} over nothing", config.label()),
                    format!("{:+.1}%", (ratio - 1.0) * 100.0),
                    "≤ +3%",
                    ratio.is_finite().then_some(ratio <= 1.03),
                );
            }
        }
        figures.insert(workload.name.to_owned(), serde_json::Value::Object(per_config));
    }
    section.notes.push(format!(
        "{rounds} round(s) ({} under strace) after an uncounted warm-up, configurations interleaved. The npm project is {NPM_PACKAGES} `file:` tarballs ({NPM_SCRIPTED} with an `install` script hashing a string in node) under a fake HOME and cache; the cargo workspace is {CRATES} crates whose build scripts read their manifest and generate code, built from clean (`debug = 0`)."
    ,
        rounds.min(STRACE_ROUNDS)
    ));
    section.notes.push("`credwatch run` includes the agent's start-up; under `watch` the agent was already attached. Agent CPU: user+system seconds of the agent process during the run (sampled every 20 ms for `run`). Both workloads use both cores, which other engineers were also using.".into());
    section.json = serde_json::Value::Object(figures);
    Ok(section)
}
