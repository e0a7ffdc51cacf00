//! The kernel cache on disk across processes (`OFFLOAD_KERNEL_CACHE`), on a CUDA device:
//! a first process compiles a kernel and stores it, a second loads it from the disk
//! without compiling, a third finds the entry corrupt, ignores it, compiles and still
//! launches, and with the cache off nothing is read or written. Each process is a child
//! of this test binary with its own environment. Machines without a CUDA device skip.
//!
//! On a GPU machine: `cargo test -p offload-tests --test kernel_cache -- --nocapture`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use offload::{map, BackendKind, Runtime};

/// Set in the children, so that their test runs only there.
const CHILD: &str = "OFFLOAD_TEST_CHILD";
/// The child test.
const CHILD_TEST: &str = "child_launches_a_kernel_on_the_first_cuda_device";

#[offload::kernel]
fn kernel_cache_triple(i: usize, x: &mut [f32]) {
    x[i] *= 3.0;
}

/// The first CUDA device of a GPU runtime started from the process environment's kernel
/// cache setting, if there is one.
fn first_cuda_device(rt: &Runtime) -> Option<usize> {
    (0..rt.num_devices())
        .find(|&d| rt.describe(d).map(|desc| desc.kind == BackendKind::Cuda).unwrap_or(false))
}

#[test]
#[ignore = "run in a child process by a_second_process_loads_the_kernel_from_the_disk_cache"]
fn child_launches_a_kernel_on_the_first_cuda_device() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let rt = Runtime::builder().env(|_| None).gpus(true).host_devices(0).build().expect("runtime");
    let Some(d) = first_cuda_device(&rt) else {
        println!("no cuda device");
        return;
    };
    let gpu = rt.device(d).expect("device");
    let n = 4096;
    let mut x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let start = Instant::now();
    gpu.data(map::tofrom(&mut x), |v| kernel_cache_triple::launch(&gpu, n, v)).expect("launch");
    let first = start.elapsed();
    assert!(x.iter().enumerate().all(|(i, &v)| v == 3.0 * i as f32), "wrong result");
    let s = offload::kernel_cache::stats();
    println!(
        "cache: hits={} misses={} ignored={} stored={} not_stored={} first_launch_us={} location={:?}",
        s.hits,
        s.misses,
        s.ignored,
        s.stored,
        s.not_stored,
        first.as_micros(),
        offload::kernel_cache::location()
    );
}

/// The counts a child printed, by name.
fn count(out: &str, name: &str) -> u64 {
    // The line may follow the test harness's own `test name ... ` on the same line.
    let line = out
        .lines()
        .find_map(|l| l.find("cache: ").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("no counts in:\n{out}"));
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in: {line}"))
}

/// Runs the child with `OFFLOAD_KERNEL_CACHE` = `cache`; returns what it printed.
fn run_child(cache: &OsStr) -> String {
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args([CHILD_TEST, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("OFFLOAD_KERNEL_CACHE", cache)
        .output()
        .expect("the child runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed:\n{text}");
    text
}

/// The cache entries in `dir`.
fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension() == Some(OsStr::new("kernel")))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the directory when dropped.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_second_process_loads_the_kernel_from_the_disk_cache() {
    let has_cuda = offload_tests::backends()
        .iter()
        .any(|b| b.name == "gpu" && first_cuda_device(&b.runtime()).is_some());
    if !has_cuda {
        println!("SKIP kernel cache: no CUDA device");
        return;
    }
    let dir = std::env::temp_dir().join(format!("offload-kernel-cache-test-{}", std::process::id()));
    let _cleanup = Cleanup(dir.clone());
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.join("kernels");

    // First process: compiled, stored, in a directory private to the user.
    let out = run_child(cache.as_os_str());
    println!("first run:  {}", out.lines().find(|l| l.starts_with("cache: ")).unwrap_or(""));
    assert!(count(&out, "misses") >= 1 && count(&out, "hits") == 0, "{out}");
    assert!(count(&out, "stored") >= 1 && count(&out, "not_stored") == 0, "{out}");
    assert!(!entries(&cache).is_empty(), "nothing stored in {}", cache.display());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&cache).expect("the cache directory").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the cache directory's mode");
    }

    // Second process: every kernel from the disk, nothing compiled or written.
    let out = run_child(cache.as_os_str());
    println!("second run: {}", out.lines().find(|l| l.starts_with("cache: ")).unwrap_or(""));
    assert!(count(&out, "hits") >= 1, "{out}");
    assert_eq!((count(&out, "misses"), count(&out, "ignored"), count(&out, "stored")), (0, 0, 0), "{out}");
    // The goal of issue 23, item 5 (a first launch of a cached kernel within 5 ms), is
    // reported rather than asserted: a loaded machine may miss it.
    println!("first launch of a cached kernel: {} us (goal: 5000)", count(&out, "first_launch_us"));

    // Every entry's last byte flipped: ignored, compiled again, replaced; the launch works.
    for e in entries(&cache) {
        let mut bytes = std::fs::read(&e).expect("read an entry");
        if let Some(last) = bytes.last_mut() {
            *last ^= 0x5a;
        }
        std::fs::write(&e, &bytes).expect("write an entry");
    }
    let out = run_child(cache.as_os_str());
    println!("corrupted:  {}", out.lines().find(|l| l.starts_with("cache: ")).unwrap_or(""));
    assert!(count(&out, "ignored") >= 1 && count(&out, "hits") == 0 && count(&out, "stored") >= 1, "{out}");
    let out = run_child(cache.as_os_str());
    assert!(count(&out, "hits") >= 1 && count(&out, "ignored") == 0, "replaced entries load: {out}");

    // Off: nothing read, nothing written.
    let out = run_child(OsStr::new("off"));
    assert_eq!((count(&out, "hits"), count(&out, "misses"), count(&out, "stored")), (0, 0, 0), "{out}");
    assert!(out.contains("location=None"), "{out}");
}
