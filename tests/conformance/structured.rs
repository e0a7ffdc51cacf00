//! Cases 24-25 of docs/SEMANTICS.md: the one reference count and the `hold` count.
//!
//! Every construct moves the same reference count (rule 7); maps with the `hold` modifier
//! move the hold count instead, and `exit data` never removes an entry whose hold count is
//! above 0: `delete` only zeroes the reference count.

use offload::{map, MapItem, MapType, Result, Runtime};
use offload_tests::{assert_clean, check, check_eq, device_copy_of, fill_device, on_every_device};

/// The (reference, hold) counts of the entry holding `x`, `None` when absent.
fn counts<T>(rt: &Runtime, x: &[T], dev: usize) -> Result<Option<(u64, u64)>> {
    Ok(rt.entry(x.as_ptr() as usize, dev)?.map(|e| (e.ref_count, e.hold_count)))
}

/// `exit data from(m) release(r) delete(d)` (all at once, then each on its own).
///
/// # Safety
/// `m` is valid for writes and not otherwise accessed during the calls.
unsafe fn exit_m_r_d(rt: &Runtime, dev: usize, m: *mut i32, r: &[i32], d: &[i32]) -> Result<()> {
    let exits =
        [MapItem::from(m, 16), MapItem::slice(r, MapType::RELEASE), MapItem::slice(d, MapType::DELETE)];
    // SAFETY: forwarded from the caller.
    unsafe { rt.exit_data(dev, &exits)? };
    for item in exits {
        // SAFETY: as above.
        unsafe { rt.exit_data(dev, &[item])? };
    }
    Ok(())
}

#[test]
fn case_24_exit_data_inside_a_hold_region_removes_nothing() {
    on_every_device("case 24 (hold)", |rt, dev| {
        let mut m = [1i32; 4];
        let r = [2i32; 4];
        let d = [3i32; 4];
        let region = [
            MapItem::from(m.as_mut_ptr(), 16).hold(),
            MapItem::slice(&r, MapType::ALLOC.hold()),
            MapItem::slice(&d, MapType::ALLOC.hold()),
        ];
        // SAFETY: the arrays stay alive and unaliased until the matching target_data_end.
        unsafe { rt.target_data_begin(dev, &region)? };
        for x in [&m, &r, &d] {
            check_eq!(counts(rt, x, dev)?, Some((0, 1)));
            fill_device(rt, dev, x, 9)?;
        }
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: `m` is ours and not otherwise accessed during the calls.
        unsafe { exit_m_r_d(rt, dev, m.as_mut_ptr(), &r, &d)? };
        // All stay present with their hold count; `from(m)` did not copy, since the entry
        // did not leave.
        check_eq!(rt.transfer_stats(dev)?, s0);
        check_eq!((m, r, d), ([1; 4], [2; 4], [3; 4]));
        for x in [&m, &r, &d] {
            check!(rt.is_present(x.as_ptr() as usize, dev)?, "an entry left inside the hold region");
            check_eq!(counts(rt, x, dev)?, Some((0, 1)));
            check_eq!(device_copy_of(rt, x, dev)?, vec![9; 4]);
        }
        let s1 = rt.transfer_stats(dev)?;
        // SAFETY: matches the begin above; the arrays are not otherwise accessed.
        unsafe { rt.target_data_end(dev, &region)? };
        // The region's end releases all three: only `from(m)` copies back.
        check_eq!((m, r, d), ([9; 4], [2; 4], [3; 4]));
        check_eq!(rt.transfer_stats(dev)?.from_device - s1.from_device, 1);
        for x in [&m, &r, &d] {
            check!(!rt.is_present(x.as_ptr() as usize, dev)?, "an entry outlived the region");
        }
        assert_clean(rt, dev)
    });
}

#[test]
fn case_24_without_hold_exit_data_removes_each_at_once() {
    on_every_device("case 24 (no hold)", |rt, dev| {
        let mut m = [1i32; 4];
        let r = [2i32; 4];
        let d = [3i32; 4];
        let region = [
            MapItem::from(m.as_mut_ptr(), 16),
            MapItem::slice(&r, MapType::ALLOC),
            MapItem::slice(&d, MapType::ALLOC),
        ];
        // SAFETY: the arrays stay alive and unaliased until the matching target_data_end.
        unsafe { rt.target_data_begin(dev, &region)? };
        for x in [&m, &r, &d] {
            check_eq!(counts(rt, x, dev)?, Some((1, 0)));
            fill_device(rt, dev, x, 9)?;
        }
        let s0 = rt.transfer_stats(dev)?;
        let exits = [
            MapItem::from(m.as_mut_ptr(), 16),
            MapItem::slice(&r, MapType::RELEASE),
            MapItem::slice(&d, MapType::DELETE),
        ];
        // SAFETY: `m` is ours and not otherwise accessed during the call.
        unsafe { rt.exit_data(dev, &exits)? };
        // One count: the exit took each entry to 0, so each left, and `m` came back then.
        check_eq!((m, r, d), ([9; 4], [2; 4], [3; 4]));
        check_eq!(rt.transfer_stats(dev)?.from_device - s0.from_device, 1);
        for x in [&m, &r, &d] {
            check!(!rt.is_present(x.as_ptr() as usize, dev)?, "exit data left an entry in place");
        }
        m = [4; 4];
        // SAFETY: matches the begin above; the arrays are not otherwise accessed.
        unsafe { rt.target_data_end(dev, &region)? };
        // The region's end finds them absent and does nothing (no copy over the new `m`).
        check_eq!(m, [4; 4]);
        check_eq!(rt.transfer_stats(dev)?.from_device - s0.from_device, 1);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_24_exit_data_inside_a_safe_hold_region_removes_nothing() {
    on_every_device("case 24 (safe API)", |rt, dev| {
        let gpu = rt.device(dev)?;
        let r = [2i32; 4];
        let d = [3i32; 4];
        gpu.data((map::alloc(&r).hold(), map::alloc(&d).hold()), |(rv, dv)| {
            gpu.exit_data((map::release(&r), map::delete(&d)))?;
            gpu.exit_data(map::delete(&r))?;
            check!(rt.is_present(r.as_ptr() as usize, dev)?, "r left inside the region");
            check!(rt.is_present(d.as_ptr() as usize, dev)?, "d left inside the region");
            // The hand-written kernel: the views are of `alloc` maps (shared borrows), which
            // the generated launchers refuse for `&mut` arguments.
            gpu.launch(&offload_kernels::FILL_I32, rv.len(), (5i32, rv))?;
            gpu.launch(&offload_kernels::FILL_I32, dv.len(), (6i32, dv))
        })?;
        check!(!rt.is_present(r.as_ptr() as usize, dev)?, "r outlived the region");
        check!(!rt.is_present(d.as_ptr() as usize, dev)?, "d outlived the region");
        // Without `hold` the same exits end the region's entries at once.
        gpu.data(map::alloc(&r), |_| {
            gpu.exit_data(map::release(&r))?;
            check!(!rt.is_present(r.as_ptr() as usize, dev)?, "release kept an entry of a plain region");
            Ok(())
        })?;
        assert_clean(rt, dev)
    });
}

#[test]
fn case_24_hold_is_refused_on_enter_and_exit_data() {
    on_every_device("case 24 (hold on enter/exit data)", |rt, dev| {
        let x = [1i32; 4];
        for item in [MapItem::slice(&x, MapType::TO.hold()), MapItem::slice(&x, MapType::ALLOC.hold())] {
            // SAFETY: `x` is valid for reads; the call is refused before anything happens.
            let e = unsafe { rt.enter_data(dev, &[item]) }.unwrap_err().to_string();
            check!(e.contains("hold") && e.contains("target enter data"), "{e}");
        }
        // SAFETY: as above.
        let e = unsafe { rt.exit_data(dev, &[MapItem::slice(&x, MapType::RELEASE.hold())]) }.unwrap_err();
        check!(e.to_string().contains("target exit data"), "{e}");
        assert_clean(rt, dev)
    });
}

#[test]
fn case_25_delete_zeroes_only_the_reference_count() {
    on_every_device("case 25 (enter, then hold region)", |rt, dev| {
        let x = [1i32; 4];
        let enter = [MapItem::slice(&x, MapType::TO)];
        // SAFETY: `x` is valid for reads during the calls.
        unsafe {
            rt.enter_data(dev, &enter)?;
            rt.enter_data(dev, &enter)?;
        }
        let region = [MapItem::slice(&x, MapType::ALLOC.hold())];
        // SAFETY: `x` stays alive until the matching target_data_end; alloc copies nothing.
        unsafe { rt.target_data_begin(dev, &region)? };
        check_eq!(counts(rt, &x, dev)?, Some((2, 1)));
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&x, MapType::DELETE)])? };
        check_eq!(counts(rt, &x, dev)?, Some((0, 1)));
        check!(rt.is_present(x.as_ptr() as usize, dev)?, "delete removed an entry a hold map holds");
        check_eq!(rt.transfer_stats(dev)?, s0);
        // SAFETY: matches the begin above.
        unsafe { rt.target_data_end(dev, &region)? };
        // The hold region's end takes the last count: the entry leaves (alloc: no copy).
        check_eq!(counts(rt, &x, dev)?, None);
        check_eq!(rt.transfer_stats(dev)?, s0);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_25_delete_inside_a_hold_region_then_region_ends() {
    on_every_device("case 25 (hold region, then enter)", |rt, dev| {
        let gpu = rt.device(dev)?;
        let mut x = [1i32; 4];
        gpu.data(map::tofrom(&mut x).hold(), |v| {
            let h = v.host_range();
            let item = MapItem::alloc(h.begin as *const i32, h.bytes);
            // SAFETY: the region keeps `x` borrowed and alive; alloc copies nothing.
            unsafe { rt.enter_data(dev, &[item, item])? };
            // One construct counts an entry once (rule 2).
            check_eq!(rt.entry(h.begin, dev)?.map(|e| (e.ref_count, e.hold_count)), Some((1, 1)));
            // SAFETY: as above.
            unsafe { rt.enter_data(dev, &[item])? };
            check_eq!(rt.entry(h.begin, dev)?.map(|e| (e.ref_count, e.hold_count)), Some((2, 1)));
            let del = MapItem { map_type: MapType::DELETE, ..item };
            // SAFETY: delete copies nothing back.
            unsafe { rt.exit_data(dev, &[del])? };
            check_eq!(rt.entry(h.begin, dev)?.map(|e| (e.ref_count, e.hold_count)), Some((0, 1)));
            offload_kernels::fill_i32(&gpu, 8, v)
        })?;
        // The hold region released the entry: its `tofrom` copied back.
        check_eq!(x, [8; 4]);
        check_eq!(counts(rt, &x, dev)?, None);
        assert_clean(rt, dev)
    });
}
