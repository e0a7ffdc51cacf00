//! A barrier whose waiters spin instead of sleeping, for one host thread per device
//! stepping in lockstep: a step of a few hundred microseconds cannot afford the tens of
//! microseconds a futex wake-up costs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crossbeam_utils::Backoff;

/// A sense-reversing spin barrier for `n` threads.
#[derive(Debug)]
pub struct SpinBarrier {
    n: usize,
    waiting: AtomicUsize,
    sense: AtomicBool,
}

impl SpinBarrier {
    /// A barrier for `n > 0` threads.
    pub fn new(n: usize) -> Self {
        Self { n: n.max(1), waiting: AtomicUsize::new(0), sense: AtomicBool::new(false) }
    }

    /// Waits until all `n` threads have called `wait`; returns `true` in exactly one of
    /// them (the last to arrive).
    pub fn wait(&self) -> bool {
        let sense = !self.sense.load(Ordering::Acquire);
        if self.waiting.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.waiting.store(0, Ordering::Relaxed);
            self.sense.store(sense, Ordering::Release);
            return true;
        }
        let backoff = Backoff::new();
        while self.sense.load(Ordering::Acquire) != sense {
            backoff.snooze();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn threads_pass_together_and_one_leads() {
        let (b, leaders, step) = (SpinBarrier::new(4), AtomicUsize::new(0), AtomicU64::new(0));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..1000u64 {
                        // Everyone sees the same step before anyone moves on.
                        assert_eq!(step.load(Ordering::Acquire), i);
                        if b.wait() {
                            leaders.fetch_add(1, Ordering::Relaxed);
                            step.fetch_add(1, Ordering::Release);
                        }
                        b.wait();
                    }
                });
            }
        });
        assert_eq!(leaders.load(Ordering::Relaxed), 1000);
    }
}
