//! The timeline file of `OFFLOAD_TRACE=path.json` ([`crate::RuntimeBuilder::trace_file`]):
//! the runtime's `offload` events in the Chrome trace-event format (its JSON Object
//! Format, `{"traceEvents": [...], "displayTimeUnit": "ns"}`), which Perfetto and
//! `chrome://tracing` open.
//!
//! A [`ChromeTraceLayer`] sits in the runtime's own subscriber beside the `OFFLOAD_INFO`
//! layer and turns each event into trace events:
//!
//! - a process per device (pid: the device number + 1, named `device N`) and one for the
//!   host (pid 0, `host`: events of no device); in each, a track per device queue that ran
//!   work (`copy-in queue`, `compute queue`, `copy-out queue`; a host device's one
//!   `worker queue`, which runs all three in turn) and one per OS thread that
//!   emitted events, named by the thread's name (`main`, `offload-dev0-compute`, ...);
//! - on a queue's track, a complete event (`"ph": "X"`) per copy (`copy`: direction,
//!   bytes, staged, GB/s), kernel (`kernel`: name, `n`), library call (`gemm`) and replay,
//!   timed on the device: between two stamps the device's queue reached
//!   ([`crate::backend`]'s `stamp`: timed events on CUDA, the worker's clock on host
//!   devices; HIP has none yet);
//! - on a thread's track, a complete event per construct (`construct`: from its trace line
//!   to its end, with the program's `file:line` and the line itself) and per copy the
//!   thread waited for (`host copy`), and instants (`"ph": "i"`) for launches, queued
//!   copies, present-table entry events, the program's notes (`note`, named by their
//!   words: `Runtime::annotate`) and everything else;
//! - a flow arrow (`"ph": "s"` / `"f"`) from each construct to each queue span it caused;
//! - counters (`"ph": "C"`) per device after each construct, read from its table and pool:
//!   `present entries`, `mapped bytes`, `pool bytes` (`in_use`, `cached`); and one per
//!   named entry, `ref count a[0:4]` (`count`, and `hold` once its hold count has been
//!   used), set when the entry is made, found, left mapped by an exit, and removed (0).
//!
//! Times are microseconds since the trace began (one clock for the process; a GPU's times
//! are placed on it through an anchor event). Events are written to the file as they come,
//! each as one line of JSON straight from the event's fields (nothing is kept in memory
//! but the tracks' names and the latest constructs' starts); [`ChromeTraceLayer::flush`]
//! (the runtime's `flush_trace`, and its drop) closes the document, which the next event
//! reopens.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Instant;

use parking_lot::Mutex;
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
    /// `rank R: ` before each process's name, under an MPI launcher.
    rank: String,
    start: Instant,
    /// `start` on [`clock_origin`]'s clock, in microseconds.
    origin_offset: f64,
    state: Mutex<State>,
}

/// One value of a trace event's `args`.
#[derive(Clone, Debug)]
enum Arg {
    U(u64),
    I(i64),
    F(f64),
    B(bool),
    S(String),
}

/// A trace event's `args`: field names and values.
type Args = Vec<(&'static str, Arg)>;

/// One trace event, written by [`EventFile::push`].
struct TraceEvent<'a> {
    ph: &'static str,
    name: &'a str,
    cat: Option<&'a str>,
    pid: u64,
    tid: u64,
    ts: f64,
    /// A complete event's duration.
    dur: Option<f64>,
    /// A flow arrow's id (and, at its end, binding to the enclosing slice).
    flow: Option<u64>,
    args: &'a [(&'a str, Arg)],
}

/// The file's events, written as they come: the file's head, then each event after a
/// comma; a flush writes the tail that closes the document, and the next event writes
/// over it.
struct EventFile {
    out: BufWriter<File>,
    written: u64,
    /// The tail is at the end of the file (the position is after it).
    closed: bool,
    /// The first failed write, for the next flush to report.
    failed: Option<std::io::Error>,
}

const HEAD: &[u8] = b"{\"traceEvents\":[\n";
const TAIL: &[u8] = b"\n],\"displayTimeUnit\":\"ns\"}\n";

/// Writes `s` as a JSON string.
fn string(out: &mut impl Write, s: &str) -> std::io::Result<()> {
    serde_json::to_writer(out, s).map_err(std::io::Error::from)
}

/// Writes `v` as a JSON number (`null` for what JSON has no number for).
fn number(out: &mut impl Write, v: f64) -> std::io::Result<()> {
    if v.is_finite() {
        write!(out, "{v}")
    } else {
        out.write_all(b"null")
    }
}

impl EventFile {
    fn create(path: &Path) -> std::io::Result<Self> {
        let mut out = BufWriter::with_capacity(1 << 18, File::create(path)?);
        out.write_all(HEAD)?;
        Ok(Self { out, written: 0, closed: false, failed: None })
    }

    fn push(&mut self, e: &TraceEvent<'_>) {
        let written = self.write(e);
        match written {
            Ok(()) => self.written += 1,
            Err(err) => {
                self.failed.get_or_insert(err);
            }
        }
    }

    fn write(&mut self, e: &TraceEvent<'_>) -> std::io::Result<()> {
        if self.closed {
            self.out.seek(SeekFrom::Current(-(TAIL.len() as i64)))?;
            self.closed = false;
        }
        let out = &mut self.out;
        if self.written > 0 {
            out.write_all(b",\n")?;
        }
        write!(out, "{{\"ph\":\"{}\",\"pid\":{},\"tid\":{},\"ts\":", e.ph, e.pid, e.tid)?;
        number(out, e.ts)?;
        out.write_all(b",\"name\":")?;
        string(out, e.name)?;
        if let Some(cat) = e.cat {
            out.write_all(b",\"cat\":")?;
            string(out, cat)?;
        }
        if let Some(dur) = e.dur {
            out.write_all(b",\"dur\":")?;
            number(out, dur)?;
        }
        match (e.ph, e.flow) {
            ("f", Some(id)) => write!(out, ",\"id\":{id},\"bp\":\"e\"")?,
            (_, Some(id)) => write!(out, ",\"id\":{id}")?,
            ("i", None) => out.write_all(b",\"s\":\"t\"")?,
            _ => {}
        }
        out.write_all(b",\"args\":{")?;
        for (i, (k, v)) in e.args.iter().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            string(out, k)?;
            out.write_all(b":")?;
            match v {
                Arg::U(v) => write!(out, "{v}")?,
                Arg::I(v) => write!(out, "{v}")?,
                Arg::F(v) => number(out, *v)?,
                Arg::B(v) => write!(out, "{v}")?,
                Arg::S(v) => string(out, v)?,
            }
        }
        out.write_all(b"}}")
    }

    /// Closes the document and writes it out (an event after it reopens it).
    fn flush(&mut self) -> std::io::Result<()> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if !self.closed {
            self.out.write_all(TAIL)?;
            self.closed = true;
        }
        self.out.flush()
    }
}

struct State {
    events: EventFile,
    /// Each OS thread's tid (numbered from 1 in order of first event) and name.
    threads: HashMap<ThreadId, (u64, String)>,
    /// Processes and (process, thread) pairs already named by a metadata event.
    processes: BTreeSet<u64>,
    named_threads: HashSet<(u64, u64)>,
    /// Named entries (pid, name) whose hold count has been above 0: their `ref count`
    /// counters carry `hold` too, until they are removed.
    held: HashSet<(u64, String)>,
    /// Constructs begun and not ended yet, by number.
    open: HashMap<u64, OpenConstruct>,
    /// Where and when the latest constructs began (pid, tid, ts), for flow arrows to work
    /// they caused that ran after they ended (the oldest forgotten past [`REMEMBERED`]).
    began: BTreeMap<u64, (u64, u64, f64)>,
    /// Flow arrows drawn so far (their ids).
    flows: u64,
}

/// Constructs whose start a later span's arrow can find.
const REMEMBERED: usize = 1 << 16;

/// A construct's start, until its end makes it a slice.
struct OpenConstruct {
    pid: u64,
    tid: u64,
    ts: f64,
    name: String,
    args: Args,
}

/// Device queue tracks' tids: above any OS thread's.
const QUEUE_TID: u64 = 1 << 20;

/// A device queue's track (tid, name, sort index: first in the device's process).
fn queue_track(queue: &str) -> (u64, String, i64) {
    let i = match queue {
        "copy-in" | "worker" => 0,
        "compute" => 1,
        "copy-out" => 2,
        _ => 3,
    };
    (QUEUE_TID + i as u64, format!("{queue} queue"), i - 10)
}

impl fmt::Debug for ChromeTraceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChromeTraceLayer").field("path", &self.shared.path).finish_non_exhaustive()
    }
}

impl State {
    /// A metadata event (`"ph": "M"`) naming (`value`: a string) or ordering a process or
    /// thread.
    fn meta(&mut self, what: &'static str, pid: u64, tid: u64, value: Arg) {
        let key = if what.ends_with("sort_index") { "sort_index" } else { "name" };
        let args = [(key, value)];
        let e = TraceEvent {
            ph: "M",
            name: what,
            cat: None,
            pid,
            tid,
            ts: 0.0,
            dur: None,
            flow: None,
            args: &args,
        };
        self.events.push(&e);
    }

    /// A flow arrow from construct `construct`'s start to the slice at `to` (pid, tid, ts).
    fn flow_from(&mut self, construct: Option<u64>, (pid, tid, ts): (u64, u64, f64)) {
        let Some(&(cpid, ctid, cts)) = construct.and_then(|c| self.began.get(&c)) else {
            return;
        };
        self.flows += 1;
        let id = Some(self.flows);
        let arrow = |ph, pid, tid, ts| TraceEvent {
            ph,
            name: "caused",
            cat: Some("flow"),
            pid,
            tid,
            ts,
            dur: None,
            flow: id,
            args: &[],
        };
        self.events.push(&arrow("s", cpid, ctid, cts));
        self.events.push(&arrow("f", pid, tid, ts));
    }
}

/// The error of a trace file that could not be written.
fn write_failed(path: &Path, e: &std::io::Error) -> Error {
    Error::InvalidSetting {
        var: "OFFLOAD_TRACE",
        value: path.display().to_string(),
        expected: match e.kind() {
            std::io::ErrorKind::NotFound => "a file path in an existing folder (writing the trace failed)",
            std::io::ErrorKind::PermissionDenied => {
                "a file path the program may write (writing the trace: permission denied)"
            }
            _ => "a file path the runtime can create and write (writing the trace failed)",
        },
    }
}

/// A counter event (`"ph": "C"`) of process `pid` at `ts`.
fn counter<'a>(name: &'a str, pid: u64, ts: f64, args: &'a [(&'a str, Arg)]) -> TraceEvent<'a> {
    TraceEvent { ph: "C", name, cat: None, pid, tid: 0, ts, dur: None, flow: None, args }
}

/// A complete event (`"ph": "X"`) on track `(pid, tid)` from `ts` for `dur` microseconds.
fn slice<'a>(
    name: &'a str,
    cat: &'a str,
    (pid, tid): (u64, u64),
    (ts, dur): (f64, f64),
    args: &'a Args,
) -> TraceEvent<'a> {
    TraceEvent {
        ph: "X",
        name,
        cat: Some(cat),
        pid,
        tid,
        ts: ts.max(0.0),
        dur: Some(dur.max(0.0)),
        flow: None,
        args,
    }
}

/// A copy's rate: bytes per microsecond / 1000 = GB/s (`None` for no time).
fn gb_per_s(bytes: Option<u64>, micros: f64) -> Option<f64> {
    (micros > 0.0).then(|| bytes.unwrap_or(0) as f64 / micros / 1e3)
}

/// The process's clock for device spans' absolute end times (`ended_at_micros`): the first
/// moment anything asked for it.
pub(crate) fn clock_origin() -> std::time::Instant {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

impl ChromeTraceLayer {
    /// A trace to be written to `path`, its clock starting now; under an MPI launcher, the
    /// process's `rank` names its processes (`rank 1: device 0`).
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for `OFFLOAD_TRACE`, naming the path, when the file cannot
    /// be created.
    pub(crate) fn new(path: PathBuf, rank: Option<u32>) -> Result<Self> {
        let rank = rank.map(|r| format!("rank {r}: ")).unwrap_or_default();
        let events = EventFile::create(&path).map_err(|e| write_failed(&path, &e))?;
        let mut state = State {
            events,
            threads: HashMap::new(),
            processes: BTreeSet::new(),
            named_threads: HashSet::new(),
            held: HashSet::new(),
            open: HashMap::new(),
            began: BTreeMap::new(),
            flows: 0,
        };
        // The host's process is named from the start; each device's at its first event.
        state.processes.insert(0);
        state.meta("process_name", 0, 0, Arg::S(format!("{rank}host")));
        let origin = clock_origin();
        let start = Instant::now();
        let origin_offset = start.saturating_duration_since(origin).as_secs_f64() * 1e6;
        Ok(Self { shared: Arc::new(Shared { path, rank, start, origin_offset, state: Mutex::new(state) }) })
    }

    /// The file written.
    pub(crate) fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Writes every event so far out to the file, closing the document (later events
    /// reopen it: the file is whole after each flush).
    pub(crate) fn flush(&self) -> Result<()> {
        self.shared.state.lock().events.flush().map_err(|e| write_failed(&self.shared.path, &e))
    }

    /// Records one event's trace events.
    fn record(&self, f: Fields) {
        let thread = std::thread::current();
        let mut state = self.shared.state.lock();
        // Read under the lock, so that the file's events are in time order.
        let now = self.shared.start.elapsed().as_secs_f64() * 1e6;
        let pid = f.device.map_or(0, |d| d + 1);
        let st = &mut *state;
        if st.processes.insert(pid) {
            let rank = &self.shared.rank;
            let name = f.device.map_or_else(|| format!("{rank}host"), |d| format!("{rank}device {d}"));
            st.meta("process_name", pid, 0, Arg::S(name));
            st.meta("process_sort_index", pid, 0, Arg::U(pid));
        }
        // A device-side span is drawn on its queue's track; everything else on the track of
        // the OS thread that emitted it.
        let (tid, track, sort) = match &f.queue {
            Some(q) => queue_track(q),
            None => {
                let next = st.threads.len() as u64 + 1;
                let (tid, name) = st.threads.entry(thread.id()).or_insert_with(|| {
                    (next, thread.name().map_or_else(|| format!("thread {next}"), str::to_string))
                });
                (*tid, name.clone(), *tid as i64)
            }
        };
        if st.named_threads.insert((pid, tid)) {
            st.meta("thread_name", pid, tid, Arg::S(track));
            st.meta("thread_sort_index", pid, tid, Arg::I(sort));
        }
        let kind = f.kind.as_deref().unwrap_or("event");
        let here = |name, cat, ts, dur, args| slice(name, cat, (pid, tid), (ts, dur), args);
        if f.queue.is_some() {
            let dur = f.micros.unwrap_or(0.0).max(0.0);
            // By the span's absolute end (a time read before the event reaches this lock
            // would shift the span by however long the thread waited); `now` without one.
            let end = f.ended_at.map_or(now, |at| at - self.shared.origin_offset);
            let ts = (end - dur).max(0.0);
            let name = match (kind, &f.kernel, &f.direction) {
                ("copy", _, Some(d)) => format!("copy {d}"),
                ("kernel", Some(k), _) => format!("kernel {k}"),
                (_, Some(k), _) => format!("{kind} {k}"),
                _ => kind.to_string(),
            };
            let args = f.args(kind == "copy", false);
            st.events.push(&here(&name, kind, ts, dur, &args));
            st.flow_from(f.construct, (pid, tid, ts));
            return;
        }
        match kind {
            "copy" if f.queued != Some(true) => {
                // The calling thread's time in a copy it waited for.
                let dur = f.micros.unwrap_or(0.0).max(0.0);
                let name = format!("copy {}", f.direction.as_deref().unwrap_or(""));
                st.events.push(&here(&name, "host copy", now - dur, dur, &f.args(true, false)));
            }
            "construct" if f.construct.is_some() => {
                let id = f.construct.unwrap_or_default();
                let name = f.construct_name().unwrap_or_else(|| kind.to_string());
                st.began.insert(id, (pid, tid, now));
                if st.began.len() > REMEMBERED {
                    st.began.pop_first();
                }
                st.open.insert(id, OpenConstruct { pid, tid, ts: now, name, args: f.args(false, true) });
            }
            "construct end" => {
                if let Some(c) = f.construct.and_then(|id| st.open.remove(&id)) {
                    st.events.push(&slice(&c.name, "construct", (c.pid, c.tid), (c.ts, now - c.ts), &c.args));
                }
                if let Some(u) = &f.usage {
                    let counters: [(&str, &[(&str, Arg)]); 3] = [
                        ("present entries", &[("entries", Arg::U(u.entries))]),
                        ("mapped bytes", &[("bytes", Arg::U(u.mapped_bytes))]),
                        (
                            "pool bytes",
                            &[("in_use", Arg::U(u.pool_in_use)), ("cached", Arg::U(u.pool_cached))],
                        ),
                    ];
                    for (name, args) in counters {
                        st.events.push(&counter(name, pid, now, args));
                    }
                }
            }
            _ => {
                // A named entry's reference count, as a counter per entry (`ref count
                // a[0:4]`): made, found, left mapped by an exit, removed.
                if let (Some(range), Some(count)) = (f.text_arg("range"), f.count_arg("ref_count")) {
                    if matches!(kind, "entry created" | "mapping exists" | "entry removed" | "counts") {
                        let removed = kind == "entry removed";
                        let count = if removed { 0 } else { count };
                        let hold = if removed { 0 } else { f.count_arg("hold_count").unwrap_or(0) };
                        // The hold count once it has been used (`ompx_hold`), to the entry's end.
                        let key = (pid, range.clone());
                        let with_hold = if hold > 0 {
                            st.held.insert(key);
                            true
                        } else if removed {
                            st.held.remove(&key)
                        } else {
                            st.held.contains(&key)
                        };
                        let both = [("count", Arg::U(count)), ("hold", Arg::U(hold))];
                        let args = if with_hold { &both[..] } else { &both[..1] };
                        st.events.push(&counter(&format!("ref count {range}"), pid, now, args));
                    }
                }
                if kind == "counts" {
                    return;
                }
                let name = match (kind, &f.kernel, f.queued) {
                    ("launch", Some(k), _) => format!("launch {k}"),
                    ("copy", _, Some(true)) => format!("queue copy {}", f.direction.as_deref().unwrap_or("")),
                    // Its line's construct: "device 0: target enter data at main.rs:7 ...".
                    ("construct", _, _) => f.construct_name().unwrap_or_else(|| kind.to_string()),
                    // The program's own words (`Runtime::annotate`).
                    ("note", _, _) => f.message.clone().unwrap_or_default(),
                    _ => kind.to_string(),
                };
                // The line where it was written (the tracer leaves it empty where the fields
                // say it all: `Trace::event`).
                let args = f.args(false, true);
                let e = TraceEvent {
                    ph: "i",
                    name: &name,
                    cat: Some(kind),
                    pid,
                    tid,
                    ts: now,
                    dur: None,
                    flow: None,
                    args: &args,
                };
                st.events.push(&e);
            }
        }
    }
}

/// Whether the runtime's layers (this one, `InfoLayer`) read a callsite: an `offload`
/// event or `enabled!` hint, not a span.
pub(crate) fn is_offload_event(meta: &Metadata<'_>) -> bool {
    meta.target() == "offload" && !meta.is_span()
}

/// The runtime's layers' interest in a callsite: `sometimes`, never `always`, since a
/// runtime's layer is registered process-wide and must not make other subscribers skip
/// their own `enabled` checks.
pub(crate) fn offload_interest(meta: &Metadata<'_>) -> Interest {
    if is_offload_event(meta) {
        Interest::sometimes()
    } else {
        Interest::never()
    }
}

impl<S: Subscriber> Layer<S> for ChromeTraceLayer {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        offload_interest(meta)
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        is_offload_event(meta)
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

/// A device's table and pool after a construct: the counters' values.
#[derive(Default)]
struct Usage {
    entries: u64,
    mapped_bytes: u64,
    pool_in_use: u64,
    pool_cached: u64,
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
    construct: Option<u64>,
    queued: Option<bool>,
    queue: Option<String>,
    ended_at: Option<f64>,
    usage: Option<Usage>,
    message: Option<String>,
    /// Every other field, for the event's `args`.
    rest: Args,
}

impl Fields {
    /// Field `key` among the others, if it is text.
    fn text_arg(&self, key: &str) -> Option<String> {
        self.rest.iter().find_map(|(k, v)| match v {
            Arg::S(s) if *k == key => Some(s.clone()),
            _ => None,
        })
    }

    /// Field `key` among the others, if it is a count.
    fn count_arg(&self, key: &str) -> Option<u64> {
        self.rest.iter().find_map(|(k, v)| match v {
            Arg::U(n) if *k == key => Some(*n),
            _ => None,
        })
    }

    /// A construct line's construct: between the device and ` at `.
    fn construct_name(&self) -> Option<String> {
        let line = self.message.as_deref()?;
        let (_, what) = line.split_once(": ")?;
        Some(what.split(" at ").next().unwrap_or(what).to_string())
    }

    /// The trace event's `args`: the fields (with a copy's `gb_per_s`, and with `line`
    /// the trace line as `message`), but `info` (the `OFFLOAD_INFO` bit).
    fn args(&self, rate: bool, line: bool) -> Args {
        let mut args = self.rest.clone();
        let text = |v: &Option<String>| v.as_ref().map(|v| Arg::S(v.clone()));
        let named = [
            ("device", self.device.map(Arg::U)),
            ("bytes", self.bytes.map(Arg::U)),
            ("direction", text(&self.direction)),
            ("micros", self.micros.map(Arg::F)),
            ("kernel", text(&self.kernel)),
            (
                "gb_per_s",
                if rate { gb_per_s(self.bytes, self.micros.unwrap_or(0.0)).map(Arg::F) } else { None },
            ),
            ("message", self.message.as_ref().filter(|m| line && !m.is_empty()).map(|m| Arg::S(m.clone()))),
        ];
        args.extend(named.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
        args
    }
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "info" => {}
            "device" => self.device = Some(value),
            "bytes" => self.bytes = Some(value),
            "construct" => self.construct = Some(value),
            "live_entries" => self.usage.get_or_insert_with(Usage::default).entries = value,
            "mapped_bytes" => self.usage.get_or_insert_with(Usage::default).mapped_bytes = value,
            "pool_in_use" => self.usage.get_or_insert_with(Usage::default).pool_in_use = value,
            "pool_cached" => self.usage.get_or_insert_with(Usage::default).pool_cached = value,
            // Addresses as the trace lines show them.
            name @ ("host_begin" | "device_addr") => self.rest.push((name, Arg::S(format!("{value:#x}")))),
            name => self.rest.push((name, Arg::U(value))),
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        match u64::try_from(value) {
            Ok(v) => self.record_u64(field, v),
            Err(_) => self.rest.push((field.name(), Arg::I(value))),
        }
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        match field.name() {
            "micros" => self.micros = Some(value),
            "ended_at_micros" => self.ended_at = Some(value),
            name => self.rest.push((name, Arg::F(value))),
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "queued" {
            self.queued = Some(value);
        }
        self.rest.push((field.name(), Arg::B(value)));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "kind" => self.kind = Some(value.to_string()),
            "direction" => self.direction = Some(value.to_string()),
            "kernel" => self.kernel = Some(value.to_string()),
            "queue" => self.queue = Some(value.to_string()),
            "message" => self.message = Some(value.to_string()),
            name => self.rest.push((name, Arg::S(value.to_string()))),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn writes_processes_tracks_slices_flows_and_counters() {
        let path = std::env::temp_dir().join(format!("offload-chrome-unit-{}.json", std::process::id()));
        let layer = ChromeTraceLayer::new(path.clone(), None).expect("a trace file in the temporary folder");
        let subscriber = tracing_subscriber::registry().with(layer.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "offload", info = 0x01u32, kind = "construct", device = 1usize,
                at = "main.rs:3", construct = 7u64, "device 1: target data at main.rs:3");
            tracing::debug!(target: "offload", info = 0x08u32, kind = "entry created", device = 1usize, "e");
            tracing::debug!(target: "offload", info = 0x20u32, kind = "copy", device = 1usize, bytes = 4000usize,
                direction = "host->device", staged = false, queued = false, micros = 2.0f64,
                device_addr = 4096u64, construct = 7u64, "copy");
            tracing::debug!(target: "offload", info = 0x01u32, kind = "launch", device = 1usize, kernel = "k",
                n = 10usize, construct = 7u64, "launch");
            tracing::debug!(target: "offload", info = 0x8000_0000u32, kind = "construct end", device = 1usize,
                construct = 7u64, live_entries = 1usize, mapped_bytes = 4000usize, pool_in_use = 4096usize,
                pool_cached = 0usize, "end");
            // Reached by the device after the construct ended: 5 us long, ended just now.
            let ended_at = clock_origin().elapsed().as_secs_f64() * 1e6;
            tracing::debug!(target: "offload", info = 0x8000_0000u32, kind = "kernel", device = 1usize,
                kernel = "k", n = 10usize, queue = "compute", micros = 5.0f64, ended_at_micros = ended_at,
                construct = 7u64, "span");
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
        for n in ["device 1", "host", "compute queue"] {
            assert!(names.contains(&json!(n)), "{n}: {names:?}");
        }
        let slices = of("X");
        let cat = |c: &str| slices.iter().filter(|e| e["cat"] == c).cloned().collect::<Vec<_>>();
        let copies = cat("host copy");
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0]["dur"], 2.0);
        assert_eq!(copies[0]["args"]["bytes"], 4000);
        assert_eq!(copies[0]["args"]["gb_per_s"], 2.0);
        assert_eq!(copies[0]["args"]["device_addr"], "0x1000");
        let constructs = cat("construct");
        assert_eq!(constructs.len(), 1);
        assert_eq!(constructs[0]["name"], "target data");
        assert_eq!(constructs[0]["args"]["at"], "main.rs:3");
        let c_ts = constructs[0]["ts"].as_f64().unwrap_or(-1.0);
        let c_end = c_ts + constructs[0]["dur"].as_f64().unwrap_or(-1.0);
        let copy_ts = copies[0]["ts"].as_f64().unwrap_or(-1.0);
        assert!(c_ts - 1e-3 <= copy_ts && copy_ts + 2.0 <= c_end + 1e-3, "{copies:?} in {constructs:?}");
        let kernels = cat("kernel");
        assert_eq!(kernels.len(), 1);
        assert_eq!((kernels[0]["name"].clone(), kernels[0]["dur"].as_f64()), (json!("kernel k"), Some(5.0)));
        assert_eq!(kernels[0]["tid"], QUEUE_TID + 1);
        assert!(of("i").iter().any(|e| e["name"] == "launch k" && e["args"]["n"] == 10));
        // One arrow: from the construct's start to the kernel's.
        let (starts, ends) = (of("s"), of("f"));
        assert_eq!((starts.len(), ends.len()), (1, 1));
        assert_eq!(starts[0]["id"], ends[0]["id"]);
        assert_eq!(
            (starts[0]["ts"].clone(), starts[0]["tid"].clone()),
            (constructs[0]["ts"].clone(), constructs[0]["tid"].clone())
        );
        assert_eq!(
            (ends[0]["ts"].clone(), ends[0]["tid"].clone()),
            (kernels[0]["ts"].clone(), kernels[0]["tid"].clone())
        );
        let counter = |n: &str| of("C").into_iter().find(|e| e["name"] == n).map(|e| e["args"].clone());
        assert_eq!(counter("present entries"), Some(json!({"entries": 1})));
        assert_eq!(counter("mapped bytes"), Some(json!({"bytes": 4000})));
        assert_eq!(counter("pool bytes"), Some(json!({"in_use": 4096, "cached": 0})));
    }

    #[test]
    fn an_unwritable_path_is_an_error_naming_it() {
        let e = ChromeTraceLayer::new(PathBuf::from("/nonexistent-offload-dir/t.json"), None);
        let e = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("OFFLOAD_TRACE") && e.contains("/nonexistent-offload-dir/t.json"), "{e}");
    }

    #[test]
    fn the_file_is_whole_after_each_flush_and_grows_after_it() {
        let path = std::env::temp_dir().join(format!("offload-chrome-flushes-{}.json", std::process::id()));
        let layer = ChromeTraceLayer::new(path.clone(), None).expect("a trace file in the temporary folder");
        let count = || {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let doc: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            doc["traceEvents"].as_array().map(Vec::len)
        };
        assert!(layer.flush().is_ok());
        assert_eq!(count(), Some(1), "the host's name");
        let subscriber = tracing_subscriber::registry().with(layer.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "offload", info = 0x08u32, kind = "entry created", "e");
        });
        assert!(layer.flush().is_ok());
        let after_one = count();
        assert!(after_one > Some(1), "{after_one:?}");
        assert!(layer.flush().is_ok(), "a second flush with nothing new");
        assert_eq!(count(), after_one);
        let _ = std::fs::remove_file(&path);
    }
}
