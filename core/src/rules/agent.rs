//! Coding agents (Claude Code, Codex, Gemini CLI, ...): executing one makes a process the root
//! of an agent tree. The kernel marks them through the managers' basename map
//! ([`super::RuleSet::kernel_roots`]); the engine judges the tree by [`AgentPolicy`]: the agent's
//! own files and the project's are its work, another credential or another agent's settings
//! are not.

use serde::Deserialize;

use super::{
    manager::{Manager, ScriptRoot},
    schema::Pattern,
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
}
