//! Host<->device copies of pageable memory staged through pinned buffers next to the
//! device.
//!
//! The driver's own path for pageable memory copies through a small internal buffer with
//! one thread, far below what the link can do. A [`StagingRing`] keeps, per direction, a
//! ring of pinned buffers on the device's NUMA node (bound before the first touch, touched
//! by the device's bound worker, then page-locked with the driver; never write-combined, so
//! the CPU can read them back fast). A host->device copy goes in chunks: threads of the
//! device's node copy chunk *i* into one buffer while the DMA engine drains chunk *i-1* from
//! the other; device->host runs the same ring the other way, the crew first faulting in the
//! destination's pages all at once (fresh output pages would otherwise be faulted 4 KiB at a
//! time inside the copies: docs/PERFORMANCE.md, issue 29). Memory that is already pinned
//! is copied directly, and so are small copies, where a ring's fixed costs would lose.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::backend::{Backend, Event, Queue};
use crate::error::Result;
use crate::services::copy_crew::CopyCrew;
use crate::services::pinned_memory::{PinnedMemory, PAGE};
use crate::topology::Topology;

/// How staging behaves; the defaults were measured to be good on the H200 machines
/// (see the transfer table in docs/PERFORMANCE.md). [`crate::RuntimeBuilder::build`] refuses a field
/// outside the range its comment gives ([`crate::Error::InvalidConfig`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingConfig {
    /// Whether pageable copies are staged at all (`OFFLOAD_STAGING=0` turns it off).
    pub enabled: bool,
    /// Bytes per chunk (and per pinned buffer): 4096 to 1 GiB, a multiple of 4096.
    pub chunk: usize,
    /// Buffers per direction: 2 (so that copying and DMA overlap) to 64.
    pub depth: usize,
    /// CPU threads copying into and out of the buffers: 1 to 1024.
    pub threads: usize,
    /// Copies smaller than this go straight to the driver.
    pub min_bytes: usize,
    /// A copy is cut into at least this many chunks (so its first and last chunk, which
    /// cannot overlap, are a small part of it), down to 2 MiB chunks; at least 1. Two, not
    /// more: in a pipeline the other direction's copies fill the gaps that fewer chunks
    /// leave, and larger chunks give every copy thread a piece (a 32 MiB batch in 8 MiB
    /// chunks kept half of 16 threads idle: docs/PERFORMANCE.md, issue 29).
    pub min_chunks: usize,
    /// Smallest piece of a chunk one copy thread takes; at least 1 byte.
    pub min_piece: usize,
    /// Whether device->host copies out of the pinned buffers write the caller's memory
    /// with non-temporal (streaming) stores on x86_64 (`OFFLOAD_STREAMING_STORES=0|1`):
    /// ordinary stores would first read every destination line into the cache, which a
    /// fresh output is not read from again soon. Host->device copies into the buffers
    /// always use ordinary stores (the buffers stay cached for the DMA engine), and so
    /// does every copy elsewhere than x86_64.
    pub streaming_stores: bool,
    /// How many copy threads fault in a device->host copy's destination pages before the
    /// copy (`MADV_POPULATE_WRITE`, Linux; `OFFLOAD_POPULATE_THREADS`): 0 to 1024, 0 for
    /// none (the copies then fault fresh pages in as they write them), more than the
    /// copy-out crew's threads meaning all of them (the default, 1024).
    pub populate_threads: usize,
    /// Whether the copy threads form two crews, one per direction (`OFFLOAD_SPLIT_CREWS=0|1`;
    /// with at least 2 threads; the default): a batch's copy-in and another's copy-out then
    /// run at once, each on half the threads, instead of taking turns with all of them
    /// (TF32 pipeline 4-6% faster on the H200: docs/PERFORMANCE.md).
    pub split_crews: bool,
    /// Register-in-place policy: a mapped range of at least `register_min_bytes` is
    /// page-locked where it is once it has been copied `register_after` times (and
    /// unlocked when it is unmapped), since pinning costs about as much as that many
    /// staged copies save (see the transfer table in docs/PERFORMANCE.md).
    pub register_after: u32,
    /// See `register_after`.
    pub register_min_bytes: usize,
}

impl Default for StagingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            chunk: 16 << 20,
            depth: 4,
            threads: 24,
            min_bytes: 16 << 20,
            min_chunks: 2,
            min_piece: 1 << 20,
            streaming_stores: true,
            populate_threads: 1024,
            split_crews: true,
            register_after: 16,
            register_min_bytes: 64 << 20,
        }
    }
}

impl StagingConfig {
    /// The chunk for a copy of `bytes`: small enough that a copy has `min_chunks` chunks to
    /// overlap (down to 2 MiB), never above `chunk`.
    pub(crate) fn chunk_for(&self, bytes: usize, chunk: usize) -> usize {
        (bytes / self.min_chunks.max(1)).next_multiple_of(4096).clamp((2 << 20).min(chunk), chunk)
    }

    /// How `threads` copy threads (at least 1) make up a ring's crews: the copy-in (or
    /// only) crew's size, and the copy-out crew's when [`StagingConfig::split_crews`]
    /// splits them (with at least 2 threads; the out crew the smaller half).
    pub(crate) fn crew_sizes(&self, threads: usize) -> (usize, Option<usize>) {
        let threads = threads.max(1);
        if self.split_crews && threads >= 2 {
            (threads - threads / 2, Some(threads / 2))
        } else {
            (threads, None)
        }
    }
}

/// A device's staging buffers, both directions.
pub(crate) struct StagingRing {
    to_device: Mutex<Vec<PinnedMemory>>,
    from_device: Mutex<Vec<PinnedMemory>>,
    chunk: usize,
    cfg: StagingConfig,
    /// Copies into the buffers, and out of them too unless `crew_out` is there.
    crew: CopyCrew,
    /// Copies out of the buffers, when the copy threads are split in two crews.
    crew_out: Option<CopyCrew>,
    node: Option<usize>,
    bound: bool,
}

impl fmt::Debug for StagingRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// A raw pointer that may cross to copy threads; every use is bounded by one transfer.
#[derive(Clone, Copy)]
struct Ptr(*mut u8);
// SAFETY: each transfer hands disjoint sub-ranges to the copy threads and waits for them.
unsafe impl Send for Ptr {}
// SAFETY: as above.
unsafe impl Sync for Ptr {}

impl StagingRing {
    /// Allocates the ring; call on the device's bound worker so that first touch lands on
    /// its node. `crew_out`, when given, copies out of the buffers and `crew` only into them.
    pub(crate) fn new(
        device: usize,
        cfg: &StagingConfig,
        node: Option<usize>,
        topo: &Topology,
        backend: &Arc<dyn Backend>,
        crew: CopyCrew,
        crew_out: Option<CopyCrew>,
    ) -> Result<Self> {
        let depth = cfg.depth.max(2);
        let mut bound = true;
        let mut make = || -> Result<Vec<PinnedMemory>> {
            (0..depth)
                .map(|_| {
                    let mut b = PinnedMemory::allocate(device, cfg.chunk, PAGE, node.map(|n| (n, topo)))?;
                    b.lock(backend, None)?;
                    bound &= b.is_bound();
                    Ok(b)
                })
                .collect()
        };
        let (to_device, from_device) = (make()?, make()?);
        Ok(Self {
            to_device: Mutex::new(to_device),
            from_device: Mutex::new(from_device),
            chunk: cfg.chunk,
            cfg: *cfg,
            crew,
            crew_out,
            node,
            bound: bound && node.is_some(),
        })
    }

    /// One line for the device report.
    pub(crate) fn describe(&self) -> String {
        let depth = self.to_device.lock().len();
        let pinned = self.to_device.lock().first().is_some_and(PinnedMemory::is_locked);
        format!(
            "staging: {depth}+{depth} buffers of {} MiB ({}), node {}, {}{}",
            self.chunk >> 20,
            if pinned { "page-locked" } else { "not page-locked" },
            match (self.node, self.bound) {
                (Some(n), true) => format!("{n} (bound)"),
                (Some(n), false) => format!("{n} (binding refused: first touch by the bound worker)"),
                (None, _) => "unknown (first touch by the worker)".into(),
            },
            match &self.crew_out {
                Some(out) => format!("{}+{} copy threads (in+out)", self.crew.threads(), out.threads()),
                None => format!("{} copy threads", self.crew.threads()),
            },
            if self.cfg.streaming_stores && cfg!(target_arch = "x86_64") {
                " (streaming stores out)"
            } else {
                ""
            }
        )
    }

    /// The first staging buffer, for placement checks.
    pub(crate) fn with_first_buffer<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let bufs = self.to_device.lock();
        // SAFETY: the lock keeps transfers out while `f` reads it.
        f(unsafe { bufs[0].as_slice() })
    }

    /// The crew that copies out of the buffers.
    fn out_crew(&self) -> &CopyCrew {
        self.crew_out.as_ref().unwrap_or(&self.crew)
    }

    /// Copies with all copy threads of a direction's crew (pieces of at least `min_piece`):
    /// `dst[..n] = src[..n]`; `out` (out of a buffer into the caller's memory) with
    /// streaming stores when the config asks.
    ///
    /// # Safety
    /// Both ranges valid for `n` bytes, disjoint, `dst` not otherwise accessed meanwhile.
    unsafe fn parallel_copy(&self, dst: Ptr, src: Ptr, n: usize, out: bool) {
        let (crew, streaming) =
            if out { (self.out_crew(), self.cfg.streaming_stores) } else { (&self.crew, false) };
        // SAFETY: forwarded from the caller.
        unsafe { crew.copy(dst.0, src.0.cast_const(), n, streaming) }
    }

    /// The copy-in pipeline: for each chunk, `fill(buffer, offset, len)` puts the chunk's
    /// bytes into a free pinned buffer, then `owner` DMAs it to `dst + offset` on its
    /// copy-in queue while the next chunk is filled; each buffer's DMA is followed by an
    /// event, and the buffer is filled again only once that event has completed. Every
    /// slot is drained before returning, also after an error or a panic, so no DMA
    /// outlives the call.
    ///
    /// # Safety
    /// `dst..dst+bytes` is `owner`'s memory; `fill` writes at most `len` bytes to `buffer`.
    unsafe fn pipeline_in(
        &self,
        owner: &dyn Backend,
        dst: u64,
        bytes: usize,
        mut fill: impl FnMut(*mut u8, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let bufs = self.to_device.lock();
        let depth = bufs.len();
        let chunk = self.cfg.chunk_for(bytes, self.chunk);
        let chunks = bytes.div_ceil(chunk);
        let mut slots = Slots::new(owner, depth);
        let mut step = |i: usize| -> Result<()> {
            let slot = i % depth;
            let (off, n) = (i * chunk, chunk.min(bytes - i * chunk));
            // The buffer is free once its previous DMA has finished.
            slots.wait(slot)?;
            // The buffer holds `chunk >= n` bytes and no DMA reads it now.
            fill(bufs[slot].as_ptr(), off, n)?;
            // SAFETY: the buffer stays untouched until this slot's event has completed
            // (`slots` waits for it before the buffer's next use and before returning);
            // `dst + off` is the caller's.
            unsafe { owner.enqueue_write(Queue::CopyIn, dst + off as u64, bufs[slot].as_ptr(), n)? };
            slots.started(slot, owner.record(Queue::CopyIn))
        };
        let result = (0..chunks).try_for_each(&mut step);
        result.and(slots.drain())
    }

    /// The copy-out pipeline: `owner` DMAs chunk after chunk from `src` into the pinned
    /// buffers on its copy-out queue, `depth` in flight, each followed by an event, and
    /// `drain(buffer, offset, len)` takes each chunk out once its event has completed.
    /// Drained as [`StagingRing::pipeline_in`].
    ///
    /// # Safety
    /// `src..src+bytes` is `owner`'s memory; `drain` reads at most `len` bytes of `buffer`.
    unsafe fn pipeline_out(
        &self,
        owner: &dyn Backend,
        src: u64,
        bytes: usize,
        mut drain: impl FnMut(*const u8, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let bufs = self.from_device.lock();
        let depth = bufs.len();
        let chunk = self.cfg.chunk_for(bytes, self.chunk);
        let chunks = bytes.div_ceil(chunk);
        let span = |i: usize| (i * chunk, chunk.min(bytes - i * chunk));
        let mut slots = Slots::new(owner, depth);
        let issue = |slots: &mut Slots<'_>, i: usize| -> Result<()> {
            let (off, n) = span(i);
            let slot = i % depth;
            // SAFETY: the slot's buffer is not read until its event has completed; `src +
            // off` is the caller's.
            unsafe { owner.enqueue_read(Queue::CopyOut, bufs[slot].as_ptr(), src + off as u64, n)? };
            slots.started(slot, owner.record(Queue::CopyOut))
        };
        let mut run = || -> Result<()> {
            for i in 0..depth.min(chunks) {
                issue(&mut slots, i)?;
            }
            for i in 0..chunks {
                let slot = i % depth;
                slots.wait(slot)?;
                let (off, n) = span(i);
                // The DMA into this buffer has completed.
                drain(bufs[slot].as_ptr(), off, n)?;
                if i + depth < chunks {
                    issue(&mut slots, i + depth)?;
                }
            }
            Ok(())
        };
        let result = run();
        result.and(slots.drain())
    }

    /// Host->device: `bytes` from pageable `src` to device address `dst`, the crew
    /// copying each chunk into a buffer.
    ///
    /// # Safety
    /// `src` valid for reads of `bytes`; `dst..dst+bytes` is the device's memory.
    pub(crate) unsafe fn write(
        &self,
        backend: &dyn Backend,
        dst: u64,
        src: *const u8,
        bytes: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller; each fill copies `n` bytes of the source.
        unsafe {
            self.pipeline_in(backend, dst, bytes, |buf, off, n| {
                // Into the ring: it stays in the cache for the DMA to read (streaming stores
                // were slower here on the H200: docs/PERFORMANCE.md).
                self.parallel_copy(Ptr(buf), Ptr(src.add(off).cast_mut()), n, false);
                Ok(())
            })
        }
    }

    /// Device->host: `bytes` from device address `src` into pageable `dst`, the crew
    /// copying each chunk out of its buffer.
    ///
    /// # Safety
    /// `dst` valid for writes of `bytes` and not otherwise accessed during the call.
    pub(crate) unsafe fn read(
        &self,
        backend: &dyn Backend,
        dst: *mut u8,
        src: u64,
        bytes: usize,
    ) -> Result<()> {
        // Fresh destination pages are faulted in by the crew first (the copies below would
        // fault them 4 KiB at a time, a few threads per chunk).
        self.out_crew().populate(dst, bytes, self.cfg.populate_threads);
        // SAFETY: forwarded from the caller; each drain copies `n` bytes into `dst + off`.
        unsafe {
            self.pipeline_out(backend, src, bytes, |buf, off, n| {
                self.parallel_copy(Ptr(dst.add(off)), Ptr(buf.cast_mut()), n, true);
                Ok(())
            })
        }
    }

    /// Device->device through this ring's copy-out buffers when the ring is the source
    /// device's: `owner` (the source) DMAs chunk after chunk into the buffers and each is
    /// written to `dst_backend` from there as it lands. Nothing is allocated per call.
    ///
    /// # Safety
    /// `src..src+bytes` is `owner`'s memory, `dst..dst+bytes` `dst_backend`'s.
    pub(crate) unsafe fn relay_out(
        &self,
        owner: &dyn Backend,
        src: u64,
        dst_backend: &dyn Backend,
        dst: u64,
        bytes: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller; the buffer holds the chunk's `n` bytes.
        unsafe {
            self.pipeline_out(owner, src, bytes, |buf, off, n| dst_backend.write(dst + off as u64, buf, n))
        }
    }

    /// Device->device through this ring's copy-in buffers when the ring is the destination
    /// device's: each chunk is read from `src_backend` into a buffer, then DMAed to `owner`
    /// (the destination) while the next is read.
    ///
    /// # Safety
    /// `src..src+bytes` is `src_backend`'s memory, `dst..dst+bytes` `owner`'s.
    pub(crate) unsafe fn relay_in(
        &self,
        src_backend: &dyn Backend,
        src: u64,
        owner: &dyn Backend,
        dst: u64,
        bytes: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller; the buffer has room for the chunk's `n` bytes.
        unsafe {
            self.pipeline_in(owner, dst, bytes, |buf, off, n| src_backend.read(buf, src + off as u64, n))
        }
    }
}

/// The events of a pipeline's in-flight DMAs, one slot per staging buffer: a buffer is
/// reused only once its slot's event has completed, and every slot is waited for before
/// the pipeline returns (on drop too, so that a panic cannot leave a DMA running into or
/// out of a buffer the ring hands out again).
struct Slots<'a> {
    owner: &'a dyn Backend,
    events: Vec<Option<Event>>,
}

impl<'a> Slots<'a> {
    fn new(owner: &'a dyn Backend, depth: usize) -> Self {
        Self { owner, events: (0..depth).map(|_| None).collect() }
    }

    /// Slot `slot`'s DMA was enqueued and `event` recorded after it.
    fn started(&mut self, slot: usize, event: Result<Event>) -> Result<()> {
        match event {
            Ok(e) => {
                self.events[slot] = Some(e);
                Ok(())
            }
            // Without an event the copy cannot be waited for alone: wait for the queues.
            Err(e) => Err(self.owner.synchronize().err().unwrap_or(e)),
        }
    }

    /// Waits until slot `slot`'s last DMA has completed.
    fn wait(&mut self, slot: usize) -> Result<()> {
        match self.events[slot].take() {
            Some(e) => self.owner.sync_event(&e),
            None => Ok(()),
        }
    }

    /// Waits for every slot (all of them, whatever fails); the first error.
    fn drain(&mut self) -> Result<()> {
        let mut first = Ok(());
        for slot in 0..self.events.len() {
            let r = self.wait(slot);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for Slots<'_> {
    fn drop(&mut self) {
        let _ = self.drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::host::tests::device;
    use crate::error::Error;

    /// A ring over a host device with one crew of 3 copy threads, copying out with
    /// streaming stores when asked.
    fn ring(chunk: usize, depth: usize, streaming: bool) -> (Arc<dyn Backend>, StagingRing) {
        ring_with(StagingConfig {
            chunk,
            depth,
            threads: 3,
            streaming_stores: streaming,
            split_crews: false,
            ..StagingConfig::default()
        })
    }

    /// A ring over a host device as `cfg` asks: `cfg.threads` copy threads, in one crew or,
    /// with `split_crews`, in two (the out crew the smaller).
    fn ring_with(cfg: StagingConfig) -> (Arc<dyn Backend>, StagingRing) {
        let d: Arc<dyn Backend> = Arc::new(device(1 << 30));
        let topo = Topology::system();
        let cpus = topo.whole_machine("test").cpus;
        let spawn = |threads: usize| {
            CopyCrew::spawn("test", Some((Topology::system(), cpus.clone())), threads - 1, 4096).unwrap()
        };
        let (crew_in, crew_out) = cfg.crew_sizes(cfg.threads);
        let (crew, crew_out) = (spawn(crew_in), crew_out.map(spawn));
        assert_eq!(cfg.chunk_for(1 << 30, cfg.chunk), cfg.chunk);
        assert!(cfg.chunk_for(3 << 20, cfg.chunk) <= cfg.chunk);
        let r =
            StagingRing::new(0, &cfg, topo.numa_nodes().first().copied(), &topo, &d, crew, crew_out).unwrap();
        (d, r)
    }

    #[test]
    fn chunked_copies_round_trip_at_awkward_sizes() {
        // (chunk, depth, streaming stores, populating threads, two crews)
        for (chunk, depth, streaming, populate, split) in [
            (4096usize, 2usize, false, 1024usize, false),
            (8192, 3, true, 1, true),
            (1 << 20, 2, false, 0, false),
            (1 << 20, 2, true, 2, true),
        ] {
            let (d, r) = ring_with(StagingConfig {
                chunk,
                depth,
                threads: 3,
                streaming_stores: streaming,
                populate_threads: populate,
                split_crews: split,
                ..StagingConfig::default()
            });
            for bytes in [1usize, 4095, 4096, 4097, 3 * chunk + 17, 7 * chunk, (9 << 20) + 3] {
                let src: Vec<u8> = (0..bytes).map(|i| (i * 7 + bytes) as u8).collect();
                let mut back = vec![0u8; bytes];
                let p = d.alloc(bytes).unwrap();
                // SAFETY: `src`, `back` and `p` all hold `bytes` bytes.
                unsafe {
                    r.write(&*d, p, src.as_ptr(), bytes).unwrap();
                    r.read(&*d, back.as_mut_ptr(), p, bytes).unwrap();
                }
                let what = format!("chunk {chunk} depth {depth} streaming {streaming} populate {populate}");
                assert!(back == src, "{what} split {split} bytes {bytes}");
                d.free(p, bytes).unwrap();
            }
            drop(r);
        }
    }

    /// With two crews, a copy in and a copy out run at the same time, each whole.
    #[test]
    fn split_crews_copy_both_ways_at_once() {
        let cfg = StagingConfig {
            chunk: 8192,
            depth: 2,
            threads: 4,
            split_crews: true,
            ..StagingConfig::default()
        };
        let (d, r) = ring_with(cfg);
        let s = r.describe();
        assert!(s.contains("2+2 copy threads (in+out)"), "{s}");
        let bytes = 5 * 8192 + 3;
        let (p_in, p_out) = (d.alloc(bytes).unwrap(), d.alloc(bytes).unwrap());
        let out_src: Vec<u8> = (0..bytes).map(|i| (i % 253) as u8).collect();
        // SAFETY: `p_out` and `out_src` hold `bytes` bytes.
        unsafe { r.write(&*d, p_out, out_src.as_ptr(), bytes).unwrap() };
        for round in 0..20u8 {
            let in_src = vec![round; bytes];
            let mut back = vec![0u8; bytes];
            std::thread::scope(|sc| {
                // SAFETY: `p_in` and `in_src` hold `bytes` bytes; only this thread uses `p_in`.
                sc.spawn(|| unsafe { r.write(&*d, p_in, in_src.as_ptr(), bytes).unwrap() });
                // SAFETY: `back` and `p_out` hold `bytes` bytes; only this thread writes `back`.
                sc.spawn(|| unsafe { r.read(&*d, back.as_mut_ptr(), p_out, bytes).unwrap() });
            });
            assert!(back == out_src, "round {round}: the copy out");
            let mut landed = vec![0u8; bytes];
            // SAFETY: as above.
            unsafe { r.read(&*d, landed.as_mut_ptr(), p_in, bytes).unwrap() };
            assert!(landed == in_src, "round {round}: the copy in");
        }
        d.free(p_in, bytes).unwrap();
        d.free(p_out, bytes).unwrap();
        drop(r);
    }

    #[test]
    fn device_to_device_relays_through_either_devices_ring() {
        for (chunk, depth) in [(4096usize, 2usize), (8192, 3)] {
            let (a, r) = ring(chunk, depth, false);
            let b = device(1 << 30);
            for bytes in [1usize, 4097, 3 * chunk + 17, 7 * chunk] {
                let src: Vec<u8> = (0..bytes).map(|i| (i * 13 + bytes) as u8).collect();
                let mut back = vec![0u8; bytes];
                let (pa, pb) = (a.alloc(bytes).unwrap(), b.alloc(bytes).unwrap());
                // SAFETY: every range holds `bytes` bytes on its device.
                unsafe {
                    a.write(pa, src.as_ptr(), bytes).unwrap();
                    // a -> b through a's copy-out buffers, then back through a's copy-in ones.
                    r.relay_out(&*a, pa, &b, pb, bytes).unwrap();
                    a.write(pa, back.as_ptr(), bytes).unwrap();
                    r.relay_in(&b, pb, &*a, pa, bytes).unwrap();
                    a.read(back.as_mut_ptr(), pa, bytes).unwrap();
                }
                assert!(back == src, "chunk {chunk} depth {depth} bytes {bytes}");
                a.free(pa, bytes).unwrap();
                b.free(pb, bytes).unwrap();
            }
            // A destination too short fails after the first chunk, with every slot drained.
            let (pa, pb) = (a.alloc(5 * chunk).unwrap(), b.alloc(chunk).unwrap());
            // SAFETY: the destination's backend refuses the bytes past its allocation.
            let e = unsafe { r.relay_out(&*a, pa, &b, pb, 5 * chunk) }.unwrap_err();
            assert!(matches!(e, Error::UnknownDevicePointer { .. }), "{e}");
            // SAFETY: one chunk into a one-chunk allocation.
            unsafe { r.relay_out(&*a, pa, &b, pb, chunk) }.unwrap();
            a.free(pa, 5 * chunk).unwrap();
            b.free(pb, chunk).unwrap();
            drop(r);
        }
    }

    #[test]
    fn a_failing_copy_is_an_error_and_leaves_no_slot_busy() {
        let (d, r) = ring(4096, 2, false);
        let src = vec![1u8; 5 * 4096];
        let p = d.alloc(4096).unwrap();
        // SAFETY: the device range is too short: the backend refuses the second chunk
        // before any byte moves there.
        let e = unsafe { r.write(&*d, p, src.as_ptr(), src.len()) }.unwrap_err();
        assert!(matches!(e, Error::UnknownDevicePointer { .. }), "{e}");
        // The ring still works afterwards.
        // SAFETY: one chunk into a one-chunk allocation.
        unsafe { r.write(&*d, p, src.as_ptr(), 4096) }.unwrap();
        d.free(p, 4096).unwrap();
        drop(r);
    }

    #[test]
    fn default_chunks_are_large_enough_for_every_copy_thread() {
        let cfg = StagingConfig::default();
        let mib = |n: usize| n << 20;
        // A 32 MiB batch goes in two 16 MiB chunks: 1 MiB pieces for 16 threads.
        assert_eq!(cfg.chunk_for(mib(32), cfg.chunk), mib(16));
        assert_eq!(cfg.chunk_for(mib(16), cfg.chunk), mib(8));
        // Never above the buffers, never below 2 MiB.
        assert_eq!(cfg.chunk_for(mib(1024), cfg.chunk), cfg.chunk);
        assert_eq!(cfg.chunk_for(mib(3), cfg.chunk), mib(2));
    }

    #[test]
    fn copy_threads_split_into_two_crews_only_when_asked_and_possible() {
        let split = StagingConfig { split_crews: true, ..StagingConfig::default() };
        let one = StagingConfig { split_crews: false, ..StagingConfig::default() };
        for (threads, two, single) in [
            (0usize, (1usize, None), (1usize, None)),
            (1, (1, None), (1, None)),
            (2, (1, Some(1)), (2, None)),
        ] {
            assert_eq!(split.crew_sizes(threads), two, "{threads} threads, split");
            assert_eq!(one.crew_sizes(threads), single, "{threads} threads");
        }
        assert_eq!(split.crew_sizes(3), (2, Some(1)));
        assert_eq!(split.crew_sizes(16), (8, Some(8)));
    }

    #[test]
    fn describes_its_set_up() {
        let (_d, r) = ring(1 << 20, 2, false);
        let s = r.describe();
        assert!(s.contains("2+2 buffers of 1 MiB") && s.contains("3 copy threads"), "{s}");
        assert!(!s.contains("streaming"), "{s}");
        drop(r);
        let (_d, r) = ring(1 << 20, 2, true);
        let s = r.describe();
        assert_eq!(s.contains(" (streaming stores out)"), cfg!(target_arch = "x86_64"), "{s}");
        drop(r);
    }

    /// Only copies out of the buffers stream, and only when the config asks; with two
    /// crews, on the out crew.
    #[test]
    fn only_copies_out_stream() {
        for (streaming, split) in [(true, false), (false, false), (true, true)] {
            let cfg = StagingConfig {
                chunk: 8192,
                depth: 2,
                threads: 4,
                streaming_stores: streaming,
                split_crews: split,
                ..StagingConfig::default()
            };
            let (d, r) = ring_with(cfg);
            let bytes = 3 * 8192;
            let src = vec![5u8; bytes];
            let mut back = vec![0u8; bytes];
            let p = d.alloc(bytes).unwrap();
            // SAFETY: `src` and `p` hold `bytes` bytes.
            unsafe { r.write(&*d, p, src.as_ptr(), bytes).unwrap() };
            let after_in = (r.crew.streamed_pieces(), r.out_crew().streamed_pieces());
            assert_eq!(after_in, (0, 0), "streaming {streaming} split {split}: a copy in streamed");
            // SAFETY: `back` and `p` hold `bytes` bytes.
            unsafe { r.read(&*d, back.as_mut_ptr(), p, bytes).unwrap() };
            assert!(back == src);
            let streamed = r.out_crew().streamed_pieces();
            assert_eq!(streamed > 0, streaming, "streaming {streaming} split {split}: {streamed} pieces");
            if split {
                assert_eq!(r.crew.streamed_pieces(), 0, "the copy out ran on the in crew");
            }
            d.free(p, bytes).unwrap();
            drop(r);
        }
    }
}
