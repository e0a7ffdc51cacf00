//! The parts of the HIP backend that need no AMD library, so they are compiled and tested
//! everywhere: translating the kernels' CUDA C for `hiprtc`, and mapping HIP error codes to
//! the runtime's errors.

use crate::error::Error;

/// What every HIP kernel source starts with: the CUDA spellings our kernels use, in HIP.
///
/// CUDA's `__shfl_*_sync` become `__shfl_*` with a width of 32, so the 32-lane reductions and
/// neighbour exchanges of the kernels keep their meaning on AMD's 64-lane wavefronts (each
/// wavefront acts as two 32-lane groups, exactly as two CUDA warps). The names are the HIP
/// translation's own: the generated kernels' prelude defines `offload_shfl_down(v, o)` (two
/// arguments, no mask), which a translated source holding it must keep.
pub const HIP_PRELUDE: &str = "\
// offload: CUDA spellings in HIP (32-lane groups on 64-lane wavefronts)
#define offload_hip_shfl_down(mask, var, delta) __shfl_down((var), (delta), 32)
#define offload_hip_shfl_up(mask, var, delta) __shfl_up((var), (delta), 32)
#define offload_hip_shfl(mask, var, lane) __shfl((var), (lane), 32)
";

/// A kernel's CUDA C source as HIP C for `hiprtc`: the prelude, then the source with the
/// warp intrinsics renamed to the prelude's (renaming rather than redefining leaves any
/// HIP header that declares `__shfl_*_sync` itself untouched).
pub fn hip_source(cuda: &str) -> String {
    let body = cuda
        .replace("__shfl_down_sync(", "offload_hip_shfl_down(")
        .replace("__shfl_up_sync(", "offload_hip_shfl_up(")
        .replace("__shfl_sync(", "offload_hip_shfl(");
    format!("{HIP_PRELUDE}{body}")
}

/// `hipErrorOutOfMemory`.
pub const HIP_ERROR_OUT_OF_MEMORY: i32 = 2;
/// `hipErrorNoDevice`.
pub const HIP_ERROR_NO_DEVICE: i32 = 100;

/// A failed HIP call as the runtime's error: out-of-memory keeps the sizes (asked, free,
/// total), everything else names the call and the HIP error.
pub fn hip_error(
    device: usize,
    call: &'static str,
    code: i32,
    name: &str,
    requested: usize,
    mem: Option<(usize, usize)>,
) -> Error {
    match (code, mem) {
        (HIP_ERROR_OUT_OF_MEMORY, Some((free, total))) => {
            Error::OutOfMemory { device, requested, free, total }
        }
        _ => Error::Driver { device, call, message: format!("{name} (HIP error {code})") },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_sources_translate_for_hip() {
        for k in [
            "__shfl_down_sync(0xffffffffu, acc, o)",
            "__shfl_up_sync(0xffffffffu, center, 1)",
            "__shfl_sync(0xffffffffu, v, 0)",
        ] {
            let h = hip_source(k);
            assert!(h.starts_with(HIP_PRELUDE));
            assert!(!h[HIP_PRELUDE.len()..].contains("_sync("), "{h}");
        }
        let h = hip_source("float s = __shfl_down_sync(0xffffffffu, acc, o);");
        assert!(h.ends_with("float s = offload_hip_shfl_down(0xffffffffu, acc, o);"), "{h}");
        // A generated kernel's own two-argument `offload_shfl_down` is left as it is.
        let generated = "#define offload_shfl_down(v, o) __shfl_down_sync(0xffffffffu, (v), (o))\nx = offload_shfl_down(x, 1);";
        let h = hip_source(generated);
        assert!(h.ends_with("#define offload_shfl_down(v, o) offload_hip_shfl_down(0xffffffffu, (v), (o))\nx = offload_shfl_down(x, 1);"), "{h}");
        // The macro takes the mask and drops it, keeping 32-lane groups.
        assert!(HIP_PRELUDE.contains("__shfl_down((var), (delta), 32)"));
        // Sources without warp intrinsics are unchanged after the prelude.
        assert_eq!(hip_source("x[i] *= a;"), format!("{HIP_PRELUDE}x[i] *= a;"));
    }

    #[test]
    fn hip_errors_map_to_runtime_errors() {
        let e = hip_error(
            3,
            "hipMalloc",
            HIP_ERROR_OUT_OF_MEMORY,
            "hipErrorOutOfMemory",
            1 << 40,
            Some((10, 20)),
        );
        assert!(
            matches!(e, Error::OutOfMemory { device: 3, requested, free: 10, total: 20 } if requested == 1 << 40)
        );
        let e = hip_error(1, "hipMemcpyAsync", 1, "hipErrorInvalidValue", 0, None);
        assert_eq!(e.to_string(), "device 1: hipMemcpyAsync failed: hipErrorInvalidValue (HIP error 1)");
        // Out of memory with no sizes known is still a driver error that says so.
        let e = hip_error(0, "hipMalloc", HIP_ERROR_OUT_OF_MEMORY, "hipErrorOutOfMemory", 8, None);
        assert!(e.to_string().contains("hipErrorOutOfMemory"));
    }
}
