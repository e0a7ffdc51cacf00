//! NVIDIA GPUs through `cudarc` (driver API, NVRTC), loaded at run time.
//!
//! With no `libcuda` on the machine (every CI runner) discovery reports zero CUDA devices
//! and says why; nothing calls into the driver before `is_culib_present` said it is there,
//! because cudarc panics on the first call otherwise.
//!
//! Each device has its primary context and three streams, its three queues: copy-in,
//! compute and copy-out. Copies and fills are enqueued on them; events (`CudaEvent`s,
//! without timing) mark points in them, and the staging pipelines wait on those. Peer
//! access is enabled once per pair at discovery. Kernels are compiled by NVRTC for the
//! device's architecture on first use, cached per (architecture, kernel) process-wide,
//! and loaded once per device.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaFunction, CudaStream, DriverError};
use cudarc::nvrtc::{CompileOptions, Ptx};
use parking_lot::Mutex;

use super::{
    foreign_event, Backend, BackendKind, Copy2d, DeviceDescription, Event, MemInfo, Place, Platform, Queue,
    Sgemm,
};
use crate::error::{Error, Result};
use crate::kernel::{Kernel, KernelArg};

/// A kernel's identity in the caches: its name and where its source lives.
type KernelKey = (&'static str, usize);

/// PTX per (architecture, kernel), shared by every device of that architecture.
fn ptx_cache() -> &'static Mutex<HashMap<(String, KernelKey), Ptx>> {
    static CACHE: OnceLock<Mutex<HashMap<(String, KernelKey), Ptx>>> = OnceLock::new();
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
    functions: Mutex<HashMap<KernelKey, (CudaFunction, u32)>>,
    /// Ordinals of the devices this one can read directly (peer access enabled).
    peers: Mutex<Vec<usize>>,
    /// cuBLAS on the compute stream, made on first use.
    blas: OnceLock<std::result::Result<Mutex<cudarc::cublas::CudaBlas>, String>>,
}

fn driver(device: usize, call: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Driver { device, call, message: e.to_string() }
}

/// NVIDIA's platform: the CUDA driver's devices.
pub(crate) struct CudaPlatform;

impl Platform for CudaPlatform {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn discover(&self, first: usize) -> (Vec<Box<dyn Backend>>, String) {
        discover(first)
    }
}

/// Discovers the CUDA devices, numbering them from `first_number`. Returns the devices
/// and one line for the device report.
fn discover(first_number: usize) -> (Vec<Box<dyn Backend>>, String) {
    // SAFETY: only probes whether the library can be loaded.
    if !unsafe { sys::is_culib_present() } {
        return (Vec::new(), "cuda: 0 devices (libcuda not found: no NVIDIA driver on this machine)".into());
    }
    let count = match CudaContext::device_count() {
        Ok(n) => n.max(0) as usize,
        Err(e) => return (Vec::new(), format!("cuda: 0 devices ({e})")),
    };
    let mut devices: Vec<CudaDevice> = Vec::new();
    let mut notes = Vec::new();
    for ordinal in 0..count {
        match CudaDevice::new(first_number + devices.len(), ordinal) {
            Ok(d) => devices.push(d),
            Err(e) => notes.push(format!("GPU {ordinal} skipped: {e}")),
        }
    }
    for a in &devices {
        for b in &devices {
            if a.ordinal != b.ordinal {
                match a.enable_peer(b) {
                    Ok(true) => a.peers.lock().push(b.ordinal),
                    Ok(false) => {}
                    Err(e) => notes.push(format!("peer access {}->{}: {e}", a.number, b.number)),
                }
            }
        }
    }
    let mut line = format!("cuda: {} devices", devices.len());
    for d in &devices {
        line.push_str(&format!(
            "; device {} = {} ({}, {}, {})",
            d.number,
            d.description.name,
            d.arch,
            d.description.pci_bus_id.as_deref().unwrap_or("?"),
            d.description.uuid.as_deref().unwrap_or("?")
        ));
    }
    for n in notes {
        line.push_str("; ");
        line.push_str(&n);
    }
    (devices.into_iter().map(|d| Box::new(d) as Box<dyn Backend>).collect(), line)
}

fn format_uuid(u: &sys::CUuuid) -> String {
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

impl CudaDevice {
    fn new(number: usize, ordinal: usize) -> Result<Self> {
        let ctx = CudaContext::new(ordinal).map_err(driver(number, "cuCtxCreate (primary context)"))?;
        // SAFETY: the runtime orders its own streams; slices are not used.
        unsafe { ctx.disable_event_tracking() };
        let stream = || ctx.new_stream().map_err(driver(number, "cuStreamCreate"));
        let (copy_in, compute, copy_out) = (stream()?, stream()?, stream()?);
        let name = ctx.name().map_err(driver(number, "cuDeviceGetName"))?;
        let (major, minor) = ctx.compute_capability().map_err(driver(number, "cuDeviceGetAttribute"))?;
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver(number, "cuDeviceGetAttribute"))?
            .max(1) as u32;
        let uuid = ctx.uuid().map(|u| format_uuid(&u)).ok();
        let mut buf = [0 as std::ffi::c_char; 32];
        // SAFETY: `buf` has room for the 13-byte id and its terminator; the length says so.
        unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, ctx.cu_device()) }
            .result()
            .map_err(driver(number, "cuDeviceGetPCIBusId"))?;
        // SAFETY: the driver wrote a NUL-terminated string into `buf`.
        let pci = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().to_lowercase();
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
            functions: Mutex::new(HashMap::new()),
            peers: Mutex::new(Vec::new()),
            blas: OnceLock::new(),
        })
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver(self.number, "cuCtxSetCurrent"))
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
        let mut can = 0i32;
        // SAFETY: both handles come from live contexts.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), other.ctx.cu_device()) }
            .result()
            .map_err(driver(self.number, "cuDeviceCanAccessPeer"))?;
        if can == 0 {
            return Ok(false);
        }
        self.bind()?;
        // SAFETY: this context is current; the peer context is alive.
        match unsafe { sys::cuCtxEnablePeerAccess(other.ctx.cu_ctx(), 0) }.result() {
            Ok(()) | Err(DriverError(sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)) => Ok(true),
            Err(e) => Err(driver(self.number, "cuCtxEnablePeerAccess")(e)),
        }
    }

    fn sync(&self, s: &CudaStream, call: &'static str) -> Result<()> {
        s.synchronize().map_err(driver(self.number, call))
    }

    /// The kernel's function on this device (compiled by NVRTC for this architecture on
    /// first use anywhere, loaded here on first use here) and its wave: the blocks of it
    /// the device holds at once, by the driver's occupancy calculator.
    fn function(&self, kernel: &Kernel) -> Result<(CudaFunction, u32)> {
        let src = kernel.cuda_source().ok_or(Error::NoKernelImpl {
            device: self.number,
            kernel: kernel.name(),
            backend: "cuda",
        })?;
        let key = (kernel.symbol(), src.as_ptr() as usize);
        if let Some(f) = self.functions.lock().get(&key) {
            return Ok(f.clone());
        }
        let ptx = {
            let mut cache = ptx_cache().lock();
            match cache.get(&(self.arch.to_string(), key)) {
                Some(p) => p.clone(),
                None => {
                    let p = compile(self.number, kernel.name(), src, self.arch)?;
                    cache.insert((self.arch.to_string(), key), p.clone());
                    p
                }
            }
        };
        let module = self.ctx.load_module(ptx).map_err(driver(self.number, "cuModuleLoadData"))?;
        let f = module.load_function(kernel.symbol()).map_err(driver(self.number, "cuModuleGetFunction"))?;
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(kernel.block(), 0, None)
            .map_err(driver(self.number, "cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
        let wave = self.sms.saturating_mul(per_sm.max(1));
        self.functions.lock().insert(key, (f.clone(), wave));
        Ok((f, wave))
    }

    fn oom_or(&self, requested: usize, call: &'static str) -> impl Fn(DriverError) -> Error + '_ {
        move |e| match e.0 {
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let (free, total) = self.ctx.mem_get_info().unwrap_or((0, 0));
                Error::OutOfMemory { device: self.number, requested, free, total }
            }
            _ => driver(self.number, call)(e),
        }
    }
}

pub(crate) fn compile(device: usize, name: &'static str, src: &str, arch: &'static str) -> Result<Ptx> {
    // SAFETY: only probes whether the library can be loaded.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Driver {
            device,
            call: "nvrtcCompileProgram",
            message: format!("NVRTC library not found: cannot compile kernel `{name}`"),
        });
    }
    let opts = CompileOptions { arch: Some(arch), name: Some(format!("{name}.cu")), ..Default::default() };
    cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| Error::Driver {
        device,
        call: "nvrtcCompileProgram",
        message: format!("kernel `{name}` for {arch}: {e}"),
    })
}

impl Backend for CudaDevice {
    fn description(&self) -> &DeviceDescription {
        &self.description
    }

    fn renumber(&mut self, number: usize) {
        self.number = number;
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        // SAFETY: the context is current; `bytes > 0`.
        unsafe { result::malloc_sync(bytes) }.map_err(self.oom_or(bytes, "cuMemAlloc"))
    }

    fn free(&self, addr: u64, _bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: `addr` came from `alloc` and no queued work uses it (every call waits).
        unsafe { result::free_sync(addr) }.map_err(driver(self.number, "cuMemFree"))
    }

    unsafe fn enqueue_write(&self, q: Queue, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller keeps `src` valid for `bytes` until the queue has passed the copy.
        let host = unsafe { std::slice::from_raw_parts(src, bytes) };
        // SAFETY: `dst` is device memory of at least `bytes` (the caller's contract).
        unsafe { result::memcpy_htod_async(dst, host, self.stream(q).cu_stream()) }
            .map_err(driver(self.number, "cuMemcpyHtoDAsync"))
    }

    unsafe fn enqueue_read(&self, q: Queue, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller keeps `dst` valid and untouched until the queue has passed it.
        let host = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
        // SAFETY: `src` is device memory of at least `bytes`.
        unsafe { result::memcpy_dtoh_async(host, src, self.stream(q).cu_stream()) }
            .map_err(driver(self.number, "cuMemcpyDtoHAsync"))
    }

    fn enqueue_copy(&self, q: Queue, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: both ranges are this device's memory (the generic layer's contract).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream(q).cu_stream()) }
            .map_err(driver(self.number, "cuMemcpyDtoDAsync"))
    }

    fn enqueue_memset(&self, q: Queue, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: `dst..dst+bytes` is this device's memory (the generic layer's contract).
        unsafe { result::memset_d8_async(dst, value, bytes, self.stream(q).cu_stream()) }
            .map_err(driver(self.number, "cuMemsetD8Async"))
    }

    fn record(&self, q: Queue) -> Result<Event> {
        self.bind()?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let e = self.stream(q).record_event(flags).map_err(driver(self.number, "cuEventRecord"))?;
        Ok(Event::new(e))
    }

    fn sync_event(&self, e: &Event) -> Result<()> {
        let e = e.get::<CudaEvent>().ok_or_else(|| foreign_event(self.number))?;
        e.synchronize().map_err(driver(self.number, "cuEventSynchronize"))
    }

    fn sync_queue(&self, q: Queue) -> Result<()> {
        let call = match q {
            Queue::CopyIn => "cuStreamSynchronize (copy-in)",
            Queue::Compute => "cuStreamSynchronize (compute)",
            Queue::CopyOut => "cuStreamSynchronize (copy-out)",
        };
        self.sync(self.stream(q), call)
    }

    fn can_access_peer(&self, src: &dyn Backend) -> bool {
        src.as_any().downcast_ref::<CudaDevice>().is_some_and(|s| self.peers.lock().contains(&s.ordinal))
    }

    fn enqueue_copy_from_peer(
        &self,
        q: Queue,
        dst: u64,
        src: &dyn Backend,
        src_addr: u64,
        bytes: usize,
    ) -> Result<()> {
        let peer = src.as_any().downcast_ref::<CudaDevice>().ok_or_else(|| Error::InvalidArgument {
            routine: "copy_from_peer",
            what: "source device is not a CUDA device".into(),
        })?;
        self.bind()?;
        // SAFETY: both ranges are device memory of their contexts (the caller's contract).
        unsafe {
            result::memcpy_peer_async(
                self.ctx.cu_ctx(),
                dst,
                peer.ctx.cu_ctx(),
                src_addr,
                bytes,
                self.stream(q).cu_stream(),
            )
        }
        .map_err(driver(self.number, "cuMemcpyPeerAsync"))
    }

    fn prepare(&self, kernel: &Kernel) -> Result<()> {
        self.function(kernel).map(drop)
    }

    fn launch_geometry(&self, kernel: &Kernel, n: usize) -> Option<(u32, u32)> {
        let (_, wave) = self.function(kernel).ok()?;
        Some((super::blocks_for(kernel, n, wave), kernel.block()))
    }

    fn enqueue_launch(&self, q: Queue, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        let (f, wave) = self.function(kernel)?;
        self.bind()?;
        // Every argument's bytes, then a pointer to each: what cuLaunchKernel reads.
        let mut storage = super::LaunchParams::new(args, n);
        let mut params = storage.pointers();
        let block = kernel.block();
        let blocks = super::blocks_for(kernel, n, wave);
        // SAFETY: the parameters match the kernel's signature by the Kernel convention
        // (arguments in order, then n); pointers are this device's memory, translated
        // through the present table; the driver copies `storage` at the call.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (blocks, 1, 1),
                (block, 1, 1),
                0,
                self.stream(q).cu_stream(),
                &mut params,
            )
        }
        .map_err(driver(self.number, "cuLaunchKernel"))
    }

    fn enqueue_sgemm(&self, g: &Sgemm, a: u64, b: u64, c: u64) -> Result<()> {
        let fail = |message: String| Error::Driver { device: self.number, call: "cublasSgemm", message };
        let blas = self
            .blas
            .get_or_init(|| {
                // SAFETY: only probes whether the library can be loaded.
                if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                    return Err("cuBLAS library not found".into());
                }
                cudarc::cublas::CudaBlas::new(Arc::clone(&self.compute))
                    .map(Mutex::new)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| fail(e.clone()))?;
        let int =
            |v: usize| i32::try_from(v).map_err(|_| fail(format!("dimension {v} exceeds cuBLAS's int")));
        let op = |t: bool| {
            if t {
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (m, n, k, lda, ldb, ldc) =
            (int(g.m)?, int(g.n)?, int(g.k)?, int(g.lda)?, int(g.ldb)?, int(g.ldc)?);
        self.bind()?;
        let blas = blas.lock();
        // SAFETY: `a`, `b`, `c` are this device's memory spanning the operands (checked by
        // the caller against the present table); the handle's stream is this device's
        // compute stream, waited for below; alpha and beta live through the call.
        unsafe {
            cudarc::cublas::result::sgemm(
                *blas.handle(),
                op(g.transa),
                op(g.transb),
                m,
                n,
                k,
                &g.alpha,
                a as usize as *const f32,
                lda,
                b as usize as *const f32,
                ldb,
                &g.beta,
                c as usize as *mut f32,
                ldc,
            )
        }
        .map_err(|e| fail(e.to_string()))
    }

    fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize().map_err(driver(self.number, "cuCtxSynchronize"))
    }

    fn mem_info(&self) -> Result<MemInfo> {
        let (free, total) = self.ctx.mem_get_info().map_err(driver(self.number, "cuMemGetInfo"))?;
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
        let mut p = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: 0,
            srcArray: std::ptr::null_mut(),
            srcPitch: c.src_pitch,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: 0,
            dstArray: std::ptr::null_mut(),
            dstPitch: c.dst_pitch,
            WidthInBytes: c.row_bytes,
            Height: c.rows,
        };
        match c.src {
            Place::Host(h) => {
                p.srcMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_HOST;
                p.srcHost = h as *const c_void;
            }
            Place::Device(d) => p.srcDevice = d,
        }
        match c.dst {
            Place::Host(h) => {
                p.dstMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_HOST;
                p.dstHost = h as *mut c_void;
            }
            Place::Device(d) => p.dstDevice = d,
        }
        // SAFETY: the caller keeps every row of both sides valid until the queue passes it.
        unsafe { sys::cuMemcpy2DAsync_v2(&p, self.stream(q).cu_stream()) }
            .result()
            .map_err(driver(self.number, "cuMemcpy2DAsync"))?;
        Ok(true)
    }

    unsafe fn register_host(&self, ptr: *mut u8, bytes: usize) -> Result<bool> {
        self.bind()?;
        // SAFETY: the caller guarantees `ptr..ptr+bytes` is host memory it owns until
        // `unregister_host`; PORTABLE makes it pinned for every context.
        unsafe { sys::cuMemHostRegister_v2(ptr.cast(), bytes, sys::CU_MEMHOSTREGISTER_PORTABLE) }
            .result()
            .map_err(driver(self.number, "cuMemHostRegister"))?;
        Ok(true)
    }

    unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()> {
        self.bind()?;
        // SAFETY: `ptr` was registered by `register_host`.
        unsafe { sys::cuMemHostUnregister(ptr.cast()) }
            .result()
            .map_err(driver(self.number, "cuMemHostUnregister"))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Streams and the context are released by cudarc; finish our work first.
        let _ = self.ctx.synchronize();
    }
}
