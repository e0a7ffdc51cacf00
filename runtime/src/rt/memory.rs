//! Device memory routines: `omp_target_alloc`/`omp_target_free` and
//! `omp_target_associate_ptr`/`omp_target_disassociate_ptr`.

use std::panic::Location;

use super::*;
use crate::info::{InfoFields, InfoFlags};

/// Who called a device memory routine, for its trace line: the routine as the program
/// named it (`omp_target_alloc`, `DeviceBuffer::new`, ...) and where.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caller {
    pub(crate) routine: &'static str,
    pub(crate) at: &'static Location<'static>,
}

impl Caller {
    /// `routine`, called from the caller's caller (`#[track_caller]` through).
    #[track_caller]
    pub(crate) fn here(routine: &'static str) -> Self {
        Self { routine, at: Location::caller() }
    }
}

/// The arguments of [`Runtime::associate_ptr`]: host address, device pointer, bytes,
/// device offset, device.
pub(crate) type AssociateArgs = (usize, u64, usize, usize, usize);

impl Runtime {
    /// The trace line of a device memory routine (`OFFLOAD_INFO` 0x01, as a construct's):
    /// `device D: ROUTINE at FILE:LINE: WHAT`, or `... failed: ERROR`.
    fn trace_routine<T>(&self, device: usize, who: Caller, r: &Result<T>, what: impl FnOnce(&T) -> String) {
        let fields = || InfoFields {
            kind: "memory routine",
            device: Some(device),
            at: Some(who.at),
            ..InfoFields::default()
        };
        self.inner.trace.event(InfoFlags::KERNEL_ARGS, fields, || {
            let outcome = match r {
                Ok(v) => what(v),
                Err(e) => format!("failed: {e}"),
            };
            format!("device {device}: {} at {}:{}: {outcome}", who.routine, who.at.file(), who.at.line())
        });
    }

    // ---- device memory routines -----------------------------------------------------

    /// `omp_target_alloc`: `bytes` of device memory (host memory on the initial device);
    /// 0 (null) when `bytes` is 0. Traced with the caller's `file:line` (`OFFLOAD_INFO`
    /// 0x01), as are [`Runtime::target_free`], [`Runtime::associate_ptr`] and
    /// [`Runtime::disassociate_ptr`]:
    ///
    /// ```
    /// use offload::{InfoFlags, Runtime};
    ///
    /// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1);
    /// let rt = rt.info(InfoFlags::KERNEL_ARGS).capture_info().build()?;
    /// let p = rt.target_alloc(64, 0)?;
    /// unsafe { rt.target_free(p, 0)? };
    /// let lines = rt.take_info();
    /// let at = format!("at {}:", file!());
    /// assert!(lines[0].starts_with(&format!("device 0: omp_target_alloc {at}")), "{lines:?}");
    /// assert!(lines[0].ends_with(&format!(": 64 bytes -> device {p:#x}")), "{lines:?}");
    /// assert!(lines[1].ends_with(&format!(": device {p:#x}")), "{lines:?}");
    /// # Ok::<(), offload::Error>(())
    /// ```
    #[track_caller]
    pub fn target_alloc(&self, bytes: usize, device: usize) -> Result<u64> {
        self.target_alloc_by(bytes, device, Caller::here("omp_target_alloc"))
    }

    /// [`Runtime::target_alloc`] for `who`.
    pub(crate) fn target_alloc_by(&self, bytes: usize, device: usize, who: Caller) -> Result<u64> {
        let r = self.alloc_on(bytes, device);
        self.trace_routine(device, who, &r, |p| format!("{bytes} bytes -> device {p:#x}"));
        r
    }

    fn alloc_on(&self, bytes: usize, device: usize) -> Result<u64> {
        if bytes == 0 {
            return Ok(0);
        }
        match self.target(device)? {
            Target::Device(d) => d.alloc_user(bytes),
            Target::Initial => {
                let layout = Layout::from_size_align(bytes, 256).map_err(|e| Error::InvalidArgument {
                    routine: "omp_target_alloc",
                    what: e.to_string(),
                })?;
                // Zeroed, so a buffer read before any write holds initialised bytes.
                // SAFETY: non-zero size, valid layout.
                let p = unsafe { std::alloc::alloc_zeroed(layout) };
                if p.is_null() {
                    return Err(Error::OutOfMemory { device, requested: bytes, free: 0, total: 0 });
                }
                self.inner.host_allocs.lock().insert(p as usize, layout);
                Ok(p as u64)
            }
        }
    }

    /// `omp_target_free`: frees what [`Runtime::target_alloc`] gave; null is a no-op.
    ///
    /// # Safety
    /// No kernel or copy may use the memory afterwards.
    #[track_caller]
    pub unsafe fn target_free(&self, ptr: u64, device: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.target_free_by(ptr, device, Caller::here("omp_target_free")) }
    }

    /// [`Runtime::target_free`] for `who`.
    ///
    /// # Safety
    /// As [`Runtime::target_free`].
    pub(crate) unsafe fn target_free_by(&self, ptr: u64, device: usize, who: Caller) -> Result<()> {
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.free_on(ptr, device) };
        self.trace_routine(device, who, &r, |()| format!("device {ptr:#x}"));
        r
    }

    /// # Safety
    /// As [`Runtime::target_free`].
    unsafe fn free_on(&self, ptr: u64, device: usize) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        // Waited for, not reported: a free goes on whatever the queued work did (a failure
        // of it stays for a synchronising call), so that nothing leaks.
        match self.waited(device)? {
            // An association into the block would outlive it: refused, as for a mapping.
            Target::Device(d) => d.free_user(ptr),
            Target::Initial => {
                let layout =
                    self.inner.host_allocs.lock().remove(&(ptr as usize)).ok_or(
                        Error::UnknownDevicePointer { device, addr: ptr, routine: "omp_target_free" },
                    )?;
                // SAFETY: allocated by `target_alloc` with this layout, removed once.
                unsafe { std::alloc::dealloc(ptr as usize as *mut u8, layout) };
                Ok(())
            }
        }
    }

    /// `omp_target_associate_ptr`: makes `[host, host+bytes)` present on `device` at
    /// `device_ptr + device_offset`, with an infinite count. The device range must lie
    /// inside one live allocation of `device` (a `target_alloc` block), checked before
    /// anything is associated; the host range must not overflow.
    ///
    /// # Safety
    /// `device_ptr + device_offset` must be device memory of at least `bytes`, valid until
    /// [`Runtime::disassociate_ptr`].
    #[track_caller]
    pub unsafe fn associate_ptr(
        &self,
        host: usize,
        device_ptr: u64,
        bytes: usize,
        device_offset: usize,
        device: usize,
    ) -> Result<()> {
        let who = Caller::here("omp_target_associate_ptr");
        // SAFETY: forwarded from the caller.
        unsafe { self.associate_ptr_by((host, device_ptr, bytes, device_offset, device), who) }
    }

    /// [`Runtime::associate_ptr`] for `who`, with its arguments in their order.
    ///
    /// # Safety
    /// As [`Runtime::associate_ptr`].
    pub(crate) unsafe fn associate_ptr_by(&self, args: AssociateArgs, who: Caller) -> Result<()> {
        let (host, device_ptr, bytes, device_offset, device) = args;
        let r = (|| {
            const ASSOCIATE: &str = "omp_target_associate_ptr";
            let bad = |what: &str| Error::InvalidArgument {
                routine: ASSOCIATE,
                what: format!(
                    "device {device}: host {host:#x}, device {device_ptr:#x}, {bytes} bytes: {what}"
                ),
            };
            if host == 0 {
                return Err(bad("host pointer is null; expected a host address"));
            }
            if device_ptr == 0 {
                return Err(bad("device pointer is null; expected a device address"));
            }
            if bytes == 0 {
                return Err(bad("size is 0; expected a non-zero size"));
            }
            let d = match self.target(device)? {
                Target::Device(d) => d,
                Target::Initial => {
                    return Err(bad(&format!(
                        "the initial device cannot have associated pointers (its memory is host \
                         memory); expected an offload device (0..{})",
                        self.num_devices()
                    )))
                }
            };
            let range = HostRange::new(host, bytes);
            validate::host_range(ASSOCIATE, device, &"host range", range)?;
            let addr = validate::offset(ASSOCIATE, "device pointer", device_ptr, device_offset)?;
            d.associate(range, addr)
        })();
        self.trace_routine(device, who, &r, |()| {
            let to = device_ptr.wrapping_add(device_offset as u64);
            format!("{} -> device {to:#x}", HostRange::new(host, bytes))
        });
        r
    }

    /// `omp_target_disassociate_ptr`: removes an association made by
    /// [`Runtime::associate_ptr`]; never frees the device memory.
    ///
    /// # Safety
    /// No kernel may be using the association.
    #[track_caller]
    pub unsafe fn disassociate_ptr(&self, host: usize, device: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.disassociate_ptr_by(host, device, Caller::here("omp_target_disassociate_ptr")) }
    }

    /// [`Runtime::disassociate_ptr`] for `who`.
    ///
    /// # Safety
    /// As [`Runtime::disassociate_ptr`].
    pub(crate) unsafe fn disassociate_ptr_by(&self, host: usize, device: usize, who: Caller) -> Result<()> {
        let r = self.disassociate_on(host, device);
        self.trace_routine(device, who, &r, |()| format!("host {host:#x}"));
        r
    }

    fn disassociate_on(&self, host: usize, device: usize) -> Result<()> {
        if host == 0 {
            return Err(Error::InvalidArgument {
                routine: "omp_target_disassociate_ptr",
                what: "host pointer is null".into(),
            });
        }
        match self.target(device)? {
            Target::Device(d) => d.disassociate(host),
            Target::Initial => Err(Error::InvalidArgument {
                routine: "omp_target_disassociate_ptr",
                what: format!(
                    "device {device}: the initial device has no associated pointers; expected an \
                     offload device (0..{})",
                    self.num_devices()
                ),
            }),
        }
    }
}
