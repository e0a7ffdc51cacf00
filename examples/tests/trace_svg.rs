//! The timeline renderer (`offload_examples::trace_svg`) and its program, `offload-trace`:
//! traces built in memory, drawn, and the SVG read back as XML.

use std::path::PathBuf;
use std::process::Command;

use offload::{map, Runtime};
use offload_examples::trace_svg::{render_svg, summarize, RenderOptions, Trace, TraceError};
use serde_json::{json, Value};

fn meta(pid: Value, tid: u64, what: &str, name: &str) -> Value {
    json!({"ph": "M", "name": what, "pid": pid, "tid": tid, "args": {"name": name}})
}

fn slice(pid: u64, tid: u64, cat: &str, name: &str, ts: f64, dur: f64, args: Value) -> Value {
    json!({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args})
}

fn copy(pid: u64, tid: u64, direction: &str, ts: f64, dur: f64, bytes: u64) -> Value {
    let args = json!({"direction": direction, "bytes": bytes, "staged": false});
    slice(pid, tid, "copy", &format!("copy {direction}"), ts, dur, args)
}

fn instant(pid: u64, tid: u64, cat: &str, ts: f64) -> Value {
    json!({"ph": "i", "s": "t", "cat": cat, "name": cat, "pid": pid, "tid": tid, "ts": ts, "args": {}})
}

fn counter(pid: u64, name: &str, ts: f64, args: Value) -> Value {
    json!({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": ts, "args": args})
}

fn trace(events: Vec<Value>) -> Trace {
    Trace::from_value(&json!({"traceEvents": events, "displayTimeUnit": "ns"}))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The picture, failing the test unless it is XML with an `svg` root.
fn draw(t: &Trace, options: &RenderOptions) -> String {
    let svg = render_svg(t, options).unwrap_or_else(|e| panic!("{e}"));
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("not XML: {e}\n{svg}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    svg
}

/// The elements whose class starts with `class`.
fn with_class<'a>(doc: &'a roxmltree::Document<'a>, class: &str) -> Vec<roxmltree::Node<'a, 'a>> {
    doc.descendants()
        .filter(|n| n.attribute("class").is_some_and(|c| c.split(' ').next() == Some(class)))
        .collect()
}

fn texts(doc: &roxmltree::Document<'_>, class: &str) -> Vec<String> {
    with_class(doc, class).iter().filter_map(|n| n.text()).map(str::to_string).collect()
}

fn num(n: &roxmltree::Node<'_, '_>, attr: &str) -> f64 {
    n.attribute(attr).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {attr} on {n:?}"))
}

/// The host, device 0 with three queues, device 1 with one: every kind of slice, two
/// instants, and three counter series (one counter with two arguments).
fn busy_trace() -> Vec<Value> {
    vec![
        meta(json!(0), 0, "process_name", "host"),
        meta(json!(1), 0, "process_name", "device 0"),
        meta(json!(2), 0, "process_name", "device 1"),
        json!({"ph": "M", "name": "process_sort_index", "pid": 1, "tid": 0, "args": {"sort_index": 1}}),
        meta(json!(0), 1, "thread_name", "main"),
        meta(json!(1), 11, "thread_name", "copy-in queue"),
        meta(json!(1), 12, "thread_name", "compute queue"),
        meta(json!(1), 13, "thread_name", "copy-out queue"),
        meta(json!(2), 12, "thread_name", "compute queue"),
        slice(0, 1, "construct", "target enter data", 0.0, 40.0, json!({"at": "main.rs:12"})),
        copy(1, 11, "host->device", 5.0, 20.0, 4096),
        copy(1, 11, "host->device", 30.0, 20.0, 4096),
        slice(1, 12, "kernel", "kernel fill_i32", 30.0, 50.0, json!({"n": 1024})),
        slice(1, 12, "gemm", "gemm 64x64x64", 85.0, 10.0, json!({})),
        copy(1, 13, "device->host", 96.0, 20.0, 4096),
        copy(2, 12, "device->device", 60.0, 10.0, 512),
        instant(1, 12, "launch", 29.0),
        instant(0, 1, "entry created", 4.0),
        counter(1, "present entries", 4.0, json!({"entries": 1})),
        counter(1, "present entries", 110.0, json!({"entries": 0})),
        counter(1, "pool bytes", 4.0, json!({"in_use": 4096, "cached": 0})),
        counter(1, "pool bytes", 110.0, json!({"in_use": 0, "cached": 4096})),
        json!({"ph": "s", "id": 1, "name": "flow", "pid": 0, "tid": 1, "ts": 1.0}),
        json!({"ph": "f", "id": 1, "bp": "e", "name": "flow", "pid": 1, "tid": 12, "ts": 30.0}),
    ]
}

#[test]
fn slices_lanes_legend_and_counters_are_drawn() {
    let t = trace(busy_trace());
    assert_eq!(t.ignored, 2, "the flow's two events");
    let svg = draw(&t, &RenderOptions { title: Some("busy".into()), ..RenderOptions::default() });
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(with_class(&doc, "slice").len(), 7, "{svg}");
    assert_eq!(texts(&doc, "process-label"), ["host", "device 0", "device 1"]);
    assert_eq!(
        texts(&doc, "lane-label"),
        ["main", "copy-in queue", "compute queue", "copy-out queue", "compute queue"]
    );
    // Six kinds of slice and the instants' tick.
    let legend: Vec<String> = with_class(&doc, "legend-entry")
        .iter()
        .filter_map(|g| g.descendants().find_map(|n| n.text()))
        .map(str::to_string)
        .collect();
    assert_eq!(
        legend,
        [
            "copy host->device",
            "copy device->host",
            "copy device->device",
            "kernel",
            "gemm",
            "construct",
            "instant"
        ]
    );
    // Each kind has its own colour.
    let mut fills: Vec<&str> = with_class(&doc, "slice").iter().filter_map(|n| n.attribute("fill")).collect();
    fills.sort_unstable();
    fills.dedup();
    assert_eq!(fills.len(), 6, "{fills:?}");
    assert_eq!(with_class(&doc, "instant").len(), 2);
    assert_eq!(with_class(&doc, "counter").len(), 3);
    let labels = texts(&doc, "counter-label");
    assert_eq!(labels, ["pool bytes: cached", "pool bytes: in_use", "present entries"]);
    assert!(svg.contains("device 0 · max 4.00 KiB") && svg.contains("device 0 · max 1"), "{svg}");
    assert!(svg.contains(">busy</text>"));

    // Without instants: no ticks, no legend entry for them.
    let svg = draw(&t, &RenderOptions { instants: false, ..RenderOptions::default() });
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(with_class(&doc, "instant").len(), 0);
    assert_eq!(with_class(&doc, "legend-entry").len(), 6);

    // One process, by name or by pid.
    for which in ["device 1", "2"] {
        let svg = draw(&t, &RenderOptions { processes: vec![which.into()], ..RenderOptions::default() });
        let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(texts(&doc, "process-label"), ["device 1"]);
        assert_eq!(with_class(&doc, "slice").len(), 1);
        assert_eq!(with_class(&doc, "counter").len(), 0, "device 1 has no counters");
    }
}

#[test]
fn markup_in_names_is_escaped() {
    let t = trace(vec![
        meta(json!(1), 0, "process_name", "dev \"<0>\""),
        meta(json!(1), 3, "thread_name", "q<&>'s"),
        slice(1, 3, "kernel", "kernel a<b && c>d", 0.0, 100.0, json!({"n": "<&>", "ctl": "\u{1}"})),
        counter(1, "a<&>b", 0.0, json!({"v": 1})),
    ]);
    let svg = draw(&t, &RenderOptions { title: Some("t<&>".into()), ..RenderOptions::default() });
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(texts(&doc, "process-label"), ["dev \"<0>\""]);
    assert_eq!(texts(&doc, "lane-label"), ["q<&>'s"]);
    assert_eq!(texts(&doc, "counter-label"), ["a<&>b"]);
    let tip = with_class(&doc, "slice")[0].descendants().find_map(|n| n.text()).unwrap_or_default();
    assert!(tip.starts_with("kernel a<b && c>d (kernel)") && tip.contains("n: <&>"), "{tip}");
    assert!(doc.descendants().any(|n| n.text() == Some("t<&>")));
}

#[test]
fn the_window_clips_slices_and_short_ones_keep_a_pixel() {
    let t = trace(vec![
        meta(json!(1), 1, "thread_name", "compute queue"),
        slice(1, 1, "kernel", "kernel a", 0.0, 10.0, json!({})),
        slice(1, 1, "kernel", "kernel b", 20.0, 10.0, json!({})),
        slice(1, 1, "kernel", "kernel c", 40.0, 10.0, json!({})),
        slice(1, 1, "kernel", "kernel tiny", 32.0, 0.0001, json!({})),
        counter(1, "present entries", 0.0, json!({"entries": 5})),
        counter(1, "present entries", 100.0, json!({"entries": 9})),
    ]);
    let options =
        RenderOptions { from_us: Some(15.0), to_us: Some(45.0), width: 1000, ..RenderOptions::default() };
    let svg = draw(&t, &options);
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}"));
    let rects = with_class(&doc, "slice");
    assert_eq!(rects.len(), 3, "b, tiny and c; a ends before the window: {svg}");
    let (left, right) = (num(&rects[0], "x"), num(&rects[2], "x") + num(&rects[2], "width"));
    for r in &rects {
        assert!(num(r, "width") >= 1.0);
        assert!(num(r, "x") >= left - 1e-6 && num(r, "x") + num(r, "width") <= right + 1e-6);
    }
    // c is cut at the window's end: it runs to the right edge, half its length shown.
    assert!((num(&rects[2], "width") - 0.5 * num(&rects[0], "width")).abs() < 0.05, "{svg}");
    assert!(right <= 1000.0);
    // The counter's value when the window starts (5) is drawn from its left edge; the later
    // change, outside it, is not in the label's maximum.
    assert!(svg.contains("pid 1 · max 5"), "{svg}");
    assert!(svg.contains("15.0 us to 45.0 us"), "{svg}");

    let none = RenderOptions { from_us: Some(60.0), to_us: Some(90.0), ..RenderOptions::default() };
    let svg = draw(&t, &none);
    assert!(svg.contains("no slices between 60.0 us and 90.0 us"), "{svg}");
}

#[test]
fn empty_and_slice_less_traces_say_so() {
    let svg = draw(&trace(vec![]), &RenderOptions::default());
    assert!(svg.contains("empty trace: no events to draw"), "{svg}");
    let svg = draw(&trace(vec![meta(json!(0), 0, "process_name", "host")]), &RenderOptions::default());
    assert!(svg.contains("empty trace"), "{svg}");
    let svg = draw(&trace(vec![instant(0, 1, "construct", 5.0)]), &RenderOptions::default());
    assert!(svg.contains("no slices in this trace"), "{svg}");
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(with_class(&doc, "instant").len(), 1);
    // A bare array of events (the format's Array Format) is a trace too.
    let t = Trace::parse(r#"[{"ph": "X", "ts": 1, "dur": 2, "pid": 0, "tid": 0, "name": "x"}]"#)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.processes.len(), 1);
}

#[test]
fn odd_but_valid_events_are_tolerated() {
    let t = trace(vec![
        // A string pid, no dur, an unknown category, no args, an unknown phase.
        json!({"ph": "X", "cat": "mystery", "name": "what", "pid": "gpu", "tid": "q", "ts": 3.0}),
        json!({"ph": "X", "name": "no time", "pid": 1, "tid": 1}),
        json!({"ph": "Z", "ts": 1.0}),
        json!({"ph": "C", "name": "c", "pid": 1, "ts": 2.0, "args": {"text": "x", "n": 2}}),
    ]);
    assert_eq!(t.ignored, 2);
    assert_eq!(t.processes.len(), 1);
    assert_eq!(t.processes[0].name, "pid gpu");
    assert_eq!(t.processes[0].lanes[0].name, "tid q");
    assert_eq!(t.counters.len(), 1, "only numeric arguments are series");
    let svg = draw(&t, &RenderOptions::default());
    assert!(svg.contains(">other</text>"), "{svg}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let e = Trace::parse("not json").err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("not a trace: the file is not JSON"), "{e}");
    // A file its run never closed: empty, or cut short.
    let e = Trace::parse(" \n").err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("not a trace: the file is empty: the run that wrote it never closed it"), "{e}");
    let e = Trace::parse("{\"traceEvents\": [\n{\"ph\": \"X\"},\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.starts_with("not a trace: the file ends before its JSON does"), "{e}");
    let e = Trace::parse(r#"{"events": []}"#).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("no \"traceEvents\" array"), "{e}");
    let e = Trace::parse(r#"{"traceEvents": 3}"#).err();
    assert!(matches!(e, Some(TraceError::NoEvents)), "{e:?}");
    let e = Trace::from_file(std::path::Path::new("/nonexistent/run.json")).err().map(|e| e.to_string());
    assert!(e.is_some_and(|e| e.starts_with("cannot read /nonexistent/run.json")));
    let t = trace(busy_trace());
    let backwards = RenderOptions { from_us: Some(50.0), to_us: Some(10.0), ..RenderOptions::default() };
    let e = render_svg(&t, &backwards).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("empty time window: from 50 us to 10 us"), "{e}");
    assert!(summarize(&t, &backwards).is_err());
}

#[test]
fn the_summary_measures_copies_beside_kernels() {
    let t = trace(vec![
        meta(json!(1), 0, "process_name", "device 0"),
        meta(json!(2), 0, "process_name", "device 1"),
        // Device 0: a kernel 0..100; copies 50..150 and 60..90 (overlapping each other):
        // 50 us of the kernel's 100 had a copy beside it.
        slice(1, 2, "kernel", "kernel k", 0.0, 100.0, json!({})),
        copy(1, 1, "host->device", 50.0, 100.0, 1_000_000),
        copy(1, 3, "device->host", 60.0, 30.0, 300_000),
        // Device 1's copy during device 0's kernel is not device 0's overlap.
        copy(2, 1, "host->device", 0.0, 100.0, 1000),
        slice(2, 2, "kernel", "kernel k", 200.0, 10.0, json!({})),
    ]);
    let s = summarize(&t, &RenderOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let d0 = &s.processes[0];
    assert_eq!(d0.process, "device 0");
    assert!((d0.kernel_us - 100.0).abs() < 1e-9 && (d0.copy_us - 100.0).abs() < 1e-9, "{d0:?}");
    assert!((d0.overlap_us - 50.0).abs() < 1e-9, "{d0:?}");
    assert_eq!(d0.overlap_share(), Some(0.5));
    assert_eq!(s.processes[1].overlap_share(), Some(0.0));
    let lane = s.lanes.iter().find(|l| l.process == "device 0" && l.copies == 1 && l.bytes == 1_000_000);
    // 1 MB in 100 us: 10 GB/s.
    assert!(lane.and_then(|l| l.gb_per_s()).is_some_and(|g| (g - 10.0).abs() < 1e-9), "{s:?}");
    let text = s.to_string();
    assert!(text.contains("50.0%") && text.contains("0.0%"), "{text}");
    assert!(text.contains("10.0"), "{text}");

    // A window of 0..75: the kernel's first 75 us, of which 25 beside a copy.
    let w = RenderOptions { to_us: Some(75.0), ..RenderOptions::default() };
    let s = summarize(&t, &w).unwrap_or_else(|e| panic!("{e}"));
    assert!(s.processes[0].overlap_share().is_some_and(|x| (x - 1.0 / 3.0).abs() < 1e-9), "{s:?}");
    assert!(s.processes.iter().all(|p| !p.one_worker));
}

/// A host device's work is on one `worker queue`: the summary says its copies and
/// kernels cannot overlap, instead of a share.
#[test]
fn the_summary_says_a_host_device_cannot_overlap() {
    let t = trace(vec![
        meta(json!(1), 0, "process_name", "device 0"),
        meta(json!(1), 5, "thread_name", "worker queue"),
        copy(1, 5, "host->device", 0.0, 10.0, 1000),
        slice(1, 5, "kernel", "kernel k", 10.0, 100.0, json!({})),
    ]);
    let s = summarize(&t, &RenderOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(s.processes[0].one_worker && s.processes[0].overlap_us == 0.0, "{s:?}");
    let text = s.to_string();
    assert!(text.contains("none possible: one worker") && text.contains("on one worker thread"), "{text}");
}

/// A path in Cargo's scratch folder for integration tests (inside the target folder, so
/// left for the next run to overwrite); in the system's temporary folder when this test
/// runs away from its build (a bundle carried to the GPU machine).
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    if dir.is_dir() { dir } else { std::env::temp_dir() }.join(name)
}

/// The `offload-trace` program Cargo built; away from the build, the one in a `bin`
/// folder beside this test's own folder (how a bundle lays them out).
fn program() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_offload-trace"));
    if built.is_file() {
        return built;
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("this test's path: {e}"));
    let beside = exe.parent().and_then(|d| d.parent()).map(|d| d.join("bin").join("offload-trace"));
    beside
        .filter(|p| p.is_file())
        .unwrap_or_else(|| panic!("no offload-trace at {} nor beside {}", built.display(), exe.display()))
}

#[test]
fn a_real_run_on_two_host_devices_is_drawn_with_a_lane_per_device() -> offload::Result<()> {
    let path = scratch("trace-svg-run.json");
    {
        let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).trace_file(&path).build()?;
        for d in 0..2 {
            let dev = rt.device(d)?;
            let mut x = vec![0i32; 4096];
            dev.data(map::tofrom(&mut x), |v| offload_kernels::fill_i32(&dev, 7, v))?;
            assert!(x.iter().all(|&v| v == 7));
            rt.synchronize(d)?;
        }
        rt.flush_trace()?;
    }
    let t = Trace::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let svg = draw(&t, &RenderOptions::default());
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}"));
    let processes = texts(&doc, "process-label");
    assert!(
        processes.contains(&"device 0".to_string()) && processes.contains(&"device 1".to_string()),
        "{processes:?}"
    );
    // A copy each way on each device at least.
    assert!(with_class(&doc, "slice").len() >= 4, "{svg}");
    assert!(!with_class(&doc, "counter").is_empty(), "present entries");

    // The program: a picture and a summary from the same file.
    let out = scratch("trace-svg-run.svg");
    let run = Command::new(program())
        .arg(&path)
        .args(["--svg".as_ref(), out.as_os_str(), "--summary".as_ref(), "--no-instants".as_ref()])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}{}", String::from_utf8_lossy(&run.stderr));
    assert!(
        stdout.contains("device 0") && stdout.contains("device 1") && stdout.contains("GB/s"),
        "{stdout}"
    );
    // Host devices: one worker each, no overlap to measure.
    assert_eq!(stdout.matches("none possible: one worker").count(), 2, "{stdout}");
    let svg = std::fs::read_to_string(&out).unwrap_or_else(|e| panic!("{e}"));
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(with_class(&doc, "instant").len(), 0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    assert!(svg.contains(&format!("<title>{name}</title>")), "the file name is the default title");
    Ok(())
}

#[test]
fn the_program_answers_usage_errors_with_its_usage_and_status_2() {
    let bin = program();
    for args in [
        &[][..],
        &["run.json"],
        &["run.json", "--svg"],
        &["run.json", "--summary", "--width", "wide"],
        &["--bogus"],
    ] {
        let run = Command::new(&bin).args(args).output().unwrap_or_else(|e| panic!("{e}"));
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("usage: offload-trace"), "{stderr}");
    }
    let run = Command::new(&bin)
        .args(["/nonexistent/run.json", "--summary"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(run.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&run.stderr).contains("cannot read /nonexistent/run.json"));
}

/// Pictures that show mapping (issue 48, item 6), from a made-up trace: a copy bar wide
/// enough says its array and size (its size alone when narrow), a race is a red tick
/// labelled `race`, the program's notes carry their words (cut where the next note
/// begins), and a construct's tooltip keeps its whole map list.
#[test]
fn copies_races_notes_and_map_lists_are_labelled() {
    let long_list =
        format!("device 0: target enter data at tour.rs:7 with 9 maps: {}", "to(a[0:1024]) ".repeat(9));
    let args = |range: &str| json!({"direction": "host->device", "bytes": 4096, "range": range});
    let events = vec![
        meta(json!(1), 0, "process_name", "device 0"),
        slice(1, 1, "copy", "copy host->device", 0.0, 600.0, args("a[0:1024]")),
        slice(1, 1, "copy", "copy host->device", 700.0, 4.0, args("b[0:1024]")),
        slice(1, 2, "construct", "target enter data", 0.0, 800.0, json!({"message": long_list})),
        json!({"ph": "i", "s": "t", "cat": "race", "name": "race", "pid": 1, "tid": 2, "ts": 650.0,
               "args": {"message": "device 0: race: the copy back of a[0:5] ..."}}),
        json!({"ph": "i", "s": "t", "cat": "note", "name": "1. map the inputs", "pid": 0, "tid": 1, "ts": 0.0, "args": {}}),
        json!({"ph": "i", "s": "t", "cat": "note", "name": "2. a step too long to fit before the next note",
               "pid": 0, "tid": 1, "ts": 700.0, "args": {}}),
        json!({"ph": "i", "s": "t", "cat": "note", "name": "3", "pid": 0, "tid": 1, "ts": 760.0, "args": {}}),
    ];
    let t = trace(events);
    // Without instants, races and notes are still drawn (and nothing else of the marks).
    let quiet = draw(&t, &RenderOptions { instants: false, ..RenderOptions::default() });
    let quiet = roxmltree::Document::parse(&quiet).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((with_class(&quiet, "race").len(), with_class(&quiet, "note").len()), (1, 3));
    assert!(with_class(&quiet, "instant").is_empty());
    let svg = draw(&t, &RenderOptions::default());
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}"));
    let labels: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text") && n.attribute("pointer-events") == Some("none"))
        .filter_map(|n| n.text().map(str::to_string))
        .collect();
    assert!(labels.contains(&"a[0:1024] 4.00 KiB".to_string()), "{labels:?}");
    assert!(!labels.iter().any(|l| l.contains("b[0:1024]")), "the narrow copy has no room: {labels:?}");
    // The race: red, labelled, its message on hover.
    let race = with_class(&doc, "race");
    assert_eq!(race.len(), 1, "{svg}");
    assert_eq!(race[0].attribute("stroke"), Some("#DC2626"));
    assert!(race[0].children().any(|c| c.text().is_some_and(|t| t.contains("the copy back of a[0:5]"))));
    assert_eq!(texts(&doc, "race-label"), ["race"]);
    // Notes: their words, the second cut before the third.
    let notes = texts(&doc, "note-label");
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert_eq!(notes[0], "1. map the inputs");
    assert!(notes[1].ends_with('…') && notes[1].len() < 40, "{notes:?}");
    assert_eq!(notes[2], "3");
    // The construct's tooltip keeps its whole map list.
    let construct =
        with_class(&doc, "slice").into_iter().find(|n| n.attribute("class") == Some("slice construct"));
    let tip =
        construct.and_then(|n| n.children().find_map(|c| c.text().map(str::to_string))).unwrap_or_default();
    assert!(tip.contains(long_list.trim_end()), "{tip}");
}

/// A real run's timeline names copies by their arrays, draws each named entry's reference
/// count over time, marks the race and carries the program's notes (issue 48, item 6).
#[test]
fn a_real_run_draws_names_counts_races_and_notes() -> offload::Result<()> {
    use offload::MapItem;
    let path = scratch("trace-svg-mapping.json");
    {
        let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).trace_file(&path).build()?;
        let (a, b) = ([0i32; 8], [0i32; 8]);
        let (ap, bp) = (a.as_ptr(), b.as_ptr().cast_mut());
        rt.annotate("1. two maps of a, then a halo race");
        // SAFETY: `a` and `b` outlive their mappings; the host does not touch them meanwhile.
        unsafe {
            let a = MapItem::to(ap, 32).named("a");
            rt.enter_data(0, &[a])?;
            rt.enter_data(0, &[a])?;
            rt.exit_data(0, &[MapItem::release(ap, 32)])?;
            rt.annotate("2. the halo race");
            rt.enter_data(0, &[MapItem::tofrom(bp, 20).named("b")])?;
            rt.enter_data(1, &[MapItem::tofrom(bp.add(3), 20).named_at("b", 3)])?;
            rt.exit_data(0, &[MapItem::from(bp, 20)])?;
            rt.exit_data(1, &[MapItem::from(bp.add(3), 20)])?;
            // A held entry: its hold count is drawn too.
            let h = [MapItem::tofrom(bp, 32).hold().named("h")];
            rt.target_data_begin(0, &h)?;
            rt.target_data_end(0, &h)?;
        }
        rt.flush_trace()?;
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    let events = doc["traceEvents"].as_array().cloned().unwrap_or_default();
    // The reference count of a[0:8] on device 0: 1, 2, then 1 after the release (the
    // entry stays), as a counter series named by the entry.
    let counts: Vec<u64> = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "ref count a[0:8]" && e["pid"] == 1)
        .filter_map(|e| e["args"]["count"].as_u64())
        .collect();
    assert_eq!(counts, [1, 2, 1], "{text}");
    let held: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "ref count h[0:8]")
        .filter_map(|e| Some((e["args"]["count"].as_u64()?, e["args"]["hold"].as_u64()?)))
        .collect();
    assert_eq!(held, [(0, 1), (0, 0)], "{text}");
    // Copies carry their range's name.
    assert!(
        events.iter().any(|e| e["ph"] == "X" && e["cat"] == "copy" && e["args"]["range"] == "b[3:5]"),
        "{text}"
    );
    let notes: Vec<&str> =
        events.iter().filter(|e| e["cat"] == "note").filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(notes, ["1. two maps of a, then a halo race", "2. the halo race"]);

    let t = Trace::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let svg = draw(&t, &RenderOptions::default());
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}"));
    let strips = texts(&doc, "counter-label");
    for s in ["ref count a[0:8]", "ref count b[0:5]", "ref count b[3:5]"] {
        assert!(strips.contains(&s.to_string()), "{strips:?}");
    }
    // One race tick; its word is cut (or left out) when the next mark is close, which
    // depends on this run's timings.
    assert_eq!(svg.matches(r#"<line class="race""#).count(), 1, "{svg}");
    let race = texts(&doc, "race-label");
    assert!(race.len() <= 1 && race.iter().all(|w| "race".starts_with(w.trim_end_matches('…'))), "{race:?}");
    assert_eq!(svg.matches(r#"<line class="note""#).count(), 2, "{svg}");
    let words = ["1. two maps of a, then a halo race", "2. the halo race"];
    let labels = texts(&doc, "note-label");
    assert!(
        labels.len() <= 2
            && labels.iter().all(|l| words.iter().any(|w| w.starts_with(l.trim_end_matches('…')))),
        "{labels:?}"
    );
    Ok(())
}
