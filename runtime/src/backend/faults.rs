//! Injected faults: a device whose operations fail on purpose, so that tests can prove
//! what the runtime does when a device fails mid-construct (a copy after the entry was
//! made, a launch, an allocation halfway through a map list, a pin, an event's wait).
//!
//! `Faulty` wraps any backend and, before delegating an operation, asks the
//! [`FaultInjector`] whether this one fails: the `n`-th of a kind ([`FaultPlan::fail_nth`]),
//! or each with a probability from a seed ([`FaultPlan::random`]). A failed operation does
//! nothing and returns the error a driver would: `Error::OutOfMemory` for an allocation,
//! `Error::Driver` naming the call for the others. Test-only: `RuntimeBuilder::inject_faults`
//! (hidden) wraps a runtime's host devices.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{
    Backend, Copy2d, DeviceDescription, Event, GemmOperands, Graph, Interop, MemInfo, Queue, RecordedLaunch,
};
use crate::error::{Error, Result};
use crate::gemm::{ElementType, Gemm};
use crate::kernel::{Kernel, KernelArg};

/// The kinds of device operation a [`FaultPlan`] can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// A device allocation (fails as out of memory).
    Alloc,
    /// A host-to-device copy.
    CopyIn,
    /// A device-to-host copy.
    CopyOut,
    /// A fill (`memset`) of device memory.
    Fill,
    /// A kernel launch.
    Launch,
    /// Pinning (page-locking) host memory.
    Pin,
    /// Waiting for an event or a queue.
    EventSync,
}

impl FaultKind {
    /// Every kind, in order.
    pub const ALL: [FaultKind; 7] = [
        FaultKind::Alloc,
        FaultKind::CopyIn,
        FaultKind::CopyOut,
        FaultKind::Fill,
        FaultKind::Launch,
        FaultKind::Pin,
        FaultKind::EventSync,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// The driver call a failure of this kind names.
    fn call(self) -> &'static str {
        match self {
            FaultKind::Alloc => "alloc (injected)",
            FaultKind::CopyIn => "copy to device (injected)",
            FaultKind::CopyOut => "copy from device (injected)",
            FaultKind::Fill => "memset (injected)",
            FaultKind::Launch => "launch (injected)",
            FaultKind::Pin => "register host memory (injected)",
            FaultKind::EventSync => "event synchronize (injected)",
        }
    }
}

/// Which operations of a device fail.
///
/// ```
/// use offload::backend::{FaultKind, FaultPlan};
/// // The third host-to-device copy fails; then one launch in ten, from seed 7.
/// let plan = FaultPlan::default().fail_nth(FaultKind::CopyIn, 3).random(7, 0.1, &[FaultKind::Launch]);
/// assert_eq!(plan.nth(), &[(FaultKind::CopyIn, 3)]);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    nth: Vec<(FaultKind, u64)>,
    random: Option<(u64, f64, Vec<FaultKind>)>,
    device: Option<usize>,
}

impl FaultPlan {
    /// Fails the `n`-th operation (counting from 1) of `kind` on each wrapped device.
    pub fn fail_nth(mut self, kind: FaultKind, n: u64) -> Self {
        self.nth.push((kind, n));
        self
    }

    /// Fails each operation of the kinds in `kinds` with probability `p` (0 to 1), from a
    /// generator seeded with `seed` (each device's stream of decisions is the same run to
    /// run for the same sequence of operations).
    pub fn random(mut self, seed: u64, p: f64, kinds: &[FaultKind]) -> Self {
        self.random = Some((seed, p.clamp(0.0, 1.0), kinds.to_vec()));
        self
    }

    /// Fails operations on host device `device` alone (the others count theirs and fail
    /// none); without it every wrapped device follows the plan. `device` is the number the
    /// device has when the runtime starts, before `OMP_AVAILABLE_DEVICES` renumbers.
    pub fn on_device(mut self, device: usize) -> Self {
        self.device = Some(device);
        self
    }

    /// The `n`-th operations the plan fails.
    pub fn nth(&self) -> &[(FaultKind, u64)] {
        &self.nth
    }

    /// The plan as host device `device` follows it: itself, or no faults when the plan is
    /// for another device.
    pub fn for_device(&self, device: usize) -> FaultPlan {
        match self.device {
            Some(d) if d != device => FaultPlan::default(),
            _ => self.clone(),
        }
    }
}

/// What a wrapped device saw and failed, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Operations of each kind ([`FaultKind::ALL`]'s order) asked of the device.
    pub seen: [u64; 7],
    /// Operations of each kind failed on purpose.
    pub injected: [u64; 7],
}

/// Decides, operation by operation, which fail (one per wrapped device).
#[derive(Debug)]
pub struct FaultInjector {
    plan: FaultPlan,
    /// Operations armed while running: (kind, the `seen` count that fails).
    armed: Mutex<Vec<(FaultKind, u64)>>,
    seen: [AtomicU64; 7],
    injected: [AtomicU64; 7],
    /// The random plan's generator state (xorshift64*).
    rng: Mutex<u64>,
}

impl FaultInjector {
    /// An injector following `plan`.
    pub fn new(plan: FaultPlan) -> Self {
        let seed = plan.random.as_ref().map_or(1, |(s, _, _)| *s) | 1;
        Self {
            plan,
            armed: Mutex::new(Vec::new()),
            seen: Default::default(),
            injected: Default::default(),
            rng: Mutex::new(seed),
        }
    }

    /// Fails the `k`-th operation of `kind` (counting from 1) from now on, besides what the
    /// plan fails; [`FaultInjector::disarm`] takes back what has not fired.
    pub fn arm(&self, kind: FaultKind, k: u64) {
        // The next one at the soonest (0 would name one already made).
        let at = self.seen[kind.index()].load(Ordering::Relaxed) + k.max(1);
        self.armed.lock().push((kind, at));
    }

    /// Takes back every armed failure that has not fired.
    pub fn disarm(&self) {
        self.armed.lock().clear();
    }

    /// Counts an operation of `kind`; whether it fails.
    pub fn fails(&self, kind: FaultKind) -> bool {
        let n = self.seen[kind.index()].fetch_add(1, Ordering::Relaxed) + 1;
        let mut fail = self.plan.nth.iter().any(|&(k, m)| k == kind && m == n);
        {
            let mut armed = self.armed.lock();
            if let Some(i) = armed.iter().position(|&(k, m)| k == kind && m == n) {
                armed.swap_remove(i);
                fail = true;
            }
        }
        if let Some((_, p, kinds)) = &self.plan.random {
            if kinds.contains(&kind) {
                let mut s = self.rng.lock();
                *s ^= *s >> 12;
                *s ^= *s << 25;
                *s ^= *s >> 27;
                let r = s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
                fail |= (r as f64) / ((1u64 << 53) as f64) < *p;
            }
        }
        if fail {
            self.injected[kind.index()].fetch_add(1, Ordering::Relaxed);
        }
        fail
    }

    /// What the device saw and failed so far.
    pub fn counts(&self) -> FaultCounts {
        let load = |a: &[AtomicU64; 7]| std::array::from_fn(|k| a[k].load(Ordering::Relaxed));
        FaultCounts { seen: load(&self.seen), injected: load(&self.injected) }
    }
}

/// A backend whose operations fail as its [`FaultInjector`] decides.
pub(crate) struct Faulty {
    inner: Box<dyn Backend>,
    injector: Arc<FaultInjector>,
    number: usize,
}

impl Faulty {
    /// `inner` (device `number`), failing as `injector` decides.
    pub(crate) fn new(inner: Box<dyn Backend>, number: usize, injector: Arc<FaultInjector>) -> Self {
        Self { inner, injector, number }
    }

    /// An error if this operation of `kind` fails.
    fn check(&self, kind: FaultKind) -> Result<()> {
        if !self.injector.fails(kind) {
            return Ok(());
        }
        let n = self.injector.counts().seen[kind.index()];
        Err(Error::Driver {
            device: self.number,
            call: kind.call(),
            message: format!("an injected fault: operation {n} of its kind"),
        })
    }
}

impl Backend for Faulty {
    fn description(&self) -> &DeviceDescription {
        self.inner.description()
    }
    fn uid(&self) -> String {
        self.inner.uid()
    }
    fn own_worker(&self) -> Option<std::sync::Arc<crate::backend::worker::DeviceWorker>> {
        self.inner.own_worker()
    }
    fn number(&self) -> usize {
        self.number
    }
    fn renumber(&mut self, number: usize) {
        self.number = number;
        self.inner.renumber(number);
    }
    fn alloc(&self, bytes: usize) -> Result<u64> {
        if self.injector.fails(FaultKind::Alloc) {
            let total = self.inner.mem_info().map_or(0, |m| m.total);
            return Err(Error::OutOfMemory { device: self.number, requested: bytes, free: 0, total });
        }
        self.inner.alloc(bytes)
    }
    fn free(&self, addr: u64, bytes: usize) -> Result<()> {
        self.inner.free(addr, bytes)
    }
    unsafe fn enqueue_write(&self, q: Queue, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        self.check(FaultKind::CopyIn)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.enqueue_write(q, dst, src, bytes) }
    }
    unsafe fn enqueue_read(&self, q: Queue, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        self.check(FaultKind::CopyOut)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.enqueue_read(q, dst, src, bytes) }
    }
    fn enqueue_copy(&self, q: Queue, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.inner.enqueue_copy(q, dst, src, bytes)
    }
    fn enqueue_memset(&self, q: Queue, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.check(FaultKind::Fill)?;
        self.inner.enqueue_memset(q, dst, value, bytes)
    }
    fn record(&self, q: Queue) -> Result<Event> {
        self.inner.record(q)
    }
    fn sync_event(&self, e: &Event) -> Result<()> {
        // The wait happens either way (the work is not abandoned); its failure is reported.
        let waited = self.inner.sync_event(e);
        self.check(FaultKind::EventSync).and(waited)
    }
    fn event_done(&self, e: &Event) -> Result<bool> {
        self.inner.event_done(e)
    }
    fn sync_queue(&self, q: Queue) -> Result<()> {
        let waited = self.inner.sync_queue(q);
        self.check(FaultKind::EventSync).and(waited)
    }
    fn record_point(&self, q: Queue) -> Result<Event> {
        self.inner.record_point(q)
    }
    fn enqueue_wait(&self, q: Queue, e: &Event, from: &dyn Backend) -> Result<()> {
        self.inner.enqueue_wait(q, e, from)
    }
    fn stamp(&self, q: Queue) -> Result<Option<Event>> {
        // A trace's own timestamps are no operation of the program's: never failed.
        self.inner.stamp(q)
    }
    fn stamp_time(&self, s: &Event, wait: bool) -> Result<Option<std::time::Instant>> {
        self.inner.stamp_time(s, wait)
    }
    unsafe fn write(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        self.check(FaultKind::CopyIn)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.write(dst, src, bytes) }
    }
    unsafe fn read(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        self.check(FaultKind::CopyOut)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.read(dst, src, bytes) }
    }
    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.inner.copy(dst, src, bytes)
    }
    fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.check(FaultKind::Fill)?;
        self.inner.memset(dst, value, bytes)
    }
    fn enqueue_copy_from_peer(
        &self,
        q: Queue,
        dst: u64,
        src: &dyn Backend,
        src_addr: u64,
        bytes: usize,
    ) -> Result<()> {
        self.inner.enqueue_copy_from_peer(q, dst, src, src_addr, bytes)
    }
    fn copy_from_peer(&self, dst: u64, src: &dyn Backend, src_addr: u64, bytes: usize) -> Result<()> {
        self.inner.copy_from_peer(dst, src, src_addr, bytes)
    }
    fn prepare(&self, kernel: &Kernel) -> Result<()> {
        self.inner.prepare(kernel)
    }
    fn enqueue_launch(&self, q: Queue, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        self.check(FaultKind::Launch)?;
        self.inner.enqueue_launch(q, kernel, n, args)
    }
    fn capture_graph(&self, launches: &[RecordedLaunch]) -> Result<Option<Graph>> {
        self.inner.capture_graph(launches)
    }
    fn enqueue_graph(&self, graph: &Graph) -> Result<()> {
        self.check(FaultKind::Launch)?;
        self.inner.enqueue_graph(graph)
    }
    fn launch_geometry(&self, kernel: &Kernel, n: usize) -> Option<(u32, u32)> {
        self.inner.launch_geometry(kernel, n)
    }
    fn launch(&self, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        self.check(FaultKind::Launch)?;
        self.inner.launch(kernel, n, args)
    }
    fn has_blas(&self) -> bool {
        self.inner.has_blas()
    }
    fn prepare_blas(&self) -> Result<()> {
        self.inner.prepare_blas()
    }
    fn enqueue_gemm(&self, g: &Gemm, ty: ElementType, ops: GemmOperands) -> Result<()> {
        self.check(FaultKind::Launch)?;
        self.inner.enqueue_gemm(g, ty, ops)
    }
    fn gemm(&self, g: &Gemm, ty: ElementType, ops: GemmOperands) -> Result<()> {
        self.check(FaultKind::Launch)?;
        self.inner.gemm(g, ty, ops)
    }
    fn synchronize(&self) -> Result<()> {
        let waited = self.inner.synchronize();
        self.check(FaultKind::EventSync).and(waited)
    }
    fn mem_info(&self) -> Result<MemInfo> {
        self.inner.mem_info()
    }
    fn interop(&self) -> Option<Interop> {
        self.inner.interop()
    }
    fn runs_current_thread(&self) -> bool {
        self.inner.runs_current_thread()
    }
    fn wants_staging(&self) -> bool {
        self.inner.wants_staging()
    }
    unsafe fn enqueue_copy_2d(&self, q: Queue, c: &Copy2d) -> Result<bool> {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.enqueue_copy_2d(q, c) }
    }
    unsafe fn copy_2d(&self, c: &Copy2d) -> Result<bool> {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.copy_2d(c) }
    }
    unsafe fn register_host(&self, ptr: *mut u8, bytes: usize) -> Result<bool> {
        self.check(FaultKind::Pin)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.register_host(ptr, bytes) }
    }
    unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.unregister_host(ptr) }
    }
    fn fault_injector(&self) -> Option<&FaultInjector> {
        Some(&self.injector)
    }
    fn as_any(&self) -> &dyn Any {
        self.inner.as_any()
    }
}
