//! Halo rows between ranks: a rank's slab of a grid ends in rows that the neighbouring
//! ranks own. Each exchange copies the rank's own edge rows from the edge device into a
//! pinned host buffer, sends them with non-blocking MPI while receiving the neighbour's
//! into another, and copies those into the device's halo rows. Where the MPI library says
//! at run time that it takes CUDA device pointers, device rows go to it directly.

use mpi::datatype::{AsDatatype, Buffer, BufferMut, Collection, Equivalence, Pointer, PointerMut};
use mpi::request::WaitGuard;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Count;
use parking_lot::{Mutex, MutexGuard};

use crate::api::HostBuffer;
use crate::cluster::world::Cluster;
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;
use crate::partition::{DistributedArray, RowPartition};
use crate::rt::Runtime;
use crate::BackendKind;

/// Rows going to the previous rank.
const UP: i32 = 1;
/// Rows going to the next rank.
const DOWN: i32 = 2;

/// One end of a rank's slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edge {
    /// The first rows: the previous rank's neighbours.
    Top,
    /// The last rows: the next rank's neighbours.
    Bottom,
}

/// Bytes MPI reads or writes: a pinned host buffer, or device memory for a CUDA-aware MPI.
pub(super) struct RawBytes {
    pub(super) ptr: *mut u8,
    pub(super) len: Count,
}

// The six impls below rest on this: `ptr..ptr + len` is memory of the exchange that made it
// (a slot's pinned buffer, held by the slot's lock, or a device row whose block the
// exchange holds allocated), and the requests on it complete before the exchange returns
// (they are waited for inside the `mpi::request::scope`).
// SAFETY: as said above.
unsafe impl Pointer for RawBytes {
    fn pointer(&self) -> *const std::ffi::c_void {
        self.ptr.cast_const().cast()
    }
}
// SAFETY: as above.
unsafe impl PointerMut for RawBytes {
    fn pointer_mut(&mut self) -> *mut std::ffi::c_void {
        self.ptr.cast()
    }
}
// SAFETY: as above; `len` bytes.
unsafe impl Collection for RawBytes {
    fn count(&self) -> Count {
        self.len
    }
}
// SAFETY: the bytes are sent as MPI_UINT8_T, any bits valid.
unsafe impl AsDatatype for RawBytes {
    type Out = <u8 as Equivalence>::Out;
    fn as_datatype(&self) -> Self::Out {
        u8::equivalent_datatype()
    }
}
// SAFETY: as above.
unsafe impl Buffer for RawBytes {}
// SAFETY: as above.
unsafe impl BufferMut for RawBytes {}

/// The halos' own communicator: a duplicate of the world's, so that no other message (the
/// program's, another `RankHalos`') can match theirs.
pub(super) struct HaloComm(pub(super) SimpleCommunicator);

// SAFETY: MPI runs with MPI_THREAD_MULTIPLE (`Cluster::init` refuses less), under which
// point-to-point calls on one communicator may come from any thread at once; only those
// are made on it (and its free, at drop, when no exchange can be running).
unsafe impl Sync for HaloComm {}
// SAFETY: as above; the handle is an MPI object valid on every thread.
unsafe impl Send for HaloComm {}

/// One end's pinned buffers: this rank's edge rows on their way out, the neighbour's on
/// their way in. Its lock is held for a whole exchange of the end.
struct Slot<T: DeviceCopy> {
    send: HostBuffer<T>,
    recv: HostBuffer<T>,
}

/// The halos of one rank's slab of a grid mapped as a [`DistributedArray`]: the array's
/// first part holds the rows next to the previous rank, its last part those next to the
/// next rank (with `periodic`, rank 0 and the last rank are neighbours).
///
/// Each end has a send and a receive buffer of `halo` rows, pinned, allocated on the
/// end device's compute lane (bound to its CPUs, so first touched on its NUMA node).
/// Exchanges of one `RankHalos` pair with the neighbours' in the order they are made, as
/// MPI messages do: every rank must exchange its arrays in the same order.
pub struct RankHalos<T: DeviceCopy> {
    comm: HaloComm,
    prev: Option<usize>,
    next: Option<usize>,
    bytes: usize,
    part: RowPartition,
    devices: Vec<usize>,
    rt: Runtime,
    /// `[top, bottom]`; `None` where there is no neighbour, or rows go to MPI directly.
    slots: [Mutex<Option<Slot<T>>>; 2],
    direct: bool,
}

impl<T: DeviceCopy> std::fmt::Debug for RankHalos<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankHalos")
            .field("prev", &self.prev)
            .field("next", &self.next)
            .field("bytes", &self.bytes)
            .field("devices", &self.devices)
            .field("direct", &self.direct)
            .finish()
    }
}

/// One end of one exchange: the rows sent, the rows received into, the neighbour, the
/// tags, and what holds the memory (the slot's lock, the device blocks).
struct Transfer<'s, 'a, T: DeviceCopy> {
    own: u64,
    halo: u64,
    peer: usize,
    out_tag: i32,
    in_tag: i32,
    /// The slot's send and receive buffers (null when direct), written only while
    /// `_slot` is held.
    staged: [*mut T; 2],
    _slot: Option<MutexGuard<'s, Option<Slot<T>>>>,
    _pins: [Option<crate::rt::DevicePin<'a>>; 2],
}

impl<T: DeviceCopy> Transfer<'_, '_, T> {
    /// The pinned buffer's address (`send` or receive).
    fn staged(&self, send: bool) -> u64 {
        self.staged[usize::from(!send)] as u64
    }
}

impl<T: DeviceCopy> RankHalos<T> {
    /// The halos of this rank's slab of a grid (halo rows included), split by `part` over
    /// `devices` of `rt`; only arrays mapped that way (same runtime, devices and
    /// partition) can be exchanged. Collective over the world: every rank makes its
    /// `RankHalos` in the same order (each has a communicator of its own).
    pub fn new(
        cluster: &Cluster,
        rt: &Runtime,
        devices: &[usize],
        part: &RowPartition,
        periodic: bool,
    ) -> Result<Self> {
        let (rank, size) = (cluster.rank(), cluster.size());
        let bad = |what: String| Error::InvalidArgument { routine: "RankHalos::new", what };
        if devices.len() != part.parts() {
            return Err(bad(format!("{} devices for {} parts", devices.len(), part.parts())));
        }
        let rows = part.halo().checked_mul(part.row_len());
        let bytes = rows.and_then(|r| r.checked_mul(std::mem::size_of::<T>()));
        let (Some(rows), Some(bytes)) = (rows, bytes) else {
            return Err(bad(format!("halos of {} rows of {} overflow", part.halo(), part.row_len())));
        };
        if Count::try_from(bytes).is_err() {
            return Err(bad(format!("halos of {bytes} bytes exceed an MPI count")));
        }
        let (prev, next) = if periodic {
            (Some((rank + size - 1) % size), Some((rank + 1) % size))
        } else {
            (rank.checked_sub(1), (rank + 1 < size).then_some(rank + 1))
        };
        let ends = [devices[0], devices[devices.len() - 1]];
        let direct = cluster.cuda_aware()
            && ends.iter().all(|&d| rt.describe(d).is_ok_and(|x| x.kind == BackendKind::Cuda));
        let mut slots = [Mutex::new(None), Mutex::new(None)];
        for (e, neighbour) in [prev, next].into_iter().enumerate() {
            if neighbour.is_some() && !direct {
                let send = local_buffer(rt, ends[e], rows)?;
                let recv = local_buffer(rt, ends[e], rows)?;
                slots[e] = Mutex::new(Some(Slot { send, recv }));
            }
        }
        let comm = HaloComm(cluster.world().duplicate());
        Ok(Self {
            comm,
            prev,
            next,
            bytes,
            part: *part,
            devices: devices.to_vec(),
            rt: rt.clone(),
            slots,
            direct,
        })
    }

    /// Whether device rows go to MPI directly (a CUDA-aware MPI said so at run time).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// The ends part `p` exchanges: `Top` for the first part when there is a previous
    /// rank, `Bottom` for the last when there is a next one.
    pub fn edges_of(&self, p: usize) -> Vec<Edge> {
        let mut e = Vec::new();
        if p == 0 && self.prev.is_some() {
            e.push(Edge::Top);
        }
        if p + 1 == self.part.parts() && self.next.is_some() {
            e.push(Edge::Bottom);
        }
        e
    }

    /// Exchanges the ends part `p` of `array` holds ([`RankHalos::edges_of`]): its own
    /// edge rows out to the neighbouring ranks, theirs into its halo rows; returns once
    /// the halos are on the device. Pairs with the neighbours' exchanges of their ends, so
    /// with two edge parts (several devices) both must exchange at once, each from its
    /// own thread, or the neighbours wait for each other: [`RankHalos::exchange_all`]
    /// does both from one thread.
    pub fn exchange(&self, array: &DistributedArray<'_, T>, p: usize) -> Result<()> {
        if p >= self.part.parts() {
            return Err(Error::InvalidArgument {
                routine: "RankHalos::exchange",
                what: format!("part {p} of an array of {} parts", self.part.parts()),
            });
        }
        self.exchange_parts(array, &[p])
    }

    /// Exchanges every end of `array` from this thread, both posted before either is
    /// waited for.
    pub fn exchange_all(&self, array: &DistributedArray<'_, T>) -> Result<()> {
        self.exchange_parts(array, &[0, self.part.parts() - 1])
    }

    fn exchange_parts(&self, array: &DistributedArray<'_, T>, parts: &[usize]) -> Result<()> {
        if *array.partition() != self.part
            || array.devices() != self.devices
            || !array.runtime().same_as(&self.rt)
        {
            return Err(Error::InvalidArgument {
                routine: "RankHalos::exchange",
                what: format!(
                    "an array split as {:?} on devices {:?}, not as the halos' {:?} on {:?} of their runtime",
                    array.partition(),
                    array.devices(),
                    self.part,
                    self.devices
                ),
            });
        }
        let mut parts = parts.to_vec();
        parts.dedup();
        let mut ends =
            parts.iter().flat_map(|&p| self.edges_of(p).into_iter().map(move |e| (p, e))).collect::<Vec<_>>();
        // Locks in slot order, so that two threads never hold one each the other wants.
        ends.sort_by_key(|&(_, e)| e == Edge::Bottom);
        let h = self.part.halo();
        let mut plan = Vec::with_capacity(ends.len());
        for (p, edge) in ends {
            let own = self.part.owned(p);
            let (neighbour, slot, out_tag, in_tag, own_row, halo_row) = match edge {
                Edge::Top => (self.prev, 0, UP, DOWN, own.start, own.start - h),
                Edge::Bottom => (self.next, 1, DOWN, UP, own.end - h, own.end),
            };
            let Some(peer) = neighbour else { continue };
            let mut slot = (!self.direct).then(|| self.slots[slot].lock());
            let staged = match slot.as_deref_mut() {
                Some(Some(s)) => [s.send.as_mut_ptr(), s.recv.as_mut_ptr()],
                _ => [std::ptr::null_mut(); 2],
            };
            // The rows' device blocks stay allocated until the transfer is done (a
            // `nowait` exit elsewhere could end the mapping meanwhile).
            let (own, own_pin) = array.pinned_row(p, own_row)?;
            let (halo, halo_pin) = array.pinned_row(p, halo_row)?;
            plan.push((
                p,
                Transfer {
                    own,
                    halo,
                    peer,
                    out_tag,
                    in_tag,
                    staged,
                    _slot: slot,
                    _pins: [own_pin, halo_pin],
                },
            ));
        }
        let host = self.rt.initial_device();
        if !self.direct {
            for (p, t) in &plan {
                // SAFETY: `bytes` of the part's own edge rows (pinned above) into the slot's
                // send buffer, whose lock this exchange holds.
                unsafe {
                    self.rt.target_memcpy(t.staged(true), t.own, self.bytes, 0, 0, host, self.devices[*p])?
                };
            }
        }
        let len = self.bytes as Count;
        let mut bufs: Vec<(RawBytes, RawBytes)> = plan
            .iter()
            .map(|(_, t)| {
                let (out, inn) =
                    if self.direct { (t.own, t.halo) } else { (t.staged(true), t.staged(false)) };
                (RawBytes { ptr: inn as *mut u8, len }, RawBytes { ptr: out as *mut u8, len })
            })
            .collect();
        // Every receive and send posted before any is waited for (the guards wait when the
        // scope ends), so neighbours exchanging both ways never wait on each other.
        mpi::request::scope(|scope| {
            let mut waits = Vec::with_capacity(2 * plan.len());
            for ((into, out), (_, t)) in bufs.iter_mut().zip(&plan) {
                let neighbour = self.comm.0.process_at_rank(t.peer as i32);
                waits.push(WaitGuard::from(neighbour.immediate_receive_into_with_tag(scope, into, t.in_tag)));
                waits.push(WaitGuard::from(neighbour.immediate_send_with_tag(scope, &*out, t.out_tag)));
            }
        });
        if !self.direct {
            for (p, t) in &plan {
                // SAFETY: the received rows (the slot's, locked) into the part's halo rows,
                // pinned above.
                unsafe {
                    self.rt.target_memcpy(
                        t.halo,
                        t.staged(false),
                        self.bytes,
                        0,
                        0,
                        self.devices[*p],
                        host,
                    )?
                };
            }
        }
        Ok(())
    }
}

/// A pinned buffer of `len` elements allocated (and so first touched) on `device`'s
/// compute lane, whose thread is bound to the device's CPUs.
pub(super) fn local_buffer<T: DeviceCopy>(rt: &Runtime, device: usize, len: usize) -> Result<HostBuffer<T>> {
    let mut made = None;
    rt.nowait(|s| -> Result<()> {
        let slot = &mut made;
        s.compute(device, &[], move |_| {
            *slot = Some(HostBuffer::new(rt, len)?);
            Ok(())
        })?
        .wait()
    })??;
    made.ok_or_else(|| Error::InvalidArgument {
        routine: "RankHalos::new",
        what: "no halo buffer made".into(),
    })
}
