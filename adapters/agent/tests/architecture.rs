//! The agent crate's shape, checked on its source (as rust-analyzer's tidy tests do):
//!
//! - no import circles: the graph of which module refers to which (`use` and paths,
//!   `crate::`, `super::`, `self::` and a `mod.rs`'s own children; comments and `#[cfg(test)]`
//!   modules left out) has no cycle, so no module uses one that uses it back;
//! - `daemon` and `cli` are separate parts: neither refers to the other, the shared modules
//!   refer to neither, and each binary refers only to its own part (`lockstepd` to
//!   `daemon`, `lockstep` to `cli`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Every module of the library, by path (`datadir::agent_conf`), with its source file.
fn modules() -> BTreeMap<String, PathBuf> {
    fn walk(directory: &Path, prefix: &[String], modules: &mut BTreeMap<String, PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(directory)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if prefix.is_empty() && name == "bin" {
                    continue;
                }
                let mut inner = prefix.to_vec();
                inner.push(name);
                walk(&path, &inner, modules);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let mut segments = prefix.to_vec();
                if name != "mod" && name != "lib" {
                    segments.push(name);
                }
                modules.insert(segments.join("::"), path);
            }
        }
    }
    let mut modules = BTreeMap::new();
    walk(Path::new(SOURCE), &[], &mut modules);
    modules
}

/// The code of a file without comments and without its `#[cfg(test)]` modules.
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]" {
            // Skip the item that follows: up to the line closing it at the same indent.
            let indent = line.len() - trimmed.len();
            let opening = lines.next().unwrap_or_default();
            if opening.trim_end().ends_with('{') {
                for inner in lines.by_ref() {
                    let inner_trimmed = inner.trim_start();
                    if inner.len() - inner_trimmed.len() == indent && inner_trimmed.starts_with('}')
                    {
                        break;
                    }
                }
            }
            continue;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let without_comment = match line.find("// ") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        };
        code.push_str(without_comment);
        code.push('\n');
    }
    code
}

/// The paths in `code` that start with `root` (e.g. `crate::`), as segments after it.
fn paths_after(code: &str, root: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(root) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + root.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let mut segments = Vec::new();
        let mut tail = rest;
        loop {
            let length = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            if length == 0 {
                break;
            }
            segments.push(tail[..length].to_owned());
            match tail[length..].strip_prefix("::") {
                Some(next) => tail = next,
                None => break,
            }
        }
        found.push(segments);
    }
    found
}

/// The longest module of `modules` that `segments` (an absolute path) starts with.
fn resolve(modules: &BTreeMap<String, PathBuf>, segments: &[String]) -> Option<String> {
    (1..=segments.len())
        .rev()
        .map(|length| segments[..length].join("::"))
        .find(|candidate| modules.contains_key(candidate))
}

/// Which modules each module refers to (itself excluded).
fn graph(modules: &BTreeMap<String, PathBuf>) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph = BTreeMap::new();
    for (module, path) in modules {
        let code = code_of(path);
        let own: Vec<String> = if module.is_empty() {
            Vec::new()
        } else {
            module.split("::").map(str::to_owned).collect()
        };
        let is_directory_root = path.ends_with("mod.rs") || path.ends_with("lib.rs");
        // `super::` is relative to the module's parent.
        let parent = &own[..own.len().saturating_sub(1)];
        let mut absolute: Vec<Vec<String>> = paths_after(&code, "crate::");
        for segments in paths_after(&code, "super::") {
            absolute.push(parent.iter().cloned().chain(segments).collect());
        }
        for segments in paths_after(&code, "self::") {
            absolute.push(own.iter().cloned().chain(segments).collect());
        }
        if is_directory_root {
            // `pub use child::Item;` in a mod.rs names a child without `self::`.
            for segments in paths_after(&code, "use ") {
                let child: Vec<String> = own.iter().cloned().chain(segments).collect();
                if child.len() > own.len() && modules.contains_key(&child[..=own.len()].join("::"))
                {
                    absolute.push(child);
                }
            }
        }
        let targets: BTreeSet<String> = absolute
            .iter()
            .filter_map(|segments| resolve(modules, segments))
            .filter(|target| target != module && !target.is_empty())
            .collect();
        graph.insert(module.clone(), targets);
    }
    graph
}

fn part(module: &str) -> &str {
    module.split("::").next().unwrap_or("")
}

#[test]
fn the_module_graph_is_what_the_checks_below_read() {
    let modules = modules();
    let graph = graph(&modules);
    // The checks are only as good as the graph: pin a few edges known to exist.
    for (from, to) in [
        ("daemon::worker", "daemon::driver"),
        ("daemon::driver", "daemon::step_runner"),
        ("cli::ha", "cli::bootstrap"),
        ("store", "datadir"),
        ("datadir", "datadir::agent_conf"),
        ("datadir::agent_conf", "datadir::layout"),
    ] {
        assert!(
            graph.get(from).is_some_and(|targets| targets.contains(to)),
            "{from} -> {to} not seen; the graph: {graph:#?}"
        );
    }
}

#[test]
fn no_module_uses_one_that_uses_it_back() {
    let graph = graph(&modules());
    // Depth-first search for a cycle; report it whole.
    fn visit(
        module: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if let Some(at) = stack.iter().position(|on| on == module) {
            panic!("import circle: {} -> {module}", stack[at..].join(" -> "));
        }
        if done.contains(module) {
            return;
        }
        stack.push(module.to_owned());
        for target in &graph[module] {
            visit(target, graph, stack, done);
        }
        stack.pop();
        done.insert(module.to_owned());
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        visit(module, &graph, &mut Vec::new(), &mut done);
    }
}

#[test]
fn the_daemon_and_the_cli_are_separate_parts() {
    let graph = graph(&modules());
    for (module, targets) in &graph {
        for target in targets {
            let allowed = match (part(module), part(target)) {
                ("daemon", "cli") | ("cli", "daemon") => false,
                // The shared modules (and the API's state, which the daemon serves) belong to
                // neither part.
                (from, "daemon" | "cli") => from == part(target),
                _ => true,
            };
            assert!(allowed, "{module} refers to {target}");
        }
    }
    for (binary, own, other) in [
        ("lockstepd", "daemon", "cli"),
        ("lockstep", "cli", "daemon"),
    ] {
        let code = code_of(&Path::new(SOURCE).join("bin").join(format!("{binary}.rs")));
        let parts: BTreeSet<String> = paths_after(&code, "lockstep_agent::")
            .into_iter()
            .filter_map(|segments| segments.into_iter().next())
            .collect();
        assert!(parts.contains(own), "{binary} uses {parts:?}");
        assert!(!parts.contains(other), "{binary} uses {other}: {parts:?}");
    }
}

/// The machine agent reaches state through the API only: `daemon::machine_agent` names no
/// store (neither the store crate nor the agent's `store` module) and none of the API's
/// state side (`api::*`). (Modules it uses for other things, the step runner among them,
/// have store code of their own for controllers; this checks what the machine agent itself
/// refers to.)
#[test]
fn the_machine_agent_refers_to_no_store() {
    let modules = modules();
    let graph = graph(&modules);
    let uses = graph
        .get("daemon::machine_agent")
        .expect("the machine agent's module");
    assert!(!uses.is_empty(), "the graph reads no module");
    for module in uses {
        assert!(
            module != "store" && module != "api" && !module.starts_with("api::"),
            "daemon::machine_agent refers to {module}"
        );
    }
    let code = code_of(&modules["daemon::machine_agent"]);
    assert!(
        !code.contains("lockstep_store"),
        "daemon::machine_agent refers to lockstep_store"
    );
}
