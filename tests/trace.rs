//! `OFFLOAD_TRACE` / `RuntimeBuilder::trace_file`: the Chrome trace-event timeline
//! (docs/GUIDE.md, "Timeline traces"), read back with `serde_json`.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use offload::{map, MapItem, MapType, Result, Runtime, RuntimeBuilder};
use offload_tests::{fill_device, synchronous};
use serde_json::Value;

/// A fresh path in the temporary folder, removed when dropped.
struct TempPath(PathBuf);

impl TempPath {
    fn new(what: &str) -> Self {
        let p = std::env::temp_dir().join(format!("offload-trace-{what}-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Self(p)
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Two host devices, nothing from the process environment but `OFFLOAD_SYNC`.
fn builder() -> RuntimeBuilder {
    Runtime::builder().env(|_| None).gpus(false).host_devices(2).synchronous(synchronous())
}

/// The trace's events, failing the test on a file that is not a trace.
fn events_of(path: &TempPath) -> Vec<Value> {
    let text = std::fs::read_to_string(&path.0).unwrap_or_else(|e| panic!("{}: {e}", path.0.display()));
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON: {e}\n{text}"));
    assert_eq!(doc["displayTimeUnit"], "ns");
    doc["traceEvents"].as_array().cloned().unwrap_or_else(|| panic!("no traceEvents: {text}"))
}

fn ts(e: &Value) -> f64 {
    e["ts"].as_f64().unwrap_or_else(|| panic!("no ts: {e}"))
}

#[test]
fn a_region_and_an_enter_exit_pair_make_a_timeline() -> Result<()> {
    let path = TempPath::new("timeline");
    let rt = builder().trace_file(&path.0).build()?;
    let gpu = rt.device(0)?;
    let mut x = vec![0i32; 4096];
    gpu.data(map::tofrom(&mut x), |v| offload_kernels::fill_i32(&gpu, 7, v))?;
    assert!(x.iter().all(|&v| v == 7));
    let mut y = vec![1i32; 1024];
    // SAFETY: `y` stays alive and is not touched on the host until the exit below.
    unsafe { rt.enter_data(1, &[MapItem::slice(&y, MapType::TO)])? };
    fill_device(&rt, 1, &y, 3)?;
    // SAFETY: as above; the exit copies into `y`, not otherwise borrowed.
    unsafe { rt.exit_data(1, &[MapItem::slice_mut(&mut y, MapType::FROM)])? };
    assert!(y.iter().all(|&v| v == 3));
    rt.synchronize(0)?;
    rt.synchronize(1)?;
    rt.flush_trace()?;
    let events = events_of(&path);

    // A process per device and one for the host.
    let process = |pid: u64| {
        events
            .iter()
            .find(|e| e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == pid)
            .map(|e| e["args"]["name"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(process(0).as_deref(), Some("host"));
    assert_eq!(process(1).as_deref(), Some("device 0"));
    assert_eq!(process(2).as_deref(), Some("device 1"));

    // Threads named by their OS thread's name, the test's own among them.
    let threads: HashMap<(u64, u64), String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            let key = (e["pid"].as_u64().unwrap_or(u64::MAX), e["tid"].as_u64().unwrap_or(u64::MAX));
            (key, e["args"]["name"].as_str().unwrap_or_default().to_string())
        })
        .collect();
    let me = std::thread::current().name().map(str::to_string);
    assert!(me.is_some_and(|me| threads.values().any(|n| *n == me)), "{threads:?}");
    for e in events.iter().filter(|e| e["ph"] == "X" || e["ph"] == "i") {
        let key = (e["pid"].as_u64().unwrap_or(u64::MAX), e["tid"].as_u64().unwrap_or(u64::MAX));
        assert!(threads.contains_key(&key), "no thread name for {e}");
    }

    for pid in [1u64, 2] {
        let mine: Vec<&Value> = events.iter().filter(|e| e["pid"] == pid && e["ph"] != "M").collect();
        let constructs: Vec<&Value> = mine.iter().copied().filter(|e| e["cat"] == "construct").collect();
        assert!(constructs.len() >= 2, "device {}: constructs {constructs:?}", pid - 1);
        assert!(
            constructs.iter().all(|e| e["args"]["at"].as_str().is_some_and(|a| a.contains(".rs:"))),
            "{constructs:?}"
        );
        let first = constructs.iter().map(|e| ts(e)).fold(f64::INFINITY, f64::min);
        let last = mine.iter().map(|e| ts(e)).fold(0.0, f64::max);
        let copies: Vec<&Value> = mine.iter().copied().filter(|e| e["ph"] == "X").collect();
        // One copy each way on each device.
        assert_eq!(copies.len(), 2, "device {}: {copies:?}", pid - 1);
        for c in &copies {
            let dur = c["dur"].as_f64().unwrap_or(-1.0);
            assert!(dur >= 0.0, "{c}");
            assert!(c["args"]["bytes"].as_u64().is_some_and(|b| b == 4096 * 4 || b == 1024 * 4), "{c}");
            assert!(["host->device", "device->host"].contains(&c["args"]["direction"].as_str().unwrap_or("")));
            // Inside the constructs' span (to a nanosecond: the clocks are read apart).
            assert!(ts(c) >= first - 1e-3 && ts(c) + dur <= last + 1e-3, "{c} outside {first}..{last}");
        }
        assert!(
            mine.iter().any(|e| e["ph"] == "i" && e["name"] == "launch fill_i32" && e["args"]["n"].is_u64()),
            "device {}: no launch",
            pid - 1
        );
        // Live entries counted up and back to nothing.
        let counts: Vec<i64> =
            mine.iter().filter(|e| e["ph"] == "C").filter_map(|e| e["args"]["entries"].as_i64()).collect();
        assert_eq!(counts.first(), Some(&1), "device {}: {counts:?}", pid - 1);
        assert_eq!(counts.last(), Some(&0), "device {}: {counts:?}", pid - 1);
    }
    let kinds: HashSet<&str> = events.iter().filter_map(|e| e["cat"].as_str()).collect();
    assert!(kinds.contains("entry created") && kinds.contains("entry removed"), "{kinds:?}");
    Ok(())
}

#[test]
fn offload_trace_names_the_file_written_when_the_runtime_drops() -> Result<()> {
    let path = TempPath::new("env");
    let value = path.0.display().to_string();
    let rt = Runtime::builder()
        .env(move |k| (k == "OFFLOAD_TRACE").then(|| value.clone()))
        .gpus(false)
        .host_devices(1)
        .synchronous(synchronous())
        .build()?;
    let x = vec![5i32; 64];
    // SAFETY: `x` outlives the mapping, ended below.
    unsafe { rt.enter_data(0, &[MapItem::slice(&x, MapType::TO)])? };
    // SAFETY: as above.
    unsafe { rt.exit_data(0, &[MapItem::slice(&x, MapType::RELEASE)])? };
    drop(rt);
    let events = events_of(&path);
    assert_eq!(events.iter().filter(|e| e["ph"] == "X").count(), 1);
    Ok(())
}

#[test]
fn with_tracing_off_no_file_is_written() -> Result<()> {
    let path = TempPath::new("off");
    let rt = builder().build()?;
    let mut x = vec![0i32; 64];
    let gpu = rt.device(0)?;
    gpu.data(map::tofrom(&mut x), |v| offload_kernels::fill_i32(&gpu, 7, v))?;
    rt.flush_trace()?;
    drop(rt);
    assert!(!path.0.exists());
    Ok(())
}

#[test]
fn a_trace_file_that_cannot_be_written_fails_the_build_naming_it() {
    let bad = std::env::temp_dir().join("offload-no-such-folder").join("t.json");
    let e = builder().trace_file(&bad).build().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("OFFLOAD_TRACE") && e.contains(&bad.display().to_string()), "{e}");
    let e = Runtime::builder().env(|k| (k == "OFFLOAD_TRACE").then(String::new)).gpus(false).build();
    assert!(e.err().is_some_and(|e| e.to_string().contains("OFFLOAD_TRACE")));
}

#[test]
fn entries_of_a_failed_construct_leave_the_count() -> Result<()> {
    use offload::backend::{FaultKind, FaultPlan};
    let path = TempPath::new("failed");
    let rt = Runtime::builder()
        .env(|_| None)
        .gpus(false)
        .host_devices(1)
        .synchronous(true)
        .inject_faults(FaultPlan::default().fail_nth(FaultKind::CopyIn, 2))
        .trace_file(&path.0)
        .build()?;
    let (a, b) = (vec![1i32; 256], vec![2i32; 256]);
    let items = [MapItem::slice(&a, MapType::TO), MapItem::slice(&b, MapType::TO)];
    // SAFETY: `a` and `b` outlive the construct, which fails (its second copy) and maps nothing.
    let failed = unsafe { rt.enter_data(0, &items) };
    assert!(failed.is_err(), "the second copy was to fail");
    assert!(rt.live_mappings().is_empty());
    rt.flush_trace()?;
    let events = events_of(&path);
    let counts: Vec<i64> = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["pid"] == 1)
        .filter_map(|e| e["args"]["entries"].as_i64())
        .collect();
    assert_eq!(counts.iter().max(), Some(&2), "{counts:?}");
    assert_eq!(counts.last(), Some(&0), "{counts:?}");
    Ok(())
}
