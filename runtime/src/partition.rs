//! Arrays split across devices by slices.
//!
//! A [`BlockPartition`] splits `n` items into contiguous blocks, the first `n % parts`
//! blocks one item longer. A [`RowPartition`] splits the interior rows (or planes) of a
//! row-major grid, `[halo, rows - halo)`, the same way, and gives each part its owned rows
//! plus `halo` rows on each side. A [`DistributedArray`] maps each part's rows (halos
//! included) on its own device, keyed by that slice's host address, exchanges halos between
//! neighbours with `target_memcpy` (peer copies where the devices have peer access), and
//! gathers each owned row back to the host exactly once, from its owner. A
//! [`GridPartition`] splits a grid along two or three axes (a `2 x 2` grid of parts), with
//! the faces, edges and corners each part exchanges with its neighbours.
//!
//! ```
//! use offload::partition::{DistributedArray, RowPartition};
//! use offload::{MapType, Runtime};
//!
//! let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
//! // 6 rows of 4: rows 0 and 5 are boundary rows, rows 1..5 are split over 2 devices.
//! let part = RowPartition::new(6, 4, 2, 1)?;
//! assert_eq!(part.owned(0), 1..3);
//! assert_eq!(part.mapped(1), 2..6);
//! let mut grid: Vec<f32> = (0..24).map(|i| i as f32).collect();
//! let d = DistributedArray::map(&rt, &[0, 1], &mut grid, part, MapType::TO)?;
//! d.exchange_halos(false)?;
//! d.gather()?;
//! assert_eq!(grid[4], 4.0);
//! # Ok::<(), offload::Error>(())
//! ```

use std::ops::Range;

pub(crate) mod distributed_grid;
mod grid;
pub mod halo;

pub use distributed_grid::DistributedGrid;
pub use grid::{Exchange, GridBox, GridPartition, Reach, MAX_AXES};

use crate::api::DeviceSlice;
use crate::data_env::{MapItem, MapType, UpdateDirection};
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;
use crate::range::HostRange;
use crate::rt::DevicePin;
use crate::rt::Runtime;

/// `n` items in `parts` contiguous blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockPartition {
    n: usize,
    parts: usize,
}

impl BlockPartition {
    /// Splits `n` items over `parts > 0` parts.
    pub fn new(n: usize, parts: usize) -> Result<Self> {
        if parts == 0 {
            return Err(Error::InvalidArgument { routine: "BlockPartition::new", what: "zero parts".into() });
        }
        Ok(Self { n, parts })
    }

    /// Number of parts.
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// The items of part `p` (empty for parts beyond `n`).
    ///
    /// # Panics
    ///
    /// If `p` is not a part (`p >= parts`), as an index past a slice's end does.
    pub fn range(&self, p: usize) -> Range<usize> {
        assert!(p < self.parts, "part {p} of a partition into {} parts", self.parts);
        let (base, extra) = (self.n / self.parts, self.n % self.parts);
        let start = p * base + p.min(extra);
        start..start + base + usize::from(p < extra)
    }

    /// The part that owns item `i`.
    ///
    /// # Panics
    ///
    /// If `i` is not an item (`i >= n`).
    pub fn owner(&self, i: usize) -> usize {
        assert!(i < self.n, "item {i} of a partition of {} items", self.n);
        let (base, extra) = (self.n / self.parts, self.n % self.parts);
        let long = extra * (base + 1);
        if i < long {
            i / (base + 1)
        } else {
            extra + (i - long) / base.max(1)
        }
    }
}

/// The rows (or planes) of a row-major grid split over parts, with halos.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowPartition {
    rows: usize,
    row_len: usize,
    halo: usize,
    interior: BlockPartition,
}

impl RowPartition {
    /// `rows` rows of `row_len` elements; the interior rows `[halo, rows - halo)` are split
    /// over `parts` parts, each of which also sees `halo` rows on each side.
    pub fn new(rows: usize, row_len: usize, parts: usize, halo: usize) -> Result<Self> {
        let interior =
            halo.checked_mul(2).and_then(|h| rows.checked_sub(h)).filter(|&n| n >= parts).ok_or_else(
                || Error::InvalidArgument {
                    routine: "RowPartition::new",
                    what: format!(
                        "{rows} rows with halo {halo} leave fewer interior rows than the {parts} parts"
                    ),
                },
            )?;
        Ok(Self { rows, row_len, halo, interior: BlockPartition::new(interior, parts)? })
    }

    /// Number of parts.
    pub fn parts(&self) -> usize {
        self.interior.parts()
    }

    /// Elements per row.
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Rows in all.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The halo width.
    pub fn halo(&self) -> usize {
        self.halo
    }

    /// The rows part `p` owns (computes and gathers).
    ///
    /// # Panics
    ///
    /// If `p` is not a part (`p >= parts`).
    pub fn owned(&self, p: usize) -> Range<usize> {
        let r = self.interior.range(p);
        r.start + self.halo..r.end + self.halo
    }

    /// The rows part `p` maps: its owned rows and a halo on each side.
    ///
    /// # Panics
    ///
    /// If `p` is not a part (`p >= parts`).
    pub fn mapped(&self, p: usize) -> Range<usize> {
        let o = self.owned(p);
        o.start - self.halo..o.end + self.halo
    }
}

/// A host grid mapped slice by slice, one slice per device. Holds the grid exclusively
/// until [`DistributedArray::gather`] (or drop, which unmaps without copying back).
#[derive(Debug)]
pub struct DistributedArray<'a, T: DeviceCopy> {
    rt: &'a Runtime,
    devices: Vec<usize>,
    part: RowPartition,
    host: &'a mut [T],
    mapped: bool,
}

impl<'a, T: DeviceCopy> DistributedArray<'a, T> {
    /// Maps part `p`'s rows of `host` on `devices[p]` with `map_type` (`TO` or `ALLOC`).
    pub fn map(
        rt: &'a Runtime,
        devices: &[usize],
        host: &'a mut [T],
        part: RowPartition,
        map_type: MapType,
    ) -> Result<Self> {
        let bad = |what: String| Error::InvalidArgument { routine: "DistributedArray::map", what };
        if devices.len() != part.parts() {
            return Err(bad(format!("{} devices for {} parts", devices.len(), part.parts())));
        }
        if part.rows.checked_mul(part.row_len) != Some(host.len()) {
            return Err(bad(format!(
                "a grid of {} elements is not {} x {}",
                host.len(),
                part.rows,
                part.row_len
            )));
        }
        let mut d = Self { rt, devices: devices.to_vec(), part, host, mapped: false };
        for p in 0..d.devices.len() {
            let item = MapItem::new(d.rows_range(d.part.mapped(p)), map_type);
            // SAFETY: `host` is borrowed exclusively for 'a; on failure the parts mapped so
            // far are unmapped by `drop`.
            if let Err(e) = unsafe { rt.enter_data(d.devices[p], &[item]) } {
                d.unmap_first(p);
                return Err(e);
            }
        }
        d.mapped = true;
        Ok(d)
    }

    fn rows_range(&self, rows: Range<usize>) -> HostRange {
        let size = std::mem::size_of::<T>();
        HostRange::new(
            self.host.as_ptr() as usize + rows.start * self.part.row_len * size,
            rows.len() * self.part.row_len * size,
        )
    }

    /// The runtime the array is mapped on.
    pub fn runtime(&self) -> &'a Runtime {
        self.rt
    }

    /// The partition.
    pub fn partition(&self) -> &RowPartition {
        &self.part
    }

    /// The device of part `p`.
    ///
    /// # Panics
    ///
    /// If `p` is not a part (`p >= parts`), as for every method here that takes a part.
    pub fn device(&self, p: usize) -> usize {
        self.devices[p]
    }

    /// A kernel view of part `p`'s mapped rows (halos included), writable (the array holds
    /// the grid exclusively). An exit through it copies nothing back
    /// ([`DeviceSlice::copies_back`]): neighbours' views overlap in their halos, and
    /// [`DistributedArray::gather`] brings each row back once, from its owner.
    ///
    /// # Panics
    ///
    /// If `p` is not a part (`p >= parts`), before any address is formed from it.
    pub fn view(&self, p: usize) -> DeviceSlice<'_, T> {
        // Checks `p` (`mapped` panics past the last part) before any pointer is formed.
        let r = self.part.mapped(p);
        // SAFETY: `p` is a part, so its mapped rows lie inside `host` (`map` checked that
        // `host` is rows x row_len); the view only names them for translation.
        let s = unsafe {
            std::slice::from_raw_parts(
                self.host.as_ptr().add(r.start * self.part.row_len),
                r.len() * self.part.row_len,
            )
        };
        let mut v = crate::api::view_of(s, self.devices[p], true);
        v.on_exit = crate::api::ViewExit::Release;
        v
    }

    /// Device address of global row `row` in part `p`'s copy.
    ///
    /// Errors: `row` outside part `p`'s mapped rows ([`Error::InvalidArgument`]).
    pub fn row_addr(&self, p: usize, row: usize) -> Result<u64> {
        let (device, mapped) = (self.device(p), self.part.mapped(p));
        if !mapped.contains(&row) {
            return Err(Error::InvalidArgument {
                routine: "DistributedArray::row_addr",
                what: format!(
                    "row {row} of part {p} (device {device}); expected one of the rows it maps, {}..{}",
                    mapped.start, mapped.end
                ),
            });
        }
        let r = self.rows_range(row..row + 1);
        self.rt.mapped_ptr(r.begin, device)?.ok_or(Error::NotPresent {
            device,
            range: r,
            what: "a distributed array's row",
            name: None,
        })
    }

    /// Copies each part's first and last `halo` owned rows into its neighbours' halos
    /// (device to device; peer copies where possible). With `periodic`, the first part's
    /// top halo comes from the last part and the other way round.
    pub fn exchange_halos(&self, periodic: bool) -> Result<()> {
        (0..self.part.parts()).try_for_each(|p| self.send_halos(p, periodic))
    }

    /// Part `p`'s half of [`DistributedArray::exchange_halos`]: its first owned rows to the
    /// previous part's bottom halo, its last owned rows to the next part's top halo. Parts
    /// can send concurrently (each from its own thread), since every send writes a
    /// different halo. Within one device, and between two with peer access, the copies
    /// are queued (docs/SEMANTICS.md R11): each runs on the receiving device after the
    /// work queued on the sending one before the call, and the sending device's work
    /// queued later runs after it; no thread waits. Otherwise (`omp_target_memcpy`'s path,
    /// or under `OFFLOAD_SYNC=1`) they are made before the call returns. Either way, work
    /// that *another* thread queues on the sending device while this call runs is not
    /// ordered with the copies: as with `omp_target_memcpy`, the program orders its threads'
    /// writes of the rows it sends (one thread per part, a barrier per step, as the
    /// solvers in `examples/` do). Rows on the initial
    /// device are the host grid itself: a send that
    /// reads or writes them waits for the initial device's running kernels (which may
    /// write the grid through a view) and is refused inside one.
    ///
    /// # Panics
    ///
    /// If `p` is not a part (`p >= parts`).
    #[track_caller]
    pub fn send_halos(&self, p: usize, periodic: bool) -> Result<()> {
        let (parts, h, len) = (self.part.parts(), self.part.halo, self.part.row_len);
        let own = self.part.owned(p);
        if h == 0 {
            return Ok(());
        }
        let bytes = h * len * std::mem::size_of::<T>();
        let (prev, next) = if periodic {
            (Some((p + parts - 1) % parts), Some((p + 1) % parts))
        } else {
            (p.checked_sub(1), (p + 1 < parts).then_some(p + 1))
        };
        if let Some(q) = prev {
            self.copy_rows(q, self.part.owned(q).end, p, own.start, bytes)?;
        }
        if let Some(q) = next {
            self.copy_rows(q, self.part.owned(q).start - h, p, own.end - h, bytes)?;
        }
        Ok(())
    }

    /// Copies `bytes` from global row `src_row` of part `src`'s copy to global row
    /// `dst_row` of part `dst`'s, both entries' blocks pinned meanwhile (a view given to a
    /// `nowait` exit can end a part's mapping from another thread).
    #[track_caller]
    fn copy_rows(&self, dst: usize, dst_row: usize, src: usize, src_row: usize, bytes: usize) -> Result<()> {
        // Queued behind the kernels that wrote the rows, as a launch is (docs/SEMANTICS.md
        // R11), where the devices run constructs in order: within one device, or between
        // two that reach each other (the source's later work waits for the copy).
        let (d, s) = (self.rows_range(dst_row..dst_row + 1), self.rows_range(src_row..src_row + 1));
        let (what, at) = ("a distributed array's row", std::panic::Location::caller());
        let (dst_device, src_device) = (self.devices[dst], self.devices[src]);
        let queued = if dst_device == src_device {
            self.rt.queue_copy_within(dst_device, d, s, bytes, what, at)?
        } else {
            self.rt.queue_copy_between(dst_device, d, src_device, s, bytes, what, at)?
        };
        if queued {
            return Ok(());
        }
        // On the initial device a part's "copy" is the host grid itself, which a kernel of
        // the initial device (from another thread, through a view) may be writing: hold
        // its memory as every host-side access of it does.
        let initial = self.rt.initial_device();
        let _hold = if self.devices[dst] == initial || self.devices[src] == initial {
            Some(self.rt.hold_initial_device(false, "DistributedArray::send_halos")?)
        } else {
            None
        };
        let (d, _dst_pin) = self.pinned_row(dst, dst_row)?;
        let (s, _src_pin) = self.pinned_row(src, src_row)?;
        // SAFETY: `bytes` are whole rows inside both parts' mapped copies, pinned; host
        // rows are held from the initial device's kernels.
        unsafe { self.rt.target_memcpy(d, s, bytes, 0, 0, self.devices[dst], self.devices[src]) }
    }

    /// The device address of global row `row` in part `p`'s copy, with the entry's block
    /// held allocated until the guard drops (on the initial device the "copy" is the host
    /// grid itself, and there is nothing to hold).
    pub(crate) fn pinned_row(&self, p: usize, row: usize) -> Result<(u64, Option<DevicePin<'a>>)> {
        self.rt.pinned_mapped(self.devices[p], self.rows_range(row..row + 1), "a distributed array's row")
    }

    /// The devices, part by part.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// Copies every owned row back from its owner (halos never), then unmaps.
    pub fn gather(mut self) -> Result<()> {
        let mut first_err = None;
        for p in 0..self.part.parts() {
            let r = self.rows_range(self.part.owned(p));
            // SAFETY: `host` is held exclusively; `r` lies in part `p`'s mapped slice.
            if let Err(e) = unsafe { self.rt.update(self.devices[p], UpdateDirection::From, &[(r, false)]) } {
                first_err.get_or_insert(e);
            }
        }
        let n = self.part.parts();
        self.unmap_first(n);
        self.mapped = false;
        first_err.map_or(Ok(()), Err)
    }

    /// Unmaps parts `0..n` without copying back.
    fn unmap_first(&mut self, n: usize) {
        for p in 0..n {
            let item = MapItem::new(self.rows_range(self.part.mapped(p)), MapType::DELETE);
            // SAFETY: delete copies nothing.
            let _ = unsafe { self.rt.exit_data(self.devices[p], &[item]) };
        }
    }
}

impl<T: DeviceCopy> Drop for DistributedArray<'_, T> {
    fn drop(&mut self) {
        // Inside a recorded body too (see `recorder::outside`).
        crate::rt::recorder::outside(|| {
            if self.mapped {
                let n = self.part.parts();
                self.unmap_first(n);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queued copy between two devices is checked whole against both devices' live
    /// blocks before anything is queued: a length past a block is refused, and copies and
    /// halos after it still work.
    #[test]
    #[cfg_attr(miri, ignore = "starts a runtime, which reads the machine's topology and memory")]
    fn a_copy_between_devices_past_its_block_is_refused_before_it_is_queued() {
        let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build().unwrap();
        let mut grid = vec![1f32; 6 * 4];
        let part = RowPartition::new(6, 4, 2, 1).unwrap();
        let a = DistributedArray::map(&rt, &[0, 1], &mut grid, part, MapType::TO).unwrap();
        let (dst, src) = (a.rows_range(2..3), a.rows_range(2..3));
        let at = std::panic::Location::caller();
        // Part 1 maps rows 2..6 (64 bytes from row 2); part 0 maps rows 0..4 (32 from row 2).
        let past = rt.queue_copy_between(1, dst, 0, src, 33, "a row", at);
        // The source's block is the short one, named by the pool (the host backend's own
        // check would come later, and CUDA has none).
        assert!(matches!(past, Err(Error::OutsideAllocation { device: 0, bytes: 33, .. })), "{past:?}");
        assert!(
            rt.queue_copy_between(1, dst, 0, src, 16, "a row", at).unwrap(),
            "peer host devices queue it"
        );
        a.send_halos(0, false).unwrap();
        a.gather().unwrap();
        assert!(grid.iter().all(|&v| v == 1.0));
    }

    #[test]
    fn blocks_cover_every_item_once() {
        for n in 0..40 {
            for parts in 1..6 {
                let b = BlockPartition::new(n, parts).unwrap();
                let mut next = 0;
                for p in 0..parts {
                    let r = b.range(p);
                    assert_eq!(r.start, next);
                    assert!(r.len() + 1 >= n / parts && r.len() <= n / parts + 1);
                    for i in r.clone() {
                        assert_eq!(b.owner(i), p, "n {n} parts {parts} item {i}");
                    }
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
        assert!(BlockPartition::new(5, 0).is_err());
    }

    #[test]
    fn rows_split_the_interior_with_halos() {
        let r = RowPartition::new(12, 8, 3, 1).unwrap();
        assert_eq!((r.owned(0), r.owned(1), r.owned(2)), (1..5, 5..8, 8..11));
        assert_eq!((r.mapped(0), r.mapped(2)), (0..6, 7..12));
        assert!(RowPartition::new(4, 8, 3, 1).is_err());
    }

    /// A part or item past the end panics before any address is worked out from it, as an
    /// index past a slice's end does (a view of part `parts` once formed a slice outside
    /// the grid before the index of its device panicked).
    #[test]
    fn parts_and_items_past_the_end_are_refused() {
        fn panics<R>(f: impl FnOnce() -> R) -> bool {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err()
        }
        let b = BlockPartition::new(10, 3).unwrap();
        assert!(panics(|| b.range(3)));
        assert!(panics(|| b.owner(10)));
        assert_eq!((b.range(2), b.owner(9)), (7..10, 2));
        let r = RowPartition::new(12, 8, 3, 1).unwrap();
        assert!(panics(|| r.owned(3)));
        assert!(panics(|| r.mapped(3)));
    }
}
