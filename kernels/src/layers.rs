//! Dense layers as PyTorch writes them, over the device's GEMM: `y = act(x W^T + b)` with
//! row-major `x` (`rows x in_features`), `W` (`out_features x in_features`, `nn.Linear`'s
//! layout), `b` (`out_features`) and `y` (`rows x out_features`), every shape checked by
//! name before anything runs. The GEMM is the device's (`Device::sgemm`: cuBLAS on GPUs,
//! `matrixmultiply` on host devices); the bias and the activation one generated kernel
//! after it.
//!
//! ```
//! use offload::{map, Runtime};
//! use offload_kernels::{linear, Activation, Linear};
//!
//! let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build()?;
//! let dev = rt.device(0)?;
//! let layer = Linear { rows: 2, in_features: 3, out_features: 2 };
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

use offload::{Device, DeviceSlice, Error, Result, Sgemm};

use crate::generated;

/// The activation after a dense layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// None: `y = x W^T + b`.
    Identity,
    /// `max(., 0)`.
    Relu,
}

/// A dense layer's shape over a batch: `rows` rows of `in_features` in, of `out_features`
/// out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Linear {
    /// Rows of the batch (`x`'s and `y`'s).
    pub rows: usize,
    /// Features in: `x`'s columns, `W`'s columns.
    pub in_features: usize,
    /// Features out: `y`'s columns, `W`'s rows, `b`'s length.
    pub out_features: usize,
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
/// `y` must be writable by kernels (a `from`/`tofrom` map's view, or device scratch).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the operand whose length is not its shape's; the
/// GEMM's and the kernel's errors otherwise.
#[track_caller]
pub fn linear(
    dev: &Device<'_>,
    layer: Linear,
    x: DeviceSlice<'_, f32>,
    w: DeviceSlice<'_, f32>,
    b: Option<DeviceSlice<'_, f32>>,
    y: DeviceSlice<'_, f32>,
    act: Activation,
) -> Result<()> {
    let Linear { rows, in_features: k, out_features: n } = layer;
    layer.check("x", x.len(), (rows, k), "rows x in_features")?;
    layer.check("w", w.len(), (n, k), "out_features x in_features")?;
    if let Some(b) = b {
        layer.check("b", b.len(), (1, n), "1 x out_features")?;
    }
    layer.check("y", y.len(), (rows, n), "rows x out_features")?;
    if rows == 0 || n == 0 {
        return Ok(());
    }
    // Row-major Y (rows x n) is column-major Y^T (n x rows) = W (row-major n x k, so
    // column-major k x n, transposed) times X^T (column-major k x rows).
    let g = Sgemm {
        transa: true,
        transb: false,
        m: n,
        n: rows,
        k,
        alpha: 1.0,
        lda: k.max(1),
        ldb: k.max(1),
        beta: 0.0,
        ldc: n,
    };
    dev.sgemm(&g, w, x, y)?;
    match (b, act) {
        (Some(b), act) => generated::bias_act::launch(dev, y.len(), n, act == Activation::Relu, y, b),
        (None, Activation::Relu) => generated::relu::launch(dev, y.len(), y),
        (None, Activation::Identity) => Ok(()),
    }
}
