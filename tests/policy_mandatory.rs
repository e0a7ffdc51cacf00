//! Case 48 through the process environment: under `OMP_TARGET_OFFLOAD=mandatory` with no
//! device the runtime starts, as libomptarget's does: the queries answer, the device memory
//! routines work on the initial device, and every device construct fails with one clear
//! error (tests/differential/policy.c checks the same against libomptarget 19).
//!
//! This binary holds exactly one test, because it sets process environment variables and
//! builds the process-wide runtime from them.

use std::ffi::c_void;

use offload::omp::*;
use offload::{
    Error, LaunchArg, MapItem, OffloadPolicy, Result, Runtime, Scalar, UpdateDirection, UpdateItem,
};
use offload_kernels::FILL_I32;

#[test]
fn mandatory_without_a_device_answers_queries_and_fails_constructs() -> Result<()> {
    std::env::set_var("OMP_TARGET_OFFLOAD", "mandatory");
    std::env::set_var("OFFLOAD_HOST_DEVICES", "0");
    // And no GPU either, on machines that have some (read by the CUDA driver at start-up,
    // which has not happened yet in this process).
    std::env::set_var("CUDA_VISIBLE_DEVICES", "");

    // Start-up and the queries.
    let rt = Runtime::global()?;
    assert_eq!(rt.policy(), OffloadPolicy::Mandatory);
    assert_eq!((rt.num_devices(), rt.initial_device(), rt.default_device()), (0, 0, 0));
    assert!(rt.is_initial_device());
    assert_eq!(omp_get_num_devices()?, 0);
    assert_eq!(omp_get_initial_device()?, 0);
    assert_eq!(omp_get_default_device()?, 0);
    assert_eq!(omp_get_device_num()?, 0);
    assert!(omp_is_initial_device()?);
    assert!(rt.device_report().contains("0 host devices (OFFLOAD_HOST_DEVICES)"), "{}", rt.device_report());
    assert!(Runtime::new().is_ok(), "a second runtime starts too");

    // The one error of every construct, naming the reason.
    let message = match rt.device(0) {
        Err(e @ Error::OffloadMandatory { .. }) => e.to_string(),
        other => panic!("the safe API's device 0: expected OffloadMandatory, got {other:?}"),
    };
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
    let dims = [4usize];
    let zero = [0usize];
    let mut host = [0u8; 16];
    let hp = host.as_mut_ptr().cast::<c_void>();
    let init = omp_get_initial_device()?;

    // Device memory routines and queries on the initial device (its number, 0, and
    // omp_initial_device) work, as libomptarget 19's do.
    for dev in [init, omp_initial_device] {
        let p = omp_target_alloc(16, dev)?;
        assert!(!p.is_null());
        // SAFETY: `p` holds 16 bytes of host memory; `x` and `host` are 16 bytes each.
        unsafe {
            omp_target_memcpy(p, xp, 16, 0, 0, dev, dev)?;
            omp_target_memcpy(hp, p, 0, 0, 0, dev, dev)?;
            omp_target_memset(p, 3, 16, dev)?;
            omp_target_memcpy_rect(
                hp,
                p,
                4,
                1,
                dims.as_ptr(),
                zero.as_ptr(),
                zero.as_ptr(),
                dims.as_ptr(),
                dims.as_ptr(),
                dev,
                dev,
            )?;
            assert_eq!(host, [3; 16]);
            omp_target_memset_async(p, 4, 16, dev, &[])?;
            omp_target_memcpy_async(hp, p, 16, 0, 0, dev, dev, &[])?;
            omp_taskwait()?;
            assert_eq!(host, [4; 16]);
            omp_target_free(p, dev)?;
            omp_target_free(std::ptr::null_mut(), dev)?;
        }
        assert!(omp_target_is_present(xp, dev)?);
        assert_eq!(omp_get_mapped_ptr(xp, dev)?, xp);
        assert!(omp_target_is_accessible(xp, 16, dev)?);
        assert_eq!(omp_get_uid_from_device(dev)?, "host");
        assert!(omp_get_interop_ptr(dev, InteropProperty::TargetSync)?.is_null());
        assert_eq!(use_device_ptr(xp, dev)?, xp);
        omp_set_default_device(dev)?;
        assert_eq!(omp_get_default_device()?, init);
        // Associations are refused on the initial device, as always (libomptarget: -1).
        // SAFETY: refused before anything is touched.
        let r = unsafe { omp_target_associate_ptr(xp, hp, 16, 0, dev) };
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
        // SAFETY: as above.
        let r = unsafe { omp_target_disassociate_ptr(xp, dev) };
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    }

    // Every device construct fails, on the default device (the initial device here),
    // the initial device under either number, and device 1 alike; so do the memory
    // routines on any other device number (there is none, and that is why).
    let mut results: Vec<(String, Result<()>)> = Vec::new();
    for dev in [omp_get_default_device()?, init, omp_initial_device, 1] {
        let mut add = |what: &str, r: Result<()>| results.push((format!("{what} on device {dev}"), r));
        // SAFETY: for every call, the runtime refuses before touching anything; the
        // pointers are valid host memory anyway.
        unsafe {
            add("target_data_begin", target_data_begin(dev, &[item]));
            add("target_data_end", target_data_end(dev, &[item]));
            add("target_enter_data", target_enter_data(dev, &[item]));
            add("target_exit_data", target_exit_data(dev, &[item]));
            let list = [UpdateItem { range: item.range, present: false }];
            add("target_update to", target_update(dev, UpdateDirection::To, &list));
            add("target_update from", target_update(dev, UpdateDirection::From, &list));
            add("target", target(dev, &FILL_I32, 4, &[item], &args));
            add("target without maps", target(dev, &FILL_I32, 4, &[], &args));
            add("target_nowait", target_nowait(dev, &FILL_I32, 4, &[], &args, &[]).map(drop));
            add("target_enter_data_nowait", target_enter_data_nowait(dev, &[item], &[]).map(drop));
            add("target_exit_data_nowait", target_exit_data_nowait(dev, &[item], &[]).map(drop));
            add("target_update_nowait", target_update_nowait(dev, UpdateDirection::To, &list, &[]).map(drop));
        }
    }
    // SAFETY: as above.
    unsafe {
        results.push(("omp_target_alloc on device 1".into(), omp_target_alloc(16, 1).map(drop)));
        results.push(("omp_target_memcpy from device 1".into(), omp_target_memcpy(hp, xp, 4, 0, 0, init, 1)));
        results.push(("omp_target_memset on device 1".into(), omp_target_memset(hp, 0, 4, 1).map(drop)));
        results.push(("omp_target_is_present on device 1".into(), omp_target_is_present(xp, 1).map(drop)));
        results.push(("omp_set_default_device(1)".into(), omp_set_default_device(1)));
        results.push(("if_device(true, 1)".into(), if_device(true, 1).map(drop)));
    }
    results.push(("Runtime::device(initial)".into(), rt.device(rt.initial_device()).map(drop)));
    results.push(("Runtime::device_if(false, 0)".into(), rt.device_if(false, 0).map(drop)));
    for (what, r) in results {
        match r {
            Err(e @ Error::OffloadMandatory { .. }) => {
                assert_eq!(e.to_string(), message, "{what}: a different message")
            }
            Err(e) => panic!("{what}: wrong error {e:?}"),
            Ok(()) => panic!("{what}: succeeded under mandatory with no device"),
        }
    }
    // Nothing was queued, and nothing ran: the kernel would have written 1s.
    omp_taskwait()?;
    assert_eq!(x, [0; 4]);
    Ok(())
}
