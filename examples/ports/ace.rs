//! Port of HeCBench's `ace-omp` (a phase-field simulation of dendritic solidification: the
//! Allen-Cahn equation coupled with heat conduction on a 3-D grid). Kept as the original
//! has it: seven target regions per time step (force, Allen-Cahn, the phase boundaries,
//! the thermal equation, the temperature boundaries and two grid swaps), each
//! `collapse(3)` over `x`, `y`, `z` (`z` contiguous), `num_steps + 1` steps inside one
//! `target data` region; the `declare target` functions are `#[offload::device]`
//! functions (the gradients, which take arrays, are written out in the kernels). The
//! original prints only times; the port also prints the sums of the final `phi` and `u`,
//! which `scripts/gpu/ports.sh` has the originals print too. See `examples/ports/README.md`.
//!
//! ```text
//! cargo run --release -p offload-examples --example port_ace -- 100 [-size 400] [-reps 3] [-warmup 1]
//! ```

#[path = "common.rs"]
mod common;

use common::{c_exp, median, Options};
use offload::{map, Device};

/// `dFphi`.
#[offload::device]
fn d_fphi(phi: f64, u: f64, lambda: f64) -> f64 {
    -phi * (1.0f64 - phi * phi) + lambda * u * (1.0f64 - phi * phi) * (1.0f64 - phi * phi)
}

/// `An`: the anisotropy.
#[offload::device]
fn an(phix: f64, phiy: f64, phiz: f64, epsilon: f64) -> f64 {
    if phix != 0.0f64 || phiy != 0.0f64 || phiz != 0.0f64 {
        let sq: f64 = phix * phix + phiy * phiy + phiz * phiz;
        return (1.0f64 - 3.0f64 * epsilon)
            * (1.0f64
                + (((4.0f64 * epsilon) / (1.0f64 - 3.0f64 * epsilon))
                    * ((phix * phix * (phix * phix)
                        + phiy * phiy * (phiy * phiy)
                        + phiz * phiz * (phiz * phiz))
                        / (sq * sq))));
    }
    1.0f64 - ((5.0f64 / 3.0f64) * epsilon)
}

/// `Wn`.
#[offload::device]
fn wn(phix: f64, phiy: f64, phiz: f64, epsilon: f64, w0: f64) -> f64 {
    w0 * an(phix, phiy, phiz, epsilon)
}

/// `taun`.
#[offload::device]
fn taun(phix: f64, phiy: f64, phiz: f64, epsilon: f64, tau0: f64) -> f64 {
    let a: f64 = an(phix, phiy, phiz, epsilon);
    tau0 * (a * a)
}

/// `dFunc`.
#[offload::device]
fn d_func(l: f64, m: f64, n: f64) -> f64 {
    if l != 0.0f64 || m != 0.0f64 || n != 0.0f64 {
        let s: f64 = l * l + m * m + n * n;
        return ((l * l * l * (m * m + n * n)) - (l * (m * m * (m * m) + n * n * (n * n)))) / (s * s);
    }
    0.0f64
}

/// The model's constants reach the kernels as one slice `k` (written when a kernel took at
/// most 16 values; module `const` items would do now), in the order of
/// [`Params::constants`]: `k[0..3]` dx, dy, dz; `k[3]` dt; `k[4]` delta; `k[5]` epsilon;
/// `k[6]` W0; `k[7]` tau0; `k[8]` lambda; `k[9]` D.
/// `calculateForce`: over the whole grid, zero on its faces. `f` holds `Fx`, `Fy` and
/// `Fz` one after the other (the original's three arrays; one argument here, for the
/// limit above).
#[offload::kernel(dims = 3)]
fn calculate_force(ix: usize, iy: usize, iz: usize, n: usize, k: &[f64], phi: &[f64], f: &mut [f64]) {
    let c0: usize = (ix * n + iy) * n + iz;
    let vol: usize = n * n * n;
    if ix < n - 1 && iy < n - 1 && iz < n - 1 && ix > 0 && iy > 0 && iz > 0 {
        let epsilon: f64 = k[5];
        let w0: f64 = k[6];
        let phix: f64 = (phi[c0 + n * n] - phi[c0 - n * n]) / (2.0f64 * k[0]);
        let phiy: f64 = (phi[c0 + n] - phi[c0 - n]) / (2.0f64 * k[1]);
        let phiz: f64 = (phi[c0 + 1] - phi[c0 - 1]) / (2.0f64 * k[2]);
        let sq_gphi: f64 = phix * phix + phiy * phiy + phiz * phiz;
        let c: f64 = 16.0f64 * w0 * epsilon;
        let w: f64 = wn(phix, phiy, phiz, epsilon, w0);
        let w2: f64 = w * w;
        f[c0] = w2 * phix + sq_gphi * w * c * d_func(phix, phiy, phiz);
        f[vol + c0] = w2 * phiy + sq_gphi * w * c * d_func(phiy, phiz, phix);
        f[2 * vol + c0] = w2 * phiz + sq_gphi * w * c * d_func(phiz, phix, phiy);
    } else {
        f[c0] = 0.0f64;
        f[vol + c0] = 0.0f64;
        f[2 * vol + c0] = 0.0f64;
    }
}

/// `allenCahn`: the new phase on the interior.
#[offload::kernel(dims = 3)]
#[allow(clippy::too_many_arguments)]
fn allen_cahn(
    ix: usize,
    iy: usize,
    iz: usize,
    n: usize,
    k: &[f64],
    phinew: &mut [f64],
    phiold: &[f64],
    uold: &[f64],
    f: &[f64],
) {
    let c0: usize = (ix * n + iy) * n + iz;
    let sx: usize = n * n;
    let vol: usize = n * n * n;
    let dx: f64 = k[0];
    let dy: f64 = k[1];
    let dz: f64 = k[2];
    let phix: f64 = (phiold[c0 + sx] - phiold[c0 - sx]) / (2.0f64 * dx);
    let phiy: f64 = (phiold[c0 + n] - phiold[c0 - n]) / (2.0f64 * dy);
    let phiz: f64 = (phiold[c0 + 1] - phiold[c0 - 1]) / (2.0f64 * dz);
    let div: f64 = (f[c0 + sx] - f[c0 - sx]) / (2.0f64 * dx)
        + (f[vol + c0 + n] - f[vol + c0 - n]) / (2.0f64 * dy)
        + (f[2 * vol + c0 + 1] - f[2 * vol + c0 - 1]) / (2.0f64 * dz);
    phinew[c0] =
        phiold[c0] + (k[3] / taun(phix, phiy, phiz, k[5], k[7])) * (div - d_fphi(phiold[c0], uold[c0], k[8]));
}

/// `boundaryConditionsPhi` (and `boundaryConditionsU`): `value` on the grid's faces.
#[offload::kernel(dims = 3)]
fn boundary_conditions(ix: usize, iy: usize, iz: usize, n: usize, value: f64, c: &mut [f64]) {
    if ix == 0 || ix == n - 1 || iy == 0 || iy == n - 1 || iz == 0 || iz == n - 1 {
        c[(ix * n + iy) * n + iz] = value;
    }
}

/// `thermalEquation`: the new temperature on the interior.
#[offload::kernel(dims = 3)]
#[allow(clippy::too_many_arguments)]
fn thermal_equation(
    ix: usize,
    iy: usize,
    iz: usize,
    n: usize,
    k: &[f64],
    unew: &mut [f64],
    uold: &[f64],
    phinew: &[f64],
    phiold: &[f64],
) {
    let c0: usize = (ix * n + iy) * n + iz;
    let sx: usize = n * n;
    let dx: f64 = k[0];
    let dy: f64 = k[1];
    let dz: f64 = k[2];
    let u: f64 = uold[c0];
    let lap: f64 = (uold[c0 + sx] + uold[c0 - sx] - 2.0f64 * u) / (dx * dx)
        + (uold[c0 + n] + uold[c0 - n] - 2.0f64 * u) / (dy * dy)
        + (uold[c0 + 1] + uold[c0 - 1] - 2.0f64 * u) / (dz * dz);
    unew[c0] = u + 0.5f64 * (phinew[c0] - phiold[c0]) + k[3] * k[9] * lap;
}

/// `swapGrid`: exchanges two grids element by element (as the original, by a temporary:
/// `slice::swap` is not in the kernel subset).
#[offload::kernel(dims = 3)]
#[allow(clippy::manual_swap)]
fn swap_grid(ix: usize, iy: usize, iz: usize, n: usize, cnew: &mut [f64], cold: &mut [f64]) {
    let c0: usize = (ix * n + iy) * n + iz;
    let tmp: f64 = cnew[c0];
    cnew[c0] = cold[c0];
    cold[c0] = tmp;
}

/// The model's constants, as the original's `main` sets them.
struct Params {
    dx: f64,
    dy: f64,
    dz: f64,
    dt: f64,
    delta: f64,
    r0: f64,
    epsilon: f64,
    w0: f64,
    d: f64,
    lambda: f64,
    tau0: f64,
}

impl Params {
    /// The constants in the order the kernels read them (see the kernels).
    fn constants(&self) -> Vec<f64> {
        vec![
            self.dx,
            self.dy,
            self.dz,
            self.dt,
            self.delta,
            self.epsilon,
            self.w0,
            self.tau0,
            self.lambda,
            self.d,
        ]
    }

    fn new() -> Self {
        let (w0, beta0, d, d0) = (1.0f64, 0.0f64, 2.0f64, 0.5f64);
        let a1 = 1.25 / 2.0f64.sqrt();
        let a2 = 0.64;
        Self {
            dx: 0.4,
            dy: 0.4,
            dz: 0.4,
            dt: 0.01,
            delta: 0.8,
            r0: 5.0,
            epsilon: 0.07,
            w0,
            d,
            lambda: (w0 * a1) / d0,
            tau0: ((w0 * w0 * w0 * a1 * a2) / (d0 * d)) + ((w0 * w0 * beta0) / d0),
        }
    }
}

/// `initializationPhi` and `initializationU`.
fn initial(n: usize, p: &Params) -> (Vec<f64>, Vec<f64>) {
    let (mut phi, mut u) = (vec![0f64; n * n * n], vec![0f64; n * n * n]);
    let h = 0.5 * n as f64;
    for ix in 0..n {
        for iy in 0..n {
            for iz in 0..n {
                let r = ((ix as f64 - h).powi(2) + (iy as f64 - h).powi(2) + (iz as f64 - h).powi(2)).sqrt();
                let c = (ix * n + iy) * n + iz;
                phi[c] = if r < p.r0 { 1.0 } else { -1.0 };
                u[c] = if r < p.r0 { 0.0 } else { -p.delta * (1.0 - (-(r - p.r0)).exp()) };
            }
        }
    }
    (phi, u)
}

/// One run: the original's `target data` region and its time-step loop; the loop's
/// seconds and the sums of the final `phi` and `u`.
fn run(
    gpu: &Device<'_>,
    n: usize,
    num_steps: usize,
    p: &Params,
) -> Result<(f64, f64, f64, f64), offload::Error> {
    let (mut phi, mut u) = initial(n, p);
    let vol = n * n * n;
    let offload_start = gpu.runtime().wtime()?;
    let (mut phinew, mut unew) = (vec![0f64; vol], vec![0f64; vol]);
    let mut f = vec![0f64; 3 * vol];
    let k = p.constants();
    // #pragma omp target data map(tofrom: d_phiold, d_uold) map(alloc: d_phinew, d_unew, d_Fx, d_Fy, d_Fz)
    let maps = (
        map::tofrom(&mut phi),
        map::tofrom(&mut u),
        map::alloc_mut(&mut phinew),
        map::alloc_mut(&mut unew),
        map::alloc_mut(&mut f),
        map::to(&k),
    );
    let seconds = gpu.data(maps, |(phiold, uold, phinew, unew, f, k)| {
        let start = gpu.runtime().wtime()?;
        let (all, inner) = ((0..n, 0..n, 0..n), (1..n - 1, 1..n - 1, 1..n - 1));
        for _t in 0..=num_steps {
            calculate_force::launch(gpu, all.clone(), n, k, phiold, f)?;
            allen_cahn::launch(gpu, inner.clone(), n, k, phinew, phiold, uold, f)?;
            boundary_conditions::launch(gpu, all.clone(), n, -1.0, phinew)?;
            thermal_equation::launch(gpu, inner.clone(), n, k, unew, uold, phinew, phiold)?;
            boundary_conditions::launch(gpu, all.clone(), n, -p.delta, unew)?;
            swap_grid::launch(gpu, all.clone(), n, phinew, phiold)?;
            swap_grid::launch(gpu, all.clone(), n, unew, uold)?;
        }
        // The original's omp_get_wtime: read after the device has run what the loop queued
        // (its constructs are synchronous; the CUDA version's cudaDeviceSynchronize).
        Ok(gpu.runtime().wtime()? - start)
    })?;
    let offload = gpu.runtime().wtime()? - offload_start;
    Ok((seconds, offload, phi.iter().sum(), u.iter().sum()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "port_ace NUM_STEPS [-size N] [-reps R] [-warmup W] [-device D]";
    let o = Options::parse(&[])?;
    o.only(&["size", "reps", "warmup", "device"], usage)?;
    let num_steps: usize = match o.positional.first() {
        Some(s) => s.parse().map_err(|_| format!("NUM_STEPS wants a number, got {s:?}; usage: {usage}"))?,
        None => return Err(format!("usage: {usage}").into()),
    };
    let n: usize = o.num("size", 400)?;
    let reps: usize = o.num("reps", 3)?.max(1);
    let warmup: usize = o.num("warmup", 1)?;
    if n < 3 {
        return Err("-size must be at least 3".into());
    }
    let p = Params::new();
    let (rt, dev) = common::runtime(&o)?;
    let gpu = rt.device(dev)?;
    println!(
        "ace port: {n}^3, {num_steps} steps, device {dev} ({} devices), {reps} runs after a warm-up of {warmup} steps",
        rt.num_devices()
    );
    if warmup > 0 {
        run(&gpu, n, warmup - 1, &p)?;
    }
    let (mut kernel, mut offload) = (Vec::new(), Vec::new());
    let mut sums = (0.0, 0.0);
    for r in 0..reps {
        let (s, off, phi, u) = run(&gpu, n, num_steps, &p)?;
        if reps > 1 {
            println!("run {r}: {:.3} ms", s * 1e3);
        }
        kernel.push(s);
        offload.push(off);
        sums = (phi, u);
    }
    let t = median(&kernel);
    println!("Total kernel execution time: {:.3} (ms)", t * 1e3);
    println!("Offload time: {:.3} (ms)", median(&offload) * 1e3);
    let (phi, u) = (c_exp(sums.0, 9), c_exp(sums.1, 9));
    println!("checksum: phi {phi} u {u}");
    println!("ports-result: per_run_ms {:.3} phi_sum {phi} u_sum {u}", t * 1e3);
    Ok(())
}
