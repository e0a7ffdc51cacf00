//! The runtime: its devices, their present tables, and the OpenMP routines in Rust shape.

use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};

use crate::config::{lookup_from, process_env, EnvLookup, OffloadPolicy, Overrides, Settings};
use crate::data_env::{BlocksInUse, Construct, Entry, MapItem, PresentTable, UpdateDirection};
use crate::device::host::{default_capacity, HostDevice};
use crate::device::{Backend, DeviceDescription, MemInfo};
use crate::error::{Error, HostRange, Result};
use crate::info::{InfoFlags, Trace};
use crate::kernel::{run_host_kernel, Kernel, KernelArg, Scalar};
use crate::memory_pool::{MemoryPool, Owner, PoolConfig};
use crate::staging::{StagingConfig, StagingRing};
use crate::topology::{Placement, Topology};
use crate::validate;
use crate::worker::DeviceWorker;

/// Counts of the copies a device made, for tests, benches and teaching.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Host->device copies.
    pub to_device: u64,
    /// Bytes copied host->device.
    pub to_device_bytes: u64,
    /// Device->host copies.
    pub from_device: u64,
    /// Bytes copied device->host.
    pub from_device_bytes: u64,
    /// Device->device copies into this device made directly (peer access or same device).
    pub direct: u64,
    /// Device->device copies into this device staged through host memory.
    pub staged: u64,
}

#[derive(Default)]
pub(crate) struct TransferCounters {
    to_device: AtomicU64,
    to_device_bytes: AtomicU64,
    from_device: AtomicU64,
    from_device_bytes: AtomicU64,
    direct: AtomicU64,
    staged: AtomicU64,
}

impl TransferCounters {
    pub(crate) fn record_to_device(&self, bytes: usize) {
        self.to_device.fetch_add(1, Ordering::Relaxed);
        self.to_device_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    pub(crate) fn record_from_device(&self, bytes: usize) {
        self.from_device.fetch_add(1, Ordering::Relaxed);
        self.from_device_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    pub(crate) fn record_device_copy(&self, direct: bool) {
        let c = if direct { &self.direct } else { &self.staged };
        c.fetch_add(1, Ordering::Relaxed);
    }
    fn snapshot(&self) -> TransferStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TransferStats {
            to_device: l(&self.to_device),
            to_device_bytes: l(&self.to_device_bytes),
            from_device: l(&self.from_device),
            from_device_bytes: l(&self.from_device_bytes),
            direct: l(&self.direct),
            staged: l(&self.staged),
        }
    }
}

/// What a device's memory pool holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    /// Allocations handed out and not freed (entries' device copies and `target_alloc`s).
    pub live_allocations: usize,
    /// Bytes of freed blocks kept for reuse.
    pub cached_bytes: usize,
}

/// One offload device as the generic layer sees it: its backend, memory pool and present
/// table.
pub(crate) struct DeviceState {
    pub(crate) number: usize,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) pool: MemoryPool,
    pub(crate) table: Mutex<PresentTable>,
    pub(crate) stats: TransferCounters,
    pub(crate) trace: Arc<Trace>,
    pub(crate) placement: Placement,
    pub(crate) worker: Arc<DeviceWorker>,
    pub(crate) topology: Arc<Topology>,
    pub(crate) staging_config: StagingConfig,
    /// Made on the first copy that needs it; `None` inside when it could not be made.
    pub(crate) staging: OnceLock<std::result::Result<StagingRing, String>>,
    pub(crate) pinned: Arc<PinnedRanges>,
    /// The copy-in, compute and copy-out lanes of `nowait` work, started on first use.
    pub(crate) lanes: OnceLock<std::result::Result<crate::nowait::Lanes, std::io::Error>>,
}

/// Host ranges page-locked by the runtime (runtime-owned buffers, [`Runtime::pin`]):
/// copies from them go straight to the DMA engine.
#[derive(Default)]
pub(crate) struct PinnedRanges(RwLock<BTreeMap<usize, usize>>);

impl PinnedRanges {
    pub(crate) fn insert(&self, begin: usize, bytes: usize) {
        self.0.write().insert(begin, bytes);
    }
    pub(crate) fn remove(&self, begin: usize) {
        self.0.write().remove(&begin);
    }
    pub(crate) fn contains(&self, r: HostRange) -> bool {
        self.0.read().range(..=r.begin).next_back().is_some_and(|(&b, &n)| r.end() <= b + n)
    }
}

/// Where a device number leads.
pub(crate) enum Target<'a> {
    /// An offload device.
    Device(&'a DeviceState),
    /// The initial device: the host itself.
    Initial,
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

pub(crate) struct Inner {
    pub(crate) devices: Vec<DeviceState>,
    settings: Settings,
    report: String,
    pub(crate) trace: Arc<Trace>,
    kernel_pool: Arc<rayon::ThreadPool>,
    host_allocs: Mutex<HashMap<usize, Layout>>,
    peer_access: bool,
    pinned: Arc<PinnedRanges>,
    topology: Arc<Topology>,
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

/// Builds a [`Runtime`]; every setting left unset is read from the environment.
///
/// ```
/// use offload::{OffloadPolicy, Runtime};
/// let rt = Runtime::builder().host_devices(3).policy(OffloadPolicy::Default).build()?;
/// assert_eq!(rt.num_devices(), 3);
/// assert_eq!(rt.initial_device(), 3);
/// # Ok::<(), offload::Error>(())
/// ```
pub struct RuntimeBuilder {
    over: Overrides,
    env: EnvLookup,
    capture_info: bool,
    peer_access: bool,
    gpus: bool,
}

impl fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeBuilder").field("over", &self.over).finish_non_exhaustive()
    }
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        Self {
            over: Overrides::default(),
            env: process_env(),
            capture_info: false,
            peer_access: true,
            gpus: true,
        }
    }
}

impl RuntimeBuilder {
    /// Number of host devices (`OFFLOAD_HOST_DEVICES`), at most
    /// [`MAX_HOST_DEVICES`](crate::config::MAX_HOST_DEVICES) (64): `build` refuses more.
    pub fn host_devices(mut self, n: usize) -> Self {
        self.over.host_devices = Some(n);
        self
    }

    /// `OMP_TARGET_OFFLOAD`.
    pub fn policy(mut self, p: OffloadPolicy) -> Self {
        self.over.policy = Some(p);
        self
    }

    /// `OMP_DEFAULT_DEVICE`.
    pub fn default_device(mut self, d: usize) -> Self {
        self.over.default_device = Some(d);
        self
    }

    /// `OFFLOAD_INFO`.
    pub fn info(mut self, flags: InfoFlags) -> Self {
        self.over.info = Some(flags);
        self
    }

    /// Keep trace lines in memory for [`Runtime::take_info`] instead of printing them.
    pub fn capture_info(mut self) -> Self {
        self.capture_info = true;
        self
    }

    /// The device memory pool (`OFFLOAD_MEMORY_POOL=0` turns it off).
    pub fn memory_pool(mut self, config: PoolConfig) -> Self {
        self.over.pool = Some(config);
        self
    }

    /// Whether device-to-device copies may use peer access (default yes); without it they
    /// are staged through host memory.
    pub fn peer_access(mut self, on: bool) -> Self {
        self.peer_access = on;
        self
    }

    /// Bytes of memory each host device offers (default: the machine's memory); at least
    /// 4096.
    pub fn host_device_memory(mut self, bytes: usize) -> Self {
        self.over.host_memory = Some(bytes);
        self
    }

    /// Threads of the pool that runs host kernels (default: one per CPU); 1 to
    /// [`MAX_KERNEL_THREADS`](crate::config::MAX_KERNEL_THREADS).
    pub fn kernel_threads(mut self, n: usize) -> Self {
        self.over.kernel_threads = Some(n);
        self
    }

    /// Place devices with the hwloc XML topology at `path` instead of this machine's
    /// (`OFFLOAD_TOPOLOGY_XML`): for testing placement on machines one does not have.
    pub fn topology_xml(mut self, path: impl Into<PathBuf>) -> Self {
        self.over.topology_xml = Some(path.into());
        self
    }

    /// How pageable host<->device copies are staged (`OFFLOAD_STAGING=0` turns it off).
    pub fn staging(mut self, config: StagingConfig) -> Self {
        self.over.staging = Some(config);
        self
    }

    /// Whether to look for GPUs (default yes); without, only host devices are used.
    pub fn gpus(mut self, on: bool) -> Self {
        self.gpus = on;
        self
    }

    /// Reads environment variables through `lookup` instead of the process environment
    /// (for tests and embedders).
    pub fn env(mut self, lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Self {
        self.env = lookup_from(lookup);
        self
    }

    /// Discovers devices, places them on the topology and starts their workers.
    pub fn build(self) -> Result<Runtime> {
        let settings = Settings::resolve(&self.env, &self.over)?;
        let trace = Arc::new(Trace::new(settings.info, self.capture_info));
        let topology = Arc::new(match &settings.topology_xml {
            Some(path) => Topology::from_xml_file(path)?,
            None => Topology::system(),
        });
        let mut threads = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("offload-kernel{i}"));
        if let Some(n) = self.over.kernel_threads {
            threads = threads.num_threads(n);
        }
        let start_failed = |call: &'static str, e: String| Error::Driver { device: 0, call, message: e };
        let kernel_pool =
            Arc::new(threads.build().map_err(|e| start_failed("start the host kernel pool", e.to_string()))?);
        let mut report = format!("topology: {}\n", topology.description());
        // Each device with its placement and worker; GPUs first, then host devices.
        let mut devices: Vec<(Arc<dyn Backend>, Placement, Arc<DeviceWorker>)> = Vec::new();
        let spawn = |name: String, p: &Placement| {
            DeviceWorker::spawn(name, Arc::clone(&topology), p.cpus.clone())
                .map(Arc::new)
                .map_err(|e| start_failed("spawn a device worker", e.to_string()))
        };
        if settings.policy == OffloadPolicy::Disabled {
            report.push_str("offload disabled (OMP_TARGET_OFFLOAD=disabled): constructs run on the host\n");
        } else {
            if self.gpus {
                let (gpus, line) = discover_gpus(0);
                report.push_str(&line);
                report.push('\n');
                let (amd, line) = discover_hip(gpus.len());
                if let Some(line) = line {
                    report.push_str(&line);
                    report.push('\n');
                }
                for g in gpus.into_iter().chain(amd) {
                    let bus = g.description().pci_bus_id.clone().unwrap_or_default();
                    let p = topology.place_pci(&bus);
                    let w = spawn(format!("offload-dev{}", devices.len()), &p)?;
                    devices.push((Arc::from(g), p, w));
                }
            }
            let capacity = self.over.host_memory.unwrap_or_else(default_capacity);
            for i in 0..settings.host_devices {
                let number = devices.len();
                let p = topology.whole_machine("host device");
                let w = spawn(format!("offload-host{i}"), &p)?;
                let d = HostDevice::new(
                    number,
                    i,
                    capacity,
                    Arc::clone(&w),
                    Arc::clone(&kernel_pool),
                    self.peer_access,
                );
                devices.push((Arc::new(d), p, w));
            }
            report
                .push_str(&format!("host: {} host devices (OFFLOAD_HOST_DEVICES)\n", settings.host_devices));
        }
        if devices.is_empty() && settings.policy == OffloadPolicy::Mandatory {
            return Err(Error::OffloadMandatory { reason: report.trim_end().replace('\n', "; ") });
        }
        if let Some(d) = settings.default_device {
            if d > devices.len() {
                return Err(Error::InvalidSetting {
                    var: "OMP_DEFAULT_DEVICE",
                    value: d.to_string(),
                    expected:
                        "a device number no larger than the number of devices (which is the initial device)",
                });
            }
        }
        let pinned = Arc::new(PinnedRanges::default());
        let devices = devices
            .into_iter()
            .enumerate()
            .map(|(number, (backend, placement, worker))| DeviceState {
                number,
                backend,
                pool: MemoryPool::new(settings.pool),
                table: Mutex::new(PresentTable::default()),
                stats: TransferCounters::default(),
                trace: Arc::clone(&trace),
                placement,
                worker,
                topology: Arc::clone(&topology),
                staging_config: settings.staging,
                staging: OnceLock::new(),
                pinned: Arc::clone(&pinned),
                lanes: OnceLock::new(),
            })
            .collect();
        Ok(Runtime {
            inner: Arc::new(Inner {
                devices,
                settings,
                report,
                trace,
                kernel_pool,
                host_allocs: Mutex::new(HashMap::new()),
                peer_access: self.peer_access,
                pinned,
                topology,
            }),
        })
    }
}

#[cfg(feature = "cuda")]
fn discover_gpus(first: usize) -> (Vec<Box<dyn Backend>>, String) {
    crate::device::cuda::discover(first)
}

#[cfg(not(feature = "cuda"))]
fn discover_gpus(_first: usize) -> (Vec<Box<dyn Backend>>, String) {
    (Vec::new(), "cuda: not compiled in (cargo feature `cuda` off)".into())
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

#[cfg(feature = "hip")]
fn discover_hip(first: usize) -> (Vec<Box<dyn Backend>>, Option<String>) {
    let (d, line) = crate::device::hip::discover(first);
    (d, Some(line))
}

#[cfg(not(feature = "hip"))]
fn discover_hip(_first: usize) -> (Vec<Box<dyn Backend>>, Option<String>) {
    (Vec::new(), None)
}

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
            Target::Device(d) => d.table.lock().containing(host).is_some(),
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

impl DeviceState {
    /// Translates launch arguments: mapped host addresses through the present table.
    /// The mapped entries' blocks stay pinned while the returned guard lives (through the
    /// launch).
    pub(crate) fn translate_args(
        &self,
        kernel: &Kernel,
        args: &[LaunchArg],
    ) -> Result<(Vec<KernelArg>, BlocksInUse<'_>)> {
        let mut in_use = BlocksInUse::new(self);
        let mut table = self.table.lock();
        let translated = args
            .iter()
            .enumerate()
            .map(|(index, a)| {
                Ok(match *a {
                    LaunchArg::Value(s) => KernelArg::Scalar(s),
                    LaunchArg::Device(p) => KernelArg::Ptr { addr: p, bytes: self.pool.extent(p) },
                    LaunchArg::Mapped(0) => KernelArg::Ptr { addr: 0, bytes: Some(0) },
                    LaunchArg::Mapped(h) => match table.containing(h) {
                        Some(e) => {
                            let arg = KernelArg::Ptr { addr: e.translate(h), bytes: Some(e.range.end() - h) };
                            let block = e.device_addr;
                            in_use.pin(&mut table, block);
                            arg
                        }
                        None => {
                            return Err(Error::KernelArgument {
                                kernel: kernel.name(),
                                index,
                                what: format!("host {h:#x} is not mapped on device {}", self.number),
                            })
                        }
                    },
                })
            })
            .collect::<Result<Vec<KernelArg>>>();
        drop(table);
        Ok((translated?, in_use))
    }

    /// The device address of host address `host`, with its entry's block pinned while the
    /// guard lives (for copies the runtime makes through raw device addresses).
    pub(crate) fn pinned_translation(&self, host: usize) -> Option<(u64, BlocksInUse<'_>)> {
        let mut in_use = BlocksInUse::new(self);
        let mut table = self.table.lock();
        let (addr, block) = table.containing(host).map(|e| (e.translate(host), e.device_addr))?;
        in_use.pin(&mut table, block);
        drop(table);
        Some((addr, in_use))
    }

    pub(crate) fn trace_launch(&self, kernel: &Kernel, n: usize, args: &[KernelArg]) {
        self.trace.emit(InfoFlags::KERNEL_ARGS, || {
            let list: Vec<String> = args
                .iter()
                .map(|a| match a {
                    KernelArg::Scalar(s) => format!("{s:?}"),
                    KernelArg::Ptr { addr, bytes: Some(b) } => format!("device {addr:#x} ({b} bytes)"),
                    KernelArg::Ptr { addr, bytes: None } => format!("device {addr:#x}"),
                })
                .collect();
            format!("device {}: launch `{}` n={n} args [{}]", self.number, kernel.name(), list.join(", "))
        });
    }

    /// Associates `range` with `device_addr`, which must lie in a live `omp_target_alloc`
    /// block of this device. Checked under the table's lock, as `target_free` checks for
    /// associations, so a concurrent free cannot slip in between.
    fn associate(&self, range: HostRange, device_addr: u64) -> Result<()> {
        const ASSOCIATE: &str = "omp_target_associate_ptr";
        let mut table = self.table.lock();
        self.pool.check_range(self.number, ASSOCIATE, device_addr, range.bytes)?;
        if self.pool.owner_of(device_addr) != Some(Owner::User) {
            return Err(Error::InvalidArgument {
                routine: ASSOCIATE,
                what: format!(
                    "device {}: {device_addr:#x} lies in the device copy of a mapped range (for {range}); \
                     expected memory from omp_target_alloc",
                    self.number
                ),
            });
        }
        match table.lookup(range) {
            crate::data_env::Lookup::Absent => {
                let e = Entry::new(range, device_addr, true);
                self.trace.emit(InfoFlags::ENTRIES, || {
                    format!("device {}: entry associated {range} -> device {device_addr:#x}", self.number)
                });
                table.insert(e);
                Ok(())
            }
            crate::data_env::Lookup::Inside(k) => match table.get(k) {
                // Associating the same pair again is accepted, as libomptarget does.
                Some(e) if e.associated && e.range == range && e.device_addr == device_addr => Ok(()),
                Some(e) => Err(Error::AlreadyMapped { device: self.number, range, existing: e.range }),
                None => Ok(()),
            },
            crate::data_env::Lookup::Extends(existing) => {
                Err(Error::AlreadyMapped { device: self.number, range, existing })
            }
        }
    }

    fn disassociate(&self, host: usize) -> Result<()> {
        let mut table = self.table.lock();
        let e = table.containing(host).cloned().ok_or(Error::NotAssociated {
            device: self.number,
            host,
            found: "nothing is mapped there",
        })?;
        if !e.associated {
            return Err(Error::NotAssociated {
                device: self.number,
                host,
                found: "it was mapped by a map clause",
            });
        }
        if e.hold_count > 0 {
            return Err(Error::StillHeld { device: self.number, range: e.range, count: e.hold_count });
        }
        table.remove(e.range.begin);
        self.trace
            .emit(InfoFlags::ENTRIES, || format!("device {}: entry disassociated {}", self.number, e.range));
        Ok(())
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
