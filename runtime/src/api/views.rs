//! Views of mapped host ranges on one device: [`DeviceSlice`], [`BasedSlice`].

use std::marker::PhantomData;
use std::ops::RangeBounds;

use crate::error::{Error, Result};

use crate::kernel::Kernel;
use crate::kernel::LaunchArg;
use crate::range::HostRange;
use crate::rt::Runtime;

use super::*;

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
    pub(super) device: usize,
    pub(super) host: usize,
    pub(super) len: usize,
    pub(super) writable: bool,
    /// Kernels may write the device's copy though the borrow is shared (a
    /// [`crate::HostBuffer::shared_view`]: device scratch, never copied back through it).
    pub(super) scratch: bool,
    /// The view names device memory itself ([`crate::DeviceBuffer::view`]): `host` is then
    /// the device address of its first element, and no present table is consulted.
    pub(super) resident: bool,
    /// What an exit through the view ([`crate::NowaitScope::exit`]) does.
    pub(crate) on_exit: ViewExit,
    pub(super) _borrow: PhantomData<&'a [T]>,
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

    /// Whether the view names device memory itself (a [`crate::DeviceBuffer`]'s).
    pub(crate) fn is_resident(&self) -> bool {
        self.resident
    }

    /// Whether kernels may write the device's copy through this view: a writable view, or a
    /// [`crate::HostBuffer::shared_view`] (device scratch: what kernels write there stays on
    /// the device until the buffer's owner brings it back with `&mut`). A generated
    /// kernel's `&mut` argument and [`crate::Device::sgemm`]'s C take only such views.
    pub fn device_writable(&self) -> bool {
        self.writable || self.scratch
    }

    /// Whether an exit through this view ([`crate::NowaitScope::exit`]) copies the device's
    /// data back: views of `from` and `tofrom` maps, except a [`crate::Mapped`] guard's
    /// (the guard copies back itself) and a [`crate::partition::DistributedArray`]'s (their
    /// halos overlap their neighbours' rows; its `gather` copies each row back once).
    pub fn copies_back(&self) -> bool {
        self.on_exit == ViewExit::CopyBack
    }

    /// Whether the view names device memory itself (a [`crate::DeviceBuffer::view`]), not
    /// a mapped host range.
    pub fn is_device_resident(&self) -> bool {
        self.resident
    }

    /// The host range the view names (for a [`crate::DeviceBuffer::view`], the device
    /// addresses it spans).
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
        if self.resident {
            return Ok(Some(self.host as u64));
        }
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

impl<T> BasedSlice<'_, T> {
    /// The device address of the array's base (`None` when the view's range is not
    /// mapped): C's `use_device_ptr(arr)` inside a region mapping `arr[ioff:n]`, which
    /// libomptarget answers with the device address of `arr[ioff]` minus `ioff` elements,
    /// as the kernel receives it. Elements before the view are not mapped.
    pub fn device_addr(&self, rt: &Runtime) -> Result<Option<u64>> {
        let section = self.view.device_addr(rt)?;
        Ok(section.map(|d| d.wrapping_sub((self.view.host - self.base) as u64)))
    }
}

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

/// A view of device scratch the runtime keeps itself behind `s` (a stage pipeline's
/// activations): kernels may write the device's copy ([`DeviceSlice::device_writable`]);
/// nothing is ever copied back into `s`.
pub(crate) fn scratch_view_of<T>(s: &[T], device: usize) -> DeviceSlice<'_, T> {
    DeviceSlice { scratch: true, ..view_of(s, device, false) }
}

/// A [`DeviceSlice`] whose element type is held as a value: a stage pipeline's activations
/// between stages of different types pass through code that cannot name them. It becomes a
/// view again only as the type it was made from ([`ErasedView::typed`]), so its length
/// always counts elements of the type behind it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ErasedView<'a> {
    view: DeviceSlice<'a, ()>,
    ty: std::any::TypeId,
    name: &'static str,
}

impl<'a> ErasedView<'a> {
    /// `view` with its type erased.
    pub(crate) fn of<T: 'static>(view: DeviceSlice<'a, T>) -> Self {
        let DeviceSlice { device, host, len, writable, scratch, resident, on_exit, _borrow } = view;
        let view =
            DeviceSlice { device, host, len, writable, scratch, resident, on_exit, _borrow: PhantomData };
        Self { view, ty: std::any::TypeId::of::<T>(), name: std::any::type_name::<T>() }
    }

    /// The view as `T`: an error naming both types unless it was made from a view of `T`.
    pub(crate) fn typed<T: 'static>(self, routine: &'static str) -> Result<DeviceSlice<'a, T>> {
        if self.ty != std::any::TypeId::of::<T>() {
            return Err(Error::InvalidArgument {
                routine,
                what: format!(
                    "a view of {} where {} was expected, on device {}",
                    self.name,
                    std::any::type_name::<T>(),
                    self.view.device
                ),
            });
        }
        let DeviceSlice { device, host, len, writable, scratch, resident, on_exit, .. } = self.view;
        Ok(DeviceSlice { device, host, len, writable, scratch, resident, on_exit, _borrow: PhantomData })
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
        scratch: false,
        resident: false,
        on_exit: if writable { ViewExit::CopyBack } else { ViewExit::Release },
        _borrow: PhantomData,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An erased view becomes a view again only as its own type, keeping every field.
    #[test]
    fn an_erased_view_is_typed_back_only_as_its_own_type() {
        let data = [1.5f32; 6];
        let view = scratch_view_of(&data, 3);
        let erased = ErasedView::of(view);
        let back = erased.typed::<f32>("test").unwrap();
        assert_eq!((back.device, back.host, back.len), (3, data.as_ptr() as usize, 6));
        assert!(back.scratch && !back.writable && !back.resident);
        let e = erased.typed::<u64>("test").unwrap_err().to_string();
        assert!(e.contains("a view of f32 where u64 was expected, on device 3"), "{e}");
    }
}
