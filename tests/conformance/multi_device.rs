//! Cases 37-41: several devices (at least 2; host devices count).

use offload::{BackendKind, Error, HostRange, LaunchArg, MapItem, MapType, Result, Runtime, Scalar};
use offload_kernels::{ADD_I32, FILL_I32};
use offload_tests::{assert_clean, check, check_eq, device_copy_of, on_every_backend, read_device};

/// Launches `kernel(v, p)` over `n` elements of the raw device pointer `p`.
fn launch_raw(rt: &Runtime, dev: usize, kernel: &offload::Kernel, v: i32, p: u64, n: usize) -> Result<()> {
    let args = [LaunchArg::Value(Scalar::I32(v)), LaunchArg::Device(p)];
    // SAFETY: the callers pass allocations of `dev` holding at least `n` i32.
    unsafe { rt.target_launch(dev, kernel, n, &[], &args) }
}

/// Cases 37 and 38: fill 7 on device 0, copy to the last device, add 7 there. Returns the
/// transfer statistics of the last device before and after the device-to-device copy.
fn fill_copy_add(rt: &Runtime, n: usize) -> Result<(offload::TransferStats, offload::TransferStats)> {
    let last = rt.num_devices() - 1;
    let src = rt.target_alloc(n * 4, 0)?;
    let dst = rt.target_alloc(n * 4, last)?;
    launch_raw(rt, 0, &FILL_I32, 7, src, n)?;
    launch_raw(rt, last, &FILL_I32, -1, dst, n)?;
    let before = rt.transfer_stats(last)?;
    // SAFETY: both allocations hold `n` i32; the fill kernels have completed.
    unsafe { rt.target_memcpy(dst, src, n * 4, 0, 0, last, 0)? };
    let after = rt.transfer_stats(last)?;
    launch_raw(rt, last, &ADD_I32, 7, dst, n)?;
    let got = read_device::<i32>(rt, dst, n, last)?;
    check!(got.iter().all(|&v| v == 14), "device {last}: not all 14: {:?}", &got[..got.len().min(16)]);
    // The source was only read.
    let src_now = read_device::<i32>(rt, src, n, 0)?;
    check!(src_now.iter().all(|&v| v == 7));
    // SAFETY: nothing uses either allocation any more.
    unsafe {
        rt.target_free(src, 0)?;
        rt.target_free(dst, last)?;
    }
    assert_clean(rt, 0)?;
    assert_clean(rt, last)?;
    Ok((before, after))
}

#[test]
fn case_37_device_to_device_memcpy_with_peer_access() {
    on_every_backend(
        "case 37",
        2,
        |b| b,
        |rt| {
            let last = rt.num_devices() - 1;
            // Host devices always have peer access; GPUs when the hardware allows it (and
            // then the copy must not be staged).
            let peer = rt.can_access_peer(last, 0)?;
            check!(peer || rt.describe(last)?.kind != BackendKind::Host, "host devices lack peer access");
            let (before, after) = fill_copy_add(rt, 10_000)?;
            if peer {
                check_eq!(after.direct, before.direct + 1);
                check_eq!(after.staged, before.staged);
            } else {
                println!("NOTE case 37: devices 0 and {last} have no peer access; copied through the host");
                check_eq!(after.staged, before.staged + 1);
            }
            // A device-to-device copy is not a host transfer.
            check_eq!((after.to_device, after.from_device), (before.to_device, before.from_device));
            Ok(())
        },
    );
}

#[test]
fn case_38_device_to_device_memcpy_staged_through_the_host() {
    on_every_backend(
        "case 38",
        2,
        |b| b.peer_access(false),
        |rt| {
            check!(!rt.can_access_peer(rt.num_devices() - 1, 0)?);
            let (before, after) = fill_copy_add(rt, 10_000)?;
            check_eq!(after.staged, before.staged + 1);
            check_eq!(after.direct, before.direct);
            Ok(())
        },
    );
}

#[test]
fn case_38_staged_copy_larger_than_the_bounce_buffer() {
    on_every_backend(
        "case 38 (64 MiB + 12 bytes, more than one bounce chunk)",
        2,
        |b| b.peer_access(false),
        |rt| {
            let (before, after) = fill_copy_add(rt, (64 << 20) / 4 + 3)?;
            check_eq!(after.staged, before.staged + 1);
            check_eq!(after.direct, before.direct);
            Ok(())
        },
    );
}

#[test]
fn case_39_each_device_maps_its_own_slice() {
    on_every_backend(
        "case 39",
        2,
        |b| b,
        |rt| {
            const N: usize = 1000;
            let devs = rt.num_devices();
            // One launch per device with its own `from` map.
            let mut h = vec![-1i32; devs * N];
            for (d, part) in h.chunks_mut(N).enumerate() {
                let maps = [MapItem::slice_mut(part, MapType::FROM)];
                let args = [LaunchArg::Value(Scalar::I32(d as i32)), LaunchArg::mapped(part.as_ptr())];
                // SAFETY: `part` is writable and not otherwise used during the launch.
                unsafe { rt.target_launch(d, &FILL_I32, N, &maps, &args)? };
                check!(!rt.is_present(part.as_ptr() as usize, d)?);
            }
            for (d, part) in h.chunks(N).enumerate() {
                check!(part.iter().all(|&v| v == d as i32), "slice {d}: {:?}", &part[..8]);
            }

            // All regions open at once: each device's slice lives only there until its end.
            h.fill(-1);
            let lists: Vec<[MapItem; 1]> =
                h.chunks_mut(N).map(|p| [MapItem::slice_mut(p, MapType::FROM)]).collect();
            for (d, list) in lists.iter().enumerate() {
                // SAFETY: `h` outlives the regions and is not touched while they are open.
                unsafe { rt.target_data_begin(d, list)? };
            }
            for (d, list) in lists.iter().enumerate() {
                let begin = list[0].range.begin;
                for other in 0..devs {
                    check_eq!(rt.is_present(begin, other)?, other == d);
                }
                let args = [LaunchArg::Value(Scalar::I32(10 + d as i32)), LaunchArg::Mapped(begin)];
                // SAFETY: the slice is mapped on `d`.
                unsafe { rt.target_launch(d, &FILL_I32, N, &[], &args)? };
            }
            for (d, list) in lists.iter().enumerate() {
                // SAFETY: as for the begin.
                unsafe { rt.target_data_end(d, list)? };
            }
            for (d, part) in h.chunks(N).enumerate() {
                check!(part.iter().all(|&v| v == 10 + d as i32), "slice {d}: {:?}", &part[..8]);
            }
            (0..devs).try_for_each(|d| assert_clean(rt, d))
        },
    );
}

#[test]
fn case_40_enter_on_one_device_is_absent_on_the_others() {
    on_every_backend(
        "case 40",
        2,
        |b| b,
        |rt| {
            let devs = rt.num_devices();
            let mut x = vec![1i32; 64];
            let xp = x.as_ptr() as usize;
            // SAFETY: `x` lives until the end of the case.
            unsafe { rt.enter_data(0, &[MapItem::slice(&x, MapType::TO)])? };
            check!(rt.is_present(xp, 0)?);
            check!(rt.mapped_ptr(xp, 0)?.is_some());
            for d in 1..devs {
                check!(!rt.is_present(xp, d)?, "present on device {d}");
                check_eq!(rt.mapped_ptr(xp, d)?, None);
                check_eq!(rt.entry(xp, d)?, None);
            }
            // The same range on device 1 is an independent entry with its own count and data.
            x.fill(2);
            // SAFETY: as above.
            unsafe {
                rt.enter_data(1, &[MapItem::slice(&x, MapType::TO)])?;
                rt.enter_data(1, &[MapItem::slice(&x, MapType::TO)])?;
            }
            let (e0, e1) = (rt.entry(xp, 0)?, rt.entry(xp, 1)?);
            check!(e0.as_ref().is_some_and(|e| e.ref_count == 1 && e.range == HostRange::of(&x)), "{e0:?}");
            check!(e1.as_ref().is_some_and(|e| e.ref_count == 2 && e.range == HostRange::of(&x)), "{e1:?}");
            check_eq!(device_copy_of(rt, &x, 0)?, vec![1; 64]);
            check_eq!(device_copy_of(rt, &x, 1)?, vec![2; 64]);
            // Releasing on device 0 leaves device 1's entry alone.
            // SAFETY: `x` is writable and not otherwise used.
            unsafe { rt.exit_data(0, &[MapItem::slice_mut(&mut x, MapType::FROM)])? };
            check_eq!(x, vec![1; 64]);
            check!(!rt.is_present(xp, 0)?);
            check_eq!(rt.entry(xp, 1)?, e1);
            // SAFETY: as above.
            unsafe { rt.exit_data(1, &[MapItem::slice(&x, MapType::DELETE)])? };
            check!(!rt.is_present(xp, 1)?);
            (0..devs).try_for_each(|d| assert_clean(rt, d))
        },
    );
}

#[test]
fn case_41_associate_is_per_device() {
    on_every_backend(
        "case 41",
        2,
        |b| b,
        |rt| {
            let devs = rt.num_devices();
            let mut x = [5i32; 16];
            let xp = x.as_ptr() as usize;
            let p0 = rt.target_alloc(64, 0)?;
            // SAFETY: `p0` holds 64 bytes until freed below.
            unsafe { rt.associate_ptr(xp, p0, 64, 0, 0)? };
            check!(rt.is_present(xp, 0)?);
            for d in 1..devs {
                check!(!rt.is_present(xp, d)?, "present on device {d}");
                check_eq!(rt.mapped_ptr(xp, d)?, None);
                // SAFETY: no kernel uses anything on `d`.
                let r = unsafe { rt.disassociate_ptr(xp, d) };
                check!(matches!(r, Err(Error::NotAssociated { device, .. }) if device == d), "{r:?}");
            }
            // Device 1 maps `x` the ordinary way: allocated, copied, released, and device 0's
            // association is untouched.
            let before = rt.transfer_stats(1)?;
            let list = [MapItem::slice_mut(&mut x, MapType::TOFROM)];
            let args = [LaunchArg::Value(Scalar::I32(1)), LaunchArg::Mapped(xp)];
            // SAFETY: `x` is writable and not otherwise used during the launch.
            unsafe { rt.target_launch(1, &ADD_I32, 16, &list, &args)? };
            let after = rt.transfer_stats(1)?;
            check_eq!((after.to_device - before.to_device, after.from_device - before.from_device), (1, 1));
            check_eq!(x, [6; 16]);
            check!(!rt.is_present(xp, 1)?);
            check!(rt.entry(xp, 0)?.is_some_and(|e| e.associated && e.device_addr == p0));
            // SAFETY: nothing uses the association or `p0` any more.
            unsafe {
                rt.disassociate_ptr(xp, 0)?;
                rt.target_free(p0, 0)?;
            }
            (0..devs).try_for_each(|d| assert_clean(rt, d))
        },
    );
}
