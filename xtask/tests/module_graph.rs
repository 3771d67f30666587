//! The module-graph rule, for every crate of the workspace: in each directory of a crate's
//! `src/`, the sibling modules form no cycle. A file `x.rs` or a directory `x/` is one sibling;
//! `lib.rs`, `main.rs` and `mod.rs` are the parent, not siblings. Sibling `a` depends on sibling
//! `b` when any file of `a` names `b` through a `crate::`, `super::` or `self::` path, in a `use`
//! (grouped lists included) or inline, tests included. Comments and string literals are not read,
//! nor the names a glob (`use super::*`) brings in: the test modules that use one name nothing back.
//! A loop means neither side can be read, moved or tested without the other: move what both
//! need into a module of its own, below both.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
};

/// A module path from the crate root (`["engine", "alerts"]`); the root is empty.
type ModulePath = Vec<String>;

/// One crate's dependencies between siblings, directory by directory.
#[derive(Debug, Default)]
struct CrateGraph {
    /// The `.rs` files read, so that a test can tell that it saw the crate at all.
    files: usize,
    /// Directory (as a module path) -> sibling -> the siblings it names -> the first place that
    /// names it (`file: path`), to say where a loop can be cut.
    edges: BTreeMap<ModulePath, BTreeMap<String, BTreeMap<String, String>>>,
}

impl CrateGraph {
    /// Reads every `.rs` file under `crate_dir/src`, naming them from `shown_from`.
    fn read(crate_dir: &Path, shown_from: &Path) -> CrateGraph {
        let src = crate_dir.join("src");
        let mut graph = CrateGraph::default();
        let mut pending = vec![src.clone()];
        while let Some(dir) = pending.pop() {
            let entries = fs::read_dir(&dir).unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()));
            for entry in entries {
                let path = entry.unwrap_or_else(|error| panic!("reading {}: {error}", dir.display())).path();
                if path.is_dir() {
                    pending.push(path);
                } else if path.extension().is_some_and(|ext| ext == "rs") {
                    let text =
                        fs::read_to_string(&path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
                    let relative = path.strip_prefix(&src).expect("walked from src");
                    let shown = path.strip_prefix(shown_from).unwrap_or(&path).display().to_string();
                    graph.add_file(&src, &shown, &file_module(relative), &text);
                }
            }
        }
        graph
    }

    /// Adds the edges of one file whose module is `module`.
    fn add_file(&mut self, src: &Path, shown: &str, module: &[String], text: &str) {
        self.files += 1;
        for (target, spelled) in named_paths(&tokens(text), module) {
            let common = module.iter().zip(&target).take_while(|(a, b)| a == b).count();
            let (Some(from), Some(to)) = (module.get(common), target.get(common)) else {
                // The file's own module, one of its children or one of its parents.
                continue;
            };
            let dir = &module[..common];
            if !is_module(src, dir, to) {
                // An item of the parent (a function, a type), not a sibling module.
                continue;
            }
            self.edges
                .entry(dir.to_vec())
                .or_default()
                .entry(from.clone())
                .or_default()
                .entry(to.clone())
                .or_insert_with(|| format!("{shown}: {spelled}"));
        }
    }

    /// Every loop, one per group of siblings that reach each other, with the place that makes
    /// each of its steps.
    fn cycles(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (dir, edges) in &self.edges {
            for (cycle, group) in cycles(edges) {
                let dir: String = dir.iter().map(|d| format!("{d}/")).collect();
                let mut text = format!("src/{dir}: {}", cycle.join(" -> "));
                let others: Vec<&String> = group.iter().filter(|node| !cycle.contains(node)).collect();
                if !others.is_empty() {
                    write!(
                        text,
                        " (and more loops through {})",
                        others.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                    )
                    .unwrap();
                }
                for step in cycle.windows(2) {
                    write!(text, "\n    {} -> {}: {}", step[0], step[1], edges[&step[0]][&step[1]]).unwrap();
                }
                found.push(text);
            }
        }
        found
    }

    /// The siblings that the sibling `from` of directory `dir` names.
    fn names(&self, dir: &[&str], from: &str) -> BTreeSet<String> {
        let dir: ModulePath = dir.iter().map(|d| d.to_string()).collect();
        self.edges
            .get(&dir)
            .and_then(|edges| edges.get(from))
            .map(|to| to.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// The module a file under `src/` is: `engine/mod.rs` and `engine.rs` are both `engine`.
fn file_module(relative: &Path) -> ModulePath {
    let mut module: ModulePath = relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    let file = module.pop().expect("a file has a name");
    let stem = file.strip_suffix(".rs").unwrap_or(&file);
    if !["lib", "main", "mod"].contains(&stem) {
        module.push(stem.to_owned());
    }
    module
}

/// Whether `name` is a sibling module in directory `dir` of `src`: a file `name.rs` or a
/// directory `name/` with a `mod.rs`.
fn is_module(src: &Path, dir: &[String], name: &str) -> bool {
    let dir: PathBuf = dir.iter().fold(src.to_path_buf(), |path, part| path.join(part));
    !["lib", "main", "mod"].contains(&name)
        && (dir.join(format!("{name}.rs")).is_file() || dir.join(name).join("mod.rs").is_file())
}

#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

/// Rust source as identifiers and punctuation, without comments, string and character literals
/// and lifetimes: a path in a comment or a string names nothing.
fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i = after_string(&chars, i + 1);
        } else if c == '\'' {
            if next == Some('\\') {
                // An escaped character: '\n', '\'', '\u{..}' (the quote, the backslash, the
                // escaped character, then up to the closing quote).
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                // A lifetime or a label.
                i += 1;
                while i < chars.len() && is_ident_char(chars[i]) {
                    i += 1;
                }
            }
        } else if is_ident_char(c) {
            let start = i;
            while i < chars.len() && is_ident_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let prefix = matches!(word.as_str(), "r" | "b" | "br" | "c" | "cr");
            match chars.get(i) {
                // A raw string has no escapes: its first quote ends it.
                Some('"') if prefix && word.ends_with('r') => {
                    i += 1;
                    while i < chars.len() && chars[i] != '"' {
                        i += 1;
                    }
                    i += 1;
                }
                Some('"') if prefix => i = after_string(&chars, i + 1),
                Some('#') if prefix && word.ends_with('r') => {
                    // r#"..."#: as many #s close it as opened it; r#ident is an identifier.
                    let hashes = chars[i..].iter().take_while(|c| **c == '#').count();
                    if chars.get(i + hashes) == Some(&'"') {
                        let closing: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                        i += hashes + 1;
                        while i < chars.len() && !chars[i..].starts_with(&closing) {
                            i += 1;
                        }
                        i += closing.len();
                    } else if word == "r" {
                        i += 1;
                        let start = i;
                        while i < chars.len() && is_ident_char(chars[i]) {
                            i += 1;
                        }
                        tokens.push(Token::Ident(chars[start..i].iter().collect()));
                    } else {
                        tokens.push(Token::Ident(word));
                    }
                }
                Some('\'') if word == "b" => i = after_byte(&chars, i),
                _ => tokens.push(Token::Ident(word)),
            }
        } else if c == ':' && next == Some(':') {
            tokens.push(Token::PathSep);
            i += 2;
        } else {
            if !c.is_whitespace() {
                tokens.push(Token::Punct(c));
            }
            i += 1;
        }
    }
    tokens
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Where a string literal whose body starts at `i` ends.
fn after_string(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && chars[i] != '"' {
        i += if chars[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

/// Where a byte literal `b'x'` whose quote is at `i` ends.
fn after_byte(chars: &[char], i: usize) -> usize {
    let mut i = i + 1;
    while i < chars.len() && chars[i] != '\'' {
        i += if chars[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

/// Every path that starts with `crate`, `super` or `self` in a file of module `module`,
/// resolved from the crate root, with its spelling. Inline `mod name { ... }` blocks move
/// `super` and `self` one level down, as they do for the compiler.
fn named_paths(tokens: &[Token], module: &[String]) -> Vec<(ModulePath, String)> {
    let mut found = Vec::new();
    let mut depth = 0usize;
    // The inline modules we are in, and the depth of the brace that opened each.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Punct('{') => {
                depth += 1;
                if let (Some(Token::Ident(name)), Some(Token::Ident(keyword))) =
                    (i.checked_sub(1).map(|j| &tokens[j]), i.checked_sub(2).map(|j| &tokens[j]))
                {
                    if keyword == "mod" {
                        inline.push((name.clone(), depth));
                    }
                }
            }
            Token::Punct('}') => {
                if inline.last().is_some_and(|(_, opened)| *opened == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Token::Ident(word)
                if matches!(word.as_str(), "crate" | "super" | "self")
                    && tokens.get(i + 1) == Some(&Token::PathSep)
                    && !starts_elsewhere(tokens, i) =>
            {
                let here: ModulePath =
                    module.iter().cloned().chain(inline.iter().map(|(name, _)| name.clone())).collect();
                let mut paths = Vec::new();
                i = use_tree(tokens, i, Vec::new(), &mut paths);
                for mut segments in paths {
                    if let Some(target) = resolve(&here, &segments) {
                        // `a::{self}` is spelled `a`.
                        if segments.len() > 1 && segments.last().is_some_and(|last| last == "self") {
                            segments.pop();
                        }
                        found.push((target, segments.join("::")));
                    }
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// Whether the `crate`, `super` or `self` at `i` is not where a path of ours starts: in the
/// middle of another path, `$crate` of a macro, or `pub(in crate::...)`, which restricts who
/// may see an item and uses nothing.
fn starts_elsewhere(tokens: &[Token], i: usize) -> bool {
    let before = |back: usize| i.checked_sub(back).map(|j| &tokens[j]);
    matches!(before(1), Some(Token::PathSep | Token::Punct('$')))
        || (before(1) == Some(&Token::Ident("in".into())) && before(2) == Some(&Token::Punct('(')))
}

/// Reads the path (or `use` tree) whose first segment is at `i`, below `prefix`, into `paths`:
/// `a::{b, c::{d, e}}` is `a::b`, `a::c::d` and `a::c::e`. Returns where it ends.
fn use_tree(tokens: &[Token], mut i: usize, mut prefix: Vec<String>, paths: &mut Vec<Vec<String>>) -> usize {
    loop {
        match tokens.get(i) {
            Some(Token::Ident(segment)) => {
                prefix.push(segment.clone());
                i += 1;
            }
            Some(Token::Punct('{')) => {
                i += 1;
                while let Some(token) = tokens.get(i) {
                    match token {
                        Token::Punct('}') => break,
                        Token::Ident(_) => {
                            i = use_tree(tokens, i, prefix.clone(), paths);
                            // Past a rename (`x as y`) to the next item.
                            while !matches!(tokens.get(i), Some(Token::Punct(',' | '}')) | None) {
                                i += 1;
                            }
                        }
                        _ => i += 1,
                    }
                }
                return i + 1;
            }
            _ => break,
        }
        if tokens.get(i) != Some(&Token::PathSep) {
            break;
        }
        i += 1;
    }
    paths.push(prefix);
    i
}

/// `segments` as a path from the crate root, seen from module `here`; `None` for a `super` above
/// the root.
fn resolve(here: &[String], segments: &[String]) -> Option<ModulePath> {
    let mut resolved: ModulePath = match segments.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        _ => here.to_vec(),
    };
    for (n, segment) in segments.iter().enumerate() {
        match segment.as_str() {
            "crate" if n == 0 => {}
            "self" => {}
            "super" => {
                resolved.pop()?;
            }
            _ => resolved.push(segment.clone()),
        }
    }
    Some(resolved)
}

/// One cycle per strongly connected group of nodes (those that reach each other), as the path
/// that closes it (`a -> b -> a`) from the group's first node, with the whole group.
fn cycles(edges: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<(Vec<String>, BTreeSet<String>)> {
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut pending = vec![from.clone()];
        while let Some(node) = pending.pop() {
            for next in edges.get(&node).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(next.clone()) {
                    pending.push(next.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> = edges.keys().map(|node| (node, reach(node))).collect();
    let mut grouped = BTreeSet::new();
    let mut found = Vec::new();
    for (node, reached) in &reachable {
        if !reached.contains(*node) || grouped.contains(*node) {
            continue;
        }
        let group: BTreeSet<String> = reached
            .iter()
            .filter(|other| reachable.get(other).is_some_and(|back| back.contains(*node)))
            .cloned()
            .collect();
        grouped.extend(group.iter().cloned());
        found.push((shortest_cycle(edges, node, &group), group));
    }
    found
}

/// The shortest path from `start` back to itself inside `group` (breadth first).
fn shortest_cycle(
    edges: &BTreeMap<String, BTreeMap<String, String>>,
    start: &String,
    group: &BTreeSet<String>,
) -> Vec<String> {
    let mut came_from: BTreeMap<String, String> = BTreeMap::new();
    let mut frontier = vec![start.clone()];
    while !frontier.is_empty() {
        let mut next_frontier = Vec::new();
        for node in frontier {
            for next in edges.get(&node).into_iter().flat_map(BTreeMap::keys).filter(|n| group.contains(*n)) {
                if next == start {
                    // Back from `node` to `start`, which has no predecessor.
                    let mut path = vec![node.clone()];
                    while let Some(previous) = came_from.get(path.last().expect("never empty")) {
                        path.push(previous.clone());
                    }
                    path.reverse();
                    path.push(start.clone());
                    return path;
                }
                if !came_from.contains_key(next) {
                    came_from.insert(next.clone(), node.clone());
                    next_frontier.push(next.clone());
                }
            }
        }
        frontier = next_frontier;
    }
    unreachable!("{start} reaches itself inside its group")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask/ lives in the workspace").to_path_buf()
}

/// Fails with every loop of the crate at `crate_dir` (from the workspace), after checking that it
/// read at least `files` files.
fn assert_no_cycle(crate_dir: &str, files: usize) -> CrateGraph {
    let graph = CrateGraph::read(&workspace().join(crate_dir), &workspace());
    assert!(graph.files >= files, "{crate_dir}: read {} files, expected {files} or more", graph.files);
    let cycles = graph.cycles();
    assert!(
        cycles.is_empty(),
        "{crate_dir}: the sibling modules form {} loop(s):\n{}",
        cycles.len(),
        cycles.join("\n")
    );
    graph
}

#[test]
fn core_has_no_module_cycle() {
    let graph = assert_no_cycle("core", 30);
    // The rules are data the engine reads: they know nothing of it.
    assert!(graph.names(&[], "engine").contains("rules"), "{graph:?}");
    assert!(!graph.names(&[], "rules").contains("engine"), "rules must not use the engine");
}

#[test]
fn agent_has_no_module_cycle() {
    assert_no_cycle("agent", 10);
}

#[test]
fn xtask_has_no_module_cycle() {
    assert_no_cycle("xtask", 15);
}

#[test]
fn outputs_has_no_module_cycle() {
    assert_no_cycle("outputs", 10);
}

#[test]
fn ebpf_has_no_module_cycle() {
    assert_no_cycle("ebpf/credwatch-ebpf", 10);
}

#[test]
fn ebpf_common_has_no_module_cycle() {
    assert_no_cycle("ebpf/credwatch-common", 1);
}

fn strings(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|name| name.to_string()).collect()
}

#[test]
fn the_reader_sees_every_spelling_of_a_sibling() {
    let src = Path::new(env!("CARGO_TARGET_TMPDIR")).join("module_graph_spellings/src");
    let _ = fs::remove_dir_all(&src);
    fs::create_dir_all(src.join("engine")).unwrap();
    for module in [
        "engine/mod.rs",
        "engine/alerts.rs",
        "engine/matching.rs",
        "engine/process.rs",
        "rules.rs",
        "report.rs",
        "alert.rs",
        "trace.rs",
    ] {
        fs::write(src.join(module), "").unwrap();
    }
    let mut graph = CrateGraph::default();
    let alerts = [
        "use crate::{\n    alert::Alert,\n    engine::{matching::Match, x::y},\n    rules as r,\n};",
        "fn f() { crate::report::render(&super::process::Table::new()); }",
        // Comments, strings, `$crate` and `pub(in crate::..)` name nothing.
        "// crate::trace::Header\n/* super::super::trace /* nested */ */ const S: &str = \"crate::trace\";",
        "const Q: [char; 2] = ['\\'', '{']; const R: &str = r\"C:\\\"; const B: u8 = b'\\\\';",
        "macro_rules! m { () => { $crate::trace::x() } } pub(in crate::trace) struct Hidden;",
        // Inline modules: `super` there is the file's module, `self` a child of it.
        "#[cfg(test)] mod tests { use super::process; use self::trace::x; fn t<'a>(_: &'a str) {} }",
    ]
    .join("\n");
    graph.add_file(&src, "alerts.rs", &["engine".into(), "alerts".into()], &alerts);
    assert_eq!(graph.names(&["engine"], "alerts"), strings(&["matching", "process"]));
    assert_eq!(graph.names(&[], "engine"), strings(&["alert", "report", "rules"]));
    // A parent names its children without making a sibling depend on anything.
    graph.add_file(&src, "mod.rs", &["engine".into()], "use self::alerts::Alert; use crate::engine::process;");
    graph.add_file(&src, "rules.rs", &["rules".into()], "use super::{trace::{self, Header}, report as r};");
    assert_eq!(graph.names(&[], "rules"), strings(&["report", "trace"]));
    assert!(graph.cycles().is_empty(), "{:?}", graph.cycles());
}

#[test]
fn the_reader_finds_a_planted_cycle() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("module_graph_planted");
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(root.join("src/engine")).unwrap();
    for (file, text) in [
        ("src/lib.rs", "mod engine; mod rules;"),
        ("src/rules.rs", "pub struct Rule;"),
        ("src/engine/mod.rs", "mod alerts; mod matching; mod process;"),
        ("src/engine/alerts.rs", "use super::matching::Match;"),
        ("src/engine/matching.rs", "pub fn f() -> crate::engine::process::Table { todo!() }"),
        ("src/engine/process.rs", "use crate::rules::Rule;\n#[cfg(test)]\nmod tests { use crate::engine::{alerts}; }"),
    ] {
        fs::write(root.join(file), text).unwrap();
    }
    let graph = CrateGraph::read(&root, root.parent().unwrap());
    assert_eq!(graph.files, 6);
    assert_eq!(
        graph.cycles(),
        [concat!(
            "src/engine/: alerts -> matching -> process -> alerts\n",
            "    alerts -> matching: module_graph_planted/src/engine/alerts.rs: super::matching::Match\n",
            "    matching -> process: module_graph_planted/src/engine/matching.rs: crate::engine::process::Table\n",
            "    process -> alerts: module_graph_planted/src/engine/process.rs: crate::engine::alerts",
        )]
    );
}
