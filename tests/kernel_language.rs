//! The kernel language of `#[offload::kernel]` beyond loops over slices, on every device of
//! every backend: any number of arguments, module constants and the float types'
//! constants, device functions that take views (and sub-slices), `DeviceCopy` structs by
//! value and as elements, kernels written in OpenMP's loop order, and what a checked host
//! twin catches. Each result is compared with the same Rust function called on the host.

use offload::{map, Error};
use offload_tests::{cause, check, check_eq, on_every_device};

/// Twenty arguments (and 2 bounds, 10 lengths): past any tuple's arity.
#[offload::kernel]
#[allow(clippy::too_many_arguments)]
fn twenty(
    i: usize,
    a0: f32,
    a1: f32,
    a2: f64,
    a3: i32,
    a4: u32,
    a5: i64,
    a6: u64,
    a7: usize,
    a8: bool,
    a9: f32,
    x0: &[f32],
    x1: &[f64],
    x2: &[i32],
    x3: &[u32],
    x4: &[i64],
    x5: &[u64],
    x6: &[usize],
    x7: &[f32],
    x8: &[f32],
    y: &mut [f64],
) {
    let s: f64 =
        (a0 + a1 + a9) as f64 + a2 + (a3 as f64) + (a4 as f64) + (a5 as f64) + (a6 as f64) + (a7 as f64);
    let t: f64 = x0[i] as f64
        + x1[i]
        + x2[i] as f64
        + x3[i] as f64
        + x4[i] as f64
        + x5[i] as f64
        + x6[i] as f64
        + x7[i] as f64
        + x8[i] as f64;
    y[i] = if a8 { s + t } else { s - t };
}

#[test]
fn a_kernel_of_twenty_arguments() {
    on_every_device("20 arguments", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 1000;
        let f32s: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let f64s: Vec<f64> = (0..n).map(|i| 2.0 * i as f64).collect();
        let i32s: Vec<i32> = (0..n).map(|i| -(i as i32)).collect();
        let u32s: Vec<u32> = (0..n).map(|i| i as u32 * 3).collect();
        let i64s: Vec<i64> = (0..n).map(|i| i as i64 - 7).collect();
        let u64s: Vec<u64> = (0..n).map(|i| i as u64 + 9).collect();
        let usizes: Vec<usize> = (0..n).map(|i| i % 13).collect();
        let (g1, g2) = (vec![0.5f32; n], vec![0.25f32; n]);
        let mut y = vec![0.0f64; n];
        let mut want = vec![0.0f64; n];
        for i in 0..n {
            twenty(
                i, 1.5, 2.5, 3.0, -4, 5, -6, 7, 8, true, 0.5, &f32s, &f64s, &i32s, &u32s, &i64s, &u64s,
                &usizes, &g1, &g2, &mut want,
            );
        }
        let maps = (
            (map::to(&f32s), map::to(&f64s), map::to(&i32s), map::to(&u32s), map::to(&i64s)),
            (map::to(&u64s), map::to(&usizes), map::to(&g1), map::to(&g2), map::from(&mut y)),
        );
        gpu.data(maps, |((x0, x1, x2, x3, x4), (x5, x6, x7, x8, y))| {
            twenty::launch(
                &gpu, n, 1.5, 2.5, 3.0, -4, 5, -6, 7, 8, true, 0.5, x0, x1, x2, x3, x4, x5, x6, x7, x8, y,
            )
        })?;
        check_eq!(y, want);
        Ok(())
    });
}

/// A module constant, read by kernels (a value rustc computes is exact in C too).
const DT: f64 = 1e-3;
const STEPS: u32 = 3;
const FLAG: bool = true;
const SCALE: f32 = 1.0 / 3.0;

mod physics {
    /// A constant in another module.
    pub const GRAVITY: f64 = -9.81;
}

#[offload::kernel]
fn integrate(i: usize, v: &[f64], x: &mut [f64], f: &mut [f32]) {
    let mut p = x[i];
    for _ in 0..STEPS {
        p += DT * v[i] + DT * DT * physics::GRAVITY;
    }
    x[i] = if FLAG { p } else { 0.0 };
    f[i] = (i as f32) * SCALE + f32::EPSILON - f32::MIN_POSITIVE + (i as f32).tanh() + std::f32::consts::PI;
    // CUDA's functions Rust's standard library lacks.
    f[i] += offload::erf(i as f32 * 0.01) + offload::erfc(i as f64 * 0.001) as f32;
}

#[test]
fn module_constants_and_the_float_types_constants() {
    on_every_device("constants", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 500;
        let v: Vec<f64> = (0..n).map(|i| i as f64 * 0.1).collect();
        let mut x: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let mut f = vec![0.0f32; n];
        let (mut wx, mut wf) = (x.clone(), f.clone());
        for i in 0..n {
            integrate(i, &v, &mut wx, &mut wf);
        }
        gpu.data((map::to(&v), map::tofrom(&mut x), map::from(&mut f)), |(v, x, f)| {
            integrate::launch(&gpu, n, v, x, f)
        })?;
        check_eq!(x, wx);
        // tanh and erf may differ in the last bits between libm and CUDA's.
        check!(f.iter().zip(&wf).all(|(a, b)| (a - b).abs() <= 2e-6 * b.abs().max(1.0)), "{f:?} vs {wf:?}");
        Ok(())
    });
}

#[offload::kernel]
fn exponentials(i: usize, x: &[f32], y: &mut [f32]) {
    y[i] = x[i].exp();
}

/// `f32::exp` in a kernel is within 2 ulp of the exact value on every device (CUDA's
/// `expf`; host devices' inlined exp, which loops vectorise), 0 far below its range
/// (CUDA's may give a subnormal there), and infinite above it.
#[test]
fn f32_exp_is_within_two_ulp_everywhere() {
    on_every_device("exp", |rt, d| {
        let dev = rt.device(d)?;
        let mut x: Vec<f32> = (0..20_001).map(|i| -87.0 + 175.0 * i as f32 / 20_000.0).collect();
        x.extend([-0.0, 1e-30, -1e-30, -200.0, 100.0]);
        let mut y = vec![0.0f32; x.len()];
        dev.data((map::to(&x), map::from(&mut y)), |(x, y)| exponentials::launch(&dev, x.len(), x, y))?;
        for (&x, &y) in x.iter().zip(&y).take(20_004) {
            let want = f64::from(x).exp();
            let ulp = f64::from(f32::EPSILON) * want;
            check!((f64::from(y) - want).abs() <= 2.0 * ulp, "exp({x}) = {y}, expected {want} within 2 ulp");
        }
        check!(y[20_004] == 0.0, "exp(-200) = {}", y[20_004]);
        check!(y[20_005].is_infinite(), "exp(100) = {}", y[20_005]);
        Ok(())
    });
}

/// Writes whether the launch may run a copy compiled for AVX-512 ([`offload::HostLaunch::avx512`]).
fn probe_avx512(l: &offload::HostLaunch<'_>) -> Result<(), String> {
    // SAFETY: the launch maps one u32, which nothing else touches meanwhile.
    let out = unsafe { l.slice_mut::<u32>(0, 1)? };
    out[0] = u32::from(l.avx512());
    Ok(())
}

static PROBE_AVX512: offload::Kernel = offload::Kernel::new("probe_avx512").with_host(probe_avx512);

/// Host devices let generated kernels run their copies compiled for AVX-512 where the CPU
/// has it and `host_avx512` is on (the default), and never otherwise; the kernels give the
/// same results bit for bit either way: exp, a block-stride teams kernel with team sums,
/// minima, maxima and products, a masked softmax. (Release builds have the copies; in a
/// debug build both runs take the baseline code.)
#[test]
fn host_avx512_copies_give_the_same_results() {
    let cpu = offload::HostLaunch::cpu_has_avx512();
    let run = |on: bool| {
        let rt = offload::Runtime::builder()
            .env(|_| None)
            .gpus(false)
            .host_devices(1)
            .host_avx512(on)
            .build()
            .unwrap();
        let dev = rt.device(0).unwrap();
        let mut flag = [7u32];
        dev.data(map::from(&mut flag[..]), |f| dev.launch(&PROBE_AVX512, 1, (f,))).unwrap();
        let x: Vec<f32> = (0..8_001).map(|i| -80.0 + 0.02 * i as f32).collect();
        let mut e = vec![0f32; x.len()];
        dev.data((map::to(&x), map::from(&mut e)), |(x, e)| exponentials::launch(&dev, x.len(), x, e))
            .unwrap();
        let (teams, w) = (9usize, 200usize);
        let rows: Vec<f32> = (0..teams * w).map(|i| ((i * 37) % 101) as f32 * 0.37 - 11.0).collect();
        let (mut y, mut stats) = (vec![0f32; teams * w], vec![0f32; 4 * teams]);
        dev.data((map::to(&rows), map::from(&mut y), map::from(&mut stats)), |(x, y, s)| {
            normalise_with_team_sums::launch(&dev, teams, w, x, y, s)
        })
        .unwrap();
        let mut p = rows.clone();
        dev.data(map::tofrom(&mut p), |p| {
            offload_kernels::nn::for_f32::masked_softmax::launch(&dev, teams, 224, w, w / 2, true, p)
        })
        .unwrap();
        (flag[0], [e, y, stats, p])
    };
    let ((on, with), (off, without)) = (run(true), run(false));
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        on,
        u32::from(cpu),
        "host_avx512(true) on a CPU with{} x86-64-v4",
        if cpu { "" } else { "out" }
    );
    assert_eq!(off, 0, "host_avx512(false)");
    for (k, (a, b)) in with.iter().zip(&without).enumerate() {
        let same = a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same && a.len() == b.len(), "output {k} differs between the copies");
    }
}

/// A C `declare target` function that takes an array.
#[offload::device]
fn laplacian(u: &[f32], c: usize, nx: usize) -> f32 {
    u[c - 1] + u[c + 1] + u[c - nx] + u[c + nx] - 4.0 * u[c]
}

/// Sums a view (kernels have no iterators: an index loop).
#[offload::device]
#[allow(clippy::needless_range_loop)]
fn total(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for k in 0..x.len() {
        s += x[k];
    }
    s
}

/// Writes through a view, and calls another device function.
#[offload::device]
fn store_scaled(out: &mut [f32], k: usize, v: f32) {
    out[k] = v * total(&out[k..k]).max(1.0);
}

#[offload::kernel(dims = 2)]
fn diffuse(iy: usize, ix: usize, nx: usize, u: &[f32], rows: &[f32], out: &mut [f32]) {
    let c = iy * nx + ix;
    let row = &rows[iy * 4..iy * 4 + 4];
    let l = laplacian(u, c, nx);
    out[c] = u[c] + 0.1 * l + total(row) + total(&rows[..=1]);
}

#[test]
fn device_functions_take_views_and_sub_slices() {
    on_every_device("device functions over views", |rt, d| {
        let gpu = rt.device(d)?;
        let (nx, ny) = (34, 20);
        let u: Vec<f32> = (0..nx * ny).map(|i| ((i * 7) % 11) as f32).collect();
        let rows: Vec<f32> = (0..ny * 4).map(|i| i as f32 * 0.5).collect();
        let mut out = vec![0.0f32; nx * ny];
        let mut want = out.clone();
        for iy in 1..ny - 1 {
            for ix in 1..nx - 1 {
                diffuse(iy, ix, nx, &u, &rows, &mut want);
            }
        }
        gpu.data((map::to(&u), map::to(&rows), map::tofrom(&mut out)), |(u, rows, out)| {
            diffuse::launch(&gpu, (1..ny - 1, 1..nx - 1), nx, u, rows, out)
        })?;
        check_eq!(out, want);
        Ok(())
    });
}

#[offload::kernel(dims = 1)]
fn scatter(i: usize, n: usize, x: &[f32], out: &mut [f32]) {
    store_scaled(out, i, x[i] + n as f32);
}

#[test]
fn a_device_function_writes_through_a_view() {
    on_every_device("device function stores", |rt, d| {
        let gpu = rt.device(d)?;
        let x: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let mut out = vec![0.0f32; 100];
        gpu.data((map::to(&x), map::from(&mut out)), |(x, o)| scatter::launch(&gpu, 100, 1, x, o))?;
        check!(out.iter().enumerate().all(|(i, &v)| v == i as f32 + 1.0), "{out:?}");
        Ok(())
    });
}

#[offload::kernel]
fn sub_slice_out_of_range(i: usize, x: &[f32], y: &mut [f32]) {
    let s = &x[i..i + 2];
    y[i] = s[0] + s[1];
}

#[test]
fn a_sub_slice_past_its_view_fails_the_launch_naming_it() {
    on_every_device("sub-slice out of range", |rt, d| {
        let gpu = rt.device(d)?;
        if !sub_slice_out_of_range::CHECKED && rt.describe(d)?.kind != offload::BackendKind::Host {
            return Ok(()); // unchecked GPU launches do not check (documented)
        }
        let x = vec![1.0f32; 10];
        let mut y = vec![0.0f32; 10];
        let r = gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| {
            sub_slice_out_of_range::launch(&gpu, 10, x, y)
        });
        match r.map_err(cause) {
            Err(Error::KernelFailed { message, .. }) => {
                check!(
                    message.contains("`x`") && (message.contains("9..11") || message.contains("index 11")),
                    "{message}"
                )
            }
            other => check!(false, "expected KernelFailed, got {other:?}"),
        }
        Ok(())
    });
}

/// A parameter block, by value.
#[derive(Clone, Copy, Debug, PartialEq, offload::DeviceCopy)]
#[repr(C)]
struct Params {
    dt: f64,
    damping: f32,
    steps: u32,
}

/// A vector inside a struct.
#[derive(Clone, Copy, Debug, PartialEq, Default, offload::DeviceCopy)]
#[repr(C)]
struct Vec2 {
    x: f32,
    y: f32,
}

/// An element of views: a struct of structs.
#[derive(Clone, Copy, Debug, PartialEq, Default, offload::DeviceCopy)]
#[repr(C)]
struct Particle {
    pos: Vec2,
    vel: Vec2,
    mass: f32,
    id: u32,
}

#[offload::device]
fn kinetic(p: Particle) -> f32 {
    0.5 * p.mass * (p.vel.x * p.vel.x + p.vel.y * p.vel.y)
}

#[offload::kernel]
fn advance(i: usize, p: Params, ps: &mut [Particle], energy: &mut [f32]) {
    let mut q = ps[i];
    for _ in 0..p.steps {
        q.pos.x += (p.dt as f32) * q.vel.x;
        q.pos.y += (p.dt as f32) * q.vel.y;
        q.vel.y *= p.damping;
    }
    ps[i] = q;
    ps[i].id += 1000;
    energy[i] = kinetic(ps[i]);
}

#[test]
fn structs_are_parameters_by_value_and_elements_of_views() {
    on_every_device("structs", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 300;
        let params = Params { dt: 0.5, damping: 0.9, steps: 4 };
        let mut ps: Vec<Particle> = (0..n)
            .map(|i| Particle {
                pos: Vec2 { x: i as f32, y: 0.0 },
                vel: Vec2 { x: 1.0, y: i as f32 * 0.1 },
                mass: 2.0,
                id: i as u32,
            })
            .collect();
        let mut energy = vec![0.0f32; n];
        let (mut want, mut we) = (ps.clone(), energy.clone());
        for i in 0..n {
            advance(i, params, &mut want, &mut we);
        }
        gpu.data((map::tofrom(&mut ps), map::from(&mut energy)), |(ps, e)| {
            advance::launch(&gpu, n, params, ps, e)
        })?;
        check_eq!(ps, want);
        check_eq!(energy, we);
        Ok(())
    });
}

/// The Jacobi port's step as OpenMP writes it: `collapse(2)` over `i` (outer) and `j`
/// (inner), with `i` the unit-stride index; and the same with the loops swapped.
#[offload::kernel(dims = 2)]
fn omp_order(i: usize, j: usize, n: usize, f_old: &[f32], f: &mut [f32]) {
    f[i + j * n] = 0.25f32
        * (f_old[(i - 1) + j * n] + f_old[(i + 1) + j * n] + f_old[i + (j - 1) * n] + f_old[i + (j + 1) * n]);
}

#[offload::kernel(dims = 2)]
fn c_order(j: usize, i: usize, n: usize, f_old: &[f32], f: &mut [f32]) {
    f[i + j * n] = 0.25f32
        * (f_old[(i - 1) + j * n] + f_old[(i + 1) + j * n] + f_old[i + (j - 1) * n] + f_old[i + (j + 1) * n]);
}

#[test]
fn a_kernel_in_openmp_loop_order_gives_the_same_results() {
    // The unit-stride index is the fastest thread dimension whatever its position.
    assert!(omp_order::KERNEL.thread_map().is_some_and(|m| m.contains("consecutive `i`")));
    assert!(c_order::KERNEL.thread_map().is_some_and(|m| m.contains("consecutive `i`")));
    on_every_device("OpenMP loop order", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 67;
        let f_old: Vec<f32> = (0..n * n).map(|k| ((k * 31) % 17) as f32).collect();
        let (mut a, mut b) = (vec![0.0f32; n * n], vec![0.0f32; n * n]);
        let mut want = a.clone();
        for i in 1..n - 1 {
            for j in 1..n - 1 {
                omp_order(i, j, n, &f_old, &mut want);
            }
        }
        gpu.data((map::to(&f_old), map::tofrom(&mut a), map::tofrom(&mut b)), |(f_old, a, b)| {
            omp_order::launch(&gpu, (1..n - 1, 1..n - 1), n, f_old, a)?;
            c_order::launch(&gpu, (1..n - 1, 1..n - 1), n, f_old, b)
        })?;
        check_eq!(a, want);
        check_eq!(b, want);
        Ok(())
    });
}

/// Every item stores to element 0: two iterations writing one element.
#[offload::kernel(checked = true)]
fn racy(i: usize, x: &mut [u32]) {
    x[0] = i as u32;
}

/// Every thread of a team stores to the team's element.
#[offload::kernel(teams = 8, checked = true)]
fn racy_team(team: usize, thread: usize, y: &mut [u32]) {
    y[team] = thread as u32;
}

#[test]
fn a_checked_host_twin_catches_two_iterations_storing_one_element() {
    on_every_device("store log", |rt, d| {
        if rt.describe(d)?.kind != offload::BackendKind::Host {
            return Ok(()); // GPUs do not log stores (documented)
        }
        let gpu = rt.device(d)?;
        let mut x = vec![0u32; 4];
        let r = gpu.data(map::tofrom(&mut x), |x| racy::launch(&gpu, 64, x));
        match r.map_err(cause) {
            Err(Error::KernelFailed { message, .. }) => {
                check!(message.contains("both store element 0") && message.contains("`x`"), "{message}")
            }
            other => check!(false, "expected KernelFailed, got {other:?}"),
        }
        // One item storing once: fine.
        gpu.data(map::tofrom(&mut x), |x| racy::launch(&gpu, 1, x))?;
        // A team's threads are work items too.
        let r = gpu.data(map::tofrom(&mut x), |x| racy_team::launch(&gpu, 2, x));
        match r.map_err(cause) {
            Err(Error::KernelFailed { message, .. }) => {
                check!(message.contains("both store element"), "{message}")
            }
            other => check!(false, "expected KernelFailed, got {other:?}"),
        }
        Ok(())
    });
}

/// Each team reverses its block of 64 elements through a team-local array: a thread reads
/// what another wrote, which only the barrier makes safe.
#[offload::kernel(teams = 64)]
fn reverse_blocks(team: usize, thread: usize, x: &[u32], y: &mut [u32]) {
    let mut tile: [u32; 64] = offload::team_local();
    tile[thread] = x[team * 64 + thread];
    offload::barrier();
    y[team * 64 + thread] = tile[63 - thread];
}

/// A 3-point stencil over a team's block with its halo in team-local memory, over several
/// passes (barriers inside a loop of uniform trip count), and a per-team sum (a tree in
/// team-local memory, thread 0 storing).
#[offload::kernel(teams = 32)]
fn smooth_blocks(team: usize, thread: usize, passes: u32, x: &[f32], y: &mut [f32], sums: &mut [f32]) {
    let mut tile: [f32; 34] = offload::team_local();
    let mut partial: [f32; 32] = offload::team_local();
    let g = team * 32 + thread;
    let mut v = x[g];
    for _ in 0..passes {
        tile[thread + 1] = v;
        if thread == 0 {
            tile[0] = if g > 0 { x[g - 1] } else { 0.0 };
        }
        if thread == 31 {
            tile[33] = if g + 1 < x.len() { x[g + 1] } else { 0.0 };
        }
        offload::barrier();
        v = (tile[thread] + tile[thread + 1] + tile[thread + 2]) / 3.0;
        offload::barrier();
    }
    y[g] = v;
    partial[thread] = v;
    offload::barrier();
    for s in 0..5u32 {
        let width = 16usize >> s;
        if thread < width {
            partial[thread] += partial[thread + width];
        }
        offload::barrier();
    }
    if thread == 0 {
        sums[team] = partial[0];
    }
}

#[test]
fn teams_kernels_share_team_local_arrays_across_a_barrier() {
    on_every_device("teams", |rt, d| {
        let gpu = rt.device(d)?;
        let teams = 40;
        let x: Vec<u32> = (0..teams * 64).map(|i| i as u32).collect();
        let mut y = vec![0u32; teams * 64];
        gpu.data((map::to(&x), map::from(&mut y)), |(x, y)| reverse_blocks::launch(&gpu, teams, x, y))?;
        let want: Vec<u32> = (0..teams * 64).map(|i| ((i / 64) * 64 + 63 - i % 64) as u32).collect();
        check_eq!(y, want);
        // A sub-range of teams launches only those.
        let mut z = vec![0u32; teams * 64];
        gpu.data((map::to(&x), map::tofrom(&mut z)), |(x, z)| reverse_blocks::launch(&gpu, 2..4, x, z))?;
        check!(z.iter().enumerate().all(|(i, &v)| if (128..256).contains(&i) {
            v == want[i]
        } else {
            v == 0
        }));

        // The stencil and the sums against a host computation of the same passes.
        let n = teams * 32;
        let x: Vec<f32> = (0..n).map(|i| ((i * 13) % 7) as f32).collect();
        let (mut y, mut sums) = (vec![0.0f32; n], vec![0.0f32; teams]);
        gpu.data((map::to(&x), map::from(&mut y), map::from(&mut sums)), |(x, y, s)| {
            smooth_blocks::launch(&gpu, teams, 3, x, y, s)
        })?;
        let mut want = vec![0.0f32; n];
        for t in 0..teams {
            let mut v: Vec<f32> = x[t * 32..t * 32 + 32].to_vec();
            let left = if t > 0 { x[t * 32 - 1] } else { 0.0 };
            let right = if t + 1 < teams { x[t * 32 + 32] } else { 0.0 };
            for _ in 0..3 {
                let mut tile = vec![left];
                tile.extend_from_slice(&v);
                tile.push(right);
                v = (0..32).map(|k| (tile[k] + tile[k + 1] + tile[k + 2]) / 3.0).collect();
            }
            want[t * 32..t * 32 + 32].copy_from_slice(&v);
        }
        check!(y.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-5), "{:?} vs {:?}", &y[..8], &want[..8]);
        for t in 0..teams {
            let s: f32 = want[t * 32..t * 32 + 32].iter().sum();
            check!((sums[t] - s).abs() <= 1e-3 * s.abs().max(1.0), "team {t}: {} vs {s}", sums[t]);
        }
        Ok(())
    });
}

/// A thread that fails stops its whole team (the others are not left at the barrier).
#[offload::kernel(teams = 16, checked = true)]
fn failing_team(team: usize, thread: usize, y: &mut [u32]) {
    let mut tile: [u32; 16] = offload::team_local();
    tile[thread] = thread as u32;
    offload::barrier();
    y[team * 16 + thread + if thread == 5 { 1000 } else { 0 }] = tile[15 - thread];
}

#[test]
fn a_failing_thread_fails_its_teams_launch_without_hanging() {
    on_every_device("failing team", |rt, d| {
        if !failing_team::CHECKED && rt.describe(d)?.kind != offload::BackendKind::Host {
            return Ok(());
        }
        let gpu = rt.device(d)?;
        let mut y = vec![0u32; 64];
        let r = gpu.data(map::tofrom(&mut y), |y| failing_team::launch(&gpu, 4, y));
        match r.map_err(cause) {
            Err(Error::KernelFailed { message, .. }) => {
                check!(message.contains("`y`") && message.contains("out of range"), "{message}")
            }
            other => check!(false, "expected KernelFailed, got {other:?}"),
        }
        Ok(())
    });
}

/// A team's inclusive prefix sums over its block, `rounds` times (a scan of the scan), in
/// barrier loops nested two deep whose inner bound is a local; values that live across
/// barriers (`v`, `add`, `g`, `live`) and a last team that runs past the data; each team's
/// last sum into a reduction.
#[offload::kernel(teams = 32, reduction(+: total))]
fn team_scan(team: usize, thread: usize, rounds: u32, x: &[u32], y: &mut [u32], total: &mut u64) {
    let mut buf: [u32; 32] = offload::team_local();
    let g = team * 32 + thread;
    let live = g < x.len();
    let mut v = if live { x[g] } else { 0 };
    let steps = 5u32;
    for _ in 0..rounds {
        buf[thread] = v;
        offload::barrier();
        for s in 0..steps {
            let d = 1usize << s;
            let add = if thread >= d { buf[thread - d] } else { 0 };
            offload::barrier();
            v += add;
            buf[thread] = v;
            offload::barrier();
        }
    }
    if live {
        y[g] = v;
    }
    if thread == 31 {
        *total += v as u64;
    }
}

/// Each team scales its row by the row's sum: block-stride loops whose counter is set anew
/// after the barrier (no value crosses it), a row start the same for every thread, a tree
/// in team-local memory.
#[offload::kernel(teams = 64)]
fn normalise_rows(row: usize, thread: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    let mut part: [f32; 64] = offload::team_local();
    let base = row * cols;
    let mut s = 0.0f32;
    let mut c = thread;
    while c < cols {
        s += x[base + c];
        c += 64;
    }
    part[thread] = s;
    offload::barrier();
    for k in 0..6u32 {
        let w = 32usize >> k;
        if thread < w {
            part[thread] += part[thread + w];
        }
        offload::barrier();
    }
    let total = part[0];
    c = thread;
    while c < cols {
        y[base + c] = x[base + c] / total;
        c += 64;
    }
}

#[test]
fn teams_kernels_set_a_block_stride_counter_anew_after_each_barrier() {
    on_every_device("normalise rows", |rt, d| {
        let gpu = rt.device(d)?;
        let (rows, cols) = (37, 300);
        let x: Vec<f32> = (0..rows * cols).map(|i| 1.0 + (i % 11) as f32).collect();
        let mut y = vec![0f32; rows * cols];
        gpu.data((map::to(&x), map::from(&mut y)), |(x, y)| normalise_rows::launch(&gpu, rows, cols, x, y))?;
        for r in 0..rows {
            let sum: f32 = x[r * cols..(r + 1) * cols].iter().sum();
            for c in 0..cols {
                let (got, want) = (y[r * cols + c], x[r * cols + c] / sum);
                check!((got - want).abs() <= 1e-6 * want.abs().max(1e-3), "row {r} col {c}: {got} vs {want}");
            }
        }
        Ok(())
    });
}

/// Per thread of a team of 32: a scaled block-stride sum of its row (a value before the
/// loop, read in it and after it), stored at the thread's slot with the thread's count of
/// elements; the row's last thread also stores the row's bound.
#[offload::kernel(teams = 32)]
fn strided_sums(row: usize, thread: usize, cols: usize, x: &[u32], sums: &mut [u64], counts: &mut [u32]) {
    let base = row * cols;
    let scale = (thread as u64) + 1;
    let mut s = 0u64;
    let mut n = 0u32;
    let mut c = thread;
    while c < cols {
        s += (x[base + c] as u64) * scale;
        n += 1;
        c += 32;
    }
    sums[row * 32 + thread] = s;
    counts[row * 32 + thread] = n;
    if thread == 31 {
        counts[row * 32 + thread] += cols as u32;
    }
}

/// A teams stretch whose threads walk a block-stride loop runs in rounds on host devices
/// (every thread's statements before the loop, then round by round, then after it): each
/// thread's values are the ones it computes alone, for rows shorter than the team, not a
/// multiple of it, and longer; the twin says so.
#[test]
fn block_stride_stretches_run_in_rounds_with_each_threads_own_values() {
    let p = strided_sums::KERNEL.host_path().unwrap_or_default().to_string();
    assert!(p.contains("block-stride loops in rounds"), "{p}");
    on_every_device("strided sums", |rt, d| {
        let gpu = rt.device(d)?;
        for cols in [5usize, 32, 100, 257] {
            let rows = 9;
            let x: Vec<u32> = (0..rows * cols).map(|i| (i % 13) as u32 + 1).collect();
            let (mut sums, mut counts) = (vec![0u64; rows * 32], vec![0u32; rows * 32]);
            gpu.data((map::to(&x), map::from(&mut sums), map::from(&mut counts)), |(x, s, n)| {
                strided_sums::launch(&gpu, rows, cols, x, s, n)
            })?;
            for r in 0..rows {
                for t in 0..32 {
                    let mine: Vec<u64> = (t..cols).step_by(32).map(|c| x[r * cols + c] as u64).collect();
                    let want_sum = mine.iter().sum::<u64>() * (t as u64 + 1);
                    let want_count = mine.len() as u32 + if t == 31 { cols as u32 } else { 0 };
                    let (got_sum, got_count) = (sums[r * 32 + t], counts[r * 32 + t]);
                    check!(
                        (got_sum, got_count) == (want_sum, want_count),
                        "cols {cols} row {r} thread {t}: {got_sum}, {got_count} vs {want_sum}, {want_count}"
                    );
                }
            }
        }
        Ok(())
    });
}

/// Threads `2k` and `2k + 1` of a team store the same element of the team's row (its
/// stores stay in the row: the own-rows form), checked.
#[offload::kernel(teams = 32, checked = true)]
fn paired_rows(row: usize, thread: usize, cols: usize, y: &mut [u32]) {
    let base = row * cols;
    let mut c = thread / 2;
    while c < cols {
        y[base + c] = thread as u32;
        c += 32;
    }
}

/// Each team writes one element past its row: not the own-rows form.
#[offload::kernel(teams = 32)]
fn past_rows(row: usize, thread: usize, cols: usize, x: &[u32], y: &mut [u32]) {
    let base = row * cols;
    let mut c = thread;
    while c < cols {
        y[base + c + 1] = x[base + c] + 1;
        c += 32;
    }
}

/// A teams kernel whose every access of a written view is `team * w + c` inside `while c <
/// w` (a team's block-stride walk of its row) stores plainly into the team's row; one that
/// reaches past its row stays atomic; a checked twin keeps the rows shared, so that its
/// store log still names two threads storing one element; a view too short for the rows
/// fails the launch as before.
#[test]
fn teams_stores_in_their_own_rows_are_plain_and_still_checked() {
    let path = |k: &offload::Kernel| k.host_path().unwrap_or_default().to_string();
    let p = path(&normalise_rows::KERNEL);
    assert!(p.contains("plain stores of `y` (each team only in its own row"), "{p}");
    assert!(path(&past_rows::KERNEL).contains("relaxed-atomic accesses of `y`"));
    on_every_device("own rows", |rt, d| {
        let gpu = rt.device(d)?;
        let host = rt.describe(d)?.kind == offload::BackendKind::Host;
        let (rows, cols) = (7usize, 70usize);
        let x: Vec<u32> = (0..rows * cols).map(|i| i as u32 * 3).collect();
        let mut y = vec![0u32; rows * cols + 1];
        gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| past_rows::launch(&gpu, rows, cols, x, y))?;
        check!(y[0] == 0 && y[1..] == x.iter().map(|v| v + 1).collect::<Vec<_>>()[..]);
        if host {
            let mut y = vec![0u32; rows * cols];
            let r = gpu.data(map::tofrom(&mut y), |y| paired_rows::launch(&gpu, rows, cols, y));
            match r.map_err(cause) {
                Err(Error::KernelFailed { message, .. }) => {
                    check!(message.contains("both store element") && message.contains("`y`"), "{message}")
                }
                other => check!(false, "expected KernelFailed, got {other:?}"),
            }
            // Rows past the view: the launch fails naming the index, as before.
            let x: Vec<f32> = vec![1.0; rows * cols];
            let mut short = vec![0f32; rows * cols - 1];
            let r = gpu.data((map::to(&x), map::tofrom(&mut short)), |(x, y)| {
                normalise_rows::launch(&gpu, rows, cols, x, y)
            });
            match r.map_err(cause) {
                Err(Error::KernelFailed { message, .. }) => {
                    check!(message.contains("out of range"), "{message}")
                }
                other => check!(false, "expected KernelFailed, got {other:?}"),
            }
        }
        Ok(())
    });
}

/// Differences along each row, in rounds: `x`'s element before `c` is read only where
/// `c > 0` (a start that could wrap: no window), `x`'s and `w`'s at `c` by every thread
/// (windows), `y` stored in the team's row (a window of its own row); `w` may be shorter
/// than the rows reach.
#[offload::kernel(teams = 32)]
fn row_differences(row: usize, thread: usize, cols: usize, x: &[f32], w: &[f32], y: &mut [f32]) {
    let base = row * cols;
    let mut c = thread;
    while c < cols {
        let mut d = x[base + c] * w[base + c];
        if c > 0 {
            d -= x[base + c - 1];
        }
        y[base + c] = if c % 2 == 0 { d } else { -d };
        c += 32;
    }
}

/// A block-stride round takes each run of its row as a window checked once per round (host
/// devices; the same results everywhere), for rows shorter than the team, a multiple of it
/// and longer; a view too short for the last row's run fails the launch naming the
/// index, as the body as written does.
#[test]
fn rounds_read_and_store_their_runs_through_windows() {
    on_every_device("row differences", |rt, d| {
        let gpu = rt.device(d)?;
        for cols in [5usize, 32, 100, 257] {
            let rows = 3;
            let x: Vec<f32> = (0..rows * cols).map(|i| (i % 7) as f32 + 0.5).collect();
            let w: Vec<f32> = (0..rows * cols).map(|i| (i % 3) as f32).collect();
            let mut y = vec![0f32; rows * cols];
            gpu.data((map::to(&x), map::to(&w), map::from(&mut y)), |(x, w, y)| {
                row_differences::launch(&gpu, rows, cols, x, w, y)
            })?;
            for r in 0..rows {
                for c in 0..cols {
                    let i = r * cols + c;
                    let d = x[i] * w[i] - if c > 0 { x[i - 1] } else { 0.0 };
                    let want = if c % 2 == 0 { d } else { -d };
                    check!(y[i] == want, "cols {cols}, ({r}, {c}): {} vs {want}", y[i]);
                }
            }
        }
        if rt.describe(d)?.kind == offload::BackendKind::Host {
            let (rows, cols) = (3usize, 40usize);
            let x = vec![1f32; rows * cols];
            let short = vec![1f32; rows * cols - 3];
            let mut y = vec![0f32; rows * cols];
            let r = gpu.data((map::to(&x), map::to(&short), map::from(&mut y)), |(x, w, y)| {
                row_differences::launch(&gpu, rows, cols, x, w, y)
            });
            match r.map_err(cause) {
                Err(Error::KernelFailed { message, .. }) => {
                    check!(message.contains("out of range") && message.contains("`w`"), "{message}")
                }
                other => check!(false, "expected KernelFailed, got {other:?}"),
            }
        }
        Ok(())
    });
}

/// A thread's sums in two block-stride stretches, one local reused across the barrier:
/// set by a `let` (to 1) before the first loop and by an assignment before the second.
/// `j` copies the counter before it is set: an index in the next team's row, not the
/// walk's.
#[offload::kernel(teams = 32)]
fn reused_sums(team: usize, thread: usize, n: usize, x: &[f32], a: &mut [f32], b: &mut [f32], e: &mut [f32]) {
    let mut s = 1.0f32;
    let mut c = thread;
    while c < n {
        s += x[team * n + c];
        c += 32;
    }
    a[team * 32 + thread] = s;
    offload::barrier();
    s = 0.0;
    c = thread;
    while c < n {
        s += x[team * n + c];
        c += 32;
    }
    b[team * 32 + thread] = s;
    offload::barrier();
    c = n;
    let j = c;
    c = thread;
    while c < n {
        if thread == 0 {
            e[team * n + j] = 1.0;
        }
        c += 32;
    }
}

/// Locals a thread carries from before a block-stride loop into it or after it are its own
/// in every stretch that runs in rounds, however they were set (a `let`, an assignment
/// after a barrier); an index copied from the counter before the walk is not taken for it.
#[test]
fn rounds_keep_each_threads_locals_apart() {
    on_every_device("reused sums", |rt, d| {
        let gpu = rt.device(d)?;
        let (teams, n) = (5usize, 70usize);
        let x: Vec<f32> = (0..teams * n).map(|i| (i % 9) as f32).collect();
        let (mut a, mut b, mut e) =
            (vec![0f32; teams * 32], vec![0f32; teams * 32], vec![0f32; teams * n + 1]);
        gpu.data(
            (map::to(&x), map::from(&mut a), map::from(&mut b), map::tofrom(&mut e)),
            |(x, a, b, e)| reused_sums::launch(&gpu, teams, n, x, a, b, e),
        )?;
        for t in 0..teams {
            for th in 0..32 {
                let mine: f32 = (th..n).step_by(32).map(|c| x[t * n + c]).sum();
                let (ga, gb) = (a[t * 32 + th], b[t * 32 + th]);
                check!(
                    ga == 1.0 + mine && gb == mine,
                    "team {t} thread {th}: {ga}, {gb} vs {}, {mine}",
                    1.0 + mine
                );
            }
            check!(e[(t + 1) * n] == 1.0 && e[t * n + 1..(t + 1) * n].iter().all(|v| *v == 0.0), "team {t}");
        }
        Ok(())
    });
}

#[test]
fn teams_kernels_keep_values_across_barriers_in_nested_loops_and_uneven_teams() {
    on_every_device("team scan", |rt, d| {
        let gpu = rt.device(d)?;
        // 1000 teams, the last one 5 threads past the data: tasks of uneven size too.
        let n = 1000 * 32 - 5;
        let x: Vec<u32> = (0..n).map(|i| (i % 7) as u32).collect();
        let (mut y, mut total) = (vec![0u32; n], vec![0u64]);
        gpu.data((map::to(&x), map::from(&mut y), map::tofrom(&mut total)), |(x, y, t)| {
            team_scan::launch(&gpu, n.div_ceil(32), 2, x, y, t)
        })?;
        let (mut want, mut want_total) = (vec![0u32; n], 0u64);
        for team in 0..n.div_ceil(32) {
            let mut b: Vec<u32> = (0..32).map(|t| x.get(team * 32 + t).copied().unwrap_or(0)).collect();
            for _ in 0..2 {
                for t in 1..32 {
                    b[t] += b[t - 1];
                }
            }
            for (t, v) in b.iter().enumerate() {
                if let Some(w) = want.get_mut(team * 32 + t) {
                    *w = *v;
                }
            }
            want_total += b[31] as u64;
        }
        check_eq!(y, want);
        check_eq!(total, vec![want_total]);
        Ok(())
    });
}

/// `y[i]` written where the item is: plain.
#[offload::kernel]
fn own_store(i: usize, a: f32, x: &[f32], y: &mut [f32]) {
    y[i] += a * x[i];
}

/// `y[i + 1]` written: another item's element, so the shared (atomic) path.
#[offload::kernel]
fn shifted_store(i: usize, x: &[f32], y: &mut [f32]) {
    y[i + 1] = x[i];
}

/// A 2-D kernel storing at `row * nx + col` (its own element) and reading neighbours.
#[offload::kernel(dims = 2)]
fn own_rows(row: usize, col: usize, nx: usize, x: &[f32], y: &mut [f32]) {
    let c = row * nx + col;
    y[c] += x[c - 1] + x[c + 1];
}

/// A row per item, `y[row * cols + c]` for `c` in `0..cols`: each item's own elements.
#[offload::kernel(dims = 1)]
fn scale_rows(row: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    let base = row * cols;
    for c in 0..cols {
        y[base + c] += x[base + c] * 2.0;
    }
}

/// The same, one element past the row: the next item's first element, so atomic.
#[offload::kernel(dims = 1)]
fn scale_rows_past(row: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    for c in 0..cols + 1 {
        y[row * cols + c] = x[row * cols + c];
    }
}

/// Jacobi's periodic copy: row 1 also stored to row `last`, row `last - 1` to row 0 (rows
/// no item owns when the launch covers `1..last`).
#[offload::kernel(dims = 2)]
fn wrap_rows(row: usize, col: usize, nx: usize, last: usize, x: &[f32], y: &mut [f32]) {
    let v = x[row * nx + col] + 1.0;
    y[row * nx + col] = v;
    if row == 1 {
        y[last * nx + col] = v;
    }
    if row == last - 1 {
        y[col] = v;
    }
}

/// The host twin says which views it reads and writes plainly, and a kernel whose stores
/// may land on another item's element keeps them atomic; each gives what the Rust loop
/// gives, bit for bit, whatever path a launch takes (columns wider than `nx` make rows
/// overlap: the shared path).
#[test]
fn host_twins_say_their_path_and_give_the_loops_results() {
    let path = |k: &offload::Kernel| k.host_path().unwrap_or_default().to_string();
    let p = path(&own_store::KERNEL);
    assert!(p.contains("plain loads of `x`") && p.contains("plain stores of `y`"), "{p}");
    let p = path(&shifted_store::KERNEL);
    assert!(p.contains("plain loads of `x`") && p.contains("relaxed-atomic accesses of `y`"), "{p}");
    assert!(path(&own_rows::KERNEL).contains("plain stores of `y`"));
    let p = path(&scale_rows::KERNEL);
    assert!(p.contains("plain loads of `x`") && p.contains("plain stores of `y`"), "{p}");
    assert!(path(&scale_rows_past::KERNEL).contains("relaxed-atomic accesses of `y`"));
    let p = path(&wrap_rows::KERNEL);
    assert!(p.contains("plain stores of `y`") && p.contains("atomic stores of `y` beside them"), "{p}");
    assert!(path(&reverse_blocks::KERNEL).contains("teams of 64 as loops"));
    on_every_device("host paths", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 10_000;
        // Quarters and halves: every product and sum is exact, so a GPU that fuses
        // `y + a * x` into one rounding gives the loop's bits too.
        let x: Vec<f32> = (0..n).map(|v| (v % 13) as f32 * 0.25).collect();
        let mut y: Vec<f32> = (0..n).map(|v| (v % 7) as f32 * 0.5).collect();
        let mut want = y.clone();
        for i in 100..n {
            want[i] += 1.5 * x[i];
        }
        gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| own_store::launch(&gpu, 100..n, 1.5, x, y))?;
        check_eq!(y, want);
        // Rows 1..99 of 100, rows 0 and 99 stored beside them (plain path); then rows 1..99
        // with `last` = 50, a row the launch owns (the atomic path; rows 1 and 50 both
        // store row 50: any order is OpenMP's, and a checked twin's log names them).
        let mut w = vec![0f32; n];
        gpu.data((map::to(&x), map::tofrom(&mut w)), |(x, w)| {
            wrap_rows::launch(&gpu, (1..99, 1..99), 100, 99, x, w)
        })?;
        let mut want = vec![0f32; n];
        for row in 1..99 {
            for col in 1..99 {
                want[row * 100 + col] = x[row * 100 + col] + 1.0;
            }
        }
        for col in 1..99 {
            want[99 * 100 + col] = want[100 + col];
            want[col] = want[98 * 100 + col];
        }
        check_eq!(w, want);
        let r = gpu.data((map::to(&x), map::tofrom(&mut w)), |(x, w)| {
            wrap_rows::launch(&gpu, (1..99, 1..99), 100, 50, x, w)
        });
        let host = rt.describe(d)?.kind == offload::BackendKind::Host;
        match r.map_err(cause) {
            Ok(()) => check!(!(wrap_rows::CHECKED && host), "the store log missed row 50"),
            Err(Error::KernelFailed { message, .. }) => {
                check!(wrap_rows::CHECKED && host && message.contains("both store element"), "{message}")
            }
            Err(e) => check!(false, "{e:?}"),
        }
        // Rows of 100: rows 3..97 of the 100.
        let mut r: Vec<f32> = (0..n).map(|v| (v % 3) as f32).collect();
        let mut want = r.clone();
        for (k, w) in want.iter_mut().enumerate().take(9700).skip(300) {
            *w += x[k] * 2.0;
        }
        gpu.data((map::to(&x), map::tofrom(&mut r)), |(x, r)| scale_rows::launch(&gpu, 3..97, 100, x, r))?;
        check_eq!(r, want);
        let mut z = vec![0f32; n];
        gpu.data((map::to(&x), map::tofrom(&mut z)), |(x, z)| shifted_store::launch(&gpu, n - 1, x, z))?;
        check!(z[0] == 0.0 && z[1..] == x[..n - 1]);
        // 2-D: interior of a 100 x 100 grid, then columns 1..120 of rows of 100 (rows
        // overlap each other's elements: shared path, still the loop's result).
        for (nx, cols) in [(100usize, 1..99usize), (100, 1..120)] {
            let mut y: Vec<f32> = (0..n).map(|v| (v % 5) as f32).collect();
            let mut want = y.clone();
            for row in 1..80 {
                for col in cols.clone() {
                    let c = row * nx + col;
                    want[c] += x[c - 1] + x[c + 1];
                }
            }
            let r = gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| {
                own_rows::launch(&gpu, (1..80, cols.clone()), nx, x, y)
            });
            if cols.end <= nx {
                r?;
                check_eq!(y, want);
            } else {
                // Items store to one element from two rows: the shared path, where a checked
                // host twin's store log names them (GPUs do not log stores).
                let host = rt.describe(d)?.kind == offload::BackendKind::Host;
                match r.map_err(cause) {
                    Ok(()) => check!(!(own_rows::CHECKED && host), "the store log missed the overlap"),
                    Err(Error::KernelFailed { message, .. }) => {
                        check!(
                            own_rows::CHECKED && host && message.contains("both store element"),
                            "{message}"
                        )
                    }
                    Err(e) => check!(false, "{e:?}"),
                }
            }
        }
        Ok(())
    });
}

#[test]
fn every_kernel_of_this_file_compiles_with_nvrtc() {
    offload_tests::compile_with_nvrtc(
        "kernel language",
        &[
            &twenty::KERNEL,
            &twenty::KERNEL_CHECKED,
            &integrate::KERNEL,
            &diffuse::KERNEL,
            &diffuse::KERNEL_CHECKED,
            &scatter::KERNEL,
            &scatter::KERNEL_CHECKED,
            &sub_slice_out_of_range::KERNEL_CHECKED,
            &advance::KERNEL,
            &advance::KERNEL_CHECKED,
            &omp_order::KERNEL,
            &c_order::KERNEL,
            &racy::KERNEL_CHECKED,
            &reverse_blocks::KERNEL,
            &reverse_blocks::KERNEL_CHECKED,
            &smooth_blocks::KERNEL,
            &failing_team::KERNEL_CHECKED,
            &team_scan::KERNEL,
            &normalise_rows::KERNEL,
            &own_store::KERNEL,
            &shifted_store::KERNEL,
            &own_rows::KERNEL,
            &scale_rows::KERNEL,
            &scale_rows_past::KERNEL,
            &wrap_rows::KERNEL,
            &walks::KERNEL,
            &walks::KERNEL_CHECKED,
            &tree_by_levels::KERNEL,
            &aliased::KERNEL,
            &aliased::KERNEL_CHECKED,
            &aliased_team_sum::KERNEL,
            &const_sized_tiles::KERNEL,
            &const_sized_tiles::KERNEL_CHECKED,
            &const_team_size::KERNEL,
            &const_team_size::KERNEL_CHECKED,
            &row_sums_by_const::KERNEL,
            &normalise_with_team_sums::KERNEL,
            &normalise_with_team_sums::KERNEL_CHECKED,
            &uniform_barriers::KERNEL,
            &uniform_barriers::KERNEL_CHECKED,
            &normalise_any_team::KERNEL,
            &normalise_any_team::KERNEL_CHECKED,
            &index_arithmetic::KERNEL,
            &up_to_the_top::KERNEL,
        ],
    );
}

/// A row's run of `x` at `shift` past each item's element, with a halo row copy when
/// `edge` (row 1 to row 0, outside the launch), a sum and a maximum.
#[offload::kernel(dims = 2, reduction(+: total), reduction(max: top))]
#[allow(clippy::too_many_arguments)]
fn shifted_rows(
    row: usize,
    col: usize,
    nx: usize,
    shift: usize,
    edge: bool,
    x: &[f32],
    y: &mut [f32],
    total: &mut f32,
    top: &mut f32,
) {
    let c = row * nx + col;
    let v = x[c + shift] * 2.0 + x[c];
    y[c] = v;
    if edge && row == 1 {
        y[col] = v;
    }
    *total += v;
    *top = (*top).max(v);
}

/// The same sum, only of values above 10: an update not every item makes, so the row's
/// partials stay in lanes in its loop.
#[offload::kernel(dims = 2, reduction(+: total))]
fn shifted_rows_above(row: usize, col: usize, nx: usize, x: &[f32], y: &mut [f32], total: &mut f32) {
    let c = row * nx + col;
    let v = x[c + 1] * 2.0 + x[c];
    y[c] = v;
    if v > 10.0 {
        *total += v;
    }
}

/// Rows that return early on a parameter or a row before their index arithmetic would
/// leave the view (or divide by zero): a fast row's windows are made only for rows that
/// skip those `if`s.
#[offload::kernel(dims = 2)]
fn guarded_rows(iy: usize, ix: usize, nx: usize, d: usize, x: &[f32], y: &mut [f32]) {
    if d == 0 {
        return;
    }
    if iy == 0 {
        return;
    }
    y[iy * nx + ix] = x[(iy - 1) * nx + ix] + x[iy * nx + ix + nx / d];
}

#[test]
fn rows_that_return_before_their_arithmetic_never_compute_it() {
    on_every_device("guarded rows", |rt, d| {
        let gpu = rt.device(d)?;
        let (nx, ny) = (16usize, 6usize);
        let x: Vec<f32> = (0..nx * ny + nx).map(|v| v as f32).collect();
        for div in [0usize, 2] {
            let mut y = vec![-1f32; nx * ny];
            gpu.data((map::to(&x), map::tofrom(&mut y)), |(xv, yv)| {
                guarded_rows::launch(&gpu, (0..ny, 0..nx), nx, div, xv, yv)
            })?;
            for iy in 0..ny {
                for ix in 0..nx {
                    let want = if div == 0 || iy == 0 {
                        -1.0
                    } else {
                        x[(iy - 1) * nx + ix] + x[iy * nx + ix + nx / div]
                    };
                    check!(y[iy * nx + ix] == want, "d {div} ({iy}, {ix}): {} vs {want}", y[iy * nx + ix]);
                }
            }
        }
        Ok(())
    });
}

/// Host twins run rows that need less than the whole body with a copy that does less:
/// without the `if`s no item of the row enters, and with each row's run of a view as one
/// slice checked once. Rows of every length (under, at and over a multiple of the
/// reduction's lanes) give the loop's results bit for bit where the sums are exact, and a
/// run that leaves the view fails at the item that reads outside it, as the body would.
#[test]
fn fast_rows_give_the_loops_results_and_fail_where_the_body_fails() {
    let p = shifted_rows::KERNEL.host_path().unwrap_or_default().to_string();
    assert!(p.contains("row-invariant `if`s") && p.contains("runs of `x`, `y` as slices"), "{p}");
    assert!(
        p.contains("reductions in 8 lanes") && p.contains("each item's reduction values stored per row"),
        "{p}"
    );
    let p = shifted_rows_above::KERNEL.host_path().unwrap_or_default().to_string();
    assert!(p.contains("runs of `x`, `y`") && !p.contains("stored per row"), "{p}");
    on_every_device("fast rows", |rt, d| {
        let gpu = rt.device(d)?;
        let (nx, rows) = (40usize, 30usize);
        // Small integers: every sum is exact in f32, in any order.
        let x: Vec<f32> = (0..nx * rows).map(|v| (v % 11) as f32).collect();
        for (cols, shift, edge) in
            [(0..7usize, 1usize, true), (0..8, 2, false), (3..20, 1, true), (0..39, 1, false)]
        {
            let mut y = vec![-1f32; nx * rows];
            let (mut want, mut sum, mut max) = (y.clone(), 0f32, f32::NEG_INFINITY);
            for row in 1..rows - 1 {
                for col in cols.clone() {
                    let c = row * nx + col;
                    let v = x[c + shift] * 2.0 + x[c];
                    want[c] = v;
                    if edge && row == 1 {
                        want[col] = v;
                    }
                    sum += v;
                    max = max.max(v);
                }
            }
            let got = gpu.data((map::to(&x), map::tofrom(&mut y)), |(xv, yv)| {
                shifted_rows::reduce(&gpu, (1..rows - 1, cols.clone()), nx, shift, edge, xv, yv)
            })?;
            check_eq!(y, want);
            check!(got == (sum, max), "{cols:?}: {got:?}, want {:?}", (sum, max));
            let mut z = vec![-1f32; nx * rows];
            let above = gpu.data((map::to(&x), map::tofrom(&mut z)), |(xv, zv)| {
                shifted_rows_above::reduce(&gpu, (1..rows - 1, cols.clone()), nx, xv, zv)
            })?;
            let want_above: f32 = (1..rows - 1)
                .flat_map(|row| cols.clone().map(move |col| row * nx + col))
                .map(|c| x[c + 1] * 2.0 + x[c])
                .filter(|v| *v > 10.0)
                .sum();
            check!(above == want_above, "{cols:?}: {above}, want {want_above}");
        }
        // The last row's run ends past `x`: the launch fails naming the first index outside
        // (host devices check every load; a GPU's unchecked kernel does not).
        if rt.describe(d)?.kind != offload::BackendKind::Host {
            return Ok(());
        }
        let mut y = vec![0f32; nx * rows];
        let r = gpu.data((map::to(&x), map::tofrom(&mut y)), |(xv, yv)| {
            shifted_rows::reduce(&gpu, (1..rows, 0..nx), nx, 5, false, xv, yv)
        });
        match r.map_err(cause) {
            Err(Error::KernelFailed { message, .. }) => {
                let first_outside = nx * rows;
                check!(message.contains(&format!("`x`: index {first_outside} is out of range")), "{message}")
            }
            other => check!(false, "expected a failed launch, got {other:?}"),
        }
        Ok(())
    });
}

/// An order-sensitive fold of a walk's values (small: no overflow in any order).
const FOLD: u64 = 1_000_003;

/// Each item folds the values of five walks of ranges in the order it visits them:
/// `.step_by` with a step of its own (1 to 5), `.rev()`, `.rev().step_by`, `.step_by.rev()`,
/// over `usize`, inclusive ranges and a signed range crossing zero.
#[offload::kernel(dims = 1)]
fn walks(i: usize, n: usize, out: &mut [u64]) {
    let s = i % 5 + 1;
    let mut up: u64 = 0;
    for k in (i..n).step_by(s) {
        up = (up * 7 + k as u64) % FOLD;
    }
    let mut down: u64 = 0;
    for k in (0..=i).rev() {
        down = (down * 7 + k as u64) % FOLD;
    }
    let mut down_by: u64 = 0;
    for k in (i..=n).rev().step_by(s) {
        down_by = (down_by * 7 + k as u64) % FOLD;
    }
    let mut up_reversed: u64 = 0;
    for k in (0..n).step_by(s).rev() {
        up_reversed = (up_reversed * 7 + k as u64) % FOLD;
    }
    let mut signed: i64 = 0;
    for k in (-7i32..(i as i32) - 3).rev().step_by(s) {
        signed = (signed * 7 + k as i64) % (FOLD as i64);
    }
    out[5 * i] = up;
    out[5 * i + 1] = down;
    out[5 * i + 2] = down_by;
    out[5 * i + 3] = up_reversed;
    out[5 * i + 4] = signed as u64;
}

/// A per-team sum as a tree whose loop walks its levels downwards with `.rev()`: barriers
/// inside a loop whose bounds (and step) are the same for every thread.
#[offload::kernel(teams = 64)]
fn tree_by_levels(team: usize, thread: usize, x: &[f32], sums: &mut [f32]) {
    let mut partial: [f32; 64] = offload::team_local();
    partial[thread] = x[team * 64 + thread];
    offload::barrier();
    for level in (0..6usize).rev().step_by(1) {
        let width = 1usize << level;
        if thread < width {
            partial[thread] += partial[thread + width];
        }
        offload::barrier();
    }
    if thread == 0 {
        sums[team] = partial[0];
    }
}

#[test]
fn loops_walk_ranges_with_step_by_and_rev_as_rust_does() {
    on_every_device("step_by and rev", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 23;
        let mut want = vec![0u64; 5 * n];
        for i in 0..n {
            walks(i, n, &mut want);
        }
        let mut out = vec![0u64; 5 * n];
        gpu.data(map::from(&mut out), |o| walks::launch(&gpu, n, n, o))?;
        check_eq!(out, want);
        let teams = 9;
        let x: Vec<f32> = (0..teams * 64).map(|i| (i % 17) as f32).collect();
        let mut sums = vec![0f32; teams];
        gpu.data((map::to(&x), map::from(&mut sums)), |(x, s)| tree_by_levels::launch(&gpu, teams, x, s))?;
        let want: Vec<f32> = (0..teams).map(|t| x[t * 64..t * 64 + 64].iter().sum()).collect();
        check_eq!(sums, want);
        Ok(())
    });
}

/// C's `typedef float Real;` and `typedef unsigned Index;`, as a port writes them.
type Real = f32;
type Index = u32;

/// A device function over the aliases, told of them with `types(..)`.
#[offload::device(types(Real = f32))]
fn clamp_low(v: Real, low: Real) -> Real {
    if v < low {
        low
    } else {
        v
    }
}

/// A kernel over the aliases: parameters, views, locals, casts, `Real::MAX`, compound
/// assignment, and a team-local array of `Real` (a teams kernel below).
#[offload::kernel(types(Real = f32, Index = u32))]
fn aliased(i: usize, a: Real, every: Index, x: &[Real], y: &mut [Real]) {
    let mut v: Real = a * x[i];
    if (i as Index) % every == 0 {
        v += 1.0;
    }
    v = clamp_low(v, -Real::MAX);
    y[i] = v as Real;
}

#[offload::kernel(teams = 32, types(Real = f32))]
fn aliased_team_sum(team: usize, thread: usize, x: &[Real], sums: &mut [Real]) {
    let mut part: [Real; 32] = offload::team_local();
    part[thread] = x[team * 32 + thread];
    offload::barrier();
    if thread == 0 {
        let mut s: Real = 0.0;
        let mut k = 0usize;
        while k < 32 {
            s += part[k];
            k += 1;
        }
        sums[team] = s;
    }
}

#[test]
fn aliases_of_scalar_types_named_in_types_are_the_scalar_types() {
    on_every_device("type aliases", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 100;
        let x: Vec<Real> = (0..n).map(|i| i as Real).collect();
        let mut y = vec![0.0 as Real; n];
        gpu.data((map::to(&x), map::from(&mut y)), |(x, y)| aliased::launch(&gpu, n, 2.0, 3, x, y))?;
        let mut want = vec![0.0 as Real; n];
        for i in 0..n {
            aliased(i, 2.0, 3, &x, &mut want);
        }
        check_eq!(y, want);
        let teams = 5;
        let x: Vec<Real> = (0..teams * 32).map(|i| (i % 7) as Real).collect();
        let mut sums = vec![0.0 as Real; teams];
        gpu.data((map::to(&x), map::from(&mut sums)), |(x, s)| aliased_team_sum::launch(&gpu, teams, x, s))?;
        let want: Vec<Real> = (0..teams).map(|t| x[t * 32..t * 32 + 32].iter().sum()).collect();
        check_eq!(sums, want);
        Ok(())
    });
}

/// A tile's side, as a C port's `#define BSIZE 8`.
const BSIZE: usize = 8;

/// Team-local arrays sized by constant expressions of module constants (`4 * BSIZE *
/// BSIZE`, `BSIZE + 2`): each team transposes its 8 x 8 tile through one and keeps a
/// halo'd row in the other.
#[offload::kernel(teams = 64)]
fn const_sized_tiles(team: usize, thread: usize, x: &[f32], y: &mut [f32]) {
    let mut tile: [f32; 4 * BSIZE * BSIZE] = offload::team_local();
    let mut row: [f32; BSIZE + 2] = offload::team_local();
    let r = thread / BSIZE;
    let c = thread % BSIZE;
    tile[thread] = x[team * 64 + thread];
    if thread < BSIZE + 2 {
        row[thread] = thread as f32;
    }
    offload::barrier();
    y[team * 64 + thread] = tile[c * BSIZE + r] + row[c + 1] + (tile.len() + row.len()) as f32;
}

#[test]
fn team_local_lengths_may_be_constant_expressions() {
    on_every_device("team-local lengths from constants", |rt, d| {
        let gpu = rt.device(d)?;
        let teams = 3;
        let x: Vec<f32> = (0..teams * 64).map(|i| i as f32).collect();
        let mut y = vec![0f32; teams * 64];
        gpu.data((map::to(&x), map::from(&mut y)), |(x, y)| const_sized_tiles::launch(&gpu, teams, x, y))?;
        let want: Vec<f32> = (0..teams * 64)
            .map(|i| {
                let (t, r, c) = (i / 64, (i % 64) / 8, i % 8);
                x[t * 64 + c * 8 + r] + (c + 1) as f32 + (256 + 10) as f32
            })
            .collect();
        check_eq!(y, want);
        Ok(())
    });
}

/// Threads per team of [`const_team_size`], as a C port's `#define THREADS 64`.
const THREADS: usize = 64;

/// A teams kernel whose team size is a constant expression of module constants
/// (`teams = BSIZE * BSIZE`), with team-local arrays sized the same way, and a block-stride
/// loop whose stride is the constant `teams` names in another kernel.
#[offload::kernel(teams = BSIZE * BSIZE)]
fn const_team_size(team: usize, thread: usize, x: &[f32], y: &mut [f32]) {
    let mut tile: [f32; BSIZE * BSIZE] = offload::team_local();
    tile[thread] = x[team * BSIZE * BSIZE + thread];
    offload::barrier();
    y[team * BSIZE * BSIZE + thread] = tile[BSIZE * BSIZE - 1 - thread];
}

/// Each team sums a row of `w` values with a block-stride loop over `THREADS` (the
/// constant `teams = THREADS` names), then a tree.
#[offload::kernel(teams = THREADS)]
fn row_sums_by_const(team: usize, thread: usize, w: usize, x: &[f32], sums: &mut [f32]) {
    let mut part: [f32; THREADS] = offload::team_local();
    let mut s = 0.0f32;
    let mut c = thread;
    while c < w {
        s += x[team * w + c];
        c += THREADS;
    }
    part[thread] = s;
    offload::barrier();
    for level in (0..6usize).rev() {
        let width = 1usize << level;
        if thread < width {
            part[thread] += part[thread + width];
        }
        offload::barrier();
    }
    if thread == 0 {
        sums[team] = part[0];
    }
}

#[test]
fn a_team_size_may_be_a_constant_expression() {
    on_every_device("teams = constants", |rt, d| {
        let gpu = rt.device(d)?;
        let teams = 4;
        let x: Vec<f32> = (0..teams * 64).map(|i| i as f32).collect();
        let mut y = vec![0f32; teams * 64];
        gpu.data((map::to(&x), map::from(&mut y)), |(x, y)| const_team_size::launch(&gpu, teams, x, y))?;
        let want: Vec<f32> = (0..teams * 64).map(|i| x[(i / 64) * 64 + 63 - i % 64]).collect();
        check_eq!(y, want);
        let w = 200;
        let x: Vec<f32> = (0..teams * w).map(|i| (i % 11) as f32).collect();
        let mut sums = vec![0f32; teams];
        gpu.data((map::to(&x), map::from(&mut sums)), |(x, s)| {
            row_sums_by_const::launch(&gpu, teams, w, x, s)
        })?;
        let want: Vec<f32> = (0..teams).map(|t| x[t * w..(t + 1) * w].iter().sum()).collect();
        check_eq!(sums, want);
        // The host twin knows `c += THREADS` for the team's stride: it runs in rounds.
        let path = row_sums_by_const::KERNEL.host_path().unwrap_or_default();
        check!(path.contains("teams of THREADS") && path.contains("in rounds"), "{path}");
        Ok(())
    });
}

/// A row-wise normalisation written as a C port writes `parallel for reduction(+: ..)`
/// inside a team: each team walks its row with a block-stride loop, and two team sums give
/// the mean and the variance every thread needs. Also the team's min, max and an integer
/// product.
#[offload::kernel(teams = 64)]
fn normalise_with_team_sums(
    team: usize,
    thread: usize,
    w: usize,
    x: &[f32],
    y: &mut [f32],
    stats: &mut [f32],
) {
    let mut s = 0.0f32;
    let mut c = thread;
    while c < w {
        s += x[team * w + c];
        c += 64;
    }
    let total = offload::team_sum(s);
    let mean = total / w as f32;
    let mut q = 0.0f32;
    c = thread;
    while c < w {
        let d = x[team * w + c] - mean;
        q += d * d;
        c += 64;
    }
    let squares = offload::team_sum(q);
    let var = squares / w as f32;
    let inv = 1.0f32 / (var + 1.0e-5f32).sqrt();
    c = thread;
    while c < w {
        y[team * w + c] = (x[team * w + c] - mean) * inv;
        c += 64;
    }
    let lo = offload::team_min(if thread < w { x[team * w + thread] } else { f32::MAX });
    let hi = offload::team_max(if thread < w { x[team * w + thread] } else { f32::MIN });
    let odd: u32 = offload::team_product(if thread % 16 == 0 { 2u32 } else { 1u32 });
    if thread == 0 {
        stats[4 * team] = mean;
        stats[4 * team + 1] = lo;
        stats[4 * team + 2] = hi;
        stats[4 * team + 3] = odd as f32;
    }
}

#[test]
fn team_reductions_give_every_thread_the_teams_value() {
    on_every_device("team reductions", |rt, d| {
        let gpu = rt.device(d)?;
        let (teams, w) = (6usize, 200usize);
        // Small integers: every sum is exact in any order.
        let x: Vec<f32> = (0..teams * w).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let mut y = vec![0f32; teams * w];
        let mut stats = vec![0f32; 4 * teams];
        gpu.data((map::to(&x), map::from(&mut y), map::from(&mut stats)), |(x, y, s)| {
            normalise_with_team_sums::launch(&gpu, teams, w, x, y, s)
        })?;
        for t in 0..teams {
            let row = &x[t * w..(t + 1) * w];
            let mean = row.iter().sum::<f32>() / w as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / w as f32;
            let (lo, hi) = row[..64].iter().fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
            check_eq!(stats[4 * t], mean);
            check_eq!((stats[4 * t + 1], stats[4 * t + 2], stats[4 * t + 3]), (lo, hi, 16.0));
            for c in 0..w {
                let want = (row[c] - mean) / (var + 1.0e-5).sqrt();
                let got = y[t * w + c];
                // The squares' sum is exact too, but the GPU may fuse `d * d + q`.
                check!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "team {t} column {c}: {got} vs {want}"
                );
            }
        }
        Ok(())
    });
}

/// Barriers under conditions and loop bounds that are the same for every thread of the
/// team: a `while` over a `let mut` local set from the team's number, an `if` on a kernel
/// argument, a `loop` with a uniform step count. Each pass doubles the team's block
/// through a team-local array (a thread reads another's element: only a barrier makes it
/// safe).
#[offload::kernel(teams = 32)]
fn uniform_barriers(team: usize, thread: usize, passes: usize, mirror: bool, x: &[f32], y: &mut [f32]) {
    let mut tile: [f32; 32] = offload::team_local();
    let mut v = x[team * 32 + thread];
    let mut left = team % 3 + passes;
    while left > 0 {
        tile[thread] = v;
        offload::barrier();
        v = tile[thread] + tile[31 - thread];
        offload::barrier();
        left -= 1;
    }
    if mirror {
        tile[thread] = v;
        offload::barrier();
        v = tile[31 - thread];
    }
    let mut k = 0usize;
    loop {
        offload::barrier();
        k += 1;
        if k == 2 {
            y[team * 32 + thread] = v;
        }
        if k >= 2 {
            break;
        }
    }
}

#[test]
fn barriers_stand_under_conditions_the_same_for_every_thread() {
    on_every_device("uniform barriers", |rt, d| {
        let gpu = rt.device(d)?;
        let teams = 5usize;
        let x: Vec<f32> = (0..teams * 32).map(|i| (i % 9) as f32).collect();
        for (passes, mirror) in [(1usize, false), (2, true)] {
            let mut y = vec![0f32; teams * 32];
            gpu.data((map::to(&x), map::from(&mut y)), |(x, y)| {
                uniform_barriers::launch(&gpu, teams, passes, mirror, x, y)
            })?;
            let mut want = vec![0f32; teams * 32];
            for t in 0..teams {
                let mut v: Vec<f32> = x[t * 32..(t + 1) * 32].to_vec();
                for _ in 0..t % 3 + passes {
                    v = (0..32).map(|i| v[i] + v[31 - i]).collect();
                }
                if mirror {
                    v = (0..32).map(|i| v[31 - i]).collect();
                }
                want[t * 32..(t + 1) * 32].copy_from_slice(&v);
            }
            check_eq!(y, want);
        }
        Ok(())
    });
}

/// A row normalisation whose team size is chosen at launch (`teams = ..=1024`, the port's
/// run-time block size): a block-stride loop over `offload::team_size()`, two team sums.
#[offload::kernel(teams = ..=1024)]
fn normalise_any_team(team: usize, thread: usize, w: usize, x: &[f32], y: &mut [f32], sizes: &mut [u32]) {
    let mut s = 0.0f32;
    let mut c = thread;
    while c < w {
        s += x[team * w + c];
        c += offload::team_size();
    }
    let total = offload::team_sum(s);
    let mean = total / w as f32;
    c = thread;
    while c < w {
        y[team * w + c] = x[team * w + c] - mean;
        c += offload::team_size();
    }
    if thread == 0 {
        sizes[team] = offload::team_size() as u32;
    }
}

#[test]
fn a_team_size_may_be_given_at_launch() {
    on_every_device("team size at launch", |rt, d| {
        let gpu = rt.device(d)?;
        let (teams, w) = (5usize, 300usize);
        let x: Vec<f32> = (0..teams * w).map(|i| ((i * 5) % 17) as f32).collect();
        for size in [32usize, 64, 256, 1024] {
            let mut y = vec![0f32; teams * w];
            let mut sizes = vec![0u32; teams];
            gpu.data((map::to(&x), map::from(&mut y), map::from(&mut sizes)), |(x, y, s)| {
                normalise_any_team::launch(&gpu, teams, size, w, x, y, s)
            })?;
            check!(sizes.iter().all(|&s| s as usize == size), "team size {size}: {sizes:?}");
            for t in 0..teams {
                let row = &x[t * w..(t + 1) * w];
                let mean = row.iter().sum::<f32>() / w as f32;
                check!(
                    (0..w).all(|c| y[t * w + c] == row[c] - mean),
                    "team size {size}, team {t}: {:?}",
                    &y[t * w..t * w + 4]
                );
            }
        }
        // The nowait form: `args` carries the size, which the launch runs with.
        let mut y = vec![0f32; teams * w];
        let mut sizes = vec![0u32; teams];
        gpu.data((map::to(&x), map::from(&mut y), map::from(&mut sizes)), |(xv, yv, sv)| {
            let (n, a) = normalise_any_team::args(teams, 128, w, xv, yv, sv)?;
            rt.nowait(|s| s.launch(d, &normalise_any_team::KERNEL, n, a, &[])?.wait())?
        })?;
        check!(sizes.iter().all(|&s| s == 128), "nowait: {sizes:?}");
        // Sizes outside 1..=1024, or not whole warps (the kernel reduces), are refused.
        let mut y = vec![0f32; teams * w];
        let mut sizes = vec![0u32; teams];
        for (size, needle) in [(0usize, "1 to 1024"), (2048, "1 to 1024"), (48, "whole warps")] {
            let r = gpu.data((map::to(&x), map::from(&mut y), map::from(&mut sizes)), |(x, y, s)| {
                normalise_any_team::launch(&gpu, teams, size, w, x, y, s)
            });
            check!(
                matches!(&r, Err(offload::Error::KernelArgument { what, .. }) if what.contains(needle)),
                "size {size}: {r:?}"
            );
        }
        check!(normalise_any_team::KERNEL.host_path().unwrap_or_default().contains("in rounds"), "rounds");
        Ok(())
    });
}

/// Index arithmetic whose 32-bit form would differ from the 64-bit one unless the narrow
/// variant keeps 64 bits where a value is needed whole: a square past 2^60 reduced by `%`,
/// a sum past 2^32 divided, a shift past 32 bits undone, a walk by a stride of about 2^30
/// that ends past 2^32, a product past 2^32 compared; and element indices (whose low half
/// is all an element needs).
#[offload::kernel(dims = 1)]
fn index_arithmetic(i: usize, n: usize, big: usize, x: &[f32], out: &mut [u64]) {
    let k: usize = i + big;
    let square_mod: usize = k * k % n;
    let quotient: usize = (i * 3 + big * 4) / 7;
    let shifted: usize = (big << 3) >> 2;
    let mut j: usize = i;
    let mut steps: usize = 0;
    while j < big * 4 + i {
        j += big;
        steps += 1;
    }
    let above: usize = if k * 8 > big * 7 { 1 } else { 0 };
    let near: usize = i * 2 + 1 - 1;
    out[6 * i] = square_mod as u64;
    out[6 * i + 1] = quotient as u64;
    out[6 * i + 2] = shifted as u64;
    out[6 * i + 3] = (j as u64) * 16 + steps as u64;
    out[6 * i + 4] = above as u64;
    out[6 * i + 5] = x[near / 2] as u64;
}

/// What `index_arithmetic` stores, in 64-bit arithmetic on the host.
fn index_arithmetic_expected(items: usize, n: u64, big: u64, x: &[f32]) -> Vec<u64> {
    let mut want = Vec::new();
    for i in 0..items as u64 {
        let k = i + big;
        let (mut j, mut steps) = (i, 0u64);
        while j < big * 4 + i {
            j += big;
            steps += 1;
        }
        want.extend([
            k * k % n,
            (i * 3 + big * 4) / 7,
            (big << 3) >> 2,
            j * 16 + steps,
            u64::from(k * 8 > big * 7),
            x[i as usize] as u64,
        ]);
    }
    want
}

/// The GPU runs `KERNEL_NARROW` when every bound fits (2^30 here, the most it takes) and
/// `KERNEL` with `narrow_indices(false)`; both give the 64-bit values, as the host twin does.
#[test]
fn index_arithmetic_gives_the_64_bit_values_in_either_variant() {
    let (items, n, big) = (1000usize, 1_000_003usize, 1usize << 30);
    let x: Vec<f32> = (0..items).map(|i| (i % 97) as f32).collect();
    let want = index_arithmetic_expected(items, n as u64, big as u64, &x);
    for narrow in [true, false] {
        offload_tests::on_every_device_with(
            "index arithmetic",
            |b| b.narrow_indices(narrow),
            |rt, d| {
                let gpu = rt.device(d)?;
                let mut out = vec![0u64; 6 * items];
                // `KERNEL` itself (not the checked variant a debug build's `launch` runs),
                // which a GPU runs as `KERNEL_NARROW` here unless `narrow_indices(false)`.
                gpu.data((map::to(&x), map::from(&mut out)), |(xv, ov)| {
                    let (n_items, a) = index_arithmetic::args(items, n, big, xv, ov)?;
                    gpu.launch(&index_arithmetic::KERNEL, n_items, a)
                })?;
                for (i, (got, want)) in out.chunks(6).zip(want.chunks(6)).enumerate() {
                    check!(got == want, "item {i}, narrow_indices({narrow}): {got:?}, expected {want:?}");
                }
                Ok(())
            },
        );
    }
}

#[test]
fn a_launch_runs_the_narrow_variant_only_when_every_bound_fits() {
    use offload::kernel::{KernelArg, Scalar, NARROW_LIMIT};
    let k = &index_arithmetic::KERNEL;
    let narrow = k.narrow_variant().expect("a generated kernel has a narrow variant");
    assert_eq!(narrow.symbol(), "index_arithmetic__offload_narrow");
    assert!(narrow.cuda_source().is_some_and(|c| c.contains("unsigned int")));
    // The block: start, n, big, x, out, then the two views' lengths.
    let word = |v: u64| KernelArg::Scalar(Scalar::U64(v));
    let ptr = KernelArg::Ptr { addr: 0x1000, bytes: None };
    let args = |start: u64, n: u64, big: u64, len: u64| {
        [word(start), word(n), word(big), ptr, ptr, word(len), word(len)]
    };
    let fits = NARROW_LIMIT;
    assert_eq!(k.for_launch(1000, &args(0, 7, fits, 6000)).symbol(), narrow.symbol());
    assert_eq!(k.for_launch(1 << 30, &args(fits, fits, fits, fits)).symbol(), narrow.symbol());
    // Any bound past the limit: the 64-bit kernel.
    for (items, a) in [
        ((1 << 30) + 1, args(0, 7, 0, 6)),
        (1000, args(fits + 1, 7, 0, 6000)),
        (1000, args(0, fits + 1, 0, 6000)),
        (1000, args(0, 7, fits + 1, 6000)),
        (1000, args(0, 7, 0, fits + 1)),
    ] {
        assert_eq!(k.for_launch(items, &a).symbol(), "index_arithmetic", "{a:?}");
    }
    // No items: the 64-bit kernel (the inner lengths' product is not bounded then).
    assert_eq!(k.for_launch(0, &args(0, 7, 0, 0)).symbol(), "index_arithmetic");
    // The launch's block size is kept (a team size given at launch).
    let sized = offload::Kernel::new("x").with_block(64).with_narrow(narrow);
    assert_eq!(sized.for_launch(10, &args(0, 7, 0, 60)).block(), 64);
}

/// `KERNEL_NARROW` launched by name runs only within its bounds (its indices would wrap):
/// a bound past 2^30, or no items, is refused on every device; within them it runs.
#[test]
fn a_narrow_variant_launched_by_name_is_refused_outside_its_bounds() {
    on_every_device("narrow variant by name", |rt, d| {
        let gpu = rt.device(d)?;
        let x = vec![1f32; 8];
        let mut out = vec![0u64; 48];
        gpu.data((map::to(&x), map::from(&mut out)), |(xv, ov)| {
            let (items, a) = index_arithmetic::args(8, 7, 3, xv, ov)?;
            gpu.launch(&index_arithmetic::KERNEL_NARROW, items, a)
        })?;
        check_eq!(out[5], 1);
        let mut out = vec![0u64; 48];
        for (items, big) in [(8usize, (1usize << 30) + 1), (0, 3)] {
            let r = gpu.data((map::to(&x), map::from(&mut out)), |(xv, ov)| {
                let (n, a) = index_arithmetic::args(items, 7, big, xv, ov)?;
                gpu.launch(&index_arithmetic::KERNEL_NARROW, n, a)
            });
            check!(
                matches!(&r, Err(Error::KernelArgument { what, .. }) if what.contains("32 bits")),
                "{items} items, big {big}: {r:?}"
            );
        }
        Ok(())
    });
}

/// An inclusive range that ends at its type's largest value ends, as Rust's `..=` does (a
/// C loop `j <= end; ++j` would not).
#[offload::kernel]
fn up_to_the_top(i: usize, top: u32, wide: u64, out: &mut [u32]) {
    let mut count = 0u32;
    for _j in (top - 2)..=top {
        count += 1;
    }
    for _k in (wide - 1)..=wide {
        count += 10;
    }
    out[i] = count;
}

#[test]
fn an_inclusive_range_to_the_types_largest_value_ends() {
    on_every_device("inclusive range to the top", |rt, d| {
        let gpu = rt.device(d)?;
        let mut out = vec![0u32; 4];
        gpu.data(map::from(&mut out), |o| {
            let (n, a) = up_to_the_top::args(4, u32::MAX, u64::MAX, o)?;
            gpu.launch(&up_to_the_top::KERNEL, n, a)
        })?;
        check_eq!(out, vec![23u32; 4]);
        Ok(())
    });
}
