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
    /// Pinned, allocated on the device's compute lane.
    staged: HostBuffer<T>,
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
}

impl<T: HaloElement> std::fmt::Debug for GridRanks<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.crossings.lock();
        f.debug_struct("GridRanks")
            .field("rank", &self.rank)
            .field("placement", &self.placement)
            .field("outgoing", &c[0].len())
            .field("incoming", &c[1].len())
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
                    staged: local_buffer(rt, device, n)?,
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
        })
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
            halo::pack(&dev, &c.exchange.send, &self.part.mapped(c.part), grid.view(c.part), c.packed.view())
                .map_err(&failed)?;
            let bytes = c.exchange.recv.len() * std::mem::size_of::<T>();
            // SAFETY: the packed region (a live buffer of `bytes`) into the pinned buffer of
            // as many, both owned by this crossing, whose lock the exchange holds.
            unsafe {
                self.rt.target_memcpy(
                    c.staged.as_mut_ptr() as u64,
                    c.packed.addr(),
                    bytes,
                    0,
                    0,
                    host,
                    device,
                )
            }
            .map_err(&failed)?;
        }
        let raw = |c: &mut Crossing<'a, T>| RawBytes {
            ptr: c.staged.as_mut_ptr().cast(),
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
            // SAFETY: the received bytes (pinned, this crossing's) into its landing buffer
            // of as many on the part's device.
            unsafe {
                self.rt.target_memcpy(
                    c.packed.addr(),
                    c.staged.as_mut_ptr() as u64,
                    bytes,
                    0,
                    0,
                    device,
                    host,
                )
            }
            .map_err(&failed)?;
            let dev = self.rt.device(device).map_err(&failed)?;
            halo::unpack(
                &dev,
                &c.exchange.recv,
                &self.part.mapped(c.part),
                c.packed.view(),
                grid.view(c.part),
            )
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
