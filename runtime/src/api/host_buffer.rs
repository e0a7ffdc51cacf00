//! Host memory owned by the runtime: [`HostBuffer`], and [`QueuedRead`] copies into it.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::data_env::{MapItem, MapType, UpdateDirection};
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;
use crate::range::HostRange;
use crate::rt::Runtime;
use crate::services::pinned_memory::PinnedMemory;

use super::*;

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
    /// The elements' memory (page-locked by a GPU driver where one could), freed after
    /// `drop` has unmapped it.
    memory: PinnedMemory,
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
        let memory = rt.pinned_memory(layout.size(), layout.align())?;
        Ok(Self { rt: rt.clone(), ptr: memory.start().cast(), len, memory })
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
    /// its device. On the initial device the copy is made at once, after the initial
    /// device's running kernels (which may write the view) have finished; it is refused
    /// inside one of them.
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
        if device == rt.initial_device() {
            // The view is host memory itself (a map on the initial device maps nothing),
            // which a kernel of the initial device may be writing from another thread:
            // held from them, as `DeviceBuffer::read` is.
            {
                let _hold = rt.hold_initial_device(false, "HostBuffer::read_queued")?;
                // SAFETY: `range` is the view's host memory, `src.len()` elements of `T`,
                // and the buffer holds at least as many; they are distinct allocations,
                // and no kernel writes the view meanwhile (the hold).
                unsafe {
                    std::ptr::copy_nonoverlapping(range.begin as *const T, self.ptr.as_ptr(), src.len())
                };
            }
            return Ok(QueuedRead { rt, device, buf: Some(self), pending: None });
        }
        let origin = crate::origin::Origin::new("HostBuffer::read_queued", std::panic::Location::caller());
        // SAFETY: the buffer is held by the result until the read has been waited for (by
        // `wait` or its drop); `range.bytes` fit in it (checked above).
        let pending = unsafe { rt.queue_read(device, range, self.ptr.as_ptr().cast(), origin)? };
        Ok(QueuedRead { rt, device, buf: Some(self), pending: Some(pending) })
    }

    /// Whether a GPU driver page-locked the buffer.
    pub fn is_pinned(&self) -> bool {
        self.memory.is_locked()
    }

    /// A view for kernels on `device` through a shared borrow, as device scratch: kernels
    /// may write the device's copy (a generated kernel's `&mut` argument and
    /// [`Device::sgemm`](crate::Device::sgemm)'s C take it); bringing it back to the host
    /// takes `&mut self` (`exit`, `update_from`). On the initial device, where a view is
    /// host memory itself, a kernel gets a private copy of it instead, so nothing is ever
    /// written through the `&`.
    pub fn shared_view(&self, device: usize) -> DeviceSlice<'_, T> {
        DeviceSlice {
            device,
            host: self.ptr.as_ptr() as usize,
            len: self.len,
            writable: false,
            scratch: true,
            resident: false,
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
            scratch: false,
            resident: false,
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
    pending: Option<crate::rt::PendingRead>,
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
        self.rt.wait_read(self.device, &mut p)
    }
}

impl<T: DeviceCopy> Drop for QueuedRead<T> {
    fn drop(&mut self) {
        // The copy still writes into the buffer: waited for before the buffer goes. A
        // failure stays for the next synchronising call (nowhere to report it here).
        if let Some(mut p) = self.pending.take() {
            self.rt.wait_read_quietly(self.device, &mut p);
        }
    }
}

impl<T: DeviceCopy> Drop for HostBuffer<T> {
    fn drop(&mut self) {
        // Inside a recorded body too (see `recorder::outside`).
        crate::rt::recorder::outside(|| {
            let item = self.item(MapType::DELETE);
            for d in 0..self.rt.num_devices() {
                if self.rt.is_present(item.range.begin, d).unwrap_or(false) {
                    // SAFETY: delete copies nothing back; the buffer is still alive.
                    let _ = unsafe { self.rt.exit_data(d, &[item]) };
                }
            }
        })
        // `memory` drops after this: unlocked, then freed.
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
