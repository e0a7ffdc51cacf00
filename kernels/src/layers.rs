//! Dense layers as PyTorch writes them, over the device's GEMM: `y = act(x W^T + b)` with
//! row-major `x` (`rows x in_features`), `W` (`out_features x in_features`, `nn.Linear`'s
//! layout), `b` (`out_features`) and `y` (`rows x out_features`), every shape checked by
//! name before anything runs, in any precision the device's GEMM takes (`f32`, with TF32
//! when [`Linear::tf32`] says so, `bf16`, `f16`; f32 accumulation). The GEMM is the
//! device's ([`Device::gemm`]: cuBLASLt on GPUs, with the bias and the activation fused
//! into its epilogue; `matrixmultiply` on host devices, which compute the same precisions).
//!
//! ```
//! use offload::{map, Runtime};
//! use offload_kernels::{linear, Activation, Linear};
//!
//! let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build()?;
//! let dev = rt.device(0)?;
//! let layer = Linear { rows: 2, in_features: 3, out_features: 2, tf32: false };
//! let x = [1.0f32, 2.0, 3.0, -1.0, -2.0, -3.0];
//! let w = [1.0f32, 0.0, 0.0, 0.0, 1.0, 1.0]; // out 0 = x0; out 1 = x1 + x2
//! let b = [0.5f32, 0.0];
//! let mut y = [0.0f32; 4];
//! dev.data((map::to(&x), map::to(&w), map::to(&b), map::from(&mut y)), |(x, w, b, y)| {
//!     linear(&dev, layer, x, w, Some(b), y, Activation::Relu)
//! })?;
//! assert_eq!(y, [1.5, 5.0, 0.0, 0.0]);
//! # Ok::<(), offload::Error>(())
//! ```

pub use offload::Activation;
use offload::{Device, DeviceSlice, Error, Gemm, Result};

use crate::nn::NnFloat;

/// A dense layer's shape over a batch: `rows` rows of `in_features` in, of `out_features`
/// out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Linear {
    /// Rows of the batch (`x`'s and `y`'s).
    pub rows: usize,
    /// Features in: `x`'s columns, `W`'s columns.
    pub in_features: usize,
    /// Features out: `y`'s columns, `W`'s rows, `b`'s length.
    pub out_features: usize,
    /// For `f32` tensors: multiply on TF32 tensor cores (f32 accumulation), as PyTorch's
    /// `allow_tf32`; an error for other element types, which have their own precision.
    pub tf32: bool,
}

impl Linear {
    /// An error unless `view`, operand `name`, holds `rows x cols` elements exactly.
    fn check(&self, name: &str, len: usize, (rows, cols): (usize, usize), what: &str) -> Result<()> {
        match rows.checked_mul(cols) {
            Some(n) if n == len => Ok(()),
            _ => Err(Error::InvalidArgument {
                routine: "linear",
                what: format!("{name} has {len} elements; expected {what} = {rows} x {cols} for {:?}", self),
            }),
        }
    }
}

/// `y = act(x W^T + b)` on `dev` (see the module documentation); `b` may be left out.
/// `y` must be writable by kernels (a `from`/`tofrom` map's view, or device scratch). One
/// GEMM, its epilogue adding the bias and applying the activation; exact GELU
/// ([`Activation::GeluExact`], `nn.GELU()`'s default), which no GEMM library fuses, in a
/// second pass over `y` ([`crate::nn::gelu_in_place`]), rounded once more in `T`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the operand whose length is not its shape's; the
/// GEMM's errors otherwise.
#[track_caller]
pub fn linear<T: NnFloat>(
    dev: &Device<'_>,
    layer: Linear,
    x: DeviceSlice<'_, T>,
    w: DeviceSlice<'_, T>,
    b: Option<DeviceSlice<'_, T>>,
    y: DeviceSlice<'_, T>,
    act: Activation,
) -> Result<()> {
    let Linear { rows, in_features: k, out_features: n, .. } = layer;
    layer.check("x", x.len(), (rows, k), "rows x in_features")?;
    layer.check("w", w.len(), (n, k), "out_features x in_features")?;
    if let Some(b) = b {
        layer.check("b", b.len(), (1, n), "1 x out_features")?;
    }
    layer.check("y", y.len(), (rows, n), "rows x out_features")?;
    linear_checked(dev, layer, x, (WeightLayout::OutIn, w), b, y, act)
}

/// How a dense layer's weight lies in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WeightLayout {
    /// Row-major `out_features x in_features` (`nn.Linear`'s).
    OutIn,
    /// Row-major `in_features x out_features` (GPT-2's `Conv1D`, a `.t()` of the former).
    InOut,
}

/// [`linear`] once every operand's length is checked, with `w` laid out as `layout` says.
pub(crate) fn linear_checked<T: NnFloat>(
    dev: &Device<'_>,
    layer: Linear,
    x: DeviceSlice<'_, T>,
    (layout, w): (WeightLayout, DeviceSlice<'_, T>),
    b: Option<DeviceSlice<'_, T>>,
    y: DeviceSlice<'_, T>,
    act: Activation,
) -> Result<()> {
    let Linear { rows, in_features: k, out_features: n, tf32 } = layer;
    crate::check_writable("linear", "y", &y)?;
    if rows == 0 || n == 0 {
        return Ok(());
    }
    // Row-major Y (rows x n) is column-major Y^T (n x rows) = W (row-major n x k, so
    // column-major k x n, transposed; or row-major k x n, column-major n x k as it is)
    // times X^T (column-major k x rows); the bias is one per row of Y^T.
    let (transa, lda) = match layout {
        WeightLayout::OutIn => (true, k.max(1)),
        WeightLayout::InOut => (false, n),
    };
    let g = Gemm {
        transa,
        m: n,
        n: rows,
        k,
        lda,
        ldb: k.max(1),
        ldc: n,
        tf32,
        activation: if act == Activation::GeluExact { Activation::Identity } else { act },
        ..Gemm::default()
    };
    dev.gemm(&g, w, x, y, b)?;
    if act == Activation::GeluExact {
        crate::nn::gelu_in_place(dev, y)?;
    }
    Ok(())
}
