//! Devices and the backends that drive them.
//!
//! `Backend` is the only interface that knows how a device allocates, copies and runs
//! kernels; everything above it (present tables, map clauses, the memory pool, memcpy
//! between devices) is written once, in the spirit of LLVM's offload plugins. One file per
//! backend: `host` (always compiled: separate memory, an in-order queue, kernels as Rust
//! functions on a `rayon` pool) and `cuda` (cargo feature `cuda`, on by default). Beside
//! them, what the backends share: the machine's topology ([`topology`], through hwloc),
//! each device's bound worker thread (`worker`), and the compiled-kernel cache on disk
//! ([`kernel_cache`]).

pub mod faults;
pub use faults::{FaultCounts, FaultInjector, FaultKind, FaultPlan};
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod hip;
pub(crate) mod host;
mod host_avx512;
mod host_gemm;
mod host_widened;
pub mod kernel_cache;
pub(crate) mod platform;
pub mod topology;
pub(crate) mod worker;
pub(crate) use platform::Platform;

/// The GPU backends compiled into this build, in the order their devices are numbered
/// (host devices come after them).
pub fn compiled_backends() -> &'static [BackendKind] {
    match (cfg!(feature = "cuda"), cfg!(feature = "hip")) {
        (true, true) => &[BackendKind::Cuda, BackendKind::Hip],
        (true, false) => &[BackendKind::Cuda],
        (false, true) => &[BackendKind::Hip],
        (false, false) => &[],
    }
}

/// The platforms compiled into this build, in [`compiled_backends`] order.
pub(crate) fn platforms() -> Vec<Box<dyn Platform>> {
    let cuda: Option<Box<dyn Platform>> = {
        #[cfg(feature = "cuda")]
        let p = Some(Box::new(cuda::CudaPlatform) as Box<dyn Platform>);
        #[cfg(not(feature = "cuda"))]
        let p = None;
        p
    };
    let hip: Option<Box<dyn Platform>> = {
        #[cfg(feature = "hip")]
        let p = Some(Box::new(hip::HipPlatform) as Box<dyn Platform>);
        #[cfg(not(feature = "hip"))]
        let p = None;
        p
    };
    cuda.into_iter().chain(hip).collect()
}

/// Compiles `kernel`'s CUDA C source with NVRTC for `arch` (e.g. `"sm_90"`) without any
/// device, as a launch on a GPU of that architecture would; the PTX's size in bytes.
/// Errors: no CUDA source, NVRTC not loadable (`libnvrtc.so`), or the compiler's log. For
/// checking sources on machines without a GPU (`scripts/nvrtc-check.sh`).
///
/// ```
/// let k = offload::Kernel::from_cuda_source(
///     "zero".into(),
///     r#"extern "C" __global__ void zero(float* x, unsigned long long n) {
///         unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
///         if (i < n) x[i] = 0.0f; }"#.into(),
/// );
/// match offload::backend::compile_cuda(&k, "sm_90") {
///     Ok(ptx_bytes) => assert!(ptx_bytes > 0),
///     // Without libnvrtc (no CUDA here) the error says so.
///     Err(e) => assert!(e.to_string().contains("NVRTC"), "{e}"),
/// }
/// ```
#[cfg(feature = "cuda")]
pub fn compile_cuda(kernel: &Kernel, arch: &'static str) -> Result<usize> {
    let src = kernel.cuda_source().ok_or(crate::Error::NoKernelImpl {
        device: 0,
        kernel: kernel.name(),
        backend: "cuda",
    })?;
    cuda::compile(0, kernel.name(), src, arch).map(|ptx| ptx.to_src().len())
}

/// Compiles `kernel`'s HIP source ([`Kernel::hip_source`]: its own, or its CUDA
/// translated) with NVRTC for `arch`, HIP's warp intrinsics spelled back in CUDA: where no
/// `hiprtc` is, this checks all of a HIP source but HIP's own headers. The PTX's size.
#[cfg(feature = "cuda")]
pub fn compile_hip_with_nvrtc(kernel: &Kernel, arch: &'static str) -> Result<usize> {
    let hip = kernel.hip_source().ok_or(crate::Error::NoKernelImpl {
        device: 0,
        kernel: kernel.name(),
        backend: "hip",
    })?;
    let src = format!(
        "#define __shfl_down(v, o, w) __shfl_down_sync(0xffffffffu, v, o, w)\n\
         #define __shfl_up(v, o, w) __shfl_up_sync(0xffffffffu, v, o, w)\n\
         #define __shfl(v, l, w) __shfl_sync(0xffffffffu, v, l, w)\n{hip}"
    );
    cuda::compile(0, kernel.name(), &src, arch).map(|ptx| ptx.to_src().len())
}

/// Whether NVRTC can be loaded here (so [`compile_cuda`] can compile).
#[cfg(feature = "cuda")]
pub fn nvrtc_present() -> bool {
    // SAFETY: only probes whether the library can be loaded.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

use std::any::Any;
use std::fmt;

use crate::error::{Error, Result};
use crate::gemm::{ElementType, Gemm};
use crate::kernel::{Kernel, KernelArg};

/// Which backend drives a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// A host device: memory separate from the host's, kernels as Rust functions.
    Host,
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
    /// An AMD GPU through HIP.
    Hip,
}

impl BackendKind {
    /// Lower-case name, as used in messages and reports.
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
            BackendKind::Hip => "hip",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A device's native handles, for calling the vendor's own libraries (cuBLAS, cuFFT,
/// hipBLAS, driver code) on the runtime's compute queue, as OpenMP's interop objects give
/// them (`omp_get_interop_ptr(obj, omp_ipr_targetsync, ...)`). The handles stay the
/// runtime's: valid while the runtime lives, never to be destroyed by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interop {
    /// The vendor.
    pub backend: BackendKind,
    /// The driver's device ordinal (`CUdevice`, HIP's device id).
    pub ordinal: i32,
    /// The device's context (`CUcontext`, the primary one); null on HIP, which has none.
    pub context: *mut std::ffi::c_void,
    /// The device's compute queue (`CUstream`, `hipStream_t`): work enqueued on it runs in
    /// order with the runtime's kernels on the device.
    pub stream: *mut std::ffi::c_void,
}

/// What a device says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceDescription {
    /// The backend that drives it.
    pub kind: BackendKind,
    /// Marketing or descriptive name (e.g. "NVIDIA H200", "host device 1").
    pub name: String,
    /// PCI bus id (`dddd:bb:dd.f`) for GPUs; `None` for host devices.
    pub pci_bus_id: Option<String>,
    /// Driver UUID for GPUs; `None` for host devices.
    pub uuid: Option<String>,
}

/// Device memory, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// Free now.
    pub free: usize,
    /// In all.
    pub total: usize,
}

pub use crate::kernel::PARAM_LIMIT;

/// Blocks of the kernel's block size covering `n` work items (at least one); for a
/// grid-stride kernel at most `wave`, the blocks of it the device runs at once.
#[cfg(any(feature = "cuda", feature = "hip"))]
pub(crate) fn blocks_for(kernel: &crate::kernel::Kernel, n: usize, wave: u32) -> u32 {
    let block = kernel.block().max(1);
    let blocks = n.div_ceil(block as usize).clamp(1, i32::MAX as usize) as u32;
    if kernel.is_grid_stride() {
        blocks.min(wave.max(1))
    } else {
        blocks
    }
}

/// One side of a pitched 2-D copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// Host memory at this address.
    Host(usize),
    /// This device's memory at this address.
    Device(u64),
}

/// A pitched 2-D copy: `rows` rows of `row_bytes` bytes; row `r` of a side starts at its
/// base plus `r` times its pitch. Only the CUDA backend reads it (the others copy row by row).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct Copy2d {
    pub dst: Place,
    pub dst_pitch: usize,
    pub src: Place,
    pub src_pitch: usize,
    pub row_bytes: usize,
    pub rows: usize,
}

/// Where a GEMM's operands lie in device memory: A, B, C (which D overwrites) and the
/// bias, each spanning what [`Gemm::extents`] (and `m` for the bias) says, checked by the
/// caller against the device's present table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemmOperands {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub bias: Option<u64>,
}

/// One of a device's in-order queues: a CUDA or HIP stream; on a host device, its worker
/// thread (one queue in fact, so every queue is ordered after every other there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Queue {
    /// Host->device copies.
    CopyIn = 0,
    /// Kernels, fills and copies within the device.
    Compute = 1,
    /// Device->host copies.
    CopyOut = 2,
}

/// A point recorded in one of a device's queues ([`Backend::record`]): reached once the
/// work enqueued there before it has completed. What it holds is the backend's own (a
/// CUDA or HIP event, a host device's completion flag); only the backend that recorded it
/// reads it.
pub(crate) struct Event(Box<dyn Any + Send + Sync>);

impl Event {
    /// Wraps a backend's event.
    pub(crate) fn new(e: impl Any + Send + Sync) -> Self {
        Self(Box::new(e))
    }

    /// The backend's event, if it is of type `T`.
    pub(crate) fn get<T: 'static>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Event")
    }
}

/// A launch as a recording keeps it ([`crate::Recording`]): the kernel, its work items
/// and its arguments, translated to device addresses when it was recorded.
#[derive(Clone, Debug)]
pub(crate) struct RecordedLaunch {
    pub kernel: Kernel,
    pub n: usize,
    pub args: Vec<KernelArg>,
}

/// A backend's replayable form of a recorded body (a CUDA graph); only the backend that
/// made it reads it.
pub(crate) struct Graph(Box<dyn Any + Send + Sync>);

impl Graph {
    /// Wraps a backend's graph.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn new(g: impl Any + Send + Sync) -> Self {
        Self(Box::new(g))
    }

    /// The backend's graph, if it is of type `T`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn get<T: 'static>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Graph")
    }
}

/// The error for an event that another backend recorded.
pub(crate) fn foreign_event(device: usize) -> crate::error::Error {
    crate::error::Error::InvalidArgument {
        routine: "event wait",
        what: format!("device {device}: the event was recorded by a device of another backend"),
    }
}

/// The per-vendor half of a device: allocation, copies, kernels.
///
/// Copies, fills and kernels are *enqueued* on one of the device's in-order [`Queue`]s and return
/// without waiting; [`Backend::record`] marks a point in a queue, and only
/// [`Backend::sync_event`], [`Backend::sync_queue`] and [`Backend::synchronize`] block.
/// The blocking forms the constructs use (`write`, `read`, `copy`, `memset`) are those
/// plus a synchronisation, written once here; so are `launch`, `copy_from_peer`,
/// `copy_2d` and `sgemm` over their enqueued forms. Allocation, freeing and page-locking
/// host memory are the driver's own synchronous calls. Device addresses are plain `u64`s; the
/// generic layer above decides what they mean.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Identity of the device.
    fn description(&self) -> &DeviceDescription;

    /// The device's UID (OpenMP 6.0's `omp_get_uid_from_device`): its driver UUID, else
    /// `PCI:` and its bus id; host devices name themselves.
    fn uid(&self) -> String {
        let d = self.description();
        match (&d.uuid, &d.pci_bus_id) {
            (Some(u), _) => u.clone(),
            (None, Some(bus)) => format!("PCI:{bus}"),
            (None, None) => d.name.clone(),
        }
    }

    /// Gives the device number `number` (its messages name it), when `OMP_AVAILABLE_DEVICES`
    /// leaves out or reorders devices after discovery.
    fn renumber(&mut self, number: usize);

    /// The device number its messages name.
    fn number(&self) -> usize;

    /// The worker its platform started for it, when it has one of its own (host devices
    /// run their work on it); the runtime starts one for the others.
    fn own_worker(&self) -> Option<std::sync::Arc<crate::backend::worker::DeviceWorker>> {
        None
    }

    /// Allocates `bytes > 0` of device memory (no pooling: the pool sits above).
    fn alloc(&self, bytes: usize) -> Result<u64>;

    /// Frees memory that [`Backend::alloc`] returned, after all queued work.
    fn free(&self, addr: u64, bytes: usize) -> Result<()>;

    /// Enqueues a copy of `bytes` from host memory to the device on `q`.
    ///
    /// # Safety
    /// `src` must stay valid for reads of `bytes`, and unchanged, until the queue has
    /// passed the copy (an event recorded after it has completed, or the queue has been
    /// synchronised); `dst..dst+bytes` must lie inside one allocation of this device.
    unsafe fn enqueue_write(&self, q: Queue, dst: u64, src: *const u8, bytes: usize) -> Result<()>;

    /// Enqueues a copy of `bytes` from the device to host memory on `q`.
    ///
    /// # Safety
    /// `dst` must stay valid for writes of `bytes`, and not be otherwise accessed, until
    /// the queue has passed the copy; `src..src+bytes` must lie inside one allocation of
    /// this device.
    unsafe fn enqueue_read(&self, q: Queue, dst: *mut u8, src: u64, bytes: usize) -> Result<()>;

    /// Enqueues a copy of `bytes` between two places of this device's memory on `q`.
    fn enqueue_copy(&self, q: Queue, dst: u64, src: u64, bytes: usize) -> Result<()>;

    /// Enqueues setting `bytes` bytes at `dst` to `value` on `q`.
    fn enqueue_memset(&self, q: Queue, dst: u64, value: u8, bytes: usize) -> Result<()>;

    /// Records the point `q` has reached: the returned event completes when the work
    /// enqueued on `q` before it has.
    fn record(&self, q: Queue) -> Result<Event>;

    /// Records the point `q` has reached for other queues to wait on
    /// ([`Backend::enqueue_wait`]): as [`Backend::record`], but the event carries no
    /// failure of the work before it, which stays for this device's own events and
    /// synchronisations to report in order.
    fn record_point(&self, q: Queue) -> Result<Event> {
        self.record(q)
    }

    /// Blocks until `e` (recorded by this device) has completed; an error of the work
    /// before it, if the device reports one.
    fn sync_event(&self, e: &Event) -> Result<()>;

    /// Whether `e` (recorded by this device) has completed, without blocking; an error of
    /// the work before it, if the device reports one (then it has completed).
    fn event_done(&self, e: &Event) -> Result<bool> {
        self.sync_event(e).map(|()| true)
    }

    /// Blocks until everything enqueued on `q` has completed.
    fn sync_queue(&self, q: Queue) -> Result<()>;

    /// Makes the work enqueued on `q` after this call wait until `e` has completed, `e`
    /// recorded by `from` (another device of this backend, or this one) before this call.
    /// A failure of the work before `e` is `from`'s to report, not this queue's.
    ///
    /// The default blocks the calling thread until `e` has completed, which orders the
    /// queue just as well; backends with device-side waits (CUDA's `cuStreamWaitEvent`, a
    /// host device's worker) return at once. No cycle of waits can form: an event is
    /// recorded before any wait for it is enqueued, and each queue runs in enqueue order.
    fn enqueue_wait(&self, _q: Queue, e: &Event, from: &dyn Backend) -> Result<()> {
        // Its failure is `from`'s: its next synchronising call reports it.
        let _ = from.sync_event(e);
        Ok(())
    }

    /// Records a timestamp in `q` for a timeline trace: a point whose time, once `q` has
    /// reached it, [`Backend::stamp_time`] reads on the host's clock. `None` where the
    /// backend cannot time its queues (the trace then has no device-side slices for it).
    fn stamp(&self, _q: Queue) -> Result<Option<Event>> {
        Ok(None)
    }

    /// When the queue reached stamp `s` (one [`Backend::stamp`] of this device returned), on
    /// the host's clock; `None` while it has not (with `wait`, blocks until it has).
    fn stamp_time(&self, _s: &Event, _wait: bool) -> Result<Option<std::time::Instant>> {
        Ok(None)
    }

    /// Copies `bytes` from host memory to the device (the copy-in queue, waited for).
    ///
    /// # Safety
    /// `src` must be valid for reads of `bytes` for the duration of the call, and
    /// `dst..dst+bytes` must lie inside one allocation of this device.
    unsafe fn write(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: forwarded; the queue is synchronised before `src` is given back.
        unsafe { self.enqueue_write(Queue::CopyIn, dst, src, bytes)? };
        self.sync_queue(Queue::CopyIn)
    }

    /// Copies `bytes` from the device to host memory (the copy-out queue, waited for).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `bytes` and not otherwise accessed during the
    /// call; `src..src+bytes` must lie inside one allocation of this device.
    unsafe fn read(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: forwarded; the queue is synchronised before `dst` is given back.
        unsafe { self.enqueue_read(Queue::CopyOut, dst, src, bytes)? };
        self.sync_queue(Queue::CopyOut)
    }

    /// Copies `bytes` between two places of this device's memory (waited for).
    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.enqueue_copy(Queue::Compute, dst, src, bytes)?;
        self.sync_queue(Queue::Compute)
    }

    /// Sets `bytes` bytes at `dst` to `value` (waited for).
    fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.enqueue_memset(Queue::Compute, dst, value, bytes)?;
        self.sync_queue(Queue::Compute)
    }

    /// Enqueues on `q` a copy from another device's memory into this one's directly (only
    /// for a pair of one vendor's devices that the [`platform::PeerMatrix`] holds); the
    /// source's queues are not waited for: the caller orders the source's writes before it.
    fn enqueue_copy_from_peer(
        &self,
        q: Queue,
        dst: u64,
        src: &dyn Backend,
        src_addr: u64,
        bytes: usize,
    ) -> Result<()>;

    /// [`Backend::enqueue_copy_from_peer`] on the copy-in queue, waited for.
    fn copy_from_peer(&self, dst: u64, src: &dyn Backend, src_addr: u64, bytes: usize) -> Result<()> {
        self.enqueue_copy_from_peer(Queue::CopyIn, dst, src, src_addr, bytes)?;
        self.sync_queue(Queue::CopyIn)
    }

    /// Gets `kernel` ready to launch (GPUs: compiled and loaded), so that a timed run does
    /// not pay for it.
    fn prepare(&self, _kernel: &Kernel) -> Result<()> {
        Ok(())
    }

    /// Enqueues `kernel` over `n` work items on `q`, with arguments already translated to
    /// device addresses. The arguments' values are taken by the call; the memory they name
    /// must stay allocated until the queue has passed the kernel. A failure while it runs
    /// is reported by a later synchronisation.
    fn enqueue_launch(&self, q: Queue, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()>;

    /// Makes `launches` one replayable graph (CUDA: captured on a stream of its own and
    /// instantiated); `None` when the backend has none (host devices replay the list by
    /// enqueuing each launch).
    fn capture_graph(&self, _launches: &[RecordedLaunch]) -> Result<Option<Graph>> {
        Ok(None)
    }

    /// Enqueues a graph that [`Backend::capture_graph`] made on the compute queue.
    fn enqueue_graph(&self, _graph: &Graph) -> Result<()> {
        Err(crate::error::Error::InvalidArgument {
            routine: "replay",
            what: format!("{}: this backend makes no graphs", self.description().name),
        })
    }

    /// The grid and block (in blocks and threads) a launch of `kernel` over `n` items would
    /// use, for the trace (`OFFLOAD_INFO` 0x10); `None` for devices without them (host
    /// devices run items on a thread pool).
    fn launch_geometry(&self, _kernel: &Kernel, _n: usize) -> Option<(u32, u32)> {
        None
    }

    /// Runs `kernel` over `n` work items on the compute queue and waits for it; a failure
    /// while it ran is [`crate::Error::KernelFailed`].
    fn launch(&self, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        self.enqueue_launch(Queue::Compute, kernel, n, args)?;
        self.sync_queue(Queue::Compute).map_err(|e| match e {
            crate::error::Error::Driver { device, message, .. } => {
                crate::error::Error::KernelFailed { device, kernel: kernel.name(), message }
            }
            other => other,
        })
    }

    /// Whether the backend has BLAS ([`Backend::enqueue_gemm`]): an optional capability
    /// (CUDA through cuBLASLt, host devices; not HIP, whose hipBLASLt is not bound).
    fn has_blas(&self) -> bool {
        false
    }

    /// Makes the device's BLAS handle now, when it has one to make (before a GEMM's
    /// timeline span, so that the span is the GEMM's, not the library's start).
    fn prepare_blas(&self) -> Result<()> {
        Ok(())
    }

    /// Enqueues `D = act(alpha op(A) op(B) + beta C + bias)` ([`Gemm`]) on device memory
    /// ([`GemmOperands`], elements of type `ty`) on the compute queue: cuBLASLt on CUDA
    /// devices, [`crate::gemm`]'s host kernel on host devices. Backends without BLAS
    /// ([`Backend::has_blas`]) keep this default, which refuses.
    fn enqueue_gemm(&self, _g: &Gemm, _ty: ElementType, _ops: GemmOperands) -> Result<()> {
        let d = self.description();
        Err(Error::NoKernelImpl { device: self.number(), kernel: "gemm", backend: d.kind.name() })
    }

    /// [`Backend::enqueue_gemm`], waited for.
    fn gemm(&self, g: &Gemm, ty: ElementType, ops: GemmOperands) -> Result<()> {
        self.enqueue_gemm(g, ty, ops)?;
        self.sync_queue(Queue::Compute)
    }

    /// Waits for all work queued on the device.
    fn synchronize(&self) -> Result<()>;

    /// Free and total device memory.
    fn mem_info(&self) -> Result<MemInfo>;

    /// The device's native handles, when it has any (GPUs).
    fn interop(&self) -> Option<Interop> {
        None
    }

    /// Whether the calling thread is one of this device's own kernel threads (a host
    /// device's pool, running that device's kernels).
    fn runs_current_thread(&self) -> bool {
        false
    }

    /// Whether host copies from pageable memory should be staged through pinned buffers
    /// (GPUs: yes; host devices copy directly).
    fn wants_staging(&self) -> bool {
        false
    }

    /// Enqueues a pitched 2-D copy as one driver operation on `q`; `false` (nothing
    /// enqueued) when the backend has none.
    ///
    /// # Safety
    /// Every row of both sides must stay valid memory (host memory on the destination side
    /// not otherwise accessed) until the queue has passed the copy.
    unsafe fn enqueue_copy_2d(&self, _q: Queue, _c: &Copy2d) -> Result<bool> {
        Ok(false)
    }

    /// Runs a pitched 2-D copy as one driver operation (copy-out queue when the
    /// destination is host memory, else copy-in), waited for; `false` when the backend has
    /// none (the caller then copies row by row).
    ///
    /// # Safety
    /// Every row of both sides must be valid memory (host memory for writes on the
    /// destination side, not otherwise accessed during the call).
    unsafe fn copy_2d(&self, c: &Copy2d) -> Result<bool> {
        let q = if matches!(c.dst, Place::Host(_)) { Queue::CopyOut } else { Queue::CopyIn };
        // SAFETY: forwarded; the queue is synchronised before the rows are given back.
        if !unsafe { self.enqueue_copy_2d(q, c)? } {
            return Ok(false);
        }
        self.sync_queue(q).map(|()| true)
    }

    /// Page-locks host memory so copies to and from it run at the link's speed; `false`
    /// when the backend has no such notion (host devices).
    ///
    /// # Safety
    /// `ptr..ptr+bytes` must be host memory that stays allocated until
    /// [`Backend::unregister_host`].
    unsafe fn register_host(&self, _ptr: *mut u8, _bytes: usize) -> Result<bool> {
        Ok(false)
    }

    /// Undoes [`Backend::register_host`].
    ///
    /// # Safety
    /// `ptr` was registered by this device and no copy on it is in flight.
    unsafe fn unregister_host(&self, _ptr: *mut u8) -> Result<()> {
        Ok(())
    }

    /// The injector of a fault-injecting wrapper ([`faults`]); `None` for real devices.
    fn fault_injector(&self) -> Option<&FaultInjector> {
        None
    }

    /// For peer copies between devices of the same backend ([`same_vendor`]).
    fn as_any(&self) -> &dyn Any;
}

/// `src` as a device of the vendor type `D` of device `device`, which copies from it
/// directly: the one downcast of a peer copy (the peer matrix pairs only devices of one
/// vendor, so an error here is the runtime's bug, reported rather than trusted).
pub(crate) fn same_vendor<D: Backend + 'static>(device: usize, src: &dyn Backend) -> Result<&D> {
    src.as_any().downcast_ref::<D>().ok_or_else(|| Error::InvalidArgument {
        routine: "copy_from_peer",
        what: format!(
            "device {device} copies directly only from devices of its own backend, not from device {} ({})",
            src.number(),
            src.description().kind.name()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_platforms_are_the_compiled_backends_in_order() {
        let kinds: Vec<BackendKind> = platforms().iter().map(|p| p.kind()).collect();
        assert_eq!(kinds, compiled_backends());
    }

    #[test]
    fn an_event_gives_back_only_its_own_type() {
        let e = Event::new(5u16);
        assert_eq!(e.get::<u16>(), Some(&5));
        assert!(e.get::<u32>().is_none());
        assert!(matches!(foreign_event(3), crate::error::Error::InvalidArgument { .. }));
    }
}
