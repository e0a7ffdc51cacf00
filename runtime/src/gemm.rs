//! GEMMs: `D = act(alpha op(A) op(B) + beta C + bias)`, column-major as BLAS has it, in the
//! precisions inference runs in.
//!
//! A [`Gemm`] says the shape, the scalars, the epilogue's [`Activation`] and whether f32
//! operands go through TF32 tensor cores; the element type ([`GemmElement`]: `f32`,
//! [`half::bf16`], [`half::f16`]) is A's, B's, C's and the bias's, and every product
//! accumulates in f32. [`crate::Device::gemm`] runs it: cuBLASLt on CUDA devices (the bias
//! and the activation fused into the GEMM's epilogue), `matrixmultiply`'s kernel on host
//! devices, which compute the same precisions the same way (operands widened to f32, or
//! rounded to TF32 first; f32 accumulation; the epilogue in f32; one rounding to the output
//! type), so that host tests check what GPUs compute.
//!
//! | precision | operands | expected relative error of a `k`-long dot product |
//! |---|---|---|
//! | fp32 | `f32` | about `k * 2^-24` at worst, `sqrt(k) * 2^-24` typically |
//! | TF32 | `f32`, `tf32: true` | about `2^-11` per operand (10 mantissa bits) |
//! | fp16 | [`half::f16`] | inputs `2^-11`, the output rounded once more (`2^-11`) |
//! | bf16 | [`half::bf16`] | inputs `2^-8`, the output rounded once more (`2^-8`) |
//!
//! [`Precision::tolerance`] states the bound the tests hold each precision to.

use std::borrow::Cow;

use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;

/// `D = act(alpha op(A) op(B) + beta C + bias)`, column-major: `op(A)` is `m x k`, `op(B)`
/// `k x n`, C and D (the same memory) `m x n` with leading dimensions `lda`, `ldb`, `ldc`;
/// the bias, when given, has `m` elements, one per row, broadcast over the columns.
///
/// ```
/// use offload::{Activation, Gemm};
///
/// // Column-major 2 x 3 times 3 x 4, ReLU after.
/// let g = Gemm { m: 2, n: 4, k: 3, lda: 2, ldb: 3, ldc: 2, activation: Activation::Relu, ..Gemm::default() };
/// assert_eq!(g.extents()?, (6, 12, 8));
/// # Ok::<(), offload::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    /// A is stored `k x m` and transposed.
    pub transa: bool,
    /// B is stored `n x k` and transposed.
    pub transb: bool,
    /// Rows of `op(A)`, C and D.
    pub m: usize,
    /// Columns of `op(B)`, C and D.
    pub n: usize,
    /// Columns of `op(A)`, rows of `op(B)`: the dot products' length.
    pub k: usize,
    /// Scales the product.
    pub alpha: f32,
    /// A's leading dimension (`>= max(1, rows of A as stored)`).
    pub lda: usize,
    /// B's leading dimension.
    pub ldb: usize,
    /// Scales C (which is not read when 0, as BLAS says).
    pub beta: f32,
    /// C's and D's leading dimension (`>= max(1, m)`).
    pub ldc: usize,
    /// f32 operands rounded to TF32 (10 mantissa bits) for tensor cores, accumulation still
    /// f32; only for `f32` elements.
    pub tf32: bool,
    /// Applied to each element last, after the bias ([`Activation::Identity`]: none).
    pub activation: Activation,
}

impl Default for Gemm {
    /// An empty product: no rows, columns or depth, `alpha = 1`, `beta = 0`, leading
    /// dimensions 1, no TF32, no activation. Meant for `..Gemm::default()`.
    fn default() -> Self {
        Self {
            transa: false,
            transb: false,
            m: 0,
            n: 0,
            k: 0,
            alpha: 1.0,
            lda: 1,
            ldb: 1,
            beta: 0.0,
            ldc: 1,
            tf32: false,
            activation: Activation::Identity,
        }
    }
}

impl Gemm {
    /// Elements each operand spans: `(a, b, c)`. An error when a leading dimension is
    /// smaller than its operand's rows (BLAS requires `ld >= max(1, rows)`), or when a span
    /// in bytes overflows.
    pub fn extents(&self) -> Result<(usize, usize, usize)> {
        let span = |name: &str, ld: usize, rows: usize, cols: usize| {
            if ld < rows.max(1) {
                return Err(Error::InvalidArgument {
                    routine: "gemm",
                    what: format!(
                        "{name}: leading dimension {ld} for {rows} rows; expected at least max(1, {rows})"
                    ),
                });
            }
            if cols == 0 {
                return Ok(0);
            }
            // f32 is the widest element type: a span that fits in f32s fits in any.
            ld.checked_mul(cols - 1)
                .and_then(|e| e.checked_add(rows))
                .filter(|e| e.checked_mul(std::mem::size_of::<f32>()).is_some())
                .ok_or_else(|| Error::Overflow {
                    routine: "gemm",
                    what: format!("{name}: span of {cols} columns of leading dimension {ld} and {rows} rows"),
                })
        };
        let (ar, ac) = if self.transa { (self.k, self.m) } else { (self.m, self.k) };
        let (br, bc) = if self.transb { (self.n, self.k) } else { (self.k, self.n) };
        Ok((span("A", self.lda, ar, ac)?, span("B", self.ldb, br, bc)?, span("C", self.ldc, self.m, self.n)?))
    }

    /// The precision this product runs in with elements of type `T`.
    pub fn precision<T: GemmElement>(&self) -> Precision {
        match (T::TYPE, self.tf32) {
            (ElementType::F32, false) => Precision::Fp32,
            (ElementType::F32, true) => Precision::Tf32,
            (ElementType::F16, _) => Precision::Fp16,
            (ElementType::Bf16, _) => Precision::Bf16,
        }
    }
}

/// The activation a GEMM's epilogue applies, after the bias.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// None.
    #[default]
    Identity,
    /// `max(x, 0)`.
    Relu,
    /// GELU in its tanh form, as cuBLASLt's epilogue and PyTorch's
    /// `gelu(approximate="tanh")` compute it:
    /// `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
    Gelu,
}

impl Activation {
    /// The activation of `x`, in f32.
    ///
    /// ```
    /// use offload::Activation;
    /// assert_eq!(Activation::Relu.apply(-2.0), 0.0);
    /// assert!((Activation::Gelu.apply(1.0) - 0.841192).abs() < 1e-5);
    /// ```
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Self::Identity => x,
            Self::Relu => x.max(0.0),
            Self::Gelu => {
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
            }
        }
    }
}

/// The element types of a GEMM's operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// `f32`.
    F32,
    /// IEEE half precision, [`half::f16`].
    F16,
    /// bfloat16, [`half::bf16`].
    Bf16,
}

impl ElementType {
    /// The type's name as Rust spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }
}

/// A GEMM's precision: its element type, and for f32 whether TF32 tensor cores run it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 operands and arithmetic (no TF32).
    Fp32,
    /// f32 operands rounded to TF32, f32 accumulation.
    Tf32,
    /// f16 operands and output, f32 accumulation.
    Fp16,
    /// bf16 operands and output, f32 accumulation.
    Bf16,
}

impl Precision {
    /// Every precision, in the order above.
    pub const ALL: [Precision; 4] = [Self::Fp32, Self::Tf32, Self::Fp16, Self::Bf16];

    /// The bound on `|got - want| / (|want| + rms(want))` this runtime's tests hold a
    /// layer's output to against an f64 reference, for dot products of up to a few thousand
    /// terms: fp32 `1e-4`, TF32 `4e-3`, fp16 `4e-3`, bf16 `3e-2` (a few units in the last
    /// place of each: operands rounded once, the output once more).
    pub fn tolerance(self) -> f64 {
        match self {
            Self::Fp32 => 1e-4,
            Self::Tf32 | Self::Fp16 => 4e-3,
            Self::Bf16 => 3e-2,
        }
    }

    /// Its name as the examples' `-precision` option spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fp32 => "fp32",
            Self::Tf32 => "tf32",
            Self::Fp16 => "fp16",
            Self::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;

    /// `fp32`, `tf32`, `fp16` or `bf16`.
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| Error::InvalidArgument {
            routine: "Precision::from_str",
            what: format!("unknown precision {s:?}; expected fp32, tf32, fp16 or bf16"),
        })
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An element type GEMMs take: `f32`, [`half::f16`] or [`half::bf16`] (sealed: the
/// devices' libraries have kernels for these).
pub trait GemmElement: DeviceCopy + Send + Sync + sealed::Sealed {
    /// Which type it is.
    const TYPE: ElementType;
    /// Widened to f32 (exact).
    fn to_f32(self) -> f32;
    /// Rounded from f32, to nearest even.
    fn from_f32(v: f32) -> Self;
    /// The slice itself when the type is f32 (no copy needed to compute in f32).
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        let _ = s;
        None
    }
    /// The slice itself when the type is f32.
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        let _ = s;
        None
    }
}

impl GemmElement for f32 {
    const TYPE: ElementType = ElementType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        Some(s)
    }
}

impl GemmElement for half::f16 {
    const TYPE: ElementType = ElementType::F16;
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

impl GemmElement for half::bf16 {
    const TYPE: ElementType = ElementType::Bf16;
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v)
    }
}

/// `v` rounded to TF32 (10 explicit mantissa bits; to nearest, ties away from zero, as
/// CUDA's `cvt.rna.tf32.f32`), still stored as an f32.
///
/// ```
/// assert_eq!(offload::gemm::round_to_tf32(1.0 + 2f32.powi(-11)), 1.0 + 2f32.powi(-10));
/// assert_eq!(offload::gemm::round_to_tf32(1.0 + 2f32.powi(-12)), 1.0);
/// ```
pub fn round_to_tf32(v: f32) -> f32 {
    if !v.is_finite() {
        return v;
    }
    // Half of the last kept place, then the 13 dropped bits cleared: ties go away from zero
    // (the magnitude bits round up); a carry into the exponent is the right result.
    f32::from_bits(v.to_bits().wrapping_add(0x1000) & !0x1fff)
}

/// The host's GEMM: `matrixmultiply`'s packed, vectorised f32 kernel, one block of C's
/// columns per task of `pool`, operands widened to f32 (or rounded to TF32) first when they
/// are not f32 already, the epilogue (bias, activation) on each block in f32, and one
/// rounding to `T` at the end. `a`, `b` and `c` span exactly what [`Gemm::extents`] says;
/// `bias` has `g.m` elements.
pub(crate) fn host_gemm<T: GemmElement>(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[T],
    b: &[T],
    c: &mut [T],
    bias: Option<&[T]>,
) {
    use rayon::prelude::*;
    if g.m == 0 || g.n == 0 {
        return;
    }
    fn widen<'a, T: GemmElement>(pool: &rayon::ThreadPool, x: &'a [T], tf32: bool) -> Cow<'a, [f32]> {
        match T::as_f32(x) {
            Some(x) if !tf32 => Cow::Borrowed(x),
            _ => pool.install(|| {
                Cow::Owned(
                    x.par_iter()
                        .map(|&v| if tf32 { round_to_tf32(v.to_f32()) } else { v.to_f32() })
                        .collect(),
                )
            }),
        }
    }
    let (a, b) = (widen(pool, a, g.tf32), widen(pool, b, g.tf32));
    let bias: Option<Vec<f32>> = bias.map(|b| b.iter().map(|v| v.to_f32()).collect());
    match T::as_f32_mut(c) {
        Some(c) => f32_gemm(pool, g, &a, &b, c, bias.as_deref()),
        None => {
            // C in f32 (read only when beta is not 0), computed, then rounded back: only
            // the m rows of each column are C's.
            let mut wide: Vec<f32> = if g.beta == 0.0 {
                vec![0.0; c.len()]
            } else {
                pool.install(|| c.par_iter().map(|v| v.to_f32()).collect())
            };
            f32_gemm(pool, g, &a, &b, &mut wide, bias.as_deref());
            pool.install(|| {
                c.par_chunks_mut(g.ldc).zip(wide.par_chunks(g.ldc)).for_each(|(c, w)| {
                    let rows = g.m.min(c.len());
                    c[..rows].iter_mut().zip(&w[..rows]).for_each(|(c, &w)| *c = T::from_f32(w));
                })
            });
        }
    }
}

/// [`host_gemm`] in f32: `a` and `b` already widened (or rounded to TF32).
fn f32_gemm(pool: &rayon::ThreadPool, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32], bias: Option<&[f32]>) {
    use rayon::prelude::*;
    // Strides of op(A) (m x k), op(B) (k x n) and C (m x n), column-major.
    let (rsa, csa) = if g.transa { (g.lda, 1) } else { (1, g.lda) };
    let (rsb, csb) = if g.transb { (g.ldb, 1) } else { (1, g.ldb) };
    // Blocks of whole columns, about one per thread, at least 16 columns each.
    let cols = g.n.div_ceil(pool.current_num_threads().max(1)).max(16);
    let (a, b) = (a.as_ptr() as usize, b.as_ptr() as usize);
    pool.install(|| {
        // `extents` bounds ldc * (n - 1), not ldc * cols: with fewer columns than a block
        // (n = 1 and a huge ldc) the product can overflow, and then there is one block.
        let block_len = g.ldc.saturating_mul(cols);
        c.par_chunks_mut(block_len).enumerate().for_each(|(block, out)| {
            let j0 = block * cols;
            let n = cols.min(g.n.saturating_sub(j0));
            if g.k == 0 {
                // op(A) op(B) is zero: C = beta C (C not read when beta is 0, as BLAS says).
                for j in 0..n {
                    for v in &mut out[j * g.ldc..j * g.ldc + g.m] {
                        *v = if g.beta == 0.0 { 0.0 } else { g.beta * *v };
                    }
                }
            } else {
                // SAFETY: `extents` bounds every element op(A), op(B) and C reach by these
                // strides within `a`, `b` and `c` (checked against the device's allocations
                // by the caller); this block's columns j0..j0+n of C lie in `out`, which no
                // other task touches; B's columns start at j0 * csb elements in.
                unsafe {
                    matrixmultiply::sgemm(
                        g.m,
                        g.k,
                        n,
                        g.alpha,
                        a as *const f32,
                        rsa as isize,
                        csa as isize,
                        (b as *const f32).add(j0 * csb),
                        rsb as isize,
                        csb as isize,
                        g.beta,
                        out.as_mut_ptr(),
                        1,
                        g.ldc as isize,
                    )
                }
            }
            if bias.is_some() || g.activation != Activation::Identity {
                for j in 0..n {
                    let col = &mut out[j * g.ldc..j * g.ldc + g.m];
                    match bias {
                        Some(bias) => {
                            col.iter_mut().zip(bias).for_each(|(v, b)| *v = g.activation.apply(*v + b))
                        }
                        None => col.iter_mut().for_each(|v| *v = g.activation.apply(*v)),
                    }
                }
            }
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    fn random(seed: &mut u64) -> f32 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        (*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }

    /// The product, in f64 from the operands as stored (already rounded to `T`).
    fn reference<T: GemmElement>(
        g: &Gemm,
        a: &[T],
        b: &[T],
        c0: &[T],
        bias: Option<&[T]>,
        i: usize,
        j: usize,
    ) -> f64 {
        let at = |i: usize, p: usize| {
            f64::from(if g.transa { a[p + i * g.lda] } else { a[i + p * g.lda] }.to_f32())
        };
        let bt = |p: usize, j: usize| {
            f64::from(if g.transb { b[j + p * g.ldb] } else { b[p + j * g.ldb] }.to_f32())
        };
        let dot: f64 = (0..g.k).map(|p| at(i, p) * bt(p, j)).sum();
        let beta_c =
            if g.beta == 0.0 { 0.0 } else { f64::from(g.beta) * f64::from(c0[i + j * g.ldc].to_f32()) };
        let v = f64::from(g.alpha) * dot + beta_c + bias.map_or(0.0, |b| f64::from(b[i].to_f32()));
        match g.activation {
            Activation::Identity => v,
            Activation::Relu => v.max(0.0),
            Activation::Gelu => {
                0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
            }
        }
    }

    /// Every shape, transposition, scalar pair and epilogue, in one element type, against
    /// f64; rows past `m` of each column of C untouched.
    fn agrees_on_every_shape<T: GemmElement>(tf32: bool, tol: f64) {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let shapes = [(1, 1, 1), (7, 5, 3), (33, 70, 17), (64, 64, 64), (5, 100, 0), (130, 3, 41)];
        for (m, n, k) in shapes {
            for (transa, transb) in [(false, false), (true, false), (false, true), (true, true)] {
                for (alpha, beta, activation, with_bias) in [
                    (1.0, 0.0, Activation::Identity, false),
                    (0.5, -2.0, Activation::Identity, false),
                    (1.0, 0.0, Activation::Relu, true),
                    (1.0, 0.5, Activation::Gelu, true),
                ] {
                    // Leading dimensions with room to spare, as a sub-matrix's are.
                    let ra = if transa { k } else { m };
                    let rb = if transb { n } else { k };
                    let g = Gemm {
                        transa,
                        transb,
                        m,
                        n,
                        k,
                        alpha,
                        lda: ra + 2,
                        ldb: rb + 1,
                        beta,
                        ldc: m + 3,
                        tf32,
                        activation,
                    };
                    let (ea, eb, ec) = g.extents().unwrap();
                    let mut gen =
                        |n: usize| (0..n).map(|_| T::from_f32(random(&mut seed))).collect::<Vec<T>>();
                    let (a, b, c0, bias) = (gen(ea), gen(eb), gen(ec), gen(m));
                    let bias = with_bias.then_some(&bias[..]);
                    let mut c = c0.clone();
                    host_gemm(&pool, &g, &a, &b, &mut c, bias);
                    for j in 0..n {
                        for i in 0..m {
                            let want = reference(&g, &a, &b, &c0, bias, i, j);
                            let got = f64::from(c[i + j * g.ldc].to_f32());
                            assert!(
                                (got - want).abs() <= tol * (1.0 + want.abs()) * (1.0 + k as f64).sqrt(),
                                "{:?} {g:?} at ({i}, {j}): {got} vs {want}",
                                T::TYPE
                            );
                        }
                        for i in m..g.ldc.min(ec - j * g.ldc) {
                            assert_eq!(
                                c[i + j * g.ldc].to_f32().to_bits(),
                                c0[i + j * g.ldc].to_f32().to_bits(),
                                "{g:?}: row {i} of column {j} written"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn f32_agrees_with_a_reference_in_f64_on_every_shape() {
        agrees_on_every_shape::<f32>(false, 1e-6);
    }

    #[test]
    fn tf32_agrees_within_its_rounding() {
        agrees_on_every_shape::<f32>(true, 2e-3);
    }

    #[test]
    fn f16_and_bf16_agree_within_their_rounding() {
        agrees_on_every_shape::<f16>(false, 2e-3);
        agrees_on_every_shape::<bf16>(false, 1e-2);
    }

    #[test]
    fn tf32_keeps_ten_mantissa_bits_rounding_ties_away() {
        for v in [1.0f32, -3.5, 1e-30, 6.0e7, 1.0e38, f32::MIN_POSITIVE] {
            let r = round_to_tf32(v);
            assert_eq!(r.to_bits() & 0x1fff, 0, "{v}");
            assert!(((r - v) / v).abs() <= 2f32.powi(-11), "{v} -> {r}");
        }
        assert_eq!(round_to_tf32(-(1.0 + 2f32.powi(-11))), -(1.0 + 2f32.powi(-10)));
        assert!(round_to_tf32(f32::NAN).is_nan());
        assert_eq!(round_to_tf32(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn precisions_parse_by_name_and_refuse_others() {
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>().unwrap(), p);
        }
        let e = "fp8".parse::<Precision>().unwrap_err().to_string();
        assert!(e.contains("\"fp8\"") && e.contains("bf16"), "{e}");
    }
}
