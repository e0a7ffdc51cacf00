//! Cases 24-25 of CONFORMANCE.md: structured and dynamic counts.
//!
//! Structured regions count in the structured count, enter/exit data in the dynamic count;
//! `exit data` never removes an entry a region holds (rule 7): `delete` only zeroes the
//! dynamic count.

use offload::{map, MapItem, MapType, Result, Runtime};
use offload_tests::{assert_clean, check, check_eq, device_copy_of, fill_device, on_every_device};

/// The (dynamic, structured) counts of the entry holding `x`, `None` when absent.
fn counts<T>(rt: &Runtime, x: &[T], dev: usize) -> Result<Option<(u64, u64)>> {
    Ok(rt.entry(x.as_ptr() as usize, dev)?.map(|e| (e.dynamic, e.structured)))
}

#[test]
fn case_24_exit_data_inside_a_region_removes_nothing() {
    on_every_device("case 24", |rt, dev| {
        let mut m = [1i32; 4];
        let mut r = [2i32; 4];
        let mut d = [3i32; 4];
        let region = [
            MapItem::raw(m.as_mut_ptr(), 16, MapType::TOFROM),
            MapItem::raw(r.as_mut_ptr(), 16, MapType::TOFROM),
            MapItem::raw(d.as_mut_ptr(), 16, MapType::TOFROM),
        ];
        // SAFETY: the arrays stay alive and unaliased until the matching target_data_end.
        unsafe { rt.target_data_begin(dev, &region)? };
        for x in [&m, &r, &d] {
            check_eq!(counts(rt, x, dev)?, Some((0, 1)));
            fill_device(rt, dev, x, 9)?;
        }
        let s0 = rt.transfer_stats(dev)?;
        let exits = [
            MapItem::raw(m.as_mut_ptr(), 16, MapType::FROM),
            MapItem::slice(&r, MapType::RELEASE),
            MapItem::slice(&d, MapType::DELETE),
        ];
        // SAFETY: `m` is ours and not otherwise accessed during the call.
        unsafe { rt.exit_data(dev, &exits)? };
        // Each exit on its own too.
        for item in exits {
            // SAFETY: as above.
            unsafe { rt.exit_data(dev, &[item])? };
        }
        // All stay present with their structured count; `from(m)` did not copy, since
        // the entry did not leave.
        check_eq!(rt.transfer_stats(dev)?, s0);
        check_eq!((m, r, d), ([1; 4], [2; 4], [3; 4]));
        for x in [&m, &r, &d] {
            check!(rt.is_present(x.as_ptr() as usize, dev)?, "an entry left inside the region");
            check_eq!(counts(rt, x, dev)?, Some((0, 1)));
            check_eq!(device_copy_of(rt, x, dev)?, vec![9; 4]);
        }
        // SAFETY: matches the begin above; the arrays are not otherwise accessed.
        unsafe { rt.target_data_end(dev, &region)? };
        check_eq!((m, r, d), ([9; 4], [9; 4], [9; 4]));
        for x in [&m, &r, &d] {
            check!(!rt.is_present(x.as_ptr() as usize, dev)?, "an entry outlived the region");
        }
        assert_clean(rt, dev)
    });
}

#[test]
fn case_24_exit_data_inside_a_safe_region_removes_nothing() {
    on_every_device("case 24 (safe API)", |rt, dev| {
        let gpu = rt.device(dev)?;
        let r = [2i32; 4];
        let d = [3i32; 4];
        gpu.data((map::alloc(&r), map::alloc(&d)), |(rv, dv)| {
            gpu.exit_data((map::release(&r), map::delete(&d)))?;
            gpu.exit_data(map::delete(&r))?;
            check!(rt.is_present(r.as_ptr() as usize, dev)?, "r left inside the region");
            check!(rt.is_present(d.as_ptr() as usize, dev)?, "d left inside the region");
            offload_kernels::fill_i32(&gpu, 5, rv)?;
            offload_kernels::fill_i32(&gpu, 6, dv)
        })?;
        check!(!rt.is_present(r.as_ptr() as usize, dev)?, "r outlived the region");
        check!(!rt.is_present(d.as_ptr() as usize, dev)?, "d outlived the region");
        assert_clean(rt, dev)
    });
}

#[test]
fn case_25_delete_zeroes_only_the_dynamic_count() {
    on_every_device("case 25 (enter, then region)", |rt, dev| {
        let mut x = [1i32; 4];
        let enter = [MapItem::slice(&x, MapType::TO)];
        // SAFETY: `x` is valid for reads during the calls.
        unsafe {
            rt.enter_data(dev, &enter)?;
            rt.enter_data(dev, &enter)?;
        }
        let region = [MapItem::raw(x.as_mut_ptr(), 16, MapType::TOFROM)];
        // SAFETY: `x` stays alive and unaliased until the matching target_data_end.
        unsafe { rt.target_data_begin(dev, &region)? };
        check_eq!(counts(rt, &x, dev)?, Some((2, 1)));
        fill_device(rt, dev, &x, 9)?;
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&x, MapType::DELETE)])? };
        check_eq!(counts(rt, &x, dev)?, Some((0, 1)));
        check!(rt.is_present(x.as_ptr() as usize, dev)?, "delete removed an entry a region holds");
        check_eq!(rt.transfer_stats(dev)?, s0);
        check_eq!(x, [1; 4]);
        // SAFETY: matches the begin above; `x` is not otherwise accessed during the call.
        unsafe { rt.target_data_end(dev, &region)? };
        // The region's end releases the entry: `tofrom` copies back.
        let s1 = rt.transfer_stats(dev)?;
        check_eq!(s1.from_device - s0.from_device, 1);
        check_eq!(x, [9; 4]);
        check_eq!(counts(rt, &x, dev)?, None);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_25_delete_inside_a_region_then_region_ends() {
    on_every_device("case 25 (region, then enter)", |rt, dev| {
        let gpu = rt.device(dev)?;
        let mut x = [1i32; 4];
        gpu.data(map::tofrom(&mut x), |v| {
            let h = v.host_range();
            let item = MapItem::raw(h.begin as *const i32, h.bytes, MapType::ALLOC);
            // SAFETY: the region keeps `x` borrowed and alive; alloc copies nothing.
            unsafe { rt.enter_data(dev, &[item, item])? };
            // One construct counts an entry once (rule 2).
            check_eq!(rt.entry(h.begin, dev)?.map(|e| (e.dynamic, e.structured)), Some((1, 1)));
            // SAFETY: as above.
            unsafe { rt.enter_data(dev, &[item])? };
            check_eq!(rt.entry(h.begin, dev)?.map(|e| (e.dynamic, e.structured)), Some((2, 1)));
            let del = MapItem { map_type: MapType::DELETE, ..item };
            // SAFETY: delete copies nothing back.
            unsafe { rt.exit_data(dev, &[del])? };
            check_eq!(rt.entry(h.begin, dev)?.map(|e| (e.dynamic, e.structured)), Some((0, 1)));
            offload_kernels::fill_i32(&gpu, 8, v)
        })?;
        check_eq!(x, [8; 4]);
        check_eq!(counts(rt, &x, dev)?, None);
        assert_clean(rt, dev)
    });
}
