//! What the solvers need from other processes when a grid is split over MPI ranks: a
//! [`RankEdges`] says which of a rank's parts hold rows next to another rank, exchanges
//! them, and sums the norm over ranks. In one process there is none (`None` in the
//! solvers); with the `mpi` feature, `MpiEdges` is one over an `offload::cluster`.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Instant;

use offload::partition::{DistributedArray, DistributedGrid, GridBox, GridPartition};
use offload::Error;

/// A rank's view of the ranks beside it (see the module documentation).
pub trait RankEdges: Sync {
    /// Whether part `p` holds rows next to another rank.
    fn has_edges(&self, p: usize) -> bool;
    /// Exchanges part `p`'s edge rows of `grid` with the neighbouring ranks: its own out,
    /// theirs into its halo rows (collective with the neighbours' matching exchanges).
    fn exchange(&self, grid: &DistributedArray<'_, f32>, p: usize) -> Result<(), Error>;
    /// The sum of every rank's `x`, on every rank.
    fn sum(&self, x: f64) -> f64;
    /// Whether this rank prints.
    fn is_root(&self) -> bool;
}

/// A rank's view of the other ranks when a grid is split in two or three dimensions over
/// them ([`DistributedGrid::map_held`]): with the `mpi` feature, `MpiGrid` is one over an
/// `offload::cluster::GridRanks`.
pub trait GridAcross: Sync {
    /// Brings every part of `grid` held here its neighbours' points, from this rank's
    /// parts and from other ranks' (collective with the neighbours' exchanges).
    fn exchange(&self, grid: &DistributedGrid<'_, f32>) -> Result<(), Error>;
    /// The sum of every rank's `x`, on every rank.
    fn sum(&self, x: f64) -> f64;
    /// Whether this rank prints.
    fn is_root(&self) -> bool;
    /// The NCCL communicator the halos cross with, if NCCL is the engine: its ranks sum
    /// device values (the norm) on the devices, each GPU of it holding one rank.
    fn nccl(&self) -> Option<&offload::collective::NcclComm<'_>> {
        None
    }
}

/// One process moving its grid's halos with NCCL (`OFFLOAD_HALO=nccl` without MPI): a
/// [`GridAcross`] with no other rank, every region through the communicator.
#[derive(Debug)]
pub struct NcclInProcess<'rt>(pub offload::collective::NcclComm<'rt>);

impl GridAcross for NcclInProcess<'_> {
    fn exchange(&self, grid: &DistributedGrid<'_, f32>) -> Result<(), Error> {
        grid.exchange_halos_over(&self.0)
    }
    fn sum(&self, x: f64) -> f64 {
        x
    }
    fn is_root(&self) -> bool {
        true
    }
    fn nccl(&self) -> Option<&offload::collective::NcclComm<'_>> {
        Some(&self.0)
    }
}

/// How one process moves the halos of a grid of `parts` parts, part `p` on
/// `devices[p % devices.len()]`: with NCCL ([`NcclInProcess`], and the parts' placement
/// for the solvers' `solve_grid_held`) when `OFFLOAD_HALO` asks for it and a communicator
/// over those devices can be made, else `None` (device-to-device copies, the solvers'
/// `solve_grid`). Prints which engine runs and why, unless `quiet`.
pub fn grid_in_process<'rt>(
    rt: &'rt offload::Runtime,
    devices: &[usize],
    parts: usize,
    quiet: bool,
) -> Option<(NcclInProcess<'rt>, Vec<Option<usize>>)> {
    let asked = std::env::var("OFFLOAD_HALO").unwrap_or_default();
    let mut distinct = devices.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let (nccl, line) = if asked.trim() != "nccl" {
        (None, "halo engine: device-to-device copies, queued (OFFLOAD_HALO is not nccl)".to_string())
    } else {
        match offload::collective::NcclComm::of_devices(rt, &distinct) {
            Ok(comm) => {
                let version = offload::collective::NcclComm::available().unwrap_or_default();
                (
                    Some(NcclInProcess(comm)),
                    format!("halo engine: NCCL ({version}), as OFFLOAD_HALO=nccl asks"),
                )
            }
            Err(e) => {
                (None, format!("halo engine: device-to-device copies, queued: OFFLOAD_HALO=nccl, but {e}"))
            }
        }
    };
    if !quiet {
        println!("{line}");
    }
    let placement = (0..parts).map(|p| devices.get(p % devices.len().max(1)).copied()).collect();
    nccl.map(|n| (n, placement))
}

/// The rank that holds each of `parts` parts over `ranks` ranks: contiguous runs of parts,
/// as even as they can be (part `p` on rank `p * ranks / parts`).
pub fn grid_owners(parts: usize, ranks: usize) -> Vec<usize> {
    (0..parts).map(|p| p * ranks / parts).collect()
}

/// Where this rank (`rank`) holds its parts: its `k`-th part on `devices[k % len]`, the
/// others `None`.
pub fn grid_placement(owners: &[usize], rank: usize, devices: &[usize]) -> Vec<Option<usize>> {
    let mut k = 0;
    owners
        .iter()
        .map(|&o| {
            (o == rank && !devices.is_empty()).then(|| {
                k += 1;
                devices[(k - 1) % devices.len()]
            })
        })
        .collect()
}

/// The rows of a part-local step (`1..end`, row 0 and `end` being halos of one row, as in
/// the solvers) computed first, because other ranks wait for them, and the rest, computed
/// while they travel.
pub fn edge_rows_first(end: usize) -> ([Range<usize>; 2], Range<usize>) {
    if end <= 3 {
        return ([1..end, end..end], end..end);
    }
    ([1..2, end - 1..end], 2..end - 1)
}

/// Where a step's time goes at a rank's edges (or a grid part's layers), per step,
/// averaged over the parts that exchange: the exchange call (device -> pinned -> MPI ->
/// pinned -> device between ranks; between devices of one process the time to queue the
/// copies, which then run on the devices' queues), the interior update it runs beside, and
/// the two together; what of the exchange the interior does not hide is `both - interior`
/// (which also holds the compute lane's start of the task).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HaloTimes {
    /// Seconds of the exchange call (to queue it, where its copies are queued).
    pub exchange: f64,
    /// Seconds of the interior update.
    pub interior: f64,
    /// Seconds of the two, started together, until both are done.
    pub both: f64,
}

impl HaloTimes {
    /// The exchange's seconds the interior did not hide.
    pub fn exposed(&self) -> f64 {
        (self.both - self.interior).max(0.0)
    }

    /// The share of the exchange hidden behind the interior, 0 to 1.
    pub fn overlap(&self) -> f64 {
        if self.exchange <= 0.0 {
            return 1.0;
        }
        (1.0 - self.exposed() / self.exchange).clamp(0.0, 1.0)
    }
}

/// A line of halo times, `whose` saying whose ("between ranks, per step at rank 0's
/// edges"): "halos {whose}: exchange call ... us, interior beside it ..., hidden".
pub fn describe(h: &HaloTimes, whose: &str) -> String {
    format!(
        "halos {whose}: exchange call {:.1} us, interior beside it {:.1} us, both {:.1} us; exposed {:.1} us ({:.0}% of the exchange call hidden)",
        h.exchange * 1e6,
        h.interior * 1e6,
        h.both * 1e6,
        h.exposed() * 1e6,
        h.overlap() * 100.0
    )
}

/// Whose halo times [`describe`] gives for a run split by rows over ranks.
pub const AT_RANK_EDGES: &str = "between ranks, per step at rank 0's edges";

/// Whose halo times [`describe`] gives for a grid of parts.
pub const AT_GRID_LAYERS: &str =
    "between parts, per step and part (layers first, the inner box beside the exchange)";

/// A run's ranks beside this one, and the clock of its edge parts' steps.
pub struct Across<'a> {
    /// The ranks.
    pub edges: &'a dyn RankEdges,
    /// Their exchanges' times.
    pub clock: HaloClock,
}

impl std::fmt::Debug for Across<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Across").field("clock", &self.clock).finish_non_exhaustive()
    }
}

/// One step of part `p` on `dev` (device number `device`) over its rows `1..end`: all of
/// them with `step` when `across` is `None` (or the part has no rows next to another rank);
/// otherwise the rows other ranks wait for first, then the rest on the device's compute
/// lane while the edge rows of `grid` (the step's output) travel.
#[allow(clippy::too_many_arguments)]
pub fn step_across(
    rt: &offload::Runtime,
    dev: &offload::Device<'_>,
    device: usize,
    p: usize,
    end: usize,
    across: Option<&Across<'_>>,
    grid: &DistributedArray<'_, f32>,
    step: impl Fn(&offload::Device<'_>, Range<usize>) -> Result<(), Error> + Sync,
) -> Result<(), Error> {
    let Some(a) = across.filter(|a| a.edges.has_edges(p)) else { return step(dev, 1..end) };
    let (first, rest) = edge_rows_first(end);
    for rows in first {
        step(dev, rows)?;
    }
    a.clock.overlap(rt, device, |d| step(d, rest), || a.edges.exchange(grid, p))
}

/// What one held part of a grid split in 2-D or 3-D computes in a step, in two goes: the
/// layers its neighbours read ([`GridPartition::layers_and_inner`]), then the inner box.
#[derive(Clone, Debug)]
pub struct LayersFirst {
    /// The part.
    pub part: usize,
    /// Its device.
    pub device: usize,
    /// The layers its neighbours read.
    pub layers: Vec<GridBox>,
    /// The rest of its owned box.
    pub inner: GridBox,
}

impl LayersFirst {
    /// Part `part` of `grid` on `device`.
    pub fn of(grid: &GridPartition, part: usize, device: usize) -> Self {
        let (layers, inner) = grid.layers_and_inner(part);
        Self { part, device, layers, inner }
    }
}

/// One step of `parts` (held by this thread), their halos sent by `exchange`: every part's
/// layers first (`step(part, device, box)`), then the inner boxes on the first part's
/// compute lane while `exchange` runs on this thread; the times go to `clock`.
pub fn step_layers_first(
    rt: &offload::Runtime,
    parts: &[LayersFirst],
    clock: &HaloClock,
    step: impl Fn(usize, &offload::Device<'_>, &GridBox) -> Result<(), Error> + Sync,
    exchange: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    for s in parts {
        let dev = rt.device(s.device)?;
        for b in &s.layers {
            step(s.part, &dev, b)?;
        }
    }
    let Some(lane) = parts.first().map(|s| s.device) else { return exchange() };
    let inner = |_: &offload::Device<'_>| -> Result<(), Error> {
        parts.iter().try_for_each(|s| step(s.part, &rt.device(s.device)?, &s.inner))
    };
    clock.overlap(rt, lane, inner, exchange)
}

/// Sums [`HaloTimes`] over steps and parts.
#[derive(Debug, Default)]
pub struct HaloClock(Mutex<(HaloTimes, usize)>);

impl HaloClock {
    /// Runs `interior` on the device's compute lane (through `rt.nowait`) beside
    /// `exchange` on this thread, and adds their times.
    pub fn overlap(
        &self,
        rt: &offload::Runtime,
        device: usize,
        interior: impl FnOnce(&offload::Device<'_>) -> Result<(), Error> + Send,
        exchange: impl FnOnce() -> Result<(), Error>,
    ) -> Result<(), Error> {
        let start = Instant::now();
        let inside = Mutex::new(0.0);
        let exchanged = rt.nowait(|s| -> Result<f64, Error> {
            let t = s.compute(device, &[], |d| {
                let t0 = Instant::now();
                let r = interior(d);
                *inside.lock().map_err(|_| poisoned())? = t0.elapsed().as_secs_f64();
                r
            })?;
            let sent = exchange();
            let took = start.elapsed().as_secs_f64();
            t.wait()?;
            sent.map(|()| took)
        })??;
        let both = start.elapsed().as_secs_f64();
        let interior = *inside.lock().map_err(|_| poisoned())?;
        let mut sum = self.0.lock().map_err(|_| poisoned())?;
        sum.0.exchange += exchanged;
        sum.0.interior += interior;
        sum.0.both += both;
        sum.1 += 1;
        Ok(())
    }

    /// The average per step and part, `None` before any.
    pub fn per_step(&self) -> Option<HaloTimes> {
        let (t, n) = *self.0.lock().ok()?;
        (n > 0).then(|| {
            let n = n as f64;
            HaloTimes { exchange: t.exchange / n, interior: t.interior / n, both: t.both / n }
        })
    }
}

fn poisoned() -> Error {
    Error::InvalidArgument { routine: "HaloClock", what: "a device thread panicked".into() }
}

#[cfg(feature = "mpi")]
pub use with_mpi::*;

#[cfg(feature = "mpi")]
mod with_mpi {
    use super::RankEdges;
    use mpi::datatype::PartitionMut;
    use mpi::traits::*;
    use mpi::Count;
    use offload::cluster::{Cluster, GridRanks, RankHalos, RankRuntime};
    use offload::partition::{
        DistributedArray, DistributedGrid, GridBox, GridPartition, Reach, RowPartition,
    };
    use offload::{Error, Runtime};

    /// The other ranks of an MPI job holding parts of a grid split in two or three
    /// dimensions.
    #[derive(Debug)]
    pub struct MpiGrid<'c, 'a> {
        cluster: &'c Cluster,
        ranks: GridRanks<'a, f32>,
    }

    impl<'c, 'a> MpiGrid<'c, 'a> {
        /// The crossings of a grid split by `part` across faces (`Reach::Faces`), part `p`
        /// held by rank `owners[p]`, this rank's on `placement` of `rt`.
        pub fn new(
            cluster: &'c Cluster,
            rt: &'a Runtime,
            part: &GridPartition,
            owners: &[usize],
            placement: &[Option<usize>],
        ) -> Result<Self, Error> {
            Ok(Self { cluster, ranks: GridRanks::new(cluster, rt, part, Reach::Faces, owners, placement)? })
        }

        /// How the faces cross between ranks, and why (`OFFLOAD_HALO`, the MPI library).
        pub fn engine(&self) -> &str {
            self.ranks.engine().1
        }
    }

    impl super::GridAcross for MpiGrid<'_, '_> {
        fn exchange(&self, grid: &DistributedGrid<'_, f32>) -> Result<(), Error> {
            self.ranks.exchange(grid)
        }
        fn sum(&self, x: f64) -> f64 {
            self.cluster.sum(x)
        }
        fn is_root(&self) -> bool {
            self.cluster.is_root()
        }
        fn nccl(&self) -> Option<&offload::collective::NcclComm<'_>> {
            self.ranks.nccl()
        }
    }

    /// The whole grid on rank 0 (`None` on the others) from every rank's host grid, in
    /// which it gathered its parts' owned boxes: each other rank sends rank 0 its parts'
    /// owned boxes, packed, tagged by part.
    pub fn gather_grid_parts(
        cluster: &Cluster,
        part: &GridPartition,
        owners: &[usize],
        mut host: Vec<f32>,
    ) -> Result<Option<Vec<f32>>, Error> {
        let whole = part.whole();
        let world = cluster.world();
        for (p, &owner) in owners.iter().enumerate() {
            let owned: GridBox = part.owned(p);
            if owner == 0 {
                continue;
            }
            let mut buf = vec![0f32; owned.len()];
            if cluster.rank() == owner {
                owned.pack(&whole, &host, &mut buf);
                world.process_at_rank(0).send_with_tag(&buf[..], p as i32);
            } else if cluster.is_root() {
                world.process_at_rank(owner as i32).receive_into_with_tag(&mut buf[..], p as i32);
                owned.unpack(&whole, &buf, &mut host);
            }
        }
        Ok(cluster.is_root().then_some(host))
    }

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
        fn has_edges(&self, p: usize) -> bool {
            !self.halos.edges_of(p).is_empty()
        }
        fn exchange(&self, grid: &DistributedArray<'_, f32>, p: usize) -> Result<(), Error> {
            self.halos.exchange(grid, p)
        }
        fn sum(&self, x: f64) -> f64 {
            self.cluster.sum(x)
        }
        fn is_root(&self) -> bool {
            self.cluster.is_root()
        }
    }

    /// A rank's share of a run over `rows` rows of `row_len` (planes, for the stencil),
    /// from [`RankRun::start`].
    #[derive(Debug)]
    pub struct RankRun {
        /// The rank's runtime (its GPUs, or host devices) and placement line.
        pub ranked: RankRuntime,
        /// The devices it runs on.
        pub devices: Vec<usize>,
        /// Every rank's placement line, on rank 0.
        pub placements: Option<Vec<String>>,
        /// The rows over the ranks.
        pub ranks: RowPartition,
        /// This rank's slab over its devices.
        pub slab: RowPartition,
        /// This rank's rows of the whole grid, halos included.
        pub rows: std::ops::Range<usize>,
    }

    impl RankRun {
        /// Takes this rank's devices (`ndev` of them at most) and splits `rows` rows over
        /// the ranks, then the rank's slab over its devices; every rank must call it.
        pub fn start(
            cluster: &Cluster,
            rows: usize,
            row_len: usize,
            ndev: Option<usize>,
        ) -> Result<Self, Error> {
            let ranked = cluster.runtime(crate::example_builder())?;
            let devices = crate::example_devices(&ranked.runtime, ndev);
            let placements = cluster.gather_to_root(&ranked.placement)?;
            let ranks = RowPartition::new(rows, row_len, cluster.size(), 1)?;
            let mine = ranks.mapped(cluster.rank());
            let slab = RowPartition::new(mine.len(), row_len, devices.len(), 1)?;
            Ok(Self { ranked, devices, placements, ranks, slab, rows: mine })
        }

        /// The runtime.
        pub fn runtime(&self) -> &Runtime {
            &self.ranked.runtime
        }

        /// On rank 0: the MPI library and every rank's placement line.
        pub fn print_placements(&self, cluster: &Cluster) {
            if let Some(lines) = &self.placements {
                println!("{}", cluster.library());
                lines.iter().for_each(|l| println!("{l}"));
            }
        }
    }

    /// Under `mpirun` with more than one rank, runs `across` on this rank and says so with
    /// `true`; as one process (MPI's singleton), runs nothing and gives `false`. A rank
    /// that fails alone ends the job (`MPI_Abort`): the others would wait for it forever.
    pub fn run_across_ranks<E: std::fmt::Display>(
        across: impl FnOnce(&Cluster) -> Result<(), E>,
    ) -> Result<bool, Error> {
        let cluster = Cluster::init()?;
        if cluster.size() == 1 {
            return Ok(false);
        }
        if let Err(e) = across(&cluster) {
            eprintln!("rank {}: {e}", cluster.rank());
            cluster.abort(1);
        }
        Ok(true)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts go to ranks in contiguous, even runs; a rank's parts to its devices in turn.
    #[test]
    fn parts_go_to_ranks_in_runs_and_to_devices_in_turn() {
        assert_eq!(grid_owners(4, 4), [0, 1, 2, 3]);
        assert_eq!(grid_owners(6, 3), [0, 0, 1, 1, 2, 2]);
        assert_eq!(grid_owners(5, 2), [0, 0, 0, 1, 1]);
        let owners = grid_owners(8, 2);
        assert_eq!(
            grid_placement(&owners, 1, &[3, 5]),
            [None, None, None, None, Some(3), Some(5), Some(3), Some(5)]
        );
        assert_eq!(grid_placement(&owners, 0, &[]), [None; 8], "no devices, no parts held");
    }
}
