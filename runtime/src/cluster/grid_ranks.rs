//! A grid split in one, two or three dimensions ([`GridPartition`]) over the ranks of an
//! MPI job: each rank holds some of the parts ([`DistributedGrid::map_held`]), and
//! [`GridRanks::exchange`] moves every region between parts, within the rank as
//! [`DistributedGrid::exchange_halos`] does and between ranks through pinned host buffers:
//! packed on the sender's device by the generated box kernel, copied to its rank's pinned
//! buffer, sent; received into the receiver's pinned buffer, copied to its device,
//! unpacked.

use mpi::request::WaitGuard;
use mpi::traits::*;
use mpi::Count;
use parking_lot::Mutex;

use super::halo::{local_buffer, HaloComm, RawBytes};
use crate::api::{DeviceBuffer, HostBuffer};
use crate::cluster::world::Cluster;
use crate::error::{Error, Result};
use crate::partition::distributed_grid::sending;
use crate::partition::halo::{self, HaloElement};
use crate::partition::{DistributedGrid, Exchange, GridPartition, Reach};
use crate::rt::Runtime;
use crate::BackendKind;

/// The most regions a part receives (3^3 - 1 neighbours, and one spare): a message's tag
/// is its receiving part times this plus the region's place in the part's list.
const TAGS_PER_PART: usize = 27;

/// A region crossing between this rank and another: the exchange as its receiver lists it,
/// the part held here, the other rank, the tag, and the buffers it goes through.
struct Crossing<'a, T: HaloElement> {
    /// The part held here: the sender of an outgoing region, the receiver of an incoming.
    part: usize,
    /// The part on the other rank.
    other: usize,
    peer: usize,
    tag: i32,
    exchange: Exchange,
    /// On the held part's device: the region packed (outgoing) or landed (incoming).
    packed: DeviceBuffer<'a, T>,
    /// Pinned, allocated on the device's compute lane; `None` where MPI takes `packed`.
    staged: Option<HostBuffer<T>>,
}

/// How a grid's regions cross between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HaloEngine {
    /// Device -> pinned host buffer -> MPI -> pinned host buffer -> device.
    Staged,
    /// The packed device buffers handed to a CUDA-aware MPI, no host copies.
    CudaAwareMpi,
}

impl HaloEngine {
    /// The engine for a run: `asked` is `OFFLOAD_HALO`'s value (`staged`, `mpi`, `nccl`, or
    /// unset / `auto`: the direct path where it can run), `cuda_aware` whether the MPI
    /// library said at run time that it takes CUDA pointers, `all_cuda` whether this rank's
    /// parts are all on CUDA GPUs. Gives the engine and why: the one asked for, or why it
    /// cannot run and what runs instead.
    ///
    /// Errors: a value not among those ([`Error::InvalidSetting`]).
    ///
    /// ```
    /// use offload::cluster::HaloEngine;
    ///
    /// let (engine, why) = HaloEngine::choose(Some("mpi"), false, true)?;
    /// assert_eq!(engine, HaloEngine::Staged);
    /// assert!(why.contains("does not report CUDA support"));
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn choose(asked: Option<&str>, cuda_aware: bool, all_cuda: bool) -> Result<(Self, String)> {
        let direct = match (cuda_aware, all_cuda) {
            (false, _) => Err("the MPI library does not report CUDA support"),
            (true, false) => Err("a part of this rank is not on a CUDA GPU"),
            (true, true) => Ok(()),
        };
        let staged = "staged through pinned host buffers";
        Ok(match asked.map(str::trim).filter(|v| !v.is_empty()).unwrap_or("auto") {
            "staged" => (Self::Staged, format!("{staged}, as OFFLOAD_HALO=staged asks")),
            "nccl" => (
                Self::Staged,
                format!("{staged}: OFFLOAD_HALO=nccl asks for NCCL, which is not built in yet"),
            ),
            v @ ("mpi" | "auto") => match direct {
                Ok(()) => (Self::CudaAwareMpi, "device buffers straight to the CUDA-aware MPI".to_string()),
                Err(why) if v == "mpi" => (Self::Staged, format!("{staged}: OFFLOAD_HALO=mpi, but {why}")),
                Err(why) => (Self::Staged, format!("{staged}: {why}")),
            },
            other => {
                return Err(Error::InvalidSetting {
                    var: "OFFLOAD_HALO",
                    value: other.to_string(),
                    expected: "staged, mpi, nccl or auto",
                })
            }
        })
    }
}

/// The regions of one rank's parts of a grid that cross to other ranks, with their
/// buffers. Collective: every rank makes its `GridRanks` for the same grid in the same
/// order, and exchanges with it in the same order (each has a communicator of its own).
pub struct GridRanks<'a, T: HaloElement> {
    comm: HaloComm,
    rank: usize,
    rt: &'a Runtime,
    part: GridPartition,
    reach: Reach,
    placement: Vec<Option<usize>>,
    /// `[outgoing, incoming]`, locked for a whole exchange.
    crossings: Mutex<[Vec<Crossing<'a, T>>; 2]>,
    engine: (HaloEngine, String),
}

impl<T: HaloElement> std::fmt::Debug for GridRanks<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.crossings.lock();
        f.debug_struct("GridRanks")
            .field("rank", &self.rank)
            .field("placement", &self.placement)
            .field("outgoing", &c[0].len())
            .field("incoming", &c[1].len())
            .field("engine", &self.engine)
            .finish()
    }
}

impl<'a, T: HaloElement> GridRanks<'a, T> {
    /// The crossings of a grid split by `part` whose part `p` is held by rank `owners[p]`,
    /// those of this rank on `placement[p]` of `rt` (as [`DistributedGrid::map_held`]
    /// takes it: `Some` exactly for the parts this rank owns).
    ///
    /// Errors: an owner per part, each a rank of the world, and a placement naming exactly
    /// this rank's parts are expected; a grid of more parts than the tags can number
    /// ([`Error::InvalidArgument`]).
    pub fn new(
        cluster: &Cluster,
        rt: &'a Runtime,
        part: &GridPartition,
        reach: Reach,
        owners: &[usize],
        placement: &[Option<usize>],
    ) -> Result<Self> {
        let rank = cluster.rank();
        let bad = |what: String| Error::InvalidArgument { routine: "GridRanks::new", what };
        let parts = part.parts();
        if owners.len() != parts || placement.len() != parts {
            return Err(bad(format!(
                "{} owners and {} places for {parts} parts; expected one of each a part",
                owners.len(),
                placement.len()
            )));
        }
        if let Some(p) =
            (0..parts).find(|&p| owners[p] >= cluster.size() || (owners[p] == rank) != placement[p].is_some())
        {
            return Err(bad(format!(
                "part {p}: owner {} with place {:?} on rank {rank} of {}; expected a rank of the world, and a \
                 device exactly for this rank's parts",
                owners[p],
                placement[p],
                cluster.size()
            )));
        }
        if parts.checked_mul(TAGS_PER_PART).is_none_or(|t| t > 32767) {
            return Err(bad(format!("{parts} parts; at most {} can be tagged", 32767 / TAGS_PER_PART)));
        }
        let on_gpus = |d: &usize| rt.describe(*d).is_ok_and(|x| x.kind == BackendKind::Cuda);
        let all_cuda = placement.iter().flatten().all(on_gpus);
        let engine = HaloEngine::choose(
            std::env::var("OFFLOAD_HALO").ok().as_deref(),
            cluster.cuda_aware(),
            all_cuda,
        )?;
        let mut crossings: [Vec<Crossing<'a, T>>; 2] = [Vec::new(), Vec::new()];
        for to in 0..parts {
            for (k, exchange) in part.exchanges(to, reach).enumerate() {
                let from = exchange.neighbour;
                if owners[to] == owners[from] || (owners[to] != rank && owners[from] != rank) {
                    continue;
                }
                let (held, other, out) = if owners[from] == rank { (from, to, 0) } else { (to, from, 1) };
                let device = placement[held].unwrap_or_default();
                let n = exchange.recv.len();
                if Count::try_from(n * std::mem::size_of::<T>()).is_err() {
                    return Err(bad(format!("a region of {n} points exceeds an MPI count")));
                }
                crossings[out].push(Crossing {
                    part: held,
                    other,
                    peer: owners[other],
                    tag: (to * TAGS_PER_PART + k) as i32,
                    exchange,
                    packed: DeviceBuffer::new(&rt.device(device)?, n)?,
                    staged: match engine.0 {
                        HaloEngine::Staged => Some(local_buffer(rt, device, n)?),
                        HaloEngine::CudaAwareMpi => None,
                    },
                });
            }
        }
        Ok(Self {
            comm: HaloComm(cluster.world().duplicate()),
            rank,
            rt,
            part: part.clone(),
            reach,
            placement: placement.to_vec(),
            crossings: Mutex::new(crossings),
            engine,
        })
    }

    /// The engine the regions cross with, and why it was chosen ([`HaloEngine::choose`]
    /// over `OFFLOAD_HALO`, the MPI library and this rank's devices).
    pub fn engine(&self) -> (HaloEngine, &str) {
        (self.engine.0, &self.engine.1)
    }

    /// The regions this rank sends to other ranks and receives from them.
    pub fn crossings(&self) -> [usize; 2] {
        let c = self.crossings.lock();
        [c[0].len(), c[1].len()]
    }

    /// Brings every part of `grid` held here its neighbours' points: from parts held here
    /// ([`DistributedGrid::exchange_halos`]) and from other ranks' (every receive and send
    /// posted before any is waited for). Collective with the neighbouring ranks' exchanges
    /// of the same grid. The program orders its writes of the points sent before the call
    /// (all of this rank's parts' steps queued from this thread, or a barrier).
    ///
    /// Errors: a grid not split and placed as these crossings were made for
    /// ([`Error::InvalidArgument`]); a failing pack, copy or MPI call names the rank, the
    /// part, its device and the region ([`Error::Exchange`]).
    pub fn exchange(&self, grid: &DistributedGrid<'_, T>) -> Result<()> {
        if *grid.partition() != self.part
            || grid.reach() != self.reach
            || grid.placement() != self.placement
            || !grid.runtime().same_as(self.rt)
        {
            return Err(Error::InvalidArgument {
                routine: "GridRanks::exchange",
                what: format!(
                    "a grid split as {:?} on {:?}; expected the crossings' {:?} on {:?} of their runtime",
                    grid.partition(),
                    grid.placement(),
                    self.part,
                    self.placement
                ),
            });
        }
        grid.exchange_halos()?;
        let mut guard = self.crossings.lock();
        let [outgoing, incoming] = &mut *guard;
        let host = self.rt.initial_device();
        for c in outgoing.iter_mut() {
            let device = grid.device(c.part).unwrap_or_default();
            let failed = self.failed(c, device, true);
            let dev = self.rt.device(device).map_err(&failed)?;
            let mapped = self.part.mapped(c.part);
            halo::pack(&dev, &c.exchange.send, &mapped, grid.view(c.part), c.packed.view())
                .map_err(&failed)?;
            let bytes = c.exchange.recv.len() * std::mem::size_of::<T>();
            match c.staged.as_mut() {
                // SAFETY: the packed region (a live buffer of `bytes`) into the pinned buffer
                // of as many, both owned by this crossing, whose lock the exchange holds.
                Some(staged) => unsafe {
                    let to = staged.as_mut_ptr() as u64;
                    self.rt.target_memcpy(to, c.packed.addr(), bytes, 0, 0, host, device)
                }
                .map_err(&failed)?,
                // MPI reads the packed buffer itself: the packing must be done first.
                None => self.rt.synchronize(device).map_err(&failed)?,
            }
        }
        // MPI's bytes: the pinned buffer, or the device buffer itself (CUDA-aware MPI).
        let raw = |c: &mut Crossing<'a, T>| RawBytes {
            ptr: match c.staged.as_mut() {
                Some(staged) => staged.as_mut_ptr().cast(),
                None => c.packed.addr() as *mut u8,
            },
            len: (c.exchange.recv.len() * std::mem::size_of::<T>()) as Count,
        };
        let mut into: Vec<RawBytes> = incoming.iter_mut().map(raw).collect();
        let out: Vec<RawBytes> = outgoing.iter_mut().map(raw).collect();
        // Every receive and send posted before any is waited for (the guards wait when the
        // scope ends), so ranks exchanging both ways never wait on each other.
        mpi::request::scope(|scope| {
            let mut waits = Vec::with_capacity(into.len() + out.len());
            for (b, c) in into.iter_mut().zip(incoming.iter()) {
                let peer = self.comm.0.process_at_rank(c.peer as i32);
                waits.push(WaitGuard::from(peer.immediate_receive_into_with_tag(scope, b, c.tag)));
            }
            for (b, c) in out.iter().zip(outgoing.iter()) {
                let peer = self.comm.0.process_at_rank(c.peer as i32);
                waits.push(WaitGuard::from(peer.immediate_send_with_tag(scope, b, c.tag)));
            }
        });
        for c in incoming.iter_mut() {
            let device = grid.device(c.part).unwrap_or_default();
            let failed = self.failed(c, device, false);
            let bytes = c.exchange.recv.len() * std::mem::size_of::<T>();
            if let Some(staged) = c.staged.as_mut() {
                let from = staged.as_mut_ptr() as u64;
                // SAFETY: the received bytes (pinned, this crossing's) into its landing
                // buffer of as many on the part's device.
                unsafe { self.rt.target_memcpy(c.packed.addr(), from, bytes, 0, 0, device, host) }
                    .map_err(&failed)?;
            }
            let dev = self.rt.device(device).map_err(&failed)?;
            let mapped = self.part.mapped(c.part);
            halo::unpack(&dev, &c.exchange.recv, &mapped, c.packed.view(), grid.view(c.part))
                .map_err(&failed)?;
        }
        Ok(())
    }

    /// What wraps a failure of crossing `c` on this rank, whose part is on `device`: the
    /// error names this rank, the part, its device and the region, sent (`out`) or received.
    fn failed(&self, c: &Crossing<'a, T>, device: usize, out: bool) -> impl Fn(Error) -> Error {
        let (rank, part) = (self.rank, c.part);
        let other = format!("rank {}", c.peer);
        let region =
            if out { sending(&c.exchange, c.other, &other) } else { receiving(&c.exchange, c.other, &other) };
        move |source: Error| Error::Exchange {
            rank: Some(rank),
            part,
            device,
            region: region.clone(),
            source: Box::new(source),
        }
    }
}

/// Names a region received, for an error: "receiving the face [6..7, 1..5] from part 2
/// (rank 1) as [0..1, 1..5]".
fn receiving(e: &Exchange, from: usize, place: &str) -> String {
    format!(
        "receiving the {} {:?} from part {from} ({place}) as {:?}",
        e.kind(),
        e.send.ranges(),
        e.recv.ranges()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each value of `OFFLOAD_HALO` against what the MPI library and the devices allow:
    /// the engine, or the fallback with its reason; a wrong value refused.
    #[test]
    fn the_engine_is_the_one_asked_for_or_a_stated_fallback() {
        let pick = |asked, aware, cuda| HaloEngine::choose(asked, aware, cuda).map(|(e, _)| e).ok();
        assert_eq!(pick(None, true, true), Some(HaloEngine::CudaAwareMpi));
        assert_eq!(pick(Some("auto"), true, true), Some(HaloEngine::CudaAwareMpi));
        assert_eq!(pick(Some("mpi"), true, true), Some(HaloEngine::CudaAwareMpi));
        assert_eq!(pick(Some("staged"), true, true), Some(HaloEngine::Staged));
        for (asked, aware, cuda, because) in [
            (None, false, true, "does not report CUDA support"),
            (Some("mpi"), false, true, "OFFLOAD_HALO=mpi, but the MPI library does not report CUDA support"),
            (Some("mpi"), true, false, "not on a CUDA GPU"),
            (Some("nccl"), true, true, "NCCL, which is not built in yet"),
        ] {
            let (engine, why) = HaloEngine::choose(asked, aware, cuda).unwrap();
            assert_eq!(engine, HaloEngine::Staged, "{asked:?}");
            assert!(why.contains(because) && why.starts_with("staged"), "{asked:?}: {why}");
        }
        assert!(matches!(
            HaloEngine::choose(Some("rdma"), true, true),
            Err(Error::InvalidSetting { var: "OFFLOAD_HALO", .. })
        ));
    }
}
