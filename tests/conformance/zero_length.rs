//! Cases 21-23 of docs/SEMANTICS.md: zero-length array sections.
//!
//! A zero-length section creates no entry (rule 6); when it points inside a mapped range it
//! stands for that range's entry, as libomptarget reads it: it is present, and it moves the
//! entry's count like any map of it (copying nothing). A `present` map of one that points
//! at nothing fails with "(0 bytes)".

use offload::{map, Error, HostRange, LaunchArg, MapItem, MapType, Result, Runtime, Scalar};
use offload_kernels::FILL_I32;
use offload_tests::{assert_clean, check, check_eq, device_copy_of, fill_device, on_every_device};

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
        // The zero-length section stands for arr[0:5]: its count goes 1 -> 0, and it leaves
        // (libomptarget 19 and 22 alike).
        check!(!rt.is_present(at, dev)?, "arr[0:5] still present after `present release arr[0:0]`");
        check_eq!(counts(rt, at, dev)?, None);
        assert_clean(rt, dev)
    });
}

#[test]
fn zero_length_sections_move_the_count_of_the_entry_they_lie_in() {
    on_every_device("zero-length counts", |rt, dev| {
        let mut arr = [1i32, 2, 3, 4, 5];
        let at = arr.as_ptr() as usize;
        let mid = arr[2..].as_ptr();
        // SAFETY: `arr` is valid for reads during the calls; zero-length items touch nothing.
        unsafe {
            rt.enter_data(dev, &[MapItem::slice(&arr, MapType::TO)])?;
            // enter data map(to: arr[2:0]): arr[0:5]'s count 1 -> 2, no copy (even with
            // `always`: a zero-length section has no bytes to copy).
            rt.enter_data(dev, &[MapItem::to(mid, 0).always()])?;
        }
        check_eq!(counts(rt, at, dev)?, Some((2, 0)));
        // One construct naming arr[0:5] and arr[2:0] moves the count once (rule 2).
        // SAFETY: as above.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&arr, MapType::ALLOC), MapItem::alloc(mid, 0)])? };
        check_eq!(counts(rt, at, dev)?, Some((3, 0)));
        // SAFETY: release copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&arr, MapType::RELEASE), MapItem::release(mid, 0)])? };
        check_eq!(counts(rt, at, dev)?, Some((2, 0)));
        // A zero-length `from` that takes the count to 0 ends the entry and copies nothing
        // back (libomptarget copies a section's own bytes: none).
        fill_device(rt, dev, &arr, 9)?;
        // SAFETY: release copies nothing back; the zero-length `from` copies no bytes.
        unsafe {
            rt.exit_data(dev, &[MapItem::release(mid, 0)])?;
            check_eq!(counts(rt, at, dev)?, Some((1, 0)));
            rt.exit_data(dev, &[MapItem::from(arr[2..].as_mut_ptr(), 0)])?;
        }
        check!(!rt.is_present(at, dev)?, "arr[0:5] present after its last count went");
        check_eq!(arr, [1, 2, 3, 4, 5]);
        // `delete` of a zero-length section zeroes the count, whatever it was.
        // SAFETY: as above.
        unsafe {
            rt.enter_data(dev, &[MapItem::slice(&arr, MapType::ALLOC)])?;
            rt.enter_data(dev, &[MapItem::slice(&arr, MapType::ALLOC)])?;
            rt.exit_data(dev, &[MapItem::delete(arr[4..].as_ptr(), 0)])?;
        }
        check!(!rt.is_present(at, dev)?, "arr[0:5] present after `delete arr[4:0]`");
        // One past the end names nothing: neither counted nor refused without `present`.
        let end = arr.as_ptr_range().end;
        // SAFETY: as above.
        unsafe {
            rt.enter_data(dev, &[MapItem::slice(&arr, MapType::ALLOC)])?;
            rt.enter_data(dev, &[MapItem::alloc(end, 0)])?;
            rt.exit_data(dev, &[MapItem::release(end, 0)])?;
        }
        check_eq!(counts(rt, at, dev)?, Some((1, 0)));
        // SAFETY: release copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&arr, MapType::RELEASE)])? };
        assert_clean(rt, dev)
    });
}

#[test]
fn zero_length_sections_in_regions_hold_and_end_with_them() {
    on_every_device("zero-length regions", |rt, dev| {
        let arr = [0i32; 8];
        let at = arr.as_ptr() as usize;
        let zero = [MapItem::alloc(arr[3..].as_ptr(), 0)];
        // SAFETY: `arr` is valid for reads during the calls; zero-length items touch nothing.
        unsafe {
            rt.enter_data(dev, &[MapItem::slice(&arr, MapType::ALLOC)])?;
            // `target data map(alloc: arr[3:0])` holds arr[0:8] while it lasts: an exit data
            // inside it does not end the entry; the region's end does.
            rt.target_data_begin(dev, &zero)?;
            check_eq!(counts(rt, at, dev)?, Some((2, 0)));
            rt.exit_data(dev, &[MapItem::slice(&arr, MapType::RELEASE)])?;
            check!(rt.is_present(at, dev)?, "the region's zero-length map no longer holds arr");
            rt.target_data_end(dev, &zero)?;
        }
        check!(!rt.is_present(at, dev)?, "arr present after the region ended");
        // With `hold`, it moves the hold count: exit data cannot end the entry inside.
        let held = [MapItem::alloc(arr[3..].as_ptr(), 0).hold()];
        // SAFETY: as above.
        unsafe {
            rt.enter_data(dev, &[MapItem::slice(&arr, MapType::ALLOC)])?;
            rt.target_data_begin(dev, &held)?;
            check_eq!(counts(rt, at, dev)?, Some((1, 1)));
            rt.exit_data(dev, &[MapItem::slice(&arr, MapType::DELETE)])?;
            check_eq!(counts(rt, at, dev)?, Some((0, 1)));
            rt.target_data_end(dev, &held)?;
        }
        check!(!rt.is_present(at, dev)?, "arr present after the hold region ended");
        assert_clean(rt, dev)
    });
}

#[test]
fn in_the_safe_api_an_empty_slice_maps_nothing() {
    on_every_device("empty slices, safe API", |rt, dev| {
        let gpu = rt.device(dev)?;
        let mut v: Vec<i32> = (0..20).collect();
        let (_, rest) = v.split_at_mut(10);
        let (empty, c) = rest.split_at_mut(0);
        let c_at = c.as_ptr() as usize;
        // A guard over an empty slice moves no count, so dropping it cannot end the mapping
        // of the slice it lies in (which a later guard holds).
        let g1 = gpu.enter_data(map::tofrom(empty))?;
        let g2 = gpu.enter_data(map::tofrom(c))?;
        drop(g1);
        check_eq!(counts(rt, c_at, dev)?, Some((1, 0)));
        fill_i32_view(&gpu, &g2)?;
        g2.exit()?;
        check!(v[10..].iter().all(|&x| x == 5), "the copy back was lost: {:?}", &v[10..12]);
        check!(v[..10].iter().enumerate().all(|(i, &x)| x == i as i32));
        // `present` on an empty slice is checked (inside a mapping: fine; outside: an error
        // naming "(0 bytes)") and moves no count.
        let arr = [0i32; 5];
        let at = arr.as_ptr() as usize;
        check_zero_not_present(gpu.data(map::alloc(&arr[2..2]).present(), |_| Ok(())), at + 8, dev)?;
        gpu.data(map::alloc(&arr), |_| {
            gpu.data(map::alloc(&arr[2..2]).present(), |_| {
                check_eq!(counts(rt, at, dev)?, Some((1, 0)));
                Ok(())
            })
        })?;
        assert_clean(rt, dev)
    });
}

/// Sets every element of `g`'s one view to 5 with a launch.
fn fill_i32_view<'d, 'a>(
    gpu: &offload::Device<'d>,
    g: &offload::Mapped<'d, 'a, offload::Map<'a, i32>>,
) -> Result<()> {
    let view = g.views();
    gpu.launch(&FILL_I32, view.len(), (5i32, view))
}

#[test]
fn a_zero_length_section_at_a_named_base_names_the_section_below_it() {
    on_every_device("zero-length base", |rt, dev| {
        let a = [0i32; 256];
        let base = a.as_ptr();
        let section = a[64..].as_ptr();
        // SAFETY: `a` is valid for reads during the calls; zero-length items touch nothing.
        unsafe { rt.enter_data(dev, &[MapItem::to(section, 128 * 4).with_base(base)])? };
        let entry = rt.entry(section as usize, dev)?;
        check_eq!(entry.as_ref().map(|e| e.base), Some(base as usize));
        // As in libomptarget: A[0:0], A[10:0] lie in [base, section end): present, counted.
        // SAFETY: as above.
        unsafe { rt.enter_data(dev, &[MapItem::alloc(a[10..].as_ptr(), 0).present()])? };
        check_eq!(counts(rt, section as usize, dev)?, Some((2, 0)));
        // omp_target_is_present looks at one byte: A itself is not mapped.
        check!(!rt.is_present(base as usize, dev)?, "A[0] present with only A[64:128] mapped");
        let d = rt.use_device_ptr(base as usize, dev)?;
        check_eq!(d, rt.mapped_ptr(section as usize, dev)?.map(|s| s - 64 * 4));
        // SAFETY: as above.
        unsafe {
            rt.exit_data(dev, &[MapItem::release(base, 0).present()])?;
            rt.exit_data(dev, &[MapItem::release(section, 128 * 4)])?;
        }
        check!(!rt.is_present(section as usize, dev)?, "A[64:128] present after both releases");
        // Without a base, A[0:0] names nothing.
        // SAFETY: as above.
        unsafe { rt.enter_data(dev, &[MapItem::to(section, 128 * 4)])? };
        check_eq!(rt.use_device_ptr(base as usize, dev)?, None);
        check_zero_not_present(
            // SAFETY: a zero-length item touches no memory.
            unsafe { rt.enter_data(dev, &[MapItem::alloc(base, 0).present()]) },
            base as usize,
            dev,
        )?;
        // SAFETY: release copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::release(section, 128 * 4)])? };
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
