//! Settings read from the process environment, each in a child process of this binary with
//! an environment of its own: bad values are errors (not aborts, not silently ignored),
//! `OFFLOAD_REQUIRE_DEVICES` turns a skip for lack of devices into a failure, and the
//! process-wide runtime's `OFFLOAD_TRACE` file is whole however the process ends.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

use offload::{MapItem, MapType, Runtime};
use offload_tests::{on_every_backend, HOST_DEVICES, REQUIRE_DEVICES};

/// Set in the children, so that their tests run only there.
const CHILD: &str = "OFFLOAD_TEST_CHILD";

/// Every variable the children read, cleared unless a case sets it.
const VARS: [&str; 13] = [
    "OMP_TARGET_OFFLOAD",
    "OMP_DEFAULT_DEVICE",
    "OFFLOAD_HOST_DEVICES",
    "OFFLOAD_INFO",
    "OFFLOAD_MEMORY_POOL",
    "OFFLOAD_STAGING",
    "OFFLOAD_STREAMING_STORES",
    "OFFLOAD_POPULATE_THREADS",
    "OFFLOAD_SPLIT_CREWS",
    "OFFLOAD_TOPOLOGY_XML",
    "OFFLOAD_TRACE",
    "OFFLOAD_DUMP_KERNELS",
    REQUIRE_DEVICES,
];

/// Runs test `name` of this binary alone in a child process with `vars` set; returns whether
/// it passed and what it printed.
fn run_child(name: &str, vars: &[(&str, &OsStr)]) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--ignored", "--nocapture", "--test-threads=1"]).env(CHILD, "1");
    for v in VARS {
        cmd.env_remove(v);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

#[test]
#[ignore = "run in a child process by environment_values_that_are_not_accepted_are_errors"]
fn child_starts_a_runtime_from_the_environment() {
    if !in_child() {
        return;
    }
    match Runtime::builder().gpus(false).build() {
        Ok(rt) => println!("started with {} devices\n{}", rt.num_devices(), rt.device_report()),
        Err(e) => println!("error: {e}"),
    }
}

/// How `child_maps_through_the_omp_routines` ends its process (`OFFLOAD_TEST_END`).
const END: &str = "OFFLOAD_TEST_END";

#[test]
#[ignore = "run in a child process by the_global_runtimes_trace_file_is_whole_however_the_process_ends"]
fn child_maps_through_the_omp_routines() {
    if !in_child() {
        return;
    }
    let mut x = vec![1f32; 256];
    // SAFETY: `x` outlives both constructs and is not touched between them.
    unsafe {
        offload::omp::target_enter_data(0, &[MapItem::slice(&x, MapType::TO)]).expect("enter");
        offload::omp::target_exit_data(0, &[MapItem::slice_mut(&mut x, MapType::FROM)]).expect("exit");
    }
    println!("mapped");
    match std::env::var(END).as_deref() {
        Ok("exit") => std::process::exit(0),
        Ok("panic") => panic!("the program panics after mapping"),
        _ => {}
    }
}

/// A program of `offload::omp` routines never drops the process-wide runtime, and need not
/// call `flush_trace`: its trace file is written at exit all the same, whether `main`
/// returns, the program calls `std::process::exit`, or a panic unwinds out of it.
#[test]
fn the_global_runtimes_trace_file_is_whole_however_the_process_ends() {
    let child = "child_maps_through_the_omp_routines";
    for end in ["return", "exit", "panic"] {
        let path = std::env::temp_dir().join(format!("offload-exit-trace-{}-{end}.json", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let (ok, out) = run_child(
            child,
            &[
                ("OFFLOAD_HOST_DEVICES", OsStr::new("1")),
                ("OFFLOAD_TRACE", path.as_os_str()),
                (END, OsStr::new(end)),
            ],
        );
        assert!(out.contains("mapped"), "{end}: the child did not map: {out}");
        assert_eq!(ok, end != "panic", "{end}: {out}");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{end}: {}: {e}", path.display()));
        let _ = std::fs::remove_file(&path);
        let doc: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{end}: not JSON ({e}): {text:?}"));
        let events = doc["traceEvents"].as_array().unwrap_or_else(|| panic!("{end}: no traceEvents: {text}"));
        let constructs = events.iter().filter(|e| e["ph"] == "X" && e["cat"] == "construct").count();
        assert!(constructs >= 2, "{end}: {constructs} construct slices in {text}");
    }
}

/// With `OFFLOAD_HOST_DEVICES` unset and no GPU a program gets one host device, and the
/// device report says it was the default; `OFFLOAD_HOST_DEVICES=0` (or the builder's 0)
/// gives none, and beside GPUs the default is none.
#[test]
fn with_no_gpu_and_no_number_a_program_gets_one_host_device_and_is_told() {
    let child = "child_starts_a_runtime_from_the_environment";
    let (ok, out) = run_child(child, &[]);
    assert!(ok && out.contains("started with 1 devices"), "{out}");
    assert!(out.contains("host: 1 host device (the default with no GPU"), "{out}");
    let (ok, out) = run_child(child, &[("OFFLOAD_HOST_DEVICES", OsStr::new("0"))]);
    assert!(ok && out.contains("started with 0 devices"), "{out}");
    assert!(out.contains("host: 0 host devices (OFFLOAD_HOST_DEVICES)"), "{out}");

    let none = Runtime::builder().env(|_| None).gpus(false).host_devices(0).build().unwrap();
    assert_eq!(none.num_devices(), 0);
    let default = Runtime::builder().env(|_| None).gpus(false).build().unwrap();
    assert_eq!(default.num_devices(), 1, "{}", default.device_report());
    // Beside GPUs (where the machine has any) the default adds no host device.
    let with_gpus = Runtime::builder().env(|_| None).gpus(true).build().unwrap();
    let gpus = Runtime::builder().env(|_| None).gpus(true).host_devices(0).build().unwrap().num_devices();
    let report = with_gpus.device_report();
    if gpus > 0 {
        assert_eq!(with_gpus.num_devices(), gpus, "{report}");
        assert!(
            report.contains("host: 0 host devices (OFFLOAD_HOST_DEVICES unset: none beside GPUs)"),
            "{report}"
        );
    } else {
        assert_eq!(with_gpus.num_devices(), 1, "{report}");
    }
}

#[test]
fn environment_values_that_are_not_accepted_are_errors() {
    let child = "child_starts_a_runtime_from_the_environment";
    let (ok, out) = run_child(child, &[("OFFLOAD_HOST_DEVICES", OsStr::new("3"))]);
    assert!(ok && out.contains("started with 3 devices"), "{out}");
    for (var, value, expect) in [
        ("OFFLOAD_HOST_DEVICES", &b"2\xff"[..], "UTF-8"),
        ("OFFLOAD_HOST_DEVICES", b"100000", "from 0 to 64"),
        ("OFFLOAD_HOST_DEVICES", b"65", "from 0 to 64"),
        ("OFFLOAD_INFO", b"\xfe", "UTF-8"),
        ("OMP_TARGET_OFFLOAD", b"default\xff", "UTF-8"),
        ("OFFLOAD_TOPOLOGY_XML", b"/tmp/\xff.xml", "UTF-8"),
        ("OFFLOAD_TRACE", b" ", "Chrome trace-event file"),
        ("OFFLOAD_TRACE", b"/nonexistent-offload-dir/t.json", "existing folder"),
        ("OFFLOAD_POPULATE_THREADS", b"-1", "0..=1024 threads"),
        ("OFFLOAD_DUMP_KERNELS", b" ", "every kernel's CUDA and HIP source"),
        ("OFFLOAD_DUMP_KERNELS", b"/proc/offload-cannot-make-this", "a folder"),
    ] {
        let (ok, out) = run_child(child, &[(var, OsStr::from_bytes(value))]);
        assert!(ok, "{var}: the child crashed: {out}");
        assert!(out.contains(&format!("error: {var}=")) && out.contains(expect), "{var}: {out}");
    }
}

#[test]
#[ignore = "run in a child process by a_skip_fails_when_devices_are_required"]
fn child_runs_a_case_that_needs_more_host_devices_than_there_are() {
    if !in_child() {
        return;
    }
    on_every_backend("a case for many devices", HOST_DEVICES + 1, |b| b, |_| Ok(()));
    println!("case finished");
}

#[test]
fn a_skip_fails_when_devices_are_required() {
    let child = "child_runs_a_case_that_needs_more_host_devices_than_there_are";
    let (ok, out) = run_child(child, &[]);
    assert!(
        ok && out.contains("SKIP a case for many devices on host") && out.contains("case finished"),
        "{out}"
    );
    let required = (HOST_DEVICES + 1).to_string();
    // The host backend skips (and a GPU backend, on a machine with fewer GPUs or none).
    let (ok, out) = run_child(child, &[(REQUIRE_DEVICES, OsStr::new(&required))]);
    assert!(!ok && out.contains("not skipping: ") && !out.contains("case finished"), "{out}");
    assert!(out.contains(&format!("{REQUIRE_DEVICES}={required} requires {required} devices")), "{out}");
    // Asking for no more than the backend has lets the case skip.
    let (ok, out) = run_child(child, &[(REQUIRE_DEVICES, OsStr::new("1"))]);
    let gpus_absent = out.contains("SKIP gpu backends") || out.contains("not skipping: gpu backends");
    if !gpus_absent {
        assert!(ok && out.contains("case finished"), "{out}");
    } else {
        // No GPU here: a missing GPU backend is itself a skip that one required device fails.
        assert!(!ok && out.contains("not skipping: gpu backends"), "{out}");
    }
    let (ok, out) = run_child(child, &[(REQUIRE_DEVICES, OsStr::new("plenty"))]);
    assert!(!ok && out.contains("OFFLOAD_REQUIRE_DEVICES=\"plenty\" is not valid"), "{out}");
}
