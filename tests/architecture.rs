//! The runtime crate's modules are layered one way down, with no import cycle: each
//! top-level module of `runtime/src` (a file, or a directory with its submodules) may use
//! modules of its own layer or of the layers below it ([`LAYERS`]), never above, and the
//! graph has no cycle (so within a layer, too, uses go one way). Vendor libraries (`cudarc`,
//! `libloading`, which loads HIP) are named only in `backend/` (`libloading` only in `backend/hip/`),
//! and `hwlocality` only in `backend/topology.rs`.
//! Submodules of one directory may refer to each other and to their parent.
//!
//! The module graph is read from the sources (`crate::NAME` paths outside comments and
//! outside `#[cfg(test)] mod tests`), embedded at build time (`tests/build.rs`), so this
//! runs without any device and from any folder.

use std::collections::{BTreeMap, BTreeSet};

include!(concat!(env!("OUT_DIR"), "/runtime_sources.rs"));

/// The layers, top first: a module may use its own layer's modules and those below.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "front ends",
        &[
            "lib",
            "api",
            "omp",
            "nowait",
            "pipeline",
            "partition",
            "recording",
            "cluster",
            "collective",
            "macro_support",
            "soak",
            "tensor",
            "weights",
        ],
    ),
    ("runtime", &["rt"]),
    ("generic device", &["device"]),
    ("device services", &["services"]),
    ("backends", &["backend"]),
    (
        "foundation",
        &["kernel", "gemm", "index_space", "trace", "fork_join", "latch", "origin", "range", "error"],
    ),
];

/// The top-level module a file of `runtime/src` belongs to.
fn top_module(rel: &str) -> String {
    rel.split('/').next().unwrap_or(rel).trim_end_matches(".rs").to_string()
}

/// The code of a file that counts for the graph: no unit-test module, no comment lines.
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    code.lines().filter(|l| !l.trim_start().starts_with("//"))
}

/// The crate root's re-exports: item name -> the top-level module it comes from, read
/// from `lib.rs`'s `pub use MODULE::...` lines (`pub use error::{Error, HostRange, Result};`,
/// `pub use runtime::memcpy;`), so that a use through the root (`crate::Error`) counts as
/// a use of its module.
fn root_exports(sources: &[(&str, &str)]) -> BTreeMap<String, String> {
    let lib = sources.iter().find(|(rel, _)| *rel == "lib.rs").map_or("", |(_, t)| t);
    let mut out = BTreeMap::new();
    let mut lines = code_lines(lib).map(str::trim);
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("pub use ") else { continue };
        let module: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
        if module.is_empty() || !rest[module.len()..].starts_with("::") {
            continue;
        }
        // The statement, over as many lines as it takes.
        let mut text = rest.to_string();
        while !text.contains(';') {
            match lines.next() {
                Some(more) => text.push_str(more),
                None => break,
            }
        }
        let items = text.trim_end_matches(';').rsplit("::").next().unwrap_or_default();
        for item in items.trim_matches(|c| c == '{' || c == '}').split(',') {
            // `a as b` exports `b`.
            let name = item.split(" as ").last().unwrap_or_default().trim();
            if !name.is_empty() {
                out.insert(name.to_string(), module.clone());
            }
        }
    }
    out
}

/// Top-level module -> the top-level modules its code names, directly (`crate::device`) or
/// through the crate root's re-exports (`crate::Error`, `use crate::{map, Error}`).
fn module_graph(sources: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
    let exports = root_exports(sources);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let ident =
        |s: &str| -> String { s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    for (rel, text) in sources {
        let module = top_module(rel);
        let deps = graph.entry(module.clone()).or_default();
        for line in code_lines(text) {
            for (i, _) in line.match_indices("crate::") {
                let after = &line[i + 7..];
                // `crate::{a, B}`: each name of the group.
                let names: Vec<String> = match after.strip_prefix('{') {
                    Some(group) => group.split([',', '}']).map(|n| ident(n.trim())).collect(),
                    None => vec![ident(after)],
                };
                for name in names {
                    let used = match exports.get(&name) {
                        Some(m) => m.clone(),
                        None if name.starts_with(|c: char| c.is_ascii_lowercase()) => name,
                        None => continue,
                    };
                    if used != module {
                        deps.insert(used);
                    }
                }
            }
        }
    }
    graph
}

/// Each use of a module in a higher layer than the user's: (user, used).
fn upward_uses(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let layer = |m: &str| LAYERS.iter().position(|(_, ms)| ms.contains(&m));
    let mut up = Vec::new();
    for (m, deps) in graph {
        for d in deps.iter().filter(|d| graph.contains_key(*d)) {
            if let (Some(a), Some(b)) = (layer(m), layer(d)) {
                if b < a {
                    up.push((m.clone(), d.clone()));
                }
            }
        }
    }
    up
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
    let graph = module_graph(RUNTIME_SOURCES);
    assert!(graph.len() > 10, "read {} modules", graph.len());
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle between runtime modules: {}", cycle.join(" -> "));
    }
}

#[test]
fn every_module_has_a_layer_and_uses_only_its_own_and_lower_ones() {
    let graph = module_graph(RUNTIME_SOURCES);
    let unplaced: Vec<&String> =
        graph.keys().filter(|m| !LAYERS.iter().any(|(_, ms)| ms.contains(&m.as_str()))).collect();
    assert!(unplaced.is_empty(), "modules with no layer in tests/architecture.rs: {unplaced:?}");
    let up = upward_uses(&graph);
    assert!(up.is_empty(), "modules using a higher layer (user, used): {up:?}");
}

#[test]
fn vendor_libraries_are_named_only_in_their_layer() {
    for (rel, text) in RUNTIME_SOURCES {
        for line in code_lines(text) {
            for (lib, home) in [
                ("cudarc", "backend/"),
                ("libloading", "backend/hip/"),
                ("hwlocality", "backend/topology.rs"),
            ] {
                let named = line.match_indices(lib).any(|(i, _)| {
                    let before = line[..i].chars().next_back();
                    !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                });
                assert!(
                    !named || rel.starts_with(home),
                    "{rel} names {lib}, which belongs in {home}: {line}"
                );
            }
        }
    }
}

/// Whether `line` makes a raw CUDA driver call (`sys::cuXxx`, cudarc's `driver::result`)
/// or declares a foreign function (`extern "C" {`).
fn raw_vendor_call(line: &str) -> bool {
    let driver_fn = line
        .match_indices("sys::cu")
        .any(|(i, m)| line[i + m.len()..].chars().next().is_some_and(|c| c.is_ascii_uppercase()));
    driver_fn
        || line.contains("driver::result")
        || line.contains("driver::{result")
        || line.contains("extern \"C\" {")
}

/// Raw vendor calls live in one file per vendor: the CUDA driver's in
/// `backend/cuda/driver.rs` (each with its contract), HIP's through the table of the
/// runtime loaded at run time in `backend/hip/api.rs` (NVRTC's and cuBLASLt's own calls
/// stay with their concerns, `nvrtc.rs` and `cublaslt.rs`, which name no driver call).
#[test]
fn raw_driver_calls_live_in_one_file_per_vendor() {
    let homes = ["backend/cuda/driver.rs", "backend/hip/api.rs"];
    let found: Vec<String> = RUNTIME_SOURCES
        .iter()
        .filter(|(rel, _)| !homes.contains(rel))
        .flat_map(|(rel, text)| {
            code_lines(text).filter(|l| raw_vendor_call(l)).map(move |l| format!("{rel}: {}", l.trim()))
        })
        .collect();
    assert!(found.is_empty(), "raw driver calls outside their vendor's file:\n{}", found.join("\n"));
    let cuda_home = RUNTIME_SOURCES.iter().find(|(rel, _)| *rel == homes[0]);
    assert!(
        cuda_home.is_some_and(|(_, text)| code_lines(text).any(raw_vendor_call)),
        "{} not seen",
        homes[0]
    );
    assert!(raw_vendor_call("unsafe { sys::cuMemAlloc_v2(&mut p, n) }"));
    assert!(raw_vendor_call("use cudarc::driver::{result, sys};"));
    assert!(!raw_vendor_call("let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;"));
}

/// The places in `line` where a front end reaches past the runtime.
fn reaches_past_the_runtime(line: &str) -> usize {
    let paths = ["crate::device::", "crate::backend::", ".device_state(", ".settled(", ".backend."];
    let mut n: usize = paths.iter().map(|p| line.matches(p).count()).sum();
    n += line.matches("rt.target(").count();
    n
}

/// Front ends go through the runtime (the one door): they name no path of the generic
/// device or of the backends (the crate root's public types, such as `crate::BackendKind`,
/// are the API's vocabulary), and take no device state from the runtime (`device_state`,
/// `target`, `settled`). A construct a front end needs is a `Runtime` method.
#[test]
fn front_ends_reach_the_devices_only_through_the_runtime() {
    let front: &[&str] = LAYERS[0].1;
    let mut found = Vec::new();
    for (rel, text) in RUNTIME_SOURCES {
        if !front.contains(&top_module(rel).as_str()) {
            continue;
        }
        found.extend(
            code_lines(text)
                .filter(|l| reaches_past_the_runtime(l) > 0)
                .map(|l| format!("{rel}: {}", l.trim())),
        );
    }
    assert!(
        found.is_empty(),
        "front ends reaching past the runtime (make these Runtime methods):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_one_door_check_finds_a_front_end_taking_device_state() {
    assert_eq!(reaches_past_the_runtime("let d = self.rt.device_state(n)?; d.backend.sync()"), 2);
    assert_eq!(reaches_past_the_runtime("use crate::device::{BlocksInUse, Target};"), 1);
    assert_eq!(reaches_past_the_runtime("rt.describe(d)?.kind == crate::BackendKind::Host"), 0);
}

#[test]
fn uses_through_the_crate_roots_re_exports_count() {
    let lib = "pub use error::{Error, HostRange, Result};\npub use rt::memcpy;\npub use kernel::{\n    Kernel,\n    KernelArg as Arg,\n};\n";
    let sources = [
        ("lib.rs", lib),
        ("gemm.rs", "fn f() -> crate::Result<()> { crate::Arg::x() }\nuse crate::{memcpy, index_space};\n"),
    ];
    let graph = module_graph(&sources);
    let deps: Vec<&str> = graph["gemm"].iter().map(String::as_str).collect();
    assert_eq!(deps, ["error", "index_space", "kernel", "rt"]);
    // And the re-exports of the real crate are read.
    let exports = root_exports(RUNTIME_SOURCES);
    assert_eq!(exports.get("Error").map(String::as_str), Some("error"));
    assert_eq!(exports.get("Runtime").map(String::as_str), Some("rt"));
}

/// docs/ARCHITECTURE.md's drawing of the layers (its `L<k>["name: modules"]` lines), as
/// (layer name, modules), top first.
fn drawn_layers(doc: &str) -> Vec<(String, Vec<String>)> {
    doc.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('L') && l.contains("[\"") && l.ends_with("\"]"))
        .filter_map(|l| {
            let inner = &l[l.find("[\"")? + 2..l.len() - 2];
            let (name, modules) = inner.split_once(": ")?;
            Some((name.to_string(), modules.split(", ").map(str::to_string).collect()))
        })
        .collect()
}

#[test]
fn the_drawing_in_architecture_md_is_the_enforced_layers() {
    let drawn = drawn_layers(include_str!("../docs/ARCHITECTURE.md"));
    let enforced: Vec<(String, Vec<String>)> = LAYERS
        .iter()
        .map(|(name, ms)| (name.to_string(), ms.iter().map(|m| m.to_string()).collect()))
        .collect();
    assert_eq!(drawn, enforced, "docs/ARCHITECTURE.md's layer drawing against LAYERS here: redraw it");
}

#[test]
fn the_layer_check_finds_upward_uses() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("error".into()).or_default().insert("rt".into());
    g.entry("rt".into()).or_default().insert("error".into());
    assert_eq!(upward_uses(&g), [("error".to_string(), "rt".to_string())]);
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

/// The longest a function outside the tests may be, in lines.
const LONGEST_FUNCTION: usize = 200;

/// Whether `line` (trimmed) begins a function item: `fn name`, after any of `pub`,
/// `pub(crate)`, `const`, `unsafe`, `async`, `extern "C"`.
fn starts_fn(line: &str) -> Option<&str> {
    let mut rest = line;
    loop {
        let before = rest;
        for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "unsafe ", "async ", "extern \"C\" "] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        if rest == before {
            break;
        }
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(name.len());
    (end > 0).then(|| &name[..end])
}

/// Functions of `text` (rustfmt's layout: a body's closing brace at its `fn`'s
/// indentation) longer than `most` lines, as (name, first line, lines); `#[test]`
/// functions and `#[cfg(test)]` modules are skipped.
fn long_functions(text: &str, most: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    // The line after `from` that closes what opens at indentation `at`.
    let close = |from: usize, at: usize| {
        (from..lines.len()).find(|&j| indent(lines[j]) == at && lines[j].trim_start().starts_with('}'))
    };
    let mut long = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let prev = if i > 0 { lines[i - 1].trim() } else { "" };
        let at = indent(line);
        if line.trim() == "#[cfg(test)]"
            && lines.get(i + 1).is_some_and(|l| l.trim_start().starts_with("mod "))
        {
            i = close(i + 2, indent(lines[i + 1])).map_or(lines.len(), |j| j + 1);
            continue;
        }
        if let Some(name) = starts_fn(line.trim_start()) {
            // The signature ends at the line that opens the body, or ends a declaration.
            let Some(open) = (i..lines.len()).find(|&j| {
                let l = lines[j].trim_end();
                l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
            }) else {
                break;
            };
            let opened = lines[open].trim_end().ends_with('{');
            if opened {
                let end = close(open + 1, at).unwrap_or(lines.len() - 1);
                let n = end - i + 1;
                if n > most && prev != "#[test]" {
                    long.push((name.to_string(), i + 1, n));
                }
            }
        }
        i += 1;
    }
    long
}

#[test]
fn no_function_outside_the_tests_is_over_200_lines() {
    let mut long = Vec::new();
    for (path, text) in CODE_SOURCES {
        for (name, line, n) in long_functions(text, LONGEST_FUNCTION) {
            long.push(format!("{path}:{line}: fn {name} has {n} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "functions over {LONGEST_FUNCTION} lines (split them by what they do):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_length_check_measures_bodies_and_skips_tests() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let text = format!(
        "pub(crate) unsafe fn long(\n    a: u8,\n) -> u8 {{\n{}}}\n\nfn short() {{}}\ntrait T {{\n    fn decl(&self);\n}}\n\
         #[test]\nfn a_test() {{\n{}}}\n#[cfg(test)]\nmod tests {{\n    fn helper() {{\n{}    }}\n}}\n\
         impl S {{\n    fn method(&self) {{\n{}    }}\n}}\n",
        body(5),
        body(9),
        body(9),
        body(6)
    );
    assert_eq!(long_functions(&text, 6), vec![("long".to_string(), 1, 9), ("method".to_string(), 42, 8)]);
    assert_eq!(starts_fn("pub const unsafe fn f<T>()"), Some("f"));
    assert_eq!(starts_fn("let fn_name = 1;"), None);
}
