//! The host backend's GEMM: [`crate::gemm::Gemm`] computed on a host device's kernel pool,
//! in the precisions a GPU computes it in (see `crate::gemm`).

use std::sync::Arc;

use super::host_avx512::{self, SKINNY};
use super::host_widened::WidenedOperands;
use crate::gemm::{round_to_tf32, Gemm, GemmElement};

/// Where a product finds f32 copies of its 16-bit operands: the device's kept copies and
/// the write stamps of A's and B's allocations when it was queued.
#[derive(Clone, Copy)]
pub(crate) struct Widening<'w> {
    pub(crate) kept: &'w WidenedOperands,
    pub(crate) stamps: [u64; 2],
}

/// The host's GEMM: `matrixmultiply`'s packed, vectorised f32 kernel, one block of C's
/// columns per task of `pool`, operands widened to f32 (or rounded to TF32) first when they
/// are not f32 already, the epilogue (bias, activation) on each block in f32, and one
/// rounding to `T` at the end; a batch's products as tasks of `pool` too. bf16 products
/// run on the CPU's bf16 dot products instead when `kernels.bf16_dot` and the CPU has them
/// (`host_avx512`). `a`, `b` and `c` span exactly what [`Gemm::extents`] says; `bias` has
/// `g.m` elements.
#[allow(clippy::too_many_arguments)]
pub(crate) fn host_gemm<T: GemmElement>(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[T],
    b: &[T],
    c: &mut [T],
    bias: Option<&[T]>,
    widening: Option<Widening<'_>>,
    kernels: CpuKernels,
) {
    use rayon::prelude::*;
    if g.batch <= 1 || g.m == 0 || g.n == 0 {
        return host_gemm_one(pool, g, a, b, c, bias, widening, kernels);
    }
    let Ok((ea, eb, ec)) = g.one_extents() else { unreachable!("the caller checked the extents") };
    let one = Gemm { batch: 1, ..*g };
    // `extents` made C's stride at least C's span: each product's C lies in its own chunk.
    pool.install(|| {
        c.par_chunks_mut(g.stride_c).take(g.batch).enumerate().for_each(|(i, c)| {
            let (a, b) = (&a[i * g.stride_a..i * g.stride_a + ea], &b[i * g.stride_b..i * g.stride_b + eb]);
            host_gemm_one(pool, &one, a, b, &mut c[..ec], bias, widening, kernels);
        })
    });
}

/// Which of the host's GEMM kernels a product may take: those on AVX-512 where the CPU has
/// it (`avx512`, always outside tests), and bf16 on its bf16 dot products (`bf16_dot`, the
/// runtime's setting) rather than widened to f32.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuKernels {
    pub(crate) avx512: bool,
    pub(crate) bf16_dot: bool,
}

/// An operand in f32: the caller's own, or a widened copy (kept or made for this product).
enum Wide<'a> {
    Same(&'a [f32]),
    Widened(Arc<Vec<f32>>),
}

impl std::ops::Deref for Wide<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            Wide::Same(x) => x,
            Wide::Widened(x) => x,
        }
    }
}

/// `x` in f32 (rounded to TF32 when `tf32`), made on `pool`.
fn widened<T: GemmElement>(pool: &rayon::ThreadPool, x: &[T], tf32: bool) -> Vec<f32> {
    use rayon::prelude::*;
    pool.install(|| {
        x.par_iter().map(|&v| if tf32 { round_to_tf32(v.to_f32()) } else { v.to_f32() }).collect()
    })
}

/// Operand `operand` (0 for A, 1 for B) in f32: itself when it is f32 already (and not
/// to be rounded to TF32), else a copy, kept across products where `widening` says.
fn wide<'x, T: GemmElement>(
    pool: &rayon::ThreadPool,
    tf32: bool,
    widening: Option<Widening<'_>>,
    x: &'x [T],
    operand: usize,
) -> Wide<'x> {
    match (T::as_f32(x), widening) {
        (Some(x), _) if !tf32 => Wide::Same(x),
        (_, Some(w)) => {
            Wide::Widened(
                w.kept.get(x.as_ptr() as u64, x.len(), tf32, w.stamps[operand], || widened(pool, x, tf32)),
            )
        }
        (_, None) => Wide::Widened(Arc::new(widened(pool, x, tf32))),
    }
}

/// [`host_gemm`] of one product.
#[allow(clippy::too_many_arguments)]
fn host_gemm_one<T: GemmElement>(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[T],
    b: &[T],
    c: &mut [T],
    bias: Option<&[T]>,
    widening: Option<Widening<'_>>,
    kernels: CpuKernels,
) {
    use rayon::prelude::*;
    if g.m == 0 || g.n == 0 || g.batch == 0 {
        return;
    }
    let bias: Option<Vec<f32>> = bias.map(|b| b.iter().map(|v| v.to_f32()).collect());
    let wide_operands = || (wide(pool, g.tf32, widening, a, 0), wide(pool, g.tf32, widening, b, 1));
    match T::as_f32_mut(c) {
        Some(c) => {
            let (a, b) = wide_operands();
            f32_gemm(pool, g, &a, &b, c, bias.as_deref(), kernels.avx512)
        }
        None => {
            // C in f32 (read only when beta is not 0), computed, then rounded back: only
            // the m rows of each column are C's.
            let mut wide: Vec<f32> = if g.beta == 0.0 {
                vec![0.0; c.len()]
            } else {
                pool.install(|| c.par_iter().map(|v| v.to_f32()).collect())
            };
            match (T::as_bf16(a), T::as_bf16(b)) {
                // bf16 values are TF32 values already: `g.tf32` changes nothing here.
                (Some(a), Some(b)) if kernels.avx512 && kernels.bf16_dot && host_avx512::supported() => {
                    host_avx512::gemm(pool, g, a, b, &mut wide, &column_epilogue(g, bias.as_deref()));
                }
                _ => {
                    let (a, b) = wide_operands();
                    f32_gemm(pool, g, &a, &b, &mut wide, bias.as_deref(), kernels.avx512);
                }
            }
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
#[allow(clippy::too_many_arguments)]
fn f32_gemm(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    bias: Option<&[f32]>,
    avx512: bool,
) {
    use rayon::prelude::*;
    // Strides of op(A) (m x k), op(B) (k x n) and C (m x n), column-major.
    let (rsa, csa) = if g.transa { (g.lda, 1) } else { (1, g.lda) };
    let (rsb, csb) = if g.transb { (g.ldb, 1) } else { (1, g.ldb) };
    let threads = pool.current_num_threads().max(1);
    let epilogue_of = column_epilogue(g, bias);
    if avx512 && host_avx512::skinny_f32_takes(g) {
        // A layer over a handful of rows (a decoding step), 16 lanes a step.
        return host_avx512::skinny_f32(pool, g, a, b, c, &epilogue_of);
    }
    if g.transa && !g.transb && g.n <= SKINNY && g.k > 0 {
        // A layer applied to a handful of rows (a decoding step): dot products reading
        // each weight row once, rather than packing every weight for a few columns.
        return f32_gemm_skinny(pool, g, a, b, c, bias);
    }
    if avx512 && host_avx512::layer_f32_takes(g) {
        // A layer over a batch of rows: B packed once, A's rows read in place.
        return host_avx512::layer_f32(pool, g, a, b, c, &epilogue_of);
    }
    if threads > 1 && g.m >= g.n && g.m >= 64 && g.k > 0 {
        // Each task packs its own part of one operand and all of the other: split the
        // longer side of C (a layer's outputs, against a batch's rows), so that the
        // operand packed whole by every task is the smaller.
        return f32_gemm_by_rows(pool, g, a, b, c, bias);
    }
    // Blocks of whole columns, about one per thread, at least 16 columns each.
    let cols = g.n.div_ceil(threads).max(16);
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
            for j in 0..n {
                epilogue(g, &mut out[j * g.ldc..j * g.ldc + g.m], bias);
            }
        })
    });
}

/// [`f32_gemm`] for `op(A) = A^T` (A's rows are C's rows' weights, contiguous), `op(B) = B`
/// and at most [`SKINNY`] columns of C (`g.k > 0`): each C element the dot product of a row
/// of A and a column of B, in blocks of C's rows over the pool, each row of A read once
/// for every column. A matrix-vector product is memory-bound: packing A for so few columns,
/// as a general kernel does, costs more than the arithmetic.
fn f32_gemm_skinny(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    bias: Option<&[f32]>,
) {
    use rayon::prelude::*;
    let rows = g.m.div_ceil(pool.current_num_threads().max(1) * 4).max(16);
    // Every block writes rows i0..i0 + m of each column, which no other block writes; the
    // blocks meet in C only through its address.
    let c_addr = c.as_mut_ptr() as usize;
    pool.install(|| {
        (0..g.m.div_ceil(rows)).into_par_iter().for_each(|block| {
            let i0 = block * rows;
            let m = rows.min(g.m - i0);
            for j in 0..g.n {
                let col = &b[j * g.ldb..j * g.ldb + g.k];
                // SAFETY: rows i0..i0+m of column j lie in `c` (`extents` bounds C's span) and
                // this block alone writes them.
                let out =
                    unsafe { std::slice::from_raw_parts_mut((c_addr as *mut f32).add(j * g.ldc + i0), m) };
                for (r, o) in out.iter_mut().enumerate() {
                    let row = &a[(i0 + r) * g.lda..(i0 + r) * g.lda + g.k];
                    let v = g.alpha * dot(row, col);
                    *o = if g.beta == 0.0 { v } else { v + g.beta * *o };
                }
                epilogue(g, out, bias.map(|b| &b[i0..i0 + m]));
            }
        })
    });
}

/// `x . y` over equal lengths, in eight running sums (lanes the compiler vectorises).
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xs, ys) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xs.remainder().iter().zip(ys.remainder()).map(|(a, b)| a * b).sum();
    for (xc, yc) in xs.zip(ys) {
        for l in 0..8 {
            acc[l] += xc[l] * yc[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// [`epilogue`] for a part of a column that starts at row `i0`, as the AVX-512 kernels
/// call it.
fn column_epilogue<'g>(g: &'g Gemm, bias: Option<&'g [f32]>) -> impl Fn(&mut [f32], usize) + Sync + 'g {
    move |col, i0| epilogue(g, col, bias.map(|b| &b[i0..i0 + col.len()]))
}

/// The bias (one per row of `col`) and the activation on a column (or part of one) of C.
fn epilogue(g: &Gemm, col: &mut [f32], bias: Option<&[f32]>) {
    if let Some(bias) = bias {
        col.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
    }
    g.activation.apply_all(col);
}

/// [`f32_gemm`] in blocks of C's rows, about one per thread and at least 32 rows each, for
/// products of few columns (`g.k > 0`): each block `op(A)`'s rows times all of `op(B)`.
fn f32_gemm_by_rows(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    bias: Option<&[f32]>,
) {
    use rayon::prelude::*;
    let (rsa, csa) = if g.transa { (g.lda, 1) } else { (1, g.lda) };
    let (rsb, csb) = if g.transb { (g.ldb, 1) } else { (1, g.ldb) };
    let rows = g.m.div_ceil(pool.current_num_threads().max(1)).max(32);
    // Every block writes rows i0..i0 + m of each column, which no other block writes; the
    // blocks meet in C only through raw pointers.
    let (a, b, c) = (a.as_ptr() as usize, b.as_ptr() as usize, c.as_mut_ptr() as usize);
    pool.install(|| {
        (0..g.m.div_ceil(rows)).into_par_iter().for_each(|block| {
            let i0 = block * rows;
            let m = rows.min(g.m - i0);
            let c = c as *mut f32;
            // SAFETY: `extents` bounds every element op(A), op(B) and C reach by these strides
            // (checked against the device's allocations by the caller); op(A)'s rows i0..i0+m
            // start i0 * rsa elements in and C's rows i0..i0+m of each column i0 elements
            // in, which this block alone writes.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    g.k,
                    g.n,
                    g.alpha,
                    (a as *const f32).add(i0 * rsa),
                    rsa as isize,
                    csa as isize,
                    b as *const f32,
                    rsb as isize,
                    csb as isize,
                    g.beta,
                    c.add(i0),
                    1,
                    g.ldc as isize,
                )
            }
            for j in 0..g.n {
                // SAFETY: this block's rows of column j, as above; nothing else holds them.
                let col = unsafe { std::slice::from_raw_parts_mut(c.add(j * g.ldc + i0), m) };
                epilogue(g, col, bias.map(|b| &b[i0..i0 + m]));
            }
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::Activation;
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
            Activation::GeluExact => unreachable!("Device::gemm refuses it"),
        }
    }

    /// Every shape, transposition, scalar pair and epilogue, in one element type, against
    /// f64; rows past `m` of each column of C untouched.
    fn agrees_on_every_shape<T: GemmElement>(tf32: bool, kernels: CpuKernels, tol: f64) {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        // Beside the general ones, the edges of the AVX-512 kernels: the layer kernel's
        // bands of 8 rows and blocks of 32 columns (up to 512), the bf16 panels' 32 rows and
        // 8 columns, k in pairs, the dot products' 32-element steps.
        let shapes = [
            (1, 1, 1),
            (7, 5, 3),
            (33, 70, 17),
            (64, 64, 64),
            (5, 100, 0),
            (130, 3, 41),
            (33, 9, 66),
            (64, 8, 100),
            (3, 2, 33),
            (13, 45, 32),
            (3, 600, 4),
        ];
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
                        ..Gemm::default()
                    };
                    let (ea, eb, ec) = g.extents().unwrap();
                    let mut gen =
                        |n: usize| (0..n).map(|_| T::from_f32(random(&mut seed))).collect::<Vec<T>>();
                    let (a, b, c0, bias) = (gen(ea), gen(eb), gen(ec), gen(m));
                    let bias = with_bias.then_some(&bias[..]);
                    let mut c = c0.clone();
                    host_gemm(&pool, &g, &a, &b, &mut c, bias, None, kernels);
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

    /// Every kernel: the AVX-512 ones (where the CPU has them) and the portable ones.
    const EVERY: [CpuKernels; 2] =
        [CpuKernels { avx512: true, bf16_dot: true }, CpuKernels { avx512: false, bf16_dot: false }];

    #[test]
    fn f32_agrees_with_a_reference_in_f64_on_every_shape() {
        for kernels in EVERY {
            agrees_on_every_shape::<f32>(false, kernels, 1e-6);
        }
    }

    #[test]
    fn tf32_agrees_within_its_rounding() {
        agrees_on_every_shape::<f32>(true, EVERY[0], 2e-3);
    }

    #[test]
    fn f16_and_bf16_agree_within_their_rounding() {
        for kernels in EVERY {
            agrees_on_every_shape::<f16>(false, kernels, 2e-3);
            agrees_on_every_shape::<bf16>(false, kernels, 1e-2);
        }
        // bf16 widened to f32 on the AVX-512 kernels.
        agrees_on_every_shape::<bf16>(false, CpuKernels { avx512: true, bf16_dot: false }, 1e-2);
    }
}
