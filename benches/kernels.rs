//! Generated (`#[offload::kernel]`) vs hand-written kernels, side by side in one run:
//! fill, saxpy and sum over 256 MiB of `f32` (GB/s), and the Jacobi solver on a
//! 16384 x 16384 grid for 1000 iterations (s).
//!
//! Two views of the element-wise kernels: the GPU time of one launch by CUDA events (the
//! same CUDA sources the runtime compiles, launched raw through cudarc with the grid the
//! runtime gives each: one block per 256 items for the hand-written kernels, at most one
//! wave of the device for the generated grid-stride ones), and the wall time of a launch
//! through the runtime (launch + synchronize, as a user sees it). Medians after warm-up,
//! the two variants alternating.
//!
//! `cargo bench -p offload-benches --bench kernels` (needs a GPU: says so and exits 0
//! without one). `JACOBI_NITER`, `JACOBI_N` and `JACOBI_RUNS` change the Jacobi run
//! (1000, 16384, 3); `KERNELS_DUMP=dir` writes the generated Jacobi variants' sources
//! there, for `nvcc`/`ncu`.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use offload::{map, Kernel, Runtime};
use offload_benches::{Bench, Budget};
use offload_examples::jacobi::{self, KernelChoice};
use offload_kernels::{generated, FILL_F32, SAXPY, SUM_F32};

const N: usize = 64 << 20; // 256 MiB of f32
const BLOCK: u32 = 256;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A kernel loaded raw, with the grid the runtime would launch it with.
struct Raw {
    f: CudaFunction,
    blocks: u32,
}

fn load(
    ctx: &Arc<CudaContext>,
    arch: &'static str,
    k: &Kernel,
    sms: u32,
) -> Result<Raw, Box<dyn std::error::Error>> {
    let src = k.cuda_source().ok_or("no CUDA source")?;
    let opts = cudarc::nvrtc::CompileOptions { arch: Some(arch), ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts)?;
    let f = ctx.load_module(ptx)?.load_function(k.symbol())?;
    let mut blocks = N.div_ceil(BLOCK as usize) as u32;
    if k.is_grid_stride() {
        blocks = blocks.min(sms * f.occupancy_max_active_blocks_per_multiprocessor(BLOCK, 0, None)?);
    }
    Ok(Raw { f, blocks })
}

/// How long criterion spends on one kernel: 20 samples over about a second.
const KERNEL_BUDGET: Budget = Budget { samples: 20, ..Budget::SLOW };

/// Median milliseconds per launch of `launch` on `s`, measured as `id`: criterion's
/// samples, each a run of back-to-back launches timed by CUDA events around it.
fn event_ms(
    bench: &mut Bench,
    id: &str,
    s: &Arc<CudaStream>,
    mut launch: impl FnMut(),
) -> Result<f64, Box<dyn std::error::Error>> {
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let secs = bench.custom(id, KERNEL_BUDGET, |iters| {
        let a = s.record_event(flags).expect("event");
        for _ in 0..iters {
            launch();
        }
        let b = s.record_event(flags).expect("event");
        let ms = a.elapsed_ms(&b).expect("elapsed");
        std::time::Duration::from_secs_f64(f64::from(ms) * 1e-3)
    });
    Ok(secs * 1e3)
}

/// GPU time of one Jacobi step on a 16384 x 16384 grid: the hand-written kernel, and the
/// generated one as generated and with variations of its loop (to choose the generator's).
fn jacobi_kernels(
    bench: &mut Bench,
    ctx: &Arc<CudaContext>,
    arch: &'static str,
    sms: u32,
    s: &Arc<CudaStream>,
) -> Result<(), Box<dyn std::error::Error>> {
    let side = env("JACOBI_N", 16384);
    let (nx, ny) = (side as u64, side as u64);
    let grid = vec![0.5f32; side * side];
    let (da, mut db) = (s.clone_htod(&grid)?, s.clone_htod(&grid)?);
    let (mut norm, mut next) = (s.alloc_zeros::<f32>(2)?, s.alloc_zeros::<f32>(1)?);
    println!("\nOne Jacobi step {side} x {side}, GPU time by CUDA events, median of criterion's samples\n");
    println!("| kernel | grid | ms per step |\n|---|---|---|");
    let compile = |src: &str, sym: &str| -> Result<CudaFunction, Box<dyn std::error::Error>> {
        let opts = cudarc::nvrtc::CompileOptions { arch: Some(arch), ..Default::default() };
        Ok(ctx.load_module(cudarc::nvrtc::compile_ptx_with_opts(src, opts)?)?.load_function(sym)?)
    };
    // Hand-written: 16 rows per thread, columns padded to warps.
    let tuned =
        compile(offload_kernels::stencil::JACOBI_STEP.cuda_source().ok_or("no source")?, "jacobi_step")?;
    let (rows, cols_pad) = (16u64, (nx - 2).next_multiple_of(32));
    let tn = cols_pad * (ny - 2).div_ceil(rows);
    let (one, slot, end, null) = (1u64, 0u64, ny - 1, 0u64);
    let tcfg = LaunchConfig {
        grid_dim: (tn.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the hand-written kernel's signature (a, a_new, norm, nx, iy_start, iy_end, rows,
    // slot, cols_pad, push_first, push_last, n); null pushes; grids of nx * ny floats.
    let ms = event_ms(bench, "jacobi_step/tuned", s, || unsafe {
        s.launch_builder(&tuned)
            .arg(&da)
            .arg(&mut db)
            .arg(&mut norm)
            .arg(&nx)
            .arg(&one)
            .arg(&end)
            .arg(&rows)
            .arg(&slot)
            .arg(&cols_pad)
            .arg(&null)
            .arg(&null)
            .arg(&tn)
            .launch(tcfg)
            .expect("launch");
    })?;
    println!("| hand-written (16 rows per thread) | {} blocks | {ms:.4} |", tcfg.grid_dim.0);
    let src = generated::jacobi_step::KERNEL.cuda_source().ok_or("no source")?;
    // Variants: the strip length (the kernel's `rows = 4`) and a minimum of resident
    // blocks per SM (which caps registers), or one block per 256 strips (no grid stride).
    let var = |r: u32, min_blocks: u32| {
        let v = src.replace("__offload_rows = 4u;", &format!("__offload_rows = {r}u;"));
        if min_blocks == 0 {
            v
        } else {
            v.replace("__launch_bounds__(256)", &format!("__launch_bounds__(256, {min_blocks})"))
        }
    };
    let full = |r: u64| ((nx - 2) * (ny - 2).div_ceil(r)).div_ceil(256) as u32;
    let narrow = generated::jacobi_step::KERNEL_NARROW.cuda_source().ok_or("no narrow source")?;
    // The narrow variant needs fewer registers, so its one wave has more blocks: also timed
    // on the 64-bit variant's grid, which tells the index arithmetic from the occupancy.
    let wave64 =
        sms * compile(src, "jacobi_step")?.occupancy_max_active_blocks_per_multiprocessor(256, 0, None)?;
    let variants = [
        ("generated (rows = 4), one wave", src.to_string(), 0u32),
        ("generated (rows = 4), one wave, 32-bit indices (KERNEL_NARROW)", narrow.to_string(), 0u32),
        (
            "generated (rows = 4), 32-bit indices (KERNEL_NARROW), the 64-bit one wave's grid",
            narrow.to_string(),
            wave64,
        ),
        ("generated, rows = 1", var(1, 0), 0),
        ("generated, rows = 2", var(2, 0), 0),
        ("generated, rows = 8", var(8, 0), 0),
        ("generated, rows = 16", var(16, 0), 0),
        ("generated, rows = 16, a block per 256 strips", var(16, 0), full(16)),
        ("generated, rows = 2, >= 8 blocks/SM", var(2, 8), 0),
        ("generated, rows = 4, >= 6 blocks/SM", var(4, 6), 0),
        ("generated, rows = 8, >= 5 blocks/SM", var(8, 5), 0),
        ("generated, rows = 2, a block per 256 strips", var(2, 0), full(2)),
        ("generated, rows = 4, a block per 256 strips", src.to_string(), full(4)),
    ];
    let (l1, n, wrap) = (nx - 2, (nx - 2) * (ny - 2), 1u32);
    let (len, two) = (nx * ny, 1u64);
    let dump = std::env::var_os("KERNELS_DUMP");
    for (k, (what, src, blocks)) in variants.into_iter().enumerate() {
        if let Some(dir) = &dump {
            std::fs::write(std::path::Path::new(dir).join(format!("jacobi-generated-{k}.cu")), &src)?;
        }
        let symbol = if src.contains("jacobi_step__offload_narrow(") {
            "jacobi_step__offload_narrow"
        } else {
            "jacobi_step"
        };
        let f = compile(&src, symbol)?;
        let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(256, 0, None)?;
        let cfg = LaunchConfig {
            grid_dim: (if blocks == 0 { sms * per_sm } else { blocks }, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the generated layout: s0, s1, l1, nx, iy_end, wrap, a, a_new, norm, next_norm,
        // their four lengths, n; the grids hold nx * ny floats, the norms one each.
        let ms = event_ms(bench, &format!("jacobi_step/{what}"), s, || unsafe {
            s.launch_builder(&f)
                .arg(&one)
                .arg(&one)
                .arg(&l1)
                .arg(&nx)
                .arg(&end)
                .arg(&wrap)
                .arg(&da)
                .arg(&mut db)
                .arg(&mut norm)
                .arg(&mut next)
                .arg(&len)
                .arg(&len)
                .arg(&two)
                .arg(&two)
                .arg(&n)
                .launch(cfg)
                .expect("launch");
        })?;
        println!("| {what} | {} blocks ({per_sm} per SM) | {ms:.4} |", cfg.grid_dim.0);
    }
    // The same step without the halo stores and the norm reset (a plain stencil with its
    // norm): what those branches cost.
    let f = compile(plain_jacobi::KERNEL.cuda_source().ok_or("no source")?, "plain_jacobi")?;
    let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(256, 0, None)?;
    let cfg = LaunchConfig { grid_dim: (sms * per_sm, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the generated layout: s0, s1, l1, nx, a, a_new, norm, their lengths, n.
    let ms = event_ms(bench, "jacobi_step/plain", s, || unsafe {
        s.launch_builder(&f)
            .arg(&one)
            .arg(&one)
            .arg(&l1)
            .arg(&nx)
            .arg(&da)
            .arg(&mut db)
            .arg(&mut norm)
            .arg(&len)
            .arg(&len)
            .arg(&two)
            .arg(&n)
            .launch(cfg)
            .expect("launch");
    })?;
    println!(
        "| generated, no halo stores or norm reset (rows = 4) | {} blocks ({per_sm} per SM) | {ms:.4} |",
        cfg.grid_dim.0
    );
    // The teams form (`generated::jacobi_teams`): 256 columns x `strip` rows a team, one
    // wave of blocks looping over the teams, or one block per team.
    let k = &generated::jacobi_teams::KERNEL;
    let f = compile(k.cuda_source().ok_or("no source")?, k.symbol())?;
    let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(256, 0, None)?;
    let col_blocks = (nx - 2).div_ceil(256);
    for (strip, one_per_team) in [(16u64, false), (16, true), (32, false), (32, true), (8, true)] {
        let teams = col_blocks * (ny - 2).div_ceil(strip);
        let blocks = if one_per_team { teams as u32 } else { (teams as u32).min(sms * per_sm) };
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (s0, team_items) = (0u64, teams * 256);
        // SAFETY: the generated layout: s0, nx, iy_start, iy_end, strip_rows, col_blocks,
        // wrap, a, a_new, norm, next_norm, their four lengths, n (teams x 256).
        let ms = event_ms(bench, &format!("jacobi_step/teams/{strip}/{one_per_team}"), s, || unsafe {
            s.launch_builder(&f)
                .arg(&s0)
                .arg(&nx)
                .arg(&one)
                .arg(&end)
                .arg(&strip)
                .arg(&col_blocks)
                .arg(&wrap)
                .arg(&da)
                .arg(&mut db)
                .arg(&mut norm)
                .arg(&mut next)
                .arg(&len)
                .arg(&len)
                .arg(&two)
                .arg(&two)
                .arg(&team_items)
                .launch(cfg)
                .expect("launch");
        })?;
        let grid = if one_per_team { "a block per team" } else { "one wave" };
        println!("| teams (256 columns x {strip} rows a team), {grid} | {blocks} blocks ({per_sm} per SM) | {ms:.4} |");
    }
    Ok(())
}

/// The Jacobi port's step (`examples/ports/jacobi.rs`) as OpenMP writes it: `collapse(2)`
/// over `i` (outer) and `j` (inner), `i` the unit-stride index.
#[offload::kernel(dims = 2, reduction(+: error))]
fn port_omp_order(i: usize, j: usize, n: usize, f_old: &[f32], f: &mut [f32], error: &mut f32) {
    let t: f32 = 0.25f32
        * (f_old[(i - 1) + j * n] + f_old[(i + 1) + j * n] + f_old[i + (j - 1) * n] + f_old[i + (j + 1) * n]);
    let df: f32 = t - f_old[i + j * n];
    f[i + j * n] = t;
    *error += df * df;
}

/// The same step written in the coalesced order (`j` outer, `i` inner).
#[offload::kernel(dims = 2, reduction(+: error))]
fn port_c_order(j: usize, i: usize, n: usize, f_old: &[f32], f: &mut [f32], error: &mut f32) {
    let t: f32 = 0.25f32
        * (f_old[(i - 1) + j * n] + f_old[(i + 1) + j * n] + f_old[i + (j - 1) * n] + f_old[i + (j + 1) * n]);
    let df: f32 = t - f_old[i + j * n];
    f[i + j * n] = t;
    *error += df * df;
}

/// GPU time of the Jacobi port's step in OpenMP's loop order and in the coalesced order
/// (the generator maps the unit-stride index to consecutive threads in both).
fn loop_orders(
    bench: &mut Bench,
    ctx: &Arc<CudaContext>,
    arch: &'static str,
    sms: u32,
    s: &Arc<CudaStream>,
) -> Result<(), Box<dyn std::error::Error>> {
    let side = env("PORT_N", 4096);
    let n = side as u64;
    let grid: Vec<f32> = (0..side * side).map(|k| (k % 97) as f32 * 0.01).collect();
    let (fa, mut fb) = (s.clone_htod(&grid)?, s.clone_htod(&grid)?);
    let mut err = s.alloc_zeros::<f32>(1)?;
    println!(
        "\nThe Jacobi port's step {side} x {side}, GPU time by CUDA events, median of criterion's samples\n"
    );
    println!("| kernel | thread mapping | ms per step |\n|---|---|---|");
    let (one, inner, items, len, elen) = (1u64, n - 2, (n - 2) * (n - 2), n * n, 1u64);
    let mut times = Vec::new();
    for (what, k) in
        [("OpenMP order (i, j)", &port_omp_order::KERNEL), ("coalesced order (j, i)", &port_c_order::KERNEL)]
    {
        let opts = cudarc::nvrtc::CompileOptions { arch: Some(arch), ..Default::default() };
        let src = k.cuda_source().ok_or("no source")?;
        let f =
            ctx.load_module(cudarc::nvrtc::compile_ptx_with_opts(src, opts)?)?.load_function(k.symbol())?;
        let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(256, 0, None)?;
        let cfg =
            LaunchConfig { grid_dim: (sms * per_sm, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the generated layout: s0, s1, l1, n, f_old, f, error, their three lengths,
        // the item count; the grids hold n * n floats, the error one.
        let ms = event_ms(bench, &format!("port/{what}"), s, || unsafe {
            s.launch_builder(&f)
                .arg(&one)
                .arg(&one)
                .arg(&inner)
                .arg(&n)
                .arg(&fa)
                .arg(&mut fb)
                .arg(&mut err)
                .arg(&len)
                .arg(&len)
                .arg(&elen)
                .arg(&items)
                .launch(cfg)
                .expect("launch");
        })?;
        println!("| {what} | {} | {ms:.4} |", k.thread_map().unwrap_or("?"));
        times.push(ms);
    }
    println!("\nOpenMP order / coalesced order: {:.3}", times[0] / times[1]);
    Ok(())
}

/// The Jacobi update and its norm, nothing else.
#[offload::kernel(dims = 2, reduction(+: norm), rows = 4)]
fn plain_jacobi(iy: usize, ix: usize, nx: usize, a: &[f32], a_new: &mut [f32], norm: &mut f32) {
    let c = iy * nx + ix;
    let v = 0.25f32 * (a[c + 1] + a[c - 1] + a[c + nx] + a[c - nx]);
    a_new[c] = v;
    let r = v - a[c];
    *norm += r * r;
}

fn row(what: &str, generated: f64, tuned: f64, unit: &str) {
    let ratio = if unit == "s" { tuned / generated } else { generated / tuned };
    println!("| {what:<44} | {generated:>10.1} {unit} | {tuned:>10.1} {unit} | {:>6.3} |", ratio);
}

/// The same kernels through the runtime: wall time per launch + synchronize, on views of
/// `x` and of output buffers, with `a` (saxpy) and `v` (fill).
fn through_the_runtime(
    bench: &mut Bench,
    rt: &Runtime,
    x: &[f32],
    a: f32,
    v: f32,
) -> Result<(), Box<dyn std::error::Error>> {
    let gb = |bytes: usize, ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
    println!(
        "\nWall time per launch through the runtime (launch + synchronize), median of criterion's samples\n"
    );
    println!("| kernel | generated | hand-written | ratio |\n|---|---|---|---|");
    let gpu = rt.device(0)?;
    let mut y = vec![0f32; N];
    let mut out = [0f32];
    gpu.data((map::to(x), map::tofrom(&mut y), map::tofrom(&mut out)), |(xv, yv, ov)| {
        let g = bench.wall("runtime/fill/generated", KERNEL_BUDGET, || {
            generated::fill_f32::launch(&gpu, N, v, yv).expect("launch")
        });
        let h = bench.wall("runtime/fill/hand-written", KERNEL_BUDGET, || {
            gpu.launch(&FILL_F32, N, (v, yv)).expect("launch")
        });
        row("fill, GB/s", gb(4 * N, g * 1e3), gb(4 * N, h * 1e3), "GB/s");
        let g = bench.wall("runtime/saxpy/generated", KERNEL_BUDGET, || {
            generated::saxpy::launch(&gpu, N, a, xv, yv).expect("launch")
        });
        let h = bench.wall("runtime/saxpy/hand-written", KERNEL_BUDGET, || {
            gpu.launch(&SAXPY, N, (a, xv, yv)).expect("launch")
        });
        row("saxpy, GB/s", gb(12 * N, g * 1e3), gb(12 * N, h * 1e3), "GB/s");
        let g = bench.wall("runtime/sum/generated", KERNEL_BUDGET, || {
            generated::sum_f32::launch(&gpu, N, xv, ov).expect("launch")
        });
        let h = bench.wall("runtime/sum/hand-written", KERNEL_BUDGET, || {
            gpu.launch(&SUM_F32, N, (xv, ov)).expect("launch")
        });
        row("sum, GB/s", gb(4 * N, g * 1e3), gb(4 * N, h * 1e3), "GB/s");
        Ok(())
    })?;

    Ok(())
}

/// The Jacobi solver on device 0 with the generated, hand-written and teams kernels,
/// alternating (`JACOBI_N`, `JACOBI_NITER`, `JACOBI_RUNS`); the grids must agree.
fn jacobi_solvers(rt: &Runtime) -> Result<(), Box<dyn std::error::Error>> {
    let side = env("JACOBI_N", 16384);
    let runs = env("JACOBI_RUNS", 3).max(1);
    let args = |kernel| jacobi::Args {
        nx: side,
        ny: side,
        niter: env("JACOBI_NITER", 1000),
        csv: true,
        kernel,
        ..Default::default()
    };
    println!(
        "\nJacobi {side} x {side} x {} on device 0, median of {runs} runs each, alternating\n",
        args(KernelChoice::Tuned).niter
    );
    println!("| solver | generated | hand-written | ratio |\n|---|---|---|---|");
    let (mut tg, mut th, mut tt) = (Vec::new(), Vec::new(), Vec::new());
    let mut grids = Vec::new();
    let mut teams_grid = None;
    for _ in 0..runs {
        let g = jacobi::solve(rt, &[0], &args(KernelChoice::Generated))?;
        let h = jacobi::solve(rt, &[0], &args(KernelChoice::Tuned))?;
        let t = jacobi::solve(rt, &[0], &jacobi::Args { rows: 16, ..args(KernelChoice::Teams) })?;
        tg.push(g.seconds);
        th.push(h.seconds);
        tt.push(t.seconds);
        teams_grid.get_or_insert(t);
        grids.push((g, h));
    }
    let (g, h) = &grids[0];
    if jacobi::max_diff(&g.grid, &h.grid, side, side) != 0.0 {
        return Err("Jacobi: the generated and hand-written grids differ".into());
    }
    let teams = teams_grid.ok_or("no teams run")?;
    if jacobi::max_diff(&teams.grid, &h.grid, side, side) != 0.0 {
        return Err("Jacobi: the teams and hand-written grids differ".into());
    }
    println!(
        "| Jacobi, s (final norm {:.6} / {:.6})        | {:>10.4} s | {:>10.4} s | {:>6.3} |",
        g.norm,
        h.norm,
        offload_benches::median(tg.clone()),
        offload_benches::median(th.clone()),
        offload_benches::median(th.clone()) / offload_benches::median(tg)
    );
    println!(
        "| Jacobi teams kernel, s (final norm {:.6})     | {:>10.4} s | {:>10.4} s | {:>6.3} |",
        teams.norm,
        offload_benches::median(tt.clone()),
        offload_benches::median(th.clone()),
        offload_benches::median(th) / offload_benches::median(tt)
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(rt) = offload_benches::gpu_bench("kernels")? else { return Ok(()) };
    let mut bench = Bench::new("kernels");

    // ---- GPU time by events, raw launches of the same sources ----
    let ctx = CudaContext::new(0)?;
    let (major, minor) = ctx.compute_capability()?;
    let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
    let sms = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
    let s = ctx.new_stream()?;
    let x: Vec<f32> = (0..N).map(|i| (i % 1000) as f32 * 1e-3).collect();
    let (dx, mut dy, mut dout) = (s.clone_htod(&x)?, s.alloc_zeros::<f32>(N)?, s.alloc_zeros::<f32>(1)?);
    let (n, s0, a, v, one) = (N as u64, 0u64, 2.0f32, 1.5f32, 1u64);
    let cfg =
        |r: &Raw| LaunchConfig { grid_dim: (r.blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let gb = |bytes: usize, ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
    println!(
        "\nGPU time per launch by CUDA events, n = {N} f32 (256 MiB), median of criterion's samples; generated grids: one wave \
         ({sms} SMs x the blocks of the kernel one holds), hand-written: {} blocks\n",
        N.div_ceil(256)
    );
    println!("| kernel | generated | hand-written | ratio |\n|---|---|---|---|");

    let (gf, hf) = (load(&ctx, arch, &generated::fill_f32::KERNEL, sms)?, load(&ctx, arch, &FILL_F32, sms)?);
    // SAFETY (every raw launch below): the arguments follow each kernel's CUDA signature
    // (the generated layout: starts, arguments, one length per view, n; the hand-written:
    // arguments, n) and the buffers hold N floats (the sums' output one).
    // SAFETY: the arguments follow the kernel's signature (see the first launch).
    let g = event_ms(&mut bench, "fill/generated", &s, || unsafe {
        s.launch_builder(&gf.f)
            .arg(&s0)
            .arg(&v)
            .arg(&mut dy)
            .arg(&n)
            .arg(&n)
            .launch(cfg(&gf))
            .expect("launch");
    })?;
    // SAFETY: the arguments follow the kernel's signature (see the first launch).
    let h = event_ms(&mut bench, "fill/hand-written", &s, || unsafe {
        s.launch_builder(&hf.f).arg(&v).arg(&mut dy).arg(&n).launch(cfg(&hf)).expect("launch");
    })?;
    row("fill (write 4 B/item), GB/s", gb(4 * N, g), gb(4 * N, h), "GB/s");

    let (gs, hs) = (load(&ctx, arch, &generated::saxpy::KERNEL, sms)?, load(&ctx, arch, &SAXPY, sms)?);
    // SAFETY: the arguments follow the kernel's signature (see the first launch).
    let g = event_ms(&mut bench, "saxpy/generated", &s, || unsafe {
        s.launch_builder(&gs.f)
            .arg(&s0)
            .arg(&a)
            .arg(&dx)
            .arg(&mut dy)
            .arg(&n)
            .arg(&n)
            .arg(&n)
            .launch(cfg(&gs))
            .expect("launch");
    })?;
    // SAFETY: the arguments follow the kernel's signature (see the first launch).
    let h = event_ms(&mut bench, "saxpy/hand-written", &s, || unsafe {
        s.launch_builder(&hs.f).arg(&a).arg(&dx).arg(&mut dy).arg(&n).launch(cfg(&hs)).expect("launch");
    })?;
    row("saxpy (read 8 B, write 4 B/item), GB/s", gb(12 * N, g), gb(12 * N, h), "GB/s");

    let (gr, hr) = (load(&ctx, arch, &generated::sum_f32::KERNEL, sms)?, load(&ctx, arch, &SUM_F32, sms)?);
    // SAFETY: the arguments follow the kernel's signature (see the first launch).
    let g = event_ms(&mut bench, "sum/generated", &s, || unsafe {
        s.launch_builder(&gr.f)
            .arg(&s0)
            .arg(&dx)
            .arg(&mut dout)
            .arg(&n)
            .arg(&one)
            .arg(&n)
            .launch(cfg(&gr))
            .expect("launch");
    })?;
    // SAFETY: the arguments follow the kernel's signature (see the first launch).
    let h = event_ms(&mut bench, "sum/hand-written", &s, || unsafe {
        s.launch_builder(&hr.f).arg(&dx).arg(&mut dout).arg(&n).launch(cfg(&hr)).expect("launch");
    })?;
    row("sum (read 4 B/item), GB/s", gb(4 * N, g), gb(4 * N, h), "GB/s");
    // The sum of one launch of each, from zero, against the host's.
    let want: f64 = x.iter().map(|&v| f64::from(v)).sum();
    for (r, generated) in [(&gr, true), (&hr, false)] {
        s.memset_zeros(&mut dout)?;
        // SAFETY: as above.
        unsafe {
            let mut l = s.launch_builder(&r.f);
            if generated {
                l.arg(&s0).arg(&dx).arg(&mut dout).arg(&n).arg(&one).arg(&n);
            } else {
                l.arg(&dx).arg(&mut dout).arg(&n);
            }
            l.launch(cfg(r))?;
        }
        let got = s.clone_dtoh(&dout)?[0] as f64;
        if (got - want).abs() > 1e-4 * want {
            return Err(format!(
                "sum ({}) {got} != {want}",
                if generated { "generated" } else { "hand-written" }
            )
            .into());
        }
    }

    // ---- The Jacobi step kernels alone, by events ----
    jacobi_kernels(&mut bench, &ctx, arch, sms, &s)?;
    loop_orders(&mut bench, &ctx, arch, sms, &s)?;

    // ---- Through the runtime: launch + synchronize ----
    through_the_runtime(&mut bench, &rt, &x, a, v)?;
    // ---- Jacobi ----
    jacobi_solvers(&rt)?;
    println!("\nratio: generated / hand-written for GB/s, hand-written / generated for seconds (1 = equal, > 1 = generated faster)");
    Ok(())
}
