//! Cases 46-50: `OFFLOAD_INFO` traces, present-table dumps, `OMP_TARGET_OFFLOAD` and the
//! memory pool.

use offload::{
    map, BackendKind, Error, HostRange, InfoFlags, LaunchArg, MapItem, MapType, OffloadPolicy, PoolConfig,
    Result, Runtime, Scalar, UpdateDirection,
};
use offload_kernels::{fill_i32, ADD_I32, FILL_I32};
use offload_tests::{assert_clean, check, check_eq, on_every_backend, on_every_device, on_every_device_with};

/// Indices of the lines that contain every one of `needles`.
fn find(lines: &[String], needles: &[&str]) -> Vec<usize> {
    (0..lines.len()).filter(|&i| needles.iter().all(|n| lines[i].contains(n))).collect()
}

#[test]
fn case_46_info_trace_of_a_target_data_region() {
    on_every_device_with(
        "case 46",
        |b| b.info(InfoFlags::ALL).capture_info(),
        |rt, dev| {
            let a = [1i32; 16];
            let mut b = [2i32; 32];
            let c = [3i32; 48];
            let (ra, rb, rc) = (HostRange::of(&a), HostRange::of(&b), HostRange::of(&c));
            let (sa, sb, sc) = (ra.to_string(), rb.to_string(), rc.to_string());
            let list = [
                MapItem::slice(&a, MapType::ALLOC),
                MapItem::slice_mut(&mut b, MapType::TOFROM),
                MapItem::slice(&c, MapType::TO),
            ];
            rt.take_info();
            // SAFETY: the arrays outlive the region and are not touched while it is open.
            unsafe { rt.target_data_begin(dev, &list)? };
            let begin = rt.take_info();
            // SAFETY: as above.
            unsafe { rt.target_data_end(dev, &list)? };
            let end = rt.take_info();
            let all: Vec<String> = begin.iter().chain(&end).cloned().collect();
            let me = format!("device {dev}: ");

            // Three entries created, in list order, each with its counts.
            let created = find(&begin, &[&me, "entry created"]);
            check_eq!(created.len(), 3);
            for (i, r) in created.iter().zip([&sa, &sb, &sc]) {
                check!(begin[*i].contains(r.as_str()), "line {:?} should name {r}", begin[*i]);
                check!(begin[*i].contains("ref count 1 hold count 0"), "{:?}", begin[*i]);
            }
            // Copies in for B and C only, with their sizes; none for A.
            let to = find(&begin, &[&me, "copy host->device"]);
            check_eq!(to.len(), 2);
            check!(begin[to[0]].contains(&sb) && begin[to[0]].contains("128 bytes"), "{:?}", begin[to[0]]);
            check!(begin[to[1]].contains(&sc) && begin[to[1]].contains("192 bytes"), "{:?}", begin[to[1]]);
            // The table after the construct, with three rows.
            check!(!find(&begin, &["after target data", "(3 entries)"]).is_empty(), "{begin:#?}");

            // The copy back for B only, then removals in the order C, B, A.
            check!(find(&end, &["copy host->device"]).is_empty(), "{end:#?}");
            let from = find(&end, &[&me, "copy device->host"]);
            check_eq!(from.len(), 1);
            check!(end[from[0]].contains(&sb) && end[from[0]].contains("128 bytes"), "{:?}", end[from[0]]);
            let removed = find(&end, &[&me, "entry removed"]);
            check_eq!(removed.len(), 3);
            for (i, r) in removed.iter().zip([&sc, &sb, &sa]) {
                check!(end[*i].contains(r.as_str()), "line {:?} should name {r}", end[*i]);
                check!(end[*i].contains("ref count 0 hold count 0"), "{:?}", end[*i]);
            }
            // B's data comes back before its memory goes.
            check!(from[0] < removed[1], "{end:#?}");
            check!(!find(&end, &["after target data", "(0 entries)"]).is_empty(), "{end:#?}");
            // A is never copied.
            check!(find(&all, &["copy", &sa]).is_empty(), "{all:#?}");
            check_eq!(b, [2; 32]);
            assert_clean(rt, dev)
        },
    );
}

#[test]
fn case_46_info_trace_of_a_launch_and_an_existing_mapping() {
    on_every_device_with(
        "case 46 (launch)",
        |b| b.info(InfoFlags::KERNEL_ARGS | InfoFlags::MAPPING_EXISTS).capture_info(),
        |rt, dev| {
            let mut x = [0i32; 8];
            let r = HostRange::of(&x).to_string();
            // SAFETY: `x` is alive and not touched during the calls.
            unsafe {
                rt.enter_data(dev, &[MapItem::slice(&x, MapType::TO)])?;
                rt.take_info();
                let maps = [MapItem::slice_mut(&mut x, MapType::TOFROM)];
                let args = [LaunchArg::Value(Scalar::I32(4)), LaunchArg::mapped(x.as_ptr())];
                rt.target_launch(dev, &FILL_I32, 8, &maps, &args)?;
            }
            let lines = rt.take_info();
            let exists = find(&lines, &[&format!("device {dev}: mapping exists"), &r]);
            check_eq!(exists.len(), 1);
            // The counts with the launch's own increment, as libomptarget's "Mapping exists".
            check!(lines[exists[0]].contains("ref count 2 hold count 0"), "{lines:#?}");
            let launch =
                find(&lines, &[&format!("device {dev}: launch `fill_i32` n=8 args [I32(4), device 0x")]);
            check_eq!(launch.len(), 1);
            // Only ENTRIES lines would mention creation; TRANSFERS is off.
            check!(
                find(&lines, &["entry created"]).is_empty() && find(&lines, &["copy"]).is_empty(),
                "{lines:#?}"
            );
            // SAFETY: `x` is writable and not otherwise used.
            unsafe { rt.exit_data(dev, &[MapItem::slice_mut(&mut x, MapType::FROM)])? };
            check_eq!(x, [4; 8]);
            assert_clean(rt, dev)
        },
    );
}

/// Rows of a present-table dump (after its two header lines).
fn rows(dump: &str) -> Vec<&str> {
    dump.lines().skip(2).collect()
}

#[test]
fn case_47_present_table_dump() {
    on_every_device("case 47", |rt, dev| {
        let a = [0u8; 100];
        let b = [0f64; 10];
        let (ap, bp) = (a.as_ptr() as usize, b.as_ptr() as usize);
        let dump = rt.dump_present_table(dev)?;
        check!(dump.starts_with(&format!("device {dev} present table (0 entries)")), "{dump}");
        check!(rows(&dump).is_empty(), "{dump}");
        // SAFETY: `a` and `b` live until the end of the case.
        unsafe {
            rt.enter_data(dev, &[MapItem::slice(&a, MapType::TO)])?;
            rt.enter_data(dev, &[MapItem::slice(&b, MapType::ALLOC)])?;
            rt.enter_data(dev, &[MapItem::slice(&b, MapType::ALLOC)])?;
        }
        let dump = rt.dump_present_table(dev)?;
        check!(dump.starts_with(&format!("device {dev} present table (2 entries)")), "{dump}");
        let r = rows(&dump);
        check_eq!(r.len(), 2);
        let row_of =
            |p: usize| r.iter().find(|l| l.split_whitespace().next() == Some(&format!("{p:#x}"))).copied();
        let ra = row_of(ap).unwrap_or_default().split_whitespace().collect::<Vec<_>>();
        let rb = row_of(bp).unwrap_or_default().split_whitespace().collect::<Vec<_>>();
        // host, device, bytes, ref count, hold
        check_eq!(ra.get(2..), Some(&["100", "1", "0"][..]));
        check_eq!(rb.get(2..), Some(&["80", "2", "0"][..]));
        let device_a = format!("{:#x}", rt.mapped_ptr(ap, dev)?.unwrap_or(0));
        check_eq!(ra.get(1).copied(), Some(device_a.as_str()));
        // SAFETY: as above.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&a, MapType::RELEASE)])? };
        let dump = rt.dump_present_table(dev)?;
        check!(dump.starts_with(&format!("device {dev} present table (1 entries)")), "{dump}");
        let r = rows(&dump);
        check_eq!(r.len(), 1);
        let host_b = format!("{bp:#x}");
        check_eq!(r[0].split_whitespace().next(), Some(host_b.as_str()));
        // SAFETY: as above.
        unsafe { rt.exit_data(dev, &[MapItem::slice(&b, MapType::DELETE)])? };
        check!(rows(&rt.dump_present_table(dev)?).is_empty());
        // The initial device has no table.
        check!(matches!(rt.dump_present_table(rt.initial_device()), Err(Error::NoSuchDevice { .. })));
        assert_clean(rt, dev)
    });
}

fn env_policy(value: &'static str) -> impl Fn(&str) -> Option<String> + Send + Sync + 'static {
    move |k| (k == "OMP_TARGET_OFFLOAD").then(|| value.to_string())
}

/// Checks that `r` is the `OffloadMandatory` error with a clear message naming the reason.
fn is_mandatory_error<T: std::fmt::Debug>(r: Result<T>) -> std::result::Result<(), String> {
    match r {
        Err(e @ Error::OffloadMandatory { .. }) => {
            let s = e.to_string();
            let clear = s.contains("OMP_TARGET_OFFLOAD=mandatory")
                && s.contains("no offload device is available")
                && s.contains("0 host devices");
            if clear {
                Ok(())
            } else {
                Err(format!("unclear message: {s}"))
            }
        }
        Err(e) => Err(format!("wrong error: {e:?}")),
        Ok(v) => Err(format!("succeeded: {v:?}")),
    }
}

/// Under `mandatory` with no device the runtime starts and answers (libomptarget 19 does
/// too); device constructs fail, on the initial device as well, since the default device
/// is then the initial device (libomptarget: "failure of target construct while offloading
/// is mandatory"); the device memory routines work on the initial device.
#[test]
fn case_48_mandatory_without_a_device_starts_and_fails_constructs() {
    for (how, b) in [
        ("env", Runtime::builder().env(env_policy("mandatory")).gpus(false).host_devices(0)),
        ("env, upper case", Runtime::builder().env(env_policy("MANDATORY")).gpus(false).host_devices(0)),
        (
            "env only",
            Runtime::builder()
                .env(|k| match k {
                    "OMP_TARGET_OFFLOAD" => Some("mandatory".into()),
                    "OFFLOAD_HOST_DEVICES" => Some("0".into()),
                    _ => None,
                })
                .gpus(false),
        ),
        (
            "builder",
            Runtime::builder().env(|_| None).gpus(false).policy(OffloadPolicy::Mandatory).host_devices(0),
        ),
    ] {
        let rt = b.build().unwrap_or_else(|e| panic!("case 48 ({how}): start-up failed: {e}"));
        assert_eq!(rt.policy(), OffloadPolicy::Mandatory, "case 48 ({how})");
        assert_eq!(
            (rt.num_devices(), rt.initial_device(), rt.default_device()),
            (0, 0, 0),
            "case 48 ({how})"
        );
        assert!(rt.is_initial_device(), "case 48 ({how})");
        let init = rt.initial_device();
        let mut x = [0i32; 16];
        let xp = x.as_ptr() as usize;
        let p =
            rt.target_alloc(64, init).unwrap_or_else(|e| panic!("case 48 ({how}): alloc on the host: {e}"));
        // SAFETY: `p` is 64 bytes of host memory, `x` 64 bytes.
        let copied = unsafe { rt.target_memcpy(p, xp as u64, 64, 0, 0, init, init) };
        assert!(copied.is_ok(), "case 48 ({how}): memcpy on the host: {copied:?}");
        // SAFETY: nothing uses `p`.
        let freed = unsafe { rt.target_free(p, init) };
        assert!(freed.is_ok(), "case 48 ({how}): free on the host: {freed:?}");
        assert!(matches!(rt.is_present(xp, init), Ok(true)), "case 48 ({how})");
        let tofrom = [MapItem::slice_mut(&mut x, MapType::TOFROM)];
        let args = [LaunchArg::Value(Scalar::I32(5)), LaunchArg::Mapped(xp)];
        // SAFETY: every construct is refused before touching `x`.
        let refused: Vec<(&str, std::result::Result<(), String>)> = unsafe {
            vec![
                ("device", is_mandatory_error(rt.device(init).map(drop))),
                ("device 1", is_mandatory_error(rt.device(1).map(drop))),
                ("alloc on device 1", is_mandatory_error(rt.target_alloc(4, 1))),
                ("enter data", is_mandatory_error(rt.enter_data(init, &tofrom))),
                ("target data", is_mandatory_error(rt.target_data_begin(init, &tofrom))),
                ("exit data", is_mandatory_error(rt.exit_data(init, &tofrom))),
                (
                    "update",
                    is_mandatory_error(rt.update(
                        init,
                        UpdateDirection::To,
                        &[(HostRange::new(xp, 64), false)],
                    )),
                ),
                ("launch", is_mandatory_error(rt.target_launch(init, &FILL_I32, 16, &tofrom, &args))),
            ]
        };
        for (what, r) in refused {
            if let Err(why) = r {
                panic!("case 48 ({how}), {what}: {why}");
            }
        }
        assert_eq!(x, [0; 16], "case 48 ({how}): nothing ran");
    }
    // Without `mandatory`, no device is fine: constructs fall back to the host.
    let rt = Runtime::builder()
        .env(|_| None)
        .gpus(false)
        .host_devices(0)
        .build()
        .expect("default policy, no device");
    assert_eq!((rt.num_devices(), rt.initial_device()), (0, 0));
    assert!(rt.device(0).is_ok());
}

#[test]
fn case_48_mandatory_with_devices_runs_normally() {
    on_every_device_with(
        "case 48 (devices present)",
        |b| b.env(env_policy("mandatory")),
        |rt, dev| {
            check_eq!(rt.policy(), OffloadPolicy::Mandatory);
            let mut x = [1i32; 32];
            rt.device(dev)?.data(map::tofrom(&mut x), |v| fill_i32(&rt.device(dev)?, 8, v))?;
            check_eq!(x, [8; 32]);
            assert_clean(rt, dev)
        },
    );
}

#[test]
fn case_49_disabled_runs_everything_on_the_host() {
    on_every_backend(
        "case 49",
        0,
        |b| b.env(env_policy("disabled")),
        |rt| {
            check_eq!(rt.policy(), OffloadPolicy::Disabled);
            check_eq!(rt.num_devices(), 0);
            check_eq!(rt.initial_device(), 0);
            check_eq!(rt.default_device(), 0);
            check!(rt.device_report().contains("disabled"), "{}", rt.device_report());
            check!(matches!(rt.device(1), Err(Error::NoSuchDevice { .. })));
            let init = rt.initial_device();
            // Setting the default device is accepted for any number and changes nothing:
            // there are no devices (libomptarget takes it without complaint).
            for d in [0, 1, 7, usize::MAX] {
                rt.set_default_device(d)?;
                check_eq!(rt.default_device(), init);
            }

            let mut x = vec![1i32; 100];
            let xp = x.as_ptr() as usize;
            let tofrom = [MapItem::slice_mut(&mut x, MapType::TOFROM)];
            // SAFETY: for every construct below, `x` is alive; on the host nothing is copied,
            // and the kernel writes `x` itself while nothing else uses it.
            unsafe {
                // Data constructs do nothing, not even `present` checks.
                rt.enter_data(init, &[MapItem::slice(&x, MapType::TO.present())])?;
                rt.target_data_begin(init, &tofrom)?;
                // The kernel runs on host memory: `x` changes at once, not at the region's end.
                let args = [LaunchArg::Value(Scalar::I32(5)), LaunchArg::Mapped(xp)];
                rt.target_launch(init, &FILL_I32, 100, &tofrom, &args)?;
            }
            check!(x.iter().all(|&v| v == 5), "{:?}", &x[..8]);
            check!(rt.is_present(xp, init)?);
            check_eq!(rt.mapped_ptr(xp, init)?, Some(xp as u64));
            // SAFETY: as above.
            unsafe {
                rt.update(init, UpdateDirection::From, &[(HostRange::new(xp, 400), true)])?;
                rt.target_data_end(init, &tofrom)?;
                rt.exit_data(init, &[MapItem::slice_mut(&mut x, MapType::FROM)])?;
            }
            check!(x.iter().all(|&v| v == 5));
            check!(rt.live_mappings().is_empty());

            // The safe API and raw allocations on the initial device work on host memory.
            let mut y = [0i32; 16];
            let host = rt.device(init)?;
            host.data(map::tofrom(&mut y), |v| fill_i32(&host, 3, v))?;
            check_eq!(y, [3; 16]);
            let p = rt.target_alloc(64, init)?;
            let args = [LaunchArg::Value(Scalar::I32(2)), LaunchArg::Device(p)];
            // SAFETY: `p` is 64 bytes of host memory.
            unsafe { rt.target_launch(init, &FILL_I32, 16, &[], &args)? };
            // SAFETY: `p` holds 16 i32 written by the kernel, which has completed.
            let v = unsafe { std::slice::from_raw_parts(p as usize as *const i32, 16) }.to_vec();
            check_eq!(v, vec![2; 16]);
            // SAFETY: nothing uses `p`.
            unsafe { rt.target_free(p, init)? };
            check!(rt.live_mappings().is_empty());
            Ok(())
        },
    );
}

/// A fixed workload of maps, launches, copies and raw allocations; returns what the host
/// ends up with.
fn workload(rt: &Runtime, dev: usize) -> Result<Vec<i32>> {
    let init = rt.initial_device();
    let mut a: Vec<i32> = (0..1000).collect();
    let mut b = vec![0i32; 300];
    let mut c = vec![0i32; 1000];
    let region = [MapItem::slice_mut(&mut a, MapType::TOFROM)];
    // SAFETY: `a`, `b`, `c` are alive and only touched by the runtime during the calls.
    unsafe {
        rt.target_data_begin(dev, &region)?;
        rt.target_launch(
            dev,
            &ADD_I32,
            1000,
            &[],
            &[LaunchArg::Value(Scalar::I32(10)), LaunchArg::mapped(a.as_ptr())],
        )?;
        rt.enter_data(dev, &[MapItem::slice(&b, MapType::TO)])?;
        rt.target_launch(
            dev,
            &FILL_I32,
            300,
            &[],
            &[LaunchArg::Value(Scalar::I32(4)), LaunchArg::mapped(b.as_ptr())],
        )?;
        rt.exit_data(dev, &[MapItem::slice_mut(&mut b, MapType::FROM)])?;
        let p = rt.target_alloc(4000, dev)?;
        let da = rt.mapped_ptr(a.as_ptr() as usize, dev)?.unwrap_or(0);
        rt.target_memcpy(p, da, 4000, 0, 0, dev, dev)?;
        rt.target_launch(
            dev,
            &ADD_I32,
            1000,
            &[],
            &[LaunchArg::Value(Scalar::I32(1)), LaunchArg::Device(p)],
        )?;
        rt.target_memcpy(c.as_mut_ptr() as u64, p, 4000, 0, 0, init, dev)?;
        rt.target_free(p, dev)?;
        rt.target_data_end(dev, &region)?;
        // Many short-lived maps of different sizes.
        for k in 1..=20usize {
            let t = vec![k as i32; k * 37];
            rt.enter_data(dev, &[MapItem::slice(&t, MapType::TO)])?;
            rt.exit_data(dev, &[MapItem::slice(&t, MapType::RELEASE)])?;
        }
    }
    Ok([a, b, c].concat())
}

fn workload_expected() -> Vec<i32> {
    let a: Vec<i32> = (10..1010).collect();
    let c: Vec<i32> = (11..1011).collect();
    [a, vec![4; 300], c].concat()
}

#[test]
fn case_50_pool_off_gives_the_same_results() {
    on_every_device_with(
        "case 50 (pool off)",
        |b| b.memory_pool(PoolConfig { enabled: false, ..Default::default() }),
        |rt, dev| {
            check_eq!(workload(rt, dev)?, workload_expected());
            check_eq!(rt.pool_usage(dev)?.cached_bytes, 0);
            // Every block went back to the device (exactly measurable on host devices; a
            // GPU's free memory also moves with the driver's own allocations).
            if rt.describe(dev)?.kind == BackendKind::Host {
                let m = rt.mem_info(dev)?;
                check_eq!(m.free, m.total);
            }
            assert_clean(rt, dev)
        },
    );
}

#[test]
fn case_50_pool_on_gives_the_same_results_and_keeps_blocks() {
    // Constructs wait here: a block that queued work still uses is freed when the work is
    // done, so how many blocks a run takes from the cache depends on timing otherwise.
    on_every_device_with(
        "case 50 (pool on)",
        |b| b.synchronous(true),
        |rt, dev| {
            check_eq!(workload(rt, dev)?, workload_expected());
            // The pool kept freed blocks for reuse (which is what the pool-off run must not do).
            let usage = rt.pool_usage(dev)?;
            check!(usage.cached_bytes > 0, "{usage:?}");
            let host = rt.describe(dev)?.kind == BackendKind::Host;
            let free = rt.mem_info(dev)?.free;
            if host {
                check_eq!(rt.mem_info(dev)?.total - free, usage.cached_bytes);
            }
            // A second run reuses the cached blocks instead of allocating more.
            check_eq!(workload(rt, dev)?, workload_expected());
            check_eq!(rt.pool_usage(dev)?.cached_bytes, usage.cached_bytes);
            if host {
                check_eq!(rt.mem_info(dev)?.free, free);
            }
            assert_clean(rt, dev)
        },
    );
}

#[test]
fn case_50_pool_setting_from_the_environment() {
    on_every_device_with(
        "case 50 (OFFLOAD_MEMORY_POOL=0)",
        |b| b.env(|k| (k == "OFFLOAD_MEMORY_POOL").then(|| "0".to_string())),
        |rt, dev| {
            check_eq!(workload(rt, dev)?, workload_expected());
            check_eq!(rt.pool_usage(dev)?.cached_bytes, 0);
            assert_clean(rt, dev)
        },
    );
}

#[test]
fn case_46_entries_are_created_in_list_order_whatever_their_addresses() {
    on_every_device_with(
        "case 46 (list order)",
        |b| b.info(InfoFlags::ENTRIES).capture_info(),
        |rt, dev| {
            let arr = [0u8; 300];
            let (lo, mid, hi) = (&arr[..100], &arr[100..200], &arr[200..]);
            // Highest address first.
            let list = [
                MapItem::slice(hi, MapType::ALLOC),
                MapItem::slice(mid, MapType::ALLOC),
                MapItem::slice(lo, MapType::ALLOC),
            ];
            rt.take_info();
            // SAFETY: `arr` outlives the region; alloc copies nothing.
            unsafe {
                rt.target_data_begin(dev, &list)?;
                rt.target_data_end(dev, &list)?;
            }
            let lines = rt.take_info();
            let created: Vec<&String> = lines.iter().filter(|l| l.contains("entry created")).collect();
            check_eq!(created.len(), 3);
            for (l, part) in created.iter().zip([hi, mid, lo]) {
                check!(l.contains(&HostRange::of(part).to_string()), "{lines:#?}");
            }
            assert_clean(rt, dev)
        },
    );
}

#[test]
fn a_failed_construct_shows_the_present_table_when_dumps_are_on() {
    on_every_device_with(
        "dump on error",
        |b| b.info(InfoFlags::DUMP_TABLE).capture_info(),
        |rt, dev| {
            let (x, y) = ([1u8; 64], [2u8; 8]);
            // SAFETY: `x` outlives its mapping; the second construct fails before copying.
            unsafe { rt.enter_data(dev, &[MapItem::slice(&x, MapType::TO)])? };
            rt.take_info();
            // SAFETY: as above.
            let r = unsafe { rt.enter_data(dev, &[MapItem::slice(&y, MapType::TO.present())]) };
            check!(matches!(r, Err(Error::NotPresent { .. })), "{r:?}");
            let lines = rt.take_info();
            let failed =
                find(&lines, &["target enter data failed", "is not present", "present table (1 entries)"]);
            check_eq!(failed.len(), 1);
            check!(lines[failed[0]].contains(&format!("{:#x}", x.as_ptr() as usize)), "{lines:#?}");
            // SAFETY: as above.
            unsafe { rt.exit_data(dev, &[MapItem::slice(&x, MapType::DELETE)])? };
            assert_clean(rt, dev)
        },
    );
}

#[test]
fn traces_and_dumps_show_the_hold_count() {
    on_every_device_with(
        "hold in traces and dumps",
        |b| b.info(InfoFlags::ENTRIES).capture_info(),
        |rt, dev| {
            let x = [0i32; 4];
            let r = HostRange::of(&x).to_string();
            let region = [MapItem::slice(&x, MapType::ALLOC.hold())];
            rt.take_info();
            // SAFETY: `x` outlives the region.
            unsafe { rt.target_data_begin(dev, &region)? };
            let lines = rt.take_info();
            let created = find(&lines, &[&format!("device {dev}: entry created"), &r]);
            check_eq!(created.len(), 1);
            check!(lines[created[0]].contains("ref count 0 hold count 1"), "{lines:#?}");
            let dump = rt.dump_present_table(dev)?;
            let row: Vec<&str> =
                rows(&dump).first().map(|l| l.split_whitespace().collect()).unwrap_or_default();
            // host, device, bytes, ref count, hold
            check_eq!(row.get(2..), Some(&["16", "0", "1"][..]));
            // SAFETY: matches the begin.
            unsafe { rt.target_data_end(dev, &region)? };
            assert_clean(rt, dev)
        },
    );
}

/// `OFFLOAD_INFO=-1` turns every bit on, the launch details (0x10) and the ranges a
/// construct skipped (0x40) among them.
#[test]
fn info_minus_one_traces_launch_details_and_skipped_host_ranges() {
    on_every_device_with(
        "OFFLOAD_INFO=-1",
        |b| b.env(|k| (k == "OFFLOAD_INFO").then(|| "-1".to_string())).capture_info(),
        |rt, dev| {
            let x = [0i32; 8];
            rt.take_info();
            // SAFETY: `x` lives through the calls; nothing is mapped, so nothing is copied.
            unsafe {
                rt.update(dev, UpdateDirection::To, &[(HostRange::of(&x), false)])?;
                rt.exit_data(dev, &[MapItem::slice(&x, MapType::RELEASE)])?;
            }
            let lines = rt.take_info();
            let me = format!("device {dev}: ");
            let skipped =
                find(&lines, &[&me, "has no device counterpart; skipped", &HostRange::of(&x).to_string()]);
            check_eq!(skipped.len(), 2);
            check!(lines[skipped[0]].contains("target update"), "{lines:#?}");
            check!(lines[skipped[1]].contains("target exit data"), "{lines:#?}");
            let mut y = [0i32; 64];
            rt.device(dev)?.data(map::tofrom(&mut y), |v| fill_i32(&rt.device(dev)?, 1, v))?;
            let lines = rt.take_info();
            let launch = find(&lines, &[&me, "launch `fill_i32` n=64:"]);
            check_eq!(launch.len(), 1);
            let gpu = rt.describe(dev)?.kind != BackendKind::Host;
            check!(lines[launch[0]].contains(if gpu { "blocks x" } else { "kernel threads" }), "{lines:#?}");
            assert_clean(rt, dev)
        },
    );
}

/// Construct lines name the construct, where the program called it and its map list;
/// each entry is reported created before its copy, and table dumps name the half.
#[test]
fn construct_lines_say_where_and_what_in_the_order_things_happen() {
    on_every_device_with(
        "construct lines",
        |b| b.info(InfoFlags::ALL).capture_info(),
        |rt, dev| {
            let gpu = rt.device(dev)?;
            let (a, mut b, c) = ([1i32; 16], [2i32; 16], [3i32; 16]);
            rt.take_info();
            #[rustfmt::skip]
            let (line, r) = (line!(), gpu.data((map::alloc(&a), map::tofrom(&mut b), map::to(&c)), |_| Ok(())));
            r?;
            let lines = rt.take_info();
            let at = format!("at {}:{line} with 3 maps: alloc(host {:#x}, 64 bytes) tofrom(host {:#x}, 64 bytes) to(host {:#x}, 64 bytes)", file!(), a.as_ptr() as usize, b.as_ptr() as usize, c.as_ptr() as usize);
            let me = format!("device {dev}: ");
            let enter = find(&lines, &[&me, "entering target data", &at]);
            let exit = find(&lines, &[&me, "exiting target data", &at]);
            check_eq!((enter.len(), exit.len()), (1, 1));
            let created = find(&lines, &[&me, "entry created", &HostRange::of(&b).to_string()]);
            let copied = find(&lines, &[&me, "copy host->device", &HostRange::of(&b).to_string()]);
            check_eq!((created.len(), copied.len()), (1, 1));
            check!(enter[0] < created[0] && created[0] < copied[0], "{lines:#?}");
            check!(!find(&lines, &["after target data (entry half)"]).is_empty(), "{lines:#?}");
            check!(!find(&lines, &["after target data (exit half)"]).is_empty(), "{lines:#?}");
            // The launch of a `target` construct: its line, then the launch, between the halves.
            let mut y = [0i32; 8];
            #[rustfmt::skip]
            let (line, r) = (line!(), gpu.target(&FILL_I32, 8, map::tofrom(&mut y), |v| (5i32, v)));
            r?;
            let lines = rt.take_info();
            let launch_at =
                format!("entering target (kernel `fill_i32`, n=8) at {}:{line} with 0 maps", file!());
            let region = find(&lines, &[&me, "entering target data", &format!("{}:{line}", file!())]);
            let launch = find(&lines, &[&me, &launch_at]);
            check_eq!((region.len(), launch.len()), (1, 1));
            check!(region[0] < launch[0], "{lines:#?}");
            check_eq!(y, [5; 8]);
            assert_clean(rt, dev)
        },
    );
}

/// The trace's events reach a program's own `tracing` subscriber, with fields, whatever
/// `OFFLOAD_INFO` says (here: nothing).
#[test]
fn a_programs_own_tracing_subscriber_gets_the_events_with_fields() {
    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use tracing::field::{Field, Visit};

    type Event = BTreeMap<String, String>;
    #[derive(Default)]
    struct Fields(Event);
    impl Visit for Fields {
        fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
            self.0.insert(f.name().to_string(), format!("{v:?}"));
        }
        fn record_str(&mut self, f: &Field, v: &str) {
            self.0.insert(f.name().to_string(), v.to_string());
        }
    }
    std::thread_local! {
        /// The events this thread emitted.
        static SEEN: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
    }
    /// Keeps every `offload` event's fields, per thread. Installed once as a layer of the
    /// process's subscriber (a thread's scoped one would miss the events of the runtime's
    /// own threads), beside the runtime's text layer as a program would add it.
    struct Collect;
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Collect {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            if e.metadata().target() == "offload" {
                let mut f = Fields::default();
                e.record(&mut f);
                SEEN.with_borrow_mut(|v| v.push(f.0));
            }
        }
    }
    static TEXT: std::sync::OnceLock<offload::InfoLog> = std::sync::OnceLock::new();
    let text = TEXT.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        let (layer, log) = offload::InfoLayer::capture(InfoFlags::ALL);
        let _ =
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Collect).with(layer));
        log
    });
    on_every_device("tracing subscriber", |rt, dev| {
        let gpu = rt.device(dev)?;
        let mut b = [0i32; 64];
        SEEN.take();
        let line = line!() + 1;
        gpu.data(map::tofrom(&mut b), |v| fill_i32(&gpu, 1, v))?;
        let events = SEEN.take();
        let of = |kind: &str| {
            events.iter().filter(|e| e.get("kind").map(String::as_str) == Some(kind)).collect::<Vec<_>>()
        };
        let begin = (b.as_ptr() as usize).to_string();
        let me = dev.to_string();
        // The region's two halves and the kernel's launch, each at the program's line.
        let construct = of("construct");
        check!(construct.len() >= 3, "{events:#?}"); // (a checked GPU launch maps its report too)
        for c in &construct {
            check_eq!(c.get("at"), Some(&format!("{}:{line}", file!())));
        }
        // Those of `b` (a checked GPU launch maps and copies a report of its own too).
        let of_b = |kind: &str| {
            of(kind).into_iter().filter(|e| e.get("host_begin") == Some(&begin)).collect::<Vec<_>>()
        };
        let created = of_b("entry created");
        check_eq!(created.len(), 1);
        for (k, v) in [
            ("device", &me),
            ("host_begin", &begin),
            ("host_bytes", &"256".to_string()),
            ("ref_count", &"1".to_string()),
        ] {
            check_eq!(created[0].get(k), Some(v));
        }
        let copies = of_b("copy");
        check_eq!(copies.len(), 2);
        check_eq!(copies[0].get("direction"), Some(&"host->device".to_string()));
        check_eq!(copies[1].get("bytes"), Some(&"256".to_string()));
        check!(
            of("launch").iter().any(|e| e.get("kernel").map(String::as_str) == Some("fill_i32")),
            "{events:#?}"
        );
        check!(of_b("entry removed").len() == 1, "{events:#?}");
        check!(rt.take_info().is_empty(), "OFFLOAD_INFO is off: nothing in the runtime's own sink");
        // The program's own text layer wrote the lines (other tests' lines are there too).
        let at = format!("at {}:{line}", file!());
        let lines = text.take();
        let mine: Vec<_> =
            lines.iter().filter(|l| l.starts_with(&format!("device {dev}: ")) && l.contains(&at)).collect();
        check!(mine.len() >= 3, "{lines:#?}");
        check!(mine.iter().any(|l| l.contains("entering target data")), "{mine:#?}");
        check_eq!(b, [1; 64]);
        assert_clean(rt, dev)
    });
}
