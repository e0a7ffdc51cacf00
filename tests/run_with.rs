//! `Pipeline::run_with`: per-device state handed to each compute (made once per device on
//! its compute lane, kept across its batches, dropped with the run whatever happened) and
//! batches with several outputs of their own element types, on every backend: results in
//! batch order, a failing or panicking batch named, nothing left mapped.

use std::sync::atomic::{AtomicUsize, Ordering};

use offload::pipeline::Pipeline;
use offload::{Device, Error, HostBuffer, MapType, Runtime};
use offload_tests::{assert_clean, check, check_eq, on_every_backend};

#[offload::kernel]
fn affine(i: usize, a: f32, b: f32, x: &[f32], y: &mut [f32]) {
    y[i] = a * x[i] + b;
}

#[offload::kernel]
fn classify(i: usize, x: &[f32], p: &mut [f32], class: &mut [u32]) {
    p[i] = 0.5 * x[i];
    class[i] = if x[i] > 100.0 { 1 } else { 0 };
}

const N: usize = 64;

/// Per device: how many states were made, how many dropped, and the batches the dropped
/// ones had seen.
#[derive(Default)]
struct Counts {
    made: [AtomicUsize; 2],
    dropped: [AtomicUsize; 2],
    batches: [AtomicUsize; 2],
}

/// A device's scratch: `N` elements mapped `alloc` on it (kernels write it through its
/// shared view), and the batches it served.
struct Scratch<'c> {
    device: usize,
    buf: HostBuffer<f32>,
    batches: usize,
    counts: &'c Counts,
}

impl<'c> Scratch<'c> {
    fn new(dev: &Device<'_>, counts: &'c Counts) -> offload::Result<Self> {
        let buf = HostBuffer::<f32>::new(dev.runtime(), N)?;
        buf.enter(dev.number(), MapType::ALLOC)?;
        counts.made[dev.number()].fetch_add(1, Ordering::Relaxed);
        Ok(Self { device: dev.number(), buf, batches: 0, counts })
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        self.counts.dropped[self.device].fetch_add(1, Ordering::Relaxed);
        self.counts.batches[self.device].fetch_add(self.batches, Ordering::Relaxed);
    }
}

fn inputs(n: usize) -> Vec<Vec<f32>> {
    (0..n).map(|b| (0..N).map(|i| (b * N + i) as f32).collect()).collect()
}

/// The pipeline's devices: two where the backend has them.
fn devices(rt: &Runtime) -> Vec<usize> {
    (0..rt.num_devices().min(2)).collect()
}

#[test]
fn per_device_scratch_is_made_once_kept_across_batches_and_released_on_every_backend() {
    on_every_backend(
        "pipeline with per-device scratch",
        1,
        |b| b,
        |rt| {
            let devices = devices(rt);
            let counts = Counts::default();
            let x = inputs(20);
            let mut y = vec![vec![0f32; N]; 20];
            let init = |dev: &Device<'_>| Scratch::new(dev, &counts);
            let report =
                Pipeline::new(rt, &devices, 2)?.run_with(&x, &mut y, init, |dev, scratch, _, x, y| {
                    if scratch.device != dev.number() {
                        return Err(Error::InvalidArgument {
                            routine: "compute",
                            what: format!(
                                "device {}'s compute got device {}'s state",
                                dev.number(),
                                scratch.device
                            ),
                        });
                    }
                    scratch.batches += 1;
                    // x -> scratch -> y, the scratch never leaving the device.
                    let h = scratch.buf.shared_view(dev.number());
                    affine::launch(dev, N, 1.0, 1.0, x, h)?;
                    affine::launch(dev, N, 2.0, 0.0, h, y)
                })?;
            for (b, (xb, yb)) in x.iter().zip(&y).enumerate() {
                check!(xb.iter().zip(yb).all(|(x, y)| *y == 2.0 * (x + 1.0)), "batch {b}: {yb:?}");
            }
            check_eq!(report.batches_per_device.iter().sum::<usize>(), 20);
            for (k, &d) in devices.iter().enumerate() {
                let ran = report.batches_per_device[k];
                let made = counts.made[d].load(Ordering::Relaxed);
                check_eq!(made, usize::from(ran > 0));
                check_eq!(counts.dropped[d].load(Ordering::Relaxed), made);
                check_eq!(counts.batches[d].load(Ordering::Relaxed), ran);
                assert_clean(rt, d)?;
            }
            Ok(())
        },
    );
}

#[test]
fn state_is_dropped_and_unmapped_when_a_batch_panics_or_init_fails() {
    on_every_backend(
        "pipeline state on failure",
        1,
        |b| b,
        |rt| {
            let devices = devices(rt);
            let counts = Counts::default();
            let x = inputs(12);
            let mut y = vec![vec![-1f32; N]; 12];
            let init = |dev: &Device<'_>| Scratch::new(dev, &counts);
            let r =
                Pipeline::new(rt, &devices, 2)?.run_with(&x, &mut y, init, |dev, scratch, batch, x, y| {
                    assert!(batch != 3, "no state can take batch {batch}");
                    let h = scratch.buf.shared_view(dev.number());
                    affine::launch(dev, N, 1.0, 1.0, x, h)?;
                    affine::launch(dev, N, 2.0, 0.0, h, y)
                });
            match &r {
                Err(e @ Error::Batch { batch: 3, source }) => {
                    check!(matches!(**source, Error::Panicked { .. }), "{source:?}");
                    check!(e.to_string().contains("no state can take batch 3"), "{e}");
                }
                other => check!(false, "expected batch 3 to fail with its panic, got {other:?}"),
            }
            check!(y[3].iter().all(|&v| v == -1.0), "the failed batch was copied back");
            for &d in &devices {
                check_eq!(counts.dropped[d].load(Ordering::Relaxed), counts.made[d].load(Ordering::Relaxed));
                assert_clean(rt, d)?;
            }

            // A state that cannot be made fails the first batch of its device, named.
            let last = *devices.last().unwrap_or(&0);
            let init = |dev: &Device<'_>| {
                if dev.number() == last {
                    return Err(Error::InvalidArgument {
                        routine: "init",
                        what: format!("device {last} has no room for scratch"),
                    });
                }
                Scratch::new(dev, &counts)
            };
            let r = Pipeline::new(rt, &[last], 2)?.run_with(&x, &mut y, init, |_, _, _, _, _| Ok(()));
            match &r {
                Err(e @ Error::Batch { batch: 0, .. }) => {
                    check!(e.to_string().contains(&format!("device {last} has no room")), "{e}")
                }
                other => check!(false, "expected batch 0 to fail in init, got {other:?}"),
            }
            for &d in &devices {
                assert_clean(rt, d)?;
            }
            Ok(())
        },
    );
}

#[test]
fn two_outputs_of_their_own_types_come_back_in_batch_order_on_every_backend() {
    on_every_backend(
        "pipeline with two outputs",
        1,
        |b| b,
        |rt| {
            let devices = devices(rt);
            let x = inputs(10);
            let mut out: Vec<(Vec<f32>, Vec<u32>)> = vec![(vec![0.0; N], vec![7; N]); 10];
            let report = Pipeline::new(rt, &devices, 3)?.run_with(
                &x,
                &mut out,
                |_| Ok(()),
                |dev, _, _, x, (p, class)| classify::launch(dev, N, x, p, class),
            )?;
            check_eq!(report.batches_per_device.iter().sum::<usize>(), 10);
            for (b, (xb, (p, class))) in x.iter().zip(&out).enumerate() {
                check!(xb.iter().zip(p).all(|(x, p)| *p == 0.5 * x), "batch {b}: {p:?}");
                check!(
                    xb.iter().zip(class).all(|(x, c)| *c == u32::from(*x > 100.0)),
                    "batch {b}: {class:?}"
                );
            }
            // Three outputs, one of them a slice borrowed from elsewhere.
            let mut third = vec![vec![0f32; N]; 10];
            let mut three: Vec<(Vec<f32>, Vec<u32>, &mut [f32])> = out
                .iter()
                .cloned()
                .zip(third.iter_mut())
                .map(|((p, c), t)| (p, c, t.as_mut_slice()))
                .collect();
            Pipeline::new(rt, &devices, 2)?.run_with(
                &x,
                &mut three,
                |_| Ok(()),
                |dev, _, _, x, (p, c, t)| {
                    classify::launch(dev, N, x, p, c)?;
                    affine::launch(dev, N, -1.0, 0.0, x, t)
                },
            )?;
            check!(third.iter().zip(&x).all(|(t, x)| t.iter().zip(x).all(|(t, x)| *t == -x)));
            for &d in &devices {
                assert_clean(rt, d)?;
            }
            Ok(())
        },
    );
}

#[test]
fn a_failing_batch_of_two_outputs_is_named_and_copies_neither_back() {
    on_every_backend(
        "pipeline with two outputs, failing",
        1,
        |b| b,
        |rt| {
            let devices = devices(rt);
            let x = inputs(12);
            let mut out: Vec<(Vec<f32>, Vec<u32>)> = vec![(vec![-1.0; N], vec![7; N]); 12];
            let r = Pipeline::new(rt, &devices, 2)?.run_with(
                &x,
                &mut out,
                |_| Ok(()),
                |dev, _, batch, x, (p, class)| {
                    if batch == 5 {
                        return Err(Error::InvalidArgument {
                            routine: "test",
                            what: "batch 5 is bad".into(),
                        });
                    }
                    classify::launch(dev, N, x, p, class)
                },
            );
            match &r {
                Err(e @ Error::Batch { batch: 5, source }) => {
                    check!(source.to_string().contains("batch 5 is bad"), "{e}")
                }
                other => check!(false, "expected batch 5 to fail, got {other:?}"),
            }
            check!(out[5].0.iter().all(|&v| v == -1.0) && out[5].1.iter().all(|&v| v == 7));
            for &d in &devices {
                assert_clean(rt, d)?;
            }
            Ok(())
        },
    );
}
