//! Kernels on one host device beside the C they replace (`benches/c/host_kernels.c`, built
//! with gcc's `parallel for` and with clang-19 on libomptarget's host plugin by
//! `scripts/host-kernels.sh`, which runs the three sides in turn and prints the table of
//! docs/PERFORMANCE.md): saxpy at 2^16, 2^20 and 2^24 (generated and hand-written), Jacobi
//! 2048^2 x 100 with the norm each step (tuned, generated and teams kernels), the 3-D
//! 7-point stencil of `examples/stencil3d.rs` at 256^3 x 100 (its tuned kernel), a row-wise
//! layer normalisation at 8192 x 768 (its teams form, a team of 256 per row with per-team
//! tree reductions, and its 1-D form, a row per work item) and a row-wise softmax.
//!
//! Each case prints `side<TAB>case<TAB>size<TAB>median seconds` over the samples, the C
//! twin's format: `cargo bench -p offload-benches --bench host_kernels [-- CASE]`, CASE one
//! of saxpy, jacobi, stencil3d, layernorm, softmax.

use std::time::Instant;

use offload::{map, Device, Runtime};
use offload_benches::median;
use offload_examples::jacobi::{solve, Args, KernelChoice};
use offload_kernels::generated::saxpy;

/// Samples per case (the C twin's count), Jacobi's fewer: each is a whole run.
const SAMPLES: usize = 11;
const JACOBI_SAMPLES: usize = 5;

/// Team size of the teams layer normalisation.
const TEAM: usize = 256;

/// Layer normalisation of row `row` (`cols` columns) in the teams form: the team's threads
/// stride over the row, and two tree reductions in team-local memory give the mean and the
/// variance (as a CUDA block would).
#[offload::kernel(teams = 256)]
fn layernorm_teams(row: usize, thread: usize, cols: usize, x: &[f32], g: &[f32], b: &[f32], y: &mut [f32]) {
    let mut part: [f32; 256] = offload::team_local();
    let base = row * cols;
    let mut s = 0.0f32;
    let mut c = thread;
    while c < cols {
        s += x[base + c];
        c += 256;
    }
    part[thread] = s;
    offload::barrier();
    for k in 0..8u32 {
        let w = 128usize >> k;
        if thread < w {
            part[thread] += part[thread + w];
        }
        offload::barrier();
    }
    let mean = part[0] / cols as f32;
    offload::barrier();
    let mut v = 0.0f32;
    c = thread;
    while c < cols {
        let d = x[base + c] - mean;
        v += d * d;
        c += 256;
    }
    part[thread] = v;
    offload::barrier();
    for k in 0..8u32 {
        let w = 128usize >> k;
        if thread < w {
            part[thread] += part[thread + w];
        }
        offload::barrier();
    }
    let inv = 1.0f32 / (part[0] / cols as f32 + 1e-5f32).sqrt();
    c = thread;
    while c < cols {
        y[base + c] = (x[base + c] - mean) * inv * g[c] + b[c];
        c += 256;
    }
}

/// The same normalisation in the 1-D form: a row per work item.
#[offload::kernel(dims = 1)]
fn layernorm_rows(row: usize, cols: usize, x: &[f32], g: &[f32], b: &[f32], y: &mut [f32]) {
    let base = row * cols;
    let mut mean = 0.0f32;
    for c in 0..cols {
        mean += x[base + c];
    }
    mean /= cols as f32;
    let mut var = 0.0f32;
    for c in 0..cols {
        let d = x[base + c] - mean;
        var += d * d;
    }
    let inv = 1.0f32 / (var / cols as f32 + 1e-5f32).sqrt();
    for c in 0..cols {
        y[base + c] = (x[base + c] - mean) * inv * g[c] + b[c];
    }
}

/// Row-wise softmax, a row per work item.
#[offload::kernel(dims = 1)]
fn softmax_rows(row: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    let base = row * cols;
    let mut m = f32::NEG_INFINITY;
    for c in 0..cols {
        m = m.max(x[base + c]);
    }
    let mut sum = 0.0f32;
    for c in 0..cols {
        sum += (x[base + c] - m).exp();
    }
    for c in 0..cols {
        y[base + c] = (x[base + c] - m).exp() / sum;
    }
}

fn report(side: &str, case: &str, size: usize, samples: Vec<f64>) {
    println!("offload-{side}\t{case}\t{size}\t{:.9}", median(samples));
}

/// `samples` timings of `f` after one untimed run.
fn timed(
    samples: usize,
    mut f: impl FnMut() -> Result<(), offload::Error>,
) -> Result<Vec<f64>, offload::Error> {
    f()?;
    (0..samples)
        .map(|_| {
            let t0 = Instant::now();
            f().map(|()| t0.elapsed().as_secs_f64())
        })
        .collect()
}

fn saxpy_cases(rt: &Runtime, dev: &Device<'_>) -> Result<(), offload::Error> {
    for n in [1usize << 16, 1 << 20, 1 << 24] {
        let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
        let mut y = vec![1f32; n];
        let reps = if n >= 1 << 22 {
            4
        } else if n >= 1 << 18 {
            64
        } else {
            512
        };
        dev.data((map::to(&x), map::tofrom(&mut y)), |(xv, yv)| {
            let per_launch = |t: Vec<f64>| t.into_iter().map(|s| s / reps as f64).collect::<Vec<_>>();
            let generated = timed(SAMPLES, || {
                for _ in 0..reps {
                    saxpy::launch(dev, n, 0.5, xv, yv)?;
                }
                rt.synchronize(dev.number())
            })?;
            report("generated", "saxpy", n, per_launch(generated));
            let hand = timed(SAMPLES, || {
                for _ in 0..reps {
                    dev.launch(&offload_kernels::SAXPY, n, (0.5f32, xv, yv))?;
                }
                rt.synchronize(dev.number())
            })?;
            report("hand-written", "saxpy", n, per_launch(hand));
            Ok(())
        })?;
    }
    Ok(())
}

fn jacobi_cases(rt: &Runtime) -> Result<(), offload::Error> {
    for (side, kernel) in [
        ("tuned", KernelChoice::Tuned),
        ("generated", KernelChoice::Generated),
        ("teams", KernelChoice::Teams),
    ] {
        let args = Args {
            nx: 2048,
            ny: 2048,
            niter: 100,
            nccheck: 1,
            csv: true,
            ndev: Some(1),
            kernel,
            ..Args::default()
        };
        let mut samples = Vec::new();
        for _ in 0..=JACOBI_SAMPLES {
            samples.push(solve(rt, &[0], &args)?.seconds);
        }
        samples.remove(0);
        report(side, "jacobi", 2048 * 2048, samples);
    }
    Ok(())
}

fn stencil_case(rt: &Runtime) -> Result<(), offload::Error> {
    let args = offload_examples::stencil3d::Args {
        nx: 256,
        ny: 256,
        nz: 256,
        niter: 100,
        ndev: Some(1),
        csv: true,
        ..Default::default()
    };
    let mut samples = Vec::new();
    for _ in 0..=JACOBI_SAMPLES {
        samples.push(offload_examples::stencil3d::solve(rt, &[0], &args)?.0);
    }
    samples.remove(0);
    report("tuned", "stencil3d", 256 * 256 * 256, samples);
    Ok(())
}

fn row_cases(rt: &Runtime, dev: &Device<'_>, case: &str) -> Result<(), offload::Error> {
    let (rows, cols) = (8192usize, 768usize);
    let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 7) % 101) as f32 * 0.01).collect();
    let g: Vec<f32> = (0..cols).map(|c| 1.0 + 0.001 * c as f32).collect();
    let b: Vec<f32> = (0..cols).map(|c| 0.01 * (c % 5) as f32).collect();
    let mut y = vec![0f32; rows * cols];
    let sync = || rt.synchronize(dev.number());
    dev.data((map::to(&x), map::to(&g), map::to(&b), map::from(&mut y)), |(x, g, b, y)| {
        if case == "layernorm" {
            let teams = timed(SAMPLES, || {
                layernorm_teams::launch(dev, rows, cols, x, g, b, y)?;
                sync()
            })?;
            report("teams", case, rows * cols, teams);
            let flat = timed(SAMPLES, || {
                layernorm_rows::launch(dev, rows, cols, x, g, b, y)?;
                sync()
            })?;
            report("1-d", case, rows * cols, flat);
        } else {
            let flat = timed(SAMPLES, || {
                softmax_rows::launch(dev, rows, cols, x, y)?;
                sync()
            })?;
            report("1-d", case, rows * cols, flat);
        }
        Ok(())
    })?;
    // The two layer normalisations agree with each other (checked once, outside timing).
    if case == "layernorm" {
        let mut z = vec![0f32; rows * cols];
        dev.data((map::to(&x), map::to(&g), map::to(&b), map::from(&mut z)), |(x, g, b, z)| {
            layernorm_teams::launch(dev, rows, cols, x, g, b, z)
        })?;
        let worst = y.iter().zip(&z).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-4, "teams and 1-D layer norms differ by {worst}");
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !offload_benches::measuring() {
        return Ok(());
    }
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let want = |case: &str| only.as_deref().is_none_or(|o| o == case);
    let rt = Runtime::builder().host_devices(1).build()?;
    let dev = rt.device(0)?;
    assert_eq!(TEAM, layernorm_teams::KERNEL.block() as usize);
    if want("saxpy") {
        saxpy_cases(&rt, &dev)?;
    }
    if want("jacobi") {
        jacobi_cases(&rt)?;
    }
    if want("stencil3d") {
        stencil_case(&rt)?;
    }
    for case in ["layernorm", "softmax"] {
        if want(case) {
            row_cases(&rt, &dev, case)?;
        }
    }
    Ok(())
}
