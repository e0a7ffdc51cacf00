//! NVIDIA GPUs through `cudarc` (driver API, NVRTC), loaded at run time: the device and
//! its platform here, every raw driver call it makes in [`driver`], kernels compiled by
//! NVRTC in [`nvrtc`], cuBLASLt in [`cublaslt`], NCCL in `nccl` (feature `nccl`).
//!
//! With no `libcuda` on the machine (every CI runner) discovery reports zero CUDA devices
//! and says why; nothing calls into the driver before [`driver::present`] said it is there,
//! because cudarc panics on the first call otherwise.
//!
//! Each device has its primary context and three streams, its three queues: copy-in,
//! compute and copy-out. Copies and fills are enqueued on them; events (`CudaEvent`s,
//! without timing) mark points in them, and the staging pipelines wait on those. Peer
//! access is enabled once per pair at discovery. Kernels are compiled by NVRTC straight
//! to a cubin for the device's architecture (so the driver has no PTX to JIT) on first use,
//! kept per (architecture, kernel) process-wide and on disk per machine
//! ([`crate::kernel_cache`]), and loaded once per device.

mod cublaslt;
mod driver;
#[cfg(feature = "nccl")]
pub(crate) mod nccl;
mod nvrtc;

pub(crate) use nvrtc::compile;

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaFunction, CudaStream, DriverError};
use parking_lot::Mutex;

use self::nvrtc::{build, nvrtc_version, Compiled};
use super::platform::{KernelKey, LoadedKernels, VendorPlatform};
use super::{
    foreign_event, Backend, BackendKind, Copy2d, DeviceDescription, Event, GemmOperands, Graph, MemInfo,
    Queue, RecordedLaunch,
};
use crate::error::{Error, Result};
use crate::gemm::{ElementType, Gemm};
use crate::kernel::{Kernel, KernelArg};

/// Code per (architecture, kernel), shared by every device of that architecture.
fn code_cache() -> &'static Mutex<HashMap<(String, KernelKey), Compiled>> {
    static CACHE: OnceLock<Mutex<HashMap<(String, KernelKey), Compiled>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// One CUDA device.
pub(crate) struct CudaDevice {
    number: usize,
    ordinal: usize,
    ctx: Arc<CudaContext>,
    copy_in: Arc<CudaStream>,
    compute: Arc<CudaStream>,
    copy_out: Arc<CudaStream>,
    arch: &'static str,
    /// Multiprocessors: a grid-stride kernel's wave is this many times the blocks of it
    /// that one holds at once.
    sms: u32,
    description: DeviceDescription,
    /// Each loaded kernel and its wave (the blocks the whole device holds at once).
    functions: LoadedKernels<(CudaFunction, u32)>,
    /// cuBLASLt (handle, workspace, plans), made on first use.
    blas: OnceLock<std::result::Result<Mutex<cublaslt::LtBlas>, String>>,
    /// Events for reuse ([`PooledEvent`]).
    events: EventPool,
    /// The timeline's anchor: a timed event that had completed when the host read the
    /// instant beside it; a stamp's time is that instant plus the time between the two
    /// events. Made at the first stamp.
    clock: OnceLock<std::result::Result<(CudaEvent, std::time::Instant), Error>>,
    /// Timed events for reuse (stamps).
    timed_events: EventPool,
}

/// A timed event of a timeline's stamp ([`Backend::stamp`]), back to its pool when dropped.
struct StampEvent(PooledEvent);

/// Events (without timing) kept for reuse: constructs record one per queued piece of work,
/// and creating and destroying one each time costs more than recording it.
type EventPool = Arc<Mutex<Vec<CudaEvent>>>;

/// Most events a device keeps for reuse.
const POOLED_EVENTS: usize = 256;

/// An event of a device's pool, back to the pool when dropped (re-recording a completed
/// or pending event is allowed: a wait on it then waits for its latest record).
struct PooledEvent {
    event: Option<CudaEvent>,
    pool: EventPool,
}

impl PooledEvent {
    fn get(&self) -> Result<&CudaEvent> {
        self.event.as_ref().ok_or_else(|| Error::InvalidArgument {
            routine: "event wait",
            what: "the event was given back to its pool".into(),
        })
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        let mut pool = self.pool.lock();
        if pool.len() < POOLED_EVENTS {
            pool.extend(self.event.take());
        }
    }
}

/// A recorded body captured as a CUDA graph; launched by one thread at a time (graphs are
/// not internally synchronised).
struct CapturedGraph(Mutex<cudarc::driver::CudaGraph>);

// SAFETY: the graph's handles are used only under the mutex, and the graph keeps its
// context alive; CUDA allows them to be used from any thread one at a time.
unsafe impl Send for CapturedGraph {}
// SAFETY: as above.
unsafe impl Sync for CapturedGraph {}

/// A failed driver call as the runtime's error, naming the device and the call.
fn driver_error(device: usize, call: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Driver { device, call, message: e.to_string() }
}

/// NVIDIA's platform: the CUDA driver's devices.
pub(crate) struct CudaPlatform;

impl VendorPlatform for CudaPlatform {
    type Device = CudaDevice;

    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_count(&self) -> std::result::Result<usize, String> {
        if !driver::present() {
            return Err("libcuda not found: no NVIDIA driver on this machine".into());
        }
        CudaContext::device_count().map(|n| n.max(0) as usize).map_err(|e| e.to_string())
    }

    fn open(&self, number: usize, ordinal: usize) -> Result<CudaDevice> {
        CudaDevice::new(number, ordinal)
    }

    fn enable_peer(&self, a: &CudaDevice, b: &CudaDevice) -> Result<bool> {
        a.enable_peer(b)
    }

    fn details(&self, d: &CudaDevice) -> Option<String> {
        let desc = &d.description;
        Some(format!(
            "{}, {}, {}",
            d.arch,
            desc.pci_bus_id.as_deref().unwrap_or("?"),
            desc.uuid.as_deref().unwrap_or("?")
        ))
    }

    fn opened(&self, _devices: &[CudaDevice]) {
        // Load NVRTC (and read its version, which kernel cache keys hold) beside the
        // program's start rather than in its first launch; without a thread, that launch does.
        let _ = std::thread::Builder::new().name("offload-nvrtc-load".into()).spawn(nvrtc_version);
    }
}

fn format_uuid(u: &sys::CUuuid) -> String {
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

impl CudaDevice {
    fn new(number: usize, ordinal: usize) -> Result<Self> {
        let ctx = CudaContext::new(ordinal).map_err(driver_error(number, "cuCtxCreate (primary context)"))?;
        driver::untrack_events(&ctx);
        let stream = || ctx.new_stream().map_err(driver_error(number, "cuStreamCreate"));
        let (copy_in, compute, copy_out) = (stream()?, stream()?, stream()?);
        let name = ctx.name().map_err(driver_error(number, "cuDeviceGetName"))?;
        let (major, minor) =
            ctx.compute_capability().map_err(driver_error(number, "cuDeviceGetAttribute"))?;
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_error(number, "cuDeviceGetAttribute"))?
            .max(1) as u32;
        let uuid = ctx.uuid().map(|u| format_uuid(&u)).ok();
        let pci = driver::pci_bus_id(&ctx).map_err(driver_error(number, "cuDeviceGetPCIBusId"))?;
        Ok(Self {
            number,
            ordinal,
            ctx,
            copy_in,
            compute,
            copy_out,
            arch,
            sms,
            description: DeviceDescription { kind: BackendKind::Cuda, name, pci_bus_id: Some(pci), uuid },
            functions: LoadedKernels::new(),
            blas: OnceLock::new(),
            events: EventPool::default(),
            clock: OnceLock::new(),
            timed_events: EventPool::default(),
        })
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_error(self.number, "cuCtxSetCurrent"))
    }

    /// Enqueues `kernel` over `n` items on `stream` (one of this device's).
    fn launch_on(&self, stream: sys::CUstream, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        let (f, wave) = self.function(kernel)?;
        self.bind()?;
        // The arguments as one block, as C lays out the function's parameters.
        let mut params = crate::kernel::LaunchParams::new(self.number, kernel, args, n)?;
        let mut size = params.size();
        let block = kernel.block();
        let blocks = super::blocks_for(kernel, n, wave);
        // SAFETY: this device's context is current (bound above); the block matches the
        // kernel's signature by the Kernel convention (arguments in order at C's alignment,
        // then n), its pointers this device's memory translated through the present table;
        // `params` and `size` live through the call.
        unsafe { driver::launch(&f, blocks, block, stream, params.block(), &mut size) }
            .map_err(driver_error(self.number, "cuLaunchKernel"))
    }

    /// cuBLASLt for this device, made on first use.
    fn cublaslt(&self) -> Result<&Mutex<cublaslt::LtBlas>> {
        self.blas
            .get_or_init(|| cublaslt::LtBlas::new(Arc::clone(&self.ctx)).map(Mutex::new))
            .as_ref()
            .map_err(|e| Error::Driver { device: self.number, call: "cublasLtCreate", message: e.clone() })
    }

    /// The stream that is queue `q`.
    fn stream(&self, q: Queue) -> &Arc<CudaStream> {
        match q {
            Queue::CopyIn => &self.copy_in,
            Queue::Compute => &self.compute,
            Queue::CopyOut => &self.copy_out,
        }
    }

    /// Lets this device read `other`'s memory directly, if the hardware can.
    fn enable_peer(&self, other: &CudaDevice) -> Result<bool> {
        driver::enable_peer_access(&self.ctx, &other.ctx)
            .map_err(driver_error(self.number, "cuCtxEnablePeerAccess"))
    }

    fn sync(&self, s: &CudaStream, call: &'static str) -> Result<()> {
        s.synchronize().map_err(driver_error(self.number, call))
    }

    /// Waits for the work of the device's three queues, where all of this runtime's work
    /// on it goes (kernels, copies, GEMMs, NCCL), one queue after another. Not the whole
    /// context (`cuCtxSynchronize`): the primary context is every runtime's of the process,
    /// and a context-wide wait is refused while another thread records a graph on a stream
    /// of its own, and breaks that recording.
    fn sync_queues(&self) -> Result<()> {
        [Queue::CopyIn, Queue::Compute, Queue::CopyOut]
            .into_iter()
            .try_for_each(|q| self.sync(self.stream(q), "cuStreamSynchronize"))
    }

    /// The kernel's function on this device (compiled by NVRTC for this architecture, or
    /// read from the disk cache, on first use in the process; loaded here on first use
    /// here) and its wave: the blocks of it the device holds at once, by the driver's
    /// occupancy calculator.
    fn function(&self, kernel: &Kernel) -> Result<(CudaFunction, u32)> {
        let src = LoadedKernels::<()>::source(self.number, kernel, BackendKind::Cuda, kernel.cuda_source())?;
        self.functions.get_or_load(kernel, src, || self.load(kernel, src))
    }

    /// Loads `kernel` (from `src`) on this device: its code compiled for this architecture
    /// or taken from the caches, and its wave.
    fn load(&self, kernel: &Kernel, src: &'static str) -> Result<(CudaFunction, u32)> {
        let key = (kernel.symbol(), src.as_ptr() as usize);
        let compiled = {
            let mut cache = code_cache().lock();
            match cache.get(&(self.arch.to_string(), key)) {
                Some(c) => c.clone(),
                None => {
                    let c = build(self.number, kernel.name(), src, self.arch, true)?;
                    cache.insert((self.arch.to_string(), key), c.clone());
                    c
                }
            }
        };
        let module = match self.ctx.load_module(compiled.code) {
            Ok(m) => m,
            // A stored cubin the driver refuses (the driver changed under the cache, say)
            // costs a compile, never a launch: compiled afresh, it replaces the entry.
            Err(_) if compiled.from_disk => {
                let fresh = build(self.number, kernel.name(), src, self.arch, false)?;
                code_cache().lock().insert((self.arch.to_string(), key), fresh.clone());
                self.ctx.load_module(fresh.code).map_err(driver_error(self.number, "cuModuleLoadData"))?
            }
            Err(e) => return Err(driver_error(self.number, "cuModuleLoadData")(e)),
        };
        let f = module
            .load_function(kernel.symbol())
            .map_err(driver_error(self.number, "cuModuleGetFunction"))?;
        // Loaded now, so that the launch after `prepare` only queues.
        driver::load_now(&f);
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(kernel.block(), 0, None)
            .map_err(driver_error(self.number, "cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
        let wave = self.sms.saturating_mul(per_sm.max(1));
        Ok((f, wave))
    }

    fn oom_or(&self, requested: usize, call: &'static str) -> impl Fn(DriverError) -> Error + '_ {
        move |e| match e.0 {
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let (free, total) = self.ctx.mem_get_info().unwrap_or((0, 0));
                Error::OutOfMemory { device: self.number, requested, free, total }
            }
            _ => driver_error(self.number, call)(e),
        }
    }
}

impl Backend for CudaDevice {
    fn description(&self) -> &DeviceDescription {
        &self.description
    }

    fn number(&self) -> usize {
        self.number
    }
    fn renumber(&mut self, number: usize) {
        self.number = number;
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        // SAFETY: the context is current; the generic layer allocates no zero-sized block.
        unsafe { driver::malloc(bytes) }.map_err(self.oom_or(bytes, "cuMemAlloc"))
    }

    fn free(&self, addr: u64, _bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: `addr` came from `alloc`; the runtime frees a block only once the work that
        // used it is done (the pool after its events, a retired entry after its last user).
        unsafe { driver::free(addr) }.map_err(driver_error(self.number, "cuMemFree"))
    }

    unsafe fn enqueue_write(&self, q: Queue, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the context is current; the rest is the caller's contract.
        unsafe { driver::copy_to_device(dst, src, bytes, self.stream(q).cu_stream()) }
            .map_err(driver_error(self.number, "cuMemcpyHtoDAsync"))
    }

    unsafe fn enqueue_read(&self, q: Queue, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the context is current; the rest is the caller's contract.
        unsafe { driver::copy_to_host(dst, src, bytes, self.stream(q).cu_stream()) }
            .map_err(driver_error(self.number, "cuMemcpyDtoHAsync"))
    }

    fn enqueue_copy(&self, q: Queue, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the context is current; both ranges are this device's memory (the generic
        // layer's contract).
        unsafe { driver::copy_on_device(dst, src, bytes, self.stream(q).cu_stream()) }
            .map_err(driver_error(self.number, "cuMemcpyDtoDAsync"))
    }

    fn enqueue_memset(&self, q: Queue, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the context is current; `dst..dst+bytes` is this device's memory (the
        // generic layer's contract).
        unsafe { driver::fill(dst, value, bytes, self.stream(q).cu_stream()) }
            .map_err(driver_error(self.number, "cuMemsetD8Async"))
    }

    fn record(&self, q: Queue) -> Result<Event> {
        self.bind()?;
        let reused = self.events.lock().pop();
        let event = match reused {
            Some(e) => e,
            None => {
                let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
                self.ctx.new_event(flags).map_err(driver_error(self.number, "cuEventCreate"))?
            }
        };
        let pooled = PooledEvent { event: Some(event), pool: Arc::clone(&self.events) };
        pooled.get()?.record(self.stream(q)).map_err(driver_error(self.number, "cuEventRecord"))?;
        Ok(Event::new(pooled))
    }

    fn sync_event(&self, e: &Event) -> Result<()> {
        let e = e.get::<PooledEvent>().ok_or_else(|| foreign_event(self.number))?;
        e.get()?.synchronize().map_err(driver_error(self.number, "cuEventSynchronize"))
    }

    fn event_done(&self, e: &Event) -> Result<bool> {
        let e = e.get::<PooledEvent>().ok_or_else(|| foreign_event(self.number))?;
        e.get()?.try_is_complete().map_err(driver_error(self.number, "cuEventQuery"))
    }

    fn stamp(&self, q: Queue) -> Result<Option<Event>> {
        let timed = || {
            self.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver_error(self.number, "cuEventCreate (timed)"))
        };
        let clock = self.clock.get_or_init(|| {
            // On the compute queue, waited for: the instant is read right after it is reached.
            let anchor = timed()?;
            anchor.record(&self.compute).map_err(driver_error(self.number, "cuEventRecord (timed)"))?;
            anchor.synchronize().map_err(driver_error(self.number, "cuEventSynchronize (timed)"))?;
            Ok((anchor, std::time::Instant::now()))
        });
        if let Err(e) = clock {
            return Err(e.clone());
        }
        let reused = self.timed_events.lock().pop();
        let event = match reused {
            Some(e) => e,
            None => timed()?,
        };
        let pooled = PooledEvent { event: Some(event), pool: Arc::clone(&self.timed_events) };
        pooled.get()?.record(self.stream(q)).map_err(driver_error(self.number, "cuEventRecord (timed)"))?;
        Ok(Some(Event::new(StampEvent(pooled))))
    }

    fn stamp_time(&self, s: &Event, wait: bool) -> Result<Option<std::time::Instant>> {
        let s = s.get::<StampEvent>().ok_or_else(|| foreign_event(self.number))?;
        let Some(Ok((anchor, at))) = self.clock.get() else {
            return Err(foreign_event(self.number));
        };
        let s = s.0.get()?;
        if !wait && !s.try_is_complete().map_err(driver_error(self.number, "cuEventQuery"))? {
            return Ok(None);
        }
        let ms = anchor.elapsed_ms(s).map_err(driver_error(self.number, "cuEventElapsedTime"))?;
        Ok(Some(*at + std::time::Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3)))
    }

    fn sync_queue(&self, q: Queue) -> Result<()> {
        let call = match q {
            Queue::CopyIn => "cuStreamSynchronize (copy-in)",
            Queue::Compute => "cuStreamSynchronize (compute)",
            Queue::CopyOut => "cuStreamSynchronize (copy-out)",
        };
        self.sync(self.stream(q), call)
    }

    /// `cuStreamWaitEvent`: the event may be another context's (another GPU's); the event
    /// can be recorded again, or go back to its pool, once the wait is enqueued.
    fn enqueue_wait(&self, q: Queue, e: &Event, _from: &dyn Backend) -> Result<()> {
        let e = e.get::<PooledEvent>().ok_or_else(|| foreign_event(self.number))?;
        self.bind()?;
        self.stream(q).wait(e.get()?).map_err(driver_error(self.number, "cuStreamWaitEvent"))
    }

    fn enqueue_copy_from_peer(
        &self,
        q: Queue,
        dst: u64,
        src: &dyn Backend,
        src_addr: u64,
        bytes: usize,
    ) -> Result<()> {
        let peer: &CudaDevice = super::same_vendor(self.number, src)?;
        self.bind()?;
        // SAFETY: this context is current; both ranges are device memory of their contexts
        // (the caller's contract).
        unsafe {
            driver::copy_from_peer(&self.ctx, dst, &peer.ctx, src_addr, bytes, self.stream(q).cu_stream())
        }
        .map_err(driver_error(self.number, "cuMemcpyPeerAsync"))
    }

    fn prepare(&self, kernel: &Kernel) -> Result<()> {
        self.function(kernel).map(drop)
    }

    fn launch_geometry(&self, kernel: &Kernel, n: usize) -> Option<(u32, u32)> {
        let (_, wave) = self.function(kernel).ok()?;
        Some((super::blocks_for(kernel, n, wave), kernel.block()))
    }

    fn enqueue_launch(&self, q: Queue, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        self.launch_on(self.stream(q).cu_stream(), kernel, n, args)
    }

    fn capture_graph(&self, launches: &[RecordedLaunch]) -> Result<Option<Graph>> {
        // Modules load before the capture (loading is not allowed while capturing).
        for l in launches {
            self.function(&l.kernel)?;
        }
        self.bind()?;
        // A stream of its own, so that the program's other threads' work on the device's
        // queues is not captured.
        let stream = self.ctx.new_stream().map_err(driver_error(self.number, "cuStreamCreate"))?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        stream.begin_capture(mode).map_err(driver_error(self.number, "cuStreamBeginCapture"))?;
        let enqueued =
            launches.iter().try_for_each(|l| self.launch_on(stream.cu_stream(), &l.kernel, l.n, &l.args));
        // The capture always ends, whatever failed.
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        enqueued?;
        let graph =
            ended.map_err(driver_error(self.number, "cuStreamEndCapture"))?.ok_or_else(|| Error::Driver {
                device: self.number,
                call: "cuStreamEndCapture",
                message: "the capture made no graph".into(),
            })?;
        graph.upload().map_err(driver_error(self.number, "cuGraphUpload"))?;
        Ok(Some(Graph::new(CapturedGraph(Mutex::new(graph)))))
    }

    fn enqueue_graph(&self, graph: &Graph) -> Result<()> {
        let g = graph.get::<CapturedGraph>().ok_or_else(|| Error::InvalidArgument {
            routine: "replay",
            what: format!("device {}: the graph was made by a device of another backend", self.number),
        })?;
        self.bind()?;
        let g = g.0.lock();
        // SAFETY: a live graph of this device's context, launched by one thread at a time
        // (the lock); on the compute stream, in order with the device's other work.
        unsafe { driver::launch_graph(g.cu_graph_exec(), self.compute.cu_stream()) }
            .map_err(driver_error(self.number, "cuGraphLaunch"))
    }

    fn has_blas(&self) -> bool {
        true
    }
    fn prepare_blas(&self) -> Result<()> {
        self.cublaslt().map(drop)
    }

    fn enqueue_gemm(&self, g: &Gemm, ty: ElementType, ops: GemmOperands) -> Result<()> {
        let blas = self.cublaslt()?;
        self.bind()?;
        blas.lock().matmul(g, ty, ops, &self.compute).map_err(|message| Error::Driver {
            device: self.number,
            call: "cublasLtMatmul",
            message,
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.sync_queues()
    }

    fn mem_info(&self) -> Result<MemInfo> {
        let (free, total) = self.ctx.mem_get_info().map_err(driver_error(self.number, "cuMemGetInfo"))?;
        Ok(MemInfo { free, total })
    }

    fn wants_staging(&self) -> bool {
        true
    }

    fn interop(&self) -> Option<super::Interop> {
        Some(super::Interop {
            backend: BackendKind::Cuda,
            ordinal: self.ordinal as i32,
            context: self.ctx.cu_ctx().cast(),
            stream: self.compute.cu_stream().cast(),
        })
    }

    unsafe fn enqueue_copy_2d(&self, q: Queue, c: &Copy2d) -> Result<bool> {
        self.bind()?;
        // SAFETY: the context is current; the rows are the caller's contract.
        unsafe { driver::copy_2d(c, self.stream(q).cu_stream()) }
            .map_err(driver_error(self.number, "cuMemcpy2DAsync"))?;
        Ok(true)
    }

    unsafe fn register_host(&self, ptr: *mut u8, bytes: usize) -> Result<bool> {
        self.bind()?;
        // SAFETY: a context is current; the caller keeps the memory until `unregister_host`.
        unsafe { driver::register_host(ptr, bytes) }
            .map_err(driver_error(self.number, "cuMemHostRegister"))?;
        Ok(true)
    }

    unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()> {
        self.bind()?;
        // SAFETY: `ptr` was registered by `register_host`; no copy on it is in flight.
        unsafe { driver::unregister_host(ptr) }.map_err(driver_error(self.number, "cuMemHostUnregister"))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Streams and the context are released by cudarc; finish our work first (this
        // device's queues: another runtime may be recording on the shared context).
        let _ = self.sync_queues();
    }
}
