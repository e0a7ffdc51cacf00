//! HIP sources from CUDA C: the one translation every kernel's HIP source goes through.

/// What every HIP source translated from CUDA starts with: the CUDA spellings kernels
/// use, in HIP.
///
/// CUDA's `__shfl_*_sync` become `__shfl_*` with a width of 32, so the 32-lane reductions and
/// neighbour exchanges of the kernels keep their meaning on AMD's 64-lane wavefronts (each
/// wavefront acts as two 32-lane groups, exactly as two CUDA warps). The names are the
/// translation's own: a generated kernel's header defines `offload_shfl_down(v, o)` (two
/// arguments, no mask) over `__shfl_down_sync`, which becomes this prelude's.
pub const HIP_PRELUDE: &str = "\
// offload: CUDA spellings in HIP (32-lane groups on 64-lane wavefronts)
#define offload_hip_shfl_down(mask, var, delta) __shfl_down((var), (delta), 32)
#define offload_hip_shfl_up(mask, var, delta) __shfl_up((var), (delta), 32)
#define offload_hip_shfl(mask, var, lane) __shfl((var), (lane), 32)
";

/// A kernel's CUDA C source as HIP C for `hiprtc`: the prelude, then the source with the
/// warp intrinsics renamed to the prelude's (renaming rather than redefining leaves any
/// HIP header that declares `__shfl_*_sync` itself untouched). The one way a kernel gets
/// HIP from CUDA, generated or hand-written.
pub fn hip_translation(cuda: &str) -> String {
    let body = cuda
        .replace("__shfl_down_sync(", "offload_hip_shfl_down(")
        .replace("__shfl_up_sync(", "offload_hip_shfl_up(")
        .replace("__shfl_sync(", "offload_hip_shfl(");
    format!("{HIP_PRELUDE}{body}")
}
