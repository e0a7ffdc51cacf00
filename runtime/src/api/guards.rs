//! [`Mapped`]: a mapping of borrowed slices that ends itself, from [`Device::enter_data`]
//! or [`Device::data_region`], and [`HostMut`], the host copy it lends for the
//! `target update` pattern.
//!
//! The guard holds the maps, so their slices stay borrowed (shared or exclusive) exactly
//! as long as they are mapped; dropping it ends the mapping, so the present table never
//! keeps an entry for freed host memory, unless the guard is never dropped
//! (`std::mem::forget`, a reference cycle). That is a leak, which Rust lets safe code make:
//! the entry stays while its memory can be freed and handed out again, a later map there
//! finds it present and copies nothing in, and the runtime's drop reports it among the live
//! mappings. Nothing is ever written through it: copies back go only into what a live
//! guard or region borrows. Inside, the host copy of an exclusively
//! borrowed map can be changed ([`Mapped::host_mut`]) and pushed ([`Mapped::update_to`]),
//! or pulled ([`Mapped::update_from`]), as OpenMP programs do between `target` regions:
//!
//! ```
//! use offload::{map, Runtime};
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let gpu = rt.device(0)?;
//! let mut v = vec![1i32; 8];
//! // #pragma omp target data map(to: v[0:8])
//! let mut region = gpu.data_region(map::to_mut(&mut v))?;
//! let view = region.views();
//! region.host_mut(&view)?.fill(5);     // init_again(v) on the host
//! region.update_to(&view)?;            // #pragma omp target update to(v[0:8])
//! region.host_mut(&view)?.fill(0);
//! region.update_from(&view)?;          // #pragma omp target update from(v[0:8])
//! assert_eq!(&*region.host_mut(&view)?, &[5; 8]);
//! region.exit()?;                      // `to`: nothing copied back
//! assert_eq!(v, [5; 8]);
//! # Ok::<(), offload::Error>(())
//! ```

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::panic::Location;

use crate::api::{Device, DeviceSlice, MapList};
use crate::data_env::{MapItem, MapKind, MapType, UpdateDirection};
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;
use crate::range::HostRange;
use crate::rt::MapConstruct;

/// How a [`Mapped`] ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// `target exit data` of the maps' exit items ([`MapList::exit_items`]).
    ExitData,
    /// The closing half of `target data` with the same items.
    RegionEnd,
}

/// A mapping of borrowed slices on one device that ends when dropped. [`Mapped::exit`]
/// returns the end's error; a drop cannot, so it keeps it for the device's next
/// synchronising call ([`crate::Runtime::synchronize`], a copy back, ...) to report as
/// [`crate::Error::Queued`], and the constructs before that are refused. See the [module
/// documentation](self).
#[must_use = "dropping the guard ends the mapping at once"]
pub struct Mapped<'d, 'a, L: MapList<'a>> {
    device: Device<'d>,
    maps: L,
    /// The items the mapping began with.
    items: Vec<MapItem>,
    exclusive: Vec<HostRange>,
    ending: Ending,
    open: bool,
    /// Where the program opened it (the trace names it at the end too).
    at: &'static Location<'static>,
    _borrow: PhantomData<&'a ()>,
}

impl<'a, L: MapList<'a>> std::fmt::Debug for Mapped<'_, 'a, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapped")
            .field("device", &self.device.number())
            .field("items", &self.items)
            .field("ending", &self.ending)
            .field("open", &self.open)
            .finish()
    }
}

impl<'d, 'a, L: MapList<'a>> Mapped<'d, 'a, L> {
    #[track_caller]
    fn new(device: Device<'d>, maps: L, ending: Ending) -> Result<Self> {
        let items = super::entry_items(device.runtime(), device.number(), &maps)?;
        let mut exclusive = Vec::new();
        maps.exclusive_ranges(&mut exclusive);
        let at = Location::caller();
        Ok(Self { device, maps, items, exclusive, ending, open: false, at, _borrow: PhantomData })
    }

    /// `target enter data` of `maps` (`from` entering as `alloc`).
    #[track_caller]
    pub(crate) fn enter(device: Device<'d>, maps: L) -> Result<Self> {
        let mut m = Self::new(device, maps, Ending::ExitData)?;
        let entry: Vec<MapItem> = m
            .items
            .iter()
            .map(|i| match i.map_type.kind {
                MapKind::From => {
                    MapItem { map_type: MapType { kind: MapKind::Alloc, always: false, ..i.map_type }, ..*i }
                }
                _ => *i,
            })
            .collect();
        // SAFETY: every item's slice is borrowed by `m.maps` (exclusively for kinds that
        // copy back) for as long as the mapping lasts; entering only reads.
        unsafe { device.runtime().map_construct_at(MapConstruct::EnterData, device.number(), &entry, m.at)? };
        m.open = true;
        Ok(m)
    }

    /// The opening half of `target data` over `maps`.
    #[track_caller]
    pub(crate) fn region(device: Device<'d>, maps: L) -> Result<Self> {
        let mut m = Self::new(device, maps, Ending::RegionEnd)?;
        // SAFETY: as in `enter`.
        unsafe {
            device.runtime().map_construct_at(MapConstruct::DataBegin, device.number(), &m.items, m.at)?
        };
        m.open = true;
        Ok(m)
    }

    /// The device views of the maps, in the list's shape. An exit through them
    /// ([`crate::NowaitScope::exit`]) is refused: the guard ends the mapping.
    pub fn views(&self) -> L::Views {
        self.maps.views(self.device.number(), true)
    }

    /// The device.
    pub fn device(&self) -> Device<'d> {
        self.device
    }

    /// Ends the mapping now (copying back what its maps copy back), with its error.
    pub fn exit(mut self) -> Result<()> {
        self.end()
    }

    fn end(&mut self) -> Result<()> {
        if !std::mem::replace(&mut self.open, false) {
            return Ok(());
        }
        let (rt, d) = (self.device.runtime(), self.device.number());
        // SAFETY: items that copy back come from exclusive borrows held by `self.maps`, and
        // nothing else writes to them now: `&mut self` excludes a live `HostMut`, and exits
        // through the guard's views are refused.
        unsafe {
            match self.ending {
                Ending::RegionEnd => rt.map_construct_at(MapConstruct::DataEnd, d, &self.items, self.at),
                Ending::ExitData => {
                    let mut exit = Vec::new();
                    self.maps.exit_items(&mut exit);
                    rt.map_construct_at(MapConstruct::ExitData, d, &exit, self.at)
                }
            }
        }
    }

    /// The range of `view` checked to lie inside one of this guard's exclusive borrows.
    fn exclusive_range<T>(&self, view: &DeviceSlice<'_, T>, routine: &'static str) -> Result<HostRange> {
        let r = view.host_range();
        if view.device() == self.device.number() && self.exclusive.iter().any(|e| e.contains(&r)) {
            return Ok(r);
        }
        Err(Error::InvalidArgument {
            routine,
            what: format!(
                "device {}: a view of {r} on device {}; expected a view of one of this guard's maps \
                 over an exclusive borrow (map::from, map::tofrom, map::to_mut, map::alloc_mut)",
                self.device.number(),
                view.device()
            ),
        })
    }

    /// The host copy of the part of an exclusively borrowed map that `view` names, to
    /// change between constructs. On the initial device, whose device data is the host
    /// copy itself, it is a private copy written back when the [`HostMut`] drops.
    pub fn host_mut<T: DeviceCopy>(&mut self, view: &DeviceSlice<'_, T>) -> Result<HostMut<'_, T>> {
        let r = self.exclusive_range(view, "Mapped::host_mut")?;
        let (ptr, len) = (r.begin as *mut T, view.len());
        let rt = self.device.runtime();
        if self.device.number() == rt.initial_device() {
            let _hold = rt.hold_initial_device(false, "Mapped::host_mut")?;
            // SAFETY: `ptr..+len` lies in an exclusive borrow held by `self.maps`; no kernel
            // runs on the initial device while the hold lasts.
            let copy = unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec();
            return Ok(HostMut { slice: None, copy: Some((copy, ptr, self.device)), _guard: PhantomData });
        }
        // SAFETY: the range lies in an exclusive borrow held by `self.maps` for 'a, and is
        // reached otherwise only through this guard (borrowed mutably for the result's
        // life: its updates and its end), never through its views (exits through them are
        // refused, and they name device memory on this device, which is not the initial
        // one).
        let slice = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        Ok(HostMut { slice: Some(slice), copy: None, _guard: PhantomData })
    }

    /// `#pragma omp target update to(...)` of the part of a map that `view` names.
    #[track_caller]
    pub fn update_to<T>(&self, view: &DeviceSlice<'_, T>) -> Result<()> {
        let r = view.host_range();
        if view.device() != self.device.number() || !self.items.iter().any(|i| i.range.contains(&r)) {
            return Err(Error::InvalidArgument {
                routine: "Mapped::update_to",
                what: format!(
                    "device {}: a view of {r} on device {}; expected a view of one of this guard's maps",
                    self.device.number(),
                    view.device()
                ),
            });
        }
        // SAFETY: the range is borrowed by `self.maps`; `&self` excludes a live `HostMut`.
        unsafe { self.device.runtime().update(self.device.number(), UpdateDirection::To, &[(r, false)]) }
    }

    /// `#pragma omp target update from(...)` into the part of an exclusively borrowed map
    /// that `view` names.
    #[track_caller]
    pub fn update_from<T>(&mut self, view: &DeviceSlice<'_, T>) -> Result<()> {
        let r = self.exclusive_range(view, "Mapped::update_from")?;
        // SAFETY: the range is borrowed exclusively by `self.maps`, and `&mut self`
        // excludes every other access through this guard.
        unsafe { self.device.runtime().update(self.device.number(), UpdateDirection::From, &[(r, false)]) }
    }
}

impl<'a, L: MapList<'a>> Drop for Mapped<'_, 'a, L> {
    fn drop(&mut self) {
        // Inside a recorded body too (see `recorder::outside`).
        crate::rt::recorder::outside(|| {
            // A drop cannot return the error (`exit` does): it is kept for the device's next
            // synchronising call to report (or, when a failure is pending already, that one is
            // reported), so that a failed copy back is not silent.
            if let Err(e) = self.end() {
                // A failed `exit data` is undone, which would leave the guard's mapping live
                // after its borrow ends: it is ended again without copying back (`release`).
                if self.ending == Ending::ExitData {
                    let mut exit = Vec::new();
                    self.maps.exit_items(&mut exit);
                    for item in &mut exit {
                        item.map_type = MapType::RELEASE;
                    }
                    let (rt, d) = (self.device.runtime(), self.device.number());
                    // SAFETY: `release` copies nothing into the borrowed ranges.
                    let _ = unsafe { rt.map_construct_at(MapConstruct::ExitData, d, &exit, self.at) };
                }
                let construct = match self.ending {
                    Ending::RegionEnd => "exiting target data (a guard's drop)",
                    Ending::ExitData => "target exit data (a guard's drop)",
                };
                let origin = crate::origin::Origin::new(construct, self.at);
                self.device.runtime().keep_failure(self.device.number(), origin, e);
            }
        })
    }
}

/// The host copy of part of a mapped slice, lent by [`Mapped::host_mut`].
pub struct HostMut<'g, T: DeviceCopy> {
    slice: Option<&'g mut [T]>,
    /// On the initial device: the private copy, where it goes back, and its device.
    copy: Option<(Vec<T>, *mut T, Device<'g>)>,
    _guard: PhantomData<&'g mut ()>,
}

impl<T: DeviceCopy + std::fmt::Debug> std::fmt::Debug for HostMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: DeviceCopy> Deref for HostMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match (&self.slice, &self.copy) {
            (Some(s), _) => s,
            (None, Some((c, ..))) => c,
            (None, None) => &[],
        }
    }
}

impl<T: DeviceCopy> DerefMut for HostMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match (&mut self.slice, &mut self.copy) {
            (Some(s), _) => s,
            (None, Some((c, ..))) => c,
            (None, None) => &mut [],
        }
    }
}

impl<T: DeviceCopy> Drop for HostMut<'_, T> {
    fn drop(&mut self) {
        if let Some((copy, ptr, device)) = self.copy.take() {
            // Not on a kernel thread of the initial device: `host_mut` refuses those, and
            // the value is not `Send`.
            let _hold = device.runtime().inner.initial_device_lock.read();
            // SAFETY: `ptr..+len` lies in an exclusive borrow held by the guard this value
            // borrows mutably; no kernel runs on the initial device while the hold lasts.
            unsafe { std::ptr::copy_nonoverlapping(copy.as_ptr(), ptr, copy.len()) };
        }
    }
}
