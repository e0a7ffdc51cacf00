//! Device-side spans of the timeline (`OFFLOAD_TRACE`): a copy, kernel or library call is
//! bracketed by two stamps in its queue ([`Backend::stamp`](crate::backend::Backend::stamp)),
//! whose times the device reads later: without waiting at each construct's start once
//! many are pending, waiting at a flush and at shutdown. Each becomes a `tracing` event
//! of the timeline's own bit, which the trace file draws on the queue's track. With no
//! timeline nothing is stamped.

use parking_lot::Mutex;

use super::DeviceState;
use crate::backend::{BackendKind, Event, Queue};
use crate::error::Result;
use crate::info::{DeviceUsage, InfoFields};

/// Spans pending past this many are read without waiting at the next construct's start,
/// so a long run's stamps do not pile up.
const READ_PAST: usize = 256;

/// What a span was: the event fields that name it (kind `copy`, `kernel`, `gemm`, ...).
pub(crate) type SpanOf = InfoFields<'static>;

/// Spans whose stamps the device has not read yet.
#[derive(Default)]
pub(crate) struct PendingSpans(Mutex<Vec<Pending>>);

struct Pending {
    what: SpanOf,
    queue: Queue,
    begin: Event,
    end: Event,
}

/// The name of queue `q` on its track: a host device's three queues are its one worker,
/// drawn as one track (`worker`), where nothing overlaps.
fn queue_name(q: Queue, kind: BackendKind) -> &'static str {
    match (kind, q) {
        (BackendKind::Host, _) => "worker",
        (_, Queue::CopyIn) => "copy-in",
        (_, Queue::Compute) => "compute",
        (_, Queue::CopyOut) => "copy-out",
    }
}

impl DeviceState {
    /// Runs `work`, which enqueues on (or waits for) queue `q`, as span `what` of the
    /// timeline when one is written; a failing stamp only loses the span.
    pub(crate) fn timed<R>(
        &self,
        q: Queue,
        what: impl FnOnce() -> SpanOf,
        work: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        if !self.trace.timeline() {
            return work();
        }
        let begin = self.backend.stamp(q).ok().flatten();
        let done = work();
        // The end is stamped whatever the work's outcome: a host device's stamps pair up
        // per thread (backend/host.rs, `SpanJobs`).
        let end = begin.as_ref().and_then(|_| self.backend.stamp(q).ok().flatten());
        if let (Some(begin), Some(end), true) = (begin, end, done.is_ok()) {
            let mut what = what();
            what.construct = what.construct.or_else(crate::info::current_construct);
            self.timeline.0.lock().push(Pending { what, queue: q, begin, end });
        }
        done
    }

    /// Writes the spans whose stamps have been reached (all of them, waiting, with
    /// `wait`) to the trace; keeps the others.
    pub(crate) fn write_spans(&self, wait: bool) {
        if !self.trace.timeline() {
            return;
        }
        let pending = std::mem::take(&mut *self.timeline.0.lock());
        let kind = self.backend.description().kind;
        let mut kept = Vec::new();
        for p in pending {
            let read = |e: &Event| self.backend.stamp_time(e, wait);
            match (read(&p.begin), read(&p.end)) {
                (Ok(Some(b)), Ok(Some(e))) => {
                    self.trace.device_span(self.number, queue_name(p.queue, kind), p.what, (b, e))
                }
                (Ok(_), Ok(_)) => kept.push(p),
                // A stamp whose work failed has no time: the span is dropped.
                _ => {}
            }
        }
        if !kept.is_empty() {
            let mut list = self.timeline.0.lock();
            kept.append(&mut list);
            *list = kept;
        }
    }

    /// At a construct's start: writes the spans already reached once many are pending.
    pub(crate) fn write_spans_if_many(&self) {
        if self.trace.timeline() && self.timeline.0.lock().len() > READ_PAST {
            self.write_spans(false);
        }
    }

    /// The present table's entries and mapped bytes and the pool's bytes now, for the
    /// timeline's counters (`None` with no timeline).
    pub(crate) fn usage(&self) -> Option<DeviceUsage> {
        if !self.trace.timeline() {
            return None;
        }
        let (entries, mapped_bytes) = {
            let table = self.table.lock();
            (table.len(), table.entries().map(|e| e.range.bytes).sum())
        };
        let (pool_in_use, pool_cached) = self.pool.usage();
        Some(DeviceUsage { entries, mapped_bytes, pool_in_use, pool_cached })
    }
}
