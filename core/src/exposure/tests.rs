//! Every test works in its own temporary home (never the real one), with fake credentials.

use std::{
    ffi::OsStr,
    fs,
    os::unix::{
        ffi::OsStrExt as _,
        fs::{chown, symlink, PermissionsExt as _},
    },
    path::Path,
    time::{Duration, SystemTime},
};

use super::*;

const DAY: u64 = 86_400;

/// 2025-01-01T00:00:00Z: files are made this many days before it.
fn base() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_735_689_600)
}

/// An hour after [`base`]: ages in whole days are exact.
fn now() -> SystemTime {
    base() + Duration::from_secs(3_600)
}

/// The uid and gid that own the test's files: 4242 when the tests run as root (which chowns
/// them), else the user running them, so that "the owner" is never root.
fn owner() -> (u32, u32) {
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 {
        (4242, 4242)
    } else {
        (uid, gid)
    }
}

fn put(path: &Path, text: &str, age_days: u64, mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
    let file = fs::File::options().write(true).open(path).unwrap();
    file.set_modified(base() - Duration::from_secs(age_days * DAY)).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Hands `dir` and everything in it to [`owner`], with directories open to search (0755)
/// unless made otherwise later.
fn own(dir: &Path) {
    let (uid, gid) = owner();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        chown(&path, Some(uid), Some(gid)).unwrap();
        if fs::symlink_metadata(&path).unwrap().is_dir() {
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
            stack.extend(fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
}

fn alice() -> Identity {
    let (uid, gid) = owner();
    Identity { name: Some("alice".into()), uid, gids: vec![gid] }
}

fn stranger() -> Identity {
    let identity = Identity { name: Some("mallory".into()), uid: 4343, gids: vec![4343] };
    assert_ne!(identity.uid, owner().0);
    identity
}

fn rules() -> RuleSet {
    RuleSet::defaults().unwrap()
}

fn scan_home(home: &Path, who: &Identity, limits: Limits) -> Exposure {
    scan(&rules(), who, &Scope { home: home.to_path_buf(), system_root: None, other_homes: Vec::new() }, limits, now())
}

fn file<'a>(exposure: &'a Exposure, suffix: &str) -> Option<&'a FileExposure> {
    exposure.categories.iter().flat_map(|c| &c.files).find(|f| f.path.ends_with(suffix))
}

fn category<'a>(exposure: &'a Exposure, name: &str) -> &'a Category {
    exposure.categories.iter().find(|c| c.category == name).unwrap_or_else(|| panic!("no {name}: {exposure:#?}"))
}

fn rotate_of(id: &str) -> Vec<String> {
    rules().rules().iter().find(|r| r.id == id).unwrap().rotate.clone()
}

/// A home with fake credentials of five categories, and look-alikes the catalogue leaves out.
fn fake_home(home: &Path) {
    put(&home.join(".ssh/id_ed25519"), "fake key", 10, 0o600);
    put(&home.join(".ssh/id_ed25519.pub"), "ssh-ed25519 AAAA", 10, 0o644);
    put(&home.join(".ssh/config"), "Host *", 30, 0o644);
    put(&home.join(".aws/credentials"), "[default]\naws_access_key_id = AKIAFAKE", 400, 0o600);
    put(&home.join(".npmrc"), "//registry.npmjs.org/:_authToken=npm_fake", 2, 0o600);
    put(&home.join(".ethereum/keystore/UTC--2024-01-01T00-00-00.0Z--00aa"), "{}", 100, 0o600);
    put(&home.join("src/app/.env"), "API_KEY=fake", 0, 0o644);
    put(&home.join("src/app/.env.example"), "API_KEY=", 0, 0o644);
    put(&home.join("src/app/node_modules/dotenv/.env"), "X=1", 0, 0o644);
    put(&home.join("notes.txt"), "nothing", 0, 0o644);
    own(home);
}

#[test]
fn finds_the_catalogue_in_a_home_grouped_by_category_with_ages_and_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    fake_home(&home);
    let exposure = scan_home(&home, &alice(), Limits::default());

    let names: BTreeSet<&str> = exposure.categories.iter().map(|c| c.category.as_str()).collect();
    assert_eq!(names, BTreeSet::from(["ssh", "cloud", "registry", "wallets", "env-files"]), "{exposure:#?}");
    assert!(exposure.categories.windows(2).all(|w| w[0].severity >= w[1].severity), "worst first");
    assert_eq!(exposure.summary.files, 6);
    assert_eq!((exposure.summary.readable, exposure.summary.root_only, exposure.summary.categories), (6, 0, 5));

    let ssh = category(&exposure, "ssh");
    let paths: Vec<&str> = ssh.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, [home.join(".ssh/config").to_str().unwrap(), home.join(".ssh/id_ed25519").to_str().unwrap()]);
    let key = file(&exposure, "/.ssh/id_ed25519").unwrap();
    assert_eq!(
        (key.rules.as_slice(), key.age_days, key.mode.as_str()),
        (&["ssh-private-keys".to_owned()][..], 10, "0600")
    );
    assert_eq!(key.modified, "2024-12-22T00:00:00Z");
    assert!(key.readable);
    assert_eq!(ssh.rotate, rotate_of("ssh-private-keys"), "both ssh rules give the same advice, once");

    let aws = file(&exposure, "/.aws/credentials").unwrap();
    assert_eq!((aws.age_days, aws.size), (400, 38));
    assert_eq!(category(&exposure, "cloud").rotate, rotate_of("aws-credentials"));
    assert_eq!(file(&exposure, "/.npmrc").unwrap().rules, ["npm-registry-token"]);
    assert_eq!(file(&exposure, "--00aa").unwrap().age_days, 100);
    assert_eq!(category(&exposure, "env-files").files.len(), 1, "not .env.example, not in node_modules");
    assert!(file(&exposure, ".pub").is_none() && file(&exposure, "notes.txt").is_none());

    let markdown = exposure.to_markdown();
    assert!(markdown.contains("## `ssh` (critical): 2 files\n"), "{markdown}");
    let shown = format!("- `{}`: 400 days old, readable, `aws-credentials` (mode 0600, owner ", aws.path);
    assert!(markdown.contains(&shown), "{markdown}");
    assert!(markdown.contains(&format!("- [ ] {}\n", rotate_of("aws-credentials")[0])), "{markdown}");
    assert!(markdown.contains("6 credential files in 5 categories"), "{markdown}");
    assert!(markdown.contains("## Containment\n\nRun installs under `credwatch run --contain -- "), "{markdown}");
    let containment = &exposure.containment;
    assert!(containment.ends_with("move keys out of files: SSH keys into ssh-agent or a hardware key, cloud keys into short-lived SSO sessions, registry tokens into short-lived, scoped CI tokens, `.env` secrets into a secret manager."), "{containment}");

    let json = serde_json::to_value(&exposure).unwrap();
    let first = &json["categories"][0]["files"][0];
    for key in ["path", "rules", "severity", "modified", "age_days", "readable", "uid", "gid", "mode", "size"] {
        assert!(first.get(key).is_some(), "no {key} in {first}");
    }
    assert_eq!(json["summary"]["files"], 6);
    assert_eq!(json["system_paths"], false);
}

#[test]
fn readable_follows_owner_group_and_other_bits_and_every_directory_above() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    put(&home.join(".aws/credentials"), "k", 1, 0o600);
    put(&home.join(".npmrc"), "t", 1, 0o640);
    put(&home.join(".pypirc"), "t", 1, 0o000);
    put(&home.join(".git-credentials"), "t", 1, 0o644);
    put(&home.join(".ssh/id_rsa"), "k", 1, 0o644);
    own(dir.path());
    fs::set_permissions(home.join(".ssh"), fs::Permissions::from_mode(0o700)).unwrap();
    let readable = |who: &Identity| -> BTreeMap<String, bool> {
        let exposure = scan_home(&home, who, Limits::default());
        assert_eq!(exposure.summary.files, 5, "{exposure:#?}");
        assert_eq!(exposure.summary.readable + exposure.summary.root_only, 5);
        let name = |f: &FileExposure| f.path.rsplit('/').next().unwrap().to_owned();
        exposure.categories.iter().flat_map(|c| &c.files).map(|f| (name(f), f.readable)).collect()
    };
    let expect = |pairs: &[(&str, bool)]| -> BTreeMap<String, bool> {
        pairs.iter().map(|(n, r)| ((*n).to_owned(), *r)).collect()
    };
    assert_eq!(
        readable(&alice()),
        expect(&[
            ("credentials", true),
            (".npmrc", true),
            (".pypirc", false),
            (".git-credentials", true),
            ("id_rsa", true)
        ])
    );
    // Not the owner, not in the group: the other bits, and no search permission on ~/.ssh.
    assert_eq!(
        readable(&stranger()),
        expect(&[
            ("credentials", false),
            (".npmrc", false),
            (".pypirc", false),
            (".git-credentials", true),
            ("id_rsa", false)
        ])
    );
    // In the file's group: the group bits.
    let member = Identity { gids: vec![4343, owner().1], ..stranger() };
    let as_member = readable(&member);
    assert!(as_member[".npmrc"] && !as_member["credentials"], "{as_member:?}");
    // Root reads everything, and the output says so.
    let root = Identity { name: Some("root".into()), uid: 0, gids: vec![0] };
    assert!(readable(&root).values().all(|r| *r));
    let exposure = scan_home(&home, &root, Limits::default());
    assert!(exposure.root && exposure.to_markdown().contains("root reads every file"));
    let exposure = scan_home(&home, &stranger(), Limits::default());
    let markdown = exposure.to_markdown();
    assert!(markdown.contains("1 readable by `mallory`, 4 only by package code run as root"), "{markdown}");
    assert!(markdown.contains("1 day old, root only, `pypi-token` (mode 0000, owner "), "{markdown}");
}

#[test]
fn odd_bytes_in_paths_are_escaped_in_both_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let key = home.join(".ssh").join(OsStr::from_bytes(b"id_\xff\x1b[2J`x"));
    put(&key, "k", 3, 0o600);
    put(&home.join("a\nb\\c/.env"), "K=v", 3, 0o600);
    own(dir.path());
    let exposure = scan_home(&home, &alice(), Limits::default());
    assert_eq!(exposure.summary.files, 2, "{exposure:#?}");
    let key = file(&exposure, "x").unwrap();
    assert!(key.path.ends_with("/.ssh/id_\\xff\\u{1b}[2J`x"), "{}", key.path);
    let env = file(&exposure, "/.env").unwrap();
    assert!(env.path.ends_with("/a\\nb\\\\c/.env"), "{}", env.path);
    let markdown = exposure.to_markdown();
    assert!(!markdown.contains('\x1b') && !markdown.contains("a\nb"), "{markdown}");
    assert!(markdown.contains("/.ssh/id_\\xff\\u{1b}[2J'x`: 3 days old"), "a backtick cannot end the span: {markdown}");
    let json = serde_json::to_string(&exposure).unwrap();
    assert!(!json.contains("\\u001b") && json.contains(r"id_\\xff\\u{1b}[2J"), "{json}");
}

#[test]
fn bounds_cut_the_walk_and_say_so_and_links_to_directories_are_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    put(&home.join("a/b/c/.env"), "K=v", 1, 0o600);
    put(&home.join("a/.env"), "K=v", 1, 0o600);
    put(&dir.path().join("outside/project/.env"), "K=v", 1, 0o600);
    put(&dir.path().join("outside/aws-credentials"), "k", 5, 0o600);
    symlink(dir.path().join("outside/project"), home.join("linked")).unwrap();
    fs::create_dir_all(home.join(".aws")).unwrap();
    symlink(dir.path().join("outside/aws-credentials"), home.join(".aws/credentials")).unwrap();
    own(dir.path());

    let exposure = scan_home(&home, &alice(), Limits { max_depth: 2, ..Limits::default() });
    let envs: Vec<&str> = category(&exposure, "env-files").files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(envs, [home.join("a/.env").to_str().unwrap()], "not c/.env (too deep), not linked/.env");
    assert_eq!(exposure.walk.too_deep, 1);
    assert_eq!(exposure.walk.too_deep_examples, [home.join("a/b/c").to_str().unwrap()]);
    assert!(!exposure.walk.truncated);
    let aws = file(&exposure, "/.aws/credentials").unwrap();
    assert_eq!(aws.symlink_to.as_deref(), dir.path().join("outside/aws-credentials").to_str());
    assert_eq!(aws.age_days, 5, "the age of the file it points to");
    assert!(aws.readable);
    // Readable by all, through the link...
    fs::set_permissions(dir.path().join("outside/aws-credentials"), fs::Permissions::from_mode(0o644)).unwrap();
    let open = scan_home(&home, &stranger(), Limits { max_depth: 2, ..Limits::default() });
    assert!(file(&open, "/.aws/credentials").unwrap().readable);
    // ...until it lies in a directory the stranger cannot search.
    fs::set_permissions(dir.path().join("outside"), fs::Permissions::from_mode(0o700)).unwrap();
    let hidden = scan_home(&home, &stranger(), Limits { max_depth: 2, ..Limits::default() });
    assert!(!file(&hidden, "/.aws/credentials").unwrap().readable);
    fs::set_permissions(dir.path().join("outside"), fs::Permissions::from_mode(0o755)).unwrap();
    let markdown = exposure.to_markdown();
    assert!(markdown.contains("- **Cut:** 1 directory deeper than 2 levels not entered, e.g. `"), "{markdown}");
    assert!(markdown.contains("`node_modules`"), "{markdown}");

    let exposure = scan_home(&home, &alice(), Limits { max_entries: 3, ..Limits::default() });
    assert!(exposure.walk.truncated && exposure.walk.entries == 3, "{:?}", exposure.walk);
    assert!(exposure.to_markdown().contains("the walk stopped after 3 entries"));

    let exposure = scan_home(&home, &alice(), Limits::default());
    assert_eq!(category(&exposure, "env-files").files.len(), 2);
    assert!(!exposure.to_markdown().contains("**Cut:**"));
}

#[test]
fn a_user_scope_checks_system_paths_under_the_system_root() {
    let dir = tempfile::tempdir().unwrap();
    let (home, root) = (dir.path().join("home"), dir.path().join("root"));
    put(&home.join(".vault-token"), "s.fake", 7, 0o600);
    put(&root.join("etc/shadow"), "root:*:1::::::", 50, 0o640);
    put(&root.join("etc/ssl/private/site.key"), "k", 20, 0o600);
    put(&root.join("etc/ssl/certs/site.pem"), "c", 20, 0o644);
    own(dir.path());
    let scope = Scope { home: home.clone(), system_root: Some(root.clone()), other_homes: Vec::new() };
    let exposure = scan(&rules(), &alice(), &scope, Limits::default(), now());
    assert_eq!(exposure.summary.files, 3, "{exposure:#?}");
    let shadow = file(&exposure, "/etc/shadow").unwrap();
    assert_eq!((shadow.rules.as_slice(), shadow.age_days), (&["shadow-passwords".to_owned()][..], 50));
    assert_eq!(category(&exposure, "system").rotate, rotate_of("shadow-passwords"));
    assert_eq!(category(&exposure, "tls").files[0].rules, ["tls-private-keys"]);
    assert!(exposure.system_paths);
    let not_searched = exposure.walk.not_searched.join("\n");
    assert!(not_searched.contains("proc-environ-mem: process memory"), "{not_searched}");
    assert!(not_searched.contains("under the home only"), "{not_searched}");
    assert!(!exposure.containment.contains("move keys"), "no category it advises on: {}", exposure.containment);
    let empty = scan_home(&dir.path().join("none"), &alice(), Limits::default());
    assert_eq!(empty.containment, "Nothing to contain: no file of the catalogue was found.");
    let stranger = scan(&rules(), &stranger(), &scope, Limits::default(), now());
    assert_eq!((stranger.summary.readable, stranger.summary.root_only), (0, 3));
    // A home alone: system paths are not looked at, and it says so.
    let alone = scan_home(&home, &alice(), Limits::default());
    assert!(file(&alone, "/etc/shadow").is_none());
    assert!(alone
        .walk
        .not_searched
        .iter()
        .any(|n| n.ends_with("patterns of system paths (`/etc/shadow`, ...): not looked for with a home alone")));
    assert!(!alone.walk.not_searched.iter().any(|n| n.contains("/proc")));
}

#[test]
fn other_homes_show_what_the_user_can_read_there() {
    let dir = tempfile::tempdir().unwrap();
    let (mine, bob, inside) = (dir.path().join("mallory"), dir.path().join("bob"), dir.path().join("mallory/sub"));
    put(&mine.join(".npmrc"), "t", 1, 0o644);
    put(&bob.join(".git-credentials"), "https://bob:tok@example.com", 4, 0o644);
    put(&bob.join(".aws/credentials"), "k", 4, 0o600);
    put(&bob.join("src/app/.env"), "K=v", 4, 0o644);
    put(&dir.path().join("mallory/sub/.netrc"), "machine x password y", 4, 0o644);
    own(dir.path());
    let scope = Scope { home: mine.clone(), system_root: None, other_homes: vec![bob.clone(), inside, mine] };
    let exposure = scan(&rules(), &stranger(), &scope, Limits::default(), now());
    let paths: BTreeSet<&str> = exposure.categories.iter().flat_map(|c| &c.files).map(|f| f.path.as_str()).collect();
    // A home inside the user's has its own `~/` files; the same home given twice counts once.
    let expected =
        [dir.path().join("mallory/.npmrc"), dir.path().join("mallory/sub/.netrc"), bob.join(".git-credentials")];
    assert_eq!(paths, expected.iter().map(|p| p.to_str().unwrap()).collect(), "{exposure:#?}");
    assert_eq!((exposure.walk.other_homes, exposure.walk.other_homes_not_readable), (2, 1));
    let markdown = exposure.to_markdown();
    assert!(markdown.contains("and 2 other users' homes (their files `mallory` can read)"), "{markdown}");
    assert!(
        markdown.contains("- 1 file of the catalogue in other users' homes that `mallory` cannot read"),
        "{markdown}"
    );
    // Root reads them all.
    let root = Identity { name: None, uid: 0, gids: vec![0] };
    assert_eq!(scan(&rules(), &root, &scope, Limits::default(), now()).summary.files, 4);
}

/// A home with the session stores of a messenger, a browser flavour and an AI tool, among the
/// rest of their profiles (history, extension code, caches, Telegram's media): each store is
/// listed under its category with its rules' advice, the rest is not, and `run --contain`
/// (the same list) would hide the stores alone.
#[test]
fn messaging_browser_and_ai_tool_stores_are_listed_under_their_categories_and_the_rest_of_a_profile_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let discord = home.join(".config/discord/Local Storage/leveldb/000005.ldb");
    let tdata = home.join(".local/share/TelegramDesktop/tdata/key_datas");
    let cookies = home.join(".config/BraveSoftware/Brave-Browser/Profile 1/Cookies");
    let opencode = home.join(".local/share/opencode/auth.json");
    for store in [&discord, &tdata, &cookies, &opencode] {
        put(store, "fake session", 3, 0o600);
    }
    let brave = home.join(".config/BraveSoftware/Brave-Browser");
    put(&brave.join("Profile 1/History"), "h", 3, 0o600);
    put(&brave.join("Profile 1/Preferences"), "{}", 3, 0o600);
    put(&home.join(".config/discord/settings.json"), "{}", 3, 0o644);
    put(&home.join(".config/opencode/opencode.json"), "{}", 3, 0o644);
    // What makes a used profile big: extension code, service workers, Telegram's media cache.
    for n in 0..300 {
        put(&brave.join(format!("Profile 1/Extensions/ext{}/1.0/file{n}.js", n % 7)), "js", 3, 0o644);
        put(&brave.join(format!("Profile 1/Service Worker/CacheStorage/c{}/{n}", n % 11)), "x", 3, 0o600);
        put(&home.join(format!(".local/share/TelegramDesktop/tdata/user_data/cache/0/{n}")), "m", 3, 0o600);
    }
    own(&home);

    let exposure = scan_home(&home, &alice(), Limits::default());
    let listed: BTreeSet<&str> = exposure.categories.iter().flat_map(|c| &c.files).map(|f| f.path.as_str()).collect();
    let stores: BTreeSet<&str> = [&discord, &tdata, &cookies, &opencode].iter().map(|p| p.to_str().unwrap()).collect();
    assert_eq!(listed, stores, "the stores, nothing else of the profiles: {exposure:#?}");
    for (suffix, category_name, rule) in [
        ("/leveldb/000005.ldb", "messaging", "discord-tokens"),
        ("/tdata/key_datas", "messaging", "telegram-desktop-session"),
        ("/Profile 1/Cookies", "browsers", "browser-profiles"),
        ("/opencode/auth.json", "ai-tools", "ai-agent-credentials"),
    ] {
        let found = file(&exposure, suffix).unwrap_or_else(|| panic!("{suffix}: {exposure:#?}"));
        assert_eq!(found.rules, [rule], "{suffix}");
        let listed_in = category(&exposure, category_name);
        assert!(listed_in.files.iter().any(|f| f.path.ends_with(suffix)), "{suffix} under {category_name}");
        assert!(listed_in.rotate.contains(&rotate_of(rule)[0]), "{rule}'s advice under {category_name}");
    }
    assert_eq!(category(&exposure, "messaging").severity, Severity::High);
    let markdown = exposure.to_markdown();
    assert!(markdown.contains("## `messaging` (high): 2 files\n"), "{markdown}");
    assert!(markdown.contains(&format!("- [ ] {}\n", rotate_of("telegram-desktop-session")[0])), "{markdown}");
    assert!(!exposure.walk.truncated && exposure.walk.too_deep == 0, "{:?}", exposure.walk);

    let scope = Scope { home: home.clone(), system_root: None, other_homes: Vec::new() };
    let (hidden, _) = credential_files(&rules(), &alice(), &scope, Limits::default());
    let hidden: BTreeSet<&str> = hidden.iter().map(|f| f.path.to_str().unwrap()).collect();
    assert_eq!(hidden, stores, "run --contain hides the same files");
}

/// A stand-in ssh-agent at `path` holding `keys` keys, for one connection.
fn ssh_agent_stand_in(path: &Path, keys: u8) -> std::thread::JoinHandle<()> {
    use std::io::{Read as _, Write as _};
    let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.read_exact(&mut [0u8; 5]).unwrap();
        stream.write_all(&[0, 0, 0, 5, 12, 0, 0, 0, keys]).unwrap();
    })
}

#[test]
fn doors_are_listed_with_who_can_reach_them_and_what_they_hold() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(OsStr::from_bytes(b"home\x1b[2J"));
    let runtime = dir.path().join("run");
    fs::create_dir_all(home.join(".gnupg")).unwrap();
    fs::create_dir_all(runtime.join("systemd")).unwrap();
    let agent = ssh_agent_stand_in(&dir.path().join("agent.sock"), 1);
    // Listening, never asked (gpg-agent's extra socket has no probe).
    let _extra = std::os::unix::net::UnixListener::bind(home.join(".gnupg/S.gpg-agent.extra")).unwrap();
    own(dir.path());
    fs::set_permissions(home.join(".gnupg/S.gpg-agent.extra"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(dir.path().join("agent.sock"), fs::Permissions::from_mode(0o666)).unwrap();
    let mut exposure = scan_home(&home, &stranger(), Limits::default());
    let scope = DoorScope {
        home: home.clone(),
        uid: stranger().uid,
        runtime_dir: runtime.clone(),
        env: vec![("SSH_AUTH_SOCK".into(), dir.path().join("agent.sock").into())],
        system_root: None,
    };
    exposure.add_doors(&rules(), &scope, true);
    agent.join().unwrap();
    let found: Vec<(&str, &str, bool)> =
        exposure.doors.iter().map(|d| (d.kind.as_str(), d.file_type, d.reachable)).collect();
    // The owner's 0600 socket is not the stranger's to connect to; 0666 is, and 0755 enters.
    assert_eq!(
        found,
        [("ssh-agent", "socket", true), ("gpg-agent", "socket", false), ("systemd-user", "directory", true)],
        "{exposure:#?}"
    );
    assert_eq!(exposure.summary.doors, 3);
    let agent = &exposure.doors[0];
    assert_eq!((agent.from_variable.as_deref(), agent.mode.as_str()), (Some("SSH_AUTH_SOCK"), "0666"));
    assert_eq!(agent.holds, Some(Answer::SshAgent { keys: 1 }));
    assert_eq!(exposure.doors[1].holds, None);
    assert!(exposure.doors[1].path.ends_with("/home\\u{1b}[2J/.gnupg/S.gpg-agent.extra"), "{}", exposure.doors[1].path);

    let markdown = exposure.to_markdown();
    assert!(!markdown.contains('\x1b'), "{markdown}");
    assert!(
        markdown.contains("## Doors: 3 sockets and directories that reach credentials without a file\n"),
        "{markdown}"
    );
    let agent_line = format!(
        "- `{}` (an ssh-agent, `ssh`): socket, mode 0666, owner {}:{}, `mallory` can connect; found through \
         `SSH_AUTH_SOCK`: 1 key loaded\n",
        dir.path().join("agent.sock").display(),
        owner().0,
        owner().1
    );
    assert!(markdown.contains(&agent_line), "{markdown}");
    assert!(markdown.contains("/.gnupg/S.gpg-agent.extra` (gpg-agent, `gpg`): socket, mode 0600"), "{markdown}");
    assert!(markdown.contains("`mallory` cannot reach it (root can)\n"), "{markdown}");
    assert!(
        markdown.contains("/run/systemd` (the user's systemd manager, `desktop`): directory, mode 0755"),
        "{markdown}"
    );
    let json = serde_json::to_value(&exposure).unwrap();
    assert_eq!(json["doors"][0]["holds"], serde_json::json!({"answer": "ssh-agent", "keys": 1}));
    assert_eq!(json["doors"][0]["from_variable"], "SSH_AUTH_SOCK");
    assert!(json["doors"][1].get("holds").is_none() && json["doors"][1].get("from_variable").is_none());

    let mut unasked = scan_home(&home, &stranger(), Limits::default());
    unasked.add_doors(&rules(), &scope, false);
    assert!(unasked.doors.iter().all(|d| d.holds.is_none()), "--no-probe connects to none");
    let mut none = scan_home(&home, &stranger(), Limits::default());
    none.add_doors(
        &rules(),
        &DoorScope { home: dir.path().join("empty"), runtime_dir: PathBuf::new(), env: Vec::new(), ..scope },
        true,
    );
    assert!(none.to_markdown().contains("## Doors: 0 sockets and directories that reach credentials without a file\n\nNo door of rules/doors.yaml was found.\n"));
}
