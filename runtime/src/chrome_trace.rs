//! The timeline file of `OFFLOAD_TRACE=path.json` ([`crate::RuntimeBuilder::trace_file`]):
//! the runtime's `offload` events in the Chrome trace-event format (its JSON Object
//! Format, `{"traceEvents": [...], "displayTimeUnit": "ns"}`), which Perfetto and
//! `chrome://tracing` open.
//!
//! A [`ChromeTraceLayer`] sits in the runtime's own subscriber beside the `OFFLOAD_INFO`
//! layer and turns each event into trace events:
//!
//! - a process per device (pid: the device number + 1, named `device N`) and one for the
//!   host (pid 0, `host`: events of no device); a thread per OS thread that emitted
//!   events, named by the thread's name (`offload-dev0-compute`, ...);
//! - a complete event (`"ph": "X"`) per copy, ending when the copy's event was emitted and
//!   lasting its measured time, with its direction, bytes, staging and GB/s;
//! - an instant (`"ph": "i"`) per kernel launch (launch events carry no duration yet, so
//!   a launch is a point, with the kernel's name and `n`), per construct (with the
//!   program's `file:line`), per present-table entry event (created, exists, removed)
//!   and per other event (skipped ranges, failures, reports);
//! - a counter (`"ph": "C"`) per device, `present entries`: entries created by maps less
//!   those removed (entries made by `omp_target_associate_ptr` are not traced, so not
//!   counted).
//!
//! Times are microseconds since the trace began (one clock for the process). Events are
//! kept in memory and the whole file is written on [`ChromeTraceLayer::flush`] (the
//! runtime's `flush_trace`, and its drop).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Instant;

use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use crate::error::{Error, Result};

/// Writes the runtime's `offload` events to a Chrome trace-event file (see the module
/// documentation); clones share one trace.
#[derive(Clone)]
pub(crate) struct ChromeTraceLayer {
    shared: Arc<Shared>,
}

struct Shared {
    path: PathBuf,
    start: Instant,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    events: Vec<Value>,
    /// Each OS thread's tid (numbered from 1 in order of first event) and name.
    threads: HashMap<ThreadId, (u64, String)>,
    /// Processes and (process, thread) pairs already named by a metadata event.
    processes: BTreeSet<u64>,
    named_threads: HashSet<(u64, u64)>,
    /// Live present-table entries per process (device).
    live: HashMap<u64, i64>,
}

impl fmt::Debug for ChromeTraceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChromeTraceLayer").field("path", &self.shared.path).finish_non_exhaustive()
    }
}

impl ChromeTraceLayer {
    /// A trace to be written to `path`, its clock starting now.
    pub(crate) fn new(path: PathBuf) -> Self {
        let mut state = State::default();
        // The host's process is named from the start; each device's at its first event.
        state.processes.insert(0);
        state
            .events
            .push(json!({"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "host"}}));
        Self { shared: Arc::new(Shared { path, start: Instant::now(), state: Mutex::new(state) }) }
    }

    /// The file written.
    pub(crate) fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Writes every event so far to the file (replacing what an earlier flush wrote).
    pub(crate) fn flush(&self) -> Result<()> {
        let state = self.shared.state.lock();
        // Written straight from the list (no copy of it), which events wait for meanwhile.
        let written = std::fs::File::create(&self.shared.path).and_then(|file| {
            let mut out = std::io::BufWriter::new(file);
            out.write_all(b"{\"traceEvents\":")?;
            serde_json::to_writer(&mut out, &state.events)?;
            out.write_all(b",\"displayTimeUnit\":\"ns\"}\n")?;
            out.flush()
        });
        written.map_err(|e| Error::InvalidSetting {
            var: "OFFLOAD_TRACE",
            value: self.shared.path.display().to_string(),
            expected: match e.kind() {
                std::io::ErrorKind::NotFound => {
                    "a file path in an existing folder (writing the trace failed)"
                }
                std::io::ErrorKind::PermissionDenied => {
                    "a file path the program may write (writing the trace: permission denied)"
                }
                _ => "a file path the runtime can create and write (writing the trace failed)",
            },
        })
    }

    /// Records one event's trace events.
    fn record(&self, f: Fields) {
        let thread = std::thread::current();
        let mut state = self.shared.state.lock();
        // Read under the lock, so that the file's events are in time order.
        let now = self.shared.start.elapsed().as_secs_f64() * 1e6;
        let pid = f.device.map_or(0, |d| d + 1);
        let State { events, threads, processes, named_threads, live } = &mut *state;
        let next = threads.len() as u64 + 1;
        let (tid, thread_name) = threads.entry(thread.id()).or_insert_with(|| {
            (next, thread.name().map_or_else(|| format!("thread {next}"), str::to_string))
        });
        let tid = *tid;
        if processes.insert(pid) {
            let name = f.device.map_or_else(|| "host".to_string(), |d| format!("device {d}"));
            events.push(
                json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}),
            );
            events.push(
                json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}),
            );
        }
        if named_threads.insert((pid, tid)) {
            events.push(
                json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread_name}}),
            );
        }
        let kind = f.kind.clone().unwrap_or_else(|| "event".to_string());
        let mut args = f.args();
        match kind.as_str() {
            "copy" => {
                let dur = f.micros.unwrap_or(0.0).max(0.0);
                let bytes = f.bytes.unwrap_or(0);
                // bytes per microsecond / 1000 = GB/s.
                let gbps = (dur > 0.0).then(|| bytes as f64 / dur / 1e3);
                args.insert("gb_per_s".into(), json!(gbps));
                let direction = f.direction.as_deref().unwrap_or("copy");
                events.push(json!({
                    "ph": "X", "cat": "copy", "name": format!("copy {direction}"),
                    "pid": pid, "tid": tid, "ts": (now - dur).max(0.0), "dur": dur, "args": args,
                }));
            }
            _ => {
                let name = match (&*kind, &f.kernel) {
                    ("launch", Some(k)) => format!("launch {k}"),
                    // Its line's construct: "device 0: target enter data at main.rs:7 ...".
                    ("construct", _) => f.construct().unwrap_or_else(|| kind.clone()),
                    _ => kind.clone(),
                };
                events.push(json!({
                    "ph": "i", "s": "t", "cat": kind, "name": name,
                    "pid": pid, "tid": tid, "ts": now, "args": args,
                }));
            }
        }
        let delta = match kind.as_str() {
            "entry created" => 1,
            "entry removed" => -1,
            // Traced as created by its plan, then counted into another thread's entry.
            k if k.starts_with("entry published meanwhile") => -1,
            _ => 0,
        };
        if delta != 0 {
            let n = live.entry(pid).or_default();
            *n += delta;
            events.push(json!({
                "ph": "C", "name": "present entries", "pid": pid, "tid": 0, "ts": now,
                "args": {"entries": *n},
            }));
        }
    }
}

impl<S: Subscriber> Layer<S> for ChromeTraceLayer {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        // As `InfoLayer`'s: `sometimes`, so that other subscribers keep their own checks.
        if meta.target() == "offload" && !meta.is_span() {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        meta.target() == "offload" && !meta.is_span()
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "offload" {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        self.record(f);
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::DEBUG)
    }
}

/// The fields of an `offload` event (see [`crate::info`]).
#[derive(Default)]
struct Fields {
    kind: Option<String>,
    device: Option<u64>,
    bytes: Option<u64>,
    direction: Option<String>,
    micros: Option<f64>,
    kernel: Option<String>,
    /// Every other field, for the event's `args`.
    rest: Map<String, Value>,
}

impl Fields {
    /// A construct line's construct: between the device and ` at `.
    fn construct(&self) -> Option<String> {
        let line = self.rest.get("message")?.as_str()?;
        let (_, what) = line.split_once(": ")?;
        Some(what.split(" at ").next().unwrap_or(what).to_string())
    }

    /// The trace event's `args`: every field but `info` (the `OFFLOAD_INFO` bit).
    fn args(&self) -> Map<String, Value> {
        let mut args = self.rest.clone();
        let named = [
            ("kind", self.kind.as_ref().map(|v| json!(v))),
            ("device", self.device.map(|v| json!(v))),
            ("bytes", self.bytes.map(|v| json!(v))),
            ("direction", self.direction.as_ref().map(|v| json!(v))),
            ("micros", self.micros.map(|v| json!(v))),
            ("kernel", self.kernel.as_ref().map(|v| json!(v))),
        ];
        for (k, v) in named {
            if let Some(v) = v {
                args.insert(k.into(), v);
            }
        }
        args.remove("info");
        args
    }
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "device" => self.device = Some(value),
            "bytes" => self.bytes = Some(value),
            // Addresses as the trace lines show them.
            name @ ("host_begin" | "device_addr") => {
                self.rest.insert(name.into(), json!(format!("{value:#x}")));
            }
            name => {
                self.rest.insert(name.into(), json!(value));
            }
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        match u64::try_from(value) {
            Ok(v) => self.record_u64(field, v),
            Err(_) => {
                self.rest.insert(field.name().into(), json!(value));
            }
        }
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        match field.name() {
            "micros" => self.micros = Some(value),
            name => {
                self.rest.insert(name.into(), json!(value));
            }
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.rest.insert(field.name().into(), json!(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "kind" => self.kind = Some(value.to_string()),
            "direction" => self.direction = Some(value.to_string()),
            "kernel" => self.kernel = Some(value.to_string()),
            name => {
                self.rest.insert(name.into(), json!(value));
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn writes_processes_threads_slices_instants_and_counters() {
        let path = std::env::temp_dir().join(format!("offload-chrome-unit-{}.json", std::process::id()));
        let layer = ChromeTraceLayer::new(path.clone());
        let subscriber = tracing_subscriber::registry().with(layer.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "offload", info = 0x01u32, kind = "construct", device = 1usize,
                at = "main.rs:3", "device 1: target data at main.rs:3");
            tracing::debug!(target: "offload", info = 0x08u32, kind = "entry created", device = 1usize, "e");
            tracing::debug!(target: "offload", info = 0x20u32, kind = "copy", device = 1usize, bytes = 4000usize,
                direction = "host->device", staged = false, micros = 2.0f64, device_addr = 4096u64, "copy");
            tracing::debug!(target: "offload", info = 0x01u32, kind = "launch", device = 1usize, kernel = "k",
                n = 10usize, "launch");
            tracing::debug!(target: "offload", info = 0x08u32, kind = "entry removed", device = 1usize, "e");
            tracing::debug!(target: "elsewhere", kind = "copy", "not offload's");
        });
        let flushed = layer.flush();
        let text = std::fs::read_to_string(layer.path());
        let _ = std::fs::remove_file(&path);
        assert!(flushed.is_ok(), "{flushed:?}");
        let doc: Value = serde_json::from_str(&text.unwrap_or_default()).unwrap_or(Value::Null);
        assert_eq!(doc["displayTimeUnit"], "ns");
        let events = doc["traceEvents"].as_array().cloned().unwrap_or_default();
        let of = |ph: &str| events.iter().filter(|e| e["ph"] == ph).cloned().collect::<Vec<_>>();
        let names: Vec<_> =
            of("M").iter().map(|e| e["args"]["name"].clone()).filter(|n| !n.is_null()).collect();
        assert!(names.contains(&json!("device 1")), "{names:?}");
        assert!(names.contains(&json!("host")), "{names:?}");
        let copies = of("X");
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0]["dur"], 2.0);
        assert_eq!(copies[0]["args"]["bytes"], 4000);
        assert_eq!(copies[0]["args"]["gb_per_s"], 2.0);
        assert_eq!(copies[0]["args"]["staged"], false);
        assert_eq!(copies[0]["args"]["device_addr"], "0x1000");
        let instants = of("i");
        assert_eq!(instants[0]["args"]["at"], "main.rs:3");
        assert_eq!(instants[0]["name"], "target data");
        assert!(instants.iter().any(|e| e["name"] == "launch k" && e["args"]["n"] == 10));
        let counts: Vec<_> = of("C").iter().map(|e| e["args"]["entries"].clone()).collect();
        assert_eq!(counts, [json!(1), json!(0)]);
    }

    #[test]
    fn an_unwritable_path_is_an_error_naming_it() {
        let layer = ChromeTraceLayer::new(PathBuf::from("/nonexistent-offload-dir/t.json"));
        let e = layer.flush().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("OFFLOAD_TRACE") && e.contains("/nonexistent-offload-dir/t.json"), "{e}");
    }
}
