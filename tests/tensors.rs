//! `offload::tensor` and `offload_kernels::ops` on every device of every backend: shapes,
//! views (transpose, narrow, reshape), the loader's tensors, and each op over tensors
//! giving exactly what the flat-slice kernel gives, with shape errors that name the
//! tensor at fault.

use offload::half::bf16;
use offload::tensor::{DeviceTensor, HostTensor, Shape, Tensor};
use offload::weights::{serialize, Weights};
use offload::{map, Activation, DeviceBuffer, Error};
use offload_kernels::{nn, ops};
use offload_tests::{check, check_eq, on_every_device};

/// Deterministic values in [-1, 1).
fn values(seed: u32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(0x85EB_CA6B).rotate_left(13);
            (h >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// The message of a shape error, which must come from `routine` and name `tensor`.
fn shape_error(r: offload::Result<()>, routine: &str, tensor: &str) -> offload::Result<String> {
    match r {
        Err(e @ Error::Shape { .. }) => {
            let msg = e.to_string();
            check!(msg.starts_with(&format!("{routine}: tensor `{tensor}` ")), "{msg}");
            Ok(msg)
        }
        other => Err(Error::InvalidArgument {
            routine: "check",
            what: format!("expected a shape error, got {other:?}"),
        }),
    }
}

#[test]
fn shapes_strides_and_views() {
    let s = Shape::new(&[2, 3, 4]).unwrap();
    assert_eq!((s.strides(), s.numel(), s.rows(), s.last(), s.span()), (&[12, 4, 1][..], 24, 6, 4, 24));
    assert!(s.is_contiguous());
    assert_eq!(Shape::new(&[]).unwrap().numel(), 1);
    assert_eq!(Shape::new(&[3, 0]).unwrap().span(), 0);
    assert!(matches!(Shape::new(&[usize::MAX, 3]), Err(Error::Overflow { .. })));
    assert_eq!(format!("{s}"), "[2, 3, 4]");

    on_every_device("tensor views", |rt, d| {
        let dev = rt.device(d)?;
        let buf = DeviceBuffer::from_slice(&dev, &(0..24).map(|i| i as f32).collect::<Vec<_>>())?;
        let x = Tensor::new("x", buf.view(), &[2, 3, 4])?;
        let t = x.t()?;
        check_eq!(t.dims(), &[2, 4, 3][..]);
        check_eq!(t.strides(), &[12, 1, 4][..]);
        check!(!t.shape().is_contiguous());
        check_eq!(t.name(), "x^T");
        shape_error(t.contiguous("softmax").map(drop), "softmax", "x^T")?;
        shape_error(t.reshape(&[24]).map(drop), "Tensor::reshape", "x^T")?;
        shape_error(x.reshape(&[5, 5]).map(drop), "Tensor::reshape", "x")?;
        check_eq!(x.reshape(&[6, 4])?.dims().to_vec(), [6, 4]);
        // Narrowing the middle dimension keeps the strides: a strided view.
        let n = x.narrow(1, 1, 2)?;
        check_eq!((n.dims(), n.strides()), (&[2, 2, 4][..], &[12, 4, 1][..]));
        check!(!n.shape().is_contiguous());
        check_eq!(n.storage().len(), 20);
        check_eq!(n.shape().span(), 20); // to the last element reached: 12 + 4 + 3 + 1
        shape_error(x.narrow(1, 2, 2).map(drop), "Tensor::narrow", "x")?;
        shape_error(x.narrow(3, 0, 1).map(drop), "Tensor::narrow", "x")?;
        shape_error(x.narrow(0, usize::MAX, 2).map(drop), "Tensor::narrow", "x")?;
        // Rows of the outer dimension stay row-major, and read the right elements.
        let r = x.rows_range(1..2)?;
        check!(r.shape().is_contiguous());
        let mut got = vec![0f32; 12];
        dev.data(map::from(&mut got), |g| ops::add(&dev, &r, &r, &Tensor::new("g", g, &[1, 3, 4])?))?;
        check_eq!(got, (12..24).map(|i| 2.0 * i as f32).collect::<Vec<_>>());
        shape_error(Tensor::new("y", buf.view(), &[5, 5]).map(drop), "Tensor::new", "y")?;
        let scalar = Tensor::new("s", buf.view().slice(..1)?, &[])?;
        shape_error(scalar.t().map(drop), "Tensor::t", "s")?;
        Ok(())
    });
}

#[test]
fn host_and_device_tensors_keep_their_name_and_shape() {
    let e = HostTensor::new("w", &[2, 2], vec![1.0f32; 3]).unwrap_err();
    assert_eq!(e.to_string(), "HostTensor::new: tensor `w` of shape [2, 2] needs 4 elements; 3 were given");
    on_every_device("host and device tensors", |rt, d| {
        let dev = rt.device(d)?;
        let h = HostTensor::new("w", &[2, 3], values(1, 6))?;
        let on = DeviceTensor::from_host(&dev, &h)?;
        check_eq!((on.name(), on.dims()), ("w", &[2, 3][..]));
        let back = on.to_host()?;
        check!(back == h, "{back:?} != {h:?}");
        let buf = DeviceBuffer::<f32>::new(&dev, 5)?;
        let e = DeviceTensor::from_buffer("b", buf, &[2, 3]).unwrap_err();
        check!(
            e.to_string().contains("tensor `b` of shape [2, 3] needs 6 elements; its buffer holds 5"),
            "{e}"
        );
        Ok(())
    });
}

#[test]
fn the_loader_gives_named_tensors_of_the_declared_shape() {
    let dir = std::env::temp_dir().join(format!("offload-tensors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.safetensors");
    let w = values(2, 6);
    std::fs::write(&path, serialize(&[("fc.weight", &[3, 2], &w[..])]).unwrap()).unwrap();
    let file = Weights::open(&path).unwrap();
    let t = file.tensor::<bf16>("fc.weight", &[3, 2]).unwrap();
    assert_eq!((t.name(), t.dims()), ("fc.weight", &[3, 2][..]));
    assert_eq!(t.data()[1], bf16::from_f32(w[1]));
    let e = file.tensor::<f32>("fc.weight", &[2, 3]).unwrap_err();
    assert!(e.to_string().contains("tensor `fc.weight` has shape [3, 2]; the model declares [2, 3]"), "{e}");
    let e = file.tensor::<f32>("fc.bias", &[3]).unwrap_err();
    assert!(e.to_string().contains("tensor `fc.bias` is missing"), "{e}");
    on_every_device("loader tensors", |rt, d| {
        let on = file.device_tensor::<f32>(&rt.device(d)?, "fc.weight", &[3, 2])?;
        check_eq!(on.to_host()?.into_vec(), w);
        Ok(())
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `linear` over tensors equals the slice form, with the weight row-major `[out, in]` or
/// the transpose of a row-major `[in, out]`; its shape errors name the tensor.
#[test]
fn linear_takes_either_weight_layout_and_names_misfits() {
    on_every_device("ops::linear", |rt, d| {
        let dev = rt.device(d)?;
        let (rows, k, n) = (5, 7, 3);
        let x = values(3, rows * k);
        let w = values(4, n * k); // [n, k]
        let w_in_out: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect(); // [k, n]
        let b = values(5, n);
        let bufs = (
            DeviceBuffer::from_slice(&dev, &x)?,
            DeviceBuffer::from_slice(&dev, &w)?,
            DeviceBuffer::from_slice(&dev, &w_in_out)?,
            DeviceBuffer::from_slice(&dev, &b)?,
        );
        let xt = Tensor::new("x", bufs.0.view(), &[rows, k])?;
        let wt = Tensor::new("fc.weight", bufs.1.view(), &[n, k])?;
        let conv = Tensor::new("c_fc.weight", bufs.2.view(), &[k, n])?;
        let bt = Tensor::new("fc.bias", bufs.3.view(), &[n])?;
        let want = DeviceBuffer::<f32>::new(&dev, rows * n)?;
        offload_kernels::linear(
            &dev,
            offload_kernels::Linear { rows, in_features: k, out_features: n, tf32: false },
            bufs.0.view(),
            bufs.1.view(),
            Some(bufs.3.view()),
            want.view(),
            Activation::Gelu,
        )?;
        let y = DeviceTensor::<f32>::new(&dev, "y", &[rows, n])?;
        ops::linear(&dev, &xt, &wt, Some(&bt), &y.view(), Activation::Gelu)?;
        check_eq!(y.to_host()?.into_vec(), want.to_vec()?);
        let y2 = DeviceTensor::<f32>::new(&dev, "y2", &[rows, n])?;
        ops::linear(&dev, &xt, &conv.t()?, Some(&bt), &y2.view(), Activation::Gelu)?;
        let (got, want) = (y2.to_host()?.into_vec(), want.to_vec()?);
        for (g, w) in got.iter().zip(&want) {
            check!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{got:?} != {want:?}");
        }
        // Leading dimensions are rows: [1, rows, k] in, [1, rows, n] out.
        let y3 = DeviceTensor::<f32>::new(&dev, "y3", &[1, rows, n])?;
        ops::linear(&dev, &xt.reshape(&[1, rows, k])?, &wt, Some(&bt), &y3.view(), Activation::Gelu)?;
        check_eq!(y3.to_host()?.into_vec(), want);
        // Misfits, each by name.
        let m = shape_error(
            ops::linear(&dev, &xt, &conv, None, &y.view(), Activation::Identity),
            "linear",
            "c_fc.weight",
        )?;
        check!(m.contains("has shape [7, 3]; expected [3, 7]"), "{m}");
        shape_error(
            ops::linear(&dev, &xt, &wt, Some(&wt), &y.view(), Activation::Identity),
            "linear",
            "fc.weight",
        )?;
        let short = y.view().reshape(&[n, rows])?.named("y_short");
        shape_error(ops::linear(&dev, &xt, &wt, None, &short, Activation::Identity), "linear", "fc.weight")?;
        let y4 = DeviceTensor::<f32>::new(&dev, "y4", &[rows + 1, n])?;
        shape_error(ops::linear(&dev, &xt, &wt, None, &y4.view(), Activation::Identity), "linear", "y4")?;
        Ok(())
    });
}

/// Every row-wise and element-wise op over tensors gives the flat kernel's result bit
/// for bit (in bf16), and refuses an output of another shape by its name.
#[test]
fn ops_equal_the_flat_kernels_and_name_misfits() {
    on_every_device("ops against nn", |rt, d| {
        let dev = rt.device(d)?;
        let (rows, cols) = (6, 10);
        let to16 = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
        let x = DeviceBuffer::from_slice(&dev, &to16(values(6, rows * cols)))?;
        let g = DeviceBuffer::from_slice(&dev, &to16(values(7, cols)))?;
        let beta = DeviceBuffer::from_slice(&dev, &to16(values(8, cols)))?;
        let xt = Tensor::new("x", x.view(), &[2, 3, cols])?;
        let gt = Tensor::new("ln.weight", g.view(), &[cols])?;
        let bt = Tensor::new("ln.bias", beta.view(), &[cols])?;
        let flat = DeviceBuffer::<bf16>::new(&dev, rows * cols)?;
        let shaped = DeviceTensor::<bf16>::new(&dev, "y", &[2, 3, cols])?;
        let same = |what: &str| -> offload::Result<()> {
            let (a, b) = (flat.to_vec()?, shaped.to_host()?.into_vec());
            check!(a == b, "{what}: {a:?} != {b:?}");
            Ok(())
        };
        let y = shaped.view();
        nn::softmax(&dev, cols, x.view(), flat.view())?;
        ops::softmax(&dev, &xt, &y)?;
        same("softmax")?;
        nn::log_softmax(&dev, cols, x.view(), flat.view())?;
        ops::log_softmax(&dev, &xt, &y)?;
        same("log_softmax")?;
        nn::layer_norm(&dev, cols, 1e-5, x.view(), g.view(), beta.view(), flat.view())?;
        ops::layer_norm(&dev, &xt, &gt, &bt, 1e-5, &y)?;
        same("layer_norm")?;
        nn::rms_norm(&dev, cols, 1e-6, x.view(), g.view(), flat.view())?;
        ops::rms_norm(&dev, &xt, &gt, 1e-6, &y)?;
        same("rms_norm")?;
        nn::gelu(&dev, x.view(), flat.view())?;
        ops::gelu(&dev, &xt, &y)?;
        same("gelu")?;
        nn::gelu_tanh(&dev, x.view(), flat.view())?;
        ops::gelu_tanh(&dev, &xt, &y)?;
        same("gelu_tanh")?;
        nn::silu(&dev, x.view(), flat.view())?;
        ops::silu(&dev, &xt, &y)?;
        same("silu")?;
        nn::add(&dev, x.view(), x.view(), flat.view())?;
        ops::add(&dev, &xt, &xt, &y)?;
        same("add")?;
        nn::add_in_place(&dev, flat.view(), x.view())?;
        ops::add_in_place(&dev, &y, &xt)?;
        same("add_in_place")?;
        let ids = [3u32, 0, 1];
        let table = Tensor::new("wte", x.view(), &[rows, cols])?;
        nn::embedding(&dev, cols, &ids, x.view(), flat.view().slice(..3 * cols)?)?;
        ops::embedding(
            &dev,
            &ids,
            &table,
            &y.reshape(&[rows * cols])?.narrow(0, 0, 3 * cols)?.reshape(&[3, cols])?,
        )?;
        same("embedding")?;
        let (am_flat, am) =
            (DeviceBuffer::<u32>::new(&dev, rows)?, DeviceTensor::<u32>::new(&dev, "classes", &[2, 3])?);
        nn::argmax(&dev, cols, x.view(), am_flat.view())?;
        ops::argmax(&dev, &xt, &am.view())?;
        check_eq!(am_flat.to_vec()?, am.to_host()?.into_vec());
        let (v, i) = (
            DeviceTensor::<bf16>::new(&dev, "v", &[2, 3, 4])?,
            DeviceTensor::<u32>::new(&dev, "i", &[2, 3, 4])?,
        );
        let (vf, iflat) =
            (DeviceBuffer::<bf16>::new(&dev, rows * 4)?, DeviceBuffer::<u32>::new(&dev, rows * 4)?);
        nn::top_k(&dev, cols, 4, x.view(), vf.view(), iflat.view())?;
        ops::top_k(&dev, &xt, 4, &v.view(), &i.view())?;
        check_eq!((vf.to_vec()?, iflat.to_vec()?), (v.to_host()?.into_vec(), i.to_host()?.into_vec()));
        let wide = DeviceTensor::<f32>::new(&dev, "wide", &[2, 3, cols])?;
        ops::to_f32(&dev, &xt, &wide.view())?;
        ops::from_f32(&dev, &wide.view(), &y)?;
        check_eq!(shaped.to_host()?.into_vec(), x.to_vec()?);

        // Misfits by name: outputs of another shape, per-column weights of another length,
        // an input transposed where rows are wanted, a scalar.
        let other = DeviceTensor::<bf16>::new(&dev, "probs", &[2, 3, cols - 1])?;
        let m = shape_error(ops::softmax(&dev, &xt, &other.view()), "softmax", "probs")?;
        check!(m.contains("has shape [2, 3, 9]; expected [2, 3, 10] (`x`'s shape)"), "{m}");
        shape_error(
            ops::layer_norm(&dev, &xt, &gt.narrow(0, 0, 9)?, &bt, 1e-5, &y),
            "layer_norm",
            "ln.weight",
        )?;
        shape_error(ops::argmax(&dev, &xt, &am.view().reshape(&[6])?), "argmax", "classes")?;
        shape_error(ops::top_k(&dev, &xt, 3, &v.view(), &i.view()), "top_k", "v")?;
        shape_error(
            ops::softmax(&dev, &xt.reshape(&[6, cols])?.t()?, &y.reshape(&[cols, 6])?),
            "softmax",
            "x^T",
        )?;
        shape_error(ops::embedding(&dev, &ids, &table, &y), "embedding", "y")?;
        let scalar = Tensor::new("s", x.view().slice(..1)?, &[])?;
        shape_error(ops::softmax(&dev, &scalar, &scalar), "softmax", "s")?;
        Ok(())
    });
}

/// Attention over tensors: keys and values read in place as the first positions of a
/// cache (`narrow`) give what a row-major copy of those positions gives.
#[test]
fn attention_reads_a_narrowed_cache_in_place() {
    on_every_device("ops::attention", |rt, d| {
        let dev = rt.device(d)?;
        let (b, h, cap, dim, kv_len, q_len) = (2, 2, 8, 4, 5, 2);
        let kc = values(9, b * h * cap * dim);
        let vc = values(10, b * h * cap * dim);
        // The first kv_len positions of each head, row-major.
        let first = |c: &[f32]| -> Vec<f32> {
            (0..b * h).flat_map(|bh| c[bh * cap * dim..bh * cap * dim + kv_len * dim].to_vec()).collect()
        };
        let q = DeviceBuffer::from_slice(&dev, &values(11, b * h * q_len * dim))?;
        let (kb, vb) = (DeviceBuffer::from_slice(&dev, &kc)?, DeviceBuffer::from_slice(&dev, &vc)?);
        let (kr, vr) =
            (DeviceBuffer::from_slice(&dev, &first(&kc))?, DeviceBuffer::from_slice(&dev, &first(&vc))?);
        let qt = Tensor::new("q", q.view(), &[b, h, q_len, dim])?;
        let k_cache = Tensor::new("k_cache", kb.view(), &[b, h, cap, dim])?.narrow(2, 0, kv_len)?;
        let v_cache = Tensor::new("v_cache", vb.view(), &[b, h, cap, dim])?.narrow(2, 0, kv_len)?;
        let (k, v) = (
            Tensor::new("k", kr.view(), &[b, h, kv_len, dim])?,
            Tensor::new("v", vr.view(), &[b, h, kv_len, dim])?,
        );
        let scores = DeviceTensor::<f32>::new(&dev, "scores", &[b, h, q_len, kv_len])?;
        let (o1, o2) = (
            DeviceTensor::<f32>::new(&dev, "o1", &[b, h, q_len, dim])?,
            DeviceTensor::<f32>::new(&dev, "o2", &[b, h, q_len, dim])?,
        );
        ops::attention(&dev, &qt, &k_cache, &v_cache, true, None, &scores.view(), &o1.view())?;
        ops::attention(&dev, &qt, &k, &v, true, None, &scores.view(), &o2.view())?;
        // Equal up to f32 rounding: a GPU's GEMM library may pick another algorithm (and
        // summation order) for the cache's strides than for the packed copy.
        let (cached, packed) = (o1.to_host()?.into_vec(), o2.to_host()?.into_vec());
        let close = cached.iter().zip(&packed).all(|(x, y)| (x - y).abs() <= 1e-6 * (1.0 + y.abs()));
        check!(close, "{cached:?} != {packed:?}");
        // Misfits by name.
        let m = shape_error(
            ops::attention(&dev, &qt, &k_cache, &v, true, None, &scores.view(), &o1.view()),
            "attention",
            "v",
        )?;
        check!(m.contains("expected `k_cache`'s"), "{m}");
        shape_error(
            ops::attention(&dev, &qt, &k.t()?, &v, true, None, &scores.view(), &o1.view()),
            "attention",
            "k^T",
        )?;
        let late = Tensor::new("late", kb.view(), &[b, h, cap, dim])?.narrow(2, 1, kv_len)?;
        shape_error(
            ops::attention(&dev, &qt, &late, &late, true, None, &scores.view(), &o1.view()),
            "attention",
            "late",
        )?;
        shape_error(
            ops::attention(
                &dev,
                &qt.reshape(&[b * h, q_len, dim])?,
                &k,
                &v,
                true,
                None,
                &scores.view(),
                &o1.view(),
            ),
            "attention",
            "q",
        )?;
        shape_error(
            ops::attention(&dev, &qt, &k, &v, true, None, &o1.view(), &o1.view()),
            "attention",
            "o1",
        )?;
        Ok(())
    });
}
