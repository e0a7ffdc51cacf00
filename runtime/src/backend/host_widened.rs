//! f32 copies of a host device's 16-bit GEMM operands, kept while the memory they copy is
//! not written, so that bf16 and f16 weights are widened once rather than on every
//! product (host devices compute every precision's products in f32).
//!
//! Every allocation of a host device carries a *write stamp*, a number from one counter
//! for the process, renewed after each write the device is asked for (a copy or memset
//! into it, a GEMM's output, and a kernel launch for every allocation that one of its
//! pointer arguments reaches, but for a generated kernel's views it only reads, `&[T]`,
//! which its [`crate::kernel::KernelShape`] says).
//! A product takes its operands' stamps before it is queued; a copy widened under a stamp
//! is used again only while the allocation keeps that stamp. Writers renew the stamp
//! after queueing their write and readers take it before queueing their read, so a copy
//! is never older than its stamp says: one device runs its queue in order.
//!
//! An operand is kept from the second product that reads it unwritten (activations,
//! written before each product, are never kept), within a budget of bytes, the least
//! recently used dropped first; freeing an allocation drops its copies. Memory written
//! behind the runtime's back (through a raw device address, in `unsafe` code) is not seen.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// The process's write stamps: each new one is larger than every one before.
static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

/// A new write stamp.
pub(crate) fn new_stamp() -> u64 {
    NEXT_STAMP.fetch_add(1, Ordering::Relaxed)
}

/// Bytes of f32 copies one host device keeps at most.
pub(crate) const DEFAULT_BUDGET: usize = 1 << 30;

/// One operand: its stamp when last seen, and its f32 copy once seen twice under it.
struct Kept {
    stamp: u64,
    wide: Option<Arc<Vec<f32>>>,
    /// When it was last used (a count of lookups), for eviction.
    used_at: u64,
}

/// A host device's kept f32 copies, by the operand's address, its element count and
/// whether it was rounded to TF32.
pub(crate) struct WidenedOperands {
    budget: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    kept: HashMap<(u64, usize, bool), Kept>,
    bytes: usize,
    clock: u64,
}

impl WidenedOperands {
    /// An empty set keeping at most `budget` bytes of copies.
    pub(crate) fn new(budget: usize) -> Self {
        Self { budget, state: Mutex::new(State::default()) }
    }

    /// The f32 copy of the `len` elements at `addr` (rounded to TF32 when `tf32`), written
    /// last under `stamp`: the kept one, or `widen()`'s, which is kept when this operand
    /// was seen before under the same stamp and the budget has room.
    pub(crate) fn get(
        &self,
        addr: u64,
        len: usize,
        tf32: bool,
        stamp: u64,
        widen: impl FnOnce() -> Vec<f32>,
    ) -> Arc<Vec<f32>> {
        let key = (addr, len, tf32);
        let seen_before = {
            let mut s = self.state.lock();
            s.clock += 1;
            let now = s.clock;
            match s.kept.get_mut(&key) {
                Some(k) if k.stamp == stamp => {
                    k.used_at = now;
                    if let Some(wide) = &k.wide {
                        return Arc::clone(wide);
                    }
                    true
                }
                _ => false,
            }
        };
        // Widened without the lock: other products of the device's pool may look up meanwhile.
        let wide = Arc::new(widen());
        let mut s = self.state.lock();
        let bytes = len * std::mem::size_of::<f32>();
        let old = s.kept.remove(&key);
        if let Some(Kept { wide: Some(_), .. }) = old {
            s.bytes -= bytes;
        }
        let keep = seen_before && bytes <= self.budget;
        if keep {
            while s.bytes + bytes > self.budget {
                let oldest = s
                    .kept
                    .iter()
                    .filter(|(_, k)| k.wide.is_some())
                    .min_by_key(|(_, k)| k.used_at)
                    .map(|(key, _)| *key);
                let Some(oldest) = oldest else { break };
                s.kept.remove(&oldest);
                s.bytes -= oldest.1 * std::mem::size_of::<f32>();
            }
            s.bytes += bytes;
        }
        let used_at = s.clock;
        s.kept.insert(key, Kept { stamp, wide: keep.then(|| Arc::clone(&wide)), used_at });
        wide
    }

    /// Drops every copy of memory in `addr..addr + bytes` (an allocation being freed).
    pub(crate) fn forget(&self, addr: u64, bytes: usize) {
        let mut s = self.state.lock();
        let end = addr.saturating_add(bytes as u64);
        let mut freed = 0;
        s.kept.retain(|&(a, len, _), k| {
            let inside = a >= addr && a < end;
            if inside && k.wide.is_some() {
                freed += len * std::mem::size_of::<f32>();
            }
            !inside
        });
        s.bytes -= freed;
    }

    /// Bytes of copies kept now.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.state.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn kept_from_the_second_sighting_under_one_stamp() {
        let w = WidenedOperands::new(1 << 20);
        let widened = Cell::new(0);
        let widen = || {
            widened.set(widened.get() + 1);
            vec![1.0f32; 100]
        };
        w.get(0x1000, 100, false, 7, widen);
        w.get(0x1000, 100, false, 7, widen);
        w.get(0x1000, 100, false, 7, widen);
        assert_eq!(widened.get(), 2, "widened on the first two products, kept after");
        assert_eq!(w.bytes(), 400);
        // Written since (a new stamp): widened again, kept again only from a second look.
        w.get(0x1000, 100, false, 8, widen);
        assert_eq!((widened.get(), w.bytes()), (3, 0));
        w.get(0x1000, 100, false, 8, widen);
        w.get(0x1000, 100, false, 8, widen);
        assert_eq!(widened.get(), 4);
        // TF32 rounding is another copy.
        w.get(0x1000, 100, true, 8, widen);
        assert_eq!(widened.get(), 5);
        w.forget(0x1000, 400);
        assert_eq!(w.bytes(), 0);
        w.get(0x1000, 100, false, 8, widen);
        assert_eq!(widened.get(), 6, "a freed allocation's copies are gone");
    }

    #[test]
    fn the_least_recently_used_copy_makes_room() {
        let w = WidenedOperands::new(1000);
        for _ in 0..2 {
            w.get(0x1000, 100, false, 1, || vec![0.0; 100]);
            w.get(0x2000, 100, false, 1, || vec![0.0; 100]);
        }
        assert_eq!(w.bytes(), 800);
        w.get(0x1000, 100, false, 1, || panic!("kept"));
        // A third copy: the one used longest ago (0x2000) goes.
        for _ in 0..2 {
            w.get(0x3000, 100, false, 1, || vec![0.0; 100]);
        }
        assert_eq!(w.bytes(), 800);
        w.get(0x1000, 100, false, 1, || panic!("kept"));
        w.get(0x3000, 100, false, 1, || panic!("kept"));
        let mut again = false;
        w.get(0x2000, 100, false, 1, || {
            again = true;
            vec![0.0; 100]
        });
        assert!(again, "evicted");
        // Larger than the whole budget: used, never kept.
        for _ in 0..2 {
            w.get(0x4000, 1000, false, 1, || vec![0.0; 1000]);
        }
        assert!(w.bytes() <= 1000);
    }
}
