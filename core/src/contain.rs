//! `run --contain`: what a contained command's tree must not see. The catalogue's credential
//! files that exist (found as `credential_files` finds them) become empty files, and secret
//! environment variables are withheld. The agent does the hiding; this module only decides it.
//!
//! Files, not their directories: an open of an empty `~/.ssh/id_ed25519` succeeds and alerts,
//! where one in an emptied `~/.ssh` would fail with ENOENT, which no rule reports (probes of
//! missing paths are everyday noise). `~/.ssh/**` is in the catalogue, so every file there is
//! found and hidden anyway.

pub mod net;

pub mod home;

use std::{ffi::OsStr, os::unix::ffi::OsStrExt as _, path::PathBuf};

use crate::{
    exposure::{self, display_path, Identity, Limits, Scope, Walk},
    rules::{schema::Contain, RuleSet},
};

/// A file replaced in the contained tree: by an empty one, or by a copy of its settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hidden {
    pub path: PathBuf,
    /// A rule of it says `contain: keep-settings`: a copy through [`keep_settings`].
    pub keep_settings: bool,
    /// The category of the most severe rule that made it hidden.
    pub category: String,
    pub rules: Vec<String>,
}

#[derive(Debug)]
pub struct Plan {
    /// Sorted.
    pub hidden: Vec<Hidden>,
    /// Names of the environment variables withheld from the command, sorted.
    pub withheld: Vec<String>,
    /// Of `withheld`, those that name a door ([`Plan::withhold_door_variables`]): the way to a
    /// socket, no registry's secret.
    pub door_variables: Vec<String>,
    pub walk: Walk,
}

/// Name parts (between `_`) of a variable that holds a secret: `GITHUB_TOKEN`, `NPM_TOKEN`,
/// `AWS_SECRET_ACCESS_KEY`, `TWINE_PASSWORD`, `SSH_AUTH_SOCK`, `npm_config__authToken`.
const SECRET_PARTS: &[&str] = &[
    "TOKEN",
    "AUTHTOKEN",
    "SECRET",
    "SECRETS",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "CREDENTIALS",
    "AUTH",
    "APIKEY",
    "PAT",
];
/// Variables that name a secret without those parts.
const SECRET_NAMES: &[&str] = &["XAUTHORITY", "GPG_AGENT_INFO", "DOCKER_AUTH_CONFIG", "VAULT_TOKEN"];

/// Whether a variable of the command's environment is withheld from a contained tree: its name
/// says it holds a secret (a part of [`SECRET_PARTS`], or ending in `_KEY`/`_KEY_ID`, as
/// `OPENAI_API_KEY`, `AWS_ACCESS_KEY_ID`), or its value is a URL with a password in it
/// (`PIP_INDEX_URL=https://user:token@host/simple`). The proxy variables are passed, password
/// or not: without them the manager reaches no registry at all.
pub fn is_secret_variable(name: &OsStr, value: &OsStr) -> bool {
    let name = String::from_utf8_lossy(name.as_bytes()).to_ascii_uppercase();
    if name.ends_with("_PROXY") {
        return false;
    }
    SECRET_NAMES.contains(&name.as_str())
        || name.split('_').any(|part| SECRET_PARTS.contains(&part))
        || name.ends_with("_KEY")
        || name.ends_with("_KEY_ID")
        || url_with_password(&String::from_utf8_lossy(value.as_bytes()))
}

/// Words of a setting's name that hold a secret: npm's `_auth`, `_authToken`, `_password`,
/// `username`, `certfile`, `keyfile`; yarn's `npmAuthToken`, `npmAuthIdent`; bun's `token`.
const SECRET_SETTING_WORDS: &[&str] =
    &["auth", "token", "password", "_pass", "username", "certfile", "keyfile", "secret"];

/// A manager's configuration file without the lines that hold secrets: a line goes when its
/// setting's name (before `=`, else before `:`) has a word of [`SECRET_SETTING_WORDS`], or it
/// holds a URL with a password. The rest stays as it was, so `registry=`, scopes and
/// `legacy-peer-deps=` still apply.
pub fn keep_settings(text: &[u8]) -> Vec<u8> {
    let mut kept = Vec::with_capacity(text.len());
    for line in text.split_inclusive(|&b| b == b'\n') {
        let readable = String::from_utf8_lossy(line);
        let name = readable.split_once('=').or_else(|| readable.split_once(':')).map_or("", |(name, _)| name);
        let name = name.to_ascii_lowercase();
        if SECRET_SETTING_WORDS.iter().any(|word| name.contains(word)) || url_with_password(&readable) {
            continue;
        }
        kept.extend_from_slice(line);
    }
    kept
}

/// `scheme://user:password@host...`: the userinfo holds a colon before the host.
fn url_with_password(value: &str) -> bool {
    let Some((_, rest)) = value.split_once("://") else { return false };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.rsplit_once('@').is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

/// What to hide from a command run by `who`: the files it can read (root: every file found;
/// the others are out of its reach already), and which of `env` to withhold.
pub fn plan<'a>(
    rules: &RuleSet,
    who: &Identity,
    scope: &Scope,
    limits: Limits,
    env: impl IntoIterator<Item = (&'a OsStr, &'a OsStr)>,
) -> Plan {
    let (files, walk) = exposure::credential_files(rules, who, scope, limits);
    let hidden: Vec<Hidden> = (files.into_iter())
        .filter(|file| file.readable)
        .map(|file| Hidden {
            keep_settings: (rules.rules().iter())
                .any(|rule| rule.contain == Contain::KeepSettings && file.rules.contains(&rule.id)),
            path: file.path,
            category: file.category,
            rules: file.rules,
        })
        .collect();
    let mut withheld: Vec<String> = (env.into_iter())
        .filter(|(name, value)| is_secret_variable(name, value))
        .map(|(name, _)| String::from_utf8_lossy(name.as_bytes()).into_owned())
        .collect();
    withheld.sort();
    Plan { hidden, withheld, door_variables: Vec::new(), walk }
}

impl Plan {
    /// The hidden registry credentials and withheld variables a package manager may have
    /// needed to install: said before the command runs, since they are not passed.
    pub fn registry_credentials(&self) -> Vec<String> {
        (self.hidden.iter())
            .filter(|hidden| hidden.category == "registry")
            .map(|hidden| display_path(&hidden.path))
            .chain(
                (self.withheld.iter())
                    .filter(|name| !self.door_variables.contains(name))
                    .map(|name| format!("${}", crate::output::escape(name))),
            )
            .collect()
    }

    /// Withholds the variables that name a door too (`doors::withheld_variables`: `DISPLAY`,
    /// `DBUS_SESSION_BUS_ADDRESS`, `SSH_AUTH_SOCK`, ...).
    pub fn withhold_door_variables(&mut self, names: Vec<String>) {
        self.withheld.extend(names.iter().cloned());
        self.withheld.sort();
        self.withheld.dedup();
        self.door_variables = names;
        self.door_variables.sort();
    }

    /// `ssh 2, cloud 1`: hidden paths per category, most first.
    pub fn categories(&self) -> String {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for hidden in &self.hidden {
            match counts.iter_mut().find(|(category, _)| *category == hidden.category) {
                Some((_, n)) => *n += 1,
                None => counts.push((hidden.category.clone(), 1)),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        counts.iter().map(|(category, n)| format!("{category} {n}")).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use std::{ffi::OsString, fs, os::unix::fs::PermissionsExt as _, path::Path};

    use super::*;

    fn names(pairs: &[(&str, &str)]) -> Vec<String> {
        let pairs: Vec<(OsString, OsString)> = pairs.iter().map(|(n, v)| (n.into(), v.into())).collect();
        pairs.iter().filter(|(n, v)| is_secret_variable(n, v)).map(|(n, _)| n.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn secret_variables_are_told_by_name_or_by_a_password_in_a_url() {
        let withheld = names(&[
            ("GITHUB_TOKEN", "ghs_x"),
            ("NPM_TOKEN", "npm_x"),
            ("npm_config__authToken", "x"),
            ("AWS_ACCESS_KEY_ID", "AKIA"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("OPENAI_API_KEY", "sk-x"),
            ("TWINE_PASSWORD", "x"),
            ("SSH_AUTH_SOCK", "/tmp/ssh-x/agent.1"),
            ("XAUTHORITY", "/home/a/.Xauthority"),
            ("PIP_INDEX_URL", "https://user:tok@pypi.example/simple"),
        ]);
        assert_eq!(withheld.len(), 10, "{withheld:?}");
        let kept = names(&[
            ("PATH", "/usr/bin"),
            ("HOME", "/home/a"),
            ("GIT_AUTHOR_NAME", "Alice"),
            ("KEYBOARD", "us"),
            ("PIP_INDEX_URL", "https://pypi.example/simple"),
            ("npm_config_registry", "https://user@registry.example/"),
            ("TOKENIZERS_PARALLELISM", "false"),
            ("https_proxy", "http://user:pass@proxy.example:3128"),
        ]);
        assert_eq!(kept, Vec::<String>::new());
    }

    #[test]
    fn a_managers_configuration_keeps_its_settings_and_loses_its_secrets() {
        let npmrc = b"registry=https://registry.example/\n//registry.example/:_authToken=npm_FAKE\n\
                      @acme:registry=https://npm.acme.example/\n_auth=FAKE\nlegacy-peer-deps=true\n\
                      proxy=http://u:FAKE@proxy.example:3128/\n//npm.acme.example/:username=alice\n";
        assert_eq!(
            String::from_utf8(keep_settings(npmrc)).unwrap(),
            "registry=https://registry.example/\n@acme:registry=https://npm.acme.example/\nlegacy-peer-deps=true\n"
        );
        let yarnrc = b"npmRegistryServer: \"https://registry.example\"\nnpmScopes:\n  acme:\n    npmAuthToken: FAKE\n    npmRegistryServer: \"https://npm.acme.example\"\n";
        assert!(!String::from_utf8(keep_settings(yarnrc)).unwrap().contains("FAKE"));
        assert!(String::from_utf8(keep_settings(yarnrc))
            .unwrap()
            .contains("npmScopes:\n  acme:\n    npmRegistryServer"));
    }

    #[test]
    fn every_credential_file_is_hidden_and_secret_variables_withheld() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        for (relative, text) in [
            (".npmrc", "//registry.npmjs.org/:_authToken=FAKE\n"),
            (".ssh/id_ed25519", "FAKE"),
            (".ssh/deploy_prod", "FAKE"),
            (".aws/credentials", "FAKE"),
            ("project/package.json", "{}"),
        ] {
            let path = home.join(relative);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, text).unwrap();
        }
        // Out of this user's reach already: not hidden for it, hidden for root.
        let other = home.join(".aws/credentials");
        fs::set_permissions(&other, fs::Permissions::from_mode(0o000)).unwrap();
        let rules = RuleSet::load(None).unwrap();
        let scope = Scope { home: home.clone(), system_root: None, other_homes: Vec::new() };
        let user = Identity { name: None, uid: 4242, gids: vec![4242] };
        let env = [(OsStr::new("NPM_TOKEN"), OsStr::new("npm_FAKE")), (OsStr::new("PATH"), OsStr::new("/bin"))];
        let plan = plan(&rules, &user, &scope, Limits::default(), env);
        let hidden: Vec<PathBuf> = plan.hidden.iter().map(|h| h.path.clone()).collect();
        let kept: Vec<bool> = plan.hidden.iter().map(|h| h.keep_settings).collect();
        assert_eq!(kept, [true, false, false], "~/.npmrc keeps its settings");
        // The test may run as root, which reads a mode 000 file: the user's check is by bits.
        let ssh = home.join(".ssh");
        assert_eq!(hidden, vec![home.join(".npmrc"), ssh.join("deploy_prod"), ssh.join("id_ed25519")]);
        assert_eq!(plan.withheld, vec!["NPM_TOKEN"]);
        assert_eq!(plan.registry_credentials(), vec![display_path(&home.join(".npmrc")), "$NPM_TOKEN".into()]);
        let root = Identity { name: None, uid: 0, gids: vec![0] };
        let plan = super::plan(&rules, &root, &scope, Limits::default(), []);
        let hidden: Vec<&Path> = plan.hidden.iter().map(|h| h.path.as_path()).collect();
        assert_eq!(
            hidden,
            vec![other.as_path(), &home.join(".npmrc"), &ssh.join("deploy_prod"), &ssh.join("id_ed25519")]
        );
        assert_eq!(plan.categories(), "ssh 2, cloud 1, registry 1");
    }

    #[test]
    fn the_doors_variables_are_withheld_and_not_said_to_be_registry_credentials() {
        let rules = RuleSet::load(None).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let scope = Scope { home: dir.path().to_owned(), system_root: None, other_homes: Vec::new() };
        let user = Identity { name: None, uid: 4242, gids: vec![4242] };
        let env = [
            (OsStr::new("NPM_TOKEN"), OsStr::new("npm_FAKE")),
            (OsStr::new("SSH_AUTH_SOCK"), OsStr::new("/tmp/ssh-x/agent.1")),
            (OsStr::new("DISPLAY"), OsStr::new(":0")),
        ];
        let mut plan = plan(&rules, &user, &scope, Limits::default(), env);
        assert_eq!(plan.withheld, vec!["NPM_TOKEN", "SSH_AUTH_SOCK"]);
        plan.withhold_door_variables(vec!["SSH_AUTH_SOCK".into(), "DISPLAY".into()]);
        assert_eq!(plan.withheld, vec!["DISPLAY", "NPM_TOKEN", "SSH_AUTH_SOCK"]);
        assert_eq!(plan.registry_credentials(), vec!["$NPM_TOKEN"]);
    }
}
