//! Cases 26-31: `associate_ptr` / `disassociate_ptr` and `get_mapped_ptr`.

use offload::{Error, HostRange, InfoFlags, LaunchArg, MapItem, MapType, Result, Scalar, UpdateDirection};
use offload_kernels::{ADD_I32, FILL_I32};
use offload_tests::{
    assert_clean, check, check_eq, fails, mut_range, on_every_device, on_every_device_with, read_device,
    write_device,
};

#[test]
fn case_26_associate_then_disassociate_repeatedly() {
    on_every_device("case 26", |rt, dev| {
        let mut h = [0x5a5a_i32];
        let hp = h.as_ptr() as usize;
        check!(!rt.is_present(hp, dev)?);
        let d = rt.target_alloc(4, dev)?;
        check!(d != 0);
        write_device(rt, d, &[77], dev)?;
        let before = rt.transfer_stats(dev)?;
        // The first pair and 8 repetitions.
        for round in 0..9 {
            // SAFETY: `d` is a live 4-byte allocation of `dev` until the `target_free` below.
            unsafe { rt.associate_ptr(hp, d, 4, 0, dev)? };
            check!(rt.is_present(hp, dev)?, "round {round}: not present after associate");
            check_eq!(rt.mapped_ptr(hp, dev)?, Some(d));
            let e = rt.entry(hp, dev)?;
            check!(
                e.as_ref()
                    .is_some_and(|e| e.associated && e.range == HostRange::new(hp, 4) && e.device_addr == d),
                "round {round}: entry {e:?}"
            );
            // SAFETY: no kernel uses the association.
            unsafe { rt.disassociate_ptr(hp, dev)? };
            check!(!rt.is_present(hp, dev)?, "round {round}: present after disassociate");
            check_eq!(rt.mapped_ptr(hp, dev)?, None);
            check!(rt.entry(hp, dev)?.is_none());
        }
        // Associating and disassociating copies nothing either way.
        check_eq!(rt.transfer_stats(dev)?, before);
        check_eq!(h[0], 0x5a5a);

        // SAFETY: no kernel uses any association.
        let e = fails(unsafe { rt.disassociate_ptr(hp, dev) }, "disassociate of an absent pointer")?;
        check!(
            matches!(e, Error::NotAssociated { device, host, .. } if device == dev && host == hp),
            "{e:?}"
        );
        check!(e.to_string().contains("not mapped by associate_ptr"), "{e}");
        check!(e.to_string().contains("nothing is mapped there"), "{e}");

        // `disassociate` never freed `d`: copies to and from it still work.
        check_eq!(rt.pool_usage(dev)?.live_allocations, 1);
        check_eq!(read_device::<i32>(rt, d, 1, dev)?, vec![77]);
        write_device(rt, d, &[-31], dev)?;
        // SAFETY: `h` is a live i32 written by nothing else; `d` holds 4 bytes.
        unsafe { rt.target_memcpy(h.as_mut_ptr() as u64, d, 4, 0, 0, rt.initial_device(), dev)? };
        check_eq!(h[0], -31);

        // SAFETY: nothing uses `d` any more.
        unsafe { rt.target_free(d, dev)? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_26_associate_with_a_device_offset() {
    on_every_device("case 26 (offset)", |rt, dev| {
        let mut h = [0i32; 4];
        let hp = h.as_ptr() as usize;
        let d = rt.target_alloc(64, dev)?;
        // SAFETY: `d + 16` has 16 bytes of the 64-byte allocation behind it.
        unsafe { rt.associate_ptr(hp, d, 16, 16, dev)? };
        check_eq!(rt.mapped_ptr(hp, dev)?, Some(d + 16));
        check_eq!(rt.mapped_ptr(hp + 12, dev)?, Some(d + 28));
        check_eq!(rt.mapped_ptr(hp + 16, dev)?, None);
        // A kernel through the association writes at the offset, not at `d`.
        // SAFETY: memset inside the allocation.
        unsafe { rt.target_memset(d, 0, 64, dev)? };
        // SAFETY: `h` is associated (device memory of 16 bytes); no map list.
        unsafe {
            rt.target_launch(
                dev,
                &FILL_I32,
                4,
                &[],
                &[LaunchArg::Value(Scalar::I32(3)), LaunchArg::mapped(h.as_ptr())],
            )?
        };
        check_eq!(read_device::<i32>(rt, d, 16, dev)?, [vec![0; 4], vec![3; 4], vec![0; 8]].concat());
        // SAFETY: `h` is writable and not otherwise used during the update.
        unsafe { rt.update(dev, UpdateDirection::From, &[(mut_range(&mut h), true)])? };
        check_eq!(h, [3; 4]);
        // SAFETY: no kernel uses the association; then nothing uses `d`.
        unsafe {
            rt.disassociate_ptr(hp, dev)?;
            rt.target_free(d, dev)?;
        }
        check_eq!(h, [3; 4]);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_27_disassociate_of_a_mapped_range_fails() {
    on_every_device("case 27", |rt, dev| {
        let y = [1i32; 16];
        let yp = y.as_ptr() as usize;
        // SAFETY: `y` lives until the end of the case.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&y, MapType::ALLOC)])? };
        let mapped = rt.entry(yp, dev)?;
        // SAFETY: no kernel runs.
        let e = fails(unsafe { rt.disassociate_ptr(yp, dev) }, "disassociate of a mapped range")?;
        check!(
            matches!(e, Error::NotAssociated { device, host, .. } if device == dev && host == yp),
            "{e:?}"
        );
        check!(e.to_string().contains("not mapped by associate"), "{e}");
        check!(e.to_string().contains("mapped by a map clause"), "{e}");
        // Also through an address inside the range.
        // SAFETY: as above.
        let e = fails(unsafe { rt.disassociate_ptr(yp + 8, dev) }, "disassociate inside a mapped range")?;
        check!(matches!(e, Error::NotAssociated { .. }), "{e:?}");
        // `y` stays mapped, counts untouched.
        check!(rt.is_present(yp, dev)?);
        check_eq!(rt.entry(yp, dev)?, mapped);
        check!(
            mapped.as_ref().is_some_and(|e| e.ref_count == 1 && e.hold_count == 0 && !e.associated),
            "{mapped:?}"
        );
        // SAFETY: `y` is alive.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&y, MapType::RELEASE)])? };
        check!(!rt.is_present(yp, dev)?);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_28_disassociate_inside_a_hold_region_fails() {
    on_every_device("case 28", |rt, dev| {
        let mut x = [0i32; 4];
        let xp = x.as_ptr() as usize;
        let d = rt.target_alloc(16, dev)?;
        // SAFETY: `d` holds 16 bytes until freed below.
        unsafe { rt.associate_ptr(xp, d, 16, 0, dev)? };
        let stats = rt.transfer_stats(dev)?;
        let list = [MapItem::slice_mut(&mut x, MapType::ALLOC.hold())];
        for depth in 1..=2u64 {
            // SAFETY: `x` outlives the region.
            unsafe { rt.target_data_begin(dev, &list)? };
            check!(rt.entry(xp, dev)?.is_some_and(|e| e.associated && e.hold_count == depth));
            // SAFETY: no kernel runs.
            let e = fails(unsafe { rt.disassociate_ptr(xp, dev) }, "disassociate inside a hold region")?;
            check!(
                matches!(e, Error::StillHeld { device, range, count }
                    if device == dev && range == HostRange::new(xp, 16) && count == depth),
                "{e:?}"
            );
            check!(e.to_string().contains(&format!("hold count {depth}")), "{e}");
            check_eq!(rt.mapped_ptr(xp, dev)?, Some(d));
        }
        for _ in 0..2 {
            // SAFETY: as for the begin.
            unsafe { rt.target_data_end(dev, &list)? };
        }
        check!(rt.entry(xp, dev)?.is_some_and(|e| e.associated && e.hold_count == 0));
        // The region copied nothing (an associated entry is never copied implicitly).
        check_eq!(rt.transfer_stats(dev)?, stats);
        // SAFETY: no region holds it any more; then nothing uses `d`.
        unsafe {
            rt.disassociate_ptr(xp, dev)?;
            rt.target_free(d, dev)?;
        }
        assert_clean(rt, dev)
    });
}

#[test]
fn case_28_disassociate_inside_a_plain_region_succeeds() {
    on_every_device("case 28 (no hold)", |rt, dev| {
        let mut x = [0i32; 4];
        let xp = x.as_ptr() as usize;
        let d = rt.target_alloc(16, dev)?;
        // SAFETY: `d` holds 16 bytes until freed below.
        unsafe { rt.associate_ptr(xp, d, 16, 0, dev)? };
        let stats = rt.transfer_stats(dev)?;
        let list = [MapItem::slice_mut(&mut x, MapType::TOFROM)];
        // SAFETY: `x` outlives the region.
        unsafe { rt.target_data_begin(dev, &list)? };
        // The infinite reference count does not move, so nothing holds the entry.
        check!(rt.entry(xp, dev)?.is_some_and(|e| e.associated && e.hold_count == 0));
        // SAFETY: no kernel runs.
        unsafe { rt.disassociate_ptr(xp, dev)? };
        check!(!rt.is_present(xp, dev)?, "disassociate left the entry");
        // The region's end finds `x` absent: nothing copied, nothing freed.
        // SAFETY: as for the begin.
        unsafe { rt.target_data_end(dev, &list)? };
        check_eq!(rt.transfer_stats(dev)?, stats);
        check!(!rt.is_present(xp, dev)?);
        // SAFETY: the association is gone; nothing uses `d`.
        unsafe { rt.target_free(d, dev)? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_29_associated_entries_move_data_only_with_always_or_update() {
    on_every_device("case 29", |rt, dev| {
        const N: usize = 8;
        let mut x = [1i32; N];
        let xp = x.as_ptr() as usize;
        let d = rt.target_alloc(4 * N, dev)?;
        // SAFETY: inside the allocation.
        unsafe { rt.target_memset(d, 0, 4 * N, dev)? };
        // SAFETY: `d` holds 4 * N bytes until freed below.
        unsafe { rt.associate_ptr(xp, d, 4 * N, 0, dev)? };
        let entry = rt.entry(xp, dev)?;
        let s0 = rt.transfer_stats(dev)?;

        // A launch with `tofrom(x)` copies nothing either way; the kernel works on `d`.
        let tofrom = [MapItem::slice_mut(&mut x, MapType::TOFROM)];
        let args = [LaunchArg::Value(Scalar::I32(5)), LaunchArg::Mapped(xp)];
        // SAFETY: `x` is alive; the argument translates to `d`.
        unsafe { rt.target_launch(dev, &ADD_I32, N, &tofrom, &args)? };
        check_eq!(rt.transfer_stats(dev)?, s0);
        check_eq!(x, [1; N]);
        check_eq!(read_device::<i32>(rt, d, N, dev)?, vec![5; N]);
        check_eq!(rt.entry(xp, dev)?, entry);

        // exit `delete`, `release` and `from` leave the entry as it was and copy nothing.
        let s1 = rt.transfer_stats(dev)?;
        for t in [MapType::DELETE, MapType::RELEASE, MapType::FROM, MapType::TOFROM] {
            // SAFETY: `x` is alive and writable.
            unsafe { rt.exit_data(dev, &[MapItem::slice_mut(&mut x, t)])? };
            check_eq!(rt.entry(xp, dev)?, entry);
        }
        // enter `to` neither copies nor counts.
        // SAFETY: `x` is alive.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&x, MapType::TO)])? };
        check_eq!(rt.entry(xp, dev)?, entry);
        check_eq!(rt.transfer_stats(dev)?, s1);
        check_eq!(x, [1; N]);
        check_eq!(read_device::<i32>(rt, d, N, dev)?, vec![5; N]);

        // Copies made by `op`: (host->device, device->host).
        let copies = |op: &mut dyn FnMut() -> Result<()>| -> Result<(u64, u64)> {
            let a = rt.transfer_stats(dev)?;
            op()?;
            let b = rt.transfer_stats(dev)?;
            Ok((b.to_device - a.to_device, b.from_device - a.from_device))
        };
        // `always to` copies.
        x = [9; N];
        // SAFETY: `x` is alive.
        let n = copies(&mut || unsafe { rt.enter_data(dev, &[MapItem::slice(&x, MapType::TO.always())]) })?;
        check_eq!(n, (1, 0));
        check_eq!(read_device::<i32>(rt, d, N, dev)?, vec![9; N]);
        // `update to` copies.
        x = [3; N];
        // SAFETY: `x` is alive.
        let n =
            copies(&mut || unsafe { rt.update(dev, UpdateDirection::To, &[(HostRange::of(&x), false)]) })?;
        check_eq!(n, (1, 0));
        check_eq!(read_device::<i32>(rt, d, N, dev)?, vec![3; N]);
        let add_one = [LaunchArg::Value(Scalar::I32(1)), LaunchArg::Mapped(xp)];
        // SAFETY: `x` is associated with `d`.
        unsafe { rt.target_launch(dev, &ADD_I32, N, &[], &add_one)? };
        // `update from` copies.
        let n = copies(&mut || {
            // SAFETY: `x` is writable and not otherwise used.
            unsafe { rt.update(dev, UpdateDirection::From, &[(mut_range(&mut x), false)]) }
        })?;
        check_eq!(n, (0, 1));
        check_eq!(x, [4; N]);
        // SAFETY: as above.
        unsafe { rt.target_launch(dev, &ADD_I32, N, &[], &add_one)? };
        // exit `always from` copies and still leaves the entry.
        let n = copies(&mut || {
            // SAFETY: `x` is writable and not otherwise used.
            unsafe { rt.exit_data(dev, &[MapItem::slice_mut(&mut x, MapType::FROM.always())]) }
        })?;
        check_eq!(n, (0, 1));
        check_eq!(x, [5; N]);
        check_eq!(rt.entry(xp, dev)?, entry);

        // SAFETY: nothing uses the association or `d` any more.
        unsafe {
            rt.disassociate_ptr(xp, dev)?;
            rt.target_free(d, dev)?;
        }
        assert_clean(rt, dev)
    });
}

#[test]
fn case_30_bad_associate_and_disassociate_arguments_fail() {
    on_every_device("case 30", |rt, dev| {
        let h = [0i32; 4];
        let hp = h.as_ptr() as usize;
        let d = rt.target_alloc(16, dev)?;
        let init = rt.initial_device();
        let bad = |r: Result<()>, what: &str, needle: &str| -> Result<()> {
            let e = fails(r, what)?;
            check!(matches!(e, Error::InvalidArgument { .. }), "{what}: {e:?}");
            check!(e.to_string().contains(needle), "{what}: {e}");
            Ok(())
        };
        // SAFETY: for every call below, `d` holds 16 bytes; the calls are expected to fail.
        unsafe {
            bad(rt.associate_ptr(0, d, 16, 0, dev), "null host", "host pointer is null")?;
            bad(rt.associate_ptr(hp, 0, 16, 0, dev), "null device", "device pointer is null")?;
            bad(rt.associate_ptr(hp, d, 0, 0, dev), "size 0", "size is 0")?;
            bad(rt.associate_ptr(hp, d, 16, 0, init), "initial device", "initial device")?;
            bad(rt.disassociate_ptr(0, dev), "disassociate null", "host pointer is null")?;
            bad(rt.disassociate_ptr(hp, init), "disassociate on the initial device", "initial device")?;
        }
        for e in [
            // SAFETY: as above.
            fails(unsafe { rt.associate_ptr(hp, d, 16, 0, init + 1) }, "no such device")?,
            // SAFETY: as above.
            fails(unsafe { rt.disassociate_ptr(hp, init + 1) }, "no such device")?,
        ] {
            check!(matches!(e, Error::NoSuchDevice { .. }), "{e:?}");
        }
        check!(!rt.is_present(hp, dev)?);
        check!(rt.live_mappings().iter().all(|(dv, _)| *dv != dev));
        // SAFETY: nothing uses `d`.
        unsafe { rt.target_free(d, dev)? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_30_associate_over_a_mapped_range_fails() {
    on_every_device("case 30 (already mapped)", |rt, dev| {
        let h = [0i32; 8];
        let hp = h.as_ptr() as usize;
        let d = rt.target_alloc(32, dev)?;
        // SAFETY: `h` lives until the end of the case.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&h[2..4], MapType::ALLOC)])? };
        let mapped = rt.entry(hp + 8, dev)?;
        // Overlapping the mapped h[2..4], or inside it: refused, table unchanged.
        for (off, bytes) in [(0, 32), (8, 8), (12, 4)] {
            // SAFETY: `d` holds 32 bytes; the call is expected to fail.
            let e = fails(unsafe { rt.associate_ptr(hp + off, d, bytes, 0, dev) }, "associate over a map")?;
            check!(matches!(e, Error::AlreadyMapped { device, .. } if device == dev), "{e:?}");
            check!(e.to_string().contains("already mapped"), "{e}");
            check_eq!(rt.entry(hp + 8, dev)?, mapped);
        }
        // SAFETY: `h` is alive.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&h[2..4], MapType::DELETE)])? };
        // Associating the same pair twice is accepted; one disassociate removes it.
        // SAFETY: `d` holds 32 bytes.
        unsafe {
            rt.associate_ptr(hp, d, 32, 0, dev)?;
            rt.associate_ptr(hp, d, 32, 0, dev)?;
        }
        // A different device address for the same range is refused.
        // SAFETY: `d + 16` has 16 bytes behind it; the call is expected to fail.
        let e = fails(unsafe { rt.associate_ptr(hp, d, 16, 16, dev) }, "re-associate elsewhere")?;
        check!(matches!(e, Error::AlreadyMapped { .. }), "{e:?}");
        check_eq!(rt.mapped_ptr(hp, dev)?, Some(d));
        // SAFETY: nothing uses the association.
        unsafe { rt.disassociate_ptr(hp, dev)? };
        check!(!rt.is_present(hp, dev)?);
        // SAFETY: nothing uses `d`.
        unsafe { rt.target_free(d, dev)? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_31_mapped_ptr_is_the_address_the_kernel_sees() {
    on_every_device_with(
        "case 31",
        |b| b.info(InfoFlags::KERNEL_ARGS).capture_info(),
        |rt, dev| {
            const N: usize = 64;
            let mut h = [0i32; N];
            let hp = h.as_ptr() as usize;
            check_eq!(rt.mapped_ptr(hp, dev)?, None);
            check_eq!(rt.mapped_ptr(hp + 16, dev)?, None);
            // SAFETY: `h` lives until the end of the case.
            unsafe { rt.enter_data(dev, &[MapItem::slice(&h, MapType::TO)])? };
            let p = rt.mapped_ptr(hp, dev)?.ok_or(Error::NotPresent {
                device: dev,
                range: HostRange::of(&h),
                what: "case 31",
                name: None,
            })?;
            check_eq!(rt.mapped_ptr(hp + 16, dev)?, Some(p + 16));
            check_eq!(rt.mapped_ptr(hp + 4 * N - 1, dev)?, Some(p + 4 * N as u64 - 1));
            check_eq!(rt.mapped_ptr(hp + 4 * N, dev)?, None);

            rt.take_info();
            // SAFETY: `h` is mapped; the kernel writes its device copy.
            unsafe {
                rt.target_launch(
                    dev,
                    &FILL_I32,
                    N,
                    &[],
                    &[LaunchArg::Value(Scalar::I32(7)), LaunchArg::Mapped(hp)],
                )?
            };
            let lines = rt.take_info();
            let want = format!(
                "device {dev}: launch `fill_i32` n={N} args [I32(7), device {p:#x} ({} bytes)]",
                4 * N
            );
            check!(lines.contains(&want), "no trace line {want:?} in {lines:#?}");
            check_eq!(read_device::<i32>(rt, p, N, dev)?, vec![7; N]);

            // `h + 16` bytes: the kernel sees `p + 16` and writes from element 4.
            // SAFETY: as above.
            unsafe {
                rt.target_launch(
                    dev,
                    &FILL_I32,
                    4,
                    &[],
                    &[LaunchArg::Value(Scalar::I32(9)), LaunchArg::Mapped(hp + 16)],
                )?
            };
            let lines = rt.take_info();
            let want = format!("device {:#x} ({} bytes)", p + 16, 4 * N - 16);
            check!(lines.iter().any(|l| l.contains(&want)), "no {want:?} in {lines:#?}");

            // SAFETY: `h` is writable and not otherwise used.
            unsafe { rt.exit_data(dev, &[MapItem::slice_mut(&mut h, MapType::FROM)])? };
            let mut expect = [7; N];
            expect[4..8].fill(9);
            check_eq!(h, expect);
            check_eq!(rt.mapped_ptr(hp, dev)?, None);
            check_eq!(rt.mapped_ptr(hp + 16, dev)?, None);
            assert_clean(rt, dev)
        },
    );
}
