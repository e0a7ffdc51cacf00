//! A device memory pool above the backends: freed blocks are kept by size class and
//! handed out again, so a map/unmap loop does not pay the driver's allocation cost.
//!
//! Sizes round to a size class: up to [`EXACT_CLASSES`] bytes the size itself (in 256-byte
//! steps, the drivers' alignment), above it one of 8 classes per power of two, so a block
//! wastes at most 1/8 of itself (a 129 MiB map takes a 144 MiB block, not 256 MiB).
//! Blocks up to [`PoolConfig::max_block`] are pooled, larger ones go straight to the device. At most
//! [`PoolConfig::keep`] bytes of free blocks are kept (the release threshold); beyond that
//! freed blocks are returned. When the device runs out of memory the pool returns its cached
//! blocks and tries once more. Every live allocation is tracked, so freeing an unknown
//! pointer is an error and a kernel argument's extent is known.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use crate::backend::Backend;
use crate::error::{Error, Result};

/// How a device's memory pool behaves. [`crate::RuntimeBuilder::build`] refuses a field
/// outside the range its comment gives ([`crate::Error::InvalidConfig`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Whether freed blocks are kept at all (`OFFLOAD_MEMORY_POOL=0` turns it off).
    pub enabled: bool,
    /// Largest block size that is pooled: at most 1 TiB.
    pub max_block: usize,
    /// Most bytes of free blocks kept per device.
    pub keep: usize,
    /// Most bytes of device memory the runtime holds on each device, in live and kept
    /// blocks (at least 4096; `usize::MAX`, the default: as much as the device has). An
    /// allocation past it first gives back the kept blocks, then fails as the device would
    /// ([`Error::OutOfMemory`] with the limit as the total), so that a program, or a test
    /// of its out-of-memory paths, can run as if the device were smaller.
    pub limit: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self { enabled: true, max_block: 256 << 20, keep: 1 << 30, limit: usize::MAX }
    }
}

/// Who an allocation belongs to: a user's `omp_target_alloc`, or the runtime's device
/// copy of a mapped range (which only unmapping may free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// `omp_target_alloc` / [`crate::Runtime::target_alloc`].
    User,
    /// A present-table entry's device copy.
    Mapping,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    /// Bytes the caller asked for.
    bytes: usize,
    /// Bytes really allocated (the size class, or `bytes` when not pooled).
    capacity: usize,
    owner: Owner,
}

/// A block [`MemoryPool::take`] took out of the live set, to hand to
/// [`MemoryPool::give_back`].
#[derive(Debug)]
#[must_use = "the block is lost unless given back"]
pub(crate) struct TakenBlock {
    addr: u64,
    block: Block,
}

#[derive(Default)]
struct PoolState {
    live: BTreeMap<u64, Block>,
    free: HashMap<usize, Vec<u64>>,
    cached: usize,
    /// Bytes allocated from the device: live and cached blocks' capacities, and those
    /// being allocated (reserved before the driver call, against [`PoolConfig::limit`]).
    held: usize,
}

/// One device's pool. See the module documentation.
pub(crate) struct MemoryPool {
    config: PoolConfig,
    /// The device's number, for errors.
    device: usize,
    state: Mutex<PoolState>,
}

/// The granularity of the exact classes: the drivers' allocation alignment.
const MIN_CLASS: usize = 256;

/// Sizes up to this many bytes are pooled at their own size (rounded to 256 bytes); above
/// it, 8 classes per power of two.
pub(crate) const EXACT_CLASSES: usize = 64 << 10;

/// The block size a request of `bytes > 0` takes: `bytes` rounded up to 256 bytes up to
/// [`EXACT_CLASSES`], else to the next multiple of an eighth of the power of two below it
/// (`None` when that overflows).
pub(crate) fn size_class(bytes: usize) -> Option<usize> {
    if bytes <= EXACT_CLASSES {
        return Some(bytes.max(1).next_multiple_of(MIN_CLASS));
    }
    let step = (1usize << bytes.ilog2()) / 8;
    bytes.checked_next_multiple_of(step)
}

impl MemoryPool {
    pub(crate) fn new(config: PoolConfig, device: usize) -> Self {
        Self { config, device, state: Mutex::new(PoolState::default()) }
    }

    fn class_of(&self, bytes: usize) -> Option<usize> {
        (self.config.enabled && bytes <= self.config.max_block).then(|| size_class(bytes)).flatten()
    }

    /// Allocates `bytes > 0` on `backend` for `owner`.
    pub(crate) fn alloc(&self, backend: &dyn Backend, bytes: usize, owner: Owner) -> Result<u64> {
        let class = self.class_of(bytes);
        if let Some(c) = class {
            let mut s = self.state.lock();
            if let Some(addr) = s.free.get_mut(&c).and_then(Vec::pop) {
                s.cached -= c;
                s.live.insert(addr, Block { bytes, capacity: c, owner });
                return Ok(addr);
            }
        }
        let capacity = class.unwrap_or(bytes);
        self.reserve(backend, bytes, capacity)?;
        let addr = match backend.alloc(capacity) {
            // A failed trim fails the allocation too (its reservation given back below).
            Err(Error::OutOfMemory { .. }) if self.state.lock().cached > 0 => {
                self.trim(backend).and_then(|()| backend.alloc(capacity))
            }
            r => r,
        };
        let mut s = self.state.lock();
        match addr {
            Ok(addr) => {
                s.live.insert(addr, Block { bytes, capacity, owner });
                Ok(addr)
            }
            Err(e) => {
                s.held -= capacity;
                Err(e)
            }
        }
    }

    /// Counts `capacity` more bytes held, within [`PoolConfig::limit`]: past it, the kept
    /// blocks go back to the device first, and then it is out of memory.
    fn reserve(&self, backend: &dyn Backend, bytes: usize, capacity: usize) -> Result<()> {
        let limit = self.config.limit;
        let mut trimmed = false;
        loop {
            {
                let mut s = self.state.lock();
                if s.held.checked_add(capacity).is_some_and(|h| h <= limit) {
                    s.held += capacity;
                    return Ok(());
                }
                if trimmed || s.cached == 0 {
                    let free = limit.saturating_sub(s.held);
                    return Err(Error::OutOfMemory {
                        device: self.device,
                        requested: bytes,
                        free,
                        total: limit,
                    });
                }
            }
            self.trim(backend)?;
            trimmed = true;
        }
    }

    /// Frees an allocation that [`MemoryPool::alloc`] made for `owner`; returns the bytes it
    /// had. A block of another owner stays allocated and is an error (a user cannot free a
    /// mapped range's device copy from under its entry).
    pub(crate) fn free(
        &self,
        backend: &dyn Backend,
        device: usize,
        addr: u64,
        owner: Owner,
    ) -> Result<usize> {
        let taken = self.take(device, addr, owner)?;
        self.give_back(backend, taken)
    }

    /// The first half of [`MemoryPool::free`]: the block stops being live (no check or
    /// lookup finds it any more), without the backend call that may wait for the device.
    pub(crate) fn take(&self, device: usize, addr: u64, owner: Owner) -> Result<TakenBlock> {
        let mut s = self.state.lock();
        match s.live.get(&addr) {
            Some(b) if b.owner == owner => {}
            Some(b) => {
                return Err(Error::InvalidArgument {
                    routine: "omp_target_free",
                    what: format!(
                        "device {device}: {addr:#x} ({} bytes) is the device copy of a mapped range, \
                         not an omp_target_alloc block; unmap the range instead",
                        b.bytes
                    ),
                })
            }
            None => return Err(Error::UnknownDevicePointer { device, addr, routine: "target_free" }),
        }
        let block = s.live.remove(&addr).ok_or(Error::UnknownDevicePointer {
            device,
            addr,
            routine: "target_free",
        })?;
        Ok(TakenBlock { addr, block })
    }

    /// The second half of [`MemoryPool::free`]: keeps the block for reuse or gives it back
    /// to the device; returns the bytes it had.
    pub(crate) fn give_back(&self, backend: &dyn Backend, taken: TakenBlock) -> Result<usize> {
        let TakenBlock { addr, block } = taken;
        let mut s = self.state.lock();
        let pooled = self.class_of(block.bytes) == Some(block.capacity);
        if pooled && s.cached + block.capacity <= self.config.keep {
            s.cached += block.capacity;
            s.free.entry(block.capacity).or_default().push(addr);
            return Ok(block.bytes);
        }
        s.held -= block.capacity;
        drop(s);
        backend.free(addr, block.capacity)?;
        Ok(block.bytes)
    }

    /// Bytes from `addr` to the end of the live allocation that contains it.
    pub(crate) fn extent(&self, addr: u64) -> Option<usize> {
        let s = self.state.lock();
        let (&base, b) = s.live.range(..=addr).next_back()?;
        let end = base + b.bytes as u64;
        (addr < end || (addr == base && b.bytes == 0)).then(|| (end - addr) as usize)
    }

    /// Checks that `addr..addr+bytes` lies inside one live allocation, at the size it was
    /// asked for (a block in the free cache is not live): one descent of the tree under the
    /// lock. The error names the block found there, if any.
    pub(crate) fn check_range(
        &self,
        device: usize,
        routine: &'static str,
        addr: u64,
        bytes: usize,
    ) -> Result<()> {
        let s = self.state.lock();
        let found = match s.live.range(..=addr).next_back() {
            Some((&base, b)) => {
                let end = base + b.bytes as u64;
                match addr.checked_add(bytes as u64) {
                    Some(last) if last <= end && (addr < end || bytes == 0) => return Ok(()),
                    _ if addr < end => format!(
                        "the live block {base:#x}..{end:#x} ({} bytes) ends {} bytes short",
                        b.bytes,
                        (addr as u128 + bytes as u128) - end as u128
                    ),
                    _ => format!(
                        "the nearest live block below, {base:#x}..{end:#x}, ends before it: \
                         freed or never allocated"
                    ),
                }
            }
            None => "no live block at or below it: freed or never allocated".into(),
        };
        Err(Error::OutsideAllocation { device, routine, addr, bytes, found })
    }

    /// The owner of the live block containing `addr`, if any.
    pub(crate) fn owner_of(&self, addr: u64) -> Option<Owner> {
        let s = self.state.lock();
        let (&base, b) = s.live.range(..=addr).next_back()?;
        (addr < base + b.bytes as u64).then_some(b.owner)
    }

    /// Returns every cached free block to the device.
    pub(crate) fn trim(&self, backend: &dyn Backend) -> Result<()> {
        let blocks: Vec<(usize, u64)> = {
            let mut s = self.state.lock();
            s.held -= s.cached;
            s.cached = 0;
            s.free.drain().flat_map(|(c, v)| v.into_iter().map(move |a| (c, a))).collect()
        };
        blocks.into_iter().try_for_each(|(c, a)| backend.free(a, c))
    }

    /// Frees everything, live or cached (at runtime shutdown).
    pub(crate) fn release_all(&self, backend: &dyn Backend) -> Result<()> {
        let live: Vec<(u64, Block)> = {
            let mut s = self.state.lock();
            let live = std::mem::take(&mut s.live);
            s.held = s.cached;
            live.into_iter().collect()
        };
        for (a, b) in live {
            backend.free(a, b.capacity)?;
        }
        self.trim(backend)
    }

    /// Bytes held in free blocks.
    pub(crate) fn cached_bytes(&self) -> usize {
        self.state.lock().cached
    }

    /// Bytes in live blocks and bytes in free blocks kept for reuse.
    pub(crate) fn usage(&self) -> (usize, usize) {
        let s = self.state.lock();
        (s.held.saturating_sub(s.cached), s.cached)
    }

    /// Number of live allocations.
    pub(crate) fn live_count(&self) -> usize {
        self.state.lock().live.len()
    }

    /// Number of live allocations made for `owner`.
    pub(crate) fn live_count_of(&self, owner: Owner) -> usize {
        self.state.lock().live.values().filter(|b| b.owner == owner).count()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backend::{BackendKind, DeviceDescription, Event, MemInfo, Queue};
    use crate::kernel::{Kernel, KernelArg};

    /// A device that only counts: bytes (addresses without memory behind them) and the host
    /// ranges it page-locked, so the services' bookkeeping is tested with no driver, thread
    /// or FFI call (and under Miri).
    pub(crate) struct CountingDevice {
        description: DeviceDescription,
        capacity: usize,
        /// (bytes in use, next address).
        state: Mutex<(usize, u64)>,
        /// The host ranges page-locked now, as (start, bytes).
        pub(crate) locked: Mutex<Vec<(usize, usize)>>,
        /// Page-locking fails, as a driver's can.
        pub(crate) refuse_locks: std::sync::atomic::AtomicBool,
    }

    pub(crate) fn device(capacity: usize) -> CountingDevice {
        let description = DeviceDescription {
            kind: BackendKind::Host,
            name: "counting device".into(),
            pci_bus_id: None,
            uuid: None,
        };
        CountingDevice {
            description,
            capacity,
            state: Mutex::new((0, 0x1000)),
            locked: Mutex::new(Vec::new()),
            refuse_locks: Default::default(),
        }
    }

    fn no_memory<T>() -> Result<T> {
        Err(Error::InvalidArgument { routine: "CountingDevice", what: "has no memory to touch".into() })
    }

    impl Backend for CountingDevice {
        fn description(&self) -> &DeviceDescription {
            &self.description
        }
        fn number(&self) -> usize {
            0
        }
        fn renumber(&mut self, _number: usize) {}
        fn alloc(&self, bytes: usize) -> Result<u64> {
            let mut s = self.state.lock();
            if s.0 + bytes > self.capacity {
                let free = self.capacity - s.0;
                return Err(Error::OutOfMemory { device: 0, requested: bytes, free, total: self.capacity });
            }
            let addr = s.1;
            *s = (s.0 + bytes, s.1 + bytes.next_multiple_of(256) as u64);
            Ok(addr)
        }
        fn free(&self, _addr: u64, bytes: usize) -> Result<()> {
            self.state.lock().0 -= bytes;
            Ok(())
        }
        unsafe fn enqueue_write(&self, _q: Queue, _dst: u64, _src: *const u8, _bytes: usize) -> Result<()> {
            no_memory()
        }
        unsafe fn enqueue_read(&self, _q: Queue, _dst: *mut u8, _src: u64, _bytes: usize) -> Result<()> {
            no_memory()
        }
        fn enqueue_copy(&self, _q: Queue, _dst: u64, _src: u64, _bytes: usize) -> Result<()> {
            no_memory()
        }
        fn enqueue_memset(&self, _q: Queue, _dst: u64, _value: u8, _bytes: usize) -> Result<()> {
            no_memory()
        }
        fn record(&self, _q: Queue) -> Result<Event> {
            no_memory()
        }
        fn sync_event(&self, _e: &Event) -> Result<()> {
            Ok(())
        }
        fn sync_queue(&self, _q: Queue) -> Result<()> {
            Ok(())
        }
        fn enqueue_copy_from_peer(
            &self,
            _q: Queue,
            _dst: u64,
            _src: &dyn Backend,
            _src_addr: u64,
            _bytes: usize,
        ) -> Result<()> {
            no_memory()
        }
        fn enqueue_launch(&self, _q: Queue, _kernel: &Kernel, _n: usize, _args: &[KernelArg]) -> Result<()> {
            no_memory()
        }
        fn synchronize(&self) -> Result<()> {
            Ok(())
        }
        fn mem_info(&self) -> Result<MemInfo> {
            Ok(MemInfo { free: self.capacity - self.state.lock().0, total: self.capacity })
        }
        unsafe fn register_host(&self, ptr: *mut u8, bytes: usize) -> Result<bool> {
            if self.refuse_locks.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Error::Driver { device: 0, call: "register", message: "refused".into() });
            }
            self.locked.lock().push((ptr as usize, bytes));
            Ok(true)
        }
        unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()> {
            let mut locked = self.locked.lock();
            let i = locked.iter().position(|&(p, _)| p == ptr as usize).ok_or_else(|| {
                Error::InvalidArgument {
                    routine: "CountingDevice",
                    what: "unlocks what it never locked".into(),
                }
            })?;
            locked.remove(i);
            Ok(())
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    #[test]
    fn freed_blocks_are_reused_by_size_class() {
        let d = device(1 << 20);
        let p = MemoryPool::new(PoolConfig::default(), 0);
        let a = p.alloc(&d, 1000, Owner::User).unwrap();
        assert_eq!(p.extent(a), Some(1000));
        assert_eq!(p.extent(a + 10), Some(990));
        assert_eq!(p.free(&d, 0, a, Owner::User).unwrap(), 1000);
        assert_eq!(p.cached_bytes(), 1024);
        let c = p.alloc(&d, 600, Owner::User).unwrap();
        assert_ne!(a, c, "below 64 KiB sizes are exact (to 256 bytes): 768 is not 1024's class");
        p.free(&d, 0, c, Owner::User).unwrap();
        let b = p.alloc(&d, 1023, Owner::User).unwrap();
        assert_eq!(a, b, "a block of the same class is reused");
        assert_eq!(p.cached_bytes(), 768);
        p.free(&d, 0, b, Owner::User).unwrap();
        assert!(matches!(p.free(&d, 0, b, Owner::User), Err(Error::UnknownDevicePointer { .. })));
        // A mapped range's device copy is not the user's to free.
        let m = p.alloc(&d, 64, Owner::Mapping).unwrap();
        let e = p.free(&d, 0, m, Owner::User).unwrap_err();
        assert!(e.to_string().contains("device copy of a mapped range"), "{e}");
        assert_eq!(p.free(&d, 0, m, Owner::Mapping).unwrap(), 64);
        p.release_all(&d).unwrap();
        assert_eq!(d.mem_info().unwrap().free, 1 << 20);
    }

    #[test]
    fn a_limit_gives_back_kept_blocks_then_runs_out_of_memory() {
        let d = device(1 << 20);
        let p = MemoryPool::new(PoolConfig { limit: 8192, ..PoolConfig::default() }, 3);
        let a = p.alloc(&d, 4096, Owner::User).unwrap();
        let b = p.alloc(&d, 2048, Owner::Mapping).unwrap();
        // 6144 of 8192 held: 4096 more is past the limit, and nothing is kept to give back.
        let e = p.alloc(&d, 4096, Owner::User).unwrap_err();
        assert!(
            matches!(e, Error::OutOfMemory { device: 3, requested: 4096, free: 2048, total: 8192 }),
            "{e:?}"
        );
        assert_eq!(p.live_count(), 2, "a failed allocation leaves nothing");
        // A kept block is given back to make room.
        p.free(&d, 0, b, Owner::Mapping).unwrap();
        assert_eq!(p.cached_bytes(), 2048);
        let c = p.alloc(&d, 4096, Owner::User).unwrap();
        assert_eq!((p.cached_bytes(), p.live_count()), (0, 2));
        assert!(p.alloc(&d, 1, Owner::User).is_err(), "8192 of 8192 held");
        p.free(&d, 0, a, Owner::User).unwrap();
        p.free(&d, 0, c, Owner::User).unwrap();
        assert!(p.alloc(&d, 8192, Owner::User).is_ok(), "what was freed counts again");
        p.release_all(&d).unwrap();
        assert_eq!(d.mem_info().unwrap().free, 1 << 20);
    }

    #[test]
    fn ranges_are_checked_against_live_blocks_at_their_asked_size() {
        let d = device(1 << 20);
        let p = MemoryPool::new(PoolConfig::default(), 0);
        let a = p.alloc(&d, 1000, Owner::User).unwrap();
        assert!(p.check_range(0, "t", a, 1000).is_ok());
        assert!(p.check_range(0, "t", a + 999, 1).is_ok());
        // The size class holds 1024 bytes, but only the 1000 asked for are the block's.
        let e = p.check_range(0, "t", a + 10, 1000).unwrap_err();
        assert!(matches!(e, Error::OutsideAllocation { bytes: 1000, .. }), "{e}");
        assert!(e.to_string().contains("ends 10 bytes short"), "{e}");
        assert!(p.check_range(0, "t", a + 1000, 1).is_err());
        assert!(p.check_range(0, "t", a, usize::MAX).is_err());
        assert!(p.check_range(0, "t", u64::MAX, 1).is_err());
        p.free(&d, 0, a, Owner::User).unwrap();
        // Freed into the cache: no longer live.
        let e = p.check_range(0, "t", a, 1).unwrap_err();
        assert!(e.to_string().contains("freed or never allocated"), "{e}");
        p.release_all(&d).unwrap();
    }

    #[test]
    fn huge_sizes_are_not_pooled() {
        let p = MemoryPool::new(PoolConfig { max_block: usize::MAX, ..PoolConfig::default() }, 0);
        assert_eq!(p.class_of(usize::MAX), None);
        assert_eq!(p.class_of(1000), Some(1024));
    }

    #[test]
    fn size_classes_are_exact_when_small_and_waste_at_most_an_eighth_above() {
        assert_eq!(size_class(1), Some(256));
        assert_eq!(size_class(256), Some(256));
        assert_eq!(size_class(257), Some(512));
        assert_eq!(size_class(EXACT_CLASSES), Some(EXACT_CLASSES));
        assert_eq!(size_class(129 << 20), Some(144 << 20), "129 MiB takes 144 MiB, not 256");
        assert_eq!(size_class(128 << 20), Some(128 << 20));
        let mut v = EXACT_CLASSES + 1;
        while v < 1 << 50 {
            for b in [v, v + 1, v + v / 3, 2 * v - 1] {
                let c = size_class(b).unwrap();
                assert!(c >= b && (c - b) * 8 <= c, "{b} -> {c}");
                // The class is its own class: a freed block serves every request of it.
                assert_eq!(size_class(c), Some(c), "{b} -> {c}");
            }
            v = v * 3 / 2;
        }
        assert_eq!(size_class(usize::MAX), None);
    }

    #[test]
    fn disabled_pool_returns_every_block() {
        let d = device(1 << 20);
        let p = MemoryPool::new(PoolConfig { enabled: false, ..PoolConfig::default() }, 0);
        let a = p.alloc(&d, 1000, Owner::User).unwrap();
        assert_eq!(d.mem_info().unwrap().free, (1 << 20) - 1000);
        p.free(&d, 0, a, Owner::User).unwrap();
        assert_eq!(p.cached_bytes(), 0);
        assert_eq!(d.mem_info().unwrap().free, 1 << 20);
    }

    #[test]
    fn cached_blocks_are_released_when_the_device_is_full() {
        let d = device(4096);
        let p = MemoryPool::new(PoolConfig::default(), 0);
        let a = p.alloc(&d, 2048, Owner::User).unwrap();
        p.free(&d, 0, a, Owner::User).unwrap();
        // 2048 cached + 4096 asked > capacity: the pool must give its cache back first.
        let b = p.alloc(&d, 4096, Owner::User).unwrap();
        assert_eq!(p.cached_bytes(), 0);
        p.free(&d, 0, b, Owner::User).unwrap();
    }
}
