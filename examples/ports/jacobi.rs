//! Port of HeCBench's `jacobi-omp` (NVIDIA's 2-D Jacobi teaching example): a 5-point
//! Jacobi relaxation on an `N x N` grid with sine boundaries, the L2 norm of the update
//! reduced every iteration (`reduction(+: error) map(tofrom: error)`), iterated until it
//! falls under 1e-5 (at most 10 000 iterations). Kept as the original has it: the same
//! two target regions per iteration (the step, `collapse(2)` with `i` outer and the
//! contiguous index `i + j * N` inner-strided; the copy back into `f_old`), the same
//! norm, prints and `PASS`/`FAIL`. See `examples/ports/README.md`.
//!
//! ```text
//! cargo run --release -p offload-examples --example port_jacobi -- [-n 2048] [-reps 3] [-warmup 20] [-max_iters 10000]
//! ```
//! It runs `-warmup` iterations once (kernel compilation, pools), then the whole solve
//! `-reps` times from the initial grid, and prints each run's time per iteration and
//! their median, then the original's lines for the last run.

#[path = "common.rs"]
mod common;

use common::{c_exp, g6, median, Options};
use offload::{map, Device};

/// One Jacobi step with its squared-update sum: the original's first target region,
/// `collapse(2)` over `i` (outer) and `j` (inner), `IDX(i, j) = i + j * N`.
#[offload::kernel(dims = 2, reduction(+: error))]
fn jacobi_step(i: usize, j: usize, n: usize, f_old: &[f32], f: &mut [f32], error: &mut f32) {
    let t: f32 = 0.25f32
        * (f_old[(i - 1) + j * n] + f_old[(i + 1) + j * n] + f_old[i + (j - 1) * n] + f_old[i + (j + 1) * n]);
    let df: f32 = t - f_old[i + j * n];
    f[i + j * n] = t;
    *error += df * df;
}

/// The original's second target region: `f_old = f` on the interior, `collapse(2)` over
/// `j` (outer) and `i` (inner) with the interior test inside.
#[offload::kernel(dims = 2)]
fn copy_back(j: usize, i: usize, n: usize, f: &[f32], f_old: &mut [f32]) {
    if j >= 1 && j <= n - 2 && i >= 1 && i <= n - 2 {
        f_old[i + j * n] = f[i + j * n];
    }
}

/// `initialize_data`: `sinf(j * 2 * M_PI / (N - 1))` on the left and right columns, the
/// same of `i` on the top and bottom rows, zero inside.
fn initialize_data(f: &mut [f32], n: usize) {
    for j in 0..n {
        for i in 0..n {
            f[i + j * n] = if i == 0 || i == n - 1 {
                ((j as f64 * 2.0 * std::f64::consts::PI / (n - 1) as f64) as f32).sin()
            } else if j == 0 || j == n - 1 {
                ((i as f64 * 2.0 * std::f64::consts::PI / (n - 1) as f64) as f32).sin()
            } else {
                0.0
            };
        }
    }
}

/// What one solve gives: iterations, seconds of the loop, the last error.
struct Run {
    iters: usize,
    seconds: f64,
    error: f32,
}

/// The original's `main` from the allocation to the end of the target data region; the
/// original's progress lines are printed when `print`.
fn solve(gpu: &Device<'_>, n: usize, max_iters: usize, print: bool) -> Result<Run, offload::Error> {
    let mut f = vec![0f32; n * n];
    let mut f_old = vec![0f32; n * n];
    initialize_data(&mut f, n);
    initialize_data(&mut f_old, n);
    let mut error = f32::MAX;
    let tolerance = 1.0e-5f32;
    let mut num_iters = 0;
    // #pragma omp target data map(to: f[0:N*N], f_old[0:N*N])
    let seconds = gpu.data((map::to_mut(&mut f), map::to_mut(&mut f_old)), |(f, f_old)| {
        let start = gpu.runtime().wtime()?;
        while error > tolerance && num_iters < max_iters {
            let mut err = [0f32];
            // #pragma omp target teams distribute parallel for collapse(2) reduction(+:error) map(tofrom: error)
            gpu.data(map::tofrom(&mut err), |e| {
                jacobi_step::launch(gpu, (1..n - 1, 1..n - 1), n, f_old, f, e)
            })?;
            // #pragma omp target teams distribute parallel for collapse(2)
            copy_back::launch(gpu, (0..n, 0..n), n, f, f_old)?;
            error = (err[0] / (n * n) as f32).sqrt();
            if print && num_iters % 1000 == 0 {
                println!("Error after iteration {num_iters} = {}", g6(error as f64));
            }
            num_iters += 1;
        }
        // The original's omp_get_wtime: read after the device has run what the loop queued
        // (its constructs are synchronous; the CUDA version's cudaDeviceSynchronize).
        Ok(gpu.runtime().wtime()? - start)
    })?;
    Ok(Run { iters: num_iters, seconds, error })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "port_jacobi [-n N] [-reps R] [-warmup W] [-max_iters M] [-device D]";
    let o = Options::parse(&[])?;
    o.only(&["n", "reps", "warmup", "max_iters", "device"], usage)?;
    let n: usize = o.num("n", 2048)?;
    let reps: usize = o.num("reps", 3)?.max(1);
    let warmup: usize = o.num("warmup", 20)?;
    let max_iters: usize = o.num("max_iters", 10000)?;
    if n < 3 {
        return Err("-n must be at least 3".into());
    }
    let (rt, dev) = common::runtime(&o)?;
    let gpu = rt.device(dev)?;
    println!(
        "jacobi port: {n} x {n}, device {dev} ({} devices), {reps} runs after {warmup} warm-up iterations",
        rt.num_devices()
    );
    if warmup > 0 {
        solve(&gpu, n, warmup, false)?;
    }
    let mut per_iter = Vec::new();
    let mut last = None;
    for r in 0..reps {
        let run = solve(&gpu, n, max_iters, r + 1 == reps)?;
        let t = run.seconds / run.iters.max(1) as f64;
        println!("run {r}: {} iterations, {:.3} us per iteration", run.iters, t * 1e6);
        per_iter.push(t);
        last = Some(run);
    }
    let run = last.expect("at least one run");
    let t = median(&per_iter);
    println!("Average execution time per iteration: {} (s)", g6(t));
    println!("iterations: {}, final error {}", run.iters, g6(run.error as f64));
    println!(
        "ports-result: per_iteration_us {:.3} iterations {} error {}",
        t * 1e6,
        run.iters,
        c_exp(run.error as f64, 6)
    );
    if run.error <= 1.0e-5 && run.iters < max_iters {
        println!("PASS");
        Ok(())
    } else {
        println!("FAIL");
        Err("did not converge".into())
    }
}
