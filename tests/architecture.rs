//! The runtime crate's modules form no import cycle: each top-level module of
//! `runtime/src` (a file, or a directory with its submodules) may use only modules below
//! it. Submodules of one directory may refer to each other and to their parent.
//!
//! The module graph is read from the sources (`crate::NAME` paths outside comments and
//! outside `#[cfg(test)] mod tests`), so this runs without any device.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `runtime/src`, from the repository root (the working directory of bundled tests) or
/// from this crate's manifest directory.
fn runtime_src() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime/src");
    if here.is_dir() {
        here
    } else {
        PathBuf::from("runtime/src")
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("runtime/src is readable") {
        let p = entry.expect("directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Top-level module -> the top-level modules its code names.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src");
        let top = rel.components().next().expect("a component").as_os_str().to_string_lossy();
        let module = top.trim_end_matches(".rs").to_string();
        let text = std::fs::read_to_string(&f).expect("source is readable");
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
        let deps = graph.entry(module.clone()).or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let name: String =
                    line[i + 7..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                if !name.is_empty() && name != module {
                    deps.insert(name);
                }
            }
        }
    }
    graph
}

/// A cycle of `graph`, if it has one (depth-first search for a back edge).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        v: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == v) {
            let mut cycle = path[at..].to_vec();
            cycle.push(v.to_string());
            return Some(cycle);
        }
        if done.contains(v) {
            return None;
        }
        path.push(v.to_string());
        for w in g.get(v).into_iter().flatten().filter(|w| g.contains_key(*w)) {
            if let Some(c) = visit(g, w, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(v.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|v| visit(graph, v, &mut Vec::new(), &mut done))
}

#[test]
fn the_runtime_modules_have_no_import_cycle() {
    let graph = module_graph(&runtime_src());
    assert!(graph.len() > 10, "read {} modules from {}", graph.len(), runtime_src().display());
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle between runtime modules: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let g = |edges: &[(&str, &str)]| {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for &(a, b) in edges {
            m.entry(a.into()).or_default().insert(b.into());
            m.entry(b.into()).or_default();
        }
        m
    };
    assert_eq!(find_cycle(&g(&[("a", "b"), ("b", "c")])), None);
    let c = find_cycle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])).expect("a cycle");
    assert_eq!(c.first(), c.last());
    assert_eq!(c.len(), 4);
}
