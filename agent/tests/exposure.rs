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
    // HOME is the throwaway one too: nothing here may look at the real home.
    Command::new(env!("CARGO_BIN_EXE_credwatch")).arg("exposure").args(args).env("HOME", home).output().unwrap()
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
