//! Unwind safety: a panic in a `data` body, a `nowait` task, a pipeline stage or a host
//! kernel ends the construct as an error would, leaves nothing mapped and no stale device
//! data, and the device goes on working.

use std::panic::{catch_unwind, AssertUnwindSafe};

use offload::error::panic_message;
use offload::pipeline::Pipeline;
use offload::{map, BackendKind, Error, HostLaunch, Kernel, Result, Runtime};
use offload_kernels::fill_i32;
use offload_tests::{assert_clean, check, check_eq, device_copy_of, on_every_backend, on_every_device};

/// Writes 9 into the first half of argument 0, then panics.
fn panics_halfway(l: &HostLaunch<'_>) -> Result<(), String> {
    // SAFETY: argument 0 is a mapped range of n i32 used by nothing else during the launch.
    let x = unsafe { l.slice_mut::<i32>(0, l.n())? };
    x[..l.n() / 2].fill(9);
    panic!("kernel gave up at item {}", l.n() / 2);
}

/// A host-only kernel that panics.
static PANICS_HALFWAY: Kernel = Kernel::new("panics_halfway").with_host(panics_halfway);

/// Whether `device` runs host kernels (GPU backends have no host implementation to panic).
fn runs_host_kernels(rt: &Runtime, device: usize) -> Result<bool> {
    Ok(rt.describe(device)?.kind == BackendKind::Host)
}

#[test]
fn a_panic_in_a_data_body_ends_its_maps_then_resumes() {
    on_every_device("panicking data body", |rt, d| {
        let dev = rt.device(d)?;
        let mut x = vec![1i32; 256];
        let mut y = vec![0i32; 256];
        let caught = catch_unwind(AssertUnwindSafe(|| {
            dev.data((map::to(&x), map::tofrom(&mut y)), |(_, yv)| -> Result<()> {
                fill_i32(&dev, 5, yv)?;
                panic!("body gave up");
            })
        }));
        let payload = caught.err().ok_or(Error::InvalidArgument {
            routine: "check",
            what: "the body's panic should resume".into(),
        })?;
        check_eq!(panic_message(&*payload), "body gave up");
        assert_clean(rt, d)?;
        // Ended as an error return ends it: the `from` half copied back.
        check!(y.iter().all(|&v| v == 5), "tofrom not copied back: {:?}", &y[..4]);
        // No stale entry: a new `to` map copies the host's current data.
        x.fill(2);
        dev.data(map::to(&x), |_| {
            let copy = device_copy_of(rt, &x, d)?;
            check!(copy == x, "the device kept stale data: {:?}", &copy[..4]);
            Ok(())
        })?;
        assert_clean(rt, d)
    });
}

#[test]
fn a_panic_in_a_nested_data_body_keeps_the_outer_region() {
    on_every_device("panicking nested data body", |rt, d| {
        let dev = rt.device(d)?;
        let x = vec![1i32; 64];
        let z = vec![3i32; 64];
        dev.data(map::to(&x), |_| {
            let caught = catch_unwind(AssertUnwindSafe(|| {
                dev.data((map::to(&x), map::to(&z)), |_| -> Result<()> { panic!("inner gave up") })
            }));
            check!(caught.is_err());
            check!(rt.is_present(x.as_ptr() as usize, d)?, "the outer region lost its map");
            check!(!rt.is_present(z.as_ptr() as usize, d)?, "the inner region's map was left");
            Ok(())
        })?;
        assert_clean(rt, d)
    });
}

#[test]
fn a_panicking_nowait_task_fails_the_scope_and_leaves_nothing_mapped() {
    on_every_device("panicking nowait task", |rt, d| {
        let x = vec![1i32; 128];
        let mut y = vec![0i32; 128];
        let r = rt.nowait(|s| -> Result<()> {
            let (entered, (xv, yv)) = s.enter(d, (map::to(&x), map::from(&mut y)), &[])?;
            let bad = s.compute(d, &[&entered], |_| panic!("task gave up"))?;
            s.cleanup(d, (yv, xv), &[&bad])?;
            Ok(())
        });
        match r {
            Err(Error::Panicked { device, message, .. }) => {
                check!(device == d && message == "task gave up", "device {device}: {message}")
            }
            other => check!(false, "expected the task's panic as the scope's error, got {other:?}"),
        }
        check!(y.iter().all(|&v| v == 0), "a failed task's data was copied back");
        assert_clean(rt, d)?;
        // The lane survived and runs the next scope's tasks.
        let mut z = vec![0i32; 16];
        rt.nowait(|s| -> Result<()> {
            let (entered, zv) = s.enter(d, map::from(&mut z), &[])?;
            let filled = s.compute(d, &[&entered], move |dev| fill_i32(dev, 4, zv))?;
            s.exit(d, zv, &[&filled])?;
            Ok(())
        })??;
        check!(z.iter().all(|&v| v == 4), "{z:?}");
        assert_clean(rt, d)
    });
}

#[test]
fn a_panicking_pipeline_stage_fails_its_batch_and_leaves_nothing_mapped() {
    on_every_backend(
        "panicking pipeline stage",
        1,
        |b| b,
        |rt| {
            let devices: Vec<usize> = (0..rt.num_devices()).collect();
            let inputs = vec![vec![1i32; 32]; 20];
            let mut out = vec![vec![0i32; 32]; 20];
            let r = Pipeline::new(rt, &devices, 2)?.run(&inputs, &mut out, |dev, batch, _, y| {
                if batch == 5 {
                    panic!("stage gave up on batch {batch}");
                }
                fill_i32(dev, 1, y)
            });
            match &r {
                Err(e @ Error::Batch { batch: 5, source }) => {
                    check!(matches!(**source, Error::Panicked { .. }), "{source:?}");
                    check!(e.to_string().contains("stage gave up on batch 5"), "{e}");
                }
                other => check!(false, "expected batch 5 to fail with its panic, got {other:?}"),
            }
            check!(out[5].iter().all(|&v| v == 0), "the failed batch was copied back");
            for d in devices {
                assert_clean(rt, d)?;
            }
            Ok(())
        },
    );
}

/// Host kernels only: GPU backends have no host implementation to panic in.
#[test]
fn a_panicking_host_kernel_is_a_kernel_failure_and_the_device_goes_on() {
    on_every_device("panicking host kernel", |rt, d| {
        if !runs_host_kernels(rt, d)? {
            return Ok(());
        }
        let dev = rt.device(d)?;
        let mut x = vec![0i32; 100];
        let is_the_panic = |r: Result<()>| match r {
            Err(Error::KernelFailed { device, kernel, message }) => {
                device == d && kernel == "panics_halfway" && message.contains("kernel gave up at item 50")
            }
            _ => false,
        };
        // A launch with its own maps (`target`): ended, nothing left mapped.
        let r = dev.target(&PANICS_HALFWAY, 100, map::tofrom(&mut x), |xv| (xv,));
        check!(is_the_panic(r.clone()), "{r:?}");
        assert_clean(rt, d)?;
        // As a nowait task: the scope's error.
        let r = rt.nowait(|s| -> Result<()> {
            let (entered, xv) = s.enter(d, map::tofrom(&mut x), &[])?;
            let bad = s.launch(d, &PANICS_HALFWAY, 100, (xv,), &[&entered])?;
            s.cleanup(d, xv, &[&bad])?;
            Ok(())
        });
        check!(is_the_panic(r.clone().and_then(|r| r)), "{r:?}");
        assert_clean(rt, d)?;
        // The device's worker survived: the next kernel runs.
        dev.data(map::tofrom(&mut x), |xv| fill_i32(&dev, 6, xv))?;
        check!(x.iter().all(|&v| v == 6), "{:?}", &x[..4]);
        assert_clean(rt, d)
    });
}

#[test]
fn a_panicking_kernel_on_the_initial_device_is_a_kernel_failure() {
    let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build().expect("runtime");
    let host = rt.device(rt.initial_device()).expect("initial device");
    let mut x = vec![0i32; 100];
    let r = host.data(map::tofrom(&mut x), |xv| host.launch(&PANICS_HALFWAY, 100, (xv,)));
    match r {
        Err(Error::KernelFailed { device, kernel: "panics_halfway", message }) => {
            assert_eq!(device, rt.initial_device());
            assert!(message.contains("kernel gave up at item 50"), "{message}");
        }
        other => panic!("expected a kernel failure, got {other:?}"),
    }
    host.data(map::tofrom(&mut x), |xv| fill_i32(&host, 8, xv)).expect("the next kernel");
    assert!(x.iter().all(|&v| v == 8));
}

/// A panic in `run_serially`'s compute unmaps its batch before it goes on (it once left the
/// batch mapped, keyed by memory about to be freed: later maps there found it present and
/// copied nothing).
#[test]
fn a_panic_in_run_serially_unmaps_its_batch() {
    on_every_backend(
        "panic in run_serially",
        1,
        |b| b,
        |rt| {
            let inputs = vec![vec![1i32; 32]; 2];
            let mut out = vec![vec![0i32; 32]; 2];
            let p = Pipeline::new(rt, &[0], 2)?;
            let r = catch_unwind(AssertUnwindSafe(|| {
                p.run_serially(&inputs, &mut out, |_, batch, _, _| -> Result<()> {
                    panic!("serial batch {batch} gave up")
                })
            }));
            check!(r.is_err(), "the panic went on");
            assert_clean(rt, 0)?;
            Ok(())
        },
    );
}

/// A pipeline run inside another pipeline's compute: its scope is opened by a task, so its
/// batches run at once on that task's thread (they once queued behind the outer batch's
/// unmap, which waited for them: a hang).
#[test]
fn a_pipeline_inside_a_pipelines_compute_runs() {
    on_every_backend(
        "a pipeline inside a compute",
        1,
        |b| b,
        |rt| {
            let devices: Vec<usize> = (0..rt.num_devices()).collect();
            let inputs = vec![vec![1i32; 32]; 4];
            let mut out = vec![vec![0i32; 32]; 4];
            let inner_devices = devices.clone();
            Pipeline::new(rt, &devices, 2)?.run(&inputs, &mut out, |dev, _, _, y| {
                let ii = vec![vec![0i32; 8]; 3];
                let mut oo = vec![vec![0i32; 8]; 3];
                Pipeline::new(dev.runtime(), &inner_devices, 2)?
                    .run(&ii, &mut oo, |d, _, _, b| fill_i32(d, 2, b))?;
                check!(oo.iter().flatten().all(|&v| v == 2), "inner outputs");
                fill_i32(dev, 1, y)
            })?;
            check!(out.iter().flatten().all(|&v| v == 1), "outer outputs");
            for d in devices {
                assert_clean(rt, d)?;
            }
            Ok(())
        },
    );
}
