//! Embeds the runtime crate's sources for `tests/architecture.rs`, so that its test binary
//! checks the layering from any folder (the GPU machine runs bundled binaries elsewhere).

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let p = entry.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// `files` as a Rust slice of (path relative to `base`, text) pairs named `name`.
fn embed(name: &str, doc: &str, base: &Path, files: &[PathBuf]) -> String {
    let mut out = format!("/// {doc}\npub const {name}: &[(&str, &str)] = &[\n");
    for f in files {
        let rel = f.strip_prefix(base).expect("under base").to_string_lossy().replace('\\', "/");
        out.push_str(&format!("    ({rel:?}, include_str!({:?})),\n", f.display().to_string()));
    }
    out.push_str("];\n");
    out
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.join("..").canonicalize().expect("the workspace root exists");
    let src = root.join("runtime/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut out =
        embed("RUNTIME_SOURCES", "`runtime/src`'s files: (path relative to it, text).", &src, &files);
    // The code that is not tests, for the length of its functions.
    let mut code = Vec::new();
    for dir in ["runtime/src", "runtime/macros/src", "kernels/src", "examples", "benches", "tests/src"] {
        let dir = root.join(dir);
        println!("cargo:rerun-if-changed={}", dir.display());
        rust_files(&dir, &mut code);
    }
    // Test modules kept in files of their own, and example tests, are tests.
    code.retain(|f| {
        let rel = f.strip_prefix(&root).expect("under the root").to_string_lossy().replace('\\', "/");
        !rel.ends_with("/tests.rs") && !rel.starts_with("examples/tests/")
    });
    code.sort();
    out.push_str(&embed(
        "CODE_SOURCES",
        "The workspace's code outside its test suites: (path relative to the root, text).",
        &root,
        &code,
    ));
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("runtime_sources.rs");
    std::fs::write(dest, out).expect("OUT_DIR is writable");
}
