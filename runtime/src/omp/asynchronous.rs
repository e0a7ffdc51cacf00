//! OpenMP's asynchronous device routines (`omp_target_memcpy_async`,
//! `omp_target_memcpy_rect_async`, `omp_target_memset_async`) and `nowait` with `depend`
//! on `target`, `target enter data`, `target exit data` and `target update`, in C's shape.
//!
//! Each routine queues a task on one of the device's lanes (those of [`crate::nowait`]:
//! copy-in, compute, copy-out) and returns its [`Task`] at once. A task first waits for its
//! dependences, [`Depend`] objects (C's `omp_depend_t`): made on a host address with a
//! [`DependType`], as `#pragma omp depobj(o) depend(inout: x)` makes one, or from a task (one
//! of these routines' or a nowait scope's). Address dependences order tasks as OpenMP's
//! do: a task with `in` on an address runs after the last task with `out` or `inout` on it;
//! one with `out` or `inout`, after that task and every `in` task since. Two dependences
//! match when their addresses are equal (as in OpenMP, overlapping storage at different
//! addresses does not). Tasks with no dependence between them are unordered, even on one
//! device, as in OpenMP. [`omp_taskwait`] waits for every task these routines queued and
//! returns the first error among them; a task whose dependence failed does not run and
//! fails with [`Error::Dependency`]. As OpenMP orders sibling tasks, dependences and
//! `omp_taskwait` are per thread: a thread's taskwait waits for the tasks it queued, and
//! its address dependences order its own tasks (a task handle orders across threads).
//! The routines and `omp_taskwait` are refused inside a `nowait` task (and the taskwait
//! inside a kernel), where they could wait for work queued behind the caller.
//!
//! Work of the initial device alone (a host-to-host copy, a region on the initial device)
//! runs on the calling thread, after its dependences, as an undeferred task. Host code
//! joins the same graph through [`task`] (C's `#pragma omp task depend(...)`), deferred on
//! a thread of its own.
//!
//! ```
//! use offload::omp::*;
//! use offload::Runtime;
//!
//! use_runtime(Runtime::builder().host_devices(2).build()?)?;
//! let (dev, host) = (0, omp_get_initial_device()?);
//! let p = omp_target_alloc(64, dev)?;
//! let mut back = [0u8; 64];
//! // SAFETY: `p` holds 64 bytes of `dev`; `back` lives until the taskwait.
//! unsafe {
//!     // #pragma omp depobj(o) depend(inout: p)  (and in: p for the read)
//!     omp_target_memset_async(p, 7, 64, dev, &[Depend::new(DependType::InOut, p)])?;
//!     omp_target_memcpy_async(back.as_mut_ptr().cast(), p, 64, 0, 0, host, dev, &[Depend::new(DependType::In, p)])?;
//! }
//! omp_taskwait()?;
//! assert_eq!(back, [7; 64]);
//! unsafe { omp_target_free(p, dev)? };
//! # Ok::<(), offload::Error>(())
//! ```

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::Location;

use super::{dev, rt};
use crate::data_env::{MapItem, UpdateDirection, UpdateItem};
use crate::error::{panic_message, Error, Result};
use crate::kernel::{Kernel, LaunchArg, OmpSpace};
use crate::memcpy::RectSide;
use crate::nowait::{copy_lane, queue_task, running_a_task, wait_for_all, Lane, Task};
use crate::range::HostRange;
use crate::rt::{MapConstruct, Runtime};

/// The dependence type of a [`Depend`] on an address (`depend(in: x)`, `out`, `inout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DependType {
    /// `in`: after the last `out`/`inout` task on the address.
    In,
    /// `out`: after the last `out`/`inout` task and every `in` task since.
    Out,
    /// `inout`: as `out`.
    InOut,
}

/// A dependence of an asynchronous routine: C's `omp_depend_t`. See the module
/// documentation.
#[derive(Clone, Debug)]
pub struct Depend(DependOn);

#[derive(Clone, Debug)]
enum DependOn {
    Task(Task),
    Address { addr: usize, kind: DependType },
}

impl Depend {
    /// A dependence of type `kind` on the host or device address `ptr`, as
    /// `#pragma omp depobj(o) depend(kind: *ptr)`.
    pub fn new<T>(kind: DependType, ptr: *const T) -> Self {
        Self(DependOn::Address { addr: ptr as usize, kind })
    }

    /// A dependence on `task`: the new task runs after it.
    pub fn on_task(task: &Task) -> Self {
        Self(DependOn::Task(task.clone()))
    }
}

impl From<&Task> for Depend {
    fn from(task: &Task) -> Self {
        Self::on_task(task)
    }
}

/// The tasks an address's dependences order.
#[derive(Default)]
struct AddressTasks {
    last_out: Option<Task>,
    ins_since: Vec<Task>,
}

/// The tasks one thread queued since its last [`omp_taskwait`] and the address
/// dependences between them (OpenMP orders sibling tasks: those of one generating task,
/// here one thread).
#[derive(Default)]
struct DependGraph {
    by_address: HashMap<usize, AddressTasks>,
    queued: Vec<Task>,
    /// `queued`'s length at which finished tasks are next dropped (doubles as it grows).
    prune_at: usize,
}

/// Tasks kept before finished ones are first dropped from a thread's graph.
const PRUNE_AT: usize = 4096;

impl DependGraph {
    /// The tasks a new task must wait for under `depend`, from the graph as it is before
    /// the task (so a task listing one address twice never waits for itself).
    fn before(&self, depend: &[Depend]) -> Vec<Task> {
        let mut before = Vec::new();
        for d in depend {
            match &d.0 {
                DependOn::Task(t) => before.push(t.clone()),
                DependOn::Address { addr, kind } => {
                    let Some(at) = self.by_address.get(addr) else { continue };
                    before.extend(at.last_out.iter().cloned());
                    if *kind != DependType::In {
                        before.extend(at.ins_since.iter().cloned());
                    }
                }
            }
        }
        before
    }

    /// Records `task`, queued with `depend`, for later dependences and [`omp_taskwait`].
    fn record(&mut self, task: &Task, depend: &[Depend]) {
        for d in depend {
            let DependOn::Address { addr, kind } = &d.0 else { continue };
            let at = self.by_address.entry(*addr).or_default();
            if *kind == DependType::In {
                at.ins_since.push(task.clone());
            } else {
                at.ins_since.clear();
                at.last_out = Some(task.clone());
            }
        }
        if self.queued.len() >= self.prune_at.max(PRUNE_AT) {
            self.prune();
            self.prune_at = 2 * self.queued.len();
        }
        self.queued.push(task.clone());
    }

    /// Drops tasks that succeeded; failed ones stay for [`omp_taskwait`] to report.
    fn prune(&mut self) {
        let succeeded = |t: &Task| t.is_done() && t.wait().is_ok();
        self.queued.retain(|t| !succeeded(t));
        self.by_address.retain(|_, a| {
            a.ins_since.retain(|t| !t.is_done());
            if a.last_out.as_ref().is_some_and(Task::is_done) {
                a.last_out = None;
            }
            a.last_out.is_some() || !a.ins_since.is_empty()
        });
    }
}

std::thread_local! {
    /// The calling thread's tasks.
    static GRAPH: RefCell<DependGraph> = RefCell::default();
}

/// Queues `work` on `lane` of `device` after `depend`; on the initial device runs it now.
fn submit(
    rt: &'static Runtime,
    device: usize,
    lane: Lane,
    depend: &[Depend],
    work: impl FnOnce() -> Result<()> + Send + 'static,
) -> Result<Task> {
    if running_a_task() {
        // Its dependences could be queued behind the running task on its own lane.
        return Err(Error::InvalidArgument {
            routine: "an asynchronous omp routine",
            what: format!(
                "device {device}: called from inside a nowait task; expected a call from the \
                 program's own threads"
            ),
        });
    }
    let task = Task::new();
    let before = GRAPH.with_borrow(|g| g.before(depend));
    if device == rt.initial_device() {
        task.finish(run_after(&before, device, "an undeferred task", work));
    } else {
        // SAFETY: `work` owns what it uses ('static); the raw memory it reaches is the
        // caller's to keep valid (each routine's contract). One thread queues its tasks in
        // the order it records them, so none waits for one queued behind it on its lane.
        unsafe { queue_task(rt, device, lane, task.clone(), before, false, None, false, |_| work())? };
    }
    GRAPH.with_borrow_mut(|g| g.record(&task, depend));
    Ok(task)
}

/// Runs `work` (`what`, on `device`) on the calling thread once `before` has finished: a
/// failed dependence fails it unrun, a panic fails it with [`Error::Panicked`].
fn run_after(
    before: &[Task],
    device: usize,
    what: &'static str,
    work: impl FnOnce() -> Result<()>,
) -> Result<()> {
    wait_for_all(before).map_err(|e| Error::Dependency { cause: e.to_string() })?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
        .unwrap_or_else(|payload| Err(Error::Panicked { device, what, message: panic_message(&*payload) }))
}

/// `#pragma omp task depend(...)` around host code: `work` runs on a thread of its own once
/// the tasks its dependences name have finished, and a later routine's dependence on the
/// same address (or on the returned [`Task`]) waits for it; [`omp_taskwait`] waits for it
/// with the device tasks. So host code takes its place in the same graph as `target nowait`
/// and the asynchronous copies: a host task with `depend(in: x)` after a `target nowait
/// depend(out: x)` reads what the region copied back, and a region with `depend(in: x)`
/// after a host task with `depend(out: x)` maps what the task wrote. A dependence that
/// failed fails the task with [`Error::Dependency`] without running it; a panic of `work`
/// fails it with [`Error::Panicked`]. Refused inside a `nowait` task, as the other routines.
///
/// ```
/// use offload::omp::*;
/// use offload::{HostLaunch, Kernel, LaunchArg, MapItem, Runtime};
/// use std::sync::atomic::{AtomicI32, Ordering};
/// use std::sync::Arc;
///
/// fn add_one(l: &HostLaunch<'_>) -> Result<(), String> {
///     // SAFETY: argument 0 is a mapped range of n i32.
///     unsafe { l.slice_mut::<i32>(0, l.n())? }.iter_mut().for_each(|v| *v += 1);
///     Ok(())
/// }
/// static ADD: Kernel = Kernel::new("add_one").with_host(add_one);
///
/// use_runtime(Runtime::builder().host_devices(1).build()?)?;
/// let x: &'static mut [i32; 1024] = Box::leak(Box::new([1; 1024])); // C's global array
/// let p = x.as_mut_ptr();
/// let seen = Arc::new(AtomicI32::new(0));
/// // SAFETY: `x` lives for ever; between the tasks only they touch it, in dependence order.
/// unsafe {
///     // #pragma omp target map(tofrom: x) nowait depend(out: x)  (x[i] += 1)
///     let args = [LaunchArg::mapped(p.cast_const())];
///     target_nowait(0, &ADD, 1024, &[MapItem::tofrom(p, 4096)], &args, &[Depend::new(DependType::Out, p)])?;
/// }
/// // #pragma omp task depend(in: x): reads what the region copied back.
/// let (addr, s) = (p as usize, Arc::clone(&seen));
/// task(&[Depend::new(DependType::In, p)], move || {
///     // SAFETY: the region that wrote `x` has finished (the dependence).
///     s.store(unsafe { *(addr as *const i32) }, Ordering::Relaxed);
///     Ok(())
/// })?;
/// omp_taskwait()?;
/// assert_eq!(seen.load(Ordering::Relaxed), 2);
/// # Ok::<(), offload::Error>(())
/// ```
pub fn task(depend: &[Depend], work: impl FnOnce() -> Result<()> + Send + 'static) -> Result<Task> {
    if running_a_task() {
        return Err(Error::InvalidArgument {
            routine: "omp::task",
            what: "called from inside a nowait task; expected a call from the program's own threads".into(),
        });
    }
    let host = rt()?.initial_device();
    let task = Task::new();
    let before = GRAPH.with_borrow(|g| g.before(depend));
    let done = task.clone();
    let run = move || done.finish(run_after(&before, host, "a host task", work));
    std::thread::Builder::new().name("offload-host-task".into()).spawn(run).map_err(|e| Error::Driver {
        device: host,
        call: "spawn a host task's thread",
        message: e.to_string(),
    })?;
    GRAPH.with_borrow_mut(|g| g.record(&task, depend));
    Ok(task)
}

/// `#pragma omp taskwait` for the asynchronous routines: waits for every task the calling
/// thread queued since its last taskwait, then returns the first error among them. Refused
/// inside a kernel or a task, which the tasks may be waiting for.
pub fn omp_taskwait() -> Result<()> {
    // No runtime yet: no task was queued, and none is started just to look.
    let in_kernel = Runtime::global_if_started().is_some_and(|rt| rt.in_kernel());
    if running_a_task() || in_kernel {
        return Err(Error::InvalidArgument {
            routine: "omp_taskwait",
            what: "called from inside a kernel or a nowait task, which the tasks may be waiting for; \
                   expected a call from the thread that queued them"
                .into(),
        });
    }
    let graph = GRAPH.take();
    wait_for_all(&graph.queued)
}

/// `omp_target_memcpy_async(dst, src, length, dst_offset, src_offset, dst_device_num,
/// src_device_num, depobj_count, depobj_list)`: on the destination device's copy-in lane,
/// or the source's copy-out lane when the destination is the initial device.
///
/// # Safety
/// As [`super::omp_target_memcpy`], until the task has finished.
#[allow(clippy::too_many_arguments)]
pub unsafe fn omp_target_memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    length: usize,
    dst_offset: usize,
    src_offset: usize,
    dst_device_num: i32,
    src_device_num: i32,
    depend: &[Depend],
) -> Result<Task> {
    let rt = rt()?;
    let (dd, sd) = (dev(rt, dst_device_num)?, dev(rt, src_device_num)?);
    let (dst, src) = (dst as u64, src as u64);
    let (device, lane) = copy_lane(rt, dd, sd);
    // SAFETY: forwarded from the caller.
    submit(rt, device, lane, depend, move || unsafe {
        rt.target_memcpy(dst, src, length, dst_offset, src_offset, dd, sd)
    })
}

/// What [`omp_target_memcpy_rect_async`] gives: C's routine returns an `int`, the number
/// of dimensions supported for the query form and 0 for a copy it queued; here the copy's
/// [`Task`] takes the place of the 0.
///
/// ```
/// use offload::omp::*;
/// use std::ptr::{null, null_mut};
///
/// use_runtime(offload::Runtime::builder().host_devices(2).build()?)?;
/// // SAFETY: the query form reads nothing.
/// let r = unsafe {
///     omp_target_memcpy_rect_async(null_mut(), null(), 0, 0, null(), null(), null(), null(), null(), 0, 0, &[])?
/// };
/// assert_eq!(r.dimensions(), Some(i32::MAX));
/// assert!(r.task().is_none());
/// # Ok::<(), offload::Error>(())
/// ```
#[derive(Clone, Debug)]
pub enum RectCopy {
    /// The query form (both pointers null): the number of dimensions supported
    /// (`i32::MAX`, as libomptarget's `INT_MAX`).
    Dimensions(i32),
    /// The copy, queued.
    Queued(Task),
}

impl RectCopy {
    /// The queued copy's task; `None` for the query form.
    pub fn task(&self) -> Option<&Task> {
        match self {
            Self::Queued(t) => Some(t),
            Self::Dimensions(_) => None,
        }
    }

    /// The queued copy's task, by value; `None` for the query form.
    pub fn into_task(self) -> Option<Task> {
        match self {
            Self::Queued(t) => Some(t),
            Self::Dimensions(_) => None,
        }
    }

    /// The query form's answer, the number of dimensions supported; `None` for a copy.
    pub fn dimensions(&self) -> Option<i32> {
        match self {
            Self::Dimensions(n) => Some(*n),
            Self::Queued(_) => None,
        }
    }
}

/// `omp_target_memcpy_rect_async(...)`, on the lane [`omp_target_memcpy_async`] would use.
/// The five arrays are read during the call. With both pointers null (the query form) it
/// queues nothing and returns [`RectCopy::Dimensions`] with the number of dimensions
/// supported (`i32::MAX`, as [`super::omp_target_memcpy_rect`] and libomptarget), whatever
/// the other arguments; otherwise [`RectCopy::Queued`] with the copy's task.
///
/// # Safety
/// As [`super::omp_target_memcpy_rect`]; the two pointers' memory until the task has
/// finished (the five arrays are copied at the call).
#[allow(clippy::too_many_arguments)]
pub unsafe fn omp_target_memcpy_rect_async(
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
    depend: &[Depend],
) -> Result<RectCopy> {
    const ROUTINE: &str = "omp_target_memcpy_rect_async";
    if dst.is_null() && src.is_null() {
        return Ok(RectCopy::Dimensions(i32::MAX));
    }
    let rt = rt()?;
    // SAFETY: the caller guarantees `num_dims` elements per array.
    let arr = |p, name| unsafe { super::rect_array(ROUTINE, p, num_dims, name) }.map(<[usize]>::to_vec);
    let (volume, dst_o, src_o) =
        (arr(volume, "volume")?, arr(dst_offsets, "dst_offsets")?, arr(src_offsets, "src_offsets")?);
    let (dst_d, src_d) = (arr(dst_dimensions, "dst_dimensions")?, arr(src_dimensions, "src_dimensions")?);
    let (dd, sd) = (dev(rt, dst_device_num)?, dev(rt, src_device_num)?);
    let (dst, src) = (dst as u64, src as u64);
    let (device, lane) = copy_lane(rt, dd, sd);
    submit(rt, device, lane, depend, move || {
        let dst_side = RectSide { ptr: dst, device: dd, offsets: &dst_o, dimensions: &dst_d };
        let src_side = RectSide { ptr: src, device: sd, offsets: &src_o, dimensions: &src_d };
        // SAFETY: forwarded from the caller.
        unsafe { rt.target_memcpy_rect(element_size, &volume, dst_side, src_side) }
    })
    .map(RectCopy::Queued)
}

/// `omp_target_memset_async(ptr, value, count, device_num, depobj_count, depobj_list)`
/// (OpenMP 6.0), on the device's copy-in lane; `value`'s low byte is stored, as C's.
///
/// # Safety
/// As [`super::omp_target_memset`], until the task has finished.
pub unsafe fn omp_target_memset_async(
    ptr: *mut c_void,
    value: i32,
    count: usize,
    device_num: i32,
    depend: &[Depend],
) -> Result<Task> {
    let rt = rt()?;
    let d = dev(rt, device_num)?;
    let [byte, ..] = value.to_le_bytes();
    let p = ptr as u64;
    // SAFETY: forwarded from the caller.
    submit(rt, d, Lane::CopyIn, depend, move || unsafe { rt.target_memset(p, byte, count, d) })
}

/// `#pragma omp target enter data map(...) device(d) nowait depend(...)`, on the copy-in
/// lane.
///
/// # Safety
/// As [`super::target_enter_data`], until the task has finished.
#[track_caller]
pub unsafe fn target_enter_data_nowait(device_num: i32, maps: &[MapItem], depend: &[Depend]) -> Result<Task> {
    let rt = rt()?;
    // A construct: refused at the call, not in its task, under mandatory with no device.
    rt.offload_available()?;
    let at = Location::caller();
    let (d, maps) = (dev(rt, device_num)?, maps.to_vec());
    // SAFETY: forwarded from the caller.
    submit(rt, d, Lane::CopyIn, depend, move || unsafe {
        rt.map_construct_at(MapConstruct::EnterData, d, &maps, at)
    })
}

/// `#pragma omp target exit data map(...) device(d) nowait depend(...)`, on the copy-out
/// lane.
///
/// # Safety
/// As [`super::target_exit_data`], until the task has finished.
#[track_caller]
pub unsafe fn target_exit_data_nowait(device_num: i32, maps: &[MapItem], depend: &[Depend]) -> Result<Task> {
    let rt = rt()?;
    // A construct: refused at the call, not in its task, under mandatory with no device.
    rt.offload_available()?;
    let at = Location::caller();
    let (d, maps) = (dev(rt, device_num)?, maps.to_vec());
    // SAFETY: forwarded from the caller.
    submit(rt, d, Lane::CopyOut, depend, move || unsafe {
        rt.map_construct_at(MapConstruct::ExitData, d, &maps, at)
    })
}

/// `#pragma omp target update to(...)` (or `from`) `device(d) nowait depend(...)`: `to` on
/// the copy-in lane, `from` on the copy-out lane.
///
/// # Safety
/// As [`super::target_update`], until the task has finished.
#[track_caller]
pub unsafe fn target_update_nowait(
    device_num: i32,
    dir: UpdateDirection,
    items: &[UpdateItem],
    depend: &[Depend],
) -> Result<Task> {
    let rt = rt()?;
    // A construct: refused at the call, not in its task, under mandatory with no device.
    rt.offload_available()?;
    let at = Location::caller();
    let d = dev(rt, device_num)?;
    let list: Vec<(HostRange, bool)> = items.iter().map(|i| (i.range, i.present)).collect();
    let lane = if dir == UpdateDirection::To { Lane::CopyIn } else { Lane::CopyOut };
    // SAFETY: forwarded from the caller.
    submit(rt, d, lane, depend, move || unsafe { rt.update_at(d, dir, &list, at) })
}

/// `#pragma omp target map(...) device(d) nowait depend(...)` running `kernel` over `n`
/// work items, on the compute lane.
///
/// # Safety
/// As [`super::target`], until the task has finished.
#[track_caller]
pub unsafe fn target_nowait(
    device_num: i32,
    kernel: &'static Kernel,
    n: usize,
    maps: &[MapItem],
    args: &[LaunchArg],
    depend: &[Depend],
) -> Result<Task> {
    let at = Location::caller();
    // SAFETY: forwarded from the caller.
    unsafe { target_space_nowait(device_num, kernel, OmpSpace::Items(n), maps, args, depend, at) }
}

/// `#pragma omp target teams distribute parallel for collapse(d) ... nowait depend(...)`: as
/// [`super::target_loops`], on the compute lane.
///
/// # Safety
/// As [`super::target`], until the task has finished.
#[track_caller]
pub unsafe fn target_loops_nowait(
    device_num: i32,
    kernel: &'static Kernel,
    loops: &[std::ops::Range<usize>],
    maps: &[MapItem],
    args: &[LaunchArg],
    depend: &[Depend],
) -> Result<Task> {
    let space = OmpSpace::loops(loops)?;
    // SAFETY: forwarded from the caller.
    unsafe { target_space_nowait(device_num, kernel, space, maps, args, depend, Location::caller()) }
}

/// `#pragma omp target teams num_teams(t) thread_limit(l) ... nowait depend(...)`: as
/// [`super::target_teams`], on the compute lane.
///
/// # Safety
/// As [`super::target`], until the task has finished.
#[track_caller]
pub unsafe fn target_teams_nowait(
    device_num: i32,
    kernel: &'static Kernel,
    num_teams: usize,
    thread_limit: Option<usize>,
    maps: &[MapItem],
    args: &[LaunchArg],
    depend: &[Depend],
) -> Result<Task> {
    let space = OmpSpace::Teams { num_teams, thread_limit };
    // SAFETY: forwarded from the caller.
    unsafe { target_space_nowait(device_num, kernel, space, maps, args, depend, Location::caller()) }
}

/// The task of a `target ... nowait` over `space`, called from `at`.
///
/// # Safety
/// As [`super::target`], until the task has finished.
unsafe fn target_space_nowait(
    device_num: i32,
    kernel: &'static Kernel,
    space: OmpSpace,
    maps: &[MapItem],
    args: &[LaunchArg],
    depend: &[Depend],
    at: &'static Location<'static>,
) -> Result<Task> {
    let rt = rt()?;
    // A construct: refused at the call, not in its task, under mandatory with no device.
    rt.offload_available()?;
    let (d, maps, args) = (dev(rt, device_num)?, maps.to_vec(), args.to_vec());
    // SAFETY: forwarded from the caller.
    submit(rt, d, Lane::Compute, depend, move || unsafe {
        rt.target_launch_at(d, kernel, &maps, &args, crate::rt::ArgShape::OpenMp(space), at)
    })
}
