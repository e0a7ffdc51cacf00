//! What the runtime tells about itself: `OFFLOAD_INFO` traces in the manner of
//! `LIBOMPTARGET_INFO`, and present-table dumps.
//!
//! | bit | meaning |
//! | --- | --- |
//! | `0x01` | kernel launches with their translated arguments |
//! | `0x02` | a map found its range already present |
//! | `0x04` | the present table after each construct, and with a failed construct's error |
//! | `0x08` | entries created and removed, with their counts |
//! | `0x10` | launch details: the grid and block a backend chose |
//! | `0x20` | data transfers: direction, bytes, addresses |
//! | `0x40` | host data with no device counterpart: ranges an exit or update skipped |
//!
//! `-1` (or any value with every bit set) turns everything on, as with `LIBOMPTARGET_INFO`.
//!
//! Lines go to standard error unless the runtime was built to capture them
//! ([`crate::RuntimeBuilder::capture_info`]), which is how tests and teaching tools read
//! them back.
//!
//! The same events go to [`tracing`], whatever the bits, whenever a subscriber listens to
//! target `offload` at level `DEBUG` (JSON, a file, `tracing-chrome`), except table dumps,
//! which are made only when 0x04 is on: the line as the message, and fields `info` (its
//! bit), `kind` (`construct`, `entry created`, `mapping exists`, `entry removed`, `copy`,
//! `launch`, `table`, `skipped`, ...), `device`, and where they apply `host_begin`,
//! `host_bytes`, `device_addr`, `ref_count`, `hold_count`,
//! `bytes`, `direction`, `staged`, `micros` (a copy's time), `kernel`, `n`, `at` (the
//! program's `file:line`).

use std::fmt;
use std::ops::BitOr;
use std::sync::Arc;

use parking_lot::Mutex;

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

/// The fields of a trace event beyond its line (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct InfoFields<'a> {
    pub(crate) kind: &'static str,
    pub(crate) device: Option<usize>,
    pub(crate) host: Option<crate::error::HostRange>,
    pub(crate) device_addr: Option<u64>,
    pub(crate) counts: Option<(u64, u64)>,
    pub(crate) bytes: Option<usize>,
    pub(crate) direction: Option<&'static str>,
    pub(crate) staged: Option<bool>,
    pub(crate) micros: Option<f64>,
    pub(crate) kernel: Option<&'a str>,
    pub(crate) n: Option<usize>,
    pub(crate) at: Option<&'a std::panic::Location<'a>>,
}

/// Where trace lines go.
#[derive(Debug)]
pub(crate) enum InfoSink {
    Stderr,
    Capture(InfoLog),
}

/// The runtime's tracer.
#[derive(Debug)]
pub(crate) struct Trace {
    flags: InfoFlags,
    sink: InfoSink,
}

impl Trace {
    pub(crate) fn new(flags: InfoFlags, capture: bool) -> Self {
        let sink = if capture { InfoSink::Capture(InfoLog::default()) } else { InfoSink::Stderr };
        Self { flags, sink }
    }

    /// Whether lines of kind `flag` are wanted (cheap: check before formatting).
    pub(crate) fn on(&self, flag: InfoFlags) -> bool {
        self.flags.contains(flag)
    }

    /// Emits a line of kind `flag` (a `tracing` event with only the `info` field).
    pub(crate) fn emit(&self, flag: InfoFlags, line: impl FnOnce() -> String) {
        self.event(flag, InfoFields::default, line);
    }

    /// Emits an event of kind `flag`: its line to this runtime's sink when its bits ask for
    /// it, and the line with `fields` to a `tracing` subscriber listening to `offload` at
    /// `DEBUG`.
    /// Neither is formatted when nobody wants it.
    pub(crate) fn event<'a>(
        &self,
        flag: InfoFlags,
        fields: impl FnOnce() -> InfoFields<'a>,
        line: impl FnOnce() -> String,
    ) {
        let mine = self.on(flag);
        let theirs = tracing::enabled!(target: "offload", tracing::Level::DEBUG);
        if !mine && !theirs {
            return;
        }
        let text = line();
        if theirs {
            let f = fields();
            let at = f.at.map(|l| format!("{}:{}", l.file(), l.line()));
            tracing::debug!(
                target: "offload",
                info = flag.bits(),
                kind = f.kind,
                device = f.device,
                host_begin = f.host.map(|h| h.begin),
                host_bytes = f.host.map(|h| h.bytes),
                device_addr = f.device_addr,
                ref_count = f.counts.map(|c| c.0),
                hold_count = f.counts.map(|c| c.1),
                bytes = f.bytes,
                direction = f.direction,
                staged = f.staged,
                micros = f.micros,
                kernel = f.kernel,
                n = f.n,
                at = at.as_deref(),
                "{text}"
            );
        }
        if mine {
            self.write(text);
        }
    }

    /// Emits a line whatever the flags (table dumps asked for explicitly, leak reports).
    pub(crate) fn write(&self, line: String) {
        match &self.sink {
            InfoSink::Stderr => eprintln!("offload info: {line}"),
            InfoSink::Capture(log) => log.0.lock().push(line),
        }
    }

    /// Takes the captured lines (empty when writing to standard error).
    pub(crate) fn take(&self) -> Vec<String> {
        self.log().map(|l| l.take()).unwrap_or_default()
    }

    /// The capture, when lines are captured.
    pub(crate) fn log(&self) -> Option<InfoLog> {
        match &self.sink {
            InfoSink::Stderr => None,
            InfoSink::Capture(log) => Some(log.clone()),
        }
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
}
