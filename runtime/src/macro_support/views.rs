//! The host twin's views of a launch's arguments: [`SharedSlice`] (bounds-checked relaxed
//! atomic loads and stores of each element), [`ReadView`] and [`OwnView`] (plain loads and
//! stores where a per-launch check proves them safe), and a checked twin's [`StoreLog`].

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::kernel::{HostLaunch, KernelStruct};

use super::arguments::index_arg;

/// Element types of generated kernels' slices: loaded and stored as relaxed atomics.
///
/// # Safety
/// `Atomic` must have the size of `Self`, and `load`/`store` must only access the element
/// at `p` through `Atomic`.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The atomic type of the same size.
    type Atomic;
    /// Relaxed load of `*p`.
    ///
    /// # Safety
    /// `p` must be valid for reads and aligned for `Self::Atomic`, and every concurrent
    /// access to `*p` must be atomic.
    unsafe fn load(p: *const Self) -> Self;
    /// Relaxed store of `v` to `*p`.
    ///
    /// # Safety
    /// As [`Element::load`], and `p` must be valid for writes.
    unsafe fn store(p: *const Self, v: Self);
}

macro_rules! element {
    ($($t:ty => $a:ty, $bits:ty, |$x:ident| $to:expr, |$b:ident| $from:expr;)*) => {$(
        // SAFETY: `$a` has the size of `$t`; accesses go through `$a` only.
        unsafe impl Element for $t {
            type Atomic = $a;
            #[inline]
            unsafe fn load(p: *const Self) -> Self {
                // SAFETY: the caller gives a valid, aligned pointer only accessed atomically.
                let $b: $bits = unsafe { <$a>::from_ptr(p as *mut $bits) }.load(Ordering::Relaxed);
                $from
            }
            #[inline]
            unsafe fn store(p: *const Self, $x: Self) {
                // SAFETY: as in `load`; the pointer is valid for writes.
                unsafe { <$a>::from_ptr(p as *mut $bits) }.store($to, Ordering::Relaxed)
            }
        }
    )*};
}
element! {
    f32 => AtomicU32, u32, |x| x.to_bits(), |b| f32::from_bits(b);
    f64 => AtomicU64, u64, |x| x.to_bits(), |b| f64::from_bits(b);
    i32 => AtomicU32, u32, |x| x as u32, |b| b as i32;
    u32 => AtomicU32, u32, |x| x, |b| b;
    i64 => AtomicU64, u64, |x| x as u64, |b| b as i64;
    u64 => AtomicU64, u64, |x| x, |b| b;
    usize => AtomicUsize, usize, |x| x, |b| b;
    half::bf16 => AtomicU16, u16, |x| x.to_bits(), |b| half::bf16::from_bits(b);
    half::f16 => AtomicU16, u16, |x| x.to_bits(), |b| half::f16::from_bits(b);
}

// SAFETY: a kernel struct has no padding and a size that is a multiple of 4 (its
// `KernelStruct` contract); its words are loaded and stored one `AtomicU32` at a time.
unsafe impl<T: KernelStruct> Element for T {
    type Atomic = AtomicU32;
    #[inline]
    unsafe fn load(p: *const Self) -> Self {
        let mut out = std::mem::MaybeUninit::<T>::uninit();
        let dst = out.as_mut_ptr().cast::<u32>();
        for k in 0..std::mem::size_of::<T>() / 4 {
            // SAFETY: word `k` of the element, aligned (the caller's contract), accessed atomically.
            let w = unsafe { AtomicU32::from_ptr((p as *mut u32).add(k)) }.load(Ordering::Relaxed);
            // SAFETY: word `k` of `out`.
            unsafe { dst.add(k).write_unaligned(w) };
        }
        // SAFETY: every byte was written; every bit pattern of a DeviceCopy type is valid.
        unsafe { out.assume_init() }
    }
    #[inline]
    unsafe fn store(p: *const Self, v: Self) {
        let src = (&v as *const T).cast::<u32>();
        for k in 0..std::mem::size_of::<T>() / 4 {
            // SAFETY: word `k` of `v`, initialized (no padding).
            let w = unsafe { src.add(k).read_unaligned() };
            // SAFETY: as in `load`; the caller's pointer is valid for writes.
            unsafe { AtomicU32::from_ptr((p as *mut u32).add(k)) }.store(w, Ordering::Relaxed);
        }
    }
}

/// A view argument of a generated host twin (or a sub-slice of one), shared by all its
/// iterations.
#[derive(Debug)]
pub struct SharedSlice<'a, T> {
    ptr: *const T,
    len: usize,
    kernel: &'static str,
    name: &'static str,
    /// The stores of a checked twin, by element of the argument's whole view.
    log: Option<&'a StoreLog>,
    /// Where this view starts in the argument's whole view.
    base: usize,
}

impl<T> Clone for SharedSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SharedSlice<'_, T> {}

// SAFETY: every access to the elements is atomic (see `Element`); the log is `Sync`.
unsafe impl<T: Element> Sync for SharedSlice<'_, T> {}
// SAFETY: as for `Sync`; the slice owns nothing.
unsafe impl<T: Element> Send for SharedSlice<'_, T> {}

impl<'a, T: Element> SharedSlice<'a, T> {
    /// Argument `ptr_index` of the launch (a device range) as `len_index`'s count of `T`.
    /// Fails unless the runtime knows the range's extent and it holds that many elements,
    /// and unless it is aligned for atomic access.
    pub fn new(
        l: &HostLaunch<'_>,
        kernel: &'static str,
        name: &'static str,
        ptr_index: usize,
        len_index: usize,
    ) -> std::result::Result<Self, String> {
        let len = index_arg(l, len_index)?;
        let (ptr, extent) = l.ptr::<T>(ptr_index)?;
        match extent {
            Some(e) if e >= len => {}
            Some(e) => {
                return Err(format!(
                    "kernel `{kernel}` argument `{name}`: a view of {len} elements but only {e} are mapped"
                ))
            }
            None => {
                return Err(format!(
                    "kernel `{kernel}` argument `{name}`: the device range's extent is unknown (a raw \
                     pointer, or an argument list not made by the kernel's `args`)"
                ))
            }
        }
        if len > 0 && !(ptr as usize).is_multiple_of(std::mem::align_of::<T::Atomic>()) {
            return Err(format!(
                "kernel `{kernel}` argument `{name}`: {ptr:p} is not aligned for atomic access"
            ));
        }
        Ok(Self { ptr, len, kernel, name, log: None, base: 0 })
    }

    /// A teams kernel's team-local array, over `buf` (the twin's, one per team at a time):
    /// shared by the team's threads through atomic accesses, as the exclusive borrow allows.
    pub fn team_local(buf: &'a mut [T], kernel: &'static str, name: &'static str) -> Self {
        Self { ptr: buf.as_mut_ptr(), len: buf.len(), kernel, name, log: None, base: 0 }
    }

    /// The same view, its stores recorded in `log` (a checked twin's).
    pub fn logged<'b>(self, log: &'b StoreLog) -> SharedSlice<'b, T>
    where
        'a: 'b,
    {
        SharedSlice { log: log.on().then_some(log), ..self }
    }

    /// Elements in the slice.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cold]
    #[inline(never)]
    fn out_of_range(&self, i: usize) -> ! {
        out_of_range(self.kernel, self.name, i, self.len)
    }

    /// Elements `start..end` (`&x[start..end]`); panics (failing the launch) naming the
    /// kernel and the argument when the range is not inside the view.
    pub fn sub(&self, start: usize, end: usize) -> Self {
        if start > end || end > self.len {
            panic!(
                "kernel `{}` argument `{}`: the sub-slice {start}..{end} is out of range for a view of {} elements",
                self.kernel, self.name, self.len
            )
        }
        // SAFETY: `start <= len`, inside (or one past) the launch's range.
        let ptr = unsafe { self.ptr.add(start) };
        Self { ptr, len: end - start, base: self.base + start, ..*self }
    }

    /// Element `i`; panics (the launch then fails with [`Error::KernelFailed`]) naming the
    /// kernel, the argument and the index when `i` is out of range.
    #[inline]
    pub fn get(&self, i: usize) -> T {
        if i >= self.len {
            self.out_of_range(i)
        }
        // SAFETY: `i < len` elements of the launch's range, aligned (checked in `new`),
        // accessed only atomically during the launch.
        unsafe { T::load(self.ptr.add(i)) }
    }

    /// Stores `v` at element `i`; panics as [`SharedSlice::get`], and in a checked twin
    /// when another iteration stored to the element.
    #[inline]
    pub fn set(&self, i: usize, v: T) {
        if i >= self.len {
            self.out_of_range(i)
        }
        if let Some(log) = self.log {
            log.record(self.base + i, self.kernel, self.name);
        }
        // SAFETY: as in `get`; the launch's ranges are device memory it may write.
        unsafe { T::store(self.ptr.add(i), v) }
    }
}

impl<T> SharedSlice<'_, T> {
    /// The bytes the view spans: its address and length in bytes.
    pub fn span(&self) -> (usize, usize) {
        (self.ptr as usize, self.len * std::mem::size_of::<T>())
    }
}

impl<'a, T: Element> SharedSlice<'a, T> {
    /// The same view as a plain slice, for a read-only argument that no written view of
    /// the launch overlaps ([`views_apart`]).
    ///
    /// # Safety
    /// Nothing may write the view's elements while the result lives: the launch writes no
    /// element of it, and nothing else runs on the device's memory meanwhile (a host
    /// device's worker runs its work in order; the initial device's views are borrowed
    /// from the host program by the construct).
    pub unsafe fn plain(self) -> ReadView<'a, T> {
        let data = if self.len == 0 {
            &[]
        } else {
            // SAFETY: `new` checked that the launch's range holds `len` elements, aligned;
            // the memory is initialised (host devices zero their allocations); the caller
            // guarantees no write meanwhile.
            unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
        };
        ReadView { data, lo: 0, len: self.len, kernel: self.kernel, name: self.name }
    }
}

/// A read-only view argument of a generated host twin as a plain slice: its loads are
/// plain loads, which rustc may keep in registers and vectorise (a [`SharedSlice`]'s
/// atomic loads are neither).
#[derive(Clone, Copy, Debug)]
pub struct ReadView<'a, T> {
    data: &'a [T],
    /// The view's index of `data[0]` (0 unless [`ReadView::part`] made it).
    lo: usize,
    /// The whole view's length.
    len: usize,
    kernel: &'static str,
    name: &'static str,
}

impl<T: Copy> ReadView<'_, T> {
    /// Elements in the (whole) view.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Only elements `lo..hi` of the view, indexed as in the whole view: a task's part of a
    /// view its items read only at their own elements, so that its loads need no check
    /// rustc cannot prove. Panics (failing the launch) when the range is not inside.
    #[inline]
    pub fn part(self, lo: usize, hi: usize) -> Self {
        match self.data.get(lo.wrapping_sub(self.lo)..hi.wrapping_sub(self.lo)) {
            Some(data) => ReadView { data, lo, ..self },
            None => out_of_range(self.kernel, self.name, hi.max(lo), self.len),
        }
    }

    /// Elements `start..start + n` of the view as a view of their own, indexed from 0: a
    /// row's run of a load whose index is the row's first plus the item's place in it
    /// (the macro's analysis), so that the load `window.get(k)`, `k < n`, needs no check
    /// rustc cannot drop. `None` (the row then runs the body as written) when the run is
    /// not inside the view.
    #[inline]
    pub fn window(self, start: usize, n: usize) -> Option<Self> {
        let lo = start.wrapping_sub(self.lo);
        let data = self.data.get(lo..lo.checked_add(n)?)?;
        Some(ReadView { data, lo: 0, ..self })
    }

    /// Element `i`; panics as [`SharedSlice::get`] when `i` is out of range.
    #[inline]
    pub fn get(&self, i: usize) -> T {
        match self.data.get(i.wrapping_sub(self.lo)) {
            Some(v) => *v,
            None => out_of_range(self.kernel, self.name, i, self.len),
        }
    }
}

impl<'a, T: Element> SharedSlice<'a, T> {
    /// Elements `lo..hi` of a written view as the plain elements of one task of the
    /// launch, for a view whose every access is at the work item's own element (the
    /// macro's analysis) and whose task spans [`own_rows_fit`] checked. Panics (failing
    /// the launch) when the range is not inside the view.
    ///
    /// # Safety
    /// No other task, view or thread may access elements `lo..hi` while the result lives.
    pub unsafe fn own(self, lo: usize, hi: usize) -> OwnView<'a, T> {
        if lo > hi || hi > self.len {
            self.out_of_range(hi.max(lo))
        }
        let data: &'a [std::cell::Cell<T>] = if lo == hi {
            &[]
        } else {
            // SAFETY: `lo..hi` is inside the launch's checked, aligned, initialised range;
            // the caller guarantees nothing else accesses it meanwhile.
            let elems = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(lo).cast_mut(), hi - lo) };
            std::cell::Cell::from_mut(elems).as_slice_of_cells()
        };
        OwnView { data, lo, len: self.len, kernel: self.kernel, name: self.name, beside: None }
    }
}

/// The elements a task of a generated host twin owns in a written view (each work item
/// only its own): plain loads and stores, which rustc may vectorise.
pub struct OwnView<'a, T> {
    data: &'a [std::cell::Cell<T>],
    /// The whole view, for stores outside the task's elements that the macro proved land
    /// in rows no task owns (checked per launch, [`rows_outside`]): relaxed atomics.
    beside: Option<SharedSlice<'a, T>>,
    /// The view's index of `data[0]`.
    lo: usize,
    /// The whole view's length.
    len: usize,
    kernel: &'static str,
    name: &'static str,
}

impl<T> std::fmt::Debug for OwnView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnView")
            .field("name", &self.name)
            .field("lo", &self.lo)
            .field("elements", &self.data.len())
            .finish()
    }
}

impl<T> Clone for OwnView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for OwnView<'_, T> {}

impl<'a, T: Copy> OwnView<'a, T> {
    /// A teams kernel's team-local array over `buf` (the task's own, one team at a time):
    /// its threads run in turn on one pool thread, so plain cells share it.
    pub fn team_local(buf: &'a mut [T], kernel: &'static str, name: &'static str) -> Self {
        let len = buf.len();
        OwnView {
            data: std::cell::Cell::from_mut(buf).as_slice_of_cells(),
            lo: 0,
            len,
            kernel,
            name,
            beside: None,
        }
    }

    /// The whole view's length.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the whole view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn cell(&self, i: usize) -> &std::cell::Cell<T> {
        match self.data.get(i.wrapping_sub(self.lo)) {
            Some(c) => c,
            None => out_of_range(self.kernel, self.name, i, self.len),
        }
    }

    /// Elements `start..start + n` (of the whole view) as a view of their own, indexed
    /// from 0: a row's run of an access whose index is the row's first plus the item's
    /// place in it (see [`ReadView::window`]). `None` when the run is not the task's.
    #[inline]
    pub fn window(self, start: usize, n: usize) -> Option<Self> {
        let lo = start.wrapping_sub(self.lo);
        let data = self.data.get(lo..lo.checked_add(n)?)?;
        Some(OwnView { data, lo: 0, beside: None, ..self })
    }

    /// Element `i` (of the whole view); panics as [`SharedSlice::get`] outside the task's
    /// elements (which the analysis proved cannot happen inside the view).
    #[inline]
    pub fn get(&self, i: usize) -> T {
        self.cell(i).get()
    }

    /// Stores `v` at element `i`: one of the task's own, or (a view with stores beside its
    /// own) one in a row no task owns, through the whole view's relaxed atomics; panics as
    /// [`OwnView::get`] otherwise.
    #[inline]
    pub fn set(&self, i: usize, v: T)
    where
        T: Element,
    {
        match (self.data.get(i.wrapping_sub(self.lo)), &self.beside) {
            (Some(c), _) => c.set(v),
            (None, Some(whole)) => set_beside(whole, i, v),
            (None, None) => out_of_range(self.kernel, self.name, i, self.len),
        }
    }

    /// The same task's elements, its stores outside them going through `whole` (the view
    /// this was made from): for a view the macro found stored beside its own elements,
    /// in rows [`rows_outside`] checked no task owns.
    pub fn with_beside<'b>(self, whole: SharedSlice<'b, T>) -> OwnView<'b, T>
    where
        'a: 'b,
    {
        OwnView { beside: Some(whole), ..self }
    }
}

/// A store outside a task's elements, in a row no task owns: rare (halo rows), so kept
/// out of the loop that makes it.
#[cold]
#[inline(never)]
fn set_beside<T: Element>(whole: &SharedSlice<'_, T>, i: usize, v: T) {
    whole.set(i, v)
}

/// Whether every row of `rows` is outside `row0..row0 + count`, the rows a launch's tasks
/// own: stores there reach no task's elements.
pub fn rows_outside(rows: &[usize], row0: usize, count: usize) -> bool {
    rows.iter().all(|&r| r < row0 || r - row0 >= count)
}

/// Whether the elements the work items of a launch own in a written view indexed
/// `row * width + col` (`v[i]` in one dimension: `width` 1, one column) stay apart and
/// inside its `len` elements: `rows` rows from `row0`, `cols` columns from `col0`.
pub fn own_rows_fit(row0: usize, rows: usize, col0: usize, cols: usize, width: usize, len: usize) -> bool {
    if rows == 0 || cols == 0 {
        return true;
    }
    let last = (row0.checked_add(rows - 1))
        .and_then(|r| r.checked_mul(width))
        .and_then(|r| r.checked_add(col0))
        .and_then(|r| r.checked_add(cols));
    col0.checked_add(cols).is_some_and(|c| c <= width) && last.is_some_and(|l| l <= len)
}

#[cold]
#[inline(never)]
fn out_of_range(kernel: &str, name: &str, i: usize, len: usize) -> ! {
    panic!("kernel `{kernel}` argument `{name}`: index {i} is out of range for a view of {len} elements")
}

/// Whether no written view of a launch overlaps another of its views (each given as its
/// [`SharedSlice::span`] and whether the launch writes it): the twin may then read its
/// read-only views as plain slices.
pub fn views_apart(views: &[((usize, usize), bool)]) -> bool {
    let overlap = |a: (usize, usize), b: (usize, usize)| {
        a.1 > 0 && b.1 > 0 && a.0 < b.0.saturating_add(b.1) && b.0 < a.0.saturating_add(a.1)
    };
    views
        .iter()
        .enumerate()
        .all(|(k, &(a, wa))| views[k + 1..].iter().all(|&(b, wb)| !(wa || wb) || !overlap(a, b)))
}

/// Views longer than this are not logged by checked twins (the log takes 4 bytes an
/// element).
pub const STORE_LOG_LIMIT: usize = 1 << 24;

/// Which work item stored to each element of a `&mut` view, in a checked host twin: a
/// second item storing to an element fails the launch (iterations must write distinct
/// elements). Reads of elements another item writes are not caught.
#[derive(Debug)]
pub struct StoreLog {
    /// Item + 1 (truncated to 32 bits) per element; 0 for none.
    owners: Vec<AtomicU32>,
}

impl StoreLog {
    /// A log of `len` elements when `on` and `len` is at most [`STORE_LOG_LIMIT`]; an
    /// inactive one otherwise.
    pub fn new(on: bool, len: usize) -> Self {
        let owners = if on && len <= STORE_LOG_LIMIT {
            (0..len).map(|_| AtomicU32::new(0)).collect()
        } else {
            Vec::new()
        };
        Self { owners }
    }

    fn on(&self) -> bool {
        !self.owners.is_empty()
    }

    // Inline: a call in a twin's loop would make rustc keep its values in memory.
    #[inline]
    fn record(&self, element: usize, kernel: &str, name: &str) {
        let Some(slot) = self.owners.get(element) else { return };
        let me = (CURRENT_ITEM.with(|c| c.get()) as u32).wrapping_add(1);
        let before = slot.swap(me, Ordering::Relaxed);
        if before != 0 && before != me {
            two_stores(kernel, name, element, before - 1, me - 1)
        }
    }
}

#[cold]
#[inline(never)]
fn two_stores(kernel: &str, name: &str, element: usize, first: u32, second: u32) -> ! {
    panic!(
        "kernel `{kernel}` argument `{name}`: work items {first} and {second} both store element {element} (a checked \
         launch; iterations must write distinct elements, as in OpenMP's `parallel for`)"
    )
}

thread_local! {
    static CURRENT_ITEM: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Says which work item this thread runs (a checked twin's [`StoreLog`] reads it).
#[inline]
pub fn set_item(t: usize) {
    CURRENT_ITEM.with(|c| c.set(t));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{KernelArg, Scalar};
    use crate::macro_support::{bits16_arg, bool_arg};

    #[test]
    fn shared_slices_are_bounds_checked_and_read_back_what_was_stored() {
        let mut v = [1.0f32, 2.0, 3.0];
        let args = [
            KernelArg::Ptr { addr: v.as_mut_ptr() as u64, bytes: Some(12) },
            KernelArg::Scalar(Scalar::U64(3)),
            KernelArg::Scalar(Scalar::U64(4)),
        ];
        let l = HostLaunch::new("k", 3, &args);
        {
            let s = SharedSlice::<f32>::new(&l, "k", "x", 0, 1).unwrap();
            s.set(2, s.get(0) + s.get(2));
            assert_eq!(s.get(2), 4.0);
            let err = std::panic::catch_unwind(|| s.get(3)).unwrap_err();
            let msg = crate::error::panic_message(&*err);
            assert!(msg.contains("kernel `k` argument `x`: index 3 is out of range"), "{msg}");
            // A length beyond the mapped extent is refused.
            assert!(SharedSlice::<f32>::new(&l, "k", "x", 0, 2).unwrap_err().contains("only 3 are mapped"));
        }
        assert_eq!(v, [1.0, 2.0, 4.0]);
    }

    #[test]
    fn sixteen_bit_floats_are_loaded_and_stored_whole_by_their_bits() {
        use half::{bf16, f16};
        let mut b = [bf16::from_f32(1.5), bf16::NAN, bf16::from_bits(0x8001)];
        let mut h = [f16::from_f32(-2.25), f16::from_bits(0x7c01), f16::ZERO];
        let args = [
            KernelArg::Ptr { addr: b.as_mut_ptr() as u64, bytes: Some(6) },
            KernelArg::Ptr { addr: h.as_mut_ptr() as u64, bytes: Some(6) },
            KernelArg::Scalar(Scalar::U64(3)),
            KernelArg::Scalar(Scalar::U32(0x3f80)),
            KernelArg::Scalar(Scalar::U32(0x1_0000)),
        ];
        let l = HostLaunch::new("k", 3, &args);
        {
            let (sb, sh) = (
                SharedSlice::<bf16>::new(&l, "k", "b", 0, 2).unwrap(),
                SharedSlice::<f16>::new(&l, "k", "h", 1, 2).unwrap(),
            );
            // Payloads and signs survive a load and a store: no arithmetic in between.
            sb.set(0, sb.get(2));
            sh.set(2, sh.get(1));
            sb.set(1, sb.get(0) * bf16::from_f32(-2.0));
            assert!(std::panic::catch_unwind(|| sb.get(3)).is_err());
        }
        let doubled = bf16::from_f32(bf16::from_bits(0x8001).to_f32() * -2.0).to_bits();
        assert_eq!(b.map(bf16::to_bits), [0x8001, doubled, 0x8001]);
        assert_eq!(h.map(f16::to_bits), [f16::from_f32(-2.25).to_bits(), 0x7c01, 0x7c01]);
        // A scalar's bits come in a 32-bit word; more than 16 bits is a bad argument.
        assert_eq!(bits16_arg(&l, 3), Ok(0x3f80));
        assert!(bits16_arg(&l, 4).unwrap_err().contains("not the bits of a 16-bit float"));
    }

    #[test]
    fn a_store_log_names_two_items_storing_one_element() {
        let mut v = [0u32; 4];
        let log = StoreLog::new(true, 4);
        let s = SharedSlice::team_local(&mut v[..], "k", "x").logged(&log);
        set_item(3);
        s.set(1, 5);
        s.set(1, 6); // the same item again: fine
        set_item(8);
        let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.set(1, 7))).unwrap_err();
        let msg = crate::error::panic_message(&*e);
        assert!(msg.contains("work items 3 and 8 both store element 1"), "{msg}");
        // Past the limit, or off, nothing is logged.
        assert!(!StoreLog::new(false, 4).on() && !StoreLog::new(true, STORE_LOG_LIMIT + 1).on());
    }

    #[test]
    fn views_are_apart_unless_a_written_one_overlaps_another() {
        let (x, y, z) = ((1000, 400), (1400, 400), (1200, 400));
        assert!(views_apart(&[(x, false), (y, true)]), "adjacent");
        assert!(!views_apart(&[(x, false), (x, true)]), "the same range twice, one written");
        assert!(!views_apart(&[(x, false), (z, true)]) && !views_apart(&[(z, true), (y, false)]));
        assert!(views_apart(&[(x, false), (z, false)]), "two reads may overlap");
        assert!(views_apart(&[(x, true), ((1100, 0), false)]), "an empty view overlaps nothing");
        assert!(views_apart(&[]));
    }

    #[test]
    fn own_rows_stay_apart_and_inside_the_view() {
        // 4 rows of 3 columns from (1, 1) in rows of width 5: elements 6..=23.
        assert!(own_rows_fit(1, 4, 1, 3, 5, 24));
        assert!(!own_rows_fit(1, 4, 1, 3, 5, 23), "past the view");
        assert!(!own_rows_fit(1, 4, 3, 3, 5, 100), "columns past the width: rows would overlap");
        assert!(own_rows_fit(7, 100, 0, 1, 1, 107) && !own_rows_fit(7, 100, 0, 1, 1, 106), "1-D");
        assert!(own_rows_fit(0, 0, 0, 3, 1, 0), "nothing launched");
        assert!(!own_rows_fit(usize::MAX / 2, 4, 0, 1, 4, usize::MAX), "overflow");
        assert!(!own_rows_fit(usize::MAX, 2, 0, 1, 1, usize::MAX), "rows past usize");
    }

    #[test]
    fn stores_beside_a_tasks_rows_go_to_rows_no_task_owns() {
        assert!(rows_outside(&[0, 9], 1, 8) && !rows_outside(&[0, 8], 1, 8) && !rows_outside(&[1], 1, 8));
        assert!(rows_outside(&[], 1, 8) && rows_outside(&[3], 4, 0));
        // Rows 1..3 of 4 columns owned by one task; a store to row 0 goes beside.
        let mut v = [0u32; 16];
        let args = [
            KernelArg::Ptr { addr: v.as_mut_ptr() as u64, bytes: Some(64) },
            KernelArg::Scalar(Scalar::U64(16)),
        ];
        let l = HostLaunch::new("k", 8, &args);
        let s = SharedSlice::<u32>::new(&l, "k", "y", 0, 1).unwrap();
        {
            // SAFETY: elements 4..12 are this task's; row 0 and 3 are no task's.
            let own = unsafe { s.own(4, 12) }.with_beside(s);
            own.set(5, 1);
            own.set(1, 2);
            own.set(13, 3);
            let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| own.set(16, 4))).unwrap_err();
            assert!(crate::error::panic_message(&*e).contains("index 16 is out of range"));
        }
        assert_eq!((v[5], v[1], v[13]), (1, 2, 3));
    }

    #[test]
    fn own_views_read_and_write_only_their_tasks_elements() {
        let mut v: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let args = [
            KernelArg::Ptr { addr: v.as_mut_ptr() as u64, bytes: Some(32) },
            KernelArg::Scalar(Scalar::U64(8)),
        ];
        let l = HostLaunch::new("k", 8, &args);
        let s = SharedSlice::<f32>::new(&l, "k", "y", 0, 1).unwrap();
        assert!(views_apart(&[(s.span(), true)]));
        {
            // SAFETY: the two tasks' elements are apart; nothing else touches `v`.
            let (a, b) = unsafe { (s.own(0, 4), s.own(4, 8)) };
            for i in 0..4 {
                a.set(i, a.get(i) * 2.0);
                b.set(i + 4, b.get(i + 4) + 1.0);
            }
            assert_eq!(a.len(), 8);
            let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.get(4))).unwrap_err();
            assert!(crate::error::panic_message(&*e).contains("argument `y`: index 4 is out of range"));
            // SAFETY: read-only while `a` and `b` are not used.
            let r = unsafe { s.plain() };
            assert_eq!(r.get(7), 8.0);
            assert!(std::panic::catch_unwind(|| r.get(8)).is_err());
            // A part reads as the whole view, only its own elements.
            let p = r.part(2, 5);
            assert_eq!((p.get(2), p.get(4), p.len()), (4.0, 5.0, 8));
            assert!(
                std::panic::catch_unwind(|| p.get(5)).is_err()
                    && std::panic::catch_unwind(|| p.get(1)).is_err()
            );
            assert!(std::panic::catch_unwind(|| r.part(6, 9)).is_err());
        }
        assert_eq!(v, [0.0, 2.0, 4.0, 6.0, 5.0, 6.0, 7.0, 8.0]);
        let e = std::panic::catch_unwind(|| {
            // SAFETY: refused before any access.
            unsafe { s.own(4, 9) };
        });
        assert!(e.is_err(), "a range past the view is refused");
    }

    #[test]
    fn windows_are_runs_inside_the_view_or_nothing() {
        let mut v: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let args = [
            KernelArg::Ptr { addr: v.as_mut_ptr() as u64, bytes: Some(48) },
            KernelArg::Scalar(Scalar::U64(12)),
        ];
        let l = HostLaunch::new("k", 12, &args);
        let s = SharedSlice::<f32>::new(&l, "k", "y", 0, 1).unwrap();
        {
            // SAFETY: read only while `r` and its windows live.
            let r = unsafe { s.plain() };
            let w = r.window(3, 4).unwrap();
            assert_eq!((w.get(0), w.get(3), w.len()), (3.0, 6.0, 12));
            assert!(std::panic::catch_unwind(|| w.get(4)).is_err(), "only the run");
            assert!(
                r.window(9, 4).is_none() && r.window(usize::MAX, 2).is_none() && r.window(12, 0).is_some()
            );
            // A part's window is indexed as the whole view, inside the part only.
            let p = r.part(2, 8);
            assert_eq!(p.window(4, 3).unwrap().get(2), 6.0);
            assert!(p.window(1, 2).is_none() && p.window(6, 3).is_none());
        }
        {
            // SAFETY: this task's elements 4..10, nothing else touches `v`.
            let own = unsafe { s.own(4, 10) }.with_beside(s);
            let w = own.window(5, 3).unwrap();
            w.set(0, -1.0);
            w.set(2, w.get(2) * 2.0);
            assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.set(3, 0.0))).is_err());
            assert!(own.window(8, 3).is_none() && own.window(2, 3).is_none());
        }
        assert_eq!(&v[4..9], [4.0, -1.0, 6.0, 14.0, 8.0]);
    }

    #[test]
    fn an_unknown_extent_is_refused() {
        let mut v = [0u64; 2];
        let args =
            [KernelArg::Ptr { addr: v.as_mut_ptr() as u64, bytes: None }, KernelArg::Scalar(Scalar::U64(2))];
        let l = HostLaunch::new("k", 2, &args);
        assert!(SharedSlice::<u64>::new(&l, "k", "y", 0, 1).unwrap_err().contains("extent is unknown"));
    }

    #[test]
    fn integer_elements_keep_their_bits() {
        let mut v = [-5i32, 0];
        let args = [
            KernelArg::Ptr { addr: v.as_mut_ptr() as u64, bytes: Some(8) },
            KernelArg::Scalar(Scalar::U64(2)),
        ];
        let l = HostLaunch::new("k", 2, &args);
        let s = SharedSlice::<i32>::new(&l, "k", "v", 0, 1).unwrap();
        s.set(1, s.get(0) * 3);
        assert_eq!(s.get(1), -15);
        assert!(bool_arg(&HostLaunch::new("k", 0, &[KernelArg::Scalar(Scalar::U32(1))]), 0).unwrap());
    }
}
