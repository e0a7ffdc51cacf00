//! The OpenMP constructs in Rust shape: `target data`, `target enter/exit data`,
//! `target update`, target launches, and `synchronize`.

use super::*;

impl Runtime {
    // ---- map constructs ------------------------------------------------------------

    /// `#pragma omp target data map(...)`, the opening half: maps `items` (each moving the
    /// entry's reference count, or its hold count with [`MapType::hold`]). On the initial
    /// device it does nothing.
    ///
    /// [`MapType::hold`]: crate::MapType::hold
    ///
    /// # Safety
    /// Each item's host range must stay valid until the matching
    /// [`Runtime::target_data_end`], and `from` ranges must not be read or written
    /// elsewhere during that call.
    pub unsafe fn target_data_begin(&self, device: usize, items: &[MapItem]) -> Result<()> {
        let target = self.target(device)?;
        validate::map_list(Construct::TargetData, device, items)?;
        match target {
            // SAFETY: forwarded from the caller.
            Target::Device(d) => unsafe { d.map_enter(items, Construct::TargetData) },
            Target::Initial => Ok(()),
        }
    }

    /// The closing half of `target data`: unmaps `items` (the same list) in reverse order.
    ///
    /// # Safety
    /// As [`Runtime::target_data_begin`].
    pub unsafe fn target_data_end(&self, device: usize, items: &[MapItem]) -> Result<()> {
        let target = self.target(device)?;
        validate::map_list(Construct::TargetData, device, items)?;
        match target {
            // SAFETY: forwarded from the caller.
            Target::Device(d) => unsafe { d.map_exit(items, Construct::TargetData) },
            Target::Initial => Ok(()),
        }
    }

    /// `#pragma omp target enter data map(...)`.
    ///
    /// # Safety
    /// Each item's host range must be valid for reads during the call.
    pub unsafe fn enter_data(&self, device: usize, items: &[MapItem]) -> Result<()> {
        let target = self.target(device)?;
        validate::map_list(Construct::EnterData, device, items)?;
        match target {
            // SAFETY: forwarded from the caller.
            Target::Device(d) => unsafe { d.map_enter(items, Construct::EnterData) },
            Target::Initial => Ok(()),
        }
    }

    /// `#pragma omp target exit data map(...)`.
    ///
    /// # Safety
    /// Each `from` item's host range must be valid for writes and not otherwise accessed
    /// during the call.
    pub unsafe fn exit_data(&self, device: usize, items: &[MapItem]) -> Result<()> {
        let target = self.target(device)?;
        validate::map_list(Construct::ExitData, device, items)?;
        match target {
            // SAFETY: forwarded from the caller.
            Target::Device(d) => unsafe { d.map_exit(items, Construct::ExitData) },
            Target::Initial => Ok(()),
        }
    }

    /// `#pragma omp target update to(...)` / `from(...)`; each range with its `present`
    /// modifier.
    ///
    /// # Safety
    /// Host ranges valid for reads (`To`) or exclusive writes (`From`) during the call.
    pub unsafe fn update(
        &self,
        device: usize,
        dir: UpdateDirection,
        items: &[(HostRange, bool)],
    ) -> Result<()> {
        let target = self.target(device)?;
        validate::update_list(device, items)?;
        match target {
            // SAFETY: forwarded from the caller.
            Target::Device(d) => unsafe { d.update(items, dir) },
            Target::Initial => Ok(()),
        }
    }

    /// `#pragma omp target map(...)`: maps `maps`, runs `kernel` over `n` work items with
    /// `args` (mapped host addresses translated to device addresses), then unmaps `maps`.
    /// On the initial device the kernel's host implementation runs on host memory.
    /// A non-null `Device` argument that points into no live allocation of the device (nor
    /// of a device it has peer access to) is refused before anything is mapped.
    ///
    /// # Safety
    /// As [`Runtime::target_data_begin`] for `maps`; `Device` arguments must be device
    /// memory of at least what the kernel touches; on the initial device `Mapped`
    /// arguments must be valid host memory for what the kernel touches.
    pub unsafe fn target_launch(
        &self,
        device: usize,
        kernel: &Kernel,
        n: usize,
        maps: &[MapItem],
        args: &[LaunchArg],
    ) -> Result<()> {
        let target = self.target(device)?;
        validate::map_list(Construct::Target, device, maps)?;
        let d = match target {
            Target::Device(d) => d,
            Target::Initial => return self.run_on_host(kernel, n, args, &[]),
        };
        self.check_device_args(d, kernel, args)?;
        // SAFETY: forwarded from the caller.
        unsafe { d.map_enter(maps, Construct::Target)? };
        // Mapped memory the kernel uses stays allocated until it has run (`_in_use`).
        let launched = d.translate_args(kernel, args).and_then(|(a, _in_use)| {
            d.trace_launch(kernel, n, &a);
            d.backend.launch(kernel, n, &a)
        });
        // Unmapped whatever the kernel did, so nothing stays mapped on error.
        // SAFETY: forwarded from the caller.
        let exited = unsafe { d.map_exit(maps, Construct::Target) };
        launched.and(exited)
    }

    /// Checks that every non-null `LaunchArg::Device` of a launch on `d` points into a live
    /// allocation of `d`, or of a device whose memory `d` reaches by peer access (halo
    /// exchanges pass a neighbour's rows).
    fn check_device_args(&self, d: &DeviceState, kernel: &Kernel, args: &[LaunchArg]) -> Result<()> {
        for (index, a) in args.iter().enumerate() {
            let LaunchArg::Device(p) = *a else { continue };
            if p == 0 || d.pool.extent(p).is_some() {
                continue;
            }
            let on_peer = self.inner.peer_access
                && self.inner.devices.iter().any(|q| {
                    q.number != d.number
                        && d.backend.can_access_peer(&*q.backend)
                        && q.pool.extent(p).is_some()
                });
            if !on_peer {
                return Err(Error::KernelArgument {
                    kernel: kernel.name(),
                    index,
                    what: format!(
                        "device {p:#x} is not inside a live allocation of device {}, nor of a device it \
                         has peer access to; expected a `target_alloc` block or a mapped entry's memory",
                        d.number
                    ),
                });
            }
        }
        Ok(())
    }

    /// Runs `kernel` on the initial device; `extents[i]`, where given, is how many bytes
    /// mapped argument `i` spans (the host memory it names is all there is).
    pub(crate) fn run_on_host(
        &self,
        kernel: &Kernel,
        n: usize,
        args: &[LaunchArg],
        extents: &[Option<usize>],
    ) -> Result<()> {
        let f = kernel.host_fn().ok_or(Error::NoKernelImpl {
            device: self.initial_device(),
            kernel: kernel.name(),
            backend: "host fallback",
        })?;
        let args: Vec<KernelArg> = args
            .iter()
            .enumerate()
            .map(|(i, a)| match *a {
                LaunchArg::Mapped(h) => {
                    KernelArg::Ptr { addr: h as u64, bytes: extents.get(i).copied().flatten() }
                }
                LaunchArg::Device(p) => KernelArg::Ptr { addr: p, bytes: extents.get(i).copied().flatten() },
                LaunchArg::MappedBase { base, .. } => KernelArg::Ptr { addr: base as u64, bytes: None },
                LaunchArg::Value(s) => KernelArg::Scalar(s),
            })
            .collect();
        let _hold = self.hold_initial_device(true, kernel.name())?;
        run_host_kernel(&self.inner.kernel_pool, self.initial_device(), kernel.name(), f, n, &args)
    }

    /// Waits for all work queued on `device`.
    pub fn synchronize(&self, device: usize) -> Result<()> {
        match self.target(device)? {
            Target::Device(d) => d.backend.synchronize(),
            Target::Initial => Ok(()),
        }
    }
}
