//! Cases 16-20 of docs/SEMANTICS.md: overlap and containment.
//!
//! A request inside a mapped range refers to that entry; on entry, one that sticks out of
//! it is an "explicit extension" error that changes nothing; at exit and in `update` it is
//! absent (rule 4).

use offload::{
    map, Entry, Error, HostRange, LaunchArg, MapItem, MapType, Result, Runtime, Scalar, UpdateDirection,
};
use offload_kernels::FILL_I32;
use offload_tests::{assert_clean, check, check_eq, device_copy_of, on_every_device};

/// The entries of device `dev`.
fn table(rt: &Runtime, dev: usize) -> Vec<Entry> {
    rt.live_mappings().into_iter().filter(|(d, _)| *d == dev).map(|(_, e)| e).collect()
}

/// Checks that `r` is an extension error of `requested` over `existing` on `dev`, and that
/// its message names both ranges.
fn check_extension(r: Result<()>, requested: HostRange, existing: HostRange, dev: usize) -> Result<()> {
    let Err(e) = r else {
        check!(false, "{requested} over mapped {existing} was accepted on device {dev}");
        return Ok(());
    };
    check!(
        matches!(e, Error::Extension { device, requested: r, existing: x }
            if device == dev && r == requested && x == existing),
        "expected an extension error of {requested} over {existing} on device {dev}, got {e:?}"
    );
    let msg = e.to_string();
    check!(
        msg.contains(&requested.to_string()) && msg.contains(&existing.to_string()),
        "the message does not name both ranges: {msg}"
    );
    Ok(())
}

/// Sets `n` i32 of the device copy at host address `at` to `v`, with a launch that maps
/// nothing.
fn fill_device_at(rt: &Runtime, dev: usize, at: *const i32, n: usize, v: i32) -> Result<()> {
    // SAFETY: no map list; `at` lies in a range mapped on `dev` (the launch fails
    // otherwise), and the kernel writes n i32 from there, which the translation bounds.
    unsafe {
        rt.target_launch(dev, &FILL_I32, n, &[], &[LaunchArg::Value(Scalar::I32(v)), LaunchArg::mapped(at)])
    }
}

#[test]
fn case_16_partial_overlap_is_an_extension_error() {
    on_every_device("case 16", |rt, dev| {
        let arr = [0i32; 10];
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&arr[0..2], MapType::ALLOC)])? };
        let before = table(rt, dev);
        let live = rt.pool_usage(dev)?.live_allocations;
        let existing = HostRange::of(&arr[0..2]);

        // Extends past the end, through each construct that maps.
        let past = HostRange::of(&arr[1..3]);
        // SAFETY: `arr` is valid for reads during the call.
        let r = unsafe { rt.enter_data(dev, &[MapItem::slice(&arr[1..3], MapType::ALLOC)]) };
        check_extension(r, past, existing, dev)?;
        // SAFETY: `arr` is valid for reads until the (failing) construct returns.
        let r = unsafe { rt.target_data_begin(dev, &[MapItem::slice(&arr[1..3], MapType::ALLOC)]) };
        check_extension(r, past, existing, dev)?;
        let r = rt.device(dev)?.data(map::alloc(&arr[1..3]), |_| Ok(()));
        check_extension(r, past, existing, dev)?;
        // A whole list fails, an absent item before the extension included.
        let list = [MapItem::slice(&arr[8..10], MapType::TO), MapItem::slice(&arr[1..3], MapType::ALLOC)];
        // SAFETY: `arr` is valid for reads during the call.
        let r = unsafe { rt.enter_data(dev, &list) };
        check_extension(r, past, existing, dev)?;
        check!(!rt.is_present(arr[8..].as_ptr() as usize, dev)?, "the failed construct mapped arr[8:2]");
        // At exit and in updates such a range is absent (rule 4): ignored, or with
        // `present` an error; either way nothing changes.
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: release copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&arr[1..3], MapType::RELEASE)])? };
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.update(dev, UpdateDirection::To, &[(past, false)])? };
        check_eq!(rt.transfer_stats(dev)?, s0);
        // SAFETY: as above.
        let r = unsafe { rt.exit_data(dev, &[MapItem::slice(&arr[1..3], MapType::RELEASE.present())]) };
        check!(
            matches!(r, Err(Error::NotPresent { device, range, .. }) if device == dev && range == past),
            "{r:?}"
        );
        // SAFETY: as above.
        let r = unsafe { rt.update(dev, UpdateDirection::To, &[(past, true)]) };
        check!(
            matches!(r, Err(Error::NotPresent { device, range, .. }) if device == dev && range == past),
            "{r:?}"
        );

        check_eq!(table(rt, dev), before);
        check_eq!(rt.pool_usage(dev)?.live_allocations, live);
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&arr[0..2], MapType::DELETE)])? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_16_starting_before_or_covering_is_an_extension_error() {
    on_every_device("case 16 (starts before)", |rt, dev| {
        let arr = [0i32; 10];
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&arr[5..7], MapType::ALLOC)])? };
        let before = table(rt, dev);
        let existing = HostRange::of(&arr[5..7]);
        for req in [&arr[4..6], &arr[4..8], &arr[..]] {
            // SAFETY: `arr` is valid for reads during the call.
            let r = unsafe { rt.enter_data(dev, &[MapItem::slice(req, MapType::ALLOC)]) };
            check_extension(r, HostRange::of(req), existing, dev)?;
        }
        check_eq!(table(rt, dev), before);
        // Adjacent ranges do not overlap: they are separate entries.
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&arr[3..5], MapType::ALLOC)])? };
        check_eq!(table(rt, dev).len(), 2);
        // SAFETY: delete copies nothing back.
        unsafe {
            rt.exit_data(
                dev,
                &[MapItem::slice(&arr[3..5], MapType::DELETE), MapItem::slice(&arr[5..7], MapType::DELETE)],
            )?
        };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_17_sub_range_refers_to_the_enclosing_entry() {
    on_every_device("case 17", |rt, dev| {
        let mut arr = vec![0i32; 100];
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&arr, MapType::ALLOC)])? };
        let big = rt.entry(arr.as_ptr() as usize, dev)?.ok_or(Error::NotPresent {
            device: dev,
            range: HostRange::of(&arr),
            what: "case 17",
            name: None,
        })?;
        // Give the (uninitialised) device copy known contents.
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.update(dev, UpdateDirection::To, &[(HostRange::of(&arr), false)])? };
        let s0 = rt.transfer_stats(dev)?;
        let tail = MapItem::tofrom(arr[98..].as_mut_ptr(), 8);
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[tail])? };
        // Present already: no copy, no new entry, the count of the big one goes up.
        check_eq!(rt.transfer_stats(dev)?, s0);
        let t = table(rt, dev);
        check_eq!(t.len(), 1);
        check_eq!(t[0].range, HostRange::of(&arr));
        check_eq!((t[0].ref_count, t[0].hold_count), (2, 0));
        check_eq!(t[0].device_addr, big.device_addr);
        let at98 = rt.mapped_ptr(arr[98..].as_ptr() as usize, dev)?;
        check_eq!(at98, Some(big.device_addr + 98 * 4));
        // A kernel given &arr[98] writes the big entry's elements 98 and 99.
        fill_device_at(rt, dev, arr[98..].as_ptr(), 2, 4)?;
        let dev_copy = device_copy_of(rt, &arr, dev)?;
        check!(dev_copy[98..] == [4, 4], "device copy ends in {:?}", &dev_copy[98..]);
        check!(dev_copy[..98].iter().all(|&v| v == 0), "the kernel wrote outside arr[98:2]");
        // Exiting the sub-range decrements the big entry; at rc 1 nothing is copied back.
        let s1 = rt.transfer_stats(dev)?;
        // SAFETY: `arr` is ours and not otherwise accessed during the call.
        unsafe { rt.exit_data(dev, &[tail])? };
        check_eq!(rt.transfer_stats(dev)?, s1);
        check_eq!(rt.entry(arr.as_ptr() as usize, dev)?.map(|e| e.ref_count), Some(1));
        check_eq!(arr[98..], [0, 0]);
        // The last exit of the sub-range releases the whole entry and copies back only
        // the sub-range.
        // SAFETY: as above.
        unsafe { rt.exit_data(dev, &[tail])? };
        let s2 = rt.transfer_stats(dev)?;
        check_eq!((s2.from_device - s1.from_device, s2.from_device_bytes - s1.from_device_bytes), (1, 8));
        check_eq!(arr[98..], [4, 4]);
        check!(arr[..98].iter().all(|&v| v == 0), "more than arr[98:2] was copied back");
        assert_clean(rt, dev)
    });
}

#[test]
fn case_18_presence_is_by_containment() {
    on_every_device("case 18", |rt, dev| {
        let arr = [0i32; 100];
        let at = |i: usize| &arr[i] as *const i32 as usize;
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&arr[50..52], MapType::ALLOC)])? };
        check!(rt.is_present(at(50), dev)?, "&arr[50] not present");
        check!(rt.is_present(at(51), dev)?, "&arr[51] not present");
        check!(rt.is_present(at(51) + 3, dev)?, "the last byte of arr[51] not present");
        check!(!rt.is_present(at(52), dev)?, "&arr[52] (one past the end) present");
        check!(!rt.is_present(at(0), dev)?, "&arr[0] present");
        check!(!rt.is_present(at(49), dev)?, "&arr[49] present");
        check!(!rt.is_present(at(50) - 1, dev)?, "the byte before arr[50] present");
        let base = rt.mapped_ptr(at(50), dev)?;
        check!(base.is_some(), "no mapped pointer for &arr[50]");
        check_eq!(rt.mapped_ptr(at(51), dev)?, base.map(|b| b + 4));
        check_eq!(rt.mapped_ptr(at(49), dev)?, None);
        // SAFETY: release copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&arr[50..52], MapType::RELEASE)])? };
        check!(!rt.is_present(at(50), dev)?, "&arr[50] present after the exit");
        assert_clean(rt, dev)
    });
}

#[test]
fn case_19_delete_inside_target_data_ends_the_region_entry() {
    on_every_device("case 19", |rt, dev| {
        let mut arr = vec![0i32; 100];
        let region = [MapItem::tofrom(arr.as_mut_ptr(), 400)];
        // SAFETY: `arr` stays alive and unaliased until the matching target_data_end.
        unsafe { rt.target_data_begin(dev, &region)? };
        check_eq!(rt.entry(arr.as_ptr() as usize, dev)?.map(|e| (e.ref_count, e.hold_count)), Some((1, 0)));
        // One reference count (rule 7): `exit data delete` removes the region's entry at
        // once, copying nothing.
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&arr, MapType::DELETE)])? };
        check_eq!(rt.entry(arr.as_ptr() as usize, dev)?, None);
        // `enter data alloc arr[98:2]` makes a new, small entry.
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&arr[98..], MapType::ALLOC)])? };
        let t = table(rt, dev);
        check_eq!(t.len(), 1);
        check_eq!((t[0].range, t[0].ref_count, t[0].hold_count), (HostRange::of(&arr[98..]), 1, 0));
        fill_device_at(rt, dev, arr[98..].as_ptr(), 2, 7)?;
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: matches the begin above; `arr` is not otherwise accessed during the call.
        unsafe { rt.target_data_end(dev, &region)? };
        // arr[0:100] is not wholly inside a mapped range: absent at the region's end, so
        // nothing of it comes back and the small entry keeps its count (rule 4).
        check_eq!(rt.transfer_stats(dev)?, s0);
        check!(arr.iter().all(|&v| v == 0), "the region end copied back: {:?}", &arr[96..]);
        check_eq!(
            rt.entry(arr[98..].as_ptr() as usize, dev)?.map(|e| (e.ref_count, e.hold_count)),
            Some((1, 0))
        );
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&arr[98..], MapType::DELETE)])? };
        check_eq!(rt.transfer_stats(dev)?, s0);
        check!(arr.iter().all(|&v| v == 0), "delete copied back");
        assert_clean(rt, dev)
    });
}

#[test]
fn case_20_update_of_a_sub_range_moves_exactly_its_bytes() {
    on_every_device("case 20", |rt, dev| {
        let mut arr = [1i32, 2, 3, 4, 5];
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&arr, MapType::TO)])? };
        arr = [10, 20, 30, 40, 50];
        let sub = HostRange::of(&arr[2..5]);
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: `arr` is valid for reads during the call.
        unsafe { rt.update(dev, UpdateDirection::To, &[(sub, false)])? };
        let s1 = rt.transfer_stats(dev)?;
        check_eq!((s1.to_device - s0.to_device, s1.to_device_bytes - s0.to_device_bytes), (1, 12));
        check_eq!((s1.from_device, s1.from_device_bytes), (s0.from_device, s0.from_device_bytes));
        check_eq!(device_copy_of(rt, &arr, dev)?, vec![1, 2, 30, 40, 50]);

        fill_device_at(rt, dev, arr.as_ptr(), 5, 9)?;
        let s2 = rt.transfer_stats(dev)?;
        // SAFETY: `arr` is ours and not otherwise accessed during the call.
        unsafe { rt.update(dev, UpdateDirection::From, &[(sub, false)])? };
        let s3 = rt.transfer_stats(dev)?;
        check_eq!((s3.from_device - s2.from_device, s3.from_device_bytes - s2.from_device_bytes), (1, 12));
        check_eq!((s3.to_device, s3.to_device_bytes), (s2.to_device, s2.to_device_bytes));
        check_eq!(arr, [10, 20, 9, 9, 9]);
        check_eq!(rt.entry(arr.as_ptr() as usize, dev)?.map(|e| (e.ref_count, e.hold_count)), Some((1, 0)));
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&arr, MapType::DELETE)])? };
        assert_clean(rt, dev)
    });
}
