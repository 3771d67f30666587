//! `credwatch run --contain`'s home: package code in the box cannot plant anything there (a
//! write fails with EROFS, and alerts as the write would have), but the project and the
//! managers' caches take their writes, so real installs succeed; persistence paths stay
//! read-only even inside the project; `--contain-writes overlay` lists what the box wrote,
//! drops it, and with `--keep` keeps all but the persistence paths; without root the same box
//! is a user namespace's.

use std::{fs, path::Path};

use credwatch_e2e::{OtherUser, Run, Sandbox, EXIT_ALERT};
use serde_json::Value;

/// The user's own start-up file, which nothing in the box may change.
const BASHRC: &str = "# the user's own\n";

/// `credwatch run --contain OPTIONS -- npm-stand-in planter SCRIPT REPORT ARGS...`: `script` runs
/// as package code (a postinstall of package `planter`) in `cwd`, with `$1` a report file
/// outside the home.
fn planted(sandbox: &Sandbox, cwd: &Path, options: &[&str], script: &str, args: &[&str]) -> (Run, String) {
    let report = sandbox.work().join("report.txt");
    let _ = fs::remove_file(&report);
    let manager = sandbox.fake_manager();
    let mut cmd = vec![manager.to_str().unwrap(), "planter", script, report.to_str().unwrap()];
    cmd.extend_from_slice(args);
    let options: Vec<&str> = ["--contain"].into_iter().chain(options.iter().copied()).collect();
    let run = sandbox.run_with(cwd, &options, &cmd, &[]);
    (run, fs::read_to_string(&report).unwrap_or_default())
}

fn rule_hits(run: &Run, rule: &str, path: &Path) -> bool {
    let path = path.to_str().unwrap();
    run.alerts().iter().any(|alert: &Value| alert["rule"]["id"] == rule && alert["file"]["path"] == path)
}

#[test]
fn a_write_to_the_home_fails_alerts_and_leaves_the_real_home_unchanged() {
    let sandbox = Sandbox::new();
    let home = sandbox.home();
    fs::write(home.join(".bashrc"), BASHRC).unwrap();
    fs::create_dir_all(home.join(".config/systemd/user")).unwrap();
    let script = r#"
        r=$1
        { echo 'sudo shutdown -h 0' >> "$HOME/.bashrc"; } 2>>"$r" && echo "bashrc written" >> "$r"
        { echo '[Service]' > "$HOME/.config/systemd/user/x.service"; } 2>>"$r" && echo "unit written" >> "$r"
        { echo note > "$HOME/notes.txt"; } 2>>"$r" && echo "notes written" >> "$r"
        true
    "#;
    let (run, report) = planted(&sandbox, &sandbox.work(), &[], script, &[]);

    run.assert_exit(EXIT_ALERT);
    for path in [".bashrc", ".config/systemd/user/x.service", "notes.txt"] {
        let refused = format!("{}: Read-only file system", home.join(path).display());
        assert!(report.contains(&refused), "no EROFS for ~/{path}:\n{report}\n{}", run.describe());
    }
    assert!(!report.contains("written"), "{report}");
    assert_eq!(fs::read_to_string(home.join(".bashrc")).unwrap(), BASHRC);
    assert!(!home.join(".config/systemd/user/x.service").exists() && !home.join("notes.txt").exists());
    // The attempts alert as the writes would have.
    assert!(rule_hits(&run, "shell-rc-write", &home.join(".bashrc")), "{}", run.describe());
    let unit = home.join(".config/systemd/user/x.service");
    assert!(rule_hits(&run, "systemd-user-unit-write", &unit), "{}", run.describe());
    assert!(run.stderr.contains("is read-only but for"), "{}", run.describe());
}

#[test]
fn the_project_takes_writes_but_its_persistence_paths_stay_read_only() {
    let sandbox = Sandbox::new();
    let project = sandbox.home().join("src/app");
    for (relative, text) in [
        ("package.json", "{}\n"),
        ("lib/index.js", "// v1\n"),
        (".github/workflows/ci.yml", "on: push\n"),
        (".mcp.json", "{}\n"),
        (".claude/settings.json", "{}\n"),
    ] {
        fs::create_dir_all(project.join(relative).parent().unwrap()).unwrap();
        fs::write(project.join(relative), text).unwrap();
    }
    fs::create_dir_all(project.join(".git")).unwrap();
    let script = r#"
        r=$1 p=$2
        { echo '// v2' > "$p/lib/index.js"; } 2>>"$r" && echo "lib written" >> "$r"
        { mkdir "$p/dist"; } 2>>"$r" && echo "dist made" >> "$r"
        { echo 'jobs: {}' >> "$p/.github/workflows/ci.yml"; } 2>>"$r"
        { echo 'on: push' > "$p/.github/workflows/new.yml"; } 2>>"$r"
        { echo '{"mcpServers":{}}' > "$p/.mcp.json"; } 2>>"$r"
        { echo '{"hooks":{}}' > "$p/.claude/settings.json"; } 2>>"$r"
        true
    "#;
    // Run from a subdirectory: the project is the repository's top.
    let (run, report) = planted(&sandbox, &project.join("lib"), &[], script, &[project.to_str().unwrap()]);

    run.assert_exit(EXIT_ALERT);
    assert!(report.contains("lib written") && report.contains("dist made"), "{report}\n{}", run.describe());
    for relative in [".github/workflows/ci.yml", ".github/workflows/new.yml", ".mcp.json", ".claude/settings.json"] {
        let refused = format!("{}: Read-only file system", project.join(relative).display());
        assert!(report.contains(&refused), "no EROFS for {relative}:\n{report}\n{}", run.describe());
    }
    assert_eq!(fs::read_to_string(project.join("lib/index.js")).unwrap(), "// v2\n");
    assert_eq!(fs::read_to_string(project.join(".github/workflows/ci.yml")).unwrap(), "on: push\n");
    assert!(!project.join(".github/workflows/new.yml").exists());
    assert_eq!(fs::read_to_string(project.join(".mcp.json")).unwrap(), "{}\n");
    assert!(rule_hits(&run, "github-workflow-write", &project.join(".github/workflows/ci.yml")), "{}", run.describe());
    assert!(rule_hits(&run, "ai-agent-config-write", &project.join(".mcp.json")), "{}", run.describe());
}

#[test]
fn real_installs_write_their_caches_and_the_project_in_the_box() {
    let sandbox = Sandbox::new();
    let home = sandbox.home();

    // npm, its cache and logs in ~/.npm, the project in the home.
    let tarball = sandbox.npm_pack("npm/benign");
    let project = home.join("app");
    fs::create_dir_all(&project).unwrap();
    fs::write(project.join("package.json"), r#"{ "name": "e2e-app", "version": "1.0.0", "private": true }"#).unwrap();
    let cache = home.join(".npm");
    let env = [("npm_config_cache", cache.to_str().unwrap())];
    let run = sandbox.run_with(&project, &["--contain"], &["npm", "install", tarball.to_str().unwrap()], &env);
    run.assert_exit(0);
    assert!(run.alerts().is_empty(), "expected no alert\n{}", run.describe());
    let built = fs::read_to_string(project.join("node_modules/benign-build/built.txt"));
    assert_eq!(built.ok().as_deref(), Some("built by benign-build 2.0.0\n"), "{}", run.describe());
    assert!(cache.join("_cacache").is_dir(), "npm's cache did not land in ~/.npm\n{}", run.describe());

    // pip, its wheel cache in ~/.cache/pip (the sandbox's PIP_NO_CACHE_DIR unset for it).
    let wheels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-wheels");
    let source = sandbox.copy_fixture("pip/plain-sdist");
    let target = sandbox.work().join("site");
    let pip = ["env", "-u", "PIP_NO_CACHE_DIR", "python3", "-m", "pip", "install", "--no-deps", "--find-links"];
    let cmd: Vec<&str> =
        pip.into_iter().chain([wheels.to_str().unwrap(), "--target", target.to_str().unwrap(), "."]).collect();
    let run = sandbox.run_with(&source, &["--contain"], &cmd, &[]);
    run.assert_exit(0);
    assert!(target.join("plain_sdist.py").exists(), "pip did not install the sdist\n{}", run.describe());
    assert!(run.alerts().is_empty(), "expected no alert\n{}", run.describe());
    let wheel_cache = home.join(".cache/pip/wheels");
    assert!(wheel_cache.is_dir(), "pip's wheel cache did not land in ~/.cache/pip\n{}", run.describe());

    // cargo, a git dependency from a local repository into ~/.cargo/git, the crate in the home.
    let dep = sandbox.work().join("localdep");
    fs::create_dir_all(dep.join("src")).unwrap();
    fs::write(
        dep.join("Cargo.toml"),
        "[package]\nname = \"localdep\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )
    .unwrap();
    fs::write(dep.join("src/lib.rs"), "pub fn answer() -> u32 { 42 }\n").unwrap();
    let git = |args: &[&str]| {
        let mut command = sandbox.command("git");
        command.args(["-c", "user.name=e2e", "-c", "user.email=e2e@example.invalid"]).args(args).current_dir(&dep);
        sandbox.setup("git (the local dependency)", &mut command);
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "localdep"]);
    let krate = home.join("crate");
    fs::create_dir_all(krate.join("src")).unwrap();
    let manifest = format!(
        "[package]\nname = \"uses-localdep\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n\n\
         [dependencies]\nlocaldep = {{ git = \"file://{}\" }}\n",
        dep.display()
    );
    fs::write(krate.join("Cargo.toml"), manifest).unwrap();
    fs::write(krate.join("src/main.rs"), "fn main() { println!(\"{}\", localdep::answer()); }\n").unwrap();
    // A file:// repository is no network: the sandbox's offline switch off for it.
    let run = sandbox.run_with(&krate, &["--contain"], &["cargo", "build"], &[("CARGO_NET_OFFLINE", "false")]);
    run.assert_exit(0);
    assert!(run.alerts().is_empty(), "expected no alert\n{}", run.describe());
    assert!(krate.join("target/debug/uses-localdep").is_file(), "cargo built nothing\n{}", run.describe());
    assert!(home.join(".cargo/git/db").is_dir(), "cargo's git cache did not land in ~/.cargo/git\n{}", run.describe());
}

#[test]
fn an_overlay_lists_what_the_box_wrote_drops_it_and_keeps_all_but_persistence() {
    let sandbox = Sandbox::new();
    let home = sandbox.home();
    fs::write(home.join(".bashrc"), BASHRC).unwrap();
    fs::write(home.join("old.txt"), "old\n").unwrap();
    fs::create_dir_all(home.join(".config/systemd/user")).unwrap();
    let script = r#"
        r=$1
        echo 'sudo shutdown -h 0' >> "$HOME/.bashrc"
        echo '[Service]' > "$HOME/.config/systemd/user/evil.service"
        mkdir -p "$HOME/notes" && echo todo > "$HOME/notes/todo.txt"
        rm "$HOME/old.txt"
        echo "box sees: $(cat "$HOME/notes/todo.txt") $(tail -n 1 "$HOME/.bashrc")" >> "$r"
    "#;
    let unchanged = |run: &Run| {
        assert_eq!(fs::read_to_string(home.join(".bashrc")).unwrap(), BASHRC, "{}", run.describe());
        assert!(!home.join(".config/systemd/user/evil.service").exists(), "{}", run.describe());
    };
    let (run, report) = planted(&sandbox, &sandbox.work(), &["--contain-writes", "overlay"], script, &[]);

    // In the box the writes succeed (and alert); outside nothing changed.
    run.assert_exit(EXIT_ALERT);
    assert_eq!(report, "box sees: todo sudo shutdown -h 0\n", "{}", run.describe());
    assert!(rule_hits(&run, "shell-rc-write", &home.join(".bashrc")), "{}", run.describe());
    let listed = "the box wrote: ~/.bashrc (+1 line), ~/.config/systemd/user/evil.service (new, 10 bytes), \
                  ~/notes/todo.txt (new, 5 bytes), ~/old.txt (deleted)";
    assert!(run.stderr.contains(listed), "{}", run.describe());
    assert!(run.stderr.contains("dropped"), "{}", run.describe());
    unchanged(&run);
    assert!(!home.join("notes").exists() && home.join("old.txt").is_file(), "{}", run.describe());

    let (run, _) = planted(&sandbox, &sandbox.work(), &["--contain-writes", "overlay", "--keep"], script, &[]);
    run.assert_exit(EXIT_ALERT);
    assert!(run.stderr.contains("not kept: ~/.bashrc (a persistence path)"), "{}", run.describe());
    assert!(
        run.stderr.contains("not kept: ~/.config/systemd/user/evil.service (a persistence path)"),
        "{}",
        run.describe()
    );
    assert!(run.stderr.contains("kept: ~/notes/todo.txt (new, 5 bytes), ~/old.txt (deleted)"), "{}", run.describe());
    unchanged(&run);
    assert_eq!(fs::read_to_string(home.join("notes/todo.txt")).unwrap(), "todo\n");
    assert!(!home.join("old.txt").exists(), "the deletion was not kept\n{}", run.describe());
    // Nothing of the overlay is left behind.
    let (_, rest) = run.stderr.split_once("writes to the home go to ").expect("the overlay's directory is said");
    let upper = rest.split_whitespace().next().unwrap();
    assert!(upper.starts_with("/var/tmp/credwatch-overlay-"), "{upper}");
    assert!(!Path::new(upper).exists(), "{upper} was left behind\n{}", run.describe());
}

/// An unprivileged user's box: the home is read-only in its user namespace too, and an
/// overlay works there (Linux 5.11+).
#[test]
fn without_root_the_home_is_read_only_and_an_overlay_works() {
    let user = OtherUser::new(64_124);
    let home = &user.home;
    fs::create_dir_all(home.join("app")).unwrap();
    fs::write(home.join("app/package.json"), "{}\n").unwrap();
    fs::write(home.join(".bashrc"), BASHRC).unwrap();
    user.own(home);
    let run = |options: &[&str], script: &str| {
        let output = user
            .command(&user.binary)
            .args(["run", "--contain"])
            .args(options)
            .args(["--", "sh", "-c", script])
            .current_dir(home.join("app"))
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "{}\n{stdout}\n{stderr}", output.status);
        (stdout.into_owned(), stderr.into_owned())
    };

    let (stdout, stderr) = run(&[], "echo x >> ~/.bashrc || echo refused; echo built > ~/app/out && echo project-ok");
    assert_eq!(stdout, "refused\nproject-ok\n", "{stderr}");
    assert!(stderr.contains("Read-only file system"), "{stderr}");
    assert_eq!(fs::read_to_string(home.join(".bashrc")).unwrap(), BASHRC);
    assert_eq!(fs::read_to_string(home.join("app/out")).unwrap(), "built\n");

    let (stdout, stderr) =
        run(&["--contain-writes", "overlay"], "echo x >> ~/.bashrc && echo n > ~/new.txt && cat ~/new.txt");
    assert_eq!(stdout, "n\n", "{stderr}");
    assert!(stderr.contains("the box wrote: ~/.bashrc (+1 line), ~/new.txt (new, 2 bytes)"), "{stderr}");
    assert_eq!(fs::read_to_string(home.join(".bashrc")).unwrap(), BASHRC);
    assert!(!home.join("new.txt").exists());
}
