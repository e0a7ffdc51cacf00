//! AMD GPUs through HIP (`hip-sys`, cargo feature `hip`).
//!
//! The same shape as the CUDA backend: per device three non-blocking streams (copy-in,
//! compute, copy-out) on which operations are queued (a construct waits only where the host
//! needs the result, as on CUDA), peer access enabled per pair at discovery, pinned host memory by `hipHostRegister`, events for staging slots,
//! and kernels compiled at run time by `hiprtc` from the same CUDA C sources (translated by
//! [`crate::kernel::hip_translation`]) for the device's `gcnArchName`. HIP keeps a current
//! device per thread, so every call selects its device first. `hip-sys` has no `hiprtc`
//! bindings: the few functions used are declared below (ROCm exports them from
//! `libamdhip64`). There is no BLAS on this backend (hipBLAS is not bound): its `has_blas` is
//! false, and `Device::sgemm` says so.
//!
//! Only built and tested without hardware here (no AMD GPU is lent); see docs/GUIDE.md.

use std::any::Any;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

use hip_sys::hiprt as hip;

use super::hip_support::{hip_error, HIP_ERROR_NO_DEVICE};
use super::platform::{LoadedKernels, VendorPlatform};
use super::{foreign_event, Backend, BackendKind, DeviceDescription, Event, MemInfo, Queue};
use crate::error::{Error, Result};
use crate::kernel::{Kernel, KernelArg};

/// `hiprtcProgram`, opaque.
type HiprtcProgram = *mut c_void;

#[link(name = "amdhip64")]
extern "C" {
    fn hiprtcCreateProgram(
        prog: *mut HiprtcProgram,
        src: *const c_char,
        name: *const c_char,
        num_headers: c_int,
        headers: *const *const c_char,
        include_names: *const *const c_char,
    ) -> c_int;
    fn hiprtcCompileProgram(prog: HiprtcProgram, num_options: c_int, options: *const *const c_char) -> c_int;
    fn hiprtcGetProgramLogSize(prog: HiprtcProgram, size: *mut usize) -> c_int;
    fn hiprtcGetProgramLog(prog: HiprtcProgram, log: *mut c_char) -> c_int;
    fn hiprtcGetCodeSize(prog: HiprtcProgram, size: *mut usize) -> c_int;
    fn hiprtcGetCode(prog: HiprtcProgram, code: *mut c_char) -> c_int;
    fn hiprtcDestroyProgram(prog: *mut HiprtcProgram) -> c_int;
}

/// The name HIP gives an error code.
fn error_name(r: hip::hipError_t) -> String {
    // SAFETY: hipGetErrorName returns a static string for any code.
    unsafe { CStr::from_ptr(hip::hipGetErrorName(r)) }.to_string_lossy().into_owned()
}

/// A HIP call's result as ours.
fn check(device: usize, call: &'static str, r: hip::hipError_t) -> Result<()> {
    if r == hip::hipError_t::hipSuccess {
        return Ok(());
    }
    Err(hip_error(device, call, r as i32, &error_name(r), 0, None))
}

/// A stream handle that may cross threads (HIP streams are thread-safe).
struct Stream(hip::hipStream_t);
// SAFETY: HIP stream handles may be used from any thread.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

/// An event handle, as `Stream`; destroyed when dropped.
struct HipEvent(hip::hipEvent_t);
// SAFETY: HIP event handles may be used from any thread.
unsafe impl Send for HipEvent {}
// SAFETY: as above; waiting on an event from several threads is allowed.
unsafe impl Sync for HipEvent {}

impl Drop for HipEvent {
    fn drop(&mut self) {
        // SAFETY: an event made by `hipEventCreateWithFlags`, destroyed once (a recorded
        // event may be destroyed before it completes; HIP releases it then).
        unsafe { hip::hipEventDestroy(self.0) };
    }
}

/// A loaded kernel function, as `Stream`.
#[derive(Clone, Copy)]
struct Function(hip::hipFunction_t);
// SAFETY: module functions may be launched from any thread.
unsafe impl Send for Function {}

/// One AMD GPU.
pub(crate) struct HipDevice {
    number: usize,
    ordinal: c_int,
    streams: [Stream; 3],
    arch: String,
    /// Threads the device holds at once (CUs x threads per CU): a grid-stride kernel's wave.
    resident_threads: u32,
    description: DeviceDescription,
    functions: LoadedKernels<Function>,
}

/// AMD's platform: the HIP runtime's devices.
pub(crate) struct HipPlatform;

impl VendorPlatform for HipPlatform {
    type Device = HipDevice;

    fn kind(&self) -> BackendKind {
        BackendKind::Hip
    }

    fn device_count(&self) -> std::result::Result<usize, String> {
        let mut count: c_int = 0;
        // SAFETY: a plain query with a valid out-pointer.
        let r = unsafe { hip::hipGetDeviceCount(&mut count) };
        match r {
            hip::hipError_t::hipSuccess => Ok(count.max(0) as usize),
            _ if r as i32 == HIP_ERROR_NO_DEVICE => Err("no AMD GPU".into()),
            _ => Err(format!("HIP error {}", r as i32)),
        }
    }

    fn open(&self, number: usize, ordinal: usize) -> Result<HipDevice> {
        let ordinal = c_int::try_from(ordinal).map_err(|_| Error::Driver {
            device: number,
            call: "hipGetDeviceCount",
            message: format!("device ordinal {ordinal} out of range"),
        })?;
        HipDevice::new(number, ordinal)
    }

    fn enable_peer(&self, a: &HipDevice, b: &HipDevice) -> Result<bool> {
        a.enable_peer(b.ordinal)
    }

    fn details(&self, d: &HipDevice) -> Option<String> {
        Some(format!("{}, {}", d.arch, d.description.pci_bus_id.as_deref().unwrap_or("?")))
    }
}

fn c_string(buf: &[c_char]) -> String {
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    buf[..end].iter().map(|&c| c as u8 as char).collect()
}

impl HipDevice {
    fn new(number: usize, ordinal: c_int) -> Result<Self> {
        let ck = |call, r| check(number, call, r);
        // SAFETY: a valid device ordinal from hipGetDeviceCount.
        ck("hipSetDevice", unsafe { hip::hipSetDevice(ordinal) })?;
        // SAFETY: zeroed memory is a valid value of this plain C struct.
        let mut props: hip::hipDeviceProp_t = unsafe { std::mem::zeroed() };
        // SAFETY: `props` is a valid out-pointer of the bindings' layout (the same size
        // as ROCm 5.2's, checked when the bindings were made).
        ck("hipGetDeviceProperties", unsafe { hip::hipGetDeviceProperties(&mut props, ordinal) })?;
        let mut bus = [0 as c_char; 32];
        // SAFETY: the buffer has room for the id and its terminator.
        ck("hipDeviceGetPCIBusId", unsafe {
            hip::hipDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as c_int, ordinal)
        })?;
        let mut uuid = hip::hipUUID { bytes: [0; 16] };
        // SAFETY: a valid out-pointer.
        let uuid = (unsafe { hip::hipDeviceGetUuid(&mut uuid, ordinal) } == hip::hipError_t::hipSuccess)
            .then(|| {
                let b: Vec<String> = uuid.bytes.iter().map(|&c| format!("{:02x}", c as u8)).collect();
                format!("GPU-{}", b.concat())
            });
        let mut streams = Vec::new();
        for _ in 0..3 {
            let mut s: hip::hipStream_t = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; 1 = hipStreamNonBlocking.
            ck("hipStreamCreateWithFlags", unsafe { hip::hipStreamCreateWithFlags(&mut s, 1) })?;
            streams.push(Stream(s));
        }
        let [a, b, c]: [Stream; 3] = streams.try_into().map_err(|_| Error::Driver {
            device: number,
            call: "hipStreamCreateWithFlags",
            message: "three streams expected".into(),
        })?;
        let arch = c_string(&props.gcnArchName);
        Ok(Self {
            number,
            ordinal,
            streams: [a, b, c],
            arch: arch.split(':').next().unwrap_or_default().to_string(),
            resident_threads: (props.multiProcessorCount.max(1) as u32)
                .saturating_mul(props.maxThreadsPerMultiProcessor.max(64) as u32),
            description: DeviceDescription {
                kind: BackendKind::Hip,
                name: c_string(&props.name),
                pci_bus_id: Some(c_string(&bus).to_lowercase()),
                uuid,
            },
            functions: LoadedKernels::new(),
        })
    }

    fn select(&self) -> Result<()> {
        // SAFETY: a valid ordinal.
        check(self.number, "hipSetDevice", unsafe { hip::hipSetDevice(self.ordinal) })
    }

    fn sync(&self, q: Queue, call: &'static str) -> Result<()> {
        // SAFETY: a live stream of this device.
        check(self.number, call, unsafe { hip::hipStreamSynchronize(self.queue(q)) })
    }

    fn enable_peer(&self, peer: c_int) -> Result<bool> {
        let mut can: c_int = 0;
        // SAFETY: valid ordinals and out-pointer.
        check(self.number, "hipDeviceCanAccessPeer", unsafe {
            hip::hipDeviceCanAccessPeer(&mut can, self.ordinal, peer)
        })?;
        if can == 0 {
            return Ok(false);
        }
        self.select()?;
        // SAFETY: enables access from the current device to `peer`.
        match unsafe { hip::hipDeviceEnablePeerAccess(peer, 0) } {
            hip::hipError_t::hipSuccess | hip::hipError_t::hipErrorPeerAccessAlreadyEnabled => Ok(true),
            r => check(self.number, "hipDeviceEnablePeerAccess", r).map(|()| false),
        }
    }

    /// The stream that is queue `q`.
    fn queue(&self, q: Queue) -> hip::hipStream_t {
        self.streams[q as usize].0
    }

    /// Enqueues a `hipMemcpyAsync` on queue `q`.
    ///
    /// # Safety
    /// Both ranges valid for `bytes` until the queue has passed the copy.
    unsafe fn enqueue_memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: hip::hipMemcpyKind,
        q: Queue,
    ) -> Result<()> {
        self.select()?;
        // SAFETY: the caller's contract.
        check(self.number, "hipMemcpyAsync", unsafe {
            hip::hipMemcpyAsync(dst, src, bytes, kind, self.queue(q))
        })
    }

    fn function(&self, kernel: &Kernel) -> Result<Function> {
        let src = LoadedKernels::<()>::source(self.number, kernel, BackendKind::Hip, kernel.cuda_source())?;
        self.functions.get_or_load(kernel, src, || self.load(kernel, src))
    }

    /// Loads `kernel` (CUDA C `src`, or its own HIP source) on this device with hiprtc.
    fn load(&self, kernel: &Kernel, src: &str) -> Result<Function> {
        let hip = kernel.hip_source().unwrap_or_else(|| crate::kernel::hip_translation(src).into());
        let code = compile(self.number, kernel.name(), &hip, &self.arch)?;
        self.select()?;
        let mut module: hip::hipModule_t = std::ptr::null_mut();
        // SAFETY: `code` is a complete code object from hiprtc; it outlives the call.
        check(self.number, "hipModuleLoadData", unsafe {
            hip::hipModuleLoadData(&mut module, code.as_ptr().cast())
        })?;
        let name = CString::new(kernel.symbol()).map_err(|_| Error::InvalidArgument {
            routine: "hip kernel",
            what: format!("kernel symbol {:?} has a NUL byte", kernel.symbol()),
        })?;
        let mut f: hip::hipFunction_t = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        check(self.number, "hipModuleGetFunction", unsafe {
            hip::hipModuleGetFunction(&mut f, module, name.as_ptr())
        })?;
        Ok(Function(f))
    }
}

/// Compiles HIP C to a code object for `arch` with hiprtc.
fn compile(device: usize, name: &'static str, src: &str, arch: &str) -> Result<Vec<u8>> {
    let fail = |what: String| Error::Driver {
        device,
        call: "hiprtcCompileProgram",
        message: format!("kernel `{name}` for {arch}: {what}"),
    };
    let csrc = CString::new(src).map_err(|_| fail("source has a NUL byte".into()))?;
    let cname = CString::new(format!("{name}.hip")).map_err(|_| fail("name has a NUL byte".into()))?;
    let opt =
        CString::new(format!("--offload-arch={arch}")).map_err(|_| fail("arch has a NUL byte".into()))?;
    let mut prog: HiprtcProgram = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings that live through the calls; no headers.
    unsafe {
        if hiprtcCreateProgram(
            &mut prog,
            csrc.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        ) != 0
        {
            return Err(fail("hiprtcCreateProgram failed".into()));
        }
        let opts = [opt.as_ptr()];
        let compiled = hiprtcCompileProgram(prog, 1, opts.as_ptr());
        let result = if compiled != 0 {
            let mut n = 0usize;
            hiprtcGetProgramLogSize(prog, &mut n);
            let mut log = vec![0 as c_char; n.max(1)];
            hiprtcGetProgramLog(prog, log.as_mut_ptr());
            Err(fail(c_string(&log)))
        } else {
            let mut n = 0usize;
            hiprtcGetCodeSize(prog, &mut n);
            let mut code = vec![0u8; n];
            hiprtcGetCode(prog, code.as_mut_ptr().cast());
            Ok(code)
        };
        hiprtcDestroyProgram(&mut prog);
        result
    }
}

impl Backend for HipDevice {
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
        self.select()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let r = unsafe { hip::hipMalloc(&mut p, bytes) };
        if r != hip::hipError_t::hipSuccess {
            let mem = self.mem_info().ok().map(|m| (m.free, m.total));
            return Err(hip_error(self.number, "hipMalloc", r as i32, &error_name(r), bytes, mem));
        }
        Ok(p as u64)
    }

    fn free(&self, addr: u64, _bytes: usize) -> Result<()> {
        self.select()?;
        // SAFETY: `addr` came from `alloc`; the runtime frees a block only once the work that
        // used it is done (the pool after its events, a retired entry after its last user).
        check(self.number, "hipFree", unsafe { hip::hipFree(addr as usize as *mut c_void) })
    }

    unsafe fn enqueue_write(&self, q: Queue, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        let kind = hip::hipMemcpyKind::hipMemcpyHostToDevice;
        // SAFETY: the caller keeps `src` valid until the queue has passed the copy.
        unsafe { self.enqueue_memcpy(dst as usize as *mut c_void, src.cast(), bytes, kind, q) }
    }

    unsafe fn enqueue_read(&self, q: Queue, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        let kind = hip::hipMemcpyKind::hipMemcpyDeviceToHost;
        // SAFETY: the caller keeps `dst` valid and untouched until the queue has passed it.
        unsafe { self.enqueue_memcpy(dst.cast(), src as usize as *const c_void, bytes, kind, q) }
    }

    fn enqueue_copy(&self, q: Queue, dst: u64, src: u64, bytes: usize) -> Result<()> {
        let kind = hip::hipMemcpyKind::hipMemcpyDeviceToDevice;
        // SAFETY: both ranges are this device's memory (the generic layer's contract).
        unsafe {
            self.enqueue_memcpy(dst as usize as *mut c_void, src as usize as *const c_void, bytes, kind, q)
        }
    }

    fn enqueue_memset(&self, q: Queue, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.select()?;
        // SAFETY: `dst..dst+bytes` is this device's memory.
        let r = unsafe { hip::hipMemsetD8Async(dst as usize as *mut c_void, value, bytes, self.queue(q)) };
        check(self.number, "hipMemsetD8Async", r)
    }

    fn record(&self, q: Queue) -> Result<Event> {
        self.select()?;
        let mut ev: hip::hipEvent_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; 2 = hipEventDisableTiming.
        check(self.number, "hipEventCreateWithFlags", unsafe { hip::hipEventCreateWithFlags(&mut ev, 2) })?;
        let ev = HipEvent(ev);
        // SAFETY: a live event and stream of this device.
        check(self.number, "hipEventRecord", unsafe { hip::hipEventRecord(ev.0, self.queue(q)) })?;
        Ok(Event::new(ev))
    }

    fn sync_event(&self, e: &Event) -> Result<()> {
        let e = e.get::<HipEvent>().ok_or_else(|| foreign_event(self.number))?;
        // SAFETY: a recorded event of this device, alive while borrowed.
        check(self.number, "hipEventSynchronize", unsafe { hip::hipEventSynchronize(e.0) })
    }

    fn sync_queue(&self, q: Queue) -> Result<()> {
        self.sync(q, "hipStreamSynchronize")
    }

    fn enqueue_copy_from_peer(
        &self,
        q: Queue,
        dst: u64,
        src: &dyn Backend,
        src_addr: u64,
        bytes: usize,
    ) -> Result<()> {
        let peer: &HipDevice = super::same_vendor(self.number, src)?;
        self.select()?;
        // SAFETY: both ranges are device memory of their devices (the caller's contract).
        let r = unsafe {
            hip::hipMemcpyPeerAsync(
                dst as usize as *mut c_void,
                self.ordinal,
                src_addr as usize as *const c_void,
                peer.ordinal,
                bytes,
                self.queue(q),
            )
        };
        check(self.number, "hipMemcpyPeerAsync", r)
    }

    fn prepare(&self, kernel: &Kernel) -> Result<()> {
        self.function(kernel).map(drop)
    }

    fn launch_geometry(&self, kernel: &Kernel, n: usize) -> Option<(u32, u32)> {
        let block = kernel.block();
        Some((super::blocks_for(kernel, n, self.resident_threads / block.max(1)), block))
    }

    fn enqueue_launch(&self, q: Queue, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<()> {
        let f = self.function(kernel)?;
        self.select()?;
        let mut params = crate::kernel::LaunchParams::new(self.number, kernel, args, n)?;
        let mut size = params.size();
        // HIP_LAUNCH_PARAM_BUFFER_POINTER, the block, HIP_LAUNCH_PARAM_BUFFER_SIZE, its
        // size, HIP_LAUNCH_PARAM_END (hip_runtime_api.h's values).
        let mut extra: [*mut std::ffi::c_void; 5] = [
            std::ptr::without_provenance_mut(1),
            params.block(),
            std::ptr::without_provenance_mut(2),
            (&mut size as *mut usize).cast(),
            std::ptr::without_provenance_mut(3),
        ];
        let block = kernel.block();
        let blocks = super::blocks_for(kernel, n, self.resident_threads / block.max(1));
        // SAFETY: the block follows the Kernel convention (arguments at C's alignment, then
        // n); pointers are this device's memory; HIP copies the block at the call, while
        // `params` and `size` live.
        let r = unsafe {
            hip::hipModuleLaunchKernel(
                f.0,
                blocks,
                1,
                1,
                block,
                1,
                1,
                0,
                self.queue(q),
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        };
        check(self.number, "hipModuleLaunchKernel", r)
    }

    fn synchronize(&self) -> Result<()> {
        self.select()?;
        // SAFETY: no arguments.
        check(self.number, "hipDeviceSynchronize", unsafe { hip::hipDeviceSynchronize() })
    }

    fn mem_info(&self) -> Result<MemInfo> {
        self.select()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        check(self.number, "hipMemGetInfo", unsafe { hip::hipMemGetInfo(&mut free, &mut total) })?;
        Ok(MemInfo { free, total })
    }

    fn wants_staging(&self) -> bool {
        true
    }

    fn interop(&self) -> Option<super::Interop> {
        Some(super::Interop {
            backend: BackendKind::Hip,
            ordinal: self.ordinal,
            context: std::ptr::null_mut(),
            stream: self.queue(Queue::Compute).cast(),
        })
    }

    unsafe fn register_host(&self, ptr: *mut u8, bytes: usize) -> Result<bool> {
        self.select()?;
        // SAFETY: the caller keeps the memory allocated until `unregister_host`; 1 = portable.
        check(self.number, "hipHostRegister", unsafe { hip::hipHostRegister(ptr.cast(), bytes, 1) })?;
        Ok(true)
    }

    unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()> {
        self.select()?;
        // SAFETY: registered by `register_host`.
        check(self.number, "hipHostUnregister", unsafe { hip::hipHostUnregister(ptr.cast()) })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for HipDevice {
    fn drop(&mut self) {
        if self.select().is_ok() {
            for s in &self.streams {
                // SAFETY: streams created in `new`, destroyed once, after their work.
                unsafe {
                    hip::hipStreamSynchronize(s.0);
                    hip::hipStreamDestroy(s.0);
                }
            }
        }
    }
}
