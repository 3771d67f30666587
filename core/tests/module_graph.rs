//! The core's top-level modules form no cycle: `rules` knows nothing of `engine`, and what sits
//! above both (`samples`, `pipeline`, `report`) is not imported back. Read from the sources
//! (tests included), so that a `use crate::...` that closes a loop fails here.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

/// Top-level module -> the top-level modules its files name through `crate::`.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut pending = vec![src.clone()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let relative = path.strip_prefix(&src).unwrap();
            let top = relative.components().next().unwrap().as_os_str().to_string_lossy();
            let module = top.trim_end_matches(".rs").to_owned();
            if module == "lib" || path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let text = fs::read_to_string(&path).unwrap();
            let names = graph.entry(module.clone()).or_default();
            names.extend(crate_paths(&text).into_iter().filter(|name| *name != module));
        }
    }
    graph
}

/// The first segment of every `crate::` path, in `crate::a::b` and in `use crate::{a, b::c}`.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_ascii_lowercase() || c == '_') => {
                        let word: String =
                            group[i..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                        names.insert(word);
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let word: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if !word.is_empty() {
                names.insert(word);
            }
        }
    }
    names
}

/// A cycle through `from`, as the path that closes it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>, path: &mut Vec<String>) -> Option<Vec<String>> {
    let last = path.last()?.clone();
    for next in graph.get(&last).into_iter().flatten() {
        if let Some(start) = path.iter().position(|m| m == next) {
            let mut found = path[start..].to_vec();
            found.push(next.clone());
            return Some(found);
        }
        path.push(next.clone());
        if let Some(found) = cycle(graph, path) {
            return Some(found);
        }
        path.pop();
    }
    None
}

#[test]
fn the_core_modules_form_no_cycle() {
    let graph = module_graph();
    assert!(graph.contains_key("rules") && graph.contains_key("engine"), "{graph:?}");
    for module in graph.keys() {
        if let Some(found) = cycle(&graph, &mut vec![module.clone()]) {
            panic!("module cycle: {}", found.join(" -> "));
        }
    }
    assert!(!graph["rules"].contains("engine"), "rules must not use the engine: {:?}", graph["rules"]);
}

#[test]
fn the_reader_sees_both_spellings_of_a_crate_path() {
    let text = "use crate::{\n    alert::Alert,\n    engine::{Engine, x::y},\n    rules,\n};\nfn f() { crate::output::escape(\"\"); }";
    let names: Vec<String> = crate_paths(text).into_iter().collect();
    assert_eq!(names, ["alert", "engine", "output", "rules"]);
    // A loop is found, so the check above can fail.
    let graph = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(cycle(&graph, &mut vec!["a".to_owned()]), Some(vec!["a".to_owned(), "b".to_owned(), "a".to_owned()]));
}
