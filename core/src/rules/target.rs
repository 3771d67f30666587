//! Path patterns of a rule ([`Pattern`], as files write them) and their compiled form: `~/...`
//! patterns are tried against the path relative to every home it lies under, the others against
//! the absolute path.

use std::sync::Arc;

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use serde::Deserialize;

/// Where a path pattern is anchored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    /// `~/...`: relative to each user's home.
    Home,
    /// `/...` or `**/...`: matched against the absolute path.
    Absolute,
}

/// A path glob: `~/...` (under any home), `/...` or `**/...`. `*` stops at `/`, `**` does not.
///
/// Its [`Glob`] is parsed again when a set is built rather than kept: a parsed glob holds its
/// tokens, most of a rule set's memory after its compiled sets, and only the sets need them.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "String")]
pub struct Pattern {
    pub text: String,
    pub anchor: Anchor,
}

impl TryFrom<String> for Pattern {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let anchor = if text.starts_with("~/") {
            Anchor::Home
        } else if text.starts_with('/') || text.starts_with("**/") {
            Anchor::Absolute
        } else {
            return Err(format!("path pattern {text:?} must start with `~/`, `/` or `**/`"));
        };
        let pattern = Pattern { text, anchor };
        pattern.parse().map_err(|e| format!("bad glob {:?}: {}", pattern.text, e.kind()))?;
        Ok(pattern)
    }
}

impl Pattern {
    /// The glob to add to a set (a `~/` pattern's is relative to the home); checked when the
    /// pattern was read.
    fn parse(&self) -> Result<Glob, globset::Error> {
        let body = match self.anchor {
            Anchor::Home => &self.text[2..],
            Anchor::Absolute => &self.text,
        };
        GlobBuilder::new(body).literal_separator(true).build()
    }
}

#[derive(Clone, Debug)]
pub struct Targets {
    home: GlobSet,
    absolute: GlobSet,
    home_exclude: GlobSet,
    absolute_exclude: GlobSet,
}

impl Targets {
    pub fn compile(targets: &[Pattern], exclude: &[Pattern]) -> Result<Targets, globset::Error> {
        let (home, absolute) = split(targets)?;
        let (home_exclude, absolute_exclude) = split(exclude)?;
        Ok(Targets { home, absolute, home_exclude, absolute_exclude })
    }

    /// Whether the absolute `path` is a target. `home` is the opener's `HOME` when known; the
    /// homes of `/etc/passwd`'s usual layout (`/root`, `/home/<user>`) are always tried.
    pub fn matches(&self, path: &str, home: Option<&str>) -> bool {
        let relatives = home_relatives(path, home);
        let hit = self.absolute.is_match(path) || relatives.iter().any(|rel| self.home.is_match(rel));
        hit && !self.excluded(path, &relatives)
    }

    /// Whether the absolute `path` is excluded.
    pub fn excludes(&self, path: &str, home: Option<&str>) -> bool {
        self.excluded(path, &home_relatives(path, home))
    }

    fn excluded(&self, path: &str, relatives: &[&str]) -> bool {
        self.absolute_exclude.is_match(path) || relatives.iter().any(|rel| self.home_exclude.is_match(rel))
    }
}

/// All rules' targets, and all their exclusions, each in two glob sets (one per anchor), so that
/// an open costs a few matches however many rules there are, and the rules share four compiled
/// sets instead of four each (most of the compiled rules' memory: every set with a glob that is
/// no literal, prefix or suffix compiles a regex). [`TargetIndex::matching`] gives the rules that
/// match a path; [`RuleTargets`] is one rule's view of the index.
#[derive(Clone, Debug, Default)]
pub struct TargetIndex {
    targets: AnchoredSets,
    exclude: AnchoredSets,
}

impl TargetIndex {
    /// `rules[i]` are the target and exclude patterns of rule `i`.
    pub fn build<'a>(
        rules: impl IntoIterator<Item = (&'a [Pattern], &'a [Pattern])>,
    ) -> Result<TargetIndex, globset::Error> {
        let (targets, exclude): (Vec<_>, Vec<_>) = rules.into_iter().unzip();
        Ok(TargetIndex { targets: AnchoredSets::build(targets)?, exclude: AnchoredSets::build(exclude)? })
    }

    /// Indices of the rules whose targets match `path` and whose exclusions do not (what
    /// [`RuleTargets::matches`] says of each rule), sorted, without repeats: each set is
    /// matched once for all the rules.
    pub fn matching(&self, path: &str, home: Option<&str>) -> Vec<usize> {
        let relatives = home_relatives(path, home);
        let mut out = self.targets.rules(path, &relatives);
        let excluded = self.exclude.rules(path, &relatives);
        out.retain(|rule| !excluded.contains(rule));
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// One rule's view of the [`TargetIndex`] of its set.
#[derive(Clone, Default)]
pub struct RuleTargets {
    index: Arc<TargetIndex>,
    rule: usize,
}

/// The index is the whole set's: a rule shows its number alone.
impl std::fmt::Debug for RuleTargets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleTargets").field("rule", &self.rule).finish_non_exhaustive()
    }
}

impl RuleTargets {
    pub fn new(index: Arc<TargetIndex>, rule: usize) -> RuleTargets {
        RuleTargets { index, rule }
    }

    /// Whether the absolute `path` is one of the rule's targets (as [`Targets::matches`]).
    pub fn matches(&self, path: &str, home: Option<&str>) -> bool {
        let relatives = home_relatives(path, home);
        self.index.targets.hit(self.rule, path, &relatives) && !self.index.exclude.hit(self.rule, path, &relatives)
    }

    /// Whether the absolute `path` is in the rule's `exclude`.
    pub fn excludes(&self, path: &str, home: Option<&str>) -> bool {
        self.index.exclude.hit(self.rule, path, &home_relatives(path, home))
    }
}

/// Many rules' patterns by anchor, with the rule of each glob.
#[derive(Clone, Debug, Default)]
struct AnchoredSets {
    home: GlobSet,
    absolute: GlobSet,
    /// Rule index of each glob, in the order the sets were built.
    home_rules: Vec<usize>,
    absolute_rules: Vec<usize>,
}

impl AnchoredSets {
    fn build(rules: Vec<&[Pattern]>) -> Result<AnchoredSets, globset::Error> {
        let (mut home, mut absolute) = (GlobSetBuilder::new(), GlobSetBuilder::new());
        let (mut home_rules, mut absolute_rules) = (Vec::new(), Vec::new());
        for (rule, patterns) in rules.into_iter().enumerate() {
            for pattern in patterns {
                match pattern.anchor {
                    Anchor::Home => {
                        home.add(pattern.parse()?);
                        home_rules.push(rule);
                    }
                    Anchor::Absolute => {
                        absolute.add(pattern.parse()?);
                        absolute_rules.push(rule);
                    }
                }
            }
        }
        Ok(AnchoredSets { home: home.build()?, absolute: absolute.build()?, home_rules, absolute_rules })
    }

    /// The rules with a glob that matches `path` (or, home-anchored, one of its `relatives`), in
    /// no order, with repeats.
    fn rules(&self, path: &str, relatives: &[&str]) -> Vec<usize> {
        let mut out: Vec<usize> = self.absolute.matches(path).into_iter().map(|i| self.absolute_rules[i]).collect();
        for rel in relatives {
            out.extend(self.home.matches(rel).into_iter().map(|i| self.home_rules[i]));
        }
        out
    }

    /// Whether a glob of `rule` matches `path` (or, home-anchored, one of its `relatives`).
    fn hit(&self, rule: usize, path: &str, relatives: &[&str]) -> bool {
        let of_rule = |set: &GlobSet, rules: &[usize], text: &str| {
            rules.contains(&rule) && set.matches(text).into_iter().any(|i| rules[i] == rule)
        };
        of_rule(&self.absolute, &self.absolute_rules, path)
            || relatives.iter().any(|rel| of_rule(&self.home, &self.home_rules, rel))
    }
}

fn split(patterns: &[Pattern]) -> Result<(GlobSet, GlobSet), globset::Error> {
    let mut home = GlobSetBuilder::new();
    let mut absolute = GlobSetBuilder::new();
    for pattern in patterns {
        match pattern.anchor {
            Anchor::Home => home.add(pattern.parse()?),
            Anchor::Absolute => absolute.add(pattern.parse()?),
        };
    }
    Ok((home.build()?, absolute.build()?))
}

/// `path` relative to each home it is under.
fn home_relatives<'a>(path: &'a str, home: Option<&str>) -> Vec<&'a str> {
    let mut out = Vec::with_capacity(2);
    if let Some(rel) = path.strip_prefix("/root/") {
        out.push(rel);
    }
    if let Some(rest) = path.strip_prefix("/home/") {
        if let Some((user, rel)) = rest.split_once('/') {
            if !user.is_empty() {
                out.push(rel);
            }
        }
    }
    // A HOME of "/" (daemons) would make every absolute path home-relative.
    if let Some(home) = home.map(|h| h.trim_end_matches('/')).filter(|h| !h.is_empty()) {
        if let Some(rel) = path.strip_prefix(home).and_then(|rest| rest.strip_prefix('/')) {
            if !out.contains(&rel) {
                out.push(rel);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(targets: &[&str], exclude: &[&str]) -> Targets {
        let parse = |list: &[&str]| -> Vec<Pattern> {
            list.iter().map(|t| Pattern::try_from((*t).to_owned()).unwrap()).collect()
        };
        Targets::compile(&parse(targets), &parse(exclude)).unwrap()
    }

    #[test]
    fn home_patterns_match_every_home() {
        let t = targets(&["~/.npmrc", "~/.ssh/**"], &[]);
        assert!(t.matches("/root/.npmrc", None));
        assert!(t.matches("/home/alice/.npmrc", None));
        assert!(t.matches("/home/alice/.ssh/id_ed25519", None));
        assert!(t.matches("/tmp/xyz/home/.npmrc", Some("/tmp/xyz/home")));
        assert!(t.matches("/tmp/xyz/home/.ssh/keys/id_rsa", Some("/tmp/xyz/home/")));
        assert!(!t.matches("/tmp/xyz/home/.npmrc", None));
        assert!(!t.matches("/home/alice/project/.npmrc", None));
        assert!(!t.matches("/home/.npmrc", None));
        assert!(!t.matches("/etc/.npmrc", Some("/")));
    }

    #[test]
    fn star_stops_at_slash_and_exclusions_win() {
        let t =
            targets(&["**/.env", "**/.env.*", "/etc/ssh/ssh_host_*_key"], &["**/node_modules/**", "**/.env.example"]);
        assert!(t.matches("/home/alice/app/.env", None));
        assert!(t.matches("/srv/app/.env.production", None));
        assert!(!t.matches("/srv/app/.env.example", None));
        assert!(!t.matches("/srv/app/node_modules/dotenv/.env", None));
        assert!(t.matches("/etc/ssh/ssh_host_ed25519_key", None));
        assert!(!t.matches("/etc/ssh/ssh_host_ed25519_key.pub", None));
        assert!(!t.matches("/etc/ssh/x/ssh_host_a/b_key", None));
    }
}
