//! What the solvers need from other processes when a grid is split over MPI ranks: a
//! [`RankEdges`] says which of a rank's parts hold rows next to another rank, exchanges
//! them, and sums the norm over ranks. In one process there is none (`None` in the
//! solvers); with the `mpi` feature, [`MpiEdges`] is one over an `offload::cluster`.

use std::ops::Range;

use offload::partition::DistributedArray;
use offload::Error;

/// A rank's view of the ranks beside it (see the module documentation).
pub trait RankEdges: Sync {
    /// Whether part `p` of `parts` holds rows next to another rank.
    fn has_edges(&self, p: usize, parts: usize) -> bool;
    /// Exchanges part `p`'s edge rows of `grid` with the neighbouring ranks: its own out,
    /// theirs into its halo rows (collective with the neighbours' matching exchanges).
    fn exchange(&self, grid: &DistributedArray<'_, f32>, p: usize) -> Result<(), Error>;
    /// The sum of every rank's `x`, on every rank.
    fn sum(&self, x: f64) -> f64;
    /// Whether this rank prints.
    fn is_root(&self) -> bool;
}

/// The rows of a part-local step (`1..end`, row 0 and `end` being halos) computed first,
/// because other ranks wait for them, and the rest, computed while they travel.
pub fn edge_rows_first(end: usize) -> ([Range<usize>; 2], Range<usize>) {
    if end <= 3 {
        return ([1..end, end..end], end..end);
    }
    ([1..2, end - 1..end], 2..end - 1)
}

#[cfg(feature = "mpi")]
pub use with_mpi::*;

#[cfg(feature = "mpi")]
mod with_mpi {
    use super::RankEdges;
    use mpi::datatype::PartitionMut;
    use mpi::traits::*;
    use mpi::Count;
    use offload::cluster::{Cluster, RankHalos};
    use offload::partition::{DistributedArray, RowPartition};
    use offload::{Error, Runtime};

    /// The ranks of an MPI job beside this one.
    #[derive(Debug)]
    pub struct MpiEdges<'c> {
        cluster: &'c Cluster,
        halos: RankHalos<f32>,
    }

    impl<'c> MpiEdges<'c> {
        /// The edges of this rank's slab split by `part` over `devices` of `rt`, wrapping
        /// around from the last rank to rank 0 with `periodic`.
        pub fn new(
            cluster: &'c Cluster,
            rt: &Runtime,
            devices: &[usize],
            part: &RowPartition,
            periodic: bool,
        ) -> Result<Self, Error> {
            Ok(Self { cluster, halos: RankHalos::new(cluster, rt, devices, part, periodic)? })
        }

        /// Whether device rows go to MPI directly (a CUDA-aware MPI).
        pub fn direct(&self) -> bool {
            self.halos.direct()
        }
    }

    impl RankEdges for MpiEdges<'_> {
        fn has_edges(&self, p: usize, parts: usize) -> bool {
            !self.halos.edges_of(p, parts).is_empty()
        }
        fn exchange(&self, grid: &DistributedArray<'_, f32>, p: usize) -> Result<(), Error> {
            self.halos.exchange(self.cluster, grid, p)
        }
        fn sum(&self, x: f64) -> f64 {
            self.cluster.sum(x)
        }
        fn is_root(&self) -> bool {
            self.cluster.is_root()
        }
    }

    /// The whole grid on rank 0 (`None` on the others) from every rank's owned rows of
    /// `slab` (its rows `ranks.mapped(rank)` of the global grid): rows outside every
    /// rank's owned rows (the global halo rows) are taken from rank 0's and the last
    /// rank's slabs.
    pub fn gather_grid(
        cluster: &Cluster,
        ranks: &RowPartition,
        slab: &[f32],
    ) -> Result<Option<Vec<f32>>, Error> {
        let len = ranks.row_len();
        let count = |rows: usize| {
            Count::try_from(rows * len).map_err(|_| Error::InvalidArgument {
                routine: "gather_grid",
                what: format!("{rows} rows of {len} exceed an MPI count"),
            })
        };
        let (r, mapped) = (cluster.rank(), ranks.mapped(cluster.rank()));
        // Rank 0 also sends the rows above its first owned one, the last rank those below.
        let send_rows = |q: usize| {
            let o = ranks.owned(q);
            let start = if q == 0 { 0 } else { o.start };
            let end = if q + 1 == ranks.parts() { ranks.rows() } else { o.end };
            start..end
        };
        let mine = send_rows(r);
        let local = (mine.start - mapped.start) * len..(mine.end - mapped.start) * len;
        let root = cluster.world().process_at_rank(0);
        if !cluster.is_root() {
            root.gather_varcount_into(&slab[local]);
            return Ok(None);
        }
        let counts: Vec<Count> =
            (0..ranks.parts()).map(|q| count(send_rows(q).len())).collect::<Result<_, _>>()?;
        let displs: Vec<Count> =
            (0..ranks.parts()).map(|q| count(send_rows(q).start)).collect::<Result<_, _>>()?;
        let mut grid = vec![0f32; ranks.rows() * len];
        {
            let mut part = PartitionMut::new(&mut grid[..], &counts[..], &displs[..]);
            root.gather_varcount_into_root(&slab[local], &mut part);
        }
        Ok(Some(grid))
    }
}
