//! Coding agents (Claude Code, Codex, Gemini CLI, ...): executing one makes a process the root
//! of an agent tree. The kernel marks them through the managers' basename map
//! ([`super::RuleSet::kernel_roots`]); the engine judges the tree by [`AgentPolicy`]: the agent's
//! own files and the project's are its work, another credential or another agent's settings
//! are not.

use serde::Deserialize;

use super::{
    manager::{Manager, ScriptRoot},
    target::Pattern,
};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    /// `claude`, `codex`, ...
    pub name: String,
    /// Basenames of the executables that are this agent.
    #[serde(default)]
    pub execs: Vec<String>,
    /// Release files an interpreter runs that are this agent (`node .../codex.js`), as for
    /// managers.
    #[serde(default)]
    pub scripts: Vec<ScriptRoot>,
    /// Its own files (credentials, settings, hooks, MCP servers): reading and writing them is
    /// its work.
    #[serde(default)]
    pub own: Vec<Pattern>,
}

impl Agent {
    /// The agent as the root tables see it (the kernel's and [`super::manager::root_manager`]).
    pub fn as_root(&self) -> Manager {
        Manager {
            name: self.name.clone(),
            execs: self.execs.clone(),
            scripts: self.scripts.clone(),
            script: !self.scripts.is_empty(),
            ..Manager::default()
        }
    }
}

/// What agent trees alert on, besides every credential read (`kind: target`, `access: read`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentPolicy {
    /// Ids of the write rules that also apply to agent trees (another agent's hooks and MCP
    /// servers); the other write rules, exec, syscall and connect rules are about package
    /// code, not about what a developer asks an agent to do.
    #[serde(default)]
    pub writes: Vec<String>,
    /// Basenames of the shells agents run their tools through (`claude > bash -c 'git push'`).
    /// In an agent tree such a shell, under the agent or its own programs or another such
    /// shell, passes a `via_manager` actor's chain on without being an actor itself: the
    /// agent's git reaches ssh through it, as npm's does directly. Never in a package tree:
    /// there the shell runs a lifecycle script, package code.
    #[serde(default)]
    pub tool_shells: Vec<String>,
}

#[cfg(test)]
mod tests {
    use crate::rules::{manager::root_manager, RuleSet};

    /// What the real CLIs keep in HOME (claude-code 2.1.332, codex 0.171.0 and gemini-cli 0.61.0,
    /// started under `credwatch watch` by tests/tests/agent_clis.rs; OAuth logins add
    /// `oauth_creds.json` and `google_accounts.json` to ~/.gemini).
    const REAL_FILES: &[(&str, &[&str])] = &[
        (
            "claude",
            &[
                ".claude.json",
                ".claude/.credentials.json",
                ".claude/settings.json",
                ".claude/backups/.claude.json.backup.1796467781216",
                ".claude/projects/-home-alice-app/01a245d2.jsonl",
            ],
        ),
        (
            "codex",
            &[
                ".codex/auth.json",
                ".codex/config.toml",
                ".codex/state_5.sqlite",
                ".codex/sessions/2026/12/05/rollout.jsonl",
            ],
        ),
        (
            "gemini",
            &[
                ".gemini/settings.json",
                ".gemini/oauth_creds.json",
                ".gemini/google_accounts.json",
                ".gemini/projects.json",
                ".gemini/tmp/app/chats/session.jsonl",
            ],
        ),
    ];

    /// The entry points of the real CLIs (rules/agents.yaml says how to check them against a
    /// release) root their trees; entry files too common to root by do not.
    #[test]
    fn the_real_agents_entry_points_root_their_trees() {
        let rules = RuleSet::defaults().unwrap();
        let roots = rules.agent_roots();
        let root = |file: &str, args: &[&str]| {
            let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
            root_manager(roots, file, &args).map(|index| roots[index].name.as_str())
        };
        let npm = "/usr/lib/node_modules";
        // The bins as npm links them, and pnpm's shims running their targets by name.
        assert_eq!(root("/usr/bin/claude", &["claude", "-p", "hi"]), Some("claude"));
        let claude_exe = format!("{npm}/@anthropic-ai/claude-code/bin/claude.exe");
        assert_eq!(root(&claude_exe, &[&claude_exe, "-p", "hi"]), Some("claude"));
        let native_codex = format!("{npm}/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex");
        assert_eq!(root(&native_codex, &[&native_codex, "exec", "hi"]), Some("codex"));
        assert_eq!(root("/usr/bin/node", &["node", &format!("{npm}/@openai/codex/bin/codex.js")]), Some("codex"));
        let gemini_js = format!("{npm}/@google/gemini-cli/bundle/gemini.js");
        assert_eq!(root("/usr/bin/node", &["node", &gemini_js, "-p", "hi"]), Some("gemini"));
        assert_eq!(root("/usr/bin/node", &["node", "--max-old-space-size=8192", &gemini_js]), Some("gemini"));
        assert_eq!(root("/usr/bin/node", &["node", &format!("{npm}/@anthropic-ai/claude-code/cli.js")]), None);
        assert_eq!(root("/usr/bin/node", &["node", "/home/alice/app/index.js"]), None);
    }

    /// The shells agents run their tools through are data, and the policy's keys are checked.
    #[test]
    fn the_agents_tool_shells_are_data() {
        let shells = RuleSet::defaults().unwrap().agent_tool_shells().to_vec();
        assert!(["sh", "bash", "dash", "zsh"].iter().all(|shell| shells.iter().any(|s| s == shell)), "{shells:?}");
        let dir = tempfile::tempdir().unwrap();
        let load = |text: &str| {
            std::fs::write(dir.path().join("agents.yaml"), text).unwrap();
            RuleSet::load_dir(dir.path())
        };
        let rules = load("schema: 2\nagent_policy:\n  tool_shells: [fish]\n").unwrap();
        assert_eq!(rules.agent_tool_shells(), ["fish"]);
        assert!(load("schema: 2\nagents: []\n").unwrap().agent_tool_shells().is_empty());
        let error = load("schema: 2\nagent_policy:\n  tool_shell: [fish]\n").unwrap_err().to_string();
        assert!(error.contains("agents.yaml:3:3: ") && error.contains("unknown field `tool_shell`"), "{error}");
    }

    /// The agent and its tools read these for their work: each is the agent's own, and no `kill`
    /// rule targets it, since under `--enforce` the kernel (which does not know whose tree reads
    /// a file) would kill the agent reading its own token.
    #[test]
    fn the_real_agents_files_are_their_own_and_never_killed() {
        let rules = RuleSet::defaults().unwrap();
        let home = "/home/alice";
        for (name, files) in REAL_FILES {
            let agent = rules.agents().iter().position(|agent| agent.name == *name).unwrap();
            for file in *files {
                let path = format!("{home}/{file}");
                assert!(rules.agent_owns(agent, &path, Some(home)), "{path} is not {name}'s own");
                let killing: Vec<&str> = rules
                    .kill_rules()
                    .filter(|rule| rule.matches_path(&path, Some(home)))
                    .map(|rule| rule.id.as_str())
                    .collect();
                assert!(killing.is_empty(), "{path} of {name} is a target of kill rules {killing:?}");
            }
        }
    }
}
