//! The ready kernels over [`Tensor`]s: each takes its operands' shapes from the tensors
//! (rows and columns, heads and positions, features in and out) and checks them against
//! one another before anything runs, naming the tensor that does not fit. They run
//! [`crate::nn`]'s kernels and [`crate::linear`]'s GEMM, so they compute exactly as those
//! do, in `f32`, `bf16` and `f16`.
//!
//! ```
//! use offload::half::bf16;
//! use offload::tensor::DeviceTensor;
//! use offload::{Activation, Runtime};
//! use offload_kernels::ops;
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let dev = rt.device(0)?;
//! let x = DeviceTensor::<bf16>::new(&dev, "x", &[4, 64])?;
//! let w = DeviceTensor::<bf16>::new(&dev, "fc.weight", &[128, 64])?; // nn.Linear(64, 128)
//! let h = DeviceTensor::<bf16>::new(&dev, "h", &[4, 128])?;
//! ops::linear(&dev, &x.view(), &w.view(), None, &h.view(), Activation::Gelu)?;
//! // A weight the wrong way round is refused, by name.
//! let e = ops::linear(&dev, &x.view(), &w.view().t()?, None, &h.view(), Activation::Gelu).unwrap_err();
//! assert_eq!(
//!     e.to_string(),
//!     "linear: tensor `fc.weight^T` has shape [64, 128]; expected [128, 64] \
//!      (out_features x in_features: `h`'s last dimension x `x`'s)"
//! );
//! # Ok::<(), offload::Error>(())
//! ```

use offload::tensor::{AsTensor, Tensor};
use offload::{Activation, Device, DeviceSlice, Error, Result};

use crate::layers::{linear_checked, WeightLayout};
use crate::nn::{self, Attention, NnFloat};
use crate::Linear;

/// `dims` with its last dimension replaced by `last` (dropped when `None`).
fn with_last(dims: &[usize], last: Option<usize>) -> Vec<usize> {
    let mut d = dims[..dims.len().saturating_sub(1)].to_vec();
    d.extend(last);
    d
}

/// An error unless `t` has `like`'s shape (named in the message).
fn same_dims<A, B>(routine: &'static str, t: &Tensor<'_, A>, like: &Tensor<'_, B>) -> Result<()> {
    t.expect_dims(routine, like.dims(), &format!("`{}`'s shape", like.name()))
}

/// An error unless `t` has at least one dimension (the row-wise ops work its last).
fn has_rows<T>(routine: &'static str, t: &Tensor<'_, T>) -> Result<()> {
    if t.dims().is_empty() {
        return Err(Error::Shape {
            routine,
            tensor: t.name().to_string(),
            what: "is a scalar; expected rows (at least one dimension)".into(),
        });
    }
    Ok(())
}

/// `y = act(x W^T + b)`, as `nn.Linear` then the activation: `x` is `[..., in_features]`,
/// `w` `[out_features, in_features]` (row-major as `nn.Linear` keeps it, or the
/// [`Tensor::t`] of a row-major `[in_features, out_features]`, as GPT-2's `Conv1D` keeps
/// it), `b` `[out_features]`, `y` `[..., out_features]` with `x`'s leading dimensions. One
/// GEMM ([`crate::linear`]); for TF32, call that with [`Linear::tf32`].
pub fn linear<T: NnFloat>(
    dev: &Device<'_>,
    x: &impl AsTensor<T>,
    w: &impl AsTensor<T>,
    b: Option<&dyn AsTensor<T>>,
    y: &impl AsTensor<T>,
    act: Activation,
) -> Result<()> {
    const R: &str = "linear";
    let x = &x.as_tensor();
    let w = &w.as_tensor();
    let y = &y.as_tensor();
    let b = b.map(|b| b.as_tensor());
    let b = b.as_ref();
    has_rows(R, x)?;
    has_rows(R, y)?;
    let (k, n) = (x.last(), y.last());
    w.expect_dims(
        R,
        &[n, k],
        &format!("out_features x in_features: `{}`'s last dimension x `{}`'s", y.name(), x.name()),
    )?;
    if let Some(b) = b {
        b.expect_dims(R, &[n], &format!("out_features: `{}`'s last dimension", y.name()))?;
    }
    y.expect_dims(R, &with_last(x.dims(), Some(n)), &format!("`{}`'s rows x out_features", x.name()))?;
    let (layout, wv) = if w.shape().is_contiguous() {
        (WeightLayout::OutIn, w.contiguous(R)?)
    } else if let Some(stored) = w.t().ok().filter(|t| t.shape().is_contiguous()) {
        (WeightLayout::InOut, stored.contiguous(R)?)
    } else {
        return Err(Error::Shape {
            routine: R,
            tensor: w.name().to_string(),
            what: format!(
                "is a strided view ({:?}); expected a row-major weight or its transpose",
                w.shape()
            ),
        });
    };
    let layer = Linear { rows: x.rows(), in_features: k, out_features: n, tf32: false };
    let b = b.map(|b| b.contiguous(R)).transpose()?;
    linear_checked(dev, layer, x.contiguous(R)?, (layout, wv), b, y.contiguous(R)?, act)
}

/// `y = softmax(x)` over `x`'s last dimension (`y` of `x`'s shape).
pub fn softmax<T: NnFloat>(dev: &Device<'_>, x: &impl AsTensor<T>, y: &impl AsTensor<T>) -> Result<()> {
    let x = &x.as_tensor();
    let y = &y.as_tensor();
    has_rows("softmax", x)?;
    same_dims("softmax", y, x)?;
    nn::softmax(dev, x.last(), x.contiguous("softmax")?, y.contiguous("softmax")?)
}

/// `y = log_softmax(x)` over `x`'s last dimension (`y` of `x`'s shape).
pub fn log_softmax<T: NnFloat>(dev: &Device<'_>, x: &impl AsTensor<T>, y: &impl AsTensor<T>) -> Result<()> {
    const R: &str = "log_softmax";
    let x = &x.as_tensor();
    let y = &y.as_tensor();
    has_rows(R, x)?;
    same_dims(R, y, x)?;
    nn::log_softmax(dev, x.last(), x.contiguous(R)?, y.contiguous(R)?)
}

/// Layer normalisation over `x`'s last dimension, as `nn.LayerNorm(cols, eps)`: `gamma`
/// and `beta` `[cols]`, `y` of `x`'s shape.
pub fn layer_norm<T: NnFloat>(
    dev: &Device<'_>,
    x: &impl AsTensor<T>,
    gamma: &impl AsTensor<T>,
    beta: &impl AsTensor<T>,
    eps: f32,
    y: &impl AsTensor<T>,
) -> Result<()> {
    const R: &str = "layer_norm";
    let x = &x.as_tensor();
    let gamma = &gamma.as_tensor();
    let beta = &beta.as_tensor();
    let y = &y.as_tensor();
    has_rows(R, x)?;
    let cols = x.last();
    let per_col = format!("`{}`'s last dimension", x.name());
    gamma.expect_dims(R, &[cols], &per_col)?;
    beta.expect_dims(R, &[cols], &per_col)?;
    same_dims(R, y, x)?;
    nn::layer_norm(
        dev,
        cols,
        eps,
        x.contiguous(R)?,
        gamma.contiguous(R)?,
        beta.contiguous(R)?,
        y.contiguous(R)?,
    )
}

/// RMS normalisation over `x`'s last dimension, as `nn.RMSNorm(cols, eps)`: `w` `[cols]`,
/// `y` of `x`'s shape.
pub fn rms_norm<T: NnFloat>(
    dev: &Device<'_>,
    x: &impl AsTensor<T>,
    w: &impl AsTensor<T>,
    eps: f32,
    y: &impl AsTensor<T>,
) -> Result<()> {
    const R: &str = "rms_norm";
    let x = &x.as_tensor();
    let w = &w.as_tensor();
    let y = &y.as_tensor();
    has_rows(R, x)?;
    w.expect_dims(R, &[x.last()], &format!("`{}`'s last dimension", x.name()))?;
    same_dims(R, y, x)?;
    nn::rms_norm(dev, x.last(), eps, x.contiguous(R)?, w.contiguous(R)?, y.contiguous(R)?)
}

/// The index of each row's largest element, as `x.argmax(-1)`: `out` has `x`'s shape
/// without its last dimension.
pub fn argmax<T: NnFloat>(dev: &Device<'_>, x: &impl AsTensor<T>, out: &impl AsTensor<u32>) -> Result<()> {
    const R: &str = "argmax";
    let x = &x.as_tensor();
    let out = &out.as_tensor();
    has_rows(R, x)?;
    out.expect_dims(
        R,
        &with_last(x.dims(), None),
        &format!("`{}`'s shape without its last dimension", x.name()),
    )?;
    nn::argmax(dev, x.last(), x.contiguous(R)?, out.contiguous(R)?)
}

/// Each row's `k` largest elements, as `torch.topk(x, k)` ([`nn::top_k`]): `values` and
/// `indices` have `x`'s shape with `k` last.
pub fn top_k<T: NnFloat>(
    dev: &Device<'_>,
    x: &impl AsTensor<T>,
    k: usize,
    values: &impl AsTensor<T>,
    indices: &impl AsTensor<u32>,
) -> Result<()> {
    const R: &str = "top_k";
    let x = &x.as_tensor();
    let values = &values.as_tensor();
    let indices = &indices.as_tensor();
    has_rows(R, x)?;
    let want = with_last(x.dims(), Some(k));
    let what = format!("`{}`'s shape with k = {k} last", x.name());
    values.expect_dims(R, &want, &what)?;
    indices.expect_dims(R, &want, &what)?;
    nn::top_k(dev, x.last(), k, x.contiguous(R)?, values.contiguous(R)?, indices.contiguous(R)?)
}

/// `y = gelu(x)`, exact (`nn.GELU()`), `y` of `x`'s shape.
pub fn gelu<T: NnFloat>(dev: &Device<'_>, x: &impl AsTensor<T>, y: &impl AsTensor<T>) -> Result<()> {
    let x = &x.as_tensor();
    let y = &y.as_tensor();
    same_dims("gelu", y, x)?;
    nn::gelu(dev, x.contiguous("gelu")?, y.contiguous("gelu")?)
}

/// `y = gelu(x)` by the tanh approximation (`nn.GELU(approximate="tanh")`).
pub fn gelu_tanh<T: NnFloat>(dev: &Device<'_>, x: &impl AsTensor<T>, y: &impl AsTensor<T>) -> Result<()> {
    let x = &x.as_tensor();
    let y = &y.as_tensor();
    same_dims("gelu_tanh", y, x)?;
    nn::gelu_tanh(dev, x.contiguous("gelu_tanh")?, y.contiguous("gelu_tanh")?)
}

/// `y = x * sigmoid(x)` (`nn.SiLU()`).
pub fn silu<T: NnFloat>(dev: &Device<'_>, x: &impl AsTensor<T>, y: &impl AsTensor<T>) -> Result<()> {
    let x = &x.as_tensor();
    let y = &y.as_tensor();
    same_dims("silu", y, x)?;
    nn::silu(dev, x.contiguous("silu")?, y.contiguous("silu")?)
}

/// `y = a + b` element-wise (a residual connection); all three of one shape.
pub fn add<T: NnFloat>(
    dev: &Device<'_>,
    a: &impl AsTensor<T>,
    b: &impl AsTensor<T>,
    y: &impl AsTensor<T>,
) -> Result<()> {
    let a = &a.as_tensor();
    let b = &b.as_tensor();
    let y = &y.as_tensor();
    same_dims("add", b, a)?;
    same_dims("add", y, a)?;
    nn::add(dev, a.contiguous("add")?, b.contiguous("add")?, y.contiguous("add")?)
}

/// `y += b` element-wise (a residual added to the stream); `b` of `y`'s shape.
pub fn add_in_place<T: NnFloat>(dev: &Device<'_>, y: &impl AsTensor<T>, b: &impl AsTensor<T>) -> Result<()> {
    let y = &y.as_tensor();
    let b = &b.as_tensor();
    same_dims("add", b, y)?;
    nn::add_in_place(dev, y.contiguous("add")?, b.contiguous("add")?)
}

/// `out[r] = table[ids[r]]`, as `nn.Embedding`: `table` is `[vocab, dim]`, `out`
/// `[..., dim]` with a row per id (host ids; see [`nn::embedding`]).
pub fn embedding<T: NnFloat>(
    dev: &Device<'_>,
    ids: &[u32],
    table: &impl AsTensor<T>,
    out: &impl AsTensor<T>,
) -> Result<()> {
    const R: &str = "embedding";
    let table = &table.as_tensor();
    let out = &out.as_tensor();
    if table.dims().len() != 2 {
        return Err(Error::Shape {
            routine: R,
            tensor: table.name().to_string(),
            what: format!("has shape {}; expected [vocab, dim]", table.shape()),
        });
    }
    has_rows(R, out)?;
    if out.last() != table.last() || out.rows() != ids.len() {
        return Err(Error::Shape {
            routine: R,
            tensor: out.name().to_string(),
            what: format!(
                "has shape {}; expected {} rows (one per id) of {} (`{}`'s dim)",
                out.shape(),
                ids.len(),
                table.last(),
                table.name()
            ),
        });
    }
    nn::embedding(dev, table.last(), ids, table.contiguous(R)?, out.contiguous(R)?)
}

/// `y = x` converted from f32 to `T`, rounded to nearest even; `y` of `x`'s shape.
pub fn from_f32<T: NnFloat>(dev: &Device<'_>, x: &impl AsTensor<f32>, y: &impl AsTensor<T>) -> Result<()> {
    let x = &x.as_tensor();
    let y = &y.as_tensor();
    same_dims("cast", y, x)?;
    nn::from_f32(dev, x.contiguous("cast")?, y.contiguous("cast")?)
}

/// `y = x` converted from `T` to f32 (exact); `y` of `x`'s shape.
pub fn to_f32<T: NnFloat>(dev: &Device<'_>, x: &impl AsTensor<T>, y: &impl AsTensor<f32>) -> Result<()> {
    let x = &x.as_tensor();
    let y = &y.as_tensor();
    same_dims("cast", y, x)?;
    nn::to_f32(dev, x.contiguous("cast")?, y.contiguous("cast")?)
}

/// Scaled dot-product attention, as `F.scaled_dot_product_attention(q, k, v,
/// is_causal=causal, scale=scale)` ([`nn::attention`]): `q` and `out` are `[batch, heads,
/// q_len, head_dim]`; `k` and `v` `[batch, heads, kv_len, head_dim]`, row-major or the first
/// `kv_len` positions of a KV cache of more (`cache.narrow(2, 0, kv_len)`: read in place);
/// `scores` is scratch of `[batch, heads, q_len, kv_len]`. With `causal` and `q_len <
/// kv_len` the queries are the last positions.
#[allow(clippy::too_many_arguments)]
pub fn attention<T: NnFloat>(
    dev: &Device<'_>,
    q: &impl AsTensor<T>,
    k: &impl AsTensor<T>,
    v: &impl AsTensor<T>,
    causal: bool,
    scale: Option<f32>,
    scores: &impl AsTensor<T>,
    out: &impl AsTensor<T>,
) -> Result<()> {
    const R: &str = "attention";
    let q = &q.as_tensor();
    let k = &k.as_tensor();
    let v = &v.as_tensor();
    let scores = &scores.as_tensor();
    let out = &out.as_tensor();
    let &[batch, heads, q_len, head_dim] = q.dims() else {
        return Err(Error::Shape {
            routine: R,
            tensor: q.name().to_string(),
            what: format!("has shape {}; expected [batch, heads, q_len, head_dim]", q.shape()),
        });
    };
    let kv_len = k.dims().get(2).copied().unwrap_or(0);
    let kv_dims = [batch, heads, kv_len, head_dim];
    let kv_what = format!("[batch, heads, kv_len, head_dim] with `{}`'s batch, heads and head_dim", q.name());
    k.expect_dims(R, &kv_dims, &kv_what)?;
    v.expect_dims(R, &kv_dims, &kv_what)?;
    scores.expect_dims(R, &[batch, heads, q_len, kv_len], "[batch, heads, q_len, kv_len]")?;
    same_dims(R, out, q)?;
    // Keys and values: row-major, or a cache's first positions (rows `capacity` apart).
    let capacity = |t: &Tensor<'_, T>| -> Result<usize> {
        let s = t.strides();
        let cap = s[1] / head_dim.max(1);
        let cache_like = s[3] == 1 && s[2] == head_dim && s[1] == cap * head_dim && s[0] == heads * s[1];
        if !cache_like || cap < kv_len {
            return Err(Error::Shape {
                routine: R,
                tensor: t.name().to_string(),
                what: format!(
                    "is a strided view ({:?}); expected a row-major [batch, heads, kv_len, head_dim] \
                     tensor or the first kv_len positions of a cache",
                    t.shape()
                ),
            });
        }
        Ok(cap)
    };
    let cap = capacity(k)?;
    if capacity(v)? != cap {
        return Err(Error::Shape {
            routine: R,
            tensor: v.name().to_string(),
            what: format!("has strides {:?}; expected `{}`'s, {:?}", v.strides(), k.name(), k.strides()),
        });
    }
    let whole = batch * heads * cap * head_dim;
    fn cache<'a, T>(
        t: &Tensor<'a, T>,
        whole: usize,
        kv_len: usize,
        cap: usize,
    ) -> Result<DeviceSlice<'a, T>> {
        t.storage().slice(..whole).map_err(|_| Error::Shape {
            routine: R,
            tensor: t.name().to_string(),
            what: format!("views positions past its cache's start; expected the first {kv_len} of {cap}"),
        })
    }
    let a = Attention { batch, heads, q_len, kv_len, head_dim, causal, scale, kv_capacity: Some(cap) };
    nn::attention(
        dev,
        a,
        q.contiguous(R)?,
        cache(k, whole, kv_len, cap)?,
        cache(v, whole, kv_len, cap)?,
        scores.contiguous(R)?,
        out.contiguous(R)?,
    )
}
