//! Grids split in one, two or three dimensions: a grid of parts (devices or ranks), each
//! owning a box of the interior, with halos on every side and the regions it exchanges with
//! each neighbour, across faces alone or across edges and corners too.
//!
//! A grid of `D` axes (axis 0 slowest, the last contiguous, as a row-major array) has a
//! boundary of `halo` points on each side of each axis, which no part computes; its interior
//! is split along each axis into blocks ([`BlockPartition`]), one part per combination, so
//! `2 x 2` parts of a 2-D grid each own a quarter. A part maps its owned box grown by `halo`
//! on each side ([`GridPartition::mapped`]): the points of that shell are either the
//! grid's boundary (fixed, copied from the host) or another part's owned points, which
//! [`GridPartition::exchanges`] names, neighbour by neighbour, with the box each sends and
//! the box the other receives.
//!
//! ```
//! use offload::partition::{GridPartition, Reach};
//!
//! // 8 x 10 points with a boundary of 1: a 6 x 8 interior on 2 x 2 parts.
//! let g = GridPartition::new(&[8, 10], &[2, 2], 1)?;
//! assert_eq!(g.owned(3).ranges(), &[4..7, 5..9]);
//! assert_eq!(g.mapped(3).ranges(), &[3..8, 4..10]);
//! // Part 0 (top left) receives its right face from part 1, its lower face from part 2,
//! // and (for a 9-point stencil) its lower right corner from part 3.
//! let from: Vec<usize> = g.exchanges(0, Reach::Corners).map(|e| e.neighbour).collect();
//! assert_eq!(from, [1, 2, 3]);
//! # Ok::<(), offload::Error>(())
//! ```

use std::ops::Range;

use super::BlockPartition;
use crate::error::{Error, Result};

/// The most axes a [`GridPartition`] splits.
pub const MAX_AXES: usize = 3;

/// A box of grid points: a range along each axis of a grid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GridBox {
    ranges: Vec<Range<usize>>,
}

impl GridBox {
    /// The box of `ranges`, one per axis (axis 0 slowest).
    pub fn new(ranges: &[Range<usize>]) -> Self {
        Self { ranges: ranges.to_vec() }
    }

    /// Its range along each axis.
    pub fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// Its extent along each axis.
    pub fn extents(&self) -> Vec<usize> {
        self.ranges.iter().map(|r| r.len()).collect()
    }

    /// Its number of points.
    pub fn len(&self) -> usize {
        self.ranges.iter().map(|r| r.len()).product()
    }

    /// Whether it holds no point.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `point` (a coordinate per axis) lies inside.
    pub fn contains(&self, point: &[usize]) -> bool {
        point.len() == self.ranges.len() && self.ranges.iter().zip(point).all(|(r, c)| r.contains(c))
    }

    /// Whether `other`, of as many axes, lies wholly inside.
    pub fn encloses(&self, other: &GridBox) -> bool {
        other.ranges.len() == self.ranges.len()
            && (other.is_empty()
                || self.ranges.iter().zip(&other.ranges).all(|(a, b)| a.start <= b.start && b.end <= a.end))
    }

    /// The offset of each row of the box (its runs along the last axis) in a row-major
    /// array that holds `within` (which must enclose it), in order: what packing the box
    /// into a contiguous buffer copies, `extents().last()` elements from each.
    ///
    /// # Panics
    ///
    /// If `within` does not enclose the box, or the box has no axes.
    pub fn rows_in(&self, within: &GridBox) -> Vec<usize> {
        assert!(!self.ranges.is_empty(), "a box of no axes has no rows");
        assert!(within.encloses(self), "{self:?} is not inside {within:?}");
        if self.is_empty() {
            return Vec::new();
        }
        let axes = self.ranges.len();
        let ext = within.extents();
        // Row-major strides of `within`.
        let mut stride = vec![1usize; axes];
        for a in (0..axes.saturating_sub(1)).rev() {
            stride[a] = stride[a + 1] * ext[a + 1];
        }
        let mut rows = Vec::with_capacity(self.len() / self.ranges[axes - 1].len());
        let mut at: Vec<usize> = self.ranges.iter().map(|r| r.start).collect();
        loop {
            rows.push(at.iter().zip(&within.ranges).zip(&stride).map(|((c, w), s)| (c - w.start) * s).sum());
            // The next row: the axes before the last, as an odometer.
            let mut a = axes - 1;
            loop {
                if a == 0 {
                    return rows;
                }
                a -= 1;
                at[a] += 1;
                if at[a] < self.ranges[a].end {
                    break;
                }
                at[a] = self.ranges[a].start;
            }
        }
    }

    /// Copies the box's points out of `src`, a row-major array of the points of `within`,
    /// into `dst` in the box's own row-major order (a face, edge or corner packed for a
    /// message).
    ///
    /// # Panics
    ///
    /// If `within` does not enclose the box, the box has no axes, `src` is not
    /// `within.len()` elements or `dst` not `self.len()`.
    pub fn pack<T: Copy>(&self, within: &GridBox, src: &[T], dst: &mut [T]) {
        assert_eq!(src.len(), within.len(), "pack: the source is not the enclosing box");
        assert_eq!(dst.len(), self.len(), "pack: the destination is not the box");
        let run = self.ranges.last().map_or(0, |r| r.len());
        for (row, d) in self.rows_in(within).into_iter().zip(dst.chunks_exact_mut(run.max(1))) {
            d.copy_from_slice(&src[row..row + run]);
        }
    }

    /// Copies `src`, the box's points in its own row-major order, into `dst`, a row-major
    /// array of the points of `within` (a received face, edge or corner unpacked).
    ///
    /// # Panics
    ///
    /// As [`GridBox::pack`], with the roles of the two arrays swapped.
    pub fn unpack<T: Copy>(&self, within: &GridBox, src: &[T], dst: &mut [T]) {
        assert_eq!(dst.len(), within.len(), "unpack: the destination is not the enclosing box");
        assert_eq!(src.len(), self.len(), "unpack: the source is not the box");
        let run = self.ranges.last().map_or(0, |r| r.len());
        for (row, s) in self.rows_in(within).into_iter().zip(src.chunks_exact(run.max(1))) {
            dst[row..row + run].copy_from_slice(s);
        }
    }
}

/// Which neighbours a stencil reads across: those sharing a face (a 5- or 7-point
/// stencil), or also those sharing only an edge or a corner (9- or 27-point).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Across faces only: each halo box is as wide as the owned box along the other axes.
    Faces,
    /// Across faces, edges and corners: the halo shell whole.
    Corners,
}

/// What a part receives from one neighbour: the neighbour's owned points `send`, into this
/// part's halo points `recv` (packed in the boxes' row-major order where they go through a
/// buffer: [`GridBox::pack`]). The two boxes are the same points, except across a periodic
/// axis's ends, where `recv` lies in the boundary and `send` at the interior's other end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// The neighbour's part (this part itself across a periodic axis it spans alone).
    pub neighbour: usize,
    /// Where the neighbour lies, per axis: -1 before, 0 level, 1 after.
    pub direction: Vec<i8>,
    /// The points received, in grid coordinates: inside this part's mapped box, outside
    /// its owned one.
    pub recv: GridBox,
    /// The points the neighbour sends, in grid coordinates: inside its owned box, the
    /// same extents as `recv`.
    pub send: GridBox,
}

impl Exchange {
    /// The kind of region, by how many axes the neighbour is off: `"face"`, `"edge"` or
    /// `"corner"` (for naming it in errors).
    pub fn kind(&self) -> &'static str {
        match self.direction.iter().filter(|&&d| d != 0).count() {
            1 => "face",
            2 => "edge",
            _ => "corner",
        }
    }
}

/// A row-major grid of up to [`MAX_AXES`] axes split over a grid of parts, with halos.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GridPartition {
    extents: Vec<usize>,
    halo: usize,
    axes: Vec<BlockPartition>,
    /// Per axis: whether the interior wraps (the boundary before it holds the interior's
    /// last points, the boundary after it the first).
    periodic: Vec<bool>,
}

impl GridPartition {
    /// A grid of `extents` points (axis 0 slowest) whose interior, `halo` points in from
    /// each side, is split into `parts[a]` blocks along each axis `a`. Each block must be
    /// at least `halo` wide, so that a part's halos reach only its next neighbours.
    pub fn new(extents: &[usize], parts: &[usize], halo: usize) -> Result<Self> {
        let bad = |what: String| Error::InvalidArgument { routine: "GridPartition::new", what };
        if extents.is_empty() || extents.len() > MAX_AXES || parts.len() != extents.len() {
            return Err(bad(format!(
                "a grid of {} axes split by {} (1 to {MAX_AXES} axes, a count of parts for each)",
                extents.len(),
                parts.len()
            )));
        }
        let mut axes = Vec::with_capacity(extents.len());
        for (a, (&n, &p)) in extents.iter().zip(parts).enumerate() {
            let interior = halo.checked_mul(2).and_then(|h| n.checked_sub(h)).unwrap_or(0);
            let block = BlockPartition::new(interior, p)?;
            // The shortest block is the last one.
            let shortest = block.range(p - 1).len();
            if shortest == 0 || shortest < halo {
                return Err(bad(format!(
                    "axis {a}: {n} points with halo {halo} leave {interior} interior points, which \
                     {p} parts cannot split into blocks of at least {} each",
                    halo.max(1)
                )));
            }
            axes.push(block);
        }
        // Every count of points and of parts must fit, so that `len`, `parts` and the
        // boxes' offsets never overflow.
        let points = extents.iter().try_fold(1usize, |n, &e| n.checked_mul(e));
        let count = parts.iter().try_fold(1usize, |n, &p| n.checked_mul(p));
        if points.is_none() || count.is_none() {
            return Err(Error::Overflow {
                routine: "GridPartition::new",
                what: format!("a grid of {extents:?} points split by {parts:?}"),
            });
        }
        let periodic = vec![false; extents.len()];
        Ok(Self { extents: extents.to_vec(), halo, axes, periodic })
    }

    /// The same split with the interior wrapping along each axis where `periodic` says so:
    /// the `halo` boundary points before the interior receive its last `halo` points, those
    /// after it its first (Jacobi's top and bottom rows). A part alone along such an axis
    /// is its own neighbour there.
    ///
    /// Errors: not one flag per axis ([`Error::InvalidArgument`]).
    ///
    /// ```
    /// use offload::partition::{GridPartition, Reach};
    ///
    /// // Rows wrap, columns do not: part 0's top halo row comes from part 2's last row.
    /// let g = GridPartition::new(&[8, 10], &[2, 2], 1)?.with_periodic(&[true, false])?;
    /// let top = g.exchanges(0, Reach::Faces).next().unwrap();
    /// assert_eq!((top.neighbour, top.recv.ranges(), top.send.ranges()), (2, &[0..1, 1..5][..], &[6..7, 1..5][..]));
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn with_periodic(mut self, periodic: &[bool]) -> Result<Self> {
        if periodic.len() != self.axes.len() {
            return Err(Error::InvalidArgument {
                routine: "GridPartition::with_periodic",
                what: format!(
                    "{} flags for a grid of {} axes; expected one per axis",
                    periodic.len(),
                    self.axes.len()
                ),
            });
        }
        self.periodic = periodic.to_vec();
        Ok(self)
    }

    /// Per axis, whether the interior wraps ([`GridPartition::with_periodic`]).
    pub fn periodic(&self) -> &[bool] {
        &self.periodic
    }

    /// The grid's points per axis.
    pub fn extents(&self) -> &[usize] {
        &self.extents
    }

    /// The halo width (and the boundary's).
    pub fn halo(&self) -> usize {
        self.halo
    }

    /// The parts per axis (`2 x 2` is `[2, 2]`).
    pub fn shape(&self) -> Vec<usize> {
        self.axes.iter().map(|b| b.parts()).collect()
    }

    /// The number of parts.
    pub fn parts(&self) -> usize {
        self.axes.iter().map(|b| b.parts()).product()
    }

    /// The whole grid as a box.
    pub fn whole(&self) -> GridBox {
        GridBox { ranges: self.extents.iter().map(|&n| 0..n).collect() }
    }

    /// The interior (every point some part owns).
    pub fn interior(&self) -> GridBox {
        GridBox { ranges: self.extents.iter().map(|&n| self.halo..n - self.halo).collect() }
    }

    /// Part `p`'s place in the grid of parts, per axis (parts are numbered row-major, the
    /// last axis fastest).
    ///
    /// # Panics
    ///
    /// If `p` is not a part.
    pub fn coords(&self, p: usize) -> Vec<usize> {
        assert!(p < self.parts(), "part {p} of a grid of {} parts", self.parts());
        let mut rest = p;
        let mut c = vec![0; self.axes.len()];
        for a in (0..self.axes.len()).rev() {
            c[a] = rest % self.axes[a].parts();
            rest /= self.axes[a].parts();
        }
        c
    }

    /// The part at `coords` in the grid of parts, if there is one.
    pub fn part_at(&self, coords: &[usize]) -> Option<usize> {
        if coords.len() != self.axes.len() {
            return None;
        }
        coords.iter().zip(&self.axes).try_fold(0, |p, (&c, b)| (c < b.parts()).then_some(p * b.parts() + c))
    }

    /// The points part `p` owns (computes, and gathers back).
    ///
    /// # Panics
    ///
    /// If `p` is not a part.
    pub fn owned(&self, p: usize) -> GridBox {
        let c = self.coords(p);
        let ranges = c
            .iter()
            .zip(&self.axes)
            .map(|(&c, b)| {
                let r = b.range(c);
                r.start + self.halo..r.end + self.halo
            })
            .collect();
        GridBox { ranges }
    }

    /// The points part `p` maps: its owned box and `halo` points on each side.
    ///
    /// # Panics
    ///
    /// If `p` is not a part.
    pub fn mapped(&self, p: usize) -> GridBox {
        let o = self.owned(p);
        GridBox { ranges: o.ranges.iter().map(|r| r.start - self.halo..r.end + self.halo).collect() }
    }

    /// Part `p`'s owned box as the layers its neighbours read, `halo` points deep along
    /// each side that has a neighbour (across a periodic axis's ends too), as disjoint boxes
    /// in a fixed order, and the inner box left: a step computes the layers first and the
    /// inner box while they travel. Together they are the owned box, each point once.
    ///
    /// # Panics
    ///
    /// If `p` is not a part.
    ///
    /// ```
    /// use offload::partition::GridPartition;
    ///
    /// // Part 0 of 2 x 1 owns rows 1..4 and columns 1..5; only its lower side has a neighbour.
    /// let g = GridPartition::new(&[8, 6], &[2, 1], 1)?;
    /// let (layers, inner) = g.layers_and_inner(0);
    /// assert_eq!(layers.iter().map(|b| b.ranges().to_vec()).collect::<Vec<_>>(), [vec![3..4, 1..5]]);
    /// assert_eq!(inner.ranges(), &[1..3, 1..5]);
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn layers_and_inner(&self, p: usize) -> (Vec<GridBox>, GridBox) {
        let (coords, owned) = (self.coords(p), self.owned(p));
        let mut rest = owned.ranges.clone();
        let mut layers = Vec::new();
        for (a, &c) in coords.iter().enumerate() {
            let parts = self.axes[a].parts();
            for before in [true, false] {
                let has = self.periodic[a] || if before { c > 0 } else { c + 1 < parts };
                let r = rest[a].clone();
                let w = self.halo.min(r.len());
                if !has || w == 0 {
                    continue;
                }
                let (layer, left) = if before {
                    (r.start..r.start + w, r.start + w..r.end)
                } else {
                    (r.end - w..r.end, r.start..r.end - w)
                };
                let mut b = rest.clone();
                b[a] = layer;
                layers.push(GridBox { ranges: b });
                rest[a] = left;
            }
        }
        (layers, GridBox { ranges: rest })
    }

    /// What part `p` receives from each neighbour before a stencil step that reads across
    /// `reach`, in a fixed order (directions row-major, -1 before 0 before 1). The regions
    /// received from all neighbours are disjoint; with [`Reach::Corners`] they cover every
    /// point of `p`'s halo shell inside the interior (or across a periodic axis's ends),
    /// with [`Reach::Faces`] the shell's faces alone. A neighbour sends them out of its
    /// owned box ([`Exchange::send`]).
    ///
    /// # Panics
    ///
    /// If `p` is not a part.
    pub fn exchanges(&self, p: usize, reach: Reach) -> impl Iterator<Item = Exchange> + '_ {
        let (coords, owned) = (self.coords(p), self.owned(p));
        let axes = self.axes.len();
        let count = 3usize.pow(axes as u32);
        (0..count).filter_map(move |code| {
            // Digit a of `code` in base 3 (axis 0 first) is the direction along axis a.
            let direction: Vec<i8> =
                (0..axes).map(|a| (code / 3usize.pow((axes - 1 - a) as u32) % 3) as i8 - 1).collect();
            let off = direction.iter().filter(|&&d| d != 0).count();
            if off == 0 || (reach == Reach::Faces && off > 1) {
                return None;
            }
            let (mut at, mut recv, mut send) =
                (Vec::with_capacity(axes), Vec::with_capacity(axes), Vec::with_capacity(axes));
            for (a, ((&c, &d), r)) in coords.iter().zip(&direction).zip(&owned.ranges).enumerate() {
                let parts = self.axes[a].parts();
                let wanted = c.checked_add_signed(isize::from(d)).filter(|&n| n < parts);
                // Across a periodic axis's ends, the halo receives the interior's far end.
                let span = self.extents[a] - 2 * self.halo;
                let (neighbour, shift) = match (wanted, self.periodic[a]) {
                    (Some(n), _) => (n, 0isize),
                    (None, true) if d < 0 => (parts - 1, span as isize),
                    (None, true) => (0, -(span as isize)),
                    (None, false) => return None,
                };
                at.push(neighbour);
                let got = match d {
                    -1 => r.start - self.halo..r.start,
                    1 => r.end..r.end + self.halo,
                    _ => r.clone(),
                };
                let moved = got.start.wrapping_add_signed(shift)..got.end.wrapping_add_signed(shift);
                recv.push(got);
                send.push(moved);
            }
            let neighbour = self.part_at(&at)?;
            Some(Exchange {
                neighbour,
                direction,
                recv: GridBox { ranges: recv },
                send: GridBox { ranges: send },
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every point of `b`, in row-major order.
    fn points(b: &GridBox) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new()];
        for r in b.ranges() {
            out =
                out.into_iter().flat_map(|p| r.clone().map(move |c| [p.clone(), vec![c]].concat())).collect();
        }
        if b.is_empty() {
            out.clear();
        }
        out
    }

    /// Odd and uneven splits in one, two and three axes, halos of 1 and 2, no axis, the
    /// first or every axis periodic: owned boxes tile the interior once; every exchange is
    /// received outside the receiver's owned box, inside its mapped box, from the points
    /// of the sender's owned box that wrap onto it; the received regions are disjoint and
    /// cover the shell inside the (wrapped) interior (corners) or its faces (faces); the
    /// sender lists the receiver back in the opposite direction.
    #[test]
    fn boxes_tile_the_interior_and_exchanges_cover_each_halo_once() {
        let cases: &[(&[usize], &[usize], usize)] = &[
            (&[9], &[3], 1),
            (&[12], &[4], 2),
            (&[7, 9], &[2, 3], 1),
            (&[11, 6], &[3, 2], 1),
            (&[10, 13], &[2, 2], 2),
            (&[6, 7, 8], &[2, 2, 2], 1),
            (&[9, 8, 7], &[3, 1, 2], 1),
            (&[10, 10, 11], &[2, 3, 2], 2),
        ];
        // Miri runs this module's tests (slowly): a 1-D and a 2-D case there.
        let cases: Vec<_> = if cfg!(miri) { vec![cases[0], cases[2]] } else { cases.to_vec() };
        for (extents, shape, halo) in cases {
            let g = GridPartition::new(extents, shape, halo).unwrap();
            let interior = g.interior();
            let mut owner = std::collections::HashMap::new();
            for p in 0..g.parts() {
                assert_eq!(g.part_at(&g.coords(p)), Some(p));
                for pt in points(&g.owned(p)) {
                    assert!(interior.contains(&pt), "{extents:?}/{shape:?}: {pt:?} outside the interior");
                    assert!(owner.insert(pt.clone(), p).is_none(), "{pt:?} owned twice");
                }
                assert!(g.whole().encloses(&g.mapped(p)));
            }
            assert_eq!(owner.len(), interior.len(), "{extents:?}/{shape:?}: owned boxes miss points");
            // No axis wrapping, the first, and all.
            let axes = extents.len();
            for periodic in
                [vec![false; axes], [vec![true], vec![false; axes - 1]].concat(), vec![true; axes]]
            {
                let g = g.clone().with_periodic(&periodic).unwrap();
                // A point of the shell, wrapped into the interior along periodic axes.
                let wrap = |pt: &[usize]| -> Vec<usize> {
                    pt.iter()
                        .enumerate()
                        .map(|(a, &c)| {
                            let (lo, hi) = (halo, extents[a] - halo);
                            match (periodic[a], c < lo, c >= hi) {
                                (true, true, _) => c + (hi - lo),
                                (true, _, true) => c - (hi - lo),
                                _ => c,
                            }
                        })
                        .collect()
                };
                for p in 0..g.parts() {
                    let (owned, mapped) = (g.owned(p), g.mapped(p));
                    for reach in [Reach::Faces, Reach::Corners] {
                        let mut got = std::collections::HashSet::new();
                        for e in g.exchanges(p, reach) {
                            assert!(
                                mapped.encloses(&e.recv) && g.owned(e.neighbour).encloses(&e.send),
                                "{e:?}"
                            );
                            let sent = points(&e.send);
                            assert_eq!(sent.len(), e.recv.len(), "{e:?}");
                            for (pt, from) in points(&e.recv).into_iter().zip(sent) {
                                assert_eq!(wrap(&pt), from, "{e:?}");
                                assert!(
                                    !owned.contains(&pt) && owner[&from] == e.neighbour,
                                    "{pt:?} from {e:?}"
                                );
                                assert!(got.insert(pt), "received twice: {e:?}");
                            }
                            let back: Vec<i8> = e.direction.iter().map(|d| -d).collect();
                            assert!(
                                g.exchanges(e.neighbour, reach)
                                    .any(|b| b.neighbour == p && b.direction == back),
                                "{e:?} not listed back"
                            );
                        }
                        // The shell inside the interior (wrapped): all of it, or the points
                        // level with the owned box along all axes but one.
                        for pt in points(&mapped) {
                            let off = pt.iter().zip(owned.ranges()).filter(|(c, r)| !r.contains(*c)).count();
                            let inside = interior.contains(&wrap(&pt));
                            let want = inside && off > 0 && (reach == Reach::Corners || off == 1);
                            assert_eq!(
                                got.contains(&pt),
                                want,
                                "{extents:?}/{shape:?} {periodic:?} part {p} {reach:?} at {pt:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The layers and the inner box tile the owned box once, and every point a neighbour
    /// receives from the part lies in a layer, not in the inner box.
    #[test]
    fn layers_and_inner_tile_the_owned_box_and_hold_what_is_sent() {
        /// Extents, parts per axis, halo, periodic axes.
        type Case = (&'static [usize], &'static [usize], usize, &'static [bool]);
        let cases: &[Case] = &[
            (&[9], &[3], 1, &[false]),
            (&[9, 11], &[2, 2], 1, &[true, false]),
            (&[10, 13], &[3, 2], 2, &[false, false]),
            (&[7, 8, 9], &[2, 2, 2], 1, &[false, true, false]),
            (&[6, 6, 6], &[1, 1, 1], 1, &[true, true, true]),
        ];
        for &(extents, shape, halo, periodic) in cases {
            let g = GridPartition::new(extents, shape, halo).unwrap().with_periodic(periodic).unwrap();
            for p in 0..g.parts() {
                let (layers, inner) = g.layers_and_inner(p);
                let mut seen = std::collections::HashSet::new();
                for b in layers.iter().chain([&inner]) {
                    for pt in points(b) {
                        assert!(seen.insert(pt), "{extents:?}/{shape:?} part {p}: a point twice");
                    }
                }
                assert_eq!(seen.len(), g.owned(p).len(), "{extents:?}/{shape:?} part {p}");
                for q in 0..g.parts() {
                    for e in g.exchanges(q, Reach::Corners).filter(|e| e.neighbour == p) {
                        for pt in points(&e.send) {
                            assert!(
                                !inner.contains(&pt),
                                "{extents:?}/{shape:?}: {pt:?} sent from part {p}'s inner box"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Packing a face, an edge or a corner and unpacking it elsewhere moves exactly its
    /// points, in row-major order, and nothing else.
    #[test]
    fn packing_moves_exactly_the_boxs_points() {
        let g = GridPartition::new(&[7, 8, 9], &[2, 2, 2], 1).unwrap();
        for p in 0..if cfg!(miri) { 1 } else { g.parts() } {
            let mapped = g.mapped(p);
            let coord = |pt: &[usize]| (pt[0] * 1000 + pt[1] * 100 + pt[2]) as u32;
            let local: Vec<u32> = points(&mapped).iter().map(|pt| coord(pt)).collect();
            for e in g.exchanges(p, Reach::Corners) {
                let mut buf = vec![0u32; e.recv.len()];
                e.recv.pack(&mapped, &local, &mut buf);
                let want: Vec<u32> = points(&e.recv).iter().map(|pt| coord(pt)).collect();
                assert_eq!(buf, want, "{} {e:?}", e.kind());
                let mut other = vec![u32::MAX; mapped.len()];
                e.recv.unpack(&mapped, &buf, &mut other);
                for (pt, v) in points(&mapped).iter().zip(&other) {
                    let inside = e.recv.contains(pt);
                    assert_eq!(*v, if inside { coord(pt) } else { u32::MAX }, "{pt:?}");
                }
            }
        }
    }

    #[test]
    fn grids_too_small_or_malformed_are_refused() {
        for (extents, shape, halo) in [
            (&[5usize][..], &[4usize][..], 1),
            (&[10, 10][..], &[2, 5][..], 2),
            (&[4, 4, 4, 4][..], &[1, 1, 1, 1][..], 1),
            (&[8, 8][..], &[2][..], 1),
            (&[8, 8][..], &[2, 0][..], 1),
            (&[1, 8][..], &[1, 1][..], 1),
        ] {
            match GridPartition::new(extents, shape, halo) {
                Err(Error::InvalidArgument {
                    routine: "GridPartition::new" | "BlockPartition::new", ..
                }) => {}
                other => panic!("{extents:?} / {shape:?} / {halo}: {other:?}"),
            }
        }
        // Counts of points or of parts that do not fit a usize.
        let huge = (1usize << 40) + 2;
        for (extents, shape) in
            [(&[huge, huge][..], &[1usize << 33, 1 << 33][..]), (&[1 << 33; 3][..], &[2, 1, 1][..])]
        {
            assert!(
                matches!(
                    GridPartition::new(extents, shape, 1),
                    Err(Error::Overflow { routine: "GridPartition::new", .. })
                ),
                "{extents:?} / {shape:?}"
            );
        }
        let g = GridPartition::new(&[8, 8], &[2, 2], 1).unwrap();
        assert!(matches!(
            g.with_periodic(&[true]),
            Err(Error::InvalidArgument { routine: "GridPartition::with_periodic", .. })
        ));
    }
}
