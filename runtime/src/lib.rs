//! # offload
//!
//! An OpenMP-style offload runtime: the device data environment of OpenMP's `map`
//! clauses, `target enter/exit data`, `target update` and the `omp_target_*` routines,
//! with one present table per device keyed by host address, over any number of devices.
//!
//! Two interfaces share the same tables:
//! * [`omp`]: the OpenMP routines under their own names, in C's raw-pointer shape, for
//!   porting C line by line;
//! * the safe API ([`Device::data`], [`map`], [`HostBuffer`], [`Device::launch`]), in
//!   which a mapping borrows its host slice for as long as it lives.
//!
//! Devices come from backends ([`backend`](mod@backend)); host devices (`OFFLOAD_HOST_DEVICES=N`) run
//! everywhere and make every rule observable without a GPU.
//!
//! ```
//! use offload::{map, Runtime};
//! let rt = Runtime::builder().host_devices(2).build()?;
//! let x = vec![1u32; 64];
//! for d in 0..rt.num_devices() {
//!     rt.device(d)?.data(map::to(&x), |_view| {
//!         assert!(rt.is_present(x.as_ptr() as usize, d)?);
//!         Ok(())
//!     })?;
//! }
//! assert!(rt.live_mappings().is_empty());
//! # Ok::<(), offload::Error>(())
//! ```

#![warn(missing_docs)]

pub mod api;
pub mod backend;
pub mod cluster;
pub mod config;
mod copy_crew;
pub mod data_env;
mod device;
pub mod error;
pub mod index_space;
pub mod info;
pub mod kernel;
pub mod kernel_cache;
mod latch;
mod macro_support;
mod memory_pool;
pub mod nowait;
pub mod omp;
pub mod partition;
pub mod pipeline;
pub mod recording;
mod runtime;
#[cfg(test)]
mod soak;
mod staging;
pub mod topology;
mod validate;
mod worker;

pub use api::{Association, DeviceBuffer, DeviceGlobal, GlobalArg, HostMut, Mapped};
pub use api::{BasedSlice, Device, DevicePtr, DeviceSlice, HostBuffer, KernelArgs, Map, MapList, QueuedRead};
pub use backend::{BackendKind, DeviceDescription, Interop, MemInfo, Sgemm};
pub use config::OffloadPolicy;
pub use data_env::{Entry, MapItem, MapKind, MapType, UpdateDirection, UpdateItem};
#[doc(hidden)]
pub use device::audit::{AuditRule, DeviceSnapshot, FailedConstruct};
pub use device::TransferStats;
pub use error::{Error, HostRange, Result};
pub use index_space::IndexSpace;
pub use info::{InfoFlags, InfoLayer, InfoLog};
pub use kernel::{barrier, erf, erfc, team_local, ErrorFunction};
pub use kernel::{
    DeviceCopy, HostLaunch, Kernel, KernelArg, KernelScalar, KernelShape, KernelStruct, LaunchArg, Scalar,
    ShapeParam,
};
pub use memory_pool::PoolConfig;
pub use nowait::{NowaitScope, Task};
pub use recording::Recording;
pub use runtime::memcpy;
pub use runtime::memcpy::RectSide;
pub use runtime::RuntimeBuilder;
pub use runtime::{Pinned, PoolUsage, Runtime};
pub use staging::StagingConfig;
pub use topology::{NumaDistances, Placement, PlacementSource, Topology, TopologyGpu};

/// Single-source kernels: see the `offload_macros` crate docs. `#[offload::kernel]` lives
/// in the macro namespace, beside the [`kernel`](mod@kernel) module.
pub use offload_macros::{device, kernel, DeviceCopy};

/// What generated kernels call; not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::macro_support::*;
}

/// Map clauses over borrowed slices, for [`Device::data`] and [`Device::target`].
///
/// `to` and `alloc` borrow shared; `from` and `tofrom` borrow exclusively, since the
/// device's data is copied back into them.
pub mod map {
    use crate::api::Map;
    use crate::kernel::DeviceCopy;
    use crate::MapType;

    /// `map(to: s)`.
    pub fn to<T: DeviceCopy>(s: &[T]) -> Map<'_, T> {
        Map::shared(s, MapType::TO)
    }

    /// `map(alloc: s)`.
    pub fn alloc<T: DeviceCopy>(s: &[T]) -> Map<'_, T> {
        Map::shared(s, MapType::ALLOC)
    }

    /// `map(to: s)` over an exclusive borrow, so that the host copy can be changed while
    /// it is mapped ([`crate::Mapped::host_mut`]) and pushed with `update_to`. Nothing is
    /// copied back at the end, as with `to`.
    pub fn to_mut<T: DeviceCopy>(s: &mut [T]) -> Map<'_, T> {
        Map::exclusive(s, MapType::TO)
    }

    /// `map(alloc: s)` over an exclusive borrow (see [`to_mut`]).
    pub fn alloc_mut<T: DeviceCopy>(s: &mut [T]) -> Map<'_, T> {
        Map::exclusive(s, MapType::ALLOC)
    }

    /// `map(from: s)`.
    pub fn from<T: DeviceCopy>(s: &mut [T]) -> Map<'_, T> {
        Map::exclusive(s, MapType::FROM)
    }

    /// `map(tofrom: s)`.
    pub fn tofrom<T: DeviceCopy>(s: &mut [T]) -> Map<'_, T> {
        Map::exclusive(s, MapType::TOFROM)
    }

    /// `map(release: s)` (exit only).
    pub fn release<T: DeviceCopy>(s: &[T]) -> Map<'_, T> {
        Map::shared(s, MapType::RELEASE)
    }

    /// `map(delete: s)` (exit only).
    pub fn delete<T: DeviceCopy>(s: &[T]) -> Map<'_, T> {
        Map::shared(s, MapType::DELETE)
    }
}
