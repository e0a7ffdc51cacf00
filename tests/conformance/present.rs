//! Cases 11-15 of docs/SEMANTICS.md: the `present` modifier.
//!
//! A `present` map of an absent range fails with an error naming the host address and the
//! byte count, and the construct changes nothing: no entry, no allocation, no count.

use std::cell::Cell;

use offload::{map, Error, HostRange, MapItem, MapType, Result, Runtime, UpdateDirection};
use offload_tests::{assert_clean, check, check_eq, device_copy_of, fill_device, on_every_device};

/// The (reference, hold) counts of the entry holding `x`, `None` when absent.
fn counts<T>(rt: &Runtime, x: &[T], dev: usize) -> Result<Option<(u64, u64)>> {
    Ok(rt.entry(x.as_ptr() as usize, dev)?.map(|e| (e.ref_count, e.hold_count)))
}

/// Checks that `r` failed with `NotPresent` for exactly `range` on `dev`, and that the
/// message names the host address in hex and the byte count.
fn check_not_present(r: Result<()>, range: HostRange, dev: usize) -> Result<()> {
    let Err(e) = r else {
        check!(false, "a `present` map of absent {range} succeeded on device {dev}");
        return Ok(());
    };
    check!(
        matches!(e, Error::NotPresent { device, range: r, .. } if device == dev && r == range),
        "expected NotPresent for {range} on device {dev}, got {e:?}"
    );
    let msg = e.to_string();
    check!(msg.contains(&format!("{:#x}", range.begin)), "message lacks the host address: {msg}");
    check!(msg.contains(&format!("({} bytes)", range.bytes)), "message lacks the byte count: {msg}");
    Ok(())
}

#[test]
fn case_11_target_data_present_inside_a_region() {
    on_every_device("case 11 (present)", |rt, dev| {
        let gpu = rt.device(dev)?;
        let i = [0i32; 4];
        gpu.data(map::alloc(&i), |_| {
            check_eq!(counts(rt, &i, dev)?, Some((1, 0)));
            gpu.data(map::alloc(&i).present(), |_| {
                check_eq!(counts(rt, &i, dev)?, Some((2, 0)));
                Ok(())
            })?;
            check_eq!(counts(rt, &i, dev)?, Some((1, 0)));
            Ok(())
        })?;
        check_eq!(counts(rt, &i, dev)?, None);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_11_target_data_present_on_absent_fails() {
    on_every_device("case 11 (absent)", |rt, dev| {
        let gpu = rt.device(dev)?;
        let i = [0i32; 4];
        let live = rt.pool_usage(dev)?.live_allocations;
        let ran = Cell::new(false);
        let r = gpu.data(map::alloc(&i).present(), |_| {
            ran.set(true);
            Ok(())
        });
        check_not_present(r, HostRange::of(&i), dev)?;
        check!(!ran.get(), "the region body ran although its `present` map failed");
        check_eq!(counts(rt, &i, dev)?, None);
        check_eq!(rt.pool_usage(dev)?.live_allocations, live);
        // The same through the raw API, with an absent item before it in the list: the
        // construct allocates nothing at all.
        let other = [0i32; 8];
        let items = [MapItem::slice(&other, MapType::TO), MapItem::slice(&i, MapType::ALLOC.present())];
        // SAFETY: both arrays outlive the construct (which fails before using them).
        let r = unsafe { rt.target_data_begin(dev, &items) };
        check_not_present(r, HostRange::of(&i), dev)?;
        check!(!rt.is_present(other.as_ptr() as usize, dev)?, "the failed construct mapped `other`");
        check_eq!(rt.pool_usage(dev)?.live_allocations, live);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_12_enter_present_alloc_on_absent_fails() {
    on_every_device("case 12", |rt, dev| {
        let i = [0i32; 4];
        let live = rt.pool_usage(dev)?.live_allocations;
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: `i` is valid for reads during the call.
        let r = unsafe { rt.enter_data(dev, &[MapItem::slice(&i, MapType::ALLOC.present())]) };
        check_not_present(r, HostRange::of(&i), dev)?;
        check!(!rt.is_present(i.as_ptr() as usize, dev)?, "i present after a failed enter");
        check_eq!(rt.pool_usage(dev)?.live_allocations, live);
        check_eq!(rt.transfer_stats(dev)?, s0);
        // `present to` is refused the same way.
        // SAFETY: as above.
        let r = unsafe { rt.enter_data(dev, &[MapItem::slice(&i, MapType::TO.present())]) };
        check_not_present(r, HostRange::of(&i), dev)?;
        check_eq!(rt.transfer_stats(dev)?, s0);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_13_exit_present_delete_twice_fails_the_second_time() {
    on_every_device("case 13 (delete)", |rt, dev| {
        let i = [0i32; 4];
        // SAFETY: `i` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&i, MapType::ALLOC)])? };
        check_eq!(counts(rt, &i, dev)?, Some((1, 0)));
        let del = [MapItem::slice(&i, MapType::DELETE.present())];
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &del)? };
        check_eq!(counts(rt, &i, dev)?, None);
        // SAFETY: as above.
        let r = unsafe { rt.exit_data(dev, &del) };
        check_not_present(r, HostRange::of(&i), dev)?;
        // Without `present` the same exit of an absent range is silently ignored (rule 4).
        // SAFETY: as above.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&i, MapType::DELETE)])? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_13_exit_present_release_twice_fails_the_second_time() {
    on_every_device("case 13 (release)", |rt, dev| {
        let i = [0i32; 4];
        // SAFETY: `i` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&i, MapType::ALLOC)])? };
        let rel = [MapItem::slice(&i, MapType::RELEASE.present())];
        // SAFETY: release copies nothing back.
        unsafe { rt.exit_data(dev, &rel)? };
        check_eq!(counts(rt, &i, dev)?, None);
        // SAFETY: as above.
        let r = unsafe { rt.exit_data(dev, &rel) };
        check_not_present(r, HostRange::of(&i), dev)?;
        // Without `present` the same exit of an absent range is silently ignored (rule 4).
        // SAFETY: as above.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&i, MapType::RELEASE)])? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_13_present_release_at_count_two_keeps_the_entry() {
    on_every_device("case 13 (release at rc 2)", |rt, dev| {
        let i = [0i32; 4];
        let enter = [MapItem::slice(&i, MapType::ALLOC)];
        // SAFETY: `i` is valid for reads during the calls.
        unsafe {
            rt.enter_data(dev, &enter)?;
            rt.enter_data(dev, &enter)?;
        }
        // SAFETY: release copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&i, MapType::RELEASE.present())])? };
        check_eq!(counts(rt, &i, dev)?, Some((1, 0)));
        // SAFETY: as above.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&i, MapType::RELEASE.present())])? };
        check_eq!(counts(rt, &i, dev)?, None);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_14_update_present_on_mapped_moves_data() {
    on_every_device("case 14 (mapped)", |rt, dev| {
        let mut i = [1i32, 2, 3, 4];
        // SAFETY: `i` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&i, MapType::TO)])? };
        i = [5, 6, 7, 8];
        // SAFETY: `i` is valid for reads during the call.
        unsafe { rt.update(dev, UpdateDirection::To, &[(HostRange::of(&i), true)])? };
        check_eq!(device_copy_of(rt, &i, dev)?, vec![5, 6, 7, 8]);
        fill_device(rt, dev, &i, 9)?;
        // SAFETY: `i` is ours and not otherwise accessed during the call.
        unsafe { rt.update(dev, UpdateDirection::From, &[(HostRange::of(&i), true)])? };
        check_eq!(i, [9; 4]);
        check_eq!(counts(rt, &i, dev)?, Some((1, 0)));
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&i, MapType::DELETE)])? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_14_update_present_on_absent_fails() {
    on_every_device("case 14 (absent)", |rt, dev| {
        let i = [1i32, 2, 3, 4];
        let live = rt.pool_usage(dev)?.live_allocations;
        let s0 = rt.transfer_stats(dev)?;
        for dir in [UpdateDirection::To, UpdateDirection::From] {
            // SAFETY: `i` is ours; nothing is mapped, so nothing is copied.
            let r = unsafe { rt.update(dev, dir, &[(HostRange::of(&i), true)]) };
            check_not_present(r, HostRange::of(&i), dev)?;
            // Without `present` an absent range is silently ignored (rule 4).
            // SAFETY: as above.
            unsafe { rt.update(dev, dir, &[(HostRange::of(&i), false)])? };
        }
        check_eq!(i, [1, 2, 3, 4]);
        check_eq!(rt.transfer_stats(dev)?, s0);
        check_eq!(rt.pool_usage(dev)?.live_allocations, live);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_15_present_sub_range_is_fine_super_range_is_extension() {
    on_every_device("case 15", |rt, dev| {
        let arr = [0i32; 10];
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&arr[2..8], MapType::ALLOC)])? };
        let mapped = HostRange::of(&arr[2..8]);

        // A sub-range, by a region and by enter data.
        let gpu = rt.device(dev)?;
        gpu.data(map::alloc(&arr[3..5]).present(), |_| {
            check_eq!(counts(rt, &arr[2..8], dev)?, Some((2, 0)));
            Ok(())
        })?;
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&arr[7..8], MapType::TO.present())])? };
        check_eq!(counts(rt, &arr[2..8], dev)?, Some((2, 0)));

        // Super-ranges: an extension, whichever side sticks out; nothing changes.
        let live = rt.pool_usage(dev)?.live_allocations;
        for sup in [&arr[..], &arr[2..9], &arr[1..8]] {
            let want = HostRange::of(sup);
            // SAFETY: `arr` is valid for reads during the call.
            let r = unsafe { rt.enter_data(dev, &[MapItem::slice(sup, MapType::ALLOC.present())]) };
            let ok = matches!(&r, Err(Error::Extension { device, requested, existing })
                if *device == dev && *requested == want && *existing == mapped);
            check!(ok, "expected an extension error for {want} over {mapped}, got {r:?}");
            let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
            check!(
                msg.contains(&want.to_string()) && msg.contains(&mapped.to_string()),
                "the message does not name both ranges: {msg}"
            );
            let gpu_r = gpu.data(map::alloc(sup).present(), |_| Ok(()));
            check!(matches!(gpu_r, Err(Error::Extension { .. })), "target data: got {gpu_r:?}");
        }
        check_eq!(counts(rt, &arr[2..8], dev)?, Some((2, 0)));
        check_eq!(rt.pool_usage(dev)?.live_allocations, live);
        check_eq!(rt.live_mappings().iter().filter(|(d, _)| *d == dev).count(), 1);

        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&arr[2..8], MapType::DELETE)])? };
        assert_clean(rt, dev)
    });
}

#[test]
fn rule_10_present_is_not_checked_again_at_a_regions_end() {
    on_every_device("rule 10 (target data)", |rt, dev| {
        let i = [0i32; 4];
        let mut b = [1i32; 4];
        // SAFETY: `i` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&i, MapType::ALLOC)])? };
        let region = [MapItem::slice(&i, MapType::ALLOC.present()), MapItem::tofrom(b.as_mut_ptr(), 16)];
        // SAFETY: both arrays outlive the region; `b` is not touched while it is open.
        unsafe { rt.target_data_begin(dev, &region)? };
        fill_device(rt, dev, &b, 7)?;
        // The region's `present` item leaves inside it.
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&i, MapType::DELETE)])? };
        check!(!rt.is_present(i.as_ptr() as usize, dev)?);
        // The end succeeds and unmaps the region's other item, copying it back.
        // SAFETY: matches the begin.
        unsafe { rt.target_data_end(dev, &region)? };
        check_eq!(b, [7; 4]);
        check!(!rt.is_present(b.as_ptr() as usize, dev)?, "b left mapped by the region's end");
        assert_clean(rt, dev)
    });
}

#[test]
fn rule_10_a_safe_region_whose_present_item_was_released_ends_normally() {
    on_every_device("rule 10 (safe API)", |rt, dev| {
        let gpu = rt.device(dev)?;
        let i = [0i32; 4];
        let mut b = [1i32; 4];
        let entered = gpu.enter_data(map::alloc(&i))?;
        gpu.data((map::alloc(&i).present(), map::tofrom(&mut b)), |(_, bv)| {
            gpu.exit_data(map::release(&i))?;
            offload_kernels::fill_i32(&gpu, 3, bv)
        })?;
        check_eq!(b, [3; 4]);
        check_eq!(counts(rt, &b, dev)?, None);
        check_eq!(counts(rt, &i, dev)?, None);
        entered.exit()?; // released inside: nothing left to release
        assert_clean(rt, dev)
    });
}
