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
use crate::data_env::MapType;
use crate::error::{Error, Result};
use crate::rt::memcpy::RectSide;
use crate::rt::Runtime;

use super::halo::{self, HaloElement};
use super::{Exchange, GridBox, GridPartition, Reach};

/// A host grid held part by part in device buffers, one part per device of a
/// [`GridPartition`]. Holds the grid exclusively until [`DistributedGrid::gather`] (or
/// drop, which frees the parts without copying back).
#[derive(Debug)]
pub struct DistributedGrid<'a, T: HaloElement> {
    rt: &'a Runtime,
    devices: Vec<usize>,
    part: GridPartition,
    reach: Reach,
    host: &'a mut [T],
    /// Part `p`'s mapped box, row-major, on `devices[p]`.
    local: Vec<DeviceBuffer<'a, T>>,
    /// Per sending part, what it sends.
    sends: Vec<Vec<Send<'a, T>>>,
}

/// One region a part sends: the exchange as its receiver lists it, packed into `packed` on
/// the sender's device, copied into `landed` on the receiver's where that is another.
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
        let bad = |what: String| Error::InvalidArgument { routine: "DistributedGrid::map", what };
        if devices.len() != part.parts() {
            return Err(bad(format!("{} devices for {} parts", devices.len(), part.parts())));
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
        if let Some(&d) = devices.iter().find(|&&d| d == rt.initial_device()) {
            return Err(bad(format!("device {d} is the initial device; expected offload devices")));
        }
        let mut local = Vec::with_capacity(devices.len());
        for (p, &d) in devices.iter().enumerate() {
            local.push(DeviceBuffer::new(&rt.device(d)?, part.mapped(p).len())?);
        }
        let mut sends: Vec<Vec<Send<'a, T>>> = (0..devices.len()).map(|_| Vec::new()).collect();
        for to in 0..devices.len() {
            for exchange in part.exchanges(to, reach) {
                let from = exchange.neighbour;
                let n = exchange.recv.len();
                let packed = DeviceBuffer::new(&rt.device(devices[from])?, n)?;
                let landed = if devices[from] == devices[to] {
                    None
                } else {
                    Some(DeviceBuffer::new(&rt.device(devices[to])?, n)?)
                };
                sends[from].push(Send { to, exchange, packed, landed });
            }
        }
        let g = Self { rt, devices: devices.to_vec(), part, reach, host, local, sends };
        if copy_in {
            for p in 0..g.devices.len() {
                g.copy_box(p, &g.part.mapped(p), false)?;
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

    /// The devices, part by part.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// The device of part `p`.
    ///
    /// # Panics
    ///
    /// If `p` is not a part (`p >= parts`), as for every method here that takes a part.
    pub fn device(&self, p: usize) -> usize {
        self.devices[p]
    }

    /// A kernel view of part `p`'s points: its mapped box ([`GridPartition::mapped`]),
    /// row-major, halos included (a kernel may write it, as a [`DeviceBuffer`]'s).
    pub fn view(&self, p: usize) -> DeviceSlice<'_, T> {
        self.local[p].view()
    }

    /// Part `p`'s points as they are on its device now (its mapped box, row-major).
    pub fn to_vec(&self, p: usize) -> Result<Vec<T>> {
        self.local[p].to_vec()
    }

    /// Brings every part its neighbours' points: what [`DistributedGrid::send_halos`]
    /// sends, for every part in turn.
    pub fn exchange_halos(&self) -> Result<()> {
        (0..self.devices.len()).try_for_each(|p| self.send_halos(p))
    }

    /// Part `p`'s half of [`DistributedGrid::exchange_halos`]: each region of its owned
    /// box that a neighbour's halo holds is packed on `p`'s device, copied to the
    /// neighbour's device if that is another, and unpacked into the neighbour's halo.
    /// Parts can send concurrently, each from its own thread: every region has one sender
    /// and one place it lands. As with [`super::DistributedArray::send_halos`], the
    /// program orders its threads' writes of the points sent (a barrier per step): the
    /// packing is queued behind the work this thread queued on `p`'s device, not other
    /// threads'.
    ///
    /// Errors name the part, its device, the neighbour and the region
    /// ([`Error::Exchange`]).
    pub fn send_halos(&self, p: usize) -> Result<()> {
        let dev = self.rt.device(self.devices[p])?;
        let mapped = self.part.mapped(p);
        for s in &self.sends[p] {
            let e = &s.exchange;
            let failed = |source: Error| Error::Exchange {
                rank: None,
                part: p,
                device: self.devices[p],
                region: format!(
                    "the {} {} to part {} (device {}) as {}",
                    e.kind(),
                    boxed(&e.send),
                    s.to,
                    self.devices[s.to],
                    boxed(&e.recv)
                ),
                source: Box::new(source),
            };
            halo::pack(&dev, &e.send, &mapped, self.local[p].view(), s.packed.view()).map_err(failed)?;
            let arrived = match &s.landed {
                Some(landed) => {
                    // SAFETY: both buffers are live allocations of their devices of
                    // `recv.len()` elements, owned by `self`; only this part's sends write
                    // `landed`, and one thread sends a part's regions.
                    unsafe {
                        self.rt.target_memcpy(
                            landed.addr(),
                            s.packed.addr(),
                            e.recv.len() * std::mem::size_of::<T>(),
                            0,
                            0,
                            self.devices[s.to],
                            self.devices[p],
                        )
                    }
                    .map_err(failed)?;
                    landed
                }
                None => &s.packed,
            };
            let to = self.rt.device(self.devices[s.to])?;
            halo::unpack(&to, &e.recv, &self.part.mapped(s.to), arrived.view(), self.local[s.to].view())
                .map_err(failed)?;
        }
        Ok(())
    }

    /// Copies every owned box back to the host grid from its part (halos and the grid's
    /// boundary never), then frees the parts. Every part is copied even if one fails; the
    /// first failure is returned.
    pub fn gather(self) -> Result<()> {
        let mut first_err = None;
        for p in 0..self.devices.len() {
            if let Err(e) = self.copy_box(p, &self.part.owned(p), true) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Copies `region` (inside part `p`'s mapped box) between the host grid and the part:
    /// to the host with `back`, else to the device.
    fn copy_box(&self, p: usize, region: &GridBox, back: bool) -> Result<()> {
        let (mapped, whole) = (self.part.mapped(p), self.part.whole());
        let starts = |b: &GridBox| -> Vec<usize> {
            region.ranges().iter().zip(b.ranges()).map(|(r, w)| r.start - w.start).collect()
        };
        let (host_at, local_at) = (starts(&whole), starts(&mapped));
        let (host_dims, local_dims) = (whole.extents(), mapped.extents());
        let host = RectSide {
            ptr: self.host.as_ptr() as u64,
            device: self.rt.initial_device(),
            offsets: &host_at,
            dimensions: &host_dims,
        };
        let local = RectSide {
            ptr: self.local[p].addr(),
            device: self.devices[p],
            offsets: &local_at,
            dimensions: &local_dims,
        };
        let (dst, src) = if back { (host, local) } else { (local, host) };
        let volume = region.extents();
        // SAFETY: the host grid is held exclusively for 'a and is `whole` (checked by
        // `map`); the part's buffer is a live allocation of `mapped.len()` elements; the
        // region lies inside both (`owned` and `mapped` boxes of the partition), and
        // target_memcpy_rect checks every offset again.
        unsafe { self.rt.target_memcpy_rect(std::mem::size_of::<T>(), &volume, dst, src) }
    }
}

/// A box as `rows 0..1 x columns 1..5` would be written: `[0..1, 1..5]`.
fn boxed(b: &GridBox) -> String {
    format!("{:?}", b.ranges())
}
