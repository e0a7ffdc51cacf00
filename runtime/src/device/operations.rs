//! What the runtime's routines ask of a device beyond the constructs: copies between two
//! devices, pitched-copy accounting, user allocations (`omp_target_alloc` / `free`), checks
//! of caller-given device addresses, and the device's shutdown. Kept here so that the
//! layers above call methods rather than reach into its pool, table and counters.

use super::{BlocksInUse, DeviceState};
use crate::backend::{Copy2d, GemmOperands, Graph, Place, Queue, RecordedLaunch};
use crate::data_env::Entry;
use crate::error::{Error, Result};
use crate::gemm::{ElementType, Gemm};
use crate::info::Trace;
use crate::kernel::{Kernel, KernelArg};
use crate::range::HostRange;
use crate::services::memory_pool::Owner;
use crate::services::pinned_memory::PinnedMemory;

/// Largest host bounce buffer for a device-to-device copy between devices without peer
/// access or staging buffers.
const BOUNCE_CHUNK: usize = 4 << 20;

impl DeviceState {
    /// Checks that `addr..addr+len` lies in one live allocation of this device, for
    /// `routine`.
    pub(crate) fn check_range(&self, routine: &'static str, addr: u64, len: usize) -> Result<()> {
        self.pool.check_range(self.number, routine, addr, len)
    }

    /// Whether `addr` lies in a live allocation of this device.
    pub(crate) fn owns(&self, addr: u64) -> bool {
        self.pool.extent(addr).is_some()
    }

    /// Copies `len` bytes of `src`'s memory at `s` into this device's at `d`: on the device
    /// itself, by peer access when the peer matrix says this device `reaches` src's memory
    /// ([`crate::Runtime::reaches`]), else through
    /// either device's staging ring, else through a host bounce buffer. (The caller times it,
    /// a span of this device's copy-in queue.)
    ///
    /// # Safety
    /// `d..d+len` is this device's memory and `s..s+len` is `src`'s.
    pub(crate) unsafe fn copy_from_peer_device(
        &self,
        d: u64,
        src: &DeviceState,
        s: u64,
        len: usize,
        reaches: bool,
    ) -> Result<()> {
        let (dd, sd) = (self, src);
        if dd.number == sd.number {
            dd.backend.copy(d, s, len)?;
            dd.stats.record_device_copy(true);
            return Ok(());
        }
        if reaches {
            dd.backend.copy_from_peer(d, &*sd.backend, s, len)?;
            dd.stats.record_device_copy(true);
            return Ok(());
        }
        if let Some(ring) = sd.staging_ring() {
            // SAFETY: both ranges are the devices' memory (this function's contract).
            unsafe { ring.relay_out(&*sd.backend, s, &*dd.backend, d, len)? };
            dd.stats.record_device_copy(false);
            return Ok(());
        }
        if let Some(ring) = dd.staging_ring() {
            // SAFETY: as above.
            unsafe { ring.relay_in(&*sd.backend, s, &*dd.backend, d, len)? };
            dd.stats.record_device_copy(false);
            return Ok(());
        }
        let mut bounce = vec![0u8; len.min(BOUNCE_CHUNK)];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(bounce.len());
            // SAFETY: `bounce` holds at least `n` bytes; the device ranges are the caller's.
            unsafe {
                sd.backend.read(bounce.as_mut_ptr(), s + done as u64, n)?;
                dd.backend.write(d + done as u64, bounce.as_ptr(), n)?;
            }
            done += n;
        }
        dd.stats.record_device_copy(false);
        Ok(())
    }

    /// Counts a pitched copy of `bytes` between `dst` and `src` that the backend made.
    pub(crate) fn record_copy_2d(&self, dst: Place, src: Place, bytes: usize) {
        match (dst, src) {
            (Place::Host(_), _) => self.stats.record_from_device(bytes),
            (_, Place::Host(_)) => self.stats.record_to_device(bytes),
            _ => self.stats.record_device_copy(true),
        }
    }

    /// `omp_target_alloc` of `bytes > 0` on this device.
    pub(crate) fn alloc_user(&self, bytes: usize) -> Result<u64> {
        self.pool.alloc(&*self.backend, bytes, Owner::User)
    }

    /// `omp_target_free` of `ptr` (not null) on this device: refused while an association
    /// holds memory of the block.
    pub(crate) fn free_user(&self, ptr: u64) -> Result<()> {
        // The table stays locked until the block has left the live set, so no association
        // can be made into it in between (`associate` checks under the same lock); the
        // backend's free, which may wait for the device, comes after.
        let table = self.table.lock();
        let extent = self.pool.extent(ptr).unwrap_or(0) as u64;
        let held = table
            .entries()
            .find(|e| e.associated && e.device_addr.wrapping_sub(ptr) < extent)
            .map(|e| e.range);
        if let Some(range) = held {
            return Err(Error::InvalidArgument {
                routine: "omp_target_free",
                what: format!(
                    "device {}: {ptr:#x} holds the device memory of the associated {range}; disassociate it first",
                    self.number
                ),
            });
        }
        let taken = self.pool.take(self.number, ptr, Owner::User)?;
        drop(table);
        self.pool.give_back(&*self.backend, taken).map(drop)
    }

    /// The device address of `span` when it lies wholly in one mapped range, its block
    /// pinned in `in_use` until that is dropped (operands of a library call).
    pub(crate) fn pin_mapped(&self, in_use: &mut BlocksInUse<'_>, span: HostRange) -> Option<u64> {
        let mut table = self.table.lock();
        let (addr, block) = table
            .containing(span.begin)
            .filter(|e| e.range.contains(&span))
            .map(|e| (e.translate(span.begin), e.device_addr))?;
        in_use.pin(&mut table, block);
        Some(addr)
    }

    /// The trace this device writes to.
    pub(crate) fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Ends the device at the runtime's drop: reports (to `trace`) queued work that failed
    /// unreported and mappings still live, unregisters what the policy registered, and gives
    /// its staging buffers and pooled memory back.
    pub(crate) fn shut_down(&mut self, trace: &Trace) {
        if let Err(e) = self.settle() {
            let line = format!("device {}: queued work failed and was never reported: {e}", self.number);
            trace.report("shutdown failed", self.number, line);
        }
        self.write_spans(true);
        let table = self.table.lock();
        if table.len() > 0 {
            let line = format!(
                "runtime dropped with {} mapping(s) still live on device {}:\n{}",
                table.len(),
                self.number,
                table.dump(self.number)
            );
            trace.report("live at shutdown", self.number, line);
        }
        let live: Vec<Entry> = table.entries().filter(|e| e.registered).cloned().collect();
        drop(table);
        for e in live {
            // SAFETY: locked by the policy; nothing is in flight at shutdown.
            unsafe { self.unlock_host(e.range.begin as *mut u8) };
        }
        // Its buffers are unlocked and freed before the pool goes.
        drop(self.staging.take());
        if let Err(e) = self.pool.release_all(&*self.backend) {
            let line = format!("device {}: releasing memory at shutdown failed: {e}", self.number);
            trace.report("shutdown failed", self.number, line);
        }
    }

    // ---- the backend's operations the runtime asks for, through the device ----------

    /// Queues `kernel` over `n` items with translated `args` on the compute queue.
    pub(crate) fn enqueue_kernel(&self, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        self.backend.enqueue_launch(Queue::Compute, kernel, n, args)
    }

    /// Runs `kernel` over `n` items and waits for it ([`crate::backend::Backend::launch`]).
    pub(crate) fn run_kernel(&self, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        self.backend.launch(kernel, n, args)
    }

    /// Makes recorded launches one graph, where the backend makes graphs.
    pub(crate) fn capture_graph(&self, launches: &[RecordedLaunch]) -> Result<Option<Graph>> {
        self.backend.capture_graph(launches)
    }

    /// Queues a graph [`DeviceState::capture_graph`] made on the compute queue.
    pub(crate) fn enqueue_graph(&self, graph: &Graph) -> Result<()> {
        self.backend.enqueue_graph(graph)
    }

    /// Waits for the compute queue.
    pub(crate) fn sync_compute(&self) -> Result<()> {
        self.backend.sync_queue(Queue::Compute)
    }

    /// Waits for every queue of the device.
    pub(crate) fn synchronize_queues(&self) -> Result<()> {
        self.backend.synchronize()
    }

    /// Whether the device has BLAS (GEMMs).
    pub(crate) fn has_blas(&self) -> bool {
        self.backend.has_blas()
    }

    /// Makes the device's BLAS handle now (before a GEMM's span).
    pub(crate) fn prepare_blas(&self) -> Result<()> {
        self.backend.prepare_blas()
    }

    /// Queues a GEMM on device memory on the compute queue.
    pub(crate) fn gemm(&self, g: &Gemm, ty: ElementType, ops: GemmOperands) -> Result<()> {
        self.backend.gemm(g, ty, ops)
    }

    /// Sets `bytes` of device memory at `dst` to `value`, waited for.
    pub(crate) fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.backend.memset(dst, value, bytes)
    }

    /// A pitched 2-D copy as one driver operation, waited for; `false` when the backend
    /// has none.
    ///
    /// # Safety
    /// As [`crate::backend::Backend::copy_2d`].
    pub(crate) unsafe fn copy_2d(&self, c: &Copy2d) -> Result<bool> {
        // SAFETY: forwarded from the caller.
        unsafe { self.backend.copy_2d(c) }
    }

    /// Page-locks `[ptr, ptr+bytes)` in place for this device's copies and records it in
    /// the runtime's pinned ranges; `false` where the device has no such notion or the
    /// driver refused.
    ///
    /// # Safety
    /// The memory stays allocated until [`DeviceState::unlock_host`].
    pub(crate) unsafe fn lock_host(&self, ptr: *mut u8, bytes: usize) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { self.pinned.lock(&*self.backend, ptr, bytes) }
    }

    /// Undoes [`DeviceState::lock_host`].
    ///
    /// # Safety
    /// `ptr` was locked by this device, and no copy on it is in flight.
    pub(crate) unsafe fn unlock_host(&self, ptr: *mut u8) {
        // SAFETY: forwarded from the caller.
        unsafe { self.pinned.unlock(&*self.backend, ptr) }
    }

    /// Page-locks runtime-owned `memory` with this device's driver, recorded as the
    /// program's (a `HostBuffer`); whether the driver did.
    pub(crate) fn lock_memory(&self, memory: &mut PinnedMemory) -> bool {
        memory.lock(&self.backend, Some(&self.pinned)).unwrap_or(false)
    }
}
