//! Each construct's entry steps, and its exit steps, are atomic (OpenMP 5.2, 5.8.3): many
//! host threads mapping one shared variable `tofrom`, adding 1 to it on the device and
//! unmapping it never lose an update, whichever path the exit takes (a region's end, `exit
//! data`, `update from` then `exit data`, a region run on a `nowait` lane), queued and with
//! every construct waiting, on every backend. The shape of C's `#pragma omp parallel for`
//! around `#pragma omp target map(tofrom: counter)` with an atomic update inside.
//!
//! Before the present table kept ranges in transit, a region's end removed the entry and
//! copied the value back after releasing the table's lock; another thread's region then
//! mapped the variable anew from the stale host value and its copy back overwrote the first
//! (a 4-thread run of 32 768 regions ended at 20 000-30 000).

use std::sync::Barrier;

use offload::{HostRange, LaunchArg, MapItem, Result, Runtime, RuntimeBuilder, Scalar, UpdateDirection};
use offload_kernels::ADD_I32;
use offload_tests::{check, on_every_backend, run_threads};

const THREADS: usize = 4;

/// Regions per thread: 4 x 2048 = 8192 updates of one variable per case and mode
/// (`OFFLOAD_ATOMIC_ITERATIONS` sets fewer or more, for ThreadSanitizer's slow runs).
fn iterations() -> usize {
    std::env::var("OFFLOAD_ATOMIC_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(2048)
}

/// How one thread adds 1 to the shared counter on device `dev`.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// `target map(tofrom: counter)`: the region's end copies back.
    Region,
    /// `target enter data map(to:)`, a region with no map, `target exit data map(from:)`.
    EnterExit,
    /// As `EnterExit` with `target update from` before the exit (which then releases).
    UpdateThenRelease,
    /// `Region`, run as a task on the device's compute lane (`nowait`). Every thread's
    /// tasks share that one lane, so this path races only with the others: [`Path::Mixed`].
    NowaitRegion,
    /// Thread `t` takes path `t % 3` of `Region`, `EnterExit` and `NowaitRegion`. Not
    /// `UpdateThenRelease`: beside threads whose exit copies back only when it is the
    /// last, a release that is the last loses their updates, in C as here.
    Mixed,
}

/// The counter's address, shared by the threads (C's global variable).
#[derive(Clone, Copy)]
struct Counter(usize);

impl Counter {
    fn ptr(self) -> *mut i32 {
        self.0 as *mut i32
    }
}

/// Adds 1 to `*c` on device `dev` by `path`.
///
/// # Safety
/// `c` points to an `i32` that only the runtime's copies touch while the threads run.
unsafe fn add_one(rt: &Runtime, dev: usize, c: Counter, path: Path, thread: usize) -> Result<()> {
    let args = [LaunchArg::Value(Scalar::I32(1)), LaunchArg::mapped(c.ptr().cast_const())];
    // SAFETY: forwarded from the caller (also into the nowait task, which the scope waits
    // for); the counter is 4 bytes.
    unsafe {
        match path {
            Path::Region => rt.target_launch(dev, &ADD_I32, 1, &[MapItem::tofrom(c.ptr(), 4)], &args),
            Path::EnterExit => {
                rt.enter_data(dev, &[MapItem::to(c.ptr().cast_const(), 4)])?;
                rt.target_launch(dev, &ADD_I32, 1, &[], &args)?;
                rt.exit_data(dev, &[MapItem::from(c.ptr(), 4)])
            }
            Path::UpdateThenRelease => {
                rt.enter_data(dev, &[MapItem::to(c.ptr().cast_const(), 4)])?;
                rt.target_launch(dev, &ADD_I32, 1, &[], &args)?;
                rt.update(dev, UpdateDirection::From, &[(HostRange::new(c.0, 4), false)])?;
                rt.exit_data(dev, &[MapItem::release(c.ptr().cast_const(), 4)])
            }
            Path::NowaitRegion => rt.nowait(|s| {
                let task = s.compute(dev, &[], move |_| add_one(rt, dev, c, Path::Region, thread))?;
                task.wait()
            })?,
            Path::Mixed => {
                let path = [Path::Region, Path::EnterExit, Path::NowaitRegion][thread % 3];
                add_one(rt, dev, c, path, thread)
            }
        }
    }
}

/// Runs `THREADS` threads of [`iterations`] additions each by `path` on device 0 and checks
/// the counter, queued and with every construct waiting.
fn no_update_lost(what: &str, path: Path) {
    for synchronous in [false, true] {
        let mode = if synchronous { "synchronous" } else { "queued" };
        let configure = move |b: RuntimeBuilder| b.synchronous(synchronous);
        on_every_backend(&format!("{what} ({mode})"), 1, configure, |rt| {
            let mut counter = 0i32;
            let c = Counter(std::ptr::addr_of_mut!(counter) as usize);
            let start = Barrier::new(THREADS);
            run_threads(THREADS, |t| {
                start.wait();
                // SAFETY: only the runtime touches `counter` until the threads end.
                (0..iterations()).try_for_each(|_| unsafe { add_one(rt, 0, c, path, t) })
            })?;
            check!(
                counter == (THREADS * iterations()) as i32,
                "{path:?}: {counter} of {} updates",
                THREADS * iterations()
            );
            check!(rt.live_mappings().is_empty(), "{:?}", rt.live_mappings());
            Ok(())
        });
    }
}

#[test]
fn concurrent_regions_never_lose_an_update() {
    no_update_lost("regions on one variable", Path::Region);
}

#[test]
fn concurrent_enter_and_exit_data_never_lose_an_update() {
    no_update_lost("enter/exit data on one variable", Path::EnterExit);
}

#[test]
fn an_update_from_lands_before_another_thread_maps_anew() {
    no_update_lost("update from, then release", Path::UpdateThenRelease);
}

#[test]
fn regions_exits_and_nowait_tasks_at_once_never_lose_an_update() {
    no_update_lost("every path at once", Path::Mixed);
}
