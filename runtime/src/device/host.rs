//! Host devices: the OpenMP host fallback made into real devices, for CI and teaching.
//!
//! Each host device has memory of its own (separate allocations, so a value written on the
//! host is not seen by the device until it is copied), one worker thread that runs the
//! device's work in order, and kernels that are Rust functions run on a shared `rayon`
//! pool. Every semantic of the data environment can therefore be observed without a GPU.

use std::alloc::Layout;
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::{foreign_event, Backend, BackendKind, DeviceDescription, Event, MemInfo, Queue, Sgemm};
use crate::error::{Error, Result};
use crate::kernel::{run_host_kernel, Kernel, KernelArg};
use crate::worker::DeviceWorker;

/// Alignment of host-device allocations, the same as CUDA's `cuMemAlloc` gives.
const ALIGN: usize = 256;

/// A raw address that may cross to the worker thread; the memory it names outlives the
/// job (the submitting call waits for it, or the enqueue's caller keeps it valid until the
/// queue has passed the job).
#[derive(Clone, Copy)]
struct Addr(usize);

/// A host device's event: a point in its worker's queue, reached when the worker runs the
/// job that fires it.
#[derive(Default)]
struct HostEvent {
    /// 0 pending, 1 reached, 2 abandoned (its job was dropped unrun: the worker ended).
    state: Mutex<u8>,
    reached: Condvar,
}

impl HostEvent {
    fn set(&self, to: u8) {
        let mut s = self.state.lock();
        if *s == 0 {
            *s = to;
            self.reached.notify_all();
        }
    }
}

/// Fires its event when the worker runs it; abandons it when dropped unrun, so that no
/// waiter blocks forever.
struct Firing(Arc<HostEvent>);

impl Drop for Firing {
    fn drop(&mut self) {
        self.0.set(2);
    }
}

/// A host device's own kernel threads, started on its first kernel (a machine with many
/// cores and several host devices does not start a pool per device up front).
pub(crate) struct KernelPool {
    name: String,
    threads: Option<usize>,
    pool: std::sync::OnceLock<std::result::Result<Arc<rayon::ThreadPool>, String>>,
}

impl KernelPool {
    /// A pool named `name` (threads `{name}-k{i}`) of `threads` threads (rayon's default,
    /// one per CPU, when `None`), not started yet.
    pub(crate) fn new(name: String, threads: Option<usize>) -> Self {
        Self { name, threads, pool: std::sync::OnceLock::new() }
    }

    /// The pool, started now if it was not.
    fn get(&self, device: usize) -> Result<&Arc<rayon::ThreadPool>> {
        self.pool
            .get_or_init(|| {
                let name = self.name.clone();
                let mut b = rayon::ThreadPoolBuilder::new().thread_name(move |i| format!("{name}-k{i}"));
                if let Some(n) = self.threads {
                    b = b.num_threads(n);
                }
                b.build().map(Arc::new).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| Error::Driver {
                device,
                call: "start the host device's kernel pool",
                message: e.clone(),
            })
    }

    /// Whether the calling thread is one of the pool's (never, before it started).
    fn owns_current_thread(&self) -> bool {
        matches!(self.pool.get(), Some(Ok(p)) if p.current_thread_index().is_some())
    }
}

/// One host device.
pub(crate) struct HostDevice {
    number: usize,
    /// Its index among the host devices, fixed at start-up (its UID's N).
    host_index: usize,
    description: DeviceDescription,
    worker: Option<Arc<DeviceWorker>>,
    pool: KernelPool,
    allocations: Mutex<BTreeMap<u64, usize>>,
    used: AtomicUsize,
    capacity: usize,
    peer_access: bool,
    /// The first failure of an enqueued kernel not yet reported: the next synchronisation
    /// of the device returns it (one worker runs every queue).
    failed: Arc<Mutex<Option<Error>>>,
}

impl HostDevice {
    /// Host device number `number` (its index among all devices), with `capacity` bytes
    /// of memory, its work run in order by `worker`, and kernels on `pool`.
    pub(crate) fn new(
        number: usize,
        host_index: usize,
        capacity: usize,
        worker: Arc<DeviceWorker>,
        pool: KernelPool,
        peer_access: bool,
    ) -> Self {
        Self {
            number,
            host_index,
            description: DeviceDescription {
                kind: BackendKind::Host,
                name: format!("host device {host_index}"),
                pci_bus_id: None,
                uuid: None,
            },
            worker: Some(worker),
            pool,
            allocations: Mutex::new(BTreeMap::new()),
            used: AtomicUsize::new(0),
            capacity,
            peer_access,
            failed: Arc::new(Mutex::new(None)),
        }
    }

    /// `kernel`'s host twin over `n` items, as a job for the worker. Mapped arguments were
    /// translated through the present table; raw device pointers (which may name a peer
    /// host device's memory) are the unsafe caller's contract.
    fn kernel_job(
        &self,
        kernel: &Kernel,
        n: usize,
        args: &[KernelArg],
    ) -> Result<impl FnOnce() -> Result<()> + Send + 'static> {
        let f = kernel.host_fn().ok_or(Error::NoKernelImpl {
            device: self.number,
            kernel: kernel.name(),
            backend: "host",
        })?;
        let pool = Arc::clone(self.pool.get(self.number)?);
        let (name, args, number) = (kernel.name(), args.to_vec(), self.number);
        Ok(move || run_host_kernel(&pool, number, name, f, n, &args))
    }

    /// The failure an enqueued kernel left, if any (taken: reported once).
    fn take_failure(&self) -> Result<()> {
        self.failed.lock().take().map_or(Ok(()), Err)
    }

    fn closed(&self) -> Error {
        Error::QueueClosed { device: self.number, why: "the device's worker thread ended" }
    }

    /// Runs `f` on the device's worker, in queue order, and waits for its result.
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        self.worker.as_ref().ok_or_else(|| self.closed())?.run(f).map_err(|_| self.closed())
    }

    /// Queues `f` on the device's worker, after everything queued before it (every
    /// [`Queue`] of a host device is its one worker). A panic of `f` becomes the failure
    /// the next synchronisation reports.
    fn submit(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let (failed, device) = (Arc::clone(&self.failed), self.number);
        let job = move || {
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                failed.lock().get_or_insert(Error::Driver {
                    device,
                    call: "host device queue",
                    message: format!("a queued job panicked: {}", crate::error::panic_message(&*p)),
                });
            }
        };
        self.worker.as_ref().ok_or_else(|| self.closed())?.submit(Box::new(job)).map_err(|_| self.closed())
    }

    /// Checks that `addr..addr+bytes` lies inside one live allocation.
    fn check_range(&self, addr: u64, bytes: usize, routine: &'static str) -> Result<()> {
        let allocs = self.allocations.lock();
        match allocs.range(..=addr).next_back() {
            Some((&base, &len)) if addr + bytes as u64 <= base + len as u64 => Ok(()),
            _ => Err(Error::UnknownDevicePointer { device: self.number, addr, routine }),
        }
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        // Every job was waited for, so none still uses the memory freed below.
        drop(self.worker.take());
        for (&addr, &len) in self.allocations.get_mut().iter() {
            // SAFETY: every entry was allocated by `alloc` with this layout and not freed.
            unsafe {
                std::alloc::dealloc(addr as usize as *mut u8, Layout::from_size_align_unchecked(len, ALIGN))
            };
        }
    }
}

impl Backend for HostDevice {
    fn description(&self) -> &DeviceDescription {
        &self.description
    }

    fn renumber(&mut self, number: usize) {
        self.number = number;
    }

    /// `host-N`, N its index among host devices (it keeps it when renumbered).
    fn uid(&self) -> String {
        format!("host-{}", self.host_index)
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        let oom =
            |free| Error::OutOfMemory { device: self.number, requested: bytes, free, total: self.capacity };
        let used = self.used.fetch_add(bytes, Ordering::Relaxed);
        if used.saturating_add(bytes) > self.capacity {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            return Err(oom(self.capacity.saturating_sub(used)));
        }
        let layout = Layout::from_size_align(bytes, ALIGN).map_err(|_| oom(self.capacity - used))?;
        // Zeroed: reads of memory no copy has written yet (an `alloc` map copied back, a new
        // buffer read) must see initialised bytes, as a GPU's DMA would give them.
        // SAFETY: `bytes > 0` (the caller never asks for zero) and the layout is valid.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            return Err(oom(self.capacity - used));
        }
        self.allocations.lock().insert(p as u64, bytes);
        Ok(p as u64)
    }

    fn free(&self, addr: u64, bytes: usize) -> Result<()> {
        let len = self.allocations.lock().remove(&addr).ok_or(Error::UnknownDevicePointer {
            device: self.number,
            addr,
            routine: "free",
        })?;
        debug_assert_eq!(len, bytes);
        let a = Addr(addr as usize);
        // Freed on the queue, after any kernel or copy already queued that may use it.
        self.run(move || {
            let a = a;
            // SAFETY: allocated by `alloc` with this layout; removed from the table above,
            // so it is freed once.
            unsafe { std::alloc::dealloc(a.0 as *mut u8, Layout::from_size_align_unchecked(len, ALIGN)) }
        })?;
        self.used.fetch_sub(len, Ordering::Relaxed);
        Ok(())
    }

    unsafe fn enqueue_write(&self, _q: Queue, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        self.check_range(dst, bytes, "copy to device")?;
        let (d, s) = (Addr(dst as usize), Addr(src as usize));
        self.submit(move || {
            let (d, s) = (d, s);
            // SAFETY: the caller keeps `src` valid for `bytes` reads until the queue has
            // passed this job; `dst` is inside one of this device's allocations (checked),
            // which never overlap host memory, and is freed only on this queue.
            unsafe { std::ptr::copy_nonoverlapping(s.0 as *const u8, d.0 as *mut u8, bytes) }
        })
    }

    unsafe fn enqueue_read(&self, _q: Queue, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        self.check_range(src, bytes, "copy from device")?;
        let (d, s) = (Addr(dst as usize), Addr(src as usize));
        self.submit(move || {
            let (d, s) = (d, s);
            // SAFETY: as in `enqueue_write`, with the directions swapped.
            unsafe { std::ptr::copy_nonoverlapping(s.0 as *const u8, d.0 as *mut u8, bytes) }
        })
    }

    fn enqueue_copy(&self, _q: Queue, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.check_range(dst, bytes, "copy within device")?;
        self.check_range(src, bytes, "copy within device")?;
        let (d, s) = (Addr(dst as usize), Addr(src as usize));
        self.submit(move || {
            let (d, s) = (d, s);
            // SAFETY: both ranges lie inside live allocations (checked), freed only on this
            // queue, after this job; they may overlap.
            unsafe { std::ptr::copy(s.0 as *const u8, d.0 as *mut u8, bytes) }
        })
    }

    fn enqueue_memset(&self, _q: Queue, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.check_range(dst, bytes, "memset")?;
        let d = Addr(dst as usize);
        self.submit(move || {
            let d = d;
            // SAFETY: inside a live allocation (checked), freed only after this job.
            unsafe { std::ptr::write_bytes(d.0 as *mut u8, value, bytes) }
        })
    }

    fn record(&self, _q: Queue) -> Result<Event> {
        let e = Arc::new(HostEvent::default());
        let firing = Firing(Arc::clone(&e));
        self.submit(move || firing.0.set(1))?;
        Ok(Event::new(e))
    }

    fn sync_event(&self, e: &Event) -> Result<()> {
        let e = e.get::<Arc<HostEvent>>().ok_or_else(|| foreign_event(self.number))?;
        let mut state = e.state.lock();
        while *state == 0 {
            e.reached.wait(&mut state);
        }
        if *state == 1 {
            self.take_failure()
        } else {
            Err(self.closed())
        }
    }

    fn sync_queue(&self, _q: Queue) -> Result<()> {
        self.run(|| ())?;
        self.take_failure()
    }

    fn can_access_peer(&self, src: &dyn Backend) -> bool {
        self.peer_access && src.as_any().downcast_ref::<HostDevice>().is_some_and(|s| s.peer_access)
    }

    fn enqueue_copy_from_peer(
        &self,
        _q: Queue,
        dst: u64,
        src: &dyn Backend,
        src_addr: u64,
        bytes: usize,
    ) -> Result<()> {
        let peer = src.as_any().downcast_ref::<HostDevice>().ok_or_else(|| Error::InvalidArgument {
            routine: "copy_from_peer",
            what: "source device is not a host device".into(),
        })?;
        peer.check_range(src_addr, bytes, "peer copy source")?;
        self.check_range(dst, bytes, "peer copy destination")?;
        // The peer's worker is another thread: its queued writes land first.
        peer.synchronize()?;
        let (d, s) = (Addr(dst as usize), Addr(src_addr as usize));
        self.submit(move || {
            let (d, s) = (d, s);
            // SAFETY: two live allocations of two distinct devices, valid and disjoint, kept
            // allocated by the caller until this queue has passed the copy.
            unsafe { std::ptr::copy_nonoverlapping(s.0 as *const u8, d.0 as *mut u8, bytes) }
        })
    }

    fn enqueue_launch(&self, _q: Queue, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        let job = self.kernel_job(kernel, n, args)?;
        let failed = Arc::clone(&self.failed);
        self.submit(move || {
            if let Err(e) = job() {
                failed.lock().get_or_insert(e);
            }
        })
    }

    /// As the enqueue, waited for, with this kernel's own result (not a failure another
    /// thread's enqueued kernel left on the shared worker).
    fn launch(&self, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        let job = self.kernel_job(kernel, n, args)?;
        self.run(job)?
    }

    fn enqueue_sgemm(&self, g: &Sgemm, a: u64, b: u64, c: u64) -> Result<()> {
        let (ea, eb, ec) = g.extents()?;
        for (addr, n) in [(a, ea), (b, eb), (c, ec)] {
            self.check_range(addr, n * 4, "sgemm")?;
        }
        let (g, pool) = (*g, Arc::clone(self.pool.get(self.number)?));
        let (a, b, c) = (Addr(a as usize), Addr(b as usize), Addr(c as usize));
        self.submit(move || {
            let (a, b, c) = (a, b, c);
            // SAFETY: the three ranges lie in live allocations of this device (checked),
            // freed only on this queue after this job; C is not one of the inputs (the
            // caller's contract, as for BLAS).
            let (a, b, cm) = unsafe {
                (
                    std::slice::from_raw_parts(a.0 as *const f32, ea),
                    std::slice::from_raw_parts(b.0 as *const f32, eb),
                    std::slice::from_raw_parts_mut(c.0 as *mut f32, ec),
                )
            };
            host_sgemm(&pool, &g, a, b, cm);
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.run(|| ())
    }

    fn runs_current_thread(&self) -> bool {
        self.pool.owns_current_thread()
    }

    fn mem_info(&self) -> Result<MemInfo> {
        let used = self.used.load(Ordering::Relaxed);
        Ok(MemInfo { free: self.capacity.saturating_sub(used), total: self.capacity })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Column-major SGEMM on the host, one column of C per task.
fn host_sgemm(pool: &rayon::ThreadPool, g: &Sgemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    use rayon::prelude::*;
    let at = |i: usize, p: usize| if g.transa { a[p + i * g.lda] } else { a[i + p * g.lda] };
    let bt = |p: usize, j: usize| if g.transb { b[j + p * g.ldb] } else { b[p + j * g.ldb] };
    pool.install(|| {
        c.par_chunks_mut(g.ldc).take(g.n).enumerate().for_each(|(j, col)| {
            for (i, out) in col.iter_mut().take(g.m).enumerate() {
                let dot: f32 = (0..g.k).map(|p| at(i, p) * bt(p, j)).sum();
                *out = g.alpha * dot + if g.beta == 0.0 { 0.0 } else { g.beta * *out };
            }
        })
    });
}

/// Bytes of memory each host device offers unless configured: the machine's memory.
pub(crate) fn default_capacity() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<usize>().ok())
        })
        .map_or(16 << 30, |kb| kb * 1024)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn device(capacity: usize) -> HostDevice {
        let pool = KernelPool::new("test-host".into(), Some(2));
        let topo = Arc::new(crate::topology::Topology::system());
        let worker = Arc::new(DeviceWorker::spawn("test-host".into(), topo, Vec::new()).unwrap());
        HostDevice::new(0, 0, capacity, worker, pool, true)
    }

    #[test]
    fn memory_is_separate_and_copies_round_trip() {
        let d = device(1 << 20);
        let p = d.alloc(16).unwrap();
        let src = [7u8; 16];
        let mut dst = [0u8; 16];
        // SAFETY: both arrays hold 16 bytes.
        unsafe {
            d.write(p, src.as_ptr(), 16).unwrap();
            d.read(dst.as_mut_ptr(), p, 16).unwrap();
        }
        assert_eq!(dst, src);
        assert_ne!(p as usize, src.as_ptr() as usize);
        d.free(p, 16).unwrap();
        assert!(matches!(d.free(p, 16), Err(Error::UnknownDevicePointer { .. })));
    }

    #[test]
    fn enqueued_copies_run_in_order_and_events_mark_them() {
        let d = device(1 << 20);
        let p = d.alloc(4096).unwrap();
        let src: Vec<u8> = (0..4096).map(|i| i as u8).collect();
        let mut back = vec![0u8; 4096];
        // SAFETY: `src` and `back` outlive the queue's use of them (the event is waited for).
        unsafe {
            d.enqueue_write(Queue::CopyIn, p, src.as_ptr(), 4096).unwrap();
            d.enqueue_memset(Queue::Compute, p + 8, 0xee, 8).unwrap();
            d.enqueue_read(Queue::CopyOut, back.as_mut_ptr(), p, 4096).unwrap();
        }
        let e = d.record(Queue::CopyOut).unwrap();
        d.sync_event(&e).unwrap();
        assert_eq!(&back[..8], &src[..8]);
        assert_eq!(&back[8..16], &[0xee; 8]);
        assert_eq!(&back[16..], &src[16..]);
        // A reached event stays reached.
        d.sync_event(&e).unwrap();
        d.sync_queue(Queue::Compute).unwrap();
        d.free(p, 4096).unwrap();
    }

    #[test]
    fn foreign_and_abandoned_events_are_errors() {
        let d = device(1 << 20);
        let foreign = Event::new(7u32);
        assert!(matches!(d.sync_event(&foreign), Err(Error::InvalidArgument { .. })));
        // An event whose job was dropped unrun (its worker ended) does not block forever.
        let e = Arc::new(HostEvent::default());
        drop(Firing(Arc::clone(&e)));
        assert!(matches!(d.sync_event(&Event::new(e)), Err(Error::QueueClosed { .. })));
        // Without a worker nothing can be enqueued.
        let mut d = d;
        drop(d.worker.take());
        assert!(matches!(d.record(Queue::Compute), Err(Error::QueueClosed { .. })));
        assert!(matches!(d.enqueue_memset(Queue::Compute, 0, 0, 0), Err(Error::UnknownDevicePointer { .. })));
    }

    #[test]
    fn an_enqueued_kernels_failure_comes_at_the_next_synchronisation() {
        fn fails(_: &crate::kernel::HostLaunch<'_>) -> std::result::Result<(), String> {
            Err("index 9 out of range".into())
        }
        static FAILS: Kernel = Kernel::new("fails").with_host(fails);
        let d = device(1 << 20);
        d.enqueue_launch(Queue::Compute, &FAILS, 4, &[]).unwrap();
        let e = d.sync_queue(Queue::Compute).unwrap_err();
        assert!(e.to_string().contains("index 9 out of range"), "{e}");
        // Reported once; the blocking launch gives its own result.
        d.sync_queue(Queue::Compute).unwrap();
        assert!(d.launch(&FAILS, 4, &[]).is_err());
        d.sync_queue(Queue::CopyIn).unwrap();
    }

    #[test]
    fn out_of_memory_says_how_much() {
        let d = device(1000);
        let p = d.alloc(600).unwrap();
        let e = d.alloc(600).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { requested: 600, free: 400, total: 1000, .. }), "{e}");
        d.free(p, 600).unwrap();
        assert_eq!(d.mem_info().unwrap().free, 1000);
    }

    #[test]
    fn out_of_range_copies_are_refused() {
        let d = device(1 << 20);
        let p = d.alloc(8).unwrap();
        let src = [0u8; 16];
        // SAFETY: the call is refused before any byte moves.
        let e = unsafe { d.write(p, src.as_ptr(), 16) }.unwrap_err();
        assert!(matches!(e, Error::UnknownDevicePointer { .. }));
        d.free(p, 8).unwrap();
    }
}
