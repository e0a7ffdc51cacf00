//! Beyond one node: ranks of an MPI job, each on its own GPUs.
//!
//! [`placement`] decides which of a node's GPUs each rank takes (by PCI bus id, so that a
//! per-rank `CUDA_VISIBLE_DEVICES` cannot mislead it); it needs no MPI and is always
//! built. With the `mpi` feature (rsmpi over the system's Open MPI or MPICH), a
//! `Cluster` is the job as this rank sees it (ranks, its node, collectives, the runtime
//! of its own devices) and `RankHalos` moves a slab's edge rows between neighbouring
//! ranks: device -> pinned host buffer -> non-blocking MPI -> pinned -> device;
//! `GridRanks` does the same for the faces, edges and corners of a grid split in two or
//! three dimensions whose parts the ranks hold.
//!
//! A grid's rows are split over ranks as they are over devices: a
//! [`crate::partition::RowPartition`] over the ranks gives each rank its owned rows and
//! halo; the rank maps that slab with another over its own devices.

pub mod placement;

#[cfg(feature = "mpi")]
mod grid_ranks;
#[cfg(feature = "mpi")]
mod halo;
#[cfg(feature = "mpi")]
mod world;

#[cfg(feature = "mpi")]
pub use grid_ranks::{GridRanks, HaloEngine};
#[cfg(feature = "mpi")]
pub use halo::{Edge, RankHalos};
#[cfg(feature = "mpi")]
pub use world::{Cluster, RankRuntime};
