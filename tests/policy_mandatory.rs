//! Case 48 through the process environment: `OMP_TARGET_OFFLOAD=mandatory` with no device
//! makes start-up and every OpenMP routine and construct fail with one clear error.
//!
//! This binary holds exactly one test, because it sets process environment variables and
//! builds the process-wide runtime from them.

use std::ffi::c_void;

use offload::omp::*;
use offload::{Error, LaunchArg, MapItem, Result, Runtime, Scalar, UpdateDirection, UpdateItem};
use offload_kernels::FILL_I32;

#[test]
fn mandatory_without_a_device_fails_everywhere_with_one_error() {
    std::env::set_var("OMP_TARGET_OFFLOAD", "mandatory");
    std::env::set_var("OFFLOAD_HOST_DEVICES", "0");
    // And no GPU either, on machines that have some (read by the CUDA driver at start-up,
    // which has not happened yet in this process).
    std::env::set_var("CUDA_VISIBLE_DEVICES", "");

    let first = match Runtime::global() {
        Err(e @ Error::OffloadMandatory { .. }) => e,
        Err(e) => panic!("wrong error at start-up: {e:?}"),
        Ok(rt) => panic!("the runtime started with {} devices", rt.num_devices()),
    };
    let message = first.to_string();
    assert!(
        message.contains("OMP_TARGET_OFFLOAD=mandatory")
            && message.contains("no offload device is available"),
        "unclear message: {message}"
    );
    assert!(message.contains("0 host devices (OFFLOAD_HOST_DEVICES)"), "the reason is missing: {message}");

    let mut x = [0i32; 4];
    let xp = x.as_mut_ptr().cast::<c_void>();
    let item = MapItem::tofrom(x.as_mut_ptr(), 16);
    let args = [LaunchArg::Value(Scalar::I32(1)), LaunchArg::mapped(x.as_ptr())];
    let dims = [1usize];
    let zero = [0usize];
    let mut host = [0u8; 8];
    let hp = host.as_mut_ptr().cast::<c_void>();

    // Every routine and construct, on the default device number 0 and the initial device
    // number 0 alike (there is no device), even the ones that would do nothing.
    // SAFETY: for every call, the runtime does not exist, so nothing is dereferenced; the
    // pointers are valid host memory anyway.
    let results: Vec<(&str, Result<()>)> = unsafe {
        vec![
            ("Runtime::global again", Runtime::global().map(drop)),
            ("Runtime::new", Runtime::new().map(drop)),
            ("omp_get_num_devices", omp_get_num_devices().map(drop)),
            ("omp_get_initial_device", omp_get_initial_device().map(drop)),
            ("omp_get_default_device", omp_get_default_device().map(drop)),
            ("omp_target_alloc", omp_target_alloc(16, 0).map(drop)),
            ("omp_target_alloc(0)", omp_target_alloc(0, 0).map(drop)),
            ("omp_target_free(null)", omp_target_free(std::ptr::null_mut(), 0)),
            ("omp_target_is_present", omp_target_is_present(xp, 0).map(drop)),
            ("omp_get_mapped_ptr", omp_get_mapped_ptr(xp, 0).map(drop)),
            ("omp_target_associate_ptr", omp_target_associate_ptr(xp, hp, 4, 0, 0)),
            ("omp_target_disassociate_ptr", omp_target_disassociate_ptr(xp, 0)),
            ("omp_target_memcpy", omp_target_memcpy(hp, xp, 4, 0, 0, 0, 0)),
            ("omp_target_memcpy(0 bytes)", omp_target_memcpy(hp, xp, 0, 0, 0, 0, 0)),
            (
                "omp_target_memcpy_rect",
                omp_target_memcpy_rect(
                    hp,
                    xp,
                    1,
                    1,
                    dims.as_ptr(),
                    zero.as_ptr(),
                    zero.as_ptr(),
                    dims.as_ptr(),
                    dims.as_ptr(),
                    0,
                    0,
                )
                .map(drop),
            ),
            ("omp_target_memset", omp_target_memset(hp, 0, 4, 0).map(drop)),
            ("target_data_begin", target_data_begin(0, &[item])),
            ("target_data_end", target_data_end(0, &[item])),
            ("target_enter_data", target_enter_data(0, &[item])),
            ("target_exit_data", target_exit_data(0, &[item])),
            (
                "target_update to",
                target_update(0, UpdateDirection::To, &[UpdateItem { range: item.range, present: false }]),
            ),
            (
                "target_update from",
                target_update(0, UpdateDirection::From, &[UpdateItem { range: item.range, present: false }]),
            ),
            ("target", target(0, &FILL_I32, 4, &[item], &args)),
            ("target without maps", target(0, &FILL_I32, 4, &[], &args)),
        ]
    };
    for (what, r) in results {
        match r {
            Err(e @ Error::OffloadMandatory { .. }) => {
                assert_eq!(e.to_string(), message, "{what}: a different message")
            }
            Err(e) => panic!("{what}: wrong error {e:?}"),
            Ok(()) => panic!("{what}: succeeded under mandatory with no device"),
        }
    }
    // Nothing ran: the kernel would have written 1s.
    assert_eq!(x, [0; 4]);
    assert_eq!(host, [0; 8]);
}
