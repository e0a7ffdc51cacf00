//! Page-locked host memory, written once. Two things become pinned, each by one type here:
//!
//! - memory the runtime owns ([`PinnedMemory`]): the staging rings' buffers, the bounce
//!   slots that small queued copies start from, and [`crate::HostBuffer`]s. It is allocated
//!   page-aligned, bound to a NUMA node before its first touch when asked, touched by the
//!   calling thread (a device's bound worker, so that the pages land next to the device),
//!   page-locked with one device's driver where it can be, and unlocked and freed when
//!   dropped;
//! - memory the program owns, page-locked in place ([`crate::Runtime::pin`], a `HostBuffer`,
//!   a mapped range the staging policy locks after repeated large copies): recorded in the
//!   runtime's [`PinnedRanges`] by [`PinnedRanges::lock`] and forgotten by
//!   [`PinnedRanges::unlock`], so that copies from it skip staging and
//!   `omp_target_is_accessible` can say it is.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::backend::{Backend, BackendKind};
use crate::error::{Error, Result};
use crate::range::HostRange;
use crate::topology::Topology;

/// The unit page-locking works on; runtime-owned pinned memory is aligned to it.
pub(crate) const PAGE: usize = 4096;

/// Host ranges page-locked for the runtime's devices in place ([`crate::Runtime::pin`],
/// `HostBuffer`s, mapped ranges locked by the staging policy): copies from them go straight
/// to the DMA engine. Shared by every device of a runtime.
#[derive(Default)]
pub(crate) struct PinnedRanges(RwLock<BTreeMap<usize, (usize, BackendKind)>>);

impl PinnedRanges {
    /// Page-locks `[ptr, ptr+bytes)` with `backend`'s driver and records it; whether the
    /// driver did (host devices and drivers that refuse leave nothing recorded).
    ///
    /// # Safety
    /// The memory stays allocated until [`PinnedRanges::unlock`] with the same backend.
    pub(crate) unsafe fn lock(&self, backend: &dyn Backend, ptr: *mut u8, bytes: usize) -> bool {
        // SAFETY: forwarded from the caller.
        let locked = matches!(unsafe { backend.register_host(ptr, bytes) }, Ok(true));
        if locked {
            self.0.write().insert(ptr as usize, (bytes, backend.description().kind));
        }
        locked
    }

    /// Forgets the range at `ptr` and unlocks it with `backend`, which locked it.
    ///
    /// # Safety
    /// `ptr` was locked by [`PinnedRanges::lock`] with `backend`, and no copy on it is in
    /// flight.
    pub(crate) unsafe fn unlock(&self, backend: &dyn Backend, ptr: *mut u8) {
        self.0.write().remove(&(ptr as usize));
        // SAFETY: forwarded from the caller. A failure leaves the pages locked until the
        // process ends; nothing reads them through the runtime any more.
        let _ = unsafe { backend.unregister_host(ptr) };
    }

    /// The backend that page-locked all of `r`, if one did.
    pub(crate) fn pinned_by(&self, r: HostRange) -> Option<BackendKind> {
        let map = self.0.read();
        let (&b, &(n, by)) = map.range(..=r.begin).next_back()?;
        (r.end() <= b + n).then_some(by)
    }

    /// Whether all of `r` is page-locked.
    pub(crate) fn contains(&self, r: HostRange) -> bool {
        self.pinned_by(r).is_some()
    }

    /// Every page-locked range, in address order.
    pub(crate) fn ranges(&self) -> Vec<HostRange> {
        self.0.read().iter().map(|(&b, &(n, _))| HostRange::new(b, n)).collect()
    }
}

/// Who page-locked a [`PinnedMemory`], so that its drop can unlock it.
struct Lock {
    backend: Arc<dyn Backend>,
    /// Where it is recorded when the program sees the memory (a `HostBuffer`).
    recorded_in: Option<Arc<PinnedRanges>>,
}

/// Page-aligned host memory the runtime owns, zeroed, page-locked by one device's driver
/// where it could be, and unlocked and freed when dropped.
pub(crate) struct PinnedMemory {
    ptr: NonNull<u8>,
    layout: Layout,
    lock: Option<Lock>,
    /// Bound to the NUMA node asked for (before the first touch).
    bound: bool,
}

// SAFETY: plain memory owned by this value, like a `Vec<u8>`; its users serialise access.
unsafe impl Send for PinnedMemory {}
// SAFETY: as above; `&PinnedMemory` hands out only a raw pointer.
unsafe impl Sync for PinnedMemory {}

impl PinnedMemory {
    /// `bytes` zeroed bytes (at least one), aligned to a page or to `align` if larger; bound to NUMA node `node` of `topo` before the first touch when
    /// given, and touched by the calling thread. Not page-locked yet: see
    /// [`PinnedMemory::lock`]. An error naming `device` when the size is too large or the
    /// memory is short.
    pub(crate) fn allocate(
        device: usize,
        bytes: usize,
        align: usize,
        node: Option<(usize, &Topology)>,
    ) -> Result<Self> {
        let layout = Layout::from_size_align(bytes.max(1), align.max(PAGE)).map_err(|e| {
            Error::InvalidArgument { routine: "pinned host memory", what: format!("{bytes} bytes: {e}") }
        })?;
        let Some((node, topo)) = node else {
            // SAFETY: non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            let ptr = NonNull::new(p).ok_or_else(|| Self::short(device, layout))?;
            return Ok(Self { ptr, layout, lock: None, bound: false });
        };
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        let ptr = NonNull::new(p).ok_or_else(|| Self::short(device, layout))?;
        // SAFETY: `layout.size()` bytes just allocated, viewed as not yet written.
        let area = unsafe { std::slice::from_raw_parts(p.cast::<MaybeUninit<u8>>(), layout.size()) };
        let bound = topo.bind_area(area, &[node]);
        // First touch: zeroing the pages places them (on the bound node when binding
        // worked, else on the toucher's).
        // SAFETY: the whole allocation.
        unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
        Ok(Self { ptr, layout, lock: None, bound })
    }

    fn short(device: usize, layout: Layout) -> Error {
        Error::OutOfMemory { device, requested: layout.size(), free: 0, total: 0 }
    }

    /// Page-locks the memory with `backend`'s driver (recorded in `ranges` when the program
    /// sees the memory); whether the driver did (`false` where the device has no such
    /// notion). The driver's error comes back for the runtime's own memory; memory the
    /// program sees is only recorded where a driver locked it. Once locked, a further lock
    /// does nothing and says yes.
    pub(crate) fn lock(
        &mut self,
        backend: &Arc<dyn Backend>,
        ranges: Option<&Arc<PinnedRanges>>,
    ) -> Result<bool> {
        if self.lock.is_some() {
            return Ok(true);
        }
        let (p, n) = (self.ptr.as_ptr(), self.layout.size());
        let locked = match ranges {
            // SAFETY: the memory is allocated until `drop`, which unlocks it first.
            Some(r) => unsafe { r.lock(&**backend, p, n) },
            // SAFETY: as above.
            None => unsafe { backend.register_host(p, n)? },
        };
        if locked {
            self.lock = Some(Lock { backend: Arc::clone(backend), recorded_in: ranges.cloned() });
        }
        Ok(locked)
    }

    /// The first byte.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The first byte, never null.
    pub(crate) fn start(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Whether a driver page-locked it.
    pub(crate) fn is_locked(&self) -> bool {
        self.lock.is_some()
    }

    /// Whether it was bound to the NUMA node asked for.
    pub(crate) fn is_bound(&self) -> bool {
        self.bound
    }

    /// The memory as bytes.
    ///
    /// # Safety
    /// No one writes it while the slice lives (a DMA included).
    pub(crate) unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialised (zeroed) bytes; the caller keeps writers out.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl std::fmt::Debug for PinnedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedMemory")
            .field("at", &self.ptr)
            .field("bytes", &self.layout.size())
            .field("locked", &self.is_locked())
            .field("bound", &self.bound)
            .finish()
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        // Its owners drop it only once no copy reads or writes it (every transfer waits;
        // queued work is settled before a device's state drops).
        if let Some(lock) = self.lock.take() {
            match &lock.recorded_in {
                // SAFETY: locked by `lock` with this backend; no copy is in flight.
                Some(r) => unsafe { r.unlock(&*lock.backend, self.ptr.as_ptr()) },
                // SAFETY: as above.
                None => drop(unsafe { lock.backend.unregister_host(self.ptr.as_ptr()) }),
            }
        }
        // SAFETY: allocated in `allocate` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::memory_pool::tests::device;

    #[test]
    fn memory_is_aligned_zeroed_and_of_the_size_asked() {
        let topo = Topology::system();
        for node in [None, topo.numa_nodes().first().map(|&n| (n, &*topo))] {
            let m = PinnedMemory::allocate(0, 10_000, 1, node).unwrap();
            assert_eq!(m.as_ptr() as usize % PAGE, 0);
            // SAFETY: no one writes it.
            let bytes = unsafe { m.as_slice() };
            assert_eq!(bytes.len(), 10_000);
            assert!(bytes.iter().all(|&b| b == 0));
            assert!(!m.is_locked());
        }
        let empty = PinnedMemory::allocate(0, 0, 1, None).unwrap();
        // SAFETY: no one writes it.
        assert_eq!(unsafe { empty.as_slice() }.len(), 1);
        let wide = PinnedMemory::allocate(0, 64, 1 << 16, None).unwrap();
        assert_eq!(wide.as_ptr() as usize % (1 << 16), 0);
    }

    #[test]
    fn an_impossible_size_is_refused_by_name() {
        let e = PinnedMemory::allocate(3, usize::MAX - 10, 1, None).unwrap_err();
        assert!(e.to_string().contains("pinned host memory"), "{e}");
    }

    #[test]
    fn memory_is_unlocked_before_it_is_freed_and_forgotten_when_recorded() {
        let counting = Arc::new(device(1 << 20));
        let backend: Arc<dyn Backend> = counting.clone();
        let ranges = Arc::new(PinnedRanges::default());
        let mut own = PinnedMemory::allocate(0, 8192, 1, None).unwrap();
        assert!(
            own.lock(&backend, None).unwrap() && own.lock(&backend, None).unwrap(),
            "a second lock is a no-op"
        );
        let mut seen = PinnedMemory::allocate(0, 100, 1, None).unwrap();
        assert!(seen.lock(&backend, Some(&ranges)).unwrap());
        let (own_at, seen_at) = (own.as_ptr() as usize, seen.as_ptr() as usize);
        assert_eq!(*counting.locked.lock(), vec![(own_at, 8192), (seen_at, 100)]);
        assert_eq!(ranges.ranges(), vec![HostRange::new(seen_at, 100)], "only the program's is recorded");
        drop(seen);
        assert!(ranges.ranges().is_empty());
        drop(own);
        assert!(counting.locked.lock().is_empty());
    }

    #[test]
    fn a_refused_lock_is_an_error_for_own_memory_and_leaves_nothing_recorded() {
        let counting = Arc::new(device(1 << 20));
        counting.refuse_locks.store(true, std::sync::atomic::Ordering::Relaxed);
        let backend: Arc<dyn Backend> = counting.clone();
        let ranges = Arc::new(PinnedRanges::default());
        let mut own = PinnedMemory::allocate(0, 4096, 1, None).unwrap();
        assert!(own.lock(&backend, None).is_err() && !own.is_locked());
        let mut seen = PinnedMemory::allocate(0, 4096, 1, None).unwrap();
        assert!(!seen.lock(&backend, Some(&ranges)).unwrap() && !seen.is_locked());
        assert!(ranges.ranges().is_empty() && counting.locked.lock().is_empty());
    }

    #[test]
    fn ranges_lock_and_unlock_in_place() {
        let counting = device(1 << 20);
        let ranges = PinnedRanges::default();
        let mut data = vec![0u8; 300];
        // SAFETY: `data` outlives the lock, undone below.
        assert!(unsafe { ranges.lock(&counting, data.as_mut_ptr(), 300) });
        assert!(ranges.contains(HostRange::new(data.as_ptr() as usize + 10, 290)));
        // SAFETY: locked above; no copy.
        unsafe { ranges.unlock(&counting, data.as_mut_ptr()) };
        assert!(ranges.ranges().is_empty() && counting.locked.lock().is_empty());
        let host = crate::backend::host::tests::device(1 << 20);
        // SAFETY: as above; a host device locks nothing.
        assert!(!unsafe { ranges.lock(&host, data.as_mut_ptr(), 300) });
        assert!(ranges.ranges().is_empty());
    }

    #[test]
    fn ranges_answer_for_whole_ranges_only() {
        let r = PinnedRanges::default();
        r.0.write().insert(4096, (8192, BackendKind::Cuda));
        assert_eq!(r.pinned_by(HostRange::new(4096, 8192)), Some(BackendKind::Cuda));
        assert!(r.contains(HostRange::new(8192, 100)));
        assert!(!r.contains(HostRange::new(8192, 8192)));
        assert!(!r.contains(HostRange::new(0, 10)));
        assert_eq!(r.ranges(), vec![HostRange::new(4096, 8192)]);
    }
}
