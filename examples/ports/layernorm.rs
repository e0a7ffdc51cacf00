//! Port of `examples/ports/c/layernorm.c` (our own OpenMP program, the teams form of a
//! row-wise layer normalisation): a team per row, the team size `bs` chosen at run time
//! (`teams = ..=1024`: one kernel for every size, as the C's `thread_limit(bs)`), its
//! `parallel for` loops as block-stride loops over `offload::team_size()`, and its two
//! `reduction(+)`s as `offload::team_sum`. The same inputs, output lines and timing (the
//! C's `omp_get_wtime` is `Runtime::wtime`); `scripts/differential.sh` compares the lines
//! with the C program's on libomptarget's host plugin.
//!
//! ```text
//! cargo run --release -p offload-examples --example port_layernorm -- [rows] [width] [bs] [reps] [-device D]
//! ```

#[path = "common.rs"]
mod common;

use common::{c_exp, Options};
use offload::map;

/// One row per team: `parallel for reduction(+: sum)`, `reduction(+: sq)`, then the
/// scaled row, each loop split over the team's threads by its size.
#[offload::kernel(teams = ..=1024)]
#[allow(clippy::too_many_arguments)]
fn layernorm(
    row: usize,
    t: usize,
    w: usize,
    eps: f32,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    y: &mut [f32],
) {
    let ts: usize = offload::team_size();
    let mut s = 0.0f32;
    for c in (t..w).step_by(ts) {
        s += x[row * w + c];
    }
    let sum = offload::team_sum(s);
    let mean = sum / w as f32;
    let mut q = 0.0f32;
    for c in (t..w).step_by(ts) {
        let d = x[row * w + c] - mean;
        q += d * d;
    }
    let sq = offload::team_sum(q);
    let rstd = 1.0f32 / (sq / w as f32 + eps).sqrt();
    for c in (t..w).step_by(ts) {
        y[row * w + c] = (x[row * w + c] - mean) * rstd * gamma[c] + beta[c];
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "port_layernorm [rows] [width] [bs (1 to 1024)] [reps] [-device D]";
    let o = Options::parse(&[])?;
    o.only(&["device"], usage)?;
    let arg = |k: usize, default: usize| -> Result<usize, String> {
        o.positional.get(k).map_or(Ok(default), |v| v.parse().map_err(|_| format!("{v:?}: {usage}")))
    };
    let (rows, w, bs, reps) = (arg(0, 4096)?, arg(1, 128)?, arg(2, 256)?, arg(3, 10)?);
    if rows < 1 || w < 1 || !(1..=1024).contains(&bs) || reps < 1 {
        return Err(usage.into());
    }
    let eps = 1e-5f32;
    let n = rows * w;
    let x: Vec<f32> = (0..n).map(|i| ((i * 7 + i / w * 3) % 3) as f32 - 1.0).collect();
    let gamma: Vec<f32> = (0..w).map(|c| 1.0 + c as f32 / 256.0).collect();
    let beta: Vec<f32> = (0..w).map(|c| c as f32 / 512.0 - 0.125).collect();
    let mut y = vec![0f32; n];

    let (rt, dev) = common::runtime(&o)?;
    let gpu = rt.device(dev)?;
    // #pragma omp target data map(to: x, gamma, beta) map(from: y)
    let t =
        gpu.data((map::to(&x), map::to(&gamma), map::to(&beta), map::from(&mut y)), |(xv, gv, bv, yv)| {
            let mut t0 = 0.0;
            // One warm-up normalisation, then `reps` timed.
            for r in 0..=reps {
                if r == 1 {
                    t0 = rt.wtime()?;
                }
                // #pragma omp target teams distribute num_teams(rows) thread_limit(bs)
                layernorm::launch(&gpu, rows, bs, w, eps, xv, gv, bv, yv)?;
            }
            Ok((rt.wtime()? - t0) / reps as f64)
        })?;
    println!("# time per normalisation: {:.3} ms", t * 1e3);
    let total: f64 = y.iter().map(|&v| f64::from(v)).sum();
    println!("rows {rows} width {w}");
    println!("checksum {}", c_exp(total, 17));
    for r in [0, rows / 2, rows - 1] {
        let yr = &y[r * w..(r + 1) * w];
        let e = |v: f32| c_exp(f64::from(v), 9);
        println!("row {r}: {} {} {} {}", e(yr[0]), e(yr[1]), e(yr[w / 2]), e(yr[w - 1]));
    }
    Ok(())
}
