//! Every raw CUDA driver call of the CUDA backend, in one place, each with the contract that
//! makes it sound: the `sys` and `result` functions of `cudarc` that its safe `CudaContext`,
//! `CudaStream` and `CudaFunction` do not cover (copies on the device's own streams, pinned
//! host memory, peer access, launches with an argument block, graphs). The device
//! ([`super::CudaDevice`]) calls only these and cudarc's safe API; errors come back as
//! `DriverError`, which the device names with its number and the call.

use std::ffi::{c_char, c_void, CStr};

use cudarc::driver::{result, sys, CudaContext, CudaFunction, DriverError};

use crate::backend::{Copy2d, Place};

/// Whether `libcuda` can be loaded: nothing else here may be called before it said yes, as
/// cudarc panics on the first call into a driver it cannot load.
pub(super) fn present() -> bool {
    // SAFETY: only probes whether the library can be loaded.
    unsafe { sys::is_culib_present() }
}

/// Turns off cudarc's tracking of reads and writes by events: the runtime orders the work
/// on its own streams itself, and passes cudarc no slices to track.
pub(super) fn untrack_events(ctx: &CudaContext) {
    // SAFETY: as said: nothing of cudarc's that tracking protects is used.
    unsafe { ctx.disable_event_tracking() };
}

/// The device's PCI bus id, lower case (`0000:3b:00.0`).
pub(super) fn pci_bus_id(ctx: &CudaContext) -> Result<String, DriverError> {
    let mut buf = [0 as c_char; 32];
    // SAFETY: `buf` has room for the 13-byte id and its terminator; the length says so.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, ctx.cu_device()) }.result()?;
    // SAFETY: the driver wrote a NUL-terminated string into `buf` (zeroed, so a NUL ends it
    // in any case).
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().to_lowercase())
}

/// Lets `from` read `to`'s memory directly if the hardware can; whether it does now.
pub(super) fn enable_peer_access(from: &CudaContext, to: &CudaContext) -> Result<bool, DriverError> {
    let mut can = 0i32;
    // SAFETY: both handles come from live contexts; `can` is a valid out-pointer.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, from.cu_device(), to.cu_device()) }.result()?;
    if can == 0 {
        return Ok(false);
    }
    from.bind_to_thread()?;
    // SAFETY: `from`'s context is current; `to`'s is alive.
    match unsafe { sys::cuCtxEnablePeerAccess(to.cu_ctx(), 0) }.result() {
        Ok(()) | Err(DriverError(sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)) => Ok(true),
        Err(e) => Err(e),
    }
}

/// Loads `f` now rather than at its first launch (CUDA's lazy loading), so that a launch
/// only queues: a lazy load can wait for the device's running work. A failure only leaves
/// the load to the launch, which reports what is wrong.
pub(super) fn load_now(f: &CudaFunction) {
    // SAFETY: a live function handle of a loaded module.
    let _ = unsafe { sys::cuFuncLoad(f.cu_function()) };
}

/// `bytes` of device memory in the current context.
///
/// # Safety
/// The device's context is current on this thread and `bytes > 0`.
pub(super) unsafe fn malloc(bytes: usize) -> Result<u64, DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::malloc_sync(bytes) }
}

/// Frees what [`malloc`] gave.
///
/// # Safety
/// The context is current, `addr` came from `malloc` and no queued work uses it any more.
pub(super) unsafe fn free(addr: u64) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::free_sync(addr) }
}

/// Queues a copy of `bytes` from host `src` to device `dst` on `stream`.
///
/// # Safety
/// The context is current; `src` stays valid for `bytes` until the stream has passed the
/// copy; `dst` is device memory of at least `bytes`.
pub(super) unsafe fn copy_to_device(
    dst: u64,
    src: *const u8,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: `src` is valid for `bytes` (the caller's contract).
    let host = unsafe { std::slice::from_raw_parts(src, bytes) };
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_htod_async(dst, host, stream) }
}

/// Queues a copy of `bytes` from device `src` to host `dst` on `stream`.
///
/// # Safety
/// The context is current; `dst` stays valid and untouched until the stream has passed the
/// copy; `src` is device memory of at least `bytes`.
pub(super) unsafe fn copy_to_host(
    dst: *mut u8,
    src: u64,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: `dst` is valid for `bytes` and no one else touches it (the caller's contract).
    let host = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_dtoh_async(host, src, stream) }
}

/// Queues a copy of `bytes` between two ranges of the device's memory on `stream`.
///
/// # Safety
/// The context is current; both ranges are its memory, of at least `bytes`.
pub(super) unsafe fn copy_on_device(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, stream) }
}

/// Queues a fill of `bytes` of device memory at `dst` with `value` on `stream`.
///
/// # Safety
/// The context is current; `dst..dst+bytes` is its memory.
pub(super) unsafe fn fill(
    dst: u64,
    value: u8,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::memset_d8_async(dst, value, bytes, stream) }
}

/// Queues a copy of `bytes` from `src` in `src_ctx`'s memory to `dst` in `dst_ctx`'s.
///
/// # Safety
/// `dst_ctx` is current; both ranges are their contexts' memory, of at least `bytes`.
pub(super) unsafe fn copy_from_peer(
    dst_ctx: &CudaContext,
    dst: u64,
    src_ctx: &CudaContext,
    src: u64,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_peer_async(dst_ctx.cu_ctx(), dst, src_ctx.cu_ctx(), src, bytes, stream) }
}

/// Queues a pitched copy of `c.rows` rows on `stream`.
///
/// # Safety
/// The context is current; every row of both sides stays valid until the stream passes the
/// copy; device sides are its memory.
pub(super) unsafe fn copy_2d(c: &Copy2d, stream: sys::CUstream) -> Result<(), DriverError> {
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
    // SAFETY: the caller's contract; `p` describes exactly the two sides it gave.
    unsafe { sys::cuMemcpy2DAsync_v2(&p, stream) }.result()
}

/// Queues `f` over `blocks` blocks of `block` threads on `stream`, its arguments one block
/// of `size` bytes at `params` (`CU_LAUNCH_PARAM_BUFFER_POINTER`).
///
/// # Safety
/// The context is current; `params` holds the arguments `f`'s signature takes, laid out as C
/// lays out its parameters, with pointers into this context's memory; `params` and `size`
/// live through the call (the driver copies the block at it).
pub(super) unsafe fn launch(
    f: &CudaFunction,
    blocks: u32,
    block: u32,
    stream: sys::CUstream,
    params: *mut c_void,
    size: &mut usize,
) -> Result<(), DriverError> {
    let mut extra: [*mut c_void; 5] = [
        std::ptr::without_provenance_mut(sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize),
        params,
        std::ptr::without_provenance_mut(sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize),
        (size as *mut usize).cast(),
        std::ptr::null_mut(), // CU_LAUNCH_PARAM_END
    ];
    // SAFETY: the caller's contract; `extra` is the terminated list the driver reads.
    unsafe {
        sys::cuLaunchKernel(
            f.cu_function(),
            blocks,
            1,
            1,
            block,
            1,
            1,
            0,
            stream,
            std::ptr::null_mut(),
            extra.as_mut_ptr(),
        )
    }
    .result()
}

/// Queues an instantiated graph on `stream`.
///
/// # Safety
/// The graph's context is current; the graph is launched by one thread at a time.
pub(super) unsafe fn launch_graph(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::graph::launch(exec, stream) }
}

/// Page-locks host `[ptr, ptr+bytes)` for every context (PORTABLE).
///
/// # Safety
/// A context is current; the memory stays allocated until [`unregister_host`].
pub(super) unsafe fn register_host(ptr: *mut u8, bytes: usize) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { sys::cuMemHostRegister_v2(ptr.cast(), bytes, sys::CU_MEMHOSTREGISTER_PORTABLE) }.result()
}

/// Undoes [`register_host`].
///
/// # Safety
/// `ptr` was registered by `register_host` and no copy on it is in flight.
pub(super) unsafe fn unregister_host(ptr: *mut u8) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { sys::cuMemHostUnregister(ptr.cast()) }.result()
}
