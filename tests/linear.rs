//! `offload_kernels::linear`: PyTorch's dense layer (`y = act(x W^T + b)`, row-major, W as
//! `nn.Linear` holds it) over the device's GEMM, on every device of every backend, against
//! an f64 reference, in every precision (fp32, TF32, fp16, bf16) within its stated
//! tolerance; and its shape errors, each naming the operand.

use offload::half::{bf16, f16};
use offload::{map, Error, HostBuffer, MapType, Precision};
use offload_kernels::nn::NnFloat;
use offload_kernels::{linear, Activation, Linear};
use offload_tests::{activation_f64, check, on_every_device, values};

/// The layer in f64, row by row.
fn reference(l: Linear, x: &[f32], w: &[f32], b: Option<&[f32]>, act: Activation) -> Vec<f64> {
    let mut y = Vec::with_capacity(l.rows * l.out_features);
    for r in 0..l.rows {
        for o in 0..l.out_features {
            let dot: f64 = (0..l.in_features)
                .map(|i| f64::from(x[r * l.in_features + i]) * f64::from(w[o * l.in_features + i]))
                .sum();
            let v = dot + b.map_or(0.0, |b| f64::from(b[o]));
            y.push(activation_f64(act, v));
        }
    }
    y
}

#[test]
fn a_dense_layer_agrees_with_the_reference_on_every_device() {
    on_every_device("linear", |rt, d| {
        let dev = rt.device(d)?;
        for (l, with_bias, act) in [
            (Linear { rows: 5, in_features: 7, out_features: 3, tf32: false }, true, Activation::Relu),
            (Linear { rows: 64, in_features: 33, out_features: 48, tf32: false }, true, Activation::Identity),
            (Linear { rows: 9, in_features: 16, out_features: 16, tf32: false }, false, Activation::Relu),
            (Linear { rows: 1, in_features: 4, out_features: 2, tf32: false }, false, Activation::Identity),
        ] {
            let x = values(1, l.rows * l.in_features);
            let w = values(2, l.out_features * l.in_features);
            let b = values(3, l.out_features);
            let mut y = vec![f32::NAN; l.rows * l.out_features];
            dev.data((map::to(&x), map::to(&w), map::to(&b), map::from(&mut y)), |(xv, wv, bv, yv)| {
                linear(&dev, l, xv, wv, with_bias.then_some(bv), yv, act)
            })?;
            let want = reference(l, &x, &w, with_bias.then_some(&b[..]), act);
            for (i, (got, want)) in y.iter().zip(&want).enumerate() {
                let tol = 1e-5 * (1.0 + l.in_features as f64);
                check!((f64::from(*got) - want).abs() <= tol, "{l:?} element {i}: {got} vs {want}");
            }
        }
        Ok(())
    });
}

#[test]
fn each_operand_of_the_wrong_size_is_named() {
    on_every_device("linear shapes", |rt, d| {
        let dev = rt.device(d)?;
        let l = Linear { rows: 2, in_features: 3, out_features: 4, tf32: false };
        let (x, w, b) = (vec![0f32; 6], vec![0f32; 12], vec![0f32; 4]);
        let mut y = vec![0f32; 8];
        let cases: [(&str, Linear, &str); 3] = [
            ("x", Linear { rows: 3, ..l }, "x has 6 elements; expected rows x in_features = 3 x 3"),
            (
                "w",
                Linear { rows: 3, in_features: 2, ..l },
                "w has 12 elements; expected out_features x in_features = 4 x 2",
            ),
            ("y", l, "y has 6 elements; expected rows x out_features = 2 x 4"),
        ];
        for (name, shape, needle) in cases {
            let short_y = name == "y";
            let r =
                dev.data((map::to(&x), map::to(&w), map::to(&b), map::from(&mut y)), |(xv, wv, bv, yv)| {
                    let yv = if short_y { yv.slice(..6)? } else { yv };
                    linear(&dev, shape, xv, wv, Some(bv), yv, Activation::Relu)
                });
            match r {
                Err(Error::InvalidArgument { routine: "linear", what }) => {
                    check!(what.contains(needle), "{name}: {what}")
                }
                other => check!(false, "{name}: expected InvalidArgument, got {other:?}"),
            }
        }
        // A bias of the wrong length, alone.
        let r = dev.data((map::to(&x), map::to(&w), map::to(&b), map::from(&mut y)), |(xv, wv, bv, yv)| {
            linear(&dev, l, xv, wv, Some(bv.slice(..3)?), yv, Activation::Identity)
        });
        check!(
            matches!(&r, Err(Error::InvalidArgument { what, .. }) if what.contains("b has 3 elements; expected 1 x out_features = 1 x 4")),
            "{r:?}"
        );
        Ok(())
    });
}

#[test]
fn a_layer_writes_device_scratch_and_chains_into_the_next() {
    on_every_device("linear into scratch", |rt, d| {
        let dev = rt.device(d)?;
        let (l1, l2) = (
            Linear { rows: 4, in_features: 8, out_features: 6, tf32: false },
            Linear { rows: 4, in_features: 6, out_features: 2, tf32: false },
        );
        let x = values(7, 32);
        let (w1, w2) = (values(8, 48), values(9, 12));
        let hidden = HostBuffer::<f32>::new(rt, 24)?;
        hidden.enter(d, MapType::ALLOC)?;
        let mut y = vec![0f32; 8];
        dev.data((map::to(&x), map::to(&w1), map::to(&w2), map::from(&mut y)), |(xv, w1v, w2v, yv)| {
            linear(&dev, l1, xv, w1v, None, hidden.shared_view(d), Activation::Relu)?;
            linear(&dev, l2, hidden.shared_view(d), w2v, None, yv, Activation::Identity)
        })?;
        let h: Vec<f32> =
            reference(l1, &x, &w1, None, Activation::Relu).into_iter().map(|v| v as f32).collect();
        let want = reference(l2, &h, &w2, None, Activation::Identity);
        check!(y.iter().zip(&want).all(|(g, w)| (f64::from(*g) - w).abs() < 1e-4), "{y:?} vs {want:?}");
        let mut hidden = hidden;
        hidden.exit(d, MapType::RELEASE)?;
        Ok(())
    });
}

/// One layer in precision `p` (elements `T`, TF32 for `Tf32`) against the f64 reference of
/// the f32 values it was made from: every element within `p.tolerance()` of the reference,
/// relative to its size plus the output's root mean square.
fn layer_in<T: NnFloat>(
    rt: &offload::Runtime,
    d: usize,
    p: Precision,
    l: Linear,
    act: Activation,
) -> offload::Result<()> {
    let dev = rt.device(d)?;
    let (x, w, b) = (
        values(11, l.rows * l.in_features),
        values(12, l.out_features * l.in_features),
        values(13, l.out_features),
    );
    let cast = |v: &[f32]| v.iter().map(|&v| T::from_f32(v)).collect::<Vec<T>>();
    let (xt, wt, bt) = (cast(&x), cast(&w), cast(&b));
    let mut y = cast(&vec![f32::NAN; l.rows * l.out_features]);
    let l = Linear { tf32: p == Precision::Tf32, ..l };
    dev.data((map::to(&xt), map::to(&wt), map::to(&bt), map::from(&mut y)), |(xv, wv, bv, yv)| {
        linear(&dev, l, xv, wv, Some(bv), yv, act)
    })?;
    let want = reference(l, &x, &w, Some(&b), act);
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
    let worst = y
        .iter()
        .zip(&want)
        .map(|(g, w)| (f64::from(g.to_f32()) - w).abs() / (w.abs() + rms))
        .fold(0.0, f64::max);
    check!(
        worst <= p.tolerance(),
        "{p:?} {l:?} {act:?}: worst relative error {worst:.2e} over {:.0e}",
        p.tolerance()
    );
    Ok(())
}

#[test]
fn every_precision_agrees_with_the_reference_within_its_tolerance() {
    on_every_device("linear precisions", |rt, d| {
        for l in [
            Linear { rows: 33, in_features: 512, out_features: 48, tf32: false },
            Linear { rows: 8, in_features: 4096, out_features: 16, tf32: false },
        ] {
            for act in [Activation::Identity, Activation::Relu, Activation::Gelu, Activation::GeluExact] {
                layer_in::<f32>(rt, d, Precision::Fp32, l, act)?;
                layer_in::<f32>(rt, d, Precision::Tf32, l, act)?;
                layer_in::<f16>(rt, d, Precision::Fp16, l, act)?;
                layer_in::<bf16>(rt, d, Precision::Bf16, l, act)?;
            }
        }
        Ok(())
    });
}

/// Exact GELU: `linear` applies it after the product (no GEMM library fuses it), and
/// `Device::gemm`, which has no second pass, refuses it naming `linear`.
#[test]
fn exact_gelu_runs_through_linear_and_is_refused_by_the_bare_gemm() {
    on_every_device("linear exact gelu", |rt, d| {
        let dev = rt.device(d)?;
        let l = Linear { rows: 1, in_features: 1, out_features: 3, tf32: false };
        let (x, w) = ([1.0f32], [-1.0f32, 0.5, 2.0]);
        let mut y = [0.0f32; 3];
        let g = offload::Gemm { m: 3, n: 1, k: 1, lda: 3, ldb: 1, ldc: 3, ..Default::default() };
        let g = offload::Gemm { activation: Activation::GeluExact, ..g };
        let refused = dev.data((map::to(&x), map::to(&w), map::from(&mut y)), |(xv, wv, yv)| {
            let r = dev.gemm(&g, wv, xv, yv, None);
            linear(&dev, l, xv, wv, None, yv, Activation::GeluExact)?;
            Ok(r)
        })?;
        check!(
            matches!(&refused, Err(Error::InvalidArgument { routine: "gemm", what }) if what.contains("exact GELU") && what.contains("offload_kernels::linear")),
            "{refused:?}"
        );
        for (got, v) in y.iter().zip(w) {
            let want = activation_f64(Activation::GeluExact, f64::from(v));
            check!((f64::from(*got) - want).abs() < 1e-6, "gelu({v}) = {got}, expected {want}");
        }
        // Tanh and exact GELU differ (by 1.6e-4 at 1.0): the right one ran.
        check!((y[1] - Activation::Gelu.apply(0.5)).abs() > 1e-5, "{y:?}");
        Ok(())
    });
}

#[test]
fn tf32_is_refused_for_half_precision_elements() {
    on_every_device("linear tf32 of bf16", |rt, d| {
        let dev = rt.device(d)?;
        let l = Linear { rows: 2, in_features: 2, out_features: 2, tf32: true };
        let v = vec![bf16::ONE; 4];
        let mut y = vec![bf16::ZERO; 4];
        let r = dev.data((map::to(&v), map::from(&mut y)), |(v, y)| {
            linear(&dev, l, v, v, None, y, Activation::Identity)
        });
        check!(
            matches!(&r, Err(Error::InvalidArgument { routine: "gemm", what }) if what.contains("TF32 applies to f32 operands, not bf16")),
            "{r:?}"
        );
        Ok(())
    });
}

#[test]
fn an_output_that_cannot_be_written_is_refused_by_its_name() {
    on_every_device("linear read-only y", |rt, d| {
        let dev = rt.device(d)?;
        let l = Linear { rows: 2, in_features: 2, out_features: 2, tf32: false };
        let v = vec![1.0f32; 4];
        let y = vec![0.0f32; 4];
        let r = dev
            .data((map::to(&v), map::to(&y)), |(v, y)| linear(&dev, l, v, v, None, y, Activation::Identity));
        check!(
            matches!(&r, Err(Error::InvalidArgument { routine: "linear", what }) if what.starts_with("`y` is written")),
            "{r:?}"
        );
        // The same for attention's scores and output.
        let a = offload_kernels::nn::Attention {
            batch: 1,
            heads: 1,
            q_len: 2,
            kv_len: 2,
            head_dim: 2,
            causal: false,
            scale: None,
            kv_capacity: None,
        };
        let mut out = vec![0.0f32; 4];
        let r = dev.data((map::to(&v), map::to(&y), map::from(&mut out)), |(v, s, o)| {
            offload_kernels::nn::attention(&dev, a, v, v, v, s, o)
        });
        check!(
            matches!(&r, Err(Error::InvalidArgument { routine: "attention", what }) if what.starts_with("`scores` is written")),
            "{r:?}"
        );
        check!(out == [0.0; 4]);
        Ok(())
    });
}
