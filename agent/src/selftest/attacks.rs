//! The attacks `credwatch selftest` reproduces: each one's npm package (its lifecycle script and
//! payload, embedded), the throwaway home of fake credentials it runs on, and the alerts the
//! default rules raise for it (taken from real runs under `credwatch run` and `watch`).

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

/// One attack: its package and what it must raise.
pub struct Attack {
    /// `--attack NAME`.
    pub name: &'static str,
    pub title: &'static str,
    /// The package's files, by their path in it.
    pub files: &'static [(&'static str, &'static str)],
    pub package: &'static str,
    pub expected: &'static [Expected],
}

/// An alert the attack must raise: its rule (or one of them), and the file (a path under the lab,
/// also found in a sweep's list) or the command (part of its argv, joined by spaces) it names.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    pub rules: &'static [&'static str],
    pub what: Target,
}

#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// Relative to the lab's directory (`home/.npmrc`).
    File(&'static str),
    Command(&'static str),
}

const fn file(rules: &'static [&'static str], path: &'static str) -> Expected {
    Expected { rules, what: Target::File(path) }
}

const fn command(rules: &'static [&'static str], needle: &'static str) -> Expected {
    Expected { rules, what: Target::Command(needle) }
}

/// The project both attacks are installed into, under the throwaway home as a checkout would be.
pub const PROJECT: &str = "home/src/app";

pub const NX: Attack = Attack {
    name: "nx",
    title: "Nx \"s1ngularity\" (nx 21.5.0, Aug 2025): postinstall `node telemetry.js`",
    files: &[
        ("package.json", include_str!("attacks/nx/package.json")),
        ("telemetry.js", include_str!("attacks/nx/telemetry.js")),
    ],
    package: "credwatch-selftest-nx",
    expected: &[
        command(&["gh-auth-token"], "gh auth token"),
        file(&["git-credentials"], "home/.config/gh/hosts.yml"),
        command(&["npm-token-use"], "npm whoami"),
        file(&["npm-registry-token"], "home/.npmrc"),
        command(&["ai-cli-claude-unsafe"], "claude --dangerously-skip-permissions"),
        command(&["ai-cli-gemini-yolo"], "gemini --yolo"),
        command(&["ai-cli-q-trust-all-tools"], "q chat --trust-all-tools"),
        // The wallets, key and .env the search listed: one sweep, not an alert per file.
        file(
            &["credential-sweep"],
            "home/.ethereum/keystore/UTC--2025-08-26T20-32-06.000Z--6fd9a1c3e0b2f7d4a8c5e1b3f9d2a7c4e6b8f0a1",
        ),
        file(&["credential-sweep"], "home/.electrum/wallets/default_wallet"),
        // A key of a kill rule: under `watch --enforce` its read is blocked and told by its own
        // rule, outside the sweep.
        file(&["credential-sweep", "ssh-private-keys"], "home/.ssh/id_rsa"),
        file(&["credential-sweep"], "home/src/app/.env"),
        file(&["shell-rc-write"], "home/.bashrc"),
        file(&["shell-rc-write"], "home/.zshrc"),
    ],
};

pub const SHAI_HULUD_2: Attack = Attack {
    name: "shai-hulud-2",
    title: "Shai-Hulud 2.0 (Nov 2025): preinstall `node setup_bun.js`, then `bun bun_environment.js`",
    files: &[
        ("package.json", include_str!("attacks/shai-hulud-2/package.json")),
        ("setup_bun.js", include_str!("attacks/shai-hulud-2/setup_bun.js")),
        ("bun_environment.js", include_str!("attacks/shai-hulud-2/bun_environment.js")),
    ],
    package: "credwatch-selftest-shai-hulud-2",
    expected: &[
        command(&["downloaded-bun"], ".bun/bin/bun"),
        command(&["sudo-non-interactive"], "sudo -n true"),
        command(&["gh-auth-token"], "gh auth token"),
        file(&["git-credentials"], "home/.config/gh/hosts.yml"),
        file(&["npm-registry-token"], "home/.npmrc"),
        command(&["npm-token-use"], "npm whoami"),
        // The cloud credentials after the GitHub and npm ones: a sweep; under `watch --enforce`
        // (kill rules) each read is blocked and told by its own rule.
        file(&["credential-sweep", "aws-credentials"], "home/.aws/credentials"),
        file(&["credential-sweep", "gcloud-credentials"], "home/.config/gcloud/application_default_credentials.json"),
        command(&["trufflehog"], "trufflehog filesystem"),
        command(&["exec-of-written-file"], ".truffler-cache/trufflehog"),
        file(&["github-workflow-write"], "home/src/app/.github/workflows/discussion.yaml"),
        command(&["npm-publish-from-package"], "npm publish"),
    ],
};

pub const ALL: &[&Attack] = &[&NX, &SHAI_HULUD_2];

/// What the loopback stub serves as downloads (Shai-Hulud 2.0's Bun and TruffleHog).
pub const BUN_STAND_IN: &str = include_str!("attacks/shai-hulud-2/bun-stand-in.sh");
pub const TRUFFLEHOG_STAND_IN: &str = include_str!("attacks/shai-hulud-2/trufflehog-stand-in.sh");
/// `gh`, `claude` and `gemini` (scripts, as Claude Code and Gemini CLI are node scripts).
const SCRIPT_STAND_IN: &str = include_str!("attacks/tools/stand-in.sh");

/// The throwaway home's files, relative to the lab. Every value is fake and says so. `NPMRC` gets
/// the stub's registry line added.
const FAKE_HOME: &[(&str, &str)] = &[
    (
        "home/.credwatch-selftest",
        "A throwaway home made by `credwatch selftest`: every credential here is fake. The payloads refuse to run without this file.\n",
    ),
    ("home/.bashrc", "# credwatch selftest: a throwaway .bashrc\n"),
    ("home/.zshrc", "# credwatch selftest: a throwaway .zshrc\n"),
    (
        "home/.ssh/id_rsa",
        "-----BEGIN RSA PRIVATE KEY-----\nFAKE-credwatch-selftest-not-a-key\n-----END RSA PRIVATE KEY-----\n",
    ),
    (
        "home/.ssh/id_ed25519",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKE-credwatch-selftest-not-a-key\n-----END OPENSSH PRIVATE KEY-----\n",
    ),
    (
        "home/.aws/credentials",
        "[default]\naws_access_key_id = AKIAFAKECREDWATCHSELF\naws_secret_access_key = FAKE/credwatch/selftest/not/a/secret\n",
    ),
    ("home/.config/gh/hosts.yml", "github.com:\n    user: credwatch-selftest\n    oauth_token: gho_FAKEcredwatchSelftestNotAToken00000\n    git_protocol: https\n"),
    (
        "home/.config/gcloud/application_default_credentials.json",
        "{\"type\": \"authorized_user\", \"client_id\": \"FAKE-credwatch-selftest.apps.googleusercontent.com\", \"client_secret\": \"FAKE-credwatch-selftest\", \"refresh_token\": \"FAKE-credwatch-selftest-not-a-token\"}\n",
    ),
    (
        "home/.ethereum/keystore/UTC--2025-08-26T20-32-06.000Z--6fd9a1c3e0b2f7d4a8c5e1b3f9d2a7c4e6b8f0a1",
        "{\"address\": \"6fd9a1c3e0b2f7d4a8c5e1b3f9d2a7c4e6b8f0a1\", \"crypto\": {\"ciphertext\": \"FAKE-credwatch-selftest\"}, \"version\": 3}\n",
    ),
    ("home/.electrum/wallets/default_wallet", "{\"wallet_type\": \"standard\", \"keystore\": {\"xprv\": \"FAKE-credwatch-selftest\"}}\n"),
    ("home/src/app/.env", "DATABASE_URL=postgres://app:FAKE-credwatch-selftest@localhost/app\nSTRIPE_SECRET_KEY=sk_test_FAKEcredwatchSelftest\n"),
];

/// The environment variables Shai-Hulud 2.0 harvested, fake.
pub const FAKE_ENV: &[(&str, &str)] = &[
    ("NPM_TOKEN", "npm_FAKEcredwatchSelftestNotAToken00000000"),
    ("GITHUB_TOKEN", "ghp_FAKEcredwatchSelftestNotAToken0000000"),
    ("AWS_ACCESS_KEY_ID", "AKIAFAKECREDWATCHSELF"),
    ("AWS_SECRET_ACCESS_KEY", "FAKE/credwatch/selftest/not/a/secret"),
    ("AZURE_CLIENT_SECRET", "FAKE-credwatch-selftest"),
];

/// A lab: the throwaway home, the stand-in tools, the attack's package and the project that
/// depends on it, in `dir`.
pub struct Lab {
    pub dir: PathBuf,
}

impl Lab {
    /// Writes the lab for `attack` in `dir` (a new, empty directory); `registry` is the stub's URL.
    pub fn write(dir: &Path, attack: &Attack, registry: &str) -> Result<Lab> {
        let lab = Lab { dir: dir.to_owned() };
        for (relative, text) in FAKE_HOME {
            lab.put(relative, text)?;
        }
        // The stub is the only registry: its token is what `npm whoami` and the worm's publish use.
        let authority = registry.trim_start_matches("http:");
        lab.put(
            "home/.npmrc",
            &format!(
                "//registry.npmjs.org/:_authToken=npm_FAKEcredwatchSelftestNotAToken00000000\n{authority}:_authToken=npm_FAKEcredwatchSelftestNotAToken00000000\n"
            ),
        )?;
        lab.put("npmrc-global", "")?;
        for name in ["gh", "claude", "gemini", "q"] {
            lab.put(&format!("tools/{name}"), SCRIPT_STAND_IN)?;
            lab.executable(&format!("tools/{name}"))?;
        }
        // A binary: a script's exec shows /bin/sh as argv[0], and the sudo rule reads sudo's options.
        let sudo = lab.path("tools/sudo");
        fs::copy("/bin/true", &sudo).with_context(|| format!("copying /bin/true to {}", sudo.display()))?;
        let package = format!("packages/{}", attack.name);
        for (relative, text) in attack.files {
            lab.put(&format!("{package}/{relative}"), text)?;
        }
        // npm's own policy (npm 11's allowScripts) would run it anyway, with a warning.
        let manifest = serde_json::json!({
            "name": "app",
            "version": "1.0.0",
            "private": true,
            "dependencies": { attack.package: format!("file:../../../{package}") },
            "allowScripts": { attack.package: true },
        });
        lab.put(&format!("{PROJECT}/package.json"), &serde_json::to_string_pretty(&manifest)?)?;
        fs::create_dir_all(lab.path("tmp")).with_context(|| format!("creating {}", lab.path("tmp").display()))?;
        Ok(lab)
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    fn put(&self, relative: &str, text: &str) -> Result<()> {
        let path = self.path(relative);
        let parent = path.parent().expect("a file in the lab");
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    }

    fn executable(&self, relative: &str) -> Result<()> {
        let path = self.path(relative);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", path.display()))
    }
}
