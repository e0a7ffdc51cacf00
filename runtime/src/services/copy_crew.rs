//! A crew of persistent copy threads bound to one NUMA node: the CPU half of a staged copy.
//!
//! A staged transfer copies chunk after chunk between pageable memory and pinned buffers,
//! with a wait for the DMA engine between chunks. A general thread pool lets its threads
//! fall asleep in those waits and pays a wake-up for every thread at every chunk, which on
//! a virtual machine costs tens of microseconds: more than copying a small chunk. The crew
//! keeps its threads spinning between the chunks of a transfer (and for a short while
//! after), so a chunk is handed out with a few atomic operations; idle, they park.
//!
//! One job at a time: [`CopyCrew::copy`] publishes `dst[..n] = src[..n]` cut into pieces,
//! copies pieces itself too, and returns when every piece is done. Pieces are claimed with
//! one atomic word that holds the job's number, its piece count and the next piece, so a
//! thread still looking at a finished job can never claim a piece of the next one.
//!
//! A job may ask for non-temporal stores (x86_64): a copy out of a pinned buffer into
//! memory the caller reads much later (a batch's output) would otherwise read every
//! destination line into the cache first, only to evict it again.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::topology::Topology;

/// How long an idle crew thread polls (yielding) for a next job before it parks: longer
/// than the gap between two chunks of a transfer (a DMA of one chunk), short enough to cost
/// little after the transfer.
const SPIN: Duration = Duration::from_micros(1000);

/// The job being copied. Written only while no piece of it can be claimed.
struct Job {
    dst: AtomicPtr<u8>,
    src: AtomicPtr<u8>,
    len: AtomicUsize,
    piece: AtomicUsize,
    /// Whether the job copies with non-temporal stores ([`copy_piece`]).
    streaming: AtomicBool,
}

/// The claim word: job number (bits 63-32), pieces (31-16), next unclaimed piece (15-0).
fn claim_word(id: u64, pieces: usize, next: usize) -> u64 {
    (id << 32) | ((pieces as u64) << 16) | next as u64
}

/// `(job, pieces, next)` of a claim word.
fn claim_parts(c: u64) -> (u64, u64, u64) {
    (c >> 32, (c >> 16) & 0xffff, c & 0xffff)
}

/// Most pieces of one job: more than the threads a crew may have (1024) plus the caller.
const MAX_PIECES: usize = 0xffff;

struct Shared {
    /// See [`claim_word`].
    claim: AtomicU64,
    /// Pieces of the job copied.
    done: AtomicUsize,
    job: Job,
    stop: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// Pieces copied with streaming stores asked for (tests check which copies stream).
    #[cfg(test)]
    streamed: AtomicUsize,
}

impl Shared {
    /// Claims and copies pieces of job `id` until none is left; returns how many it copied.
    fn work(&self, id: u64) -> usize {
        let mut copied = 0;
        loop {
            let c = self.claim.load(Ordering::Acquire);
            let (job, pieces, next) = claim_parts(c);
            if job != id || next >= pieces {
                return copied;
            }
            if self.claim.compare_exchange_weak(c, c + 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
                continue;
            }
            let i = next as usize;
            let (dst, src) = (self.job.dst.load(Ordering::Relaxed), self.job.src.load(Ordering::Relaxed));
            let (len, piece) = (self.job.len.load(Ordering::Relaxed), self.job.piece.load(Ordering::Relaxed));
            let off = i * piece;
            let n = piece.min(len - off);
            let streaming = self.job.streaming.load(Ordering::Relaxed);
            if src.is_null() {
                // A populate job ([`CopyCrew::populate`]).
                populate_writable(dst.wrapping_add(off), n);
            } else {
                // SAFETY: piece `i` of the job is claimed by this thread alone; the job's
                // ranges are valid and disjoint until every piece is done (the caller of
                // `copy` waits for that), and the fields were written before the job number
                // this claim matched was published.
                unsafe { copy_piece(dst.add(off), src.add(off).cast_const(), n, streaming) };
                #[cfg(test)]
                if streaming {
                    self.streamed.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.done.fetch_add(1, Ordering::AcqRel);
            copied += 1;
        }
    }

    /// The job number with unclaimed pieces, if any, read with `order`.
    fn open_job(&self, order: Ordering) -> Option<u64> {
        let (job, pieces, next) = claim_parts(self.claim.load(order));
        (next < pieces).then_some(job)
    }
}

/// Persistent copy threads; see the module documentation.
pub(crate) struct CopyCrew {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// One job at a time (a crew serves one direction of a ring, or both when the ring has
    /// one crew); holds the last job's number.
    caller: Mutex<u64>,
    /// Smallest piece of a job, in bytes (rounded up to whole pages when cut).
    min_piece: usize,
}

impl CopyCrew {
    /// `threads` helpers (at least 0; the caller of [`CopyCrew::copy`] copies too), named
    /// `{name}-copy{i}`, each bound to the CPUs of `bind` when given (best effort, as the
    /// device's worker).
    pub(crate) fn spawn(
        name: &str,
        bind: Option<(Arc<Topology>, Vec<usize>)>,
        threads: usize,
        min_piece: usize,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            job: Job {
                dst: AtomicPtr::new(std::ptr::null_mut()),
                src: AtomicPtr::new(std::ptr::null_mut()),
                len: AtomicUsize::new(0),
                piece: AtomicUsize::new(1),
                streaming: AtomicBool::new(false),
            },
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            #[cfg(test)]
            streamed: AtomicUsize::new(0),
        });
        let mut crew =
            Self { shared: Arc::clone(&shared), threads: Vec::new(), caller: Mutex::new(0), min_piece };
        for i in 0..threads {
            let (s, bind) = (Arc::clone(&shared), bind.clone());
            let t = std::thread::Builder::new().name(format!("{name}-copy{i}")).spawn(move || {
                if let Some((topo, cpus)) = bind {
                    // Best effort, as for the worker; the report shows the worker's binding.
                    let _ = topo.bind_current_thread(&cpus);
                }
                helper(&s);
            })?;
            crew.threads.push(t);
        }
        Ok(crew)
    }

    /// Copy threads, the caller's included.
    pub(crate) fn threads(&self) -> usize {
        self.threads.len() + 1
    }

    /// Pieces this crew has copied with streaming stores asked for.
    #[cfg(test)]
    pub(crate) fn streamed_pieces(&self) -> usize {
        self.shared.streamed.load(Ordering::Relaxed)
    }

    /// Faults in `dst[..n]`'s pages writable with up to `threads` crew threads (the
    /// caller's included), without writing them (Linux's `MADV_POPULATE_WRITE`): a
    /// destination of fresh pages is then faulted in, in the kernel, before the chunks are
    /// copied into it, rather than 4 KiB at a time by the threads copying each chunk. A
    /// kernel without it (before 5.14) refuses, and the copies fault the pages in as before.
    /// `threads == 0` does nothing. Only the range's whole pages are populated, cut at page
    /// boundaries (a piece rounding its own ends inward would skip a page at every cut).
    pub(crate) fn populate(&self, dst: *mut u8, n: usize, threads: usize) {
        let page = page_size();
        let (Some(start), end) =
            (dst.addr().checked_next_multiple_of(page), dst.addr().saturating_add(n) / page * page)
        else {
            return;
        };
        if threads == 0 || end <= start {
            return;
        }
        // SAFETY: a null source makes every piece a populate of its part of the whole pages
        // of `dst`, which stores nothing (see `populate_writable`).
        unsafe {
            self.run(dst.wrapping_add(start - dst.addr()), std::ptr::null(), end - start, false, threads)
        }
    }

    /// `dst[..n] = src[..n]` with every crew thread and the calling one; with `streaming`,
    /// with non-temporal stores on x86_64 (for a destination not read again soon).
    ///
    /// # Safety
    /// Both ranges valid for `n` bytes and disjoint, `dst` not otherwise accessed until
    /// this returns.
    pub(crate) unsafe fn copy(&self, dst: *mut u8, src: *const u8, n: usize, streaming: bool) {
        // SAFETY: the caller's guarantee.
        unsafe { self.run(dst, src, n, streaming, usize::MAX) }
    }

    /// One job over `dst[..n]` in at most `threads` pieces (and at most one per crew
    /// thread): a copy from `src`, or a populate when `src` is null.
    ///
    /// # Safety
    /// As [`CopyCrew::copy`], when `src` is not null.
    unsafe fn run(&self, dst: *mut u8, src: *const u8, n: usize, streaming: bool, threads: usize) {
        if n == 0 {
            return;
        }
        let mut last = self.caller.lock();
        let s = &*self.shared;
        // At most one piece per thread, and never more than MAX_PIECES. Pieces are whole
        // pages (a populate's range is), so that no two pieces share one.
        let ways = threads.clamp(1, self.threads().min(MAX_PIECES));
        let page = page_size();
        let piece = n.div_ceil(ways).max(self.min_piece).next_multiple_of(page);
        let pieces = n.div_ceil(piece);
        debug_assert!(pieces <= MAX_PIECES);
        let id = (*last + 1) & 0xffff_ffff;
        *last = id;
        // No piece of the previous job is claimable (it is done), so the fields are ours.
        s.job.dst.store(dst, Ordering::Relaxed);
        // Only read through (the pointer is stored mutable for the atomic's type).
        s.job.src.store(src.cast_mut(), Ordering::Relaxed);
        s.job.len.store(n, Ordering::Relaxed);
        s.job.piece.store(piece, Ordering::Relaxed);
        s.job.streaming.store(streaming, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        // From here until every piece is done, unwinding out of this call would free memory
        // the helpers still write; nothing below can panic, and this makes sure of it.
        let guard = AbortOnUnwind;
        // Publishing the job number with piece 0 opens the job.
        s.claim.store(claim_word(id, pieces, 0), Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock();
            s.wake.notify_all();
        }
        s.work(id);
        while s.done.load(Ordering::Acquire) < pieces {
            std::hint::spin_loop();
        }
        std::mem::forget(guard);
    }
}

/// `dst[..n] = src[..n]`; with `streaming` on x86_64, with non-temporal stores.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: both ranges valid for `n` bytes and disjoint.
unsafe fn copy_piece(dst: *mut u8, src: *const u8, n: usize, streaming: bool) {
    if !(streaming && cfg!(target_arch = "x86_64")) {
        // SAFETY: the caller's guarantee.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
        return;
    }
    // Streaming stores require 16-byte aligned destinations: the bytes before the first
    // aligned one and after the last whole 64-byte line are copied as usual.
    let head = dst.align_offset(16).min(n);
    let lines = (n - head) / 64;
    // SAFETY: `head <= n` bytes of both ranges (the caller's guarantee).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    for l in 0..lines {
        let off = head + 64 * l;
        // SAFETY: `off + 64 <= n`, and `dst + off` is 16-byte aligned (`dst + head` is).
        unsafe { stream_line(dst.add(off), src.add(off)) };
    }
    fence_streams();
    let tail = head + 64 * lines;
    // SAFETY: the last `n - tail` bytes of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(tail), dst.add(tail), n - tail) };
}

/// Copies one 64-byte line with non-temporal stores (x86_64: four unaligned loads, four
/// `movntdq`); elsewhere, and under Miri (which runs no inline assembly), as usual.
///
/// # Safety
/// `src` and `dst` valid for 64 bytes and disjoint; `dst` 16-byte aligned.
#[inline(always)]
unsafe fn stream_line(dst: *mut u8, src: *const u8) {
    debug_assert!(dst.addr().is_multiple_of(16), "a streaming store to an unaligned address");
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        // SAFETY: the caller's guarantee; the loads are unaligned ones, the stores are to
        // the aligned addresses `_mm_stream_si128` needs.
        unsafe {
            let (s, d) = (src.cast::<__m128i>(), dst.cast::<__m128i>());
            let (a, b, c, e) = (
                _mm_loadu_si128(s),
                _mm_loadu_si128(s.add(1)),
                _mm_loadu_si128(s.add(2)),
                _mm_loadu_si128(s.add(3)),
            );
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    // SAFETY: the caller's guarantee.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, 64)
    };
}

/// Orders the non-temporal stores before what follows: they are weakly ordered, and the
/// release that counts a piece done (handing its bytes to the caller) orders only ordinary
/// stores.
#[inline(always)]
fn fence_streams() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: SSE is part of x86_64's baseline; the fence touches no memory.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Aborts the process when dropped by an unwinding panic: a job's caller or crew thread
/// that unwound mid-job would leave the others writing memory the caller then frees, or
/// the caller waiting for pieces no one copies. Forgotten on the way out of a job.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        std::process::abort();
    }
}

/// The system's page size (4 KiB where it cannot be read, and under Miri).
fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        #[cfg(all(unix, not(miri)))]
        {
            // SAFETY: sysconf reads a system constant.
            let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            if let Ok(p) = usize::try_from(p) {
                if p.is_power_of_two() {
                    return p;
                }
            }
        }
        4096
    })
}

/// `MADV_POPULATE_WRITE` over the whole pages of `ptr..ptr+n`; a refusal changes nothing.
fn populate_writable(ptr: *mut u8, n: usize) {
    // Under Miri, which runs no system call, a populate is a no-op: the claim protocol
    // around it is what the tests there check.
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        let page = page_size();
        let (start, end) =
            ((ptr as usize).next_multiple_of(page), (ptr as usize).saturating_add(n) / page * page);
        if end > start {
            // SAFETY: the range lies inside the caller's, which the caller is about to
            // overwrite. Populating faults its pages in as a write would, with no store:
            // anonymous memory keeps its bytes (file-backed pages are copied or dirtied as a
            // write would, which the copy that follows does anyway).
            let _ = unsafe { libc::madvise(start as *mut libc::c_void, end - start, MADV_POPULATE_WRITE) };
        }
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    let _ = (ptr, n);
}

/// A crew thread: spins for jobs, parks when idle, ends when the crew is dropped.
fn helper(s: &Shared) {
    // A helper that unwound mid-piece would leave its job's caller waiting forever.
    let guard = AbortOnUnwind;
    let mut idle = Instant::now();
    loop {
        if s.stop.load(Ordering::Acquire) {
            std::mem::forget(guard);
            return;
        }
        if let Some(id) = s.open_job(Ordering::Acquire) {
            if s.work(id) > 0 {
                idle = Instant::now();
            }
            continue;
        }
        if idle.elapsed() < SPIN {
            // Yielding, not spinning on the core: with as many copy threads as CPUs the
            // thread that drives the transfer (and the driver's) must still get to run.
            std::thread::yield_now();
            continue;
        }
        let mut g = s.lock.lock();
        s.sleepers.fetch_add(1, Ordering::SeqCst);
        // SeqCst, as the caller's store of the claim and load of `sleepers` are: either it
        // sees this sleeper, or this load sees its job.
        if s.open_job(Ordering::SeqCst).is_none() && !s.stop.load(Ordering::SeqCst) {
            // The timeout bounds the cost of a wake-up lost to any ordering not foreseen.
            s.wake.wait_for(&mut g, Duration::from_millis(50));
        }
        s.sleepers.fetch_sub(1, Ordering::SeqCst);
        idle = Instant::now();
    }
}

impl Drop for CopyCrew {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock();
            self.shared.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crew(threads: usize, min_piece: usize) -> CopyCrew {
        CopyCrew::spawn("test", None, threads, min_piece).unwrap()
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads the machine's topology")]
    fn bound_helpers_copy_too() {
        let topo = Topology::system();
        let cpus = topo.whole_machine("test").cpus;
        let c = CopyCrew::spawn("test", Some((topo, cpus)), 2, 4096).unwrap();
        let src = vec![9u8; 3 * 4096];
        let mut dst = vec![0u8; 3 * 4096];
        // SAFETY: both hold 12 KiB; disjoint vectors.
        unsafe { c.copy(dst.as_mut_ptr(), src.as_ptr(), src.len(), false) };
        assert_eq!(dst, src);
    }

    /// The streaming path's head, whole lines and tail, at every alignment below a line;
    /// small enough for Miri, which checks their bounds (there the lines are ordinary
    /// copies) and, through `stream_line`'s debug assertion, the stores' alignment.
    #[test]
    fn streaming_copies_land_whole_at_every_alignment() {
        let c = crew(0, 4096);
        for n in [1usize, 15, 16, 63, 64, 65, 200, 4097] {
            let src: Vec<u8> = (0..n).map(|i| (i * 13 + n) as u8).collect();
            for at in 0..64 {
                let mut dst = vec![0u8; at + n + 1];
                // SAFETY: both hold `n` bytes; disjoint vectors.
                unsafe { c.copy(dst[at..].as_mut_ptr(), src.as_ptr(), n, true) };
                assert!(dst[at..at + n] == src[..], "n {n} at {at}");
                assert!(dst[..at].iter().all(|&b| b == 0) && dst[at + n] == 0, "n {n} at {at}: outside");
            }
        }
    }

    /// Small enough for Miri, which checks the claim protocol's atomics and the threads'
    /// accesses to the copied ranges (scripts/miri.sh).
    #[test]
    fn concurrent_pieces_are_each_copied_once() {
        let c = crew(3, 4096);
        for round in 0..4usize {
            let n = 4 * 4096 + round;
            let src: Vec<u8> = (0..n).map(|i| (i + round) as u8).collect();
            let mut dst = vec![0u8; n];
            // SAFETY: both hold `n` bytes; disjoint vectors.
            unsafe { c.copy(dst.as_mut_ptr(), src.as_ptr(), n, false) };
            assert!(dst == src, "round {round}");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "megabytes of copies: too slow under Miri")]
    fn copies_every_byte_at_awkward_sizes_and_piece_counts() {
        for (threads, min_piece) in [(0usize, 4096usize), (1, 4096), (3, 4096), (5, 1 << 20)] {
            let c = crew(threads, min_piece);
            for n in [1usize, 4095, 4096, 4097, 3 * 4096 + 5, 1 << 20, (5 << 20) + 17] {
                let src: Vec<u8> = (0..n).map(|i| (i * 31 + n) as u8).collect();
                // Ordinary and streaming stores, into a destination at alignments below a line.
                for (streams, at) in
                    [(false, 0usize), (false, 1), (true, 0), (true, 1), (true, 17), (true, 63)]
                {
                    let mut dst = vec![0u8; at + n + 1];
                    // SAFETY: both hold `n` bytes; disjoint vectors.
                    unsafe { c.copy(dst[at..].as_mut_ptr(), src.as_ptr(), n, streams) };
                    let what = format!("threads {threads} streaming {streams} n {n} at {at}");
                    assert!(dst[at..at + n] == src[..], "{what}");
                    assert!(dst[..at].iter().all(|&b| b == 0) && dst[at + n] == 0, "{what}: nothing outside");
                }
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "megabytes, and populating is a no-op under Miri: too slow, nothing to check")]
    fn populating_changes_no_byte_and_a_copy_after_it_lands() {
        let c = crew(3, 4096);
        // Fresh zeroed pages, and pages already holding data, at an unaligned start.
        let mut fresh = vec![0u8; (16 << 20) + 123];
        c.populate(fresh[7..].as_mut_ptr(), fresh.len() - 7, usize::MAX);
        assert!(fresh.iter().all(|&b| b == 0));
        let mut data: Vec<u8> = (0..(8 << 20) + 5).map(|i| (i % 251) as u8).collect();
        let before = data.clone();
        c.populate(data.as_mut_ptr(), data.len(), 2);
        assert_eq!(data, before);
        // SAFETY: disjoint vectors of the same length.
        unsafe { c.copy(fresh.as_mut_ptr(), data.as_ptr(), data.len(), true) };
        assert_eq!(&fresh[..data.len()], &data[..]);
        c.populate(std::ptr::null_mut(), 0, 1);
    }

    /// Every whole page of a range that starts 16 bytes past a page (as glibc's large
    /// allocations do) is faulted in, the pages at the cuts between pieces included.
    #[test]
    #[cfg(target_os = "linux")]
    #[cfg_attr(miri, ignore = "system calls")]
    fn populate_covers_every_whole_page_at_an_unaligned_start() {
        let (c, page) = (crew(3, 4096), page_size());
        let len = 64 * page;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base.cast::<u8>();
        let mut resident = vec![0u8; 64];
        // SAFETY: the mapping's pages, one status byte each.
        let residency =
            |r: &mut Vec<u8>| assert_eq!(unsafe { libc::mincore(base.cast(), len, r.as_mut_ptr()) }, 0);
        residency(&mut resident);
        assert!(resident.iter().all(|&r| r & 1 == 0), "a fresh mapping is not resident: {resident:?}");
        c.populate(base.wrapping_add(16), len - 16, 4);
        residency(&mut resident);
        // Page 0 is only partly in the range; every other page is whole.
        assert_eq!(resident[0] & 1, 0, "a partial page is left alone");
        assert!(resident[1..].iter().all(|&r| r & 1 == 1), "{resident:?}");
        // SAFETY: the mapping made above, no longer used.
        assert_eq!(unsafe { libc::munmap(base.cast(), len) }, 0);
    }

    /// A populate asked of fewer threads is cut in that many pieces (of the crew's 4), and
    /// one asked of none is no job at all.
    #[test]
    fn populate_uses_the_threads_it_is_given() {
        let c = crew(3, 4096);
        let mut fresh = vec![0u8; 64 << 10];
        let job = || claim_parts(c.shared.claim.load(Ordering::SeqCst));
        for (threads, pieces) in [(1usize, 1u64), (2, 2), (3, 3), (4, 4), (64, 4)] {
            c.populate(fresh.as_mut_ptr(), fresh.len(), threads);
            let (_, p, next) = job();
            assert_eq!((p, next), (pieces, pieces), "{threads} threads");
        }
        let before = job();
        c.populate(fresh.as_mut_ptr(), fresh.len(), 0);
        assert_eq!(job(), before, "no threads: no job");
        assert!(fresh.iter().all(|&b| b == 0));
    }

    #[test]
    #[cfg_attr(miri, ignore = "sleeps and megabytes: too slow under Miri")]
    fn back_to_back_jobs_never_mix_and_parked_threads_wake() {
        let c = crew(4, 4096);
        let mut bufs: Vec<Vec<u8>> = (0..64).map(|k| vec![k as u8; 64 << 10]).collect();
        let mut out = vec![0u8; 64 << 10];
        for round in 0..3 {
            for (k, b) in bufs.iter().enumerate() {
                // SAFETY: both hold 64 KiB; disjoint vectors. (Every other job streams.)
                unsafe { c.copy(out.as_mut_ptr(), b.as_ptr(), b.len(), k % 2 == 0) };
                assert!(out.iter().all(|&v| v == b[0]), "round {round} job {k}");
            }
            // Long enough for the threads to park; the next job must wake them.
            std::thread::sleep(SPIN * 3);
            bufs.reverse();
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "megabytes of copies: too slow under Miri")]
    fn two_callers_take_turns() {
        let c = Arc::new(crew(2, 4096));
        std::thread::scope(|s| {
            for t in 0..2u8 {
                let c = Arc::clone(&c);
                s.spawn(move || {
                    let src = vec![t + 1; 1 << 20];
                    let mut dst = vec![0u8; 1 << 20];
                    for _ in 0..50 {
                        // SAFETY: both hold 1 MiB; each thread's own vectors.
                        unsafe { c.copy(dst.as_mut_ptr(), src.as_ptr(), src.len(), false) };
                        assert!(dst.iter().all(|&v| v == t + 1));
                        dst.fill(0);
                    }
                });
            }
        });
    }
}
