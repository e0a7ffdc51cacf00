//! A barrier whose waiters spin instead of sleeping, for one host thread per device
//! stepping in lockstep: a step of a few hundred microseconds cannot afford the tens of
//! microseconds a futex wake-up costs.
//!
//! A thread that fails must not leave the others spinning forever: [`SpinBarrier::abort`]
//! breaks the barrier, and every wait, now or later, returns [`BarrierBroken`].
//! [`run_in_lockstep`] runs the parts of a solver that way: a part that fails (an error or
//! a panic) breaks the barrier, the others stop at their next wait, and the run returns
//! the failure.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crossbeam_utils::Backoff;
use offload::error::panic_message;
use offload::Error;

/// A wait on a barrier that was broken ([`SpinBarrier::abort`]): a thread stepping with
/// this one failed, so this one must stop too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarrierBroken;

/// A sense-reversing spin barrier for `n` threads, which can be broken.
#[derive(Debug)]
pub struct SpinBarrier {
    n: usize,
    waiting: AtomicUsize,
    sense: AtomicBool,
    broken: AtomicBool,
}

impl SpinBarrier {
    /// A barrier for `n > 0` threads.
    pub fn new(n: usize) -> Self {
        Self {
            n: n.max(1),
            waiting: AtomicUsize::new(0),
            sense: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        }
    }

    /// Waits until all `n` threads have called `wait`; `Ok(true)` in exactly one of them
    /// (the last to arrive). [`BarrierBroken`] as soon as the barrier is broken.
    pub fn wait(&self) -> Result<bool, BarrierBroken> {
        if self.broken.load(Ordering::Acquire) {
            return Err(BarrierBroken);
        }
        let sense = !self.sense.load(Ordering::Acquire);
        if self.waiting.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.waiting.store(0, Ordering::Relaxed);
            self.sense.store(sense, Ordering::Release);
            return Ok(true);
        }
        let backoff = Backoff::new();
        while self.sense.load(Ordering::Acquire) != sense {
            if self.broken.load(Ordering::Acquire) {
                return Err(BarrierBroken);
            }
            backoff.snooze();
        }
        Ok(false)
    }

    /// Breaks the barrier for good: every thread waiting now or later gets
    /// [`BarrierBroken`].
    pub fn abort(&self) {
        self.broken.store(true, Ordering::Release);
    }
}

/// Why a part of a [`run_in_lockstep`] run stopped before its end.
#[derive(Debug)]
pub enum Stop {
    /// The part failed.
    Failed(Error),
    /// Another part failed: the barrier was broken.
    Broken,
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Self::Failed(e)
    }
}

impl From<BarrierBroken> for Stop {
    fn from(_: BarrierBroken) -> Self {
        Self::Broken
    }
}

/// Runs `part(p, state, barrier)` for each of `states` (part `p` drives `devices[p]`,
/// the device a panic's error names) on a thread of its own, all stepping on one barrier. The first part to fail, by an error
/// or a panic (as [`Error::Panicked`]), breaks the barrier, so that the others stop at
/// their next wait instead of waiting forever; its failure is the run's.
pub fn run_in_lockstep<S: Send>(
    devices: &[usize],
    states: Vec<S>,
    part: impl Fn(usize, S, &SpinBarrier) -> Result<(), Stop> + Sync,
) -> Result<(), Error> {
    let barrier = SpinBarrier::new(states.len());
    let first_failure: Mutex<Option<Error>> = Mutex::new(None);
    let fail = |e: Error| {
        first_failure.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(e);
        // After recording: whoever sees the barrier broken finds the cause recorded.
        barrier.abort();
    };
    std::thread::scope(|s| {
        for (p, state) in states.into_iter().enumerate() {
            let (part, barrier, fail) = (&part, &barrier, &fail);
            s.spawn(move || {
                let device = devices.get(p).copied().unwrap_or(p);
                match catch_unwind(AssertUnwindSafe(|| part(p, state, barrier))) {
                    Ok(Ok(())) | Ok(Err(Stop::Broken)) => {}
                    Ok(Err(Stop::Failed(e))) => fail(e),
                    Err(payload) => fail(Error::Panicked {
                        device,
                        what: "a solver's device thread",
                        message: panic_message(&*payload),
                    }),
                }
            });
        }
    });
    // The barrier is broken only after a failure was recorded, so a part that stopped at
    // it left the run's error here.
    match first_failure.into_inner().unwrap_or_else(PoisonError::into_inner) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    /// Runs `f` on a thread of its own; a failure (not a hang) if it takes over 30 s.
    fn within_30_s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(30)).expect("threads still waiting after 30 s")
    }

    #[test]
    fn threads_pass_together_and_one_leads() {
        let (b, leaders, step) = (SpinBarrier::new(4), AtomicUsize::new(0), AtomicU64::new(0));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..1000u64 {
                        // Everyone sees the same step before anyone moves on.
                        assert_eq!(step.load(Ordering::Acquire), i);
                        if b.wait().unwrap() {
                            leaders.fetch_add(1, Ordering::Relaxed);
                            step.fetch_add(1, Ordering::Release);
                        }
                        b.wait().unwrap();
                    }
                });
            }
        });
        assert_eq!(leaders.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn abort_releases_a_waiting_thread_and_every_later_wait() {
        let b = std::sync::Arc::new(SpinBarrier::new(2));
        let waiter = std::sync::Arc::clone(&b);
        let t = std::thread::spawn(move || waiter.wait());
        std::thread::sleep(Duration::from_millis(20));
        b.abort();
        assert_eq!(within_30_s(move || t.join().unwrap()), Err(BarrierBroken));
        assert_eq!(b.wait(), Err(BarrierBroken));
    }

    fn failing_part(fails: usize, at: usize) -> impl Fn(usize, (), &SpinBarrier) -> Result<(), Stop> + Sync {
        move |p, (), barrier| {
            for step in 0..1000 {
                if p == fails && step == at {
                    return Err(Stop::Failed(Error::InvalidArgument {
                        routine: "test",
                        what: format!("part {p} failed at step {step}"),
                    }));
                }
                barrier.wait()?;
            }
            Ok(())
        }
    }

    #[test]
    fn one_failing_part_stops_every_part_with_its_error() {
        let r = within_30_s(|| run_in_lockstep(&[0, 1, 2, 3], vec![(); 4], failing_part(2, 10)));
        match r {
            Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "part 2 failed at step 10"),
            other => panic!("expected part 2's error, got {other:?}"),
        }
        assert!(within_30_s(|| run_in_lockstep(&[0, 1, 2, 3], vec![(); 4], failing_part(9, 0))).is_ok());
    }

    #[test]
    fn a_panicking_part_stops_every_part_and_is_named() {
        let r = within_30_s(|| {
            run_in_lockstep(&[4, 5, 6], vec![(); 3], |p, (), barrier| {
                for step in 0..1000 {
                    assert!(!(p == 1 && step == 3), "part {p} gave up");
                    barrier.wait()?;
                }
                Ok(())
            })
        });
        match r {
            Err(Error::Panicked { device: 5, message, .. }) => assert_eq!(message, "part 1 gave up"),
            other => panic!("expected part 1's panic, got {other:?}"),
        }
    }
}
