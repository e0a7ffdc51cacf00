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

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let src = manifest.join("../runtime/src").canonicalize().expect("runtime/src exists");
    println!("cargo:rerun-if-changed={}", src.display());
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut out = String::from("/// `runtime/src`'s files: (path relative to it, text).\n");
    out.push_str("pub const RUNTIME_SOURCES: &[(&str, &str)] = &[\n");
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src").to_string_lossy().replace('\\', "/");
        out.push_str(&format!("    ({rel:?}, include_str!({:?})),\n", f.display().to_string()));
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("runtime_sources.rs");
    std::fs::write(dest, out).expect("OUT_DIR is writable");
}
