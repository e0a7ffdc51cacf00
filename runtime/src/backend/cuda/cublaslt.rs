//! cuBLASLt for the CUDA backend: every [`Gemm`] in fp32, TF32, fp16 or bf16 with f32
//! accumulation, the bias and the activation fused into the GEMM's epilogue
//! (`CUBLASLT_EPILOGUE_RELU_BIAS`, `GELU_BIAS`, ...), on the device's compute stream.
//!
//! A product's descriptors and algorithm (its *plan*) are made once per shape, element
//! type, epilogue and operand alignment, and kept. The first time a plan runs with
//! `beta = 0` (D does not depend on what C held, so running it again changes nothing) the
//! heuristic's best few algorithms are each timed on the operands themselves, and the
//! fastest is kept: cuBLASLt's first choice is not always its fastest (for fp32 on Hopper
//! it can leave several percent). A bias aligned below 16 bytes is copied to an aligned
//! buffer first (see [`BIAS_ALIGN`]).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaContext, CudaStream};

use super::driver;

use crate::backend::GemmOperands;
use crate::gemm::{Activation, ElementType, Gemm};

/// Workspace cuBLASLt may use per product: NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;
/// Algorithms the heuristic is asked for, each timed once a plan runs with `beta = 0`.
const CANDIDATES: usize = 8;
/// Runs per candidate while timing (after one warm-up run).
const TIMED_RUNS: usize = 3;
/// The bias alignment the fused epilogues are given: cuBLASLt's preferences name none for
/// the bias, and its kernels read it in vectors (a half-precision bias at an odd element
/// faulted with a misaligned address on the H200, poisoning the context), so a bias
/// aligned below this is first copied to the handle's own, aligned, bias buffer.
const BIAS_ALIGN: u64 = 16;

/// A cuBLASLt handle, its workspace and its plans, for one device; used under the device's
/// lock, by one thread at a time.
pub(crate) struct LtBlas {
    ctx: Arc<CudaContext>,
    handle: sys::cublasLtHandle_t,
    workspace: u64,
    /// Where a misaligned bias is copied (see [`BIAS_ALIGN`]): `(address, bytes)`, made on
    /// first need and grown as needed.
    bias_buffer: Option<(u64, usize)>,
    /// Bias buffers outgrown, freed with the handle: products still queued, or captured
    /// in a graph replayed later, may read them.
    outgrown: Vec<u64>,
    plans: HashMap<PlanKey, Plan>,
}

// SAFETY: the handle, the descriptors and the workspace are used only through `&mut self`
// (the device's mutex), so by one thread at a time; cuBLASLt allows a handle to move
// between threads (it is bound to no thread, only to the context bound around each call).
unsafe impl Send for LtBlas {}

/// What makes two products share a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    transa: bool,
    transb: bool,
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
    ty: ElementType,
    tf32: bool,
    activation: Activation,
    bias: bool,
    /// Products in the batch, and the strides of A, B and C between them (0 for one).
    batch: usize,
    strides: [usize; 3],
    /// log2 of each operand's alignment in bytes (A, B, C, then the bias or 8 without
    /// one), up to 256. cuBLASLt's preferences name no bias alignment, so a plan chosen
    /// (and timed) for one bias alignment is not reused for another.
    align: [u8; 4],
}

/// A product's descriptors and chosen algorithm.
struct Plan {
    desc: MatmulDesc,
    a: Layout,
    b: Layout,
    c: Layout,
    /// The heuristic's candidates, best first by its estimate.
    candidates: Vec<sys::cublasLtMatmulHeuristicResult_t>,
    /// The one that runs: the heuristic's first until timed.
    chosen: usize,
    timed: bool,
}

macro_rules! owned_descriptor {
    ($name:ident, $raw:ty, $destroy:path) => {
        /// A cuBLASLt descriptor, destroyed when dropped.
        struct $name($raw);
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: made by its create function, destroyed only here.
                let _ = unsafe { $destroy(self.0) };
            }
        }
    };
}
owned_descriptor!(MatmulDesc, sys::cublasLtMatmulDesc_t, lt::destroy_matmul_desc);
owned_descriptor!(Layout, sys::cublasLtMatrixLayout_t, lt::destroy_matrix_layout);
owned_descriptor!(Preference, sys::cublasLtMatmulPreference_t, lt::destroy_matmul_pref);

impl LtBlas {
    /// A handle and a workspace on `ctx`'s device; an error (a message) when the library is
    /// missing or the workspace does not fit.
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Result<Self, String> {
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err("cuBLASLt library (libcublasLt) not found".into());
        }
        ctx.bind_to_thread().map_err(|e| e.to_string())?;
        let handle = lt::create_handle().map_err(|e| e.to_string())?;
        // SAFETY: the context is bound; the allocation is freed in `drop`.
        let workspace = match unsafe { driver::malloc(WORKSPACE_BYTES) } {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: made above, not used again.
                let _ = unsafe { lt::destroy_handle(handle) };
                return Err(format!("cuBLASLt workspace of {WORKSPACE_BYTES} bytes: {e}"));
            }
        };
        Ok(Self { ctx, handle, workspace, bias_buffer: None, outgrown: Vec::new(), plans: HashMap::new() })
    }

    /// Enqueues `g` on `stream` (this device's compute stream) with operands of type `ty`
    /// at `ops`, which the caller has checked lie in this device's memory and span the
    /// operands. An error names the cuBLASLt call and its status.
    pub(crate) fn matmul(
        &mut self,
        g: &Gemm,
        ty: ElementType,
        ops: GemmOperands,
        stream: &Arc<CudaStream>,
    ) -> Result<(), String> {
        if g.m == 0 || g.n == 0 || g.batch == 0 {
            return Ok(());
        }
        let ops = match ops.bias {
            Some(bias) if bias % BIAS_ALIGN != 0 => {
                GemmOperands { bias: Some(self.aligned_bias(bias, g.m * ty.size(), stream)?), ..ops }
            }
            _ => ops,
        };
        let align = |addr: u64| addr.trailing_zeros().min(8) as u8;
        // A batch's later products start a stride further: as aligned as both.
        let stride_align = |stride: usize| if g.batch > 1 { align((stride * ty.size()) as u64) } else { 8 };
        // A matrix of one column never steps by its leading dimension, which may then be
        // anything from its rows up (the caller checked only what is reached); cuBLASLt
        // refuses a huge one, so such a matrix is described with its rows.
        let (a_cols, b_cols) = (if g.transa { g.m } else { g.k }, if g.transb { g.k } else { g.n });
        let (a_rows, b_rows) = (if g.transa { g.k } else { g.m }, if g.transb { g.n } else { g.k });
        let one_column = |cols: usize, rows: usize, ld: usize| if cols == 1 { rows.max(1) } else { ld };
        let key = PlanKey {
            transa: g.transa,
            transb: g.transb,
            m: g.m,
            n: g.n,
            k: g.k,
            lda: one_column(a_cols, a_rows, g.lda),
            ldb: one_column(b_cols, b_rows, g.ldb),
            ldc: one_column(g.n, g.m, g.ldc),
            ty,
            tf32: g.tf32,
            activation: g.activation,
            bias: ops.bias.is_some(),
            batch: g.batch,
            strides: if g.batch > 1 { [g.stride_a, g.stride_b, g.stride_c] } else { [0; 3] },
            align: [
                align(ops.a).min(stride_align(g.stride_a)),
                align(ops.b).min(stride_align(g.stride_b)),
                align(ops.c).min(stride_align(g.stride_c)),
                ops.bias.map_or(8, align),
            ],
        };
        if !self.plans.contains_key(&key) {
            let plan = self.plan(&key)?;
            self.plans.insert(key, plan);
        }
        let (handle, workspace) = (self.handle, self.workspace);
        let plan = self.plans.get_mut(&key).ok_or("plan just made is missing")?;
        if let Some(bias) = ops.bias {
            let ptr = bias as usize as *const c_void;
            // SAFETY: a live descriptor; the attribute is a device pointer, read from `ptr`'s
            // own storage for its size.
            unsafe {
                lt::set_matmul_desc_attribute(
                    plan.desc.0,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    (&ptr as *const *const c_void).cast(),
                    std::mem::size_of::<*const c_void>(),
                )
            }
            .map_err(|e| format!("cublasLtMatmulDescSetAttribute(BIAS_POINTER): {e}"))?;
        }
        let run = |plan: &Plan, which: usize| {
            let (alpha, beta) = (g.alpha, g.beta);
            // SAFETY: the descriptors are live; A, B, C and the bias are this device's memory
            // spanning the layouts (the caller's check), D is C; alpha and beta (f32, the
            // scale type) live through the call, which only enqueues; the workspace is this
            // handle's, used by one product at a time on this one stream.
            unsafe {
                lt::matmul(
                    handle,
                    plan.desc.0,
                    (&alpha as *const f32).cast(),
                    (&beta as *const f32).cast(),
                    ops.a as usize as *const c_void,
                    plan.a.0,
                    ops.b as usize as *const c_void,
                    plan.b.0,
                    ops.c as usize as *const c_void,
                    plan.c.0,
                    ops.c as usize as *mut c_void,
                    plan.c.0,
                    &plan.candidates[which].algo,
                    workspace as usize as *mut c_void,
                    WORKSPACE_BYTES,
                    stream.cu_stream() as sys::cudaStream_t,
                )
            }
            .map_err(|e| format!("cublasLtMatmul: {e}"))
        };
        if !plan.timed && g.beta == 0.0 && plan.candidates.len() > 1 {
            plan.chosen = fastest(plan, stream, &self.ctx, run)?;
            plan.timed = true;
            tracing::debug!(target: "offload::gemm", ?key, chosen = plan.chosen, "cuBLASLt algorithm timed");
        }
        run(plan, plan.chosen)
    }

    /// A copy of the `bytes` of bias at `bias` in the bias buffer, enqueued on `stream`
    /// (the products' stream, so the next product's copy waits for this one's product).
    fn aligned_bias(&mut self, bias: u64, bytes: usize, stream: &Arc<CudaStream>) -> Result<u64, String> {
        if self.bias_buffer.is_none_or(|(_, have)| have < bytes) {
            let want = bytes.next_power_of_two().max(4096);
            // SAFETY: the context is bound (the caller's); freed in `drop`.
            let buffer =
                unsafe { driver::malloc(want) }.map_err(|e| format!("a bias buffer of {want} bytes: {e}"))?;
            self.outgrown.extend(self.bias_buffer.replace((buffer, want)).map(|(old, _)| old));
        }
        let (buffer, _) = self.bias_buffer.ok_or("bias buffer just made is missing")?;
        // SAFETY: `bias..bias + bytes` is this device's memory (the caller's check of the
        // operands), the buffer holds at least `bytes`; both in this context, on its stream.
        unsafe { driver::copy_on_device(buffer, bias, bytes, stream.cu_stream()) }
            .map_err(|e| format!("copying a misaligned bias (cuMemcpyDtoDAsync): {e}"))?;
        Ok(buffer)
    }

    /// The plan for `key`: descriptors, layouts and the heuristic's candidates.
    fn plan(&self, key: &PlanKey) -> Result<Plan, String> {
        use sys::cublasLtMatmulDescAttributes_t as Attr;
        let data = match key.ty {
            ElementType::F32 => sys::cudaDataType::CUDA_R_32F,
            ElementType::F16 => sys::cudaDataType::CUDA_R_16F,
            ElementType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        };
        let compute = if key.tf32 {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let desc = MatmulDesc(
            lt::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F)
                .map_err(|e| format!("cublasLtMatmulDescCreate: {e}"))?,
        );
        let epilogue = match (key.bias, key.activation) {
            (false, Activation::Identity) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            (false, Activation::Relu) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU,
            (false, Activation::Gelu) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
            (true, Activation::Identity) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            (true, Activation::Relu) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
            (true, Activation::Gelu) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
            (_, Activation::GeluExact) => return Err("no cuBLASLt epilogue computes exact GELU".into()),
        };
        // cublasOperation_t: N = 0, T = 1, as an int32.
        let (ta, tb) = (i32::from(key.transa), i32::from(key.transb));
        let attributes: [(Attr, *const c_void, usize); 3] = [
            (Attr::CUBLASLT_MATMUL_DESC_TRANSA, (&ta as *const i32).cast(), 4),
            (Attr::CUBLASLT_MATMUL_DESC_TRANSB, (&tb as *const i32).cast(), 4),
            (Attr::CUBLASLT_MATMUL_DESC_EPILOGUE, (&epilogue as *const sys::cublasLtEpilogue_t).cast(), 4),
        ];
        for (attr, value, size) in attributes {
            // SAFETY: a live descriptor; each value is a 4-byte integer living in this frame.
            unsafe { lt::set_matmul_desc_attribute(desc.0, attr, value, size) }
                .map_err(|e| format!("cublasLtMatmulDescSetAttribute({attr:?}): {e}"))?;
        }
        let layout = |rows: usize, cols: usize, ld: usize| -> Result<Layout, String> {
            let (rows, cols, ld) = (rows as u64, cols as u64, ld as i64);
            lt::create_matrix_layout(data, rows, cols, ld)
                .map(Layout)
                .map_err(|e| format!("cublasLtMatrixLayoutCreate({rows} x {cols}, ld {ld}): {e}"))
        };
        let (ar, ac) = if key.transa { (key.k, key.m) } else { (key.m, key.k) };
        let (br, bc) = if key.transb { (key.n, key.k) } else { (key.k, key.n) };
        let (a, b, c) = (layout(ar, ac, key.lda)?, layout(br, bc, key.ldb)?, layout(key.m, key.n, key.ldc)?);
        if key.batch > 1 {
            use sys::cublasLtMatrixLayoutAttribute_t as L;
            let count = i32::try_from(key.batch).map_err(|_| format!("a batch of {} products", key.batch))?;
            for (layout, stride) in [(&a, key.strides[0]), (&b, key.strides[1]), (&c, key.strides[2])] {
                let stride = i64::try_from(stride).map_err(|_| format!("a batch stride of {stride}"))?;
                // SAFETY: a live layout; each value is an integer of the size given, living
                // in this frame.
                unsafe {
                    lt::set_matrix_layout_attribute(
                        layout.0,
                        L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&count as *const i32).cast(),
                        4,
                    )
                    .map_err(|e| format!("cublasLtMatrixLayoutSetAttribute(BATCH_COUNT): {e}"))?;
                    lt::set_matrix_layout_attribute(
                        layout.0,
                        L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        (&stride as *const i64).cast(),
                        8,
                    )
                    .map_err(|e| format!("cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET): {e}"))?;
                }
            }
        }
        let pref =
            Preference(lt::create_matmul_pref().map_err(|e| format!("cublasLtMatmulPreferenceCreate: {e}"))?);
        use sys::cublasLtMatmulPreferenceAttributes_t as Pref;
        let workspace = WORKSPACE_BYTES as u64;
        let [aa, ab, ac_, _] = key.align.map(|l| 1u32 << l);
        let prefs: [(Pref, *const c_void, usize); 5] = [
            (Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, (&workspace as *const u64).cast(), 8),
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, (&aa as *const u32).cast(), 4),
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, (&ab as *const u32).cast(), 4),
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, (&ac_ as *const u32).cast(), 4),
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, (&ac_ as *const u32).cast(), 4),
        ];
        for (attr, value, size) in prefs {
            // SAFETY: a live preference; each value is an integer of `size` bytes in this frame.
            unsafe { lt::set_matmul_pref_attribute(pref.0, attr, value, size) }
                .map_err(|e| format!("cublasLtMatmulPreferenceSetAttribute({attr:?}): {e}"))?;
        }
        let mut results = vec![
            // SAFETY: a plain C struct of integers and floats; all zeros is a valid value.
            unsafe { std::mem::zeroed::<sys::cublasLtMatmulHeuristicResult_t>() };
            CANDIDATES
        ];
        let mut count = 0i32;
        // SAFETY: live handle and descriptors; `results` has room for CANDIDATES entries,
        // of which the call writes `count`.
        unsafe {
            sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                desc.0,
                a.0,
                b.0,
                c.0,
                c.0,
                pref.0,
                CANDIDATES as i32,
                results.as_mut_ptr(),
                &mut count,
            )
        }
        .result()
        .map_err(|e| format!("cublasLtMatmulAlgoGetHeuristic: {e}"))?;
        results.truncate(usize::try_from(count).unwrap_or(0));
        results.retain(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
        if results.is_empty() {
            return Err(format!(
                "cuBLASLt has no algorithm for {key:?} (an operand's alignment or the shape is not supported)"
            ));
        }
        Ok(Plan { desc, a, b, c, candidates: results, chosen: 0, timed: false })
    }
}

/// The candidate of `plan` that runs fastest: each run once, then `TIMED_RUNS` times
/// between two timed events, on `stream`; a candidate that fails to run is passed over.
fn fastest(
    plan: &Plan,
    stream: &Arc<CudaStream>,
    ctx: &Arc<CudaContext>,
    run: impl Fn(&Plan, usize) -> Result<(), String>,
) -> Result<usize, String> {
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end) = (
        ctx.new_event(timing).map_err(|e| e.to_string())?,
        ctx.new_event(timing).map_err(|e| e.to_string())?,
    );
    let mut best: Option<(f32, usize)> = None;
    for which in 0..plan.candidates.len() {
        if run(plan, which).is_err() {
            continue;
        }
        start.record(stream).map_err(|e| e.to_string())?;
        let runs: Result<(), String> = (0..TIMED_RUNS).try_for_each(|_| run(plan, which));
        end.record(stream).map_err(|e| e.to_string())?;
        let ms = start.elapsed_ms(&end).map_err(|e| format!("timing cuBLASLt's candidates: {e}"))?;
        if runs.is_ok() && best.is_none_or(|(t, _)| ms < t) {
            best = Some((ms, which));
        }
    }
    best.map(|(_, which)| which).ok_or_else(|| "no cuBLASLt candidate ran".into())
}

impl Drop for LtBlas {
    fn drop(&mut self) {
        // The plans' descriptors first, then the handle and the workspace, in the context.
        self.plans.clear();
        let _ = self.ctx.bind_to_thread();
        // SAFETY: made in `new`, destroyed only here; the device's work was waited for
        // before the device is dropped, so no product still uses the workspace.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
            let _ = driver::free(self.workspace);
            for buffer in self.bias_buffer.iter().map(|&(b, _)| b).chain(self.outgrown.drain(..)) {
                let _ = driver::free(buffer);
            }
        }
    }
}
