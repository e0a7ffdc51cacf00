//! The device data environment: map types, map lists and their processing.
//!
//! A map list given to one construct is processed as a unit (OpenMP 5.x, as
//! `docs/SEMANTICS.md` states it):
//!
//! * **entry**, in list order: an absent range is allocated; each entry's count goes up once
//!   per construct, however often the list names it; a `to` copies when the construct
//!   created the entry (anywhere in its list) or with `always`. A `present` item must be
//!   present before the construct starts, or nothing happens at all. A range that partly
//!   overlaps a mapped one is an error.
//! * **exit**, in reverse list order: each entry's count goes down once (`delete` zeroes the
//!   reference count); a `from` copies when the construct releases the entry (both counts
//!   0) or with `always`; identical ranges copy once; released entries are then freed in
//!   that order. A range not wholly inside one mapped range is absent here, and `present`
//!   is checked only by `exit data`, never at the end of a region (rule 10).
//!
//! There is one reference count, as OpenMP 5.2 defines it: `target data`, target launches
//! and `enter`/`exit data` all move it. Maps with the `hold` modifier (LLVM's `ompx_hold`,
//! allowed on `target data` and target launches) move a second count instead, and no
//! `exit data` removes an entry whose hold count is above 0. Entries made by
//! `associate_ptr` have an infinite reference count: only `always` and `update` move their
//! data, and only `disassociate` removes them (refused while a `hold` map holds them).
//!
//! Every construct is all or nothing: a failure undoes what the construct did (entries it
//! created are freed, counts restored) before the error is returned.

pub(crate) mod plan;
mod present_table;

pub use present_table::Entry;
pub(crate) use present_table::{next_mark, Lookup, PresentTable};

use std::fmt;

use crate::range::HostRange;

/// The kind of a map clause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapKind {
    /// Copy host->device when the entry is created.
    To,
    /// Copy device->host when the entry is released.
    From,
    /// Both `to` and `from`.
    ToFrom,
    /// Allocate, copy nothing.
    Alloc,
    /// (exit only) Decrement, copy nothing.
    Release,
    /// (exit only) Zero the reference count, copy nothing.
    Delete,
}

/// A map type: its kind and the `always`, `present` and `hold` modifiers.
///
/// ```
/// use offload::MapType;
/// let t = MapType::TOFROM.always().present();
/// assert_eq!(t.to_string(), "always, present, tofrom");
/// assert_eq!(MapType::ALLOC.hold().to_string(), "hold, alloc");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MapType {
    /// The clause's kind.
    pub kind: MapKind,
    /// `always`: copy even when the count does not move from or to zero.
    pub always: bool,
    /// `present`: the range must already be mapped.
    pub present: bool,
    /// `hold` (LLVM's `ompx_hold`): the map moves the entry's hold count instead of its
    /// reference count, so no `exit data` removes the entry while the region lasts. Only on
    /// `target data` and target launches.
    pub hold: bool,
    /// Implicit: the map a C `target` region makes of a variable it uses with no map clause
    /// (OpenMP 5.2, 5.8.3). Where part of the range is already mapped, only that part is
    /// mapped (its entry's count moves, nothing is allocated, and the kernel's pointer to
    /// the range is translated through that entry), where an explicit map is an extension
    /// error. Only on target launches.
    pub implicit: bool,
}

impl MapType {
    const fn of(kind: MapKind) -> Self {
        Self { kind, always: false, present: false, hold: false, implicit: false }
    }
    /// `map(to: ...)`.
    pub const TO: Self = Self::of(MapKind::To);
    /// `map(from: ...)`.
    pub const FROM: Self = Self::of(MapKind::From);
    /// `map(tofrom: ...)`.
    pub const TOFROM: Self = Self::of(MapKind::ToFrom);
    /// `map(alloc: ...)`.
    pub const ALLOC: Self = Self::of(MapKind::Alloc);
    /// `map(release: ...)`.
    pub const RELEASE: Self = Self::of(MapKind::Release);
    /// `map(delete: ...)`.
    pub const DELETE: Self = Self::of(MapKind::Delete);

    /// With the `always` modifier.
    pub const fn always(mut self) -> Self {
        self.always = true;
        self
    }

    /// With the `present` modifier.
    pub const fn present(mut self) -> Self {
        self.present = true;
        self
    }

    /// With the `hold` modifier (LLVM's `ompx_hold`).
    pub const fn hold(mut self) -> Self {
        self.hold = true;
        self
    }

    /// Made implicitly by a target region ([`MapType::implicit`]).
    pub const fn implicit(mut self) -> Self {
        self.implicit = true;
        self
    }

    /// Whether this map copies host->device at entry (when it copies at all).
    pub const fn copies_in(self) -> bool {
        matches!(self.kind, MapKind::To | MapKind::ToFrom)
    }

    /// Whether this map copies device->host at exit (when it copies at all).
    pub const fn copies_out(self) -> bool {
        matches!(self.kind, MapKind::From | MapKind::ToFrom)
    }
}

impl fmt::Display for MapType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.always {
            f.write_str("always, ")?;
        }
        if self.present {
            f.write_str("present, ")?;
        }
        if self.hold {
            f.write_str("hold, ")?;
        }
        if self.implicit {
            f.write_str("implicit, ")?;
        }
        f.write_str(match self.kind {
            MapKind::To => "to",
            MapKind::From => "from",
            MapKind::ToFrom => "tofrom",
            MapKind::Alloc => "alloc",
            MapKind::Release => "release",
            MapKind::Delete => "delete",
        })
    }
}

/// One item of a map list: a host range and how to map it.
///
/// Building one is safe; the constructs that copy through it are `unsafe` (see
/// [`crate::omp`]) or borrow the memory (the safe API). The constructors take the pointer
/// the kind needs: `*mut T` (or `&mut [T]`) for kinds that write to the host (`from`,
/// `tofrom`), so a port cannot hand a read-only pointer to a copy-back by accident.
///
/// ```
/// use offload::{MapItem, MapKind};
/// let (x, mut y) = ([1.0f32; 8], [0.0f32; 8]);
/// // map(to: x[2:4]) map(always, from: y[0:8])
/// let to = MapItem::to(x[2..].as_ptr(), 16);
/// let from = MapItem::from(y.as_mut_ptr(), 32).always();
/// assert_eq!((to.map_type.kind, from.map_type.kind), (MapKind::To, MapKind::From));
/// assert!(from.map_type.always && from.range.bytes == 32);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapItem {
    /// The host bytes.
    pub range: HostRange,
    /// The map type.
    pub map_type: MapType,
    /// C's base pointer of the section, when it lies below the section (`A` in
    /// `map(to: A[64:128])`); see [`MapItem::with_base`]. `None`: the section's first byte.
    pub base: Option<usize>,
    /// The name traces give the range ([`MapItem::named`]); `None`: traces give its bytes.
    pub name: Option<&'static str>,
    /// The size of one element in bytes, so that traces give offsets in elements: the
    /// pointee's size for the typed constructors (`to`, `slice`, ...), 1 for
    /// [`MapItem::new`].
    pub elem_size: usize,
    /// The index in the named array of the range's first element ([`MapItem::named_at`]).
    pub name_index: usize,
}

impl MapItem {
    /// `bytes` bytes at `ptr` with any map type, as C's `map(type: ptr[0:n])` gives them.
    pub fn raw<T>(ptr: *mut T, bytes: usize, map_type: MapType) -> Self {
        Self::reading(ptr, bytes, map_type)
    }

    /// `range` with `map_type` (no base pointer).
    pub const fn new(range: HostRange, map_type: MapType) -> Self {
        Self { range, map_type, base: None, name: None, elem_size: 1, name_index: 0 }
    }

    fn reading<T>(ptr: *const T, bytes: usize, map_type: MapType) -> Self {
        let elem_size = std::mem::size_of::<T>().max(1);
        Self { elem_size, ..Self::new(HostRange::new(ptr as usize, bytes), map_type) }
    }

    /// With a name for the trace, as LLVM's traces name a map by its source text
    /// (`a[0:1024]`): the entry this item creates keeps the name and the element size, and
    /// every `OFFLOAD_INFO` line about a range inside the entry names it as an element
    /// section of it (`a[256:128]` for the second quarter), as do
    /// [`crate::Runtime::dump_present_table`] and [`crate::Runtime::live_mappings`].
    /// Unnamed ranges are given by their bytes (`host 0x..0x.. (16 bytes)`). An unnamed
    /// entry takes the name of a later item that maps exactly its range.
    ///
    /// ```
    /// use offload::omp::*;
    /// use offload::{InfoFlags, MapItem, Runtime};
    ///
    /// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1);
    /// let rt = use_runtime(rt.info(InfoFlags::ENTRIES | InfoFlags::ABSENT).capture_info().build()?)?;
    /// let a = [0.0f32; 1024];
    /// unsafe {
    ///     target_enter_data(0, &[MapItem::to(a.as_ptr(), 4096).named("a")])?;
    ///     // Half inside, half outside: skipped, and the trace says why.
    ///     target_exit_data(0, &[MapItem::release(a[960..].as_ptr(), 512)])?;
    ///     target_exit_data(0, &[MapItem::release(a.as_ptr(), 4096)])?;
    /// }
    /// let lines = rt.take_info();
    /// assert!(lines[0].starts_with("device 0: entry created a[0:1024] -> device 0x"), "{lines:?}");
    /// assert!(lines[1].ends_with("a[960:128] is not wholly inside mapped a[0:1024]; skipped"), "{lines:?}");
    /// assert!(lines[2].starts_with("device 0: entry removed a[0:1024]"), "{lines:?}");
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub const fn named(self, name: &'static str) -> Self {
        self.named_at(name, 0)
    }

    /// With a name for the trace, the range being elements `index..` of array `name`: a
    /// part of an array split over devices, given as it is in the whole (`a[512:512]`
    /// for the second half of `a[0:1024]`). See [`MapItem::named`].
    ///
    /// ```
    /// use offload::MapItem;
    /// let mut a = [0.0f64; 1024];
    /// let half = MapItem::tofrom(a[512..].as_mut_ptr(), 512 * 8).named_at("a", 512);
    /// assert_eq!((half.name, half.name_index, half.elem_size), (Some("a"), 512, 8));
    /// ```
    pub const fn named_at(mut self, name: &'static str, index: usize) -> Self {
        self.name = Some(name);
        self.name_index = index;
        self
    }

    /// With C's base pointer of the section: `A` in `map(to: A[64:128])`. An entry this
    /// item creates remembers it, and, as in libomptarget, a zero-length lookup from any
    /// address in `[base, section end)` finds the entry: `use_device_ptr(A)` then gives the
    /// device address that corresponds to `A` (the device copy of `A[64]` minus 64
    /// elements), and a zero-length section at `A` names the entry. A base above the
    /// section's first byte is ignored.
    ///
    /// ```
    /// use offload::omp::*;
    /// use offload::{MapItem, Runtime};
    ///
    /// use_runtime(Runtime::builder().host_devices(1).build()?)?;
    /// let a = vec![0i32; 256];
    /// let section = a[64..].as_ptr();
    /// unsafe {
    ///     // #pragma omp target enter data map(to: A[64:128])
    ///     target_enter_data(0, &[MapItem::to(section, 128 * 4).with_base(a.as_ptr())])?;
    ///     // #pragma omp target data use_device_ptr(A)
    ///     let d = use_device_ptr(a.as_ptr().cast(), 0)? as usize;
    ///     assert_eq!(d + 64 * 4, omp_get_mapped_ptr(section.cast(), 0)? as usize);
    ///     target_exit_data(0, &[MapItem::release(section, 128 * 4)])?;
    /// }
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn with_base<T>(mut self, base: *const T) -> Self {
        self.base = Some(base as usize).filter(|&b| b < self.range.begin);
        self
    }

    /// `map(to: ...)` of `bytes` bytes at `ptr`.
    pub fn to<T>(ptr: *const T, bytes: usize) -> Self {
        Self::reading(ptr, bytes, MapType::TO)
    }

    /// `map(alloc: ...)` of `bytes` bytes at `ptr`.
    pub fn alloc<T>(ptr: *const T, bytes: usize) -> Self {
        Self::reading(ptr, bytes, MapType::ALLOC)
    }

    /// `map(release: ...)` of `bytes` bytes at `ptr`.
    pub fn release<T>(ptr: *const T, bytes: usize) -> Self {
        Self::reading(ptr, bytes, MapType::RELEASE)
    }

    /// `map(delete: ...)` of `bytes` bytes at `ptr`.
    pub fn delete<T>(ptr: *const T, bytes: usize) -> Self {
        Self::reading(ptr, bytes, MapType::DELETE)
    }

    /// `map(from: ...)` of `bytes` bytes at `ptr`.
    pub fn from<T>(ptr: *mut T, bytes: usize) -> Self {
        Self::raw(ptr, bytes, MapType::FROM)
    }

    /// `map(tofrom: ...)` of `bytes` bytes at `ptr`.
    pub fn tofrom<T>(ptr: *mut T, bytes: usize) -> Self {
        Self::raw(ptr, bytes, MapType::TOFROM)
    }

    /// The whole of `slice`, for map types that do not write to the host (`to`, `alloc`,
    /// `release`, `delete`, with any modifier); use [`MapItem::slice_mut`] for the others.
    /// Giving it `from` or `tofrom` is a bug the constructs cannot see (debug builds
    /// assert it).
    pub fn slice<T>(slice: &[T], map_type: MapType) -> Self {
        debug_assert!(!map_type.copies_out(), "MapItem::slice with {map_type}: use MapItem::slice_mut");
        Self::reading(slice.as_ptr(), std::mem::size_of_val(slice), map_type)
    }

    /// The whole of `slice`, with any map type.
    pub fn slice_mut<T>(slice: &mut [T], map_type: MapType) -> Self {
        Self::raw(slice.as_mut_ptr(), std::mem::size_of_val(slice), map_type)
    }

    /// The named array the item's range is a part of, when it was named.
    pub(crate) fn array(&self) -> Option<crate::range::ArrayName> {
        crate::range::ArrayName::of(self.name, self.elem_size, self.name_index, self.range.begin)
    }

    /// With the `always` modifier.
    pub const fn always(mut self) -> Self {
        self.map_type = self.map_type.always();
        self
    }

    /// With the `present` modifier.
    pub const fn present(mut self) -> Self {
        self.map_type = self.map_type.present();
        self
    }

    /// With the `hold` modifier.
    pub const fn hold(mut self) -> Self {
        self.map_type = self.map_type.hold();
        self
    }

    /// Made implicitly, as C's `target` maps a variable it uses with no map clause: where
    /// part of the range is mapped, only that part is ([`MapType::implicit`]; on
    /// [`crate::Runtime::target_launch`] and [`crate::omp::target`] only).
    ///
    /// ```
    /// use offload::omp::*;
    /// use offload::{HostLaunch, Kernel, LaunchArg, MapItem, Runtime};
    ///
    /// fn bump(l: &HostLaunch<'_>) -> Result<(), String> {
    ///     let (base, _) = l.ptr::<i32>(0)?;
    ///     // SAFETY: the launch maps arr[50:2] and passes arr's base.
    ///     unsafe { (50..52).for_each(|i| *base.add(i) += 1) };
    ///     Ok(())
    /// }
    /// static BUMP: Kernel = Kernel::new("bump").with_host(bump);
    ///
    /// use_runtime(Runtime::builder().host_devices(1).build()?)?;
    /// let mut arr = [0i32; 100];
    /// let p = arr.as_mut_ptr();
    /// // SAFETY: `arr` outlives the mapping; the host does not touch it meanwhile.
    /// unsafe {
    ///     // #pragma omp target enter data map(to: arr[50:2])
    ///     target_enter_data(0, &[MapItem::to(p.wrapping_add(50), 8)])?;
    ///     // #pragma omp target  (arr used, no map clause: implicitly tofrom, the part present)
    ///     target(0, &BUMP, 1, &[MapItem::tofrom(p, 400).implicit()], &[LaunchArg::mapped(p)])?;
    ///     // #pragma omp target exit data map(from: arr[50:2])
    ///     target_exit_data(0, &[MapItem::from(p.wrapping_add(50), 8)])?;
    /// }
    /// assert_eq!((arr[49], arr[50], arr[51], arr[52]), (0, 1, 1, 0));
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub const fn implicit(mut self) -> Self {
        self.map_type = self.map_type.implicit();
        self
    }
}

/// One range of a `target update` (`to(...)` or `from(...)`: the direction is the call's),
/// with or without the `present` modifier; unlike a [`MapItem`] it has no map kind, since
/// an update moves no count.
///
/// ```
/// use offload::UpdateItem;
/// let x = [1.0f32; 8];
/// let u = UpdateItem::slice(&x[2..4]).present();
/// assert_eq!(u.range.bytes, 8);
/// assert!(u.present && !UpdateItem::raw(x.as_ptr(), 32).present);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpdateItem {
    /// The host bytes.
    pub range: HostRange,
    /// `present`: an error when the range is not mapped (else it is skipped).
    pub present: bool,
}

impl UpdateItem {
    /// `bytes` bytes at `ptr`, as C's `to(ptr[0:n])` gives them.
    pub fn raw<T>(ptr: *const T, bytes: usize) -> Self {
        Self { range: HostRange::new(ptr as usize, bytes), present: false }
    }

    /// The whole of `slice`.
    pub fn slice<T>(slice: &[T]) -> Self {
        Self { range: HostRange::of(slice), present: false }
    }

    /// With the `present` modifier.
    pub const fn present(mut self) -> Self {
        self.present = true;
        self
    }
}

/// The construct a map list belongs to: it decides which map kinds and modifiers are
/// allowed and whether `present` is checked at exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Construct {
    TargetData,
    Target,
    EnterData,
    ExitData,
}

impl Construct {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Construct::TargetData => "target data",
            Construct::Target => "target",
            Construct::EnterData => "target enter data",
            Construct::ExitData => "target exit data",
        }
    }

    /// A region (`target data`, a launch): the only constructs that take `hold`, and whose
    /// exit half never checks `present` (rule 10: presence is judged where a construct
    /// begins).
    pub(crate) const fn is_region(self) -> bool {
        matches!(self, Construct::TargetData | Construct::Target)
    }

    pub(crate) const fn allows(self, t: MapType) -> bool {
        use MapKind::*;
        if (t.hold && !self.is_region()) || (t.implicit && !matches!(self, Construct::Target)) {
            return false;
        }
        let kind = t.kind;
        match self {
            Construct::TargetData | Construct::Target => matches!(kind, To | From | ToFrom | Alloc),
            Construct::EnterData => matches!(kind, To | ToFrom | Alloc),
            Construct::ExitData => matches!(kind, From | ToFrom | Release | Delete),
        }
    }
}

/// Direction of a `target update`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateDirection {
    /// `update to`: host->device.
    To,
    /// `update from`: device->host.
    From,
}
