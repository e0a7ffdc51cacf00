//! A count of outstanding work that can be waited down to zero, as rayon's scope counts
//! its jobs.
//!
//! [`crate::nowait`] lends host data to tasks for a scope's lifetime, and a task may queue
//! more tasks while it runs; so the scope may end only when no task is queued or running,
//! however deep the nesting. Each task takes a [`Pending`] from the scope's
//! [`CountLatch`] *before* it is submitted (by whoever submits it: the scope's closure or a
//! running task, itself still counted) and drops it once it has finished, also when it
//! panicked, failed to submit or was dropped without running. The count therefore reaches
//! zero only when every task, queued by anyone, has finished, and [`CountLatch::wait`]
//! returns only then.
//!
//! The latch is shared through an `Arc`: the last decrement may wake the waiter, which
//! may then free the scope at once, while the decrementing thread is still inside the
//! latch's code; the `Arc` keeps the latch alive for it.
//!
//! Why not `crossbeam_utils::sync::WaitGroup`: its `wait` consumes the waiter's own handle
//! and returns when every clone has dropped, and new work is counted only by cloning a live
//! handle. The scope must count up from its own handle while it waits (a running task
//! queues another through the scope, not through a handle of its own), and keep that handle
//! past the wait; a wait group would need each task to carry a handle to its children and
//! the scope to give its own up before waiting. The two are the same lock and condition
//! variable otherwise, so there is no speed to gain either.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// The count of outstanding work; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct CountLatch {
    count: Mutex<usize>,
    zero: Condvar,
}

/// One unit of outstanding work of a [`CountLatch`]; dropping it counts it down.
#[derive(Debug)]
#[must_use = "the work counts as outstanding only while its `Pending` lives"]
pub(crate) struct Pending(Arc<CountLatch>);

impl CountLatch {
    /// A latch at zero.
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The count, locked. No code holding the lock can panic, so a poisoned lock still
    /// holds a correct count.
    fn lock(&self) -> MutexGuard<'_, usize> {
        self.count.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one more unit of work, outstanding until the returned [`Pending`] drops.
    pub(crate) fn pending(self: &Arc<Self>) -> Pending {
        *self.lock() += 1;
        Pending(Arc::clone(self))
    }

    /// Work outstanding now.
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        *self.lock()
    }

    /// Blocks until no work is outstanding.
    pub(crate) fn wait(&self) {
        let mut count = self.lock();
        while *count > 0 {
            count = self.zero.wait(count).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut count = self.0.lock();
        // Every `Pending` was counted once when made, so the count is at least one.
        *count -= 1;
        if *count == 0 {
            self.0.zero.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Threads per test: small under Miri, which runs every thread on one core, slowly.
    const THREADS: usize = if cfg!(miri) { 3 } else { 8 };

    #[test]
    fn waiting_at_zero_returns_at_once() {
        let latch = CountLatch::new();
        latch.wait();
        drop(latch.pending());
        latch.wait();
        assert_eq!(latch.count(), 0);
    }

    #[test]
    fn wait_returns_only_after_every_pending_is_dropped() {
        let latch = CountLatch::new();
        let done = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..THREADS)
            .map(|i| {
                let (pending, done) = (latch.pending(), Arc::clone(&done));
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(i as u64));
                    done.fetch_add(1, Ordering::Relaxed);
                    drop(pending);
                })
            })
            .collect();
        latch.wait();
        // Each thread counted itself as done before it dropped its `Pending`.
        assert_eq!(done.load(Ordering::Relaxed), THREADS);
        threads.into_iter().for_each(|t| t.join().unwrap());
    }

    /// Work that queues more work while it is outstanding, three levels deep (as nowait
    /// tasks that queue tasks): the count never touches zero before the deepest is done.
    #[test]
    fn work_queued_by_outstanding_work_is_waited_for() {
        fn level(
            latch: &Arc<CountLatch>,
            depth: usize,
            done: &Arc<AtomicUsize>,
        ) -> std::thread::JoinHandle<()> {
            let (pending, latch, done) = (latch.pending(), Arc::clone(latch), Arc::clone(done));
            std::thread::spawn(move || {
                let children: Vec<_> = if depth > 0 {
                    (0..2).map(|_| level(&latch, depth - 1, &done)).collect()
                } else {
                    std::thread::sleep(Duration::from_millis(5));
                    Vec::new()
                };
                done.fetch_add(1, Ordering::Relaxed);
                drop(pending);
                children.into_iter().for_each(|c| c.join().unwrap());
            })
        }
        let (latch, done) = (CountLatch::new(), Arc::new(AtomicUsize::new(0)));
        let root = level(&latch, 2, &done);
        latch.wait();
        assert_eq!(done.load(Ordering::Relaxed), 1 + 2 + 4);
        root.join().unwrap();
    }

    #[test]
    fn work_that_panics_still_counts_down() {
        let latch = CountLatch::new();
        let pending = latch.pending();
        let t = std::thread::spawn(move || {
            let _pending = pending;
            panic!("deliberate");
        });
        latch.wait();
        assert!(t.join().is_err());
        assert_eq!(latch.count(), 0);
    }

    #[test]
    fn many_threads_count_up_and_down_at_once() {
        let latch = CountLatch::new();
        let rounds = if cfg!(miri) { 5 } else { 1000 };
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                let outer = latch.pending();
                let latch = &latch;
                s.spawn(move || {
                    for _ in 0..rounds {
                        drop(latch.pending());
                    }
                    drop(outer);
                });
            }
            latch.wait();
            assert_eq!(latch.count(), 0);
        });
    }
}
