//! `NAME::reduce` of `#[offload::kernel(reduction(..))]` kernels on every device of every
//! backend and on the initial device: the runtime provides the reduction variables, set to
//! their operators' identities, and returns the reduced values.
//!
//! Sums are of integers (also in floats, exactly representable at every partial), so every
//! order of addition gives the same bits and the results are compared exactly.

use offload::{map, Error, Runtime};
use offload_tests::{assert_clean, check, check_eq, on_every_backend, on_every_device};

/// Defines `$kernel`, adding `i + 1` as `$t` into a `+` reduction, unchecked on GPUs.
macro_rules! sum_kernel {
    ($kernel:ident, $t:ty) => {
        /// Adds `i + 1` for every item.
        #[offload::kernel(checked = false, reduction(+: s))]
        fn $kernel(i: usize, s: &mut $t) {
            *s += (i + 1) as $t;
        }
    };
}
sum_kernel!(sum_i32, i32);
sum_kernel!(sum_u64, u64);
sum_kernel!(sum_f32, f32);
sum_kernel!(sum_f64, f64);

/// Sum of 1..=n in `u128`.
fn triangle(n: usize) -> u128 {
    let n = n as u128;
    n * (n + 1) / 2
}

#[test]
fn sums_of_one_to_n_of_every_width() {
    on_every_device("reduce: sums of 1..=n", |rt, d| {
        let gpu = rt.device(d)?;
        // Many blocks and a partial last one; a single item.
        for n in [(1usize << 16) + 37, 1] {
            check_eq!(sum_u64::reduce(&gpu, n)? as u128, triangle(n));
            check_eq!(sum_f64::reduce(&gpu, n)? as u128, triangle(n));
        }
        // i32: the total stays under 2^31.
        for n in [50_021usize, 1] {
            check_eq!(sum_i32::reduce(&gpu, n)? as u128, triangle(n));
        }
        // f32 holds every partial exactly while the total stays under 2^24.
        for n in [5000usize, 1] {
            check_eq!(sum_f32::reduce(&gpu, n)? as u128, triangle(n));
        }
        // A large u64 sum (beyond 32 bits).
        let n = 3 << 20;
        check_eq!(sum_u64::reduce(&gpu, n)? as u128, triangle(n));
        assert_clean(rt, d)
    });
}

/// Smallest and largest element of `x` (checked by default in debug builds).
#[offload::kernel(reduction(min: lo), reduction(max: hi))]
fn extremes(i: usize, x: &[i64], lo: &mut i64, hi: &mut i64) {
    *lo = (*lo).min(x[i]);
    *hi = (*hi).max(x[i]);
}

/// The same for floats.
#[offload::kernel(reduction(min: lo), reduction(max: hi))]
fn extremes_f32(i: usize, x: &[f32], lo: &mut f32, hi: &mut f32) {
    *lo = lo.min(x[i]);
    *hi = hi.max(x[i]);
}

/// Deterministic, unsorted values of both signs, beyond 32 bits.
fn values(n: usize) -> Vec<i64> {
    (0..n as i64).map(|i| (i * 7919 % 100_003 - 50_000) * (1 << 20) + i % 13).collect()
}

#[test]
fn min_and_max_come_back_as_a_tuple() {
    on_every_device("reduce: min and max", |rt, d| {
        let gpu = rt.device(d)?;
        let x = values(100_003);
        let (lo, hi) = gpu.data(map::to(&x), |xv| extremes::reduce(&gpu, x.len(), xv))?;
        check_eq!((lo, hi), (x.iter().copied().min().unwrap_or(0), x.iter().copied().max().unwrap_or(0)));
        // Part of the mapping: a view's items only.
        let (lo, hi) = gpu.data(map::to(&x), |xv| extremes::reduce(&gpu, 10, xv.slice(0..10)?))?;
        check_eq!(
            (lo, hi),
            (x[..10].iter().copied().min().unwrap_or(0), x[..10].iter().copied().max().unwrap_or(0))
        );
        let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let (lo, hi) = gpu.data(map::to(&xf), |xv| extremes_f32::reduce(&gpu, xf.len(), xv))?;
        check_eq!(
            (lo, hi),
            (
                xf.iter().copied().fold(f32::INFINITY, f32::min),
                xf.iter().copied().fold(f32::NEG_INFINITY, f32::max)
            )
        );
        assert_clean(rt, d)
    });
}

/// Reduction variables between other arguments, of two types.
#[offload::kernel(reduction(+: total), reduction(+: count))]
fn middle(i: usize, scale: f64, total: &mut f64, x: &[f64], count: &mut u32, limit: f64, y: &mut [f64]) {
    y[i] = scale * x[i];
    *total += scale * x[i];
    if x[i] > limit {
        *count += 1u32;
    }
}

#[test]
fn reduction_variables_may_sit_anywhere_among_the_arguments() {
    on_every_device("reduce: reduction variables in the middle", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 70_001;
        let x: Vec<f64> = (0..n).map(|i| (i % 1000) as f64).collect();
        let mut y = vec![0.0; n];
        let (total, count) = gpu
            .data((map::to(&x), map::from(&mut y)), |(xv, yv)| middle::reduce(&gpu, n, 2.0, xv, 499.5, yv))?;
        let want_total: f64 = x.iter().map(|v| 2.0 * v).sum();
        check_eq!(total, want_total);
        check_eq!(count as usize, x.iter().filter(|&&v| v > 499.5).count());
        check!(y.iter().zip(&x).all(|(y, x)| *y == 2.0 * x), "y wrong");
        assert_clean(rt, d)
    });
}

/// Adds 1 to every element.
#[offload::kernel]
fn bump(i: usize, x: &mut [f64]) {
    x[i] += 1.0;
}

/// Sum of `x` (integers in floats: exact in any order).
#[offload::kernel(reduction(+: s))]
fn total(i: usize, x: &[f64], s: &mut f64) {
    *s += x[i];
}

#[test]
fn a_reduce_in_a_loop_gives_what_the_mapped_form_gives() {
    on_every_device("reduce: iterations against map::tofrom", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 10_007;
        // Ten when every step fails once (each run is a sweep's).
        let iterations = offload_tests::sized(100, 10);
        let mut x: Vec<f64> = (0..n).map(|i| (i % 17) as f64).collect();
        let (by_reduce, by_map) = gpu.data(map::tofrom(&mut x), |xv| {
            let (mut by_reduce, mut by_map) = (Vec::new(), Vec::new());
            for _ in 0..iterations {
                bump::launch(&gpu, n, xv)?;
                by_reduce.push(total::reduce(&gpu, n, xv)?);
                let mut s = [0.0f64];
                gpu.data(map::tofrom(&mut s), |sv| total::launch(&gpu, n, xv, sv))?;
                by_map.push(s[0]);
            }
            Ok((by_reduce, by_map))
        })?;
        check_eq!(by_reduce, by_map);
        let base: f64 = (0..n).map(|i| (i % 17) as f64).sum();
        check_eq!(by_reduce[iterations - 1], base + iterations as f64 * n as f64);
        check!(x.iter().enumerate().all(|(i, &v)| v == (i % 17) as f64 + iterations as f64), "x wrong");
        assert_clean(rt, d)
    });
}

#[test]
fn an_empty_space_gives_the_identities() {
    on_every_device("reduce: n = 0", |rt, d| {
        let gpu = rt.device(d)?;
        check_eq!(sum_i32::reduce(&gpu, 0)?, 0);
        check_eq!(sum_f64::reduce(&gpu, 0)?, 0.0);
        let x = [5i64];
        check_eq!(gpu.data(map::to(&x), |xv| extremes::reduce(&gpu, 0, xv))?, (i64::MAX, i64::MIN));
        check_eq!(gpu.data(map::to(&x), |xv| extremes::reduce(&gpu, 3..3, xv))?, (i64::MAX, i64::MIN));
        let xf = [5f32];
        check_eq!(
            gpu.data(map::to(&xf), |xv| extremes_f32::reduce(&gpu, 0, xv))?,
            (f32::INFINITY, f32::NEG_INFINITY)
        );
        // Nothing ran; the regions' memory may be given back at the next synchronisation.
        rt.synchronize(d)?;
        assert_clean(rt, d)
    });
}

#[test]
fn an_unmapped_view_is_an_error_naming_the_kernel_and_argument() {
    on_every_device("reduce: unmapped view", |rt, d| {
        let gpu = rt.device(d)?;
        let x = vec![1.0f64; 64];
        // A view that outlives its region: no longer mapped.
        let stale = gpu.data(map::to(&x), Ok)?;
        match total::reduce(&gpu, 64, stale) {
            Err(Error::KernelArgument { kernel: "total", what, .. }) => {
                check!(what.contains("`x`") && what.contains("not mapped"), "{what}")
            }
            other => check!(false, "expected KernelArgument, got {other:?}"),
        }
        // A shared view for a `&mut [T]` argument, checked before anything runs.
        let (xs, mut y) = (vec![1.0f64; 8], vec![0.0f64; 8]);
        let r = gpu.data((map::to(&xs), map::to(&y)), |(xv, yv)| middle::reduce(&gpu, 8, 1.0, xv, 0.0, yv));
        match r {
            Err(Error::KernelArgument { kernel: "middle", what, .. }) => {
                check!(what.contains("`y` is declared `&mut [f64]`"), "{what}")
            }
            other => check!(false, "expected KernelArgument, got {other:?}"),
        }
        // The views a launch writes may not overlap.
        let r = gpu.data(map::tofrom(&mut y), |yv| {
            middle::reduce(&gpu, 4, 1.0, yv.slice(0..4)?, 0.0, yv.slice(2..6)?)
        });
        check!(matches!(&r, Err(Error::KernelArgument { what, .. }) if what.contains("overlap")), "{r:?}");
        // Nothing leaked on any of these paths.
        assert_clean(rt, d)
    });
}

/// Whether `r` is the failure of kernel `kernel` whose message has `what` and `index`:
/// reported by the launch, or by the read back that synchronises with it (which names the
/// construct and wraps the kernel's failure).
fn failed_in<T>(r: &offload::Result<T>, kernel: &str, what: &str, index: &str) -> bool {
    let Err(e) = r else { return false };
    let text = e.to_string();
    text.contains(&format!("kernel `{kernel}` failed")) && text.contains(what) && text.contains(index)
}

/// Reads one past the end of `x` at the last item (checked on GPUs in debug builds).
#[offload::kernel(checked = true, reduction(+: s))]
fn over_the_end(i: usize, x: &[u32], s: &mut u32) {
    *s += x[i + 1];
}

#[test]
fn a_checked_reduce_reports_an_access_out_of_range() {
    on_every_device("reduce: checked", |rt, d| {
        let gpu = rt.device(d)?;
        let x: Vec<u32> = (0..1000).collect();
        // In range: the report is read back with the value and says nothing.
        let s = gpu.data(map::to(&x), |xv| over_the_end::reduce(&gpu, 999, xv))?;
        check_eq!(s, (1..1000).sum::<u32>());
        let r = gpu.data(map::to(&x), |xv| over_the_end::reduce(&gpu, 1000, xv));
        check!(failed_in(&r, "over_the_end", "argument `x`", "index 1000"), "{r:?}");
        // The device works on, and the partial was freed.
        check_eq!(gpu.data(map::to(&x), |xv| over_the_end::reduce(&gpu, 10, xv))?, (1..11).sum::<u32>());
        assert_clean(rt, d)
    });
}

/// Sum of a 2-D interior, over C-like bounds.
#[offload::kernel(dims = 2, reduction(+: s))]
fn interior(iy: usize, ix: usize, nx: usize, a: &[u64], s: &mut u64) {
    *s += a[iy * nx + ix];
}

#[test]
fn a_two_dimensional_reduce() {
    on_every_device("reduce: 2-D", |rt, d| {
        let gpu = rt.device(d)?;
        let (ny, nx) = (301, 517);
        let a: Vec<u64> = (0..ny * nx).map(|v| v as u64 % 1013).collect();
        let s = gpu.data(map::to(&a), |av| interior::reduce(&gpu, (1..ny - 1, 1..nx - 1), nx, av))?;
        let want: u64 =
            (1..ny - 1).flat_map(|y| (1..nx - 1).map(move |x| (y, x))).map(|(y, x)| a[y * nx + x]).sum();
        check_eq!(s, want);
        assert_clean(rt, d)
    });
}

/// Every case above on the initial device (the host twin on host memory).
fn on_the_initial_device(rt: &Runtime) -> offload::Result<()> {
    let init = rt.device(rt.initial_device())?;
    let n = 5000;
    check_eq!(sum_i32::reduce(&init, n)? as u128, triangle(n));
    check_eq!(sum_u64::reduce(&init, n)? as u128, triangle(n));
    check_eq!(sum_f32::reduce(&init, n)? as u128, triangle(n));
    check_eq!(sum_f64::reduce(&init, n)? as u128, triangle(n));
    check_eq!(sum_i32::reduce(&init, 0)?, 0);
    let x = values(10_001);
    let (lo, hi) = init.data(map::to(&x), |xv| extremes::reduce(&init, x.len(), xv))?;
    check_eq!((lo, hi), (x.iter().copied().min().unwrap_or(0), x.iter().copied().max().unwrap_or(0)));
    let xf: Vec<f64> = (0..n).map(|i| (i % 1000) as f64).collect();
    let mut y = vec![0.0; n];
    let (t, c) = init
        .data((map::to(&xf), map::from(&mut y)), |(xv, yv)| middle::reduce(&init, n, 2.0, xv, 499.5, yv))?;
    check_eq!(
        (t, c as usize),
        (xf.iter().map(|v| 2.0 * v).sum::<f64>(), xf.iter().filter(|&&v| v > 499.5).count())
    );
    check!(y.iter().zip(&xf).all(|(y, x)| *y == 2.0 * x), "y wrong");
    let xu: Vec<u32> = (0..100).collect();
    let r = init.data(map::to(&xu), |xv| over_the_end::reduce(&init, 100, xv));
    check!(failed_in(&r, "over_the_end", "argument `x`", "index 100"), "{r:?}");
    check!(rt.live_mappings().is_empty(), "mappings left");
    Ok(())
}

#[test]
fn reduce_runs_on_the_initial_device() {
    on_every_backend("reduce on the initial device", 0, |b| b, on_the_initial_device);
}

/// The reduce kernels compile with NVRTC, both variants (see kernel_macro.rs).
#[test]
fn every_reduce_kernel_compiles_with_nvrtc() {
    let kernels = [
        &sum_i32::KERNEL,
        &sum_f32::KERNEL,
        &middle::KERNEL,
        &middle::KERNEL_CHECKED,
        &over_the_end::KERNEL_CHECKED,
        &interior::KERNEL,
    ];
    offload_tests::compile_with_nvrtc("reduce kernels", &kernels);
}
