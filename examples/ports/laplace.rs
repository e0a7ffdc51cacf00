//! Port of HeCBench's `laplace-omp` (Kyle Niemeyer's red-black Gauss-Seidel with SOR for
//! Laplace's equation on a `NUM x NUM` plate, red and black cells in separate arrays).
//! Kept as the original has it: per iteration the red kernel (`collapse(2)`, `row` outer,
//! `col` inner) writing each cell's squared update into `bl_norm_L2`, a `reduction(+:
//! norm_L2)` over that array, the black kernel and the same reduction again; the norm is
//! read by the host every iteration and ends the loop under 1e-6. The same coefficients,
//! prints, `temperature.dat` and (with `-check`) the CPU reference and `PASS`/`FAIL`. See
//! `examples/ports/README.md`.
//!
//! ```text
//! cargo run --release -p offload-examples --example port_laplace -- [-n 1024] [-reps 1] [-warmup 20] [-out temperature.dat] [-check]
//! ```

#[path = "common.rs"]
mod common;

use std::io::Write;

use common::{c_exp, median, Options};
use offload::{map, Device};

/// SOR relaxation parameter.
const OMEGA: f32 = 1.85;

/// The red half-sweep: the original's first target region (`row` in `1..=NUM/2` outer,
/// `col` in `1..=NUM` inner). `coef` holds the original's `aP`, `aW`, `aE`, `aS`, `aN` and
/// `b` one after the other (written when a kernel took at most 16 values; six arrays apart,
/// 23 values, are fine now).
#[offload::kernel(dims = 2)]
#[allow(clippy::too_many_arguments)]
fn red_kernel(
    row: usize,
    col: usize,
    num: usize,
    omega: f32,
    coef: &[f32],
    temp_black: &[f32],
    temp_red: &mut [f32],
    bl_norm_l2: &mut [f32],
) {
    let half: usize = (num >> 1) + 2;
    let size: usize = num * num;
    let ind_red: usize = col * half + row;
    let ind: usize = 2 * row - (col & 1) - 1 + num * (col - 1);
    let temp_old: f32 = temp_red[ind_red];
    let res: f32 = coef[5 * size + ind]
        + (coef[size + ind] * temp_black[row + (col - 1) * half]
            + coef[2 * size + ind] * temp_black[row + (col + 1) * half]
            + coef[3 * size + ind] * temp_black[row - (col & 1) + col * half]
            + coef[4 * size + ind] * temp_black[row + ((col + 1) & 1) + col * half]);
    let temp_new: f32 = temp_old * (1.0f32 - omega) + omega * (res / coef[ind]);
    temp_red[ind_red] = temp_new;
    let d: f32 = temp_new - temp_old;
    bl_norm_l2[ind_red] = d * d;
}

/// The black half-sweep, as the red one with the colours exchanged.
#[offload::kernel(dims = 2)]
#[allow(clippy::too_many_arguments)]
fn black_kernel(
    row: usize,
    col: usize,
    num: usize,
    omega: f32,
    coef: &[f32],
    temp_red: &[f32],
    temp_black: &mut [f32],
    bl_norm_l2: &mut [f32],
) {
    let half: usize = (num >> 1) + 2;
    let size: usize = num * num;
    let ind_black: usize = col * half + row;
    let ind: usize = 2 * row - ((col + 1) & 1) - 1 + num * (col - 1);
    let temp_old: f32 = temp_black[ind_black];
    let res: f32 = coef[5 * size + ind]
        + (coef[size + ind] * temp_red[row + (col - 1) * half]
            + coef[2 * size + ind] * temp_red[row + (col + 1) * half]
            + coef[3 * size + ind] * temp_red[row - ((col + 1) & 1) + col * half]
            + coef[4 * size + ind] * temp_red[row + (col & 1) + col * half]);
    let temp_new: f32 = temp_old * (1.0f32 - omega) + omega * (res / coef[ind]);
    temp_black[ind_black] = temp_new;
    let d: f32 = temp_new - temp_old;
    bl_norm_l2[ind_black] = d * d;
}

/// `norm_L2 += bl_norm_L2[i]`: the original's `reduction(+:norm_L2)` target region.
#[offload::kernel(reduction(+: norm_l2))]
fn add_norm(i: usize, bl_norm_l2: &[f32], norm_l2: &mut f32) {
    *norm_l2 += bl_norm_l2[i];
}

/// The coefficient arrays and right-hand side of `fill_coeffs`.
struct Coeffs {
    a_p: Vec<f32>,
    a_w: Vec<f32>,
    a_e: Vec<f32>,
    a_s: Vec<f32>,
    a_n: Vec<f32>,
    b: Vec<f32>,
}

/// `fill_coeffs(NUM, NUM, th_cond, dx, dy, width, TN, ...)`.
#[allow(clippy::too_many_arguments)]
fn fill_coeffs(rowmax: usize, colmax: usize, th_cond: f32, dx: f32, dy: f32, width: f32, tn: f32) -> Coeffs {
    let size = rowmax * colmax;
    let mut c = Coeffs {
        a_p: vec![0.0; size],
        a_w: vec![0.0; size],
        a_e: vec![0.0; size],
        a_s: vec![0.0; size],
        a_n: vec![0.0; size],
        b: vec![0.0; size],
    };
    for col in 0..colmax {
        for row in 0..rowmax {
            let ind = col * rowmax + row;
            c.b[ind] = 0.0;
            let mut sp = 0.0f32;
            if col == 0 {
                c.a_w[ind] = 0.0;
                sp = -2.0 * th_cond * width * dy / dx;
            } else {
                c.a_w[ind] = th_cond * width * dy / dx;
            }
            if col == colmax - 1 {
                c.a_e[ind] = 0.0;
                sp = -2.0 * th_cond * width * dy / dx;
            } else {
                c.a_e[ind] = th_cond * width * dy / dx;
            }
            if row == 0 {
                c.a_s[ind] = 0.0;
                sp = -2.0 * th_cond * width * dx / dy;
            } else {
                c.a_s[ind] = th_cond * width * dx / dy;
            }
            if row == rowmax - 1 {
                c.a_n[ind] = 0.0;
                c.b[ind] = 2.0 * th_cond * width * dx * tn / dy;
                sp = -2.0 * th_cond * width * dx / dy;
            } else {
                c.a_n[ind] = th_cond * width * dx / dy;
            }
            c.a_p[ind] = c.a_w[ind] + c.a_e[ind] + c.a_s[ind] + c.a_n[ind] - sp;
        }
    }
    c
}

/// What one solve gives.
struct Run {
    iters: usize,
    seconds: f64,
    norm: f32,
    temp_red: Vec<f32>,
    temp_black: Vec<f32>,
}

/// The original's iteration loop inside its `target data` region; its progress lines are
/// printed when `print`.
fn solve(
    gpu: &Device<'_>,
    num: usize,
    c: &Coeffs,
    it_max: usize,
    print: bool,
) -> Result<Run, offload::Error> {
    let size = num * num;
    let size_temp = (num / 2 + 2) * (num + 2);
    let tol = 1.0e-6f32;
    let mut temp_red = vec![0f32; size_temp];
    let mut temp_black = vec![0f32; size_temp];
    let mut bl_norm_l2 = vec![0f32; size_temp];
    let mut iter = 1;
    let mut last = 0f32;
    // #pragma omp target data map(to: aP, aW, aE, aS, aN, b (as one array), bl_norm_L2) map(tofrom: temp_red, temp_black)
    let coef: Vec<f32> = [&c.a_p[..], &c.a_w, &c.a_e, &c.a_s, &c.a_n, &c.b].concat();
    let maps = (
        map::to(&coef),
        map::to_mut(&mut bl_norm_l2),
        map::tofrom(&mut temp_red),
        map::tofrom(&mut temp_black),
    );
    let seconds = gpu.data(maps, |(coef, bl, red, black)| {
        let start = gpu.runtime().wtime()?;
        let space = (1..num / 2 + 1, 1..num + 1);
        while iter <= it_max {
            let mut norm_l2 = [0f32];
            red_kernel::launch(gpu, space.clone(), num, OMEGA, coef, black, red, bl)?;
            gpu.data(map::tofrom(&mut norm_l2), |n| add_norm::launch(gpu, size_temp, bl, n))?;
            black_kernel::launch(gpu, space.clone(), num, OMEGA, coef, red, black, bl)?;
            gpu.data(map::tofrom(&mut norm_l2), |n| add_norm::launch(gpu, size_temp, bl, n))?;
            last = (norm_l2[0] / size as f32).sqrt();
            if print && iter % 1000 == 0 {
                println!("{iter:5}, {last:0.6}");
            }
            if last < tol {
                break;
            }
            iter += 1;
        }
        // The original's omp_get_wtime: read after the device has run what the loop queued
        // (its constructs are synchronous; the CUDA version's cudaDeviceSynchronize).
        Ok(gpu.runtime().wtime()? - start)
    })?;
    Ok(Run { iters: iter, seconds, norm: last, temp_red, temp_black })
}

/// `red_ref` and `black_ref` of the original's `reference.h`, one sweep each; the sum of
/// both squared-update sums.
fn reference_sweep(num: usize, c: &Coeffs, red: &mut [f32], black: &mut [f32]) -> f32 {
    let half = (num >> 1) + 2;
    let mut norm = 0f32;
    for col in 1..=num {
        for row in 1..=num / 2 {
            let ind_red = col * half + row;
            let ind = 2 * row - (col & 1) - 1 + num * (col - 1);
            let old = red[ind_red];
            let res = c.b[ind]
                + c.a_w[ind] * black[row + (col - 1) * half]
                + c.a_e[ind] * black[row + (col + 1) * half]
                + c.a_s[ind] * black[row - (col & 1) + col * half]
                + c.a_n[ind] * black[row + ((col + 1) & 1) + col * half];
            let new = old * (1.0 - OMEGA) + OMEGA * (res / c.a_p[ind]);
            red[ind_red] = new;
            norm += (new - old) * (new - old);
        }
    }
    let mut norm_b = 0f32;
    for row in 1..=num / 2 {
        for col in 1..=num {
            let ind_black = col * half + row;
            let ind = 2 * row - ((col + 1) & 1) - 1 + num * (col - 1);
            let old = black[ind_black];
            let res = c.b[ind]
                + c.a_w[ind] * red[row + (col - 1) * half]
                + c.a_e[ind] * red[row + (col + 1) * half]
                + c.a_s[ind] * red[row - ((col + 1) & 1) + col * half]
                + c.a_n[ind] * red[row + (col & 1) + col * half];
            let new = old * (1.0 - OMEGA) + OMEGA * (res / c.a_p[ind]);
            black[ind_black] = new;
            norm_b += (new - old) * (new - old);
        }
    }
    norm + norm_b
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "port_laplace [-n NUM] [-reps R] [-warmup W] [-it_max M] [-out FILE|-] [-check] [-device D]";
    let o = Options::parse(&["check"])?;
    o.only(&["n", "reps", "warmup", "it_max", "out", "check", "device"], usage)?;
    let num: usize = o.num("n", 1024)?;
    let reps: usize = o.num("reps", 1)?.max(1);
    let warmup: usize = o.num("warmup", 20)?;
    let it_max: usize = o.num("it_max", 1_000_000)?;
    let out = o.text("out", "temperature.dat");
    if num < 4 || !num.is_multiple_of(2) {
        return Err("-n must be even and at least 4".into());
    }
    let (l, h, width, th_cond, tn) = (1.0f32, 1.0f32, 0.01f32, 1.0f32, 1.0f32);
    let (dx, dy) = (l / num as f32, h / num as f32);
    let c = fill_coeffs(num, num, th_cond, dx, dy, width, tn);

    let (rt, dev) = common::runtime(&o)?;
    let gpu = rt.device(dev)?;
    println!(
        "laplace port: device {dev} ({} devices), {reps} runs after {warmup} warm-up iterations",
        rt.num_devices()
    );
    println!("Problem size: {num} x {num} ");
    if warmup > 0 {
        solve(&gpu, num, &c, warmup, false)?;
    }
    let mut per_iter = Vec::new();
    let mut last = None;
    for r in 0..reps {
        let run = solve(&gpu, num, &c, it_max, r + 1 == reps)?;
        let t = run.seconds / run.iters as f64;
        if reps > 1 {
            println!(
                "run {r}: {} iterations, {:.6} s, {:.3} us per iteration",
                run.iters,
                run.seconds,
                t * 1e6
            );
        }
        per_iter.push(t);
        last = Some(run);
    }
    let run = last.expect("at least one run");
    let t = median(&per_iter);
    println!("Total time for {} iterations: {:.6} s", run.iters, t * run.iters as f64);

    // The original always runs the CPU reference (as long again as the GPU loop, serially
    // here); the port does with -check.
    let reference = o.has("check").then(|| {
        let size_temp = (num / 2 + 2) * (num + 2);
        let (mut red, mut black) = (vec![0f32; size_temp], vec![0f32; size_temp]);
        for _ in 1..=it_max {
            let norm = (reference_sweep(num, &c, &mut red, &mut black) / (num * num) as f32).sqrt();
            if norm < 1.0e-6 {
                break;
            }
        }
        (red, black)
    });

    let mut count = 0;
    let half_rows = num / 2 + 2;
    let mut file =
        (out != "-").then(|| std::fs::File::create(&out).map(std::io::BufWriter::new)).transpose()?;
    if let Some(f) = file.as_mut() {
        writeln!(f, "#x\ty\ttemp(K)")?;
    }
    let mut checksum = 0f64;
    for row in 1..num + 1 {
        for col in 1..num + 1 {
            let x_pos = (col - 1) as f32 * dx + (dx / 2.0);
            let y_pos = (row - 1) as f32 * dy + (dy / 2.0);
            let (v, want) = if (row + col) % 2 == 0 {
                let ind = col * half_rows + (row + (col % 2)) / 2;
                (run.temp_red[ind], reference.as_ref().map(|r| r.0[ind]))
            } else {
                let ind = col * half_rows + (row + ((col + 1) % 2)) / 2;
                (run.temp_black[ind], reference.as_ref().map(|r| r.1[ind]))
            };
            if want.is_some_and(|w| v - w >= 1e-3) {
                count += 1;
            }
            checksum += v as f64;
            if let Some(f) = file.as_mut() {
                writeln!(f, "{x_pos:.6}\t{y_pos:.6}\t{v:.6}")?;
            }
        }
        if let Some(f) = file.as_mut() {
            writeln!(f)?;
        }
    }
    if let Some(f) = file.as_mut() {
        f.flush()?;
    }
    println!(
        "ports-result: per_iteration_us {:.3} iterations {} norm {} temperature_sum {}",
        t * 1e6,
        run.iters,
        c_exp(run.norm as f64, 6),
        c_exp(checksum, 9)
    );
    match reference {
        Some(_) => println!("{}", if count == 0 { "PASS" } else { "FAIL" }),
        None => println!("reference not run (-check runs it)"),
    }
    if count != 0 {
        return Err(format!("{count} cells differ from the CPU reference").into());
    }
    Ok(())
}
