//! Device memory routines: `omp_target_alloc`/`omp_target_free` and
//! `omp_target_associate_ptr`/`omp_target_disassociate_ptr`.

use super::*;

impl Runtime {
    // ---- device memory routines -----------------------------------------------------

    /// `omp_target_alloc`: `bytes` of device memory (host memory on the initial device);
    /// 0 (null) when `bytes` is 0.
    pub fn target_alloc(&self, bytes: usize, device: usize) -> Result<u64> {
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
    pub unsafe fn target_free(&self, ptr: u64, device: usize) -> Result<()> {
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
    pub unsafe fn associate_ptr(
        &self,
        host: usize,
        device_ptr: u64,
        bytes: usize,
        device_offset: usize,
        device: usize,
    ) -> Result<()> {
        const ASSOCIATE: &str = "omp_target_associate_ptr";
        let bad = |what: &str| Error::InvalidArgument {
            routine: ASSOCIATE,
            what: format!("device {device}: host {host:#x}, device {device_ptr:#x}, {bytes} bytes: {what}"),
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
    }

    /// `omp_target_disassociate_ptr`: removes an association made by
    /// [`Runtime::associate_ptr`]; never frees the device memory.
    ///
    /// # Safety
    /// No kernel may be using the association.
    pub unsafe fn disassociate_ptr(&self, host: usize, device: usize) -> Result<()> {
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
