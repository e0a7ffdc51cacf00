//! `offload_kernels::nn` on every device of every backend, in f32, bf16 and f16: each
//! kernel against an f64 reference computed from the same (rounded) inputs, within the
//! output type's rounding plus f32's arithmetic:
//!
//! | type | relative | absolute |
//! | --- | --- | --- |
//! | f32 | 2e-5 | 1e-6 |
//! | bf16 | 2^-8 + 2e-5 (half a bf16 step, rounded once) | 1e-6 |
//! | f16 | 2^-11 + 2e-5 (half an f16 step) | 1e-6 |
//!
//! argmax and the casts exactly; the shape errors name the argument.

use offload::half::{bf16, f16};
use offload::tensor::{DeviceTensor, HostTensor};
use offload::weights::{serialize, Weights};
use offload::Device;
use offload::{map, Error};
use offload_kernels::nn::{self, NnFloat};
use offload_kernels::ops;
use offload_kernels::Activation;
use offload_tests::{check, on_every_device};

/// A test's view of an element type: conversions and the tolerance of the table above.
trait Elem: NnFloat + Copy + Default + PartialEq + std::fmt::Debug {
    fn of(v: f32) -> Self;
    fn f(self) -> f64;
    const REL: f64;
}

impl Elem for f32 {
    fn of(v: f32) -> Self {
        v
    }
    fn f(self) -> f64 {
        f64::from(self)
    }
    const REL: f64 = 2e-5;
}

impl Elem for bf16 {
    fn of(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
    const REL: f64 = 1.0 / 256.0 + 2e-5;
}

impl Elem for f16 {
    fn of(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn f(self) -> f64 {
        self.to_f64()
    }
    const REL: f64 = 1.0 / 2048.0 + 2e-5;
}

/// `got` against the f64 reference `want`, within `T`'s tolerance.
fn close<T: Elem>(what: &str, got: &[T], want: &[f64]) -> offload::Result<()> {
    check!(got.len() == want.len());
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.f();
        check!(
            (g - w).abs() <= T::REL * w.abs() + 1e-6,
            "{what} in {}: element {k} is {g}, the f64 reference {w}",
            T::NAME
        );
    }
    Ok(())
}

/// `rows` rows of `cols` values with a spread of magnitudes, rounded to `T`.
fn input<T: Elem>(rows: usize, cols: usize, seed: usize) -> Vec<T> {
    (0..rows * cols)
        .map(|k| T::of((((k * 7919 + seed * 104_729) % 10_007) as f32 / 10_007.0 - 0.5) * 8.0))
        .collect()
}

/// Every kernel of the module in `T`, against its f64 reference, on rows of 300 columns
/// (more than a team's 256 threads, not a multiple of it); the row-wise kernels whose team
/// covers a row in whole warps also on rows of 5 (one warp, mostly idle) and 33 (two
/// warps, the second nearly idle).
fn every_kernel_in<T: Elem>(rt: &offload::Runtime, d: usize) -> offload::Result<()> {
    for (rows, cols) in [(19, 300), (7, 5), (5, 33)] {
        every_kernel_in_shape::<T>(rt, d, rows, cols)?;
    }
    Ok(())
}

/// [`every_kernel_in`] on `rows` rows of `cols`.
fn every_kernel_in_shape<T: Elem>(
    rt: &offload::Runtime,
    d: usize,
    rows: usize,
    cols: usize,
) -> offload::Result<()> {
    let dev = rt.device(d)?;
    let x: Vec<T> = input(rows, cols, 1);
    let gamma: Vec<T> = input(1, cols, 2);
    let beta: Vec<T> = input(1, cols, 3);
    let rows_of =
        |v: &[T]| -> Vec<Vec<f64>> { v.chunks(cols).map(|r| r.iter().map(|e| e.f()).collect()).collect() };
    let xr = rows_of(&x);
    let (gr, br): (Vec<f64>, Vec<f64>) =
        (gamma.iter().map(|e| e.f()).collect(), beta.iter().map(|e| e.f()).collect());
    let (gr, br) = (&gr, &br);

    let mut y = vec![T::default(); rows * cols];
    dev.data((map::to(&x), map::from(&mut y)), |(x, y)| nn::softmax(&dev, cols, x, y))?;
    let soft: Vec<f64> = xr
        .iter()
        .flat_map(|r| {
            let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = r.iter().map(|v| (v - m).exp()).sum();
            r.iter().map(move |v| (v - m).exp() / s).collect::<Vec<_>>()
        })
        .collect();
    close("softmax", &y, &soft)?;

    dev.data((map::to(&x), map::from(&mut y)), |(x, y)| nn::log_softmax(&dev, cols, x, y))?;
    close("log_softmax", &y, &soft.iter().map(|p| p.ln()).collect::<Vec<_>>())?;

    let eps = 1e-5f32;
    dev.data((map::to(&x), map::to(&gamma), map::to(&beta), map::from(&mut y)), |(x, g, b, y)| {
        nn::layer_norm(&dev, cols, eps, x, g, b, y)
    })?;
    let ln: Vec<f64> = xr
        .iter()
        .flat_map(|r| {
            let mean = r.iter().sum::<f64>() / cols as f64;
            let var = r.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
            let rstd = 1.0 / (var + f64::from(eps)).sqrt();
            r.iter().enumerate().map(move |(k, v)| (v - mean) * rstd * gr[k] + br[k]).collect::<Vec<_>>()
        })
        .collect();
    close("layer_norm", &y, &ln)?;

    dev.data((map::to(&x), map::to(&gamma), map::from(&mut y)), |(x, w, y)| {
        nn::rms_norm(&dev, cols, eps, x, w, y)
    })?;
    let rms: Vec<f64> = xr
        .iter()
        .flat_map(|r| {
            let rstd = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / cols as f64 + f64::from(eps)).sqrt();
            r.iter().enumerate().map(move |(k, v)| v * rstd * gr[k]).collect::<Vec<_>>()
        })
        .collect();
    close("rms_norm", &y, &rms)?;
    if cols != 300 {
        // The kernels below have teams of a fixed size, or none: one shape is enough.
        return Ok(());
    }

    // argmax: ties go to the first; a row of equal values, and one with its max twice.
    let mut xa = x.clone();
    xa[cols..2 * cols].iter_mut().for_each(|v| *v = T::of(1.5));
    xa[2 * cols + 10] = T::of(100.0);
    xa[2 * cols + 250] = T::of(100.0);
    let mut at = vec![u32::MAX; rows];
    dev.data((map::to(&xa), map::from(&mut at)), |(x, o)| nn::argmax(&dev, cols, x, o))?;
    let want: Vec<u32> = rows_of(&xa)
        .iter()
        .map(|r| {
            let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            r.iter().position(|&v| v == m).unwrap_or(0) as u32
        })
        .collect();
    check!(at == want, "argmax in {}: {at:?}, want {want:?}", T::NAME);
    check!(at[1] == 0 && at[2] == 10);

    // top-k: decreasing, equals by index, NaNs passed over; a row of NaNs but two.
    let k = 7;
    let mut xk = xa.clone();
    xk[5] = T::of(f32::NAN);
    xk[3 * cols..4 * cols]
        .iter_mut()
        .enumerate()
        .for_each(|(j, v)| *v = T::of(if j == 4 || j == 9 { -2.0 } else { f32::NAN }));
    let (mut values, mut indices) = (vec![T::default(); rows * k], vec![0u32; rows * k]);
    dev.data((map::to(&xk), map::from(&mut values), map::from(&mut indices)), |(x, v, i)| {
        nn::top_k(&dev, cols, k, x, v, i)
    })?;
    for (r, row) in rows_of(&xk).iter().enumerate() {
        let mut order: Vec<usize> = (0..cols).filter(|&j| !row[j].is_nan()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        order.resize(k, u32::MAX as usize);
        let want: Vec<u32> = order.iter().map(|&j| j as u32).collect();
        let got = &indices[r * k..(r + 1) * k];
        check!(got == want, "top_k in {} row {r}: {got:?}, want {want:?}", T::NAME);
        for (p, &j) in order.iter().enumerate() {
            let want = if j < cols { row[j] } else { f64::NEG_INFINITY };
            check!(values[r * k + p].f() == want, "top_k value {p} of row {r} in {}", T::NAME);
        }
    }
    check!(indices[k..2 * k] == [0, 1, 2, 3, 4, 5, 6], "equals by index: {:?}", &indices[k..2 * k]);
    check!(indices[3 * k..3 * k + 3] == [4, 9, u32::MAX]);

    // Element-wise: GELU both ways, SiLU, the residual add, casts.
    let xs: Vec<f64> = x.iter().map(|e| e.f()).collect();
    dev.data((map::to(&x), map::from(&mut y)), |(x, y)| nn::gelu(&dev, x, y))?;
    let erf = |v: f64| libm_erf(v);
    close("gelu", &y, &xs.iter().map(|&v| 0.5 * v * (1.0 + erf(v / 2f64.sqrt()))).collect::<Vec<_>>())?;
    dev.data((map::to(&x), map::from(&mut y)), |(x, y)| nn::gelu_tanh(&dev, x, y))?;
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let gt: Vec<f64> =
        xs.iter().map(|&v| 0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())).collect();
    close("gelu_tanh", &y, &gt)?;
    dev.data((map::to(&x), map::from(&mut y)), |(x, y)| nn::silu(&dev, x, y))?;
    close("silu", &y, &xs.iter().map(|&v| v / (1.0 + (-v).exp())).collect::<Vec<_>>())?;
    let b: Vec<T> = input(rows, cols, 4);
    dev.data((map::to(&x), map::to(&b), map::from(&mut y)), |(a, b, y)| nn::add(&dev, a, b, y))?;
    close("add", &y, &xs.iter().zip(&b).map(|(a, b)| a + b.f()).collect::<Vec<_>>())?;

    let wide: Vec<f32> = (0..1000).map(|k| (k as f32 * 0.01371).sin() * 300.0).collect();
    let mut narrow = vec![T::default(); wide.len()];
    let mut back = vec![0f32; wide.len()];
    dev.data((map::to(&wide), map::from(&mut narrow), map::from(&mut back)), |(w, n, b)| {
        nn::from_f32(&dev, w, n)?;
        nn::to_f32(&dev, n, b)
    })?;
    check!(narrow.iter().zip(&wide).all(|(n, &w)| *n == T::of(w)), "from_f32 in {}", T::NAME);
    check!(back.iter().zip(&narrow).all(|(b, n)| f64::from(*b) == n.f()), "to_f32 in {}", T::NAME);
    Ok(())
}

/// erf in f64 by its series and continued fraction (std has none): within 1e-15, far
/// below every tolerance here.
fn libm_erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    // Numerical Recipes' erfc approximation, fractional error below 1.2e-7.
    let y = t
        * (-x * x - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398
                                    + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - y
    } else {
        y - 1.0
    }
}

#[test]
fn every_kernel_agrees_with_f64_in_f32() {
    on_every_device("nn in f32", every_kernel_in::<f32>);
}

#[test]
fn every_kernel_agrees_with_f64_in_bf16() {
    on_every_device("nn in bf16", every_kernel_in::<bf16>);
}

#[test]
fn every_kernel_agrees_with_f64_in_f16() {
    on_every_device("nn in f16", every_kernel_in::<f16>);
}

#[test]
fn shapes_that_do_not_fit_are_refused_naming_the_argument() {
    on_every_device("nn shapes", |rt, d| {
        let dev = rt.device(d)?;
        let x = vec![bf16::ZERO; 12];
        let (mut y, mut short, mut at) = (vec![bf16::ZERO; 12], vec![bf16::ZERO; 5], vec![0u32; 3]);
        let w = vec![bf16::ONE; 4];
        let msg = |e: Error| e.to_string();
        dev.data(
            (map::to(&x), map::from(&mut y), map::from(&mut short), map::to(&w), map::from(&mut at)),
            |(x, y, short, w, at)| {
                let e = nn::softmax(&dev, 5, x, y).unwrap_err();
                check!(msg(e).contains("`x` holds 12 elements, not whole rows of 5"));
                let e = nn::softmax(&dev, 0, x, y).unwrap_err();
                check!(msg(e).contains("not whole rows of 0"));
                let e = nn::log_softmax(&dev, 4, x, short).unwrap_err();
                check!(msg(e).contains("`y` holds 5 elements; expected 12"));
                let e = nn::rms_norm(&dev, 3, 1e-6, x, w, y).unwrap_err();
                check!(msg(e).contains("`w` holds 4 elements; expected 3 (one per column)"));
                let e = nn::layer_norm(&dev, 4, f32::NAN, x, w, w, y).unwrap_err();
                check!(msg(e).contains("eps NaN"));
                let e = nn::layer_norm(&dev, 4, 1e-5, x, w, short, y).unwrap_err();
                check!(msg(e).contains("`beta` holds 5 elements"));
                let e = nn::argmax(&dev, 6, x, at).unwrap_err();
                check!(msg(e).contains("`out` holds 3 elements; expected 2 (one per row)"));
                let e = nn::top_k(&dev, 4, 0, x, y, at).unwrap_err();
                check!(msg(e).contains("k = 0 of rows of 4; expected 1 to 4"));
                let e = nn::top_k(&dev, 4, 5, x, y, at).unwrap_err();
                check!(msg(e).contains("k = 5 of rows of 4"));
                let e = nn::top_k(&dev, 4, 1, x, y, at).unwrap_err();
                check!(msg(e).contains("`values` holds 12 elements; expected 3 (rows x k)"));
                let e = nn::add(&dev, x, short, y).unwrap_err();
                check!(msg(e).contains("`b` holds 5 elements; expected 12"));
                check!(nn::gelu(&dev, x, short).is_err() && nn::silu(&dev, short, y).is_err());
                // The same shapes fit.
                nn::rms_norm(&dev, 4, 1e-6, x, w, y)?;
                nn::argmax(&dev, 4, x, at)
            },
        )?;
        check!(at == [0, 0, 0]);
        Ok(())
    });
}

#[test]
fn in_place_forms_give_the_out_of_place_bits_and_one_view_twice_is_refused() {
    on_every_device("nn in place", |rt, d| {
        let dev = rt.device(d)?;
        let x: Vec<bf16> = input(4, 256, 5);
        let b: Vec<bf16> = input(4, 256, 6);
        type Op = fn(
            &offload::Device<'_>,
            offload::DeviceSlice<'_, bf16>,
            offload::DeviceSlice<'_, bf16>,
        ) -> offload::Result<()>;
        type InPlace = fn(&offload::Device<'_>, offload::DeviceSlice<'_, bf16>) -> offload::Result<()>;
        let ops: [(&str, Op, InPlace); 3] = [
            ("gelu", nn::gelu, nn::gelu_in_place),
            ("gelu_tanh", nn::gelu_tanh, nn::gelu_tanh_in_place),
            ("silu", nn::silu, nn::silu_in_place),
        ];
        for (name, out_of_place, in_place) in ops {
            let (mut y, mut z) = (vec![bf16::ZERO; x.len()], x.clone());
            dev.data((map::to(&x), map::from(&mut y), map::tofrom(&mut z)), |(x, y, z)| {
                out_of_place(&dev, x, y)?;
                in_place(&dev, z)
            })?;
            check!(y == z, "{name}: in place differs");
            // The same view as input and output: refused, nothing run.
            let mut w = x.clone();
            let e = dev.data(map::tofrom(&mut w), |w| out_of_place(&dev, w, w)).unwrap_err();
            check!(e.to_string().contains("overlap and the kernel writes `y`"), "{e}");
            check!(w == x);
        }
        let (mut y, mut z) = (vec![bf16::ZERO; x.len()], x.clone());
        dev.data((map::to(&x), map::to(&b), map::from(&mut y), map::tofrom(&mut z)), |(x, b, y, z)| {
            nn::add(&dev, x, b, y)?;
            nn::add_in_place(&dev, z, b)
        })?;
        check!(y == z, "add in place differs");
        Ok(())
    });
}

/// Attention in `T` against f64 on the same rounded inputs: prefill (`q_len == kv_len`) and
/// decoding steps over a cache (`q_len < kv_len`), causal and not. Scores and
/// probabilities are stored in `T` between the products (as PyTorch's math backend does),
/// so a probability may be off by `T`'s relative step times (1 + the row's largest score)
/// twice over, and the output by that times the values' largest magnitude, plus its own
/// rounding.
fn attention_in<T: Elem>(rt: &offload::Runtime, d: usize) -> offload::Result<()> {
    let dev = rt.device(d)?;
    let cases = [
        (7, 7, true, 7),
        (7, 7, false, 7),
        (1, 9, true, 9),
        (3, 9, true, 9),
        (5, 300, false, 300),
        (3, 9, true, 16),
    ];
    for (q_len, kv_len, causal, cap) in cases {
        let (batch, heads, dim) = (2, 3, 40);
        let kv_capacity = (cap != kv_len).then_some(cap);
        let a =
            nn::Attention { batch, heads, q_len, kv_len, head_dim: dim, causal, scale: None, kv_capacity };
        // Queries and keys of magnitude up to 1, as after a layer norm.
        let small = |v: Vec<T>| -> Vec<T> { v.into_iter().map(|x| T::of(x.f() as f32 * 0.25)).collect() };
        let q: Vec<T> = small(input(batch * heads * q_len, dim, 7));
        // A cache's positions past `kv_len` hold NaN: never read.
        let past = |mut x: Vec<T>| {
            x.chunks_mut(dim)
                .enumerate()
                .filter(|(r, _)| r % cap >= kv_len)
                .for_each(|(_, row)| row.fill(T::of(f32::NAN)));
            x
        };
        let k: Vec<T> = past(small(input(batch * heads * cap, dim, 8)));
        let v: Vec<T> = past(input(batch * heads * cap, dim, 9));
        let mut s = vec![T::default(); batch * heads * q_len * kv_len];
        let mut out = vec![T::default(); q.len()];
        dev.data(
            (map::to(&q), map::to(&k), map::to(&v), map::from(&mut s), map::from(&mut out)),
            |(q, k, v, s, o)| nn::attention(&dev, a, q, k, v, s, o),
        )?;
        let scale = 1.0 / (dim as f64).sqrt();
        let vmax = v.iter().map(|x| x.f().abs()).filter(|x| !x.is_nan()).fold(0.0, f64::max);
        for h in 0..batch * heads {
            for i in 0..q_len {
                let keep = if causal { kv_len - q_len + i + 1 } else { kv_len };
                let row: Vec<f64> = (0..keep)
                    .map(|j| {
                        (0..dim)
                            .map(|c| q[(h * q_len + i) * dim + c].f() * k[(h * cap + j) * dim + c].f())
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let smax = row.iter().map(|x| x.abs()).fold(0.0, f64::max);
                let tol = (4.0 * T::REL * (1.0 + smax) + 1e-4) * vmax;
                let total: f64 = row.iter().map(|x| (x - m).exp()).sum();
                for c in 0..dim {
                    let want: f64 =
                        (0..keep).map(|j| (row[j] - m).exp() / total * v[(h * cap + j) * dim + c].f()).sum();
                    let got = out[(h * q_len + i) * dim + c].f();
                    check!(
                        (got - want).abs() <= tol,
                        "{} {a:?}: head {h} query {i} feature {c}: {got} vs {want}",
                        T::NAME
                    );
                }
                // Masked keys have probability 0; the kept ones sum to 1.
                let p = &s[(h * q_len + i) * kv_len..(h * q_len + i + 1) * kv_len];
                check!(p[keep..].iter().all(|x| x.f() == 0.0));
                check!(
                    (p.iter().map(|x| x.f()).sum::<f64>() - 1.0).abs()
                        <= 4.0 * T::REL * (keep as f64).sqrt() + 1e-5
                );
            }
        }
    }
    Ok(())
}

#[test]
fn attention_agrees_with_f64_in_every_type() {
    on_every_device("attention f32", attention_in::<f32>);
    on_every_device("attention bf16", attention_in::<bf16>);
    on_every_device("attention f16", attention_in::<f16>);
}

#[test]
fn attention_shapes_that_do_not_fit_are_refused() {
    on_every_device("attention shapes", |rt, d| {
        let dev = rt.device(d)?;
        let x = vec![0f32; 2 * 4 * 8];
        let mut s = vec![0f32; 2 * 4 * 4];
        let mut o = vec![0f32; 2 * 4 * 8];
        let a = nn::Attention {
            batch: 1,
            heads: 2,
            q_len: 4,
            kv_len: 4,
            head_dim: 8,
            causal: true,
            scale: None,
            kv_capacity: None,
        };
        dev.data((map::to(&x), map::from(&mut s), map::from(&mut o)), |(x, s, o)| {
            nn::attention(&dev, a, x, x, x, s, o)?;
            let e = nn::attention(&dev, nn::Attention { q_len: 5, ..a }, x, x, x, s, o).unwrap_err();
            check!(e.to_string().contains("a causal attention's queries are the last"), "{e}");
            let e = nn::attention(&dev, nn::Attention { kv_len: 3, causal: false, ..a }, x, x, x, s, o)
                .unwrap_err();
            check!(e.to_string().contains("`k` holds 64 elements; expected 48"), "{e}");
            let e =
                nn::attention(&dev, nn::Attention { kv_capacity: Some(3), ..a }, x, x, x, s, o).unwrap_err();
            check!(e.to_string().contains("hold fewer positions than are read"), "{e}");
            let e =
                nn::attention(&dev, nn::Attention { kv_capacity: Some(5), ..a }, x, x, x, s, o).unwrap_err();
            check!(e.to_string().contains("`k` holds 64 elements; expected 80"), "{e}");
            let e = nn::attention(&dev, nn::Attention { head_dim: 0, ..a }, x, x, x, s, o).unwrap_err();
            check!(e.to_string().contains("at least 1"), "{e}");
            let e = nn::attention(&dev, nn::Attention { batch: usize::MAX, ..a }, x, x, x, s, o).unwrap_err();
            check!(e.to_string().contains("overflows"), "{e}");
            Ok(())
        })?;
        Ok(())
    });
}

#[test]
fn embedding_gathers_rows_by_id_and_refuses_an_id_past_the_table() {
    on_every_device("embedding", |rt, d| {
        let dev = rt.device(d)?;
        let (vocab, dim) = (50, 24);
        let table: Vec<bf16> = input(vocab, dim, 11);
        let ids = [3u32, 0, 49, 3, 17];
        let mut out = vec![bf16::ZERO; ids.len() * dim];
        dev.data((map::to(&table), map::from(&mut out)), |(t, o)| nn::embedding(&dev, dim, &ids, t, o))?;
        for (r, &id) in ids.iter().enumerate() {
            let id = id as usize;
            check!(out[r * dim..(r + 1) * dim] == table[id * dim..(id + 1) * dim], "row {r}");
        }
        let mut out = vec![bf16::ZERO; 2 * dim];
        dev.data((map::to(&table), map::tofrom(&mut out)), |(t, o)| {
            let e = nn::embedding(&dev, dim, &[1, 50], t, o).unwrap_err();
            check!(e.to_string().contains("id 50 (position 1) is past the table's 50 rows"), "{e}");
            let e = nn::embedding(&dev, dim, &[1, 2, 3], t, o).unwrap_err();
            check!(e.to_string().contains("`out` holds 48 elements; expected 72 (ids x dim)"), "{e}");
            let e = nn::embedding(&dev, 7, &[1], t, o).unwrap_err();
            check!(e.to_string().contains("`table` holds 1200 elements, not whole rows of 7"), "{e}");
            Ok(())
        })?;
        check!(out.iter().all(|v| *v == bf16::ZERO), "nothing gathered after a refusal");
        Ok(())
    });
}

/// docs/INFERENCE.md's forward pass, as written there.
/// The class of each of `rows` rows of 64 features in `x`.
fn classify(dev: &Device<'_>, path: &std::path::Path, x: &[f32], rows: usize) -> offload::Result<Vec<u32>> {
    let w = Weights::open(path)?;
    // Weights once onto the device, converted to bf16 (rounded once), shapes as declared.
    let w0 = w.device_tensor::<bf16>(dev, "0.weight", &[128, 64])?;
    let b0 = w.device_tensor::<bf16>(dev, "0.bias", &[128])?;
    let w2 = w.device_tensor::<bf16>(dev, "2.weight", &[10, 128])?;
    let b2 = w.device_tensor::<bf16>(dev, "2.bias", &[10])?;
    // The batch, converted on the device; activations in device scratch.
    let xs = DeviceTensor::from_host(dev, &HostTensor::new("x", &[rows, 64], x.to_vec())?)?;
    let x16 = DeviceTensor::<bf16>::new(dev, "x16", &[rows, 64])?;
    let h = DeviceTensor::<bf16>::new(dev, "h", &[rows, 128])?;
    let logits = DeviceTensor::<bf16>::new(dev, "logits", &[rows, 10])?;
    let classes = DeviceTensor::<u32>::new(dev, "classes", &[rows])?;
    ops::from_f32(dev, &xs, &x16)?;
    ops::linear(dev, &x16, &w0, Some(&b0), &h, Activation::Gelu)?;
    ops::linear(dev, &h, &w2, Some(&b2), &logits, Activation::Identity)?;
    ops::argmax(dev, &logits, &classes)?;
    Ok(classes.to_host()?.into_vec())
}

#[test]
fn the_inference_pages_forward_pass_classifies_on_every_device() {
    // A model whose answers are plain: layer 0 copies the 64 features (and GELU keeps a
    // 3 near 3, a 0 at 0), layer 2 reads feature k as class k's logit; row r's feature
    // r % 10 is 3, the others 0, so its class is r % 10.
    let (rows, mut w0, mut w2) = (37, vec![0f32; 128 * 64], vec![0f32; 10 * 128]);
    (0..64).for_each(|j| w0[j * 64 + j] = 1.0);
    (0..10).for_each(|k| w2[k * 128 + k] = 1.0);
    let bytes = serialize(&[
        ("0.weight", &[128, 64][..], &w0[..]),
        ("0.bias", &[128], &[0f32; 128]),
        ("2.weight", &[10, 128], &w2[..]),
        ("2.bias", &[10], &[0f32; 10]),
    ])
    .expect("a file");
    let path = std::env::temp_dir().join(format!("offload-nn-mlp-{}.safetensors", std::process::id()));
    std::fs::write(&path, bytes).expect("a temporary file");
    let x: Vec<f32> = (0..rows * 64).map(|i| if i % 64 == (i / 64) % 10 { 3.0 } else { 0.0 }).collect();
    on_every_device("inference page", |rt, d| {
        let classes = classify(&rt.device(d)?, &path, &x, rows)?;
        check!(classes == (0..rows as u32).map(|r| r % 10).collect::<Vec<_>>(), "{classes:?}");
        Ok(())
    });
    let _ = std::fs::remove_file(&path);
}

#[test]
fn every_nn_kernel_compiles_with_nvrtc() {
    offload_tests::compile_with_nvrtc("nn", &nn::all());
}
