//! Map clauses over borrowed host slices ([`Map`]) and map lists ([`MapList`]).

use std::marker::PhantomData;

use crate::data_env::{MapItem, MapType};
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;
use crate::range::HostRange;
use crate::rt::Runtime;

use super::*;

/// One map clause over a borrowed host slice. Made by the functions of [`crate::map`].
#[derive(Debug)]
#[must_use = "a map does nothing until given to a construct"]
pub struct Map<'a, T> {
    item: MapItem,
    writable: bool,
    _borrow: PhantomData<&'a [T]>,
}

impl<'a, T: DeviceCopy> Map<'a, T> {
    /// Whether the map takes part in constructs: an empty slice maps nothing.
    fn counted(&self) -> bool {
        self.item.range.bytes > 0
    }

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

    /// With a name for the trace ([`MapItem::named`]): `OFFLOAD_INFO` lines then give
    /// ranges of the mapping as element sections of it (`a[0:1024]`, `a[256:128]`), and
    /// table dumps and [`Runtime::live_mappings`] name it. The macros of [`crate::map`]
    /// (`map::to!(a)`) name a map by its source text.
    ///
    /// ```
    /// use offload::{map, InfoFlags, Runtime};
    ///
    /// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1);
    /// let rt = rt.info(InfoFlags::KERNEL_ARGS).capture_info().build()?;
    /// let a = vec![1.0f32; 1024];
    /// rt.device(0)?.data(map::to(&a).named("a"), |_| Ok(()))?;
    /// let lines = rt.take_info();
    /// assert!(lines[0].ends_with("with 1 maps: to(a[0:1024])"), "{lines:?}");
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn named(mut self, name: &'static str) -> Self {
        self.item = self.item.named(name);
        self
    }

    /// With a name for the trace, the slice being elements `index..` of array `name` (a
    /// part of an array split over devices: `map::tofrom(&mut a[512..]).named_at("a",
    /// 512)` is `a[512:512]`); see [`MapItem::named_at`].
    pub fn named_at(mut self, name: &'static str, index: usize) -> Self {
        self.item = self.item.named_at(name, index);
        self
    }

    /// The map item in the OpenMP shape.
    pub fn item(&self) -> MapItem {
        self.item
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
    /// Appends the map items in list order. Maps of empty slices are left out: in the safe
    /// API an empty slice maps nothing (a zero-length item would move the count of a
    /// mapping it lies in, which a guard cannot give back soundly; see
    /// [`MapList::empty_present`]).
    fn items(&self, out: &mut Vec<MapItem>);
    /// Appends the host ranges of empty slices mapped with `present`, which must lie in a
    /// mapped range when the construct begins (the safe API checks them before it).
    fn empty_present(&self, _out: &mut Vec<HostRange>) {}
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
        out.extend(self.counted().then_some(self.item));
    }
    fn empty_present(&self, out: &mut Vec<HostRange>) {
        if !self.counted() && self.item.map_type.present {
            out.push(self.item.range);
        }
    }
    fn exit_items(&self, out: &mut Vec<MapItem>) {
        if !self.counted() {
            return;
        }
        let t = self.item.map_type;
        let kind = if t.copies_out() { MapType::FROM } else { MapType::RELEASE };
        let kind = if t.always && t.copies_out() { kind.always() } else { kind };
        // The name goes with it, for the exit's trace lines.
        out.push(MapItem { map_type: kind, base: None, ..self.item });
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
            scratch: false,
            resident: false,
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
        self.iter().for_each(|m| m.items(out));
    }
    fn empty_present(&self, out: &mut Vec<HostRange>) {
        self.iter().for_each(|m| m.empty_present(out));
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
            fn empty_present(&self, out: &mut Vec<HostRange>) {
                $(self.$i.empty_present(out);)+
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

/// The entry items of `maps` for a construct on `device` ([`MapList::items`]), after
/// checking that every empty slice mapped with `present` lies in a mapped range there (the
/// check a zero-length `present` item gets in the OpenMP shape, without its count).
pub(crate) fn entry_items<'a, L: MapList<'a>>(rt: &Runtime, device: usize, maps: &L) -> Result<Vec<MapItem>> {
    let mut empty = Vec::new();
    maps.empty_present(&mut empty);
    for range in empty {
        if rt.use_device_ptr(range.begin, device)?.is_none() {
            return Err(Error::NotPresent { device, range, what: "a `present` map on entry", name: None });
        }
    }
    let mut items = Vec::new();
    maps.items(&mut items);
    Ok(items)
}

/// The map clause macros of [`crate::map`] (`map::to!(a)` is `map::to(&a).named("a")`):
/// the clause function `$f` over `$e` borrowed as `$b`, named by its source text.
///
/// Macros because only a macro sees its argument's source text, which LLVM's traces give
/// a map (`a[0:1024]`); each takes the borrow its function takes (`&` for `to` and
/// `alloc`, `&mut` for `from` and `tofrom`), so it reads as the function with the `&` left
/// out. They are defined at the crate root under `map_` names (`offload::map_to!`, as
/// `#[macro_export]` requires) and re-exported in [`crate::map`] beside the functions
/// (`map::to!`); the other clauses are named with [`Map::named`].
///
/// A slice of a named array, `a[lo..hi]` or `a[lo..]`, is named as the part of `a` it is
/// (`named_at("a", lo)`: `a[512:256]`, not `a[512..768][0:256]`).
#[doc(hidden)]
#[macro_export]
macro_rules! __named_map {
    ($f:ident, [$($b:tt)+], $a:ident [$lo:tt .. $($hi:tt)*]) => {
        $crate::map::$f($($b)+ $a[$lo..$($hi)*]).named_at(stringify!($a), $lo)
    };
    ($f:ident, [$($b:tt)+], $e:expr) => {
        $crate::map::$f($($b)+ $e).named(stringify!($e))
    };
}

/// `map::to(&a).named("a")`: `map(to: a)` named by its source text for the trace
/// ([`Map::named`]).
///
/// ```
/// use offload::{map, InfoFlags, Runtime};
///
/// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1);
/// let rt = rt.info(InfoFlags::KERNEL_ARGS).capture_info().build()?;
/// let (a, mut b) = (vec![1i32; 16], vec![0i32; 16]);
/// rt.device(0)?.data((map::to!(a), map::tofrom!(b[8..])), |_| Ok(()))?;
/// let lines = rt.take_info();
/// assert!(lines[0].ends_with("with 2 maps: to(a[0:16]) tofrom(b[8:8])"), "{lines:?}");
/// # Ok::<(), offload::Error>(())
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! map_to {
    ($($e:tt)+) => {
        $crate::__named_map!(to, [&], $($e)+)
    };
}

/// `map::alloc(&a).named("a")` (see [`map::to!`](crate::map::to!)).
#[doc(hidden)]
#[macro_export]
macro_rules! map_alloc {
    ($($e:tt)+) => {
        $crate::__named_map!(alloc, [&], $($e)+)
    };
}

/// `map::from(&mut a).named("a")` (see [`map::to!`](crate::map::to!)).
#[doc(hidden)]
#[macro_export]
macro_rules! map_from {
    ($($e:tt)+) => {
        $crate::__named_map!(from, [&mut], $($e)+)
    };
}

/// `map::tofrom(&mut a).named("a")` (see [`map::to!`](crate::map::to!)).
#[doc(hidden)]
#[macro_export]
macro_rules! map_tofrom {
    ($($e:tt)+) => {
        $crate::__named_map!(tofrom, [&mut], $($e)+)
    };
}
