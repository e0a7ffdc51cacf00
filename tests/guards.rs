//! The safe API's guards on every backend present, and on the initial device: a mapping
//! that ends itself ([`offload::Mapped`], from `Device::enter_data` and
//! `Device::data_region`) and the host copy it lends for `target update`; owned device
//! memory ([`offload::DeviceBuffer`]) and associations that end themselves.

use offload::{map, DeviceBuffer, Error, Result, Runtime};
use offload_kernels::{saxpy, scale, ADD_I32};
use offload_tests::{assert_clean, check, check_eq, fails, on_every_backend};

/// Nothing is left mapped or allocated on `d` (on the initial device: nothing is mapped).
fn clean(rt: &Runtime, d: usize) -> Result<()> {
    if d == rt.initial_device() {
        check!(rt.live_mappings().is_empty());
        return Ok(());
    }
    assert_clean(rt, d)
}

/// Runs `case` on every device of every backend, and on each runtime's initial device.
fn on_every_device_and_the_initial_one(what: &str, case: impl Fn(&Runtime, usize) -> Result<()>) {
    on_every_backend(what, 1, |b| b, |rt| (0..=rt.num_devices()).try_for_each(|d| case(rt, d)));
}

#[test]
fn entered_data_ends_when_the_guard_drops() {
    on_every_device_and_the_initial_one("enter_data guard", |rt, d| {
        let gpu = rt.device(d)?;
        let on_device = d != rt.initial_device();
        let x = vec![2.0f32; 256];
        let mut y = vec![1.0f32; 256];
        {
            let entered = gpu.enter_data((map::to(&x), map::tofrom(&mut y)))?;
            let (xv, yv) = entered.views();
            check!(rt.is_present(x.as_ptr() as usize, d)? && rt.is_present(yv.host_range().begin, d)?);
            saxpy(&gpu, 3.0, xv, yv)?;
            // Dropped here: `tofrom` copies back, `to` is released.
        }
        check!(y.iter().all(|&v| v == 7.0), "y[0] = {}", y[0]);
        check!(!on_device || !rt.is_present(x.as_ptr() as usize, d)?);
        // `map::from` enters as `alloc` (nothing copied in) and copies back at the end.
        let mut z = vec![5.0f32; 64];
        let entered = gpu.enter_data(map::from(&mut z))?;
        if on_device {
            check_eq!(rt.entry(entered.views().host_range().begin, d)?.map(|e| e.ref_count), Some(1));
        }
        scale(&gpu, 2.0, entered.views())?;
        entered.exit()?;
        if !on_device {
            check!(z.iter().all(|&v| v == 10.0), "initial device: z[0] = {}", z[0]);
        }
        clean(rt, d)
    });
}

#[test]
fn an_exit_error_is_returned_by_exit() {
    on_every_backend(
        "enter_data guard exit error",
        1,
        |b| b,
        |rt| {
            let gpu = rt.device(0)?;
            let x = [0i32; 16];
            // The entry is deleted behind the guard's back; a `present` exit would fail, a plain
            // release finds nothing and succeeds, as OpenMP's exit of an absent range does.
            let entered = gpu.enter_data(map::to(&x))?;
            gpu.exit_data(map::delete(&x))?;
            entered.exit()?;
            assert_clean(rt, 0)
        },
    );
}

/// The OpenMP Examples' `target_update` pattern: change the host copy of a mapped array
/// between two target regions and push it with `update to`; pull a result with `update from`.
#[test]
fn the_host_copy_changes_and_is_pushed_inside_a_region() {
    on_every_device_and_the_initial_one("data_region + update", |rt, d| {
        let gpu = rt.device(d)?;
        let mut v = vec![1.0f32; 1000];
        let mut p = vec![0.0f32; 1000];
        let mut region = gpu.data_region((map::to_mut(&mut v), map::tofrom(&mut p)))?;
        let (vv, pv) = region.views();
        saxpy(&gpu, 1.0, vv, pv)?; // p = 1
        region.host_mut(&vv)?.fill(2.0); // init_again(v)
        region.update_to(&vv)?;
        saxpy(&gpu, 1.0, vv, pv)?; // p = 1 + 2
        scale(&gpu, 10.0, pv)?; // p = 30
        region.update_from(&pv)?;
        check!(region.host_mut(&pv)?.iter().all(|&x| x == 30.0), "device {d}: p not pulled");
        // Part of a view: only that part moves.
        region.host_mut(&vv)?[..10].fill(-1.0);
        region.update_to(&vv.slice(..5)?)?;
        saxpy(&gpu, 1.0, vv.slice(..10)?, pv.slice(..10)?)?; // p[..5] = 29, p[5..10] = 32 (or 29 on the initial device)
        region.exit()?;
        check_eq!(p[..5], [29.0; 5]);
        let expect = if d == rt.initial_device() { -1.0 } else { 2.0 };
        check!(p[5..10].iter().all(|&x| x == 30.0 + expect), "device {d}: p[5] = {}", p[5]);
        check!(p[10..].iter().all(|&x| x == 30.0));
        // `to_mut` copies nothing back: the host keeps what it wrote.
        check_eq!(v[..10], [-1.0; 10]);
        check!(v[10..].iter().all(|&x| x == 2.0));
        clean(rt, d)
    });
}

#[test]
fn host_access_needs_a_view_of_an_exclusive_map_of_the_guard() {
    on_every_backend(
        "host_mut refusals",
        1,
        |b| b,
        |rt| {
            let gpu = rt.device(0)?;
            let (a, mut b, mut c) = (vec![0i32; 8], vec![0i32; 8], vec![0i32; 8]);
            let mut region = gpu.data_region((map::to(&a), map::tofrom(&mut b)))?;
            let (av, _) = region.views();
            let e = fails(region.host_mut(&av).map(drop), "host_mut of a shared map")?;
            check!(matches!(e, Error::InvalidArgument { routine: "Mapped::host_mut", .. }), "{e:?}");
            check!(e.to_string().contains("exclusive borrow"), "{e}");
            let other = gpu.enter_data(map::tofrom(&mut c))?;
            let cv = other.views();
            let e = fails(region.update_from(&cv), "update_from through another guard's view")?;
            check!(e.to_string().contains("device 0"), "{e}");
            let e = fails(region.update_to(&cv), "update_to through another guard's view")?;
            check!(matches!(e, Error::InvalidArgument { routine: "Mapped::update_to", .. }), "{e:?}");
            if rt.num_devices() > 1 {
                let elsewhere = rt.device(1)?.enter_data(map::to(&a))?;
                check!(region.update_to(&elsewhere.views()).is_err());
            }
            drop(other);
            region.exit()?;
            assert_clean(rt, 0)
        },
    );
}

#[test]
fn device_buffers_copy_launch_and_free_themselves() {
    on_every_device_and_the_initial_one("DeviceBuffer", |rt, d| {
        let gpu = rt.device(d)?;
        let data: Vec<i32> = (0..1000).collect();
        {
            let mut buf = DeviceBuffer::from_slice(&gpu, &data)?;
            check_eq!((buf.len(), buf.device().number()), (1000, d));
            // is_device_ptr: the buffer as a kernel argument.
            gpu.launch(&ADD_I32, 1000, (7i32, &buf))?;
            check!(buf.to_vec()?.iter().enumerate().all(|(i, &v)| v == i as i32 + 7));
            // Parts, checked.
            buf.write(998, &[-1, -2])?;
            let mut tail = [0i32; 3];
            buf.read(997, &mut tail)?;
            check_eq!(tail, [1004, -1, -2]);
            let e = fails(buf.write(999, &[0, 0]), "a write past the end")?;
            check!(e.to_string().contains("elements 999..999+2 of a buffer of 1000"), "{e}");
            check!(buf.read(usize::MAX, &mut tail).is_err());
            // To and from every other device (the initial one included).
            for other in 0..=rt.num_devices() {
                let mut there = DeviceBuffer::<i32>::new(&rt.device(other)?, 1000)?;
                there.copy_from(&buf)?;
                check_eq!(there.to_vec()?, buf.to_vec()?);
                let mut back = DeviceBuffer::<i32>::new(&gpu, 1000)?;
                back.fill_bytes(0)?;
                back.copy_from(&there)?;
                check_eq!(back.to_vec()?[998..], [-1, -2]);
            }
            let short = DeviceBuffer::<i32>::new(&gpu, 10)?;
            check!(matches!(
                DeviceBuffer::<i32>::new(&gpu, 20)?.copy_from(&short),
                Err(Error::InvalidArgument { .. })
            ));
            // A buffer of another device is refused as an argument.
            if rt.num_devices() > 1 && d < rt.num_devices() {
                let elsewhere = DeviceBuffer::from_slice(&rt.device((d + 1) % rt.num_devices())?, &data)?;
                let e = fails(gpu.launch(&ADD_I32, 1000, (7i32, &elsewhere)), "a buffer of another device")?;
                check!(matches!(e, Error::KernelArgument { index: 1, .. }), "{e:?}");
            }
            check!(DeviceBuffer::<i32>::new(&gpu, 0)?.to_vec()?.is_empty());
            check!(DeviceBuffer::<u64>::new(&gpu, usize::MAX).is_err());
        }
        clean(rt, d)
    });
}

#[test]
fn an_association_lasts_as_long_as_its_guard() {
    on_every_backend(
        "Association",
        1,
        |b| b,
        |rt| {
            for d in 0..rt.num_devices() {
                let gpu = rt.device(d)?;
                let buf = DeviceBuffer::from_slice(&gpu, &[10i32; 64])?;
                let mut host = vec![1i32; 16];
                {
                    let mut assoc = buf.associate(&mut host, 8)?;
                    let h = assoc.host().as_ptr() as usize;
                    check_eq!(rt.mapped_ptr(h, d)?, Some(buf.addr() + 32));
                    // A map of it copies nothing: the device keeps the buffer's values.
                    assoc.host_mut().fill(2);
                    gpu.data(map::tofrom(assoc.host_mut()), |v| offload_kernels::add_i32(&gpu, 1, v))?;
                    check_eq!(assoc.host(), &[2; 16][..]);
                    gpu.launch(&ADD_I32, 16, (1i32, assoc.view()))?; // the view reaches the buffer too
                    assoc.update_from()?;
                    check_eq!(assoc.host(), &[12; 16][..]);
                    assoc.host_mut()[0] = 100;
                    assoc.update_to()?;
                    check_eq!(buf.to_vec()?[8], 100);
                    check_eq!(buf.to_vec()?[7], 10);
                    // Freeing the buffer under the association is refused by the runtime (the
                    // borrow checker stops the safe API; the raw routine says why).
                    // SAFETY: the call fails before freeing anything.
                    let e = fails(unsafe { rt.target_free(buf.addr(), d) }, "free under an association")?;
                    check!(e.to_string().contains("disassociate it first"), "{e}");
                }
                check!(!rt.is_present(host.as_ptr() as usize, d)?);
                check_eq!(host[..2], [100, 12]);
                let e = fails(buf.associate(&mut host, 60).map(drop), "past the buffer's end")?;
                check!(e.to_string().contains("60..60+16"), "{e}");
            }
            // The initial device has no associations.
            let init = rt.device(rt.initial_device())?;
            let buf = DeviceBuffer::from_slice(&init, &[0u8; 8])?;
            check!(buf.associate(&mut [0u8; 4], 0).is_err());
            Ok(())
        },
    );
}

#[test]
fn an_exit_through_a_guards_view_is_refused() {
    on_every_backend(
        "nowait exit of a guard's view",
        1,
        |b| b,
        |rt| {
            let gpu = rt.device(0)?;
            let mut v = vec![0i32; 16];
            let entered = gpu.enter_data(map::tofrom(&mut v))?;
            let view = entered.views();
            let r = rt.nowait(|s| s.exit(0, view, &[]).map(drop))?;
            let e = fails(r, "an exit through a guard's view")?;
            check!(e.to_string().contains("drop or exit the guard"), "{e}");
            offload_kernels::fill_i32(&gpu, 7, view)?;
            entered.exit()?; // still the guard's to end: it copies back
            check_eq!(v, vec![7; 16]);
            clean(rt, 0)
        },
    );
}

#[test]
fn new_buffers_of_host_devices_read_as_zeros() {
    let rt = Runtime::builder()
        .env(|_| None)
        .gpus(false)
        .host_devices(1)
        .memory_pool(offload::PoolConfig { enabled: false, ..Default::default() })
        .build()
        .expect("runtime");
    for d in [0, rt.initial_device()] {
        let dev = rt.device(d).expect("device");
        let b = DeviceBuffer::<u64>::new(&dev, 4096).expect("buffer");
        assert!(b.to_vec().expect("read").iter().all(|&v| v == 0), "device {d}");
    }
}

/// Writes 1 into each of its `n` u64, one at a time, slowly.
fn slow_ones(l: &offload::HostLaunch<'_>) -> std::result::Result<(), String> {
    let (p, _) = l.ptr::<u64>(0)?;
    for i in 0..l.n() {
        // SAFETY: argument 0 is a buffer of `n` u64.
        unsafe { p.add(i).write_volatile(1) };
        SLOW_ONES_RUNNING.store(true, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    Ok(())
}
static SLOW_ONES: offload::Kernel = offload::Kernel::new("slow_ones").with_host(slow_ones);
static SLOW_ONES_RUNNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// On the initial device a buffer is host memory: a read waits for a kernel writing it
/// from another thread, so it never sees half of the kernel's writes.
#[test]
fn reads_of_an_initial_device_buffer_wait_for_its_kernels() {
    let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(0).build().expect("runtime");
    let init = rt.device(rt.initial_device()).expect("initial device");
    let buf = DeviceBuffer::<u64>::new(&init, 64).expect("buffer");
    std::thread::scope(|s| {
        s.spawn(|| init.launch(&SLOW_ONES, 64, (&buf,)).expect("launch"));
        // Once the kernel has written its first element, every read must wait for its end.
        while !SLOW_ONES_RUNNING.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::yield_now();
        }
        for _ in 0..50 {
            let seen = buf.to_vec().expect("read");
            let ones = seen.iter().filter(|&&v| v == 1).count();
            assert!(ones == 0 || ones == 64, "a read saw {ones} of 64 writes of a running kernel");
        }
    });
    assert!(buf.to_vec().expect("read").iter().all(|&v| v == 1));
}
