//! `bf16` and `f16` in `#[offload::kernel]`, on every device of every backend: views and
//! scalar arguments of the 16-bit floats, their conversions (`to_f32`, `to_f64`,
//! `from_f32`) bit for bit as the `half` crate converts, on every bit pattern and on the
//! values where rounding is decided (ties, subnormals, overflow, NaN payloads), their
//! operators computed in f32 and rounded back as `half`'s are, and a teams kernel that
//! keeps them in team-local memory and reduces in f32.

use offload::half::{bf16, f16};
use offload::map;
use offload_tests::{check, on_every_device};

/// Every conversion of the language, both ways.
#[offload::kernel]
fn convert(i: usize, x: &[f32], b: &mut [bf16], h: &mut [f16], back: &mut [f32], wide: &mut [f64]) {
    b[i] = bf16::from_f32(x[i]);
    h[i] = f16::from_f32(x[i]);
    back[2 * i] = b[i].to_f32();
    back[2 * i + 1] = h[i].to_f32();
    wide[2 * i] = b[i].to_f64();
    wide[2 * i + 1] = f16::to_f64(h[i]);
}

/// Every bit pattern, widened.
#[offload::kernel]
fn widen(i: usize, b: &[bf16], h: &[f16], f: &mut [f32], d: &mut [f64]) {
    f[2 * i] = b[i].to_f32();
    f[2 * i + 1] = h[i].to_f32();
    d[2 * i] = b[i].to_f64();
    d[2 * i + 1] = h[i].to_f64();
}

/// `mix_bf16` and `mix_f16`: the operators on one 16-bit type (each computed in f32 and
/// rounded), a scalar argument of it, compound assignment, comparison, negation and a
/// selection.
macro_rules! mix_kernel {
    ($name:ident, $t:ty) => {
        #[offload::kernel]
        fn $name(i: usize, a: $t, x: &[$t], y: &[$t], out: &mut [$t], flags: &mut [u32]) {
            let p = x[i];
            let q = y[i];
            let mut v = a * p + q;
            v -= p / q;
            v *= if p < q { p - q } else { -(p % q) };
            out[i] = v;
            let lt = if p < q { 1u32 } else { 0u32 };
            let eq = if p == q { 2u32 } else { 0u32 };
            let ge = if p >= q { 4u32 } else { 0u32 };
            flags[i] = lt + eq + ge;
        }
    };
}
mix_kernel!(mix_bf16, bf16);
mix_kernel!(mix_f16, f16);

/// A device function over bf16: arguments and result of the 16-bit type (an add, then a
/// multiply: nothing a GPU compiler contracts into a fused multiply-add, so the bits are
/// the host's).
#[offload::device]
fn lerp(a: bf16, b: bf16, t: f32) -> bf16 {
    bf16::from_f32((a.to_f32() + b.to_f32()) * t)
}

/// `lerp` called from a kernel, its result bound to a typed local and converted.
#[offload::kernel]
fn blend(i: usize, t: f32, a: &[bf16], b: &[bf16], y: &mut [bf16], wide: &mut [f32]) {
    let v: bf16 = lerp(a[i], b[i], t);
    y[i] = v;
    wide[i] = v.to_f32();
}

#[test]
fn device_functions_take_and_return_bf16() {
    on_every_device("bf16 device function", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 300;
        let a: Vec<bf16> = (0..n).map(|k| bf16::from_f32(k as f32 * 0.37 - 20.0)).collect();
        let b: Vec<bf16> = (0..n).map(|k| bf16::from_f32(5.0 - k as f32 * 0.11)).collect();
        let (mut y, mut wide) = (vec![bf16::ZERO; n], vec![0f32; n]);
        gpu.data((map::to(&a), map::to(&b), map::from(&mut y), map::from(&mut wide)), |(a, b, y, w)| {
            blend::launch(&gpu, n, 0.3, a, b, y, w)
        })?;
        let (mut wy, mut ww) = (vec![bf16::ZERO; n], vec![0f32; n]);
        for i in 0..n {
            blend(i, 0.3, &a, &b, &mut wy, &mut ww);
        }
        check!(y == wy && wide == ww, "{:?} vs {:?}", &y[..4], &wy[..4]);
        Ok(())
    });
}

/// Every associated constant of the 16-bit floats the language has, stored.
#[offload::kernel]
fn constants(i: usize, b: &mut [bf16], h: &mut [f16]) {
    if i == 0 {
        b[0] = bf16::ZERO;
        b[1] = bf16::NEG_ZERO;
        b[2] = bf16::ONE;
        b[3] = bf16::NEG_ONE;
        b[4] = bf16::MAX;
        b[5] = bf16::MIN;
        b[6] = bf16::MIN_POSITIVE;
        b[7] = bf16::MIN_POSITIVE_SUBNORMAL;
        b[8] = bf16::MAX_SUBNORMAL;
        b[9] = bf16::EPSILON;
        b[10] = bf16::INFINITY;
        b[11] = bf16::NEG_INFINITY;
        b[12] = offload::half::bf16::NAN;
        h[0] = f16::ZERO;
        h[1] = f16::NEG_ZERO;
        h[2] = f16::ONE;
        h[3] = f16::NEG_ONE;
        h[4] = f16::MAX;
        h[5] = f16::MIN;
        h[6] = f16::MIN_POSITIVE;
        h[7] = f16::MIN_POSITIVE_SUBNORMAL;
        h[8] = f16::MAX_SUBNORMAL;
        h[9] = f16::EPSILON;
        h[10] = f16::INFINITY;
        h[11] = f16::NEG_INFINITY;
        h[12] = offload::half::f16::NAN;
    }
}

#[test]
fn the_constants_are_halfs_bits() {
    on_every_device("bf16 and f16 constants", |rt, d| {
        let gpu = rt.device(d)?;
        let (mut b, mut h) = (vec![bf16::ONE; 13], vec![f16::ONE; 13]);
        gpu.data((map::tofrom(&mut b), map::tofrom(&mut h)), |(b, h)| constants::launch(&gpu, 1, b, h))?;
        let wb = [
            bf16::ZERO,
            bf16::NEG_ZERO,
            bf16::ONE,
            bf16::NEG_ONE,
            bf16::MAX,
            bf16::MIN,
            bf16::MIN_POSITIVE,
            bf16::MIN_POSITIVE_SUBNORMAL,
            bf16::MAX_SUBNORMAL,
            bf16::EPSILON,
            bf16::INFINITY,
            bf16::NEG_INFINITY,
            bf16::NAN,
        ];
        let wh = [
            f16::ZERO,
            f16::NEG_ZERO,
            f16::ONE,
            f16::NEG_ONE,
            f16::MAX,
            f16::MIN,
            f16::MIN_POSITIVE,
            f16::MIN_POSITIVE_SUBNORMAL,
            f16::MAX_SUBNORMAL,
            f16::EPSILON,
            f16::INFINITY,
            f16::NEG_INFINITY,
            f16::NAN,
        ];
        check!(b.iter().map(|x| x.to_bits()).eq(wb.iter().map(|x| x.to_bits())), "{b:?}");
        check!(h.iter().map(|x| x.to_bits()).eq(wh.iter().map(|x| x.to_bits())), "{h:?}");
        Ok(())
    });
}

/// A row's RMS norm in bf16: the row kept in team-local bf16, the sum of squares in f32
/// across the team, the output scaled by a bf16 weight.
#[offload::kernel(teams = 64)]
fn rms_norm_bf16(row: usize, thread: usize, cols: usize, x: &[bf16], w: &[bf16], y: &mut [bf16]) {
    let mut tile: [bf16; 512] = offload::team_local();
    let mut acc = 0.0f32;
    let mut k = thread;
    while k < cols {
        let v = x[row * cols + k];
        tile[k] = v;
        acc += v.to_f32() * v.to_f32();
        k += offload::team_size();
    }
    let total = offload::team_sum(acc);
    let scale = 1.0f32 / (total / cols as f32 + 1e-6f32).sqrt();
    let mut k = thread;
    while k < cols {
        y[row * cols + k] = bf16::from_f32(tile[k].to_f32() * scale) * w[k];
        k += offload::team_size();
    }
}

/// docs/KERNELS.md's example: a row's mean in f32, the row centred and scaled in bf16.
#[offload::kernel(dims = 1)]
fn scale_rows(i: usize, cols: usize, s: bf16, x: &[bf16], y: &mut [bf16]) {
    let mut sum = 0.0f32;
    for k in 0..cols {
        sum += x[i * cols + k].to_f32();
    }
    let mean = bf16::from_f32(sum / cols as f32);
    for k in 0..cols {
        y[i * cols + k] = (x[i * cols + k] - mean) * s;
    }
}

#[test]
fn the_guides_example_gives_the_host_functions_bits() {
    on_every_device("bf16 rows", |rt, d| {
        let gpu = rt.device(d)?;
        let (rows, cols) = (50, 96);
        let x: Vec<bf16> =
            (0..rows * cols).map(|k| bf16::from_f32(((k * 37) % 101) as f32 * 0.03 - 1.1)).collect();
        let s = bf16::from_f32(-2.5);
        let mut y = vec![bf16::ZERO; rows * cols];
        gpu.data((map::to(&x), map::from(&mut y)), |(x, y)| scale_rows::launch(&gpu, rows, cols, s, x, y))?;
        let mut want = vec![bf16::ZERO; rows * cols];
        for i in 0..rows {
            scale_rows(i, cols, s, &x, &mut want);
        }
        check!(y == want, "{:?} vs {:?}", &y[..4], &want[..4]);
        Ok(())
    });
}

/// The f32 values where a conversion to bf16 or f16 decides something: ties to even either
/// way, the largest finite values and what overflows, subnormals of both types and what
/// underflows, zeros, infinities and NaNs with payloads.
fn edge_values() -> Vec<f32> {
    let mut v =
        vec![0.0, -0.0, 1.0, -1.0, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, f32::MAX, f32::MIN];
    // NaNs: quiet and signalling, with payloads in the bits kept and the bits dropped.
    for bits in [0x7fc0_0000u32, 0x7f80_0001, 0x7fa0_0000, 0xffc1_2345, 0x7f81_0000, 0x7fbf_ffff] {
        v.push(f32::from_bits(bits));
    }
    // Around each bf16 (and f16) step: exactly halfway, just under, just over, both parities.
    for base in [0x3f80_0000u32, 0x3f81_0000, 0x4049_0000, 0x7f7f_0000, 0x0080_0000, 0x0001_0000] {
        for low in [0x7fffu32, 0x8000, 0x8001, 0xffff, 0x0001] {
            v.push(f32::from_bits(base | low));
            v.push(-f32::from_bits(base | low));
        }
    }
    for base in [1.0f32, 1.5, 65504.0, 65519.0, 65520.0, 6.1035156e-5, 5.9604645e-8, 2.9802322e-8] {
        let b = base.to_bits();
        for d in [-1i32, 0, 1, 0x1000, -0x1000, 0x0fff, 0x1001] {
            v.push(f32::from_bits(b.wrapping_add_signed(d)));
        }
    }
    // A spread of ordinary values.
    v.extend((0..2000).map(|k| ((k as f32) * 0.7431).sin() * 10f32.powi(k % 13 - 6)));
    v
}

#[test]
fn conversions_agree_with_half_bit_for_bit() {
    on_every_device("bf16 and f16 conversions", |rt, d| {
        let gpu = rt.device(d)?;
        let x = edge_values();
        let n = x.len();
        let (mut b, mut h) = (vec![bf16::ZERO; n], vec![f16::ZERO; n]);
        let (mut back, mut wide) = (vec![0f32; 2 * n], vec![0f64; 2 * n]);
        gpu.data(
            (map::to(&x), map::from(&mut b), map::from(&mut h), map::from(&mut back), map::from(&mut wide)),
            |(x, b, h, back, wide)| convert::launch(&gpu, n, x, b, h, back, wide),
        )?;
        for (i, &v) in x.iter().enumerate() {
            let (wb, wh) = (bf16::from_f32(v), f16::from_f32(v));
            check!(
                b[i].to_bits() == wb.to_bits(),
                "bf16::from_f32({v:e} = {:#010x}): {:#06x}, half gives {:#06x}",
                v.to_bits(),
                b[i].to_bits(),
                wb.to_bits()
            );
            check!(
                h[i].to_bits() == wh.to_bits(),
                "f16::from_f32({v:e} = {:#010x}): {:#06x}, half gives {:#06x}",
                v.to_bits(),
                h[i].to_bits(),
                wh.to_bits()
            );
            check!(
                back[2 * i].to_bits() == wb.to_f32().to_bits()
                    && back[2 * i + 1].to_bits() == wh.to_f32().to_bits()
            );
            check!(
                wide[2 * i].to_bits() == wb.to_f64().to_bits()
                    && wide[2 * i + 1].to_bits() == wh.to_f64().to_bits()
            );
        }
        Ok(())
    });
}

#[test]
fn every_bit_pattern_widens_as_half_widens_it() {
    on_every_device("bf16 and f16 widened", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 1 << 16;
        let b: Vec<bf16> = (0..n).map(|k| bf16::from_bits(k as u16)).collect();
        let h: Vec<f16> = (0..n).map(|k| f16::from_bits(k as u16)).collect();
        let (mut f, mut dd) = (vec![0f32; 2 * n], vec![0f64; 2 * n]);
        gpu.data((map::to(&b), map::to(&h), map::from(&mut f), map::from(&mut dd)), |(b, h, f, dd)| {
            widen::launch(&gpu, n, b, h, f, dd)
        })?;
        for k in 0..n {
            let (wb, wh) = (b[k], h[k]);
            check!(
                f[2 * k].to_bits() == wb.to_f32().to_bits(),
                "bf16 {k:#06x}.to_f32(): {:#010x}",
                f[2 * k].to_bits()
            );
            check!(
                f[2 * k + 1].to_bits() == wh.to_f32().to_bits(),
                "f16 {k:#06x}.to_f32(): {:#010x}",
                f[2 * k + 1].to_bits()
            );
            check!(dd[2 * k].to_bits() == wb.to_f64().to_bits(), "bf16 {k:#06x}.to_f64()");
            check!(dd[2 * k + 1].to_bits() == wh.to_f64().to_bits(), "f16 {k:#06x}.to_f64()");
        }
        Ok(())
    });
}

/// Pairs of operands: ordinary values of both signs and magnitudes, equal pairs, zeros,
/// and values whose results overflow or are subnormal.
fn operands(n: usize) -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..n).map(|k| ((k as f32) * 0.377).sin() * 2f32.powi((k % 17) as i32 - 8)).collect();
    let mut y: Vec<f32> =
        (0..n).map(|k| ((k as f32) * 1.91).cos() * 2f32.powi((k % 11) as i32 - 5)).collect();
    for k in (0..n).step_by(7) {
        y[k] = x[k];
    }
    y[1] = 0.0;
    (x, y)
}

/// A 16-bit float type as the operator test needs it.
trait Half: Copy + Default + std::fmt::Display + offload::DeviceCopy {
    const NAME: &'static str;
    fn from_f32(v: f32) -> Self;
    fn bits(self) -> u16;
    fn nan(self) -> bool;
}

macro_rules! half {
    ($($t:ident),*) => {$(
        impl Half for $t {
            const NAME: &'static str = stringify!($t);
            fn from_f32(v: f32) -> Self {
                $t::from_f32(v)
            }
            fn bits(self) -> u16 {
                self.to_bits()
            }
            fn nan(self) -> bool {
                self.is_nan()
            }
        }
    )*};
}
half!(bf16, f16);

/// The operands of [`operands`] in `T`, run through a `mix` kernel (`launch`) and through
/// the same function on the host (`host`): the same bits (or both NaN) and comparisons.
fn check_mix<T: Half>(
    gpu: &offload::Device<'_>,
    a: T,
    launch: impl Fn(
        offload::DeviceSlice<'_, T>,
        offload::DeviceSlice<'_, T>,
        offload::DeviceSlice<'_, T>,
        offload::DeviceSlice<'_, u32>,
    ) -> offload::Result<()>,
    host: impl Fn(usize, T, &[T], &[T], &mut [T], &mut [u32]),
) -> offload::Result<()> {
    let n = 4096;
    let (x, y) = operands(n);
    let (x, y): (Vec<T>, Vec<T>) =
        (x.into_iter().map(T::from_f32).collect(), y.into_iter().map(T::from_f32).collect());
    let (mut out, mut flags) = (vec![T::default(); n], vec![0u32; n]);
    gpu.data((map::to(&x), map::to(&y), map::from(&mut out), map::from(&mut flags)), |(xv, yv, o, f)| {
        launch(xv, yv, o, f)
    })?;
    let (mut want, mut want_flags) = (vec![T::default(); n], vec![0u32; n]);
    for i in 0..n {
        host(i, a, &x, &y, &mut want, &mut want_flags);
    }
    for i in 0..n {
        let (o, w) = (out[i], want[i]);
        check!(
            o.bits() == w.bits() || (o.nan() && w.nan()),
            "{} item {i} ({} and {}): {o} ({:#06x}), half gives {w} ({:#06x})",
            T::NAME,
            x[i],
            y[i],
            o.bits(),
            w.bits()
        );
    }
    check!(flags == want_flags, "{} comparisons differ", T::NAME);
    Ok(())
}

#[test]
fn operators_compute_in_f32_and_round_as_half_does() {
    on_every_device("bf16 and f16 operators", |rt, d| {
        let gpu = rt.device(d)?;
        let a = bf16::from_f32(1.375);
        check_mix(&gpu, a, |x, y, o, f| mix_bf16::launch(&gpu, x.len(), a, x, y, o, f), mix_bf16)?;
        let a = f16::from_f32(-0.8125);
        check_mix(&gpu, a, |x, y, o, f| mix_f16::launch(&gpu, x.len(), a, x, y, o, f), mix_f16)
    });
}

#[test]
fn a_teams_kernel_keeps_bf16_in_team_local_memory_and_reduces_in_f32() {
    on_every_device("bf16 RMS norm", |rt, d| {
        let gpu = rt.device(d)?;
        let (rows, cols) = (37, 300);
        let x: Vec<bf16> =
            (0..rows * cols).map(|k| bf16::from_f32(((k as f32) * 0.0137).sin() * 3.0 + 0.25)).collect();
        let w: Vec<bf16> = (0..cols).map(|k| bf16::from_f32(0.5 + (k % 7) as f32 * 0.125)).collect();
        let mut y = vec![bf16::ZERO; rows * cols];
        gpu.data((map::to(&x), map::to(&w), map::from(&mut y)), |(x, w, y)| {
            rms_norm_bf16::launch(&gpu, rows, cols, x, w, y)
        })?;
        // Against f64 on the same bf16 inputs: the f32 sum's order differs by backend, so
        // an output may round to the neighbouring bf16; allow two of its steps (2^-7 each).
        for r in 0..rows {
            let row = &x[r * cols..(r + 1) * cols];
            let ms = row.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>() / cols as f64;
            let scale = 1.0 / (ms + 1e-6).sqrt();
            for k in 0..cols {
                let want = row[k].to_f64() * scale * w[k].to_f64();
                let got = y[r * cols + k].to_f64();
                check!(
                    (got - want).abs() <= 2.0 * 2f64.powi(-7) * want.abs().max(2f64.powi(-126)),
                    "row {r} col {k}: {got} vs {want}"
                );
            }
        }
        Ok(())
    });
}

#[test]
fn every_half_float_kernel_compiles_with_nvrtc() {
    offload_tests::compile_with_nvrtc(
        "bf16 and f16",
        &[
            &convert::KERNEL,
            &convert::KERNEL_CHECKED,
            &widen::KERNEL,
            &mix_bf16::KERNEL,
            &mix_bf16::KERNEL_CHECKED,
            &mix_f16::KERNEL,
            &rms_norm_bf16::KERNEL,
            &rms_norm_bf16::KERNEL_CHECKED,
            &scale_rows::KERNEL,
            &constants::KERNEL,
            &blend::KERNEL,
        ],
    );
}
