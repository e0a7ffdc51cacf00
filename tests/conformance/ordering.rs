//! Cases 42-45: a construct changes each item's count once and copies by its whole map
//! list (OpenMP 5.x; not LLVM 19's libomptarget).

use offload::{Error, HostRange, LaunchArg, MapItem, MapType, Scalar};
use offload_kernels::{ADD_I32, FILL_I32};
use offload_tests::{assert_clean, check, check_eq, device_copy_of, fails, on_every_device};

fn set(v: i32, x: &[i32]) -> [LaunchArg; 2] {
    [LaunchArg::Value(Scalar::I32(v)), LaunchArg::mapped(x.as_ptr())]
}

#[test]
fn case_42_target_data_alloc_from_alloc_copies_back() {
    on_every_device("case 42", |rt, dev| {
        let mut x = [0i32];
        let xp = x.as_ptr() as usize;
        let list = [
            MapItem::slice_mut(&mut x, MapType::ALLOC),
            MapItem::slice_mut(&mut x, MapType::FROM),
            MapItem::slice_mut(&mut x, MapType::ALLOC),
        ];
        // SAFETY: `x` outlives the region and is not touched while it is open.
        unsafe { rt.target_data_begin(dev, &list)? };
        // The region counted `x` once.
        check!(rt.entry(xp, dev)?.is_some_and(|e| e.ref_count == 1 && e.hold_count == 0));
        let present = [MapItem::slice(&x, MapType::ALLOC.present())];
        // SAFETY: `x` is mapped; the kernel writes its device copy.
        unsafe { rt.target_launch(dev, &FILL_I32, 1, &present, &set(222, &x))? };
        check!(rt.entry(xp, dev)?.is_some_and(|e| e.ref_count == 1));
        check_eq!(x[0], 0);
        let before = rt.transfer_stats(dev)?;
        // SAFETY: as for the begin.
        unsafe { rt.target_data_end(dev, &list)? };
        check_eq!(x[0], 222);
        // One copy back, however often the list names `x`.
        check_eq!(rt.transfer_stats(dev)?.from_device, before.from_device + 1);
        check!(!rt.is_present(xp, dev)?);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_43_launch_alloc_from_to_alloc_copies_in() {
    on_every_device("case 43", |rt, dev| {
        let mut x = [111i32];
        let xp = x.as_ptr() as usize;
        let list = [
            MapItem::slice_mut(&mut x, MapType::ALLOC),
            MapItem::slice_mut(&mut x, MapType::FROM),
            MapItem::slice_mut(&mut x, MapType::TO),
            MapItem::slice_mut(&mut x, MapType::ALLOC),
        ];
        let before = rt.transfer_stats(dev)?;
        // SAFETY: `x` is not touched during the launch.
        unsafe { rt.target_launch(dev, &ADD_I32, 1, &list, &set(111, &x))? };
        check_eq!(x[0], 222);
        let after = rt.transfer_stats(dev)?;
        check_eq!((after.to_device - before.to_device, after.from_device - before.from_device), (1, 1));
        check!(!rt.is_present(xp, dev)?);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_44_exit_delete_from_delete_inside_target_data_copies_back() {
    on_every_device("case 44", |rt, dev| {
        let mut x = [5i32];
        let xp = x.as_ptr() as usize;
        let outer = [MapItem::slice(&x, MapType::ALLOC)];
        // SAFETY: `x` outlives the region.
        unsafe { rt.target_data_begin(dev, &outer)? };
        let before = rt.transfer_stats(dev)?;
        // Present already: enter `alloc(x) to(x)` counts once and copies nothing.
        // SAFETY: `x` is alive.
        unsafe {
            rt.enter_data(dev, &[MapItem::slice(&x, MapType::ALLOC), MapItem::slice(&x, MapType::TO)])?
        };
        check_eq!(rt.transfer_stats(dev)?.to_device, before.to_device);
        check!(rt.entry(xp, dev)?.is_some_and(|e| e.ref_count == 2 && e.hold_count == 0));
        // SAFETY: `x` is mapped.
        unsafe { rt.target_launch(dev, &FILL_I32, 1, &[], &set(222, &x))? };
        let exit = [
            MapItem::slice_mut(&mut x, MapType::DELETE),
            MapItem::slice_mut(&mut x, MapType::FROM),
            MapItem::slice_mut(&mut x, MapType::DELETE),
        ];
        // SAFETY: `x` is writable and not otherwise used.
        unsafe { rt.exit_data(dev, &exit)? };
        check_eq!(x[0], 222);
        check_eq!(rt.transfer_stats(dev)?.from_device, before.from_device + 1);
        // One reference count: the exit took it to 0 (delete), so the entry left.
        check!(!rt.is_present(xp, dev)?, "delete inside the region left the entry");
        x[0] = 1;
        // SAFETY: as for the begin; the region's end finds `x` absent.
        unsafe { rt.target_data_end(dev, &outer)? };
        check_eq!(x[0], 1);
        check!(!rt.is_present(xp, dev)?);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_44_enter_alloc_to_of_an_absent_range_copies() {
    on_every_device("case 44 (absent x)", |rt, dev| {
        let x = [321i32; 4];
        let xp = x.as_ptr() as usize;
        let before = rt.transfer_stats(dev)?;
        // SAFETY: `x` is alive until the end of the case.
        unsafe {
            rt.enter_data(dev, &[MapItem::slice(&x, MapType::ALLOC), MapItem::slice(&x, MapType::TO)])?
        };
        check_eq!(rt.transfer_stats(dev)?.to_device, before.to_device + 1);
        check!(rt.entry(xp, dev)?.is_some_and(|e| e.ref_count == 1 && e.hold_count == 0));
        check_eq!(device_copy_of(rt, &x, dev)?, vec![321; 4]);
        // `to(x) to(x)` on a fresh range copies once.
        let y = [7i32; 4];
        let before = rt.transfer_stats(dev)?;
        // SAFETY: `y` is alive until the end of the case.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&y, MapType::TO), MapItem::slice(&y, MapType::TO)])? };
        check_eq!(rt.transfer_stats(dev)?.to_device, before.to_device + 1);
        check!(rt.entry(y.as_ptr() as usize, dev)?.is_some_and(|e| e.ref_count == 1));
        // SAFETY: both alive.
        unsafe {
            rt.exit_data(dev, &[MapItem::slice(&x, MapType::RELEASE)])?;
            rt.exit_data(dev, &[MapItem::slice(&y, MapType::RELEASE)])?;
        }
        assert_clean(rt, dev)
    });
}

#[test]
fn case_45_present_after_alloc_in_one_list_is_not_present_on_entry() {
    on_every_device("case 45", |rt, dev| {
        let mut x = [9i32; 2];
        let xp = x.as_ptr() as usize;
        let list = [
            MapItem::slice_mut(&mut x, MapType::ALLOC),
            MapItem::slice_mut(&mut x, MapType::ALLOC.present()),
            MapItem::slice_mut(&mut x, MapType::TOFROM),
        ];
        let before = rt.transfer_stats(dev)?;
        // SAFETY: `x` is not touched during the launch; it is expected to fail before running.
        let e = fails(unsafe { rt.target_launch(dev, &FILL_I32, 2, &list, &set(1, &x)) }, "case 45 launch")?;
        let want = HostRange::new(xp, 8);
        check!(
            matches!(e, Error::NotPresent { device, range, .. } if device == dev && range == want),
            "{e:?}"
        );
        let msg = e.to_string();
        check!(msg.contains("not present") && msg.contains("on entry"), "{msg}");
        check!(msg.contains(&format!("{xp:#x}")) && msg.contains("(8 bytes)"), "{msg}");
        // Nothing ran, nothing was copied, nothing is left mapped or allocated.
        check_eq!(x, [9, 9]);
        check_eq!(rt.transfer_stats(dev)?, before);
        check!(!rt.is_present(xp, dev)?);
        // The same list on `target data` and `enter data` fails the same way.
        // SAFETY: expected to fail before touching `x`.
        let e = fails(unsafe { rt.target_data_begin(dev, &list[..2]) }, "target data")?;
        check!(matches!(e, Error::NotPresent { .. }), "{e:?}");
        // SAFETY: as above.
        let e = fails(unsafe { rt.enter_data(dev, &list[..2]) }, "enter data")?;
        check!(matches!(e, Error::NotPresent { .. }), "{e:?}");
        assert_clean(rt, dev)
    });
}
