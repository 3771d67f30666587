use std::{fs, path::Path};

use super::*;
use crate::{
    alert::Severity,
    rules::{
        fixtures::{EXEC_RULE, EXEC_RULE_SCHEMA_1, MINIMAL_RULE, MINIMAL_RULE_SCHEMA_1},
        schema::{self, Access},
        RuleKind,
    },
};

fn write(dir: &Path, name: &str, text: &str) {
    fs::write(dir.join(name), text).unwrap();
}

#[test]
fn every_default_rule_passes_its_samples() {
    let set = RuleSet::defaults().unwrap();
    assert!(set.rules().len() >= 20, "{} rules", set.rules().len());
    let failures = failures(&set);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn check_dir_replays_samples_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "mine.yaml", MINIMAL_RULE);
    // Samples may also be written as full events, in the trace's JSON shape.
    let full_events = MINIMAL_RULE.replace("id: demo", "id: demo-events").replace(
        "        - open: {pid: 1, path: /home/alice/.demo-token}\n",
        "        - event: {time_ns: 5, pid: 1, kind: open, tid: 1, syscall: openat, dirfd: -100, flags: 0, mode: 0, path: .demo-token, abs_path: /root/.demo-token, ret: 4}\n",
    );
    write(dir.path(), "events.yaml", &full_events);
    let report = check_dir(dir.path()).unwrap();
    let defaults = RuleSet::defaults().unwrap().rules().len();
    assert_eq!(report, CheckReport { files: 2, managers: 0, rules: 2, samples: (defaults + 2) * 2 });
    fs::remove_file(dir.path().join("events.yaml")).unwrap();

    // A negative sample that fires is reported with the rule's file and line.
    let broken = MINIMAL_RULE.replace("/home/alice/.demo-token.pub", "/root/.demo-token");
    write(dir.path(), "mine.yaml", &broken);
    match check_dir(dir.path()).unwrap_err() {
        CheckError::Samples { failures } => {
            assert_eq!(failures.len(), 1, "{failures:?}");
            assert!(
                failures[0].contains("mine.yaml:3:5: rule demo: the negative sample fired the rule"),
                "{}",
                failures[0]
            );
        }
        other => panic!("expected sample failures, got {other}"),
    }
}

/// An exec, a syscall (kill) and a write rule, from the exec and the minimal rule of a schema.
fn three_kinds(exec_rule: &str, minimal_rule: &str, schema: u8) -> [(&'static str, String); 3] {
    let exec_match = "    exec:\n      names: [demo]\n      any_args: [--go]\n";
    let (exec_kind, syscall_kind, read) = match schema {
        1 => ("", "", ""),
        _ => ("    kind: exec\n", "    kind: syscall\n", "    access: read\n"),
    };
    let syscall = exec_rule.replace("demo-exec", "demo-syscall").replace(
        &format!("{exec_kind}{exec_match}"),
        &format!(
            "    action: kill\n{syscall_kind}    syscalls:\n      names: [ptrace]\n      operations: [PTRACE_ATTACH]\n"
        ),
    );
    let syscall = syscall
        .replace(
            "- exec: {pid: 2, ppid: 1, args: [demo, --go]}",
            "- syscall: {pid: 1, name: ptrace, operation: PTRACE_ATTACH, target: 9}",
        )
        .replace(
            "- exec: {pid: 2, ppid: 1, args: [demo, --stop]}",
            "- syscall: {pid: 1, name: ptrace, operation: PTRACE_DETACH, target: 9}",
        );
    let targets = "    targets: [\"~/.demo-token\"]\n";
    let write_rule = minimal_rule
        .replace("id: demo", "id: demo-write")
        .replace(&format!("{read}{targets}"), &format!("    access: write\n{targets}"));
    let write_rule = write_rule
        .replace(
            "- open: {pid: 1, path: /home/alice/.demo-token}",
            "- open: {pid: 1, path: /home/alice/.demo-token, flags: \"O_WRONLY|O_APPEND\"}",
        )
        .replace(
            "- open: {pid: 1, path: /home/alice/.demo-token.pub}",
            "- open: {pid: 1, path: /home/alice/.demo-token}",
        );
    [("exec.yaml", exec_rule.to_owned()), ("syscall.yaml", syscall), ("write.yaml", write_rule)]
}

#[test]
fn new_rule_kinds_load_and_replay() {
    // Schema 2 names each kind; schema 1 files say the same by which key they have.
    for (schema, exec_rule, minimal_rule) in
        [(2, EXEC_RULE, MINIMAL_RULE), (1, EXEC_RULE_SCHEMA_1, MINIMAL_RULE_SCHEMA_1)]
    {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in three_kinds(exec_rule, minimal_rule, schema) {
            write(dir.path(), name, &text);
        }
        let report = check_dir(dir.path()).unwrap();
        assert_eq!(report.rules, 3, "schema {schema}");
        let set = RuleSet::load(Some(dir.path())).unwrap();
        let kind = |id: &str| set.rules().iter().find(|r| r.id == id).unwrap().kind;
        assert_eq!(kind("demo-exec"), RuleKind::Exec, "schema {schema}");
        assert_eq!(kind("demo-syscall"), RuleKind::Syscall, "schema {schema}");
        assert_eq!(kind("demo-write"), RuleKind::Target(Access::Write), "schema {schema}");
        assert_eq!(kind("ssh-keys"), RuleKind::Target(Access::Read));
        assert!(set.kill_rules().any(|r| r.id == "demo-syscall"), "schema {schema}");
    }
}

/// Replays `steps` (sample steps in YAML) over the default rules: (rule id, severity) of
/// each alert.
fn replay_yaml(steps: &str) -> Vec<(String, Severity)> {
    let steps: Vec<schema::Step> = serde_saphyr::from_str(steps).unwrap();
    replay(&RuleSet::defaults().unwrap(), &steps).into_iter().map(|a| (a.rule.id, a.rule.severity)).collect()
}

#[test]
fn the_readers_of_their_own_credentials_are_reported_low() {
    // `npm version` signing its tag: npm -> git -> gpg -> gpg-agent reads the secret key.
    let signing = r#"
- exec: {pid: 100, args: [npm, version, patch], cwd: /home/alice/lib}
- exec: {pid: 101, ppid: 100, file: /usr/bin/git, args: [git, tag, -s, -m, v1.0.1, v1.0.1]}
- exec: {pid: 102, ppid: 101, file: /usr/bin/gpg, args: [gpg, -bsau, alice@example.org]}
- exec: {pid: 103, ppid: 102, file: /usr/bin/gpg-agent, args: [gpg-agent, --daemon]}
- open: {pid: 103, path: /home/alice/.gnupg/private-keys-v1.d/0C5A33B8A1C8D09F9B8E1E4D2E3F4A5B6C7D8E9F.key}
"#;
    assert_eq!(replay_yaml(signing), [("gnupg-private-keys".to_owned(), Severity::Low)]);
    // The same gpg started by package code is not the manager's doing.
    let by_package = r#"
- exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
- exec: {pid: 101, ppid: 100, args: [node, x.js], env: {npm_package_name: evil, npm_lifecycle_event: postinstall}}
- exec: {pid: 102, ppid: 101, file: /usr/bin/gpg, args: [gpg, --export-secret-keys, -a]}
- exec: {pid: 103, ppid: 102, file: /usr/bin/gpg-agent, args: [gpg-agent, --daemon]}
- open: {pid: 103, path: /home/alice/.gnupg/private-keys-v1.d/0C5A33B8A1C8D09F9B8E1E4D2E3F4A5B6C7D8E9F.key}
"#;
    assert_eq!(
        replay_yaml(by_package),
        [
            ("gpg-secret-key-export".to_owned(), Severity::Critical),
            ("gnupg-private-keys".to_owned(), Severity::Critical)
        ]
    );
    // Maven (java) and terraform read their own settings on every run.
    let build_tools = r#"
- exec: {pid: 200, args: [pip, install, ./jvm-bridge-1.0.tar.gz], cwd: /home/alice}
- exec: {pid: 201, ppid: 200, args: [python3, setup.py, bdist_wheel], cwd: /tmp/pip-req-build-k2}
- exec: {pid: 202, ppid: 201, file: /usr/bin/java, args: [/usr/bin/java, -classpath, /usr/share/maven/boot/plexus-classworlds.jar, org.codehaus.plexus.classworlds.launcher.Launcher, package]}
- open: {pid: 202, path: /home/alice/.m2/settings.xml}
- exec: {pid: 203, ppid: 201, file: /usr/local/bin/terraform, args: [terraform, providers, schema, -json]}
- open: {pid: 203, path: /home/alice/.terraform.d/credentials.tfrc.json}
"#;
    assert_eq!(
        replay_yaml(build_tools),
        [("maven-settings".to_owned(), Severity::Low), ("terraform-credentials".to_owned(), Severity::Low)]
    );
}
