//! A fork-join team for host devices' generated kernels: the thread that runs a kernel (the
//! device's worker) forks the launch's tasks, runs them itself, and is joined by a thread
//! *waiting* for that device and by the team's helpers, never more than
//! [`ForkJoinTeam::size`] threads in all; it returns once every task has ended.
//!
//! Why not the device's `rayon` pool, as hand-written kernels use: rayon lets only a pool's
//! own threads take part, so the thread that launched a kernel and waits for it could only
//! spin beside it, a third busy thread on a two-core machine, while the pool's second thread
//! had to be woken for every launch. libomp's master thread runs its share of a parallel
//! region; here the waiting thread does ([`ForkJoinTeam::help`]). A launch of fewer than
//! [`SHARED_ITEMS`] work items is not shared at all. Sleeping helpers are called only to
//! the seats no thread took within [`WAITER_GRACE`], and stay awake for [`HOT`] after, so
//! that launches back to back that nobody waits for find them awake.
//!
//! The tasks are cut into one stretch of consecutive tasks per seat; a thread claims its
//! own stretch's tasks in order, then those left in the next ones, so each works through
//! consecutive data while the tail balances, and a thread that stops (is descheduled) holds
//! at most one task. A task's panic is caught; the tasks not started yet are skipped, and
//! the first panic resumes in the driver once every task has ended.
//!
//! Several teams may fork at once (one per host device): the teams of one host platform
//! share its cores ([`SharedCores`]), so a team forking while others are busy, or were a
//! moment ago, takes only its share of the seats instead of oversubscribing the machine,
//! and a team alone takes them all.
//!
//! The job's body is borrowed from the driver's stack and reached by other threads through
//! a pointer whose lifetime is erased ([`Body`]); it is called only for a task index claimed
//! inside a stretch, and the driver does not return before every such call has ended (the
//! `done` count), so no call outlives the borrow.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Work items from which a launch is shared: below, joining costs more than it saves (a
/// kernel of a thousand saxpy items takes about a microsecond alone).
pub(crate) const SHARED_ITEMS: usize = 8192;

/// How long the driver waits, after publishing a job, for a waiting thread to take a seat
/// before it calls sleeping helpers to the seats left.
const WAITER_GRACE: Duration = Duration::from_micros(1);

/// How long a helper stays awake after its last job, as the device's worker does.
const HOT: Duration = Duration::from_micros(50);

/// How long after its last job a team still counts as busy for the others sharing its
/// cores: longer than the gap between two steps of devices working in lockstep (a halo
/// exchange, a synchronisation), short enough that a device left idle soon stops costing
/// the busy ones their share.
const LATELY: Duration = Duration::from_millis(2);

/// Most teams whose activity [`SharedCores`] tracks; more teams than this fork with every
/// seat, as before sharing existed.
const MEMBERS: usize = 64;

/// A member's stamp while it forks a job.
const BUSY: u64 = u64::MAX;

/// How long after two members last forked at once the members that ended a job within
/// [`LATELY`] still count as busy: devices in lockstep overlap at nearly every step, while
/// a program that uses its devices one after the other never does, and each of its
/// launches keeps every seat.
const CONTENDED: Duration = Duration::from_millis(20);

/// The cores that several teams share (a host platform's devices): each member notes when
/// it forks and when it ends a job, and a member forking takes `cores / (1 + others busy)`
/// seats, at least its own and at most its team's size. The others busy are those forking now and, while members have
/// lately forked at once ([`CONTENDED`]), those that ended a job within [`LATELY`]: members
/// working in lockstep thus split the cores evenly (whichever forks first), while a member
/// alone, or members used one after the other, keep them all.
pub(crate) struct SharedCores {
    epoch: Instant,
    /// Per member: [`BUSY`], or when its last job ended (nanoseconds since `epoch`, plus
    /// one), or 0 before its first.
    stamps: [AtomicU64; MEMBERS],
    members: AtomicUsize,
    /// When a member last forked while another was forking (as a stamp), or 0.
    overlapped: AtomicU64,
    /// [`LATELY`] and [`CONTENDED`] in nanoseconds (tests take longer ones).
    lately: u64,
    contended: u64,
    /// The cores shared: the machine's.
    cores: usize,
}

impl SharedCores {
    /// `cores` cores (the machine's), shared by no member yet.
    pub(crate) fn new(cores: usize) -> Arc<Self> {
        Self::with_spans(cores, LATELY, CONTENDED)
    }

    /// [`SharedCores::new`] with other spans than [`LATELY`] and [`CONTENDED`].
    fn with_spans(cores: usize, lately: Duration, contended: Duration) -> Arc<Self> {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Arc::new(Self {
            epoch: Instant::now(),
            stamps: std::array::from_fn(|_| AtomicU64::new(0)),
            members: AtomicUsize::new(0),
            overlapped: AtomicU64::new(0),
            lately: nanos(lately),
            contended: nanos(contended),
            cores: cores.max(1),
        })
    }

    /// A new member's number, or `None` once [`MEMBERS`] have joined.
    fn join(&self) -> Option<usize> {
        self.members
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| (m < MEMBERS).then_some(m + 1))
            .ok()
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(BUSY - 1).saturating_add(1)
    }

    /// Marks member `me` busy and gives its share of `size` seats.
    fn start(&self, me: usize, size: usize) -> usize {
        self.stamps[me].store(BUSY, Ordering::Relaxed);
        // Two members starting at once must not both miss the other's mark (a store then
        // loads of other locations: only a sequentially consistent fence orders them).
        std::sync::atomic::fence(Ordering::SeqCst);
        let now = self.now();
        let within = |stamp: u64, span: u64| stamp != 0 && now.saturating_sub(stamp) < span;
        let members = self.members.load(Ordering::Relaxed).min(MEMBERS);
        let (mut forking, mut lately) = (0, 0);
        for k in (0..members).filter(|&k| k != me) {
            match self.stamps[k].load(Ordering::Relaxed) {
                BUSY => forking += 1,
                ended if within(ended, self.lately) => lately += 1,
                _ => {}
            }
        }
        if forking > 0 {
            self.overlapped.store(now, Ordering::Relaxed);
        } else if !within(self.overlapped.load(Ordering::Relaxed), self.contended) {
            lately = 0;
        }
        // The share of the machine's cores, never above the team's own size (a team made
        // smaller than the machine, `kernel_threads`, keeps its size while that fits).
        (self.cores / (1 + forking + lately)).clamp(1, size.max(1))
    }

    /// Marks member `me`'s job ended now.
    fn end(&self, me: usize) {
        self.stamps[me].store(self.now(), Ordering::Relaxed);
    }
}

/// A team of `size` threads at most per job: the driver, and a waiting thread or helpers.
pub(crate) struct ForkJoinTeam {
    shared: Arc<Shared>,
    size: usize,
    /// The cores this team shares with others, and its number among them.
    cores: Option<(Arc<SharedCores>, usize)>,
    name: String,
    /// Runs first on each helper thread (the host backend marks it as a kernel thread).
    start: fn(),
    /// The `size - 1` helper threads, started on the first fork that needs them.
    helpers: Mutex<Vec<JoinHandle<()>>>,
    /// Whether the helpers could not be started (the driver then runs
    /// alone, or with a waiting thread).
    helpers_failed: AtomicBool,
}

/// What the team's threads share.
struct Shared {
    /// The job being forked now.
    job: Mutex<Option<Arc<Job>>>,
    /// Helpers sleep here until a driver calls for them (or the team closes).
    call: Condvar,
    /// Calls for helpers so far: a helper works a job once per call it sees.
    calls: AtomicUsize,
    /// Whether a job is published now (a cheap look before taking the lock).
    open: AtomicBool,
    closing: AtomicBool,
}

impl Shared {
    /// Takes a seat in the job being forked now, if it has tasks left and a free seat, and
    /// works it; whether this thread ran a task.
    fn join(&self) -> bool {
        self.current().is_some_and(|job| job.sit().is_some_and(|seat| job.work(seat)))
    }

    /// The job being forked now, if it has tasks nobody has claimed.
    fn current(&self) -> Option<Arc<Job>> {
        if !self.open.load(Ordering::Relaxed) {
            return None;
        }
        self.job.lock().as_ref().filter(|j| j.unclaimed()).map(Arc::clone)
    }
}

/// One fork: `tasks` calls of `body`, in as many stretches of consecutive tasks as the
/// team has seats (the driver's, then each joiner's): each thread claims its own stretch's
/// tasks in order, then the next stretches' left, so that a thread works through
/// consecutive data (as rayon's halving does) while the tail still balances.
struct Job {
    stretches: Box<[Stretch]>,
    done: AtomicUsize,
    /// Threads that may still join besides the driver.
    seats: AtomicUsize,
    failed: AtomicBool,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    body: Body,
}

/// Tasks `next..end` of a [`Job`], not claimed yet.
struct Stretch {
    next: AtomicUsize,
    end: usize,
}

/// The driver's task body, its lifetime erased (see the module documentation).
struct Body(*const (dyn Fn(usize) + Sync + 'static));

// SAFETY: the body is `Sync` (shared calls from several threads are what it was made for)
// and is called only while the driver keeps it alive (module documentation).
unsafe impl Send for Body {}
// SAFETY: as above.
unsafe impl Sync for Body {}

impl Job {
    /// A job of `tasks` in `stretches` stretches (the driver's and each joiner's, or a
    /// guest's), with `seats - 1` seats for joiners.
    fn new(tasks: usize, stretches: usize, seats: usize, body: Body) -> Self {
        let stretches = (0..stretches)
            .map(|k| Stretch {
                next: AtomicUsize::new(k * tasks / stretches),
                end: (k + 1) * tasks / stretches,
            })
            .collect();
        Job {
            stretches,
            done: AtomicUsize::new(0),
            seats: AtomicUsize::new(seats.saturating_sub(1)),
            failed: AtomicBool::new(false),
            panic: Mutex::new(None),
            body,
        }
    }

    /// Claims and runs tasks from seat `seat`'s stretch on until none is left; whether it
    /// ran any.
    fn work(&self, seat: usize) -> bool {
        let mut ran = false;
        while let Some(i) = self.claim(seat) {
            ran = true;
            self.run(i);
        }
        ran
    }

    /// The next task nobody has claimed, in seat `seat`'s stretch or the first after it
    /// with one left, now this thread's.
    fn claim(&self, seat: usize) -> Option<usize> {
        let n = self.stretches.len();
        (0..n).map(|k| &self.stretches[(seat + k) % n]).find_map(|s| {
            if s.next.load(Ordering::Relaxed) >= s.end {
                return None;
            }
            let i = s.next.fetch_add(1, Ordering::Relaxed);
            (i < s.end).then_some(i)
        })
    }

    /// Runs task `i`, claimed by this thread (below the task count), and counts it done.
    fn run(&self, i: usize) {
        if !self.failed.load(Ordering::Relaxed) {
            // SAFETY: `i` was claimed below the task count, so the driver is still waiting
            // for this call to be counted done and keeps the body alive (module docs).
            let body = unsafe { &*self.body.0 };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| body(i))) {
                self.failed.store(true, Ordering::Relaxed);
                self.panic.lock().get_or_insert(p);
            }
        }
        // Release: the task's writes are visible to the driver once it sees the count.
        self.done.fetch_add(1, Ordering::Release);
    }

    /// Takes a free seat, if there is one: its number (the driver's is 0).
    fn sit(&self) -> Option<usize> {
        let before =
            self.seats.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| s.checked_sub(1)).ok()?;
        Some(self.stretches.len() - before)
    }

    fn unclaimed(&self) -> bool {
        self.stretches.iter().any(|s| s.next.load(Ordering::Relaxed) < s.end)
    }
}

thread_local! {
    /// The team of the kernel this thread drives now, if any ([`ForkJoinTeam::driving`]).
    static DRIVING: Cell<Option<*const ForkJoinTeam>> = const { Cell::new(None) };
}

/// Puts the thread's driven team back as it was when dropped (also on unwinding).
struct Restore(Option<*const ForkJoinTeam>);

impl Drop for Restore {
    fn drop(&mut self) {
        DRIVING.with(|d| d.set(self.0));
    }
}

impl ForkJoinTeam {
    /// A team running a job on `size` threads at most (at least one: the driver), its
    /// helpers named `{name}-t{i}` and running `start` first; no thread is started yet.
    /// With `cores`, the team shares them with the other teams made with the same: a job
    /// takes only its share of the seats while others are busy ([`SharedCores`]).
    pub(crate) fn new(name: String, size: usize, start: fn(), cores: Option<Arc<SharedCores>>) -> Self {
        let shared = Shared {
            job: Mutex::new(None),
            call: Condvar::new(),
            calls: AtomicUsize::new(0),
            open: AtomicBool::new(false),
            closing: AtomicBool::new(false),
        };
        Self {
            shared: Arc::new(shared),
            size: size.max(1),
            cores: cores.and_then(|c| c.join().map(|me| (c, me))),
            name,
            start,
            helpers: Mutex::new(Vec::new()),
            helpers_failed: AtomicBool::new(false),
        }
    }

    /// The most threads that run one job.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Runs `f` with this team as the calling thread's current one ([`with_current`]): what `f` forks
    /// through [`ForkJoinTeam::fork`] runs on this team.
    pub(crate) fn driving<R>(&self, f: impl FnOnce() -> R) -> R {
        let _restore = Restore(DRIVING.with(|d| d.replace(Some(self as *const _))));
        f()
    }

    /// Runs `body(i)` for every `i` in `0..tasks` (`items` work items in all), on this
    /// thread and the threads that join it, and returns when all have ended; the first
    /// panic of a task resumes here then.
    pub(crate) fn fork(&self, tasks: usize, items: usize, body: &(dyn Fn(usize) + Sync)) {
        if tasks <= 1 || self.size == 1 || items < SHARED_ITEMS {
            (0..tasks).for_each(body);
            return;
        }
        match &self.cores {
            Some((cores, me)) => {
                let _end = EndOnDrop(cores, *me);
                self.fork_on(cores.start(*me, self.size), tasks, body)
            }
            None => self.fork_on(self.size, tasks, body),
        }
    }

    /// [`ForkJoinTeam::fork`] on `seats` threads at most (the driver's included), besides
    /// guests ([`ForkJoinTeam::guest`]) where the team shares its cores.
    fn fork_on(&self, seats: usize, tasks: usize, body: &(dyn Fn(usize) + Sync)) {
        if seats <= 1 && self.cores.is_none() {
            (0..tasks).for_each(body);
            return;
        }
        // SAFETY: only the lifetime is erased; see the module documentation for why no call
        // through the pointer outlives `body`.
        let erased: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(body) };
        // A driver alone keeps a second stretch for a guest, which it works itself after
        // its own when no guest came: consecutive tasks either way.
        let job = Arc::new(Job::new(tasks, seats.max(2), seats, Body(erased)));
        *self.shared.job.lock() = Some(Arc::clone(&job));
        self.shared.open.store(true, Ordering::Release);
        if seats > 1 {
            // A thread spinning while it waits for the device polls for the job every few
            // hundred nanoseconds: once one has joined, or after a moment, the seats left go
            // to helpers.
            let start = Instant::now();
            while job.seats.load(Ordering::Relaxed) == seats - 1 && start.elapsed() < WAITER_GRACE {
                std::hint::spin_loop();
            }
            let free = job.seats.load(Ordering::Relaxed);
            if free > 0 && job.unclaimed() {
                self.call_helpers(free);
            }
        }
        job.work(0);
        // Every task claimed is being run: wait for the ones other threads hold.
        let mut spins = 0u32;
        while job.done.load(Ordering::Acquire) < tasks {
            if spins < 64 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
        // Late joiners find no job (or one with no task left, which they leave at once).
        self.shared.open.store(false, Ordering::Relaxed);
        *self.shared.job.lock() = None;
        let panic = job.panic.lock().take();
        if let Some(p) = panic {
            resume_unwind(p);
        }
    }

    /// The threads a kernel that does not fork through this team (a hand-written kernel's
    /// `rayon` loops) may use now: the team's share of its cores, as a fork would take
    /// ([`SharedCores`]), the team marked busy until the [`CoreShare`] drops; the team's
    /// size when it shares no cores.
    pub(crate) fn share(&self) -> CoreShare<'_> {
        match &self.cores {
            Some((cores, me)) => {
                CoreShare { threads: cores.start(*me, self.size), _end: Some(EndOnDrop(cores, *me)) }
            }
            None => CoreShare { threads: self.size, _end: None },
        }
    }

    /// Whether a job is being forked now (it may have no task left to share).
    pub(crate) fn has_work(&self) -> bool {
        self.shared.open.load(Ordering::Relaxed)
    }

    /// Joins the job being forked now, if it has tasks left and a free seat, and works it;
    /// whether this thread ran a task. For a thread that waits for the driver to finish.
    pub(crate) fn help(&self) -> bool {
        self.shared.join()
    }

    /// Works one task of the job being forked now without a seat, from its last stretch
    /// on, if the job takes guests (it was forked on cores shared with other teams);
    /// whether this thread ran a task. For the driver of another team sharing these cores
    /// ([`SharedCores`]) that has ended its own job and waits for this team's: the cores'
    /// share its own job had is idle until then, so the two jobs end together. One task a
    /// call, so that the guest sees soon when what it waits for has come.
    pub(crate) fn guest(&self) -> bool {
        if self.cores.is_none() {
            return false;
        }
        let Some(job) = self.shared.current() else { return false };
        match job.claim(job.stretches.len() - 1) {
            Some(i) => {
                job.run(i);
                true
            }
            None => false,
        }
    }

    /// Wakes `seats` helpers (as many as the job has free seats: a helper woken for no
    /// seat would only poll for [`HOT`], taking CPU time from the job), starting them
    /// first if this is the first call (then every helper starts awake and polls once).
    fn call_helpers(&self, seats: usize) {
        if self.helpers_failed.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut helpers = self.helpers.lock();
            if helpers.is_empty() {
                for i in 1..self.size {
                    let shared = Arc::clone(&self.shared);
                    let start = self.start;
                    let spawned =
                        std::thread::Builder::new().name(format!("{}-t{i}", self.name)).spawn(move || {
                            start();
                            helper(&shared)
                        });
                    match spawned {
                        Ok(h) => helpers.push(h),
                        Err(_) => break,
                    }
                }
                if helpers.is_empty() {
                    self.helpers_failed.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }
        let _held = self.shared.job.lock();
        self.shared.calls.fetch_add(1, Ordering::Relaxed);
        for _ in 0..seats {
            self.shared.call.notify_one();
        }
    }
}

/// A team's share of its cores for a kernel that runs outside the team
/// ([`ForkJoinTeam::share`]): the team counts as busy for the others until this drops.
pub(crate) struct CoreShare<'a> {
    /// Threads the kernel may use, its driver's included (at least one).
    pub(crate) threads: usize,
    _end: Option<EndOnDrop<'a>>,
}

/// Marks a team's job ended in its [`SharedCores`] when dropped (also on unwinding).
struct EndOnDrop<'a>(&'a SharedCores, usize);

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        self.0.end(self.1);
    }
}

/// The team whose kernel the calling thread drives now ([`ForkJoinTeam::driving`]), given
/// to `f`; `None` outside a kernel, and inside `f` (a fork nested in a task runs alone).
pub(crate) fn with_current<R>(f: impl FnOnce(Option<&ForkJoinTeam>) -> R) -> R {
    let restore = Restore(DRIVING.with(Cell::take));
    match restore.0 {
        // SAFETY: set only by `driving`, whose borrow of the team outlasts every call made
        // inside it on this thread.
        Some(t) => f(Some(unsafe { &*t })),
        None => f(None),
    }
}

/// A helper's life: sleep until called, work the job there is, then stay awake for
/// [`HOT`] taking a seat in any job forked meanwhile (launches back to back, none waited
/// for, find it awake), again until the team closes.
fn helper(shared: &Shared) {
    let mut seen = 0;
    loop {
        {
            let mut slot = shared.job.lock();
            while shared.calls.load(Ordering::Relaxed) == seen && !shared.closing.load(Ordering::Relaxed) {
                shared.call.wait(&mut slot);
            }
            seen = shared.calls.load(Ordering::Relaxed);
        }
        let mut since = Instant::now();
        let mut polls = 0u32;
        while since.elapsed() < HOT {
            if shared.closing.load(Ordering::Relaxed) {
                return;
            }
            if shared.open.load(Ordering::Acquire) && shared.join() {
                since = Instant::now();
            } else if polls < 64 {
                std::hint::spin_loop();
                polls += 1;
            } else {
                std::thread::yield_now();
            }
        }
        if shared.closing.load(Ordering::Relaxed) {
            return;
        }
    }
}

impl Drop for ForkJoinTeam {
    fn drop(&mut self) {
        {
            let _held = self.shared.job.lock();
            self.shared.closing.store(true, Ordering::Relaxed);
            self.shared.call.notify_all();
        }
        for h in self.helpers.get_mut().drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team(size: usize) -> ForkJoinTeam {
        ForkJoinTeam::new("fj-test".into(), size, || {}, None)
    }

    /// Tells a helping thread to stop when dropped, also when the test's thread unwinds
    /// (a failed assertion must not leave the scope waiting for it).
    struct Stop<'a>(&'a AtomicBool);

    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// Runs `f` while another thread helps `t`'s jobs, as a thread waiting for the device
    /// does, until `f` returns (or unwinds).
    fn while_another_thread_helps(t: &ForkJoinTeam, f: impl FnOnce()) {
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    t.help();
                    std::thread::yield_now();
                }
            });
            let _stop = Stop(&stop);
            f();
        });
    }

    /// Every task runs once, whatever the team's size, and what the tasks wrote is seen
    /// by the driver when `fork` returns.
    #[test]
    fn every_task_runs_once_and_its_writes_are_seen() {
        for size in [1, 2, 3] {
            let t = team(size);
            for tasks in [0usize, 1, 2, 7, 64] {
                let runs: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                t.fork(tasks, SHARED_ITEMS, &|i| {
                    runs[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1), "size {size}, {tasks} tasks");
            }
        }
    }

    /// A thread waiting for the driver takes a seat and works the tasks: a task of the
    /// driver's held until the waiting thread has run one finishes only because it did.
    /// (Helpers are kept out, as when they could not be started: they would take the seat.)
    #[test]
    fn a_waiting_thread_works_the_tasks() {
        let t = team(2);
        t.helpers_failed.store(true, Ordering::Relaxed);
        let (waiter_ran, held) = (AtomicUsize::new(0), AtomicBool::new(false));
        let driver = std::thread::current().id();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    t.help();
                    std::hint::spin_loop();
                }
            });
            let waiter_id = waiter.thread().id();
            let _stop = Stop(&stop);
            t.driving(|| {
                with_current(|current| {
                    current.expect("the driven team is current").fork(8, SHARED_ITEMS, &|_| {
                        let me = std::thread::current().id();
                        if me == waiter_id {
                            waiter_ran.fetch_add(1, Ordering::Relaxed);
                        } else if me == driver && !held.swap(true, Ordering::Relaxed) {
                            while waiter_ran.load(Ordering::Relaxed) == 0 {
                                std::thread::yield_now();
                            }
                        }
                    })
                })
            });
        });
        assert!(waiter_ran.load(Ordering::Relaxed) >= 1);
    }

    /// With nobody waiting, the driver calls its helpers: a task it holds until another
    /// thread (a helper: nobody else joins here) has run one finishes only because one came.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "its driver's wait for a helper does not end under Miri's scheduler (natively it does, on one CPU \
                  too); the panic test starts, calls and closes helpers under Miri"
    )]
    fn helpers_are_called_when_nobody_waits() {
        let t = team(3);
        let others = AtomicUsize::new(0);
        let driver = std::thread::current().id();
        t.fork(16, SHARED_ITEMS, &|_| {
            if std::thread::current().id() != driver {
                others.fetch_add(1, Ordering::Relaxed);
            } else {
                while others.load(Ordering::Relaxed) == 0 {
                    std::thread::yield_now();
                }
            }
        });
        assert!(others.load(Ordering::Relaxed) >= 1);
        assert_eq!(t.helpers.lock().len(), 2);
    }

    /// A launch of few work items is not shared: the driver runs every task, and no
    /// helper thread is started.
    #[test]
    fn a_small_launch_runs_on_the_driver_alone() {
        let t = team(4);
        let driver = std::thread::current().id();
        let elsewhere = AtomicUsize::new(0);
        t.fork(3, SHARED_ITEMS - 1, &|_| {
            if std::thread::current().id() != driver {
                elsewhere.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert_eq!(elsewhere.load(Ordering::Relaxed), 0);
        assert!(t.helpers.lock().is_empty());
    }

    /// A panicking task fails the fork: the panic resumes in the driver once every task
    /// has ended (in a launch shared or not), and the team forks again afterwards. (Tasks
    /// not started once the failure is known are skipped, which no test can time.)
    #[test]
    fn a_panic_resumes_in_the_driver_and_the_team_goes_on() {
        let t = team(2);
        let caught = catch_unwind(AssertUnwindSafe(|| {
            t.fork(1000, SHARED_ITEMS, &|i| {
                if i == 0 {
                    panic!("task {i} fails");
                }
            })
        }));
        let payload = caught.expect_err("the fork fails");
        assert_eq!(payload.downcast_ref::<String>().map(String::as_str), Some("task 0 fails"));
        // And in a launch too small to share.
        let caught = catch_unwind(AssertUnwindSafe(|| {
            t.fork(10, SHARED_ITEMS - 1, &|i| {
                if i == 5 {
                    panic!("task {i} fails");
                }
            })
        }));
        let payload = caught.expect_err("the fork fails");
        assert_eq!(payload.downcast_ref::<String>().map(String::as_str), Some("task 5 fails"));
        let again = AtomicUsize::new(0);
        t.fork(5, SHARED_ITEMS, &|_| {
            again.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(again.load(Ordering::Relaxed), 5);
    }

    /// A waiting thread may claim every task before the driver claims its first: each task
    /// still runs once and no index past the last is run (many short forks, a thread
    /// helping all the while).
    #[test]
    fn tasks_run_once_however_the_waiting_thread_races_the_driver() {
        let t = team(2);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    t.help();
                }
            });
            let _stop = Stop(&stop);
            for _ in 0..if cfg!(miri) { 20 } else { 20_000 } {
                let runs = [AtomicUsize::new(0), AtomicUsize::new(0)];
                t.fork(2, SHARED_ITEMS, &|i| {
                    runs[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
            }
        });
    }

    /// No more than the team's size run one job at once, helpers and waiting threads
    /// together; a fork nested in a task finds no current team.
    #[test]
    fn no_more_threads_than_the_size_and_nested_forks_run_alone() {
        let t = team(2);
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        while_another_thread_helps(&t, || {
            t.driving(|| {
                for _ in 0..if cfg!(miri) { 2 } else { 50 } {
                    with_current(|team| {
                        team.expect("driven").fork(16, SHARED_ITEMS, &|_| {
                            let in_now = now.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(in_now, Ordering::SeqCst);
                            assert!(with_current(|nested| nested.is_none()));
                            std::thread::yield_now();
                            now.fetch_sub(1, Ordering::SeqCst);
                        })
                    });
                }
            });
        });
        assert!(most.load(Ordering::SeqCst) <= 2, "{} at once", most.load(Ordering::SeqCst));
        assert!(with_current(|team| team.is_none()), "no team outside `driving`");
    }

    /// A member of shared cores alone takes every seat; with another busy (forking, or
    /// ended within `LATELY`) it takes its share, at least its own seat; once the other
    /// has been idle longer than `LATELY` it takes every seat again.
    #[test]
    fn shared_cores_split_between_busy_members_only() {
        // Spans no test machine outlasts between two statements, so that "a moment ago"
        // holds however slowly the test runs.
        let hour = Duration::from_secs(3600);
        let cores = SharedCores::with_spans(4, hour, hour);
        let (a, b, c) = (cores.join(), cores.join(), cores.join());
        let (a, b, c) = (a.expect("a member"), b.expect("a member"), c.expect("a member"));
        assert_eq!(cores.start(a, 4), 4, "alone (the others never forked)");
        assert_eq!(cores.start(b, 4), 2, "a is forking");
        assert_eq!(cores.start(c, 4), 1, "a and b are forking");
        assert_eq!(cores.start(c, 2), 1, "never under one seat");
        cores.end(a);
        cores.end(b);
        assert_eq!(cores.start(c, 4), 1, "a and b ended a moment ago, and overlapped lately");
        cores.end(c);
        // With the real spans, members idle for longer than LATELY no longer count.
        let cores = SharedCores::new(4);
        let (a, b) = (cores.join().expect("a member"), cores.join().expect("a member"));
        cores.start(a, 4);
        assert_eq!(cores.start(b, 4), 2);
        cores.end(a);
        cores.end(b);
        std::thread::sleep(LATELY * 2);
        assert_eq!(cores.start(a, 4), 4, "b idle for longer than LATELY");
        cores.end(a);
    }

    /// Teams made smaller than the machine (`kernel_threads`) keep their size while their
    /// share of the machine's cores allows it: four teams of 4 on 16 cores, all busy, take 4
    /// seats each; on 8 cores, 2.
    #[test]
    fn shared_cores_split_the_machine_not_the_team() {
        let hour = Duration::from_secs(3600);
        for (machine, each) in [(16, 4), (8, 2)] {
            let cores = SharedCores::with_spans(machine, hour, hour);
            let members: Vec<usize> = (0..4).map(|_| cores.join().expect("a member")).collect();
            for &m in &members[..3] {
                cores.start(m, 4);
            }
            assert_eq!(cores.start(members[3], 4), each, "{machine} cores");
        }
    }

    /// Two teams sharing two cores fork at once, over and over, from two threads (two
    /// devices in lockstep): every task of every fork runs once, whatever seats each took.
    #[test]
    fn teams_sharing_cores_fork_at_once() {
        let cores = SharedCores::new(2);
        let teams = [0, 1].map(|_| ForkJoinTeam::new("fj-pair".into(), 2, || {}, Some(Arc::clone(&cores))));
        std::thread::scope(|s| {
            for t in &teams {
                s.spawn(move || {
                    for _ in 0..if cfg!(miri) { 3 } else { 300 } {
                        let runs: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
                        t.fork(8, SHARED_ITEMS, &|i| {
                            runs[i].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
                    }
                });
            }
        });
    }

    /// Members that never fork at once (a program using its devices one after the other)
    /// keep every seat, however closely their jobs follow each other.
    #[test]
    fn shared_cores_used_one_after_the_other_are_not_split() {
        let cores = SharedCores::new(4);
        let (a, b) = (cores.join().expect("a member"), cores.join().expect("a member"));
        for _ in 0..10 {
            assert_eq!(cores.start(a, 4), 4);
            cores.end(a);
            assert_eq!(cores.start(b, 4), 4);
            cores.end(b);
        }
    }

    /// Members join up to `MEMBERS`; a team made past that forks with every seat.
    #[test]
    fn shared_cores_take_a_bounded_number_of_members() {
        let cores = SharedCores::new(3);
        let first = cores.join();
        assert_eq!(first, Some(0));
        for _ in 1..MEMBERS {
            assert!(cores.join().is_some());
        }
        assert_eq!(cores.join(), None);
        assert_eq!(cores.start(0, 3), 3, "no other member has forked");
        cores.end(0);
        let late = ForkJoinTeam::new("fj-late".into(), 2, || {}, Some(Arc::clone(&cores)));
        assert!(late.cores.is_none());
    }

    /// A team whose shared cores are taken by another busy team forks on its driver
    /// alone: no waiting thread or helper takes a seat, and no helper is started; its
    /// tasks all run, and its job's end is noted for the others.
    #[test]
    fn a_team_sharing_busy_cores_runs_its_share() {
        let cores = SharedCores::new(2);
        let busy = cores.join().expect("a member");
        let t = ForkJoinTeam::new("fj-shared".into(), 2, || {}, Some(Arc::clone(&cores)));
        let me = t.cores.as_ref().map(|(_, me)| *me).expect("a member");
        cores.start(busy, 2);
        let driver = std::thread::current().id();
        let (ran, elsewhere) = (AtomicUsize::new(0), AtomicUsize::new(0));
        while_another_thread_helps(&t, || {
            t.fork(64, SHARED_ITEMS, &|_| {
                ran.fetch_add(1, Ordering::Relaxed);
                if std::thread::current().id() != driver {
                    elsewhere.fetch_add(1, Ordering::Relaxed);
                }
            });
        });
        assert_eq!(ran.load(Ordering::Relaxed), 64);
        assert_eq!(elsewhere.load(Ordering::Relaxed), 0);
        assert!(t.helpers.lock().is_empty());
        assert_ne!(cores.stamps[me].load(Ordering::Relaxed), BUSY, "the job's end is noted");
        assert_ne!(cores.stamps[me].load(Ordering::Relaxed), 0);
        // The other ends, and after LATELY the team forks on two seats again.
        cores.end(busy);
        std::thread::sleep(LATELY * 2);
        assert_eq!(cores.start(me, 2), 2);
        cores.end(me);
    }

    /// A team forking on its one seat of shared cores takes a guest (another team's driver
    /// waiting for it): the guest works from the job's last stretch while the driver
    /// works its first, and every task runs once. The driver's first task waits until the
    /// guest has run a task of the last stretch, so the case fails (instead of hanging)
    /// only if no guest can join.
    #[test]
    fn a_team_on_one_seat_takes_a_guest_from_its_last_stretch() {
        let cores = SharedCores::new(1);
        let t = ForkJoinTeam::new("fj-guest".into(), 2, || {}, Some(Arc::clone(&cores)));
        let runs: Vec<AtomicUsize> = (0..16).map(|_| AtomicUsize::new(0)).collect();
        let (guest_ran, stop) = (AtomicBool::new(false), AtomicBool::new(false));
        let first_guest_task = AtomicUsize::new(usize::MAX);
        let driver = std::thread::current().id();
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if !t.guest() {
                        std::thread::yield_now();
                    }
                }
            });
            let _stop = Stop(&stop);
            t.fork(16, SHARED_ITEMS, &|i| {
                runs[i].fetch_add(1, Ordering::Relaxed);
                if std::thread::current().id() != driver {
                    let _ = first_guest_task.compare_exchange(
                        usize::MAX,
                        i,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    guest_ran.store(true, Ordering::Release);
                } else if i == 0 {
                    let start = Instant::now();
                    while !guest_ran.load(Ordering::Acquire) {
                        assert!(start.elapsed() < Duration::from_secs(60), "no guest joined");
                        std::thread::yield_now();
                    }
                }
            });
        });
        assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
        let first = first_guest_task.load(Ordering::Relaxed);
        assert!((8..16).contains(&first), "the guest's first task was {first}, not one of the last stretch");
        assert!(t.helpers.lock().is_empty(), "a guest is no helper: none was started");
        // Without a job, or with none of its tasks left, a guest finds nothing.
        assert!(!t.guest());
        // A team that shares no cores takes no guest: its jobs have their seats.
        let alone = team(2);
        let refused = AtomicBool::new(false);
        alone.fork(4, SHARED_ITEMS, &|i| {
            if i == 0 && !alone.guest() {
                refused.store(true, Ordering::Relaxed);
            }
        });
        assert!(refused.load(Ordering::Relaxed), "a guest worked a job of a team sharing no cores");
    }
}
