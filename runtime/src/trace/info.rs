//! What the runtime tells about itself: `OFFLOAD_INFO` traces in the manner of
//! `LIBOMPTARGET_INFO`, and present-table dumps.
//!
//! | bit | meaning |
//! | --- | --- |
//! | `0x01` | constructs (also one refused before it ran, or failed once begun, then why) and the device memory routines (`omp_target_alloc`, `free`, `associate_ptr`, `disassociate_ptr`, device buffers), each with the program's `file:line`; kernel launches with their translated arguments |
//! | `0x02` | a map found its range already present, and why a map copied nothing (`to` on a present range, `from` on an entry that stays, a zero-length exit), and what a `release` that keeps its entry moved |
//! | `0x04` | the present table after each construct, and with a failed construct's error |
//! | `0x08` | entries created and removed, with their counts |
//! | `0x10` | launch details: the grid and block a backend chose |
//! | `0x20` | data transfers: direction, bytes, addresses |
//! | `0x40` | host data with no device counterpart: ranges an exit or update skipped (absent, or not wholly inside a mapped range) |
//! | `0x80` | races between devices: a copy back (exit or `update from`) into host memory that another device has mapped with `from` (level `WARN`) |
//! | `0x100` | every device's present table after each construct, not only the construct's own device's (other devices' only when they hold an entry) |
//!
//! `-1` (or any value with every bit set) turns everything on, as with `LIBOMPTARGET_INFO`.
//!
//! A range inside an entry whose map was named ([`crate::MapItem::named`],
//! `map::to(&a).named("a")`, `offload::map_to!(a)`) is given as an element section of it
//! (`a[256:128]`); other ranges by their bytes (`host 0x..0x.. (16 bytes)`).
//!
//! The trace is made of [`tracing`] events, target `offload`, level `DEBUG` (reports of
//! mappings still live at shutdown: `WARN`), each with its line as the message and fields
//! `info` (its bit; 0 for reports made whatever the bits), `kind` (`construct`,
//! `refused`, `failed`, `memory routine`, `entry created`, `mapping exists`, `not copied`, `released`, `zero length`,
//! `entry removed`, `copy`, `launch`, `table`, `skipped`, `race`, `note`, `counts` (the timeline's), ...), `device`, and where they apply `host_begin`, `host_bytes`,
//! `device_addr`, `ref_count`, `hold_count`, `bytes`, `direction`, `staged`, `micros` (a
//! copy's time), `kernel`, `n`, `at` (the program's `file:line`), `range` (a copy's or an
//! entry's range as the program named it, `a[0:4]`).
//!
//! The `OFFLOAD_INFO` text is one subscriber of those events, an [`InfoLayer`]: every
//! runtime hands the events its bits ask for to a layer of its own, which writes them to
//! standard error or, for a runtime built with [`crate::RuntimeBuilder::capture_info`]
//! (tests, teaching tools), to a capture read back with [`crate::Runtime::take_info`].
//! A program's own subscriber gets every event whenever it listens, whatever the bits
//! (table dumps only with 0x04), and may hold an [`InfoLayer`] of its own.

use std::fmt;
use std::ops::BitOr;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;
use crate::range::{ArrayName, HostRange, RangeName};
use crate::trace::chrome::ChromeTraceLayer;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Dispatch, Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// A set of `OFFLOAD_INFO` bits.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct InfoFlags(u32);

impl InfoFlags {
    /// Nothing traced.
    pub const NONE: Self = Self(0);
    /// Kernel launches and their arguments.
    pub const KERNEL_ARGS: Self = Self(0x01);
    /// A mapping that already existed.
    pub const MAPPING_EXISTS: Self = Self(0x02);
    /// The present table after each construct.
    pub const DUMP_TABLE: Self = Self(0x04);
    /// Entries created and removed.
    pub const ENTRIES: Self = Self(0x08);
    /// Launch details: grid and block.
    pub const LAUNCH: Self = Self(0x10);
    /// Data transfers.
    pub const TRANSFERS: Self = Self(0x20);
    /// Host ranges an exit or update skipped: no device counterpart.
    pub const ABSENT: Self = Self(0x40);
    /// Races between devices: a copy back into host memory that another device has mapped
    /// with `from` (a `WARN` event).
    pub const RACE: Self = Self(0x80);
    /// Every device's present table after each construct, as libomptarget prints them: the
    /// construct's own (as [`InfoFlags::DUMP_TABLE`] does) and every other device's that
    /// holds an entry.
    pub const EVERY_TABLE: Self = Self(0x100);
    /// Every bit (`-1`).
    pub const ALL: Self = Self(u32::MAX);

    /// The flags from their bit pattern (unknown bits are kept, as libomptarget does).
    pub const fn from_bits(bits: u32) -> Self {
        Self(bits)
    }

    /// The bit pattern.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }

    /// Parses `OFFLOAD_INFO`'s value: decimal, hexadecimal with `0x`, or `-1` for every
    /// bit (a negative number's two's-complement bits, as C's `int` gives them).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            Some(h) => u32::from_str_radix(h, 16).ok()?,
            None => match s.parse::<u32>() {
                Ok(v) => v,
                Err(_) => i32::try_from(s.parse::<i64>().ok()?).ok().filter(|v| *v < 0)? as u32,
            },
        };
        Some(Self(v))
    }
}

impl BitOr for InfoFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl fmt::Debug for InfoFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InfoFlags({:#x})", self.0)
    }
}

/// Captured trace lines, readable after the runtime that wrote them is gone (its
/// shutdown report of live mappings included).
#[derive(Clone, Debug, Default)]
pub struct InfoLog(Arc<Mutex<Vec<String>>>);

impl InfoLog {
    /// Takes the lines captured so far.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock())
    }
}

/// What an entry line says ([`Trace::entry`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct EntryLine {
    pub(crate) device: usize,
    pub(crate) range: HostRange,
    /// The named array the entry is, when its map named it.
    pub(crate) array: Option<ArrayName>,
    pub(crate) device_addr: u64,
    /// (reference, hold).
    pub(crate) counts: (u64, u64),
    pub(crate) associated: bool,
}

/// The fields of a trace event beyond its line (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct InfoFields<'a> {
    pub(crate) kind: &'static str,
    pub(crate) device: Option<usize>,
    pub(crate) host: Option<crate::range::HostRange>,
    pub(crate) device_addr: Option<u64>,
    pub(crate) counts: Option<(u64, u64)>,
    pub(crate) bytes: Option<usize>,
    pub(crate) direction: Option<&'static str>,
    pub(crate) staged: Option<bool>,
    pub(crate) micros: Option<f64>,
    pub(crate) kernel: Option<&'a str>,
    pub(crate) n: Option<usize>,
    pub(crate) at: Option<&'a std::panic::Location<'a>>,
    /// The construct (its number in the process) that made this event, for the timeline's
    /// flow arrows.
    pub(crate) construct: Option<u64>,
    /// A copy that was queued, not made (its `micros`: the queueing).
    pub(crate) queued: Option<bool>,
    /// A device-side span's queue (`copy-in`, `compute`, `copy-out`) and when it ended, in
    /// microseconds on [`crate::trace::chrome::clock_origin`]'s clock.
    pub(crate) queue: Option<&'static str>,
    pub(crate) ended_at: Option<f64>,
    /// A device's state at a construct's end.
    pub(crate) usage: Option<DeviceUsage>,
    /// The host range as the program named it (`a[0:4]`), when it did: a copy's, an
    /// entry's (the timeline names copy bars and draws each named entry's count by it).
    pub(crate) name: Option<RangeName>,
}

/// A device's present table and memory pool at one moment, for the timeline's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeviceUsage {
    /// Present-table entries, and the bytes of host memory they map.
    pub(crate) entries: usize,
    pub(crate) mapped_bytes: usize,
    /// Pool bytes in live blocks, and in free blocks kept for reuse.
    pub(crate) pool_in_use: usize,
    pub(crate) pool_cached: usize,
}

/// The bit of events for the timeline alone (`OFFLOAD_TRACE`, a program's subscriber):
/// device-side spans, constructs' ends. No [`InfoLayer`] writes them as text.
pub(crate) const TIMELINE: InfoFlags = InfoFlags::from_bits(1 << 31);

thread_local! {
    /// The construct this thread is running (0: none), for the events it causes.
    static CURRENT_CONSTRUCT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Numbers constructs for the timeline, from 1.
static NEXT_CONSTRUCT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The construct this thread is running, if any (traced ones only).
pub(crate) fn current_construct() -> Option<u64> {
    let c = CURRENT_CONSTRUCT.with(std::cell::Cell::get);
    (c != 0).then_some(c)
}

/// Where an [`InfoLayer`] writes its lines.
#[derive(Clone, Debug)]
enum InfoSink {
    Stderr,
    Capture(InfoLog),
}

/// The `OFFLOAD_INFO` text output as a [`tracing_subscriber::Layer`]: it writes the line of
/// each `offload` event whose bit it was given (and every report made whatever the bits)
/// to standard error, `offload info: ` first, or to a capture.
///
/// Every runtime hands its events to a layer of its own, set from `OFFLOAD_INFO`; a
/// program that wants the same text inside its own subscriber stack adds one beside its
/// other layers (and leaves `OFFLOAD_INFO` unset, or gets the lines twice):
///
/// ```
/// use offload::{InfoFlags, InfoLayer};
/// use tracing_subscriber::layer::SubscriberExt;
///
/// let (layer, log) = InfoLayer::capture(InfoFlags::ENTRIES | InfoFlags::TRANSFERS);
/// let subscriber = tracing_subscriber::registry().with(layer);
/// tracing::subscriber::with_default(subscriber, || {
///     tracing::debug!(target: "offload", info = 0x20u32, "device 0: copy host->device, 64 bytes");
///     tracing::debug!(target: "offload", info = 0x01u32, "device 0: launching k"); // not asked for
/// });
/// assert_eq!(log.take(), ["device 0: copy host->device, 64 bytes"]);
/// ```
#[derive(Clone, Debug)]
pub struct InfoLayer {
    flags: InfoFlags,
    sink: InfoSink,
}

impl InfoLayer {
    /// A layer writing the lines of `flags` to standard error.
    pub fn new(flags: InfoFlags) -> Self {
        Self { flags, sink: InfoSink::Stderr }
    }

    /// A layer keeping the lines of `flags`, and the handle that reads them.
    pub fn capture(flags: InfoFlags) -> (Self, InfoLog) {
        let log = InfoLog::default();
        (Self { flags, sink: InfoSink::Capture(log.clone()) }, log)
    }

    /// The bits this layer writes.
    pub fn flags(&self) -> InfoFlags {
        self.flags
    }

    /// Whether a line of bit `info` (0: a report made whatever the bits) is written.
    fn wants(&self, info: u32) -> bool {
        info & TIMELINE.bits() == 0 && (info == 0 || self.flags.contains(InfoFlags::from_bits(info)))
    }

    fn write(&self, line: &str) {
        match &self.sink {
            InfoSink::Stderr => eprintln!("offload info: {line}"),
            InfoSink::Capture(log) => log.0.lock().push(line.to_string()),
        }
    }
}

impl<S: Subscriber> Layer<S> for InfoLayer {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        crate::trace::chrome::offload_interest(meta)
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        crate::trace::chrome::is_offload_event(meta)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "offload" {
            return;
        }
        let mut line = LineOf::default();
        event.record(&mut line);
        if let (Some(info), Some(text)) = (line.info, line.message) {
            if self.wants(info) {
                self.write(&text);
            }
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::DEBUG)
    }
}

/// Reads an event's `info` bit and its line.
#[derive(Default)]
struct LineOf {
    info: Option<u32>,
    message: Option<String>,
}

impl Visit for LineOf {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "info" {
            self.info = u32::try_from(value).ok();
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "info" {
            self.info = u32::try_from(value).ok();
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = Some(format!("{value:?}"));
        }
    }
}

/// One `offload` event at `$level` with every field, through `tracing`'s own macro (so that
/// a program's subscriber sees an ordinary callsite).
macro_rules! offload_event {
    ($level:expr, $flag:expr, $f:expr, $at:expr, $text:expr) => {
        tracing::event!(
            target: "offload",
            $level,
            info = $flag.bits(),
            kind = $f.kind,
            device = $f.device,
            host_begin = $f.host.map(|h| h.begin),
            host_bytes = $f.host.map(|h| h.bytes),
            device_addr = $f.device_addr,
            ref_count = $f.counts.map(|c| c.0),
            hold_count = $f.counts.map(|c| c.1),
            bytes = $f.bytes,
            direction = $f.direction,
            staged = $f.staged,
            micros = $f.micros,
            kernel = $f.kernel,
            n = $f.n,
            at = $at.as_deref(),
            construct = $f.construct,
            queued = $f.queued,
            queue = $f.queue,
            ended_at_micros = $f.ended_at,
            live_entries = $f.usage.map(|u| u.entries),
            mapped_bytes = $f.usage.map(|u| u.mapped_bytes),
            pool_in_use = $f.usage.map(|u| u.pool_in_use),
            pool_cached = $f.usage.map(|u| u.pool_cached),
            range = $f.name.map(tracing::field::display),
            "{}",
            $text
        )
    };
}

/// The bits whose events the trace file (`OFFLOAD_TRACE`) records.
const FILE_FLAGS: InfoFlags = InfoFlags::from_bits(
    InfoFlags::KERNEL_ARGS.bits()
        | InfoFlags::MAPPING_EXISTS.bits()
        | InfoFlags::ENTRIES.bits()
        | InfoFlags::LAUNCH.bits()
        | InfoFlags::TRANSFERS.bits()
        | InfoFlags::RACE.bits()
        | TIMELINE.bits(),
);

/// The runtime's tracer: hands each event to the program's subscriber, if one listens, and
/// to the runtime's own [`InfoLayer`] when `OFFLOAD_INFO` asks for its bit (and to its
/// trace-file layer, `OFFLOAD_TRACE`, for the bits that file records).
pub(crate) struct Trace {
    flags: InfoFlags,
    log: Option<InfoLog>,
    /// A registry with this runtime's own layer, made only when there is something for it
    /// to write (while any exists, every `offload` callsite asks the thread's subscriber
    /// whether it is enabled; without one, `tracing`'s level check alone says no). Events go
    /// to it as the emitting thread's default for the one event, so that it sees every
    /// thread's events and nothing of other runtimes.
    own: Option<Dispatch>,
    /// The bits sent to `own`: `flags`, and those the trace file records.
    own_flags: InfoFlags,
    /// The Chrome trace-event file (`OFFLOAD_TRACE`), when asked for.
    file: Option<ChromeTraceLayer>,
    /// `own` holds an [`InfoLayer`] (else reports are written without it).
    text: bool,
}

impl fmt::Debug for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trace")
            .field("flags", &self.flags)
            .field("captured", &self.log.is_some())
            .field("file", &self.file.as_ref().map(ChromeTraceLayer::path))
            .finish()
    }
}

impl Trace {
    /// A tracer with no trace file.
    #[cfg(test)]
    pub(crate) fn new(flags: InfoFlags, capture: bool) -> Self {
        Self::with_file(flags, capture, None)
    }

    /// A tracer that also writes the Chrome trace-event `file` when one is given.
    pub(crate) fn with_file(flags: InfoFlags, capture: bool, file: Option<ChromeTraceLayer>) -> Self {
        let (layer, log) = if capture {
            let (layer, log) = InfoLayer::capture(flags);
            (layer, Some(log))
        } else {
            (InfoLayer::new(flags), None)
        };
        // The file records constructs, launches, entries and copies, whatever `flags` says
        // (the `InfoLayer` still writes only the lines of its own bits).
        let own_flags = match file {
            Some(_) => flags | FILE_FLAGS,
            None => flags,
        };
        // No text layer when it would write nothing (a trace file alone).
        let text_on = flags != InfoFlags::NONE || capture;
        let text = text_on.then_some(layer);
        let own = (text.is_some() || file.is_some())
            .then(|| Dispatch::new(tracing_subscriber::registry().with(text).with(file.clone())));
        Self { flags, log, own, own_flags, file, text: text_on }
    }

    /// Whether lines of kind `flag` are wanted (cheap: check before formatting).
    pub(crate) fn on(&self, flag: InfoFlags) -> bool {
        self.own.is_some() && self.own_flags.contains(flag)
    }

    /// Whether anyone may read ranges' names: `OFFLOAD_INFO` or a timeline is on, or a
    /// program's subscriber listens (asked once, as a device starts: the present table
    /// then keeps the names of entries that left it).
    pub(crate) fn names_wanted(&self) -> bool {
        self.own.is_some() || tracing::enabled!(target: "offload", Level::DEBUG)
    }

    /// Whether a timeline is written (`OFFLOAD_TRACE`): device-side spans and constructs'
    /// spans are measured only then.
    pub(crate) fn timeline(&self) -> bool {
        self.file.is_some()
    }

    /// Starts construct `what`'s span on this thread, when a timeline is written: numbers
    /// it and makes it the thread's current construct until [`Trace::construct_end`].
    /// Returns (its number, the construct it interrupts), or `None` with no timeline.
    pub(crate) fn construct_begin(&self) -> Option<(u64, u64)> {
        if !self.timeline() {
            return None;
        }
        let id = NEXT_CONSTRUCT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some((id, CURRENT_CONSTRUCT.with(|c| c.replace(id))))
    }

    /// Ends construct `id` (of [`Trace::construct_begin`]) on `device`, with the device's
    /// state after it, and makes `outer` the thread's current construct again.
    pub(crate) fn construct_end(&self, (id, outer): (u64, u64), device: usize, usage: Option<DeviceUsage>) {
        CURRENT_CONSTRUCT.with(|c| c.set(outer));
        let fields = || InfoFields {
            kind: "construct end",
            device: Some(device),
            construct: Some(id),
            usage,
            ..InfoFields::default()
        };
        self.event(TIMELINE, fields, || format!("device {device}: construct {id} ended"));
    }

    /// The program's landmark `text` ([`crate::Runtime::annotate`]), for the timeline and
    /// a program's subscriber.
    pub(crate) fn note(&self, text: &str) {
        self.event(TIMELINE, || InfoFields { kind: "note", ..InfoFields::default() }, || text.to_string());
    }

    /// Named entry `name` of device `device` holds `counts` (reference, hold) after an exit
    /// that left it mapped, for the timeline's per-entry count (`TIMELINE`: the entry lines
    /// give the counts when entries are made, found and removed).
    pub(crate) fn counts(&self, device: usize, name: RangeName, counts: (u64, u64)) {
        let fields = || InfoFields {
            kind: "counts",
            device: Some(device),
            host: Some(name.range),
            counts: Some(counts),
            name: Some(name),
            ..InfoFields::default()
        };
        self.event(TIMELINE, fields, || {
            format!("device {device}: {name}: ref count {} hold count {}", counts.0, counts.1)
        });
    }

    /// A span of work device `device`'s queue `queue` ran from `begin` to `end` (host
    /// clock), for the timeline: `what` says what it was (kind `copy`, `kernel`, ...).
    pub(crate) fn device_span(
        &self,
        device: usize,
        queue: &'static str,
        what: InfoFields<'_>,
        (begin, end): (std::time::Instant, std::time::Instant),
    ) {
        let micros = end.saturating_duration_since(begin).as_secs_f64() * 1e6;
        let at = end.saturating_duration_since(crate::trace::chrome::clock_origin()).as_secs_f64() * 1e6;
        let fields = || InfoFields {
            device: Some(device),
            queue: Some(queue),
            micros: Some(micros),
            ended_at: Some(at),
            ..what
        };
        self.event(TIMELINE, fields, || {
            format!("device {device}: {} ran {micros:.1} us on the {queue} queue", what.kind)
        });
    }

    /// Whether anyone wants lines of kind `flag` ([`Trace::event`]'s test), for work done
    /// only to trace.
    pub(crate) fn wants(&self, flag: InfoFlags) -> bool {
        self.on(flag) || tracing::enabled!(target: "offload", Level::DEBUG)
    }

    /// Whether anyone wants warnings of kind `flag` ([`Trace::warn`]'s test).
    pub(crate) fn wants_warning(&self, flag: InfoFlags) -> bool {
        self.on(flag) || tracing::enabled!(target: "offload", Level::WARN)
    }

    /// A warning of kind `flag` (`RACE`) at `WARN`, as [`Trace::event`] emits its events.
    pub(crate) fn warn(&self, flag: InfoFlags, fields: InfoFields<'_>, text: String) {
        let at = fields.at.map(|l| format!("{}:{}", l.file(), l.line()));
        let emit = || offload_event!(Level::WARN, flag, fields, at, text);
        if let Some(own) = self.own.as_ref().filter(|_| self.on(flag)) {
            tracing::dispatcher::with_default(own, emit);
        }
        if tracing::enabled!(target: "offload", Level::WARN) {
            emit();
        }
    }

    /// Writes the trace file, when there is one.
    pub(crate) fn flush_file(&self) -> Result<()> {
        self.file.as_ref().map_or(Ok(()), ChromeTraceLayer::flush)
    }

    /// A present-table entry's line under `flag`: `what` ("entry created", "mapping
    /// exists", ...) on `device`, with the host range, the device address and both counts
    /// (the reference count shown as `inf` for an associated entry).
    pub(crate) fn entry(&self, flag: InfoFlags, what: &'static str, e: EntryLine) {
        let fields = || InfoFields {
            kind: what,
            device: Some(e.device),
            host: Some(e.range),
            device_addr: Some(e.device_addr),
            counts: Some(e.counts),
            name: e.array.map(|a| RangeName::new(e.range, Some(a))),
            ..InfoFields::default()
        };
        self.event(flag, fields, || {
            let ref_count = if e.associated { "inf".to_string() } else { e.counts.0.to_string() };
            format!(
                "device {}: {what} {} -> device {:#x}, ref count {ref_count} hold count {}",
                e.device,
                RangeName::new(e.range, e.array),
                e.device_addr,
                e.counts.1
            )
        });
    }

    /// A range `construct` skips on `device`: it has no device counterpart (`ABSENT`).
    pub(crate) fn skipped(&self, device: usize, construct: &str, range: RangeName) {
        let fields = || InfoFields {
            kind: "skipped",
            device: Some(device),
            host: Some(range.range),
            ..InfoFields::default()
        };
        self.event(InfoFlags::ABSENT, fields, || {
            format!("device {device}: {construct}: {range} has no device counterpart; skipped")
        });
    }

    /// Device `device`'s present table after `label` (`DUMP_TABLE`, or `EVERY_TABLE` for
    /// the other devices' tables), dumped by `dump` only when someone wants it.
    pub(crate) fn table(&self, device: usize, label: &str, dump: impl FnOnce() -> String) {
        let fields = || InfoFields { kind: "table", device: Some(device), ..InfoFields::default() };
        // The construct's own table comes with either bit; other devices' only with 0x100.
        let flag =
            if self.on(InfoFlags::DUMP_TABLE) { InfoFlags::DUMP_TABLE } else { InfoFlags::EVERY_TABLE };
        self.event(flag, fields, || format!("after {label}: {}", dump()));
    }

    /// Emits an event of kind `flag` with only its line.
    pub(crate) fn emit(&self, flag: InfoFlags, line: impl FnOnce() -> String) {
        self.event(flag, InfoFields::default, line);
    }

    /// Emits an event of kind `flag`: to the runtime's own layer when its bits ask for it,
    /// and to the program's subscriber when it listens to `offload` at `DEBUG`.
    /// Nothing is formatted when nobody wants it.
    pub(crate) fn event<'a>(
        &self,
        flag: InfoFlags,
        fields: impl FnOnce() -> InfoFields<'a>,
        line: impl FnOnce() -> String,
    ) {
        let mine = self.on(flag);
        let theirs = tracing::enabled!(target: "offload", Level::DEBUG);
        if !mine && !theirs {
            return;
        }
        let f = fields();
        // Only the timeline listens, to an event whose fields say it all: no line to format.
        let text =
            if theirs || (self.text && self.flags.contains(flag)) || !Self::file_has_fields(flag, f.kind) {
                line()
            } else {
                String::new()
            };
        let at = f.at.map(|l| format!("{}:{}", l.file(), l.line()));
        let emit = || offload_event!(Level::DEBUG, flag, f, at, text);
        // Our own layer first: while it is the process's only dispatcher, `tracing` takes a
        // callsite's interest from the thread's default when the callsite is first hit.
        if let Some(own) = self.own.as_ref().filter(|_| mine) {
            tracing::dispatcher::with_default(own, emit);
        }
        if theirs {
            emit();
        }
    }

    /// Whether the trace file draws events of bit `flag` and `kind` from their fields alone
    /// (it keeps the line of the others: constructs' map lists, failures, reports).
    fn file_has_fields(flag: InfoFlags, kind: &str) -> bool {
        (flag == TIMELINE && kind != "note")
            || matches!(kind, "copy" | "entry created" | "entry removed" | "mapping exists")
    }

    /// Reports `line` whatever the bits (live mappings at shutdown), at `WARN`: written by
    /// the runtime's own layer, and given to the program's subscriber.
    pub(crate) fn report(&self, kind: &'static str, device: usize, text: String) {
        let f = InfoFields { kind, device: Some(device), ..InfoFields::default() };
        let at: Option<String> = None;
        let emit = || offload_event!(Level::WARN, InfoFlags::NONE, f, at, text);
        if let Some(own) = &self.own {
            tracing::dispatcher::with_default(own, emit);
        }
        if !self.text {
            InfoLayer::new(InfoFlags::NONE).write(&text);
        }
        emit();
    }

    /// Takes the captured lines (empty when writing to standard error).
    pub(crate) fn take(&self) -> Vec<String> {
        self.log().map(|l| l.take()).unwrap_or_default()
    }

    /// The capture, when lines are captured.
    pub(crate) fn log(&self) -> Option<InfoLog> {
        self.log.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hex_and_decimal() {
        assert_eq!(InfoFlags::parse("0x20"), Some(InfoFlags::TRANSFERS));
        assert_eq!(InfoFlags::parse("40"), Some(InfoFlags::from_bits(40)));
        assert_eq!(InfoFlags::parse("zz"), None);
        assert!(InfoFlags::ALL.contains(InfoFlags::ENTRIES | InfoFlags::TRANSFERS));
        assert!(!InfoFlags::NONE.contains(InfoFlags::NONE));
        assert_eq!(InfoFlags::parse("-1"), Some(InfoFlags::ALL));
        assert!(InfoFlags::parse("-1").is_some_and(|f| f.contains(InfoFlags::ABSENT | InfoFlags::LAUNCH)));
        assert_eq!(InfoFlags::parse("-2147483649"), None);
        assert_eq!(InfoFlags::parse(" 0x7f "), Some(InfoFlags::from_bits(0x7f)));
    }

    #[test]
    fn captures_only_wanted_lines() {
        let t = Trace::new(InfoFlags::ENTRIES, true);
        t.emit(InfoFlags::ENTRIES, || "a".into());
        t.emit(InfoFlags::TRANSFERS, || unreachable!("not formatted when off"));
        assert_eq!(t.take(), vec!["a".to_string()]);
        assert!(t.take().is_empty());
    }

    #[test]
    fn every_thread_reaches_its_runtimes_own_layer_and_no_other() {
        let (a, b) = (Trace::new(InfoFlags::ALL, true), Trace::new(InfoFlags::ALL, true));
        std::thread::scope(|s| {
            for i in 0..4 {
                let (a, b) = (&a, &b);
                s.spawn(move || {
                    a.emit(InfoFlags::ENTRIES, || format!("a{i}"));
                    b.emit(InfoFlags::TRANSFERS, || format!("b{i}"));
                });
            }
        });
        let (mut la, mut lb) = (a.take(), b.take());
        la.sort();
        lb.sort();
        assert_eq!(la, ["a0", "a1", "a2", "a3"]);
        assert_eq!(lb, ["b0", "b1", "b2", "b3"]);
    }

    #[test]
    fn timeline_events_are_never_text() {
        let t = Trace::new(InfoFlags::ALL, true);
        t.event(TIMELINE, InfoFields::default, || "a span".into());
        t.emit(InfoFlags::ENTRIES, || "a line".into());
        assert_eq!(t.take(), ["a line"]);
        // With no trace file, no construct is numbered and no span measured.
        assert!(!t.timeline() && t.construct_begin().is_none() && current_construct().is_none());
    }

    #[test]
    fn reports_are_written_whatever_the_bits() {
        let t = Trace::new(InfoFlags::NONE, true);
        t.emit(InfoFlags::ENTRIES, || unreachable!("not formatted when off"));
        t.report("live at shutdown", 3, "still live".into());
        assert_eq!(t.take(), ["still live"]);
    }

    #[test]
    fn a_programs_layer_filters_by_its_own_bits_and_sees_the_fields() {
        use tracing_subscriber::layer::SubscriberExt;
        let (layer, log) = InfoLayer::capture(InfoFlags::TRANSFERS);
        assert_eq!(layer.flags(), InfoFlags::TRANSFERS);
        let t = Trace::new(InfoFlags::NONE, false);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            let fields =
                || InfoFields { kind: "copy", device: Some(1), bytes: Some(64), ..InfoFields::default() };
            t.event(InfoFlags::TRANSFERS, fields, || "copied 64 bytes".into());
            t.event(InfoFlags::ENTRIES, InfoFields::default, || "entry created".into());
            tracing::debug!(target: "elsewhere", info = 0x20u32, "not offload's");
        });
        assert_eq!(log.take(), ["copied 64 bytes"]);
    }
}
