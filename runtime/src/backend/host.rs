//! Host devices: the OpenMP host fallback made into real devices, for CI and teaching.
//!
//! Each host device has memory of its own (separate allocations, so a value written on the
//! host is not seen by the device until it is copied), one worker thread that runs the
//! device's work in order, and kernels that are Rust functions run on a `rayon` pool of
//! its own, whose thread 0 is the worker itself (see [`KernelPool`]). Every semantic of the
//! data environment can therefore be observed without a GPU.

use std::alloc::Layout;
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::host_gemm::{host_gemm, CpuKernels, Widening};
use super::host_widened::{new_stamp, WidenedOperands, DEFAULT_BUDGET};
use super::platform::VendorPlatform;
use super::{foreign_event, Backend, BackendKind, DeviceDescription, Event, GemmOperands, MemInfo, Queue};
use crate::backend::worker::DeviceWorker;
use crate::error::{Error, Result};
use crate::fork_join::{ForkJoinTeam, SharedCores, SHARED_ITEMS};
use crate::gemm::{ElementType, Gemm, GemmElement};
use crate::kernel::{run_host_kernel, HostLaunch, Kernel, KernelArg, ShapeParam};
use crate::topology::Topology;

/// Alignment of host-device allocations, the same as CUDA's `cuMemAlloc` gives.
const ALIGN: usize = 256;

/// A raw address that may cross to the worker thread; the memory it names outlives the
/// job (the submitting call waits for it, or the enqueue's caller keeps it valid until the
/// queue has passed the job).
#[derive(Clone, Copy)]
struct Addr(usize);

/// One timeline span's work on a host device, between its two stamps ([`Backend::stamp`]).
/// A host device runs every queue on one worker, so a span's stamps cannot be points in the
/// queue (another thread's kernel queued between a copy's two stamps would count as the
/// copy's time): the span begins when its first job starts and ends when its last job ends,
/// the jobs that the thread which opened it queues until it takes the end stamp.
#[derive(Default)]
struct SpanJobs(Mutex<SpanState>);

#[derive(Default)]
struct SpanState {
    first_start: Option<Instant>,
    last_end: Option<Instant>,
    /// The span's jobs queued and not ended.
    pending: usize,
    /// When its end stamp was taken (no job joins it after).
    closed: Option<Instant>,
}

impl SpanJobs {
    /// Counts a job of the span, queued now ([`SpanJobs::run`] runs it).
    fn queued(self: Arc<Self>) -> Arc<Self> {
        self.0.lock().pending += 1;
        self
    }

    /// Runs a job counted by [`SpanJobs::queued`], recording its start and end (also when
    /// it unwinds).
    fn run<T>(self: Arc<Self>, f: impl FnOnce() -> T) -> T {
        struct Ended(Arc<SpanJobs>);
        impl Drop for Ended {
            fn drop(&mut self) {
                let mut s = self.0 .0.lock();
                s.pending -= 1;
                s.last_end = Some(Instant::now());
            }
        }
        self.0.lock().first_start.get_or_insert_with(Instant::now);
        let _ended = Ended(self);
        f()
    }

    /// The span's begin (`end` false) or end, once known: a span with no job is an
    /// instant, at its end stamp.
    fn time(&self, end: bool) -> Option<Instant> {
        let s = self.0.lock();
        let settled = s.closed.filter(|_| s.pending == 0);
        if end {
            settled.map(|closed| s.last_end.unwrap_or(closed))
        } else {
            s.first_start.or(settled)
        }
    }
}

/// A stamp of a host device: the begin or the end of a [`SpanJobs`].
struct SpanMark {
    jobs: Arc<SpanJobs>,
    end: bool,
}

thread_local! {
    /// The timeline spans this thread has open, one per host device (by
    /// `HostDevice::id`): their begin stamp taken, their end not yet.
    static OPEN_SPANS: std::cell::RefCell<Vec<(usize, Arc<SpanJobs>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Numbers host devices for [`OPEN_SPANS`] (a device's number may change; this does not).
static NEXT_HOST_ID: AtomicUsize = AtomicUsize::new(0);

/// A host device's event: a point in its worker's queue, reached when the worker runs the
/// job that fires it. It takes the failure that the jobs queued before it left (if any), so
/// that whoever waits for it learns of exactly the work it covers.
struct HostEvent {
    /// 0 pending, 1 reached, 2 abandoned (its job was dropped unrun: the worker ended).
    state: Mutex<(u8, Option<Error>)>,
    reached: Condvar,
    /// The device's slot of unreported failures: a failure this event took and nobody
    /// waited for goes back there when the event is dropped, so none is lost.
    device_failed: Arc<Mutex<Option<Error>>>,
}

impl Drop for HostEvent {
    fn drop(&mut self) {
        if let Some(e) = self.state.get_mut().1.take() {
            self.device_failed.lock().get_or_insert(e);
        }
    }
}

impl HostEvent {
    fn new(device_failed: Arc<Mutex<Option<Error>>>) -> Self {
        Self { state: Mutex::new((0, None)), reached: Condvar::new(), device_failed }
    }

    fn set(&self, to: u8, failure: Option<Error>) {
        let mut s = self.state.lock();
        if s.0 == 0 {
            *s = (to, failure);
            self.reached.notify_all();
        }
    }

    /// Waits until the event is reached or abandoned, leaving a failure it carries for its
    /// own device to report (when the event is dropped, if nobody takes it first), calling
    /// `help` meanwhile (work that brings the event nearer). Polls for a moment first:
    /// devices in lockstep reach each other's points within microseconds, where a sleep
    /// and a wake-up cost tens of them.
    fn wait_passed(&self, mut help: impl FnMut() -> bool) {
        let mut start = Instant::now();
        while start.elapsed() < PASS_SPIN {
            if self.state.lock().0 != 0 {
                return;
            }
            if help() {
                start = Instant::now();
            } else {
                std::thread::yield_now();
            }
        }
        let mut s = self.state.lock();
        while s.0 == 0 {
            self.reached.wait(&mut s);
        }
    }

    /// `None` while pending; then the failure it carries (taken: reported once), or that
    /// it was abandoned.
    fn outcome(&self, block: bool) -> Option<std::result::Result<(), Option<Error>>> {
        let mut s = self.state.lock();
        while block && s.0 == 0 {
            self.reached.wait(&mut s);
        }
        match s.0 {
            0 => None,
            1 => Some(s.1.take().map_or(Ok(()), |e| Err(Some(e)))),
            _ => Some(Err(None)),
        }
    }
}

/// How long a queue waiting for another device's event polls before it sleeps.
const PASS_SPIN: Duration = Duration::from_micros(50);

/// Fires its event when the worker runs it; abandons it when dropped unrun, so that no
/// waiter blocks forever.
struct Firing(Arc<HostEvent>);

impl Drop for Firing {
    fn drop(&mut self) {
        self.0.set(2, None);
    }
}

/// Copies up to this size are made by the caller when the device's worker is idle: a
/// hand-off to the worker and back (a few microseconds) costs more than such a copy.
const INLINE_BYTES: usize = 64 * 1024;

/// A host device's own kernel threads, started on its first kernel (a machine with many
/// cores and several host devices does not start a pool per device up front).
///
/// The pool is started by the device's worker thread, which becomes its thread 0 (rayon's
/// `use_current_thread`): a kernel then runs on the worker itself, with no hand-off to
/// another thread and back, and its `rayon` loops share the items with the other
/// `threads - 1` threads. The worker takes part only while it runs a kernel (it waits for
/// its queue otherwise), so [`KernelPool::get`] must be called on the worker only. Rayon
/// keeps a few kilobytes of a pool so joined for good (its thread-0 state): one per host
/// device that ran a kernel. A hand-written kernel launched while other host devices are
/// busy is handed to a smaller pool of the device's share instead ([`KernelPool::smaller`]):
/// one per share size a device is given, kept (asleep) with the device.
pub(crate) struct KernelPool {
    name: String,
    threads: Option<usize>,
    /// The pool, and whether the thread that started it is its thread 0.
    pool: std::sync::OnceLock<std::result::Result<(rayon::ThreadPool, bool), String>>,
    /// Generated kernels' team, of the pool's size, started with it
    /// ([`crate::fork_join`]: the worker drives it, a thread waiting for the device joins).
    team: std::sync::OnceLock<ForkJoinTeam>,
    /// The cores the team shares with the other host devices' teams, if any.
    cores: Option<Arc<SharedCores>>,
    /// Smaller pools for hand-written kernels launched while other host devices are busy
    /// (entry `s - 1`: `s` threads, started on the first launch given that share), so
    /// that devices in lockstep split the cores instead of each running a thread a core.
    /// Their threads are their own (the worker, thread 0 of `pool`, can join one pool
    /// only): the worker hands the kernel over and waits (as a thread of `pool`, it could
    /// meanwhile take work only `pool` has, and only the worker installs work there).
    shares: std::sync::OnceLock<Box<[std::sync::OnceLock<SmallerPool>]>>,
}

/// A [`KernelPool`]'s pool of fewer threads; `None` when its threads could not start (the
/// whole pool then runs the kernels that would have run on it, as a team whose helpers
/// cannot start runs its jobs alone).
type SmallerPool = Option<rayon::ThreadPool>;

thread_local! {
    /// Whether this thread is running a host device's kernel: tells a worker that is
    /// thread 0 of its kernel pool inside a kernel from the same worker between jobs.
    static IN_KERNEL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether this thread is one of a kernel pool's own threads (which run only kernels).
    static KERNEL_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Keeps the panics of host kernels off stderr: a failing work item's panic is the
/// launch's [`Error::KernelFailed`], message included, and a kernel whose items fail in
/// several tasks would otherwise print each panic (and its backtrace). Every other panic
/// goes to the hook that was in place. Installed once, when the first kernel pool starts;
/// a hook the program sets later replaces it.
fn quiet_kernel_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let flag = |k: &'static std::thread::LocalKey<std::cell::Cell<bool>>| {
                k.try_with(|k| k.get()).unwrap_or(false)
            };
            if !(flag(&IN_KERNEL) || flag(&KERNEL_THREAD)) {
                previous(info)
            }
        }));
    });
}

/// Marks the current thread as running a kernel until dropped.
struct InKernel(bool);

impl InKernel {
    fn enter() -> Self {
        Self(IN_KERNEL.with(|k| k.replace(true)))
    }
}

impl Drop for InKernel {
    fn drop(&mut self) {
        IN_KERNEL.with(|k| k.set(self.0));
    }
}

impl KernelPool {
    /// A pool named `name` (threads `{name}-k{i}`) of `threads` threads, the worker that
    /// starts it included (rayon's default, one per CPU, when `None`), not started yet; its
    /// generated kernels' team shares `cores` with the other teams given the same.
    pub(crate) fn new(name: String, threads: Option<usize>, cores: Option<Arc<SharedCores>>) -> Self {
        Self {
            name,
            threads,
            pool: std::sync::OnceLock::new(),
            team: std::sync::OnceLock::new(),
            cores,
            shares: std::sync::OnceLock::new(),
        }
    }

    /// The generated kernels' team, once the pool has started (on the first kernel).
    fn team(&self) -> Option<&ForkJoinTeam> {
        self.team.get()
    }

    /// Runs kernel `f` from the worker with the pool started and the team driven by it: on
    /// the pool, the worker its thread 0. With `share` (a kernel of `rayon` loops, which
    /// does not fork through the team), while other host devices are busy it runs instead
    /// on a pool of the device's share of the cores ([`ForkJoinTeam::share`]), should that
    /// be fewer threads: devices in lockstep then split the cores instead of each running a
    /// thread a core.
    fn run_kernel<T>(
        &self,
        device: usize,
        share: bool,
        f: impl FnOnce(&rayon::ThreadPool) -> T,
    ) -> Result<T> {
        let pool = self.get(device)?;
        let team = self.team.get_or_init(|| {
            let mark = || KERNEL_THREAD.with(|k| k.set(true));
            ForkJoinTeam::new(self.name.clone(), pool.current_num_threads(), mark, self.cores.clone())
        });
        if !share || self.cores.is_none() {
            return Ok(team.driving(|| f(pool)));
        }
        let share = team.share();
        let on = self.smaller(share.threads, pool.current_num_threads()).unwrap_or(pool);
        Ok(team.driving(|| f(on)))
    }

    /// The pool of `threads` threads for a share of the cores, started now if it was not;
    /// `None` when that is the whole pool's `all`, or when its threads could not be
    /// started (the kernel then runs on the whole pool, as it would alone).
    fn smaller(&self, threads: usize, all: usize) -> Option<&rayon::ThreadPool> {
        if threads == 0 || threads >= all {
            return None;
        }
        let shares = self.shares.get_or_init(|| (1..all).map(|_| std::sync::OnceLock::new()).collect());
        let slot = shares.get(threads - 1)?;
        slot.get_or_init(|| {
            let name = format!("{}-s{threads}-", self.name);
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(move |i| format!("{name}k{i}"))
                .start_handler(|_| KERNEL_THREAD.with(|k| k.set(true)))
                .build()
                .ok()
        })
        .as_ref()
    }

    /// The pool, started now if it was not, with the calling thread (the device's worker)
    /// as its thread 0; should that thread already belong to a pool, the pool gets threads
    /// of its own only.
    fn get(&self, device: usize) -> Result<&rayon::ThreadPool> {
        self.pool
            .get_or_init(|| {
                quiet_kernel_panics();
                // Threads from `own` on are the pool's own (thread 0 may be the worker).
                let builder = |own: usize| {
                    let name = self.name.clone();
                    let b = rayon::ThreadPoolBuilder::new()
                        .thread_name(move |i| format!("{name}-k{i}"))
                        .start_handler(move |i| KERNEL_THREAD.with(|k| k.set(i >= own)));
                    match self.threads {
                        Some(n) => b.num_threads(n),
                        None => b,
                    }
                };
                match builder(1).use_current_thread().build() {
                    Ok(p) => Ok((p, true)),
                    Err(_) => builder(0).build().map(|p| (p, false)).map_err(|e| e.to_string()),
                }
            })
            .as_ref()
            .map(|(p, _)| p)
            .map_err(|e| Error::Driver {
                device,
                call: "start the host device's kernel pool",
                message: e.clone(),
            })
    }

    /// Whether the calling thread runs the pool's work: one of its own threads, or the
    /// worker that joined it while it runs a kernel (never, before the pool started).
    fn owns_current_thread(&self) -> bool {
        let in_share = || {
            self.shares.get().is_some_and(|shares| {
                shares.iter().any(|s| matches!(s.get(), Some(Some(p)) if p.current_thread_index().is_some()))
            })
        };
        match self.pool.get() {
            Some(Ok((p, joined))) => match p.current_thread_index() {
                Some(0) if *joined => IN_KERNEL.with(|k| k.get()),
                Some(_) => true,
                None => in_share(),
            },
            _ => false,
        }
    }
}

/// One host device.
pub(crate) struct HostDevice {
    number: usize,
    /// This device among every host device of the process ([`OPEN_SPANS`]).
    id: usize,
    /// Its index among the host devices, fixed at start-up (its UID's N).
    host_index: usize,
    description: DeviceDescription,
    worker: Option<Arc<DeviceWorker>>,
    pool: Arc<KernelPool>,
    allocations: Mutex<BTreeMap<u64, Allocation>>,
    /// f32 copies of 16-bit GEMM operands, kept while their allocation is unwritten.
    widened: Arc<WidenedOperands>,
    /// Whether bf16 products use the CPU's bf16 dot products (`host_avx512`) where it has them.
    bf16_dot: bool,
    /// Whether generated kernels run their AVX-512 copies where the CPU has them.
    avx512: bool,
    used: AtomicUsize,
    capacity: usize,
    /// The first failure of an enqueued kernel not yet reported: the next synchronisation
    /// of the device returns it (one worker runs every queue).
    failed: Arc<Mutex<Option<Error>>>,
}

/// A live allocation of a host device: its length, and the write stamp it had after the
/// last write queued to it ([`super::host_widened`]).
struct Allocation {
    bytes: usize,
    stamp: u64,
}

/// Host devices as a platform, like the GPUs' ([`super::platform`]): `count` devices of
/// `capacity` bytes each, every one with a worker of its own placed on the whole machine and
/// a kernel pool of `kernel_threads` threads (one per CPU when `None`).
pub(crate) struct HostPlatform {
    pub(crate) count: usize,
    /// Whether `count` is the default (no GPU and no number asked for), which the device
    /// report says.
    pub(crate) defaulted: bool,
    pub(crate) capacity: usize,
    pub(crate) kernel_threads: Option<usize>,
    /// Whether bf16 products use the CPU's bf16 dot products where it has them.
    pub(crate) bf16_dot: bool,
    /// Whether generated kernels run their AVX-512 copies where the CPU has them.
    pub(crate) avx512: bool,
    pub(crate) topology: Arc<Topology>,
    /// The cores the devices' generated kernels share: devices running kernels at once
    /// split them ([`SharedCores`]).
    pub(crate) cores: Arc<SharedCores>,
}

impl VendorPlatform for HostPlatform {
    type Device = HostDevice;

    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    fn device_count(&self) -> std::result::Result<usize, String> {
        Ok(self.count)
    }

    fn open(&self, number: usize, ordinal: usize) -> Result<HostDevice> {
        let name = format!("offload-host{ordinal}");
        let cpus = self.topology.whole_machine("host device").cpus;
        let worker = DeviceWorker::spawn(name.clone(), Arc::clone(&self.topology), cpus).map_err(|e| {
            Error::Driver { device: number, call: "spawn a device worker", message: e.to_string() }
        })?;
        let pool = KernelPool::new(name, self.kernel_threads, Some(Arc::clone(&self.cores)));
        Ok(HostDevice::new(number, ordinal, self.capacity, Arc::new(worker), pool)
            .with_bf16_dot(self.bf16_dot)
            .with_avx512(self.avx512))
    }

    fn details(&self, _: &HostDevice) -> Option<String> {
        None
    }

    /// Host devices read each other's memory (one address space); the builder empties the
    /// peer matrix when it is told not to use peer access, for every platform alike.
    fn enable_peer(&self, _a: &HostDevice, _b: &HostDevice) -> Result<bool> {
        Ok(true)
    }

    fn summary(&self, count: usize) -> String {
        match (self.defaulted, count) {
            (true, 1) => "host: 1 host device (the default with no GPU; OFFLOAD_HOST_DEVICES=N for N)".into(),
            (true, _) => format!("host: {count} host devices (OFFLOAD_HOST_DEVICES unset: none beside GPUs)"),
            (false, _) => format!("host: {count} host devices (OFFLOAD_HOST_DEVICES)"),
        }
    }
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
    ) -> Self {
        Self {
            number,
            id: NEXT_HOST_ID.fetch_add(1, Ordering::Relaxed),
            host_index,
            description: DeviceDescription {
                kind: BackendKind::Host,
                name: format!("host device {host_index}"),
                pci_bus_id: None,
                uuid: None,
            },
            worker: Some(worker),
            pool: Arc::new(pool),
            allocations: Mutex::new(BTreeMap::new()),
            widened: Arc::new(WidenedOperands::new(DEFAULT_BUDGET)),
            bf16_dot: true,
            avx512: HostLaunch::cpu_has_avx512(),
            used: AtomicUsize::new(0),
            capacity,
            failed: Arc::new(Mutex::new(None)),
        }
    }

    /// This device with bf16 products on the CPU's bf16 dot products where it has them
    /// (`on`, the default) or widened to f32 (see `RuntimeBuilder::host_bf16_dot`).
    pub(crate) fn with_bf16_dot(mut self, on: bool) -> Self {
        self.bf16_dot = on;
        self
    }

    /// This device with generated kernels on their AVX-512 copies where the CPU has them
    /// (`on`, the default) or on the baseline ones (see `RuntimeBuilder::host_avx512`).
    pub(crate) fn with_avx512(mut self, on: bool) -> Self {
        self.avx512 = on && HostLaunch::cpu_has_avx512();
        self
    }

    /// `kernel`'s host twin over `n` items, as a job for the worker (which runs it itself,
    /// as thread 0 of the kernel pool, or hands it to a pool of its share of the cores and
    /// waits: [`KernelPool::run_kernel`]). Mapped arguments were translated through the
    /// present table; raw device pointers (which may name a peer host device's memory) are
    /// the unsafe caller's contract.
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
        let pool = Arc::clone(&self.pool);
        // Up to 8 arguments travel inside the job: no allocation of their own.
        let args: smallvec::SmallVec<[KernelArg; 8]> = args.into();
        let (name, number, avx512) = (kernel.name(), self.number, self.avx512);
        // Every variant of a generated kernel says how its twin runs (they share the cores
        // through their team); a hand-written one runs `rayon` loops, worth a pool of its
        // share of the cores (a hand-off to its threads) from as many items as a generated
        // one shares.
        let share = kernel.host_path().is_none() && n >= SHARED_ITEMS;
        Ok(move || {
            let _in = InKernel::enter();
            pool.run_kernel(number, share, |p| run_host_kernel(p, number, name, f, n, &args, avx512))?
        })
    }

    /// The failure an enqueued kernel left, if any (taken: reported once).
    fn take_failure(&self) -> Result<()> {
        self.failed.lock().take().map_or(Ok(()), Err)
    }

    /// Whether event `e` was reached (waiting for it when `block`), with the failure of
    /// the work it covers.
    fn event_outcome(&self, e: &Event, block: bool) -> Result<bool> {
        let e = e.get::<Arc<HostEvent>>().ok_or_else(|| foreign_event(self.number))?;
        match e.outcome(block) {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(Some(failure))) => Err(failure),
            Some(Err(None)) => Err(self.closed()),
        }
    }

    /// An event fired when the queue reaches this point, carrying the failures of the work
    /// before it when `with_failures` ([`Backend::record`]), else none
    /// ([`Backend::record_point`]).
    fn mark(&self, with_failures: bool) -> Result<Event> {
        let e = Arc::new(HostEvent::new(Arc::clone(&self.failed)));
        let (firing, failed) = (Firing(Arc::clone(&e)), Arc::clone(&self.failed));
        self.submit_short(move || firing.0.set(1, if with_failures { failed.lock().take() } else { None }))?;
        Ok(Event::new(e))
    }

    fn closed(&self) -> Error {
        Error::QueueClosed { device: self.number, why: "the device's worker thread ended" }
    }

    /// Runs `f` in queue order and waits for its result: on the calling thread when the
    /// worker is idle ([`DeviceWorker::run_here_if_idle`]), else on the worker. Not for
    /// kernels, which run on the worker (thread 0 of the device's kernel pool).
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        let worker = self.worker.as_ref().ok_or_else(|| self.closed())?;
        match worker.run_here_if_idle(f) {
            Ok(v) => Ok(v),
            Err(f) => self.run_on_worker(worker, f),
        }
    }

    /// Runs `f` on the worker after what is queued, this thread working the tasks of the
    /// generated kernel the worker runs meanwhile, if it has any to share
    /// ([`crate::fork_join`]).
    fn run_on_worker<T: Send + 'static>(
        &self,
        worker: &DeviceWorker,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        let help = || {
            self.pool.team().is_some_and(|t| {
                t.has_work() && {
                    let _in = InKernel::enter();
                    t.help()
                }
            })
        };
        worker.run_helping(f, help).map_err(|_| self.closed())
    }

    /// Queues a short job `f` (a copy of at most [`INLINE_BYTES`], a memset, an event):
    /// run at once on the calling thread when the worker is idle (the queue is at this
    /// point; see [`DeviceWorker::run_here_if_idle`]), as [`HostDevice::submit`] otherwise.
    fn submit_short(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let worker = self.worker.as_ref().ok_or_else(|| self.closed())?;
        match worker.run_here_if_idle(self.guarded(f)) {
            Ok(()) => Ok(()),
            Err(job) => worker.submit(Box::new(job)).map_err(|_| self.closed()),
        }
    }

    /// Queues `f` on the device's worker, after everything queued before it (every
    /// [`Queue`] of a host device is its one worker).
    fn submit(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let job = self.guarded(f);
        self.worker.as_ref().ok_or_else(|| self.closed())?.submit(Box::new(job)).map_err(|_| self.closed())
    }

    /// `f` as a job of the timeline span this thread has open on this device, if any
    /// ([`SpanJobs`]): what copies, kernels and matrix products queue.
    fn spanned<T>(&self, f: impl FnOnce() -> T + Send + 'static) -> impl FnOnce() -> T + Send + 'static {
        let span = OPEN_SPANS.with(|open| {
            open.borrow().iter().find(|(id, _)| *id == self.id).map(|(_, jobs)| Arc::clone(jobs).queued())
        });
        move || match span {
            Some(jobs) => jobs.run(f),
            None => f(),
        }
    }

    /// Queues copy (or memset) `f` of `bytes`: a short one through
    /// [`HostDevice::submit_short`], a long one on the worker (the caller goes on meanwhile).
    fn queue_copy(&self, bytes: usize, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let f = self.spanned(f);
        if bytes <= INLINE_BYTES {
            self.submit_short(f)
        } else {
            self.submit(f)
        }
    }

    /// `f` as a queued job: a panic becomes the failure the next synchronisation reports.
    fn guarded(&self, f: impl FnOnce() + Send + 'static) -> impl FnOnce() + Send + 'static {
        let (failed, device) = (Arc::clone(&self.failed), self.number);
        move || {
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                failed.lock().get_or_insert(Error::Driver {
                    device,
                    call: "host device queue",
                    message: format!("a queued job panicked: {}", crate::error::panic_message(&*p)),
                });
            }
        }
    }

    /// Checks that `addr..addr+bytes` lies inside one live allocation.
    fn check_range(&self, addr: u64, bytes: usize, routine: &'static str) -> Result<()> {
        self.stamp_of(addr, bytes).map(drop).ok_or(Error::UnknownDevicePointer {
            device: self.number,
            addr,
            routine,
        })
    }

    /// The write stamp of the allocation holding `addr..addr+bytes`, if one does.
    fn stamp_of(&self, addr: u64, bytes: usize) -> Option<u64> {
        let allocs = self.allocations.lock();
        match allocs.range(..=addr).next_back() {
            Some((&base, a)) if addr.saturating_add(bytes as u64) <= base + a.bytes as u64 => Some(a.stamp),
            _ => None,
        }
    }

    /// Renews the write stamp of every allocation that `addr..addr+bytes` reaches (of
    /// every allocation when `bytes` is unknown): called after a write is queued.
    fn stamp_written(&self, addr: u64, bytes: Option<usize>) {
        let mut allocs = self.allocations.lock();
        let stamp = new_stamp();
        match bytes {
            None => allocs.values_mut().for_each(|a| a.stamp = stamp),
            Some(bytes) => {
                let end = addr.saturating_add(bytes.max(1) as u64);
                let first = allocs.range(..=addr).next_back().map_or(addr, |(&base, _)| base);
                for (&base, a) in allocs.range_mut(first..end) {
                    if base + a.bytes as u64 > addr {
                        a.stamp = stamp;
                    }
                }
            }
        }
    }

    /// Renews the stamps of what a launch's pointer arguments reach, but for the views
    /// `kernel`'s shape says it only reads (`&[T]`). The argument block's pointers are its
    /// views, in order (the index space's slots and the views' lengths are values); when
    /// they do not pair one to one with the shape's views, or the kernel has no shape (one
    /// built by hand, which may write through any pointer), every pointer counts as written.
    fn stamp_arguments(&self, kernel: &Kernel, args: &[KernelArg]) {
        let pointers = args.iter().filter_map(|a| match *a {
            KernelArg::Ptr { addr, bytes } => Some((addr, bytes)),
            KernelArg::Scalar(_) => None,
        });
        // What each view may do, without allocating on the launch path.
        let views = kernel.shape().map(|s| {
            s.params.iter().filter_map(|p| {
                if let ShapeParam::View { writes, .. } = p {
                    Some(*writes)
                } else {
                    None
                }
            })
        });
        let paired = views.clone().is_some_and(|v| v.count() == pointers.clone().count());
        let mut writes = views.into_iter().flatten();
        for (addr, bytes) in pointers {
            if !paired || writes.next().unwrap_or(true) {
                self.stamp_written(addr, bytes);
            }
        }
    }

    /// [`Backend::enqueue_gemm`] in elements of type `T`: every operand checked to lie in
    /// one live allocation, aligned for `T`, then [`host_gemm`] on the kernel pool.
    fn enqueue_gemm_of<T: GemmElement>(&self, g: &Gemm, ops: GemmOperands) -> Result<()> {
        let (ea, eb, ec) = g.extents()?;
        let size = std::mem::size_of::<T>();
        let operands = [(ops.a, ea), (ops.b, eb), (ops.c, ec)].into_iter().chain(ops.bias.map(|b| (b, g.m)));
        for (addr, n) in operands {
            self.check_range(addr, n * size, "gemm")?;
            if addr % std::mem::align_of::<T>() as u64 != 0 {
                return Err(Error::InvalidArgument {
                    routine: "gemm",
                    what: format!(
                        "device {}: operand at {addr:#x} is not aligned for {}",
                        self.number,
                        T::TYPE.name()
                    ),
                });
            }
        }
        let (g, pool, number) = (*g, Arc::clone(&self.pool), self.number);
        let (a, b, c) = (Addr(ops.a as usize), Addr(ops.b as usize), Addr(ops.c as usize));
        let bias = ops.bias.map(|b| Addr(b as usize));
        // The operands' stamps now, before the product is queued (see `host_widened`).
        let stamps = [self.stamp_of(ops.a, ea * size), self.stamp_of(ops.b, eb * size)];
        let widened = Arc::clone(&self.widened);
        let bf16_dot = self.bf16_dot;
        self.submit(self.spanned(move || {
            let (a, b, c, bias) = (a, b, c, bias);
            // SAFETY: the ranges lie in live allocations of this device, aligned for `T`
            // (checked), freed only on this queue after this job; C is neither an input
            // nor the bias (the caller's contract, as for BLAS); any bits are a `T`.
            let (a, b, cm, bias) = unsafe {
                (
                    std::slice::from_raw_parts(a.0 as *const T, ea),
                    std::slice::from_raw_parts(b.0 as *const T, eb),
                    std::slice::from_raw_parts_mut(c.0 as *mut T, ec),
                    bias.map(|p| std::slice::from_raw_parts(p.0 as *const T, g.m)),
                )
            };
            // The pool is started on the worker (see `KernelPool`); a failure to start it
            // is the queue's failure.
            let pool = pool.get(number).unwrap_or_else(|e| panic!("{e}"));
            let _in = InKernel::enter();
            let widening = match stamps {
                [Some(sa), Some(sb)] => Some(Widening { kept: &widened, stamps: [sa, sb] }),
                _ => None,
            };
            host_gemm(pool, &g, a, b, cm, bias, widening, CpuKernels { avx512: true, bf16_dot });
        }))?;
        self.stamp_written(ops.c, Some(ec * size));
        Ok(())
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        // Every job was waited for, so none still uses the memory freed below.
        drop(self.worker.take());
        for (&addr, a) in self.allocations.get_mut().iter() {
            // SAFETY: every entry was allocated by `alloc` with this layout and not freed.
            unsafe {
                std::alloc::dealloc(
                    addr as usize as *mut u8,
                    Layout::from_size_align_unchecked(a.bytes, ALIGN),
                )
            };
        }
    }
}

impl Backend for HostDevice {
    fn description(&self) -> &DeviceDescription {
        &self.description
    }

    fn own_worker(&self) -> Option<Arc<DeviceWorker>> {
        self.worker.clone()
    }
    fn number(&self) -> usize {
        self.number
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
        self.allocations.lock().insert(p as u64, Allocation { bytes, stamp: new_stamp() });
        Ok(p as u64)
    }

    fn free(&self, addr: u64, bytes: usize) -> Result<()> {
        let len = self
            .allocations
            .lock()
            .remove(&addr)
            .ok_or(Error::UnknownDevicePointer { device: self.number, addr, routine: "free" })?
            .bytes;
        debug_assert_eq!(len, bytes);
        self.widened.forget(addr, len);
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
        self.queue_copy(bytes, move || {
            let (d, s) = (d, s);
            // SAFETY: the caller keeps `src` valid for `bytes` reads until the queue has
            // passed this job; `dst` is inside one of this device's allocations (checked),
            // which never overlap host memory, and is freed only on this queue.
            unsafe { std::ptr::copy_nonoverlapping(s.0 as *const u8, d.0 as *mut u8, bytes) }
        })?;
        self.stamp_written(dst, Some(bytes));
        Ok(())
    }

    unsafe fn enqueue_read(&self, _q: Queue, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        self.check_range(src, bytes, "copy from device")?;
        let (d, s) = (Addr(dst as usize), Addr(src as usize));
        self.queue_copy(bytes, move || {
            let (d, s) = (d, s);
            // SAFETY: as in `enqueue_write`, with the directions swapped.
            unsafe { std::ptr::copy_nonoverlapping(s.0 as *const u8, d.0 as *mut u8, bytes) }
        })
    }

    fn enqueue_copy(&self, _q: Queue, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.check_range(dst, bytes, "copy within device")?;
        self.check_range(src, bytes, "copy within device")?;
        let (d, s) = (Addr(dst as usize), Addr(src as usize));
        self.queue_copy(bytes, move || {
            let (d, s) = (d, s);
            // SAFETY: both ranges lie inside live allocations (checked), freed only on this
            // queue, after this job; they may overlap.
            unsafe { std::ptr::copy(s.0 as *const u8, d.0 as *mut u8, bytes) }
        })?;
        self.stamp_written(dst, Some(bytes));
        Ok(())
    }

    fn enqueue_memset(&self, _q: Queue, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.check_range(dst, bytes, "memset")?;
        let d = Addr(dst as usize);
        self.queue_copy(bytes, move || {
            let d = d;
            // SAFETY: inside a live allocation (checked), freed only after this job.
            unsafe { std::ptr::write_bytes(d.0 as *mut u8, value, bytes) }
        })?;
        self.stamp_written(dst, Some(bytes));
        Ok(())
    }

    fn record(&self, _q: Queue) -> Result<Event> {
        self.mark(true)
    }

    fn record_point(&self, _q: Queue) -> Result<Event> {
        self.mark(false)
    }

    fn sync_event(&self, e: &Event) -> Result<()> {
        self.event_outcome(e, true).map(drop)
    }

    fn event_done(&self, e: &Event) -> Result<bool> {
        self.event_outcome(e, false)
    }

    fn sync_queue(&self, _q: Queue) -> Result<()> {
        self.run(|| ())?;
        self.take_failure()
    }

    /// A job on the worker that waits for `e` (this thread goes on): the jobs queued after
    /// it run once `e`'s device has passed it, or its worker ended. Meanwhile the worker
    /// works tasks of the generated kernel that device runs, as a guest of its team
    /// ([`ForkJoinTeam::guest`]): devices in lockstep then end their steps together.
    fn enqueue_wait(&self, _q: Queue, e: &Event, from: &dyn Backend) -> Result<()> {
        let e = Arc::clone(e.get::<Arc<HostEvent>>().ok_or_else(|| foreign_event(self.number))?);
        let peer = from.as_any().downcast_ref::<HostDevice>().map(|p| Arc::clone(&p.pool));
        self.submit(move || {
            e.wait_passed(|| {
                peer.as_ref().and_then(|p| p.team()).is_some_and(|t| {
                    let _in = InKernel::enter();
                    t.guest()
                })
            })
        })
    }

    /// The first stamp a thread takes on this device opens a span, the next closes it: the
    /// span's jobs time it ([`SpanJobs`]).
    fn stamp(&self, _q: Queue) -> Result<Option<Event>> {
        let mark = OPEN_SPANS.with(|open| {
            let mut open = open.borrow_mut();
            match open.iter().position(|(id, _)| *id == self.id) {
                Some(k) => {
                    let (_, jobs) = open.swap_remove(k);
                    jobs.0.lock().closed = Some(Instant::now());
                    SpanMark { jobs, end: true }
                }
                None => {
                    let jobs = Arc::new(SpanJobs::default());
                    open.push((self.id, Arc::clone(&jobs)));
                    SpanMark { jobs, end: false }
                }
            }
        });
        Ok(Some(Event::new(mark)))
    }

    fn stamp_time(&self, s: &Event, wait: bool) -> Result<Option<Instant>> {
        let s = s.get::<SpanMark>().ok_or_else(|| foreign_event(self.number))?;
        if s.jobs.time(s.end).is_none() && wait {
            // The span's jobs were queued before its end stamp was taken: they have run
            // once a job queued now has.
            self.run(|| ())?;
        }
        Ok(s.jobs.time(s.end))
    }

    fn enqueue_copy_from_peer(
        &self,
        _q: Queue,
        dst: u64,
        src: &dyn Backend,
        src_addr: u64,
        bytes: usize,
    ) -> Result<()> {
        let peer: &HostDevice = super::same_vendor(self.number, src)?;
        peer.check_range(src_addr, bytes, "peer copy source")?;
        self.check_range(dst, bytes, "peer copy destination")?;
        let (d, s) = (Addr(dst as usize), Addr(src_addr as usize));
        self.submit(self.spanned(move || {
            let (d, s) = (d, s);
            // SAFETY: two live allocations of two distinct devices, valid and disjoint, kept
            // allocated by the caller until this queue has passed the copy.
            unsafe { std::ptr::copy_nonoverlapping(s.0 as *const u8, d.0 as *mut u8, bytes) }
        }))?;
        self.stamp_written(dst, Some(bytes));
        Ok(())
    }

    fn copy_from_peer(&self, dst: u64, src: &dyn Backend, src_addr: u64, bytes: usize) -> Result<()> {
        // The peer's worker is another thread: the writes queued there land first (a
        // queued copy orders them with `enqueue_wait` instead).
        super::same_vendor::<HostDevice>(self.number, src)?.synchronize()?;
        self.enqueue_copy_from_peer(Queue::CopyIn, dst, src, src_addr, bytes)?;
        self.sync_queue(Queue::CopyIn)
    }

    fn enqueue_launch(&self, _q: Queue, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        let job = self.kernel_job(kernel, n, args)?;
        let failed = Arc::clone(&self.failed);
        self.submit(self.spanned(move || {
            if let Err(e) = job() {
                failed.lock().get_or_insert(e);
            }
        }))?;
        self.stamp_arguments(kernel, args);
        Ok(())
    }

    /// As the enqueue, waited for, with this kernel's own result (not a failure another
    /// thread's enqueued kernel left on the shared worker).
    fn launch(&self, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        let job = self.spanned(self.kernel_job(kernel, n, args)?);
        // On the worker (thread 0 of the device's kernel pool, or the one a share pool's
        // threads hand the result back to).
        let ran = self.run_on_worker(self.worker.as_ref().ok_or_else(|| self.closed())?, job);
        self.stamp_arguments(kernel, args);
        ran?
    }

    fn has_blas(&self) -> bool {
        true
    }
    fn enqueue_gemm(&self, g: &Gemm, ty: ElementType, ops: GemmOperands) -> Result<()> {
        match ty {
            ElementType::F32 => self.enqueue_gemm_of::<f32>(g, ops),
            ElementType::F16 => self.enqueue_gemm_of::<half::f16>(g, ops),
            ElementType::Bf16 => self.enqueue_gemm_of::<half::bf16>(g, ops),
        }
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
        let pool = KernelPool::new("test-host".into(), Some(2), None);
        let topo = crate::topology::Topology::system();
        let worker = Arc::new(DeviceWorker::spawn("test-host".into(), topo, Vec::new()).unwrap());
        HostDevice::new(0, 0, capacity, worker, pool)
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
        let e = Arc::new(HostEvent::new(Arc::clone(&d.failed)));
        drop(Firing(Arc::clone(&e)));
        assert!(matches!(d.sync_event(&Event::new(e)), Err(Error::QueueClosed { .. })));
        // Without a worker nothing can be enqueued.
        let mut d = d;
        drop(d.worker.take());
        assert!(matches!(d.record(Queue::Compute), Err(Error::QueueClosed { .. })));
        assert!(matches!(d.enqueue_memset(Queue::Compute, 0, 0, 0), Err(Error::UnknownDevicePointer { .. })));
    }

    /// A launch renews the write stamps of the views its kernel may write, not of those it
    /// only reads; of every pointer when its kernel has no shape or its pointers do not
    /// pair with the shape's views; copies, memsets and a GEMM's output renew theirs.
    #[test]
    fn writes_renew_the_stamps_of_what_they_reach() {
        use crate::kernel::{KernelShape, Scalar};
        fn nothing(_: &crate::kernel::HostLaunch<'_>) -> std::result::Result<(), String> {
            Ok(())
        }
        static SHAPE: KernelShape = KernelShape {
            dims: 1,
            threads: 0,
            team_size_at_launch: false,
            team_warps: false,
            params: &[
                ShapeParam::View { elem_bytes: 4, writes: false },
                ShapeParam::Value,
                ShapeParam::View { elem_bytes: 4, writes: true },
            ],
        };
        static SHAPED: Kernel = Kernel::new("shaped").with_host(nothing).with_shape(&SHAPE);
        static BY_HAND: Kernel = Kernel::new("by_hand").with_host(nothing);
        let d = device(1 << 20);
        let (r, w, other) = (d.alloc(64).unwrap(), d.alloc(64).unwrap(), d.alloc(64).unwrap());
        let stamp = |p| d.stamp_of(p, 64).unwrap();
        let before = [stamp(r), stamp(w), stamp(other)];
        let ptr = |addr| KernelArg::Ptr { addr, bytes: Some(64) };
        let args = [KernelArg::Scalar(Scalar::U64(0)), ptr(r), KernelArg::Scalar(Scalar::U32(3)), ptr(w)];
        d.launch(&SHAPED, 1, &args).unwrap();
        assert_eq!(stamp(r), before[0], "a view only read keeps its stamp");
        assert_ne!(stamp(w), before[1], "a view written gets a new one");
        assert_eq!(stamp(other), before[2]);
        let s = stamp(r);
        d.launch(&BY_HAND, 1, &[ptr(r)]).unwrap();
        assert_ne!(stamp(r), s, "a kernel without a shape may write any pointer");
        let s = stamp(r);
        d.launch(&SHAPED, 1, &[ptr(r), KernelArg::Scalar(Scalar::U32(3))]).unwrap();
        assert_ne!(stamp(r), s, "unpaired pointers count as written");
        let s = stamp(other);
        d.enqueue_memset(Queue::Compute, other + 8, 0, 8).unwrap();
        assert_ne!(stamp(other), s, "a memset");
        let s = stamp(other);
        d.enqueue_copy(Queue::Compute, other, w, 64).unwrap();
        assert_ne!(stamp(other), s, "a copy");
        let s = [stamp(r), stamp(w)];
        d.launch(&BY_HAND, 1, &[KernelArg::Ptr { addr: w, bytes: None }]).unwrap();
        assert!(stamp(r) != s[0] && stamp(w) != s[1], "a pointer of unknown extent reaches everything");
        d.synchronize().unwrap();
        for p in [r, w, other] {
            d.free(p, 64).unwrap();
        }
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
        // An event carries the failures of exactly the work queued before it and after the
        // previous event: whoever waits for it learns of them, once.
        let p = d.alloc(64).unwrap();
        d.enqueue_launch(Queue::Compute, &FAILS, 4, &[]).unwrap();
        let after_failure = d.record(Queue::Compute).unwrap();
        d.enqueue_memset(Queue::Compute, p, 0, 64).unwrap();
        let after_memset = d.record(Queue::Compute).unwrap();
        assert!(d.sync_event(&after_memset).is_ok());
        assert!(matches!(d.event_done(&after_failure), Err(Error::KernelFailed { .. })));
        assert!(d.event_done(&after_failure).unwrap());
        // One nobody waited for gives its failure back to the device when dropped.
        d.enqueue_launch(Queue::Compute, &FAILS, 4, &[]).unwrap();
        drop(d.record(Queue::Compute).unwrap());
        assert!(d.sync_queue(Queue::Compute).is_err());
        d.free(p, 64).unwrap();
    }

    /// A queue told to wait for another device's event runs nothing queued after the wait
    /// until that device has passed it, without blocking the thread that queued it; a
    /// failure of the other device's work stays that device's to report.
    #[test]
    fn a_queue_waits_for_another_devices_event_and_leaves_its_failure_there() {
        fn fails(_: &crate::kernel::HostLaunch<'_>) -> std::result::Result<(), String> {
            Err("the source failed".into())
        }
        static FAILS: Kernel = Kernel::new("fails").with_host(fails);
        let (a, b) = (device(1 << 20), device(1 << 20));
        // Device a is held at a gate until the test opens it.
        let (open, gate) = std::sync::mpsc::channel::<()>();
        a.submit(move || {
            let _ = gate.recv();
        })
        .unwrap();
        a.enqueue_launch(Queue::Compute, &FAILS, 4, &[]).unwrap();
        let passed = a.record_point(Queue::Compute).unwrap();
        let p = b.alloc(8).unwrap();
        b.enqueue_wait(Queue::Compute, &passed, &a).unwrap();
        b.enqueue_memset(Queue::Compute, p, 0xab, 8).unwrap();
        let after = b.record(Queue::Compute).unwrap();
        // Device a has not passed its event: device b cannot have passed its wait.
        assert!(!b.event_done(&after).unwrap());
        open.send(()).unwrap();
        b.sync_event(&after).unwrap();
        let mut back = [0u8; 8];
        // SAFETY: 8 bytes each side.
        unsafe { b.read(back.as_mut_ptr(), p, 8).unwrap() };
        assert_eq!(back, [0xab; 8]);
        // Device a reports its own failure (the point carries none), while the point lives.
        assert!(a.event_done(&passed).unwrap());
        let e = a.sync_queue(Queue::Compute).unwrap_err();
        assert!(e.to_string().contains("the source failed"), "{e}");
        b.sync_queue(Queue::Compute).unwrap();
        b.free(p, 8).unwrap();
    }

    #[test]
    fn kernels_run_on_the_worker_which_belongs_to_the_device_only_inside_them() {
        use std::sync::atomic::AtomicPtr;
        /// The pool of the device under test, for the kernel to ask.
        static POOL: AtomicPtr<KernelPool> = AtomicPtr::new(std::ptr::null_mut());
        static SEEN: Mutex<Vec<(Option<String>, bool)>> = Mutex::new(Vec::new());
        fn look(l: &crate::kernel::HostLaunch<'_>) -> std::result::Result<(), String> {
            // SAFETY: set below to the device's pool, which outlives the launches.
            let pool = unsafe { &*POOL.load(Ordering::SeqCst) };
            let me = (std::thread::current().name().map(String::from), pool.owns_current_thread());
            SEEN.lock().push(me);
            // Argument 0: n u32 that only this kernel uses.
            // SAFETY: as said.
            let x = unsafe { l.slice_mut::<u32>(0, l.n())? };
            use rayon::prelude::*;
            x.par_iter_mut().enumerate().for_each(|(i, v)| *v += i as u32);
            if l.n() == 3 {
                panic!("three is too few");
            }
            Ok(())
        }
        static LOOK: Kernel = Kernel::new("look").with_host(look);
        let d = device(1 << 20);
        POOL.store(Arc::as_ptr(&d.pool).cast_mut(), Ordering::SeqCst);
        let p = d.alloc(4 * 100_000).unwrap();
        let arg = [KernelArg::Ptr { addr: p, bytes: Some(4 * 100_000) }];
        d.launch(&LOOK, 100_000, &arg).unwrap();
        d.enqueue_launch(Queue::Compute, &LOOK, 100_000, &arg).unwrap();
        d.sync_queue(Queue::Compute).unwrap();
        let mut back = vec![0u32; 100_000];
        // SAFETY: `back` holds the 100 000 u32 read.
        unsafe { d.read(back.as_mut_ptr().cast(), p, 4 * 100_000).unwrap() };
        assert!(back.iter().enumerate().all(|(i, &v)| v == 2 * i as u32));
        // Both ran on the worker itself, which counted as the device's inside them only.
        assert_eq!(*SEEN.lock(), vec![(Some("test-host".to_string()), true); 2]);
        assert!(!d.run(|| IN_KERNEL.with(|k| k.get())).unwrap());
        assert!(!d.runs_current_thread());
        // A panic is the launch's error, naming the kernel, and the worker goes on.
        let e = d.launch(&LOOK, 3, &arg).unwrap_err();
        assert!(
            matches!(&e, Error::KernelFailed { kernel: "look", message, .. } if message.contains("three")),
            "{e}"
        );
        assert!(!d.run(|| IN_KERNEL.with(|k| k.get())).unwrap());
        d.launch(&LOOK, 1, &arg).unwrap();
        d.free(p, 4 * 100_000).unwrap();
    }

    /// A hand-written kernel launched while another host device sharing the cores is busy
    /// runs on a pool of its share of them, whose threads count as the device's; alone, or
    /// when small, it runs on the whole pool, from the worker.
    #[test]
    #[cfg_attr(miri, ignore = "starts rayon pools, which Miri reports as leaked")]
    fn hand_written_kernels_take_their_share_of_cores_others_use() {
        static SEEN: Mutex<Vec<(usize, Option<String>, bool)>> = Mutex::new(Vec::new());
        static POOL: std::sync::atomic::AtomicPtr<KernelPool> =
            std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
        fn count(l: &crate::kernel::HostLaunch<'_>) -> std::result::Result<(), String> {
            // SAFETY: set below to the device's pool, which outlives the launches.
            let pool = unsafe { &*POOL.load(Ordering::SeqCst) };
            let name = std::thread::current().name().map(String::from);
            SEEN.lock().push((rayon::current_num_threads(), name, pool.owns_current_thread()));
            // SAFETY: argument 0 holds n u32 that only this kernel uses.
            let x = unsafe { l.slice_mut::<u32>(0, l.n())? };
            use rayon::prelude::*;
            x.par_iter_mut().enumerate().for_each(|(i, v)| *v = i as u32);
            Ok(())
        }
        static COUNT: Kernel = Kernel::new("count").with_host(count);
        // As `#[offload::kernel]` marks every variant of a generated kernel (which forks
        // through the device's team, not on a rayon pool).
        static NOTED: Kernel = Kernel::new("count").with_host(count).with_host_path("generated");
        let cores = SharedCores::new(2);
        let pool = KernelPool::new("share-host".into(), Some(2), Some(Arc::clone(&cores)));
        let topo = crate::topology::Topology::system();
        let worker = Arc::new(DeviceWorker::spawn("share-host".into(), topo, Vec::new()).unwrap());
        let d = HostDevice::new(0, 0, 1 << 22, worker, pool);
        POOL.store(Arc::as_ptr(&d.pool).cast_mut(), Ordering::SeqCst);
        let n = SHARED_ITEMS * 4;
        let p = d.alloc(4 * n).unwrap();
        let arg = [KernelArg::Ptr { addr: p, bytes: Some(4 * n) }];
        // Alone: the whole pool of two, from the worker.
        d.launch(&COUNT, n, &arg).unwrap();
        // Another device sharing the cores is busy: one thread of its own.
        let other = ForkJoinTeam::new("share-other".into(), 2, || {}, Some(Arc::clone(&cores)));
        let busy = other.share();
        assert_eq!(busy.threads, 2, "the other device was alone");
        d.launch(&COUNT, n, &arg).unwrap();
        // A small kernel keeps the whole pool (no hand-off for a short launch), and so does
        // a generated one.
        d.launch(&COUNT, SHARED_ITEMS - 1, &arg).unwrap();
        d.launch(&NOTED, n, &arg).unwrap();
        drop(busy);
        let mut back = vec![0u32; n];
        // SAFETY: `back` holds the n u32 read.
        unsafe { d.read(back.as_mut_ptr().cast(), p, 4 * n).unwrap() };
        assert!(back.iter().enumerate().all(|(i, &v)| v == i as u32));
        let seen = SEEN.lock().clone();
        let whole = (2, Some("share-host".to_string()), true);
        assert_eq!(
            seen,
            [whole.clone(), (1, Some("share-host-s1-k0".to_string()), true), whole.clone(), whole]
        );
        d.free(p, 4 * n).unwrap();
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
