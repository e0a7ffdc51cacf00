//! Index spaces of generated kernels: the loop bounds a `#[offload::kernel]` launcher takes.
//!
//! A kernel with `D` leading `usize` parameters runs over a `D`-dimensional space, written
//! as C loop bounds, outermost first: `n` or `a..b` for one index (OpenMP's
//! `parallel for`), a tuple of ranges for two or three (`collapse(2)`, `collapse(3)`).
//! A range whose end is not above its start is empty, as in Rust; a space with an empty
//! dimension has no work items and launches nothing.
//!
//! ```
//! use offload::index_space::{Grid, IndexSpace};
//! assert_eq!(10.ranges(), [0..10]);
//! let g = Grid::new("k", (1..7, 1..5))?;          // 6 rows x 4 columns
//! assert_eq!((g.starts(), g.lens(), g.items()), ([1, 1], [6, 4], 24));
//! assert_eq!(Grid::new("k", (0..3, 5..2, 0..9))?.items(), 0);
//! # Ok::<(), offload::Error>(())
//! ```

// One-dimensional spaces are arrays of one range, on purpose.
#![allow(clippy::single_range_in_vec_init)]

use std::ops::Range;

use crate::error::{Error, Result};

/// Bounds of a `D`-dimensional index space, outermost dimension first.
pub trait IndexSpace<const D: usize> {
    /// The half-open range of each index.
    fn ranges(self) -> [Range<usize>; D];
}

/// `0..n`.
impl IndexSpace<1> for usize {
    fn ranges(self) -> [Range<usize>; 1] {
        [0..self]
    }
}

impl IndexSpace<1> for Range<usize> {
    fn ranges(self) -> [Range<usize>; 1] {
        [self]
    }
}

impl IndexSpace<1> for (Range<usize>,) {
    fn ranges(self) -> [Range<usize>; 1] {
        [self.0]
    }
}

impl IndexSpace<2> for (Range<usize>, Range<usize>) {
    fn ranges(self) -> [Range<usize>; 2] {
        [self.0, self.1]
    }
}

/// `(0..a, 0..b)`.
impl IndexSpace<2> for (usize, usize) {
    fn ranges(self) -> [Range<usize>; 2] {
        [0..self.0, 0..self.1]
    }
}

impl IndexSpace<3> for (Range<usize>, Range<usize>, Range<usize>) {
    fn ranges(self) -> [Range<usize>; 3] {
        [self.0, self.1, self.2]
    }
}

/// `(0..a, 0..b, 0..c)`.
impl IndexSpace<3> for (usize, usize, usize) {
    fn ranges(self) -> [Range<usize>; 3] {
        [0..self.0, 0..self.1, 0..self.2]
    }
}

/// An index space reduced to what a launch passes: each dimension's start and length,
/// and the number of work items (the product of the lengths).
///
/// Work item `t < items()` is the point whose index in dimension `d` is
/// `starts[d] + (t / (lens[d+1] * ... * lens[D-1])) % lens[d]` (the last index varies
/// fastest, as in nested C loops).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid<const D: usize> {
    starts: [usize; D],
    lens: [usize; D],
    items: usize,
}

impl<const D: usize> Grid<D> {
    /// The grid of `space` for kernel `kernel`; an error if the number of work items
    /// overflows `usize`.
    pub fn new(kernel: &'static str, space: impl IndexSpace<D>) -> Result<Self> {
        let ranges = space.ranges();
        let starts = ranges.clone().map(|r| r.start);
        let lens = ranges.clone().map(|r| r.end.saturating_sub(r.start));
        let items = if lens.contains(&0) {
            0
        } else {
            lens.iter().try_fold(1usize, |acc, &l| acc.checked_mul(l)).ok_or_else(|| Error::Overflow {
                routine: kernel,
                what: format!("the index space {ranges:?} has more than usize::MAX points"),
            })?
        };
        Ok(Self { starts, lens, items })
    }

    /// The first index of each dimension.
    pub fn starts(&self) -> [usize; D] {
        self.starts
    }

    /// The length of each dimension.
    pub fn lens(&self) -> [usize; D] {
        self.lens
    }

    /// The number of work items.
    pub fn items(&self) -> usize {
        self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_dimension_from_a_count_or_a_range() {
        assert_eq!(7.ranges(), [0..7]);
        assert_eq!((3..9).ranges(), [3..9]);
        let g = Grid::new("k", 3..9).unwrap();
        assert_eq!((g.starts(), g.lens(), g.items()), ([3], [6], 6));
    }

    #[test]
    fn tuples_are_outermost_first() {
        let g = Grid::new("k", (1..4, 2..7, 0..2)).unwrap();
        assert_eq!((g.starts(), g.lens(), g.items()), ([1, 2, 0], [3, 5, 2], 30));
        assert_eq!((4, 5).ranges(), [0..4, 0..5]);
        assert_eq!((1, 2, 3).ranges(), [0..1, 0..2, 0..3]);
    }

    #[test]
    fn reversed_or_empty_ranges_have_no_items() {
        let (start, end) = (5, 2);
        assert_eq!(Grid::new("k", start..end).unwrap().items(), 0);
        assert_eq!(Grid::new("k", (0..usize::MAX, 3..3)).unwrap().items(), 0);
    }

    #[test]
    fn too_many_items_is_an_overflow_error_naming_the_kernel() {
        let e = Grid::new("stencil", (0..usize::MAX, 0..2)).unwrap_err();
        assert!(matches!(e, Error::Overflow { routine: "stencil", .. }), "{e}");
    }
}
