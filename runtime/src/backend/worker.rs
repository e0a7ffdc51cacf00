//! One host worker thread per device, bound to the CPUs nearest the device, running the
//! device's host-side work in order. (Staging's CPU copies run on the copy crews of
//! `services::copy_crew`, not here.)
//!
//! A job that panics does not end its worker (the device's later work still needs it):
//! [`DeviceWorker::run`] hands the panic back to the waiting caller, where it resumes; a
//! job given to [`DeviceWorker::submit`] must report its own failures (`nowait` tasks catch
//! their panics), and a panic that escapes one anyway is dropped.
//!
//! Hand-offs are cheap when work comes in bursts (a loop of launches): an idle worker
//! polls its queue for [`SPIN`] before it sleeps, and [`DeviceWorker::run`]'s caller polls
//! for the result for as long before it sleeps, so a short job costs no wake-up of a
//! sleeping thread either way. The result comes back through a slot on the caller's stack
//! ([`Handback`]), not a channel made per call. A short job on an idle worker costs no
//! hand-off at all: [`DeviceWorker::run_here_if_idle`] runs it on the caller's thread in
//! the queue's place (host devices' small copies, frees and synchronisations).

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TryRecvError};

use crate::topology::Topology;

type Job = Box<dyn FnOnce() + Send>;

/// The worker is gone: it panicked, or the device is shutting down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WorkerGone;

/// A thread bound to a device's CPUs that runs jobs in submission order.
pub(crate) struct DeviceWorker {
    queue: Option<Sender<Job>>,
    /// Jobs submitted and not finished (a job run by its caller in the queue's place
    /// counts while it runs).
    pending: Arc<AtomicUsize>,
    /// Held while a job runs, on the worker or by a caller in the queue's place: a job
    /// queued meanwhile waits for that one.
    running: Arc<parking_lot::Mutex<()>>,
    thread: Option<JoinHandle<()>>,
    binding: Result<Vec<usize>, String>,
}

impl std::fmt::Debug for DeviceWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceWorker").field("binding", &self.binding).finish_non_exhaustive()
    }
}

impl DeviceWorker {
    /// Starts a worker named `name`, bound to `cpus` of `topology` (best effort: the
    /// binding read back, or why it failed, is kept for the report).
    pub(crate) fn spawn(name: String, topology: Arc<Topology>, cpus: Vec<usize>) -> std::io::Result<Self> {
        let (tx, rx) = unbounded::<Job>();
        let (bound_tx, bound_rx) = bounded(1);
        let pending = Arc::new(AtomicUsize::new(0));
        let running = Arc::new(parking_lot::Mutex::new(()));
        let (finished, turn) = (Arc::clone(&pending), Arc::clone(&running));
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let _ = bound_tx.send(topology.bind_current_thread(&cpus).map_err(|e| e.to_string()));
            while let Some(job) = next_job(&rx) {
                let held = turn.lock();
                // The job's owner learns of a panic (see the module documentation).
                let _ = catch_unwind(AssertUnwindSafe(job));
                drop(held);
                finished.fetch_sub(1, Ordering::Release);
            }
        })?;
        let binding = bound_rx.recv().unwrap_or_else(|_| Err("worker ended before binding".into()));
        Ok(Self { queue: Some(tx), pending, running, thread: Some(thread), binding })
    }

    /// Runs `f` on the calling thread, in the queue's place, when nothing is queued or
    /// running: the queue is then at this point, and a job submitted meanwhile (by any
    /// thread) runs after `f`, as if `f` had been queued. Saves two thread hand-offs for a
    /// short job (a small copy, a free, a synchronisation) on an idle device. Gives `f`
    /// back when the worker is busy. A panic of `f` unwinds in the caller, the queue
    /// released.
    pub(crate) fn run_here_if_idle<T, F: FnOnce() -> T>(&self, f: F) -> Result<T, F> {
        // The turn first: a job the worker takes after the claim below then waits for `f`.
        let Some(_held) = self.queue.as_ref().and_then(|_| self.running.try_lock()) else { return Err(f) };
        if self.pending.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return Err(f);
        }
        /// Releases the queue's place (also when `f` unwinds).
        struct Claim<'a>(&'a AtomicUsize);
        impl Drop for Claim<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Release);
            }
        }
        let _claim = Claim(&self.pending);
        Ok(f())
    }

    /// Runs `f` on the worker after every job submitted before it, and returns its result;
    /// a panic of `f` resumes in the caller (the worker goes on).
    pub(crate) fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, WorkerGone> {
        self.run_helping(f, || false)
    }

    /// [`DeviceWorker::run`], calling `help` while it waits (before it sleeps, and for as
    /// long as `help` finds work): a host device's caller works the tasks of the kernel it
    /// waits behind (`crate::fork_join`), instead of spinning beside it.
    pub(crate) fn run_helping<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
        help: impl FnMut() -> bool,
    ) -> Result<T, WorkerGone> {
        let slot = Handback::new();
        let filler = Filler(&slot);
        // A job refused by the channel is dropped here, abandoning the slot.
        self.submit(Box::new(move || filler.fill(catch_unwind(AssertUnwindSafe(f)))))?;
        match slot.wait(help) {
            Some(Ok(v)) => Ok(v),
            Some(Err(panic)) => resume_unwind(panic),
            None => Err(WorkerGone),
        }
    }

    /// Queues `job` after every job submitted before it, without waiting.
    pub(crate) fn submit(&self, job: Box<dyn FnOnce() + Send>) -> Result<(), WorkerGone> {
        let queue = self.queue.as_ref().ok_or(WorkerGone)?;
        self.pending.fetch_add(1, Ordering::Relaxed);
        queue.send(job).map_err(|_| {
            self.pending.fetch_sub(1, Ordering::Relaxed);
            WorkerGone
        })
    }

    /// Whether every job submitted so far has finished (what they did is visible to the
    /// caller then).
    #[cfg(test)]
    pub(crate) fn idle(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    /// The CPUs the worker is bound to, as read back after binding (empty when the
    /// topology is not this machine's), or why binding failed.
    pub(crate) fn binding(&self) -> Result<&[usize], &str> {
        self.binding.as_deref().map_err(String::as_str)
    }
}

/// How long an idle worker polls its queue, and a caller of [`DeviceWorker::run`] its
/// result, before sleeping: longer than a short job and the caller's turn-around between
/// two launches, short enough that an idle device costs nothing to speak of.
const SPIN: Duration = Duration::from_micros(50);

/// Polls `ready` for [`SPIN`] (a few busy rounds, then yielding the CPU, which matters on
/// a machine with fewer cores than busy threads) and gives its first `Some`.
fn spin<R>(ready: impl FnMut() -> Option<R>) -> Option<R> {
    spin_for(ready, SPIN)
}

thread_local! {
    /// Whether this thread's last wait for a job's result outlasted [`SPIN`]: its next wait
    /// then sleeps after the busy rounds instead of yielding for [`SPIN`] (a long kernel's
    /// caller would only take CPU time from the kernel's threads).
    static WAITS_ARE_LONG: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// [`spin`] for at most `budget` after the busy rounds.
fn spin_for<R>(mut ready: impl FnMut() -> Option<R>, budget: Duration) -> Option<R> {
    for _ in 0..64 {
        if let Some(r) = ready() {
            return Some(r);
        }
        std::hint::spin_loop();
    }
    if budget.is_zero() {
        return None;
    }
    let start = Instant::now();
    while start.elapsed() < budget {
        if let Some(r) = ready() {
            return Some(r);
        }
        std::thread::yield_now();
    }
    None
}

/// The worker's next job: polled for a while, then waited for; `None` once every sender is
/// gone and the queue is drained.
fn next_job(rx: &Receiver<Job>) -> Option<Job> {
    let polled = spin(|| match rx.try_recv() {
        Ok(job) => Some(Some(job)),
        Err(TryRecvError::Disconnected) => Some(None),
        Err(TryRecvError::Empty) => None,
    });
    match polled {
        Some(job) => job,
        None => rx.recv().ok(),
    }
}

const PENDING: u8 = 0;
const FILLED: u8 = 1;
const ABANDONED: u8 = 2;

/// A one-shot slot for a job's result, on the stack of the thread that waits for it: the
/// job fills it through a [`Filler`] (or abandons it, when the job is dropped unrun) and
/// wakes the waiter, which polls for a while before it parks.
struct Handback<T> {
    state: AtomicU8,
    value: UnsafeCell<Option<T>>,
    waiter: Thread,
    /// Set once the waiter has stopped polling and parks (tests fill a slot only then, so
    /// that what they check does not hang on how the threads were scheduled).
    parked: std::sync::atomic::AtomicBool,
}

impl<T> Handback<T> {
    /// An empty slot that the calling thread will wait on.
    fn new() -> Self {
        Self {
            state: AtomicU8::new(PENDING),
            value: UnsafeCell::new(None),
            waiter: std::thread::current(),
            parked: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Waits until the slot is filled (`Some`) or abandoned (`None`), calling `help` while
    /// it polls (see [`DeviceWorker::run_helping`]); it does not sleep while `help` finds
    /// work. Only the thread that made the slot may wait: its [`Filler`] unparks that thread.
    fn wait(&self, mut help: impl FnMut() -> bool) -> Option<T> {
        let filled = || self.state.load(Ordering::Acquire) != PENDING;
        let mut done = || (filled() || (help() && filled())).then_some(());
        // Spin only while this thread's waits end within the spin: the waits of a long
        // kernel's caller park at once and leave the cores to the kernel.
        let long = WAITS_ARE_LONG.with(|l| l.get());
        let start = Instant::now();
        if spin_for(&mut done, if long { Duration::ZERO } else { SPIN }).is_none() {
            self.parked.store(true, Ordering::Release);
            while done().is_none() {
                std::thread::park();
            }
            WAITS_ARE_LONG.with(|l| l.set(start.elapsed() >= SPIN));
        } else {
            WAITS_ARE_LONG.with(|l| l.set(false));
        }
        // SAFETY: the state is no longer pending, so the filler has written the value (or
        // abandoned it) before its release store, and touches the slot no more.
        unsafe { (*self.value.get()).take() }
    }
}

/// The job's end of a [`Handback`]: fills it once, or abandons it when dropped unfilled.
///
/// The slot lives on the waiter's stack: the waiter must not return before the slot is
/// filled or abandoned, which [`Handback::wait`] ensures; a filler must therefore be made
/// only for a slot that will be waited on, and is sent to the thread that fills it.
struct Filler<T>(*const Handback<T>);

// SAFETY: the filler only writes a `T` into the slot (moved to the waiter's thread) and
// wakes the waiter; the slot outlives it (see the type's documentation).
unsafe impl<T: Send> Send for Filler<T> {}

impl<T> Filler<T> {
    /// Hands `value` to the waiter.
    fn fill(self, value: T) {
        // SAFETY: the slot is alive (the waiter waits for the state to change) and nothing
        // else touches the value while it is pending.
        unsafe { *(*self.0).value.get() = Some(value) };
        self.finish(FILLED);
        std::mem::forget(self);
    }

    fn finish(&self, state: u8) {
        // SAFETY: the slot is alive until the store below; the waiter's thread handle is
        // cloned first, since the slot may be gone as soon as the state changes.
        let waiter = unsafe { (*self.0).waiter.clone() };
        // SAFETY: as above.
        unsafe { (*self.0).state.store(state, Ordering::Release) };
        waiter.unpark();
    }
}

impl<T> Drop for Filler<T> {
    fn drop(&mut self) {
        self.finish(ABANDONED);
    }
}

impl Drop for DeviceWorker {
    fn drop(&mut self) {
        self.queue = None; // the worker drains its queue and ends
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The three lane threads of a device (`nowait` tasks run on them): copy-in, compute and
/// copy-out, in that order.
pub(crate) struct Lanes([DeviceWorker; 3]);

impl Lanes {
    /// The copy-in, compute and copy-out lanes, in that order.
    pub(crate) fn new(lanes: [DeviceWorker; 3]) -> Self {
        Self(lanes)
    }

    /// Lane `index` (0 copy-in, 1 compute, 2 copy-out).
    pub(crate) fn worker(&self, index: usize) -> &DeviceWorker {
        &self.0[index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_jobs_in_order_and_reports_its_binding() {
        let topo = Topology::system();
        let cpus = topo.whole_machine("test").cpus;
        let w = DeviceWorker::spawn("test-worker".into(), topo, cpus.clone()).unwrap();
        let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
        for i in 0..100 {
            let l = Arc::clone(&log);
            w.run(move || l.lock().push(i)).unwrap();
        }
        assert_eq!(*log.lock(), (0..100).collect::<Vec<_>>());
        let name = w.run(|| std::thread::current().name().map(String::from)).unwrap();
        assert_eq!(name.as_deref(), Some("test-worker"));
        if let Ok(b) = w.binding() {
            assert!(b.iter().all(|c| cpus.contains(c)), "bound to {b:?}, asked {cpus:?}");
        }
    }

    #[test]
    fn a_panicking_job_resumes_in_its_caller_and_the_worker_goes_on() {
        let topo = Topology::system();
        let w = DeviceWorker::spawn("test-worker".into(), topo, Vec::new()).unwrap();
        let caught = catch_unwind(AssertUnwindSafe(|| w.run(|| panic!("job panicked"))));
        assert_eq!(crate::error::panic_message(&*caught.unwrap_err()), "job panicked");
        // A submitted job has no caller to resume in; its panic must not end the worker.
        w.submit(Box::new(|| panic!("submitted job panicked"))).unwrap();
        assert_eq!(w.run(|| 7), Ok(7));
    }

    #[test]
    fn a_handback_is_filled_from_another_thread_or_abandoned() {
        /// Waits on a slot that another thread fills with `value` once this thread has given
        /// up polling and parked, and at least `SPIN * 4` after that (a lower bound only:
        /// load lengthens it, never shortens it).
        fn filled_after_park<T: Send>(value: T) -> Option<T> {
            let slot = Handback::new();
            let filler = Filler(&slot);
            std::thread::scope(|s| {
                s.spawn(|| {
                    while !slot.parked.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    std::thread::sleep(SPIN * 4);
                    filler.fill(value);
                });
                slot.wait(|| false)
            })
        }
        assert_eq!(filled_after_park(vec![1, 2, 3]), Some(vec![1, 2, 3]));
        // That wait outlasted the spin: this thread's next wait parks without spinning (and
        // still gets its value).
        assert!(WAITS_ARE_LONG.with(|l| l.get()));
        assert_eq!(filled_after_park(5u8), Some(5));
        assert!(WAITS_ARE_LONG.with(|l| l.get()));
        // Dropped unfilled (a job dropped unrun): the waiter learns it.
        let slot = Handback::<u32>::new();
        let filler = Filler(&slot);
        std::thread::spawn(move || drop(filler)).join().unwrap();
        assert_eq!(slot.wait(|| false), None);
    }

    #[test]
    fn concurrent_callers_get_their_own_results_and_a_sleeping_worker_wakes() {
        let topo = Topology::system();
        let w = Arc::new(DeviceWorker::spawn("test-worker".into(), topo, Vec::new()).unwrap());
        let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let callers: Vec<_> = (0..4u64)
            .map(|c| {
                let (w, log) = (Arc::clone(&w), Arc::clone(&log));
                std::thread::spawn(move || {
                    for i in 0..500u64 {
                        let l = Arc::clone(&log);
                        assert_eq!(
                            w.run(move || {
                                l.lock().push((c, i));
                                c * 1000 + i
                            }),
                            Ok(c * 1000 + i)
                        );
                        if i % 100 == 0 {
                            // Long enough for the worker to stop polling and sleep.
                            std::thread::sleep(SPIN * 4);
                        }
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        // Each caller's jobs ran in its order.
        let log = log.lock();
        for c in 0..4 {
            let mine: Vec<u64> = log.iter().filter(|(k, _)| *k == c).map(|(_, i)| *i).collect();
            assert_eq!(mine, (0..500).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_job_run_in_the_queues_place_comes_before_what_is_queued_meanwhile() {
        let topo = Topology::system();
        let w = Arc::new(DeviceWorker::spawn("test-worker".into(), topo, Vec::new()).unwrap());
        let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
        // Idle: runs here, on this thread.
        let here = w.run_here_if_idle(|| std::thread::current().name().map(String::from));
        assert_eq!(here.ok().flatten().as_deref(), std::thread::current().name());
        // While it runs, another thread queues a job: that one waits for it.
        let (started_tx, started_rx) = crossbeam_channel::bounded(0);
        let (w2, l2) = (Arc::clone(&w), Arc::clone(&log));
        let other = std::thread::spawn(move || {
            started_rx.recv().unwrap();
            assert!(!w2.idle());
            w2.run(move || l2.lock().push("queued")).unwrap();
        });
        let (l1, w1) = (Arc::clone(&log), Arc::clone(&w));
        let ran = w.run_here_if_idle(move || {
            started_tx.send(()).unwrap();
            // Until the other thread's job is queued behind this one (whose claim counts
            // one): it checks that the worker is busy before it queues, so it sees this job
            // running however the threads are scheduled.
            while w1.pending.load(Ordering::Acquire) < 2 {
                std::thread::yield_now();
            }
            l1.lock().push("here");
        });
        assert!(ran.is_ok());
        other.join().unwrap();
        assert_eq!(*log.lock(), ["here", "queued"]);
        // Busy: given back. The queue is held by a job that waits for a signal.
        let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(0);
        w.submit(Box::new(move || {
            let _ = go_rx.recv();
        }))
        .unwrap();
        assert!(w.run_here_if_idle(|| 7).is_err());
        go_tx.send(()).unwrap();
        let idle = |w: &DeviceWorker| {
            while !w.idle() {
                std::thread::yield_now();
            }
        };
        idle(&w);
        // A panic in the queue's place unwinds here and releases the queue.
        let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = w.run_here_if_idle(|| panic!("boom"));
        }));
        assert!(p.is_err() && w.idle());
        assert_eq!(w.run(|| 3), Ok(3));
        idle(&w);
        assert_eq!(w.run_here_if_idle(|| 4).ok(), Some(4));
    }
}
