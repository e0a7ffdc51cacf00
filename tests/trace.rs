//! `OFFLOAD_TRACE` / `RuntimeBuilder::trace_file`: the Chrome trace-event timeline
//! (docs/GUIDE.md, "Timeline traces"), read back with `serde_json`.

use std::collections::HashSet;
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

/// A trace's events, read back.
struct Timeline(Vec<Value>);

impl Timeline {
    fn read(path: &TempPath) -> Self {
        Self(events_of(path))
    }

    /// The events of phase `ph` (and, with `cat`, that category) in process `pid`.
    fn of(&self, pid: u64, ph: &str, cat: Option<&str>) -> Vec<&Value> {
        self.0
            .iter()
            .filter(|e| e["pid"] == pid && e["ph"] == ph && cat.is_none_or(|c| e["cat"] == c))
            .collect()
    }

    /// The name a metadata event `what` (`process_name`, `thread_name`) gives (pid, tid).
    fn named(&self, what: &str, pid: u64, tid: Option<u64>) -> Option<String> {
        self.0
            .iter()
            .find(|e| {
                e["ph"] == "M" && e["name"] == what && e["pid"] == pid && tid.is_none_or(|t| e["tid"] == t)
            })
            .and_then(|e| e["args"]["name"].as_str().map(str::to_string))
    }

    /// The construct slice on `e`'s track that holds its start (`None`: none does).
    fn construct_around(&self, e: &Value) -> Option<&Value> {
        self.of(e["pid"].as_u64()?, "X", Some("construct")).into_iter().find(|c| {
            c["tid"] == e["tid"] && ts(c) <= ts(e) + 1e-3 && ts(e) + dur(e) <= ts(c) + dur(c) + 1e-3
        })
    }

    /// The construct slice a flow arrow leads from into slice `e` (checked: the arrow ends
    /// at `e`'s start on its track, and starts at the construct's start on its track).
    fn cause_of(&self, e: &Value) -> Option<&Value> {
        let f = self.0.iter().find(|f| {
            f["ph"] == "f"
                && f["bp"] == "e"
                && f["pid"] == e["pid"]
                && f["tid"] == e["tid"]
                && f["ts"] == e["ts"]
        })?;
        let s = self.0.iter().find(|s| s["ph"] == "s" && s["id"] == f["id"])?;
        self.0.iter().find(|c| {
            c["ph"] == "X"
                && c["cat"] == "construct"
                && c["pid"] == s["pid"]
                && c["tid"] == s["tid"]
                && c["ts"] == s["ts"]
        })
    }

    /// The values of counter `name`'s `key` in process `pid`, in order.
    fn counter(&self, pid: u64, name: &str, key: &str) -> Vec<u64> {
        self.0
            .iter()
            .filter(|e| e["ph"] == "C" && e["pid"] == pid && e["name"] == name)
            .filter_map(|e| e["args"][key].as_u64())
            .collect()
    }
}

fn dur(e: &Value) -> f64 {
    e["dur"].as_f64().unwrap_or(0.0)
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
    rt.flush_trace()?;
    let t = Timeline::read(&path);

    // A process per device and one for the host.
    assert_eq!(t.named("process_name", 0, None).as_deref(), Some("host"));
    assert_eq!(t.named("process_name", 1, None).as_deref(), Some("device 0"));
    assert_eq!(t.named("process_name", 2, None).as_deref(), Some("device 1"));
    // Every slice and instant is on a named track; the test's own thread is one.
    let me = std::thread::current().name().map(str::to_string);
    let threads: HashSet<String> =
        t.0.iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
            .filter_map(|e| e["args"]["name"].as_str().map(str::to_string))
            .collect();
    assert!(me.is_some_and(|me| threads.contains(&me)), "{threads:?}");
    for e in t.0.iter().filter(|e| e["ph"] == "X" || e["ph"] == "i") {
        let (pid, tid) = (e["pid"].as_u64(), e["tid"].as_u64());
        assert!(t.named("thread_name", pid.unwrap_or(u64::MAX), tid).is_some(), "no track name for {e}");
    }

    for pid in [1u64, 2] {
        let constructs = t.of(pid, "X", Some("construct"));
        assert!(constructs.len() >= 2, "device {}: constructs {constructs:?}", pid - 1);
        let at: Vec<&str> = constructs.iter().filter_map(|e| e["args"]["at"].as_str()).collect();
        assert!(at.len() == constructs.len() && at.iter().all(|a| a.starts_with("tests/")), "{at:?}");
        // A launch names its kernel's arguments, and its geometry is traced beside it.
        let launches = t.of(pid, "i", Some("launch"));
        assert!(launches.iter().all(|l| l["args"]["message"].as_str().is_some_and(|m| m.contains("args ["))));
        let geometry = t.of(pid, "i", Some("launch geometry"));
        assert_eq!(geometry.len(), launches.len(), "{launches:?}");
        // On a host device it says how a generated kernel's twin runs: device 0 ran the
        // generated `fill_i32`, which stores `x[i]`, its item's own element.
        for g in geometry.iter().filter(|_| pid == 1) {
            let m = g["args"]["message"].as_str().unwrap_or_default();
            assert!(!m.contains("kernel threads") || m.contains("host twin: plain stores of `x`"), "{m}");
        }
        // What the calling thread did lies inside its construct's span.
        for e in t.of(pid, "X", Some("host copy")).into_iter().chain(t.of(pid, "i", Some("launch"))) {
            assert!(t.construct_around(e).is_some(), "device {}: {e} is in no construct", pid - 1);
        }
        // On the device's queues: one copy each way and the kernel, each caused by a
        // construct (an arrow from its start) and not before it.
        let copies = t.of(pid, "X", Some("copy"));
        assert_eq!(copies.len(), 2, "device {}: {copies:?}", pid - 1);
        let kernels = t.of(pid, "X", Some("kernel"));
        assert_eq!(kernels.len(), 1, "device {}: {kernels:?}", pid - 1);
        assert_eq!(kernels[0]["name"], "kernel fill_i32");
        for e in copies.iter().chain(&kernels) {
            let track = t.named("thread_name", pid, e["tid"].as_u64()).unwrap_or_default();
            assert!(track.ends_with(" queue"), "{e} on track {track}");
            assert!(dur(e) >= 0.0);
            let cause = t.cause_of(e).unwrap_or_else(|| panic!("no arrow into {e}"));
            assert!(ts(cause) <= ts(e) + 1e-3, "{e} before its construct {cause}");
        }
        for c in &copies {
            let bytes = c["args"]["bytes"].as_u64();
            assert!(bytes == Some(4096 * 4) || bytes == Some(1024 * 4), "{c}");
            assert!(["host->device", "device->host"].contains(&c["args"]["direction"].as_str().unwrap_or("")));
            assert!(c["args"]["gb_per_s"].is_number() || dur(c) == 0.0, "{c}");
        }
        // Live entries after each construct, back to none.
        let entries = t.counter(pid, "present entries", "entries");
        assert_eq!(entries.iter().max(), Some(&1), "device {}: {entries:?}", pid - 1);
        assert_eq!(entries.last(), Some(&0), "device {}: {entries:?}", pid - 1);
    }
    Ok(())
}

#[test]
fn every_backend_times_its_queues_on_the_device() {
    let path = TempPath::new("backends");
    let file = path.0.clone();
    offload_tests::on_every_backend(
        "timeline",
        1,
        move |b| b.trace_file(&file),
        |rt| {
            let dev = rt.device(0)?;
            let mut x = vec![1i32; 1 << 18];
            dev.data(map::tofrom(&mut x), |v| offload_kernels::fill_i32(&dev, 4, v))?;
            offload_tests::check!(x.iter().all(|&v| v == 4));
            rt.flush_trace()?;
            let t = Timeline::read(&path);
            let constructs = t.of(1, "X", Some("construct"));
            // The region's two halves and the kernel's target construct.
            offload_tests::check!(constructs.len() == 3);
            let first = constructs.iter().map(|c| ts(c)).fold(f64::INFINITY, f64::min);
            let spans: Vec<&Value> =
                t.of(1, "X", Some("copy")).into_iter().chain(t.of(1, "X", Some("kernel"))).collect();
            // The copy in, the kernel and the copy back, each timed on its queue, caused by a
            // construct, and begun after the first construct began (to the anchor's error of a
            // few microseconds). Their ends are not bounded by the region's: a queue's end is
            // stamped by the device after the work, which on a loaded machine may come after
            // the waiting thread has seen the work done and ended its construct.
            offload_tests::check!(spans.len() == 3);
            for e in spans {
                let queue = t.named("thread_name", 1, e["tid"].as_u64()).unwrap_or_default();
                offload_tests::check!(queue.ends_with(" queue"));
                offload_tests::check!(t.cause_of(e).is_some());
                offload_tests::check!(
                    first - 50.0 <= ts(e) && dur(e) >= 0.0,
                    "{e} before the first construct at {first}"
                );
            }
            let copies = t.of(1, "X", Some("copy"));
            offload_tests::check!(copies.iter().all(|c| c["args"]["bytes"] == 1 << 20 && dur(c) > 0.0));
            Ok(())
        },
    );
}

#[test]
fn the_counters_are_the_table_and_the_pool_after_each_construct() -> Result<()> {
    let path = TempPath::new("counters");
    let rt = builder().trace_file(&path.0).build()?;
    let (a, b, c) = (vec![1u8; 1000], vec![2u8; 3000], vec![3u8; 64]);
    let items = |v: &Vec<u8>, t| [MapItem::slice(v, t)];
    let mut expected = Vec::new();
    let mut after = |rt: &Runtime| {
        let on0: Vec<_> = rt.live_mappings().into_iter().filter(|(d, _)| *d == 0).map(|(_, e)| e).collect();
        expected.push((on0.len() as u64, on0.iter().map(|e| e.range.bytes as u64).sum::<u64>()));
    };
    // SAFETY: the vectors outlive every mapping, all ended below; the host writes none.
    unsafe {
        rt.enter_data(0, &items(&a, MapType::TO))?;
        after(&rt);
        rt.enter_data(0, &items(&b, MapType::ALLOC))?;
        after(&rt);
        rt.enter_data(0, &items(&a, MapType::TO))?;
        after(&rt);
        rt.target_data_begin(0, &items(&c, MapType::TO))?;
        after(&rt);
        rt.target_data_end(0, &items(&c, MapType::TO))?;
        after(&rt);
        rt.exit_data(0, &items(&a, MapType::DELETE))?;
        after(&rt);
        rt.exit_data(0, &items(&b, MapType::RELEASE))?;
        after(&rt);
    }
    rt.flush_trace()?;
    let t = Timeline::read(&path);
    let entries = t.counter(1, "present entries", "entries");
    let bytes = t.counter(1, "mapped bytes", "bytes");
    let got: Vec<(u64, u64)> = entries.into_iter().zip(bytes).collect();
    assert_eq!(got, expected);
    assert_eq!(expected.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2, 2, 3, 2, 1, 0]);
    // The pool: blocks of at least the mapped bytes in use, all kept for reuse at the end.
    let in_use = t.counter(1, "pool bytes", "in_use");
    let cached = t.counter(1, "pool bytes", "cached");
    assert_eq!(in_use.len(), expected.len());
    assert!(in_use.iter().zip(&expected).all(|(u, e)| *u >= e.1), "{in_use:?} {expected:?}");
    // (Queued, blocks go back to the pool when the device has passed the work that used
    // them, seen at a later construct's start.)
    if synchronous() {
        assert_eq!(in_use.last(), Some(&0), "{in_use:?}");
        assert!(cached.last().is_some_and(|&c| c >= 4064), "{cached:?}");
    }
    // Nothing on device 1, which did nothing.
    assert!(t.counter(2, "present entries", "entries").is_empty());
    Ok(())
}

#[test]
fn pipelines_and_nowait_work_are_drawn_on_the_device_queues() -> Result<()> {
    use offload::pipeline::Pipeline;
    let path = TempPath::new("pipeline");
    let rt = builder().trace_file(&path.0).build()?;
    let inputs: Vec<Vec<i32>> = (0..6).map(|b| vec![b; 512]).collect();
    let mut outputs = vec![vec![0i32; 512]; 6];
    let report = Pipeline::new(&rt, &[0, 1], 2)?.run(&inputs, &mut outputs, |dev, batch, _x, y| {
        offload_kernels::fill_i32(dev, 10 * batch as i32, y)
    })?;
    assert!(outputs.iter().enumerate().all(|(b, o)| o.iter().all(|&v| v == 10 * b as i32)));
    // A nowait scope: its copies and kernel are queued and run after the calls return.
    let mut z = vec![0i32; 2048];
    rt.nowait(|s| -> Result<()> {
        let (t0, zv) = s.enter(1, map::tofrom(&mut z), &[])?;
        let k = s.compute(1, &[&t0], move |dev| offload_kernels::fill_i32(dev, 5, zv))?;
        s.exit(1, zv, &[&k])?;
        Ok(())
    })??;
    assert!(z.iter().all(|&v| v == 5));
    rt.flush_trace()?;
    let t = Timeline::read(&path);
    let mut kernels = 0;
    for pid in [1u64, 2] {
        // The pipeline's lanes are tracks of their own.
        let lanes: Vec<String> =
            t.0.iter()
                .filter(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == pid)
                .filter_map(|e| e["args"]["name"].as_str().map(str::to_string))
                .filter(|n| n.starts_with(&format!("offload-dev{}-", pid - 1)))
                .collect();
        let batches = report.batches_per_device[pid as usize - 1];
        assert!(batches == 0 || !lanes.is_empty(), "device {}: no lane tracks", pid - 1);
        for e in t.of(pid, "X", Some("copy")).into_iter().chain(t.of(pid, "X", Some("kernel"))) {
            assert!(t.cause_of(e).is_some(), "no arrow into {e}");
        }
        kernels += t.of(pid, "X", Some("kernel")).len();
    }
    // One kernel per batch, and the nowait scope's.
    assert_eq!(kernels, 6 + 1);
    // Every construct, the pipeline's own included, is where the program called it.
    let at: HashSet<&str> =
        t.0.iter()
            .filter(|e| e["cat"] == "construct" && e["ph"] == "X")
            .filter_map(|e| e["args"]["at"].as_str())
            .collect();
    assert!(!at.is_empty() && at.iter().all(|a| a.starts_with("tests/trace.rs:")), "{at:?}");
    let z_copies = t.of(2, "X", Some("copy")).into_iter().filter(|c| c["args"]["bytes"] == 2048 * 4).count();
    assert_eq!(z_copies, 2);
    Ok(())
}

#[test]
fn a_copy_between_devices_is_a_slice_of_the_destination() -> Result<()> {
    let path = TempPath::new("memcpy");
    let rt = builder().trace_file(&path.0).build()?;
    let (a, b) = (rt.target_alloc(4096, 0)?, rt.target_alloc(4096, 1)?);
    // SAFETY: both are live 4096-byte allocations of their devices, freed once, after the copy.
    unsafe {
        rt.target_memcpy(b, a, 4096, 0, 0, 1, 0)?;
        rt.target_free(a, 0)?;
        rt.target_free(b, 1)?;
    }
    rt.flush_trace()?;
    let t = Timeline::read(&path);
    let copies = t.of(2, "X", Some("copy"));
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(copies[0]["args"]["direction"], "device->device");
    assert_eq!(copies[0]["args"]["bytes"], 4096);
    assert_eq!(t.named("thread_name", 2, copies[0]["tid"].as_u64()).as_deref(), Some("worker queue"));
    assert!(t.of(2, "i", Some("memcpy")).len() == 1, "the routine's line, on the destination");
    Ok(())
}

#[test]
fn under_an_mpi_launcher_each_rank_writes_its_own_file() -> Result<()> {
    let path = TempPath::new("rank");
    let ranked = TempPath(path.0.with_file_name(format!(
        "{}.rank3.json",
        path.0.file_stem().and_then(|s| s.to_str()).unwrap_or_default()
    )));
    let value = path.0.display().to_string();
    let rt = Runtime::builder()
        .env(move |k| match k {
            "OFFLOAD_TRACE" => Some(value.clone()),
            "OMPI_COMM_WORLD_RANK" => Some("3".into()),
            _ => None,
        })
        .gpus(false)
        .host_devices(1)
        .build()?;
    let x = vec![5i32; 64];
    // SAFETY: `x` outlives the mapping, ended below.
    unsafe { rt.enter_data(0, &[MapItem::slice(&x, MapType::TO)])? };
    // SAFETY: as above.
    unsafe { rt.exit_data(0, &[MapItem::slice(&x, MapType::RELEASE)])? };
    drop(rt);
    assert!(!path.0.exists(), "the unranked name was written");
    let t = Timeline::read(&ranked);
    assert_eq!(t.named("process_name", 0, None).as_deref(), Some("rank 3: host"));
    assert_eq!(t.named("process_name", 1, None).as_deref(), Some("rank 3: device 0"));
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
    assert_eq!(events.iter().filter(|e| e["ph"] == "X" && e["cat"] == "copy").count(), 1);
    assert_eq!(events.iter().filter(|e| e["ph"] == "X" && e["cat"] == "construct").count(), 2);
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
fn a_failed_construct_is_a_span_and_leaves_the_counters_at_nothing() -> Result<()> {
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
    let t = Timeline::read(&path);
    assert_eq!(t.of(1, "X", Some("construct")).len(), 1);
    assert_eq!(t.counter(1, "present entries", "entries"), [0]);
    assert_eq!(t.counter(1, "mapped bytes", "bytes"), [0]);
    // Its first copy was made (and drawn); the failed one was not.
    assert_eq!(t.of(1, "X", Some("copy")).len(), 1);
    Ok(())
}

#[offload::kernel]
fn dumped_triple(i: usize, x: &mut [f32]) {
    x[i] *= 3.0;
}

/// `RuntimeBuilder::dump_kernels` (`OFFLOAD_DUMP_KERNELS`): at its first launch a kernel's
/// CUDA and HIP sources are written under its symbol, on every backend (host devices
/// included), once; the folder is made when missing.
#[test]
fn kernels_sources_are_written_at_their_first_launch_on_every_backend() {
    let root = std::env::temp_dir().join(format!("offload-dump-kernels-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dirs = std::sync::Mutex::new(0usize);
    offload_tests::on_every_backend(
        "kernel dump",
        1,
        |b| {
            let mut n = dirs.lock().unwrap_or_else(|e| e.into_inner());
            *n += 1;
            b.dump_kernels(root.join(format!("run{n}")))
        },
        |rt| {
            let n = *dirs.lock().unwrap_or_else(|e| e.into_inner());
            let dir = root.join(format!("run{n}"));
            let launched =
                if dumped_triple::CHECKED { &dumped_triple::KERNEL_CHECKED } else { &dumped_triple::KERNEL };
            let file = dir.join(format!("{}.cu", launched.symbol()));
            offload_tests::check!(!file.exists(), "nothing is written before the first launch");
            let io = |e: std::io::Error| offload::Error::InvalidArgument {
                routine: "kernel dump test",
                what: format!("{}: {e}", file.display()),
            };
            for d in 0..rt.num_devices() {
                let mut x = vec![1f32; 64];
                let gpu = rt.device(d)?;
                gpu.data(map::tofrom(&mut x), |xv| dumped_triple::launch(&gpu, 64, xv))?;
                offload_tests::check_eq!(x[63], 3.0);
                if d == 0 {
                    let cuda = std::fs::read_to_string(&file).map_err(io)?;
                    offload_tests::check!(
                        cuda.contains("__global__") && cuda.contains(launched.symbol()),
                        "{cuda}"
                    );
                    let hip = dir.join(format!("{}.hip", launched.symbol()));
                    offload_tests::check!(hip.exists(), "the HIP source too");
                    // Written once per runtime: later launches, on any device, leave it.
                    std::fs::write(&file, "read").map_err(io)?;
                }
            }
            let again = std::fs::read_to_string(&file).unwrap_or_default();
            offload_tests::check_eq!(again, "read");
            Ok(())
        },
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// A host device runs its three queues on one thread: no copy's span may overlap a
/// kernel's, however the work was queued (a copy of a `nowait` task that does not wait for
/// the kernel, queued behind it by another lane), and a copy is timed from its start.
#[test]
fn a_host_devices_copies_and_kernels_never_overlap_on_its_timeline() -> Result<()> {
    let path = TempPath::new("host-overlap");
    let rt = builder().host_devices(1).trace_file(&path.0).build()?;
    let mut big = vec![0i32; 1 << 22];
    let other = vec![1u8; 4 << 20];
    for _ in 0..3 {
        rt.nowait(|s| -> Result<()> {
            let (t0, bv) = s.enter(0, map::tofrom(&mut big), &[])?;
            let k = s.compute(0, &[&t0], move |dev| offload_kernels::fill_i32(dev, 7, bv))?;
            let (t1, ov) = s.enter(0, map::to(&other), &[&t0])?;
            s.exit(0, ov, &[&t1])?;
            s.exit(0, bv, &[&k])?;
            Ok(())
        })??;
    }
    assert!(big.iter().all(|&v| v == 7));
    rt.flush_trace()?;
    let t = Timeline::read(&path);
    let span = |e: &Value| (ts(e), ts(e) + dur(e));
    let kernels: Vec<(f64, f64)> = t.of(1, "X", Some("kernel")).into_iter().map(span).collect();
    let copies: Vec<(f64, f64)> = t.of(1, "X", Some("copy")).into_iter().map(span).collect();
    assert_eq!(kernels.len(), 3);
    assert_eq!(copies.len(), 9, "{copies:?}");
    for c in &copies {
        for k in &kernels {
            // Touching is fine: one job ends as the next begins (to a microsecond).
            assert!(c.1 <= k.0 + 1.0 || k.1 <= c.0 + 1.0, "copy {c:?} overlaps kernel {k:?}");
        }
    }
    Ok(())
}
