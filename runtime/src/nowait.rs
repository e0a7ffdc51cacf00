//! Asynchronous (`nowait`) constructs with dependencies.
//!
//! [`Runtime::nowait`] opens a scope, in the manner of `std::thread::scope`: inside it,
//! enter/exit/update/launch/memcpy and arbitrary device work are queued and return a
//! [`Task`]; each may wait for earlier tasks, on any device. Each device has three lanes —
//! copy-in, compute and copy-out — each a thread bound to the device's CPUs that runs its
//! tasks in order, so a copy-in, a kernel and a copy-out of one device proceed at once (on
//! GPUs on three streams). Host data given to a task stays borrowed until the scope ends,
//! and the scope does not end before every task has finished, so no host buffer is freed
//! or touched while a copy on it is in flight. This holds for tasks queued by running
//! tasks too (a task may capture the scope and queue more): the scope counts outstanding
//! tasks (a latch: `latch.rs`) and waits for the count to reach zero, also while unwinding
//! from a panic of its closure. [`Task::wait`] gives a task's error; a task whose
//! dependency failed does not run and fails with [`Error::Dependency`], except clean-up
//! tasks ([`NowaitScope::cleanup`]), which run whatever happened before them.
//!
//! A task that panics fails with [`Error::Panicked`] naming the panic; the scope returns
//! that error like any other (the panic does not resume: it happened on a lane thread, and
//! the lane goes on with the next task). Its dependents fail as after an error, and
//! clean-up tasks after it still unmap what was entered.
//!
//! A scope opened by a running task (a pipeline inside a pipeline's compute, say) runs its
//! tasks at once, each on the opening task's thread after its dependences, as OpenMP lets
//! any task be undeferred: queued on a lane, one could wait behind work that waits for the
//! opener itself, for ever. A [`Pipeline::serve`](crate::pipeline::Pipeline::serve), whose
//! batches are queued from threads of its own, is refused inside a task for that reason.
//!
//! ```
//! use offload::{map, HostLaunch, Kernel, Runtime};
//!
//! fn add_one(l: &HostLaunch<'_>) -> Result<(), String> {
//!     // SAFETY: argument 0 is a mapped range of n i32.
//!     unsafe { l.slice_mut::<i32>(0, l.n())? }.iter_mut().for_each(|v| *v += 1);
//!     Ok(())
//! }
//! static ADD: Kernel = Kernel::new("add_one").with_host(add_one);
//!
//! let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
//! let mut a = vec![1i32; 1000];
//! let mut b = vec![5i32; 1000];
//! rt.nowait(|s| {
//!     let (ta, va) = s.enter(0, map::tofrom(&mut a), &[])?;
//!     let (tb, vb) = s.enter(1, map::tofrom(&mut b), &[])?;
//!     let ka = s.launch(0, &ADD, 1000, (va,), &[&ta])?;
//!     let kb = s.launch(1, &ADD, 1000, (vb,), &[&tb, &ka])?; // across devices
//!     s.exit(0, va, &[&ka])?;
//!     s.exit(1, vb, &[&kb])?;
//!     Ok::<(), offload::Error>(())
//! })??;
//! assert!(a.iter().all(|&v| v == 2) && b.iter().all(|&v| v == 6));
//! # Ok::<(), offload::Error>(())
//! ```

use std::cell::Cell;
use std::marker::PhantomData;
use std::panic::Location;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::api::{Device, DeviceSlice, KernelArgs, MapList};
use crate::data_env::{MapItem, MapKind, MapType, UpdateDirection};
use crate::error::{panic_message, Error, Result};
use crate::kernel::{DeviceCopy, Kernel};
use crate::latch::{CountLatch, Pending};
use crate::range::HostRange;
use crate::rt::{MapConstruct, Runtime};

/// Which of a device's three lanes runs a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Host->device copies (enter, update to, memcpy into the device).
    CopyIn = 0,
    /// Kernels and other device work.
    Compute = 1,
    /// Device->host copies and unmapping (exit, update from).
    CopyOut = 2,
}

#[derive(Default)]
struct TaskState {
    result: Mutex<Option<Result<()>>>,
    done: Condvar,
}

/// A queued asynchronous operation. Cheap to clone.
#[derive(Clone)]
pub struct Task {
    state: Arc<TaskState>,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task").field("done", &self.is_done()).finish()
    }
}

impl Task {
    pub(crate) fn new() -> Self {
        Self { state: Arc::new(TaskState::default()) }
    }

    pub(crate) fn finish(&self, r: Result<()>) {
        *self.state.result.lock() = Some(r);
        self.state.done.notify_all();
    }

    /// Waits for the task; its error if it failed.
    pub fn wait(&self) -> Result<()> {
        let mut g = self.state.result.lock();
        while g.is_none() {
            self.state.done.wait(&mut g);
        }
        g.clone().unwrap_or(Ok(()))
    }

    /// Whether the task has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.state.result.lock().is_some()
    }
}

/// Where the task running on this thread runs: (runtime, as an address; device; lane);
/// `None` on threads that are not running a task.
type RunningTask = Option<(usize, usize, Lane)>;

thread_local! {
    static RUNNING: Cell<RunningTask> = const { Cell::new(None) };
}

/// A task's completion, held by its job: [`Completion::finish`] records the result, then
/// counts the task down in its scope; a job dropped unrun (never submitted, or dropped by
/// a closing queue) fails its task instead, so no one waits on it forever.
struct Completion {
    task: Task,
    device: usize,
    /// Dropped after `Drop::drop` has finished the task, so the scope never sees the
    /// count at zero before every task's result is recorded.
    _pending: Option<Pending>,
}

impl Completion {
    fn finish(self, r: Result<()>) {
        self.task.finish(r);
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if !self.task.is_done() {
            self.task.finish(Err(Error::QueueClosed {
                device: self.device,
                why: "the task's lane ended before it ran",
            }));
        }
    }
}

/// A scope of asynchronous work; see the module documentation.
pub struct NowaitScope<'scope, 'env: 'scope> {
    rt: &'env Runtime,
    /// Every task queued, in submission order, for the scope's first error.
    tasks: Mutex<Vec<Task>>,
    /// Tasks queued and not yet finished.
    outstanding: Arc<CountLatch>,
    /// Ranges entered in the scope (device, range), and the exits queued (their task,
    /// device and ranges): what no exit that succeeded covers is released when the scope
    /// ends, since its host borrows end with it.
    unexited: Mutex<Vec<(usize, HostRange)>>,
    exits: Mutex<Vec<(Task, usize, Vec<HostRange>)>>,
    /// The task that opened the scope, when a task did: it waits for the scope's tasks
    /// while it occupies its lane, so they run at once, on its thread (see `spawn`).
    opened_by: RunningTask,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for NowaitScope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NowaitScope").field("tasks", &self.tasks.lock().len()).finish()
    }
}

/// Waits, when dropped, until a scope has no task outstanding: after its closure
/// returned, and while unwinding from a panic of it.
struct WaitForTasks<'a>(&'a CountLatch);

impl Drop for WaitForTasks<'_> {
    fn drop(&mut self) {
        self.0.wait();
    }
}

impl Runtime {
    /// Runs `f` with a scope in which constructs can be queued without waiting; returns
    /// when every task queued in it (by `f` or by other tasks) has finished: the first
    /// task error, in submission order, if any task failed (whether or not it was waited
    /// for), else `f`'s result. A panic of `f` resumes once every task has finished.
    pub fn nowait<'env, R>(
        &'env self,
        f: impl for<'scope> FnOnce(&'scope NowaitScope<'scope, 'env>) -> R,
    ) -> Result<R> {
        let scope = NowaitScope {
            rt: self,
            tasks: Mutex::new(Vec::new()),
            outstanding: CountLatch::new(),
            unexited: Mutex::new(Vec::new()),
            exits: Mutex::new(Vec::new()),
            opened_by: RUNNING.get(),
            _scope: PhantomData,
            _env: PhantomData,
        };
        let r = {
            let _wait = WaitForTasks(&scope.outstanding);
            f(&scope)
        };
        // Every task has finished, so none of these waits blocks.
        let first_error = scope.tasks.lock().iter().find_map(|t| t.wait().err());
        let left = scope.release_unexited();
        match (first_error, left) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(r),
        }
    }
}

impl<'scope, 'env> NowaitScope<'scope, 'env> {
    /// The runtime.
    pub fn runtime(&self) -> &'env Runtime {
        self.rt
    }

    /// Queues `work` on `lane` of `device`, after `after`; with `cleanup` it runs even if a
    /// dependency failed (and is told so).
    fn spawn(
        &'scope self,
        device: usize,
        lane: Lane,
        after: &[&Task],
        cleanup: bool,
        work: impl FnOnce(Result<()>) -> Result<()> + Send + 'scope,
    ) -> Result<Task> {
        // A scope opened by a task waits for its tasks while that task occupies its lane,
        // and a lane runs its jobs in order, each waiting for its dependences: a task of the
        // scope queued on any lane could wait behind work that waits for the opener (its
        // own lane; another lane's exit after it; another device's lane whose task waits
        // for this one), for ever. So its tasks are undeferred, as OpenMP lets any task be:
        // each runs at once on the opener's thread, after its dependences.
        let undeferred = self.opened_by.is_some();
        let task = Task::new();
        let deps: Vec<Task> = after.iter().map(|t| (*t).clone()).collect();
        // Counted before submission, by a caller that is itself counted (a running task)
        // or that the scope waits for (its closure).
        let pending = self.outstanding.pending();
        self.tasks.lock().push(task.clone());
        // SAFETY: the job borrows only data that outlives 'scope, and the scope does not
        // return (nor unwind) before its count of outstanding tasks is zero; `pending`
        // counts this job until it has finished or been dropped.
        unsafe {
            queue_task(self.rt, device, lane, task.clone(), deps, cleanup, Some(pending), undeferred, work)?
        };
        Ok(task)
    }

    /// Releases what was entered in the scope and never exited (its host borrows end with
    /// the scope, so the table must not keep it); an error naming the first such range.
    fn release_unexited(&self) -> Result<()> {
        let mut left = std::mem::take(&mut *self.unexited.lock());
        for (task, device, ranges) in self.exits.lock().drain(..) {
            if task.wait().is_err() {
                continue; // (done: every task has finished) its ranges are still mapped
            }
            for x in ranges {
                if let Some(k) = left.iter().position(|(d, r)| *d == device && r.contains(&x)) {
                    left.swap_remove(k);
                }
            }
        }
        let mut first = None;
        for (device, range) in left {
            // SAFETY: `release` copies nothing into host memory.
            let r = unsafe { self.rt.exit_data(device, &[MapItem::new(range, MapType::RELEASE)]) };
            first.get_or_insert_with(|| {
                r.err().unwrap_or_else(|| Error::InvalidArgument {
                    routine: "NowaitScope",
                    what: format!(
                        "device {device}: {range} was entered in the scope and never exited; released at \
                         its end (expected an exit or cleanup of its views in the scope)"
                    ),
                })
            });
        }
        first.map_or(Ok(()), Err)
    }

    /// `target enter data nowait` over borrowed slices; returns the task and the views.
    /// Each range must be exited in the scope ([`NowaitScope::exit`],
    /// [`NowaitScope::cleanup`]); one that is not is released when the scope ends, and the
    /// scope returns an error naming it.
    #[track_caller]
    pub fn enter<L: MapList<'scope> + Send + 'scope>(
        &'scope self,
        device: usize,
        maps: L,
        after: &[&Task],
    ) -> Result<(Task, L::Views)> {
        self.enter_at(device, maps, after, Location::caller())
    }

    /// [`NowaitScope::enter`] as called from `at` (a pipeline's caller).
    pub(crate) fn enter_at<L: MapList<'scope> + Send + 'scope>(
        &'scope self,
        device: usize,
        maps: L,
        after: &[&Task],
        at: &'static Location<'static>,
    ) -> Result<(Task, L::Views)> {
        let views = maps.views(device, false);
        let entered = crate::api::entry_items(self.rt, device, &maps)?;
        let rt = self.rt;
        let t = self.spawn(device, Lane::CopyIn, after, false, move |_| {
            let mut items = Vec::new();
            maps.items(&mut items);
            // The exit half takes `from` maps' copies back; enter data accepts `alloc` for them.
            for i in &mut items {
                if i.map_type.kind == MapKind::From {
                    i.map_type.kind = MapKind::Alloc;
                }
            }
            // SAFETY: the slices stay borrowed for 'scope, which outlives the task.
            unsafe { rt.map_construct_at(MapConstruct::EnterData, device, &items, at) }
        })?;
        self.unexited.lock().extend(entered.iter().map(|i| (device, i.range)));
        Ok((t, views))
    }

    /// `target exit data nowait` of what `views` name: `from` for views of exclusive
    /// borrows (`map::from`, `map::tofrom`), `release` for the others.
    #[track_caller]
    pub fn exit<V: ExitList + Send + 'scope>(
        &'scope self,
        device: usize,
        views: V,
        after: &[&Task],
    ) -> Result<Task> {
        self.unmap(device, views, after, false, Location::caller())
    }

    /// Like [`NowaitScope::exit`], but runs even if a dependency failed; then it copies
    /// nothing back (`release` only), so a failed computation leaves nothing mapped.
    #[track_caller]
    pub fn cleanup<V: ExitList + Send + 'scope>(
        &'scope self,
        device: usize,
        views: V,
        after: &[&Task],
    ) -> Result<Task> {
        self.unmap(device, views, after, true, Location::caller())
    }

    /// The body of `exit` and `cleanup` (a plain exit never runs after a failed dependency,
    /// so for it `before` is always `Ok`), as called from `at`.
    pub(crate) fn unmap<V: ExitList + Send + 'scope>(
        &'scope self,
        device: usize,
        views: V,
        after: &[&Task],
        cleanup: bool,
        at: &'static Location<'static>,
    ) -> Result<Task> {
        let rt = self.rt;
        // A view of another device would copy that device's data back too, concurrently
        // with its own exit: refused here, before anything is queued.
        let mut items = Vec::new();
        views.exit_items(device, &mut items)?;
        let ranges: Vec<HostRange> = items.iter().map(|i| i.range).collect();
        let task = self.spawn(device, Lane::CopyOut, after, cleanup, move |before| {
            let _borrows = views;
            let mut items = items;
            if before.is_err() {
                items.iter_mut().for_each(|i| i.map_type = MapType::RELEASE);
            }
            // SAFETY: `from` items come from exclusive borrows held for 'scope.
            let r = unsafe { rt.map_construct_at(MapConstruct::ExitData, device, &items, at) };
            before.and(r)
        })?;
        self.exits.lock().push((task.clone(), device, ranges));
        Ok(task)
    }

    /// A kernel launch, `nowait`.
    #[track_caller]
    pub fn launch<A: KernelArgs + Send + 'scope>(
        &'scope self,
        device: usize,
        kernel: &'scope Kernel,
        n: usize,
        args: A,
        after: &[&Task],
    ) -> Result<Task> {
        let (rt, at) = (self.rt, Location::caller());
        self.spawn(device, Lane::Compute, after, false, move |_| {
            rt.device(device)?.launch_at(kernel, n, args, at)
        })
    }

    /// Any device work (several kernels, a GEMM, ...) on the compute lane.
    pub fn compute(
        &'scope self,
        device: usize,
        after: &[&Task],
        work: impl FnOnce(&Device<'env>) -> Result<()> + Send + 'scope,
    ) -> Result<Task> {
        let rt = self.rt;
        self.spawn(device, Lane::Compute, after, false, move |_| work(&rt.device(device)?))
    }

    /// `target update to nowait`.
    #[track_caller]
    pub fn update_to<T: DeviceCopy>(
        &'scope self,
        device: usize,
        host: &'scope [T],
        after: &[&Task],
    ) -> Result<Task> {
        let (rt, range, at) = (self.rt, HostRange::of(host), Location::caller());
        // SAFETY: `host` is borrowed shared for 'scope; update to only reads it.
        self.spawn(device, Lane::CopyIn, after, false, move |_| unsafe {
            rt.update_at(device, UpdateDirection::To, &[(range, false)], at)
        })
    }

    /// `target update from nowait`.
    #[track_caller]
    pub fn update_from<T: DeviceCopy>(
        &'scope self,
        device: usize,
        host: &'scope mut [T],
        after: &[&Task],
    ) -> Result<Task> {
        let (rt, ptr, len) = (self.rt, host.as_mut_ptr() as usize, std::mem::size_of_val(host));
        let at = Location::caller();
        // SAFETY: `host` is borrowed exclusively for 'scope; any bits are valid `T`.
        self.spawn(device, Lane::CopyOut, after, false, move |_| unsafe {
            rt.update_at(device, UpdateDirection::From, &[(HostRange::new(ptr, len), false)], at)
        })
    }

    /// `omp_target_memcpy` `nowait` (on the destination device's copy-in lane, or the
    /// source's copy-out lane when the destination is the host).
    ///
    /// # Safety
    /// As [`Runtime::target_memcpy`], until the task has finished.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn memcpy(
        &'scope self,
        dst: u64,
        src: u64,
        len: usize,
        dst_offset: usize,
        src_offset: usize,
        dst_device: usize,
        src_device: usize,
        after: &[&Task],
    ) -> Result<Task> {
        let rt = self.rt;
        let (device, lane) = copy_lane(rt, dst_device, src_device);
        // SAFETY: forwarded from the caller.
        self.spawn(device, lane, after, false, move |_| unsafe {
            rt.target_memcpy(dst, src, len, dst_offset, src_offset, dst_device, src_device)
        })
    }

    /// `omp_target_memcpy_rect` `nowait`, on the lane [`NowaitScope::memcpy`] would use;
    /// the arrays of `dst` and `src` are copied at the call.
    ///
    /// # Safety
    /// As [`Runtime::target_memcpy_rect`], until the task has finished.
    pub unsafe fn memcpy_rect(
        &'scope self,
        element_size: usize,
        volume: &[usize],
        dst: crate::memcpy::RectSide<'_>,
        src: crate::memcpy::RectSide<'_>,
        after: &[&Task],
    ) -> Result<Task> {
        let rt = self.rt;
        let (device, lane) = copy_lane(rt, dst.device, src.device);
        let volume = volume.to_vec();
        let (d_off, d_dim, s_off, s_dim) =
            (dst.offsets.to_vec(), dst.dimensions.to_vec(), src.offsets.to_vec(), src.dimensions.to_vec());
        let (d_ptr, d_dev, s_ptr, s_dev) = (dst.ptr, dst.device, src.ptr, src.device);
        self.spawn(device, lane, after, false, move |_| {
            let dst =
                crate::memcpy::RectSide { ptr: d_ptr, device: d_dev, offsets: &d_off, dimensions: &d_dim };
            let src =
                crate::memcpy::RectSide { ptr: s_ptr, device: s_dev, offsets: &s_off, dimensions: &s_dim };
            // SAFETY: forwarded from the caller.
            unsafe { rt.target_memcpy_rect(element_size, &volume, dst, src) }
        })
    }

    /// `omp_target_memset` `nowait`, on the device's copy-in lane.
    ///
    /// # Safety
    /// As [`Runtime::target_memset`], until the task has finished.
    pub unsafe fn memset(
        &'scope self,
        ptr: u64,
        value: u8,
        bytes: usize,
        device: usize,
        after: &[&Task],
    ) -> Result<Task> {
        let rt = self.rt;
        // SAFETY: forwarded from the caller.
        self.spawn(device, Lane::CopyIn, after, false, move |_| unsafe {
            rt.target_memset(ptr, value, bytes, device)
        })
    }
}

/// The device and lane of a copy from `src` to `dst`: the destination's copy-in lane, or
/// the source's copy-out lane when the destination is the initial device.
pub(crate) fn copy_lane(rt: &Runtime, dst: usize, src: usize) -> (usize, Lane) {
    if dst == rt.initial_device() {
        (src, Lane::CopyOut)
    } else {
        (dst, Lane::CopyIn)
    }
}

fn runtime_id(rt: &Runtime) -> usize {
    rt.identity()
}

/// Waits for every task of `deps` (all of them, so that nothing runs while one is still
/// running), then gives the first error in their order.
pub(crate) fn wait_for_all(deps: &[Task]) -> Result<()> {
    let results: Vec<Result<()>> = deps.iter().map(Task::wait).collect();
    results.into_iter().find(Result::is_err).unwrap_or(Ok(()))
}

/// Whether the calling thread is running a `nowait` task (of any runtime or lane).
pub(crate) fn running_a_task() -> bool {
    RUNNING.get().is_some()
}

/// Queues `work` as `task` on `lane` of `device`, to run once every task of `deps` has
/// finished (if one failed, `work` is dropped unrun and `task` fails with
/// [`Error::Dependency`], unless `cleanup`: then `work` runs and is told). `pending` counts
/// the task as outstanding until its result is recorded (`None`: nothing waits on a
/// count). `undeferred`: run it now, on this thread, instead (as the lane would: after
/// `deps`, marked as a task of `lane`). The core of [`NowaitScope`]'s constructs and of
/// [`crate::omp`]'s asynchronous routines.
///
/// # Safety
/// Whatever `work` borrows must outlive the job: the caller waits for `pending`'s latch, or
/// `work` borrows nothing (`'static`).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn queue_task<'w>(
    rt: &Runtime,
    device: usize,
    lane: Lane,
    task: Task,
    deps: Vec<Task>,
    cleanup: bool,
    pending: Option<Pending>,
    undeferred: bool,
    work: impl FnOnce(Result<()>) -> Result<()> + Send + 'w,
) -> Result<()> {
    let done = Completion { task, device, _pending: pending };
    // The task comes after the constructs the program made before it: what they queued
    // on the device is waited for first (tasks run on other queues).
    let lanes = rt.task_lanes(device, undeferred);
    let lanes = match lanes {
        Ok(lanes) => lanes,
        Err(e) => {
            done.finish(Err(e.clone()));
            return Err(e);
        }
    };
    let rt_id = runtime_id(rt);
    let job = move || {
        let before = wait_for_all(&deps);
        drop(deps);
        let r = if before.is_err() && !cleanup {
            // Dropped now, not after the count-down: what it holds may borrow 'w.
            drop(work);
            Err(Error::Dependency { cause: before.err().map_or_else(String::new, |e| e.to_string()) })
        } else {
            let outer = RUNNING.replace(Some((rt_id, device, lane)));
            let _waits = crate::rt::ConstructsWait::begin();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(before)));
            RUNNING.set(outer);
            r.unwrap_or_else(|payload| {
                Err(Error::Panicked { device, what: "a nowait task", message: panic_message(&*payload) })
            })
        };
        // The last thing the job does: its waiter may end as soon as it is counted down.
        done.finish(r);
    };
    let Some(lanes) = lanes else {
        job();
        return Ok(());
    };
    let job: Box<dyn FnOnce() + Send + 'w> = Box::new(job);
    // SAFETY: the job is counted by `pending` (when given) from before it is submitted
    // until it has finished (`done.finish`, its last step) or has been dropped, and the
    // caller keeps what it borrows alive until then (or it borrows nothing).
    let job: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(job) };
    // On failure the unsent job is dropped here, which fails the task (`Completion`).
    lanes
        .worker(lane as usize)
        .submit(job)
        .map_err(|_| Error::QueueClosed { device, why: "the lane thread ended" })
}

/// What [`NowaitScope::exit`] unmaps: a view, or a tuple or `Vec` of views.
///
/// # Safety
/// Exits trust the items: a `from` item must name host memory the value borrows
/// exclusively until the exit has finished.
pub unsafe trait ExitList {
    /// Appends the exit items for an exit on `device`: `from` for views that copy back
    /// ([`DeviceSlice::copies_back`]), `release` otherwise; a view of another device is an
    /// error.
    fn exit_items(&self, device: usize, out: &mut Vec<MapItem>) -> Result<()>;
}

// SAFETY: views copy back only into exclusive borrows they carry.
unsafe impl<T> ExitList for DeviceSlice<'_, T> {
    fn exit_items(&self, device: usize, out: &mut Vec<MapItem>) -> Result<()> {
        if self.device() != device {
            return Err(Error::InvalidArgument {
                routine: "NowaitScope::exit",
                what: format!(
                    "a view of device {} ({}) given to an exit on device {device}",
                    self.device(),
                    self.host_range()
                ),
            });
        }
        if self.on_exit == crate::api::ViewExit::Refuse {
            return Err(Error::InvalidArgument {
                routine: "NowaitScope::exit",
                what: format!(
                    "device {device}: a view of a guard's mapping ({}); the guard (Mapped, \
                     Association) ends it: drop or exit the guard instead",
                    self.host_range()
                ),
            });
        }
        // An empty view mapped nothing (`MapList::items`): it has nothing to end.
        if self.is_empty() {
            return Ok(());
        }
        let kind = if self.copies_back() { MapType::FROM } else { MapType::RELEASE };
        out.push(MapItem::new(self.host_range(), kind));
        Ok(())
    }
}

// SAFETY: views copy back only into exclusive borrows they carry.
unsafe impl<V: ExitList> ExitList for Vec<V> {
    fn exit_items(&self, device: usize, out: &mut Vec<MapItem>) -> Result<()> {
        self.iter().try_for_each(|v| v.exit_items(device, out))
    }
}

macro_rules! exit_list_tuple {
    ($($n:ident : $i:tt),+) => {
        // SAFETY: views copy back only into exclusive borrows they carry.
        unsafe impl<$($n: ExitList),+> ExitList for ($($n,)+) {
            fn exit_items(&self, device: usize, out: &mut Vec<MapItem>) -> Result<()> {
                $(self.$i.exit_items(device, out)?;)+
                Ok(())
            }
        }
    };
}
exit_list_tuple!(A: 0);
exit_list_tuple!(A: 0, B: 1);
exit_list_tuple!(A: 0, B: 1, C: 2);
exit_list_tuple!(A: 0, B: 1, C: 2, D: 3);
