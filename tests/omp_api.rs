//! The OpenMP routines of `offload::omp`, in C's raw-pointer shape, on the process-wide
//! runtime (the machine's GPUs, if any, and two host devices). The tests of this binary
//! share that runtime, so each uses its own host memory and they run one at a time, each
//! checking it left nothing behind.

use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

use offload::omp::*;
use offload::{
    map, BackendKind, Error, LaunchArg, MapItem, MapType, OmpSpace, Result, Runtime, Scalar, UpdateDirection,
    UpdateItem,
};
use offload_kernels::{ADD_I32, FILL_I32};
use offload_tests::{assert_clean, check, check_eq, fails};

static SERIAL: Mutex<()> = Mutex::new(());

/// Installs the global runtime (idempotent) and holds this binary's test lock.
fn setup() -> Result<(MutexGuard<'static, ()>, &'static Runtime)> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = use_runtime(
        Runtime::builder().env(|_| None).host_devices(2).synchronous(offload_tests::synchronous()).build()?,
    )?;
    Ok((guard, rt))
}

/// Every device of the global runtime holds no mapping and no allocation.
fn all_clean(rt: &Runtime) -> Result<()> {
    (0..rt.num_devices()).try_for_each(|d| assert_clean(rt, d))
}

fn devices() -> Result<Vec<i32>> {
    Ok((0..omp_get_num_devices()?).collect())
}

fn vp<T>(p: *const T) -> *const c_void {
    p.cast()
}

fn vpm<T>(p: *mut T) -> *mut c_void {
    p.cast()
}

#[test]
fn device_numbers() -> Result<()> {
    let (_g, rt) = setup()?;
    // Two host devices, after the GPUs when the machine has any.
    let n = omp_get_num_devices()?;
    check_eq!(n as usize, rt.num_devices());
    let hosts =
        (0..rt.num_devices()).filter(|&d| rt.describe(d).is_ok_and(|x| x.kind == BackendKind::Host)).count();
    check_eq!(hosts, 2);
    check_eq!(omp_get_initial_device()?, n);
    check_eq!(omp_get_default_device()?, 0);
    for bad in [omp_invalid_device, -5, i32::MIN, n + 1, i32::MAX] {
        let e = fails(omp_target_alloc(4, bad), "alloc on a bad device")?;
        let (want, total) = (i64::from(bad), n as usize);
        check!(
            matches!(e, Error::NoSuchDevice { device, available } if device == want && available == total),
            "{e:?}"
        );
        let x = 0i32;
        check!(matches!(omp_target_is_present(vp(&x), bad), Err(Error::NoSuchDevice { .. })));
        check!(matches!(omp_get_mapped_ptr(vp(&x), bad), Err(Error::NoSuchDevice { .. })));
    }
    all_clean(rt)
}

/// OpenMP 5.1's `omp_initial_device` (-1) names the initial device in every routine and
/// construct that takes a device number, as `omp_get_initial_device()` does (libomptarget
/// 19 does not: see tests/differential/initial_device.c).
#[test]
fn omp_initial_device_is_the_initial_device_everywhere() -> Result<()> {
    let (_g, rt) = setup()?;
    const I: i32 = omp_initial_device;
    let init = omp_get_initial_device()?;
    check_eq!((omp_initial_device, omp_invalid_device, OMP_INVALID_DEVICE), (-1, -2, -2));

    // The default device.
    omp_set_default_device(I)?;
    check_eq!(omp_get_default_device()?, init);
    omp_set_default_device(0)?;
    check_eq!(omp_get_default_device()?, 0);

    // Queries.
    let mut x: Vec<i32> = (0..64).collect();
    let xv = vp(x.as_ptr());
    check!(omp_target_is_present(xv, I)?);
    check_eq!(omp_get_mapped_ptr(xv, I)?.cast_const(), xv);
    check!(omp_target_is_accessible(xv, 256, I)?);
    check_eq!(omp_get_uid_from_device(I)?, "host");
    check!(omp_get_interop_ptr(I, InteropProperty::TargetSync)?.is_null());
    check!(omp_get_interop_ptr(I, InteropProperty::DeviceContext)?.is_null());
    check_eq!(use_device_ptr(xv, I)?.cast_const(), xv);
    check_eq!(use_device_addr(xv, I)?.cast_const(), xv);
    check_eq!(if_device(true, I)?, I);
    check_eq!(if_device(false, I)?, init);

    // Memory routines: host memory.
    check!(omp_target_alloc(0, I)?.is_null());
    let p = omp_target_alloc(256, I)?;
    check!(!p.is_null());
    let mut y = [0i32; 64];
    let yp = vpm(y.as_mut_ptr());
    // SAFETY: `p` holds 256 bytes of host memory until freed; `x`, `y` are 256 bytes each.
    unsafe {
        omp_target_memcpy(p, xv, 256, 0, 0, I, I)?;
        omp_target_memcpy(yp, p, 256, 0, 0, init, I)?;
        check_eq!(y[63], 63);
        check_eq!(omp_target_memset(p, 0x11, 256, I)?, p);
        check_eq!(*p.cast::<u8>().add(255), 0x11);
        // A 2x2 block at (1, 1) of x as an 8x8 matrix, into y's first four elements.
        let (vol, dst_off, src_off, dst_dim, src_dim) =
            ([2usize, 2], [0usize, 0], [1usize, 1], [2usize, 2], [8usize, 8]);
        let r = omp_target_memcpy_rect(
            yp,
            xv,
            4,
            2,
            vol.as_ptr(),
            dst_off.as_ptr(),
            src_off.as_ptr(),
            dst_dim.as_ptr(),
            src_dim.as_ptr(),
            I,
            I,
        )?;
        check_eq!((r, y[..4].to_vec()), (0, vec![9, 10, 17, 18]));
        omp_target_free(p, I)?;
        omp_target_free(std::ptr::null_mut(), I)?;
    }
    // Asynchronous routines: undeferred on the initial device.
    y = [0; 64];
    // SAFETY: `x`, `y` outlive the taskwait.
    unsafe {
        omp_target_memset_async(yp, 0, 256, I, &[Depend::new(DependType::Out, yp)])?;
        omp_target_memcpy_async(yp, xv, 128, 0, 0, I, I, &[Depend::new(DependType::InOut, yp)])?;
        let (vol, off, dim) = ([4usize], [0usize], [64usize]);
        let r = omp_target_memcpy_rect_async(
            yp,
            xv,
            4,
            1,
            vol.as_ptr(),
            off.as_ptr(),
            off.as_ptr(),
            dim.as_ptr(),
            dim.as_ptr(),
            I,
            I,
            &[Depend::new(DependType::InOut, yp)],
        )?;
        check!(r.task().is_some());
    }
    omp_taskwait()?;
    check_eq!((y[3], y[31], y[32]), (3, 31, 0));

    // Associations: refused on the initial device, with a clear error.
    let a = [0i32; 4];
    // SAFETY: the routines refuse before touching anything.
    let e = fails(unsafe { omp_target_associate_ptr(vp(a.as_ptr()), xv, 16, 0, I) }, "associate on -1")?;
    check!(matches!(&e, Error::InvalidArgument { .. }) && e.to_string().contains("initial device"), "{e}");
    // SAFETY: as above.
    let e = fails(unsafe { omp_target_disassociate_ptr(vp(a.as_ptr()), I) }, "disassociate on -1")?;
    check!(matches!(&e, Error::InvalidArgument { .. }) && e.to_string().contains("initial device"), "{e}");

    // Constructs run on the host: maps do nothing, a region runs on host memory.
    let xs = x.as_mut_ptr();
    let item = MapItem::tofrom(xs, 256);
    let args = [LaunchArg::Value(Scalar::I32(7)), LaunchArg::mapped(x.as_ptr())];
    // SAFETY: `x` is alive; on the host nothing is copied and the kernel writes `x` while
    // nothing else uses it.
    unsafe {
        target_data_begin(I, &[item])?;
        target_enter_data(I, &[MapItem::to(x.as_ptr(), 256)])?;
        target_update(I, UpdateDirection::To, &[UpdateItem::raw(x.as_ptr(), 256)])?;
        target(I, &FILL_I32, 64, &[item], &args)?;
        check_eq!(x[40], 7);
        target_exit_data(I, &[MapItem::from(xs, 256)])?;
        target_data_end(I, &[item])?;
        let args = [LaunchArg::Value(Scalar::I32(8)), LaunchArg::mapped(x.as_ptr())];
        target_enter_data_nowait(I, &[MapItem::to(x.as_ptr(), 256)], &[])?;
        target_update_nowait(I, UpdateDirection::From, &[UpdateItem::raw(xs, 256)], &[])?;
        let t = target_nowait(I, &FILL_I32, 64, &[], &args, &[])?;
        target_exit_data_nowait(I, &[MapItem::from(xs, 256)], &[Depend::from(&t)])?;
    }
    omp_taskwait()?;
    check_eq!(x[63], 8);
    check!(rt.live_mappings().is_empty());

    // With each device: copies between it and -1.
    for dev in devices()? {
        let d = omp_target_alloc(256, dev)?;
        let mut back = [0i32; 64];
        // SAFETY: `d` holds 256 bytes of `dev`; `x` and `back` are 256 bytes each.
        unsafe {
            omp_target_memcpy(d, xv, 256, 0, 0, dev, I)?;
            omp_target_memcpy(vpm(back.as_mut_ptr()), d, 256, 0, 0, I, dev)?;
            check_eq!(back, [8; 64]);
            omp_target_memset_async(d, 0, 256, dev, &[Depend::new(DependType::Out, d)])?;
            omp_target_memcpy_async(
                vpm(back.as_mut_ptr()),
                d,
                256,
                0,
                0,
                I,
                dev,
                &[Depend::new(DependType::In, d)],
            )?;
            omp_taskwait()?;
            check_eq!(back, [0; 64]);
            omp_target_free(d, dev)?;
        }
    }
    all_clean(rt)
}

/// Negative device numbers other than `omp_initial_device` are no device.
#[test]
fn other_negative_device_numbers_are_errors() -> Result<()> {
    let (_g, rt) = setup()?;
    let x = [0i32; 4];
    let xv = vp(x.as_ptr());
    for bad in [omp_invalid_device, -3, i32::MIN] {
        let no_device =
            |r: Result<()>| matches!(r, Err(Error::NoSuchDevice { device, .. }) if device == i64::from(bad));
        check!(no_device(omp_set_default_device(bad)), "set_default_device({bad})");
        check!(no_device(omp_target_alloc(4, bad).map(drop)));
        check!(no_device(omp_target_is_present(xv, bad).map(drop)));
        check!(no_device(omp_target_is_accessible(xv, 4, bad).map(drop)));
        check!(no_device(omp_get_uid_from_device(bad).map(drop)));
        check!(no_device(if_device(false, bad).map(drop)));
        // SAFETY: refused before anything is touched.
        unsafe {
            check!(no_device(omp_target_memcpy(vpm(x.as_ptr().cast_mut()), xv, 4, 0, 0, bad, 0)));
            check!(no_device(target_enter_data(bad, &[MapItem::to(x.as_ptr(), 16)])));
            check!(no_device(target_enter_data_nowait(bad, &[MapItem::to(x.as_ptr(), 16)], &[]).map(drop)));
        }
    }
    check_eq!(omp_get_default_device()?, 0);
    all_clean(rt)
}

#[test]
fn alloc_memset_memcpy_free() -> Result<()> {
    let (_g, rt) = setup()?;
    let init = omp_get_initial_device()?;
    for dev in devices()? {
        check!(omp_target_alloc(0, dev)?.is_null());
        // SAFETY: null is a no-op.
        unsafe { omp_target_free(std::ptr::null_mut(), dev)? };
        let p = omp_target_alloc(400, dev)?;
        check!(!p.is_null());
        // SAFETY: for the block, `p` holds 400 bytes on `dev`; host buffers are live and
        // sized for each copy.
        unsafe {
            check_eq!(omp_target_memset(p, 0x11, 400, dev)?, p);
            let mut bytes = [0u8; 400];
            omp_target_memcpy(vpm(bytes.as_mut_ptr()), p, 400, 0, 0, init, dev)?;
            check!(bytes.iter().all(|&b| b == 0x11));
            // Only the low byte of the value counts, as C's memset does.
            omp_target_memset(p, 0x1ff, 4, dev)?;
            omp_target_memcpy(vpm(bytes.as_mut_ptr()), p, 8, 0, 0, init, dev)?;
            check_eq!(bytes[..8], [0xff, 0xff, 0xff, 0xff, 0x11, 0x11, 0x11, 0x11]);

            let src: Vec<i32> = (0..100).collect();
            omp_target_memcpy(p, vp(src.as_ptr()), 360, 40, 0, dev, init)?;
            let mut back = vec![0i32; 100];
            omp_target_memcpy(vpm(back.as_mut_ptr()), p, 400, 0, 0, init, dev)?;
            check_eq!(back[0], -1);
            check_eq!(back[1..10], [0x1111_1111; 9]);
            check_eq!(back[10..], src[..90]);
            // To every other device and back.
            for other in devices()? {
                let q = omp_target_alloc(400, other)?;
                omp_target_memcpy(q, p, 400, 0, 0, other, dev)?;
                let mut via = vec![0i32; 100];
                omp_target_memcpy(vpm(via.as_mut_ptr()), q, 400, 0, 0, init, other)?;
                check_eq!(via, back);
                omp_target_free(q, other)?;
            }
            // Length 0 with null pointers is fine; with a length it is not.
            omp_target_memcpy(std::ptr::null_mut(), std::ptr::null(), 0, 0, 0, dev, init)?;
            let e = fails(omp_target_memcpy(std::ptr::null_mut(), p, 4, 0, 0, init, dev), "null dst")?;
            check!(e.to_string().contains("destination pointer is null"), "{e}");
            omp_target_free(p, dev)?;
            let e = fails(omp_target_free(p, dev), "double free")?;
            check!(matches!(e, Error::UnknownDevicePointer { .. }), "{e:?}");
        }
    }
    // The initial device hands out host memory.
    let h = omp_target_alloc(64, init)?;
    check!(!h.is_null());
    // SAFETY: `h` is 64 bytes of host memory.
    unsafe {
        omp_target_memset(h, 7, 64, init)?;
        check!(std::slice::from_raw_parts(h.cast::<u8>(), 64).iter().all(|&b| b == 7));
        omp_target_free(h, init)?;
    }
    all_clean(rt)
}

#[test]
fn enter_exit_update_and_target() -> Result<()> {
    let (_g, rt) = setup()?;
    for dev in devices()? {
        let mut x: Vec<i32> = (0..256).collect();
        let xv = vp(x.as_ptr());
        check!(!omp_target_is_present(xv, dev)?);
        check!(omp_get_mapped_ptr(xv, dev)?.is_null());
        // SAFETY: for the block, `x` is alive; `from` copies happen while nothing else
        // touches it.
        unsafe {
            target_enter_data(dev, &[MapItem::to(x.as_ptr(), 1024)])?;
            check!(omp_target_is_present(xv, dev)?);
            check!(omp_target_is_present(vp(x.as_ptr().add(255)), dev)?);
            check!(!omp_target_is_present(vp(x.as_ptr().add(256)), dev)?);
            let d = omp_get_mapped_ptr(xv, dev)?;
            check!(!d.is_null());
            check_eq!(
                omp_get_mapped_ptr(vp(x.as_ptr().add(4)), dev)?,
                d.cast::<u8>().add(16).cast::<c_void>()
            );
            // Not present on any other device.
            for other in devices()?.into_iter().filter(|&o| o != dev) {
                check!(!omp_target_is_present(xv, other)?);
            }
            // A launch through the mapping, then `update from`.
            let args = [LaunchArg::Value(Scalar::I32(1000)), LaunchArg::mapped(x.as_ptr())];
            target(dev, &ADD_I32, 256, &[], &args)?;
            check_eq!(x[5], 5);
            target_update(dev, UpdateDirection::From, &[UpdateItem::raw(x.as_mut_ptr(), 512)])?;
            check_eq!(x[5], 1005);
            check_eq!(x[200], 200);
            // `update to` of part, then exit `from` brings all back.
            x[..128].fill(-1);
            target_update(dev, UpdateDirection::To, &[UpdateItem::raw(x.as_ptr(), 512)])?;
            target_exit_data(dev, &[MapItem::slice_mut(&mut x, MapType::FROM)])?;
            check!(x[..128].iter().all(|&v| v == -1));
            check!(x[128..].iter().enumerate().all(|(i, &v)| v == i as i32 + 1128));
            check!(!omp_target_is_present(xv, dev)?);
            check!(omp_get_mapped_ptr(xv, dev)?.is_null());
            // `present` in `update` on an absent range is an error; without it a no-op.
            let item = UpdateItem::raw(x.as_ptr(), 1024);
            target_update(dev, UpdateDirection::To, &[item])?;
            let e = fails(target_update(dev, UpdateDirection::To, &[item.present()]), "update present")?;
            check!(matches!(e, Error::NotPresent { .. }), "{e:?}");
        }
    }
    // On the initial device everything is present at its own address.
    let init = omp_get_initial_device()?;
    let y = [0u8; 4];
    check!(omp_target_is_present(vp(y.as_ptr()), init)?);
    check_eq!(omp_get_mapped_ptr(vp(y.as_ptr()), init)?.cast_const(), vp(y.as_ptr()));
    all_clean(rt)
}

#[test]
fn target_data_region_and_launch() -> Result<()> {
    let (_g, rt) = setup()?;
    for dev in devices()? {
        let mut a = vec![1i32; 1000];
        let b = vec![0i32; 10];
        let list = [MapItem::slice_mut(&mut a, MapType::TOFROM), MapItem::slice(&b, MapType::ALLOC)];
        // SAFETY: for the block, `a` and `b` outlive the region and are not touched in it.
        unsafe {
            target_data_begin(dev, &list)?;
            let args = [LaunchArg::Value(Scalar::I32(2)), LaunchArg::mapped(a.as_ptr())];
            // A launch with its own (present) map of the region's data.
            target(dev, &ADD_I32, 1000, &[MapItem::tofrom(a.as_mut_ptr(), 4000).present()], &args)?;
            check_eq!(a[0], 1);
            check!(rt.entry(a.as_ptr() as usize, dev as usize)?.is_some_and(|e| e.ref_count == 1));
            target_data_end(dev, &list)?;
        }
        check!(a.iter().all(|&v| v == 3));
        check!(!omp_target_is_present(vp(b.as_ptr()), dev)?);
        // A launch with `present` on absent data fails and leaves nothing.
        let args = [LaunchArg::Value(Scalar::I32(2)), LaunchArg::mapped(a.as_ptr())];
        // SAFETY: expected to fail before running.
        let e = fails(
            unsafe { target(dev, &FILL_I32, 1000, &[MapItem::to(a.as_ptr(), 4000).present()], &args) },
            "present launch",
        )?;
        check!(matches!(e, Error::NotPresent { .. }), "{e:?}");
        check!(a.iter().all(|&v| v == 3));
    }
    all_clean(rt)
}

/// A C port may pass one array as two arguments (`saxpy(n, a, x, x)`): the generated host
/// twin then reads the read-only view through the shared path, not as a plain slice, and
/// gives what C gives; the initial device (the host itself) too.
#[test]
fn one_array_as_a_read_and_a_written_argument() -> Result<()> {
    use offload_kernels::generated::saxpy;
    let (_g, rt) = setup()?;
    for dev in devices()?.into_iter().chain([omp_get_initial_device()?]) {
        let mut x: Vec<f32> = (0..3000).map(|v| v as f32).collect();
        let p = x.as_mut_ptr();
        let args = [
            LaunchArg::Value(Scalar::F32(0.5)),
            LaunchArg::mapped(p.cast_const()),
            LaunchArg::mapped(p.cast_const()),
        ];
        // SAFETY: `x` outlives the construct and is not touched during it.
        unsafe { target(dev, &saxpy::KERNEL, 3000, &[MapItem::tofrom(p, 12000)], &args)? };
        check!(x.iter().enumerate().all(|(i, &v)| v == i as f32 * 1.5), "device {dev}: {:?}", &x[..4]);
    }
    all_clean(rt)
}

/// A line-by-line port's kernel: `#pragma omp target teams distribute parallel for
/// map(to: x[0:n]) map(tofrom: y[0:n]) reduction(+: s)` over `y[i] += a * x[i]`.
#[offload::kernel(reduction(+: s))]
fn ported_saxpy(i: usize, a: f32, x: &[f32], y: &mut [f32], s: &mut f32) {
    y[i] += a * x[i];
    *s += x[i];
}

/// A 2-D kernel: its space is not the OpenMP shape's `n`.
#[offload::kernel(dims = 2)]
fn ported_2d(i: usize, j: usize, y: &mut [f32]) {
    y[i + j] = 0.0;
}

#[test]
fn target_launches_a_generated_kernel_with_the_c_shaped_arguments() -> Result<()> {
    let (_g, rt) = setup()?;
    let mut all = devices()?;
    all.push(omp_get_initial_device()?);
    for dev in all {
        let n = 1000;
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut y = vec![1.0f32; n];
        let mut s = [0.5f32];
        let maps = [
            MapItem::to(x.as_ptr(), 4 * n),
            MapItem::tofrom(y.as_mut_ptr(), 4 * n),
            MapItem::tofrom(s.as_mut_ptr(), 4),
        ];
        // One argument per parameter, as C passes them: the runtime adds the start and the
        // views' lengths.
        let args = [
            LaunchArg::Value(Scalar::F32(2.0)),
            LaunchArg::mapped(x.as_ptr()),
            LaunchArg::mapped(y.as_ptr()),
            LaunchArg::mapped(s.as_ptr()),
        ];
        // SAFETY: the maps name live vectors of the sizes given; nothing else touches them.
        unsafe { target(dev, &ported_saxpy::KERNEL, n, &maps, &args) }?;
        check!(y.iter().enumerate().all(|(i, &v)| v == 1.0 + 2.0 * i as f32), "device {dev}: {:?}", &y[..4]);
        check_eq!(s[0], 0.5 + (n * (n - 1) / 2) as f32);
        // A list that is not one argument per parameter is refused, naming the count.
        let short = [LaunchArg::Value(Scalar::F32(2.0)), LaunchArg::mapped(x.as_ptr())];
        // SAFETY: refused before running.
        let e = fails(unsafe { target(dev, &ported_saxpy::KERNEL, n, &maps, &short) }, "too few arguments")?;
        check!(
            matches!(&e, Error::KernelArgument { what, .. } if what.contains("takes 4 arguments, got 2")),
            "{e:?}"
        );
        let args2 = [LaunchArg::mapped(y.as_ptr())];
        // SAFETY: refused before running.
        let e = fails(unsafe { target(dev, &ported_2d::KERNEL, n, &maps, &args2) }, "a 2-D kernel")?;
        check!(
            matches!(&e, Error::KernelArgument { what, .. } if what.contains("2-D generated kernel")),
            "{e:?}"
        );
    }
    all_clean(rt)
}

#[test]
fn associate_and_disassociate() -> Result<()> {
    let (_g, rt) = setup()?;
    let init = omp_get_initial_device()?;
    for dev in devices()? {
        let mut h = [5i32; 8];
        let hv = vp(h.as_ptr());
        let d = omp_target_alloc(64, dev)?;
        // SAFETY: for the block, `d` holds 64 bytes until freed; `h` is alive.
        unsafe {
            omp_target_associate_ptr(hv, d, 32, 32, dev)?;
            check!(omp_target_is_present(hv, dev)?);
            let at = d.cast::<u8>().add(32).cast::<c_void>();
            check_eq!(omp_get_mapped_ptr(hv, dev)?, at);
            // Maps never copy an associated range; `always` does.
            target_enter_data(dev, &[MapItem::to(h.as_ptr(), 32)])?;
            omp_target_memset(at, 0, 32, dev)?;
            target_exit_data(dev, &[MapItem::slice_mut(&mut h, MapType::FROM)])?;
            check_eq!(h, [5; 8]);
            target_enter_data(dev, &[MapItem::to(h.as_ptr(), 32).always()])?;
            let mut seen = [0i32; 8];
            omp_target_memcpy(vpm(seen.as_mut_ptr()), d, 32, 0, 32, init, dev)?;
            check_eq!(seen, [5; 8]);
            omp_target_disassociate_ptr(hv, dev)?;
            check!(!omp_target_is_present(hv, dev)?);
            let e = fails(omp_target_disassociate_ptr(hv, dev), "second disassociate")?;
            check!(matches!(e, Error::NotAssociated { .. }), "{e:?}");
            let e = fails(omp_target_disassociate_ptr(std::ptr::null(), dev), "null disassociate")?;
            check!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
            let e = fails(omp_target_associate_ptr(std::ptr::null(), d, 4, 0, dev), "null associate")?;
            check!(e.to_string().contains("host pointer is null"), "{e}");
            let e = fails(omp_target_associate_ptr(hv, d, 4, 0, init), "associate on the initial device")?;
            check!(e.to_string().contains("initial device"), "{e}");
            omp_target_free(d, dev)?;
        }
    }
    all_clean(rt)
}

#[test]
fn memcpy_rect() -> Result<()> {
    let (_g, rt) = setup()?;
    let init = omp_get_initial_device()?;
    let null = std::ptr::null::<usize>();
    // SAFETY: both pointers null: a query that touches nothing.
    let dims = unsafe {
        omp_target_memcpy_rect(
            std::ptr::null_mut(),
            std::ptr::null(),
            0,
            0,
            null,
            null,
            null,
            null,
            null,
            0,
            0,
        )?
    };
    check_eq!(dims, i32::MAX);
    for dev in devices()? {
        // A 4x6 host array; its [1..3][2..5] block goes to [0..2][0..3] of a 3x4 device array.
        let host: Vec<i32> = (0..24).collect();
        let p = omp_target_alloc(48, dev)?;
        let (volume, dst_off, src_off, dst_dims, src_dims) =
            ([2usize, 3], [0usize, 1], [1usize, 2], [3usize, 4], [4usize, 6]);
        // SAFETY: for the block, `p` holds a 3x4 i32 array, `host` a 4x6 one, `back` too;
        // every shape array holds 2 entries.
        unsafe {
            omp_target_memset(p, 0xff, 48, dev)?;
            let r = omp_target_memcpy_rect(
                p,
                vp(host.as_ptr()),
                4,
                2,
                volume.as_ptr(),
                dst_off.as_ptr(),
                src_off.as_ptr(),
                dst_dims.as_ptr(),
                src_dims.as_ptr(),
                dev,
                init,
            )?;
            check_eq!(r, 0);
            let mut got = [0i32; 12];
            omp_target_memcpy(vpm(got.as_mut_ptr()), p, 48, 0, 0, init, dev)?;
            #[rustfmt::skip]
            let want = [
                -1,  8,  9, 10,
                -1, 14, 15, 16,
                -1, -1, -1, -1,
            ];
            check_eq!(got, want);
            // Back into a cleared host array at the source offsets.
            let mut back = vec![0i32; 24];
            omp_target_memcpy_rect(
                vpm(back.as_mut_ptr()),
                p,
                4,
                2,
                volume.as_ptr(),
                src_off.as_ptr(),
                dst_off.as_ptr(),
                src_dims.as_ptr(),
                dst_dims.as_ptr(),
                init,
                dev,
            )?;
            let want: Vec<i32> = (0..24)
                .map(|i| if (1..3).contains(&(i / 6)) && (2..5).contains(&(i % 6)) { i } else { 0 })
                .collect();
            check_eq!(back, want);
            // Bad arguments.
            let e = fails(
                omp_target_memcpy_rect(
                    p,
                    vp(host.as_ptr()),
                    4,
                    0,
                    volume.as_ptr(),
                    null,
                    null,
                    null,
                    null,
                    dev,
                    init,
                ),
                "0 dimensions",
            )?;
            check!(e.to_string().contains("num_dims 0 must be positive"), "{e}");
            let e = fails(
                omp_target_memcpy_rect(
                    p,
                    vp(host.as_ptr()),
                    4,
                    2,
                    null,
                    dst_off.as_ptr(),
                    src_off.as_ptr(),
                    dst_dims.as_ptr(),
                    src_dims.as_ptr(),
                    dev,
                    init,
                ),
                "null volume",
            )?;
            check!(e.to_string().contains("volume is null"), "{e}");
            omp_target_free(p, dev)?;
        }
    }
    all_clean(rt)
}

/// What a host device's kernel saw of `omp_get_device_num` / `omp_is_initial_device`: the
/// number (or -1 when the two disagreed, or threads of the kernel disagreed).
static SEEN_DEVICE: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(-2);

fn where_am_i(l: &offload::HostLaunch<'_>) -> std::result::Result<(), String> {
    use std::sync::atomic::Ordering;
    let d = omp_get_device_num().map_err(|e| e.to_string())?;
    let initial = omp_is_initial_device().map_err(|e| e.to_string())?;
    // Every thread the kernel's own parallel loops run on is the device's (it has a pool
    // of its own).
    use rayon::prelude::*;
    let all_same = (0..l.n()).into_par_iter().all(|_| omp_get_device_num().is_ok_and(|x| x == d));
    SEEN_DEVICE.store(if initial || !all_same { -1 } else { i64::from(d) }, Ordering::SeqCst);
    Ok(())
}

static WHERE_AM_I: offload::Kernel = offload::Kernel::new("where_am_i").with_host(where_am_i);

#[test]
fn device_identity_default_device_and_accessibility() -> Result<()> {
    use std::sync::atomic::Ordering;
    let (_g, rt) = setup()?;
    let initial = omp_get_initial_device()?;
    // Host code runs on the initial device.
    check_eq!(omp_get_device_num()?, initial);
    check!(omp_is_initial_device()?);
    // A host device's kernel runs on that device.
    for d in devices()? {
        let host_device = rt.describe(d as usize)?.kind == BackendKind::Host;
        if !host_device {
            continue;
        }
        SEEN_DEVICE.store(-2, Ordering::SeqCst);
        // SAFETY: no maps, no arguments.
        unsafe { target(d, &WHERE_AM_I, 8, &[], &[]) }?;
        // The kernel writes process memory, not its arguments: seen once it has run.
        rt.synchronize(d as usize)?;
        check_eq!(SEEN_DEVICE.load(Ordering::SeqCst), i64::from(d));
    }
    // The host fallback's kernels run on the initial device.
    SEEN_DEVICE.store(-2, Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { target(initial, &WHERE_AM_I, 8, &[], &[]) }?;
    check_eq!(SEEN_DEVICE.load(Ordering::SeqCst), -1); // initial: omp_is_initial_device is true there

    // The default device is the calling thread's choice.
    check_eq!(omp_get_default_device()?, 0);
    omp_set_default_device(1)?;
    check_eq!(omp_get_default_device()?, 1);
    let other = std::thread::scope(|s| s.spawn(omp_get_default_device).join());
    check_eq!(other.map_err(|_| Error::InvalidArgument { routine: "test", what: "thread".into() })??, 0);
    let e = fails(omp_set_default_device(initial + 1), "no such device")?;
    check!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
    let e = fails(omp_set_default_device(-3), "a negative device other than omp_initial_device")?;
    check!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
    check_eq!(omp_get_default_device()?, 1);
    omp_set_default_device(initial)?;
    check_eq!(omp_get_default_device()?, initial);
    omp_set_default_device(0)?;

    // Accessibility: the initial device reaches everything, host devices nothing, GPUs
    // the host memory the runtime page-locked.
    let v = vec![1u8; 4096];
    for d in devices()? {
        let kind = rt.describe(d as usize)?.kind;
        check!(!omp_target_is_accessible(vp(v.as_ptr()), v.len(), d)?, "device {d}: pageable memory");
        check!(omp_target_is_accessible(vp(v.as_ptr()), 0, d)?, "device {d}: zero bytes");
        let buf = offload::HostBuffer::<u8>::new(rt, 4096)?;
        let expect = kind != BackendKind::Host && buf.is_pinned();
        check_eq!(omp_target_is_accessible(vp(buf.as_ptr()), 4096, d)?, expect);
        check_eq!(omp_target_is_accessible(vp(buf.as_ptr()), 8192, d)?, false);
    }
    check!(omp_target_is_accessible(vp(v.as_ptr()), v.len(), initial)?);
    let e = fails(omp_target_is_accessible(std::ptr::null(), 16, initial), "null with a size")?;
    check!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let e = fails(omp_target_is_accessible(vp(v.as_ptr()), 16, initial + 1), "no such device")?;
    check!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
    all_clean(rt)
}

#[test]
fn device_uids_in_the_omp_shape() -> Result<()> {
    let (_g, _rt) = setup()?;
    for d in devices()?.into_iter().chain([omp_get_initial_device()?]) {
        let uid = omp_get_uid_from_device(d)?;
        check_eq!(omp_get_device_from_uid(&uid)?, d);
    }
    check_eq!(omp_get_uid_from_device(omp_get_initial_device()?)?, "host");
    check_eq!(omp_get_device_from_uid("GPU-not-here")?, omp_invalid_device);
    let e = fails(omp_get_uid_from_device(omp_invalid_device), "omp_invalid_device")?;
    check!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
    Ok(())
}

#[test]
fn interop_pointers_in_the_omp_shape() -> Result<()> {
    let (_g, rt) = setup()?;
    let initial = omp_get_initial_device()?;
    check!(omp_get_interop_ptr(initial, InteropProperty::TargetSync)?.is_null());
    for d in devices()? {
        let gpu = rt.describe(d as usize)?.kind != BackendKind::Host;
        check_eq!(!omp_get_interop_ptr(d, InteropProperty::TargetSync)?.is_null(), gpu);
        let cuda = rt.describe(d as usize)?.kind == BackendKind::Cuda;
        check_eq!(!omp_get_interop_ptr(d, InteropProperty::DeviceContext)?.is_null(), cuda);
    }
    let e = fails(omp_get_interop_ptr(initial + 1, InteropProperty::TargetSync), "no such device")?;
    check!(matches!(e, Error::NoSuchDevice { .. }), "{e}");
    Ok(())
}

#[test]
fn asynchronous_routines_follow_their_dependences() -> Result<()> {
    let (_g, rt) = setup()?;
    let init = omp_get_initial_device()?;
    for dev in devices()? {
        let p = omp_target_alloc(4096, dev)?;
        // Fill and read back on two different lanes (copy-in, copy-out), ordered only by
        // their address dependences: each read must see its own fill.
        let mut seen = vec![[0u8; 4096]; 24];
        // SAFETY: `p` holds 4096 bytes of `dev`; every host buffer lives past the taskwait.
        unsafe {
            for (i, s) in seen.iter_mut().enumerate() {
                omp_target_memset_async(p, i as i32, 4096, dev, &[Depend::new(DependType::InOut, p)])?;
                let rd = [Depend::new(DependType::In, p)];
                omp_target_memcpy_async(vpm(s.as_mut_ptr()), p, 4096, 0, 0, init, dev, &rd)?;
            }
        }
        omp_taskwait()?;
        for (i, s) in seen.iter().enumerate() {
            check!(s.iter().all(|&b| b == i as u8), "read {i} on device {dev} saw {}", s[0]);
        }

        // target enter data / target / update / exit data, nowait, chained on `x`.
        let mut x: Vec<i32> = (0..1000).collect();
        let mut mid = vec![0i32; 1000];
        let xp = x.as_mut_ptr();
        let xd = |k| [Depend::new(k, xp)];
        let args = [LaunchArg::Value(Scalar::I32(5)), LaunchArg::mapped(xp)];
        // SAFETY: `x` and `mid` live past the taskwait and the host touches neither before it.
        unsafe {
            target_enter_data_nowait(dev, &[MapItem::to(xp, 4000)], &xd(DependType::Out))?;
            target_nowait(dev, &ADD_I32, 1000, &[], &args, &xd(DependType::InOut))?;
            target_update_nowait(
                dev,
                UpdateDirection::From,
                &[UpdateItem::raw(xp, 4000)],
                &xd(DependType::InOut),
            )?;
            let t = target_nowait(dev, &ADD_I32, 1000, &[], &args, &xd(DependType::InOut))?;
            // A task handle as a dependence, and a host->host copy run at once.
            let snapshot = [Depend::on_task(&t)];
            omp_target_memcpy_async(vpm(mid.as_mut_ptr()), vp(xp), 4000, 0, 0, init, init, &snapshot)?;
            target_exit_data_nowait(dev, &[MapItem::from(xp, 4000)], &xd(DependType::InOut))?;
        }
        omp_taskwait()?;
        check!(mid.iter().enumerate().all(|(i, &v)| v == i as i32 + 5), "device {dev}: {}", mid[1]);
        check!(x.iter().enumerate().all(|(i, &v)| v == i as i32 + 10), "device {dev}: {}", x[1]);

        // A failed task fails its dependents, and omp_taskwait reports it.
        let mut y = [0i32; 16];
        let yp = y.as_mut_ptr();
        let yd = |k| [Depend::new(k, yp)];
        // SAFETY: `y` outlives the taskwait; the exit fails before copying anything.
        let (bad, after) = unsafe {
            let bad = target_exit_data_nowait(dev, &[MapItem::from(yp, 64).present()], &yd(DependType::Out))?;
            let after = omp_target_memset_async(p, 0, 16, dev, &yd(DependType::In))?;
            (bad, after)
        };
        let e = fails(omp_taskwait(), "taskwait after a failed task")?;
        check!(matches!(e, Error::NotPresent { .. }), "{e:?}");
        check!(matches!(bad.wait(), Err(Error::NotPresent { .. })));
        check!(matches!(after.wait(), Err(Error::Dependency { .. })), "{:?}", after.wait());
        omp_taskwait()?; // reported once
                         // SAFETY: nothing uses `p` any more.
        unsafe { omp_target_free(p, dev)? };
    }
    all_clean(rt)
}

#[test]
fn host_tasks_take_their_place_in_the_device_dependence_graph() -> Result<()> {
    let (_g, rt) = setup()?;
    const N: usize = 1 << 18;
    for dev in devices()? {
        // C: target nowait depend(out: x) (x += 1); task depend(inout: x) (x *= 10 on the
        // host); target nowait depend(in: x) (y = x + 1 on the device, copied back into y).
        // Six rounds, each checked: a task out of order sees, or leaves, the wrong values.
        let mut x = vec![0i32; N];
        let xp = x.as_mut_ptr();
        let (xa, bytes) = (xp as usize, N * 4);
        let xd = |k| [Depend::new(k, xp)];
        let mut expected = 0i32;
        for round in 0..6 {
            let seen = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(-1));
            let s = std::sync::Arc::clone(&seen);
            // SAFETY: `x` lives past the taskwait; between the calls only the tasks touch it,
            // in the order their dependences give.
            unsafe {
                let args = [LaunchArg::Value(Scalar::I32(1)), LaunchArg::mapped(xp)];
                target_nowait(dev, &ADD_I32, N, &[MapItem::tofrom(xp, bytes)], &args, &xd(DependType::Out))?;
            }
            task(&xd(DependType::InOut), move || {
                // SAFETY: the region before has copied `x` back; the region after waits.
                let x = unsafe { std::slice::from_raw_parts_mut(xa as *mut i32, N) };
                s.store(x[N - 1], std::sync::atomic::Ordering::Relaxed);
                x.iter_mut().for_each(|v| *v *= 10);
                Ok(())
            })?;
            // SAFETY: as above.
            unsafe {
                let args = [LaunchArg::Value(Scalar::I32(1)), LaunchArg::mapped(xp)];
                target_nowait(
                    dev,
                    &ADD_I32,
                    N,
                    &[MapItem::tofrom(xp, bytes)],
                    &args,
                    &xd(DependType::InOut),
                )?;
            }
            omp_taskwait()?;
            let before_task = expected + 1;
            expected = before_task * 10 + 1;
            let seen = seen.load(std::sync::atomic::Ordering::Relaxed);
            check!(
                seen == before_task,
                "device {dev}, round {round}: the host task saw {seen}, not {before_task}"
            );
            check!(x.iter().all(|&v| v == expected), "device {dev}, round {round}: {} != {expected}", x[0]);
        }
        // A failed dependence fails the host task without running it; a panic fails it.
        let mut y = [0i32; 16];
        let yp = y.as_mut_ptr();
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = std::sync::Arc::clone(&ran);
        // SAFETY: `y` outlives the taskwait; the exit fails before copying anything.
        let bad = unsafe {
            target_exit_data_nowait(
                dev,
                &[MapItem::from(yp, 64).present()],
                &[Depend::new(DependType::Out, yp)],
            )?
        };
        let after = task(&[Depend::new(DependType::In, yp)], move || {
            r.store(true, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        })?;
        let panics = task(&[], || panic!("host task panicked on purpose"))?;
        fails(omp_taskwait(), "taskwait after failed tasks")?;
        check!(matches!(bad.wait(), Err(Error::NotPresent { .. })));
        check!(matches!(after.wait(), Err(Error::Dependency { .. })), "{:?}", after.wait());
        check!(!ran.load(std::sync::atomic::Ordering::Relaxed), "a task whose dependence failed ran");
        check!(matches!(panics.wait(), Err(Error::Panicked { .. })), "{:?}", panics.wait());
    }
    all_clean(rt)
}

#[test]
fn rect_copy_query_forms_answer_the_dimensions() -> Result<()> {
    let (_g, rt) = setup()?;
    let init = omp_get_initial_device()?;
    let (none, dims) = (std::ptr::null(), std::ptr::null::<usize>());
    // Both pointers null: the number of dimensions supported (libomptarget's INT_MAX),
    // whatever the other arguments, device numbers included (as libomptarget 19).
    for (dst_dev, src_dev) in [(0, init), (init, init), (omp_initial_device, omp_initial_device), (-7, 99)] {
        // SAFETY: both pointers are null, so nothing is read.
        let sync = unsafe {
            omp_target_memcpy_rect(
                std::ptr::null_mut(),
                none,
                4,
                2,
                dims,
                dims,
                dims,
                dims,
                dims,
                dst_dev,
                src_dev,
            )?
        };
        check_eq!(sync, i32::MAX);
        // SAFETY: as above.
        let r = unsafe {
            omp_target_memcpy_rect_async(
                std::ptr::null_mut(),
                none,
                4,
                2,
                dims,
                dims,
                dims,
                dims,
                dims,
                dst_dev,
                src_dev,
                &[],
            )?
        };
        check_eq!(r.dimensions(), Some(i32::MAX));
        check!(r.task().is_none() && r.into_task().is_none());
    }
    // Nothing was queued.
    omp_taskwait()?;
    all_clean(rt)
}

#[test]
fn rect_copy_asynchronously() -> Result<()> {
    let (_g, rt) = setup()?;
    let init = omp_get_initial_device()?;
    for dev in devices()? {
        // A 3x4 block at (1, 2) of an 8x8 host matrix of i32, to a 3x4 device matrix.
        let host: Vec<i32> = (0..64).collect();
        let p = omp_target_alloc(48, dev)?;
        let mut back = [0i32; 12];
        let (vol, dst_off, src_off, dst_dim, src_dim) =
            ([3usize, 4], [0usize, 0], [1usize, 2], [3usize, 4], [8usize, 8]);
        // SAFETY: `p` holds 12 i32 of `dev`; `host` and `back` outlive the taskwait.
        unsafe {
            let t = omp_target_memcpy_rect_async(
                p,
                vp(host.as_ptr()),
                4,
                2,
                vol.as_ptr(),
                dst_off.as_ptr(),
                src_off.as_ptr(),
                dst_dim.as_ptr(),
                src_dim.as_ptr(),
                dev,
                init,
                &[],
            )?;
            check_eq!(t.dimensions(), None);
            let t = t.into_task().expect("a copy, not the query form: its task");
            omp_target_memcpy_async(vpm(back.as_mut_ptr()), p, 48, 0, 0, init, dev, &[Depend::from(&t)])?;
        }
        omp_taskwait()?;
        check_eq!(back, [10, 11, 12, 13, 18, 19, 20, 21, 26, 27, 28, 29]);
        // SAFETY: nothing uses `p` any more.
        unsafe { omp_target_free(p, dev)? };
    }
    all_clean(rt)
}

/// Launches `ADD_I32` on the initial device from inside a kernel (refused), or calls
/// `omp_taskwait` there (refused), as argument 0 says; the error is the kernel's.
fn nested(l: &offload::HostLaunch<'_>) -> std::result::Result<(), String> {
    let what: i32 = l.scalar(0)?;
    let init = omp_get_initial_device().map_err(|e| e.to_string())?;
    let mut x = [0i32; 4];
    let args = [LaunchArg::Value(Scalar::I32(1)), LaunchArg::mapped(x.as_mut_ptr())];
    let r = match what {
        // SAFETY: `x` lives through the call.
        0 => unsafe { target(init, &ADD_I32, 4, &[], &args) },
        _ => omp_taskwait(),
    };
    r.map_err(|e| e.to_string())
}
static NESTED: offload::Kernel = offload::Kernel::new("nested").with_host(nested);

#[test]
fn what_would_wait_for_itself_is_refused() -> Result<()> {
    let (_g, rt) = setup()?;
    let init = omp_get_initial_device()?;
    // The kernel is a host function: on the initial device and the first host device.
    let host = (0..init).find(|&d| rt.describe(d as usize).is_ok_and(|x| x.kind == BackendKind::Host));
    let host = host.ok_or(Error::NoSuchDevice { device: -1, available: rt.num_devices() })?;
    // A kernel of the initial device launching there, or waiting for tasks, from a kernel.
    for (what, needle) in [(0, "its own kernels"), (1, "inside a kernel")] {
        for dev in [init, host] {
            // SAFETY: the kernel's only argument is a value.
            let r = unsafe { target(dev, &NESTED, 1, &[], &[LaunchArg::Value(Scalar::I32(what))]) };
            // A host device's kernel runs after the construct returns: its failure is
            // reported by the next synchronisation, which names it.
            let r = r.and_then(|()| rt.synchronize(dev as usize));
            if what == 1 || dev == init {
                let e = fails(r, "nested")?;
                check!(e.to_string().contains(needle), "device {dev}, case {what}: {e}");
            } else {
                r?; // a host device's kernel may launch on the initial device
            }
        }
    }
    // An asynchronous routine queued from inside a nowait task is refused.
    let p = omp_target_alloc(64, 0)?;
    let pa = p as usize;
    let inner = rt.nowait(|s| {
        s.compute(0, &[], move |_| {
            // SAFETY: `pa` holds 64 bytes of device 0.
            unsafe { omp_target_memset_async(pa as *mut c_void, 0, 64, 0, &[]) }.map(drop)
        })
        .map(drop)
    });
    let e = fails(inner.and_then(|r| r), "async routine inside a task")?;
    check!(e.to_string().contains("inside a nowait task"), "{e}");
    // A task listing one address twice does not wait for itself.
    // SAFETY: `p` holds 64 bytes of device 0.
    unsafe {
        omp_target_memset_async(
            p,
            1,
            64,
            0,
            &[Depend::new(DependType::In, p), Depend::new(DependType::Out, p)],
        )?
    };
    omp_taskwait()?;
    // SAFETY: nothing uses `p` any more.
    unsafe { omp_target_free(p, 0)? };
    all_clean(rt)
}

#[test]
fn each_thread_waits_for_its_own_tasks() -> Result<()> {
    let (_g, rt) = setup()?;
    let mut y = [0i32; 4];
    let yp = y.as_mut_ptr() as usize;
    // A failed task of another thread is that thread's to report.
    std::thread::scope(|s| {
        s.spawn(move || -> Result<()> {
            // SAFETY: the exit fails before copying.
            unsafe { target_exit_data_nowait(0, &[MapItem::from(yp as *mut i32, 16).present()], &[])? };
            let e = fails(omp_taskwait(), "the failing thread's taskwait")?;
            check!(matches!(e, Error::NotPresent { .. }), "{e:?}");
            Ok(())
        })
        .join()
        .unwrap_or(Err(Error::QueueClosed { device: 0, why: "thread panicked" }))
    })?;
    omp_taskwait()?; // this thread queued nothing
    let _ = &mut y;
    all_clean(rt)
}

/// `omp_get_wtime` waits for the work queued on every device before it reads the clock, so
/// a port's timer spans its target regions as in C (where they are complete on return): a
/// queued 50 ms kernel lies between the two reads (a lower bound; without the wait they
/// are microseconds apart).
#[test]
fn omp_get_wtime_spans_queued_target_regions() -> Result<()> {
    let (_serial, rt) = setup()?;
    check!(omp_get_wtick() > 0.0 && omp_get_wtick() < 1e-3, "tick {}", omp_get_wtick());
    let hosts = (0..rt.num_devices()).filter(|&d| rt.describe(d).is_ok_and(|x| x.kind == BackendKind::Host));
    for d in hosts {
        let start = omp_get_wtime()?;
        // SAFETY: no maps; the kernel reads one scalar.
        unsafe { target(d as i32, &offload_tests::NAP, 1, &[], &[LaunchArg::Value(Scalar::U64(50))])? };
        let seconds = omp_get_wtime()? - start;
        check!(seconds >= 0.050, "device {d}: the timer read {seconds} s across a 50 ms region");
    }
    all_clean(rt)
}

/// One step of a 1-D heat equation with fixed ends, from `src` into `dst`.
#[offload::kernel(dims = 1)]
fn heat_step(i: usize, n: usize, src: &[f32], dst: &mut [f32]) {
    if i == 0 || i == n - 1 {
        dst[i] = src[i];
    } else {
        dst[i] = 0.25 * src[i - 1] + 0.5 * src[i] + 0.25 * src[i + 1];
    }
}

/// The usual ping-pong of two grids inside `target data`: the host swaps its two pointers
/// after each step (C's `tmp = a; a = b; b = tmp;`), and each launch's arguments are
/// translated through the present table, so the device copies swap with them. The raw
/// form, as a line-by-line port writes it, and the safe one (the views are `Copy`: swap
/// them). Both end with the host's own loop's values.
#[test]
fn two_grids_swapped_on_the_host_inside_target_data() -> Result<()> {
    let (_serial, rt) = setup()?;
    let (n, steps) = (64usize, 7);
    let start: Vec<f32> = (0..n).map(|i| if i == n / 2 { 64.0 } else { 0.0 }).collect();
    // The host's loop.
    let (mut want, mut other) = (start.clone(), vec![0f32; n]);
    for _ in 0..steps {
        for i in 0..n {
            other[i] = if i == 0 || i == n - 1 {
                want[i]
            } else {
                0.25 * want[i - 1] + 0.5 * want[i] + 0.25 * want[i + 1]
            };
        }
        std::mem::swap(&mut want, &mut other);
    }
    for d in devices()? {
        // #pragma omp target data map(tofrom: a[0:n], b[0:n])
        let (mut a, mut b) = (start.clone(), vec![0f32; n]);
        let maps = [MapItem::tofrom(a.as_mut_ptr(), 4 * n), MapItem::tofrom(b.as_mut_ptr(), 4 * n)];
        let (mut src, mut dst) = (a.as_mut_ptr(), b.as_mut_ptr());
        // SAFETY: the maps name live vectors of the sizes given; the host touches neither
        // inside the region.
        unsafe {
            target_data_begin(d, &maps)?;
            for _ in 0..steps {
                let args =
                    [LaunchArg::Value(Scalar::U64(n as u64)), LaunchArg::mapped(src), LaunchArg::mapped(dst)];
                target(d, &heat_step::KERNEL, n, &[], &args)?;
                std::mem::swap(&mut src, &mut dst);
            }
            target_data_end(d, &maps)?;
        }
        let newest = if steps % 2 == 0 { &a } else { &b };
        check!(*newest == want, "device {d}: {:?}", &newest[n / 2 - 2..n / 2 + 3]);
        // The safe form: both grids mapped tofrom, the views swapped.
        let (mut a, mut b) = (start.clone(), vec![0f32; n]);
        let gpu = rt.device(d as usize)?;
        gpu.data((map::tofrom(&mut a), map::tofrom(&mut b)), |(av, bv)| {
            let (mut src, mut dst) = (av, bv);
            for _ in 0..steps {
                heat_step::launch(&gpu, n, n, src, dst)?;
                std::mem::swap(&mut src, &mut dst);
            }
            Ok(())
        })?;
        let newest = if steps % 2 == 0 { &a } else { &b };
        check!(*newest == want, "device {d}: {:?}", &newest[n / 2 - 2..n / 2 + 3]);
    }
    all_clean(rt)
}

/// A 2-D kernel in the OpenMP shape: `collapse(2)` over the interior of an `ny x nx` grid.
#[offload::kernel(dims = 2)]
fn ported_stencil(i: usize, j: usize, nx: usize, u: &[f32], v: &mut [f32]) {
    v[i * nx + j] =
        0.25 * (u[(i - 1) * nx + j] + u[(i + 1) * nx + j] + u[i * nx + j - 1] + u[i * nx + j + 1]);
}

/// A 3-D kernel in the OpenMP shape: `collapse(3)`.
#[offload::kernel(dims = 3)]
fn ported_cube(i: usize, j: usize, k: usize, n: usize, w: &mut [u32]) {
    w[(i * n + j) * n + k] = (i * 100 + j * 10 + k) as u32;
}

/// A teams kernel in the OpenMP shape: `target teams num_teams(t) thread_limit(32)`, each
/// team reversing its block of 32 through a team-local array.
#[offload::kernel(teams = 32)]
fn ported_teams(team: usize, thread: usize, x: &[u32], y: &mut [u32]) {
    let mut tile: [u32; 32] = offload::team_local();
    tile[thread] = x[team * 32 + thread];
    offload::barrier();
    y[team * 32 + thread] = tile[31 - thread];
}

/// A teams kernel whose team size is the launch's (`teams = ..=64`): in the OpenMP shape,
/// `thread_limit` gives it. Each team reverses its block of `team_size()` elements.
#[offload::kernel(teams = ..=64)]
fn ported_any_team(team: usize, thread: usize, x: &[u32], y: &mut [u32]) {
    let mut tile: [u32; 64] = offload::team_local();
    let t = offload::team_size();
    tile[thread] = x[team * t + thread];
    offload::barrier();
    y[team * t + thread] = tile[t - 1 - thread];
}

#[test]
fn target_launches_every_kernel_shape_in_the_openmp_shape() -> Result<()> {
    let (_serial, rt) = setup()?;
    let mut all = devices()?;
    all.push(omp_get_initial_device()?);
    let (ny, nx) = (9usize, 13usize);
    let u: Vec<f32> = (0..ny * nx).map(|i| (i % 7) as f32).collect();
    let mut want = vec![0f32; ny * nx];
    for i in 1..ny - 1 {
        for j in 1..nx - 1 {
            ported_stencil(i, j, nx, &u, &mut want);
        }
    }
    let n = 4usize;
    let cube: Vec<u32> = (0..n * n * n).map(|x| ((x / 16) * 100 + (x / 4 % 4) * 10 + x % 4) as u32).collect();
    let teams = 5usize;
    let x: Vec<u32> = (0..teams * 32).map(|i| i as u32).collect();
    let reversed: Vec<u32> = (0..teams * 32).map(|i| ((i / 32) * 32 + 31 - i % 32) as u32).collect();
    for dev in all {
        // collapse(2) over the interior.
        let mut v = vec![0f32; ny * nx];
        let maps = [MapItem::to(u.as_ptr(), 4 * ny * nx), MapItem::tofrom(v.as_mut_ptr(), 4 * ny * nx)];
        let args = [
            LaunchArg::Value(Scalar::U64(nx as u64)),
            LaunchArg::mapped(u.as_ptr()),
            LaunchArg::mapped(v.as_ptr()),
        ];
        // SAFETY: the maps name live vectors of the sizes given; nothing else touches them.
        unsafe { target_loops(dev, &ported_stencil::KERNEL, &[1..ny - 1, 1..nx - 1], &maps, &args) }?;
        check!(v == want, "device {dev}: {:?}", &v[nx..2 * nx]);
        // collapse(3) over a whole cube.
        let mut w = vec![0u32; n * n * n];
        let maps = [MapItem::tofrom(w.as_mut_ptr(), 4 * n * n * n)];
        let args = [LaunchArg::Value(Scalar::U64(n as u64)), LaunchArg::mapped(w.as_ptr())];
        // SAFETY: as above.
        unsafe { target_loops(dev, &ported_cube::KERNEL, &[0..n, 0..n, 0..n], &maps, &args) }?;
        check!(w == cube, "device {dev}: {:?}", &w[..8]);
        // num_teams(5) thread_limit(32), and with no thread_limit.
        for limit in [Some(32), None, Some(1024)] {
            let mut y = vec![0u32; teams * 32];
            let maps =
                [MapItem::to(x.as_ptr(), 4 * teams * 32), MapItem::tofrom(y.as_mut_ptr(), 4 * teams * 32)];
            let args = [LaunchArg::mapped(x.as_ptr()), LaunchArg::mapped(y.as_ptr())];
            // SAFETY: as above.
            unsafe { target_teams(dev, &ported_teams::KERNEL, teams, limit, &maps, &args) }?;
            check!(y == reversed, "device {dev}, thread_limit {limit:?}: {:?}", &y[..4]);
        }
        // thread_limit is the team size of a kernel whose teams are sized at launch (at most
        // its 64; none: 64).
        let x2: Vec<u32> = (0..320).collect();
        for (limit, size) in [(Some(16), 16usize), (Some(100), 64), (None, 64)] {
            let mut y = vec![0u32; 320];
            let maps = [MapItem::to(x2.as_ptr(), 4 * 320), MapItem::tofrom(y.as_mut_ptr(), 4 * 320)];
            let args = [LaunchArg::mapped(x2.as_ptr()), LaunchArg::mapped(y.as_ptr())];
            // SAFETY: as above.
            unsafe { target_teams(dev, &ported_any_team::KERNEL, 320 / size, limit, &maps, &args) }?;
            let want: Vec<u32> = (0..320).map(|i| ((i / size) * size + size - 1 - i % size) as u32).collect();
            check!(y == want, "device {dev}, thread_limit {limit:?}: {:?}", &y[..4]);
        }
        // Shapes that do not fit the kernel are refused, naming the fix, and map nothing.
        let mut y = vec![0u32; 32];
        let maps = [MapItem::to(x.as_ptr(), 4 * 32), MapItem::tofrom(y.as_mut_ptr(), 4 * 32)];
        let args = [LaunchArg::mapped(x.as_ptr()), LaunchArg::mapped(y.as_ptr())];
        let refused = |r: Result<()>, needle: &str| -> Result<()> {
            let e = fails(r, needle)?;
            check!(matches!(&e, Error::KernelArgument { what, .. } if what.contains(needle)), "{e:?}");
            Ok(())
        };
        // SAFETY: each is refused before it maps or runs anything.
        unsafe {
            refused(
                target_teams(dev, &ported_teams::KERNEL, 1, Some(16), &maps, &args),
                "thread_limit(16) is below",
            )?;
            refused(target(dev, &ported_teams::KERNEL, 32, &maps, &args), "omp::target_teams")?;
            refused(target_loops(dev, &ported_cube::KERNEL, &[0..2, 0..2], &maps, &args), "not collapse(2)")?;
            refused(target_teams(dev, &ported_cube::KERNEL, 1, None, &maps, &args), "not teams")?;
            refused(target_loops(dev, &ADD_I32, &[0..4, 0..4], &maps, &args), "a kernel written by hand")?;
        }
        if dev != omp_get_initial_device()? {
            check!(
                !omp_target_is_present(vp(x.as_ptr()), dev)?,
                "device {dev}: a refused launch maps nothing"
            );
        }
    }
    // The nowait forms, chained on the output: collapse(3) then teams reversing it twice.
    for dev in devices()? {
        let mut w = vec![0u32; 4 * n * n * n];
        let wp = w.as_mut_ptr();
        let wd = |k| [Depend::new(k, wp)];
        let cube_args = [LaunchArg::Value(Scalar::U64(n as u64)), LaunchArg::mapped(wp)];
        let team_args = [LaunchArg::mapped(wp), LaunchArg::mapped(wp.wrapping_add(n * n * n))];
        // SAFETY: `w` outlives the taskwait; the host touches it only after.
        unsafe {
            target_enter_data_nowait(dev, &[MapItem::tofrom(wp, 16 * n * n * n)], &wd(DependType::Out))?;
            target_loops_nowait(
                dev,
                &ported_cube::KERNEL,
                &[0..n, 0..n, 0..n],
                &[],
                &cube_args,
                &wd(DependType::InOut),
            )?;
            target_teams_nowait(
                dev,
                &ported_teams::KERNEL,
                2,
                Some(32),
                &[],
                &team_args,
                &wd(DependType::InOut),
            )?;
            target_exit_data_nowait(dev, &[MapItem::from(wp, 16 * n * n * n)], &wd(DependType::InOut))?;
        }
        omp_taskwait()?;
        check!(w[..n * n * n] == cube[..], "device {dev}: {:?}", &w[..4]);
        let want: Vec<u32> = (0..n * n * n).map(|i| cube[(i / 32) * 32 + 31 - i % 32]).collect();
        check!(w[n * n * n..2 * n * n * n] == want[..], "device {dev}: {:?}", &w[n * n * n..n * n * n + 4]);
    }
    check!(
        matches!(OmpSpace::loops(&[0..1, 0..1, 0..1, 0..1]), Err(Error::InvalidArgument { .. })),
        "collapse(4) is refused"
    );
    all_clean(rt)
}
