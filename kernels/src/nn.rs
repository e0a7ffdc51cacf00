//! Inference building blocks, written once with `#[offload::kernel]` for every element type
//! of [`NnFloat`] (`f32`, [`bf16`], [`f16`](struct@f16)): row-wise softmax and log-softmax, layer norm
//! and RMS norm, argmax, exact and tanh GELU, SiLU, the residual add, casts, the
//! [`embedding`] gather and [`attention`] (the device's GEMMs around a masked softmax). Each
//! computes in f32 and rounds once to the element type when it stores, as PyTorch's CUDA
//! kernels for 16-bit tensors do; the row-wise ones are teams kernels (a team per row of
//! the whole warps that cover it, at most [`ROW_TEAM`] threads, the row's maximum and sums
//! reduced across the team).
//!
//! Tensors are row-major views with the row length given (`cols`); every launcher checks
//! that each view holds whole rows of the same count before anything runs, and says which
//! argument does not.
//!
//! ```
//! use offload::half::bf16;
//! use offload::{map, Runtime};
//! use offload_kernels::nn;
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let dev = rt.device(0)?;
//! let x: Vec<bf16> = [1.0f32, 2.0, 3.0, 0.0, 0.0, 0.0].iter().map(|&v| bf16::from_f32(v)).collect();
//! let mut p = vec![bf16::ZERO; 6];
//! dev.data((map::to(&x), map::from(&mut p)), |(x, p)| nn::softmax(&dev, 3, x, p))?;
//! assert_eq!(p[0], bf16::from_f32(0.09003057)); // e^1 / (e^1 + e^2 + e^3), rounded once
//! assert_eq!(p[4], bf16::from_f32(1.0 / 3.0));
//! # Ok::<(), offload::Error>(())
//! ```

use offload::half::{bf16, f16};
use offload::{Device, DeviceCopy, DeviceSlice, Error, Gemm, GemmElement, Kernel, Result};

/// Threads of the team that works one row of a row-wise kernel, at most: a row of fewer
/// columns gets the whole warps that cover it.
pub const ROW_TEAM: usize = 256;

/// The team for rows of `cols` elements: the whole warps covering a row, at most
/// [`ROW_TEAM`] (a team thread per element of a short row, not 256 of which most idle:
/// host devices run a team's threads as loops, so idle ones cost there too).
fn row_team(cols: usize) -> usize {
    (cols.div_ceil(32) * 32).clamp(32, ROW_TEAM)
}

/// GELU with the exact normal CDF (`nn.GELU()`).
const GELU: u32 = 0;
/// GELU's tanh approximation (`nn.GELU(approximate="tanh")`).
const GELU_TANH: u32 = 1;
/// `x * sigmoid(x)` (`nn.SiLU()`).
const SILU: u32 = 2;

/// Activation `act` ([`GELU`], [`GELU_TANH`], [`SILU`]) of `v`, in f32.
#[offload::device]
fn activation(act: u32, v: f32) -> f32 {
    if act == 0u32 {
        return 0.5f32 * v * (1.0f32 + offload::erf(v * std::f32::consts::FRAC_1_SQRT_2));
    }
    if act == 1u32 {
        return 0.5f32 * v * (1.0f32 + (0.7978846f32 * (v + 0.044715f32 * v * v * v)).tanh());
    }
    v / (1.0f32 + (-v).exp())
}

/// The kernels of one element type: `$t`, what loads it as f32 (`to`, tokens after an
/// element) and what stores an f32 as it (`from`, a function path, or nothing for f32).
macro_rules! nn_kernels {
    ($t:ty, to = [$($to:tt)*], from = [$($from:tt)*], $module:ident) => {
        /// The kernels of one element type (see the module's documentation).
        pub mod $module {
            #[allow(unused_imports)]
            use offload::half::{bf16, f16};

            /// `y = softmax(x)` over each row of `cols`, or `log_softmax(x)` when `log`.
            #[offload::kernel(teams = ..=256)]
            pub fn softmax(row: usize, thread: usize, cols: usize, log: bool, x: &[$t], y: &mut [$t]) {
                let base = row * cols;
                let mut m = f32::NEG_INFINITY;
                let mut k = thread;
                while k < cols {
                    m = m.max(x[base + k]$($to)*);
                    k += offload::team_size();
                }
                let most = offload::team_max(m);
                let mut s = 0.0f32;
                let mut k = thread;
                while k < cols {
                    s += (x[base + k]$($to)* - most).exp();
                    k += offload::team_size();
                }
                let total = offload::team_sum(s);
                let shift = most + total.ln();
                let mut k = thread;
                while k < cols {
                    let v = x[base + k]$($to)*;
                    y[base + k] = $($from)*(if log { v - shift } else { (v - most).exp() / total });
                    k += offload::team_size();
                }
            }

            /// Each row of `cols` attention scores in `s` made probabilities in place:
            /// with `causal`, row `r` (query `r % q_len`, the queries being the last
            /// `q_len` of `cols` positions) keeps the keys up to its own position and
            /// gives the rest 0.
            #[offload::kernel(teams = ..=256)]
            pub fn masked_softmax(row: usize, thread: usize, cols: usize, q_len: usize, causal: bool, s: &mut [$t]) {
                let base = row * cols;
                let keep = if causal { cols - q_len + row % q_len + 1 } else { cols };
                // Every walk is over the whole row (`k < cols`), the masked keys skipped
                // inside it: then each team touches only its own row, which host devices
                // see and run without atomics. Each score is loaded and each sum updated
                // whether masked or not, the mask only selecting, so host devices' loops
                // vectorise.
                let mut m = f32::NEG_INFINITY;
                let mut k = thread;
                while k < cols {
                    let v = s[base + k]$($to)*;
                    m = m.max(if k < keep { v } else { f32::NEG_INFINITY });
                    k += offload::team_size();
                }
                let most = offload::team_max(m);
                let mut t = 0.0f32;
                let mut k = thread;
                while k < cols {
                    let e = (s[base + k]$($to)* - most).exp();
                    t += if k < keep { e } else { 0.0f32 };
                    k += offload::team_size();
                }
                let total = offload::team_sum(t);
                let mut k = thread;
                while k < cols {
                    let e = (s[base + k]$($to)* - most).exp() / total;
                    s[base + k] = $($from)*(if k < keep { e } else { 0.0f32 });
                    k += offload::team_size();
                }
            }

            /// `y = (x - mean) / sqrt(var + eps) * gamma + beta` over each row of `cols`
            /// (the biased variance, as `nn.LayerNorm`).
            #[offload::kernel(teams = ..=256)]
            #[allow(clippy::too_many_arguments)]
            pub fn layer_norm(
                row: usize,
                thread: usize,
                cols: usize,
                eps: f32,
                x: &[$t],
                gamma: &[$t],
                beta: &[$t],
                y: &mut [$t],
            ) {
                let base = row * cols;
                let mut s = 0.0f32;
                let mut k = thread;
                while k < cols {
                    s += x[base + k]$($to)*;
                    k += offload::team_size();
                }
                let total = offload::team_sum(s);
                let mean = total / cols as f32;
                let mut q = 0.0f32;
                let mut k = thread;
                while k < cols {
                    let d = x[base + k]$($to)* - mean;
                    q += d * d;
                    k += offload::team_size();
                }
                let squares = offload::team_sum(q);
                let rstd = 1.0f32 / (squares / cols as f32 + eps).sqrt();
                let mut k = thread;
                while k < cols {
                    let v = (x[base + k]$($to)* - mean) * rstd;
                    y[base + k] = $($from)*(v * gamma[k]$($to)* + beta[k]$($to)*);
                    k += offload::team_size();
                }
            }

            /// `y = x / sqrt(mean(x^2) + eps) * w` over each row of `cols`.
            #[offload::kernel(teams = ..=256)]
            pub fn rms_norm(row: usize, thread: usize, cols: usize, eps: f32, x: &[$t], w: &[$t], y: &mut [$t]) {
                let base = row * cols;
                let mut q = 0.0f32;
                let mut k = thread;
                while k < cols {
                    let v = x[base + k]$($to)*;
                    q += v * v;
                    k += offload::team_size();
                }
                let squares = offload::team_sum(q);
                let rstd = 1.0f32 / (squares / cols as f32 + eps).sqrt();
                let mut k = thread;
                while k < cols {
                    y[base + k] = $($from)*(x[base + k]$($to)* * rstd * w[k]$($to)*);
                    k += offload::team_size();
                }
            }

            /// `out[row]` = the index of the row's largest element (the first of equals,
            /// as `torch.argmax`; NaNs are passed over).
            #[offload::kernel(teams = 256)]
            pub fn argmax(row: usize, thread: usize, cols: usize, x: &[$t], out: &mut [u32]) {
                let base = row * cols;
                let mut m = f32::NEG_INFINITY;
                let mut k = thread;
                while k < cols {
                    m = m.max(x[base + k]$($to)*);
                    k += offload::team_size();
                }
                let most = offload::team_max(m);
                let mut first = u32::MAX;
                let mut k = thread;
                while k < cols {
                    if x[base + k]$($to)* == most && (k as u32) < first {
                        first = k as u32;
                    }
                    k += offload::team_size();
                }
                let at = offload::team_min(first);
                if thread == 0 {
                    out[row] = if at == u32::MAX { 0u32 } else { at };
                }
            }

            /// Each row's `k` largest elements in decreasing order, equals by increasing
            /// index (NaNs passed over; a row of fewer numbers than `k` ends with index
            /// `u32::MAX` and value negative infinity): `values` and `indices` `[rows, k]`.
            #[offload::kernel(teams = 256)]
            pub fn top_k(row: usize, thread: usize, cols: usize, k: usize, x: &[$t], values: &mut [$t], indices: &mut [u32]) {
                let base = row * cols;
                // The pick before: every candidate comes after it (smaller, or equal and
                // further on).
                let mut prev = f32::INFINITY;
                let mut prev_at = -1i64;
                let mut pass = 0usize;
                while pass < k {
                    let mut m = f32::NEG_INFINITY;
                    let mut j = thread;
                    while j < cols {
                        let v = x[base + j]$($to)*;
                        if v < prev || (v == prev && (j as i64) > prev_at) {
                            m = m.max(v);
                        }
                        j += offload::team_size();
                    }
                    let most = offload::team_max(m);
                    let mut first = u32::MAX;
                    let mut j = thread;
                    while j < cols {
                        let v = x[base + j]$($to)*;
                        let after = v < prev || (v == prev && (j as i64) > prev_at);
                        if after && v == most && (j as u32) < first {
                            first = j as u32;
                        }
                        j += offload::team_size();
                    }
                    let at = offload::team_min(first);
                    if thread == 0 {
                        values[row * k + pass] = $($from)*(most);
                        indices[row * k + pass] = at;
                    }
                    prev = most;
                    prev_at = if at == u32::MAX { cols as i64 } else { at as i64 };
                    pass += 1;
                }
            }

            /// `y = f(x)` with `f` the activation numbered `act` (GELU 0, its tanh form 1, SiLU 2).
            #[offload::kernel]
            pub fn activate(i: usize, act: u32, x: &[$t], y: &mut [$t]) {
                y[i] = $($from)*(crate::nn::activation(act, x[i]$($to)*));
            }

            /// `y = f(y)` with `f` the activation numbered `act`.
            #[offload::kernel]
            pub fn activate_in_place(i: usize, act: u32, y: &mut [$t]) {
                let v = y[i]$($to)*;
                y[i] = $($from)*(crate::nn::activation(act, v));
            }

            /// `y = a + b`, summed in f32 and rounded once (the residual connection).
            #[offload::kernel]
            pub fn add(i: usize, a: &[$t], b: &[$t], y: &mut [$t]) {
                y[i] = $($from)*(a[i]$($to)* + b[i]$($to)*);
            }

            /// `y += b`, summed in f32 and rounded once.
            #[offload::kernel]
            pub fn add_in_place(i: usize, y: &mut [$t], b: &[$t]) {
                let v = y[i]$($to)* + b[i]$($to)*;
                y[i] = $($from)*(v);
            }

            /// `out[r] = table[ids[r]]`, a row of `dim` per id (ids of `vocab` rows or more
            /// leave their row as it was; the launcher refuses them first).
            #[offload::kernel(dims = 2)]
            pub fn embedding(r: usize, c: usize, dim: usize, vocab: usize, ids: &[u32], table: &[$t], out: &mut [$t]) {
                let id = ids[r] as usize;
                if id < vocab {
                    out[r * dim + c] = table[id * dim + c];
                }
            }

            /// `y = x` converted from f32, rounded to nearest even.
            #[offload::kernel]
            pub fn from_f32(i: usize, x: &[f32], y: &mut [$t]) {
                y[i] = $($from)*(x[i]);
            }

            /// `y = x` converted to f32 (exact).
            #[offload::kernel]
            pub fn to_f32(i: usize, x: &[$t], y: &mut [f32]) {
                y[i] = x[i]$($to)*;
            }
        }
    };
}

nn_kernels!(f32, to = [], from = [], for_f32);
nn_kernels!(bf16, to = [.to_f32()], from = [bf16::from_f32], for_bf16);
nn_kernels!(f16, to = [.to_f32()], from = [f16::from_f32], for_f16);

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for offload::half::bf16 {}
    impl Sealed for offload::half::f16 {}
}

/// An element type of this module's kernels: `f32`, [`bf16`] or [`f16`](struct@f16) (sealed). Its
/// methods launch the type's kernels unchecked; call the module's functions instead.
#[allow(clippy::too_many_arguments, missing_docs)]
pub trait NnFloat: GemmElement + DeviceCopy + sealed::Sealed + 'static {
    /// Its name, as Rust writes it.
    const NAME: &'static str;
    #[doc(hidden)]
    fn softmax(
        d: &Device<'_>,
        rows: usize,
        cols: usize,
        log: bool,
        x: DeviceSlice<'_, Self>,
        y: DeviceSlice<'_, Self>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn layer_norm(
        d: &Device<'_>,
        rows: usize,
        cols: usize,
        eps: f32,
        x: DeviceSlice<'_, Self>,
        gamma: DeviceSlice<'_, Self>,
        beta: DeviceSlice<'_, Self>,
        y: DeviceSlice<'_, Self>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn rms_norm(
        d: &Device<'_>,
        rows: usize,
        cols: usize,
        eps: f32,
        x: DeviceSlice<'_, Self>,
        w: DeviceSlice<'_, Self>,
        y: DeviceSlice<'_, Self>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn masked_softmax(
        d: &Device<'_>,
        rows: usize,
        cols: usize,
        q_len: usize,
        causal: bool,
        s: DeviceSlice<'_, Self>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn argmax(
        d: &Device<'_>,
        rows: usize,
        cols: usize,
        x: DeviceSlice<'_, Self>,
        out: DeviceSlice<'_, u32>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn top_k(
        d: &Device<'_>,
        rows: usize,
        cols: usize,
        k: usize,
        x: DeviceSlice<'_, Self>,
        values: DeviceSlice<'_, Self>,
        indices: DeviceSlice<'_, u32>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn activate(d: &Device<'_>, act: u32, x: DeviceSlice<'_, Self>, y: DeviceSlice<'_, Self>) -> Result<()>;
    #[doc(hidden)]
    fn activate_in_place(d: &Device<'_>, act: u32, y: DeviceSlice<'_, Self>) -> Result<()>;
    #[doc(hidden)]
    fn add_in_place(d: &Device<'_>, y: DeviceSlice<'_, Self>, b: DeviceSlice<'_, Self>) -> Result<()>;
    #[doc(hidden)]
    fn add(
        d: &Device<'_>,
        a: DeviceSlice<'_, Self>,
        b: DeviceSlice<'_, Self>,
        y: DeviceSlice<'_, Self>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn embedding(
        d: &Device<'_>,
        dim: usize,
        vocab: usize,
        ids: DeviceSlice<'_, u32>,
        table: DeviceSlice<'_, Self>,
        out: DeviceSlice<'_, Self>,
    ) -> Result<()>;
    #[doc(hidden)]
    fn cast_from_f32(d: &Device<'_>, x: DeviceSlice<'_, f32>, y: DeviceSlice<'_, Self>) -> Result<()>;
    #[doc(hidden)]
    fn cast_to_f32(d: &Device<'_>, x: DeviceSlice<'_, Self>, y: DeviceSlice<'_, f32>) -> Result<()>;
}

macro_rules! nn_float {
    ($t:ty, $module:ident) => {
        impl NnFloat for $t {
            const NAME: &'static str = stringify!($t);
            fn softmax(
                d: &Device<'_>,
                rows: usize,
                cols: usize,
                log: bool,
                x: DeviceSlice<'_, Self>,
                y: DeviceSlice<'_, Self>,
            ) -> Result<()> {
                $module::softmax::launch(d, rows, row_team(cols), cols, log, x, y)
            }
            fn layer_norm(
                d: &Device<'_>,
                rows: usize,
                cols: usize,
                eps: f32,
                x: DeviceSlice<'_, Self>,
                gamma: DeviceSlice<'_, Self>,
                beta: DeviceSlice<'_, Self>,
                y: DeviceSlice<'_, Self>,
            ) -> Result<()> {
                $module::layer_norm::launch(d, rows, row_team(cols), cols, eps, x, gamma, beta, y)
            }
            fn rms_norm(
                d: &Device<'_>,
                rows: usize,
                cols: usize,
                eps: f32,
                x: DeviceSlice<'_, Self>,
                w: DeviceSlice<'_, Self>,
                y: DeviceSlice<'_, Self>,
            ) -> Result<()> {
                $module::rms_norm::launch(d, rows, row_team(cols), cols, eps, x, w, y)
            }
            fn masked_softmax(
                d: &Device<'_>,
                rows: usize,
                cols: usize,
                q_len: usize,
                causal: bool,
                s: DeviceSlice<'_, Self>,
            ) -> Result<()> {
                $module::masked_softmax::launch(d, rows, row_team(cols), cols, q_len, causal, s)
            }
            fn argmax(
                d: &Device<'_>,
                rows: usize,
                cols: usize,
                x: DeviceSlice<'_, Self>,
                out: DeviceSlice<'_, u32>,
            ) -> Result<()> {
                $module::argmax::launch(d, rows, cols, x, out)
            }
            fn top_k(
                d: &Device<'_>,
                rows: usize,
                cols: usize,
                k: usize,
                x: DeviceSlice<'_, Self>,
                values: DeviceSlice<'_, Self>,
                indices: DeviceSlice<'_, u32>,
            ) -> Result<()> {
                $module::top_k::launch(d, rows, cols, k, x, values, indices)
            }
            fn activate(
                d: &Device<'_>,
                act: u32,
                x: DeviceSlice<'_, Self>,
                y: DeviceSlice<'_, Self>,
            ) -> Result<()> {
                $module::activate::launch(d, x.len(), act, x, y)
            }
            fn activate_in_place(d: &Device<'_>, act: u32, y: DeviceSlice<'_, Self>) -> Result<()> {
                $module::activate_in_place::launch(d, y.len(), act, y)
            }
            fn add_in_place(
                d: &Device<'_>,
                y: DeviceSlice<'_, Self>,
                b: DeviceSlice<'_, Self>,
            ) -> Result<()> {
                $module::add_in_place::launch(d, y.len(), y, b)
            }
            fn add(
                d: &Device<'_>,
                a: DeviceSlice<'_, Self>,
                b: DeviceSlice<'_, Self>,
                y: DeviceSlice<'_, Self>,
            ) -> Result<()> {
                $module::add::launch(d, a.len(), a, b, y)
            }
            fn embedding(
                d: &Device<'_>,
                dim: usize,
                vocab: usize,
                ids: DeviceSlice<'_, u32>,
                table: DeviceSlice<'_, Self>,
                out: DeviceSlice<'_, Self>,
            ) -> Result<()> {
                $module::embedding::launch(d, (ids.len(), dim), dim, vocab, ids, table, out)
            }
            fn cast_from_f32(
                d: &Device<'_>,
                x: DeviceSlice<'_, f32>,
                y: DeviceSlice<'_, Self>,
            ) -> Result<()> {
                $module::from_f32::launch(d, x.len(), x, y)
            }
            fn cast_to_f32(d: &Device<'_>, x: DeviceSlice<'_, Self>, y: DeviceSlice<'_, f32>) -> Result<()> {
                $module::to_f32::launch(d, x.len(), x, y)
            }
        }
    };
}
nn_float!(f32, for_f32);
nn_float!(bf16, for_bf16);
nn_float!(f16, for_f16);

/// The rows of `cols` that view `name` (argument `index` of `kernel`, `len` elements)
/// holds, or an error saying why it holds no whole number of them.
fn rows_of(kernel: &'static str, index: usize, name: &str, len: usize, cols: usize) -> Result<usize> {
    if cols == 0 || !len.is_multiple_of(cols) {
        return Err(Error::KernelArgument {
            kernel,
            index,
            what: format!("`{name}` holds {len} elements, not whole rows of {cols}"),
        });
    }
    Ok(len / cols)
}

/// An error unless view `name` (argument `index`) has `want` elements.
fn expect_len(
    kernel: &'static str,
    index: usize,
    name: &str,
    len: usize,
    want: usize,
    of: &str,
) -> Result<()> {
    if len != want {
        return Err(Error::KernelArgument {
            kernel,
            index,
            what: format!("`{name}` holds {len} elements; expected {want} ({of})"),
        });
    }
    Ok(())
}

/// An error unless `eps` is finite and not negative.
fn check_eps(kernel: &'static str, eps: f32) -> Result<()> {
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::KernelArgument {
            kernel,
            index: 1,
            what: format!("eps {eps}; expected a finite value of at least 0"),
        });
    }
    Ok(())
}

/// `y = softmax(x)` over each row of `cols` elements of `x` (`y` the same shape).
pub fn softmax<T: NnFloat>(
    dev: &Device<'_>,
    cols: usize,
    x: DeviceSlice<'_, T>,
    y: DeviceSlice<'_, T>,
) -> Result<()> {
    softmax_rows("softmax", false, dev, cols, x, y)
}

/// `y = log_softmax(x)` over each row of `cols` elements of `x` (`y` the same shape).
pub fn log_softmax<T: NnFloat>(
    dev: &Device<'_>,
    cols: usize,
    x: DeviceSlice<'_, T>,
    y: DeviceSlice<'_, T>,
) -> Result<()> {
    softmax_rows("log_softmax", true, dev, cols, x, y)
}

/// [`softmax`] or, when `log`, [`log_softmax`] (named `kernel` in errors).
fn softmax_rows<T: NnFloat>(
    kernel: &'static str,
    log: bool,
    dev: &Device<'_>,
    cols: usize,
    x: DeviceSlice<'_, T>,
    y: DeviceSlice<'_, T>,
) -> Result<()> {
    let rows = rows_of(kernel, 0, "x", x.len(), cols)?;
    expect_len(kernel, 1, "y", y.len(), x.len(), "x's shape")?;
    T::softmax(dev, rows, cols, log, x, y)
}

/// Layer normalisation of each row of `cols`: `(x - mean) / sqrt(var + eps) * gamma + beta`
/// (`gamma`, `beta` of `cols` elements; the biased variance, as PyTorch's `nn.LayerNorm`).
pub fn layer_norm<T: NnFloat>(
    dev: &Device<'_>,
    cols: usize,
    eps: f32,
    x: DeviceSlice<'_, T>,
    gamma: DeviceSlice<'_, T>,
    beta: DeviceSlice<'_, T>,
    y: DeviceSlice<'_, T>,
) -> Result<()> {
    check_eps("layer_norm", eps)?;
    let rows = rows_of("layer_norm", 2, "x", x.len(), cols)?;
    expect_len("layer_norm", 3, "gamma", gamma.len(), cols, "one per column")?;
    expect_len("layer_norm", 4, "beta", beta.len(), cols, "one per column")?;
    expect_len("layer_norm", 5, "y", y.len(), x.len(), "x's shape")?;
    T::layer_norm(dev, rows, cols, eps, x, gamma, beta, y)
}

/// RMS normalisation of each row of `cols`: `x / sqrt(mean(x^2) + eps) * w` (`w` of `cols`
/// elements, as PyTorch's `nn.RMSNorm`).
pub fn rms_norm<T: NnFloat>(
    dev: &Device<'_>,
    cols: usize,
    eps: f32,
    x: DeviceSlice<'_, T>,
    w: DeviceSlice<'_, T>,
    y: DeviceSlice<'_, T>,
) -> Result<()> {
    check_eps("rms_norm", eps)?;
    let rows = rows_of("rms_norm", 2, "x", x.len(), cols)?;
    expect_len("rms_norm", 3, "w", w.len(), cols, "one per column")?;
    expect_len("rms_norm", 4, "y", y.len(), x.len(), "x's shape")?;
    T::rms_norm(dev, rows, cols, eps, x, w, y)
}

/// The shape of an [`attention`]: `batch x heads` independent problems of `q_len` queries
/// over `kv_len` keys and values of `head_dim` each.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attention {
    /// Sequences.
    pub batch: usize,
    /// Heads per sequence.
    pub heads: usize,
    /// Queries per head: the last `q_len` positions of the sequence.
    pub q_len: usize,
    /// Keys and values per head (the positions so far: `q_len` in a prefill, more with a
    /// KV cache).
    pub kv_len: usize,
    /// Features per head.
    pub head_dim: usize,
    /// Each query sees only the keys up to its own position.
    pub causal: bool,
    /// The scores' scale; `None`: `1 / sqrt(head_dim)`, as PyTorch's default.
    pub scale: Option<f32>,
    /// Positions each head's keys and values hold, of which the first `kv_len` are read (a
    /// KV cache's capacity, so that decoding needs no copy); `None`: `kv_len`.
    pub kv_capacity: Option<usize>,
}

/// Scaled dot-product attention, `softmax(scale * Q K^T + mask) V` for each of
/// `batch x heads` heads, as `F.scaled_dot_product_attention(q, k, v)` (with `causal`,
/// the mask of a KV cache, `causal_lower_right`: query `i` of the last `q_len` positions
/// sees keys up to its own; PyTorch's `is_causal=True` when `q_len == kv_len`).
///
/// `q` and `out` are `[batch, heads, q_len, head_dim]`, `k` and `v` `[batch, heads,
/// kv_capacity, head_dim]` (`kv_capacity` being `kv_len` unless said), row-major; `scores` is scratch of `batch * heads * q_len * kv_len`
/// elements (the probabilities, in `T`, are left in it). Two batched GEMMs, a product per
/// head each (the device's: cuBLASLt on GPUs, f32 accumulation), around a masked softmax
/// in place.
pub fn attention<T: NnFloat>(
    dev: &Device<'_>,
    a: Attention,
    q: DeviceSlice<'_, T>,
    k: DeviceSlice<'_, T>,
    v: DeviceSlice<'_, T>,
    scores: DeviceSlice<'_, T>,
    out: DeviceSlice<'_, T>,
) -> Result<()> {
    let Attention { batch, heads, q_len, kv_len, head_dim: d, causal, scale, kv_capacity } = a;
    let cap = kv_capacity.unwrap_or(kv_len);
    let overflow = || Error::Overflow { routine: "attention", what: format!("{a:?}") };
    let heads_all = batch.checked_mul(heads).ok_or_else(overflow)?;
    let size = |rows: usize, cols: usize| heads_all.checked_mul(rows)?.checked_mul(cols);
    let (q_size, kv_size, s_size) = (
        size(q_len, d).ok_or_else(overflow)?,
        size(cap, d).ok_or_else(overflow)?,
        size(q_len, kv_len).ok_or_else(overflow)?,
    );
    let bad = |index, what: String| Err(Error::KernelArgument { kernel: "attention", index, what });
    if q_len == 0 || kv_len == 0 || d == 0 {
        return bad(0, format!("{a:?}: queries, keys and features are at least 1"));
    }
    if causal && q_len > kv_len {
        return bad(0, format!("{a:?}: a causal attention's queries are the last of its keys' positions"));
    }
    if cap < kv_len {
        return bad(0, format!("{a:?}: keys and values hold fewer positions than are read"));
    }
    for (index, name, len, want, of) in [
        (0, "q", q.len(), q_size, "batch x heads x q_len x head_dim"),
        (1, "k", k.len(), kv_size, "batch x heads x kv_capacity x head_dim"),
        (2, "v", v.len(), kv_size, "batch x heads x kv_capacity x head_dim"),
        (3, "scores", scores.len(), s_size, "batch x heads x q_len x kv_len"),
        (4, "out", out.len(), q_size, "batch x heads x q_len x head_dim"),
    ] {
        expect_len("attention", index, name, len, want, of)?;
    }
    crate::check_writable("attention", "scores", &scores)?;
    crate::check_writable("attention", "out", &out)?;
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
    // Row-major S (q_len x kv_len) = Q K^T is column-major S^T = K Q^T; row-major O =
    // P V is column-major O^T = V^T P^T (as `linear` reads row-major operands).
    // Each a batch of one product per head: K and V a cache's `cap` positions apart.
    let scores_of = Gemm {
        transa: true,
        m: kv_len,
        n: q_len,
        k: d,
        alpha: scale,
        lda: d,
        ldb: d,
        ldc: kv_len,
        batch: heads_all,
        stride_a: cap * d,
        stride_b: q_len * d,
        stride_c: q_len * kv_len,
        ..Gemm::default()
    };
    let mixed = Gemm {
        m: d,
        n: q_len,
        k: kv_len,
        lda: d,
        ldb: kv_len,
        ldc: d,
        batch: heads_all,
        stride_a: cap * d,
        stride_b: q_len * kv_len,
        stride_c: q_len * d,
        ..Gemm::default()
    };
    dev.gemm(&scores_of, k, q, scores, None)?;
    T::masked_softmax(dev, heads_all * q_len, kv_len, q_len, causal, scores)?;
    dev.gemm(&mixed, v, scores, out, None)
}

/// `out[r]` = the column of row `r`'s largest element (the first of equals, NaNs passed
/// over; 0 for a row of NaNs), one `u32` per row of `cols`.
pub fn argmax<T: NnFloat>(
    dev: &Device<'_>,
    cols: usize,
    x: DeviceSlice<'_, T>,
    out: DeviceSlice<'_, u32>,
) -> Result<()> {
    let rows = rows_of("argmax", 0, "x", x.len(), cols)?;
    expect_len("argmax", 1, "out", out.len(), rows, "one per row")?;
    if u32::try_from(cols).is_err() {
        return Err(Error::KernelArgument {
            kernel: "argmax",
            index: 0,
            what: format!("rows of {cols} columns; an index is a u32"),
        });
    }
    T::argmax(dev, rows, cols, x, out)
}

/// Each row's `k` largest elements (rows of `cols`), as `torch.topk(x, k)`: `values` and
/// `indices` are `[rows, k]`, in decreasing order, equals by increasing index (PyTorch
/// leaves their order open). NaNs are passed over: a row with fewer than `k` numbers ends
/// with value negative infinity and index `u32::MAX`.
///
/// ```
/// use offload::{map, Runtime};
/// use offload_kernels::nn;
///
/// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build()?;
/// let dev = rt.device(0)?;
/// let x = [0.5f32, 3.0, -1.0, 3.0, 2.0];
/// let (mut values, mut indices) = ([0f32; 3], [0u32; 3]);
/// dev.data((map::to(&x), map::from(&mut values), map::from(&mut indices)), |(x, v, i)| {
///     nn::top_k(&dev, 5, 3, x, v, i)
/// })?;
/// assert_eq!((values, indices), ([3.0, 3.0, 2.0], [1, 3, 4]));
/// # Ok::<(), offload::Error>(())
/// ```
pub fn top_k<T: NnFloat>(
    dev: &Device<'_>,
    cols: usize,
    k: usize,
    x: DeviceSlice<'_, T>,
    values: DeviceSlice<'_, T>,
    indices: DeviceSlice<'_, u32>,
) -> Result<()> {
    let rows = rows_of("top_k", 0, "x", x.len(), cols)?;
    if k == 0 || k > cols || u32::try_from(cols).is_err() {
        return Err(Error::KernelArgument {
            kernel: "top_k",
            index: 1,
            what: format!(
                "k = {k} of rows of {cols}; expected 1 to {cols}, and rows of at most u32::MAX columns"
            ),
        });
    }
    let want = rows
        .checked_mul(k)
        .ok_or(Error::Overflow { routine: "top_k", what: format!("{rows} rows x k = {k}") })?;
    expect_len("top_k", 2, "values", values.len(), want, "rows x k")?;
    expect_len("top_k", 3, "indices", indices.len(), want, "rows x k")?;
    crate::check_writable("top_k", "values", &values)?;
    crate::check_writable("top_k", "indices", &indices)?;
    T::top_k(dev, rows, cols, k, x, values, indices)
}

/// `y = f(x)` for activation `act`, named `kernel` in errors.
fn activate<T: NnFloat>(
    kernel: &'static str,
    act: u32,
    dev: &Device<'_>,
    x: DeviceSlice<'_, T>,
    y: DeviceSlice<'_, T>,
) -> Result<()> {
    expect_len(kernel, 1, "y", y.len(), x.len(), "x's length")?;
    T::activate(dev, act, x, y)
}

/// `y = gelu(x)` with the exact normal CDF, as PyTorch's `nn.GELU()`.
pub fn gelu<T: NnFloat>(dev: &Device<'_>, x: DeviceSlice<'_, T>, y: DeviceSlice<'_, T>) -> Result<()> {
    activate("gelu", GELU, dev, x, y)
}

/// `y = gelu(x)` by the tanh approximation, as `nn.GELU(approximate="tanh")`.
pub fn gelu_tanh<T: NnFloat>(dev: &Device<'_>, x: DeviceSlice<'_, T>, y: DeviceSlice<'_, T>) -> Result<()> {
    activate("gelu_tanh", GELU_TANH, dev, x, y)
}

/// `y = x * sigmoid(x)`, as `nn.SiLU()`.
pub fn silu<T: NnFloat>(dev: &Device<'_>, x: DeviceSlice<'_, T>, y: DeviceSlice<'_, T>) -> Result<()> {
    activate("silu", SILU, dev, x, y)
}

/// [`gelu`] of `y`, into `y` (a view given as both input and output of [`gelu`] is
/// refused: its kernel's items could read what others write).
pub fn gelu_in_place<T: NnFloat>(dev: &Device<'_>, y: DeviceSlice<'_, T>) -> Result<()> {
    T::activate_in_place(dev, GELU, y)
}

/// [`gelu_tanh`] of `y`, into `y`.
pub fn gelu_tanh_in_place<T: NnFloat>(dev: &Device<'_>, y: DeviceSlice<'_, T>) -> Result<()> {
    T::activate_in_place(dev, GELU_TANH, y)
}

/// [`silu`] of `y`, into `y`.
pub fn silu_in_place<T: NnFloat>(dev: &Device<'_>, y: DeviceSlice<'_, T>) -> Result<()> {
    T::activate_in_place(dev, SILU, y)
}

/// `y += b` element-wise, summed in f32 and rounded once (a residual added to the stream).
pub fn add_in_place<T: NnFloat>(
    dev: &Device<'_>,
    y: DeviceSlice<'_, T>,
    b: DeviceSlice<'_, T>,
) -> Result<()> {
    expect_len("add", 1, "b", b.len(), y.len(), "y's length")?;
    T::add_in_place(dev, y, b)
}

/// `y = a + b` element-wise, summed in f32 and rounded once (a residual connection).
pub fn add<T: NnFloat>(
    dev: &Device<'_>,
    a: DeviceSlice<'_, T>,
    b: DeviceSlice<'_, T>,
    y: DeviceSlice<'_, T>,
) -> Result<()> {
    expect_len("add", 1, "b", b.len(), a.len(), "a's length")?;
    expect_len("add", 2, "y", y.len(), a.len(), "a's length")?;
    T::add(dev, a, b, y)
}

/// `out[r] = table[ids[r]]` for each of the `ids` (host values, as a decoding loop has
/// them), `table` a `[vocab, dim]` embedding, `out` `[ids.len(), dim]`: `nn.Embedding`.
/// Every id is checked against the table's rows before anything is copied; the ids go to
/// the device in a buffer of this call, which waits for the gather before it returns.
pub fn embedding<T: NnFloat>(
    dev: &Device<'_>,
    dim: usize,
    ids: &[u32],
    table: DeviceSlice<'_, T>,
    out: DeviceSlice<'_, T>,
) -> Result<()> {
    let vocab = rows_of("embedding", 1, "table", table.len(), dim)?;
    expect_len("embedding", 2, "out", out.len(), ids.len().saturating_mul(dim), "ids x dim")?;
    crate::check_writable("embedding", "out", &out)?;
    if let Some((r, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
        return Err(Error::KernelArgument {
            kernel: "embedding",
            index: 0,
            what: format!("id {id} (position {r}) is past the table's {vocab} rows"),
        });
    }
    if ids.is_empty() {
        return Ok(());
    }
    let on_device = offload::DeviceBuffer::from_slice(dev, ids)?;
    T::embedding(dev, dim, vocab, on_device.view(), table, out)
}

/// `y = x` converted from f32 to `T`, rounded to nearest even (as `half` converts).
pub fn from_f32<T: NnFloat>(dev: &Device<'_>, x: DeviceSlice<'_, f32>, y: DeviceSlice<'_, T>) -> Result<()> {
    expect_len("cast", 1, "y", y.len(), x.len(), "x's length")?;
    T::cast_from_f32(dev, x, y)
}

/// `y = x` converted from `T` to f32 (exact).
pub fn to_f32<T: NnFloat>(dev: &Device<'_>, x: DeviceSlice<'_, T>, y: DeviceSlice<'_, f32>) -> Result<()> {
    expect_len("cast", 1, "y", y.len(), x.len(), "x's length")?;
    T::cast_to_f32(dev, x, y)
}

/// Every kernel of this module, plain and bounds-checked (for NVRTC checks).
pub fn all() -> Vec<&'static Kernel> {
    macro_rules! of {
        ($($m:ident),*) => {{
            let mut v: Vec<&'static Kernel> = Vec::new();
            $(
                v.extend([
                    &$m::softmax::KERNEL, &$m::softmax::KERNEL_CHECKED,
                    &$m::layer_norm::KERNEL, &$m::rms_norm::KERNEL,
                    &$m::argmax::KERNEL, &$m::argmax::KERNEL_CHECKED, &$m::masked_softmax::KERNEL,
                    &$m::top_k::KERNEL, &$m::top_k::KERNEL_CHECKED,
                    &$m::activate::KERNEL, &$m::activate_in_place::KERNEL, &$m::add::KERNEL, &$m::add_in_place::KERNEL,
                    &$m::from_f32::KERNEL, &$m::to_f32::KERNEL, &$m::embedding::KERNEL,
                ]);
            )*
            v
        }};
    }
    of!(for_f32, for_bf16, for_f16)
}
