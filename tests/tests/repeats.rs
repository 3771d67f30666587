//! Issue 27 point 1: repeated acts are counts, not records. A real `npm install` whose
//! postinstall opens `~/.npmrc` 60,000 times, then reads `~/.ssh/id_ed25519`, under
//! `credwatch watch`: the kernel sends a record per second of the loop and counts the rest, the
//! key's read still alerts, and nothing is lost. Prints what the loop cost (`repeats:` lines).
//!
//! Run by hand: `cargo test -p credwatch-e2e --test repeats -- --test-threads=1` after
//! `cargo xtask build`.

use std::{fs, path::Path, time::Duration};

use credwatch_e2e::{slow, Sandbox};
use serde_json::Value;

/// Opens of `~/.npmrc` the postinstall makes.
const OPENS: u64 = 60_000;

/// A package whose postinstall (node, in its main thread) opens `~/.npmrc` [`OPENS`] times,
/// then reads `~/.ssh/id_ed25519`; packed by the real npm: its tarball.
fn hammer(sandbox: &Sandbox) -> std::path::PathBuf {
    let dir = sandbox.work().join("packages/npmrc-hammer");
    fs::create_dir_all(&dir).unwrap();
    let manifest = r#"{ "name": "npmrc-hammer", "version": "1.0.0", "license": "MIT", "scripts": { "postinstall": "node hammer.js" } }"#;
    fs::write(dir.join("package.json"), manifest).unwrap();
    let script = format!(
        "const fs = require('fs'), home = require('os').homedir();\n\
         for (let i = 0; i < {OPENS}; i++) fs.closeSync(fs.openSync(home + '/.npmrc', 'r'));\n\
         fs.readFileSync(home + '/.ssh/id_ed25519');\n"
    );
    fs::write(dir.join("hammer.js"), script).unwrap();
    let packed = sandbox.setup("npm pack", sandbox.command("npm").args(["pack", "--silent"]).current_dir(&dir));
    dir.join(packed.trim())
}

/// The events of a trace file (its header left out).
fn trace_events(trace: &Path) -> Vec<Value> {
    let text = fs::read_to_string(trace).unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
    text.lines().skip(1).map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"))).collect()
}

fn repeats(event: &Value) -> u64 {
    event["repeats"].as_u64().unwrap_or(0)
}

#[test]
fn sixty_thousand_opens_of_npmrc_cost_a_few_records_and_the_key_read_after_them_alerts() {
    let sandbox = Sandbox::new();
    let (npmrc, key) = (sandbox.credential(".npmrc"), sandbox.credential(".ssh/id_ed25519"));
    let tarball = hammer(&sandbox);
    let trace = sandbox.work().join("trace.jsonl");
    let config = sandbox.work().join("credwatch.yaml");
    fs::write(&config, format!("trace: {}\n", trace.display())).unwrap();
    let watch = sandbox.watch_with(&["--config", config.to_str().unwrap()]);

    let project = sandbox.npm_project();
    let status = sandbox.command("npm").arg("install").arg(&tarball).current_dir(&project).status().unwrap();
    assert!(status.success(), "npm install: {status}");
    let read = sandbox.wait_for_alert(&key, slow(Duration::from_secs(30)));
    let read = read.unwrap_or_else(|| panic!("no alert for the key read after the loop: {:#?}", sandbox.alerts_now()));
    assert_eq!(read["package"]["name"], "npmrc-hammer", "{read:#}");
    let npmrc_alert = sandbox.wait_for_alert(&npmrc, slow(Duration::from_secs(10)));
    let npmrc_alert = npmrc_alert.expect("the loop's .npmrc opens alert");
    assert_eq!(npmrc_alert["package"]["name"], "npmrc-hammer", "{npmrc_alert:#}");
    let run = watch.stop();
    let alerts = run.alerts();
    assert!(
        alerts.iter().all(|a| !a["rule"]["id"].as_str().unwrap_or_default().starts_with("blind-spot")),
        "nothing was lost, so no blind spot: {alerts:#?}"
    );

    // What the kernel sent of the loop: the postinstall's records of .npmrc, what they carried
    // counted, and what its exit carried.
    let events = trace_events(&trace);
    let node = npmrc_alert["process"]["pid"].as_u64().expect("the alert names the process");
    let of_node = |kind: &'static str| events.iter().filter(move |e| e["pid"] == node && e["kind"] == kind);
    let records: Vec<&Value> = of_node("open").filter(|e| e["abs_path"] == npmrc.as_str()).collect();
    let carried: u64 = records.iter().map(|e| repeats(e)).sum();
    let exit = of_node("exit").next().expect("the postinstall's exit is in the trace");
    assert!(!records.is_empty() && records.len() < 100, "{} records of {OPENS} opens", records.len());
    // The exit's count also holds node's own repeated opens of other files (none of them of
    // .npmrc: every .npmrc open is a record or counted).
    let accounted = records.len() as u64 + carried + repeats(exit);
    assert!(accounted >= OPENS, "{} records + {carried} carried + {} at exit < {OPENS}", records.len(), repeats(exit));
    assert!(events.iter().all(|e| e["kind"] != "lost" && e["kind"] != "blind_spot"), "nothing lost");
    let all_records = events.len();
    println!(
        "repeats: {OPENS} opens of .npmrc: {} records (carrying {carried}), {} counted at exit; {all_records} records in the whole install",
        records.len(),
        repeats(exit)
    );
}
