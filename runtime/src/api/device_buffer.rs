//! [`DeviceBuffer`]: device memory owned by a Rust value (`omp_target_alloc` /
//! `omp_target_free`), and [`Association`]: a host slice associated with part of one
//! (`omp_target_associate_ptr` / `omp_target_disassociate_ptr`) for as long as the guard
//! lives.
//!
//! A buffer is a kernel argument by reference (C's `is_device_ptr`); its copies check
//! every offset and length. As on a GPU, a kernel and a copy that touch the same device
//! memory at once leave its values unspecified (on the initial device, whose memory is host
//! memory, reads wait for its kernels instead); the buffer is freed when dropped, after the
//! launches that borrow it have returned.
//!
//! ```
//! use offload::{DeviceBuffer, Runtime};
//! let rt = Runtime::builder().host_devices(2).build()?;
//! let a = DeviceBuffer::from_slice(&rt.device(0)?, &[1u32, 2, 3, 4])?;
//! let mut b = DeviceBuffer::<u32>::new(&rt.device(1)?, 4)?;
//! b.copy_from(&a)?;                     // device to device
//! assert_eq!(b.to_vec()?, [1, 2, 3, 4]);
//!
//! let mut host = [0u32; 2];
//! let mut assoc = b.associate(&mut host, 2)?; // host[0..2] <-> b[2..4]
//! assoc.update_from()?;
//! assert_eq!(assoc.host(), &[3, 4]);
//! drop(assoc);
//! assert!(rt.live_mappings().is_empty());
//! # Ok::<(), offload::Error>(())
//! ```

use std::marker::PhantomData;
use std::panic::Location;

use crate::api::{Device, DeviceSlice, KernelArgument, SharedView};
use crate::data_env::UpdateDirection;
use crate::error::{Error, Result};
use crate::kernel::{DeviceCopy, Kernel, LaunchArg};
use crate::range::HostRange;
use crate::rt::Caller;

/// `len` elements of `T` in one device's memory, freed on drop.
pub struct DeviceBuffer<'rt, T: DeviceCopy> {
    device: Device<'rt>,
    addr: u64,
    len: usize,
    /// Where the program made it, for the trace line of its free at drop.
    made_at: &'static Location<'static>,
    _elements: PhantomData<T>,
}

impl<T: DeviceCopy> std::fmt::Debug for DeviceBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device.number())
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .finish()
    }
}

impl<'rt, T: DeviceCopy> DeviceBuffer<'rt, T> {
    const ELEM: usize = std::mem::size_of::<T>();

    /// `len` elements of `device`'s memory (host memory on the initial device), with
    /// unspecified contents: zeroes on host devices and the initial device, whatever the
    /// GPU's allocator left on a GPU (any bits are a valid `T`). Traced as
    /// `omp_target_alloc` is, with the caller's `file:line`; so is its free at drop.
    #[track_caller]
    pub fn new(device: &Device<'rt>, len: usize) -> Result<Self> {
        Self::made_by(device, len, Caller::here("DeviceBuffer::new"))
    }

    fn made_by(device: &Device<'rt>, len: usize, who: Caller) -> Result<Self> {
        let bytes = len.checked_mul(Self::ELEM).ok_or_else(|| Error::Overflow {
            routine: "DeviceBuffer::new",
            what: format!("device {}: {len} elements of {} bytes", device.number(), Self::ELEM),
        })?;
        let addr = device.runtime().target_alloc_by(bytes, device.number(), who)?;
        Ok(Self { device: *device, addr, len, made_at: who.at, _elements: PhantomData })
    }

    /// A device copy of `data`.
    #[track_caller]
    pub fn from_slice(device: &Device<'rt>, data: &[T]) -> Result<Self> {
        let mut b = Self::made_by(device, data.len(), Caller::here("DeviceBuffer::from_slice"))?;
        b.write(0, data)?;
        Ok(b)
    }

    /// The buffer as a view, taken wherever a mapped view is: a generated kernel's
    /// argument (`&[T]` or `&mut [T]`: kernels may write it, as they may a buffer passed by
    /// reference), [`Device::gemm`]'s operands, [`DeviceSlice::slice`] for part of it. It
    /// names device memory itself, so no present table is consulted and no construct maps
    /// or copies through it; an exit through it is refused.
    ///
    /// ```
    /// use offload::{DeviceBuffer, Runtime};
    ///
    /// #[offload::kernel]
    /// fn square(i: usize, x: &mut [f32]) {
    ///     x[i] *= x[i];
    /// }
    ///
    /// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build()?;
    /// let dev = rt.device(0)?;
    /// let b = DeviceBuffer::from_slice(&dev, &[1f32, 2.0, 3.0])?;
    /// square::launch(&dev, 3, b.view())?;
    /// assert_eq!(b.to_vec()?, [1.0, 4.0, 9.0]);
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn view(&self) -> DeviceSlice<'_, T> {
        DeviceSlice {
            device: self.device.number(),
            host: self.addr as usize,
            len: self.len,
            writable: false,
            scratch: true,
            resident: true,
            on_exit: crate::api::ViewExit::Refuse,
            _borrow: PhantomData,
        }
    }

    /// The device.
    pub fn device(&self) -> Device<'rt> {
        self.device
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of element 0 (0 for an empty buffer).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    fn bytes(&self) -> usize {
        self.len * Self::ELEM
    }

    /// `offset..offset + n` checked to lie in the buffer, in bytes.
    fn span(&self, routine: &'static str, offset: usize, n: usize) -> Result<(usize, usize)> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok((offset * Self::ELEM, n * Self::ELEM)),
            _ => Err(Error::InvalidArgument {
                routine,
                what: format!(
                    "device {}: elements {offset}..{offset}+{n} of a buffer of {}; expected a range within 0..{}",
                    self.device.number(),
                    self.len,
                    self.len
                ),
            }),
        }
    }

    /// On the initial device, a hold of its memory for a read through `&self`: a kernel
    /// there may be writing the buffer from another thread.
    fn hold_if_initial(&self, what: &'static str) -> Result<Option<crate::rt::InitialDeviceHold<'rt>>> {
        let rt = self.device.runtime();
        if self.device.number() == rt.initial_device() {
            return rt.hold_initial_device(false, what).map(Some);
        }
        Ok(None)
    }

    /// Copies `src` into the buffer from element `offset`.
    pub fn write(&mut self, offset: usize, src: &[T]) -> Result<()> {
        let (at, bytes) = self.span("DeviceBuffer::write", offset, src.len())?;
        let rt = self.device.runtime();
        // SAFETY: the destination lies in this buffer's allocation (checked), which `&mut
        // self` keeps alive; `src` is borrowed for the call.
        unsafe {
            rt.target_memcpy(
                self.addr,
                src.as_ptr() as u64,
                bytes,
                at,
                0,
                self.device.number(),
                rt.initial_device(),
            )
        }
    }

    /// Copies elements `offset..offset + dst.len()` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [T]) -> Result<()> {
        let (at, bytes) = self.span("DeviceBuffer::read", offset, dst.len())?;
        let rt = self.device.runtime();
        let _hold = self.hold_if_initial("DeviceBuffer::read")?;
        // SAFETY: the source lies in this buffer's allocation (checked); `dst` is borrowed
        // exclusively for the call and any bits are a valid `T`.
        unsafe {
            rt.target_memcpy(
                dst.as_mut_ptr() as u64,
                self.addr,
                bytes,
                0,
                at,
                rt.initial_device(),
                self.device.number(),
            )
        }
    }

    /// The whole buffer, copied to the host.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = Vec::with_capacity(self.len);
        // SAFETY: `T: DeviceCopy` accepts every bit pattern, so zeroed memory is a valid
        // `T`; the vector is filled before use.
        v.resize(self.len, unsafe { std::mem::zeroed() });
        self.read(0, &mut v)?;
        Ok(v)
    }

    /// Copies all of `src` (of the same length, on any device of the same runtime) into
    /// the buffer: by peer access between GPUs that have it, else through the host.
    pub fn copy_from(&mut self, src: &DeviceBuffer<'_, T>) -> Result<()> {
        if src.len != self.len || !self.device.runtime().same_as(src.device.runtime()) {
            return Err(Error::InvalidArgument {
                routine: "DeviceBuffer::copy_from",
                what: format!(
                    "device {}: a buffer of {} elements from one of {} on device {}; expected the same \
                     length and runtime",
                    self.device.number(),
                    self.len,
                    src.len,
                    src.device.number()
                ),
            });
        }
        let _hold = src.hold_if_initial("DeviceBuffer::copy_from")?;
        // SAFETY: both ranges are whole live allocations of their devices, kept alive by
        // the borrows; `&mut self` excludes other writes through this buffer.
        unsafe {
            self.device.runtime().target_memcpy(
                self.addr,
                src.addr,
                self.bytes(),
                0,
                0,
                self.device.number(),
                src.device.number(),
            )
        }
    }

    /// Sets every byte of the buffer to `byte`.
    pub fn fill_bytes(&mut self, byte: u8) -> Result<()> {
        // SAFETY: the whole allocation, alive for the call.
        unsafe { self.device.runtime().target_memset(self.addr, byte, self.bytes(), self.device.number()) }
    }

    /// `omp_target_associate_ptr(host, buffer, size, offset * size_of::<T>(), device)`:
    /// `host` becomes present on the buffer's device at elements `offset..offset +
    /// host.len()` of the buffer, until the returned guard drops. Maps of it then copy
    /// nothing (its count is infinite); [`Association::update_to`] and
    /// [`Association::update_from`] move data.
    #[track_caller]
    pub fn associate<'b, 'h>(&'b self, host: &'h mut [T], offset: usize) -> Result<Association<'b, 'h, T>> {
        let who = Caller::here("DeviceBuffer::associate");
        let (at, bytes) = self.span("DeviceBuffer::associate", offset, host.len())?;
        let rt = self.device.runtime();
        let (h, d) = (host.as_mut_ptr() as usize, self.device.number());
        // SAFETY: the device range lies in this buffer (checked), which the guard borrows,
        // so it outlives the association.
        unsafe { rt.associate_ptr_by((h, self.addr, bytes, at, d), who)? };
        Ok(Association { buffer: self, host, made_at: who.at })
    }
}

impl<T: DeviceCopy> Drop for DeviceBuffer<'_, T> {
    fn drop(&mut self) {
        // Inside a recorded body too (see `recorder::outside`).
        crate::rt::recorder::outside(|| {
            let who = Caller { routine: "omp_target_free of the DeviceBuffer made", at: self.made_at };
            // SAFETY: the allocation is this value's; launches borrowing it have returned and
            // an association borrows it, so none is left.
            let _ = unsafe { self.device.runtime().target_free_by(self.addr, self.device.number(), who) };
        })
    }
}

// SAFETY: the argument names the buffer's whole allocation, alive while borrowed.
unsafe impl<T: DeviceCopy> KernelArgument for &DeviceBuffer<'_, T> {
    fn launch_arg(&self, device: usize, index: usize, kernel: &Kernel) -> Result<LaunchArg> {
        if self.device.number() != device {
            return Err(Error::KernelArgument {
                kernel: kernel.name(),
                index,
                what: format!(
                    "a buffer of device {} passed to a launch on device {device}",
                    self.device.number()
                ),
            });
        }
        Ok(LaunchArg::Device(self.addr))
    }

    fn view_range(&self) -> Option<HostRange> {
        // Its extent, so that kernels on the initial device (where it is host memory) are
        // bounds-checked.
        Some(HostRange::new(self.addr as usize, self.bytes()))
    }
}

// SAFETY: the argument names the buffer's whole allocation, alive while borrowed.
unsafe impl<T: DeviceCopy> SharedView for &DeviceBuffer<'_, T> {
    fn shared_range(&self) -> Option<HostRange> {
        None
    }
}

/// A host slice associated with part of a [`DeviceBuffer`]; disassociated on drop. See
/// [`DeviceBuffer::associate`].
#[must_use = "dropping the guard disassociates at once"]
pub struct Association<'b, 'h, T: DeviceCopy> {
    buffer: &'b DeviceBuffer<'b, T>,
    host: &'h mut [T],
    /// Where the program made it, for the trace line of its end at drop.
    made_at: &'static Location<'static>,
}

impl<T: DeviceCopy> std::fmt::Debug for Association<'_, '_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Association")
            .field("device", &self.buffer.device.number())
            .field("host", &HostRange::of(self.host))
            .finish()
    }
}

impl<'b, 'h, T: DeviceCopy> Association<'b, 'h, T> {
    fn range(&self) -> HostRange {
        HostRange::of(self.host)
    }

    /// The associated host range as a kernel argument (translated through the present
    /// table to the buffer's memory).
    pub fn view(&self) -> DeviceSlice<'_, T> {
        let mut v = crate::api::view_of(self.host, self.buffer.device.number(), true);
        // The guard ends the association; an exit through the view is refused.
        v.on_exit = crate::api::ViewExit::Refuse;
        v
    }

    /// The host copy.
    pub fn host(&self) -> &[T] {
        self.host
    }

    /// The host copy, to change before [`Association::update_to`]. (Kernels reach the
    /// buffer's memory, never this: associations exist on devices with memory of their
    /// own only.)
    pub fn host_mut(&mut self) -> &mut [T] {
        self.host
    }

    /// `#pragma omp target update to(host)`: the host copy into the buffer.
    #[track_caller]
    pub fn update_to(&self) -> Result<()> {
        let d = self.buffer.device;
        // SAFETY: the host slice is borrowed by the guard, which `&self` keeps.
        unsafe { d.runtime().update(d.number(), UpdateDirection::To, &[(self.range(), true)]) }
    }

    /// `#pragma omp target update from(host)`: the buffer's part into the host copy.
    #[track_caller]
    pub fn update_from(&mut self) -> Result<()> {
        let d = self.buffer.device;
        // SAFETY: the host slice is borrowed exclusively by the guard, which `&mut self`
        // keeps; any bits are a valid `T`.
        unsafe { d.runtime().update(d.number(), UpdateDirection::From, &[(self.range(), true)]) }
    }
}

impl<T: DeviceCopy> Drop for Association<'_, '_, T> {
    fn drop(&mut self) {
        // Inside a recorded body too (see `recorder::outside`).
        crate::rt::recorder::outside(|| {
            let d = self.buffer.device;
            let who =
                Caller { routine: "omp_target_disassociate_ptr of the Association made", at: self.made_at };
            // SAFETY: launches through the view have returned (they borrow the guard).
            let _ = unsafe { d.runtime().disassociate_ptr_by(self.host.as_ptr() as usize, d.number(), who) };
        })
    }
}
