//! Cases 21-23 of docs/SEMANTICS.md: zero-length array sections.
//!
//! A zero-length section creates no entry (rule 6); it is present when it points inside a
//! mapped range, and a `present` map of one that does not fails with "(0 bytes)".

use offload::{map, Error, HostRange, LaunchArg, MapItem, MapType, Result, Runtime, Scalar};
use offload_kernels::FILL_I32;
use offload_tests::{assert_clean, check, check_eq, device_copy_of, on_every_device};

/// The (reference, hold) counts of the entry holding host address `at`.
fn counts(rt: &Runtime, at: usize, dev: usize) -> Result<Option<(u64, u64)>> {
    Ok(rt.entry(at, dev)?.map(|e| (e.ref_count, e.hold_count)))
}

/// Checks that `r` failed with `NotPresent` for the zero-length section at `at`, with a
/// message naming the address and "(0 bytes)".
fn check_zero_not_present(r: Result<()>, at: usize, dev: usize) -> Result<()> {
    let Err(e) = r else {
        check!(false, "a `present` map of an unmapped zero-length section at {at:#x} succeeded");
        return Ok(());
    };
    check!(
        matches!(e, Error::NotPresent { device, range, .. } if device == dev && range == HostRange::new(at, 0)),
        "expected NotPresent for host {at:#x} (0 bytes) on device {dev}, got {e:?}"
    );
    let msg = e.to_string();
    check!(msg.contains(&format!("{at:#x}")), "message lacks the host address: {msg}");
    check!(msg.contains("(0 bytes)"), "message lacks \"(0 bytes)\": {msg}");
    Ok(())
}

/// A target launch mapping `present, alloc: arr[0:0]` whose kernel sets `n` elements
/// from `arr` to `v`.
fn launch_present_zero(rt: &Runtime, dev: usize, arr: &[i32], n: usize, v: i32) -> Result<()> {
    let maps = [MapItem::alloc(arr.as_ptr(), 0).present()];
    // SAFETY: the map list copies nothing; the kernel writes n i32 of the device copy of
    // `arr`, which the translation bounds (and fails when `arr` is not mapped).
    unsafe {
        rt.target_launch(
            dev,
            &FILL_I32,
            n,
            &maps,
            &[LaunchArg::Value(Scalar::I32(v)), LaunchArg::mapped(arr.as_ptr())],
        )
    }
}

#[test]
fn case_21_present_zero_length_inside_a_mapped_range() {
    on_every_device("case 21", |rt, dev| {
        let arr = [0i32; 5];
        let at = arr.as_ptr() as usize;
        let gpu = rt.device(dev)?;
        gpu.data(map::alloc(&arr), |_| {
            // A target region with `present, alloc: arr[0:0]` finds arr[0:5]; the kernel
            // writes its device copy.
            launch_present_zero(rt, dev, &arr, 5, 3)?;
            check_eq!(device_copy_of(rt, &arr, dev)?, vec![3; 5]);
            check_eq!(counts(rt, at, dev)?, Some((1, 0)));
            // A `target data` with it too, and with a zero-length section pointing into the
            // middle of the range.
            gpu.data(map::alloc(&arr[0..0]).present(), |_| Ok(()))?;
            gpu.data(map::alloc(&arr[3..3]).present(), |_| Ok(()))?;
            // One past the end is not inside.
            let end = arr.as_ptr_range().end as usize;
            // SAFETY: a zero-length map list item touches no memory.
            let r = unsafe { rt.target_data_begin(dev, &[MapItem::alloc(end as *const i32, 0).present()]) };
            check_zero_not_present(r, end, dev)?;
            check_eq!(counts(rt, at, dev)?, Some((1, 0)));
            Ok(())
        })?;
        check_eq!(arr, [0; 5]);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_22_zero_length_map_creates_no_entry() {
    on_every_device("case 22", |rt, dev| {
        let arr = [0i32; 5];
        let at = arr.as_ptr() as usize;
        let live = rt.pool_usage(dev)?.live_allocations;
        let zero = [MapItem::alloc(arr.as_ptr(), 0)];
        // SAFETY: a zero-length item touches no memory.
        unsafe { rt.target_data_begin(dev, &zero)? };
        check!(!rt.is_present(at, dev)?, "arr present after mapping arr[0:0]");
        check_eq!(counts(rt, at, dev)?, None);
        check!(rt.live_mappings().iter().all(|(d, _)| *d != dev), "arr[0:0] made an entry");
        check_eq!(rt.pool_usage(dev)?.live_allocations, live);
        // So a `present` map of it fails, naming "(0 bytes)": as a target region ...
        check_zero_not_present(launch_present_zero(rt, dev, &arr, 5, 3), at, dev)?;
        // ... as a nested target data, and as an enter data.
        check_zero_not_present(rt.device(dev)?.data(map::alloc(&arr[0..0]).present(), |_| Ok(())), at, dev)?;
        // SAFETY: a zero-length item touches no memory.
        let r = unsafe { rt.enter_data(dev, &[MapItem::alloc(arr.as_ptr(), 0).present()]) };
        check_zero_not_present(r, at, dev)?;
        check_eq!(rt.pool_usage(dev)?.live_allocations, live);
        // SAFETY: matches the begin above; nothing is copied.
        unsafe { rt.target_data_end(dev, &zero)? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_23_exit_present_release_of_zero_length() {
    on_every_device("case 23 (mapped)", |rt, dev| {
        let arr = [0i32; 5];
        let at = arr.as_ptr() as usize;
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&arr, MapType::ALLOC)])? };
        let rel = [MapItem::release(arr.as_ptr(), 0).present()];
        // SAFETY: release copies nothing back.
        unsafe { rt.exit_data(dev, &rel)? };
        // The zero-length section made no entry on the way in, so it releases none on the
        // way out: arr[0:5] keeps its count.
        check!(rt.is_present(at, dev)?, "arr[0:5] gone after `present release arr[0:0]`");
        check_eq!(counts(rt, at, dev)?, Some((1, 0)));
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&arr, MapType::DELETE)])? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_23_exit_present_release_of_zero_length_only_entered_fails() {
    on_every_device("case 23 (only arr[0:0])", |rt, dev| {
        let arr = [0i32; 5];
        let at = arr.as_ptr() as usize;
        let live = rt.pool_usage(dev)?.live_allocations;
        // SAFETY: a zero-length item touches no memory.
        unsafe { rt.enter_data(dev, &[MapItem::alloc(arr.as_ptr(), 0)])? };
        check!(!rt.is_present(at, dev)?, "arr present after entering arr[0:0]");
        check_eq!(rt.pool_usage(dev)?.live_allocations, live);
        // SAFETY: release copies nothing back.
        let r = unsafe { rt.exit_data(dev, &[MapItem::release(arr.as_ptr(), 0).present()]) };
        check_zero_not_present(r, at, dev)?;
        assert_clean(rt, dev)
    });
}
