//! # offload
//!
//! An OpenMP-style multi-GPU offload runtime: the device data environment of OpenMP's
//! `map` clauses (`to`, `from`, `tofrom`, `alloc`, `release`, `delete`, with `always`,
//! `present` and LLVM's `hold`), `target data`, `target enter/exit data`, `target update`
//! and the `omp_target_*` routines, with one present table per device keyed by host
//! address, over any number of devices: CUDA GPUs, AMD GPUs through HIP (feature `hip`),
//! and *host devices* (`OFFLOAD_HOST_DEVICES=N`), which run everywhere and make every rule
//! observable without a GPU.
//!
//! Two interfaces share the same tables:
//! * the safe API ([`Device::data`], [`map`], [`HostBuffer`], [`Device::launch`],
//!   [`Mapped`], [`DeviceBuffer`]), in which a mapping borrows its host slice for as long
//!   as it lives;
//! * [`omp`]: the OpenMP routines under their own names, in C's raw-pointer shape, for
//!   porting C line by line.
//!
//! # A first program
//!
//! A loop body written once with [`#[offload::kernel]`](macro@kernel) runs on GPUs
//! (translated to CUDA C, compiled at run time) and on host devices (a `rayon` loop):
//!
//! ```
//! use offload::{map, Runtime};
//!
//! #[offload::kernel]
//! fn saxpy(i: usize, a: f32, x: &[f32], y: &mut [f32]) {
//!     y[i] = a * x[i] + y[i];
//! }
//!
//! let n = 4096;
//! let x = vec![1.0f32; n];
//! let mut y = vec![2.0f32; n];
//! let rt = Runtime::builder().host_devices(2).build()?; // Runtime::new(): GPUs, else one host device
//! let gpu = rt.device(0)?;
//! gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| {
//!     for _ in 0..100 {
//!         saxpy::launch(&gpu, n, 2.0, x, y)?; // views translated through the present table
//!     }
//!     Ok(())
//! })?; // y copied back, both unmapped
//! assert_eq!(y[0], 202.0);
//! assert!(rt.live_mappings().is_empty());
//! # Ok::<(), offload::Error>(())
//! ```
//!
//! Every device has its own present table; the same host range mapped on two devices is
//! two entries:
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
//!
//! # Where to go next
//!
//! * Kernels: the [`kernel`](mod@kernel) module, and the kernel language with every
//!   compile error in `docs/KERNELS.md`.
//! * Asynchronous work and pipelines: [`nowait`], [`pipeline`]; replayable loop bodies:
//!   [`recording`]; arrays over several devices: [`partition`]; MPI ranks: [`cluster`].
//! * Settings (`OMP_*` and `OFFLOAD_*` variables): [`config`], [`RuntimeBuilder`]; traces:
//!   [`info`].
//! * In the repository: `README.md` (the front page), `docs/GUIDE.md` (the user guide),
//!   `docs/SEMANTICS.md` (the mapping rules and every conformance case),
//!   `docs/PORTING.md` (every OpenMP device construct with its forms here),
//!   `docs/MAPPING.md` (a guided tour with traces), `docs/ARCHITECTURE.md` (the layers and
//!   how a construct flows), `docs/PERFORMANCE.md` (every figure, with machine, date and
//!   log) and `docs/RELIABILITY.md` (how it is tested against failure).

#![warn(missing_docs)]

// The crate's own generated kernels (`partition::halo`) name it as their users do.
extern crate self as offload;

pub mod api;
pub mod backend;
pub mod cluster;
pub mod collective;
mod device;
pub mod error;
mod fork_join;
pub mod gemm;
pub mod index_space;
pub mod kernel;
mod latch;
mod macro_support;
pub mod nowait;
pub mod omp;
mod origin;
pub mod partition;
pub mod pipeline;
mod range;
pub mod recording;
mod rt;
mod services;
#[cfg(test)]
mod soak;
pub mod tensor;
mod trace;
pub mod weights;

pub use api::{Association, DeviceBuffer, DeviceGlobal, GlobalArg, HostMut, Mapped};
pub use api::{BasedSlice, Device, DevicePtr, DeviceSlice, HostBuffer, KernelArgs, Map, MapList, QueuedRead};
pub use backend::kernel_cache;
pub use backend::topology;
pub use backend::topology::{NumaDistances, Placement, PlacementSource, Topology, TopologyGpu};
pub use backend::{compiled_backends, BackendKind, DeviceDescription, Interop, MemInfo};
#[doc(hidden)]
pub use device::audit::{AuditRule, DeviceSnapshot, FailedConstruct};
pub use device::TransferStats;
pub use error::{Error, Result};
pub use gemm::{Activation, ElementType, Gemm, GemmElement, Precision};
/// The `half` crate, whose [`half::bf16`] and [`half::f16`] GEMMs take ([`GemmElement`]).
pub use half;
pub use index_space::IndexSpace;
pub use kernel::{
    barrier, erf, erfc, team_local, team_max, team_min, team_product, team_size, team_sum, zeroed_vec,
    ErrorFunction,
};
pub use kernel::{
    DeviceCopy, HostLaunch, Kernel, KernelArg, KernelScalar, KernelShape, KernelStruct, LaunchArg, OmpSpace,
    Scalar, ShapeParam,
};
pub use nowait::{NowaitScope, Task};
pub use range::HostRange;
pub use recording::Recording;
pub use rt::memcpy;
pub use rt::memcpy::RectSide;
pub use rt::RuntimeBuilder;
pub use rt::{Pinned, PoolUsage, Runtime};
pub use services::config;
pub use services::config::OffloadPolicy;
pub use services::data_env;
pub use services::data_env::{Entry, MapItem, MapKind, MapType, UpdateDirection, UpdateItem};
pub use services::memory_pool::PoolConfig;
pub use services::staging::StagingConfig;
pub use trace::info;
pub use trace::info::{InfoFlags, InfoLayer, InfoLog};

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

    // The same clauses named by their source text for the trace: `map::to!(a)` is
    // `map::to(&a).named("a")` (see `Map::named`).
    #[doc(inline)]
    pub use crate::{map_alloc as alloc, map_from as from, map_to as to, map_tofrom as tofrom};
}
