//! Reductions of `#[offload::kernel]` (`reduction(+: s)`, `min`, `max`) on every device of
//! every backend, for each reducible type, against a sequential reduction on the host.
//!
//! Integers are exact (the values are small enough that no sum overflows: the host twin is
//! Rust, whose `+=` panics on overflow in debug builds, where the GPU wraps). Floats: `min`/`max` are exact; sums are
//! combined in another order than a sequential loop, so they are compared within
//! `n * eps * sum(|x|)` (f32: about 6e-8 per item of magnitude; f64: 1.1e-16).

use offload::{map, DeviceBuffer, Error};
use offload_tests::{check, check_eq, on_every_device};

/// Values spread over the type's useful range, deterministic, not sorted.
fn values<T>(n: usize, f: impl Fn(u64) -> T) -> Vec<T> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            f(s)
        })
        .collect()
}

macro_rules! reductions_of {
    ($kernel:ident, $test:ident, $t:ty, $gen:expr, $eps:expr) => {
        /// Sum, minimum and maximum of `x` in one pass.
        #[offload::kernel(reduction(+: s), reduction(min: lo), reduction(max: hi))]
        fn $kernel(i: usize, x: &[$t], s: &mut $t, lo: &mut $t, hi: &mut $t) {
            *s += x[i];
            *lo = (*lo).min(x[i]);
            *hi = (*hi).max(x[i]);
        }

        #[test]
        fn $test() {
            on_every_device(concat!("reductions of ", stringify!($t)), |rt, d| {
                let gpu = rt.device(d)?;
                // Many blocks, a partial last block and warp; a single item; an empty space
                // (fewer blocks when every step fails once: the same steps, a run each).
                for n in [offload_tests::sized(1usize << 20, 1 << 14) + 37, 1, 0] {
                    let x: Vec<$t> = values(n, $gen);
                    let start: [$t; 3] = [x.first().copied().unwrap_or_default(), <$t>::MAX, <$t>::MIN];
                    let (mut s, mut lo, mut hi) = ([start[0]], [start[1]], [start[2]]);
                    gpu.data(
                        (map::to(&x), map::tofrom(&mut s), map::tofrom(&mut lo), map::tofrom(&mut hi)),
                        |(x, s, lo, hi)| $kernel::launch(&gpu, n, x, s, lo, hi),
                    )?;
                    let mut want = start;
                    let mut abs = 0f64;
                    for &v in &x {
                        want[0] = offload::__private::Reducible::add(want[0], v);
                        want[1] = want[1].min(v);
                        want[2] = want[2].max(v);
                        abs += (v as f64).abs();
                    }
                    check_eq!((lo[0], hi[0]), (want[1], want[2]));
                    if $eps == 0.0 {
                        check_eq!(s[0], want[0]);
                    } else {
                        let tol = (n as f64 + 1.0) * $eps * (abs + (start[0] as f64).abs());
                        let err = (s[0] as f64 - want[0] as f64).abs();
                        check!(err <= tol, "n {n}: sum {} vs {}: error {err:e} over {tol:e}", s[0], want[0]);
                    }
                }
                Ok(())
            });
        }
    };
}

reductions_of!(
    reduce_f32,
    reductions_of_f32,
    f32,
    |s| ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0,
    f32::EPSILON as f64
);
reductions_of!(
    reduce_f64,
    reductions_of_f64,
    f64,
    |s| ((s >> 11) as f64 / (1u64 << 53) as f64) * 200.0 - 100.0,
    f64::EPSILON
);
reductions_of!(reduce_i32, reductions_of_i32, i32, |s| (s >> 53) as i32 - 1024, 0.0);
reductions_of!(reduce_u32, reductions_of_u32, u32, |s| (s >> 52) as u32, 0.0);
reductions_of!(reduce_i64, reductions_of_i64, i64, |s| (s >> 22) as i64 - (1 << 41), 0.0);
reductions_of!(reduce_u64, reductions_of_u64, u64, |s| s.rotate_left(9) >> 23, 0.0);

/// The fused Jacobi update: a 2-D stencil writing `a_new` and reducing the squared update.
#[offload::kernel(dims = 2, reduction(+: norm))]
fn jacobi_norm(iy: usize, ix: usize, nx: usize, a: &[f32], a_new: &mut [f32], norm: &mut f32) {
    let c = iy * nx + ix;
    let v = 0.25f32 * (a[c + 1] + a[c - 1] + a[c + nx] + a[c - nx]);
    a_new[c] = v;
    let r = v - a[c];
    *norm += r * r;
}

#[test]
fn a_two_dimensional_stencil_reduces_its_norm() {
    on_every_device("generated Jacobi step with its norm", |rt, d| {
        let gpu = rt.device(d)?;
        let (ny, nx) = (301, 517);
        let a: Vec<f32> = values(ny * nx, |s| (s >> 41) as f32 / (1u64 << 23) as f32);
        let mut a_new = vec![0f32; ny * nx];
        let mut norm = [0f32];
        gpu.data((map::to(&a), map::tofrom(&mut a_new), map::tofrom(&mut norm)), |(a, an, n)| {
            jacobi_norm::launch(&gpu, (1..ny - 1, 1..nx - 1), nx, a, an, n)
        })?;
        let (mut want, mut wn) = (vec![0f32; ny * nx], 0f64);
        let mut partial = [0f32];
        for iy in 1..ny - 1 {
            for ix in 1..nx - 1 {
                partial[0] = 0.0;
                jacobi_norm(iy, ix, nx, &a, &mut want, &mut partial[0]);
                wn += partial[0] as f64;
            }
        }
        check_eq!(a_new, want);
        check!(((norm[0] as f64) - wn).abs() <= 1e-4 * wn, "norm {} vs {wn}", norm[0]);
        Ok(())
    });
}

/// Counts the items it does not skip: `return` ends an item, not the reduction.
#[offload::kernel(reduction(+: kept), reduction(max: last))]
fn count_kept(i: usize, every: u64, kept: &mut u64, last: &mut u64) {
    if (i as u64) % every != 0 {
        return;
    }
    *kept += 1u64;
    *last = (*last).max(i as u64);
}

#[test]
fn an_early_return_skips_the_item_and_keeps_the_reduction() {
    on_every_device("generated reduction with return", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 100_003;
        let (mut kept, mut last) = ([0u64], [0u64]);
        gpu.data((map::tofrom(&mut kept), map::tofrom(&mut last)), |(k, l)| {
            count_kept::launch(&gpu, n, 7, k, l)?;
            // A second launch adds to what the first left.
            count_kept::launch(&gpu, 10..20, 5, k, l)
        })?;
        check_eq!(kept[0], (n as u64).div_ceil(7) + 2);
        check_eq!(last[0], 100_002); // 7 * 14_286, the last multiple of 7 below n
        Ok(())
    });
}

#[test]
fn a_reduction_needs_a_writable_view_of_one_element() {
    on_every_device("generated reduction, bad views", |rt, d| {
        let gpu = rt.device(d)?;
        let shared = [0u64];
        let mut empty: [u64; 0] = [];
        let mut fine = [0u64];
        let r = gpu
            .data((map::to(&shared), map::tofrom(&mut fine)), |(s, f)| count_kept::launch(&gpu, 4, 1, s, f));
        match r {
            Err(Error::KernelArgument { kernel: "count_kept", index: 1, what }) => {
                check!(
                    what.contains("`kept` is a `+` reduction variable") && what.contains("a shared view"),
                    "{what}"
                )
            }
            other => check!(false, "expected KernelArgument, got {other:?}"),
        }
        let r = gpu.data((map::tofrom(&mut empty), map::tofrom(&mut fine)), |(e, f)| {
            count_kept::launch(&gpu, 4, 1, e, f)
        });
        check!(matches!(r, Err(Error::KernelArgument { index: 1, .. })), "{r:?}");
        // One view for two reductions overlaps.
        let r = gpu.data(map::tofrom(&mut fine), |f| count_kept::launch(&gpu, 4, 1, f, f));
        check!(matches!(&r, Err(Error::KernelArgument { what, .. }) if what.contains("overlap")), "{r:?}");
        // A device buffer's view is memory kernels may write: reductions combine into it.
        let (kept, last) =
            (DeviceBuffer::from_slice(&gpu, &[1u64])?, DeviceBuffer::from_slice(&gpu, &[0u64])?);
        count_kept::launch(&gpu, 10, 3, kept.view(), last.view())?;
        check_eq!((kept.to_vec()?, last.to_vec()?), (vec![5], vec![9]));
        // A HostBuffer's shared view is not: on the initial device its kernels write a
        // private copy, so the result would be lost.
        let mut shared = offload::HostBuffer::<u64>::new(rt, 1)?;
        shared.enter(d, offload::MapType::TO)?;
        let r = count_kept::launch(&gpu, 10, 3, shared.shared_view(d), last.view());
        check!(
            matches!(&r, Err(Error::KernelArgument { index: 1, what, .. }) if what.contains("a shared view")),
            "{r:?}"
        );
        shared.exit(d, offload::MapType::RELEASE)?;
        Ok(())
    });
}

#[test]
fn reductions_launch_in_nowait_scopes() {
    on_every_device("generated reduction in a nowait scope", |rt, d| {
        let n = 50_000;
        let x: Vec<i64> = (0..n as i64).map(|v| v - 20_000).collect();
        let (mut s, mut lo, mut hi) = ([0i64], [i64::MAX], [i64::MIN]);
        rt.nowait(|sc| -> offload::Result<()> {
            let (entered, (xv, sv, lv, hv)) = sc.enter(
                d,
                (map::to(&x), map::tofrom(&mut s), map::tofrom(&mut lo), map::tofrom(&mut hi)),
                &[],
            )?;
            let (items, args) = reduce_i64::args(n, xv, sv, lv, hv)?;
            let k = sc.launch(d, &reduce_i64::KERNEL, items, args, &[&entered])?;
            sc.exit(d, (sv, lv, hv, xv), &[&k])?;
            Ok(())
        })??;
        check_eq!((s[0], lo[0], hi[0]), (x.iter().sum::<i64>(), -20_000, 29_999));
        Ok(())
    });
}

/// Every reduction kernel compiles with NVRTC, both variants (see kernel_macro.rs).
#[test]
fn every_reduction_kernel_compiles_with_nvrtc() {
    let kernels = [
        &reduce_f32::KERNEL,
        &reduce_f64::KERNEL,
        &reduce_i32::KERNEL,
        &reduce_u32::KERNEL,
        &reduce_i64::KERNEL,
        &reduce_u64::KERNEL,
        &jacobi_norm::KERNEL,
        &jacobi_norm::KERNEL_CHECKED,
        &count_kept::KERNEL,
        &count_kept::KERNEL_CHECKED,
    ];
    offload_tests::compile_with_nvrtc("reduction kernels", &kernels);
}
