//! What a runtime and its devices say about themselves: devices, placement, staging,
//! counters, and the present tables (`omp_target_is_present`, `omp_get_mapped_ptr`, dumps).

use super::*;

impl Runtime {
    /// Number of offload devices (the initial device not counted).
    pub fn num_devices(&self) -> usize {
        self.inner.devices.len()
    }

    /// The initial device's number: `num_devices()`, as in LLVM's OpenMP.
    pub fn initial_device(&self) -> usize {
        self.inner.devices.len()
    }

    /// `omp_get_default_device`: the calling thread's choice ([`Runtime::set_default_device`]),
    /// else `OMP_DEFAULT_DEVICE`, else device 0 when there is one, else the initial device.
    pub fn default_device(&self) -> usize {
        let id = self.inner.id;
        let mine = DEFAULT_DEVICE.with(|d| d.borrow().iter().find(|(r, _)| *r == id).map(|&(_, n)| n));
        if let Some(n) = mine {
            return n;
        }
        self.inner.settings.default_device.unwrap_or(if self.inner.devices.is_empty() {
            self.initial_device()
        } else {
            0
        })
    }

    /// `omp_set_default_device`: makes `device` (an offload device or the initial device)
    /// the calling thread's default device in this runtime. OpenMP keeps the setting per
    /// task; here it is per thread (a `nowait` task's lane thread starts from the runtime's
    /// setting).
    ///
    /// ```
    /// let rt = offload::Runtime::builder().host_devices(2).build()?;
    /// assert_eq!(rt.default_device(), 0);
    /// rt.set_default_device(1)?;
    /// assert_eq!(rt.default_device(), 1);
    /// assert!(rt.set_default_device(9).is_err()); // no device 9: unchanged
    /// std::thread::scope(|s| {
    ///     s.spawn(|| assert_eq!(rt.default_device(), 0)); // another thread: its own choice
    /// });
    /// # Ok::<(), offload::Error>(())
    /// ```
    ///
    /// Under `OMP_TARGET_OFFLOAD=disabled` it is accepted for any `device` and changes
    /// nothing: there are no devices, so the initial device stays the default (programs
    /// written for offload call it freely, and libomptarget does not refuse it there).
    pub fn set_default_device(&self, device: usize) -> Result<()> {
        if self.policy() == OffloadPolicy::Disabled {
            return Ok(());
        }
        self.target(device)?;
        let id = self.inner.id;
        DEFAULT_DEVICE.with(|d| {
            let mut d = d.borrow_mut();
            d.retain(|(r, _)| *r != id);
            d.push((id, device));
        });
        Ok(())
    }

    /// `omp_get_device_num`: the device the calling thread runs on: inside a kernel of a
    /// host device (its host code runs on that device's own threads), that device; anywhere
    /// else, the initial device.
    pub fn device_num(&self) -> usize {
        self.inner
            .devices
            .iter()
            .find(|d| d.runs_current_thread())
            .map_or(self.initial_device(), |d| d.number())
    }

    /// Whether the calling thread runs a kernel of one of this runtime's host devices or of
    /// its initial device.
    pub(crate) fn in_kernel(&self) -> bool {
        self.device_num() != self.initial_device() || self.inner.kernel_pool.current_thread_index().is_some()
    }

    /// `omp_is_initial_device`: whether the calling thread runs on the initial device
    /// (`false` only inside a host device's kernels).
    pub fn is_initial_device(&self) -> bool {
        self.device_num() == self.initial_device()
    }

    /// `omp_target_is_accessible`: whether `device` can read and write the host range
    /// `host` directly, without mapping. The initial device can; a host device cannot (its
    /// memory is separate by design); a GPU can reach host memory that the runtime has
    /// page-locked through a driver of its own backend (a [`Runtime::pin`] guard, a
    /// [`crate::HostBuffer`], or a range the register-in-place policy pinned), since
    /// page-locked memory is mapped into every device's address space (CUDA's and HIP's
    /// unified addressing); other pageable memory is not reported accessible. A range of
    /// zero bytes is accessible wherever the device is valid.
    pub fn is_accessible(&self, host: HostRange, device: usize) -> Result<bool> {
        validate::host_range("omp_target_is_accessible", device, &"the host range", host)?;
        Ok(match self.target(device)? {
            Target::Initial => true,
            Target::Device(_) if host.bytes == 0 => true,
            Target::Device(d) => {
                let kind = d.description().kind;
                kind != crate::backend::BackendKind::Host && self.inner.pinned.pinned_by(host) == Some(kind)
            }
        })
    }

    /// `omp_get_uid_from_device` (OpenMP 6.0): a string that names `device` whatever the
    /// device numbering (`CUDA_VISIBLE_DEVICES` renumbers GPUs; the UID stays): a GPU's
    /// driver UUID (`GPU-...`), or `PCI:` and its bus id when the driver gave none; `host-N`
    /// for host device N (by its index among host devices); `host` for the initial device.
    ///
    /// ```
    /// let rt = offload::Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
    /// assert_eq!(rt.device_uid(1)?, "host-1");
    /// assert_eq!(rt.device_uid(rt.initial_device())?, "host");
    /// assert_eq!(rt.device_from_uid("host-1"), Some(1));
    /// assert_eq!(rt.device_from_uid("GPU-0000"), None);
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn device_uid(&self, device: usize) -> Result<String> {
        Ok(match self.target(device)? {
            Target::Initial => "host".into(),
            Target::Device(d) => d.uid(),
        })
    }

    /// `omp_get_device_from_uid` (OpenMP 6.0): the device whose UID is `uid` (see
    /// [`Runtime::device_uid`]; a GPU's PCI bus id alone is accepted too, in any case), or
    /// `None`.
    pub fn device_from_uid(&self, uid: &str) -> Option<usize> {
        find_uid(self.inner.devices.iter().map(|d| (d.uid(), d.description().pci_bus_id.as_deref())), uid)
    }

    /// The native handles of `device` (its context and compute stream), for the vendor's
    /// own libraries on the runtime's queue: `None` for host devices and the initial
    /// device. What the caller enqueues with them is ordered with the runtime's kernels on
    /// that device; [`Runtime::synchronize`] waits for it too.
    pub fn interop(&self, device: usize) -> Result<Option<crate::backend::Interop>> {
        Ok(match self.target(device)? {
            Target::Initial => None,
            Target::Device(d) => d.interop(),
        })
    }

    /// The `OMP_TARGET_OFFLOAD` policy in force.
    pub fn policy(&self) -> OffloadPolicy {
        self.inner.settings.policy
    }

    /// What each backend found at start-up, one line each.
    pub fn device_report(&self) -> &str {
        &self.inner.report
    }

    /// Identity of device `device`.
    pub fn describe(&self, device: usize) -> Result<&DeviceDescription> {
        Ok(self.device_state(device)?.description())
    }

    /// Test-only: what device `device` saw and failed on purpose, when the runtime was built
    /// with `RuntimeBuilder::inject_faults` (`None` for a device without injected faults).
    #[doc(hidden)]
    pub fn fault_counts(&self, device: usize) -> Result<Option<crate::backend::FaultCounts>> {
        Ok(self.device_state(device)?.fault_injector().map(|i| i.counts()))
    }

    /// Test-only: fails the `k`-th operation of `kind` on device `device` from now on
    /// ([`crate::backend::FaultInjector::arm`]); `false` for a device without injected
    /// faults. `disarm_faults` takes back what has not fired.
    #[doc(hidden)]
    pub fn arm_fault(&self, device: usize, kind: crate::backend::FaultKind, k: u64) -> Result<bool> {
        let injector = self.device_state(device)?.fault_injector();
        injector.iter().for_each(|i| i.arm(kind, k));
        Ok(injector.is_some())
    }

    /// Test-only: takes back device `device`'s armed faults that have not fired.
    #[doc(hidden)]
    pub fn disarm_faults(&self, device: usize) -> Result<()> {
        self.device_state(device)?.fault_injector().iter().for_each(|i| i.disarm());
        Ok(())
    }

    /// Test-only: the constructs that failed on device `device` since the last call, each
    /// with the device before and after it ([`crate::FailedConstruct::check`] says whether
    /// it left what it must); empty unless built with `RuntimeBuilder::inject_faults`.
    #[doc(hidden)]
    pub fn failed_constructs(&self, device: usize) -> Result<Vec<crate::FailedConstruct>> {
        Ok(self.device_state(device)?.take_failed_constructs())
    }

    /// Page-locks `data` in place for as long as the returned guard lives (the slice stays
    /// borrowed). Pinning costs about 64 ms per GiB once (on the H200 machines), so it pays
    /// for buffers copied more than a few times; see the transfer table in docs/PERFORMANCE.md.
    pub fn pin<'a, T: crate::kernel::DeviceCopy>(&self, data: &'a mut [T]) -> Pinned<'a, T> {
        let (ptr, bytes) = (data.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(data));
        // SAFETY: the slice is borrowed for 'a, the guard's lifetime, and unpinned in its drop.
        let by = if bytes == 0 { None } else { unsafe { self.pin_host(ptr, bytes) } };
        Pinned { rt: self.clone(), data, by }
    }

    /// Where device `device` sits: the CPUs and NUMA nodes next to it.
    pub fn placement(&self, device: usize) -> Result<&Placement> {
        Ok(self.device_state(device)?.placement())
    }

    /// The CPUs the device's worker thread is bound to, as read back from the OS (empty
    /// when the topology came from a file), or why binding failed.
    pub fn worker_binding(&self, device: usize) -> Result<std::result::Result<Vec<usize>, String>> {
        Ok(self.device_state(device)?.worker_binding())
    }

    /// The device's staging set-up, making it now if it does not exist yet; `None` for
    /// devices that copy without staging.
    pub fn staging_report(&self, device: usize) -> Result<Option<String>> {
        Ok(self.device_state(device)?.staging_report())
    }

    /// The NUMA nodes holding the device's first staging buffer (this machine only).
    pub fn staging_location(&self, device: usize) -> Result<Vec<usize>> {
        self.device_state(device)?.staging_location()
    }

    /// The topology devices were placed on.
    pub fn topology(&self) -> &Topology {
        &self.inner.topology
    }

    /// Whether copies from device `src` into device `dst` go directly (peer access, or the
    /// same device) rather than through host memory.
    pub fn can_access_peer(&self, dst: usize, src: usize) -> Result<bool> {
        self.check_offload_device(dst)?;
        self.check_offload_device(src)?;
        Ok(self.reaches(dst, src))
    }

    /// Free and total memory of device `device`.
    pub fn mem_info(&self, device: usize) -> Result<MemInfo> {
        // Memory that queued work holds is in use until the work is done (see `pool_usage`).
        self.device_state(device)?.mem_info()
    }

    /// Copies made by device `device` so far.
    pub fn transfer_stats(&self, device: usize) -> Result<TransferStats> {
        Ok(self.device_state(device)?.transfer_stats())
    }

    /// Live allocations and cached free bytes of the device's memory pool: after every
    /// mapping is gone, only `target_alloc` blocks are live.
    pub fn pool_usage(&self, device: usize) -> Result<PoolUsage> {
        // Memory that queued work holds is counted until the work is done.
        let (live_allocations, cached_bytes) = self.device_state(device)?.pool_usage();
        Ok(PoolUsage { live_allocations, cached_bytes })
    }

    /// Trace lines kept by a runtime built with [`RuntimeBuilder::capture_info`].
    pub fn take_info(&self) -> Vec<String> {
        self.inner.trace.take()
    }

    /// Marks this moment on the timeline ([`RuntimeBuilder::trace_file`], `OFFLOAD_TRACE`)
    /// with `text`, on the calling thread's track: a program's own landmarks (the steps of a
    /// lesson, the phases of a solver), drawn with their words by `offload-trace --svg` and
    /// shown as instants (category `note`) in Perfetto. Also given to a program's own
    /// `tracing` subscriber (kind `note`); nothing is printed under `OFFLOAD_INFO`, and
    /// without a timeline or subscriber it costs a check.
    ///
    /// ```
    /// let rt = offload::Runtime::builder().host_devices(1).build()?;
    /// rt.annotate("step 1: map the inputs");
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn annotate(&self, text: &str) {
        self.inner.trace.note(text);
    }

    /// Writes the timeline asked for by [`RuntimeBuilder::trace_file`] or `OFFLOAD_TRACE`
    /// (the Chrome trace-event format, for Perfetto or `chrome://tracing`) with every event
    /// so far, replacing what an earlier flush wrote; the runtime writes it again when
    /// dropped. It waits for the device-side times of the work queued so far (not for
    /// its completion as a construct: failures stay for the next construct to report).
    /// Without a trace file, does nothing.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`](crate::Error::InvalidSetting) for `OFFLOAD_TRACE`, naming
    /// the path, when the file cannot be written.
    pub fn flush_trace(&self) -> Result<()> {
        self.flush_trace_waiting(true)
    }

    /// [`Runtime::flush_trace`], waiting for the device-side times of queued work or (at
    /// process exit, which may come from inside queued work) taking only those reached.
    pub(crate) fn flush_trace_waiting(&self, wait: bool) -> Result<()> {
        for d in &self.inner.devices {
            d.write_spans(wait);
        }
        self.inner.trace.flush_file()
    }

    /// A handle on the captured trace that outlives the runtime (for its shutdown report);
    /// `None` unless built with [`RuntimeBuilder::capture_info`].
    pub fn info_log(&self) -> Option<crate::info::InfoLog> {
        self.inner.trace.log()
    }

    /// `omp_target_is_present`: whether host address `host` lies in a mapped range
    /// (always true on the initial device).
    pub fn is_present(&self, host: usize, device: usize) -> Result<bool> {
        Ok(match self.target(device)? {
            Target::Device(d) => d.is_mapped(host),
            Target::Initial => true,
        })
    }

    /// `omp_get_mapped_ptr`: the device address of host address `host`, `None` (null) when
    /// it is not mapped; `host` itself on the initial device.
    pub fn mapped_ptr(&self, host: usize, device: usize) -> Result<Option<u64>> {
        Ok(match self.target(device)? {
            Target::Device(d) => d.mapped_ptr(host),
            Target::Initial => Some(host as u64),
        })
    }

    /// `use_device_ptr` / `use_device_addr`: the device address that corresponds to host
    /// address `host`, found as libomptarget finds a zero-length section: inside a mapped
    /// range, or below one down to the base pointer its map named ([`MapItem::with_base`]:
    /// after `map(to: A[64:128])` with base `A`, the device address of `A[64]` minus 64
    /// elements). `None` when nothing is mapped there; `host` itself on the initial device.
    ///
    /// [`MapItem::with_base`]: crate::MapItem::with_base
    pub fn use_device_ptr(&self, host: usize, device: usize) -> Result<Option<u64>> {
        Ok(match self.target(device)? {
            Target::Device(d) => d.use_device_ptr(host),
            Target::Initial => Some(host as u64),
        })
    }

    /// The present-table entry containing `host` on `device`, with its counts.
    pub fn entry(&self, host: usize, device: usize) -> Result<Option<Entry>> {
        Ok(self.device_state(device)?.entry(host))
    }

    /// Every live mapping of every device.
    pub fn live_mappings(&self) -> Vec<(usize, Entry)> {
        self.inner.devices.iter().flat_map(|d| d.entries().into_iter().map(|e| (d.number(), e))).collect()
    }

    /// The present table of `device` as text (libomptarget's `ompx_dump_mapping_tables`).
    pub fn dump_present_table(&self, device: usize) -> Result<String> {
        Ok(self.device_state(device)?.dump_table())
    }
}

/// Whether `uid` names the device whose UID is `own` and whose PCI bus id (a GPU's) is
/// `pci`: its UID, or its PCI bus id with or without the `PCI:` prefix; in any case.
pub(crate) fn uid_matches(own: &str, pci: Option<&str>, uid: &str) -> bool {
    let uid = uid.trim();
    own.eq_ignore_ascii_case(uid)
        || pci.is_some_and(|p| p.eq_ignore_ascii_case(uid.trim_start_matches("PCI:")))
}

/// The device (numbered in order, the initial device after them) of `devices`, each its
/// UID and PCI bus id, that `uid` names: `host` is the initial device.
pub(crate) fn find_uid<'a>(
    devices: impl ExactSizeIterator<Item = (String, Option<&'a str>)>,
    uid: &str,
) -> Option<usize> {
    let initial = devices.len();
    if uid.trim().eq_ignore_ascii_case("host") {
        return Some(initial);
    }
    devices.enumerate().find(|(_, (own, pci))| uid_matches(own, *pci, uid)).map(|(i, _)| i)
}
