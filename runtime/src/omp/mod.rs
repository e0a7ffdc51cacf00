//! The OpenMP device routines under their own names, with C's raw-pointer shape, for
//! porting C line by line. They act on the process-wide runtime ([`Runtime::global`]);
//! [`use_runtime`] chooses it explicitly. Every routine returns `Result` instead of C's error
//! codes and aborts.
//!
//! Device numbers are C's: `0..omp_get_num_devices()` the devices,
//! `omp_get_initial_device()` or [`omp_initial_device`] (-1, OpenMP 5.1) the initial
//! device; any other number is [`Error::NoSuchDevice`]. Under `OMP_TARGET_OFFLOAD=mandatory`
//! with no device the runtime starts and the queries answer (`omp_get_num_devices()` is 0),
//! the device memory routines work on the initial device, and every construct fails with
//! [`Error::OffloadMandatory`], as with libomptarget.
//!
//! ```
//! use offload::omp::*;
//! use offload::{MapItem, MapType, Runtime};
//!
//! use_runtime(Runtime::builder().host_devices(2).build()?)?;
//! let dev = 0;
//! let mut x = [1i32, 2, 3, 4];
//! unsafe {
//!     // #pragma omp target enter data map(to: x[0:4]) device(dev)
//!     target_enter_data(dev, &[MapItem::to(x.as_ptr(), 16)])?;
//!     assert!(omp_target_is_present(x.as_ptr().cast(), dev)?);
//!     let d = omp_get_mapped_ptr(x.as_ptr().cast(), dev)?;
//!     omp_target_memset(d, 0, 16, dev)?;
//!     // #pragma omp target exit data map(from: x[0:4]) device(dev)
//!     target_exit_data(dev, &[MapItem::from(x.as_mut_ptr(), 16)])?;
//! }
//! assert_eq!(x, [0; 4]);
//! # Ok::<(), offload::Error>(())
//! ```

use std::ffi::c_void;

use crate::data_env::{MapItem, UpdateDirection, UpdateItem};
use crate::error::{Error, Result};
use crate::kernel::Kernel;
use crate::kernel::LaunchArg;
use crate::memcpy::RectSide;
use crate::range::HostRange;
use crate::rt::Runtime;

mod asynchronous;
pub use asynchronous::{
    omp_target_memcpy_async, omp_target_memcpy_rect_async, omp_target_memset_async, omp_taskwait,
    target_enter_data_nowait, target_exit_data_nowait, target_loops_nowait, target_nowait,
    target_teams_nowait, target_update_nowait, task, Depend, DependType, RectCopy,
};

/// Makes `rt` the runtime these routines use, if none was chosen or built yet; returns the
/// one in use either way. (Not called `init`: a C program ported with `use offload::omp::*`
/// often has an `init` of its own.)
pub fn use_runtime(rt: Runtime) -> Result<&'static Runtime> {
    Runtime::install_global(rt)
}

fn rt() -> Result<&'static Runtime> {
    Runtime::global()
}

/// `device_num` as the runtime's device number: [`omp_initial_device`] is the initial
/// device (OpenMP 5.1); any other negative number is no device.
fn dev(rt: &Runtime, device_num: i32) -> Result<usize> {
    if device_num == omp_initial_device {
        return Ok(rt.initial_device());
    }
    usize::try_from(device_num)
        .map_err(|_| Error::NoSuchDevice { device: device_num.into(), available: rt.num_devices() })
}

/// A device number or count as C's `int`.
fn c_int(routine: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Overflow { routine, what: format!("{v} as a C int") })
}

/// `omp_get_num_devices()`.
pub fn omp_get_num_devices() -> Result<i32> {
    c_int("omp_get_num_devices", rt()?.num_devices())
}

/// `omp_get_wtime()`: waits for the work queued on every device, then the wall clock in
/// seconds since a point fixed for the process, so that a C port's timer measures the
/// target regions it surrounds as in C, where they are complete when they return (here a
/// launch returns once queued). See [`Runtime::wtime`].
pub fn omp_get_wtime() -> Result<f64> {
    rt()?.wtime()
}

/// `omp_get_wtick()`: the resolution of [`omp_get_wtime`], in seconds (the monotonic
/// clock's nanosecond).
pub fn omp_get_wtick() -> f64 {
    1e-9
}

/// `omp_get_initial_device()`: equal to `omp_get_num_devices()`.
pub fn omp_get_initial_device() -> Result<i32> {
    c_int("omp_get_initial_device", rt()?.initial_device())
}

/// `omp_get_default_device()` (`OMP_DEFAULT_DEVICE`).
pub fn omp_get_default_device() -> Result<i32> {
    c_int("omp_get_default_device", rt()?.default_device())
}

/// `omp_set_default_device(device_num)` for the calling thread (see
/// [`Runtime::set_default_device`]); [`omp_initial_device`] makes the initial device the
/// default. Under `OMP_TARGET_OFFLOAD=disabled` any `device_num` is accepted and the initial
/// device stays the default.
pub fn omp_set_default_device(device_num: i32) -> Result<()> {
    let rt = rt()?;
    if rt.policy() == crate::config::OffloadPolicy::Disabled {
        return Ok(());
    }
    rt.set_default_device(dev(rt, device_num)?)
}

/// `omp_get_device_num()`: the device the calling thread runs on (see
/// [`Runtime::device_num`]).
pub fn omp_get_device_num() -> Result<i32> {
    c_int("omp_get_device_num", rt()?.device_num())
}

/// `omp_is_initial_device()` (see [`Runtime::is_initial_device`]).
pub fn omp_is_initial_device() -> Result<bool> {
    Ok(rt()?.is_initial_device())
}

/// `omp_target_is_accessible(ptr, size, device_num)` (see [`Runtime::is_accessible`]).
pub fn omp_target_is_accessible(ptr: *const c_void, size: usize, device_num: i32) -> Result<bool> {
    let rt = rt()?;
    rt.is_accessible(HostRange::new(ptr as usize, size), dev(rt, device_num)?)
}

/// OpenMP 5.1's `omp_initial_device`: a device number that every routine and construct
/// here takes for the initial device, whatever the number of devices (the same as
/// `omp_get_initial_device()`).
#[allow(non_upper_case_globals)] // C's name, for line-by-line ports
pub const omp_initial_device: i32 = -1;

/// OpenMP 5.2's `omp_invalid_device`, as LLVM numbers it: what
/// [`omp_get_device_from_uid`] returns for a UID no device has. As a device number it is
/// an error ([`Error::NoSuchDevice`]).
#[allow(non_upper_case_globals)] // C's name, for line-by-line ports
pub const omp_invalid_device: i32 = -2;

/// [`omp_invalid_device`] under a Rust constant's name.
pub const OMP_INVALID_DEVICE: i32 = omp_invalid_device;

/// `omp_get_uid_from_device(device_num)` (OpenMP 6.0; see [`Runtime::device_uid`]).
pub fn omp_get_uid_from_device(device_num: i32) -> Result<String> {
    let rt = rt()?;
    rt.device_uid(dev(rt, device_num)?)
}

/// `omp_get_device_from_uid(uid)` (OpenMP 6.0): the device number, or
/// [`omp_invalid_device`].
pub fn omp_get_device_from_uid(uid: &str) -> Result<i32> {
    let rt = rt()?;
    match rt.device_from_uid(uid) {
        Some(d) => c_int("omp_get_device_from_uid", d),
        None => Ok(omp_invalid_device),
    }
}

/// The properties of an interop object that [`omp_get_interop_ptr`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InteropProperty {
    /// `omp_ipr_device_context`: the device's context (`CUcontext`; null on HIP).
    DeviceContext,
    /// `omp_ipr_targetsync`: the queue the runtime's kernels run on (`CUstream`,
    /// `hipStream_t`).
    TargetSync,
}

/// `omp_get_interop_ptr` of a target-sync interop object for `device_num` (as
/// `#pragma omp interop init(targetsync: obj) device(d)` makes one): null for devices
/// without native handles (host devices, the initial device). See [`Runtime::interop`].
pub fn omp_get_interop_ptr(device_num: i32, property: InteropProperty) -> Result<*mut c_void> {
    let rt = rt()?;
    Ok(match (rt.interop(dev(rt, device_num)?)?, property) {
        (None, _) => std::ptr::null_mut(),
        (Some(i), InteropProperty::DeviceContext) => i.context,
        (Some(i), InteropProperty::TargetSync) => i.stream,
    })
}

/// The `if` clause of any construct: `device_num` when `condition` holds, else the
/// initial device, where `target` runs the region on the host and the data constructs do
/// nothing, as OpenMP's `if(false)` does. `target(if_device(n > 1000, dev)?, ...)` is
/// `#pragma omp target if(n > 1000) device(dev)`. One difference: under
/// `OMP_TARGET_OFFLOAD=mandatory` with no device, C's `if(false)` makes no runtime call
/// and runs on the host, while a construct given this routine's initial device fails as
/// every construct does then (it cannot tell the two apart).
pub fn if_device(condition: bool, device_num: i32) -> Result<i32> {
    let rt = rt()?;
    rt.check_target(dev(rt, device_num)?)?;
    if condition {
        Ok(device_num)
    } else {
        omp_get_initial_device()
    }
}

/// `use_device_ptr(ptr)` in a `target data` region on `device_num`: the device address
/// the host pointer `ptr` corresponds to, or, when it points into nothing mapped there,
/// `ptr` itself (OpenMP 5.1's rule). As in libomptarget, `ptr` may be the base of a mapped
/// section that starts past it: after `map(to: A[64:128])` given with its base
/// ([`MapItem::with_base`]), `use_device_ptr(A)` is the device address of `A[64]` minus 64
/// elements (see [`Runtime::use_device_ptr`]). On the initial device, `ptr`.
pub fn use_device_ptr(ptr: *const c_void, device_num: i32) -> Result<*mut c_void> {
    let rt = rt()?;
    Ok(match rt.use_device_ptr(ptr as usize, dev(rt, device_num)?)? {
        Some(d) => d as usize as *mut c_void,
        None => ptr.cast_mut(),
    })
}

/// `use_device_addr(x)` in a `target data` region on `device_num`: the device address of
/// the mapped storage at host address `addr` (a variable or array section's first byte),
/// or `addr` itself when nothing is mapped there, as [`use_device_ptr`].
pub fn use_device_addr(addr: *const c_void, device_num: i32) -> Result<*mut c_void> {
    use_device_ptr(addr, device_num)
}

/// `omp_target_alloc(size, device_num)`: null for size 0.
#[track_caller]
pub fn omp_target_alloc(size: usize, device_num: i32) -> Result<*mut c_void> {
    let rt = rt()?;
    Ok(rt.target_alloc(size, dev(rt, device_num)?)? as usize as *mut c_void)
}

/// `omp_target_free(ptr, device_num)`: null is a no-op.
///
/// # Safety
/// `ptr` came from `omp_target_alloc` on that device and is not used afterwards.
#[track_caller]
pub unsafe fn omp_target_free(ptr: *mut c_void, device_num: i32) -> Result<()> {
    let rt = rt()?;
    // SAFETY: forwarded from the caller.
    unsafe { rt.target_free(ptr as u64, dev(rt, device_num)?) }
}

/// `omp_target_is_present(ptr, device_num)`.
pub fn omp_target_is_present(ptr: *const c_void, device_num: i32) -> Result<bool> {
    let rt = rt()?;
    rt.is_present(ptr as usize, dev(rt, device_num)?)
}

/// `omp_get_mapped_ptr(ptr, device_num)`: null when not mapped.
pub fn omp_get_mapped_ptr(ptr: *const c_void, device_num: i32) -> Result<*mut c_void> {
    let rt = rt()?;
    Ok(rt.mapped_ptr(ptr as usize, dev(rt, device_num)?)?.unwrap_or(0) as usize as *mut c_void)
}

/// `omp_target_associate_ptr(host_ptr, device_ptr, size, device_offset, device_num)`.
///
/// # Safety
/// `device_ptr + device_offset` is device memory of at least `size` bytes.
#[track_caller]
pub unsafe fn omp_target_associate_ptr(
    host_ptr: *const c_void,
    device_ptr: *const c_void,
    size: usize,
    device_offset: usize,
    device_num: i32,
) -> Result<()> {
    let rt = rt()?;
    // SAFETY: forwarded from the caller.
    unsafe {
        rt.associate_ptr(host_ptr as usize, device_ptr as u64, size, device_offset, dev(rt, device_num)?)
    }
}

/// `omp_target_disassociate_ptr(ptr, device_num)`.
///
/// # Safety
/// No kernel is using the association.
#[track_caller]
pub unsafe fn omp_target_disassociate_ptr(ptr: *const c_void, device_num: i32) -> Result<()> {
    let rt = rt()?;
    // SAFETY: forwarded from the caller.
    unsafe { rt.disassociate_ptr(ptr as usize, dev(rt, device_num)?) }
}

/// `omp_target_memcpy(dst, src, length, dst_offset, src_offset, dst_device_num,
/// src_device_num)`.
///
/// # Safety
/// Both ranges are valid memory of their devices.
pub unsafe fn omp_target_memcpy(
    dst: *mut c_void,
    src: *const c_void,
    length: usize,
    dst_offset: usize,
    src_offset: usize,
    dst_device_num: i32,
    src_device_num: i32,
) -> Result<()> {
    let rt = rt()?;
    let (dd, sd) = (dev(rt, dst_device_num)?, dev(rt, src_device_num)?);
    // SAFETY: forwarded from the caller.
    unsafe { rt.target_memcpy(dst as u64, src as u64, length, dst_offset, src_offset, dd, sd) }
}

/// `omp_target_memcpy_rect(...)`. With both pointers null it returns the number of
/// dimensions supported (`i32::MAX`), as OpenMP specifies; otherwise 0.
///
/// # Safety
/// The arrays are valid memory of their devices, and the five `*const usize` arrays hold
/// `num_dims` elements each.
#[allow(clippy::too_many_arguments)]
pub unsafe fn omp_target_memcpy_rect(
    dst: *mut c_void,
    src: *const c_void,
    element_size: usize,
    num_dims: i32,
    volume: *const usize,
    dst_offsets: *const usize,
    src_offsets: *const usize,
    dst_dimensions: *const usize,
    src_dimensions: *const usize,
    dst_device_num: i32,
    src_device_num: i32,
) -> Result<i32> {
    if dst.is_null() && src.is_null() {
        return Ok(i32::MAX);
    }
    let rt = rt()?;
    const ROUTINE: &str = "omp_target_memcpy_rect";
    // SAFETY: the caller guarantees `num_dims` elements per array.
    let arr = |p, name| unsafe { rect_array(ROUTINE, p, num_dims, name) };
    let dst_side = RectSide {
        ptr: dst as u64,
        device: dev(rt, dst_device_num)?,
        offsets: arr(dst_offsets, "dst_offsets")?,
        dimensions: arr(dst_dimensions, "dst_dimensions")?,
    };
    let src_side = RectSide {
        ptr: src as u64,
        device: dev(rt, src_device_num)?,
        offsets: arr(src_offsets, "src_offsets")?,
        dimensions: arr(src_dimensions, "src_dimensions")?,
    };
    // SAFETY: forwarded from the caller.
    unsafe { rt.target_memcpy_rect(element_size, arr(volume, "volume")?, dst_side, src_side)? };
    Ok(0)
}

/// The `num_dims` elements at `p`, one of `routine`'s arrays called `name`.
///
/// # Safety
/// A non-null `p` points to `num_dims` elements that stay valid for `'a`.
unsafe fn rect_array<'a>(
    routine: &'static str,
    p: *const usize,
    num_dims: i32,
    name: &str,
) -> Result<&'a [usize]> {
    let n = usize::try_from(num_dims)
        .ok()
        .filter(|&n| n > 0)
        .ok_or(Error::InvalidArgument { routine, what: format!("num_dims {num_dims} must be positive") })?;
    if p.is_null() {
        return Err(Error::InvalidArgument { routine, what: format!("{name} is null") });
    }
    // SAFETY: non-null, and the caller guarantees `num_dims` valid elements.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// `omp_target_memset(ptr, value, count, device_num)`: returns `ptr`. As C's `memset`,
/// `value` is converted to `unsigned char`: its low byte is stored (a defined conversion,
/// not an overflow).
///
/// # Safety
/// `ptr..ptr+count` is memory of that device.
pub unsafe fn omp_target_memset(
    ptr: *mut c_void,
    value: i32,
    count: usize,
    device_num: i32,
) -> Result<*mut c_void> {
    let rt = rt()?;
    let [byte, ..] = value.to_le_bytes();
    // SAFETY: forwarded from the caller.
    unsafe { rt.target_memset(ptr as u64, byte, count, dev(rt, device_num)?)? };
    Ok(ptr)
}

/// `#pragma omp target data map(...) device(d)`, opening half.
///
/// # Safety
/// See [`Runtime::target_data_begin`].
#[track_caller]
pub unsafe fn target_data_begin(device_num: i32, maps: &[MapItem]) -> Result<()> {
    let rt = rt()?;
    // SAFETY: forwarded from the caller.
    unsafe { rt.target_data_begin(dev(rt, device_num)?, maps) }
}

/// `#pragma omp target data`, closing half (the same list).
///
/// # Safety
/// See [`Runtime::target_data_end`].
#[track_caller]
pub unsafe fn target_data_end(device_num: i32, maps: &[MapItem]) -> Result<()> {
    let rt = rt()?;
    // SAFETY: forwarded from the caller.
    unsafe { rt.target_data_end(dev(rt, device_num)?, maps) }
}

/// `#pragma omp target enter data map(...) device(d)`.
///
/// # Safety
/// See [`Runtime::enter_data`].
#[track_caller]
pub unsafe fn target_enter_data(device_num: i32, maps: &[MapItem]) -> Result<()> {
    let rt = rt()?;
    // SAFETY: forwarded from the caller.
    unsafe { rt.enter_data(dev(rt, device_num)?, maps) }
}

/// `#pragma omp target exit data map(...) device(d)`.
///
/// # Safety
/// See [`Runtime::exit_data`].
#[track_caller]
pub unsafe fn target_exit_data(device_num: i32, maps: &[MapItem]) -> Result<()> {
    let rt = rt()?;
    // SAFETY: forwarded from the caller.
    unsafe { rt.exit_data(dev(rt, device_num)?, maps) }
}

/// `#pragma omp target update to(...)` (or `from`) `device(d)` over `items`.
///
/// # Safety
/// See [`Runtime::update`].
#[track_caller]
pub unsafe fn target_update(device_num: i32, dir: UpdateDirection, items: &[UpdateItem]) -> Result<()> {
    let rt = rt()?;
    let list: Vec<(HostRange, bool)> = items.iter().map(|i| (i.range, i.present)).collect();
    // SAFETY: forwarded from the caller.
    unsafe { rt.update(dev(rt, device_num)?, dir, &list) }
}

/// `#pragma omp target map(...) device(d)` running `kernel` over `n` work items.
///
/// # Safety
/// See [`Runtime::target_launch`].
#[track_caller]
pub unsafe fn target(
    device_num: i32,
    kernel: &Kernel,
    n: usize,
    maps: &[MapItem],
    args: &[LaunchArg],
) -> Result<()> {
    let rt = rt()?;
    // SAFETY: forwarded from the caller.
    unsafe { rt.target_launch(dev(rt, device_num)?, kernel, n, maps, args) }
}

/// `#pragma omp target teams distribute parallel for collapse(d) map(...) device(dev)` over
/// `d = loops.len()` nested loops (1 to 3), outermost first, each `for (i = a; i < b; i++)`
/// given as `a..b`: a 1-D, 2-D or 3-D generated kernel of as many indices, one `LaunchArg`
/// per parameter as [`target`] takes them.
///
/// ```
/// use offload::omp::*;
/// use offload::{LaunchArg, MapItem, Runtime, Scalar};
///
/// #[offload::kernel(dims = 2)]
/// fn interior(i: usize, j: usize, nx: usize, u: &mut [f32]) {
///     u[i * nx + j] = 1.0;
/// }
///
/// use_runtime(Runtime::builder().host_devices(1).build()?)?;
/// let (ny, nx) = (4usize, 6usize);
/// let mut u = vec![0f32; ny * nx];
/// // #pragma omp target teams distribute parallel for collapse(2) map(tofrom: u[0:ny*nx])
/// // for (i = 1; i < ny - 1; i++) for (j = 1; j < nx - 1; j++) u[i * nx + j] = 1.0f;
/// let args = [LaunchArg::Value(Scalar::U64(nx as u64)), LaunchArg::mapped(u.as_ptr())];
/// // SAFETY: the map names a live vector of the size given.
/// unsafe { target_loops(0, &interior::KERNEL, &[1..ny - 1, 1..nx - 1], &[MapItem::tofrom(u.as_mut_ptr(), 4 * ny * nx)], &args) }?;
/// assert_eq!(u.iter().filter(|&&v| v == 1.0).count(), (ny - 2) * (nx - 2));
/// # Ok::<(), offload::Error>(())
/// ```
///
/// # Safety
/// See [`Runtime::target_launch`].
#[track_caller]
pub unsafe fn target_loops(
    device_num: i32,
    kernel: &Kernel,
    loops: &[std::ops::Range<usize>],
    maps: &[MapItem],
    args: &[LaunchArg],
) -> Result<()> {
    let rt = rt()?;
    let space = crate::OmpSpace::loops(loops)?;
    // SAFETY: forwarded from the caller.
    unsafe { rt.target_launch_space(dev(rt, device_num)?, kernel, space, maps, args) }
}

/// `#pragma omp target teams num_teams(num_teams) thread_limit(limit) map(...) device(dev)`
/// with a `parallel` region inside: a teams kernel (`#[offload::kernel(teams = T)]`) over
/// `num_teams` teams of its `T` threads. A `thread_limit` below `T` is refused (the kernel's
/// team size is its own); one at or above it is met.
///
/// # Safety
/// See [`Runtime::target_launch`].
#[track_caller]
pub unsafe fn target_teams(
    device_num: i32,
    kernel: &Kernel,
    num_teams: usize,
    thread_limit: Option<usize>,
    maps: &[MapItem],
    args: &[LaunchArg],
) -> Result<()> {
    let rt = rt()?;
    let space = crate::OmpSpace::Teams { num_teams, thread_limit };
    // SAFETY: forwarded from the caller.
    unsafe { rt.target_launch_space(dev(rt, device_num)?, kernel, space, maps, args) }
}
