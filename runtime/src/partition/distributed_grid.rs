//! A grid split in one, two or three dimensions ([`GridPartition`]) held part by part on
//! devices: the counterpart of [`super::DistributedArray`] for boxes that are not one
//! range of host memory.
//!
//! A part of a row split is a run of whole rows, one host range, so
//! [`super::DistributedArray`] maps it (keyed by its host address, as OpenMP does). A part
//! of a `2 x 2` split is a box whose rows are strided in the host grid: it lives in a
//! buffer of its device, the box's points row-major (`omp_target_alloc`), filled from the
//! host by a pitched copy (`omp_target_memcpy_rect`) and copied back the same way. Halos
//! go neighbour to neighbour as [`GridPartition::exchanges`] lists them: each region packed
//! on the sender's device by a generated kernel ([`super::halo`]), copied whole to the
//! receiver's device where that is another, and unpacked there.
//!
//! ```
//! use offload::partition::{DistributedGrid, GridPartition, Reach};
//! use offload::{MapType, Runtime};
//!
//! let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(4).build()?;
//! // 6 x 6 points, a boundary of 1, the 4 x 4 interior on 2 x 2 devices.
//! let part = GridPartition::new(&[6, 6], &[2, 2], 1)?;
//! let mut grid: Vec<f32> = (0..36).map(|i| i as f32).collect();
//! let d = DistributedGrid::map(&rt, &[0, 1, 2, 3], &mut grid, part, Reach::Faces, MapType::TO)?;
//! d.exchange_halos()?;
//! // Part 0 holds rows 0..4 and columns 0..4; its right halo column came from part 1.
//! assert_eq!(d.to_vec(0)?[3], 3.0);
//! d.gather()?;
//! assert_eq!(grid[7], 7.0);
//! # Ok::<(), offload::Error>(())
//! ```

use crate::api::{DeviceBuffer, DeviceSlice};
use crate::collective::{NcclComm, Transfer};
use crate::data_env::MapType;
use crate::error::{Error, Result};
use crate::rt::memcpy::RectSide;
use crate::rt::Runtime;
use parking_lot::Mutex;

use super::halo::{self, HaloElement};
use super::{Exchange, GridBox, GridPartition, Reach};

/// A host grid held part by part in device buffers, one part per device of a
/// [`GridPartition`]. Holds the grid exclusively until [`DistributedGrid::gather`] (or
/// drop, which frees the parts without copying back).
#[derive(Debug)]
pub struct DistributedGrid<'a, T: HaloElement> {
    rt: &'a Runtime,
    /// Each part's device, `None` for a part another process holds.
    placement: Vec<Option<usize>>,
    part: GridPartition,
    reach: Reach,
    host: &'a mut [T],
    /// Part `p`'s mapped box, row-major, on its device (`None`: held elsewhere).
    local: Vec<Option<DeviceBuffer<'a, T>>>,
    /// Per sending part, what it sends to parts held here, locked while it sends (its
    /// scratch buffers have one writer at a time).
    sends: Vec<Mutex<Vec<Send<'a, T>>>>,
}

/// One region a part sends: the exchange as its receiver lists it, packed into `packed` on
/// the sender's device, copied into `landed` on the receiver's where that is another (made
/// on first use for a region of one device that NCCL moves:
/// [`DistributedGrid::exchange_halos_over`]).
#[derive(Debug)]
struct Send<'a, T: HaloElement> {
    to: usize,
    exchange: Exchange,
    packed: DeviceBuffer<'a, T>,
    landed: Option<DeviceBuffer<'a, T>>,
}

impl<'a, T: HaloElement> DistributedGrid<'a, T> {
    /// Puts part `p`'s mapped box of `host` (the whole grid, row-major) on `devices[p]`:
    /// copied with `MapType::TO`, allocated only with `MapType::ALLOC`. `reach` says which
    /// neighbours' points a step reads ([`Reach::Faces`] for a 5- or 7-point stencil),
    /// so which regions [`DistributedGrid::exchange_halos`] moves.
    ///
    /// Errors: as many offload devices as parts, a grid of as many points as the
    /// partition, and a map type of `TO` or `ALLOC` are expected
    /// ([`Error::InvalidArgument`]); a device
    /// that is not one, or memory a device cannot give, fail as `omp_target_alloc` does,
    /// with what was allocated so far freed.
    pub fn map(
        rt: &'a Runtime,
        devices: &[usize],
        host: &'a mut [T],
        part: GridPartition,
        reach: Reach,
        map_type: MapType,
    ) -> Result<Self> {
        let placement: Vec<Option<usize>> = devices.iter().map(|&d| Some(d)).collect();
        Self::map_held(rt, &placement, host, part, reach, map_type)
    }

    /// As [`DistributedGrid::map`] for a process that holds only some of the parts: part
    /// `p` on device `placement[p]`, or held by another process where that is `None` (the
    /// parts of an MPI rank: `cluster::GridRanks` exchanges the regions between
    /// processes). Exchanges here move regions between parts held here; a gather copies
    /// back the owned boxes of those.
    pub fn map_held(
        rt: &'a Runtime,
        placement: &[Option<usize>],
        host: &'a mut [T],
        part: GridPartition,
        reach: Reach,
        map_type: MapType,
    ) -> Result<Self> {
        let bad = |what: String| Error::InvalidArgument { routine: "DistributedGrid::map", what };
        if placement.len() != part.parts() {
            return Err(bad(format!("{} devices for {} parts", placement.len(), part.parts())));
        }
        let points = part.extents().iter().try_fold(1usize, |n, &e| n.checked_mul(e));
        if points != Some(host.len()) {
            return Err(bad(format!(
                "a grid of {} elements is not one of {:?} points",
                host.len(),
                part.extents()
            )));
        }
        let copy_in = if map_type == MapType::TO {
            true
        } else if map_type == MapType::ALLOC {
            false
        } else {
            return Err(bad(format!("map type {map_type:?}; expected TO or ALLOC")));
        };
        // The initial device's "buffer" would be host memory its kernels share with this
        // thread's copies; a grid's parts go to offload devices.
        if let Some(d) = placement.iter().flatten().find(|&&d| d == rt.initial_device()) {
            return Err(bad(format!("device {d} is the initial device; expected offload devices")));
        }
        let mut local = Vec::with_capacity(placement.len());
        for (p, d) in placement.iter().enumerate() {
            local.push(d.map(|d| DeviceBuffer::new(&rt.device(d)?, part.mapped(p).len())).transpose()?);
        }
        let mut sends: Vec<Vec<Send<'a, T>>> = (0..placement.len()).map(|_| Vec::new()).collect();
        for (to, at) in placement.iter().enumerate() {
            let Some(at) = *at else { continue };
            for exchange in part.exchanges(to, reach) {
                let from = exchange.neighbour;
                let Some(src) = placement[from] else { continue };
                let n = exchange.recv.len();
                let packed = DeviceBuffer::new(&rt.device(src)?, n)?;
                let landed = if src == at { None } else { Some(DeviceBuffer::new(&rt.device(at)?, n)?) };
                sends[from].push(Send { to, exchange, packed, landed });
            }
        }
        let sends = sends.into_iter().map(Mutex::new).collect();
        let g = Self { rt, placement: placement.to_vec(), part, reach, host, local, sends };
        if copy_in {
            for p in g.held() {
                g.copy_box(p, &g.part.mapped(p), g.host.as_ptr() as u64, false)?;
            }
        }
        Ok(g)
    }

    /// The runtime the grid is on.
    pub fn runtime(&self) -> &'a Runtime {
        self.rt
    }

    /// The partition.
    pub fn partition(&self) -> &GridPartition {
        &self.part
    }

    /// Which neighbours' points the exchanges bring.
    pub fn reach(&self) -> Reach {
        self.reach
    }

    /// Each part's device, `None` for a part held by another process.
    pub fn placement(&self) -> &[Option<usize>] {
        &self.placement
    }

    /// The parts held here, in order.
    pub fn held(&self) -> impl Iterator<Item = usize> + '_ {
        self.placement.iter().enumerate().filter_map(|(p, d)| d.map(|_| p))
    }

    /// The device of part `p`, `None` if another process holds it.
    ///
    /// # Panics
    ///
    /// If `p` is not a part (`p >= parts`), as for every method here that takes a part.
    pub fn device(&self, p: usize) -> Option<usize> {
        self.placement[p]
    }

    /// A kernel view of part `p`'s points: its mapped box ([`GridPartition::mapped`]),
    /// row-major, halos included (a kernel may write it, as a [`DeviceBuffer`]'s).
    ///
    /// # Panics
    ///
    /// If `p` is not a part held here.
    pub fn view(&self, p: usize) -> DeviceSlice<'_, T> {
        self.buffer(p).unwrap_or_else(|| panic!("part {p} of the grid is held by another process")).view()
    }

    /// Part `p`'s buffer, if held here.
    pub(crate) fn buffer(&self, p: usize) -> Option<&DeviceBuffer<'a, T>> {
        self.local[p].as_ref()
    }

    /// Part `p`'s points as they are on its device now (its mapped box, row-major).
    ///
    /// Errors: a part another process holds ([`Error::InvalidArgument`]).
    pub fn to_vec(&self, p: usize) -> Result<Vec<T>> {
        match self.buffer(p) {
            Some(b) => b.to_vec(),
            None => Err(Error::InvalidArgument {
                routine: "DistributedGrid::to_vec",
                what: format!("part {p} is held by another process; expected one held here"),
            }),
        }
    }

    /// Brings every part held here its neighbours' points held here: what
    /// [`DistributedGrid::send_halos`] sends, for every part in turn.
    pub fn exchange_halos(&self) -> Result<()> {
        self.held().try_for_each(|p| self.send_halos(p))
    }

    /// Part `p`'s half of [`DistributedGrid::exchange_halos`]: each region of its owned
    /// box that a neighbour's halo holds is packed on `p`'s device (all of them first),
    /// copied to the neighbour's device if that is another, and unpacked into the
    /// neighbour's halo. Where the devices order work (docs/SEMANTICS.md R11: queued
    /// launches, peer access between the two) all of it is queued and no thread waits:
    /// each copy runs on its receiver after the packing, the unpacking after the copy, and
    /// the sender's later work after the copy; so a part's faces travel at once, each on
    /// its receiver's queue. Otherwise (`OFFLOAD_SYNC=1`, no peer access) the copies are
    /// made before the call returns.
    ///
    /// Parts can send concurrently, each from its own thread: every region has one sender
    /// and one place it lands (a part's sends from two threads at once take turns). As
    /// with [`super::DistributedArray::send_halos`], the program orders its threads' writes
    /// of the points sent (a barrier per step): the packing is queued behind the work this
    /// thread queued on `p`'s device, not other threads'.
    ///
    /// Errors name the part, its device, the neighbour and the region
    /// ([`Error::Exchange`]).
    pub fn send_halos(&self, p: usize) -> Result<()> {
        let Some(device) = self.placement[p] else { return Ok(()) };
        let mapped = self.part.mapped(p);
        let sends = self.sends[p].lock();
        // Named only when something fails: a step's sends format nothing.
        let failed = |s: &Send<'a, T>, source: Error| self.failed(p, device, s, source);
        // Every region packed first (queued one after another on `p`'s device), so that the
        // copies below wait for the packing once, not once a region.
        let dev = self.rt.device(device)?;
        for s in sends.iter() {
            halo::pack(&dev, &s.exchange.send, &mapped, self.view(p), s.packed.view())
                .map_err(|e| failed(s, e))?;
        }
        for s in sends.iter() {
            let to_device = self.placement[s.to].unwrap_or(device);
            // One device's regions are unpacked from the packed buffer itself.
            let arrived = match &s.landed {
                Some(landed) if to_device != device => {
                    self.copy_packed(s, landed, device, to_device).map_err(|e| failed(s, e))?;
                    landed
                }
                _ => &s.packed,
            };
            let to = self.rt.device(to_device).map_err(|e| failed(s, e))?;
            halo::unpack(&to, &s.exchange.recv, &self.part.mapped(s.to), arrived.view(), self.view(s.to))
                .map_err(|e| failed(s, e))?;
        }
        Ok(())
    }

    /// [`DistributedGrid::exchange_halos`] with NCCL moving every region, between parts of
    /// one device too (a rank sends to itself): each part's regions packed on its device,
    /// all sent and received in one NCCL group on the devices' compute queues, then
    /// unpacked. `comm` holds a rank on every device of a part held here
    /// ([`NcclComm::of_devices`] over them). Nothing waits on the host: the group runs after
    /// the work queued on each device before the call, the unpacking after it.
    ///
    /// Errors: a communicator of another runtime or without a rank on a part's device
    /// ([`Error::InvalidArgument`]); a failing pack, group or unpack ([`Error::Exchange`],
    /// naming the part and region, or the whole group).
    #[track_caller]
    pub fn exchange_halos_over(&self, comm: &NcclComm<'_>) -> Result<()> {
        let rank = |d: usize| {
            comm.rank_of(d).filter(|_| comm.runtime().same_as(self.rt)).ok_or_else(|| Error::InvalidArgument {
                routine: "DistributedGrid::exchange_halos_over",
                what: format!(
                    "device {d} holds a part but has no rank in the communicator ({:?}); expected one of this \
                     runtime with a rank on every device of a part",
                    comm.held()
                ),
            })
        };
        // Every part's sends locked, in order (as one thread's `send_halos` takes one).
        let held: Vec<usize> = self.held().collect();
        let mut locked: Vec<_> = held.iter().map(|&p| self.sends[p].lock()).collect();
        // A region of one device lands through NCCL too: its landing buffer, made once.
        for (&p, sends) in held.iter().zip(locked.iter_mut()) {
            let device = self.placement[p].unwrap_or_default();
            for s in sends.iter_mut().filter(|s| s.landed.is_none()) {
                let made = self.rt.device(device).and_then(|d| DeviceBuffer::new(&d, s.exchange.recv.len()));
                s.landed = Some(made.map_err(|e| self.failed(p, device, s, e))?);
            }
        }
        let mut ops = Vec::new();
        for (&p, sends) in held.iter().zip(&locked) {
            let device = self.placement[p].unwrap_or_default();
            let dev = self.rt.device(device)?;
            let mapped = self.part.mapped(p);
            for s in sends.iter() {
                let Some(landed) = &s.landed else { continue };
                let to_device = self.placement[s.to].unwrap_or(device);
                let failed = |e| self.failed(p, device, s, e);
                halo::pack(&dev, &s.exchange.send, &mapped, self.view(p), s.packed.view()).map_err(failed)?;
                let bytes = s.exchange.recv.len() * std::mem::size_of::<T>();
                let (from, to) = (rank(device)?, rank(to_device)?);
                ops.push(Transfer { device, send: true, addr: s.packed.addr(), bytes, peer: to });
                ops.push(Transfer { device: to_device, send: false, addr: landed.addr(), bytes, peer: from });
            }
        }
        // SAFETY: every buffer is a live allocation of the grid's (freed only after its
        // device's queued work), of `bytes`; each landing buffer is written by this group
        // alone and read by the unpacking queued after it, under every part's lock.
        if let Err(e) = unsafe { comm.group(&ops) } {
            let (p, device) = held.first().map_or((0, 0), |&p| (p, self.placement[p].unwrap_or_default()));
            let region = format!("the group of {} regions sent and received over NCCL", ops.len() / 2);
            return Err(Error::Exchange { rank: None, part: p, device, region, source: Box::new(e) });
        }
        for (&p, sends) in held.iter().zip(&locked) {
            let device = self.placement[p].unwrap_or_default();
            for s in sends.iter() {
                let Some(landed) = &s.landed else { continue };
                let to = self.rt.device(self.placement[s.to].unwrap_or(device))?;
                halo::unpack(&to, &s.exchange.recv, &self.part.mapped(s.to), landed.view(), self.view(s.to))
                    .map_err(|e| self.failed(p, device, s, e))?;
            }
        }
        Ok(())
    }

    /// `source`, a failure of part `p`'s region `s` (`p` on `device`), named.
    fn failed(&self, p: usize, device: usize, s: &Send<'a, T>, source: Error) -> Error {
        Error::Exchange {
            rank: None,
            part: p,
            device,
            region: sending(&s.exchange, s.to, &format!("device {}", self.placement[s.to].unwrap_or(device))),
            source: Box::new(source),
        }
    }

    /// Copies region `s`'s packed points from `device` to its landing buffer on
    /// `to_device`: queued on the receiver behind the packing where the devices order work
    /// (no thread waits, so every region of every part is in flight at once, each
    /// receiver's on its own queue), else as `omp_target_memcpy` copies.
    #[track_caller]
    fn copy_packed(
        &self,
        s: &Send<'a, T>,
        landed: &DeviceBuffer<'a, T>,
        device: usize,
        to_device: usize,
    ) -> Result<()> {
        let bytes = s.exchange.recv.len() * std::mem::size_of::<T>();
        let at = std::panic::Location::caller();
        if self.rt.queue_copy_blocks(to_device, landed.addr(), device, s.packed.addr(), bytes, at)? {
            return Ok(());
        }
        // SAFETY: both buffers are live allocations of their devices of `recv.len()`
        // elements, owned by `self`; only this part's sends write `landed`, under the
        // part's lock (held for the whole send).
        unsafe { self.rt.target_memcpy(landed.addr(), s.packed.addr(), bytes, 0, 0, to_device, device) }
    }

    /// Copies every owned box of the parts held here back to the host grid (halos and
    /// the grid's boundary never), then frees the parts. Every part is copied even if one
    /// fails; the first failure is returned.
    pub fn gather(self) -> Result<()> {
        let mut first_err = None;
        // Written through: a pointer from the exclusive borrow.
        let host = self.host.as_mut_ptr() as u64;
        for p in self.held() {
            if let Err(e) = self.copy_box(p, &self.part.owned(p), host, true) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Copies `region` (inside part `p`'s mapped box) between the host grid at `host` and
    /// the part: to the host with `back` (`host` then derived from `&mut self.host`), else
    /// to the device.
    fn copy_box(&self, p: usize, region: &GridBox, host: u64, back: bool) -> Result<()> {
        let (mapped, whole) = (self.part.mapped(p), self.part.whole());
        let starts = |b: &GridBox| -> Vec<usize> {
            region.ranges().iter().zip(b.ranges()).map(|(r, w)| r.start - w.start).collect()
        };
        let (host_at, local_at) = (starts(&whole), starts(&mapped));
        let (host_dims, local_dims) = (whole.extents(), mapped.extents());
        let host = RectSide {
            ptr: host,
            device: self.rt.initial_device(),
            offsets: &host_at,
            dimensions: &host_dims,
        };
        let (Some(buffer), Some(device)) = (self.buffer(p), self.placement[p]) else { return Ok(()) };
        let local = RectSide { ptr: buffer.addr(), device, offsets: &local_at, dimensions: &local_dims };
        let (dst, src) = if back { (host, local) } else { (local, host) };
        let volume = region.extents();
        // SAFETY: the host grid is held exclusively for 'a and is `whole` (checked by
        // `map`); the part's buffer is a live allocation of `mapped.len()` elements; the
        // region lies inside both (`owned` and `mapped` boxes of the partition), and
        // target_memcpy_rect checks every offset again.
        unsafe { self.rt.target_memcpy_rect(std::mem::size_of::<T>(), &volume, dst, src) }
    }
}

/// Names a region sent, for an error: "sending the face [6..7, 1..5] to part 2 (device 1)
/// as [0..1, 1..5]".
pub(crate) fn sending(e: &Exchange, to: usize, place: &str) -> String {
    format!("sending the {} {:?} to part {to} ({place}) as {:?}", e.kind(), e.send.ranges(), e.recv.ranges())
}
