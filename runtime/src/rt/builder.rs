//! Building a [`Runtime`]: settings from the builder and the environment, device
//! discovery (host devices, CUDA, HIP), placement of each device's worker on its socket.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::backend::host::{default_capacity, HostPlatform};
use crate::backend::platform::PeerMatrix;
use crate::backend::worker::DeviceWorker;
use crate::backend::Backend;
use crate::backend::{BackendKind, Platform};
use crate::config::{lookup_from, process_env, EnvLookup, OffloadPolicy, Overrides, Settings};
use crate::device::audit::AuditActivity;
use crate::device::{DeviceSetup, DeviceState, PinnedRanges};
use crate::error::{Error, Result};
use crate::info::{InfoFlags, Trace};
use crate::kernel::dump::KernelDump;
use crate::rt::{Inner, Runtime};
use crate::services::memory_pool::PoolConfig;
use crate::services::staging::StagingConfig;
use crate::topology::{Placement, Topology};
use crate::trace::chrome::ChromeTraceLayer;

/// Builds a [`Runtime`]; every setting left unset is read from the environment.
///
/// ```
/// use offload::{OffloadPolicy, Runtime};
/// let rt = Runtime::builder().host_devices(3).policy(OffloadPolicy::Default).build()?;
/// assert_eq!(rt.num_devices(), 3);
/// assert_eq!(rt.initial_device(), 3);
/// # Ok::<(), offload::Error>(())
/// ```
#[derive(Clone)]
pub struct RuntimeBuilder {
    over: Overrides,
    env: EnvLookup,
    capture_info: bool,
    peer_access: bool,
    gpus: bool,
    faults: Option<crate::backend::FaultPlan>,
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
            faults: None,
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

    /// `OMP_AVAILABLE_DEVICES` (OpenMP 6.0): keep only these devices, in this order,
    /// renumbered from 0; each a device number as discovered or a device UID (see
    /// [`Runtime::device_uid`](crate::Runtime::device_uid)).
    pub fn available_devices<S: Into<String>>(mut self, selectors: impl IntoIterator<Item = S>) -> Self {
        self.over.available_devices = Some(selectors.into_iter().map(Into::into).collect());
        self
    }

    /// `OFFLOAD_INFO`.
    pub fn info(mut self, flags: InfoFlags) -> Self {
        self.over.info = Some(flags);
        self
    }

    /// Write a timeline of the run to `path` in the Chrome trace-event format
    /// (`OFFLOAD_TRACE=path.json`), for Perfetto or `chrome://tracing`: copies as slices,
    /// constructs, launches and present-table entries as instants, live entries per device
    /// as counters (docs/GUIDE.md, "Timeline traces"). The file is written by
    /// [`Runtime::flush_trace`] and when the runtime is dropped; `build` fails when it
    /// cannot be created.
    pub fn trace_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.over.trace_file = Some(path.into());
        self
    }

    /// Write every kernel's CUDA and HIP source into the folder `dir` (made when missing) at
    /// the kernel's first launch, on any device, host devices included
    /// (`OFFLOAD_DUMP_KERNELS=dir`), as libomptarget's `-save-temps` keeps what it compiled:
    /// a generated kernel's files are what NVRTC compiles for it, under its symbol
    /// (`<symbol>.cu`, `<symbol>.hip`). `build` fails when the folder cannot be made.
    ///
    /// ```
    /// # use offload::Runtime;
    /// #[offload::kernel]
    /// fn twice(i: usize, x: &mut [f32]) {
    ///     x[i] *= 2.0;
    /// }
    ///
    /// let dir = std::env::temp_dir().join(format!("offload-doc-dump-{}", std::process::id()));
    /// let rt = Runtime::builder().host_devices(1).dump_kernels(&dir).build()?;
    /// let mut x = vec![1f32; 8];
    /// rt.device(0)?.data(offload::map::tofrom(&mut x), |xv| twice::launch(&rt.device(0)?, 8, xv))?;
    /// // The variant launched: the checked one in a debug build (`twice::KERNEL_CHECKED`).
    /// let launched = if twice::CHECKED { &twice::KERNEL_CHECKED } else { &twice::KERNEL };
    /// let cuda = std::fs::read_to_string(dir.join(format!("{}.cu", launched.symbol())))?;
    /// assert!(cuda.contains("__global__"));
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dump_kernels(mut self, dir: impl Into<PathBuf>) -> Self {
        self.over.dump_kernels = Some(dir.into());
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

    /// Whether every construct waits for the work it queued (`OFFLOAD_SYNC=1`), as
    /// `CUDA_LAUNCH_BLOCKING` does: for debugging, so that a failing kernel or copy is
    /// reported by the construct that queued it. By default a construct that leaves
    /// nothing for the host to see returns once its work is queued (see docs/SEMANTICS.md,
    /// "Stream-ordered constructs").
    pub fn synchronous(mut self, on: bool) -> Self {
        self.over.synchronous = Some(on);
        self
    }

    /// Whether GPU launches may run a generated kernel's variant with 32-bit index
    /// arithmetic when the work-item count and every index, length and `usize` argument
    /// are at most 2^30 (`OFFLOAD_NARROW_INDICES`, default off; see docs/KERNELS.md,
    /// "Index arithmetic"). Both variants compute the same values; which is faster depends
    /// on the kernel (the ace port gains 11% on an H100, the generated Jacobi step loses
    /// 12%), so off, the default, launches always run the 64-bit one.
    pub fn narrow_indices(mut self, on: bool) -> Self {
        self.over.narrow_indices = Some(on);
        self
    }

    /// Whether host devices compute bf16 products ([`crate::Device::gemm`] and what uses it)
    /// with the CPU's bf16 dot-product instructions where it has them (AVX512-BF16:
    /// `OFFLOAD_HOST_BF16_DOT`, default on), twice the multiply-adds of f32 and half the
    /// bytes read. Off, they widen both operands to f32 and multiply in f32, which gives
    /// results that differ in the last bits (f32 partial sums either way; the instruction
    /// also counts subnormal bf16 inputs as zero). CPUs without the instructions widen
    /// either way.
    pub fn host_bf16_dot(mut self, on: bool) -> Self {
        self.over.host_bf16_dot = Some(on);
        self
    }

    /// Whether generated kernels (`#[offload::kernel]`) on host devices run the copy of
    /// their host twin compiled for AVX-512 (x86-64-v4) where the CPU has it
    /// (`OFFLOAD_HOST_AVX512`, default on), which rustc vectorises 16 floats wide; off, or
    /// on other CPUs, in debug builds and in checked launches, they run the baseline x86-64
    /// one. Both are the same Rust: the results are the same bit for bit.
    pub fn host_avx512(mut self, on: bool) -> Self {
        self.over.host_avx512 = Some(on);
        self
    }

    /// Test-only: each host device fails operations as `plan` says (see
    /// [`crate::backend::FaultPlan`]); `Runtime::fault_counts` tells what each saw and failed.
    #[doc(hidden)]
    pub fn inject_faults(mut self, plan: crate::backend::FaultPlan) -> Self {
        self.faults = Some(plan);
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

    /// Whether the runtime will look for GPUs.
    #[cfg(feature = "mpi")]
    pub(crate) fn wants_gpus(&self) -> bool {
        self.gpus
    }

    /// Reads environment variables through `lookup` instead of the process environment
    /// (for tests and embedders).
    pub fn env(mut self, lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Self {
        self.env = lookup_from(lookup);
        self
    }

    /// Discovers devices, places them on the topology and starts their workers.
    pub fn build(self) -> Result<Runtime> {
        let mut settings = Settings::resolve(&self.env, &self.over)?;
        // Created now: a path that cannot be written fails here, not at the end.
        let file = settings
            .trace_file
            .clone()
            .map(|path| ChromeTraceLayer::new(path, settings.trace_rank))
            .transpose()?;
        let trace = Arc::new(Trace::with_file(settings.info, self.capture_info, file));
        let dump = settings.dump_kernels.clone().map(KernelDump::new).transpose()?.map(Arc::new);
        let topology = match &settings.topology_xml {
            Some(path) => Arc::new(Topology::from_xml_file(path)?),
            None => Topology::system(),
        };
        let start_failed = |call: &'static str, e: String| Error::Driver { device: 0, call, message: e };
        // The initial device's kernel pool; each host device has its own (started on its
        // first kernel), so that a thread of one runs that device's kernels only
        // (`omp_get_device_num` reads it off).
        let mut threads = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("offload-initial-k{i}"));
        if let Some(n) = self.over.kernel_threads {
            threads = threads.num_threads(n);
        }
        let initial_pool =
            Arc::new(threads.build().map_err(|e| start_failed("start the host kernel pool", e.to_string()))?);
        let mut report = format!("topology: {}\n", topology.description());
        // Each device with its placement and worker; GPUs first, then host devices.
        let mut devices: Vec<FoundDevice> = Vec::new();
        let mut peers = PeerMatrix::default();
        let spawn = |name: String, p: &Placement| {
            DeviceWorker::spawn(name, Arc::clone(&topology), p.cpus.clone())
                .map(Arc::new)
                .map_err(|e| start_failed("spawn a device worker", e.to_string()))
        };
        if settings.policy == OffloadPolicy::Disabled {
            report.push_str("offload disabled (OMP_TARGET_OFFLOAD=disabled): constructs run on the host\n");
        } else {
            if self.gpus && !cfg!(feature = "cuda") {
                report.push_str("cuda: not compiled in (cargo feature `cuda` off)\n");
            }
            let gpus = if self.gpus { crate::backend::platforms() } else { Vec::new() };
            // Each platform's devices, placed by PCI bus id (host devices: on the whole
            // machine), each with its worker there.
            // Host devices are asked for by number (`required`): one that could not start (its
            // worker thread) fails the start, as a missing GPU does not.
            let mut add = |platform: &dyn Platform, required: usize, devices: &mut Vec<FoundDevice>| {
                let (found, line) = platform.discover(devices.len(), &mut peers);
                if found.len() < required {
                    return Err(start_failed("spawn a device worker", line));
                }
                report.push_str(&line);
                report.push('\n');
                for d in found {
                    debug_assert_eq!(d.description().kind, platform.kind());
                    let number = devices.len();
                    let p = match d.description().pci_bus_id.as_deref() {
                        Some(bus) => topology.place_pci(bus),
                        None => topology.whole_machine("host device"),
                    };
                    let w = match d.own_worker() {
                        Some(w) => w,
                        None => spawn(format!("offload-dev{number}"), &p)?,
                    };
                    // Faults are injected into host devices only (GPUs: the pool's limit).
                    let d: Box<dyn Backend> = match &self.faults {
                        Some(plan) if platform.kind() == BackendKind::Host => {
                            Box::new(crate::backend::faults::Faulty::new(
                                d,
                                number,
                                Arc::new(crate::backend::FaultInjector::new(plan.for_device(number))),
                            ))
                        }
                        _ => d,
                    };
                    devices.push((d, p, w));
                }
                Ok::<(), Error>(())
            };
            // GPUs first, then host devices: as many as asked, else one when no GPU was found.
            for platform in &gpus {
                add(&**platform, 0, &mut devices)?;
            }
            let count = settings.host_devices_with(devices.len());
            let hosts = HostPlatform {
                count,
                defaulted: settings.host_devices.is_none(),
                capacity: self.over.host_memory.unwrap_or_else(default_capacity),
                kernel_threads: self.over.kernel_threads,
                bf16_dot: settings.host_bf16_dot,
                avx512: settings.host_avx512,
                topology: Arc::clone(&topology),
                cores: crate::fork_join::SharedCores::new(
                    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
                ),
            };
            add(&hosts, count, &mut devices)?;
        }
        if !self.peer_access {
            peers = PeerMatrix::default();
        }
        if let Some(list) = settings.available_devices.take() {
            let chosen;
            (devices, chosen) = keep_available(devices, &list)?;
            peers = peers.renumbered(&chosen);
            report.push_str(&format!(
                "available: {} of the devices found (OMP_AVAILABLE_DEVICES={})\n",
                devices.len(),
                list.join(",")
            ));
        }
        // `mandatory` with no device still starts, as libomptarget does: the queries answer,
        // and device constructs fail with `Error::OffloadMandatory` (`Runtime::construct_target`).
        if let Some(uid) = settings.default_device_uid.take() {
            // OMP_DEFAULT_DEVICE as a UID (OpenMP 6.0): "host", or a device's.
            let found = super::queries::find_uid(
                devices.iter().map(|(b, _, _)| (b.uid(), b.description().pci_bus_id.as_deref())),
                &uid,
            );
            settings.default_device = Some(found.ok_or_else(|| Error::InvalidSetting {
                var: "OMP_DEFAULT_DEVICE",
                value: uid.clone(),
                expected: "a device number, or the UID of a device present (see omp_get_uid_from_device)",
            })?);
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
        let setup = DeviceSetup {
            pool: settings.pool,
            trace: Arc::clone(&trace),
            topology: Arc::clone(&topology),
            staging: settings.staging,
            pinned: Arc::clone(&pinned),
            synchronous: settings.synchronous,
            narrow_indices: settings.narrow_indices,
            dump,
            audit: self.faults.is_some().then(|| Arc::new(AuditActivity::default())),
        };
        let devices = devices
            .into_iter()
            .enumerate()
            .map(|(number, (backend, placement, worker))| {
                DeviceState::new(number, backend, placement, worker, &setup)
            })
            .collect();
        Ok(Runtime {
            inner: Arc::new(Inner {
                devices,
                settings,
                report,
                trace,
                kernel_pool: initial_pool,
                initial_device_lock: parking_lot::RwLock::new(()),
                host_allocs: Mutex::new(HashMap::new()),
                peers,
                pinned,
                topology,
                id: super::NEXT_RUNTIME_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            }),
        })
    }
}

/// The devices `OMP_AVAILABLE_DEVICES` names, in its order, renumbered from 0, and the
/// number each had as discovered: each selector a device number as discovered or a device's
/// UID; one naming no device, or a device named twice, is an error.
fn keep_available(devices: Vec<FoundDevice>, list: &[String]) -> Result<(Vec<FoundDevice>, Vec<usize>)> {
    let bad = |sel: &str, expected: &'static str| Error::InvalidSetting {
        var: "OMP_AVAILABLE_DEVICES",
        value: sel.to_string(),
        expected,
    };
    let mut chosen: Vec<usize> = Vec::new();
    for sel in list {
        let at = if sel.chars().all(|c| c.is_ascii_digit()) {
            sel.parse::<usize>().ok().filter(|&i| i < devices.len())
        } else {
            devices.iter().position(|(b, _, _)| {
                super::queries::uid_matches(&b.uid(), b.description().pci_bus_id.as_deref(), sel)
            })
        };
        let at =
            at.ok_or_else(|| bad(sel, "a device number (as discovered) or the UID of a device present"))?;
        if chosen.contains(&at) {
            return Err(bad(sel, "each device named once"));
        }
        chosen.push(at);
    }
    let mut all: Vec<Option<FoundDevice>> = devices.into_iter().map(Some).collect();
    let mut kept: Vec<FoundDevice> =
        chosen.iter().filter_map(|&i| all.get_mut(i).and_then(Option::take)).collect();
    for (n, d) in kept.iter_mut().enumerate() {
        d.0.renumber(n);
    }
    Ok((kept, chosen))
}

/// A device found at start-up: its backend, placement and worker.
type FoundDevice = (Box<dyn Backend>, Placement, Arc<DeviceWorker>);
