//! Cases 1-10 of docs/SEMANTICS.md: counts and copies.
//!
//! Cases 1-7 walk one host variable through the reference count with enter/exit data (each
//! case builds the state it starts from); 8-10 are `target data` regions and launches,
//! which move the same count.

use offload::{
    map, HostRange, InfoFlags, LaunchArg, MapItem, MapType, Result, Runtime, Scalar, TransferStats,
};
use offload_kernels::{FILL_F32, FILL_I32, SUM_F32};
use offload_tests::{
    assert_clean, check, check_eq, device_copy_of, fill_device, on_every_device, on_every_device_with,
};

/// The (reference, hold) counts of the entry holding `x`, `None` when absent.
fn counts<T>(rt: &Runtime, x: &[T], dev: usize) -> Result<Option<(u64, u64)>> {
    Ok(rt.entry(x.as_ptr() as usize, dev)?.map(|e| (e.ref_count, e.hold_count)))
}

/// Host->device and device->host copies between two snapshots.
fn copies(before: TransferStats, after: TransferStats) -> (u64, u64) {
    (after.to_device - before.to_device, after.from_device - before.from_device)
}

/// `enter data map(to: x)` `times` times.
fn enter_to(rt: &Runtime, dev: usize, x: &[i32], times: usize) -> Result<()> {
    for _ in 0..times {
        // SAFETY: `x` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(x, MapType::TO)])? };
    }
    Ok(())
}

/// Trace lines of copies of `range` on `dev` in direction `dir` ("host->device" or
/// "device->host").
fn copy_lines(trace: &[String], dev: usize, dir: &str, range: HostRange) -> usize {
    let prefix = format!("device {dev}: copy {dir}");
    let range = range.to_string();
    trace.iter().filter(|l| l.starts_with(&prefix) && l.contains(&range)).count()
}

#[test]
fn case_01_enter_to_creates_an_entry_and_copies_once() {
    on_every_device("case 1", |rt, dev| {
        let x = [1i32];
        check!(!rt.is_present(x.as_ptr() as usize, dev)?, "x present before the enter");
        check_eq!(counts(rt, &x, dev)?, None);
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: `x` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&x, MapType::TO)])? };
        let s1 = rt.transfer_stats(dev)?;
        check_eq!(counts(rt, &x, dev)?, Some((1, 0)));
        check_eq!(copies(s0, s1), (1, 0));
        check_eq!(s1.to_device_bytes - s0.to_device_bytes, 4);
        check!(rt.is_present(x.as_ptr() as usize, dev)?, "x not present after enter to");
        check_eq!(rt.entry(x.as_ptr() as usize, dev)?.map(|e| e.range), Some(HostRange::of(&x)));
        check_eq!(device_copy_of(rt, &x, dev)?, vec![1]);
        // The other devices' tables are untouched (rule 1).
        for other in (0..rt.num_devices()).filter(|&d| d != dev) {
            check!(!rt.is_present(x.as_ptr() as usize, other)?, "x present on device {other}");
        }
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&x, MapType::DELETE)])? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_02_second_enter_to_counts_without_copying() {
    on_every_device("case 2", |rt, dev| {
        let mut x = [1i32];
        enter_to(rt, dev, &x, 1)?;
        x[0] = 2;
        let s0 = rt.transfer_stats(dev)?;
        enter_to(rt, dev, &x, 1)?;
        let s1 = rt.transfer_stats(dev)?;
        check_eq!(counts(rt, &x, dev)?, Some((2, 0)));
        check_eq!(copies(s0, s1), (0, 0));
        check_eq!(device_copy_of(rt, &x, dev)?, vec![1]);
        check_eq!(x, [2]);
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&x, MapType::DELETE)])? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_03_enter_always_to_counts_and_copies() {
    on_every_device("case 3", |rt, dev| {
        let mut x = [1i32];
        enter_to(rt, dev, &x, 2)?;
        x[0] = 2;
        check_eq!(device_copy_of(rt, &x, dev)?, vec![1]);
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: `x` is valid for reads during the call.
        unsafe { rt.enter_data(dev, &[MapItem::slice(&x, MapType::TO.always())])? };
        let s1 = rt.transfer_stats(dev)?;
        check_eq!(counts(rt, &x, dev)?, Some((3, 0)));
        check_eq!(copies(s0, s1), (1, 0));
        check_eq!(device_copy_of(rt, &x, dev)?, vec![2]);
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&x, MapType::DELETE)])? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_04_exit_from_above_one_only_decrements() {
    on_every_device("case 4", |rt, dev| {
        let mut x = [1i32];
        enter_to(rt, dev, &x, 2)?;
        fill_device(rt, dev, &x, 9)?;
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: `x` is exclusively ours and not otherwise accessed during the call.
        unsafe { rt.exit_data(dev, &[MapItem::slice_mut(&mut x, MapType::FROM)])? };
        let s1 = rt.transfer_stats(dev)?;
        check_eq!(counts(rt, &x, dev)?, Some((1, 0)));
        check_eq!(copies(s0, s1), (0, 0));
        check_eq!(x, [1]);
        check!(rt.is_present(x.as_ptr() as usize, dev)?, "x left at rc 1");
        check_eq!(device_copy_of(rt, &x, dev)?, vec![9]);
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&x, MapType::DELETE)])? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_05_exit_from_at_one_copies_back_and_removes() {
    on_every_device("case 5", |rt, dev| {
        let mut x = [1i32];
        enter_to(rt, dev, &x, 1)?;
        fill_device(rt, dev, &x, 9)?;
        let live = rt.pool_usage(dev)?.live_allocations;
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: `x` is exclusively ours and not otherwise accessed during the call.
        unsafe { rt.exit_data(dev, &[MapItem::slice_mut(&mut x, MapType::FROM)])? };
        let s1 = rt.transfer_stats(dev)?;
        check_eq!(x, [9]);
        check_eq!(copies(s0, s1), (0, 1));
        check_eq!(s1.from_device_bytes - s0.from_device_bytes, 4);
        check_eq!(counts(rt, &x, dev)?, None);
        check!(!rt.is_present(x.as_ptr() as usize, dev)?, "x still present");
        check_eq!(rt.pool_usage(dev)?.live_allocations, live - 1);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_06_exit_release_at_one_removes_without_copy() {
    on_every_device("case 6", |rt, dev| {
        let x = [1i32];
        enter_to(rt, dev, &x, 1)?;
        fill_device(rt, dev, &x, 9)?;
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: release copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&x, MapType::RELEASE)])? };
        let s1 = rt.transfer_stats(dev)?;
        check_eq!(copies(s0, s1), (0, 0));
        check_eq!(x, [1]);
        check_eq!(counts(rt, &x, dev)?, None);
        check!(!rt.is_present(x.as_ptr() as usize, dev)?, "x still present");
        assert_clean(rt, dev)
    });
}

#[test]
fn case_07_exit_delete_removes_at_once_without_copy() {
    on_every_device("case 7", |rt, dev| {
        let x = [1i32];
        enter_to(rt, dev, &x, 5)?;
        check_eq!(counts(rt, &x, dev)?, Some((5, 0)));
        fill_device(rt, dev, &x, 9)?;
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: delete copies nothing back.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&x, MapType::DELETE)])? };
        let s1 = rt.transfer_stats(dev)?;
        check_eq!(copies(s0, s1), (0, 0));
        check_eq!(x, [1]);
        check_eq!(counts(rt, &x, dev)?, None);
        check!(!rt.is_present(x.as_ptr() as usize, dev)?, "x still present");
        assert_clean(rt, dev)
    });
}

#[test]
fn case_07_exit_from_delete_copies_back_once() {
    // `from` with `delete` in one exit: the entry leaves, so `from` copies (rule 4).
    on_every_device("case 7 (delete with from)", |rt, dev| {
        let mut x = [1i32];
        enter_to(rt, dev, &x, 5)?;
        fill_device(rt, dev, &x, 9)?;
        let s0 = rt.transfer_stats(dev)?;
        let items = [MapItem::slice(&x, MapType::DELETE), MapItem::slice_mut(&mut x, MapType::FROM)];
        // SAFETY: `x` is exclusively ours and not otherwise accessed during the call.
        unsafe { rt.exit_data(dev, &items)? };
        let s1 = rt.transfer_stats(dev)?;
        check_eq!(copies(s0, s1), (0, 1));
        check_eq!(x, [9]);
        check_eq!(counts(rt, &x, dev)?, None);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_08_nested_target_data_copies_back_at_the_outer_end() {
    on_every_device("case 8", |rt, dev| {
        let gpu = rt.device(dev)?;
        let mut m = vec![0i32; 16];
        let outer = [MapItem::slice_mut(&mut m, MapType::TOFROM)];
        // SAFETY: `m` stays alive and unaliased until the matching target_data_end.
        unsafe { rt.target_data_begin(dev, &outer)? };
        check_eq!(counts(rt, &m, dev)?, Some((1, 0)));
        let s0 = rt.transfer_stats(dev)?;
        gpu.data(map::tofrom(&mut m), |v| {
            check!(rt.is_present(v.host_range().begin, dev)?, "m not present in the inner region");
            check_eq!(
                rt.entry(v.host_range().begin, dev)?.map(|e| (e.ref_count, e.hold_count)),
                Some((2, 0))
            );
            offload_kernels::fill_i32(&gpu, 7, v)
        })?;
        let s1 = rt.transfer_stats(dev)?;
        // The inner region neither copied in (present) nor back (not released).
        check_eq!(copies(s0, s1), (0, 0));
        check_eq!(m, vec![0; 16]);
        check_eq!(counts(rt, &m, dev)?, Some((1, 0)));
        check!(rt.is_present(m.as_ptr() as usize, dev)?, "m absent between the two ends");
        let s2 = rt.transfer_stats(dev)?;
        // SAFETY: matches the begin above; `m` is not otherwise accessed during the call.
        unsafe { rt.target_data_end(dev, &outer)? };
        let s3 = rt.transfer_stats(dev)?;
        check_eq!(copies(s2, s3), (0, 1));
        check_eq!(m, vec![7; 16]);
        check!(!rt.is_present(m.as_ptr() as usize, dev)?, "m present after the outer region");
        assert_clean(rt, dev)
    });
}

#[test]
fn case_08_nested_target_data_raw() {
    on_every_device("case 8 (raw)", |rt, dev| {
        let mut m = vec![0i32; 16];
        let list = [MapItem::slice_mut(&mut m, MapType::TOFROM)];
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: `m` stays alive and unaliased until the matching ends.
        unsafe {
            rt.target_data_begin(dev, &list)?;
            rt.target_data_begin(dev, &list)?;
        }
        check_eq!(copies(s0, rt.transfer_stats(dev)?), (1, 0));
        check_eq!(counts(rt, &m, dev)?, Some((2, 0)));
        fill_device(rt, dev, &m, 3)?;
        let s1 = rt.transfer_stats(dev)?;
        // SAFETY: matches the inner begin; `m` is not otherwise accessed during the call.
        unsafe { rt.target_data_end(dev, &list)? };
        check_eq!(copies(s1, rt.transfer_stats(dev)?), (0, 0));
        check_eq!(m, vec![0; 16]);
        check_eq!(counts(rt, &m, dev)?, Some((1, 0)));
        // SAFETY: matches the outer begin; `m` is not otherwise accessed during the call.
        unsafe { rt.target_data_end(dev, &list)? };
        check_eq!(copies(s1, rt.transfer_stats(dev)?), (0, 1));
        check_eq!(m, vec![3; 16]);
        check_eq!(counts(rt, &m, dev)?, None);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_09_launch_tofrom_without_a_region_unmaps() {
    on_every_device("case 9 (no region)", |rt, dev| {
        let mut m = vec![0i32; 8];
        let maps = [MapItem::slice_mut(&mut m, MapType::TOFROM)];
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: `m` is alive and not otherwise accessed during the launch; the kernel
        // writes m.len() i32 of its device copy.
        unsafe {
            rt.target_launch(
                dev,
                &FILL_I32,
                m.len(),
                &maps,
                &[LaunchArg::Value(Scalar::I32(5)), LaunchArg::mapped(m.as_ptr())],
            )?
        };
        check_eq!(copies(s0, rt.transfer_stats(dev)?), (1, 1));
        check_eq!(m, vec![5; 8]);
        check!(!rt.is_present(m.as_ptr() as usize, dev)?, "m present after the launch");
        assert_clean(rt, dev)
    });
}

#[test]
fn case_09_launch_tofrom_inside_a_region_keeps_the_entry() {
    on_every_device("case 9 (inside target data)", |rt, dev| {
        let mut m = vec![0i32; 8];
        let maps = [MapItem::slice_mut(&mut m, MapType::TOFROM)];
        // SAFETY: `m` stays alive and unaliased until the matching target_data_end.
        unsafe { rt.target_data_begin(dev, &maps)? };
        let s0 = rt.transfer_stats(dev)?;
        // SAFETY: `m` is alive and not otherwise accessed during the launch; the kernel
        // writes m.len() i32 of its device copy.
        unsafe {
            rt.target_launch(
                dev,
                &FILL_I32,
                m.len(),
                &maps,
                &[LaunchArg::Value(Scalar::I32(6)), LaunchArg::mapped(m.as_ptr())],
            )?
        };
        check_eq!(copies(s0, rt.transfer_stats(dev)?), (0, 0));
        check!(rt.is_present(m.as_ptr() as usize, dev)?, "m absent after a launch inside the region");
        check_eq!(counts(rt, &m, dev)?, Some((1, 0)));
        check_eq!(m, vec![0; 8]);
        // SAFETY: matches the begin above; `m` is not otherwise accessed during the call.
        unsafe { rt.target_data_end(dev, &maps)? };
        check_eq!(copies(s0, rt.transfer_stats(dev)?), (0, 1));
        check_eq!(m, vec![6; 8]);
        assert_clean(rt, dev)
    });
}

#[test]
fn case_10_launch_from_then_always_to_copies_once() {
    on_every_device_with(
        "case 10",
        |b| b.info(InfoFlags::TRANSFERS).capture_info(),
        |rt, dev| {
            const N: usize = 16;
            let mut buf = vec![0.0f32; N];
            let range = HostRange::of(&buf);
            rt.take_info();
            let s0 = rt.transfer_stats(dev)?;
            let maps = [MapItem::slice_mut(&mut buf, MapType::FROM)];
            // SAFETY: `buf` is alive and not otherwise accessed during the launch; the kernel
            // writes N f32 of its device copy.
            unsafe {
                rt.target_launch(
                    dev,
                    &FILL_F32,
                    N,
                    &maps,
                    &[LaunchArg::Value(Scalar::F32(1.0)), LaunchArg::mapped(buf.as_ptr())],
                )?
            };
            check_eq!(copies(s0, rt.transfer_stats(dev)?), (0, 1));
            check_eq!(buf, vec![1.0; N]);
            let trace = rt.take_info();
            let back = copy_lines(&trace, dev, "device->host", range);
            check!(back == 1, "one copy back of buf expected, got {back}; trace: {trace:#?}");
            let into = copy_lines(&trace, dev, "host->device", range);
            check!(into == 0, "`from` copied buf in; trace: {trace:#?}");

            // A second launch: `always to(buf)` on an absent range copies once, not twice.
            let mut total = [0.0f32];
            let maps =
                [MapItem::slice(&buf, MapType::TO.always()), MapItem::slice_mut(&mut total, MapType::TOFROM)];
            let s1 = rt.transfer_stats(dev)?;
            // SAFETY: `buf` and `total` are alive and not otherwise accessed during the launch;
            // the kernel reads N f32 of buf's device copy and writes one of total's.
            unsafe {
                rt.target_launch(
                    dev,
                    &SUM_F32,
                    N,
                    &maps,
                    &[LaunchArg::mapped(buf.as_ptr()), LaunchArg::mapped(total.as_ptr())],
                )?
            };
            check_eq!(total, [N as f32]);
            let trace = rt.take_info();
            let into = copy_lines(&trace, dev, "host->device", range);
            check!(into == 1, "`always to` of an absent range must copy once, got {into}; trace: {trace:#?}");
            // buf once and total once in; total once back.
            check_eq!(copies(s1, rt.transfer_stats(dev)?), (2, 1));
            check!(!rt.is_present(buf.as_ptr() as usize, dev)?, "buf present after the launch");
            assert_clean(rt, dev)
        },
    );
}
