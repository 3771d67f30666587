//! Section 4: `credwatch replay` throughput on a generated trace, against a parse-only baseline
//! (the same reader and `Event` structs, no engine) and `jq -c .`.
//!
//! The generator and the baseline need the credwatch library, so they live in the release xtask
//! built with `--features bench-trace` (hidden subcommands `bench-gen-trace` and `bench-parse`;
//! see [`super::build_release_xtask`]).

use std::{
    fs,
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::{fmt, median, say, syscalls::nan_null, timed, Ctx, Section};

pub fn run(ctx: &mut Ctx) -> Result<Section> {
    super::build_release_xtask()?;
    let bytes: u64 = if ctx.quick { 64 << 20 } else { 1100 << 20 };
    let rounds = ctx.rounds(2);
    let trace = ctx.work.join("replay.jsonl");
    say(&format!("bench: replay: generating a {} MB trace", bytes >> 20));
    let (generate_s, output) =
        timed(Command::new(&ctx.xtask_release).arg("bench-gen-trace").arg(&trace).arg(bytes.to_string()))?;
    if !output.status.success() {
        bail!("generating the trace: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    let size = fs::metadata(&trace)?.len();
    let events: u64 = String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("events "))
        .and_then(|n| n.trim().parse().ok())
        .context("the generator printed no event count")?;

    let measure = |what: &str| -> Result<f64> {
        let mut command = match what {
            "replay" => {
                let mut command = Command::new(&ctx.credwatch);
                command.arg("replay").arg(&trace).env("HOME", &ctx.home);
                command
            }
            "parse" => {
                let mut command = Command::new(&ctx.xtask_release);
                command.arg("bench-parse").arg(&trace);
                command
            }
            _ => {
                let mut command = Command::new("jq");
                command.arg("-c").arg(".").arg(&trace);
                command
            }
        };
        command.stdout(Stdio::null());
        let (seconds, output) = timed(&mut command)?;
        // replay exits 10 when alerts fired (the trace has a few credential reads).
        let ok = output.status.success() || (what == "replay" && output.status.code() == Some(10));
        if !ok {
            bail!("{what} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(seconds)
    };
    let mut replay = Vec::new();
    let mut parse = Vec::new();
    for round in 0..rounds {
        say(&format!("bench: replay: round {}/{rounds}", round + 1));
        // Alternate which goes first.
        if round % 2 == 0 {
            replay.push(measure("replay")?);
            parse.push(measure("parse")?);
        } else {
            parse.push(measure("parse")?);
            replay.push(measure("replay")?);
        }
    }
    let jq = match &ctx.jq {
        Ok(()) => measure("jq").map_err(|e| format!("{e:#}")),
        Err(reason) => Err(reason.clone()),
    };
    let _ = fs::remove_file(&trace);

    let mb = size as f64 / 1e6;
    let (replay_s, parse_s) = (median(&replay), median(&parse));
    let jq_s = jq.as_ref().copied().unwrap_or(f64::NAN);
    let mut section = Section::new(
        "replay",
        &format!("4. Replay throughput ({mb:.0} MB trace, {events} events, median of {rounds} round(s))"),
        &["reader", "seconds", "events/s", "MB/s", "× parse-only"],
    );
    for (name, seconds) in [
        ("`credwatch replay` (engine + rules)", replay_s),
        ("parse-only (TraceReader → Event, no rules)", parse_s),
        ("`jq -c .`", jq_s),
    ] {
        section.rows.push(vec![
            name.to_owned(),
            fmt(seconds, 2),
            fmt(events as f64 / seconds, 0),
            fmt(mb / seconds, 1),
            fmt(parse_s / seconds, 2),
        ]);
    }
    if let Err(reason) = &jq {
        section.notes.push(format!("jq: n/a: {reason}"));
    }
    section.notes.push(format!(
        "The trace (generated in {generate_s:.0} s, deleted after) is npm and cargo package trees: execs with attribution env, forks, opens with absolute paths, exits, and a credential read in about one tree in 200. One file, so replay uses one thread, like the baseline."
    ));
    section.json = json!({
        "trace_bytes": size, "events": events, "rounds": rounds,
        "replay_s": { "median": nan_null(replay_s), "rounds": replay },
        "parse_only_s": { "median": nan_null(parse_s), "rounds": parse },
        "jq_s": nan_null(jq_s), "jq_error": jq.err(),
        "replay_events_per_s": nan_null(events as f64 / replay_s),
        "replay_mb_per_s": nan_null(mb / replay_s),
        "parse_only_mb_per_s": nan_null(mb / parse_s),
        "replay_share_of_parse_only": nan_null(parse_s / replay_s),
    });
    let share = parse_s / replay_s;
    ctx.target(
        "replay throughput vs parse-only",
        format!("{:.0}% ({} vs {} MB/s)", share * 100.0, fmt(mb / replay_s, 0), fmt(mb / parse_s, 0)),
        "≥ 70%",
        share.is_finite().then_some(share >= 0.70),
    );
    Ok(section)
}

#[cfg(feature = "bench-trace")]
pub use generator::{generate, parse_only};

#[cfg(feature = "bench-trace")]
mod generator {
    use std::{collections::BTreeMap, path::Path};

    use anyhow::{Context, Result};
    use credwatch_core::{
        event::{Event, EventData, Exec, Exit, Fork, Open},
        trace::{TraceHeader, TraceReader, TraceWriter, TRACE_SCHEMA},
    };

    /// `bench-parse FILE`: reads every event as replay does, and does nothing with it.
    pub fn parse_only(file: &Path) -> Result<()> {
        let mut reader = TraceReader::open(file)?;
        let mut events = 0u64;
        while let Some(event) = reader.next_event()? {
            events += 1;
            std::hint::black_box(&event);
        }
        println!("events {events}");
        Ok(())
    }

    /// A deterministic stream of package-tree events.
    struct Gen {
        time_ns: u64,
        next_pid: u32,
        /// xorshift state: fixed seed, so every run generates the same trace.
        state: u64,
        events: u64,
        writer: TraceWriter,
        written: u64,
    }

    const HOME: &str = "/home/dev";

    impl Gen {
        fn random(&mut self, below: u64) -> u64 {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            self.state % below
        }

        fn pid(&mut self) -> u32 {
            self.next_pid = if self.next_pid >= 4_000_000 { 1000 } else { self.next_pid + 1 };
            self.next_pid
        }

        fn emit(&mut self, pid: u32, data: EventData) -> Result<()> {
            self.time_ns += 2_000 + self.random(20_000);
            let event = Event { time_ns: self.time_ns, pid, data };
            // The writer does not say how much it wrote; the serialised length is the same.
            self.written += serde_json::to_vec(&event)?.len() as u64 + 1;
            self.writer.write(&event)?;
            self.events += 1;
            Ok(())
        }

        fn exec(
            &mut self,
            pid: u32,
            ppid: u32,
            executable: &str,
            args: &[&str],
            cwd: &str,
            env: &[(&str, &str)],
        ) -> Result<()> {
            let mut vars = BTreeMap::new();
            vars.insert("HOME".to_owned(), HOME.to_owned());
            for (key, value) in env {
                vars.insert((*key).to_owned(), (*value).to_owned());
            }
            let exec = Exec {
                ppid,
                filename: executable.to_owned(),
                executable: executable.to_owned(),
                args: args.iter().map(|a| (*a).to_owned()).collect(),
                cwd: cwd.to_owned(),
                uid: 1000,
                gid: 1000,
                cgroup_id: 4242,
                env: vars,
                ..Exec::default()
            };
            self.emit(pid, EventData::Exec(exec))
        }

        fn open(&mut self, pid: u32, path: &str, cwd: &str) -> Result<()> {
            let failed = self.random(10) == 0;
            let open = Open {
                tid: pid,
                syscall: "openat".into(),
                dirfd: -100,
                flags: 0o2000000,
                mode: 0,
                path: path.strip_prefix(&format!("{cwd}/")).unwrap_or(path).to_owned(),
                abs_path: (!failed).then(|| path.to_owned()),
                truncated: false,
                ret: if failed { -2 } else { 3 + self.random(20) as i64 },
                dev: if failed { 0 } else { 2049 },
                ino: if failed { 0 } else { 100_000 + self.random(1_000_000) },
                ..Open::default()
            };
            self.emit(pid, EventData::Open(open))
        }

        fn fork(&mut self, parent: u32) -> Result<u32> {
            let child = self.pid();
            self.emit(parent, EventData::Fork(Fork { child_pid: child }))?;
            Ok(child)
        }

        fn exit(&mut self, pid: u32) -> Result<()> {
            self.emit(pid, EventData::Exit(Exit { code: 0, ..Exit::default() }))
        }

        fn npm_tree(&mut self, tree: u64) -> Result<()> {
            let cwd = format!("{HOME}/src/app-{}", tree % 997);
            let root = self.pid();
            self.exec(root, 1, "/usr/bin/node", &["node", "/usr/bin/npm", "install"], &cwd, &[])?;
            for i in 0..150 {
                let package = format!("{cwd}/node_modules/pkg-{}/package.json", (tree + i) % 5000);
                self.open(root, &package, &cwd)?;
            }
            self.open(root, &format!("{HOME}/.npmrc"), &cwd)?;
            for script in 0..3 {
                let name = format!("pkg-{}", (tree * 3 + script) % 5000);
                let dir = format!("{cwd}/node_modules/{name}");
                let env = [
                    ("npm_package_name", name.as_str()),
                    ("npm_package_version", "1.2.3"),
                    ("npm_lifecycle_event", "postinstall"),
                    ("npm_lifecycle_script", "node install.js"),
                    ("npm_command", "install"),
                ];
                let shell = self.fork(root)?;
                self.exec(shell, root, "/usr/bin/dash", &["sh", "-c", "node install.js"], &dir, &env)?;
                let node = self.fork(shell)?;
                self.exec(node, shell, "/usr/bin/node", &["node", "install.js"], &dir, &env)?;
                for i in 0..40 {
                    let file = format!("{dir}/lib/file-{i}.js");
                    self.open(node, &file, &dir)?;
                }
                self.open(node, "/usr/share/nodejs/semver/package.json", &dir)?;
                if self.random(200) == 0 {
                    // The rare package that reads a credential: the rules fire on it.
                    self.open(node, &format!("{HOME}/.ssh/id_ed25519"), &dir)?;
                }
                self.exit(node)?;
                self.exit(shell)?;
            }
            self.exit(root)
        }

        fn cargo_tree(&mut self, tree: u64) -> Result<()> {
            let cwd = format!("{HOME}/src/crate-{}", tree % 997);
            let root = self.pid();
            self.exec(root, 1, "/usr/bin/cargo", &["cargo", "build"], &cwd, &[])?;
            for i in 0..40 {
                self.open(
                    root,
                    &format!("{HOME}/.cargo/registry/src/index/dep-{}/Cargo.toml", (tree + i) % 3000),
                    &cwd,
                )?;
            }
            for krate in 0..6 {
                let name = format!("dep_{}", (tree * 6 + krate) % 3000);
                let env = [
                    ("CARGO_PKG_NAME", name.as_str()),
                    ("CARGO_PKG_VERSION", "0.4.2"),
                    ("CARGO_CRATE_NAME", name.as_str()),
                ];
                let rustc = self.fork(root)?;
                self.exec(
                    rustc,
                    root,
                    "/usr/bin/rustc",
                    &["rustc", "--crate-name", &name, "--edition=2021", "src/lib.rs"],
                    &cwd,
                    &env,
                )?;
                for i in 0..25 {
                    self.open(rustc, &format!("{cwd}/target/debug/deps/lib{name}-{i}.rmeta"), &cwd)?;
                }
                self.exit(rustc)?;
            }
            self.exit(root)
        }
    }

    /// `bench-gen-trace FILE BYTES`: writes at least BYTES of trace and prints `events N`.
    pub fn generate(file: &Path, bytes: u64) -> Result<()> {
        let header = TraceHeader {
            credwatch_trace: TRACE_SCHEMA,
            credwatch_version: env!("CARGO_PKG_VERSION").to_owned(),
            host: "bench".into(),
            host_id: None,
            kernel: "6.18".into(),
            start_time: "2026-11-29T00:00:00Z".into(),
            rules_digest: "0".repeat(64),
            scope: "machine".into(),
            command: Vec::new(),
        };
        let writer = TraceWriter::create(file, &header).with_context(|| format!("creating {}", file.display()))?;
        let mut gen = Gen {
            time_ns: 1_796_000_000_000_000_000,
            next_pid: 1000,
            state: 0x9e3779b97f4a7c15,
            events: 0,
            writer,
            written: 0,
        };
        let mut tree = 0u64;
        while gen.written < bytes {
            if tree % 10 < 7 {
                gen.npm_tree(tree)?;
            } else {
                gen.cargo_tree(tree)?;
            }
            tree += 1;
        }
        let events = gen.events;
        gen.writer.finish()?;
        println!("events {events}");
        Ok(())
    }
}
