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
//! type), so that host tests check what GPUs compute. bf16 products on a CPU with AVX512-BF16
//! multiply the bf16 pairs as they are, with f32 partial sums (`vdpbf16ps`, twice the f32
//! kernel's rate), as GPUs' bf16 tensor cores do; such a CPU counts subnormal bf16 inputs
//! as zero ([`crate::RuntimeBuilder::host_bf16_dot`] turns it off).
//!
//! | precision | operands | expected relative error of a `k`-long dot product |
//! |---|---|---|
//! | fp32 | `f32` | about `k * 2^-24` at worst, `sqrt(k) * 2^-24` typically |
//! | TF32 | `f32`, `tf32: true` | about `2^-11` per operand (10 mantissa bits) |
//! | fp16 | [`half::f16`] | inputs `2^-11`, the output rounded once more (`2^-11`) |
//! | bf16 | [`half::bf16`] | inputs `2^-8`, the output rounded once more (`2^-8`) |
//!
//! [`Precision::tolerance`] states the bound the tests hold each precision to.

use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;

/// `D = act(alpha op(A) op(B) + beta C + bias)`, column-major: `op(A)` is `m x k`, `op(B)`
/// `k x n`, C and D (the same memory) `m x n` with leading dimensions `lda`, `ldb`, `ldc`;
/// the bias, when given, has `m` elements, one per row, broadcast over the columns. With
/// `batch > 1`, that many products at once (a strided batch, as
/// `cublasGemmStridedBatched`): product `i` reads A and B `i * stride_a` and `i *
/// stride_b` elements in and writes C `i * stride_c` elements in (a stride of 0 shares an
/// input; outputs may not overlap), the bias shared.
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
    /// Products computed at once (1: one; 0: none).
    pub batch: usize,
    /// Elements from one product's A to the next's.
    pub stride_a: usize,
    /// Elements from one product's B to the next's.
    pub stride_b: usize,
    /// Elements from one product's C to the next's: at least C's span, so that no two
    /// products write one element.
    pub stride_c: usize,
}

impl Default for Gemm {
    /// An empty product: no rows, columns or depth, `alpha = 1`, `beta = 0`, leading
    /// dimensions 1, no TF32, no activation, a batch of one. Meant for `..Gemm::default()`.
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
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
        }
    }
}

impl Gemm {
    /// Elements each operand spans, over the whole batch: `(a, b, c)`. An error when a
    /// leading dimension is smaller than its operand's rows (BLAS requires `ld >= max(1,
    /// rows)`), when C's stride is shorter than C (two products would write one element),
    /// or when a span in bytes overflows.
    ///
    /// ```
    /// use offload::Gemm;
    ///
    /// // Four 2 x 3 by 3 x 2 products, B shared, each C 2 x 2 after the one before.
    /// let g = Gemm { m: 2, n: 2, k: 3, lda: 2, ldb: 3, ldc: 2, batch: 4, stride_a: 6, stride_c: 4, ..Gemm::default() };
    /// assert_eq!(g.extents()?, (24, 6, 16));
    /// assert!(Gemm { stride_c: 3, ..g }.extents().is_err());
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn extents(&self) -> Result<(usize, usize, usize)> {
        let (a, b, c) = self.one_extents()?;
        if self.batch <= 1 {
            return Ok(if self.batch == 0 { (0, 0, 0) } else { (a, b, c) });
        }
        if self.stride_c < c {
            return Err(Error::InvalidArgument {
                routine: "gemm",
                what: format!(
                    "a batch whose C stride {} is shorter than C's {c} elements; expected at least {c}, so \
                     that no two products write one element",
                    self.stride_c
                ),
            });
        }
        let whole = |name: &str, stride: usize, span: usize| {
            stride
                .checked_mul(self.batch - 1)
                .and_then(|e| e.checked_add(span))
                .filter(|e| e.checked_mul(std::mem::size_of::<f32>()).is_some())
                .ok_or_else(|| Error::Overflow {
                    routine: "gemm",
                    what: format!("{name}: a batch of {} products {stride} elements apart", self.batch),
                })
        };
        Ok((whole("A", self.stride_a, a)?, whole("B", self.stride_b, b)?, whole("C", self.stride_c, c)?))
    }

    /// Elements each operand of one product spans: `(a, b, c)` ([`Gemm::extents`]).
    pub fn one_extents(&self) -> Result<(usize, usize, usize)> {
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
    /// GELU in its exact form, PyTorch's `nn.GELU()` default: `0.5 x (1 + erf(x / sqrt 2))`.
    /// No GEMM library fuses it, so [`crate::Device::gemm`] refuses it;
    /// `offload_kernels::linear` applies it in a pass of its own after the product.
    GeluExact,
}

impl Activation {
    /// The activation of `x`, in f32.
    ///
    /// ```
    /// use offload::Activation;
    /// assert_eq!(Activation::Relu.apply(-2.0), 0.0);
    /// assert!((Activation::Gelu.apply(1.0) - 0.841192).abs() < 1e-5);
    /// assert!((Activation::GeluExact.apply(1.0) - 0.841345).abs() < 1e-5);
    /// ```
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Self::Identity => x,
            Self::Relu => x.max(0.0),
            Self::Gelu => gelu_tanh(x),
            Self::GeluExact => 0.5 * x * (1.0 + crate::erf(x * std::f32::consts::FRAC_1_SQRT_2)),
        }
    }

    /// The activation of every element of `xs`, in place: a loop the compiler vectorises
    /// for all but [`Activation::GeluExact`] (host GEMM epilogues), 16 lanes wide where
    /// the CPU has AVX-512.
    pub fn apply_all(self, xs: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU runs AVX512F (checked above).
            return unsafe { self.apply_all_avx512(xs) };
        }
        self.apply_all_here(xs);
    }

    /// [`Activation::apply_all`] compiled for AVX-512 (the crate's own target may be
    /// baseline x86-64, whose vectors are 4 lanes wide).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn apply_all_avx512(self, xs: &mut [f32]) {
        self.apply_all_here(xs);
    }

    /// [`Activation::apply_all`] for the target the caller was compiled for.
    #[inline(always)]
    fn apply_all_here(self, xs: &mut [f32]) {
        match self {
            Self::Identity => {}
            Self::Relu => xs.iter_mut().for_each(|v| *v = v.max(0.0)),
            Self::Gelu => xs.iter_mut().for_each(|v| *v = gelu_tanh(*v)),
            Self::GeluExact => xs.iter_mut().for_each(|v| *v = self.apply(*v)),
        }
    }
}

/// GELU's tanh form, `0.5 x (1 + tanh(u))` with `u = sqrt(2 / pi) (x + 0.044715 x^3)`,
/// computed as `x / (1 + e^(-2u))` (the same function: `(1 + tanh u) / 2` is the logistic
/// of `2u`), which needs one [`exp_f32`] and no branch, and keeps its relative accuracy
/// where `1 + tanh u` would cancel (large negative `x`).
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp_f32(-2.0 * u))
}

/// `e^x` in f32 within 2 ulp, without a call or a branch so that loops over it vectorise
/// (libm's `expf` is a call per element): `x = n ln 2 + r` with `n` rounded to nearest by
/// the 1.5 * 2^23 trick, `e^r` by Cephes' polynomial on `|r| <= ln 2 / 2`, and `2^n` as two
/// powers of two built in the exponent bits (so that results near overflow and in the
/// subnormal range come out right). Inputs are clamped to [-104, 89], beyond which the
/// result is 0 or infinite anyway; NaN gives NaN.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const MAGIC: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-104.0, 89.0);
    let t = x * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    // n lies in [-150, 129]: 2^n as 2^n1 2^n2, each half a normal float (exponent field
    // n_i + 127).
    let n_int = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let n1 = n_int >> 1;
    let pow2 = |k: i32| f32::from_bits((k.wrapping_add(127) as u32) << 23);
    er * pow2(n1) * pow2(n_int - n1)
}

/// `v` rounded to bf16 as `half::bf16::from_f32` rounds it (to nearest, ties to even; a NaN
/// keeps its payload's high bits and is made quiet), without a branch, so that loops
/// rounding to bf16 vectorise (tested equal bit for bit in `macro_support`).
#[inline(always)]
pub(crate) fn bf16_from_f32(v: f32) -> half::bf16 {
    let x = v.to_bits();
    let rounded = (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((x >> 16) | 0x40) as u16;
    half::bf16::from_bits(if x & 0x7fff_ffff > 0x7f80_0000 { quiet_nan } else { rounded })
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
    /// The slice itself when the type is bf16 (which host devices may multiply as it is).
    fn as_bf16(s: &[Self]) -> Option<&[half::bf16]> {
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
        bf16_from_f32(v)
    }
    fn as_bf16(s: &[Self]) -> Option<&[half::bf16]> {
        Some(s)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `exp_f32` within 2 ulp of the exact value over its normal range, subnormal results
    /// and those near overflow right, 0 and infinity beyond, NaN for NaN; the tanh GELU through it within 8 ulp of the exact value (f64, in the logistic
    /// form, which does not cancel) from x = -3, and within 2e-5 relative down to -10 (the
    /// rounding of u, about 40 there, is amplified 2u times), under 1e-36 below.
    #[test]
    fn the_branch_free_exp_and_gelu_are_accurate() {
        let ulps = |got: f32, want: f64| {
            ((f64::from(got) - want) / f64::from(f32::EPSILON * want.abs() as f32)).abs()
        };
        let mut worst = 0f64;
        for i in 0..=400_000 {
            let x = -87.0 + 175.0 * i as f32 / 400_000.0;
            worst = worst.max(ulps(exp_f32(x), f64::from(x).exp()));
        }
        assert!(worst <= 2.0, "exp_f32: {worst} ulp");
        // Near overflow, and subnormal results (within one unit of the smallest
        // subnormal), then 0 and infinity beyond.
        for x in [88.0f32, 88.5, 88.72, -87.5, -95.0, -100.0, -103.0] {
            let (got, want) = (f64::from(exp_f32(x)), f64::from(x).exp());
            assert!(
                (got - want).abs() <= 2.0 * f64::from(f32::EPSILON) * want + 1.5e-45,
                "exp_f32({x}) = {got}"
            );
        }
        assert_eq!(exp_f32(-200.0), 0.0);
        assert!(exp_f32(88.8).is_infinite() && exp_f32(1000.0).is_infinite());
        assert!(exp_f32(f32::NAN).is_nan());
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -10.0 + 22.0 * i as f32 / 200_000.0;
            let v = f64::from(x);
            let want =
                v / (1.0 + (-2.0 * (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).exp());
            if x >= -3.0 && x != 0.0 {
                worst = worst.max(ulps(gelu_tanh(x), want));
            } else if x < -3.0 {
                assert!((f64::from(gelu_tanh(x)) - want).abs() <= 2e-5 * want.abs(), "gelu_tanh({x})");
            }
        }
        assert!(worst <= 8.0, "gelu_tanh: {worst} ulp");
        assert!(gelu_tanh(-30.0) <= 0.0 && gelu_tanh(-30.0) > -1e-36 && gelu_tanh(30.0) == 30.0);
    }

    /// The vectorised activations (AVX-512 where the CPU has it) equal the one-element
    /// form bit for bit, NaN and the clamps included, on lengths with a vector tail.
    #[test]
    fn activations_of_a_slice_equal_those_of_each_element() {
        let xs: Vec<f32> =
            (0..1003).map(|i| -100.0 + 0.2 * i as f32).chain([f32::NAN, -0.0, 0.0, 1e-40]).collect();
        for act in [Activation::Identity, Activation::Relu, Activation::Gelu, Activation::GeluExact] {
            let mut all = xs.clone();
            act.apply_all(&mut all);
            for (x, y) in xs.iter().zip(&all) {
                assert_eq!(act.apply(*x).to_bits(), y.to_bits(), "{act:?}({x})");
            }
        }
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
