//! Host GEMM kernels on AVX-512: f32 with FMAs, and bf16 with AVX512-BF16's dot products,
//! without widening either operand.
//!
//! A layer's product (`op(A)` a weight of `m` outputs, `op(B)` a batch of at most
//! [`LAYER_MAX_COLS`] rows, C their outputs) runs on the *layer kernel*: B, the smaller
//! operand, is packed once per product in blocks of 32 columns, and each 8 x 32 block of
//! C keeps 16 vectors of sums while A's rows are read in place, one element (or bf16 pair)
//! broadcast per row and step. `matrixmultiply`, which packs A as well on every call, ran
//! 45-101 GFLOP/s on one core on such shapes where this kernel runs 89-105
//! (docs/PERFORMANCE.md).
//!
//! `vdpbf16ps` adds to each of 16 f32 lanes the sum of two products of bf16 pairs, which
//! are exact in f32: twice the multiply-adds of an f32 FMA from half the bytes, and how
//! oneDNN computes PyTorch's bf16 on these CPUs. bf16 products keep f32 partial sums, as a
//! GPU's bf16 GEMM does, then scale by alpha and add beta C in f32 (the caller rounds to
//! bf16 once). As the instruction does, bf16 subnormal inputs count as zero and subnormal
//! partial sums are flushed to zero. bf16 products that are not a layer's (A not
//! transposed, `k` odd, many columns) run on a *panel kernel*: 32 rows of `op(A)` packed
//! as pairs along `k`, `op(B)`'s columns read as pairs, 32 x 8 blocks of C. Products of at
//! most [`SKINNY`] columns whose A rows are contiguous (a layer over a decoding step's
//! rows) are dot products, each weight row read once.

use half::bf16;

use crate::gemm::Gemm;

/// Rows of `op(A)` packed together: two vectors of 16 lanes.
const MR: usize = 32;
/// Columns of C a block computes at once.
const NR: usize = 8;
/// The most columns of C the dot-product path takes.
pub(crate) const SKINNY: usize = 8;
/// Rows of C a block of the layer kernel computes, each from a broadcast of A.
const LAYER_ROWS: usize = 8;
/// Columns of C a block of the layer kernel computes: two vectors of 16 lanes.
const LAYER_COLS: usize = 32;
/// The most columns of C the layer kernel takes: its packed B (`n x k`) is read again for
/// every 8 rows of C, so it must stay in the caches.
pub(crate) const LAYER_MAX_COLS: usize = 512;
/// The largest packed B a thread keeps between layer products (larger ones are freed).
const KEPT_PACKED_BYTES: usize = 4 << 20;

/// Whether this CPU runs `vdpbf16ps` (AVX512-BF16 with AVX512F and AVX512BW).
pub(crate) fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether [`layer_f32`] takes `g`: an AVX-512 CPU, f32 operands (not rounded to TF32),
/// more than [`SKINNY`] and at most [`LAYER_MAX_COLS`] columns.
pub(crate) fn layer_f32_takes(g: &Gemm) -> bool {
    #[cfg(target_arch = "x86_64")]
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    avx512 && !g.tf32 && g.n > SKINNY && g.n <= LAYER_MAX_COLS && g.m > 0 && g.k > 0
}

/// What follows the product on a part of one column of C (after the product, before
/// rounding): called with the part, rows `i0..i0 + len` of its column, and `i0` (the bias
/// and the activation depend on the row only).
pub(crate) type Epilogue<'e> = &'e (dyn Fn(&mut [f32], usize) + Sync);

/// Panics unless `a`, `b` and `c` span the elements `g` reaches (`Gemm::one_extents`): the
/// kernels read rows and columns through raw pointers from there on.
fn assert_spans(g: &Gemm, a: usize, b: usize, c: usize) {
    let fits = g.one_extents().is_ok_and(|(ea, eb, ec)| ea <= a && eb <= b && ec <= c);
    assert!(fits, "host_avx512: operands of {a}, {b} and {c} elements for {g:?}");
}

/// `c = alpha op(A) op(B) + beta c` in f32 (c not read when beta is 0), then `epilogue` on
/// each block of each column; `a`, `b` and `c` span what [`Gemm::one_extents`] says (the
/// caller checked), `g.batch` is ignored. Only where [`supported`] is true.
pub(crate) fn gemm(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[bf16],
    b: &[bf16],
    c: &mut [f32],
    epilogue: Epilogue<'_>,
) {
    assert!(supported(), "host_avx512::gemm without AVX512-BF16");
    assert_spans(g, a.len(), b.len(), c.len());
    if g.m == 0 || g.n == 0 {
        return;
    }
    if g.k == 0 {
        // op(A) op(B) is zero: C = beta C (not read when beta is 0, as BLAS says).
        for j in 0..g.n {
            let col = &mut c[j * g.ldc..j * g.ldc + g.m];
            col.iter_mut().for_each(|v| *v = if g.beta == 0.0 { 0.0 } else { g.beta * *v });
            epilogue(col, 0);
        }
        return;
    }
    if g.transa && !g.transb && g.n <= SKINNY {
        return skinny(pool, g, a, b, c, epilogue);
    }
    if g.transa && g.k.is_multiple_of(2) && g.n <= LAYER_MAX_COLS {
        return layer::<Bf16Pairs>(pool, g, a, b, c, epilogue);
    }
    general(pool, g, a, b, c, epilogue);
}

/// [`gemm`] in f32 on the layer kernel, where [`layer_f32_takes`] says.
pub(crate) fn layer_f32(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    epilogue: Epilogue<'_>,
) {
    assert!(layer_f32_takes(g), "host_avx512::layer_f32 on {g:?}");
    assert_spans(g, a.len(), b.len(), c.len());
    layer::<F32Lanes>(pool, g, a, b, c, epilogue);
}

/// What the layer kernel needs of an element type: how `op(B)` is packed (one step along
/// `k` per packed value) and the block itself.
trait LayerElement {
    type In: Copy + Sync;
    type Packed: Copy + Default + Send + Sync + 'static;
    /// Steps along `k`: its elements, or its pairs.
    fn steps(k: usize) -> usize;
    /// Column `j` of `op(B)` into `dst[p * LAYER_COLS]` for each step `p`.
    fn pack_column(g: &Gemm, b: &[Self::In], j: usize, dst: &mut [Self::Packed]);
    /// Columns `j0..j0 + cols` (`cols` at most [`LAYER_COLS`]) of `op(B)` into the block
    /// `dst` (`steps * LAYER_COLS` values), column `j0 + jj` at `dst[p * LAYER_COLS + jj]`.
    fn pack_block(g: &Gemm, b: &[Self::In], j0: usize, cols: usize, dst: &mut [Self::Packed]) {
        pack_columns::<Self>(g, b, j0, cols, dst)
    }
    /// The calling thread's packed B, kept between products.
    fn scratch() -> &'static std::thread::LocalKey<std::cell::RefCell<Vec<Self::Packed>>>;
    /// `out[r][jj] = sum over steps of A's row r times column jj` for one block.
    ///
    /// # Safety
    /// The CPU runs the kernel's instructions; `rows[r]` points at row r of `op(A)`, whose
    /// `steps` steps (elements `rows[r] + p * a_step`, or pairs there) are readable;
    /// `packed` holds `steps * LAYER_COLS` values.
    unsafe fn block(
        steps: usize,
        rows: &[*const Self::In; LAYER_ROWS],
        a_step: usize,
        packed: &[Self::Packed],
        out: &mut [[f32; LAYER_COLS]; LAYER_ROWS],
    );
}

/// [`LayerElement::pack_block`] column by column.
fn pack_columns<E: LayerElement + ?Sized>(
    g: &Gemm,
    b: &[E::In],
    j0: usize,
    cols: usize,
    dst: &mut [E::Packed],
) {
    for jj in 0..cols {
        E::pack_column(g, b, j0 + jj, &mut dst[jj..]);
    }
}

/// f32: a step is one element; A may be transposed or not (`a_step` apart).
struct F32Lanes;
/// bf16: a step is a pair along `k` (A transposed, `k` even).
struct Bf16Pairs;

thread_local! {
    static F32_PACKED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    static PAIRS_PACKED: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl LayerElement for F32Lanes {
    type In = f32;
    type Packed = f32;
    fn steps(k: usize) -> usize {
        k
    }
    fn scratch() -> &'static std::thread::LocalKey<std::cell::RefCell<Vec<f32>>> {
        &F32_PACKED
    }
    fn pack_block(g: &Gemm, b: &[f32], j0: usize, cols: usize, dst: &mut [f32]) {
        // Whole blocks of contiguous columns: 8 x 8 tiles transposed in registers.
        if !g.transb && cols == LAYER_COLS && g.k >= 8 {
            assert!((j0 + cols - 1) * g.ldb + g.k <= b.len() && dst.len() >= g.k * LAYER_COLS);
            // SAFETY: the CPU has AVX512F (the callers checked); columns j0..j0 + 32 of B
            // hold k elements each in `b`, `dst` holds k steps of 32 (asserted).
            unsafe { x86::pack_f32_columns(b.as_ptr().add(j0 * g.ldb), g.ldb, g.k, dst.as_mut_ptr()) };
            return;
        }
        pack_columns::<Self>(g, b, j0, cols, dst)
    }
    fn pack_column(g: &Gemm, b: &[f32], j: usize, dst: &mut [f32]) {
        if g.transb {
            for (p, d) in dst.iter_mut().step_by(LAYER_COLS).take(g.k).enumerate() {
                *d = b[j + p * g.ldb];
            }
        } else {
            let col = &b[j * g.ldb..j * g.ldb + g.k];
            dst.iter_mut().step_by(LAYER_COLS).zip(col).for_each(|(d, &v)| *d = v);
        }
    }
    unsafe fn block(
        steps: usize,
        rows: &[*const f32; LAYER_ROWS],
        a_step: usize,
        packed: &[f32],
        out: &mut [[f32; LAYER_COLS]; LAYER_ROWS],
    ) {
        // SAFETY: the caller's contract.
        unsafe { x86::f32_block(steps, rows, a_step, packed, out) }
    }
}

impl LayerElement for Bf16Pairs {
    type In = bf16;
    type Packed = u32;
    fn steps(k: usize) -> usize {
        k / 2
    }
    fn scratch() -> &'static std::thread::LocalKey<std::cell::RefCell<Vec<u32>>> {
        &PAIRS_PACKED
    }
    fn pack_column(g: &Gemm, b: &[bf16], j: usize, dst: &mut [u32]) {
        let at = |p: usize| u32::from(if g.transb { b[j + p * g.ldb] } else { b[p + j * g.ldb] }.to_bits());
        for (p, d) in dst.iter_mut().step_by(LAYER_COLS).take(g.k / 2).enumerate() {
            *d = at(2 * p) | at(2 * p + 1) << 16;
        }
    }
    unsafe fn block(
        steps: usize,
        rows: &[*const bf16; LAYER_ROWS],
        _a_step: usize,
        packed: &[u32],
        out: &mut [[f32; LAYER_COLS]; LAYER_ROWS],
    ) {
        // SAFETY: the caller's contract.
        unsafe { x86::bf16_block(steps, rows, packed, out) }
    }
}

/// The layer kernel: `op(B)` packed in blocks of [`LAYER_COLS`] columns (on the pool),
/// then tasks of consecutive bands of [`LAYER_ROWS`] rows of C, each block against each
/// band in turn, and the epilogue on each task's rows of each column.
fn layer<E: LayerElement>(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[E::In],
    b: &[E::In],
    c: &mut [f32],
    epilogue: Epilogue<'_>,
) {
    use rayon::prelude::*;
    let steps = E::steps(g.k);
    let blocks = g.n.div_ceil(LAYER_COLS);
    let block_len = steps * LAYER_COLS;
    // The packed B of the calling thread's last product, reused (no allocation, no page
    // faults, no zeroing): its columns past `n` in the last block keep what they held,
    // and their sums are never stored.
    let mut packed = E::scratch().with(|s| s.take());
    packed.resize(blocks * block_len, E::Packed::default());
    pool.install(|| {
        packed[..blocks * block_len].par_chunks_mut(block_len).enumerate().for_each(|(blk, dst)| {
            E::pack_block(g, b, blk * LAYER_COLS, LAYER_COLS.min(g.n - blk * LAYER_COLS), dst)
        })
    });
    // Where row i of op(A) starts, and how far apart its steps are.
    let (row_stride, a_step) = if g.transa { (g.lda, 1) } else { (1, g.lda) };
    let bands = g.m.div_ceil(LAYER_ROWS);
    let per_task = bands.div_ceil(pool.current_num_threads().max(1) * 4).max(1);
    // Tasks write disjoint rows of C and meet in it only through its address.
    let (c_addr, c_len) = (c.as_mut_ptr() as usize, c.len());
    pool.install(|| {
        (0..bands.div_ceil(per_task)).into_par_iter().for_each(|task| {
            let first = task * per_task * LAYER_ROWS;
            let last = ((task + 1) * per_task * LAYER_ROWS).min(g.m);
            let mut out = [[0f32; LAYER_COLS]; LAYER_ROWS];
            // Each block of B once, the task's rows of A against it (A's rows stay in the
            // caches across blocks, B's block across bands).
            for blk in 0..blocks {
                let j0 = blk * LAYER_COLS;
                let cols = LAYER_COLS.min(g.n - j0);
                for i0 in (first..last).step_by(LAYER_ROWS) {
                    let rows = LAYER_ROWS.min(g.m - i0);
                    // Rows past m repeat the last one; their sums are not stored.
                    let row_ptrs: [*const E::In; LAYER_ROWS] =
                        std::array::from_fn(|r| a[(i0 + r.min(rows - 1)) * row_stride..].as_ptr());
                    // SAFETY: the CPU runs the kernel (checked by the callers); each row
                    // pointer starts a row i < m of op(A), whose steps lie in `a`
                    // (`extents`: element (i, p) at i * row_stride + p * a_step); the
                    // block's packed columns are `block_len` values.
                    unsafe {
                        E::block(
                            steps,
                            &row_ptrs,
                            a_step,
                            &packed[blk * block_len..(blk + 1) * block_len],
                            &mut out,
                        )
                    };
                    assert!((j0 + cols - 1) * g.ldc + i0 + rows <= c_len);
                    if rows == LAYER_ROWS && cols == LAYER_COLS {
                        // SAFETY: the CPU has AVX512F (the callers checked); rows i0..i0 + 8
                        // of columns j0..j0 + 32 of C are inside `c` (asserted), this
                        // task's, no reference to them alive.
                        unsafe {
                            let at = (c_addr as *mut f32).add(j0 * g.ldc + i0);
                            x86::store_columns(&out, at, g.ldc, g.alpha, g.beta)
                        }
                        continue;
                    }
                    for (jj, j) in (j0..j0 + cols).enumerate() {
                        for (r, sums) in out.iter().take(rows).enumerate() {
                            // SAFETY: element (i0 + r, j) of C, inside `c` (asserted), of
                            // this task's rows, no reference to it alive.
                            let v = unsafe { &mut *(c_addr as *mut f32).add(j * g.ldc + i0 + r) };
                            let s = g.alpha * sums[jj];
                            *v = if g.beta == 0.0 { s } else { s + g.beta * *v };
                        }
                    }
                }
            }
            for j in 0..g.n {
                let start = j * g.ldc + first;
                assert!(start + (last - first) <= c_len);
                // SAFETY: rows first..last of column j, inside `c` (asserted), this task's
                // alone, no other reference to them alive.
                let col =
                    unsafe { std::slice::from_raw_parts_mut((c_addr as *mut f32).add(start), last - first) };
                epilogue(col, first);
            }
        })
    });
    // Kept for the next product unless large (a thread keeps at most this much).
    if std::mem::size_of_val(packed.as_slice()) <= KEPT_PACKED_BYTES {
        E::scratch().with(|s| s.replace(packed));
    }
}

/// `op(A)`'s element `(i, p)`.
fn at(g: &Gemm, a: &[bf16], i: usize, p: usize) -> bf16 {
    if g.transa {
        a[p + i * g.lda]
    } else {
        a[i + p * g.lda]
    }
}

/// Rows `i0..i0 + rows` (`rows <= MR`) of `op(A)` as `k.div_ceil(2)` groups of [`MR`]
/// pairs (`panel[p * MR + r]`: elements `2p` and `2p + 1` of row `r`, low half first), rows
/// past `rows` and an odd `k`'s last high half zero.
fn pack_panel(g: &Gemm, a: &[bf16], i0: usize, rows: usize, panel: &mut Vec<u32>) {
    let pairs = g.k.div_ceil(2);
    panel.clear();
    panel.resize(pairs * MR, 0);
    let bits = |v: bf16| u32::from(v.to_bits());
    for r in 0..rows {
        let i = i0 + r;
        if g.transa {
            // Row i is contiguous: read it as pairs.
            let row = &a[i * g.lda..i * g.lda + g.k];
            for (p, pair) in row.chunks_exact(2).enumerate() {
                panel[p * MR + r] = bits(pair[0]) | bits(pair[1]) << 16;
            }
            if g.k % 2 == 1 {
                panel[(pairs - 1) * MR + r] = bits(row[g.k - 1]);
            }
        } else {
            for p in 0..pairs {
                let hi = if 2 * p + 1 < g.k { bits(at(g, a, i, 2 * p + 1)) } else { 0 };
                panel[p * MR + r] = bits(at(g, a, i, 2 * p)) | hi << 16;
            }
        }
    }
}

/// `op(B)`'s columns where the kernels read them: in place when each is contiguous and of
/// even length, else a copy of `n` columns of `k` rounded up to even (zero past `k`).
enum Columns<'b> {
    InPlace(&'b [bf16], usize),
    Packed(Vec<bf16>, usize),
}

impl Columns<'_> {
    fn new<'b>(pool: &rayon::ThreadPool, g: &Gemm, b: &'b [bf16]) -> Columns<'b> {
        use rayon::prelude::*;
        if !g.transb && g.k.is_multiple_of(2) {
            return Columns::InPlace(b, g.ldb);
        }
        let ld = g.k.next_multiple_of(2);
        let mut packed = vec![bf16::ZERO; ld * g.n];
        pool.install(|| {
            packed.par_chunks_mut(ld).enumerate().for_each(|(j, col)| {
                for (p, v) in col[..g.k].iter_mut().enumerate() {
                    *v = if g.transb { b[j + p * g.ldb] } else { b[p + j * g.ldb] };
                }
            })
        });
        Columns::Packed(packed, ld)
    }

    /// The columns and their leading dimension (at least `k` rounded up to even).
    fn slice(&self) -> (&[bf16], usize) {
        match self {
            Columns::InPlace(b, ld) => (b, *ld),
            Columns::Packed(b, ld) => (b, *ld),
        }
    }
}

/// The general product: tasks of whole [`MR`]-row panels of C (each packs its own), split
/// along C's columns too when there are too few panels for the pool.
fn general(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[bf16],
    b: &[bf16],
    c: &mut [f32],
    epilogue: Epilogue<'_>,
) {
    use rayon::prelude::*;
    let columns = Columns::new(pool, g, b);
    let (b, ldb) = columns.slice();
    let tasks = pool.current_num_threads().max(1) * 4;
    let panels = g.m.div_ceil(MR);
    let col_blocks = tasks.div_ceil(panels).clamp(1, g.n.div_ceil(NR));
    let cols = g.n.div_ceil(col_blocks).next_multiple_of(NR);
    let col_blocks = g.n.div_ceil(cols);
    let panels_per_task = if col_blocks == 1 { panels.div_ceil(tasks) } else { 1 };
    let row_tasks = panels.div_ceil(panels_per_task);
    // Tasks write disjoint blocks of C (their rows of their columns) and meet in it only
    // through its address.
    let c_addr = c.as_mut_ptr() as usize;
    let c_len = c.len();
    pool.install(|| {
        (0..row_tasks * col_blocks).into_par_iter().for_each(|task| {
            let (rt, cb) = (task / col_blocks, task % col_blocks);
            let (j0, j1) = (cb * cols, ((cb + 1) * cols).min(g.n));
            let mut panel = Vec::new();
            for pi in rt * panels_per_task..((rt + 1) * panels_per_task).min(panels) {
                let i0 = pi * MR;
                let rows = MR.min(g.m - i0);
                pack_panel(g, a, i0, rows, &mut panel);
                let mut j = j0;
                while j < j1 {
                    let nr = NR.min(j1 - j);
                    assert!((j + nr - 1) * g.ldc + i0 + rows <= c_len);
                    // SAFETY: `vdpbf16ps` is supported (checked by `gemm`); `block` asserts
                    // that the panel and columns j..j+nr of `b` (k rounded up to even
                    // elements each, `ldb` apart) are inside their slices; rows i0..i0+rows
                    // of columns j..j+nr of C lie in `c` (asserted) and only this task
                    // writes them.
                    unsafe {
                        x86::block(
                            nr,
                            g.k.div_ceil(2),
                            &panel,
                            &b[j * ldb..],
                            ldb,
                            (c_addr as *mut f32).add(j * g.ldc + i0),
                            g.ldc,
                            rows,
                            g.alpha,
                            g.beta,
                        )
                    };
                    j += nr;
                }
                for j in j0..j1 {
                    let start = j * g.ldc + i0;
                    assert!(start + rows <= c_len);
                    // SAFETY: rows i0..i0+rows of column j, inside `c` (asserted), written
                    // only by this task, no other reference to them alive.
                    let col =
                        unsafe { std::slice::from_raw_parts_mut((c_addr as *mut f32).add(start), rows) };
                    epilogue(col, i0);
                }
            }
        })
    });
}

/// Elements the dot-product path multiplies.
trait DotElement: Copy + Sync {
    /// `sums[j] = row . column j` for `n` (at most [`SKINNY`]) columns of `b`, each
    /// `row.len()` elements from `j * ldb`.
    ///
    /// # Safety
    /// The CPU runs the instructions of the element's kernel (AVX512F; AVX512BW and
    /// AVX512-BF16 too for bf16).
    unsafe fn dots(row: &[Self], b: &[Self], ldb: usize, n: usize, sums: &mut [f32; SKINNY]);
}

impl DotElement for f32 {
    unsafe fn dots(row: &[f32], b: &[f32], ldb: usize, n: usize, sums: &mut [f32; SKINNY]) {
        // SAFETY: the caller's contract.
        unsafe { x86::dots_f32(row, b, ldb, n, sums) }
    }
}

impl DotElement for bf16 {
    unsafe fn dots(row: &[bf16], b: &[bf16], ldb: usize, n: usize, sums: &mut [f32; SKINNY]) {
        // SAFETY: the caller's contract.
        unsafe { x86::dots(row, b, ldb, n, sums) }
    }
}

/// Whether [`skinny_f32`] takes `g`: an AVX-512 CPU, f32 operands (not rounded to TF32),
/// `op(A) = A^T`, `op(B) = B`, at most [`SKINNY`] columns.
pub(crate) fn skinny_f32_takes(g: &Gemm) -> bool {
    #[cfg(target_arch = "x86_64")]
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    avx512 && !g.tf32 && g.transa && !g.transb && g.n <= SKINNY && g.m > 0 && g.n > 0 && g.k > 0
}

/// [`gemm`] in f32 as dot products, where [`skinny_f32_takes`] says.
pub(crate) fn skinny_f32(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    epilogue: Epilogue<'_>,
) {
    assert!(skinny_f32_takes(g), "host_avx512::skinny_f32 on {g:?}");
    assert_spans(g, a.len(), b.len(), c.len());
    skinny(pool, g, a, b, c, epilogue);
}

/// `op(A) = A^T` (contiguous rows), `op(B) = B` and at most [`SKINNY`] columns: each
/// element a dot product, blocks of C's rows over the pool.
fn skinny<E: DotElement>(
    pool: &rayon::ThreadPool,
    g: &Gemm,
    a: &[E],
    b: &[E],
    c: &mut [f32],
    epilogue: Epilogue<'_>,
) {
    use rayon::prelude::*;
    let rows = g.m.div_ceil(pool.current_num_threads().max(1) * 4).max(16);
    let c_addr = c.as_mut_ptr() as usize;
    let c_len = c.len();
    pool.install(|| {
        (0..g.m.div_ceil(rows)).into_par_iter().for_each(|block| {
            let i0 = block * rows;
            let m = rows.min(g.m - i0);
            for i in i0..i0 + m {
                let row = &a[i * g.lda..i * g.lda + g.k];
                let mut sums = [0f32; SKINNY];
                // SAFETY: the CPU runs the kernel (checked by the callers); the row has k
                // elements and each of the n <= SKINNY columns k from j * ldb (`extents`).
                unsafe { E::dots(row, b, g.ldb, g.n, &mut sums) };
                for (j, s) in sums[..g.n].iter().enumerate() {
                    let at = j * g.ldc + i;
                    assert!(at < c_len);
                    // SAFETY: element (i, j) of C, inside `c` (asserted), written only by
                    // this block, which holds no reference to it.
                    let out = unsafe { &mut *(c_addr as *mut f32).add(at) };
                    *out = if g.beta == 0.0 { g.alpha * s } else { g.alpha * s + g.beta * *out };
                }
            }
            for j in 0..g.n {
                let start = j * g.ldc + i0;
                assert!(start + m <= c_len);
                // SAFETY: rows i0..i0+m of column j, inside `c` (asserted), this block's alone.
                let col = unsafe { std::slice::from_raw_parts_mut((c_addr as *mut f32).add(start), m) };
                epilogue(col, i0);
            }
        })
    });
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `$f::<N>($args)` for the run-time column count `$n` (1 to 8; anything else runs nothing).
    macro_rules! for_columns {
        ($n:expr, $f:ident($($args:expr),*)) => {
            match $n {
                1 => $f::<1>($($args),*),
                2 => $f::<2>($($args),*),
                3 => $f::<3>($($args),*),
                4 => $f::<4>($($args),*),
                5 => $f::<5>($($args),*),
                6 => $f::<6>($($args),*),
                7 => $f::<7>($($args),*),
                8 => $f::<8>($($args),*),
                _ => {}
            }
        };
    }

    use half::bf16;

    use super::{LAYER_COLS, LAYER_ROWS, MR, NR, SKINNY};

    /// `nr` (1 to [`NR`]) columns of a block of C from a packed panel: see [`tile`].
    ///
    /// # Safety
    /// As [`tile`].
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn block(
        nr: usize,
        pairs: usize,
        panel: &[u32],
        b: &[bf16],
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        rows: usize,
        alpha: f32,
        beta: f32,
    ) {
        assert!((1..=NR).contains(&nr) && panel.len() >= pairs * MR && (nr - 1) * ldb + 2 * pairs <= b.len());
        // SAFETY: the caller's contract, the sizes asserted above.
        unsafe { for_columns!(nr, tile(pairs, panel.as_ptr(), b.as_ptr(), ldb, c, ldc, rows, alpha, beta)) }
    }

    /// Reinterprets 32 bf16 (16 pairs) as the instruction's operand type.
    #[inline(always)]
    fn as_pairs(v: __m512i) -> __m512bh {
        // SAFETY: both are 64 bytes of plain bits.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// Rows `0..rows` (at most [`MR`]) of `N` columns of C, 32 rows in two vectors per
    /// column: `c = alpha (panel . columns) + beta c` over `pairs` pairs along k.
    ///
    /// # Safety
    /// The CPU runs AVX512F, AVX512BW and AVX512-BF16; `panel` holds `pairs * MR` pairs;
    /// column `j < N` of `b` holds `2 * pairs` elements from `j * ldb` (readable as
    /// unaligned 4-byte pairs); rows `0..rows` of columns `0..N` of C (`c`, `ldc`) are
    /// writable and no reference to them is alive.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const N: usize>(
        pairs: usize,
        panel: *const u32,
        b: *const bf16,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        rows: usize,
        alpha: f32,
        beta: f32,
    ) {
        let mut lo = [_mm512_setzero_ps(); N];
        let mut hi = [_mm512_setzero_ps(); N];
        for p in 0..pairs {
            // SAFETY: pair group p of the panel and pair p of each column (the contract).
            unsafe {
                let a_lo = as_pairs(_mm512_loadu_si512(panel.add(p * MR).cast()));
                let a_hi = as_pairs(_mm512_loadu_si512(panel.add(p * MR + 16).cast()));
                for j in 0..N {
                    let pair = b.add(j * ldb + 2 * p).cast::<i32>().read_unaligned();
                    let bj = as_pairs(_mm512_set1_epi32(pair));
                    lo[j] = _mm512_dpbf16_ps(lo[j], a_lo, bj);
                    hi[j] = _mm512_dpbf16_ps(hi[j], a_hi, bj);
                }
            }
        }
        let (alpha, beta_v) = (_mm512_set1_ps(alpha), _mm512_set1_ps(beta));
        let mask = |from: usize| -> __mmask16 {
            let n = rows.saturating_sub(from).min(16);
            ((1u32 << n) - 1) as __mmask16
        };
        for j in 0..N {
            for (half, acc) in [(0, lo[j]), (16, hi[j])] {
                let m = mask(half);
                if m == 0 {
                    continue;
                }
                // SAFETY: row `half` of column j is among rows 0..rows (m is not 0); the
                // masked lanes past `rows` are neither read nor written.
                unsafe {
                    let at = c.add(j * ldc + half);
                    let mut v = _mm512_mul_ps(alpha, acc);
                    if beta != 0.0 {
                        v = _mm512_fmadd_ps(beta_v, _mm512_maskz_loadu_ps(m, at), v);
                    }
                    _mm512_mask_storeu_ps(at, m, v);
                }
            }
        }
    }

    /// Transposes eight vectors of eight: `r[i][j]` becomes `r[j][i]`.
    #[target_feature(enable = "avx512f")]
    fn transpose8(r: &mut [__m256; 8]) {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        r[0] = _mm256_permute2f128_ps::<0x20>(u0, u4);
        r[1] = _mm256_permute2f128_ps::<0x20>(u1, u5);
        r[2] = _mm256_permute2f128_ps::<0x20>(u2, u6);
        r[3] = _mm256_permute2f128_ps::<0x20>(u3, u7);
        r[4] = _mm256_permute2f128_ps::<0x31>(u0, u4);
        r[5] = _mm256_permute2f128_ps::<0x31>(u1, u5);
        r[6] = _mm256_permute2f128_ps::<0x31>(u2, u6);
        r[7] = _mm256_permute2f128_ps::<0x31>(u3, u7);
    }

    /// A whole layer block of sums (8 rows of C by 32 columns) into column-major C at `c`
    /// (row `r` of column `j` at `c + j * ldc + r`): `alpha s`, plus `beta c` where beta is
    /// not 0, rounded as the scalar store rounds (a product, then a sum).
    ///
    /// # Safety
    /// The CPU runs AVX512F; rows 0..8 of columns 0..32 from `c` are writable (readable
    /// too where beta is not 0) and no reference to them is alive.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn store_columns(
        out: &[[f32; LAYER_COLS]; LAYER_ROWS],
        c: *mut f32,
        ldc: usize,
        alpha: f32,
        beta: f32,
    ) {
        let (alpha, beta_v) = (_mm256_set1_ps(alpha), _mm256_set1_ps(beta));
        for q in 0..LAYER_COLS / 8 {
            // SAFETY: 8 floats of each of `out`'s rows, from column 8q.
            let mut r: [__m256; 8] =
                std::array::from_fn(|i| unsafe { _mm256_loadu_ps(out[i][8 * q..].as_ptr()) });
            transpose8(&mut r);
            for (jj, v) in r.iter().enumerate() {
                // SAFETY: rows 0..8 of column 8q + jj (the contract).
                unsafe {
                    let at = c.add((8 * q + jj) * ldc);
                    let mut v = _mm256_mul_ps(alpha, *v);
                    if beta != 0.0 {
                        v = _mm256_add_ps(v, _mm256_mul_ps(beta_v, _mm256_loadu_ps(at)));
                    }
                    _mm256_storeu_ps(at, v);
                }
            }
        }
    }

    /// Packs 32 columns of `k` contiguous f32 each (column `jj` from `b + jj * ldb`) into
    /// `dst`, step `p` of column `jj` at `dst[p * 32 + jj]`: 8 x 8 tiles transposed in
    /// registers, the last `k % 8` steps one by one.
    ///
    /// # Safety
    /// The CPU runs AVX512F; `k` elements from `b + jj * ldb` are readable for each
    /// `jj < 32`, `k * 32` from `dst` writable, and no reference to them is alive.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pack_f32_columns(b: *const f32, ldb: usize, k: usize, dst: *mut f32) {
        for p0 in (0..k - k % 8).step_by(8) {
            for q in 0..LAYER_COLS / 8 {
                // SAFETY: steps p0..p0 + 8 of columns 8q..8q + 8, and their places in
                // `dst` (the contract).
                unsafe {
                    let mut r: [__m256; 8] =
                        std::array::from_fn(|i| _mm256_loadu_ps(b.add((8 * q + i) * ldb + p0)));
                    transpose8(&mut r);
                    for (i, v) in r.iter().enumerate() {
                        _mm256_storeu_ps(dst.add((p0 + i) * LAYER_COLS + 8 * q), *v);
                    }
                }
            }
        }
        for p in k - k % 8..k {
            for jj in 0..LAYER_COLS {
                // SAFETY: step p of column jj, and its place (the contract).
                unsafe { *dst.add(p * LAYER_COLS + jj) = *b.add(jj * ldb + p) };
            }
        }
    }

    /// A layer block's sums, two vectors per row, into `out`.
    #[target_feature(enable = "avx512f")]
    fn store_rows(acc: &[[__m512; 2]; LAYER_ROWS], out: &mut [[f32; LAYER_COLS]; LAYER_ROWS]) {
        for (out, acc) in out.iter_mut().zip(acc) {
            let (lo, hi) = out.split_at_mut(16);
            // SAFETY: 16 floats of each half of `out`'s row.
            unsafe {
                _mm512_storeu_ps(lo.as_mut_ptr(), acc[0]);
                _mm512_storeu_ps(hi.as_mut_ptr(), acc[1]);
            }
        }
    }

    /// [`super::LayerElement::block`] in f32: 16 vectors of sums, two per row.
    ///
    /// # Safety
    /// As [`super::LayerElement::block`], on a CPU with AVX512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn f32_block(
        steps: usize,
        rows: &[*const f32; LAYER_ROWS],
        a_step: usize,
        packed: &[f32],
        out: &mut [[f32; LAYER_COLS]; LAYER_ROWS],
    ) {
        assert!(packed.len() >= steps * LAYER_COLS);
        let mut acc = [[_mm512_setzero_ps(); 2]; LAYER_ROWS];
        for p in 0..steps {
            // SAFETY: step p of the packed block (asserted) and of each row (the contract).
            unsafe {
                let b0 = _mm512_loadu_ps(packed.as_ptr().add(p * LAYER_COLS));
                let b1 = _mm512_loadu_ps(packed.as_ptr().add(p * LAYER_COLS + 16));
                for (acc, row) in acc.iter_mut().zip(rows) {
                    let a = _mm512_set1_ps(*row.add(p * a_step));
                    acc[0] = _mm512_fmadd_ps(a, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(a, b1, acc[1]);
                }
            }
        }
        store_rows(&acc, out);
    }

    /// [`super::LayerElement::block`] in bf16 pairs.
    ///
    /// # Safety
    /// As [`super::LayerElement::block`], on a CPU with AVX512F and AVX512-BF16; each row's
    /// pairs are contiguous.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn bf16_block(
        steps: usize,
        rows: &[*const bf16; LAYER_ROWS],
        packed: &[u32],
        out: &mut [[f32; LAYER_COLS]; LAYER_ROWS],
    ) {
        assert!(packed.len() >= steps * LAYER_COLS);
        let mut acc = [[_mm512_setzero_ps(); 2]; LAYER_ROWS];
        for p in 0..steps {
            // SAFETY: step p of the packed block (asserted) and pair p of each row (the
            // contract), read as an unaligned 4-byte pair.
            unsafe {
                let b0 = as_pairs(_mm512_loadu_si512(packed.as_ptr().add(p * LAYER_COLS).cast()));
                let b1 = as_pairs(_mm512_loadu_si512(packed.as_ptr().add(p * LAYER_COLS + 16).cast()));
                for (acc, row) in acc.iter_mut().zip(rows) {
                    let a = as_pairs(_mm512_set1_epi32(row.add(2 * p).cast::<i32>().read_unaligned()));
                    acc[0] = _mm512_dpbf16_ps(acc[0], a, b0);
                    acc[1] = _mm512_dpbf16_ps(acc[1], a, b1);
                }
            }
        }
        store_rows(&acc, out);
    }

    /// `sums[j] = row . column j` for `n` (at most [`SKINNY`]) columns of `b`, each `row.len()`
    /// elements from `j * ldb`.
    ///
    /// # Safety
    /// The CPU runs AVX512F, AVX512BW and AVX512-BF16; column `j < n` lies in `b`.
    pub(super) unsafe fn dots(row: &[bf16], b: &[bf16], ldb: usize, n: usize, sums: &mut [f32; SKINNY]) {
        assert!(n <= SKINNY && (n == 0 || (n - 1) * ldb + row.len() <= b.len()));
        // SAFETY: the contract and the sizes asserted above.
        unsafe { for_columns!(n, dots_n(row, b.as_ptr(), ldb, sums)) }
    }

    /// `sums[j] = row . column j` in f32 for `n` (at most [`SKINNY`]) columns of `b`.
    ///
    /// # Safety
    /// The CPU runs AVX512F; column `j < n` lies in `b`.
    pub(super) unsafe fn dots_f32(row: &[f32], b: &[f32], ldb: usize, n: usize, sums: &mut [f32; SKINNY]) {
        assert!(n <= SKINNY && (n == 0 || (n - 1) * ldb + row.len() <= b.len()));
        // SAFETY: the contract and the sizes asserted above.
        unsafe { for_columns!(n, dots_f32_n(row, b.as_ptr(), ldb, sums)) }
    }

    /// [`dots_f32`] for `N` columns: 16 elements a step, the last step's past the row
    /// masked off.
    ///
    /// # Safety
    /// As [`dots_f32`], `N` columns.
    #[target_feature(enable = "avx512f")]
    unsafe fn dots_f32_n<const N: usize>(row: &[f32], b: *const f32, ldb: usize, sums: &mut [f32; SKINNY]) {
        let k = row.len();
        let mut acc = [_mm512_setzero_ps(); N];
        let mut p = 0;
        while p < k {
            let left = k - p;
            let m: __mmask16 = if left >= 16 { !0 } else { ((1u32 << left) - 1) as __mmask16 };
            // SAFETY: elements p..p+min(16, left) of the row and of each column (the
            // contract); masked lanes are not read.
            unsafe {
                let a = _mm512_maskz_loadu_ps(m, row.as_ptr().add(p));
                for (j, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(m, b.add(j * ldb + p)), *acc);
                }
            }
            p += 16;
        }
        for j in 0..N {
            sums[j] = _mm512_reduce_add_ps(acc[j]);
        }
    }

    /// [`dots`] for `N` columns: 32 elements a step, the last step's past the row masked
    /// off (read as zero).
    ///
    /// # Safety
    /// As [`dots`], `N` columns.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn dots_n<const N: usize>(row: &[bf16], b: *const bf16, ldb: usize, sums: &mut [f32; SKINNY]) {
        let k = row.len();
        let mut acc = [_mm512_setzero_ps(); N];
        let mut p = 0;
        while p < k {
            let left = k - p;
            let m: __mmask32 = if left >= 32 { !0 } else { (1u32 << left) - 1 };
            // SAFETY: elements p..p+min(32, left) of the row and of each column (the
            // contract); masked lanes are not read.
            unsafe {
                let a = as_pairs(_mm512_maskz_loadu_epi16(m, row.as_ptr().add(p).cast()));
                for (j, acc) in acc.iter_mut().enumerate() {
                    let bj = as_pairs(_mm512_maskz_loadu_epi16(m, b.add(j * ldb + p).cast()));
                    *acc = _mm512_dpbf16_ps(*acc, a, bj);
                }
            }
            p += 32;
        }
        for j in 0..N {
            sums[j] = _mm512_reduce_add_ps(acc[j]);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    use half::bf16;

    use super::{LAYER_COLS, LAYER_ROWS, SKINNY};

    /// Never called: AVX-512 is x86_64's.
    pub(super) unsafe fn f32_block(
        _: usize,
        _: &[*const f32; LAYER_ROWS],
        _: usize,
        _: &[f32],
        _: &mut [[f32; LAYER_COLS]; LAYER_ROWS],
    ) {
        unreachable!("AVX-512 off x86_64")
    }

    /// Never called: AVX-512 is x86_64's.
    pub(super) unsafe fn store_columns(
        _: &[[f32; LAYER_COLS]; LAYER_ROWS],
        _: *mut f32,
        _: usize,
        _: f32,
        _: f32,
    ) {
        unreachable!("AVX-512 off x86_64")
    }

    /// Never called: AVX-512 is x86_64's.
    pub(super) unsafe fn pack_f32_columns(_: *const f32, _: usize, _: usize, _: *mut f32) {
        unreachable!("AVX-512 off x86_64")
    }

    /// Never called: AVX-512 is x86_64's.
    pub(super) unsafe fn bf16_block(
        _: usize,
        _: &[*const bf16; LAYER_ROWS],
        _: &[u32],
        _: &mut [[f32; LAYER_COLS]; LAYER_ROWS],
    ) {
        unreachable!("AVX-512 off x86_64")
    }

    /// Never called: [`super::supported`] is false off x86_64.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn block(
        _: usize,
        _: usize,
        _: &[u32],
        _: &[bf16],
        _: usize,
        _: *mut f32,
        _: usize,
        _: usize,
        _: f32,
        _: f32,
    ) {
        unreachable!("AVX512-BF16 off x86_64")
    }

    /// Never called: AVX-512 is x86_64's.
    pub(super) unsafe fn dots_f32(_: &[f32], _: &[f32], _: usize, _: usize, _: &mut [f32; SKINNY]) {
        unreachable!("AVX-512 off x86_64")
    }

    /// Never called: [`super::supported`] is false off x86_64.
    pub(super) unsafe fn dots(_: &[bf16], _: &[bf16], _: usize, _: usize, _: &mut [f32; SKINNY]) {
        unreachable!("AVX512-BF16 off x86_64")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One product of one element each: `a * b`, through [`gemm`] and its dot products
    /// (`transa`) or its packed panel.
    fn one(a: bf16, b: bf16, transa: bool) -> f32 {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let g = Gemm { transa, m: 1, n: 1, k: 1, lda: 1, ldb: 1, ldc: 1, ..Gemm::default() };
        let mut c = [f32::NAN];
        gemm(&pool, &g, &[a], &[b], &mut c, &|_, _| {});
        c[0]
    }

    /// The kernels' entry points refuse operands shorter than the product reaches, in
    /// release builds too (they read through raw pointers after).
    #[test]
    fn operands_shorter_than_the_product_are_refused() {
        let g = Gemm { transa: true, m: 3, n: 9, k: 4, lda: 4, ldb: 4, ldc: 3, ..Gemm::default() };
        let (ea, eb, ec) = g.one_extents().unwrap();
        assert_spans(&g, ea, eb, ec);
        for (a, b, c) in [(ea - 1, eb, ec), (ea, eb - 1, ec), (ea, eb, ec - 1)] {
            let refused = std::panic::catch_unwind(|| assert_spans(&g, a, b, c)).is_err();
            assert!(refused, "{a}, {b}, {c} elements for {g:?}");
        }
    }

    #[test]
    fn products_are_exact_and_subnormal_inputs_count_as_zero() {
        if !supported() {
            eprintln!("skipped: this CPU has no AVX512-BF16 (host devices widen bf16 to f32 here)");
            return;
        }
        for transa in [true, false] {
            // Two 8-bit significands: the product is exact in f32.
            let (a, b) = (bf16::from_f32(1.0078125), bf16::from_f32(-3.015625));
            assert_eq!(one(a, b, transa), a.to_f32() * b.to_f32());
            // The instruction's DAZ: the smallest subnormal times 2^100 is 0, not 2^-33.
            assert_eq!(one(bf16::from_bits(1), bf16::from_f32(2f32.powi(100)), transa), 0.0);
            assert!(one(bf16::NAN, bf16::ONE, transa).is_nan());
        }
    }
}
