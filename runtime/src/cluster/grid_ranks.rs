//! A grid split in one, two or three dimensions ([`GridPartition`]) over the ranks of an
//! MPI job: each rank holds some of the parts ([`DistributedGrid::map_held`]), and
//! [`GridRanks::exchange`] moves every region between parts, within the rank as
//! [`DistributedGrid::exchange_halos`] does and between ranks by one of three engines
//! ([`HaloEngine`]): staged through pinned host buffers (packed on the sender's device by
//! the generated box kernel, copied to its rank's pinned buffer, sent; received into the
//! receiver's pinned buffer, copied to its device, unpacked), or the packed device buffers
//! handed to a CUDA-aware MPI or to NCCL. A device's regions of one direction lie side by
//! side in one buffer (an arena), so that a step stages each device's faces in one host
//! copy a direction, not one a face.

use mpi::request::WaitGuard;
use mpi::traits::*;
use mpi::Count;
use parking_lot::Mutex;

use super::halo::{local_buffer, HaloComm, RawBytes};
use crate::api::{DeviceBuffer, HostBuffer};
use crate::cluster::world::Cluster;
use crate::collective::{NcclComm, NcclId, Transfer};
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
/// the part held here, the other rank, the tag, and where in its [`Arena`] it goes.
struct Crossing {
    /// The part held here: the sender of an outgoing region, the receiver of an incoming.
    part: usize,
    /// Its device.
    device: usize,
    /// The part on the other rank.
    other: usize,
    peer: usize,
    tag: i32,
    exchange: Exchange,
    /// Its arena (of its direction) and its first element there.
    arena: usize,
    at: usize,
}

/// The regions one device sends (or receives) across ranks, back to back: packed (landed)
/// in one device buffer and staged in one pinned buffer, so that each device and direction
/// makes one host copy a step for all its faces, not one a face.
struct Arena<'a, T: HaloElement> {
    device: usize,
    packed: DeviceBuffer<'a, T>,
    /// Pinned, allocated on the device's compute lane; `None` where the engine takes
    /// `packed` itself (a CUDA-aware MPI, NCCL).
    staged: Option<HostBuffer<T>>,
}

/// Each direction's crossings and arenas, `[outgoing, incoming]`.
type Directions<'a, T> = ([Vec<Crossing>; 2], [Vec<Arena<'a, T>>; 2]);

/// A rank's crossings and arenas, and its engine with the reason.
type Made<'a, T> = (Directions<'a, T>, (HaloEngine, String));

/// How a grid's regions cross between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HaloEngine {
    /// Device -> pinned host buffer -> MPI -> pinned host buffer -> device.
    Staged,
    /// The packed device buffers handed to a CUDA-aware MPI, no host copies.
    CudaAwareMpi,
    /// The packed device buffers sent and received by NCCL, one rank a GPU, on the
    /// devices' compute queues.
    Nccl,
}

impl HaloEngine {
    /// The engine for a run: `asked` is `OFFLOAD_HALO`'s value (`staged`, `mpi`, `nccl`, or
    /// unset / `auto`: the direct path where it can run), `cuda_aware` whether the MPI
    /// library said at run time that it takes CUDA pointers, `all_cuda` whether this rank's
    /// parts are all on CUDA GPUs, `nccl` whether NCCL can carry this rank's parts (`Err`:
    /// why not). Gives the engine and why: the one asked for, or why it cannot run and
    /// what runs instead. (`GridRanks::new` then makes the ranks agree: NCCL runs only where
    /// every rank can run it.)
    ///
    /// Errors: a value not among those ([`Error::InvalidSetting`]).
    ///
    /// ```
    /// use offload::cluster::HaloEngine;
    ///
    /// let (engine, why) = HaloEngine::choose(Some("mpi"), false, true, Err("no NCCL library"))?;
    /// assert_eq!(engine, HaloEngine::Staged);
    /// assert!(why.contains("does not report CUDA support"));
    /// let (engine, why) = HaloEngine::choose(Some("nccl"), false, true, Err("no NCCL library"))?;
    /// assert_eq!(engine, HaloEngine::Staged);
    /// assert!(why.contains("no NCCL library"));
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn choose(
        asked: Option<&str>,
        cuda_aware: bool,
        all_cuda: bool,
        nccl: std::result::Result<(), &str>,
    ) -> Result<(Self, String)> {
        let direct = match (cuda_aware, all_cuda) {
            (false, _) => Err("the MPI library does not report CUDA support"),
            (true, false) => Err("a part of this rank is not on a CUDA GPU"),
            (true, true) => Ok(()),
        };
        let staged = "staged through pinned host buffers";
        Ok(match asked.map(str::trim).filter(|v| !v.is_empty()).unwrap_or("auto") {
            "staged" => (Self::Staged, format!("{staged}, as OFFLOAD_HALO=staged asks")),
            "nccl" => match nccl {
                Ok(()) => (Self::Nccl, "device buffers sent and received by NCCL".to_string()),
                Err(why) => (Self::Staged, format!("{staged}: OFFLOAD_HALO=nccl, but {why}")),
            },
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

    /// Whether NCCL can carry the parts of a rank placed on `placement` of `rt`: NCCL
    /// built and loadable, and every part on one CUDA GPU (NCCL takes one rank a GPU, and
    /// here one GPU a rank). `Err` says why not.
    pub fn nccl_here(rt: &Runtime, placement: &[Option<usize>]) -> std::result::Result<usize, String> {
        let mut devices: Vec<usize> = placement.iter().flatten().copied().collect();
        devices.dedup();
        devices.sort_unstable();
        devices.dedup();
        let [device] = devices[..] else {
            return Err(format!(
                "this rank's parts are on {} devices; NCCL here takes one GPU a rank",
                devices.len()
            ));
        };
        match rt.describe(device) {
            Ok(d) if d.kind == BackendKind::Cuda => {}
            Ok(d) => return Err(format!("device {device} is a {} device, not a CUDA GPU", d.kind.name())),
            Err(e) => return Err(e.to_string()),
        }
        NcclComm::available().map(|_| device)
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
    /// This rank's rank of the job's NCCL communicator, with [`HaloEngine::Nccl`]:
    /// dropped before the buffers its operations use.
    nccl: Option<NcclComm<'a>>,
    /// `[outgoing, incoming]`, locked for a whole exchange.
    crossings: Mutex<Directions<'a, T>>,
    engine: (HaloEngine, String),
}

impl<T: HaloElement> std::fmt::Debug for GridRanks<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.crossings.lock();
        f.debug_struct("GridRanks")
            .field("rank", &self.rank)
            .field("placement", &self.placement)
            .field("outgoing", &c.0[0].len())
            .field("incoming", &c.0[1].len())
            .field("engine", &self.engine)
            .finish()
    }
}

impl<'a, T: HaloElement> GridRanks<'a, T> {
    /// The crossings of a grid split by `part` whose part `p` is held by rank `owners[p]`,
    /// those of this rank on `placement[p]` of `rt` (as [`DistributedGrid::map_held`]
    /// takes it: `Some` exactly for the parts this rank owns).
    ///
    /// Collective, and so are its failures: the ranks check together that they describe
    /// the same grid, and where one rank refuses or fails, every rank returns an error
    /// (that rank its own, the others one naming it), so that none waits for another.
    ///
    /// Errors: an owner per part, each a rank of the world, and a placement naming exactly
    /// this rank's parts are expected; a grid of more parts than the tags can number; ranks
    /// that describe different grids (split, reach, owners or element type)
    /// ([`Error::InvalidArgument`]); a bad `OFFLOAD_HALO`; memory a device cannot give.
    pub fn new(
        cluster: &Cluster,
        rt: &'a Runtime,
        part: &GridPartition,
        reach: Reach,
        owners: &[usize],
        placement: &[Option<usize>],
    ) -> Result<Self> {
        let comm = HaloComm(cluster.world().duplicate());
        // NCCL only where every rank asks for it and can run it: agreed before anything is
        // allocated, so that every rank runs the same engine (NCCL cannot meet another).
        let asked = std::env::var("OFFLOAD_HALO").ok();
        let wants = asked.as_deref().map(str::trim) == Some("nccl");
        let nccl_here =
            if wants { HaloEngine::nccl_here(rt, placement) } else { Err("OFFLOAD_HALO is not nccl".into()) };
        let willing = cluster.sum(if nccl_here.is_ok() { 1.0 } else { 0.0 });
        let others = cluster.size() as f64 - willing;
        let nccl = match &nccl_here {
            Err(why) => Err(why.clone()),
            Ok(_) if others > 0.0 => {
                Err(format!("{others} other rank(s) cannot run it or do not ask for it"))
            }
            Ok(_) => Ok(()),
        };
        let made = Self::crossings_of(
            cluster,
            rt,
            part,
            reach,
            owners,
            placement,
            asked.as_deref(),
            nccl.as_ref().map(|_| ()),
        );
        // The same grid on every rank: a key of its description, compared by its least
        // and greatest value over the ranks (52 bits, exact in an f64).
        let described = format!("{part:?} {reach:?} {owners:?} {}", std::mem::size_of::<T>());
        let key = (fnv(described.as_bytes()) & ((1 << 52) - 1)) as f64;
        let (lowest, highest) = (-cluster.max(-key), cluster.max(key));
        let failed = cluster.sum(if made.is_ok() { 0.0 } else { 1.0 });
        let bad = |what: String| Error::InvalidArgument { routine: "GridRanks::new", what };
        let (crossings, engine) = made?;
        if failed > 0.0 {
            return Err(bad(format!("{failed} other rank(s) could not make their crossings of the grid")));
        }
        if lowest != highest {
            return Err(bad(
                "the ranks describe different grids (split, reach, owners or element type)".into()
            ));
        }
        let nccl = match (engine.0, nccl_here) {
            (HaloEngine::Nccl, Ok(device)) => Some(Self::nccl_rank(cluster, &comm, rt, device)?),
            _ => None,
        };
        Ok(Self {
            nccl,
            comm,
            rank: cluster.rank(),
            rt,
            part: part.clone(),
            reach,
            placement: placement.to_vec(),
            crossings: Mutex::new(crossings),
            engine,
        })
    }

    /// This rank's NCCL rank (its MPI rank) on `device`, the communicator's identity made
    /// by rank 0 and broadcast. Collective in its failures as far as MPI goes: rank 0
    /// failing to make the identity fails every rank; NCCL's own initialisation is
    /// collective in NCCL (a rank failing inside it may leave the others waiting there).
    fn nccl_rank(cluster: &Cluster, comm: &HaloComm, rt: &'a Runtime, device: usize) -> Result<NcclComm<'a>> {
        let made =
            if cluster.is_root() { NcclId::new(rt, device).map(|id| id.to_bytes()) } else { Ok([0; 128]) };
        let mut bytes = *made.as_ref().unwrap_or(&[0; 128]);
        let root_failed = cluster.max(if made.is_ok() { 0.0 } else { 1.0 }) > 0.0;
        made?;
        if root_failed {
            return Err(Error::InvalidArgument {
                routine: "GridRanks::new",
                what: "rank 0 could not make the NCCL communicator's identity".into(),
            });
        }
        // On the crossings' own communicator: no other thread's collective can meet it.
        comm.0.process_at_rank(0).broadcast_into(&mut bytes[..]);
        NcclComm::of_rank(rt, device, cluster.rank(), cluster.size(), &NcclId::from_bytes(bytes))
    }

    /// This rank's crossings and their engine, checked and allocated (see [`GridRanks::new`]).
    #[allow(clippy::too_many_arguments)]
    fn crossings_of(
        cluster: &Cluster,
        rt: &'a Runtime,
        part: &GridPartition,
        reach: Reach,
        owners: &[usize],
        placement: &[Option<usize>],
        asked: Option<&str>,
        nccl: std::result::Result<(), &String>,
    ) -> Result<Made<'a, T>> {
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
        let engine = HaloEngine::choose(asked, cluster.cuda_aware(), all_cuda, nccl.map_err(|s| s.as_str()))?;
        let mut crossings: [Vec<Crossing>; 2] = [Vec::new(), Vec::new()];
        // Each direction's arenas' devices and lengths, in the order first needed.
        let mut sizes: [Vec<(usize, usize)>; 2] = [Vec::new(), Vec::new()];
        for to in 0..parts {
            for (k, exchange) in part.exchanges(to, reach).enumerate() {
                let from = exchange.neighbour;
                if owners[to] == owners[from] || (owners[to] != rank && owners[from] != rank) {
                    continue;
                }
                let (held, other, out) = if owners[from] == rank { (from, to, 0) } else { (to, from, 1) };
                let device = placement[held].unwrap_or_default();
                let n = exchange.recv.len();
                let bytes = n.checked_mul(std::mem::size_of::<T>()).filter(|&b| Count::try_from(b).is_ok());
                if bytes.is_none() {
                    return Err(bad(format!("a region of {n} points exceeds an MPI count")));
                }
                let arena = match sizes[out].iter().position(|&(d, _)| d == device) {
                    Some(a) => a,
                    None => {
                        sizes[out].push((device, 0));
                        sizes[out].len() - 1
                    }
                };
                let at = sizes[out][arena].1;
                sizes[out][arena].1 =
                    at.checked_add(n).ok_or_else(|| bad(format!("regions of {at} + {n} points")))?;
                let tag = (to * TAGS_PER_PART + k) as i32;
                crossings[out].push(Crossing {
                    part: held,
                    device,
                    other,
                    peer: owners[other],
                    tag,
                    exchange,
                    arena,
                    at,
                });
            }
        }
        let mut arenas: [Vec<Arena<'a, T>>; 2] = [Vec::new(), Vec::new()];
        for (out, list) in sizes.iter().enumerate() {
            for &(device, n) in list {
                arenas[out].push(Arena {
                    device,
                    packed: DeviceBuffer::new(&rt.device(device)?, n)?,
                    staged: match engine.0 {
                        HaloEngine::Staged => Some(local_buffer(rt, device, n)?),
                        HaloEngine::CudaAwareMpi | HaloEngine::Nccl => None,
                    },
                });
            }
        }
        Ok(((crossings, arenas), engine))
    }

    /// The engine the regions cross with, and why it was chosen ([`HaloEngine::choose`]
    /// over `OFFLOAD_HALO`, the MPI library and this rank's devices).
    pub fn engine(&self) -> (HaloEngine, &str) {
        (self.engine.0, &self.engine.1)
    }

    /// The NCCL communicator the regions cross with (one rank a GPU, NCCL rank = MPI rank),
    /// when NCCL is the engine: a program sums its device values over the ranks with it
    /// ([`NcclComm::sum`]) instead of through the host.
    pub fn nccl(&self) -> Option<&NcclComm<'a>> {
        self.nccl.as_ref()
    }

    /// The regions this rank sends to other ranks and receives from them.
    pub fn crossings(&self) -> [usize; 2] {
        let c = self.crossings.lock();
        [c.0[0].len(), c.0[1].len()]
    }

    /// Brings every part of `grid` held here its neighbours' points: from parts held here
    /// ([`DistributedGrid::exchange_halos`]) and from other ranks' (every receive and send
    /// posted before any is waited for). Collective with the neighbouring ranks' exchanges
    /// of the same grid. The program orders its writes of the points sent before the call
    /// (all of this rank's parts' steps queued from this thread, or a barrier).
    ///
    /// A rank whose exchange fails still sends (what its buffers hold) and receives, so
    /// that no other rank waits for it; it leaves its parts' halos as they were and returns
    /// its error.
    ///
    /// Errors: a grid not split, reaching and placed as these crossings were made for
    /// ([`Error::InvalidArgument`]); a failing pack, copy or launch names the rank, the
    /// part, its device and the region ([`Error::Exchange`]). (A failing MPI call ends the
    /// job, as MPI's default error handler does.)
    pub fn exchange(&self, grid: &DistributedGrid<'_, T>) -> Result<()> {
        let mut first_err = None;
        if *grid.partition() != self.part
            || grid.reach() != self.reach
            || grid.placement() != self.placement
            || !grid.runtime().same_as(self.rt)
        {
            first_err = Some(Error::InvalidArgument {
                routine: "GridRanks::exchange",
                what: format!(
                    "a grid split as {:?} reaching across {:?} on {:?}; expected the crossings' {:?} across {:?} \
                     on {:?}, of their runtime",
                    grid.partition(),
                    grid.reach(),
                    grid.placement(),
                    self.part,
                    self.reach,
                    self.placement
                ),
            });
        }
        // Only a grid these crossings were made for is read or written.
        let usable = first_err.is_none();
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        };
        if usable {
            note(grid.exchange_halos());
        }
        let mut guard = self.crossings.lock();
        let ([outgoing, incoming], [sending, landing]) = &mut *guard;
        let host = self.rt.initial_device();
        let size = std::mem::size_of::<T>();
        // Every region packed first (queued on its part's device, each at its place in its
        // device's arena), then each arena copied out in one go: the copy waits for the
        // packing once, and a device makes one host copy a step, not one a face.
        for c in outgoing.iter() {
            if !usable {
                break;
            }
            let mapped = self.part.mapped(c.part);
            let a = &sending[c.arena];
            let packed = self.rt.device(c.device).and_then(|dev| {
                let into = a.packed.view().slice(c.at..c.at + c.exchange.recv.len())?;
                halo::pack(&dev, &c.exchange.send, &mapped, grid.view(c.part), into)
            });
            note(packed.map_err(|e| self.failed(c, true, e)));
        }
        for (k, a) in sending.iter_mut().enumerate() {
            if !usable {
                break;
            }
            let bytes = a.packed.len() * size;
            let copied = match a.staged.as_mut() {
                // SAFETY: the packed regions (a live buffer of `bytes`) into the pinned
                // buffer of as many, both owned by this arena, whose lock the exchange holds.
                Some(staged) => unsafe {
                    let to = staged.as_mut_ptr() as u64;
                    self.rt.target_memcpy(to, a.packed.addr(), bytes, 0, 0, host, a.device)
                },
                // NCCL's send is queued behind the packing on the device's compute queue.
                None if self.nccl.is_some() => Ok(()),
                // MPI reads the packed buffer itself: the packing must be done first.
                None => self.rt.synchronize(a.device),
            };
            if let (Err(e), Some(c)) = (copied, outgoing.iter().find(|c| c.arena == k)) {
                note(Err(self.failed(c, true, e)));
            }
        }
        // MPI writes the landing buffers themselves on the direct path: the unpacking of
        // the exchange before must be done first.
        // (NCCL's receives are queued behind it on the compute queue.)
        for (k, a) in landing.iter().enumerate().filter(|(_, a)| a.staged.is_none() && self.nccl.is_none()) {
            if let (Err(e), Some(c)) = (self.rt.synchronize(a.device), incoming.iter().find(|c| c.arena == k))
            {
                note(Err(self.failed(c, false, e)));
            }
        }
        if let Some(nccl) = &self.nccl {
            note(self.nccl_group(nccl, outgoing, incoming, sending, landing));
        } else {
            self.mpi_messages(outgoing, incoming, sending, landing);
        }
        // Each arena's received regions copied in at once, then each region unpacked.
        let mut landed = vec![Ok(()); landing.len()];
        for (a, r) in landing.iter_mut().zip(landed.iter_mut()) {
            if first_err.is_some() {
                break;
            }
            if let Some(staged) = a.staged.as_mut() {
                let from = staged.as_mut_ptr() as u64;
                // SAFETY: the received bytes (pinned, this arena's) into its landing buffer
                // of as many on its device.
                *r = unsafe {
                    self.rt.target_memcpy(a.packed.addr(), from, a.packed.len() * size, 0, 0, a.device, host)
                };
            }
        }
        for c in incoming.iter() {
            if first_err.is_some() {
                break;
            }
            let mapped = self.part.mapped(c.part);
            let unpacked = landed[c.arena].clone().and_then(|()| self.rt.device(c.device)).and_then(|dev| {
                let from = landing[c.arena].packed.view().slice(c.at..c.at + c.exchange.recv.len())?;
                halo::unpack(&dev, &c.exchange.recv, &mapped, from, grid.view(c.part))
            });
            if let Err(e) = unpacked {
                first_err = Some(self.failed(c, false, e));
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Every receive and send of the crossings as MPI messages: from the arenas' pinned
    /// buffers, or their device buffers themselves (CUDA-aware MPI).
    fn mpi_messages(
        &self,
        outgoing: &[Crossing],
        incoming: &[Crossing],
        sending: &mut [Arena<'a, T>],
        landing: &mut [Arena<'a, T>],
    ) {
        // Each arena's first byte, taken once (a pinned buffer's, or the device buffer's).
        let base = |a: &mut Arena<'a, T>| match a.staged.as_mut() {
            Some(staged) => staged.as_mut_ptr().cast::<u8>(),
            None => a.packed.addr() as *mut u8,
        };
        let (out_base, in_base): (Vec<*mut u8>, Vec<*mut u8>) =
            (sending.iter_mut().map(base).collect(), landing.iter_mut().map(base).collect());
        let size = std::mem::size_of::<T>();
        let raw = |c: &Crossing, base: *mut u8| RawBytes {
            ptr: base.wrapping_add(c.at * size),
            len: (c.exchange.recv.len() * size) as Count,
        };
        let mut into: Vec<RawBytes> = incoming.iter().map(|c| raw(c, in_base[c.arena])).collect();
        let out: Vec<RawBytes> = outgoing.iter().map(|c| raw(c, out_base[c.arena])).collect();
        // Every receive and send posted before any is waited for (the guards wait when the
        // scope ends), so ranks exchanging both ways never wait on each other; posted even
        // after a failure here, so that the neighbours' matching calls complete.
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
    }

    /// Every receive and send of the crossings in one NCCL group, queued on the devices'
    /// compute queues (peers are MPI ranks, which are the communicator's ranks); posted
    /// after a failure here too, so that the neighbours' matching calls complete.
    fn nccl_group(
        &self,
        nccl: &NcclComm<'a>,
        outgoing: &[Crossing],
        incoming: &[Crossing],
        sending: &[Arena<'a, T>],
        landing: &[Arena<'a, T>],
    ) -> Result<()> {
        let size = std::mem::size_of::<T>();
        let op = |c: &Crossing, a: &Arena<'a, T>, send: bool| Transfer {
            device: c.device,
            send,
            addr: a.packed.addr() + (c.at * size) as u64,
            bytes: c.exchange.recv.len() * size,
            peer: c.peer,
        };
        let ops: Vec<Transfer> = incoming
            .iter()
            .map(|c| op(c, &landing[c.arena], false))
            .chain(outgoing.iter().map(|c| op(c, &sending[c.arena], true)))
            .collect();
        // SAFETY: every region lies in its arena's live device allocation (freed after its
        // device's queued work), under the exchange's lock: each packed region is read by
        // its send alone, each landing region written by its receive and read by the
        // unpacking queued after it.
        unsafe { nccl.group(&ops) }.map_err(|e| match incoming.first().or(outgoing.first()) {
            Some(c) => Error::Exchange {
                rank: Some(self.rank),
                part: c.part,
                device: c.device,
                region: format!("the group of {} regions sent and received over NCCL", ops.len()),
                source: Box::new(e),
            },
            None => e,
        })
    }

    /// `source`, a failure of crossing `c` on this rank, named: this rank, the part, its
    /// device and the region, sent (`out`) or received (formatted only on failure).
    fn failed(&self, c: &Crossing, out: bool, source: Error) -> Error {
        let other = format!("rank {}", c.peer);
        let region =
            if out { sending(&c.exchange, c.other, &other) } else { receiving(&c.exchange, c.other, &other) };
        Error::Exchange {
            rank: Some(self.rank),
            part: c.part,
            device: c.device,
            region,
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

/// FNV-1a, 64 bits.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each value of `OFFLOAD_HALO` against what the MPI library and the devices allow:
    /// the engine, or the fallback with its reason; a wrong value refused.
    #[test]
    fn the_engine_is_the_one_asked_for_or_a_stated_fallback() {
        let no = Err("no NCCL library");
        let pick = |asked, aware, cuda| HaloEngine::choose(asked, aware, cuda, no).map(|(e, _)| e).ok();
        assert_eq!(pick(None, true, true), Some(HaloEngine::CudaAwareMpi));
        assert_eq!(pick(Some("auto"), true, true), Some(HaloEngine::CudaAwareMpi));
        assert_eq!(pick(Some("mpi"), true, true), Some(HaloEngine::CudaAwareMpi));
        assert_eq!(pick(Some("staged"), true, true), Some(HaloEngine::Staged));
        let (engine, why) = HaloEngine::choose(Some("nccl"), false, true, Ok(())).unwrap();
        assert_eq!((engine, why.as_str()), (HaloEngine::Nccl, "device buffers sent and received by NCCL"));
        // NCCL only where asked for: `auto` prefers the direct MPI path, then staging.
        assert_eq!(HaloEngine::choose(None, false, true, Ok(())).unwrap().0, HaloEngine::Staged);
        for (asked, aware, cuda, because) in [
            (None, false, true, "does not report CUDA support"),
            (Some("mpi"), false, true, "OFFLOAD_HALO=mpi, but the MPI library does not report CUDA support"),
            (Some("mpi"), true, false, "not on a CUDA GPU"),
            (Some("nccl"), true, true, "OFFLOAD_HALO=nccl, but no NCCL library"),
        ] {
            let (engine, why) = HaloEngine::choose(asked, aware, cuda, no).unwrap();
            assert_eq!(engine, HaloEngine::Staged, "{asked:?}");
            assert!(why.contains(because) && why.starts_with("staged"), "{asked:?}: {why}");
        }
        assert!(matches!(
            HaloEngine::choose(Some("rdma"), true, true, Ok(())),
            Err(Error::InvalidSetting { var: "OFFLOAD_HALO", .. })
        ));
    }
}
