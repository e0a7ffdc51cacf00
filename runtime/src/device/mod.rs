//! The generic device: what one offload device has whatever its backend (present table,
//! memory pool, staging ring, lanes, pinned ranges, copy counters, trace) and the
//! operations on it that are not constructs: launch-argument translation, associations,
//! staged host copies, its lanes; and (`map_lists`) the execution of the map lists that
//! `data_env` plans. `Runtime` holds one per device.

pub(crate) mod audit;
mod in_flight;
mod map_lists;
mod operations;
mod partials;
mod report;
mod timeline;

pub(crate) use in_flight::{ConstructsWait, InFlight, PendingRead, Wait};
pub(crate) use map_lists::BlocksInUse;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::backend::worker::{DeviceWorker, Lanes};
use crate::backend::{Backend, BackendKind, Queue};
use crate::data_env::{Entry, PresentTable};
use crate::error::{Error, Result};
use crate::info::{InfoFields, InfoFlags, Trace};
use crate::kernel::dump::KernelDump;
use crate::kernel::LaunchArg;
use crate::kernel::{Kernel, KernelArg};
use crate::range::HostRange;
use crate::services::copy_crew::CopyCrew;
use crate::services::memory_pool::{MemoryPool, Owner};
pub(crate) use crate::services::pinned_memory::PinnedRanges;
use crate::services::staging::{StagingConfig, StagingRing};
use crate::topology::{Placement, Topology};

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
    pub(crate) fn snapshot(&self) -> TransferStats {
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

/// One offload device as the generic layer sees it: its backend, memory pool and present
/// table. Its number and backend (the vendor hooks) are read by the layers above; the rest
/// is its own, reached through its methods (constructs, `report.rs`, `operations.rs`).
pub(crate) struct DeviceState {
    pub(crate) number: usize,
    backend: Arc<dyn Backend>,
    pool: MemoryPool,
    table: Mutex<PresentTable>,
    /// Signalled when host ranges leave the table's transit list
    /// ([`PresentTable::in_transit`]), for the constructs waiting on them.
    transit_done: parking_lot::Condvar,
    stats: TransferCounters,
    trace: Arc<Trace>,
    placement: Placement,
    worker: Arc<DeviceWorker>,
    topology: Arc<Topology>,
    staging_config: StagingConfig,
    /// Made on the first copy that needs it; `None` inside when it could not be made.
    staging: OnceLock<std::result::Result<StagingRing, String>>,
    pinned: Arc<PinnedRanges>,
    /// The copy-in, compute and copy-out lanes of `nowait` work, started on first use.
    lanes: OnceLock<std::result::Result<Lanes, std::io::Error>>,
    /// The work constructs queued and did not wait for, and its unreported failure.
    in_flight: InFlight,
    /// Failed constructs and what they left (fault tests only).
    audit: Option<audit::ConstructAudit>,
    /// Device-side spans whose times are not read yet (`OFFLOAD_TRACE` only).
    timeline: timeline::PendingSpans,
    /// This device's latest copies back, for the race warning (kept only while it is
    /// wanted): what another device's later copy back over the same memory races with.
    copied_back: Mutex<std::collections::VecDeque<map_lists::CopyBack>>,
    /// Where kernels' sources are written at their first launch (`OFFLOAD_DUMP_KERNELS`).
    dump: Option<Arc<KernelDump>>,
    /// Launches run kernels' narrow variants where they fit: a GPU with
    /// `OFFLOAD_NARROW_INDICES` on.
    narrow_indices: bool,
}

/// What every device of a runtime shares or is set up with, for [`DeviceState::new`].
pub(crate) struct DeviceSetup {
    pub(crate) pool: crate::services::memory_pool::PoolConfig,
    pub(crate) trace: Arc<Trace>,
    pub(crate) topology: Arc<Topology>,
    pub(crate) staging: StagingConfig,
    pub(crate) pinned: Arc<PinnedRanges>,
    /// Every construct waits (`OFFLOAD_SYNC=1`).
    pub(crate) synchronous: bool,
    /// GPU launches may run kernels' narrow variants (`OFFLOAD_NARROW_INDICES`).
    pub(crate) narrow_indices: bool,
    /// Where kernels' sources are written at their first launch (`OFFLOAD_DUMP_KERNELS`).
    pub(crate) dump: Option<Arc<KernelDump>>,
    /// Failed constructs are audited (fault tests).
    pub(crate) audit: Option<Arc<audit::AuditActivity>>,
}

impl DeviceState {
    /// Device `number` over `backend`, placed at `placement` with its `worker`.
    pub(crate) fn new(
        number: usize,
        backend: Box<dyn Backend>,
        placement: Placement,
        worker: Arc<DeviceWorker>,
        setup: &DeviceSetup,
    ) -> Self {
        let narrow_indices = setup.narrow_indices && backend.description().kind != BackendKind::Host;
        Self {
            number,
            backend: Arc::from(backend),
            pool: MemoryPool::new(setup.pool, number),
            table: Mutex::new(PresentTable::new(setup.trace.names_wanted())),
            transit_done: parking_lot::Condvar::new(),
            stats: TransferCounters::default(),
            trace: Arc::clone(&setup.trace),
            placement,
            worker,
            topology: Arc::clone(&setup.topology),
            staging_config: setup.staging,
            staging: OnceLock::new(),
            pinned: Arc::clone(&setup.pinned),
            lanes: OnceLock::new(),
            in_flight: InFlight::new(setup.synchronous),
            audit: setup.audit.as_ref().map(|a| audit::ConstructAudit::new(Arc::clone(a))),
            timeline: timeline::PendingSpans::default(),
            copied_back: Mutex::new(std::collections::VecDeque::new()),
            dump: setup.dump.clone(),
            narrow_indices,
        }
    }
}

/// A host<->device copy's span on the timeline, with its range's name if the construct
/// making it on this thread knows one.
pub(crate) fn copy_span(
    direction: &'static str,
    host: HostRange,
    addr: u64,
    staged: bool,
) -> impl Fn() -> timeline::SpanOf {
    let name = map_lists::copy_name(host);
    move || InfoFields {
        kind: "copy",
        host: Some(host),
        device_addr: Some(addr),
        bytes: Some(host.bytes),
        direction: Some(direction),
        staged: Some(staged),
        name,
        ..InfoFields::default()
    }
}

/// A kernel's span on the timeline.
pub(crate) fn kernel_span(kernel: &Kernel, n: usize) -> timeline::SpanOf {
    InfoFields { kind: "kernel", kernel: Some(kernel.name()), n: Some(n), ..InfoFields::default() }
}

/// How a host<->device copy was made, for the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyPath {
    /// Through the staging ring's pinned buffers, waited for.
    Staged,
    /// By the driver straight from (or to) the host range, waited for.
    Direct,
    /// From a bounce slot, queued behind the device's earlier work, not waited for.
    Queued,
}

impl CopyPath {
    /// A copy that was waited for: staged or direct.
    pub(crate) fn of(staged: bool) -> Self {
        if staged {
            Self::Staged
        } else {
            Self::Direct
        }
    }
}

/// Where a device number leads.
pub(crate) enum Target<'a> {
    /// An offload device.
    Device(&'a DeviceState),
    /// The initial device: the host itself.
    Initial,
}

impl DeviceState {
    /// Translates launch arguments: mapped host addresses through the present table.
    /// The mapped entries' blocks stay pinned while the returned guard lives (through the
    /// launch).
    ///
    /// With `c_pointers` (C's `target`, where a [`LaunchArg::Mapped`] is a pointer the
    /// region captured; each pair is the start of a variable the region mapped implicitly
    /// and the start of the part of it present, [`crate::MapType::implicit`]), a pointer
    /// inside no entry is initialised as OpenMP 5.2's 5.8.6 says: through the entry of
    /// that part when the pointer starts such a variable, or through the entry whose map
    /// named it as the section's base (`map(to: A[64:128])` and the pointer `A`, found as a
    /// zero-length section finds it), else it keeps its value where that is the device's
    /// own memory (`omp_target_alloc`); any other host address is refused. The safe API's
    /// views are always inside their entry, and a view whose entry is gone stays an error.
    pub(crate) fn translate_args(
        &self,
        kernel: &Kernel,
        args: &[LaunchArg],
        c_pointers: Option<&[(usize, usize)]>,
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
                    LaunchArg::MappedBase { base, section } => match table.containing(section) {
                        Some(e) => {
                            // The device address as far from the section as the host base
                            // is (C's pointer arithmetic: wrapping, never dereferenced here).
                            let addr = e.translate(section).wrapping_sub(section.wrapping_sub(base) as u64);
                            let bytes =
                                (e.range.begin <= base && base < e.range.end()).then(|| e.range.end() - base);
                            let block = e.device_addr;
                            in_use.pin(&mut table, block);
                            KernelArg::Ptr { addr, bytes }
                        }
                        None => {
                            return Err(Error::KernelArgument {
                                kernel: kernel.name(),
                                index,
                                what: format!(
                                "base {base:#x}: its section at host {section:#x} is not mapped on device {}",
                                self.number
                            ),
                            })
                        }
                    },
                    LaunchArg::Mapped(h) => match table.containing(h) {
                        Some(e) => {
                            let arg = KernelArg::Ptr { addr: e.translate(h), bytes: Some(e.range.end() - h) };
                            let block = e.device_addr;
                            in_use.pin(&mut table, block);
                            arg
                        }
                        None if c_pointers.is_some() => {
                            // The part present of the variable the region mapped implicitly
                            // from `h`, else the section whose map named `h` as its base.
                            let part = c_pointers.into_iter().flatten().find(|&&(v, _)| v == h).map(|&(_, p)| p);
                            let entry = match part {
                                Some(p) => table.containing(p).map(|e| (e, p)),
                                None => table.named_by_zero_length(h).map(|e| (e, e.range.begin)),
                            };
                            let below_entry = entry.map(|(e, at)| (e.device_addr, e.translate(at), at.wrapping_sub(h)));
                            if let Some((block, at, below)) = below_entry {
                                // As far below the part's device address as the pointer is
                                // below the part (C's arithmetic).
                                in_use.pin(&mut table, block);
                                KernelArg::Ptr { addr: at.wrapping_sub(below as u64), bytes: None }
                            } else if let Some(bytes) = self.pool.extent(h as u64) {
                                // Pointing to no mapped storage but to the device's own memory
                                // (`omp_target_alloc`): the value itself.
                                KernelArg::Ptr { addr: h as u64, bytes: Some(bytes) }
                            } else {
                                return Err(Error::KernelArgument {
                                    kernel: kernel.name(),
                                    index,
                                    what: format!(
                                        "host {h:#x} is not mapped on device {}; neither inside a mapped range, \
                                         nor the base of one, nor the device's memory (C would pass the host \
                                         address as is, which the device cannot read; LaunchArg::Device passes \
                                         a value unchanged)",
                                        self.number
                                    ),
                                });
                            }
                        }
                        None => {
                            return Err(Error::KernelArgument {
                                kernel: kernel.name(),
                                index,
                                what: format!("host {h:#x} is not mapped on device {}", self.number),
                            });
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

    /// The device address of all of host range `r` (inside one entry), with that entry's
    /// block pinned while the guard lives.
    pub(crate) fn pinned_range(&self, r: HostRange) -> Option<(u64, BlocksInUse<'_>)> {
        let mut in_use = BlocksInUse::new(self);
        let mut table = self.table.lock();
        let (addr, block) = table
            .containing(r.begin)
            .filter(|e| e.range.contains(&r))
            .map(|e| (e.translate(r.begin), e.device_addr))?;
        in_use.pin(&mut table, block);
        drop(table);
        Some((addr, in_use))
    }

    /// Compiles and loads `kernel` now (GPUs), and the narrow variant launches may run.
    pub(crate) fn prepare(&self, kernel: &Kernel) -> Result<()> {
        self.backend.prepare(kernel)?;
        match kernel.narrow_variant() {
            Some(narrow) if self.narrow_indices => self.backend.prepare(narrow),
            _ => Ok(()),
        }
    }

    /// What a launch of `kernel` over `n` items with translated `args` runs here: on a
    /// GPU, the kernel's narrow variant when the launch fits it ([`Kernel::for_launch`]),
    /// else `kernel`. Its sources are written at its first launch when the runtime dumps
    /// them (`OFFLOAD_DUMP_KERNELS`; a failed write is the launch's error), and the launch is
    /// traced.
    pub(crate) fn launching(&self, kernel: &Kernel, n: usize, args: &[KernelArg]) -> Result<Kernel> {
        if let Some(d) = &self.dump {
            d.first_launch(kernel)?;
        }
        // A narrow variant launched by name must fit its bounds: its indices would wrap.
        if !kernel.fits(n, args) {
            return Err(Error::KernelArgument {
                kernel: kernel.name(),
                index: 0,
                what: format!(
                    "device {}: `{}` computes its indices in 32 bits, and this launch of {n} items \
                     passes a bound over {} (or none); launch the kernel's KERNEL, which runs this \
                     variant where it fits",
                    self.number,
                    kernel.symbol(),
                    crate::kernel::NARROW_LIMIT
                ),
            });
        }
        let run = if self.narrow_indices { kernel.for_launch(n, args) } else { *kernel };
        self.trace_launch(&run, n, args, run.symbol() != kernel.symbol());
        Ok(run)
    }

    fn trace_launch(&self, kernel: &Kernel, n: usize, args: &[KernelArg], narrow: bool) {
        let fields = || InfoFields {
            kind: "launch",
            device: Some(self.number),
            kernel: Some(kernel.name()),
            n: Some(n),
            construct: crate::info::current_construct(),
            ..InfoFields::default()
        };
        self.trace.event(InfoFlags::KERNEL_ARGS, fields, || {
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
        let geometry = || InfoFields { kind: "launch geometry", ..fields() };
        self.trace.event(InfoFlags::LAUNCH, geometry, || match self.backend.launch_geometry(kernel, n) {
            Some((grid, block)) => format!(
                "device {}: launch `{}` n={n}: grid {grid} blocks x {block} threads{}{}",
                self.number,
                kernel.name(),
                kernel.thread_map().map(|m| format!("; {m}")).unwrap_or_default(),
                if narrow { "; 32-bit index arithmetic" } else { "" }
            ),
            None => format!(
                "device {}: launch `{}` n={n}: on the device's kernel threads{}",
                self.number,
                kernel.name(),
                kernel.host_path().map(|m| format!("; {m}")).unwrap_or_default()
            ),
        });
    }

    /// Associates `range` with `device_addr`, which must lie in a live `omp_target_alloc`
    /// block of this device. Checked under the table's lock, as `target_free` checks for
    /// associations, so a concurrent free cannot slip in between.
    pub(crate) fn associate(&self, range: HostRange, device_addr: u64) -> Result<()> {
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

    /// Removes the association at `host` (not a map clause's entry, not one held).
    pub(crate) fn disassociate(&self, host: usize) -> Result<()> {
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
        self.trace.emit(InfoFlags::ENTRIES, || {
            format!("device {}: entry disassociated {}", self.number, e.name_of(e.range))
        });
        Ok(())
    }

    /// The device's staging ring, made on first use on the device's bound worker; `None`
    /// when the device does not stage or the ring could not be made (then copies go to the
    /// driver directly, and the report says why).
    pub(crate) fn staging_ring(&self) -> Option<&StagingRing> {
        if !self.staging_config.enabled || !self.backend.wants_staging() {
            return None;
        }
        self.staging
            .get_or_init(|| {
                let name = format!("offload-dev{}", self.number);
                let cpus = self.placement.cpus.clone();
                let threads = self.staging_config.threads.clamp(1, cpus.len().max(1));
                // The copying thread is one of its crew: `threads - 1` helpers in all.
                let spawn = |name: &str, threads: usize| {
                    CopyCrew::spawn(
                        name,
                        Some((self.topology.clone(), cpus.clone())),
                        threads - 1,
                        self.staging_config.min_piece,
                    )
                    .map_err(|e| format!("copy threads: {e}"))
                };
                let (crew_in, crew_out) = self.staging_config.crew_sizes(threads);
                let crew = spawn(&name, crew_in)?;
                let crew_out = crew_out.map(|n| spawn(&format!("{name}-out"), n)).transpose()?;
                let node =
                    self.placement.is_known().then(|| self.placement.numa_nodes.first().copied()).flatten();
                let (cfg, topo) = (self.staging_config, self.topology.clone());
                let (backend, number) = (Arc::clone(&self.backend), self.number);
                self.worker
                    .run(move || {
                        StagingRing::new(number, &cfg, node, &topo, &backend, crew, crew_out)
                            .map_err(|e| e.to_string())
                    })
                    .map_err(|_| "the device worker ended".to_string())?
            })
            .as_ref()
            .ok()
    }

    fn stages(&self, host: HostRange) -> Option<&StagingRing> {
        if host.bytes < self.staging_config.min_bytes || self.pinned.contains(host) {
            return None;
        }
        self.staging_ring()
    }

    /// Host->device copy of `host` to `dst`: staged for large pageable ranges, direct
    /// otherwise; says whether it was staged.
    ///
    /// # Safety
    /// `host` valid for reads; `dst` device memory of the range's size.
    pub(crate) unsafe fn write_host(&self, dst: u64, host: HostRange) -> Result<bool> {
        let ring = self.stages(host);
        let what = copy_span("host->device", host, dst, ring.is_some());
        self.timed(Queue::CopyIn, what, || match ring {
            Some(ring) => {
                // SAFETY: forwarded from the caller.
                unsafe { ring.write(&*self.backend, dst, host.begin as *const u8, host.bytes) }.map(|()| true)
            }
            // SAFETY: forwarded from the caller.
            None => unsafe { self.backend.write(dst, host.begin as *const u8, host.bytes) }.map(|()| false),
        })
    }

    /// Device->host copy of `src` into `host`, staged or direct as [`DeviceState::write_host`].
    ///
    /// # Safety
    /// `host` valid for exclusive writes; `src` device memory of the range's size.
    pub(crate) unsafe fn read_host(&self, host: HostRange, src: u64) -> Result<bool> {
        let ring = self.stages(host);
        let what = copy_span("device->host", host, src, ring.is_some());
        self.timed(Queue::CopyOut, what, || match ring {
            Some(ring) => {
                // SAFETY: forwarded from the caller.
                unsafe { ring.read(&*self.backend, host.begin as *mut u8, src, host.bytes) }.map(|()| true)
            }
            // SAFETY: forwarded from the caller.
            None => unsafe { self.backend.read(host.begin as *mut u8, src, host.bytes) }.map(|()| false),
        })
    }

    /// The device's copy-in, compute and copy-out lanes, started on first use.
    pub(crate) fn lanes(&self) -> Result<&Lanes> {
        let lanes = self.lanes.get_or_init(|| {
            let spawn = |name: &str| {
                DeviceWorker::spawn(
                    format!("offload-dev{}-{name}", self.number),
                    Arc::clone(&self.topology),
                    self.placement.cpus.clone(),
                )
            };
            Ok(Lanes::new([spawn("in")?, spawn("compute")?, spawn("out")?]))
        });
        lanes.as_ref().map_err(|e: &std::io::Error| Error::Driver {
            device: self.number,
            call: "spawn the device's lane threads",
            message: e.to_string(),
        })
    }
}
