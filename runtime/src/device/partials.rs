//! Device memory for values a kernel computes and the host reads at once (a reduction's
//! partials): set by a queued copy before the kernel, read back by one queued copy behind
//! it, so that reading them is the call's one wait.

use super::DeviceState;
use crate::data_env::plan::Short;
use crate::error::Result;
use crate::range::HostRange;
use crate::services::memory_pool::Owner;

/// A block of partials and the bounce slot its initial copy reads: given back once the
/// work using them is done (waited for first when the call ends early or unwinds).
struct Partials<'a> {
    device: &'a DeviceState,
    addr: u64,
    slots: Short<usize>,
    waited: bool,
}

impl Drop for Partials<'_> {
    fn drop(&mut self) {
        let d = self.device;
        if !self.waited {
            let _ = d.backend.sync_queue(crate::backend::Queue::Compute);
        }
        d.give_back_slots(&self.slots);
        let _ = d.pool.free(&*d.backend, d.number, self.addr, Owner::User);
    }
}

impl DeviceState {
    /// Runs `launch` with device memory for `values` (from the pool), at the address it is
    /// given, set to `values` first; then copies it back into `values`, waiting once for
    /// all of it (and for the work queued before it, whose failure it reports).
    pub(crate) fn with_partials(
        &self,
        values: &mut [u64],
        launch: impl FnOnce(u64) -> Result<()>,
    ) -> Result<()> {
        let host = HostRange::of(values);
        let addr = self.pool.alloc(&*self.backend, host.bytes.max(1), Owner::User)?;
        let mut p = Partials { device: self, addr, slots: Short::new(), waited: false };
        // SAFETY: `values` is valid for reads; the block holds `host.bytes`.
        match unsafe { self.queue_to_device(addr, host)? } {
            Some(slot) => p.slots.push(slot),
            // SAFETY: as above; the block is new to this call, used by no queued work.
            None => unsafe { self.backend.write(addr, values.as_ptr().cast(), host.bytes)? },
        }
        let launched = launch(addr);
        // SAFETY: `values` is borrowed exclusively until the queue has passed the copy
        // (waited for just below).
        let read = launched.and_then(|()| unsafe { self.queue_from_device(host, addr) });
        let waited = self.settle_queue(true);
        p.waited = true;
        drop(p);
        read.and(waited)
    }
}
