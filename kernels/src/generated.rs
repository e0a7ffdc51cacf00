//! The kernels of this crate written once, in Rust, with `#[offload::kernel]`: each is a
//! module with `KERNEL` (the generated CUDA C and host twin), `launch` and `args`. The
//! typed launchers at the crate root ([`crate::saxpy`], [`crate::sum`], ...) run these.
//!
//! ```
//! use offload::{map, Runtime};
//! use offload_kernels::generated::sum_f32;
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let gpu = rt.device(0)?;
//! let x: Vec<f32> = (1..=100).map(|v| v as f32).collect();
//! let mut total = [0.5f32];
//! gpu.data((map::to(&x), map::tofrom(&mut total)), |(x, t)| sum_f32::launch(&gpu, x.len(), x, t))?;
//! assert_eq!(total[0], 5050.5);
//! # Ok::<(), offload::Error>(())
//! ```

/// `x[i] = v`.
#[offload::kernel]
pub fn fill_f32(i: usize, v: f32, x: &mut [f32]) {
    x[i] = v;
}

/// `x[i] = v`.
#[offload::kernel]
pub fn fill_i32(i: usize, v: i32, x: &mut [i32]) {
    x[i] = v;
}

/// `x[i] += v` (wrapping on GPUs, as C's unsigned arithmetic; a host device panics on
/// overflow in debug builds, as Rust does).
#[offload::kernel]
pub fn add_i32(i: usize, v: i32, x: &mut [i32]) {
    x[i] += v;
}

/// `x[i] *= a`.
#[offload::kernel]
pub fn scale_f32(i: usize, a: f32, x: &mut [f32]) {
    x[i] *= a;
}

/// `y[i] += a * x[i]`.
#[offload::kernel]
pub fn saxpy(i: usize, a: f32, x: &[f32], y: &mut [f32]) {
    y[i] += a * x[i];
}

/// `total += x[i]`: a `+` reduction (a shuffle tree per warp and one atomic per block on
/// GPUs; a `rayon` reduction on host devices).
#[offload::kernel(reduction(+: total))]
pub fn sum_f32(i: usize, x: &[f32], total: &mut f32) {
    *total += x[i];
}

/// `y[i] = act(y[i] + bias[i % features])`, `act` = ReLU when `relu`: a dense layer's
/// epilogue over rows of `features`.
#[offload::kernel(dims = 1)]
pub fn bias_act(i: usize, features: usize, relu: bool, y: &mut [f32], bias: &[f32]) {
    let s = y[i] + bias[i % features];
    y[i] = if relu { s.max(0.0) } else { s };
}

/// `y[i] = max(y[i], 0)`: ReLU in place.
#[offload::kernel]
pub fn relu(i: usize, y: &mut [f32]) {
    y[i] = y[i].max(0.0);
}

/// One Jacobi step at interior point `(iy, ix)` of a grid of `nx` columns whose computed
/// rows end at `iy_end`: `a_new` gets the 5-point average of `a` (in the order of NVIDIA's
/// kernel, so every variant gives the same bits), `norm` the squared update, and
/// `next_norm[0]` is zeroed (the other slot of a double-buffered norm). With `wrap` (one
/// device holds the whole periodic grid) the first and last computed rows are also stored
/// to the opposite halo rows, as the peer stores of the tuned kernel do.
///
/// Each GPU thread walks a strip of `rows = 4` rows (the default; the fastest of 1, 2, 4
/// and 8 on the H200, `benches/kernels.rs`).
#[offload::kernel(dims = 2, reduction(+: norm), rows = 4)]
#[allow(clippy::too_many_arguments)]
pub fn jacobi_step(
    iy: usize,
    ix: usize,
    nx: usize,
    iy_end: usize,
    wrap: bool,
    a: &[f32],
    a_new: &mut [f32],
    norm: &mut f32,
    next_norm: &mut [f32],
) {
    let c = iy * nx + ix;
    let v = 0.25f32 * (a[c + 1] + a[c - 1] + a[c + nx] + a[c - nx]);
    a_new[c] = v;
    if wrap {
        if iy == 1 {
            a_new[iy_end * nx + ix] = v;
        }
        if iy == iy_end - 1 {
            a_new[ix] = v;
        }
    }
    if iy == 1 && ix == 1 {
        next_norm[0] = 0.0;
    }
    let r = v - a[c];
    *norm += r * r;
}

/// Columns of a [`jacobi_teams()`] team.
pub const JACOBI_TEAM_COLUMNS: usize = 256;

/// One Jacobi step as a teams kernel (`#pragma omp target teams` + `parallel`), in the
/// shape of the hand-written kernel: a team takes [`JACOBI_TEAM_COLUMNS`] interior columns
/// (block `team % col_blocks`) of a strip of `strip_rows` rows (strip
/// `team / col_blocks`); each thread walks its column down the strip with the rows above
/// and below in registers, and reads its left and right neighbours from the team's copy of
/// the row in team-local memory (two buffers, so one barrier a row). `a_new`, `norm`,
/// `next_norm` and `wrap` as in [`jacobi_step()`]. Launched over
/// `col_blocks * ceil((iy_end - iy_start) / strip_rows)` teams.
#[offload::kernel(teams = 256, reduction(+: norm))]
#[allow(clippy::too_many_arguments)]
pub fn jacobi_teams(
    team: usize,
    thread: usize,
    nx: usize,
    iy_start: usize,
    iy_end: usize,
    strip_rows: usize,
    col_blocks: usize,
    wrap: bool,
    a: &[f32],
    a_new: &mut [f32],
    norm: &mut f32,
    next_norm: &mut [f32],
) {
    let mut row: [f32; 516] = offload::team_local();
    let ix = 1 + (team % col_blocks) * 256 + thread;
    let active = ix < nx - 1;
    // Threads past the last column shadow it (their loads stay in the grid).
    let x = if active { ix } else { nx - 2 };
    let iy0 = iy_start + (team / col_blocks) * strip_rows;
    let iy1 = (iy0 + strip_rows).min(iy_end);
    let mut up = a[(iy0 - 1) * nx + x];
    let mut center = a[iy0 * nx + x];
    for iy in iy0..iy1 {
        let buf = ((iy - iy0) % 2) * 258;
        if active {
            row[buf + thread + 1] = center;
            if thread == 0 {
                row[buf] = a[iy * nx + x - 1];
            }
            if thread == 255 || ix == nx - 2 {
                row[buf + thread + 2] = a[iy * nx + x + 1];
            }
        }
        offload::barrier();
        let down = a[(iy + 1) * nx + x];
        if active {
            let v = 0.25f32 * (row[buf + thread + 2] + row[buf + thread] + down + up);
            a_new[iy * nx + x] = v;
            if wrap {
                if iy == 1 {
                    a_new[iy_end * nx + x] = v;
                }
                if iy == iy_end - 1 {
                    a_new[x] = v;
                }
            }
            let r = v - center;
            *norm += r * r;
        }
        up = center;
        center = down;
    }
    if team == 0 && thread == 0 {
        next_norm[0] = 0.0;
    }
}

/// One 7-point step at interior point `(z, y, x)` of a grid of planes `ny x nx`: the
/// average of the six neighbours (in the tuned kernel's order).
#[offload::kernel(dims = 3)]
pub fn stencil7_step(z: usize, y: usize, x: usize, ny: usize, nx: usize, a: &[f32], a_new: &mut [f32]) {
    let plane = nx * ny;
    let i = z * plane + y * nx + x;
    a_new[i] =
        (1.0f32 / 6.0f32) * (a[i - 1] + a[i + 1] + a[i - nx] + a[i + nx] + a[i - plane] + a[i + plane]);
}

/// Every generated kernel of this module, both variants (plain and bounds-checked).
pub fn all() -> [&'static offload::Kernel; 22] {
    [
        &fill_f32::KERNEL,
        &fill_i32::KERNEL,
        &add_i32::KERNEL,
        &scale_f32::KERNEL,
        &saxpy::KERNEL,
        &sum_f32::KERNEL,
        &bias_act::KERNEL,
        &relu::KERNEL,
        &jacobi_step::KERNEL,
        &jacobi_teams::KERNEL,
        &stencil7_step::KERNEL,
        &fill_f32::KERNEL_CHECKED,
        &fill_i32::KERNEL_CHECKED,
        &add_i32::KERNEL_CHECKED,
        &scale_f32::KERNEL_CHECKED,
        &saxpy::KERNEL_CHECKED,
        &sum_f32::KERNEL_CHECKED,
        &bias_act::KERNEL_CHECKED,
        &relu::KERNEL_CHECKED,
        &jacobi_step::KERNEL_CHECKED,
        &jacobi_teams::KERNEL_CHECKED,
        &stencil7_step::KERNEL_CHECKED,
    ]
}
