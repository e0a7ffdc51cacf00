//! `#[offload::kernel]` on every device of every backend: generated kernels give what the
//! same Rust function gives when called on the host, loop by loop.

use offload::{map, Error};
use offload_tests::{check, check_eq, on_every_device};

// Written as in the issue (clippy would have `y[i] += a * x[i]`).
#[offload::kernel]
#[allow(clippy::assign_op_pattern)]
fn saxpy(i: usize, a: f32, x: &[f32], y: &mut [f32]) {
    y[i] = a * x[i] + y[i];
}

#[test]
fn saxpy_as_in_the_issue() {
    on_every_device("generated saxpy", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 10_000;
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut y = vec![1.0f32; n];
        gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| saxpy::launch(&gpu, n, 2.0, x, y))?;
        check!(y.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32 + 1.0), "y wrong");
        Ok(())
    });
}

#[test]
fn the_generated_source_has_the_documented_signature() {
    let src = saxpy::KERNEL.cuda_source().unwrap();
    assert_eq!(saxpy::KERNEL.name(), "saxpy");
    assert!(saxpy::KERNEL.host_fn().is_some());
    assert!(
        src.contains(
            "extern \"C\" __global__ void __launch_bounds__(256) saxpy(unsigned long long __offload_s0, float a, \
             const float* __restrict__ x, float* __restrict__ y, unsigned long long __offload_len_x, \
             unsigned long long __offload_len_y, unsigned long long __offload_n)"
        ),
        "{src}"
    );
    // The original function is still ordinary Rust.
    let mut y = [1.0f32];
    saxpy(0, 3.0, &[2.0], &mut y);
    assert_eq!(y, [7.0]);
}

#[test]
fn a_sub_range_launches_only_its_items_and_an_empty_one_nothing() {
    on_every_device("generated saxpy over a range", |rt, d| {
        let gpu = rt.device(d)?;
        let x = vec![1.0f32; 100];
        let mut y = vec![0.0f32; 100];
        gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| {
            saxpy::launch(&gpu, 10..20, 1.0, x, y)?;
            saxpy::launch(&gpu, 50..50, 1.0, x, y)?;
            saxpy::launch(&gpu, 0, 1.0, x, y)
        })?;
        check!(y.iter().enumerate().all(|(i, &v)| v == if (10..20).contains(&i) { 1.0 } else { 0.0 }));
        Ok(())
    });
}

/// One Jacobi sweep of the 5-point stencil on an `ny x nx` grid (interior points only).
#[offload::kernel(dims = 2)]
fn jacobi_step(i: usize, j: usize, nx: usize, u: &[f64], f: &[f64], un: &mut [f64]) {
    let c = i * nx + j;
    un[c] = 0.25 * (u[c - 1] + u[c + 1] + u[c - nx] + u[c + nx] - f[c]);
}

#[test]
fn a_two_dimensional_stencil_over_interior_bounds() {
    on_every_device("generated 2-D stencil", |rt, d| {
        let gpu = rt.device(d)?;
        let (ny, nx) = (37, 53);
        let u: Vec<f64> = (0..ny * nx).map(|k| ((k * 7919) % 101) as f64 / 10.0).collect();
        let f: Vec<f64> = (0..ny * nx).map(|k| (k % 13) as f64).collect();
        let mut un = vec![-1.0f64; ny * nx];
        gpu.data((map::to(&u), map::to(&f), map::tofrom(&mut un)), |(u, f, un)| {
            jacobi_step::launch(&gpu, (1..ny - 1, 1..nx - 1), nx, u, f, un)
        })?;
        let mut want = vec![-1.0f64; ny * nx];
        for i in 1..ny - 1 {
            for j in 1..nx - 1 {
                jacobi_step(i, j, nx, &u, &f, &mut want);
            }
        }
        check_eq!(un, want);
        Ok(())
    });
}

/// Writes a label of each point of a 3-D block.
#[offload::kernel(dims = 3)]
fn label_3d(i: usize, j: usize, k: usize, ny: usize, nx: usize, out: &mut [u64]) {
    out[(i * ny + j) * nx + k] = (i * 10_000 + j * 100 + k) as u64;
}

#[test]
fn a_three_dimensional_space_visits_each_point_once() {
    on_every_device("generated 3-D", |rt, d| {
        let gpu = rt.device(d)?;
        let (nz, ny, nx) = (6, 9, 11);
        let mut out = vec![0u64; nz * ny * nx];
        gpu.data(map::tofrom(&mut out), |o| label_3d::launch(&gpu, (1..5, 2..9, 0..10), ny, nx, o))?;
        let mut want = vec![0u64; nz * ny * nx];
        for i in 1..5 {
            for j in 2..9 {
                for k in 0..10 {
                    label_3d(i, j, k, ny, nx, &mut want);
                }
            }
        }
        check_eq!(out, want);
        Ok(())
    });
}

/// Control flow, locals, casts and float methods.
#[offload::kernel]
fn mixed(i: usize, terms: u32, clamp: bool, x: &[f32], y: &mut [f32], hits: &mut [i32]) {
    let mut s = 0.0f32;
    let h: f32 = 0.5;
    for q in 0..terms {
        if q % 3 == 0 {
            continue;
        }
        s += ((q as f32) * x[i]).abs().sqrt().mul_add(h, 1.0);
    }
    let mut w = (i % 5) as i64;
    let mut steps: i32 = 0;
    while w > 0 {
        w -= 1;
        steps += 1;
    }
    hits[i] = steps;
    if i == 3 {
        y[i] = -1.0;
        return;
    }
    if clamp && s > 10.0 {
        s = s.min(10.0);
    } else if s < 1.0 {
        s = s.powi(2) + (s as f64).exp().ln() as f32;
    } else {
        s = s.floor() + x[i].sin().max(x[i].cos()) + (x[i] * 0.1).tan().ceil();
    }
    y[i] = if s > 0.0 { s } else { -s };
}

#[test]
fn control_flow_gives_what_the_rust_function_gives() {
    on_every_device("generated control flow", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 500;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 - 250.0) / 37.0).collect();
        for clamp in [false, true] {
            let mut y = vec![0.0f32; n];
            let mut hits = vec![0i32; n];
            gpu.data((map::to(&x), map::tofrom(&mut y), map::tofrom(&mut hits)), |(xv, yv, hv)| {
                mixed::launch(&gpu, n, 7, clamp, xv, yv, hv)
            })?;
            let (mut wy, mut wh) = (vec![0.0f32; n], vec![0i32; n]);
            for i in 0..n {
                mixed(i, 7, clamp, &x, &mut wy, &mut wh);
            }
            check_eq!(hits, wh);
            // Host twins are the same Rust; GPU math may differ in the last bits.
            check!(
                y.iter().zip(&wy).all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0)),
                "y {y:?} != {wy:?}"
            );
        }
        Ok(())
    });
}

/// Linear interpolation, callable from kernels.
#[offload::device]
fn lerp(a: f32, b: f32, t: f32) -> f32 {
    let d = b - a;
    if t <= 0.0 {
        return a;
    }
    a + d * t
}

#[offload::kernel]
fn blend(i: usize, t: f32, x: &[f32], y: &mut [f32]) {
    y[i] = lerp(x[i], y[i], t);
}

#[test]
fn a_kernel_calls_a_device_function() {
    let src = blend::KERNEL.cuda_source().unwrap();
    assert!(src.contains("__device__ float lerp(float a, float b, float t) {"), "{src}");
    assert!(src.contains("y[i] = lerp(x[i], y[i], t);"), "{src}");
    on_every_device("generated kernel with a device function", |rt, d| {
        let gpu = rt.device(d)?;
        let x = vec![2.0f32; 64];
        let mut y = vec![4.0f32; 64];
        gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| blend::launch(&gpu, 64, 0.25, x, y))?;
        check!(y.iter().all(|&v| v == 2.5), "{y:?}");
        Ok(())
    });
}

/// Ease-in interpolation: a device function calling another.
#[offload::device]
fn ease(a: f32, b: f32, t: f32) -> f32 {
    lerp(a, b, t * t)
}

/// Lists only `ease`; its source brings `lerp`'s.
#[offload::kernel]
fn eased(i: usize, t: f32, x: &[f32], y: &mut [f32]) {
    y[i] = ease(x[i], y[i], t);
}

/// Lists both: the guards keep one definition of `lerp`.
#[offload::kernel]
fn eased_both(i: usize, t: f32, x: &[f32], y: &mut [f32]) {
    y[i] = ease(x[i], y[i], t) + lerp(x[i], y[i], 0.0);
}

#[test]
fn device_functions_call_device_functions() {
    let src = eased::KERNEL.cuda_source().unwrap();
    assert!(src.contains("__device__ float lerp(") && src.contains("__device__ float ease("), "{src}");
    assert!(src.find("__device__ float lerp(") < src.find("__device__ float ease("), "callee first: {src}");
    on_every_device("device function calling a device function", |rt, d| {
        let gpu = rt.device(d)?;
        let x = vec![2.0f32; 64];
        let (mut y, mut z) = (vec![4.0f32; 64], vec![4.0f32; 64]);
        gpu.data((map::to(&x), map::tofrom(&mut y), map::tofrom(&mut z)), |(x, y, z)| {
            eased::launch(&gpu, 64, 0.5, x, y)?;
            eased_both::launch(&gpu, 64, 0.5, x, z)
        })?;
        // lerp(2, 4, 0.25) = 2.5; then + lerp(2, 4, 0) = 2.
        check!(y.iter().all(|&v| v == 2.5), "{y:?}");
        check!(z.iter().all(|&v| v == 4.5), "{z:?}");
        Ok(())
    });
}

/// Reads one element past `x` for the last item.
#[offload::kernel]
fn shifted(i: usize, x: &[f32], y: &mut [f32]) {
    y[i] = x[i + 1];
}

#[test]
fn an_index_out_of_range_fails_the_launch_on_host_devices_naming_kernel_argument_and_index() {
    let rt = offload_tests::backends()[0].runtime();
    let gpu = rt.device(0).unwrap();
    let x = vec![1.0f32; 8];
    let mut y = vec![0.0f32; 8];
    let r = gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| shifted::launch(&gpu, 8, x, y));
    // Reported by the region's copy back, which waits for the kernel (or by the launch,
    // under OFFLOAD_SYNC=1).
    match r.map_err(offload_tests::cause) {
        Err(Error::KernelFailed { kernel: "shifted", message, .. }) => {
            assert!(message.contains("kernel `shifted` argument `x`: index 8 is out of range"), "{message}")
        }
        other => panic!("expected KernelFailed, got {other:?}"),
    }
    // The view's length bounds the twin, not the mapping: a part of a mapped array.
    let r =
        gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| shifted::launch(&gpu, 4, x.slice(0..4)?, y));
    let r = r.map_err(offload_tests::cause);
    assert!(matches!(r, Err(Error::KernelFailed { .. })), "{r:?}");
    assert!(rt.live_mappings().is_empty());
}

#[test]
fn a_shared_view_for_a_mut_argument_is_refused() {
    on_every_device("generated kernel, shared view for &mut", |rt, d| {
        let gpu = rt.device(d)?;
        let x = vec![1.0f32; 16];
        let y = vec![0.0f32; 16];
        let r = gpu.data((map::to(&x), map::to(&y)), |(x, y)| saxpy::launch(&gpu, 16, 1.0, x, y));
        match r {
            Err(Error::KernelArgument { kernel: "saxpy", index: 2, what }) => {
                check!(what.contains("`y` is declared `&mut [f32]`"), "{what}")
            }
            other => check!(false, "expected KernelArgument, got {other:?}"),
        }
        Ok(())
    });
}

#[test]
fn a_host_buffers_shared_view_is_device_scratch_that_kernels_may_write() {
    on_every_device("generated kernel and sgemm writing device scratch", |rt, d| {
        let gpu = rt.device(d)?;
        let x = vec![2.0f32; 16];
        let mut y = offload::HostBuffer::from_slice(rt, &[1.0f32; 16])?;
        y.enter(d, offload::MapType::TO)?;
        gpu.data(map::to(&x), |xv| saxpy::launch(&gpu, 16, 3.0, xv, y.shared_view(d)))?;
        rt.synchronize(d)?;
        check!(y.iter().all(|&v| v == 1.0), "the host's copy is untouched until brought back");
        y.update_from(d)?;
        check!(y.iter().all(|&v| v == 7.0), "{:?}", &y[..]);
        // C (4 x 4) = A B with A all 1 and B all 0.5: each element 4 * 0.5 = 2 (HIP has
        // no BLAS bound yet: NoKernelImpl).
        {
            let (a, b) = (vec![1.0f32; 16], vec![0.5f32; 16]);
            let g = offload::Gemm {
                transa: false,
                transb: false,
                m: 4,
                n: 4,
                k: 4,
                alpha: 1.0,
                lda: 4,
                ldb: 4,
                beta: 0.0,
                ldc: 4,
                tf32: false,
                activation: offload::Activation::Identity,
                batch: 1,
                stride_a: 0,
                stride_b: 0,
                stride_c: 0,
            };
            match gpu.data((map::to(&a), map::to(&b)), |(av, bv)| gpu.sgemm(&g, av, bv, y.shared_view(d))) {
                Err(Error::NoKernelImpl { kernel: "gemm", .. }) => {}
                r => {
                    r?;
                    y.update_from(d)?;
                    check!(y.iter().all(|&v| v == 2.0), "{:?}", &y[..]);
                }
            }
        }
        y.exit(d, offload::MapType::RELEASE)?;
        check!(rt.live_mappings().is_empty());
        Ok(())
    });
}

#[test]
fn generated_kernels_launch_in_nowait_scopes() {
    on_every_device("generated kernel in a nowait scope", |rt, d| {
        let n = 4096;
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut y = vec![1.0f32; n];
        rt.nowait(|s| -> offload::Result<()> {
            let (entered, (xv, yv)) = s.enter(d, (map::to(&x), map::tofrom(&mut y)), &[])?;
            let (items, args) = saxpy::args(n, 3.0, xv, yv)?;
            let k = s.launch(d, &saxpy::KERNEL, items, args, &[&entered])?;
            s.exit(d, (yv, xv), &[&k])?;
            Ok(())
        })??;
        check!(y.iter().enumerate().all(|(i, &v)| v == 3.0 * i as f32 + 1.0), "y wrong");
        check!(rt.live_mappings().is_empty());
        Ok(())
    });
}

#[test]
fn the_attribute_and_the_kernel_module_share_a_name() {
    // `offload::kernel` is both the attribute (macro namespace) and the module of `Kernel`.
    use offload::kernel::DEFAULT_BLOCK;
    assert_eq!(saxpy::KERNEL.block(), DEFAULT_BLOCK);
    let _: &offload::kernel::Kernel = &jacobi_step::KERNEL;
}

#[test]
fn generated_kernels_run_on_the_initial_device_bounded_by_their_views() {
    // The host fallback gets each view's extent from the launch, so the twin is
    // bounds-checked there too.
    let rt = offload_tests::backends()[0].runtime();
    let host = rt.device(rt.initial_device()).unwrap();
    let x = vec![1.0f32; 8];
    let mut y = vec![0.0f32; 8];
    host.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| saxpy::launch(&host, 8, 2.0, x, y)).unwrap();
    assert_eq!(y, vec![2.0f32; 8]);
    let r = host.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| shifted::launch(&host, 8, x, y));
    match r {
        Err(Error::KernelFailed { kernel: "shifted", message, .. }) => {
            assert!(message.contains("argument `x`: index 8 is out of range"), "{message}")
        }
        other => panic!("expected KernelFailed, got {other:?}"),
    }
}

#[offload::kernel]
fn scaled(i: usize, a: f64, x: &[f64], y: &mut [f64]) {
    y[i] = a * x[i];
}

#[test]
fn generated_kernels_are_a_pipelines_compute_stage() {
    offload_tests::on_every_backend(
        "generated kernel in a pipeline",
        1,
        |b| b,
        |rt| {
            let devices: Vec<usize> = (0..rt.num_devices()).collect();
            let inputs: Vec<Vec<f64>> = (0..8).map(|b| vec![b as f64; 300]).collect();
            let mut outputs = vec![vec![0f64; 300]; 8];
            offload::pipeline::Pipeline::new(rt, &devices, 2)?.run(
                &inputs,
                &mut outputs,
                |dev, _, x, y| scaled::launch(dev, x.len(), 1.5, x, y),
            )?;
            check!(outputs.iter().enumerate().all(|(b, o)| o.iter().all(|&v| v == 1.5 * b as f64)));
            Ok(())
        },
    );
}

/// Integer operators, inclusive ranges, `loop`/`break`, a body constant, integer min/max/abs.
#[offload::kernel]
fn integer_ops(i: usize, mask: u32, out: &mut [u32], clamped: &mut [i64]) {
    const TOP: u32 = 3;
    let v = i as u32;
    let mut acc: u32 = 0;
    for b in 0u32..=TOP {
        acc += (v >> b) & 1;
    }
    let mut k: u32 = 0;
    loop {
        k += 1;
        if k >= 4 {
            break;
        }
    }
    out[i] = (acc ^ mask) | (k << 8) | (!v & 0x10);
    let low = (i as i64 - 10).min(5);
    clamped[i] = low.max(-3 * low - 40).abs() * 2 % 7;
}

#[test]
fn integer_operations_give_what_the_rust_function_gives() {
    let src = integer_ops::KERNEL.cuda_source().unwrap();
    // The inclusive range is a counted loop (it ends at the type's largest value too).
    assert!(src.contains("const unsigned int TOP = 3u;") && src.contains("b_end_n"), "{src}");
    on_every_device("generated integer operations", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 300;
        let (mut out, mut clamped) = (vec![0u32; n], vec![0i64; n]);
        gpu.data((map::tofrom(&mut out), map::tofrom(&mut clamped)), |(o, c)| {
            integer_ops::launch(&gpu, n, 0b101, o, c)
        })?;
        let (mut wo, mut wc) = (vec![0u32; n], vec![0i64; n]);
        for i in 0..n {
            integer_ops(i, 0b101, &mut wo, &mut wc);
        }
        check_eq!(out, wo);
        check_eq!(clamped, wc);
        Ok(())
    });
}

/// Every generated kernel of this file compiles with NVRTC for sm_80 and sm_90 (skipped
/// without `libnvrtc` unless `OFFLOAD_NVRTC_REQUIRED=1`, as `scripts/nvrtc-check.sh` sets).
#[test]
fn every_generated_kernel_compiles_with_nvrtc() {
    let kernels = [
        &saxpy::KERNEL,
        &jacobi_step::KERNEL,
        &eased::KERNEL,
        &eased_both::KERNEL,
        &label_3d::KERNEL,
        &mixed::KERNEL,
        &blend::KERNEL,
        &shifted::KERNEL,
        &scaled::KERNEL,
        &integer_ops::KERNEL,
        &even_planes::KERNEL,
    ];
    let checked =
        [&saxpy::KERNEL_CHECKED, &mixed::KERNEL_CHECKED, &label_3d::KERNEL_CHECKED, &guarded::KERNEL];
    let all: Vec<&offload::Kernel> = kernels.into_iter().chain(checked).collect();
    offload_tests::compile_with_nvrtc("generated kernels", &all);
}

/// Reads one element past `x` for the last item, checked on GPUs too.
#[offload::kernel(checked = true)]
fn shifted_checked(i: usize, x: &[f32], y: &mut [f32]) {
    y[i] = x[i + 1];
}

/// Stores out of range for every item past the view's first half.
#[offload::kernel(checked = true)]
fn spread(i: usize, x: &mut [u32]) {
    x[2 * i] = 7;
}

#[offload::kernel(checked = false)]
fn unchecked_copy(i: usize, x: &[f32], y: &mut [f32]) {
    y[i] = x[i];
}

#[test]
fn the_checked_option_says_which_variant_launch_runs() {
    const { assert!(shifted_checked::CHECKED) };
    const { assert!(!unchecked_copy::CHECKED) };
    assert_eq!(saxpy::CHECKED, cfg!(debug_assertions), "debug builds check by default");
    assert_eq!(saxpy::KERNEL_CHECKED.name(), "saxpy");
    assert_eq!(saxpy::KERNEL_CHECKED.symbol(), "saxpy__offload_checked");
    assert!(saxpy::KERNEL_CHECKED
        .cuda_source()
        .unwrap()
        .contains("offload_at(x, i, __offload_len_x, 1u, __offload_err)"));
    assert!(!saxpy::KERNEL.cuda_source().unwrap().contains("offload_at(x"));
}

#[test]
fn a_checked_launch_reports_an_index_out_of_range_on_every_device() {
    on_every_device("checked generated kernel, read out of range", |rt, d| {
        let gpu = rt.device(d)?;
        let x = vec![1.0f32; 8];
        let mut y = vec![0.0f32; 8];
        let r = gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| shifted_checked::launch(&gpu, 8, x, y));
        match r.map_err(offload_tests::cause) {
            Err(Error::KernelFailed { kernel: "shifted_checked", message, .. }) => check!(
                message.contains("argument `x`: index 8 is out of range for a view of 8 elements"),
                "{message}"
            ),
            other => check!(false, "expected KernelFailed, got {other:?}"),
        }
        // In range, the same kernel runs.
        let r = gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| {
            shifted_checked::launch(&gpu, 7, x, y.slice(0..7)?)
        });
        check!(r.is_ok(), "{r:?}");
        check!(y[..7].iter().all(|&v| v == 1.0));
        check!(rt.live_mappings().is_empty());
        Ok(())
    });
}

#[test]
fn a_checked_launch_makes_no_store_out_of_range() {
    on_every_device("checked generated kernel, store out of range", |rt, d| {
        let gpu = rt.device(d)?;
        let mut all = vec![0u32; 64];
        let r = gpu.data(map::tofrom(&mut all), |v| spread::launch(&gpu, 16, v.slice(0..16)?));
        match r.map_err(offload_tests::cause) {
            Err(Error::KernelFailed { kernel: "spread", message, .. }) => {
                check!(
                    message.contains("argument `x`: index") && message.contains("a view of 16 elements"),
                    "{message}"
                )
            }
            other => check!(false, "expected KernelFailed, got {other:?}"),
        }
        // The mapping beyond the view is untouched (copied back as it was).
        check!(all[16..].iter().all(|&v| v == 0), "{all:?}");
        Ok(())
    });
}

/// Guards its read with the view's length.
#[offload::kernel]
fn guarded(i: usize, x: &[f32], y: &mut [f32]) {
    if i + 1 < x.len() {
        y[i] = x[i + 1];
    } else {
        y[i] = x.len() as f32;
    }
}

#[test]
fn a_kernel_reads_a_views_length() {
    on_every_device("generated kernel reading x.len()", |rt, d| {
        let gpu = rt.device(d)?;
        let x: Vec<f32> = (0..10).map(|v| v as f32).collect();
        let mut y = vec![0.0f32; 10];
        gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| guarded::launch(&gpu, 10, x, y))?;
        let want: Vec<f32> = (0..10).map(|i| if i < 9 { (i + 1) as f32 } else { 10.0 }).collect();
        check_eq!(y, want);
        Ok(())
    });
}

#[test]
fn a_written_view_may_not_overlap_another() {
    on_every_device("generated kernel, overlapping views", |rt, d| {
        let gpu = rt.device(d)?;
        let mut y = vec![1.0f32; 32];
        let r =
            gpu.data(map::tofrom(&mut y), |y| saxpy::launch(&gpu, 16, 1.0, y.slice(8..24)?, y.slice(0..16)?));
        match r {
            Err(Error::KernelArgument { kernel: "saxpy", index: 2, what }) => {
                check!(what.contains("overlap and the kernel writes `y`"), "{what}")
            }
            other => check!(false, "expected KernelArgument, got {other:?}"),
        }
        // Disjoint parts of one mapping are fine.
        gpu.data(map::tofrom(&mut y), |y| saxpy::launch(&gpu, 16, 1.0, y.slice(16..32)?, y.slice(0..16)?))?;
        check!(y[..16].iter().all(|&v| v == 2.0) && y[16..].iter().all(|&v| v == 1.0), "{y:?}");
        Ok(())
    });
}

/// Skips odd outer indices with `return`: both the whole-strip and the partial-strip loops
/// of a 3-D launch end an item there and go on with the next.
#[offload::kernel(dims = 3)]
fn even_planes(z: usize, y: usize, x: usize, ny: usize, nx: usize, out: &mut [u32]) {
    if z % 2 == 1 {
        return;
    }
    out[(z * ny + y) * nx + x] = (z + y + x) as u32;
}

#[test]
fn a_three_dimensional_space_with_whole_and_partial_strips() {
    on_every_device("generated 3-D, strips and return", |rt, d| {
        let gpu = rt.device(d)?;
        let (nz, ny, nx) = (23, 5, 37);
        let mut out = vec![7u32; nz * ny * nx];
        // 21 outer indices: five whole strips of 4 and a partial one of 1.
        gpu.data(map::tofrom(&mut out), |o| even_planes::launch(&gpu, (1..22, 0..ny, 1..nx), ny, nx, o))?;
        let mut want = vec![7u32; nz * ny * nx];
        for z in 1..22 {
            for y in 0..ny {
                for x in 1..nx {
                    even_planes(z, y, x, ny, nx, &mut want);
                }
            }
        }
        check_eq!(out, want);
        Ok(())
    });
}
