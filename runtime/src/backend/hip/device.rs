//! One AMD GPU through HIP (cargo feature `hip`).
//!
//! The same shape as the CUDA backend: per device three non-blocking streams (copy-in,
//! compute, copy-out) on which operations are queued (a construct waits only where the host
//! needs the result, as on CUDA), peer access enabled per pair at discovery, pinned host
//! memory by `hipHostRegister`, events for staging slots, and kernels compiled at run time
//! by `hiprtc` from the same CUDA C sources (translated by
//! [`crate::kernel::hip_translation`]) for the device's `gcnArchName`. HIP keeps a current
//! device per thread, so every call selects its device first. Every HIP function is called
//! through the runtime loaded at run time ([`super::api`]). There is no BLAS on this backend
//! (hipBLAS is not bound): its `has_blas` is false, and `Device::sgemm` says so.
//!
//! Only built and tested without hardware here (no AMD GPU is lent); see docs/GUIDE.md.

use std::any::Any;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

use super::api::{
    self, HipApi, HipError, RawEvent, RawFunction, RawModule, RawProgram, RawStream, HIP_SUCCESS,
};
use super::support::{hip_error, HIP_ERROR_NO_DEVICE};
use crate::backend::platform::{LoadedKernels, VendorPlatform};
use crate::backend::{foreign_event, Backend, BackendKind, DeviceDescription, Event, MemInfo, Queue};
use crate::error::{Error, Result};
use crate::kernel::{Kernel, KernelArg};

/// The name HIP gives an error code.
fn error_name(api: &HipApi, r: HipError) -> String {
    // SAFETY: hipGetErrorName returns a static string for any code.
    unsafe { CStr::from_ptr((api.hipGetErrorName)(r)) }.to_string_lossy().into_owned()
}

/// A HIP call's result as ours, naming device `device`.
fn check(api: &HipApi, device: usize, call: &'static str, r: HipError) -> Result<()> {
    if r == HIP_SUCCESS {
        return Ok(());
    }
    Err(hip_error(device, call, r, &error_name(api, r), 0, None))
}

/// A stream handle that may cross threads (HIP streams are thread-safe).
struct Stream(RawStream);
// SAFETY: HIP stream handles may be used from any thread.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

/// An event handle, as `Stream`; destroyed when dropped.
struct HipEvent {
    raw: RawEvent,
    api: &'static HipApi,
}
// SAFETY: HIP event handles may be used from any thread.
unsafe impl Send for HipEvent {}
// SAFETY: as above; waiting on an event from several threads is allowed.
unsafe impl Sync for HipEvent {}

impl Drop for HipEvent {
    fn drop(&mut self) {
        // SAFETY: an event made by `hipEventCreateWithFlags`, destroyed once (a recorded
        // event may be destroyed before it completes; HIP releases it then).
        unsafe { (self.api.hipEventDestroy)(self.raw) };
    }
}

/// A loaded kernel function, as `Stream`.
#[derive(Clone, Copy)]
struct Function(RawFunction);
// SAFETY: module functions may be launched from any thread.
unsafe impl Send for Function {}

/// One AMD GPU.
pub(crate) struct HipDevice {
    api: &'static HipApi,
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
        let api = api::api()?;
        let mut count: c_int = 0;
        // SAFETY: a plain query with a valid out-pointer.
        let r = unsafe { (api.hipGetDeviceCount)(&mut count) };
        match r {
            HIP_SUCCESS => Ok(count.max(0) as usize),
            HIP_ERROR_NO_DEVICE => Err("no AMD GPU".into()),
            _ => Err(format!("{} (HIP error {r})", error_name(api, r))),
        }
    }

    fn open(&self, number: usize, ordinal: usize) -> Result<HipDevice> {
        let ordinal = c_int::try_from(ordinal).map_err(|_| Error::Driver {
            device: number,
            call: "hipGetDeviceCount",
            message: format!("device ordinal {ordinal} out of range"),
        })?;
        let api = api::api().map_err(|why| Error::Driver {
            device: number,
            call: "load the HIP runtime",
            message: why.to_string(),
        })?;
        HipDevice::new(api, number, ordinal)
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
    fn new(api: &'static HipApi, number: usize, ordinal: c_int) -> Result<Self> {
        let ck = |call, r| check(api, number, call, r);
        // SAFETY: a valid device ordinal from hipGetDeviceCount.
        ck("hipSetDevice", unsafe { (api.hipSetDevice)(ordinal) })?;
        let mut props = api::DeviceProps([0; 1024]);
        // SAFETY: `props` has room for the ROCm 5 layout this function fills, and its
        // alignment.
        ck("hipGetDeviceProperties", unsafe { (api.hipGetDeviceProperties)(&mut props, ordinal) })?;
        let mut bus = [0 as c_char; 32];
        // SAFETY: the buffer has room for the id and its terminator.
        ck("hipDeviceGetPCIBusId", unsafe {
            (api.hipDeviceGetPCIBusId)(bus.as_mut_ptr(), bus.len() as c_int, ordinal)
        })?;
        let mut bytes = [0u8; 16];
        let uuid = api
            .hipDeviceGetUuid
            // SAFETY: a valid out-pointer of `hipUUID`'s 16 bytes.
            .filter(|get| unsafe { get(&mut bytes, ordinal) } == HIP_SUCCESS)
            .map(|_| format!("GPU-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()));
        let mut streams: Vec<Stream> = Vec::new();
        for _ in 0..3 {
            let mut s: RawStream = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            let r = unsafe { (api.hipStreamCreateWithFlags)(&mut s, api::STREAM_NON_BLOCKING) };
            if let Err(e) = ck("hipStreamCreateWithFlags", r) {
                for made in streams {
                    // SAFETY: made above, with no work on it yet.
                    unsafe { (api.hipStreamDestroy)(made.0) };
                }
                return Err(e);
            }
            streams.push(Stream(s));
        }
        let [a, b, c]: [Stream; 3] = streams.try_into().map_err(|_| Error::Driver {
            device: number,
            call: "hipStreamCreateWithFlags",
            message: "three streams expected".into(),
        })?;
        let arch = props.text(api::PROP_ARCH_NAME, 256);
        let cus = props.int(api::PROP_MULTIPROCESSORS).max(1) as u32;
        let threads_per_cu = props.int(api::PROP_THREADS_PER_MULTIPROCESSOR).max(64) as u32;
        Ok(Self {
            api,
            number,
            ordinal,
            streams: [a, b, c],
            arch: arch.split(':').next().unwrap_or_default().to_string(),
            resident_threads: cus.saturating_mul(threads_per_cu),
            description: DeviceDescription {
                kind: BackendKind::Hip,
                name: props.text(api::PROP_NAME, 256),
                pci_bus_id: Some(c_string(&bus).to_lowercase()),
                uuid,
            },
            functions: LoadedKernels::new(),
        })
    }

    /// A HIP call's result as ours, naming this device.
    fn check(&self, call: &'static str, r: HipError) -> Result<()> {
        check(self.api, self.number, call, r)
    }

    fn select(&self) -> Result<()> {
        // SAFETY: a valid ordinal.
        self.check("hipSetDevice", unsafe { (self.api.hipSetDevice)(self.ordinal) })
    }

    fn sync(&self, q: Queue, call: &'static str) -> Result<()> {
        // SAFETY: a live stream of this device.
        self.check(call, unsafe { (self.api.hipStreamSynchronize)(self.queue(q)) })
    }

    fn enable_peer(&self, peer: c_int) -> Result<bool> {
        let mut can: c_int = 0;
        // SAFETY: valid ordinals and out-pointer.
        self.check("hipDeviceCanAccessPeer", unsafe {
            (self.api.hipDeviceCanAccessPeer)(&mut can, self.ordinal, peer)
        })?;
        if can == 0 {
            return Ok(false);
        }
        self.select()?;
        // SAFETY: enables access from the current device to `peer`.
        match unsafe { (self.api.hipDeviceEnablePeerAccess)(peer, 0) } {
            HIP_SUCCESS | api::HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
            r => self.check("hipDeviceEnablePeerAccess", r).map(|()| false),
        }
    }

    /// The stream that is queue `q`.
    fn queue(&self, q: Queue) -> RawStream {
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
        kind: api::MemcpyKind,
        q: Queue,
    ) -> Result<()> {
        self.select()?;
        // SAFETY: the caller's contract.
        self.check("hipMemcpyAsync", unsafe {
            (self.api.hipMemcpyAsync)(dst, src, bytes, kind, self.queue(q))
        })
    }

    fn function(&self, kernel: &Kernel) -> Result<Function> {
        let src = LoadedKernels::<()>::source(self.number, kernel, BackendKind::Hip, kernel.cuda_source())?;
        self.functions.get_or_load(kernel, src, || self.load(kernel, src))
    }

    /// Loads `kernel` (CUDA C `src`, or its own HIP source) on this device with hiprtc.
    fn load(&self, kernel: &Kernel, src: &str) -> Result<Function> {
        let hip = kernel.hip_source().unwrap_or_else(|| crate::kernel::hip_translation(src).into());
        let code = compile(self.api, self.number, kernel.name(), &hip, &self.arch)?;
        self.select()?;
        let mut module: RawModule = std::ptr::null_mut();
        // SAFETY: `code` is a complete code object from hiprtc; it outlives the call.
        self.check("hipModuleLoadData", unsafe {
            (self.api.hipModuleLoadData)(&mut module, code.as_ptr().cast())
        })?;
        let name = CString::new(kernel.symbol()).map_err(|_| Error::InvalidArgument {
            routine: "hip kernel",
            what: format!("kernel symbol {:?} has a NUL byte", kernel.symbol()),
        })?;
        let mut f: RawFunction = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        self.check("hipModuleGetFunction", unsafe {
            (self.api.hipModuleGetFunction)(&mut f, module, name.as_ptr())
        })?;
        Ok(Function(f))
    }
}

/// Compiles HIP C to a code object for `arch` with hiprtc.
fn compile(api: &HipApi, device: usize, name: &'static str, src: &str, arch: &str) -> Result<Vec<u8>> {
    let fail = |what: String| Error::Driver {
        device,
        call: "hiprtcCompileProgram",
        message: format!("kernel `{name}` for {arch}: {what}"),
    };
    let csrc = CString::new(src).map_err(|_| fail("source has a NUL byte".into()))?;
    let cname = CString::new(format!("{name}.hip")).map_err(|_| fail("name has a NUL byte".into()))?;
    let opt =
        CString::new(format!("--offload-arch={arch}")).map_err(|_| fail("arch has a NUL byte".into()))?;
    let mut prog: RawProgram = std::ptr::null_mut();
    let (null, no_names) = (std::ptr::null(), std::ptr::null());
    // SAFETY: NUL-terminated strings that live through the call; no headers.
    if unsafe { (api.hiprtcCreateProgram)(&mut prog, csrc.as_ptr(), cname.as_ptr(), 0, null, no_names) } != 0
    {
        return Err(fail("hiprtcCreateProgram failed".into()));
    }
    let opts = [opt.as_ptr()];
    // SAFETY: a program made above; one option, NUL-terminated, alive through the call.
    let compiled = unsafe { (api.hiprtcCompileProgram)(prog, 1, opts.as_ptr()) };
    let (size_of, get): (unsafe extern "C" fn(RawProgram, *mut usize) -> c_int, _) = if compiled != 0 {
        (api.hiprtcGetProgramLogSize, api.hiprtcGetProgramLog)
    } else {
        (api.hiprtcGetCodeSize, api.hiprtcGetCode)
    };
    let mut n = 0usize;
    // SAFETY: the program and a valid out-pointer.
    unsafe { size_of(prog, &mut n) };
    let mut out = vec![0 as c_char; n.max(1)];
    // SAFETY: `out` has the `n` bytes the program said it needs (at least one).
    unsafe { get(prog, out.as_mut_ptr()) };
    // SAFETY: made above, destroyed once.
    unsafe { (api.hiprtcDestroyProgram)(&mut prog) };
    if compiled != 0 {
        return Err(fail(c_string(&out)));
    }
    out.truncate(n);
    Ok(out.into_iter().map(|c| c as u8).collect())
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
        let r = unsafe { (self.api.hipMalloc)(&mut p, bytes) };
        if r != HIP_SUCCESS {
            let mem = self.mem_info().ok().map(|m| (m.free, m.total));
            return Err(hip_error(self.number, "hipMalloc", r, &error_name(self.api, r), bytes, mem));
        }
        Ok(p as u64)
    }

    fn free(&self, addr: u64, _bytes: usize) -> Result<()> {
        self.select()?;
        // SAFETY: `addr` came from `alloc`; the runtime frees a block only once the work that
        // used it is done (the pool after its events, a retired entry after its last user).
        self.check("hipFree", unsafe { (self.api.hipFree)(addr as usize as *mut c_void) })
    }

    unsafe fn enqueue_write(&self, q: Queue, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        let kind = api::HOST_TO_DEVICE;
        // SAFETY: the caller keeps `src` valid until the queue has passed the copy.
        unsafe { self.enqueue_memcpy(dst as usize as *mut c_void, src.cast(), bytes, kind, q) }
    }

    unsafe fn enqueue_read(&self, q: Queue, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        let kind = api::DEVICE_TO_HOST;
        // SAFETY: the caller keeps `dst` valid and untouched until the queue has passed it.
        unsafe { self.enqueue_memcpy(dst.cast(), src as usize as *const c_void, bytes, kind, q) }
    }

    fn enqueue_copy(&self, q: Queue, dst: u64, src: u64, bytes: usize) -> Result<()> {
        let kind = api::DEVICE_TO_DEVICE;
        // SAFETY: both ranges are this device's memory (the generic layer's contract).
        unsafe {
            self.enqueue_memcpy(dst as usize as *mut c_void, src as usize as *const c_void, bytes, kind, q)
        }
    }

    fn enqueue_memset(&self, q: Queue, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.select()?;
        // SAFETY: `dst..dst+bytes` is this device's memory.
        let r =
            unsafe { (self.api.hipMemsetD8Async)(dst as usize as *mut c_void, value, bytes, self.queue(q)) };
        self.check("hipMemsetD8Async", r)
    }

    fn record(&self, q: Queue) -> Result<Event> {
        self.select()?;
        let mut ev: RawEvent = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let r = unsafe { (self.api.hipEventCreateWithFlags)(&mut ev, api::EVENT_DISABLE_TIMING) };
        self.check("hipEventCreateWithFlags", r)?;
        let ev = HipEvent { raw: ev, api: self.api };
        // SAFETY: a live event and stream of this device.
        self.check("hipEventRecord", unsafe { (self.api.hipEventRecord)(ev.raw, self.queue(q)) })?;
        Ok(Event::new(ev))
    }

    fn sync_event(&self, e: &Event) -> Result<()> {
        let e = e.get::<HipEvent>().ok_or_else(|| foreign_event(self.number))?;
        // SAFETY: a recorded event of this device, alive while borrowed.
        self.check("hipEventSynchronize", unsafe { (self.api.hipEventSynchronize)(e.raw) })
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
        let peer: &HipDevice = crate::backend::same_vendor(self.number, src)?;
        self.select()?;
        // SAFETY: both ranges are device memory of their devices (the caller's contract).
        let r = unsafe {
            (self.api.hipMemcpyPeerAsync)(
                dst as usize as *mut c_void,
                self.ordinal,
                src_addr as usize as *const c_void,
                peer.ordinal,
                bytes,
                self.queue(q),
            )
        };
        self.check("hipMemcpyPeerAsync", r)
    }

    fn prepare(&self, kernel: &Kernel) -> Result<()> {
        self.function(kernel).map(drop)
    }

    fn launch_geometry(&self, kernel: &Kernel, n: usize) -> Option<(u32, u32)> {
        let block = kernel.block();
        Some((crate::backend::blocks_for(kernel, n, self.resident_threads / block.max(1)), block))
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
        let blocks = crate::backend::blocks_for(kernel, n, self.resident_threads / block.max(1));
        // SAFETY: the block follows the Kernel convention (arguments at C's alignment, then
        // n); pointers are this device's memory; HIP copies the block at the call, while
        // `params` and `size` live.
        let r = unsafe {
            (self.api.hipModuleLaunchKernel)(
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
        self.check("hipModuleLaunchKernel", r)
    }

    fn synchronize(&self) -> Result<()> {
        self.select()?;
        // SAFETY: no arguments.
        self.check("hipDeviceSynchronize", unsafe { (self.api.hipDeviceSynchronize)() })
    }

    fn mem_info(&self) -> Result<MemInfo> {
        self.select()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        self.check("hipMemGetInfo", unsafe { (self.api.hipMemGetInfo)(&mut free, &mut total) })?;
        Ok(MemInfo { free, total })
    }

    fn wants_staging(&self) -> bool {
        true
    }

    fn interop(&self) -> Option<crate::backend::Interop> {
        Some(crate::backend::Interop {
            backend: BackendKind::Hip,
            ordinal: self.ordinal,
            context: std::ptr::null_mut(),
            stream: self.queue(Queue::Compute).cast(),
        })
    }

    unsafe fn register_host(&self, ptr: *mut u8, bytes: usize) -> Result<bool> {
        self.select()?;
        // SAFETY: the caller keeps the memory allocated until `unregister_host`.
        let r = unsafe { (self.api.hipHostRegister)(ptr.cast(), bytes, api::HOST_REGISTER_PORTABLE) };
        self.check("hipHostRegister", r)?;
        Ok(true)
    }

    unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()> {
        self.select()?;
        // SAFETY: registered by `register_host`.
        self.check("hipHostUnregister", unsafe { (self.api.hipHostUnregister)(ptr.cast()) })
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
                    (self.api.hipStreamSynchronize)(s.0);
                    (self.api.hipStreamDestroy)(s.0);
                }
            }
        }
    }
}
