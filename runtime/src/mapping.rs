//! The safe Rust API: maps that borrow host slices, device views, kernel launches.
//!
//! A [`Map`] borrows its host slice (shared for `to`/`alloc`, exclusive for `from`/`tofrom`)
//! for as long as any view made from it lives, so host memory cannot be freed or touched
//! while it is mapped, and a `from` copy-back never races a host access: the borrow
//! checker rejects it. A [`DeviceSlice`] names a mapped host range on one device; a launch
//! translates it through the present table at the time of the launch, so a view used after
//! its region ended is an error, never a dangling device pointer.
//!
//! ```
//! use offload::{map, HostLaunch, Kernel, Runtime};
//!
//! fn axpy(l: &HostLaunch<'_>) -> Result<(), String> {
//!     let a: f32 = l.scalar(0)?;
//!     // SAFETY: arguments 1 and 2 are distinct mapped ranges of n f32.
//!     let (x, y) = unsafe { (l.slice::<f32>(1, l.n())?, l.slice_mut::<f32>(2, l.n())?) };
//!     y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
//!     Ok(())
//! }
//! static AXPY: Kernel = Kernel::new("axpy").with_host(axpy);
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let gpu = rt.device(0)?;
//! let x = vec![1.0f32; 1000];
//! let mut y = vec![0.0f32; 1000];
//! gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| {
//!     for _ in 0..100 {
//!         gpu.launch(&AXPY, 1000, (2.0f32, x, y))?;
//!     }
//!     Ok(())
//! })?;
//! assert!(y.iter().all(|&v| v == 200.0));
//! # Ok::<(), offload::Error>(())
//! ```

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut, RangeBounds};
use std::ptr::NonNull;

use crate::data_env::{MapItem, MapType, UpdateDirection};
use crate::error::{Error, HostRange, Result};
use crate::kernel::LaunchArg;
use crate::kernel::{DeviceCopy, Kernel, KernelScalar};
use crate::runtime::Runtime;

/// One map clause over a borrowed host slice. Made by the functions of [`crate::map`].
#[derive(Debug)]
#[must_use = "a map does nothing until given to a construct"]
pub struct Map<'a, T> {
    item: MapItem,
    writable: bool,
    _borrow: PhantomData<&'a [T]>,
}

impl<'a, T: DeviceCopy> Map<'a, T> {
    pub(crate) fn shared(s: &'a [T], map_type: MapType) -> Self {
        Self { item: MapItem::slice(s, map_type), writable: false, _borrow: PhantomData }
    }

    pub(crate) fn exclusive(s: &'a mut [T], map_type: MapType) -> Self {
        Self { item: MapItem::slice_mut(s, map_type), writable: true, _borrow: PhantomData }
    }

    /// Adds the `always` modifier.
    pub fn always(mut self) -> Self {
        self.item.map_type = self.item.map_type.always();
        self
    }

    /// Adds the `present` modifier.
    pub fn present(mut self) -> Self {
        self.item.map_type = self.item.map_type.present();
        self
    }

    /// Adds the `hold` modifier (LLVM's `ompx_hold`): the map moves the entry's hold count,
    /// so no `exit data` removes the entry while the region lasts (regions only:
    /// [`Device::data`], [`Device::target`]).
    pub fn hold(mut self) -> Self {
        self.item.map_type = self.item.map_type.hold();
        self
    }

    /// The map item in the OpenMP shape.
    pub fn item(&self) -> MapItem {
        self.item
    }
}

/// What an exit through a view does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ViewExit {
    /// `from`: the view's map copies back into an exclusive borrow it carries.
    CopyBack,
    /// `release`: nothing to copy back (a shared borrow, a `to` map, a distributed array's
    /// overlapping rows, which its `gather` copies back once).
    Release,
    /// Refused: the view's mapping belongs to a guard ([`crate::Mapped`],
    /// [`crate::Association`]), which ends it itself.
    Refuse,
}

/// A mapped host range as a kernel argument on one device.
#[derive(Debug)]
pub struct DeviceSlice<'a, T> {
    device: usize,
    host: usize,
    len: usize,
    writable: bool,
    /// What an exit through the view ([`crate::NowaitScope::exit`]) does.
    pub(crate) on_exit: ViewExit,
    _borrow: PhantomData<&'a [T]>,
}

impl<T> Clone for DeviceSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceSlice<'_, T> {}

impl<'a, T> DeviceSlice<'a, T> {
    /// The device this view belongs to.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the view comes from an exclusive borrow (`from`/`tofrom` maps, runtime-owned
    /// buffers, distributed arrays), so the device's data may be copied back into it.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Whether an exit through this view ([`crate::NowaitScope::exit`]) copies the device's
    /// data back: views of `from` and `tofrom` maps, except a [`crate::Mapped`] guard's
    /// (the guard copies back itself) and a [`crate::partition::DistributedArray`]'s (their
    /// halos overlap their neighbours' rows; its `gather` copies each row back once).
    pub fn copies_back(&self) -> bool {
        self.on_exit == ViewExit::CopyBack
    }

    /// The host range the view names.
    pub fn host_range(&self) -> HostRange {
        HostRange::new(self.host, self.len * std::mem::size_of::<T>())
    }

    /// A view of part of this one (a kernel then sees the device copy of that part). Bounds
    /// outside the view, or whose `+ 1` overflows (`..=usize::MAX`), are errors.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<Self> {
        use std::ops::Bound::*;
        const ROUTINE: &str = "DeviceSlice::slice";
        let next = |b: usize, which: &str| {
            b.checked_add(1).ok_or_else(|| Error::Overflow {
                routine: ROUTINE,
                what: format!(
                    "device {}: {which} bound {b} + 1 (a view of {} elements)",
                    self.device, self.len
                ),
            })
        };
        let start = match range.start_bound() {
            Included(&s) => s,
            Excluded(&s) => next(s, "excluded start")?,
            Unbounded => 0,
        };
        let end = match range.end_bound() {
            Included(&e) => next(e, "inclusive end")?,
            Excluded(&e) => e,
            Unbounded => self.len,
        };
        let host = start
            .checked_mul(std::mem::size_of::<T>())
            .and_then(|off| self.host.checked_add(off))
            .filter(|_| start <= end && end <= self.len);
        let Some(host) = host else {
            return Err(Error::InvalidArgument {
                routine: ROUTINE,
                what: format!(
                    "device {}: {start}..{end} is outside a view of {} elements ({}); expected a range \
                     within 0..{}",
                    self.device,
                    self.len,
                    self.host_range(),
                    self.len
                ),
            });
        };
        Ok(Self { host, len: end - start, ..*self })
    }

    /// The device address of the view's first element (`None` when not mapped): C's
    /// `use_device_ptr` / `use_device_addr` inside a region.
    pub fn device_addr(&self, rt: &Runtime) -> Result<Option<u64>> {
        rt.mapped_ptr(self.host, self.device)
    }

    /// The view as the base pointer of an array whose element `offset` is the view's first
    /// (C maps `arr[ioff:n]` and indexes `arr[i + ioff]`): the kernel receives the device
    /// address of the array's base, `offset` elements before the view's. Elements before
    /// the view are not mapped: the kernel must not touch them, as in C.
    pub fn based_at(&self, offset: usize) -> Result<BasedSlice<'a, T>> {
        let base = offset.checked_mul(std::mem::size_of::<T>()).and_then(|b| self.host.checked_sub(b));
        match base {
            Some(base) => Ok(BasedSlice { view: *self, base }),
            None => Err(Error::Overflow {
                routine: "DeviceSlice::based_at",
                what: format!("device {}: {offset} elements before {}", self.device, self.host_range()),
            }),
        }
    }
}

/// A view passed as its array's base pointer; see [`DeviceSlice::based_at`].
#[derive(Debug)]
pub struct BasedSlice<'a, T> {
    view: DeviceSlice<'a, T>,
    base: usize,
}

impl<T> Clone for BasedSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for BasedSlice<'_, T> {}

// SAFETY: the section is its view's range, borrowed for the view's lifetime; the base is
// only an address the kernel computes from, as in C.
unsafe impl<T> KernelArgument for BasedSlice<'_, T> {
    fn launch_arg(&self, device: usize, index: usize, kernel: &Kernel) -> Result<LaunchArg> {
        self.view.launch_arg(device, index, kernel)?;
        Ok(LaunchArg::MappedBase { base: self.base, section: self.view.host })
    }

    fn view_range(&self) -> Option<HostRange> {
        Some(self.view.host_range())
    }
}

// SAFETY: reports its view's shared borrow.
unsafe impl<T> SharedView for BasedSlice<'_, T> {
    fn shared_range(&self) -> Option<HostRange> {
        self.view.shared_range()
    }
}

/// A view of `s` on `device` (for views the runtime hands out itself, e.g. distributed
/// arrays); `writable` when the holder has exclusive access to `s`.
pub(crate) fn view_of<T>(s: &[T], device: usize, writable: bool) -> DeviceSlice<'_, T> {
    DeviceSlice {
        device,
        host: s.as_ptr() as usize,
        len: s.len(),
        writable,
        on_exit: if writable { ViewExit::CopyBack } else { ViewExit::Release },
        _borrow: PhantomData,
    }
}

/// A raw device address as a kernel argument (e.g. a neighbour's halo row, for peer
/// stores), or null.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePtr(u64);

impl DevicePtr {
    /// The null pointer.
    pub const NULL: Self = Self(0);

    /// A kernel argument that is the device address `addr`.
    ///
    /// # Safety
    /// Whatever the kernel does through it must be valid: memory of the launching device,
    /// or of a device it has peer access to, that lives through the launch. (On host
    /// devices device memory is host memory, so this is a host-memory contract.)
    pub unsafe fn new(addr: u64) -> Self {
        Self(addr)
    }

    /// The address.
    pub fn addr(self) -> u64 {
        self.0
    }
}

// SAFETY: a `DevicePtr` is made only by the unsafe `DevicePtr::new`, whose caller vouches
// for the address.
unsafe impl KernelArgument for DevicePtr {
    fn launch_arg(&self, _: usize, _: usize, _: &Kernel) -> Result<LaunchArg> {
        Ok(LaunchArg::Device(self.0))
    }
}

// SAFETY: a device address is no view of host memory.
unsafe impl SharedView for DevicePtr {
    fn shared_range(&self) -> Option<HostRange> {
        None
    }
}

/// A list of maps given to one construct: a [`Map`], a tuple of lists, or a `Vec` of maps.
///
/// # Safety
/// An implementation is trusted by the constructs that copy through its items: every
/// range `items` and `exit_items` name must stay valid (and, for kinds that copy to the
/// host, and every range `exclusive_ranges` names, exclusively borrowed) for `'a`, and
/// `views` must name only those ranges. The crate's own implementations (a [`Map`],
/// tuples and `Vec`s of them) are the ones to use.
pub unsafe trait MapList<'a> {
    /// The device views the construct's body receives, in the same shape.
    type Views;
    /// Appends the map items in list order.
    fn items(&self, out: &mut Vec<MapItem>);
    /// Appends, in list order, the items that end what [`MapList::items`] began with
    /// `target exit data`: `from` (keeping `always`) for maps that copy back, `release`
    /// for the others.
    fn exit_items(&self, out: &mut Vec<MapItem>);
    /// Appends the host ranges borrowed exclusively.
    fn exclusive_ranges(&self, out: &mut Vec<HostRange>);
    /// The views on `device`; `by_guard` for views of a [`crate::Mapped`] guard, which an
    /// exit through them ([`crate::NowaitScope::exit`]) refuses: the guard ends its mapping.
    fn views(&self, device: usize, by_guard: bool) -> Self::Views;
}

// SAFETY: a `Map` borrows its slice for 'a (exclusively for the kinds that copy back).
unsafe impl<'a, T: DeviceCopy> MapList<'a> for Map<'a, T> {
    type Views = DeviceSlice<'a, T>;
    fn items(&self, out: &mut Vec<MapItem>) {
        out.push(self.item);
    }
    fn exit_items(&self, out: &mut Vec<MapItem>) {
        let t = self.item.map_type;
        let kind = if t.copies_out() { MapType::FROM } else { MapType::RELEASE };
        let kind = if t.always && t.copies_out() { kind.always() } else { kind };
        out.push(MapItem { range: self.item.range, map_type: kind });
    }
    fn exclusive_ranges(&self, out: &mut Vec<HostRange>) {
        if self.writable {
            out.push(self.item.range);
        }
    }
    fn views(&self, device: usize, by_guard: bool) -> Self::Views {
        let copies_back = self.writable && self.item.map_type.copies_out();
        DeviceSlice {
            device,
            host: self.item.range.begin,
            len: self.item.range.bytes / std::mem::size_of::<T>().max(1),
            writable: self.writable,
            on_exit: match (by_guard, copies_back) {
                (true, _) => ViewExit::Refuse,
                (false, true) => ViewExit::CopyBack,
                (false, false) => ViewExit::Release,
            },
            _borrow: PhantomData,
        }
    }
}

// SAFETY: a `Map` borrows its slice for 'a (exclusively for the kinds that copy back).
unsafe impl<'a, T: DeviceCopy> MapList<'a> for Vec<Map<'a, T>> {
    type Views = Vec<DeviceSlice<'a, T>>;
    fn items(&self, out: &mut Vec<MapItem>) {
        out.extend(self.iter().map(|m| m.item));
    }
    fn exit_items(&self, out: &mut Vec<MapItem>) {
        self.iter().for_each(|m| m.exit_items(out));
    }
    fn exclusive_ranges(&self, out: &mut Vec<HostRange>) {
        self.iter().for_each(|m| m.exclusive_ranges(out));
    }
    fn views(&self, device: usize, by_guard: bool) -> Self::Views {
        self.iter().map(|m| m.views(device, by_guard)).collect()
    }
}

macro_rules! map_list_tuple {
    ($($n:ident : $i:tt),+) => {
        // SAFETY: a `Map` borrows its slice for 'a (exclusively for the kinds that copy back).
        unsafe impl<'a, $($n: MapList<'a>),+> MapList<'a> for ($($n,)+) {
            type Views = ($($n::Views,)+);
            fn items(&self, out: &mut Vec<MapItem>) {
                $(self.$i.items(out);)+
            }
            fn exit_items(&self, out: &mut Vec<MapItem>) {
                $(self.$i.exit_items(out);)+
            }
            fn exclusive_ranges(&self, out: &mut Vec<HostRange>) {
                $(self.$i.exclusive_ranges(out);)+
            }
            fn views(&self, device: usize, by_guard: bool) -> Self::Views {
                ($(self.$i.views(device, by_guard),)+)
            }
        }
    };
}
map_list_tuple!(A: 0);
map_list_tuple!(A: 0, B: 1);
map_list_tuple!(A: 0, B: 1, C: 2);
map_list_tuple!(A: 0, B: 1, C: 2, D: 3);
map_list_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4);
map_list_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5);
map_list_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6);
map_list_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7);

/// One kernel argument of the safe API: a scalar or a [`DeviceSlice`].
///
/// # Safety
/// Launches trust the argument: a `LaunchArg::Mapped` or `MappedBase` must name host
/// memory the argument borrows (exclusively when a kernel may write it), a
/// `LaunchArg::Device` device memory it keeps alive, and `view_range` its true extent.
pub unsafe trait KernelArgument {
    /// The argument in the OpenMP launch shape, checked against the launching device.
    fn launch_arg(&self, device: usize, index: usize, kernel: &Kernel) -> Result<LaunchArg>;

    /// The host range a view names (so a launch on the initial device knows its extent).
    fn view_range(&self) -> Option<HostRange> {
        None
    }
}

// SAFETY: a value names no memory.
unsafe impl<T: KernelScalar> KernelArgument for T {
    fn launch_arg(&self, _: usize, _: usize, _: &Kernel) -> Result<LaunchArg> {
        Ok(LaunchArg::Value(self.into_scalar()))
    }
}

// SAFETY: a view names the range its map (or guard, buffer) borrows for 'a, writable only
// when that borrow is exclusive; its extent is that range's.
unsafe impl<T> KernelArgument for DeviceSlice<'_, T> {
    fn launch_arg(&self, device: usize, index: usize, kernel: &Kernel) -> Result<LaunchArg> {
        if self.device != device {
            return Err(Error::KernelArgument {
                kernel: kernel.name(),
                index,
                what: format!("a view of device {} passed to a launch on device {device}", self.device),
            });
        }
        Ok(LaunchArg::Mapped(self.host))
    }

    fn view_range(&self) -> Option<HostRange> {
        Some(self.host_range())
    }
}

/// The arguments of a launch: a tuple of [`KernelArgument`]s.
///
/// # Safety
/// As [`KernelArgument`] for every argument, and `shared_views` must report every view of
/// a shared borrow.
pub unsafe trait KernelArgs {
    /// Converts every argument for a launch of `kernel` on `device`.
    fn launch_args(&self, device: usize, kernel: &Kernel) -> Result<Vec<LaunchArg>>;
    /// Views among the arguments that borrow host memory shared, by position.
    fn shared_views(&self) -> Vec<(usize, HostRange)>;
    /// The bytes each argument's view spans, by position (`None` for scalars and raw
    /// pointers); empty when unknown.
    fn view_extents(&self) -> Vec<Option<usize>> {
        Vec::new()
    }
}

/// Whether an argument is a view of a shared borrow, and of which range.
///
/// # Safety
/// `shared_range` must report the range of every view of a shared borrow (the initial
/// device gives those private copies, so a kernel cannot write through `&`).
pub unsafe trait SharedView {
    /// `Some(range)` for views of shared borrows.
    fn shared_range(&self) -> Option<HostRange>;
}

// SAFETY: a value is no view.
unsafe impl<T: KernelScalar> SharedView for T {
    fn shared_range(&self) -> Option<HostRange> {
        None
    }
}

// SAFETY: reports the view's range exactly when its borrow is shared.
unsafe impl<T> SharedView for DeviceSlice<'_, T> {
    fn shared_range(&self) -> Option<HostRange> {
        (!self.writable).then(|| self.host_range())
    }
}

macro_rules! kernel_args_tuple {
    ($($n:ident : $i:tt),*) => {
        // SAFETY: each argument is one (a checked implementation), reported in order.
        unsafe impl<$($n: KernelArgument + SharedView),*> KernelArgs for ($($n,)*) {
            #[allow(unused_variables, unused_mut)]
            fn launch_args(&self, device: usize, kernel: &Kernel) -> Result<Vec<LaunchArg>> {
                Ok(vec![$(self.$i.launch_arg(device, $i, kernel)?),*])
            }
            #[allow(unused_mut)]
            fn shared_views(&self) -> Vec<(usize, HostRange)> {
                let mut v = Vec::new();
                $(if let Some(r) = self.$i.shared_range() { v.push(($i, r)); })*
                v
            }
            fn view_extents(&self) -> Vec<Option<usize>> {
                vec![$(self.$i.view_range().map(|r| r.bytes)),*]
            }
        }
    };
}
kernel_args_tuple!();
kernel_args_tuple!(A: 0);
kernel_args_tuple!(A: 0, B: 1);
kernel_args_tuple!(A: 0, B: 1, C: 2);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12, N: 13);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12, N: 13, O: 14);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12, N: 13, O: 14, P: 15);

/// One device (or the initial device) of a runtime, for the safe API.
#[derive(Clone, Copy, Debug)]
pub struct Device<'rt> {
    rt: &'rt Runtime,
    number: usize,
}

impl Runtime {
    /// Device `number` for the safe API; `initial_device()` gives the host fallback.
    /// Under `OMP_TARGET_OFFLOAD=mandatory` with no device, every number fails with
    /// [`crate::Error::OffloadMandatory`] (what the handle is for is device constructs).
    pub fn device(&self, number: usize) -> Result<Device<'_>> {
        self.construct_target(number)?;
        Ok(Device { rt: self, number })
    }

    /// The `if` clause: device `number` when `condition` holds, else the initial device
    /// (regions run on the host, data constructs do nothing), as OpenMP's `if(false)`.
    pub fn device_if(&self, condition: bool, number: usize) -> Result<Device<'_>> {
        let d = self.device(number)?;
        if condition {
            Ok(d)
        } else {
            self.device(self.initial_device())
        }
    }
}

impl<'rt> Device<'rt> {
    /// The device number.
    pub fn number(&self) -> usize {
        self.number
    }

    /// The runtime.
    pub fn runtime(&self) -> &'rt Runtime {
        self.rt
    }

    /// `#pragma omp target data map(...)`: maps `maps`, runs `body` with their device
    /// views, then unmaps them (copying `from` ranges back) whether `body` failed or not.
    ///
    /// A panic of `body` ends the region as an error would (its maps are ended, so
    /// nothing it mapped stays mapped), then resumes: `body` is the caller's own code.
    #[track_caller]
    pub fn data<'a, L: MapList<'a>, R>(
        &self,
        maps: L,
        body: impl FnOnce(L::Views) -> Result<R>,
    ) -> Result<R> {
        let mut items = Vec::new();
        maps.items(&mut items);
        // SAFETY: every item borrows its host slice for 'a (shared for reads, exclusive for
        // `from` kinds), and `maps` is alive until the end of this function.
        unsafe { self.rt.target_data_begin(self.number, &items)? };
        // A panic of `body` is held until the region has ended.
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(maps.views(self.number, false))));
        // SAFETY: as above.
        let end = unsafe { self.rt.target_data_end(self.number, &items) };
        drop(maps);
        let r = r.unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        end.map(|()| r)
    }

    /// `#pragma omp target enter data` over borrowed slices; the returned guard ends it
    /// (`target exit data`: `from` for maps that copy back, `release` for the others) when
    /// dropped or [`Mapped::exit`](crate::Mapped::exit)ed, so the slices stay borrowed for as long as they are
    /// mapped. `map::from` enters as `alloc` (and copies back at the end).
    ///
    /// ```
    /// use offload::{map, Runtime};
    /// let rt = Runtime::builder().host_devices(1).build()?;
    /// let gpu = rt.device(0)?;
    /// let (x, mut y) = (vec![1u8; 64], vec![0u8; 64]);
    /// let entered = gpu.enter_data((map::to(&x), map::from(&mut y)))?;
    /// let (xv, _yv) = entered.views();
    /// assert!(rt.is_present(x.as_ptr() as usize, 0)? && xv.len() == 64);
    /// entered.exit()?; // or drop it
    /// assert!(rt.live_mappings().is_empty());
    /// # Ok::<(), offload::Error>(())
    /// ```
    #[track_caller]
    pub fn enter_data<'a, L: MapList<'a>>(&self, maps: L) -> Result<crate::Mapped<'rt, 'a, L>> {
        crate::Mapped::enter(*self, maps)
    }

    /// `#pragma omp target data map(...)` as a guard: the region ends (its maps' exit
    /// half) when the guard is dropped or [`Mapped::exit`](crate::Mapped::exit)ed. Unlike [`Device::data`]'s
    /// body, the guard lends the host copy of exclusively borrowed maps
    /// ([`Mapped::host_mut`](crate::Mapped::host_mut)) for the `target update` pattern.
    #[track_caller]
    pub fn data_region<'a, L: MapList<'a>>(&self, maps: L) -> Result<crate::Mapped<'rt, 'a, L>> {
        crate::Mapped::region(*self, maps)
    }

    /// `#pragma omp target exit data` over borrowed slices (`from` needs `&mut`).
    #[track_caller]
    pub fn exit_data<'a, L: MapList<'a>>(&self, maps: L) -> Result<()> {
        let mut items = Vec::new();
        maps.items(&mut items);
        // SAFETY: `from` kinds are only made from exclusive borrows, held by `maps`.
        unsafe { self.rt.exit_data(self.number, &items) }
    }

    /// `#pragma omp target update to(...)`.
    #[track_caller]
    pub fn update_to<T: DeviceCopy>(&self, host: &[T]) -> Result<()> {
        // SAFETY: `host` is borrowed for reads during the call.
        unsafe { self.rt.update(self.number, UpdateDirection::To, &[(HostRange::of(host), false)]) }
    }

    /// `#pragma omp target update from(...)`.
    #[track_caller]
    pub fn update_from<T: DeviceCopy>(&self, host: &mut [T]) -> Result<()> {
        // SAFETY: `host` is borrowed exclusively during the call; any bits are valid `T`.
        unsafe { self.rt.update(self.number, UpdateDirection::From, &[(HostRange::of(host), false)]) }
    }

    /// Gets `kernel` ready on this device (GPUs compile and load it on first use; this
    /// does it now, e.g. before a timed run). A no-op on host devices.
    pub fn prepare(&self, kernel: &Kernel) -> Result<()> {
        match self.rt.target(self.number)? {
            crate::device_state::Target::Device(d) => d.backend.prepare(kernel),
            crate::device_state::Target::Initial => Ok(()),
        }
    }

    /// Runs `kernel` over `n` work items; views among `args` must be mapped on this device
    /// (a target region whose arguments are all present).
    #[track_caller]
    pub fn launch<A: KernelArgs>(&self, kernel: &Kernel, n: usize, args: A) -> Result<()> {
        self.launch_at(kernel, n, args, std::panic::Location::caller())
    }

    /// [`Device::launch`] as called from `at` (for the trace's construct line).
    pub(crate) fn launch_at<A: KernelArgs>(
        &self,
        kernel: &Kernel,
        n: usize,
        args: A,
        at: &'static std::panic::Location<'static>,
    ) -> Result<()> {
        let mut launch_args = args.launch_args(self.number, kernel)?;
        // On the initial device views are host memory itself; a view of a shared borrow
        // gets a private copy so that a kernel writing to it cannot write through `&`.
        // 16-byte words: the copy is aligned for every element type up to 16 bytes, and an
        // empty view still gets a real, aligned address.
        let mut copies: Vec<Vec<u128>> = Vec::new();
        if self.number == self.rt.initial_device() {
            for (i, range) in args.shared_views() {
                let mut words = vec![0u128; range.bytes.div_ceil(16).max(1)];
                // SAFETY: the view borrows `range` shared for its lifetime; `words` holds at
                // least `range.bytes` bytes and is a separate allocation.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        range.begin as *const u8,
                        words.as_mut_ptr().cast::<u8>(),
                        range.bytes,
                    )
                };
                copies.push(words);
                let copy = copies.last().map_or(0, |c| c.as_ptr() as usize);
                launch_args[i] = match launch_args[i] {
                    // The copy's base is as far before it as the view's base is.
                    LaunchArg::MappedBase { base, section } => {
                        LaunchArg::MappedBase { base: copy.wrapping_sub(section - base), section: copy }
                    }
                    _ => LaunchArg::Mapped(copy),
                };
            }
        }
        if self.number == self.rt.initial_device() {
            // Views are host memory (exclusive borrows, or the copies above, of the same
            // length): their extents are known, so host kernels can be bounds-checked.
            return self.rt.run_on_host(kernel, n, &launch_args, &args.view_extents());
        }
        // SAFETY: no map list; mapped arguments are translated through the present table
        // (device memory of the right extent).
        unsafe {
            self.rt.target_launch_at(
                self.number,
                kernel,
                n,
                &[],
                &launch_args,
                crate::runtime::ArgShape::Full,
                at,
            )
        }
    }

    /// `C = alpha op(A) op(B) + beta C` (column-major, as BLAS) on mapped views: cuBLAS on
    /// GPUs (no TF32), a parallel product on host devices. Each view must span its
    /// operand.
    pub fn sgemm(
        &self,
        g: &crate::device::Sgemm,
        a: DeviceSlice<'_, f32>,
        b: DeviceSlice<'_, f32>,
        c: DeviceSlice<'_, f32>,
    ) -> Result<()> {
        let (ea, eb, ec) = g.extents()?;
        let d = match self.rt.settled(self.number)? {
            crate::device_state::Target::Device(d) => d,
            crate::device_state::Target::Initial => {
                return Err(Error::InvalidArgument {
                    routine: "sgemm",
                    what: "the initial device has no sgemm; use a host device".into(),
                })
            }
        };
        // The operands stay allocated until the product is done.
        let mut in_use = crate::device_state::BlocksInUse::new(d);
        let mut addrs = [0u64; 3];
        for (i, (v, need)) in [(a, ea), (b, eb), (c, ec)].into_iter().enumerate() {
            if v.device() != self.number || v.len() < need {
                return Err(Error::InvalidArgument {
                    routine: "sgemm",
                    what: format!(
                        "operand {i}: a view of {} elements on device {} for {need} elements on device {}",
                        v.len(),
                        v.device(),
                        self.number
                    ),
                });
            }
            // The whole operand must lie in one mapped range (a view may name more of its
            // buffer than is mapped).
            let span = HostRange::new(v.host_range().begin, need * std::mem::size_of::<f32>());
            let mut table = d.table.lock();
            let (addr, block) = table
                .containing(span.begin)
                .filter(|e| e.range.contains(&span))
                .map(|e| (e.translate(span.begin), e.device_addr))
                .ok_or(Error::NotPresent { device: self.number, range: span, what: "an sgemm operand" })?;
            in_use.pin(&mut table, block);
            addrs[i] = addr;
        }
        d.backend.sgemm(g, addrs[0], addrs[1], addrs[2])
    }

    /// `#pragma omp target map(...)`: a launch with its own map list; `args` builds the
    /// kernel's arguments from the maps' views.
    #[track_caller]
    pub fn target<'a, L: MapList<'a>, A: KernelArgs>(
        &self,
        kernel: &Kernel,
        n: usize,
        maps: L,
        args: impl FnOnce(L::Views) -> A,
    ) -> Result<()> {
        let at = std::panic::Location::caller();
        // Its kernel's failure, found by its own copies back, is its own error.
        let origin = crate::device_state::Origin { construct: "target", kernel: Some(kernel.name()), at };
        self.data(maps, |views| self.launch_at(kernel, n, args(views), at))
            .map_err(|e| origin.failed(self.number, e))
    }
}

/// Host memory owned by the runtime, which can stay mapped across scopes and unmaps itself
/// (without copying back) from every device when dropped.
///
/// ```
/// use offload::{HostBuffer, MapType, Runtime};
/// let rt = Runtime::builder().host_devices(1).build()?;
/// let mut buf = HostBuffer::<i32>::from_slice(&rt, &[1, 2, 3])?;
/// buf.enter(0, MapType::TO)?;
/// buf[0] = 10;                      // the device copy keeps 1
/// buf.update_from(0)?;              // host gets the device's values back
/// assert_eq!(&buf[..], &[1, 2, 3]);
/// assert!(rt.is_present(buf.as_ptr() as usize, 0)?);
/// drop(buf);                        // unmapped from device 0
/// assert!(rt.live_mappings().is_empty());
/// # Ok::<(), offload::Error>(())
/// ```
#[derive(Debug)]
pub struct HostBuffer<T: DeviceCopy> {
    rt: Runtime,
    ptr: NonNull<T>,
    len: usize,
    /// The allocation, as made in `new` and freed in `drop`.
    layout: std::alloc::Layout,
    /// The device whose driver page-locked the buffer, if any did.
    pinned_by: Option<usize>,
}

// SAFETY: the buffer owns its memory like a `Vec<T>` does; `T: DeviceCopy` is Send + Sync.
unsafe impl<T: DeviceCopy> Send for HostBuffer<T> {}
// SAFETY: as above; shared access only reads.
unsafe impl<T: DeviceCopy> Sync for HostBuffer<T> {}

impl<T: DeviceCopy> HostBuffer<T> {
    const ALIGN: usize = 4096;

    /// The allocation for `len` elements: their bytes, or one page when that is zero (so the
    /// pointer is never dangling); an error when the size overflows or exceeds `isize::MAX`.
    fn layout(len: usize) -> Result<std::alloc::Layout> {
        let elem = std::mem::size_of::<T>();
        let too_large = |why: String| Error::InvalidArgument {
            routine: "HostBuffer::new",
            what: format!("{len} elements of {elem} bytes: {why}"),
        };
        let bytes = match len.checked_mul(elem) {
            None => return Err(too_large("the size overflows usize".into())),
            Some(0) => Self::ALIGN,
            Some(b) => b,
        };
        std::alloc::Layout::from_size_align(bytes, Self::ALIGN.max(std::mem::align_of::<T>()))
            .map_err(|e| too_large(format!("{bytes} bytes: {e}")))
    }

    /// `len` zeroed elements (every `DeviceCopy` type accepts zero bits), page-locked when
    /// a GPU driver can do it, so copies to and from it run at the link's speed.
    pub fn new(rt: &Runtime, len: usize) -> Result<Self> {
        let layout = Self::layout(len)?;
        // SAFETY: non-zero size (at least one page).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p.cast::<T>()).ok_or(Error::OutOfMemory {
            device: rt.initial_device(),
            requested: layout.size(),
            free: 0,
            total: 0,
        })?;
        // SAFETY: the allocation lives until `drop`, which unpins it first.
        let pinned_by = unsafe { rt.pin_host(p, layout.size()) };
        Ok(Self { rt: rt.clone(), ptr, len, layout, pinned_by })
    }

    /// A copy of `data`.
    pub fn from_slice(rt: &Runtime, data: &[T]) -> Result<Self> {
        let mut b = Self::new(rt, data.len())?;
        b.copy_from_slice(data);
        Ok(b)
    }

    /// The buffer as a map item of any type (the buffer owns its memory, so the
    /// runtime may write into it when the caller holds it exclusively).
    fn item(&self, map_type: MapType) -> MapItem {
        MapItem::raw(self.ptr.as_ptr(), self.len * std::mem::size_of::<T>(), map_type)
    }

    /// `target enter data map(map_type: buf)` on `device`.
    #[track_caller]
    pub fn enter(&self, device: usize, map_type: MapType) -> Result<()> {
        // SAFETY: the buffer is alive and only read.
        unsafe { self.rt.enter_data(device, &[self.item(map_type)]) }
    }

    /// `target exit data map(map_type: buf)` on `device`.
    #[track_caller]
    pub fn exit(&mut self, device: usize, map_type: MapType) -> Result<()> {
        // SAFETY: exclusive access to the buffer during the call.
        unsafe { self.rt.exit_data(device, &[self.item(map_type)]) }
    }

    /// `target update to(buf)`.
    #[track_caller]
    pub fn update_to(&self, device: usize) -> Result<()> {
        // SAFETY: the buffer is alive and only read.
        unsafe { self.rt.update(device, UpdateDirection::To, &[(HostRange::of(self), false)]) }
    }

    /// `target update from(buf)`.
    #[track_caller]
    pub fn update_from(&mut self, device: usize) -> Result<()> {
        // SAFETY: exclusive access during the call; any bits are valid `T`.
        unsafe { self.rt.update(device, UpdateDirection::From, &[(HostRange::of(self), false)]) }
    }

    /// Copies what `src` (a view of data mapped on its device) holds on the device into the
    /// start of this buffer, queued behind the work already queued there, and returns
    /// without waiting; [`QueuedRead::wait`] waits and hands the buffer back. For a value
    /// the host reads one iteration late while the next iteration's kernels are already
    /// queued (a delayed norm): the device is never idle waiting for the host. The buffer
    /// travels with the read (no borrow spans the iterations).
    ///
    /// ```
    /// use offload::{map, HostBuffer, Runtime};
    /// let rt = Runtime::builder().host_devices(1).build()?;
    /// let gpu = rt.device(0)?;
    /// let data = vec![7u32; 4];
    /// let last = HostBuffer::<u32>::new(&rt, 4)?;
    /// let last = gpu.data(map::to(&data), |v| {
    ///     let read = last.read_queued(v)?;      // queued: later launches could go here
    ///     read.wait()
    /// })?;
    /// assert_eq!(&last[..], &[7, 7, 7, 7]);
    /// # Ok::<(), offload::Error>(())
    /// ```
    ///
    /// Errors (the buffer is then dropped): `src` longer than the buffer, or not mapped on
    /// its device. On the initial device the copy is made at once.
    #[track_caller]
    pub fn read_queued(self, src: DeviceSlice<'_, T>) -> Result<QueuedRead<T>> {
        let (device, range) = (src.device(), src.host_range());
        if src.len() > self.len {
            return Err(Error::InvalidArgument {
                routine: "HostBuffer::read_queued",
                what: format!(
                    "a view of {} elements into a buffer of {}; expected at most {}",
                    src.len(),
                    self.len,
                    self.len
                ),
            });
        }
        let rt = self.rt.clone();
        let d = match rt.target(device)? {
            crate::device_state::Target::Initial => {
                // The view is host memory itself (a map on the initial device maps nothing).
                // SAFETY: `range` is the view's host memory, `src.len()` elements of `T`, and
                // the buffer holds at least as many; they are distinct allocations.
                unsafe {
                    std::ptr::copy_nonoverlapping(range.begin as *const T, self.ptr.as_ptr(), src.len())
                };
                return Ok(QueuedRead { rt, device, buf: Some(self), pending: None });
            }
            crate::device_state::Target::Device(d) => d,
        };
        if crate::device_state::recorder::recording(rt.identity(), device) {
            return Err(crate::device_state::recorder::refused(device, "HostBuffer::read_queued"));
        }
        let (addr, pins) = d.pinned_range(range).ok_or(Error::NotPresent {
            device,
            range,
            what: "the view given to HostBuffer::read_queued",
        })?;
        let origin =
            crate::device_state::Origin::new("HostBuffer::read_queued", std::panic::Location::caller());
        // SAFETY: the buffer is held by the result until the read has been waited for (by
        // `wait` or its drop); `range.bytes` fit in it (checked above).
        let pending = unsafe { d.queue_read(self.ptr.as_ptr().cast(), addr, range.bytes, pins, origin)? };
        Ok(QueuedRead { rt, device, buf: Some(self), pending: Some(pending) })
    }

    /// Whether a GPU driver page-locked the buffer.
    pub fn is_pinned(&self) -> bool {
        self.pinned_by.is_some()
    }

    /// A view for kernels on `device` through a shared borrow: kernels may write the
    /// device's copy; bringing it back to the host takes `&mut self` (`exit`,
    /// `update_from`).
    pub fn shared_view(&self, device: usize) -> DeviceSlice<'_, T> {
        DeviceSlice {
            device,
            host: self.ptr.as_ptr() as usize,
            len: self.len,
            writable: false,
            on_exit: ViewExit::Release,
            _borrow: PhantomData,
        }
    }

    /// A view for kernels on `device` (the buffer must be mapped there when launching).
    pub fn view(&mut self, device: usize) -> DeviceSlice<'_, T> {
        DeviceSlice {
            device,
            host: self.ptr.as_ptr() as usize,
            len: self.len,
            writable: true,
            on_exit: ViewExit::CopyBack,
            _borrow: PhantomData,
        }
    }
}

impl<T: DeviceCopy> Deref for HostBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialised elements owned by the buffer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: DeviceCopy> DerefMut for HostBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// A copy into a [`HostBuffer`] queued by [`HostBuffer::read_queued`]: it holds the buffer
/// until [`QueuedRead::wait`] (or the drop, which waits too) has seen the copy done.
#[must_use = "the copy is only known done once waited for"]
pub struct QueuedRead<T: DeviceCopy> {
    rt: Runtime,
    device: usize,
    buf: Option<HostBuffer<T>>,
    pending: Option<crate::device_state::PendingRead>,
}

impl<T: DeviceCopy> std::fmt::Debug for QueuedRead<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuedRead")
            .field("device", &self.device)
            .field("done", &self.pending.is_none())
            .finish()
    }
}

impl<T: DeviceCopy> QueuedRead<T> {
    /// Waits for the copy (and for the work queued before it: a synchronising call, which
    /// reports a failure of that work) and hands the buffer back (dropped on an error).
    pub fn wait(mut self) -> Result<HostBuffer<T>> {
        self.finish()?;
        self.buf.take().ok_or(Error::InvalidArgument {
            routine: "QueuedRead::wait",
            what: "the buffer was already handed back".into(),
        })
    }

    fn finish(&mut self) -> Result<()> {
        let Some(mut p) = self.pending.take() else { return Ok(()) };
        let d = self.rt.device_state(self.device)?;
        p.wait(d)
    }
}

impl<T: DeviceCopy> Drop for QueuedRead<T> {
    fn drop(&mut self) {
        // The copy still writes into the buffer: waited for before the buffer goes. A
        // failure stays for the next synchronising call (nowhere to report it here).
        if let (Some(mut p), Ok(d)) = (self.pending.take(), self.rt.device_state(self.device)) {
            p.wait_quietly(d);
        }
    }
}

impl<T: DeviceCopy> Drop for HostBuffer<T> {
    fn drop(&mut self) {
        let item = self.item(MapType::DELETE);
        for d in 0..self.rt.num_devices() {
            if self.rt.is_present(item.range.begin, d).unwrap_or(false) {
                // SAFETY: delete copies nothing back; the buffer is still alive.
                let _ = unsafe { self.rt.exit_data(d, &[item]) };
            }
        }
        if let Some(d) = self.pinned_by {
            // SAFETY: pinned in `new` by device `d`; every copy has completed.
            unsafe { self.rt.unpin_host(self.ptr.as_ptr().cast(), d) };
        }
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), self.layout) };
    }
}

#[cfg(test)]
mod host_buffer_tests {
    use super::*;

    fn runtime() -> Runtime {
        Runtime::builder().env(|_| None).gpus(false).host_devices(1).build().unwrap()
    }

    #[test]
    fn a_size_that_overflows_is_an_error() {
        let rt = runtime();
        for (len, what) in
            [(usize::MAX / 2, "overflows"), (usize::MAX, "overflows"), (usize::MAX / 8, "bytes")]
        {
            let e = HostBuffer::<u32>::new(&rt, len).unwrap_err();
            let s = e.to_string();
            assert!(matches!(e, Error::InvalidArgument { routine: "HostBuffer::new", .. }), "{s}");
            assert!(s.contains(&len.to_string()) && s.contains(what), "{s}");
        }
        let e = HostBuffer::<[u64; 4]>::new(&rt, usize::MAX / 16).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
    }

    #[test]
    fn empty_and_small_buffers_allocate_and_free() {
        let rt = runtime();
        let b = HostBuffer::<u32>::new(&rt, 0).unwrap();
        assert!(b.is_empty());
        let mut b = HostBuffer::<u32>::new(&rt, 3).unwrap();
        b[2] = 7;
        assert_eq!(&b[..], &[0, 0, 7]);
        let z = HostBuffer::<[u8; 0]>::new(&rt, usize::MAX).unwrap();
        assert_eq!(z.len(), usize::MAX);
    }
}
