//! The part of the HIP backend that needs no AMD library, so it is compiled and tested
//! everywhere: mapping HIP error codes to the runtime's errors. (Kernels' HIP sources come
//! from `Kernel::hip_source`, which translates CUDA C.)

use crate::error::Error;

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
