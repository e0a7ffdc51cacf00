//! Backend behaviour every device must show: identity, out-of-memory errors, user kernels
//! from CUDA C source, compile errors, 2-D/3-D rectangular copies, pinned runtime buffers.

use offload::{map, BackendKind, Error, HostBuffer, Kernel, MapType, RectSide, Runtime};
use offload_tests::{check, check_eq, on_every_backend, on_every_device};

#[test]
fn device_report_says_what_each_backend_found() {
    let rt = Runtime::builder().env(|_| None).host_devices(1).build().expect("runtime");
    let report = rt.device_report();
    check_report(report).unwrap_or_else(|e| panic!("{e}\n{report}"));
}

fn check_report(report: &str) -> offload::Result<()> {
    check!(report.contains("cuda:"), "no cuda line");
    check!(report.contains("host: 1 host devices"), "no host line");
    // HIP compiled in: a line for it whatever the machine (with no ROCm, zero devices and
    // why: the runtime is loaded at run time).
    if offload::compiled_backends().contains(&BackendKind::Hip) {
        check!(report.contains("hip: "), "no hip line");
    }
    Ok(())
}

#[test]
fn devices_identify_themselves() {
    on_every_backend(
        "identity",
        1,
        |b| b,
        |rt| {
            let mut seen = Vec::new();
            for d in 0..rt.num_devices() {
                let desc = rt.describe(d)?;
                println!("device {d}: {desc:?}");
                if desc.kind == offload::BackendKind::Host {
                    check!(desc.pci_bus_id.is_none() && desc.uuid.is_none());
                    continue;
                }
                let bus = desc.pci_bus_id.clone().unwrap_or_default();
                // dddd:bb:dd.f, as cuDeviceGetPCIBusId gives it.
                check!(
                    bus.len() == 12 && bus.as_bytes()[4] == b':' && bus.as_bytes()[10] == b'.',
                    "bus id {bus}"
                );
                check!(
                    desc.uuid.as_deref().is_some_and(|u| u.starts_with("GPU-") && u.len() == 40),
                    "uuid {:?}",
                    desc.uuid
                );
                check!(!seen.contains(&bus), "two devices share bus id {bus}");
                seen.push(bus);
            }
            Ok(())
        },
    );
}

#[test]
fn out_of_memory_names_the_size_asked_and_free() {
    on_every_device("out of memory", |rt, dev| {
        let huge = 1usize << 50;
        match rt.target_alloc(huge, dev) {
            Err(Error::OutOfMemory { device, requested, free, total }) => {
                check_eq!(device, dev);
                check_eq!(requested, huge);
                check!(free <= total && total > 0);
                let msg = Error::OutOfMemory { device, requested, free, total }.to_string();
                check!(msg.contains(&huge.to_string()) && msg.contains("free"), "{msg}");
            }
            other => check!(false, "expected OutOfMemory, got {other:?}"),
        }
        // The pool was not left holding anything.
        check_eq!(rt.pool_usage(dev)?.live_allocations, 0);
        Ok(())
    });
}

#[test]
fn user_kernels_from_cuda_source_run_on_gpus_and_are_refused_elsewhere() {
    let k = Kernel::from_cuda_source(
        "user_twice".into(),
        r#"extern "C" __global__ void user_twice(float* x, float add, unsigned long long n) {
            unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
            if (i < n) x[i] = 2.0f * x[i] + add; }"#
            .into(),
    );
    on_every_device("user CUDA kernel", |rt, dev| {
        let mut x: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let gpu = rt.device(dev)?;
        let r = gpu.data(map::tofrom(&mut x), |v| gpu.launch(&k, 1000, (v, 0.5f32)));
        if rt.describe(dev)?.kind == offload::BackendKind::Host {
            check!(matches!(r, Err(Error::NoKernelImpl { backend: "host", .. })), "{r:?}");
            check!(x.iter().enumerate().all(|(i, &v)| v == i as f32), "host data changed");
        } else {
            r?;
            check!(x.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32 + 0.5), "wrong result");
        }
        offload_tests::assert_clean(rt, dev)
    });
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error_with_the_compiler_log() {
    let k = Kernel::from_cuda_source("broken".into(), "extern \"C\" __global__ void broken( { }".into());
    on_every_device("compile error", |rt, dev| {
        let mut x = vec![0f32; 4];
        let gpu = rt.device(dev)?;
        let r = gpu.data(map::tofrom(&mut x), |v| gpu.launch(&k, 4, (v,)));
        // A GPU's compile error comes inside the construct's error (`Error::Construct`).
        match r.map_err(offload_tests::cause) {
            Err(Error::NoKernelImpl { .. }) if rt.describe(dev)?.kind == offload::BackendKind::Host => {}
            Err(Error::Driver { call: "nvrtcCompileProgram", message, .. }) => {
                check!(message.contains("broken"), "{message}");
            }
            other => check!(false, "expected a compile error, got {other:?}"),
        }
        offload_tests::assert_clean(rt, dev)
    });
}

/// A 3-D host array 4 x 5 x 6 of i32 with distinct values.
fn cube() -> Vec<i32> {
    (0..4 * 5 * 6).collect()
}

#[test]
fn rectangular_copies_in_2d_and_3d_land_exactly() {
    on_every_device("memcpy_rect", |rt, dev| {
        let host = cube();
        let init = rt.initial_device();
        let d = rt.target_alloc(host.len() * 4, dev)?;
        // SAFETY: `d` holds the whole cube; memset first so untouched elements are known.
        unsafe { rt.target_memset(d, 0xff, host.len() * 4, dev)? };
        let dims = [4, 5, 6];
        // 3-D: the 2 x 3 x 4 block at (1, 1, 2) host -> device, same place.
        let (vol, off) = ([2, 3, 4], [1, 1, 2]);
        let side = |ptr, device| RectSide { ptr, device, offsets: &off, dimensions: &dims };
        // SAFETY: both sides are whole 4x5x6 i32 arrays of their devices.
        unsafe { rt.target_memcpy_rect(4, &vol, side(d, dev), side(host.as_ptr() as u64, init))? };
        let back = offload_tests::read_device::<i32>(rt, d, host.len(), dev)?;
        for (i, &v) in back.iter().enumerate() {
            let (z, y, x) = (i / 30, (i / 6) % 5, i % 6);
            let inside = (1..3).contains(&z) && (1..4).contains(&y) && (2..6).contains(&x);
            check_eq!(v, if inside { host[i] } else { -1 });
        }
        // 2-D: rows 1..3, columns 1..4 of a 5 x 6 plane, device -> host at offset (2, 0).
        let mut out = vec![0i32; 30];
        let (vol2, src_off, dst_off, dims2) = ([2, 3], [1, 1], [2, 0], [5, 6]);
        // SAFETY: `out` and the first plane of `d` are 5x6 i32 arrays.
        unsafe {
            rt.target_memcpy_rect(
                4,
                &vol2,
                RectSide {
                    ptr: out.as_mut_ptr() as u64,
                    device: init,
                    offsets: &dst_off,
                    dimensions: &dims2,
                },
                RectSide { ptr: d, device: dev, offsets: &src_off, dimensions: &dims2 },
            )?
        };
        for r in 0..5 {
            for c in 0..6 {
                let want = if (2..4).contains(&r) && c < 3 { back[(r - 1) * 6 + c + 1] } else { 0 };
                check_eq!(out[r * 6 + c], want);
            }
        }
        // SAFETY: no longer used.
        unsafe { rt.target_free(d, dev)? };
        offload_tests::assert_clean(rt, dev)
    });
}

#[test]
fn runtime_buffers_are_pinned_on_gpus_and_stay_mapped_across_scopes() {
    on_every_backend(
        "host buffers",
        1,
        |b| b,
        |rt| {
            let gpu = rt.describe(0)?.kind != offload::BackendKind::Host;
            let mut buf = HostBuffer::<f32>::from_slice(rt, &[1.0; 4096])?;
            check_eq!(buf.is_pinned(), gpu);
            buf.enter(0, MapType::TO)?;
            {
                // A scope that launches on the long-lived mapping.
                rt.device(0)?.launch(&offload_kernels::SCALE_F32, 4096, (3.0f32, buf.view(0)))?;
            }
            buf.exit(0, MapType::FROM)?;
            check!(buf.iter().all(|&v| v == 3.0));
            drop(buf);
            offload_tests::assert_clean(rt, 0)
        },
    );
}

#[test]
fn often_copied_large_mappings_are_registered_in_place_on_gpus_only() {
    use offload::{HostRange, MapItem, StagingConfig, UpdateDirection};
    let cfg = StagingConfig {
        min_bytes: 1 << 20,
        register_after: 3,
        register_min_bytes: 8 << 20,
        ..Default::default()
    };
    on_every_device_with_staging(cfg, |rt, dev| {
        let gpu = rt.describe(dev)?.kind != offload::BackendKind::Host;
        let mut x: Vec<u32> = (0..4 << 20).collect(); // 16 MiB
        let range = HostRange::of(&x);
        // SAFETY: `x` outlives the mapping, deleted below; exclusive during `from` copies.
        unsafe {
            rt.enter_data(dev, &[MapItem::slice(&x, MapType::TO)])?; // copy 1
            rt.update(dev, UpdateDirection::To, &[(range, false)])?; // copy 2
            check!(!rt.entry(range.begin, dev)?.is_some_and(|e| e.registered));
            rt.update(dev, UpdateDirection::To, &[(range, false)])?; // copy 3: registered now
            check_eq!(rt.entry(range.begin, dev)?.is_some_and(|e| e.registered), gpu);
            x.iter_mut().for_each(|v| *v = 7);
            rt.update(dev, UpdateDirection::From, &[(range, false)])?; // a direct copy back
            check!(x.iter().enumerate().all(|(i, &v)| v == i as u32), "data wrong after registration");
            rt.exit_data(dev, &[MapItem::delete(x.as_mut_ptr(), range.bytes)])?;
        }
        // Unregistered at unmap: registering again must work (the driver refuses doubles).
        let pinned = rt.pin(&mut x);
        check_eq!(pinned.is_pinned(), gpu);
        drop(pinned);
        offload_tests::assert_clean(rt, dev)
    });
}

fn on_every_device_with_staging(
    cfg: offload::StagingConfig,
    case: impl Fn(&Runtime, usize) -> offload::Result<()>,
) {
    offload_tests::on_every_device_with("register in place", move |b| b.staging(cfg), case)
}

#[test]
fn dropping_a_runtime_reports_the_mappings_still_live() {
    for b in offload_tests::backends() {
        let rt = b.builder().capture_info().build().expect("runtime");
        let log = rt.info_log().expect("capturing");
        let x = vec![5u64; 16];
        // SAFETY: `x` outlives the runtime, which frees the device copy at shutdown.
        unsafe { rt.enter_data(0, &[offload::MapItem::slice(&x, MapType::TO)]) }.expect("enter");
        drop(rt);
        let lines = log.take().join("\n");
        assert!(
            lines.contains("runtime dropped with 1 mapping(s) still live on device 0"),
            "[{}] {lines}",
            b.name
        );
        assert!(
            lines.contains(&format!("{:#x}", x.as_ptr() as usize)),
            "[{}] no host address: {lines}",
            b.name
        );
    }
}

#[test]
fn every_compiled_backend_reports_and_host_devices_come_after_gpus() {
    let rt = Runtime::builder().env(|_| None).host_devices(2).build().expect("runtime");
    let report = rt.device_report();
    for kind in offload::backend::compiled_backends() {
        // With no such GPU the line says why there are none; never a panic.
        assert!(report.contains(&format!("{}: ", kind.name())), "no {kind} line in {report}");
    }
    let kinds: Vec<offload::BackendKind> =
        (0..rt.num_devices()).map(|d| rt.describe(d).expect("device").kind).collect();
    let first_host = kinds.iter().position(|k| *k == offload::BackendKind::Host).expect("host devices");
    assert_eq!(kinds.len() - first_host, 2, "{kinds:?}");
    assert!(kinds[..first_host].iter().all(|k| *k != offload::BackendKind::Host), "{kinds:?}");
    // CUDA devices are numbered before HIP devices.
    if let (Some(c), Some(h)) = (
        kinds.iter().rposition(|k| *k == offload::BackendKind::Cuda),
        kinds.iter().position(|k| *k == offload::BackendKind::Hip),
    ) {
        assert!(c < h, "{kinds:?}");
    }
}

#[test]
fn pool_blocks_waste_at_most_an_eighth_and_are_reused() {
    on_every_device("pool size classes", |rt, dev| {
        let before = rt.pool_usage(dev)?.cached_bytes;
        // 129 MiB takes a 144 MiB block (an eighth of 128 MiB per class), not 256 MiB.
        let p = rt.target_alloc(129 << 20, dev)?;
        // SAFETY: just allocated, unused.
        unsafe { rt.target_free(p, dev)? };
        check_eq!(rt.pool_usage(dev)?.cached_bytes - before, 144 << 20);
        // Any size of the class reuses the block; a small size is kept at its own size.
        let q = rt.target_alloc(140 << 20, dev)?;
        check_eq!(q, p);
        check_eq!(rt.pool_usage(dev)?.cached_bytes, before);
        let s = rt.target_alloc(1000, dev)?;
        // SAFETY: both just allocated, unused.
        unsafe {
            rt.target_free(q, dev)?;
            rt.target_free(s, dev)?;
        }
        check_eq!(rt.pool_usage(dev)?.cached_bytes - before, (144 << 20) + 1024);
        Ok(())
    });
}

/// OpenMP 6.0's device UIDs: every device has one, unique, that leads back to it (GPUs'
/// by their driver UUID or PCI bus id, so `CUDA_VISIBLE_DEVICES` cannot change it), and
/// `OMP_DEFAULT_DEVICE` accepts one.
#[test]
fn device_uids_are_unique_and_lead_back() {
    on_every_backend(
        "device UIDs",
        1,
        |b| b,
        |rt| {
            let mut seen = std::collections::HashSet::new();
            for d in 0..=rt.num_devices() {
                let uid = rt.device_uid(d)?;
                check!(seen.insert(uid.clone()), "device {d}: UID {uid} given twice");
                check_eq!(rt.device_from_uid(&uid), Some(d));
                check_eq!(rt.device_from_uid(&uid.to_lowercase()), Some(d));
                if let Some(bus) = rt.describe(d).ok().and_then(|x| x.pci_bus_id.clone()) {
                    check_eq!(rt.device_from_uid(&bus), Some(d));
                }
            }
            check_eq!(rt.device_from_uid("no-such-device"), None);
            // OMP_DEFAULT_DEVICE by UID, on a runtime of the same devices.
            let last = rt.num_devices().saturating_sub(1);
            let uid = rt.device_uid(last)?;
            let env = move |k: &str| (k == "OMP_DEFAULT_DEVICE").then(|| uid.clone());
            let again = Runtime::builder().env(env).host_devices(rt.num_devices()).gpus(false).build();
            // (Host devices only in the second runtime: a GPU's UID names no device there.)
            if rt.describe(last).is_ok_and(|x| x.kind == BackendKind::Host) {
                check_eq!(again?.default_device(), last);
            } else {
                check!(matches!(again, Err(Error::InvalidSetting { var: "OMP_DEFAULT_DEVICE", .. })));
            }
            Ok(())
        },
    );
}

/// A device's native handles (OpenMP's interop): none for host devices and the initial
/// device; on CUDA the primary context and the compute stream, on which a driver call of
/// the user's own (here a memset) runs in order with the runtime's work.
#[test]
fn interop_gives_the_native_context_and_queue() {
    on_every_backend(
        "interop",
        1,
        |b| b,
        |rt| {
            check_eq!(rt.interop(rt.initial_device())?, None);
            for d in 0..rt.num_devices() {
                let kind = rt.describe(d)?.kind;
                let i = rt.interop(d)?;
                if kind == BackendKind::Host {
                    check_eq!(i, None);
                    continue;
                }
                let i = i.ok_or(Error::InvalidArgument {
                    routine: "test",
                    what: format!("device {d}: no interop"),
                })?;
                check_eq!(i.backend, kind);
                check!(!i.stream.is_null(), "device {d}: null stream");
                if kind == BackendKind::Cuda {
                    check!(!i.context.is_null(), "device {d}: null context");
                    let gpu = rt.device(d)?;
                    let mut x = vec![0u8; 4096];
                    gpu.data(map::tofrom(&mut x), |xv| {
                        let addr = rt.mapped_ptr(xv.host_range().begin, d)?.unwrap_or(0);
                        // SAFETY: the runtime's own context and stream; `addr` is the mapped
                        // entry's 4096 bytes on this device.
                        unsafe {
                            use cudarc::driver::sys;
                            sys::cuCtxSetCurrent(i.context.cast()).result().map_err(|e| {
                                Error::InvalidArgument { routine: "cuCtxSetCurrent", what: e.to_string() }
                            })?;
                            sys::cuMemsetD8Async(addr, 7, 4096, i.stream.cast()).result().map_err(|e| {
                                Error::InvalidArgument { routine: "cuMemsetD8Async", what: e.to_string() }
                            })?;
                        }
                        rt.synchronize(d)
                    })?;
                    check!(
                        x.iter().all(|&v| v == 7),
                        "device {d}: the memset on the interop stream did not land"
                    );
                }
            }
            Ok(())
        },
    );
}

/// `OMP_AVAILABLE_DEVICES` (OpenMP 6.0): only the devices it names, in its order and
/// renumbered, by number as discovered or by UID; a selector naming nothing, or a device
/// twice, is an error that names the variable.
#[test]
fn omp_available_devices_keeps_the_devices_it_names_in_order() -> offload::Result<()> {
    let with = |v: &'static str| {
        Runtime::builder()
            .env(move |k| (k == "OMP_AVAILABLE_DEVICES").then(|| v.to_string()))
            .gpus(false)
            .host_devices(3)
            .build()
    };
    let rt = with("host-2, 0")?;
    check_eq!(rt.num_devices(), 2);
    check_eq!(rt.device_uid(0)?, "host-2");
    check_eq!(rt.device_uid(1)?, "host-0");
    check!(rt.device_report().contains("OMP_AVAILABLE_DEVICES=host-2,0"), "{}", rt.device_report());
    // The renumbered devices work, and their messages use the new numbers.
    for d in 0..2 {
        let mut x = vec![0i32; 64];
        rt.device(d)?.data(map::tofrom(&mut x), |xv| offload_kernels::fill_i32(&rt.device(d)?, 9, xv))?;
        check!(x.iter().all(|&v| v == 9));
    }
    let e = rt.target_alloc(usize::MAX / 2, 1).unwrap_err();
    check!(e.to_string().contains("device 1"), "{e}");
    // The builder's form.
    let rt =
        Runtime::builder().env(|_| None).gpus(false).host_devices(3).available_devices(["host-1"]).build()?;
    check_eq!((rt.num_devices(), rt.device_uid(0)?), (1, "host-1".to_string()));
    for bad in ["host-7", "0,0", "5", "host-1,,0"] {
        let e = with(bad).unwrap_err();
        check!(matches!(e, Error::InvalidSetting { var: "OMP_AVAILABLE_DEVICES", .. }), "{bad}: {e}");
    }
    Ok(())
}

/// The peer matrix: host devices read each other's memory unless the builder says no, a
/// device always reads its own, and devices renumbered by `OMP_AVAILABLE_DEVICES` keep their
/// pairs under their new numbers (a copy between them goes direct, else staged).
#[test]
fn peer_access_follows_the_builder_and_the_devices_kept() -> offload::Result<()> {
    for peer in [true, false] {
        let rt = Runtime::builder()
            .env(|_| None)
            .gpus(false)
            .host_devices(3)
            .peer_access(peer)
            .available_devices(["2", "0"])
            .build()?;
        check_eq!((rt.can_access_peer(0, 1)?, rt.can_access_peer(1, 0)?), (peer, peer));
        check!(rt.can_access_peer(1, 1)?, "a device reads its own memory");
        check!(rt.can_access_peer(0, rt.initial_device()).is_err(), "the initial device is no peer");
        let (a, b) = (rt.target_alloc(4096, 0)?, rt.target_alloc(4096, 1)?);
        // SAFETY: two live 4 KiB blocks of devices 0 and 1.
        unsafe { rt.target_memcpy(a, b, 4096, 0, 0, 0, 1)? };
        let s = rt.transfer_stats(0)?;
        let expected = if peer { (1, 0) } else { (0, 1) };
        check!((s.direct, s.staged) == expected, "peer access {peer}: {s:?}");
        // SAFETY: allocated above, no longer used.
        unsafe { rt.target_free(a, 0).and(rt.target_free(b, 1))? };
    }
    Ok(())
}
