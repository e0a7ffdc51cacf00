//! `nowait` tasks and pipelines on every backend present.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use offload::pipeline::Pipeline;
use offload::{map, Error, HostLaunch, Kernel, NowaitScope};
use offload_tests::{check, check_eq, on_every_backend};

fn double(l: &HostLaunch<'_>) -> Result<(), String> {
    // SAFETY: argument 0 (input) and 1 (output) are distinct mapped ranges of n f32.
    let (x, y) = unsafe { (l.slice::<f32>(0, l.n())?, l.slice_mut::<f32>(1, l.n())?) };
    y.iter_mut().zip(x).for_each(|(y, x)| *y = 2.0 * x);
    Ok(())
}

/// `y = 2 x` on every backend.
static DOUBLE: Kernel = Kernel::new("twice_f32").with_host(double).with_cuda(
    r#"extern "C" __global__ void twice_f32(const float* x, float* y, unsigned long long n) {
        unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.0f * x[i]; }"#,
);

#[test]
fn tasks_chain_across_devices_and_copy_back() {
    on_every_backend(
        "nowait chain",
        2,
        |b| b,
        |rt| {
            let last = rt.num_devices() - 1;
            let x: Vec<f32> = (0..4096).map(|i| i as f32).collect();
            let mut y = vec![0f32; 4096];
            let mut z = vec![0f32; 4096];
            rt.nowait(|s| -> offload::Result<()> {
                let (t0, (xv, yv)) = s.enter(0, (map::to(&x), map::from(&mut y)), &[])?;
                let k0 = s.launch(0, &DOUBLE, 4096, (xv, yv), &[&t0])?;
                let back = s.exit(0, (yv, xv), &[&k0])?;
                back.wait()?;
                Ok(())
            })??;
            check!(y.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32), "y wrong");
            // A dependency on another device's task.
            rt.nowait(|s| -> offload::Result<()> {
                let (t0, (yv, zv)) = s.enter(last, (map::to(&y), map::from(&mut z)), &[])?;
                let k = s.launch(last, &DOUBLE, 4096, (yv, zv), &[&t0])?;
                s.exit(last, (zv, yv), &[&k])?;
                Ok(())
            })??;
            check!(z.iter().enumerate().all(|(i, &v)| v == 4.0 * i as f32), "z wrong");
            check!(rt.live_mappings().is_empty());
            Ok(())
        },
    );
}

#[test]
fn a_failed_task_fails_its_dependents_and_the_scope() {
    on_every_backend(
        "nowait failure",
        1,
        |b| b,
        |rt| {
            let x = vec![1f32; 64];
            let mut y = vec![0f32; 64];
            let r = rt.nowait(|s| -> offload::Result<()> {
                let (t0, (xv, yv)) = s.enter(0, (map::to(&x), map::from(&mut y)), &[])?;
                // Fails: 128 elements asked of 64-element views (host) / unmapped read (checked).
                let bad = s.compute(0, &[&t0], |_| {
                    Err(Error::InvalidArgument { routine: "test", what: "deliberate failure".into() })
                })?;
                let after = s.launch(0, &DOUBLE, 64, (xv, yv), &[&bad])?;
                check!(matches!(after.wait(), Err(Error::Dependency { .. })), "dependent task ran");
                // Clean-up runs anyway and unmaps without copying back.
                let done = s.cleanup(0, (yv, xv), &[&after])?;
                check!(done.wait().is_err());
                Ok(())
            });
            match r {
                Err(Error::InvalidArgument { what, .. }) => check!(what.contains("deliberate"), "{what}"),
                other => check!(false, "the scope should fail with the task's error, got {other:?}"),
            }
            check!(y.iter().all(|&v| v == 0.0), "a failed batch copied back");
            check!(rt.live_mappings().is_empty(), "left mapped: {:?}", rt.live_mappings());
            Ok(())
        },
    );
}

#[test]
fn pipelines_keep_order_use_every_device_and_match_the_serial_run() {
    on_every_backend(
        "pipeline",
        1,
        |b| b,
        |rt| {
            let devices: Vec<usize> = (0..rt.num_devices()).collect();
            let inputs: Vec<Vec<f32>> =
                (0..23).map(|b| (0..1000).map(|i| (b * 1000 + i) as f32).collect()).collect();
            let mut out = vec![vec![0f32; 1000]; 23];
            let mut serial = vec![vec![0f32; 1000]; 23];
            let p = Pipeline::new(rt, &devices, 2)?;
            let report = p.run(&inputs, &mut out, |dev, _, x, y| dev.launch(&DOUBLE, 1000, (x, y)))?;
            p.run_serially(&inputs, &mut serial, |dev, _, x, y| dev.launch(&DOUBLE, 1000, (x, y)))?;
            check_eq!(report.batches_per_device.iter().sum::<usize>(), 23);
            for (b, o) in out.iter().enumerate() {
                check!(
                    o.iter().enumerate().all(|(i, &v)| v == 2.0 * (b * 1000 + i) as f32),
                    "batch {b} wrong"
                );
            }
            check!(out == serial, "pipeline and serial runs differ");
            check!(rt.live_mappings().is_empty());
            Ok(())
        },
    );
}

#[test]
fn a_slower_device_takes_fewer_batches() {
    on_every_backend(
        "pipeline balance",
        2,
        |b| b,
        |rt| {
            // Fewer batches when every step fails once (each run is a sweep's).
            let faults = offload_tests::every_step::faults_mode();
            let batches = offload_tests::sized(40, 12);
            let inputs = vec![vec![1f32; 16]; batches];
            let mut out = vec![vec![0f32; 16]; batches];
            // Device 0 is the slow one: its computes wait until device 1 has computed more
            // than half the batches (an order, not a time; the cap turns a hang into a
            // failure). Under injected faults device 1 may stop early, so device 0 does not
            // wait and only the results are checked.
            let fast_done = AtomicUsize::new(0);
            let report = Pipeline::new(rt, &[0, 1], 2)?.run(&inputs, &mut out, |dev, _, x, y| {
                if dev.number() == 0 && !faults {
                    let start = std::time::Instant::now();
                    while fast_done.load(Ordering::Acquire) <= batches / 2
                        && start.elapsed() < Duration::from_secs(60)
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                dev.launch(&DOUBLE, 16, (x, y))?;
                if dev.number() == 1 {
                    fast_done.fetch_add(1, Ordering::Release);
                }
                Ok(())
            })?;
            let [slow, fast] = [report.batches_per_device[0], report.batches_per_device[1]];
            check!(faults || slow < fast, "slow device took {slow}, fast {fast}");
            check!(out.iter().all(|o| o.iter().all(|&v| v == 2.0)));
            Ok(())
        },
    );
}

#[test]
fn a_failing_batch_stops_the_pipeline_and_is_named() {
    on_every_backend(
        "pipeline failure",
        1,
        |b| b,
        |rt| {
            let devices: Vec<usize> = (0..rt.num_devices()).collect();
            let inputs = vec![vec![1f32; 32]; 30];
            let mut out = vec![vec![0f32; 32]; 30];
            let r = Pipeline::new(rt, &devices, 3)?.run(&inputs, &mut out, |dev, batch, x, y| {
                if batch == 7 {
                    return Err(Error::InvalidArgument { routine: "test", what: "batch 7 is bad".into() });
                }
                dev.launch(&DOUBLE, 32, (x, y))
            });
            match r {
                Err(Error::Batch { batch: 7, source }) => {
                    check!(source.to_string().contains("batch 7 is bad"), "{source}")
                }
                other => check!(false, "expected batch 7 to fail, got {other:?}"),
            }
            check!(out[7].iter().all(|&v| v == 0.0), "the failed batch was copied back");
            check!(rt.live_mappings().is_empty(), "left mapped: {:?}", rt.live_mappings());
            Ok(())
        },
    );
}

#[test]
fn pipelines_need_two_slots() {
    let rt = offload::Runtime::builder().env(|_| None).gpus(false).host_devices(1).build().expect("runtime");
    assert!(matches!(Pipeline::new(&rt, &[0], 1), Err(Error::InvalidArgument { .. })));
    assert!(matches!(Pipeline::new(&rt, &[5], 2), Err(Error::NoSuchDevice { .. })));
}

/// Tasks that queue tasks, three levels deep, each on the next device, each writing into
/// borrowed host data: `nowait` returns only after the deepest (which sleeps first) wrote.
#[test]
fn tasks_queued_by_tasks_finish_before_the_scope_returns() {
    on_every_backend(
        "nested nowait",
        1,
        |b| b,
        |rt| {
            let n = rt.num_devices();
            let mut levels = [0u32; 3];
            let [first, second, third] = &mut levels;
            rt.nowait(|s| -> offload::Result<()> {
                s.compute(0, &[], move |_| {
                    *first = 1;
                    s.compute(1 % n, &[], move |_| {
                        *second = 2;
                        s.compute(2 % n, &[], move |_| {
                            std::thread::sleep(Duration::from_millis(50));
                            *third = 3;
                            Ok(())
                        })?;
                        Ok(())
                    })?;
                    Ok(())
                })?;
                Ok(())
            })??;
            check_eq!(levels, [1, 2, 3]);
            Ok(())
        },
    );
}

/// The error of a task queued by a task is the scope's error.
#[test]
fn a_nested_task_error_is_the_scope_error() {
    on_every_backend(
        "nested nowait failure",
        1,
        |b| b,
        |rt| {
            let r = rt.nowait(|s| {
                s.compute(0, &[], move |_| {
                    s.compute(0, &[], |_| {
                        std::thread::sleep(Duration::from_millis(20));
                        Err(Error::InvalidArgument { routine: "test", what: "nested failure".into() })
                    })?;
                    Ok(())
                })
            });
            match r {
                Err(Error::InvalidArgument { what, .. }) => check!(what == "nested failure", "{what}"),
                other => check!(false, "the nested task's error should end the scope, got {other:?}"),
            }
            Ok(())
        },
    );
}

/// A scope whose closure panics waits for its tasks, nested ones included, before the
/// panic goes on.
#[test]
fn a_panicking_scope_waits_for_nested_tasks_first() {
    /// Sets its flag when dropped: while the scope's closure unwinds.
    struct SetOnDrop<'a>(&'a AtomicBool);
    impl Drop for SetOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    on_every_backend(
        "panicking nowait scope",
        1,
        |b| b,
        |rt| {
            let unwinding = AtomicBool::new(false);
            let mut written = 0u32;
            let (unwinding, slot) = (&unwinding, &mut written);
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                rt.nowait(|s| {
                    let queued = s.compute(0, &[], move |_| {
                        // Queues the next task only once the scope is unwinding.
                        while !unwinding.load(Ordering::Acquire) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        std::thread::sleep(Duration::from_millis(30));
                        s.compute(0, &[], move |_| {
                            std::thread::sleep(Duration::from_millis(30));
                            *slot = 7;
                            Ok(())
                        })?;
                        Ok(())
                    });
                    let _signal = SetOnDrop(unwinding);
                    assert!(queued.is_ok());
                    panic!("scope gave up");
                })
            }));
            check!(caught.is_err(), "the scope's panic should resume");
            check_eq!(written, 7);
            Ok(())
        },
    );
}

/// Queues `FAN` tasks that each count themselves and, `depth - 1` more times, queue `FAN`
/// tasks of their own, spread over the devices.
fn fan_out<'scope>(
    s: &'scope NowaitScope<'scope, '_>,
    device: usize,
    depth: usize,
    count: &'scope AtomicUsize,
) -> offload::Result<()> {
    const FAN: usize = 3;
    let n = s.runtime().num_devices();
    for i in 0..FAN {
        s.compute((device + i) % n, &[], move |_| {
            count.fetch_add(1, Ordering::Relaxed);
            if depth > 1 {
                fan_out(s, device + i + 1, depth - 1, count)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// 16 threads, each opening scopes whose tasks queue tasks three levels deep: after each
/// scope every task has run.
#[test]
fn many_threads_open_scopes_of_nested_tasks() {
    const THREADS: usize = 16;
    const SCOPES: usize = 20;
    on_every_backend(
        "nowait stress",
        1,
        |b| b,
        |rt| {
            std::thread::scope(|threads| {
                let handles: Vec<_> = (0..THREADS)
                    .map(|t| {
                        threads.spawn(move || -> offload::Result<()> {
                            for _ in 0..SCOPES {
                                let count = AtomicUsize::new(0);
                                rt.nowait(|s| fan_out(s, t, 3, &count))??;
                                check_eq!(count.load(Ordering::Relaxed), 3 + 9 + 27);
                            }
                            Ok(())
                        })
                    })
                    .collect();
                handles.into_iter().try_for_each(|h| h.join().expect("a test thread panicked"))
            })
        },
    );
}

/// A task that does not run (its dependency failed) drops what its closure holds before
/// the scope can return: that may borrow the scope's data.
#[test]
fn a_task_that_does_not_run_drops_its_closure_before_the_scope_returns() {
    struct SetOnDrop<'a>(&'a AtomicBool);
    impl Drop for SetOnDrop<'_> {
        fn drop(&mut self) {
            // Slow, so that a drop after the scope's count-down would be seen late.
            std::thread::sleep(Duration::from_millis(20));
            self.0.store(true, Ordering::SeqCst);
        }
    }
    on_every_backend(
        "nowait: a skipped task's closure",
        1,
        |b| b,
        |rt| {
            for _ in 0..5 {
                let dropped = AtomicBool::new(false);
                let r = rt.nowait(|s| {
                    let failing = s.compute(0, &[], |_| {
                        Err(Error::InvalidArgument { routine: "test", what: "dependency failed".into() })
                    })?;
                    let guard = SetOnDrop(&dropped);
                    s.compute(0, &[&failing], move |_| {
                        let _held = &guard;
                        Ok(())
                    })?;
                    Ok::<(), Error>(())
                });
                check!(r.is_err(), "the failed dependency should fail the scope");
                check!(
                    dropped.load(Ordering::SeqCst),
                    "the skipped task's closure was dropped after the scope"
                );
            }
            Ok(())
        },
    );
}

/// An exit given a view of another device is refused before anything is queued: it would
/// copy that device's data back too, at the same time as that device's own exit.
#[test]
fn an_exit_refuses_a_view_of_another_device() {
    on_every_backend(
        "nowait: exit with another device's view",
        2,
        |b| b,
        |rt| {
            let mut x = vec![1i32; 64];
            let r = rt.nowait(|s| {
                let (t0, v0) = s.enter(0, map::tofrom(&mut x), &[])?;
                let e = s.exit(1, v0, &[&t0]);
                check!(
                    matches!(&e, Err(Error::InvalidArgument { what, .. }) if what.contains("view of device 0")
                        && what.contains("exit on device 1")),
                    "{e:?}"
                );
                s.exit(0, v0, &[&t0])?;
                Ok::<(), Error>(())
            });
            check!(matches!(r, Ok(Ok(()))), "{r:?}");
            check!(rt.live_mappings().is_empty());
            Ok(())
        },
    );
}

/// A scope that a task opens runs its tasks at once, on that task's thread (undeferred):
/// queued on a lane, one could wait behind work that waits for the task itself, on its own
/// lane, on another lane (the outer scope's exit after it) or on another device whose task
/// waits for this one. Each of those once hung; a scope opened on an ordinary thread still
/// queues, and may take work from any task.
#[test]
fn a_scope_opened_by_a_task_runs_its_tasks_at_once() {
    on_every_backend(
        "nowait: a scope opened by a task",
        1,
        |b| b,
        |rt| {
            // Its own lane.
            let r = rt.nowait(|s| {
                s.compute(0, &[], |_| rt.nowait(|s2| s2.compute(0, &[], |_| Ok(())).map(drop))?).map(drop)
            });
            check!(matches!(r, Ok(Ok(()))), "{r:?}");
            // Another lane, behind the outer scope's exit that waits for the opener.
            let mut x = vec![1i32; 16];
            let r = rt.nowait(|s| {
                let (t, v) = s.enter(0, map::tofrom(&mut x), &[])?;
                let k = s.compute(0, &[&t], |_| {
                    let mut y = vec![0i32; 16];
                    rt.nowait(|s2| {
                        let (t, v) = s2.enter(0, map::tofrom(&mut y), &[])?;
                        let k = s2.compute(0, &[&t], |_| Ok(()))?;
                        s2.exit(0, v, &[&k]).map(drop)
                    })??;
                    Ok(())
                })?;
                s.exit(0, v, &[&k]).map(drop)
            });
            check!(matches!(r, Ok(Ok(()))), "{r:?}");
            // Two devices whose tasks each open a scope on the other.
            if rt.num_devices() > 1 {
                let r = rt.nowait(|s| {
                    for d in 0..2 {
                        s.compute(d, &[], move |_| {
                            rt.nowait(|s2| s2.compute(1 - d, &[], |_| Ok(())).map(drop))?
                        })?;
                    }
                    Ok::<(), Error>(())
                });
                check!(matches!(r, Ok(Ok(()))), "{r:?}");
            }
            // A scope opened on an ordinary thread may take work from any task, on any lane:
            // here a task of an inner scope queues into the outer one on its own lane.
            let r = rt.nowait(|s1| {
                rt.nowait(|s2| s2.compute(0, &[], |_| s1.compute(0, &[], |_| Ok(())).map(drop)).map(drop))
            });
            check!(matches!(r, Ok(Ok(Ok(())))), "{r:?}");
            check!(rt.live_mappings().is_empty());
            Ok(())
        },
    );
}

#[test]
fn memset_and_rectangular_copies_are_tasks_too() {
    on_every_backend(
        "nowait memset and memcpy_rect",
        1,
        |b| b,
        |rt| {
            let host = rt.initial_device();
            for d in 0..rt.num_devices() {
                let p = rt.target_alloc(64, d)?;
                // A 2x3 block at (1, 1) of a 4x4 host matrix of u32, to a 2x3 device one.
                let src: Vec<u32> = (0..16).collect();
                let mut back = [0u32; 8];
                rt.nowait(|s| -> offload::Result<()> {
                    // SAFETY: `p` holds 64 bytes of `d`; `src` and `back` outlive the scope.
                    unsafe {
                        let zero = s.memset(p, 0xab, 64, d, &[])?;
                        let rect = s.memcpy_rect(
                            4,
                            &[2, 3],
                            offload::RectSide { ptr: p, device: d, offsets: &[0, 0], dimensions: &[2, 3] },
                            offload::RectSide {
                                ptr: src.as_ptr() as u64,
                                device: host,
                                offsets: &[1, 1],
                                dimensions: &[4, 4],
                            },
                            &[&zero],
                        )?;
                        s.memcpy(back.as_mut_ptr() as u64, p, 32, 0, 0, host, d, &[&rect])?;
                    }
                    Ok(())
                })??;
                check_eq!(back[..6], [5, 6, 7, 9, 10, 11]);
                check_eq!(back[6..], [0xabab_abab; 2]);
                // SAFETY: nothing uses `p` any more.
                unsafe { rt.target_free(p, d)? };
            }
            Ok(())
        },
    );
}

#[test]
fn a_task_waits_for_all_its_dependencies_even_after_one_failed() {
    on_every_backend(
        "nowait: every dependency awaited",
        1,
        |b| b,
        |rt| {
            let (slow_done, verdict) = (AtomicBool::new(false), AtomicBool::new(false));
            let x = [0i32; 4];
            let scope = rt.nowait(|s| -> offload::Result<()> {
                // One dependency fails at once (an exit of a range that must be present)...
                let (failing, xv) = s.enter(0, map::to(&x).present(), &[])?;
                // ...the other finishes later, on another lane.
                let slow = s.compute(0, &[], |_| {
                    std::thread::sleep(Duration::from_millis(100));
                    slow_done.store(true, Ordering::SeqCst);
                    Ok(())
                })?;
                // On a third lane (copy-out), so nothing but the dependencies holds it back.
                let dependent = s.exit(0, xv, &[&failing, &slow])?;
                // It fails (its dependency did), but only once both have finished.
                let failed = matches!(dependent.wait(), Err(Error::Dependency { .. }));
                verdict.store(failed && slow_done.load(Ordering::SeqCst), Ordering::SeqCst);
                Ok(())
            });
            // The scope's error is the first task's.
            check!(matches!(scope, Err(Error::NotPresent { .. })), "{scope:?}");
            check!(verdict.load(Ordering::SeqCst), "the dependent decided before every dependency finished");
            Ok(())
        },
    );
}

#[test]
fn what_a_scope_entered_and_never_exited_is_released_when_it_ends() {
    on_every_backend(
        "nowait: enter without exit",
        1,
        |b| b,
        |rt| {
            let x = vec![1i32; 64];
            let y = vec![2i32; 64];
            let r = rt.nowait(|s| -> offload::Result<()> {
                let (tx, xv) = s.enter(0, map::to(&x), &[])?;
                s.enter(0, map::to(&y), &[])?; // never exited
                s.exit(0, xv, &[&tx])?;
                Ok(())
            });
            let e = offload_tests::fails(r.and_then(|r| r), "an enter without an exit")?;
            check!(e.to_string().contains("never exited"), "{e}");
            check!(rt.live_mappings().is_empty(), "{:?}", rt.live_mappings());
            // A failed computation's plain exit does not run: the scope releases its range.
            let mut z = vec![0i32; 8];
            let r = rt.nowait(|s| -> offload::Result<()> {
                let (tz, zv) = s.enter(0, map::tofrom(&mut z), &[])?;
                let bad = s.compute(0, &[&tz], |_| {
                    Err(Error::InvalidArgument { routine: "test", what: "fails".into() })
                })?;
                s.exit(0, zv, &[&bad])?;
                Ok(())
            });
            check!(r.is_err());
            check!(rt.live_mappings().is_empty(), "{:?}", rt.live_mappings());
            Ok(())
        },
    );
}
