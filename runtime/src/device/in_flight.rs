//! Work that a device's constructs queued and did not wait for: stream-ordered constructs.
//!
//! A construct whose effect the host cannot observe (a launch, a `to` copy, an exit that
//! copies nothing back) queues its copies and kernel on the device's compute queue, in
//! program order, and returns. What the queued work needs besides device memory stays
//! reserved until an event recorded after it has completed: the blocks of the mapped
//! entries it uses (pinned in the present table, so that an exit removing the entry leaves
//! the free to the work's retirement) and the [`BounceSlots`] its copies read from (a `to`
//! source is copied into pinned memory before the construct returns, so the program may
//! change it at once). The host waits only where it observes device work: a copy into
//! host memory, a reduction's value, [`crate::Runtime::synchronize`], a routine that
//! reads or frees device memory ([`DeviceState::settle`]).
//!
//! A failure of queued work is found by the next poll or wait, and kept with the
//! construct that queued it ([`Origin`](crate::origin::Origin)): constructs refuse to run
//! ([`Error::EarlierFailure`]) until a synchronising call reports it ([`Error::Queued`]).
//! `OFFLOAD_SYNC=1` turns all this off: every construct waits, as before.

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::Location;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::{BlocksInUse, DeviceState};
use crate::backend::{Backend, Event, Queue};
use crate::data_env::plan::Short;
use crate::error::{Error, Result};
use crate::origin::Origin;
use crate::range::HostRange;
use crate::services::pinned_memory::{PinnedMemory, PAGE};

/// Bytes of one bounce slot: `to` copies up to this size are queued from a slot.
pub(crate) const SLOT_BYTES: usize = 64 << 10;

/// Bounce slots per device (2 MiB of pinned memory, made on first use).
const SLOTS: usize = 32;

/// One construct's queued work: complete once `event` is.
struct QueuedOp {
    event: Event,
    blocks: Short<u64>,
    slots: Short<usize>,
    origin: Origin,
}

/// Pinned host memory that small `to` copies are staged in before they are queued, cut
/// into [`SLOTS`] slots of [`SLOT_BYTES`]; a slot is free again when the work that reads it
/// has completed.
pub(crate) struct BounceSlots {
    /// Dropped (unlocked and freed) with its device state, after the runtime waited for all
    /// queued work.
    memory: PinnedMemory,
    free: Mutex<Vec<usize>>,
}

impl BounceSlots {
    /// Allocates and page-locks the slots for device `device` (left pageable when the
    /// driver refuses); `None` when memory is short.
    fn new(device: usize, backend: &Arc<dyn Backend>) -> Option<Self> {
        let mut memory = PinnedMemory::allocate(device, SLOTS * SLOT_BYTES, PAGE, None).ok()?;
        let _ = memory.lock(backend, None);
        Some(Self { memory, free: Mutex::new((0..SLOTS).rev().collect()) })
    }

    fn take(&self) -> Option<usize> {
        self.free.lock().pop()
    }

    fn give_back(&self, slots: &[usize]) {
        self.free.lock().extend_from_slice(slots);
    }

    fn ptr(&self, slot: usize) -> *mut u8 {
        self.memory.as_ptr().wrapping_add(slot * SLOT_BYTES)
    }
}

thread_local! {
    /// Whether the constructs this thread makes wait for their work (a `nowait` task's).
    static WAITING: Cell<bool> = const { Cell::new(false) };
}

/// Makes the constructs of the calling thread wait for their work while it lives: a
/// `nowait` task's, whose completion is what its waiter observes.
pub(crate) struct ConstructsWait(bool);

impl ConstructsWait {
    pub(crate) fn begin() -> Self {
        Self(WAITING.replace(true))
    }
}

impl Drop for ConstructsWait {
    fn drop(&mut self) {
        WAITING.set(self.0);
    }
}

/// What [`DeviceState::finish_queued`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The compute queue, whatever is on it (copies back queued after the last event).
    Queue,
    /// The constructs' queued work (their events).
    Events,
    /// Nothing: the caller has waited for the whole device.
    Done,
}

/// A copy into host memory that [`DeviceState::queue_read`] queued: done once its event
/// is; the device block it reads stays pinned until then.
pub(crate) struct PendingRead {
    event: Option<Event>,
    origin: Origin,
}

impl PendingRead {
    /// Waits for the copy (and the work queued before it) and reports a failure of queued
    /// work as a synchronising call does. Idempotent.
    pub(crate) fn wait(&mut self, device: &DeviceState) -> Result<()> {
        self.wait_quietly(device);
        device.report(Ok(()))
    }

    /// Waits for the copy and retires what has completed; a failure is kept for a
    /// synchronising call to report (for a drop, which has nowhere to report it).
    pub(crate) fn wait_quietly(&mut self, device: &DeviceState) {
        let Some(event) = self.event.take() else { return };
        if let Err(e) = device.backend.sync_event(&event) {
            device.in_flight.note_failure(self.origin, e);
        }
        device.poll_quietly();
    }
}

/// A device's queued work and its unreported failure.
pub(crate) struct InFlight {
    /// `OFFLOAD_SYNC=1`: constructs wait for their work.
    synchronous: bool,
    ops: Mutex<VecDeque<QueuedOp>>,
    /// Queued ops, read without the lock on every construct.
    count: AtomicUsize,
    failure: Mutex<Option<(Origin, Error)>>,
    /// Whether `failure` holds one, read without its lock on every construct.
    failed: std::sync::atomic::AtomicBool,
    bounce: OnceLock<Option<BounceSlots>>,
    /// Held through a wait for queued work: a second waiter waits for the first's work
    /// too, rather than seeing the queue drained before that work has completed.
    waiting: Mutex<()>,
}

impl InFlight {
    /// Nothing queued; `synchronous` from `OFFLOAD_SYNC`.
    pub(crate) fn new(synchronous: bool) -> Self {
        Self {
            synchronous,
            ops: Mutex::new(VecDeque::new()),
            count: AtomicUsize::new(0),
            failure: Mutex::new(None),
            failed: std::sync::atomic::AtomicBool::new(false),
            bounce: OnceLock::new(),
            waiting: Mutex::new(()),
        }
    }

    fn note_failure(&self, origin: Origin, e: Error) {
        self.failure.lock().get_or_insert((origin, e));
        self.failed.store(true, Ordering::Release);
    }

    /// The unreported failure, taken (reported once).
    fn take_failure(&self) -> Option<(Origin, Error)> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        let mut f = self.failure.lock();
        self.failed.store(false, Ordering::Release);
        f.take()
    }
}

impl DeviceState {
    /// Whether a construct on this device may return before its work has completed: not
    /// under `OFFLOAD_SYNC=1`, and not inside a `nowait` task (whose completion the task's
    /// waiter observes).
    pub(crate) fn ordered(&self) -> bool {
        !self.in_flight.synchronous && !WAITING.get()
    }

    /// Retires the queued work that has completed, without blocking. An error while a
    /// failure of queued work is unreported: the construct calling it must not run.
    #[inline]
    pub(crate) fn poll(&self) -> Result<()> {
        self.poll_quietly();
        if !self.in_flight.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.refusal()
    }

    #[cold]
    fn refusal(&self) -> Result<()> {
        match &*self.in_flight.failure.lock() {
            None => Ok(()),
            Some((o, _)) => {
                Err(Error::EarlierFailure { device: self.number, construct: o.construct(), at: o.at() })
            }
        }
    }

    /// Retires the queued work that has completed, without blocking, keeping a failure of
    /// it for a synchronising call to report.
    #[inline]
    pub(crate) fn poll_quietly(&self) {
        if self.in_flight.count.load(Ordering::Acquire) > 0 {
            self.retire_completed();
        }
    }

    /// Retires the queued work, oldest first, up to the first not yet complete.
    #[inline(never)]
    fn retire_completed(&self) {
        let mut done: Short<QueuedOp> = Short::new();
        {
            let mut ops = self.in_flight.ops.lock();
            while let Some(op) = ops.front() {
                match self.backend.event_done(&op.event) {
                    Ok(false) => break,
                    Ok(true) => {}
                    Err(e) => self.in_flight.note_failure(op.origin, e),
                }
                done.extend(ops.pop_front());
            }
            self.in_flight.count.store(ops.len(), Ordering::Release);
        }
        self.retire(done);
    }

    /// Waits for all work queued on the device's compute queue so far (when `wait_queue`,
    /// also what was queued after the last construct's event: copies back that the caller
    /// queued), retires it, and reports an unreported failure of queued work, once, as
    /// [`Error::Queued`] naming its construct.
    pub(crate) fn settle_queue(&self, wait_queue: bool) -> Result<()> {
        let waited = self.finish_queued(if wait_queue { Wait::Queue } else { Wait::Events });
        self.report(waited)
    }

    /// `waited`, unless a failure of queued work is unreported: that, taken.
    pub(crate) fn report(&self, waited: Result<()>) -> Result<()> {
        if let Some((o, e)) = self.in_flight.take_failure() {
            let e = Error::Queued {
                device: self.number,
                construct: o.construct(),
                at: o.at(),
                source: Box::new(e),
            };
            self.audit_report(&e);
            return Err(e);
        }
        waited
    }

    /// Waits for the work queued so far and retires it, keeping a failure of it for a
    /// synchronising call to report; the error of the queue's own wait (the caller's: the
    /// queue may hold copies it queued after the last construct's event).
    pub(crate) fn finish_queued(&self, wait: Wait) -> Result<()> {
        self.finish_queued_as(wait, false)
    }

    /// [`DeviceState::finish_queued`] for a caller with nowhere to report (a query of the
    /// device's state, a routine that waits before it frees): a failed wait of the queue
    /// is kept too, as the failure of the last construct's work, unless the work's events
    /// gave one first.
    pub(crate) fn finish_queued_quietly(&self, wait: Wait) {
        let _ = self.finish_queued_as(wait, true);
    }

    fn finish_queued_as(&self, wait: Wait, keep: bool) -> Result<()> {
        // The fast path reads the count without the lock: nothing queued, nobody waiting.
        if wait != Wait::Queue && self.in_flight.count.load(Ordering::Acquire) == 0 {
            if let Some(_idle) = self.in_flight.waiting.try_lock() {
                return Ok(());
            }
        }
        let _waiting = self.in_flight.waiting.lock();
        let ops: Vec<QueuedOp> = if self.in_flight.count.load(Ordering::Acquire) > 0 {
            let mut ops = self.in_flight.ops.lock();
            self.in_flight.count.store(0, Ordering::Release);
            ops.drain(..).collect()
        } else {
            Vec::new()
        };
        let waited = match wait {
            Wait::Queue => self.backend.sync_queue(Queue::Compute),
            Wait::Events if !ops.is_empty() => self.backend.sync_queue(Queue::Compute),
            Wait::Events | Wait::Done => Ok(()),
        };
        for op in &ops {
            // After the queue's wait each event has completed (or reports the failure).
            let done = match self.backend.event_done(&op.event) {
                Ok(false) => self.backend.sync_event(&op.event),
                other => other.map(drop),
            };
            if let Err(e) = done {
                self.in_flight.note_failure(op.origin, e);
            }
        }
        if keep {
            if let (Err(e), Some(op)) = (&waited, ops.last()) {
                // Kept only when the events gave no failure (the first is kept).
                self.in_flight.note_failure(op.origin, e.clone());
            }
        }
        self.retire(ops);
        waited
    }

    /// [`DeviceState::settle_queue`] for the constructs' work (events) only.
    pub(crate) fn settle(&self) -> Result<()> {
        self.settle_queue(false)
    }

    /// Keeps the failure `e` of `origin`, which could not return it (a guard's drop), for
    /// the device's next synchronising call to report, as a failure of queued work is; the
    /// constructs after it are refused until then ([`Error::EarlierFailure`]).
    pub(crate) fn keep_failure(&self, origin: Origin, e: Error) {
        // Kept whole: a report of earlier queued work's failure that this construct took
        // still names that work's construct and place ([`Error::cause`] reaches its root).
        // While another failure is unreported, that one is reported first, and this one
        // is not kept (as for queued work, the first failure stands for the others).
        self.in_flight.note_failure(origin, e);
    }

    /// Records that `origin` queued work on the compute queue that uses `in_use`'s blocks
    /// and reads `slots`: they stay reserved until an event recorded now has completed.
    /// When the event cannot be recorded the queue is waited for instead.
    pub(crate) fn queued(
        &self,
        origin: Origin,
        mut in_use: BlocksInUse<'_>,
        slots: Short<usize>,
    ) -> Result<()> {
        match self.backend.record(Queue::Compute) {
            Ok(event) => {
                let blocks = in_use.take_blocks();
                let op = QueuedOp { event, blocks, slots, origin };
                let mut ops = self.in_flight.ops.lock();
                ops.push_back(op);
                self.in_flight.count.store(ops.len(), Ordering::Release);
                Ok(())
            }
            Err(e) => {
                let waited = self.backend.sync_queue(Queue::Compute);
                self.give_back_slots(&slots);
                drop(in_use);
                Err(waited.err().unwrap_or(e))
            }
        }
    }

    /// Frees the bounce slots of work that has completed (or was never queued).
    pub(crate) fn give_back_slots(&self, slots: &[usize]) {
        if let (false, Some(Some(b))) = (slots.is_empty(), self.in_flight.bounce.get()) {
            b.give_back(slots);
        }
    }

    /// Ends the reservations of completed work: bounce slots back, blocks unpinned (and
    /// freed when their entry left the table meanwhile).
    fn retire(&self, ops: impl IntoIterator<Item = QueuedOp>) {
        let mut gone: Short<crate::data_env::Entry> = Short::new();
        let mut table = None;
        for op in ops {
            self.give_back_slots(&op.slots);
            if !op.blocks.is_empty() {
                let t = table.get_or_insert_with(|| self.table.lock());
                gone.extend(op.blocks.iter().filter_map(|&a| t.unpin(a)));
            }
        }
        drop(table);
        for e in &gone {
            let _ = self.release_entry(e);
        }
    }

    /// Copies `host` into a bounce slot and queues its copy to `dst` on the compute queue;
    /// the slot, or `None` (nothing done) when `host` is too large or no slot is free.
    ///
    /// # Safety
    /// `host` valid for reads during the call; `dst` device memory of its size.
    pub(crate) unsafe fn queue_to_device(&self, dst: u64, host: HostRange) -> Result<Option<usize>> {
        if host.bytes > SLOT_BYTES {
            return Ok(None);
        }
        let Some(b) = self.in_flight.bounce.get_or_init(|| BounceSlots::new(self.number, &self.backend))
        else {
            return Ok(None);
        };
        let slot = match b.take() {
            Some(s) => s,
            None => {
                // Retire what has completed, then try once more.
                self.poll()?;
                match b.take() {
                    Some(s) => s,
                    None => return Ok(None),
                }
            }
        };
        let start = std::time::Instant::now();
        // SAFETY: the caller's range is valid for reads; the slot holds `SLOT_BYTES` and
        // is this construct's alone until given back.
        unsafe { std::ptr::copy_nonoverlapping(host.begin as *const u8, b.ptr(slot), host.bytes) };
        let what = super::copy_span("host->device", host, dst, false);
        // SAFETY: the slot stays valid and unchanged until the work is retired (it is in
        // the construct's `QueuedOp`), `dst` is the caller's device range.
        let enqueue = || unsafe { self.backend.enqueue_write(Queue::Compute, dst, b.ptr(slot), host.bytes) };
        if let Err(e) = self.timed(Queue::Compute, what, enqueue) {
            b.give_back(&[slot]);
            return Err(e);
        }
        self.trace_copy(
            "host->device",
            host,
            dst,
            super::CopyPath::Queued,
            (start.elapsed(), std::time::Duration::ZERO),
        );
        self.stats.record_to_device(host.bytes);
        Ok(Some(slot))
    }

    /// Queues a copy of `bytes` between two places of this device's memory on the compute
    /// queue, behind the work queued before it; `pins` hold the blocks of both sides
    /// until it has run.
    pub(crate) fn queue_copy_within(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        pins: [BlocksInUse<'_>; 2],
        at: &'static Location<'static>,
    ) -> Result<()> {
        self.poll()?;
        self.backend.enqueue_copy(Queue::Compute, dst, src, bytes)?;
        let [mut a, mut b] = pins;
        let mut blocks = a.take_blocks();
        blocks.extend(b.take_blocks());
        self.queued(
            Origin::new("omp_target_memcpy (within the device)", at),
            BlocksInUse::adopt(self, blocks),
            Short::new(),
        )
    }

    /// Queues on this device's compute queue a copy of `bytes` from `src`'s memory at
    /// `from` into this device's memory at `to` (a peer copy: `src` must be reachable),
    /// after the work queued on `src` before the call, with `src`'s compute queue held
    /// until the copy has run (its later work cannot overwrite the rows being read); the
    /// pins hold this device's block and `src`'s until then. Neither thread waits.
    pub(crate) fn queue_copy_from_peer(
        &self,
        to: u64,
        src: &DeviceState,
        from: u64,
        bytes: usize,
        pins: (BlocksInUse<'_>, BlocksInUse<'_>),
        at: &'static Location<'static>,
    ) -> Result<()> {
        self.poll()?;
        src.poll()?;
        let (dst_pin, src_pin) = pins;
        let origin = Origin::new("omp_target_memcpy (between devices)", at);
        self.queue_after(src)?;
        self.backend.enqueue_copy_from_peer(Queue::Compute, to, &*src.backend, from, bytes)?;
        // From here the copy may be running: each pin is dropped only once it has run.
        self.queued(origin, dst_pin, Short::new())?;
        if let Err(e) = src.queue_after_or_wait(self) {
            drop(src_pin);
            return Err(e);
        }
        src.queued(origin, src_pin, Short::new())
    }

    /// Makes the work queued on this device from now on wait for the work queued on
    /// `other` so far (compute queues; no thread waits). A failure of `other`'s work is
    /// `other`'s to report.
    pub(crate) fn queue_after(&self, other: &DeviceState) -> Result<()> {
        let point = other.backend.record_point(Queue::Compute)?;
        self.backend.enqueue_wait(Queue::Compute, &point, &*other.backend)
    }

    /// [`DeviceState::queue_after`], or where the wait cannot be queued, `other`'s work
    /// waited for on this thread (the order holds either way; a failure of that work kept
    /// for `other`'s next synchronising call) and the error returned.
    pub(crate) fn queue_after_or_wait(&self, other: &DeviceState) -> Result<()> {
        self.queue_after(other).inspect_err(|_| other.finish_queued_quietly(Wait::Queue))
    }

    /// Queues a copy of `bytes` at device address `src` (in the block `pins` holds) into host
    /// memory at `dst` on the compute queue, behind the work queued before it, and records
    /// the point after it: [`PendingRead::wait`] waits for it.
    ///
    /// # Safety
    /// `dst` valid for `bytes` of writes, and not otherwise accessed, until the read has
    /// been waited for.
    pub(crate) unsafe fn queue_read(
        &self,
        dst: *mut u8,
        src: u64,
        bytes: usize,
        pins: BlocksInUse<'_>,
        origin: Origin,
    ) -> Result<PendingRead> {
        self.poll()?;
        // SAFETY: forwarded from the caller.
        unsafe { self.queue_from_device(HostRange::new(dst as usize, bytes), src)? };
        // Queued work like any other (routines that wait for the queued work wait for it;
        // the block stays pinned until it has run) ...
        self.queued(origin, pins, Short::new())?;
        // ... with a point of its own for the caller to wait for.
        let event = match self.backend.record(Queue::Compute) {
            Ok(e) => e,
            Err(e) => {
                // Nothing to wait for later: wait now, then give the memory back.
                let waited = self.backend.sync_queue(Queue::Compute);
                return Err(waited.err().unwrap_or(e));
            }
        };
        Ok(PendingRead { event: Some(event), origin })
    }

    /// Queues a copy of device address `src` into `host` on the compute queue, behind the
    /// work queued before it; the caller waits for the queue before `host` is read.
    ///
    /// # Safety
    /// `host` valid for exclusive writes until the caller has waited for the queue.
    pub(crate) unsafe fn queue_from_device(&self, host: HostRange, src: u64) -> Result<()> {
        let start = std::time::Instant::now();
        // SAFETY: forwarded from the caller.
        let enqueue =
            || unsafe { self.backend.enqueue_read(Queue::Compute, host.begin as *mut u8, src, host.bytes) };
        self.timed(Queue::Compute, super::copy_span("device->host", host, src, false), enqueue)?;
        self.trace_copy(
            "device->host",
            host,
            src,
            super::CopyPath::Queued,
            (start.elapsed(), std::time::Duration::ZERO),
        );
        self.stats.record_from_device(host.bytes);
        Ok(())
    }
}
