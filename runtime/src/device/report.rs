//! What a device says about itself, for the runtime's queries (`rt/queries.rs`): its
//! backend's description and handles, placement, staging, counters, pool and present table,
//! read here so that the layers above call methods rather than reach into its fields.

use super::DeviceState;
use crate::backend::{DeviceDescription, FaultInjector, Interop, MemInfo};
use crate::data_env::Entry;
use crate::error::{Error, Result};
use crate::range::{ArrayName, HostRange, RangeName};
use crate::topology::Placement;

use super::audit::FailedConstruct;
use super::{TransferStats, Wait};

impl DeviceState {
    /// The device's number.
    pub(crate) fn number(&self) -> usize {
        self.number
    }

    /// What the device says about itself.
    pub(crate) fn description(&self) -> &DeviceDescription {
        self.backend.description()
    }

    /// Its backend, for a collective library's vendor hooks (`crate::collective`), which
    /// drive the device's queues beside the generic layer.
    #[cfg(feature = "nccl")]
    pub(crate) fn backend(&self) -> &dyn crate::backend::Backend {
        &*self.backend
    }

    /// Its UID (`omp_get_uid_from_device`).
    pub(crate) fn uid(&self) -> String {
        self.backend.uid()
    }

    /// Its native handles, for the vendor's own libraries (`None` on host devices).
    pub(crate) fn interop(&self) -> Option<Interop> {
        self.backend.interop()
    }

    /// Whether the calling thread runs one of this device's kernels.
    pub(crate) fn runs_current_thread(&self) -> bool {
        self.backend.runs_current_thread()
    }

    /// The fault injector of a device built with faults (tests).
    pub(crate) fn fault_injector(&self) -> Option<&FaultInjector> {
        self.backend.fault_injector()
    }

    /// The constructs that failed since the last call, when the device is audited (tests).
    pub(crate) fn take_failed_constructs(&self) -> Vec<FailedConstruct> {
        self.audit.as_ref().map(|a| a.take()).unwrap_or_default()
    }

    /// Where the device sits: the CPUs and NUMA nodes next to it.
    pub(crate) fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The CPUs its worker is bound to, or why binding failed.
    pub(crate) fn worker_binding(&self) -> std::result::Result<Vec<usize>, String> {
        self.worker.binding().map(<[usize]>::to_vec).map_err(String::from)
    }

    /// Its staging set-up (made now if it does not exist yet); `None` for devices that copy
    /// without staging.
    pub(crate) fn staging_report(&self) -> Option<String> {
        if !self.staging_config.enabled || !self.backend.wants_staging() {
            return None;
        }
        self.staging_ring();
        Some(match self.staging.get() {
            Some(Ok(ring)) => ring.describe(),
            Some(Err(why)) => format!("staging unavailable: {why}"),
            None => "staging not set up".into(),
        })
    }

    /// The NUMA nodes holding its first staging buffer (this machine only).
    pub(crate) fn staging_location(&self) -> Result<Vec<usize>> {
        match self.staging_ring() {
            Some(ring) => ring.with_first_buffer(|b| self.topology.memory_location(b)),
            None => Err(Error::InvalidArgument {
                routine: "staging_location",
                what: format!("device {} has no staging buffers", self.number),
            }),
        }
    }

    /// Free and total memory, once the memory queued work holds is given back.
    pub(crate) fn mem_info(&self) -> Result<MemInfo> {
        self.finish_queued_quietly(Wait::Events);
        self.backend.mem_info()
    }

    /// Copies made so far.
    pub(crate) fn transfer_stats(&self) -> TransferStats {
        self.stats.snapshot()
    }

    /// The pool's live allocations and cached free bytes, once queued work is done (a
    /// failure of it stays for a synchronising call to report).
    pub(crate) fn pool_usage(&self) -> (usize, usize) {
        self.finish_queued_quietly(Wait::Events);
        (self.pool.live_count(), self.pool.cached_bytes())
    }

    /// Whether host address `host` lies in a mapped range (`omp_target_is_present`).
    pub(crate) fn is_mapped(&self, host: usize) -> bool {
        self.table.lock().is_mapped(host)
    }

    /// The device address of host address `host`, if mapped (`omp_get_mapped_ptr`).
    pub(crate) fn mapped_ptr(&self, host: usize) -> Option<u64> {
        self.table.lock().containing(host).map(|e| e.translate(host))
    }

    /// The device address a zero-length lookup at `host` gives (`use_device_ptr`).
    pub(crate) fn use_device_ptr(&self, host: usize) -> Option<u64> {
        self.table.lock().named_by_zero_length(host).map(|e| e.translate_any(host))
    }

    /// `range` as a trace names it: a section of the named entry it starts in, else of
    /// `own` (the map's own name), else of the named entry that held its first byte and
    /// has left the table; `None` when none is named.
    pub(crate) fn named_range(&self, range: HostRange, own: Option<ArrayName>) -> Option<RangeName> {
        let table = self.table.lock();
        let array = match table.containing(range.begin) {
            Some(e) => e.array().or(own),
            None => own.or_else(|| table.gone_name(range.begin)),
        };
        array.map(|a| RangeName::new(range, Some(a)))
    }

    /// The entry containing `host`, with its counts.
    pub(crate) fn entry(&self, host: usize) -> Option<Entry> {
        self.table.lock().containing(host).cloned()
    }

    /// Every live entry.
    pub(crate) fn entries(&self) -> Vec<Entry> {
        self.table.lock().entries().cloned().collect()
    }

    /// The present table as text.
    pub(crate) fn dump_table(&self) -> String {
        self.table.lock().dump(self.number)
    }

    /// The present table as text, unless it has no entry.
    pub(crate) fn dump_table_if_any(&self) -> Option<String> {
        let table = self.table.lock();
        (table.len() > 0).then(|| table.dump(self.number))
    }
}
