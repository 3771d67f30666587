use std::{
    fs,
    os::unix::{fs::symlink, net::UnixListener},
};

use super::*;
use crate::rules::RulesError;

/// A rule file of one door entry, `body` its keys after `id`.
fn door_file(body: &str) -> String {
    format!("schema: 2\ndoors:\n  - id: demo\n{body}")
}

const DEMO: &str = "    name: a demo socket
    category: demo
    paths: [/run/demo.sock]
    variables: {DEMO_HOST: url}
    samples:
      found: [/run/demo.sock]
      not_found: [/run/demo.pid]
      values:
        - {variable: DEMO_HOST, value: \"unix:///run/demo.sock\", path: /run/demo.sock}
";

fn load(files: &[(&str, &str)]) -> Result<RuleSet, RulesError> {
    RuleSet::from_sources(files.iter().map(|(name, text)| ((*name).to_owned(), (*text).to_owned())))
}

fn error(text: &str) -> String {
    load(&[("d.yaml", text)]).unwrap_err().to_string()
}

#[test]
fn every_default_door_passes_its_samples() {
    let rules = RuleSet::defaults().unwrap();
    let kinds: Vec<&str> = rules.doors().iter().map(|d| d.id.as_str()).collect();
    for kind in ["docker", "podman", "containerd", "buildkit", "ssh-agent", "gpg-agent", "session-bus", "systemd-user"]
    {
        assert!(kinds.contains(&kind), "{kind} not in {kinds:?}");
    }
    for kind in ["x11", "wayland", "kerberos"] {
        assert!(kinds.contains(&kind), "{kind} not in {kinds:?}");
    }
    let failures = sample_failures(&rules);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn door_samples_that_do_not_hold_are_failures() {
    let wrong = DEMO
        .replace("not_found: [/run/demo.pid]", "not_found: [/run/demo.sock]")
        .replace("path: /run/demo.sock}", "path: /run/other.sock}");
    let rules = load(&[("d.yaml", &door_file(&wrong))]).unwrap();
    let failures = sample_failures(&rules);
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(failures[0].contains("\"/run/demo.sock\" finds \"/run/demo.sock\", a `not_found` sample"), "{failures:?}");
    assert!(failures[1].contains("DEMO_HOST=\"unix:///run/demo.sock\" names [\"/run/demo.sock\"]"), "{failures:?}");
}

#[test]
fn bad_door_entries_are_errors_at_their_place() {
    assert!(load(&[("d.yaml", &door_file(DEMO))]).is_ok());
    let cases = [
        (
            DEMO.replace("    category: demo\n", "    category: demo\n    colour: red\n"),
            "d.yaml:6:5: ",
            "unknown field `colour`",
        ),
        (
            DEMO.replace("[/run/demo.sock]\n    var", "[/run/**/demo.sock]\n    var"),
            "d.yaml:6:13: ",
            "`**` would walk whole trees",
        ),
        (
            DEMO.replace("[/run/demo.sock]\n    var", "[run/demo.sock]\n    var"),
            "d.yaml:6:13: ",
            "must be absolute, or start with `~/` or `{runtime}/`",
        ),
        (
            DEMO.replace("[/run/demo.sock]\n    var", "[\"{home}/demo.sock\"]\n    var"),
            "d.yaml:6:13: ",
            "must be absolute",
        ),
        (
            DEMO.replace("[/run/demo.sock]\n    var", "[\"/run/{user}.sock\"]\n    var"),
            "d.yaml:6:13: ",
            "only in the placeholders",
        ),
        (
            DEMO.replace("[/run/demo.sock]\n    var", "[/run/../demo.sock]\n    var"),
            "d.yaml:6:13: ",
            "no empty, `.` or `..` component",
        ),
        (
            DEMO.replace("[/run/demo.sock]\n    var", "[\"/run/demo[.sock\"]\n    var"),
            "d.yaml:6:13: ",
            "bad door path component",
        ),
        (DEMO.replace("{DEMO_HOST: url}", "{DEMO_HOST: tcp}"), "d.yaml:7:28: ", "unknown variant `tcp`"),
        (
            DEMO.replace("{DEMO_HOST: url}", "{DEMO_HOST: url, OTHER: path}"),
            "d.yaml:3:5: ",
            "variable OTHER has no sample",
        ),
        (DEMO.replace("{DEMO_HOST: url}", "{9LIVES: url}"), "d.yaml:3:5: ", "\"9LIVES\" is no variable name"),
        (DEMO.replace("found: [/run/demo.sock]", "found: []"), "d.yaml:3:5: ", "`samples.found` needs a path"),
        (DEMO.replace("      found:", "      probe: ssh-agent\n      found:"), "d.yaml:9:7: ", "unknown field `probe`"),
        (DEMO.replace("    paths: [/run/demo.sock]\n", ""), "d.yaml:3:5: ", "`samples.found` without `paths`"),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .map(|(body, place, needle)| (error(&door_file(body)), place, needle))
        .filter(|(error, place, needle)| !(error.starts_with(*place) && error.contains(*needle)))
        .map(|(error, place, needle)| format!("{place} {needle:?}: {error}"))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let no_paths = DEMO
        .replace("    paths: [/run/demo.sock]\n", "")
        .replace("      found: [/run/demo.sock]\n      not_found: [/run/demo.pid]\n", "");
    assert!(load(&[("d.yaml", &door_file(&no_paths))]).is_ok(), "a door of variables only");
    let nothing = door_file("    name: n\n    category: c\n    samples: {}\n");
    assert!(error(&nothing).contains("door demo: needs `paths` or `variables`"), "{}", error(&nothing));
    // The same id twice in one set; the same variable in two doors.
    let twice = load(&[("a.yaml", &door_file(DEMO)), ("b.yaml", &door_file(DEMO))]).unwrap_err().to_string();
    assert!(twice.starts_with("b.yaml:3:5: duplicate door \"demo\" (first at a.yaml:3:5)"), "{twice}");
    let other = door_file(DEMO).replace("id: demo", "id: demo-two");
    let shared = load(&[("a.yaml", &door_file(DEMO)), ("b.yaml", &other)]).unwrap_err().to_string();
    assert!(shared.starts_with("b.yaml:3:5: door demo-two: variable DEMO_HOST is door demo's already"), "{shared}");
}

#[test]
fn a_directory_of_rules_replaces_a_door_of_the_same_id() {
    let dir = tempfile::tempdir().unwrap();
    let mine = door_file(DEMO).replace("id: demo", "id: docker").replace("DEMO_HOST", "DOCKER_HOST");
    fs::write(dir.path().join("mine.yaml"), mine).unwrap();
    let rules = RuleSet::load(Some(dir.path())).unwrap();
    let docker: Vec<_> = rules.doors().iter().filter(|d| d.id == "docker").collect();
    assert_eq!(docker.len(), 1);
    assert_eq!(docker[0].paths.iter().map(|p| p.text.as_str()).collect::<Vec<_>>(), ["/run/demo.sock"]);
    assert!(rules.doors().iter().any(|d| d.id == "ssh-agent"), "the other defaults stay");
}

/// A listening unix socket at `path` (its parent made), kept open by the returned listener.
fn socket(path: &Path) -> UnixListener {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    UnixListener::bind(path).unwrap()
}

fn touch(path: &Path) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, "").unwrap();
}

struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
    home: PathBuf,
    runtime: PathBuf,
    elsewhere: PathBuf,
}

fn tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let tree = Tree {
        root: base.join("root"),
        home: base.join("home"),
        runtime: base.join("run-user"),
        elsewhere: base.join("elsewhere"),
        _dir: dir,
    };
    for dir in [&tree.root, &tree.home, &tree.runtime, &tree.elsewhere] {
        fs::create_dir_all(dir).unwrap();
    }
    tree
}

fn scope(tree: &Tree, env: &[(&str, String)]) -> DoorScope {
    DoorScope {
        home: tree.home.clone(),
        uid: 1000,
        runtime_dir: tree.runtime.clone(),
        env: env.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect(),
        system_root: Some(tree.root.clone()),
    }
}

#[test]
fn find_lists_what_exists_once_by_resolved_path() {
    let tree = tree();
    let (root, home, runtime) = (&tree.root, &tree.home, &tree.runtime);
    let mut listeners = vec![
        socket(&root.join("run/docker.sock")),
        socket(&root.join("tmp/ssh-XXXXabcd/agent.4242")),
        socket(&home.join(".gnupg/S.gpg-agent")),
        socket(&home.join(".gnupg/S.gpg-agent.ssh")),
        socket(&runtime.join("bus")),
        socket(&runtime.join("gnupg/S.gpg-agent")),
        socket(&tree.elsewhere.join("agent.sock")),
    ];
    // /var/run is /run (a relative link, as Debian has it): one door.
    fs::create_dir_all(root.join("var")).unwrap();
    symlink("../run", root.join("var/run")).unwrap();
    touch(&root.join("run/docker.pid"));
    touch(&root.join("tmp/krb5cc_1000"));
    fs::create_dir_all(root.join("tmp/.X11-unix")).unwrap();
    fs::create_dir_all(root.join("tmp/ssh-dir/agent.1")).unwrap();
    fs::create_dir_all(runtime.join("systemd")).unwrap();
    listeners.push(socket(&runtime.join("systemd/private")));
    let env = [
        ("SSH_AUTH_SOCK", tree.elsewhere.join("agent.sock").display().to_string()),
        ("DOCKER_HOST", format!("unix://{}/run/docker.sock", root.display())),
        ("DBUS_SESSION_BUS_ADDRESS", format!("unix:path={}/bus,guid=00ff", runtime.display())),
        ("DISPLAY", "remote:10.0".into()),
        ("KRB5CCNAME", "KEYRING:persistent:1000".into()),
    ];
    let doors = find(&RuleSet::defaults().unwrap(), &scope(&tree, &env));
    let seen: Vec<(String, &str, bool, Option<&str>)> = doors
        .iter()
        .map(|d| {
            let shown = d.path.display().to_string().replace(&tree.root.display().to_string(), "ROOT");
            let shown = shown.replace(&tree.home.display().to_string(), "HOME");
            let shown = shown.replace(&tree.runtime.display().to_string(), "RUNTIME");
            let shown = shown.replace(&tree.elsewhere.display().to_string(), "ELSEWHERE");
            (shown, d.kind.as_str(), d.directory, d.from_variable.as_deref())
        })
        .collect();
    let want: Vec<(String, &str, bool, Option<&str>)> = vec![
        ("ELSEWHERE/agent.sock".into(), "ssh-agent", false, Some("SSH_AUTH_SOCK")),
        ("HOME/.gnupg/S.gpg-agent".into(), "gpg-agent", false, None),
        ("HOME/.gnupg/S.gpg-agent.ssh".into(), "gpg-agent", false, None),
        ("ROOT/run/docker.sock".into(), "docker", false, Some("DOCKER_HOST")),
        ("ROOT/tmp/.X11-unix".into(), "x11", true, None),
        ("ROOT/tmp/krb5cc_1000".into(), "kerberos", false, None),
        ("ROOT/tmp/ssh-XXXXabcd/agent.4242".into(), "ssh-agent", false, None),
        ("RUNTIME/bus".into(), "session-bus", false, Some("DBUS_SESSION_BUS_ADDRESS")),
        // Its S.gpg-agent is shut with it: not a door of its own.
        ("RUNTIME/gnupg".into(), "gpg-agent", true, None),
        ("RUNTIME/systemd".into(), "systemd-user", true, None),
    ];
    assert_eq!(seen, want, "{doors:#?}");
    assert!(doors.windows(2).all(|pair| pair[0].path < pair[1].path), "sorted");
    let docker = doors.iter().find(|d| d.kind == "docker").unwrap();
    assert_eq!(
        (docker.name.as_str(), docker.category.as_str(), docker.probe),
        ("the docker socket", "containers", Some(Probe::HttpPing))
    );
    drop(listeners);
}

#[test]
fn without_a_system_root_only_the_home_the_runtime_directory_and_variables() {
    let tree = tree();
    let _docker = socket(&tree.root.join("run/docker.sock"));
    let _gpg = socket(&tree.home.join(".gnupg/S.gpg-agent"));
    let _bus = socket(&tree.runtime.join("bus"));
    let mut scope = scope(&tree, &[]);
    scope.system_root = None;
    let doors = find(&RuleSet::defaults().unwrap(), &scope);
    let kinds: Vec<&str> = doors.iter().map(|d| d.kind.as_str()).collect();
    assert_eq!(kinds, ["gpg-agent", "session-bus"]);
}

#[test]
fn globs_are_bounded_and_say_where_they_were_cut() {
    let tree = tree();
    for n in 0..MAX_MATCHES_PER_PATH + 6 {
        touch(&tree.root.join(format!("tmp/krb5cc_{n:03}")));
    }
    let found = search(&RuleSet::defaults().unwrap(), &scope(&tree, &[]));
    assert_eq!(found.doors.len(), MAX_MATCHES_PER_PATH);
    assert_eq!(found.doors[0].path, tree.root.join("tmp/krb5cc_000"), "the first ones by name");
    assert_eq!(
        found.cut,
        [format!("/tmp/krb5cc_*: {} matches, the first {MAX_MATCHES_PER_PATH} kept", MAX_MATCHES_PER_PATH + 6)]
    );
}

#[test]
fn an_unlistable_directory_is_reported_not_fatal() {
    use std::os::unix::fs::PermissionsExt as _;
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        // Root lists any directory: the permission check cannot fail for it. The walk's own
        // code path is the same read_dir error as for a vanished directory, covered below.
        let tree = tree();
        let found = search(&RuleSet::defaults().unwrap(), &scope(&tree, &[]));
        assert!(found.unlisted.is_empty() && found.doors.is_empty());
        return;
    }
    let tree = tree();
    touch(&tree.root.join("tmp/ssh-locked/agent.1"));
    fs::set_permissions(tree.root.join("tmp/ssh-locked"), fs::Permissions::from_mode(0o000)).unwrap();
    let found = search(&RuleSet::defaults().unwrap(), &scope(&tree, &[]));
    fs::set_permissions(tree.root.join("tmp/ssh-locked"), fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(found.unlisted, [tree.root.join("tmp/ssh-locked")]);
}

#[test]
fn values_name_paths_in_each_form() {
    let runtime = Path::new("/run/user/1000");
    let paths = |form, value: &str| -> Vec<String> {
        value_paths(form, OsStr::new(value), runtime).iter().map(|p| p.display().to_string()).collect()
    };
    assert_eq!(paths(ValueForm::Path, "/tmp/a"), ["/tmp/a"]);
    assert!(paths(ValueForm::Path, "").is_empty());
    assert!(paths(ValueForm::Url, "npipe:////./pipe/docker_engine").is_empty());
    assert_eq!(paths(ValueForm::Url, "unix:///x.sock"), ["/x.sock"]);
    assert!(paths(ValueForm::Url, "unix://relative.sock").is_empty());
    assert_eq!(
        paths(ValueForm::DbusAddress, "unix:abstract=/tmp/x;unix:path=/run/bus%2c1,guid=1;tcp:host=h,port=1"),
        ["/run/bus,1"]
    );
    assert_eq!(paths(ValueForm::DbusAddress, "unix:path=/a%zz"), ["/a%zz"], "a bad escape is kept as it is");
    assert_eq!(paths(ValueForm::X11Display, ":12.1"), ["/tmp/.X11-unix/X12"]);
    assert!(paths(ValueForm::X11Display, ":").is_empty());
    assert!(paths(ValueForm::X11Display, "0").is_empty());
    assert_eq!(
        paths(ValueForm::X11Display, "/private/tmp/com.apple.launchd.x/org.xquartz:0"),
        ["/private/tmp/com.apple.launchd.x/org.xquartz"]
    );
    assert_eq!(paths(ValueForm::GpgAgentInfo, "/g/S.gpg-agent"), ["/g/S.gpg-agent"]);
    assert_eq!(paths(ValueForm::GnupgHome, "/ci/gnupg").len(), GNUPG_SOCKETS.len());
    assert!(paths(ValueForm::GnupgHome, "gnupg").is_empty());
    assert!(paths(ValueForm::Krb5Cache, "MEMORY:x").is_empty());
    let long = format!("/{}", "a".repeat(MAX_VALUE_BYTES));
    assert!(paths(ValueForm::Path, &long).is_empty(), "a value longer than any path names none");
    let odd = OsStr::from_bytes(b"unix:///tmp/\xff.sock");
    assert_eq!(value_paths(ValueForm::Url, odd, runtime), [PathBuf::from(OsStr::from_bytes(b"/tmp/\xff.sock"))]);
}

#[test]
fn withheld_are_the_doors_variables_and_any_that_names_a_door() {
    let tree = tree();
    let _docker = socket(&tree.root.join("run/docker.sock"));
    fs::create_dir_all(tree.root.join("var")).unwrap();
    symlink("../run", tree.root.join("var/run")).unwrap();
    fs::create_dir_all(tree.runtime.join("gnupg")).unwrap();
    let rules = RuleSet::defaults().unwrap();
    let doors = find(&rules, &scope(&tree, &[]));
    assert_eq!(doors.len(), 2, "{doors:#?}");
    let root = tree.root.display();
    let runtime = tree.runtime.display();
    let env: Vec<(OsString, OsString)> = [
        ("DOCKER_HOST", "tcp://127.0.0.1:2375".to_owned()),
        ("DISPLAY", ":0".into()),
        ("MY_SOCKET", format!("unix://{root}/var/run/docker.sock")),
        ("COMPOSE_SOCK", format!("{root}/run/docker.sock")),
        ("GPG_SOCK", format!("{runtime}/gnupg/S.gpg-agent")),
        ("NOT_DOCKER", format!("{root}/run/docker.sock.d/x")),
        ("NOT_EITHER", format!("/elsewhere{root}/run/docker.sock")),
        ("XDG_RUNTIME_DIR", runtime.to_string()),
        ("HOME", tree.home.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (OsString::from(k), OsString::from(v)))
    .chain([(OsString::from("BYTES"), OsString::from_vec(b"\xff\xfe".to_vec()))])
    .collect();
    assert_eq!(
        withheld_variables(&rules, &env, &doors),
        ["COMPOSE_SOCK", "DISPLAY", "DOCKER_HOST", "GPG_SOCK", "MY_SOCKET"]
    );
}

#[test]
fn doors_of_several_searches_are_tidied_as_one() {
    let door = |path: &str, kind: &str, directory: bool, from_variable: Option<&str>| Door {
        path: PathBuf::from(path),
        kind: kind.into(),
        name: kind.into(),
        category: "demo".into(),
        directory,
        from_variable: from_variable.map(str::to_owned),
        probe: None,
    };
    // One user's search found the socket inside the directory another's found whole.
    let merged = tidy(vec![
        door("/run/user/1000/gnupg/S.gpg-agent.ssh", "ssh-agent", false, Some("SSH_AUTH_SOCK")),
        door("/run/docker.sock", "docker", false, None),
        door("/run/user/1000/gnupg", "gpg-agent", true, None),
        door("/run/docker.sock", "docker", false, Some("DOCKER_HOST")),
        door("/run/user/1000/gnupg-other", "demo", false, None),
    ]);
    let kept: Vec<(&str, Option<&str>)> =
        merged.iter().map(|d| (d.path.to_str().unwrap(), d.from_variable.as_deref())).collect();
    assert_eq!(
        kept,
        [
            ("/run/docker.sock", Some("DOCKER_HOST")),
            ("/run/user/1000/gnupg", None),
            ("/run/user/1000/gnupg-other", None)
        ]
    );
}

#[test]
fn a_gnupghome_elsewhere_leads_to_its_sockets() {
    let tree = tree();
    let gnupg = tree.elsewhere.join("gnupg");
    let _agent = socket(&gnupg.join("S.gpg-agent"));
    touch(&gnupg.join("pubring.kbx"));
    let doors = find(&RuleSet::defaults().unwrap(), &scope(&tree, &[("GNUPGHOME", gnupg.display().to_string())]));
    let found: Vec<(&Path, &str, Option<&str>)> =
        doors.iter().map(|d| (d.path.as_path(), d.kind.as_str(), d.from_variable.as_deref())).collect();
    assert_eq!(found, [(gnupg.join("S.gpg-agent").as_path(), "gpg-agent", Some("GNUPGHOME"))]);
}
