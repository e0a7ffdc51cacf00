//! Pictures of `OFFLOAD_TRACE` timelines (docs/GUIDE.md, "Timeline traces"): a trace in
//! the Chrome trace-event format read into a small model ([`Trace`]), drawn as a plain SVG
//! ([`render_svg`]) or summed up per lane ([`summarize`]). The `offload-trace` program is
//! the command line over it.
//!
//! The reader takes what it knows and passes over the rest: complete slices (`"ph": "X"`),
//! instants (`"i"`, `"I"`), counters (`"C"`) and the process and thread names and sort
//! indices of metadata events (`"M"`); other phases (flows, begin/end pairs, ...) are
//! counted in [`Trace::ignored`]. Missing fields take a default (no `dur`: 0, no `cat`:
//! none), unknown categories are drawn as "other", and pids and tids may be numbers or
//! strings.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::Path;

use serde_json::Value;

/// Why a trace could not be read or drawn.
#[derive(Debug)]
pub enum TraceError {
    /// The file could not be read.
    Io {
        /// The file.
        path: String,
        /// What reading it said.
        error: std::io::Error,
    },
    /// The file is empty (or only white space).
    Empty,
    /// The JSON stops before its end: the run that wrote it did not close it.
    Unfinished(serde_json::Error),
    /// The text is not JSON.
    NotJson(serde_json::Error),
    /// The JSON is neither `{"traceEvents": [...]}` nor an array of events.
    NoEvents,
    /// The time window asked for is empty (or not a number).
    EmptyWindow {
        /// Its start, in microseconds.
        from_us: f64,
        /// Its end, in microseconds.
        to_us: f64,
    },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, error } => write!(f, "cannot read {path}: {error}"),
            Self::Empty => f.write_str(
                "not a trace: the file is empty: the run that wrote it never closed it (a runtime \
                 writes its trace when dropped, on flush_trace and, the process-wide one of \
                 Runtime::global and offload::omp, at exit; an abort or a signal leaves it unwritten)",
            ),
            Self::Unfinished(e) => write!(
                f,
                "not a trace: the file ends before its JSON does ({e}): the run that wrote it ended \
                 before closing it (an abort or a signal), or it is being written still"
            ),
            Self::NotJson(e) => write!(f, "not a trace: the file is not JSON ({e})"),
            Self::NoEvents => f.write_str(
                "not a trace: no \"traceEvents\" array (expected the Chrome trace-event format, \
                 {\"traceEvents\": [...]}, as OFFLOAD_TRACE writes it)",
            ),
            Self::EmptyWindow { from_us, to_us } => {
                write!(
                    f,
                    "empty time window: from {from_us} us to {to_us} us (the end must come after the start)"
                )
            }
        }
    }
}

impl std::error::Error for TraceError {}

/// A process or thread id: a number, as the runtime writes them, or a string, which the
/// format also allows. Numbers sort before strings.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Id {
    /// A whole number.
    Num(i64),
    /// Anything else, as its JSON text.
    Text(String),
}

impl Id {
    fn of(v: Option<&Value>) -> Id {
        match v {
            None | Some(Value::Null) => Id::Num(0),
            Some(v) => match v.as_i64() {
                Some(n) => Id::Num(n),
                None => Id::Text(v.as_str().map_or_else(|| v.to_string(), str::to_string)),
            },
        }
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Num(n) => write!(f, "{n}"),
            Id::Text(s) => f.write_str(s),
        }
    }
}

/// What a slice is, which gives its colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A copy from the host to a device.
    HostToDevice,
    /// A copy from a device to the host.
    DeviceToHost,
    /// A copy between devices.
    DeviceToDevice,
    /// A copy of no known direction.
    Copy,
    /// A copy a host thread waited for (`host copy`: the thread's time, beside the queue's).
    HostCopy,
    /// A kernel's run.
    Kernel,
    /// A matrix product (cuBLAS or the host devices' own).
    Gemm,
    /// A construct (`target enter data`, ...).
    Construct,
    /// Any other category.
    Other,
}

impl Kind {
    /// Every kind, in the legend's order.
    pub const ALL: [Kind; 9] = [
        Kind::HostToDevice,
        Kind::DeviceToHost,
        Kind::DeviceToDevice,
        Kind::Copy,
        Kind::HostCopy,
        Kind::Kernel,
        Kind::Gemm,
        Kind::Construct,
        Kind::Other,
    ];

    /// The slice's kind from its category, its name and its `direction` argument.
    fn of(cat: &str, name: &str, args: &Value) -> Kind {
        let has = |c: &str| cat.split(',').any(|x| x.trim() == c);
        if has("copy") {
            let dir = args.get("direction").and_then(Value::as_str).unwrap_or(name);
            if dir.contains("host->device") {
                Kind::HostToDevice
            } else if dir.contains("device->host") {
                Kind::DeviceToHost
            } else if dir.contains("device->device") {
                Kind::DeviceToDevice
            } else {
                Kind::Copy
            }
        } else if has("host copy") {
            Kind::HostCopy
        } else if has("kernel") {
            Kind::Kernel
        } else if has("gemm") {
            Kind::Gemm
        } else if has("construct") {
            Kind::Construct
        } else {
            Kind::Other
        }
    }

    /// The legend's words for it.
    pub fn label(self) -> &'static str {
        match self {
            Kind::HostToDevice => "copy host->device",
            Kind::DeviceToHost => "copy device->host",
            Kind::DeviceToDevice => "copy device->device",
            Kind::Copy => "copy",
            Kind::HostCopy => "thread waits for a copy",
            Kind::Kernel => "kernel",
            Kind::Gemm => "gemm",
            Kind::Construct => "construct",
            Kind::Other => "other",
        }
    }

    /// Its fill (Okabe and Ito's colour-blind-safe palette, grey for constructs and others).
    pub fn colour(self) -> &'static str {
        match self {
            Kind::HostToDevice => "#0072B2",
            Kind::DeviceToHost => "#E69F00",
            Kind::DeviceToDevice => "#CC79A7",
            Kind::Copy => "#56B4E9",
            Kind::HostCopy => "#A9C6DA",
            Kind::Kernel => "#009E73",
            Kind::Gemm => "#D55E00",
            Kind::Construct => "#7D7F9A",
            Kind::Other => "#C4C4C4",
        }
    }

    /// The colour of a label written on its fill.
    fn ink(self) -> &'static str {
        match self {
            Kind::DeviceToHost | Kind::Copy | Kind::HostCopy | Kind::Other => "#111111",
            _ => "#FFFFFF",
        }
    }

    /// Whether it is a copy of any direction.
    pub fn is_copy(self) -> bool {
        matches!(self, Kind::HostToDevice | Kind::DeviceToHost | Kind::DeviceToDevice | Kind::Copy)
    }

    /// Whether it is device work that copies may overlap: kernels and matrix products.
    pub fn is_compute(self) -> bool {
        matches!(self, Kind::Kernel | Kind::Gemm)
    }
}

/// A complete event (`"ph": "X"`).
#[derive(Clone, Debug)]
pub struct Slice {
    /// Start, in microseconds.
    pub ts: f64,
    /// Length, in microseconds (0 when missing or negative).
    pub dur: f64,
    /// Its name.
    pub name: String,
    /// Its kind, from its category.
    pub kind: Kind,
    /// `args.bytes`, for copies.
    pub bytes: Option<u64>,
    /// `args.range`: the host range as the program named it (`a[0:5]`), for copies.
    pub range: Option<String>,
    /// Its arguments as `key: value` lines, for the picture's tooltips.
    pub detail: String,
}

impl Slice {
    /// Its end, in microseconds.
    pub fn end(&self) -> f64 {
        self.ts + self.dur
    }
}

/// An instant (`"ph": "i"`).
#[derive(Clone, Debug)]
pub struct Mark {
    /// When, in microseconds.
    pub ts: f64,
    /// Its name.
    pub name: String,
    /// Its category (`race`: a race warning; `note`: the program's annotation, drawn
    /// with its words).
    pub cat: String,
    /// Its arguments as `key: value` lines, for the picture's tooltips.
    pub detail: String,
}

impl Mark {
    /// Whether it is drawn with words (a race, a note), even when other instants are not.
    pub fn is_labelled(&self) -> bool {
        matches!(self.cat.as_str(), "race" | "note")
    }
}

/// A thread's track.
#[derive(Clone, Debug)]
pub struct Lane {
    /// The thread's id.
    pub tid: Id,
    /// Its `thread_name`, else `tid N`.
    pub name: String,
    /// Its `thread_sort_index`, if any.
    pub sort_index: Option<i64>,
    /// Its slices, by start.
    pub slices: Vec<Slice>,
    /// Its instants, by time.
    pub marks: Vec<Mark>,
}

/// A process (the host, or a device) and its lanes.
#[derive(Clone, Debug)]
pub struct Process {
    /// The process id (the runtime's: 0 for the host, N + 1 for device N).
    pub pid: Id,
    /// Its `process_name`, else `pid N`.
    pub name: String,
    /// Its `process_sort_index`, if any.
    pub sort_index: Option<i64>,
    /// Its lanes, in sort order.
    pub lanes: Vec<Lane>,
}

/// One numeric argument of one counter of one process, over time.
#[derive(Clone, Debug)]
pub struct Counter {
    /// The process's id.
    pub pid: Id,
    /// The process's name.
    pub process: String,
    /// The counter's name (`present entries`, `pool bytes`, ...).
    pub name: String,
    /// The argument (`entries`, `in_use`, ...).
    pub key: String,
    /// Whether the counter has other arguments beside this one (then its label names `key`).
    pub has_siblings: bool,
    /// (time in microseconds, value), by time.
    pub points: Vec<(f64, f64)>,
}

impl Counter {
    /// Its label: the counter's name, with the argument's when it has several.
    pub fn label(&self) -> String {
        if self.has_siblings {
            format!("{}: {}", self.name, self.key)
        } else {
            self.name.clone()
        }
    }

    /// Whether its values are byte counts (they are then shown as KiB, MiB, ...).
    fn is_bytes(&self) -> bool {
        self.name.contains("bytes") || self.key.contains("bytes")
    }
}

/// A trace read into lanes and counters.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Processes with at least one slice or instant, in sort order (sort index, else pid).
    pub processes: Vec<Process>,
    /// Counter series, by process, name and argument.
    pub counters: Vec<Counter>,
    /// Events passed over: phases not drawn (flows, ...) and events with no time.
    pub ignored: usize,
}

/// Options of the picture and the summary.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// The title line (default: "offload trace").
    pub title: Option<String>,
    /// Start of the time window, in microseconds (default: the trace's first event).
    pub from_us: Option<f64>,
    /// End of the time window, in microseconds (default: the trace's last event's end).
    pub to_us: Option<f64>,
    /// The picture's width in pixels (at least 400).
    pub width: u32,
    /// Whether instants are drawn (as faint ticks above their lane's slices); races and
    /// the program's notes are drawn either way.
    pub instants: bool,
    /// Only these processes, by name (`device 0`) or pid; all when empty.
    pub processes: Vec<String>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self { title: None, from_us: None, to_us: None, width: 1200, instants: true, processes: Vec::new() }
    }
}

impl Trace {
    /// Reads the trace file at `path`.
    pub fn from_file(path: &Path) -> Result<Trace, TraceError> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| TraceError::Io { path: path.display().to_string(), error })?;
        Trace::parse(&text)
    }

    /// Reads a trace from its JSON text.
    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        if text.trim().is_empty() {
            return Err(TraceError::Empty);
        }
        let doc: Value = serde_json::from_str(text).map_err(|e| match e.classify() {
            serde_json::error::Category::Eof => TraceError::Unfinished(e),
            _ => TraceError::NotJson(e),
        })?;
        Trace::from_value(&doc)
    }

    /// Reads a trace from its JSON: the Object Format (`{"traceEvents": [...]}`) or the
    /// Array Format (a bare array of events).
    pub fn from_value(doc: &Value) -> Result<Trace, TraceError> {
        let events = match doc {
            Value::Array(events) => events,
            _ => doc.get("traceEvents").and_then(Value::as_array).ok_or(TraceError::NoEvents)?,
        };
        let mut meta = Names::default();
        for e in events.iter().filter(|e| e.get("ph").and_then(Value::as_str) == Some("M")) {
            meta.record(e);
        }
        let mut processes: BTreeMap<Id, BTreeMap<Id, Lane>> = BTreeMap::new();
        // (pid, counter name, argument) -> points
        let mut series: BTreeMap<(Id, String, String), Vec<(f64, f64)>> = BTreeMap::new();
        let mut ignored = 0;
        for e in events {
            let ph = e.get("ph").and_then(Value::as_str).unwrap_or("");
            let ts = e.get("ts").and_then(Value::as_f64).filter(|t| t.is_finite());
            let (ts, ph) = match (ph, ts) {
                ("M", _) => continue,
                (ph @ ("X" | "i" | "I" | "C"), Some(ts)) => (ts, ph),
                _ => {
                    ignored += 1;
                    continue;
                }
            };
            let pid = Id::of(e.get("pid"));
            let name = e.get("name").and_then(Value::as_str).unwrap_or("").to_string();
            let cat = e.get("cat").and_then(Value::as_str).unwrap_or("").to_string();
            let args = e.get("args").unwrap_or(&Value::Null);
            if ph == "C" {
                for (key, v) in args.as_object().into_iter().flatten() {
                    if let Some(v) = v.as_f64() {
                        series.entry((pid.clone(), name.clone(), key.clone())).or_default().push((ts, v));
                    }
                }
                continue;
            }
            let tid = Id::of(e.get("tid"));
            let lane = processes.entry(pid.clone()).or_default().entry(tid.clone()).or_insert_with(|| Lane {
                name: meta
                    .threads
                    .get(&(pid.clone(), tid.clone()))
                    .cloned()
                    .unwrap_or_else(|| format!("tid {tid}")),
                sort_index: meta.thread_sort.get(&(pid, tid.clone())).copied(),
                tid,
                slices: Vec::new(),
                marks: Vec::new(),
            });
            if ph == "X" {
                let dur =
                    e.get("dur").and_then(Value::as_f64).filter(|d| d.is_finite()).unwrap_or(0.0).max(0.0);
                let bytes = args.get("bytes").and_then(Value::as_u64);
                let range = args.get("range").and_then(Value::as_str).map(str::to_string);
                let kind = Kind::of(&cat, &name, args);
                lane.slices.push(Slice { ts, dur, kind, bytes, range, detail: detail(args), name });
            } else {
                lane.marks.push(Mark { ts, name, cat, detail: detail(args) });
            }
        }
        let mut processes: Vec<Process> = processes
            .into_iter()
            .map(|(pid, lanes)| {
                let mut lanes: Vec<Lane> = lanes.into_values().collect();
                lanes.sort_by_key(|l| sort_key(l.sort_index, &l.tid));
                for lane in &mut lanes {
                    lane.slices.sort_by(|a, b| a.ts.total_cmp(&b.ts));
                    lane.marks.sort_by(|a, b| a.ts.total_cmp(&b.ts));
                }
                Process {
                    name: meta.process_name(&pid),
                    sort_index: meta.process_sort.get(&pid).copied(),
                    pid,
                    lanes,
                }
            })
            .collect();
        processes.sort_by_key(|p| sort_key(p.sort_index, &p.pid));
        let mut keys_per_counter: BTreeMap<(Id, String), usize> = BTreeMap::new();
        for (pid, name, _) in series.keys() {
            *keys_per_counter.entry((pid.clone(), name.clone())).or_default() += 1;
        }
        let mut counters: Vec<Counter> = series
            .into_iter()
            .map(|((pid, name, key), mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                let has_siblings = keys_per_counter.get(&(pid.clone(), name.clone())).is_some_and(|&n| n > 1);
                Counter { process: meta.process_name(&pid), pid, name, key, has_siblings, points }
            })
            .collect();
        // Counters in their process's order (processes with counters only, after the rest).
        let order = |pid: &Id| processes.iter().position(|p| p.pid == *pid).unwrap_or(usize::MAX);
        counters.sort_by_cached_key(|c| {
            (order(&c.pid), sort_key(meta.process_sort.get(&c.pid).copied(), &c.pid))
        });
        Ok(Trace { processes, counters, ignored })
    }
}

/// Sorts by sort index, else by the id itself (as Perfetto does), then by id.
fn sort_key(sort_index: Option<i64>, id: &Id) -> (i64, Id) {
    let fallback = match id {
        Id::Num(n) => *n,
        Id::Text(_) => i64::MAX,
    };
    (sort_index.unwrap_or(fallback), id.clone())
}

/// The names and sort indices that metadata events give.
#[derive(Default)]
struct Names {
    processes: BTreeMap<Id, String>,
    process_sort: BTreeMap<Id, i64>,
    threads: BTreeMap<(Id, Id), String>,
    thread_sort: BTreeMap<(Id, Id), i64>,
}

impl Names {
    fn record(&mut self, e: &Value) {
        let pid = Id::of(e.get("pid"));
        let tid = Id::of(e.get("tid"));
        let args = e.get("args");
        let name = args.and_then(|a| a.get("name")).and_then(Value::as_str).map(str::to_string);
        let sort = args.and_then(|a| a.get("sort_index")).and_then(Value::as_i64);
        match (e.get("name").and_then(Value::as_str), name, sort) {
            (Some("process_name"), Some(n), _) => {
                self.processes.insert(pid, n);
            }
            (Some("thread_name"), Some(n), _) => {
                self.threads.insert((pid, tid), n);
            }
            (Some("process_sort_index"), _, Some(s)) => {
                self.process_sort.insert(pid, s);
            }
            (Some("thread_sort_index"), _, Some(s)) => {
                self.thread_sort.insert((pid, tid), s);
            }
            _ => {}
        }
    }

    fn process_name(&self, pid: &Id) -> String {
        self.processes.get(pid).cloned().unwrap_or_else(|| format!("pid {pid}"))
    }
}

/// A slice's arguments as `key: value` lines, for its tooltip: long values cut, but the
/// trace line (`message`: a construct's whole map list) kept whole.
fn detail(args: &Value) -> String {
    let mut out = String::new();
    for (k, v) in args.as_object().into_iter().flatten().take(12) {
        let v = match v {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        let v = if k == "message" { v } else { cut(&v, 80) };
        let _ = writeln!(out, "{k}: {v}");
    }
    out
}

/// `s` cut to `max` characters, with an ellipsis when cut.
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// What the options select of a trace: its time window and processes.
struct View<'a> {
    from: f64,
    to: f64,
    processes: Vec<&'a Process>,
    counters: Vec<&'a Counter>,
}

impl<'a> View<'a> {
    fn new(trace: &'a Trace, options: &RenderOptions) -> Result<View<'a>, TraceError> {
        let wanted = |name: &str, pid: &Id| {
            options.processes.is_empty()
                || options.processes.iter().any(|p| p == name || *p == pid.to_string())
        };
        let processes: Vec<&Process> = trace.processes.iter().filter(|p| wanted(&p.name, &p.pid)).collect();
        let counters: Vec<&Counter> = trace.counters.iter().filter(|c| wanted(&c.process, &c.pid)).collect();
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        let mut span = |a: f64, b: f64| {
            lo = lo.min(a);
            hi = hi.max(b);
        };
        for lane in processes.iter().flat_map(|p| &p.lanes) {
            lane.slices.iter().for_each(|s| span(s.ts, s.end()));
            lane.marks.iter().filter(|_| options.instants).for_each(|m| span(m.ts, m.ts));
        }
        counters.iter().flat_map(|c| &c.points).for_each(|&(t, _)| span(t, t));
        if !lo.is_finite() {
            (lo, hi) = (0.0, 1.0);
        }
        let from = options.from_us.unwrap_or(lo);
        let mut to = options.to_us.unwrap_or(hi);
        if options.to_us.is_none() && to <= from {
            // One point in time, or a window that starts after the data: a microsecond.
            to = from + 1.0;
        }
        if !(from.is_finite() && to.is_finite() && to > from) {
            return Err(TraceError::EmptyWindow { from_us: from, to_us: to });
        }
        Ok(View { from, to, processes, counters })
    }

    /// `[start, end]` of `s` inside the window, if any of it is.
    fn clip(&self, start: f64, end: f64) -> Option<(f64, f64)> {
        (end >= self.from && start <= self.to).then(|| (start.max(self.from), end.min(self.to)))
    }

    fn slices<'l>(&self, lane: &'l Lane) -> impl Iterator<Item = (&'l Slice, f64, f64)> + use<'l, '_> {
        lane.slices.iter().filter_map(|s| self.clip(s.ts, s.end()).map(|(a, b)| (s, a, b)))
    }

    fn marks<'l>(&self, lane: &'l Lane) -> impl Iterator<Item = &'l Mark> + use<'l, '_> {
        lane.marks.iter().filter(|m| self.clip(m.ts, m.ts).is_some())
    }
}

// ---- the picture ----

const FONT: &str = "Helvetica, Arial, 'DejaVu Sans', sans-serif";
const PAD: f64 = 14.0;
/// Roughly a character's width at font size 11, to fit labels.
const CHAR_W: f64 = 6.3;
/// Where lane and counter labels start (process labels start at `PAD`).
const LABEL_X: f64 = PAD + 10.0;
const LANE_H: f64 = 22.0;
/// A lane's slices: from `BAR_TOP` below its top to its bottom less 2; instants above them.
const BAR_TOP: f64 = 8.0;
const GROUP_H: f64 = 22.0;
const STRIP_H: f64 = 40.0;
const COUNTER_COLOURS: [&str; 6] = ["#2563EB", "#059669", "#B45309", "#7C3AED", "#DB2777", "#0E7490"];

/// Renders `trace` as an SVG document: a title, a legend, a time axis, a lane per thread
/// grouped by process with its slices coloured by [`Kind`] (and its instants as faint
/// ticks), then a step-line strip per counter series. A trace with nothing to draw gives a
/// picture that says so.
///
/// # Errors
/// [`TraceError::EmptyWindow`] when the window asked for ends before it starts.
pub fn render_svg(trace: &Trace, options: &RenderOptions) -> Result<String, TraceError> {
    let view = View::new(trace, options)?;
    let width = f64::from(options.width.max(400));
    let lanes: Vec<(&Process, Vec<&Lane>)> = view
        .processes
        .iter()
        .map(|p| {
            let drawn = p
                .lanes
                .iter()
                .filter(|l| {
                    view.slices(l).next().is_some()
                        || view.marks(l).any(|m| options.instants || m.is_labelled())
                })
                .collect();
            (*p, drawn)
        })
        .filter(|(_, l): &(_, Vec<_>)| !l.is_empty())
        .collect();
    let counters: Vec<&Counter> =
        view.counters.iter().copied().filter(|c| steps(c, &view).is_some()).collect();
    let labels = lanes
        .iter()
        .flat_map(|(p, ls)| {
            std::iter::once(p.name.chars().count()).chain(ls.iter().map(|l| l.name.chars().count() + 2))
        })
        .chain(
            counters.iter().map(|c| c.label().chars().count().max(counter_note(c, &view).chars().count())),
        );
    let label_w = (LABEL_X + labels.max().unwrap_or(8) as f64 * CHAR_W + 16.0).clamp(120.0, 320.0);
    let plot = Plot { x0: label_w, x1: width - PAD - 8.0, from: view.from, to: view.to };
    let max_label = ((label_w - LABEL_X - 16.0) / CHAR_W).round() as usize;

    let mut body = String::new();
    let title = options.title.as_deref().unwrap_or("offload trace");
    let nslices: usize = lanes.iter().flat_map(|(_, ls)| ls).map(|l| view.slices(l).count()).sum();
    let nmarks: usize = lanes.iter().flat_map(|(_, ls)| ls).map(|l| view.marks(l).count()).sum();
    let _ = write!(
        body,
        r##"<text x="{PAD}" y="{}" font-size="16" font-weight="bold" fill="#111827">{}</text>"##,
        PAD + 14.0,
        esc(title)
    );
    let mut sub = format!("{} to {}", fmt_time(view.from), fmt_time(view.to));
    let _ = write!(sub, " · {nslices} slices");
    if options.instants {
        let _ = write!(sub, " · {nmarks} instants");
    }
    if !counters.is_empty() {
        let _ = write!(sub, " · {} counters", counters.len());
    }
    let _ = write!(
        body,
        r##"<text x="{PAD}" y="{}" font-size="11" fill="#6B7280">{}</text>"##,
        PAD + 31.0,
        esc(&sub)
    );

    // The legend: the kinds drawn, in their order, then instants.
    let mut kinds: Vec<Kind> =
        lanes.iter().flat_map(|(_, ls)| ls).flat_map(|l| view.slices(l).map(|(s, _, _)| s.kind)).collect();
    kinds.sort();
    kinds.dedup();
    let mut y = draw_legend(&mut body, &kinds, options.instants && nmarks > 0, width);
    y += 32.0;

    // The time axis, its labels above the lanes and its grid through them (drawn last,
    // under everything, once the height is known).
    let ticks = ticks(view.from, view.to, plot.x1 - plot.x0);
    let axis_y = y;
    for &(t, ref label) in &ticks {
        let _ = write!(
            body,
            r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#4B5563" text-anchor="middle">{}</text>"##,
            plot.x(t),
            axis_y - 6.0,
            esc(label)
        );
    }
    y += 2.0;
    let lanes_top = y;

    if lanes.is_empty() || nslices == 0 {
        let what = if trace.processes.is_empty() && trace.counters.is_empty() {
            "empty trace: no events to draw".to_string()
        } else if options.from_us.is_some() || options.to_us.is_some() {
            format!("no slices between {} and {}", fmt_time(view.from), fmt_time(view.to))
        } else {
            "no slices in this trace".to_string()
        };
        let _ = write!(
            body,
            r##"<text class="note" x="{:.1}" y="{:.1}" font-size="12" fill="#6B7280" font-style="italic">{}</text>"##,
            plot.x0,
            y + 16.0,
            esc(&what)
        );
        y += 26.0;
    }

    y = draw_lanes(&mut body, &view, &plot, &lanes, options, (width, max_label), y);
    let lanes_bottom = y;

    if !counters.is_empty() {
        y += 8.0;
        let _ = write!(
            body,
            r##"<text x="{PAD}" y="{:.1}" font-size="12" font-weight="bold" fill="#111827">counters</text>"##,
            y + 12.0
        );
        y += 18.0;
        for (i, c) in counters.iter().enumerate() {
            draw_counter(
                &mut body,
                &plot,
                &view,
                y,
                c,
                COUNTER_COLOURS[i % COUNTER_COLOURS.len()],
                max_label,
            );
            y += STRIP_H;
        }
    }
    let height = y + PAD;

    let mut grid = String::new();
    for &(t, _) in &ticks {
        let x = plot.x(t);
        let _ = write!(
            grid,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#E5E7EB" stroke-width="1"/>"##,
            axis_y - 2.0,
            y.max(lanes_bottom)
        );
    }
    let _ = write!(
        grid,
        r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#9CA3AF" stroke-width="1"/>"##,
        plot.x0,
        lanes_top - 2.0,
        plot.x1,
        lanes_top - 2.0
    );
    Ok(format!(
        concat!(
            r#"<?xml version="1.0" encoding="UTF-8"?>"#,
            "\n",
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h:.0}" viewBox="0 0 {w} {h:.0}" font-family="{font}">"#,
            "\n<title>{title}</title>\n",
            r##"<rect width="100%" height="100%" fill="#FFFFFF"/>"##,
            "\n{grid}\n{body}\n</svg>\n"
        ),
        w = width,
        h = height,
        font = FONT,
        title = esc(title),
        grid = grid,
        body = body
    ))
}

/// Each process's group heading, then its lanes (labels, slices, and instants when
/// `options.instants`) from `y` down; returns the y below them.
fn draw_lanes(
    body: &mut String,
    view: &View<'_>,
    plot: &Plot,
    lanes: &[(&Process, Vec<&Lane>)],
    options: &RenderOptions,
    (width, max_label): (f64, usize),
    mut y: f64,
) -> f64 {
    for (p, ls) in lanes {
        let _ = write!(
            body,
            r##"<rect x="0" y="{y:.1}" width="{width}" height="{GROUP_H}" fill="#F3F4F6"/><text class="process-label" x="{PAD}" y="{:.1}" font-size="12" font-weight="bold" fill="#111827">{}</text>"##,
            y + 15.0,
            esc(&cut(&p.name, max_label + 2))
        );
        y += GROUP_H;
        for (i, lane) in ls.iter().enumerate() {
            if i % 2 == 1 {
                let _ = write!(
                    body,
                    r##"<rect x="0" y="{y:.1}" width="{width}" height="{LANE_H}" fill="#FAFAFA"/>"##
                );
            }
            let _ = write!(
                body,
                r##"<text class="lane-label" x="{LABEL_X}" y="{:.1}" font-size="11" fill="#374151">{}</text>"##,
                y + 15.0,
                esc(&cut(&lane.name, max_label))
            );
            for (s, a, b) in view.slices(lane) {
                draw_slice(body, plot, y, s, a, b);
            }
            // Races and notes are drawn even without the other instants.
            let marks: Vec<&Mark> =
                view.marks(lane).filter(|m| options.instants || m.is_labelled()).collect();
            // A note's words run to the next note of its lane: walked from the end.
            let mut upcoming = plot.x1;
            let mut next = vec![plot.x1; marks.len()];
            for (k, m) in marks.iter().enumerate().rev() {
                next[k] = upcoming;
                if m.cat == "note" {
                    upcoming = plot.x(m.ts);
                }
            }
            for (m, next_x) in marks.iter().zip(next) {
                draw_mark(body, plot, y, m, next_x);
            }
            y += LANE_H;
        }
    }
    y
}

/// One instant of the lane at `lane_y`, with its tooltip: a faint tick above the slices; a
/// race warning as a red tick labelled `race`; the program's note as a dark tick with its
/// words, cut where the lane's next note begins (`next_x`).
fn draw_mark(body: &mut String, plot: &Plot, lane_y: f64, m: &Mark, next_x: f64) {
    let x = plot.x(m.ts);
    let mut tip = format!("{} ({}) at {}", m.name, m.cat, fmt_time(m.ts));
    if !m.detail.is_empty() {
        tip.push('\n');
        tip.push_str(m.detail.trim_end());
    }
    let (class, colour, opacity, words) = match m.cat.as_str() {
        "race" => ("race", "#DC2626", 1.0, Some("race".to_string())),
        "note" => ("note", "#111827", 1.0, Some(m.name.clone())),
        _ => ("instant", "#4B5563", 0.45, None),
    };
    let bottom = if words.is_some() { lane_y + LANE_H - 2.0 } else { lane_y + BAR_TOP - 1.0 };
    let _ = write!(
        body,
        r##"<line class="{class}" x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{bottom:.1}" stroke="{colour}" stroke-opacity="{opacity}" stroke-width="{}"><title>{}</title></line>"##,
        lane_y + 1.5,
        if words.is_some() { 1.5 } else { 1.0 },
        esc(&tip)
    );
    if let Some(words) = words {
        let room = ((next_x.min(plot.x1) - x - 4.0) / (CHAR_W * 0.9)).max(0.0) as usize;
        if room >= 1 {
            let _ = write!(
                body,
                r#"<text class="{class}-label" x="{:.1}" y="{:.1}" font-size="9.5" fill="{colour}" pointer-events="none">{}</text>"#,
                x + 2.5,
                lane_y + BAR_TOP + 5.0,
                esc(&cut(&words, room))
            );
        }
    }
}

/// The legend under the title: a swatch and label per kind in `kinds`, then the instants'
/// tick when `instants`, wrapped at `width`; returns the y of its last row.
fn draw_legend(body: &mut String, kinds: &[Kind], instants: bool, width: f64) -> f64 {
    let mut y = PAD + 44.0;
    let mut x = PAD;
    let mut entries: Vec<(&str, Option<Kind>)> = kinds.iter().map(|k| (k.label(), Some(*k))).collect();
    if instants {
        entries.push(("instant", None));
    }
    for (label, kind) in entries {
        let w = 16.0 + label.chars().count() as f64 * CHAR_W + 16.0;
        if x + w > width - PAD && x > PAD {
            x = PAD;
            y += 16.0;
        }
        let swatch = match kind {
            Some(k) => {
                format!(r#"<rect x="{x}" y="{y}" width="11" height="11" rx="2" fill="{}"/>"#, k.colour())
            }
            None => format!(
                r##"<line x1="{0}" y1="{y}" x2="{0}" y2="{1}" stroke="#4B5563" stroke-width="1.2"/>"##,
                x + 5.0,
                y + 11.0
            ),
        };
        let _ = write!(
            body,
            r##"<g class="legend-entry">{swatch}<text x="{}" y="{}" font-size="11" fill="#374151">{}</text></g>"##,
            x + 16.0,
            y + 9.5,
            esc(label)
        );
        x += w;
    }
    y
}

/// The horizontal mapping from microseconds to pixels.
struct Plot {
    x0: f64,
    x1: f64,
    from: f64,
    to: f64,
}

impl Plot {
    fn x(&self, t: f64) -> f64 {
        self.x0 + (t - self.from) / (self.to - self.from) * (self.x1 - self.x0)
    }
}

/// One slice's rectangle (at least a pixel wide, so that short copies still show), with a
/// tooltip and, when it is wide enough, its name.
fn draw_slice(body: &mut String, plot: &Plot, lane_y: f64, s: &Slice, a: f64, b: f64) {
    let x = plot.x(a);
    let w = (plot.x(b) - x).max(1.0);
    let top = lane_y + BAR_TOP;
    let h = LANE_H - BAR_TOP - 2.0;
    let mut tip = format!("{} ({})\n{} at {}", s.name, s.kind.label(), fmt_time(s.dur), fmt_time(s.ts));
    if !s.detail.is_empty() {
        tip.push('\n');
        tip.push_str(s.detail.trim_end());
    }
    let _ = write!(
        body,
        r#"<rect class="slice {}" x="{x:.2}" y="{top:.1}" width="{w:.2}" height="{h}" fill="{}"><title>{}</title></rect>"#,
        s.kind.label().replace(['>', ' '], "-").replace("--", "-"),
        s.kind.colour(),
        esc(&tip)
    );
    let room = ((w - 6.0) / (CHAR_W * 0.9)) as usize;
    // What fits in a bar says most: a copy's array and size (the size alone when both do
    // not fit), a kernel's own name.
    let label = match (s.kind.is_copy(), s.bytes, &s.range) {
        (true, Some(b), Some(r)) if r.chars().count() + 1 + fmt_bytes(b as f64).chars().count() <= room => {
            format!("{r} {}", fmt_bytes(b as f64))
        }
        (true, Some(b), _) => fmt_bytes(b as f64),
        _ => s.name.strip_prefix("kernel ").unwrap_or(&s.name).to_string(),
    };
    if room >= 4 {
        let _ = write!(
            body,
            r#"<text x="{:.1}" y="{:.1}" font-size="9.5" fill="{}" pointer-events="none">{}</text>"#,
            x + 3.0,
            top + h - 3.0,
            s.kind.ink(),
            esc(&cut(&label, room))
        );
    }
}

/// A counter's points as steps in the window: the value it had when the window starts
/// (if any), then each change inside it. `None` when it has no value in the window.
fn steps(c: &Counter, view: &View<'_>) -> Option<Vec<(f64, f64)>> {
    let before = c.points.iter().rev().find(|(t, _)| *t <= view.from).map(|&(_, v)| (view.from, v));
    let inside = c.points.iter().filter(|(t, _)| *t > view.from && *t <= view.to).copied();
    let steps: Vec<(f64, f64)> = before.into_iter().chain(inside).collect();
    (!steps.is_empty()).then_some(steps)
}

/// One counter's strip: its label, process and largest value on the left, its values as a
/// step line (over a faint fill) to the window's end.
fn draw_counter(
    body: &mut String,
    plot: &Plot,
    view: &View<'_>,
    y: f64,
    c: &Counter,
    colour: &str,
    max_label: usize,
) {
    let Some(steps) = steps(c, view) else { return };
    let max = steps.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let min = steps.iter().map(|p| p.1).fold(0.0, f64::min);
    let (lo, hi) = (min, if max > min { max } else { min + 1.0 });
    let (top, bottom) = (y + 4.0, y + STRIP_H - 6.0);
    let vy = |v: f64| bottom - (v - lo) / (hi - lo) * (bottom - top);
    let _ = write!(
        body,
        r##"<text class="counter-label" x="{LABEL_X}" y="{:.1}" font-size="11" fill="#374151">{}</text><text x="{LABEL_X}" y="{:.1}" font-size="10" fill="#6B7280">{}</text>"##,
        y + 15.0,
        esc(&cut(&c.label(), max_label)),
        y + 28.0,
        esc(&cut(&counter_note(c, view), max_label))
    );
    let mut pts = String::new();
    let mut last: Option<f64> = None;
    for &(t, v) in &steps {
        let x = plot.x(t);
        if let Some(prev) = last {
            let _ = write!(pts, "{x:.1},{:.1} ", vy(prev));
        }
        let _ = write!(pts, "{x:.1},{:.1} ", vy(v));
        last = Some(v);
    }
    let end = last.map_or(lo, |v| v);
    let _ = write!(pts, "{:.1},{:.1}", plot.x1, vy(end));
    let first_x = plot.x(steps[0].0);
    let _ = write!(
        body,
        r##"<line x1="{:.1}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}" stroke="#D1D5DB" stroke-width="1"/><polygon class="counter-fill" points="{first_x:.1},{bottom:.1} {pts} {:.1},{bottom:.1}" fill="{colour}" fill-opacity="0.12"/><polyline class="counter" points="{pts}" fill="none" stroke="{colour}" stroke-width="1.5"><title>{}</title></polyline>"##,
        plot.x0,
        plot.x1,
        plot.x1,
        esc(&format!("{}: {}", c.label(), counter_note(c, view)))
    );
}

/// A counter's second label line: its process and its largest value in the window.
fn counter_note(c: &Counter, view: &View<'_>) -> String {
    let max = steps(c, view).into_iter().flatten().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let max = if c.is_bytes() { fmt_bytes(max) } else { fmt_number(max) };
    format!("{} · max {max}", c.process)
}

/// Tick times and labels for the window `[from, to]` drawn over `px` pixels: a step of 1, 2
/// or 5 times a power of ten, about 110 pixels apart, labelled in ns, us, ms or s.
fn ticks(from: f64, to: f64, px: f64) -> Vec<(f64, String)> {
    let raw = (to - from) / (px / 110.0).max(2.0);
    let mag = 10f64.powf(raw.log10().floor());
    let step =
        [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw * 0.999).unwrap_or(10.0 * mag);
    let (unit, scale) = match step {
        s if s >= 1e5 => ("s", 1e6),
        s if s >= 100.0 => ("ms", 1e3),
        s if s >= 0.1 => ("us", 1.0),
        _ => ("ns", 1e-3),
    };
    let decimals = (-(step / scale).log10().floor()).max(0.0) as usize;
    let first = (from / step).ceil();
    (0..)
        .map(|i| (first + f64::from(i)) * step)
        .take_while(|t| *t <= to + step * 1e-9)
        .take(1000)
        .map(|t| (t, format!("{:.*} {unit}", decimals, t / scale)))
        .collect()
}

/// A time or duration in microseconds, in the unit that suits it, to three figures.
pub fn fmt_time(us: f64) -> String {
    let (v, unit) = match us.abs() {
        a if a >= 1e6 => (us / 1e6, "s"),
        a if a >= 1e3 => (us / 1e3, "ms"),
        0.0 => return "0".to_string(),
        a if a >= 1.0 => (us, "us"),
        _ => (us * 1e3, "ns"),
    };
    format!("{} {unit}", three_figures(v))
}

/// A byte count in B, KiB, MiB or GiB.
pub fn fmt_bytes(b: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut i = 0;
    while v.abs() >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{} {}", three_figures(v), units[i])
    }
}

fn fmt_number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        three_figures(v)
    }
}

fn three_figures(v: f64) -> String {
    let decimals = match v.abs() {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        _ => 2,
    };
    format!("{v:.decimals$}")
}

/// `s` as XML text or attribute value: markup characters escaped, and characters XML 1.0
/// does not allow (most control characters) left out.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {}
            c => out.push(c),
        }
    }
    out
}

// ---- the summary ----

/// One lane's totals inside the window.
#[derive(Clone, Debug)]
pub struct LaneSummary {
    /// The process's name.
    pub process: String,
    /// The lane's (thread's) name.
    pub lane: String,
    /// Slices in the window.
    pub slices: usize,
    /// Time covered by at least one slice, in microseconds.
    pub busy_us: f64,
    /// Copy slices.
    pub copies: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Their summed lengths, in microseconds (for the rate).
    pub copy_us: f64,
    /// Kernel and gemm slices.
    pub kernels: usize,
    /// Time covered by them, in microseconds.
    pub kernel_us: f64,
}

impl LaneSummary {
    /// The lane's copy rate in GB/s: bytes over the copies' summed lengths.
    pub fn gb_per_s(&self) -> Option<f64> {
        (self.copy_us > 0.0 && self.bytes > 0).then(|| self.bytes as f64 / self.copy_us / 1e3)
    }
}

/// How much of a process's kernel time had a copy running beside it (on any of its lanes).
#[derive(Clone, Debug)]
pub struct ProcessSummary {
    /// The process's name.
    pub process: String,
    /// Time covered by kernel or gemm slices, in microseconds.
    pub kernel_us: f64,
    /// Time covered by copy slices, in microseconds.
    pub copy_us: f64,
    /// Time covered by both, in microseconds.
    pub overlap_us: f64,
    /// Whether the process's device work ran on one `worker queue` (a host device runs
    /// its queues on one thread): its copies and kernels cannot overlap.
    pub one_worker: bool,
}

impl ProcessSummary {
    /// The overlap as a share of kernel time (0 to 1); `None` without kernel time.
    pub fn overlap_share(&self) -> Option<f64> {
        (self.kernel_us > 0.0).then(|| self.overlap_us / self.kernel_us)
    }
}

/// A trace's totals per lane and its copy/kernel overlap per process, inside the window.
#[derive(Clone, Debug)]
pub struct Summary {
    /// The window's start, in microseconds.
    pub from_us: f64,
    /// Its end.
    pub to_us: f64,
    /// Every lane with a slice in the window.
    pub lanes: Vec<LaneSummary>,
    /// Every process with a copy or kernel slice in the window.
    pub processes: Vec<ProcessSummary>,
}

/// Sums `trace` up inside the window and processes of `options` (the rest of the options
/// do not apply).
///
/// # Errors
/// [`TraceError::EmptyWindow`] when the window asked for ends before it starts.
pub fn summarize(trace: &Trace, options: &RenderOptions) -> Result<Summary, TraceError> {
    let view = View::new(trace, options)?;
    let mut lanes = Vec::new();
    let mut processes = Vec::new();
    for p in &view.processes {
        let (mut copies, mut kernels) = (Vec::new(), Vec::new());
        for lane in &p.lanes {
            let mut all = Vec::new();
            let mut mine = Vec::new();
            let mut sum = LaneSummary {
                process: p.name.clone(),
                lane: lane.name.clone(),
                slices: 0,
                busy_us: 0.0,
                copies: 0,
                bytes: 0,
                copy_us: 0.0,
                kernels: 0,
                kernel_us: 0.0,
            };
            for (s, a, b) in view.slices(lane) {
                sum.slices += 1;
                all.push((a, b));
                if s.kind.is_copy() {
                    sum.copies += 1;
                    sum.bytes += s.bytes.unwrap_or(0);
                    sum.copy_us += s.dur;
                    copies.push((a, b));
                } else if s.kind.is_compute() {
                    sum.kernels += 1;
                    mine.push((a, b));
                    kernels.push((a, b));
                }
            }
            if sum.slices > 0 {
                sum.busy_us = covered(&union(all));
                sum.kernel_us = covered(&union(mine));
                lanes.push(sum);
            }
        }
        if copies.is_empty() && kernels.is_empty() {
            continue;
        }
        let (copies, kernels) = (union(copies), union(kernels));
        processes.push(ProcessSummary {
            process: p.name.clone(),
            kernel_us: covered(&kernels),
            copy_us: covered(&copies),
            overlap_us: covered(&intersect(&copies, &kernels)),
            one_worker: p.lanes.iter().any(|l| l.name == "worker queue"),
        });
    }
    Ok(Summary { from_us: view.from, to_us: view.to, lanes, processes })
}

/// The union of intervals, as sorted disjoint intervals.
fn union(mut spans: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(spans.len());
    for (a, b) in spans {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// The intersection of two sorted disjoint interval lists.
fn intersect(x: &[(f64, f64)], y: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < x.len() && j < y.len() {
        let (a, b) = (x[i].0.max(y[j].0), x[i].1.min(y[j].1));
        if b > a {
            out.push((a, b));
        }
        if x[i].1 < y[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

fn covered(spans: &[(f64, f64)]) -> f64 {
    // A fold from +0: an empty float `sum` is -0, which would print as "-0".
    spans.iter().fold(0.0, |t, (a, b)| t + (b - a))
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "window: {} to {}\n", fmt_time(self.from_us), fmt_time(self.to_us))?;
        let dash = || "-".to_string();
        let mut rows =
            vec![["process", "lane", "slices", "busy", "copies", "bytes", "GB/s", "kernels", "kernel time"]
                .map(str::to_string)
                .to_vec()];
        for l in &self.lanes {
            rows.push(vec![
                l.process.clone(),
                l.lane.clone(),
                l.slices.to_string(),
                fmt_time(l.busy_us),
                l.copies.to_string(),
                if l.copies > 0 { fmt_bytes(l.bytes as f64) } else { dash() },
                l.gb_per_s().map_or_else(dash, |g| if g < 0.01 { "<0.01".into() } else { three_figures(g) }),
                l.kernels.to_string(),
                if l.kernels > 0 { fmt_time(l.kernel_us) } else { dash() },
            ]);
        }
        if self.lanes.is_empty() {
            writeln!(f, "no slices in the window")?;
        } else {
            table(f, &rows)?;
        }
        if self.processes.is_empty() {
            return Ok(());
        }
        writeln!(f, "\ncopies beside kernels (time a copy and a kernel or gemm of one process both ran):\n")?;
        let mut rows = vec![["process", "kernel time", "copy time", "overlap", "of kernel time"]
            .map(str::to_string)
            .to_vec()];
        for p in &self.processes {
            rows.push(vec![
                p.process.clone(),
                fmt_time(p.kernel_us),
                fmt_time(p.copy_us),
                fmt_time(p.overlap_us),
                match p.overlap_share() {
                    _ if p.one_worker => "none possible: one worker".to_string(),
                    None => "no kernels".to_string(),
                    Some(s) => format!("{:.1}%", s * 100.0),
                },
            ]);
        }
        table(f, &rows)?;
        if self.processes.iter().any(|p| p.one_worker) {
            writeln!(
                f,
                "\n(a host device runs its copy-in, compute and copy-out queues on one worker thread, in turn)"
            )?;
        }
        Ok(())
    }
}

/// Rows as columns: text left-aligned, numbers (and `-`) right-aligned.
fn table(f: &mut fmt::Formatter<'_>, rows: &[Vec<String>]) -> fmt::Result {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let numeric = i > 0 && cell.starts_with(|ch: char| ch.is_ascii_digit() || ch == '-');
            if c > 0 {
                line.push_str("  ");
            }
            if numeric {
                let _ = write!(line, "{cell:>w$}", w = widths[c]);
            } else {
                let _ = write!(line, "{cell:<w$}", w = widths[c]);
            }
        }
        writeln!(f, "{}", line.trim_end())?;
    }
    Ok(())
}
