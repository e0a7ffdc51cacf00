//! A split grid's faces, edges and corners packed into contiguous buffers and unpacked back,
//! on the device that holds them: the regions [`GridPartition`](crate::partition::GridPartition) names
//! are strided in a part's array (a column of a 2-D grid, a plane's edge of a 3-D one), and
//! a message, a copy to another device or a network transfer wants them contiguous. Each
//! copy is a generated kernel over the region's points, in the region's row-major order,
//! as [`GridBox::pack`] does on the host.
//!
//! ```
//! use offload::partition::{GridPartition, Reach};
//! use offload::{map, Runtime};
//!
//! let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build()?;
//! let dev = rt.device(0)?;
//! let g = GridPartition::new(&[6, 6], &[2, 2], 1)?;
//! let mapped = g.mapped(0);
//! let local: Vec<f32> = (0..mapped.len()).map(|i| i as f32).collect();
//! let face = g.exchanges(1, Reach::Faces).find(|e| e.neighbour == 0).unwrap().recv;
//! let mut packed = vec![0f32; face.len()];
//! dev.data((map::to(&local), map::from(&mut packed)), |(src, dst)| {
//!     offload::partition::halo::pack(&dev, &face, &mapped, src, dst)
//! })?;
//! // Part 1 receives part 0's last owned column: 2 points, 4 apart in part 0's array.
//! assert_eq!(packed, [6.0, 10.0]);
//! # Ok::<(), offload::Error>(())
//! ```

use crate::api::{Device, DeviceSlice};
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;
use crate::partition::GridBox;

macro_rules! box_copy {
    ($module:ident, $t:ty) => {
        /// The box copy of one element type.
        pub mod $module {
            /// Point `(i, j, k)` of a box at `(o0, o1, o2)` in an array of rows `s2` long
            /// and planes `s1` rows, and element `(i * e1 + j) * e2 + k` of a buffer in the
            /// box's own row-major order: the point into the buffer (pack), or the buffer's
            /// element into the point (`unpack`).
            #[offload::kernel(dims = 3)]
            #[allow(clippy::too_many_arguments)]
            pub fn copy_box(
                i: usize,
                j: usize,
                k: usize,
                o0: usize,
                o1: usize,
                o2: usize,
                s1: usize,
                s2: usize,
                e1: usize,
                e2: usize,
                unpack: bool,
                src: &[$t],
                dst: &mut [$t],
            ) {
                let point = ((i + o0) * s1 + j + o1) * s2 + k + o2;
                let packed = (i * e1 + j) * e2 + k;
                if unpack {
                    dst[point] = src[packed];
                } else {
                    dst[packed] = src[point];
                }
            }
        }
    };
}

box_copy!(for_f32, f32);
box_copy!(for_f64, f64);

/// The element types whose boxes [`pack`] and [`unpack`] copy.
pub trait HaloElement: DeviceCopy + sealed::Sealed {
    #[doc(hidden)]
    fn copy_box(
        dev: &Device<'_>,
        unpack: bool,
        g: BoxGeometry,
        src: DeviceSlice<'_, Self>,
        dst: DeviceSlice<'_, Self>,
    ) -> Result<()>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A box inside an array, in three axes (fewer axes padded in front with extent 1).
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct BoxGeometry {
    extents: [usize; 3],
    offsets: [usize; 3],
    strides: [usize; 2],
}

macro_rules! halo_element {
    ($t:ty, $module:ident) => {
        impl HaloElement for $t {
            fn copy_box(
                dev: &Device<'_>,
                unpack: bool,
                g: BoxGeometry,
                src: DeviceSlice<'_, Self>,
                dst: DeviceSlice<'_, Self>,
            ) -> Result<()> {
                let ([e0, e1, e2], [o0, o1, o2], [s1, s2]) = (g.extents, g.offsets, g.strides);
                let space = (0..e0, 0..e1, 0..e2);
                $module::copy_box::launch(dev, space, o0, o1, o2, s1, s2, e1, e2, unpack, src, dst)
            }
        }
    };
}

halo_element!(f32, for_f32);
halo_element!(f64, for_f64);

/// `region` inside `within` as three axes, after the checks [`pack`] documents.
fn geometry(
    routine: &'static str,
    region: &GridBox,
    within: &GridBox,
    array: usize,
    buffer: usize,
) -> Result<BoxGeometry> {
    let bad = |what: String| Error::InvalidArgument { routine, what };
    let axes = within.ranges().len();
    if !(1..=3).contains(&axes) || !within.encloses(region) {
        return Err(bad(format!("the region {region:?} is not a box inside {within:?} of 1 to 3 axes")));
    }
    if array != within.len() {
        return Err(bad(format!("the array holds {array} elements, the box it holds {}", within.len())));
    }
    if buffer != region.len() {
        return Err(bad(format!("the buffer holds {buffer} elements, the region {}", region.len())));
    }
    let (mut extents, mut offsets, mut sizes) = ([1usize; 3], [0usize; 3], [1usize; 3]);
    for (a, (r, w)) in region.ranges().iter().zip(within.ranges()).enumerate() {
        let at = 3 - axes + a;
        extents[at] = r.len();
        // (An empty region may lie anywhere: its offsets are never used.)
        offsets[at] = r.start.saturating_sub(w.start);
        sizes[at] = w.len();
    }
    Ok(BoxGeometry { extents, offsets, strides: [sizes[1], sizes[2]] })
}

/// Copies the points of `region` out of `array` (a row-major array of the points of
/// `within`, on `dev`) into `buffer`, in the region's own row-major order: a face, edge or
/// corner of [`GridPartition::exchanges`](crate::partition::GridPartition::exchanges) made contiguous for a message.
/// `within` must enclose `region` (1 to 3 axes), `array` hold `within.len()` elements and
/// `buffer` `region.len()`, else `Error::InvalidArgument` saying which.
pub fn pack<T: HaloElement>(
    dev: &Device<'_>,
    region: &GridBox,
    within: &GridBox,
    array: DeviceSlice<'_, T>,
    buffer: DeviceSlice<'_, T>,
) -> Result<()> {
    copy(dev, false, region, within, array, buffer)
}

/// The reverse of [`pack`]: `buffer`, the points of `region` in its own row-major order,
/// into their places in `array` (a received face, edge or corner). The same checks.
pub fn unpack<T: HaloElement>(
    dev: &Device<'_>,
    region: &GridBox,
    within: &GridBox,
    buffer: DeviceSlice<'_, T>,
    array: DeviceSlice<'_, T>,
) -> Result<()> {
    copy(dev, true, region, within, array, buffer)
}

/// [`pack`] (`unpack` false) or [`unpack`], after their checks.
fn copy<T: HaloElement>(
    dev: &Device<'_>,
    unpack: bool,
    region: &GridBox,
    within: &GridBox,
    array: DeviceSlice<'_, T>,
    buffer: DeviceSlice<'_, T>,
) -> Result<()> {
    let routine = if unpack { "halo::unpack" } else { "halo::pack" };
    let g = geometry(routine, region, within, array.len(), buffer.len())?;
    match (region.is_empty(), unpack) {
        (true, _) => Ok(()),
        (false, true) => T::copy_box(dev, true, g, buffer, array),
        (false, false) => T::copy_box(dev, false, g, array, buffer),
    }
}

/// Every kernel of this module, plain and bounds-checked (for NVRTC checks).
pub fn all() -> Vec<&'static crate::Kernel> {
    vec![
        &for_f32::copy_box::KERNEL,
        &for_f32::copy_box::KERNEL_CHECKED,
        &for_f64::copy_box::KERNEL,
        &for_f64::copy_box::KERNEL_CHECKED,
    ]
}
