//! Halo rows between ranks: a rank's slab of a grid ends in rows that the neighbouring
//! ranks own. Each exchange copies the rank's own edge rows from the edge device into a
//! pinned host buffer, sends them with non-blocking MPI while receiving the neighbour's
//! into another, and copies those into the device's halo rows. Where the MPI library says
//! at run time that it takes CUDA device pointers, device rows go to it directly.

use mpi::datatype::{AsDatatype, Buffer, BufferMut, Collection, Equivalence, Pointer, PointerMut};
use mpi::request::WaitGuard;
use mpi::traits::*;
use mpi::Count;

use crate::cluster::world::Cluster;
use crate::device::BackendKind;
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;
use crate::mapping::HostBuffer;
use crate::partition::{DistributedArray, RowPartition};
use crate::runtime::Runtime;

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
struct RawBytes {
    ptr: *mut u8,
    len: Count,
}

// The six impls below rest on this: `ptr..ptr + len` is memory of the exchange that made it
// (a pinned buffer or a mapped device row), alive and touched by nothing else until the
// requests on it completed (they are waited for inside the `mpi::request::scope`).
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

/// The halos of one rank's slab of a grid mapped as a [`DistributedArray`]: the array's
/// first part holds the rows next to the previous rank, its last part those next to the
/// next rank (with `periodic`, rank 0 and the last rank are neighbours).
///
/// Each edge has a send and a receive buffer of `halo` rows, pinned, allocated on the
/// edge device's compute lane (bound to its CPUs, so first touched on its NUMA node).
pub struct RankHalos<T: DeviceCopy> {
    prev: Option<usize>,
    next: Option<usize>,
    bytes: usize,
    part: RowPartition,
    /// `[top, bottom]`: this rank's edge rows on their way out, the neighbours' on their
    /// way in.
    send: [Option<HostBuffer<T>>; 2],
    recv: [Option<HostBuffer<T>>; 2],
    direct: bool,
}

impl<T: DeviceCopy> std::fmt::Debug for RankHalos<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankHalos")
            .field("prev", &self.prev)
            .field("next", &self.next)
            .field("bytes", &self.bytes)
            .field("direct", &self.direct)
            .finish()
    }
}

impl<T: DeviceCopy> RankHalos<T> {
    /// The halos of this rank's slab of a grid (halo rows included), split by `part` over
    /// `devices` of `rt`; any array mapped that way can then be exchanged.
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
        let rows = part.halo() * part.row_len();
        let bytes = rows * std::mem::size_of::<T>();
        if Count::try_from(bytes).is_err() {
            return Err(bad(format!("halos of {bytes} bytes exceed an MPI count")));
        }
        let (prev, next) = match (periodic, size) {
            (_, 1) if !periodic => (None, None),
            (true, _) => (Some((rank + size - 1) % size), Some((rank + 1) % size)),
            (false, _) => (rank.checked_sub(1), (rank + 1 < size).then_some(rank + 1)),
        };
        let devs = [devices[0], devices[devices.len() - 1]];
        let direct = cluster.cuda_aware()
            && devs.iter().all(|&d| rt.describe(d).is_ok_and(|x| x.kind == BackendKind::Cuda));
        let wanted = [prev.is_some() && !direct, next.is_some() && !direct];
        let mut send = [None, None];
        let mut recv = [None, None];
        for e in 0..2 {
            if wanted[e] {
                send[e] = Some(local_buffer(rt, devs[e], rows)?);
                recv[e] = Some(local_buffer(rt, devs[e], rows)?);
            }
        }
        Ok(Self { prev, next, bytes, part: *part, send, recv, direct })
    }

    /// Whether device rows go to MPI directly (a CUDA-aware MPI said so at run time).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// The edges part `p` of `parts` exchanges.
    pub fn edges_of(&self, p: usize, parts: usize) -> Vec<Edge> {
        let mut e = Vec::new();
        if p == 0 && self.prev.is_some() {
            e.push(Edge::Top);
        }
        if p + 1 == parts && self.next.is_some() {
            e.push(Edge::Bottom);
        }
        e
    }

    /// Exchanges the edges part `p` of `array` holds ([`RankHalos::edges_of`]): its own
    /// edge rows out to the neighbouring ranks, theirs into its halo rows. Collective
    /// with the neighbours' matching exchanges; the parts of one rank may exchange at once,
    /// from their own threads. Returns once the halos are on the device.
    pub fn exchange(&self, cluster: &Cluster, array: &DistributedArray<'_, T>, p: usize) -> Result<()> {
        let part = array.partition();
        if *part != self.part {
            return Err(Error::InvalidArgument {
                routine: "RankHalos::exchange",
                what: format!("an array split as {part:?}, not as the halos' {:?}", self.part),
            });
        }
        let edges = self.edges_of(p, part.parts());
        if edges.is_empty() {
            return Ok(());
        }
        let (rt, dev, h) = (array.runtime(), array.device(p), part.halo());
        let own = part.owned(p);
        // (the rows this rank sends, the halo rows it receives into, the peer, tags, slot)
        let plan: Vec<(u64, u64, usize, i32, i32, usize)> = edges
            .iter()
            .map(|e| -> Result<_> {
                Ok(match e {
                    Edge::Top => {
                        let peer = self.prev.unwrap_or(0);
                        (array.row_addr(p, own.start)?, array.row_addr(p, own.start - h)?, peer, UP, DOWN, 0)
                    }
                    Edge::Bottom => {
                        let peer = self.next.unwrap_or(0);
                        (array.row_addr(p, own.end - h)?, array.row_addr(p, own.end)?, peer, DOWN, UP, 1)
                    }
                })
            })
            .collect::<Result<_>>()?;
        let host = rt.initial_device();
        let len = self.bytes as Count;
        let staged = |slot: usize, send: bool| -> *mut u8 {
            let b = if send { &self.send[slot] } else { &self.recv[slot] };
            b.as_ref().map_or(std::ptr::null_mut(), |b| b.as_ptr().cast_mut().cast())
        };
        if !self.direct {
            for &(mine, _, _, _, _, slot) in &plan {
                // SAFETY: `bytes` of the part's own edge rows (mapped for the array's life)
                // into the slot's pinned send buffer, which only this part's exchange uses.
                unsafe { rt.target_memcpy(staged(slot, true) as u64, mine, self.bytes, 0, 0, host, dev)? };
            }
        }
        // (into, from) of each edge, alive until every request on them has completed.
        let mut bufs: Vec<(RawBytes, RawBytes)> = plan
            .iter()
            .map(|&(mine, halo, _, _, _, slot)| {
                let (out, inn) = if self.direct {
                    (mine as *mut u8, halo as *mut u8)
                } else {
                    (staged(slot, true), staged(slot, false))
                };
                (RawBytes { ptr: inn, len }, RawBytes { ptr: out, len })
            })
            .collect();
        // Every receive and send posted before any is waited for (the guards wait when the
        // scope ends), so neighbours exchanging both ways never wait on each other.
        mpi::request::scope(|scope| {
            let mut waits = Vec::with_capacity(2 * plan.len());
            for ((into, out), &(_, _, peer, out_tag, in_tag, _)) in bufs.iter_mut().zip(&plan) {
                let neighbour = cluster.world().process_at_rank(peer as i32);
                waits.push(WaitGuard::from(neighbour.immediate_receive_into_with_tag(scope, into, in_tag)));
                waits.push(WaitGuard::from(neighbour.immediate_send_with_tag(scope, &*out, out_tag)));
            }
        });
        if !self.direct {
            for &(_, halo, _, _, _, slot) in &plan {
                // SAFETY: the received rows into the part's halo rows, mapped for the
                // array's life and read by no kernel until this returns.
                unsafe { rt.target_memcpy(halo, staged(slot, false) as u64, self.bytes, 0, 0, dev, host)? };
            }
        }
        Ok(())
    }
}

/// A pinned buffer of `len` elements allocated (and so first touched) on `device`'s
/// compute lane, whose thread is bound to the device's CPUs.
fn local_buffer<T: DeviceCopy>(rt: &Runtime, device: usize, len: usize) -> Result<HostBuffer<T>> {
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
