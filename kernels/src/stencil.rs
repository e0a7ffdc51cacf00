//! Stencils: the 2-D 5-point Jacobi step with its L2 norm fused in, and a 3-D 7-point
//! step, each with a host twin that does the same arithmetic in the same order (so a host
//! device and a GPU give the same bits).
//!
//! Both walk each column (2-D) or each `(x, y)` line (3-D) with one thread through a strip
//! of rows (planes), keeping the rows above, at and below in registers, so every element is
//! read from memory about once per step.

use offload::{Device, DevicePtr, DeviceSlice, Error, HostLaunch, Kernel, Result};
use rayon::prelude::*;

/// Interior columns a 2-D thread covers, rounded up to whole warps so a warp never spans
/// two strips.
fn padded(cols: usize) -> usize {
    cols.next_multiple_of(32)
}

// ---- 2-D Jacobi ------------------------------------------------------------------------

const JACOBI_SRC: &str = r#"
// One thread per interior column, a strip of `rows` rows each; threads are laid out so a
// warp never spans two strips (columns padded to whole warps). Left and right neighbours
// come from the neighbouring lanes' registers (warp shuffles), so each element is loaded
// about once: the kernel streams `a` and `a_new` through DRAM at close to copy speed.
extern "C" __global__ void __launch_bounds__(256) jacobi_step(
    const float* __restrict__ a, float* __restrict__ a_new, float* __restrict__ norm,
    unsigned long long nx_, unsigned long long iy_start_, unsigned long long iy_end_,
    unsigned long long rows_, unsigned long long slot, unsigned long long cols_pad_,
    float* __restrict__ push_first, float* __restrict__ push_last, unsigned long long n)
{
    const unsigned nx = (unsigned)nx_, iy_start = (unsigned)iy_start_, iy_end = (unsigned)iy_end_;
    const unsigned rows = (unsigned)rows_, cols_pad = (unsigned)cols_pad_;
    const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned lane = threadIdx.x & 31;
    float acc = 0.0f;
    if (t < n) {  // whole warps: n is a multiple of cols_pad, itself a multiple of 32
        const unsigned ix = t % cols_pad + 1;
        const bool active = ix < nx - 1;
        const unsigned x = active ? ix : nx - 2;  // padding lanes shadow the last column
        const bool edge_left = lane == 0, edge_right = lane == 31 || ix == nx - 2;
        const unsigned iy0 = iy_start + (t / cols_pad) * rows;
        const unsigned iy1 = min(iy0 + rows, iy_end);
        float up = a[(iy0 - 1) * nx + x];
        float center = a[iy0 * nx + x];
        for (unsigned iy = iy0; iy < iy1; ++iy) {
            const float down = a[(iy + 1) * nx + x];
            float left = __shfl_up_sync(0xffffffffu, center, 1);
            float right = __shfl_down_sync(0xffffffffu, center, 1);
            if (edge_left) left = a[iy * nx + x - 1];
            if (edge_right) right = a[iy * nx + x + 1];
            const float v = 0.25f * (right + left + down + up);
            if (active) {
                a_new[iy * nx + x] = v;
                if (iy == iy_start && push_first) push_first[x] = v;
                if (iy == iy_end - 1 && push_last) push_last[x] = v;
                const float r = v - center;
                acc += r * r;
            }
            up = center;
            center = down;
        }
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    __shared__ float warp_sums[32];
    if (lane == 0) warp_sums[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        acc = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
        if (threadIdx.x == 0) {
            atomicAdd(&norm[slot], acc);
            if (blockIdx.x == 0) norm[1 - slot] = 0.0f;
        }
    }
}
"#;

fn jacobi_host(l: &HostLaunch<'_>) -> Result<(), String> {
    let u = |i| l.scalar::<u64>(i).map(|v| v as usize);
    let (nx, iy_start, iy_end, slot) = (u(3)?, u(4)?, u(5)?, u(7)?);
    if nx < 3 || iy_start == 0 || iy_end <= iy_start || slot > 1 {
        return Err(format!("jacobi_step: bad shape nx {nx} rows {iy_start}..{iy_end} slot {slot}"));
    }
    let len = iy_end
        .checked_add(1)
        .and_then(|rows| rows.checked_mul(nx))
        .ok_or_else(|| format!("jacobi_step: {iy_end} + 1 rows of {nx} overflow"))?;
    let (a_new, known) = l.ptr::<f32>(1)?;
    if known.is_some_and(|k| k < len) {
        return Err(format!("jacobi_step: a_new holds {known:?} floats, needs {len}"));
    }
    crate::distinct::<f32, f32>(l, 0, len, 1, len)?;
    crate::distinct::<f32, f32>(l, 0, len, 2, 2)?;
    crate::distinct::<f32, f32>(l, 1, len, 2, 2)?;
    // SAFETY: `a` and `a_new` are distinct mapped grids of at least `(iy_end + 1) * nx`
    // floats (checked when known), and `norm` 2 floats apart from both (checked). Only the computed rows of `a_new`
    // are borrowed: its halo rows may be push targets, written through raw pointers below.
    let (a, interior, norm) = unsafe {
        (
            l.slice::<f32>(0, len)?,
            std::slice::from_raw_parts_mut(a_new.add(iy_start * nx), (iy_end - iy_start) * nx),
            l.slice_mut::<f32>(2, 2)?,
        )
    };
    let (first, _) = l.ptr::<f32>(9)?;
    let (last, _) = l.ptr::<f32>(10)?;
    let (first, last) = (first as usize, last as usize);
    let acc: f64 = interior
        .par_chunks_mut(nx)
        .enumerate()
        .map(|(k, out)| {
            let iy = iy_start + k;
            let mut acc = 0.0f32;
            // The row and its neighbours as slices of one length: no check in the loop.
            let line = |at: usize| &a[at..at + nx];
            let (c, up, down) = (line(iy * nx), line((iy - 1) * nx), line((iy + 1) * nx));
            for ix in 1..nx - 1 {
                let v = 0.25f32 * (c[ix + 1] + c[ix - 1] + down[ix] + up[ix]);
                out[ix] = v;
                let r = v - c[ix];
                acc += r * r;
            }
            for (push, row) in [(first, iy_start), (last, iy_end - 1)] {
                if push != 0 && iy == row {
                    // SAFETY: a halo row of `nx` floats (here or on a neighbour) that no
                    // reference covers and nothing else writes during this step.
                    let dst = unsafe { std::slice::from_raw_parts_mut(push as *mut f32, nx) };
                    dst[1..nx - 1].copy_from_slice(&out[1..nx - 1]);
                }
            }
            f64::from(acc)
        })
        .sum();
    norm[slot] += acc as f32;
    norm[1 - slot] = 0.0;
    Ok(())
}

/// One Jacobi step on a local grid of `nx` columns: rows `iy_start..iy_end` of `a_new`
/// get the 5-point average of `a`, `norm[slot]` gets the sum of squared updates added and
/// `norm[1 - slot]` is zeroed (so alternating slots need no separate reset). The first and
/// last computed rows are also stored to `push_first` / `push_last` when not null (halo
/// rows of this or a neighbouring device: peer stores).
pub static JACOBI_STEP: Kernel =
    Kernel::new("jacobi_step").with_cuda(JACOBI_SRC).with_host(jacobi_host).with_block(256);

/// Refuses views of `kernel` that overlap: a step reads one grid while it writes the
/// other (on host devices they are borrowed as slices, one `&mut`).
fn views_apart(kernel: &'static str, views: &[DeviceSlice<'_, f32>]) -> Result<()> {
    for (i, x) in views.iter().enumerate() {
        for (j, y) in views.iter().enumerate().skip(i + 1) {
            let (p, q) = (x.host_range(), y.host_range());
            if p.bytes > 0 && q.bytes > 0 && p.begin < q.end() && q.begin < p.end() {
                return Err(Error::KernelArgument {
                    kernel,
                    index: j,
                    what: format!("{q} overlaps argument {i} ({p}); expected distinct grids"),
                });
            }
        }
    }
    Ok(())
}

/// A Jacobi launch's shape.
#[derive(Clone, Copy, Debug)]
pub struct JacobiShape {
    /// Columns, boundary columns included.
    pub nx: usize,
    /// First computed row (local).
    pub iy_start: usize,
    /// One past the last computed row (local).
    pub iy_end: usize,
    /// Rows per GPU thread.
    pub rows_per_thread: usize,
}

/// Runs one Jacobi step (see [`JACOBI_STEP`]).
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn jacobi_step(
    dev: &Device<'_>,
    shape: JacobiShape,
    a: DeviceSlice<'_, f32>,
    a_new: DeviceSlice<'_, f32>,
    norm: DeviceSlice<'_, f32>,
    slot: usize,
    push_first: DevicePtr,
    push_last: DevicePtr,
) -> Result<()> {
    let JacobiShape { nx, iy_start, iy_end, rows_per_thread } = shape;
    let need = iy_end.checked_add(1).and_then(|rows| rows.checked_mul(nx)).ok_or_else(|| {
        Error::Overflow { routine: "jacobi_step", what: format!("a grid of {iy_end} + 1 rows of {nx}") }
    })?;
    for (i, v) in [(0usize, a.len()), (1, a_new.len())] {
        if v < need || iy_start == 0 || iy_end <= iy_start || nx < 3 {
            return Err(Error::KernelArgument {
                kernel: "jacobi_step",
                index: i,
                what: format!("grid of {v} elements for rows {iy_start}..{iy_end} of {nx} (needs {need})"),
            });
        }
    }
    if slot > 1 || norm.len() < 2 {
        return Err(Error::KernelArgument {
            kernel: "jacobi_step",
            index: 2,
            what: format!(
                "norm of {} elements and slot {slot}; expected 2 elements and slot 0 or 1",
                norm.len()
            ),
        });
    }
    views_apart("jacobi_step", &[a, a_new, norm])?;
    let rows = rows_per_thread.max(1);
    let cols_pad = padded(nx - 2);
    let n = cols_pad * (iy_end - iy_start).div_ceil(rows);
    let u = |v: usize| v as u64;
    dev.launch(
        &JACOBI_STEP,
        n,
        (a, a_new, norm, u(nx), u(iy_start), u(iy_end), u(rows), u(slot), u(cols_pad), push_first, push_last),
    )
}

// ---- 3-D 7-point stencil -----------------------------------------------------------------

const STENCIL3D_SRC: &str = r#"
extern "C" __global__ void __launch_bounds__(256) stencil7_step(
    const float* __restrict__ a, float* __restrict__ a_new,
    unsigned long long nx_, unsigned long long ny_, unsigned long long z_start_, unsigned long long z_end_,
    unsigned long long planes_, float* __restrict__ push_first, float* __restrict__ push_last,
    unsigned long long n)
{
    const unsigned nx = (unsigned)nx_, ny = (unsigned)ny_, z_start = (unsigned)z_start_, z_end = (unsigned)z_end_;
    const unsigned planes = (unsigned)planes_;
    const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned cols = (nx - 2) * (ny - 2);
    if (t >= n) return;
    const unsigned ix = t % (nx - 2) + 1, iy = (t % cols) / (nx - 2) + 1;
    const unsigned z0 = z_start + (t / cols) * planes, z1 = min(z0 + planes, z_end);
    const unsigned plane = nx * ny;
    unsigned i = z0 * plane + iy * nx + ix;
    float below = a[i - plane], center = a[i];
    for (unsigned z = z0; z < z1; ++z, i += plane) {
        const float above = a[i + plane];
        const float v = (1.0f / 6.0f) * (a[i - 1] + a[i + 1] + a[i - nx] + a[i + nx] + below + above);
        a_new[i] = v;
        if (z == z_start && push_first) push_first[iy * nx + ix] = v;
        if (z == z_end - 1 && push_last) push_last[iy * nx + ix] = v;
        below = center;
        center = above;
    }
}
"#;

fn stencil3d_host(l: &HostLaunch<'_>) -> Result<(), String> {
    let u = |i| l.scalar::<u64>(i).map(|v| v as usize);
    let (nx, ny, z_start, z_end) = (u(2)?, u(3)?, u(4)?, u(5)?);
    if nx < 3 || ny < 3 || z_start == 0 || z_end < z_start {
        return Err(format!("stencil7_step: bad shape {nx} x {ny}, planes {z_start}..{z_end}"));
    }
    let (plane, len) = nx
        .checked_mul(ny)
        .and_then(|plane| Some((plane, z_end.checked_add(1)?.checked_mul(plane)?)))
        .ok_or_else(|| format!("stencil7_step: {z_end} + 1 planes of {nx} x {ny} overflow"))?;
    let (a_new, known) = l.ptr::<f32>(1)?;
    if known.is_some_and(|k| k < len) {
        return Err(format!("stencil7_step: a_new holds {known:?} floats, needs {len}"));
    }
    crate::distinct::<f32, f32>(l, 0, len, 1, len)?;
    let (first, _) = l.ptr::<f32>(7)?;
    let (last, _) = l.ptr::<f32>(8)?;
    let (first, last) = (first as usize, last as usize);
    // SAFETY: distinct (checked) mapped grids of at least `(z_end + 1)` planes (checked
    // when known);
    // only the computed planes of `a_new` are borrowed, since its halo planes may be push
    // targets written through raw pointers below.
    let (a, interior) = unsafe {
        (
            l.slice::<f32>(0, len)?,
            std::slice::from_raw_parts_mut(a_new.add(z_start * plane), (z_end - z_start) * plane),
        )
    };
    interior.par_chunks_mut(nx).enumerate().for_each(|(k, out)| {
        let (z, iy) = (z_start + k / ny, k % ny);
        if iy == 0 || iy == ny - 1 {
            return;
        }
        // The row and its four neighbours as slices of one length: no check in the loop,
        // which then vectorises (the sum in the same order as the CUDA kernel's).
        let row = z * plane + iy * nx;
        let line = |at: usize| &a[at..at + nx];
        let (c, north, south, below, above) =
            (line(row), line(row - nx), line(row + nx), line(row - plane), line(row + plane));
        for ix in 1..nx - 1 {
            out[ix] =
                (1.0f32 / 6.0f32) * (c[ix - 1] + c[ix + 1] + north[ix] + south[ix] + below[ix] + above[ix]);
        }
        for (push, at) in [(first, z_start), (last, z_end - 1)] {
            if push != 0 && z == at {
                // SAFETY: a halo plane (here or on a neighbour) that no reference covers
                // and nothing else writes during this step; this line of it is ours.
                let dst = unsafe { std::slice::from_raw_parts_mut((push as *mut f32).add(iy * nx), nx) };
                dst[1..nx - 1].copy_from_slice(&out[1..nx - 1]);
            }
        }
    });
    Ok(())
}

/// One 7-point step on a local grid of planes `nx * ny`: planes `z_start..z_end` of
/// `a_new` get the average of the six neighbours in `a` (boundary lines untouched); the
/// first and last computed planes are also stored to `push_first` / `push_last` when not
/// null (a neighbour's halo planes: peer stores).
pub static STENCIL7_STEP: Kernel =
    Kernel::new("stencil7_step").with_cuda(STENCIL3D_SRC).with_host(stencil3d_host).with_block(256);

/// Runs one 3-D step (see [`STENCIL7_STEP`]) over planes `z_start..z_end`.
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn stencil7_step(
    dev: &Device<'_>,
    nx: usize,
    ny: usize,
    z_start: usize,
    z_end: usize,
    planes_per_thread: usize,
    a: DeviceSlice<'_, f32>,
    a_new: DeviceSlice<'_, f32>,
    push_first: DevicePtr,
    push_last: DevicePtr,
) -> Result<()> {
    let need = z_end.checked_add(1).and_then(|p| p.checked_mul(nx)?.checked_mul(ny)).ok_or_else(|| {
        Error::Overflow {
            routine: "stencil7_step",
            what: format!("a grid of {z_end} + 1 planes of {nx} x {ny}"),
        }
    })?;
    if a.len() < need || a_new.len() < need || z_start == 0 || z_end < z_start || nx < 3 || ny < 3 {
        return Err(Error::KernelArgument {
            kernel: "stencil7_step",
            index: 0,
            what: format!(
                "grids of {} / {} elements for planes {z_start}..{z_end} of {nx} x {ny}",
                a.len(),
                a_new.len()
            ),
        });
    }
    views_apart("stencil7_step", &[a, a_new])?;
    let planes = planes_per_thread.max(1);
    let n = (nx - 2) * (ny - 2) * (z_end - z_start).div_ceil(planes);
    let u = |v: usize| v as u64;
    dev.launch(
        &STENCIL7_STEP,
        n,
        (a, a_new, u(nx), u(ny), u(z_start), u(z_end), u(planes), push_first, push_last),
    )
}
