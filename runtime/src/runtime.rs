//! The runtime: its devices, their present tables, and the OpenMP routines in Rust shape.

use std::alloc::Layout;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::builder::RuntimeBuilder;
use crate::config::{OffloadPolicy, Settings};
use crate::data_env::{Construct, Entry, MapItem, UpdateDirection};
use crate::device::{DeviceDescription, MemInfo};
use crate::device_state::{DeviceState, PinnedRanges, Target, TransferStats};
use crate::error::{Error, HostRange, Result};
use crate::info::Trace;
use crate::kernel::{run_host_kernel, Kernel, KernelArg, Scalar};
use crate::memory_pool::Owner;
use crate::topology::{Placement, Topology};
use crate::validate;

/// What a device's memory pool holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    /// Allocations handed out and not freed (entries' device copies and `target_alloc`s).
    pub live_allocations: usize,
    /// Bytes of freed blocks kept for reuse.
    pub cached_bytes: usize,
}

/// An argument of a target launch in the OpenMP shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LaunchArg {
    /// A host address inside a mapped range: the kernel gets its device address.
    Mapped(usize),
    /// A device address used as is (e.g. from `target_alloc`).
    Device(u64),
    /// A value.
    Value(Scalar),
}

impl LaunchArg {
    /// A host pointer to translate through the present table.
    pub fn mapped<T>(p: *const T) -> Self {
        LaunchArg::Mapped(p as usize)
    }
}

/// What a runtime has: its devices and the state shared by all of them (made by
/// [`RuntimeBuilder::build`](crate::RuntimeBuilder::build)).
pub(crate) struct Inner {
    pub(crate) devices: Vec<DeviceState>,
    pub(crate) settings: Settings,
    pub(crate) report: String,
    pub(crate) trace: Arc<Trace>,
    pub(crate) kernel_pool: Arc<rayon::ThreadPool>,
    pub(crate) host_allocs: Mutex<HashMap<usize, Layout>>,
    pub(crate) peer_access: bool,
    pub(crate) pinned: Arc<PinnedRanges>,
    pub(crate) topology: Arc<Topology>,
}

/// An offload runtime: devices, one present table per device, and every OpenMP mapping
/// routine. Cheap to clone (shared).
///
/// ```
/// use offload::{MapItem, MapType, Runtime};
/// let rt = Runtime::builder().host_devices(2).build()?;
/// let x = [1.0f32; 8];
/// unsafe { rt.enter_data(0, &[MapItem::slice(&x, MapType::TO)])? };
/// assert!(rt.is_present(x.as_ptr() as usize, 0)?);
/// assert!(!rt.is_present(x.as_ptr() as usize, 1)?);
/// unsafe { rt.exit_data(0, &[MapItem::slice(&x, MapType::RELEASE)])? };
/// # Ok::<(), offload::Error>(())
/// ```
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("devices", &self.inner.devices.len())
            .field("policy", &self.inner.settings.policy)
            .finish()
    }
}

/// A host slice page-locked in place by [`Runtime::pin`], used through this guard (it
/// dereferences to the slice) and unpinned when dropped. While it lives, copies to and from
/// the slice skip staging and run at the link's speed.
#[derive(Debug)]
#[must_use = "the slice is unpinned when this guard drops"]
pub struct Pinned<'a, T> {
    rt: Runtime,
    data: &'a mut [T],
    by: Option<usize>,
}

impl<T> Pinned<'_, T> {
    /// Whether a driver page-locked the slice (false without GPUs).
    pub fn is_pinned(&self) -> bool {
        self.by.is_some()
    }
}

impl<T> std::ops::Deref for Pinned<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T> std::ops::DerefMut for Pinned<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.data
    }
}

impl<T> Drop for Pinned<'_, T> {
    fn drop(&mut self) {
        if let Some(d) = self.by {
            // SAFETY: pinned by `Runtime::pin` with device `d`; every copy has completed.
            unsafe { self.rt.unpin_host(self.data.as_mut_ptr().cast(), d) };
        }
    }
}

/// The process-wide runtime of [`Runtime::global`] (and `offload::omp`).
static GLOBAL: OnceLock<Result<Runtime>> = OnceLock::new();

impl Runtime {
    /// A runtime configured from the environment alone.
    pub fn new() -> Result<Self> {
        Self::builder().build()
    }

    /// A builder; unset settings come from the environment.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// The process-wide runtime the [`crate::omp`] routines use, built from the environment
    /// on first use. If that failed (e.g. `OMP_TARGET_OFFLOAD=mandatory` with no device),
    /// every call returns the same error.
    pub fn global() -> Result<&'static Runtime> {
        GLOBAL.get_or_init(Runtime::new).as_ref().map_err(Clone::clone)
    }

    /// Makes `self` the process-wide runtime unless one exists already; returns the one in
    /// use.
    pub fn install_global(self) -> Result<&'static Runtime> {
        let mut mine = Some(self);
        let r = GLOBAL.get_or_init(|| Ok(mine.take().expect("initialiser runs once")));
        r.as_ref().map_err(Clone::clone)
    }

    /// Number of offload devices (the initial device not counted).
    pub fn num_devices(&self) -> usize {
        self.inner.devices.len()
    }

    /// The initial device's number: `num_devices()`, as in LLVM's OpenMP.
    pub fn initial_device(&self) -> usize {
        self.inner.devices.len()
    }

    /// `OMP_DEFAULT_DEVICE`, else device 0 when there is one, else the initial device.
    pub fn default_device(&self) -> usize {
        self.inner.settings.default_device.unwrap_or(if self.inner.devices.is_empty() {
            self.initial_device()
        } else {
            0
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
        Ok(self.device_state(device)?.backend.description())
    }

    /// Page-locks `data` in place for as long as the returned guard lives (the slice stays
    /// borrowed). Pinning costs about 64 ms per GiB once (on the H200 machines), so it pays
    /// for buffers copied more than a few times; see the README's transfer table.
    pub fn pin<'a, T: crate::kernel::DeviceCopy>(&self, data: &'a mut [T]) -> Pinned<'a, T> {
        let (ptr, bytes) = (data.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(data));
        // SAFETY: the slice is borrowed for 'a, the guard's lifetime, and unpinned in its drop.
        let by = if bytes == 0 { None } else { unsafe { self.pin_host(ptr, bytes) } };
        Pinned { rt: self.clone(), data, by }
    }

    /// Where device `device` sits: the CPUs and NUMA nodes next to it.
    pub fn placement(&self, device: usize) -> Result<&Placement> {
        Ok(&self.device_state(device)?.placement)
    }

    /// The CPUs the device's worker thread is bound to, as read back from the OS (empty
    /// when the topology came from a file), or why binding failed.
    pub fn worker_binding(&self, device: usize) -> Result<std::result::Result<Vec<usize>, String>> {
        Ok(self.device_state(device)?.worker.binding().map(<[usize]>::to_vec).map_err(String::from))
    }

    /// The device's staging set-up, making it now if it does not exist yet; `None` for
    /// devices that copy without staging.
    pub fn staging_report(&self, device: usize) -> Result<Option<String>> {
        let d = self.device_state(device)?;
        if !d.staging_config.enabled || !d.backend.wants_staging() {
            return Ok(None);
        }
        d.staging_ring();
        Ok(Some(match d.staging.get() {
            Some(Ok(ring)) => ring.describe(),
            Some(Err(why)) => format!("staging unavailable: {why}"),
            None => "staging not set up".into(),
        }))
    }

    /// The NUMA nodes holding the device's first staging buffer (this machine only).
    pub fn staging_location(&self, device: usize) -> Result<Vec<usize>> {
        let d = self.device_state(device)?;
        match d.staging_ring() {
            Some(ring) => ring.with_first_buffer(|b| d.topology.memory_location(b)),
            None => Err(Error::InvalidArgument {
                routine: "staging_location",
                what: format!("device {device} has no staging buffers"),
            }),
        }
    }

    /// The topology devices were placed on.
    pub fn topology(&self) -> &Topology {
        &self.inner.topology
    }

    /// Whether copies from device `src` into device `dst` go directly (peer access, or the
    /// same device) rather than through host memory.
    pub fn can_access_peer(&self, dst: usize, src: usize) -> Result<bool> {
        let (d, s) = (self.device_state(dst)?, self.device_state(src)?);
        Ok(dst == src || (self.inner.peer_access && d.backend.can_access_peer(&*s.backend)))
    }

    /// Free and total memory of device `device`.
    pub fn mem_info(&self, device: usize) -> Result<MemInfo> {
        self.device_state(device)?.backend.mem_info()
    }

    /// Copies made by device `device` so far.
    pub fn transfer_stats(&self, device: usize) -> Result<TransferStats> {
        Ok(self.device_state(device)?.stats.snapshot())
    }

    /// Live allocations and cached free bytes of the device's memory pool: after every
    /// mapping is gone, only `target_alloc` blocks are live.
    pub fn pool_usage(&self, device: usize) -> Result<PoolUsage> {
        let d = self.device_state(device)?;
        Ok(PoolUsage { live_allocations: d.pool.live_count(), cached_bytes: d.pool.cached_bytes() })
    }

    /// Trace lines kept by a runtime built with [`RuntimeBuilder::capture_info`].
    pub fn take_info(&self) -> Vec<String> {
        self.inner.trace.take()
    }

    /// A handle on the captured trace that outlives the runtime (for its shutdown report);
    /// `None` unless built with [`RuntimeBuilder::capture_info`].
    pub fn info_log(&self) -> Option<crate::info::InfoLog> {
        self.inner.trace.log()
    }

    pub(crate) fn target(&self, device: usize) -> Result<Target<'_>> {
        match self.inner.devices.get(device) {
            Some(d) => Ok(Target::Device(d)),
            None if device == self.initial_device() => Ok(Target::Initial),
            None => Err(Error::NoSuchDevice { device: device as i64, available: self.num_devices() }),
        }
    }

    /// An offload device (not the initial device).
    pub(crate) fn device_state(&self, device: usize) -> Result<&DeviceState> {
        self.inner
            .devices
            .get(device)
            .ok_or(Error::NoSuchDevice { device: device as i64, available: self.num_devices() })
    }

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
                LaunchArg::Device(p) => KernelArg::Ptr { addr: p, bytes: None },
                LaunchArg::Value(s) => KernelArg::Scalar(s),
            })
            .collect();
        run_host_kernel(&self.inner.kernel_pool, self.initial_device(), kernel.name(), f, n, &args)
    }

    // ---- device memory routines -----------------------------------------------------

    /// `omp_target_alloc`: `bytes` of device memory (host memory on the initial device);
    /// 0 (null) when `bytes` is 0.
    pub fn target_alloc(&self, bytes: usize, device: usize) -> Result<u64> {
        if bytes == 0 {
            return Ok(0);
        }
        match self.target(device)? {
            Target::Device(d) => d.pool.alloc(&*d.backend, bytes, Owner::User),
            Target::Initial => {
                let layout = Layout::from_size_align(bytes, 256).map_err(|e| Error::InvalidArgument {
                    routine: "omp_target_alloc",
                    what: e.to_string(),
                })?;
                // SAFETY: non-zero size, valid layout.
                let p = unsafe { std::alloc::alloc(layout) };
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
        match self.target(device)? {
            Target::Device(d) => {
                // An association into the block would outlive it: refuse, as for a mapping.
                // The table stays locked until the block has left the live set, so no
                // association can be made into it in between (`associate` checks under the
                // same lock); the backend's free, which may wait for the device, comes after.
                let table = d.table.lock();
                let extent = d.pool.extent(ptr).unwrap_or(0) as u64;
                let held = table
                    .entries()
                    .find(|e| e.associated && e.device_addr.wrapping_sub(ptr) < extent)
                    .map(|e| e.range);
                if let Some(range) = held {
                    return Err(Error::InvalidArgument {
                        routine: "omp_target_free",
                        what: format!("device {device}: {ptr:#x} holds the device memory of the associated {range}; disassociate it first"),
                    });
                }
                let taken = d.pool.take(device, ptr, Owner::User)?;
                drop(table);
                d.pool.give_back(&*d.backend, taken).map(drop)
            }
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

    /// `omp_target_is_present`: whether host address `host` lies in a mapped range
    /// (always true on the initial device).
    pub fn is_present(&self, host: usize, device: usize) -> Result<bool> {
        Ok(match self.target(device)? {
            Target::Device(d) => d.table.lock().is_mapped(host),
            Target::Initial => true,
        })
    }

    /// `omp_get_mapped_ptr`: the device address of host address `host`, `None` (null) when
    /// it is not mapped; `host` itself on the initial device.
    pub fn mapped_ptr(&self, host: usize, device: usize) -> Result<Option<u64>> {
        Ok(match self.target(device)? {
            Target::Device(d) => d.table.lock().containing(host).map(|e| e.translate(host)),
            Target::Initial => Some(host as u64),
        })
    }

    /// The present-table entry containing `host` on `device`, with its counts.
    pub fn entry(&self, host: usize, device: usize) -> Result<Option<Entry>> {
        Ok(self.device_state(device)?.table.lock().containing(host).cloned())
    }

    /// Every live mapping of every device.
    pub fn live_mappings(&self) -> Vec<(usize, Entry)> {
        self.inner
            .devices
            .iter()
            .flat_map(|d| d.table.lock().entries().map(|e| (d.number, e.clone())).collect::<Vec<_>>())
            .collect()
    }

    /// The present table of `device` as text (libomptarget's `ompx_dump_mapping_tables`).
    pub fn dump_present_table(&self, device: usize) -> Result<String> {
        Ok(self.device_state(device)?.table.lock().dump(device))
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
            Target::Initial => return Err(bad("the initial device cannot have associated pointers")),
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
                what: "the initial device has no associated pointers".into(),
            }),
        }
    }

    /// Waits for all work queued on `device`.
    pub fn synchronize(&self, device: usize) -> Result<()> {
        match self.target(device)? {
            Target::Device(d) => d.backend.synchronize(),
            Target::Initial => Ok(()),
        }
    }

    pub(crate) fn peer_access(&self) -> bool {
        self.inner.peer_access
    }

    /// Page-locks `[ptr, ptr+bytes)` with the first device that can; returns which one.
    ///
    /// # Safety
    /// The memory stays allocated until [`Runtime::unpin_host`] with the returned device.
    pub(crate) unsafe fn pin_host(&self, ptr: *mut u8, bytes: usize) -> Option<usize> {
        let by = self.inner.devices.iter().find_map(|d| {
            // SAFETY: forwarded from the caller.
            matches!(unsafe { d.backend.register_host(ptr, bytes) }, Ok(true)).then_some(d.number)
        });
        if by.is_some() {
            self.inner.pinned.insert(ptr as usize, bytes);
        }
        by
    }

    /// Undoes [`Runtime::pin_host`].
    ///
    /// # Safety
    /// No copy on the memory is in flight (every construct waits for its copies).
    pub(crate) unsafe fn unpin_host(&self, ptr: *mut u8, device: usize) {
        self.inner.pinned.remove(ptr as usize);
        if let Some(d) = self.inner.devices.get(device) {
            // SAFETY: forwarded from the caller.
            let _ = unsafe { d.backend.unregister_host(ptr) };
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for d in &mut self.devices {
            let table = d.table.lock();
            if table.len() > 0 {
                self.trace.write(format!(
                    "runtime dropped with {} mapping(s) still live on device {}:\n{}",
                    table.len(),
                    d.number,
                    table.dump(d.number)
                ));
            }
            let live: Vec<Entry> = table.entries().filter(|e| e.registered).cloned().collect();
            drop(table);
            for e in live {
                // SAFETY: registered by the policy; nothing is in flight at shutdown.
                let _ = unsafe { d.backend.unregister_host(e.range.begin as *mut u8) };
            }
            if let Some(Ok(ring)) = d.staging.take() {
                ring.release(&*d.backend);
            }
            if let Err(e) = d.pool.release_all(&*d.backend) {
                self.trace.write(format!("device {}: releasing memory at shutdown failed: {e}", d.number));
            }
        }
        for (p, layout) in self.host_allocs.get_mut().drain() {
            // SAFETY: allocated by `target_alloc` on the initial device with this layout.
            unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        }
    }
}
