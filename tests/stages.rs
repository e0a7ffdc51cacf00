//! `pipeline::StagePipeline`: a model split into stages over devices, micro-batches flowing
//! stage to stage: outputs in micro-batch order on every backend, hand-offs by peer copy
//! and staged through the host (and none between stages of one device), the first failing
//! micro-batch stopping the pipe and naming its stage, a panic as an error, nothing left
//! mapped, and bad input refused; stages whose element types change ([`StageChain`]) and a
//! last stage of several outputs.

use offload::half::bf16;
use offload::pipeline::{Intake, ServeConfig, Stage, StageChain, StagePipeline};
use offload::{Error, Runtime};
use offload_tests::{check, check_eq, on_every_backend, synchronous};

#[offload::kernel]
fn plus(i: usize, v: f32, x: &[f32], y: &mut [f32]) {
    y[i] = x[i] + v;
}

#[offload::kernel]
fn times(i: usize, v: f32, x: &[f32], y: &mut [f32]) {
    y[i] = x[i] * v;
}

/// Three stages: `+1` on `a`, `x 2` on `b`, `+3` on `a` again, 64 elements through.
fn three<'f>(a: usize, b: usize) -> Vec<Stage<'f, f32>> {
    vec![
        Stage::new(a, 64, |dev, _, x, y| plus::launch(dev, 64, 1.0, x, y)),
        Stage::new(b, 64, |dev, _, x, y| times::launch(dev, 64, 2.0, x, y)),
        Stage::new(a, 64, |dev, _, x, y| plus::launch(dev, 64, 3.0, x, y)),
    ]
}

fn inputs(n: usize) -> Vec<Vec<f32>> {
    (0..n).map(|b| (0..64).map(|i| (b * 100 + i) as f32).collect()).collect()
}

fn expected(x: f32) -> f32 {
    (x + 1.0) * 2.0 + 3.0
}

#[test]
fn micro_batches_come_out_in_order_on_every_backend() {
    on_every_backend(
        "stage pipeline",
        1,
        |b| b,
        |rt| {
            // Two devices when there are, else both stages on the one.
            let (a, b) = (0, 1 % rt.num_devices());
            let x = inputs(20);
            let mut y = vec![vec![0f32; 64]; 20];
            let report = StagePipeline::new(rt, three(a, b), 3)?.run(&x, &mut y)?;
            for (xb, yb) in x.iter().zip(&y) {
                check!(xb.iter().zip(yb).all(|(x, y)| *y == expected(*x)), "{yb:?}");
            }
            check_eq!(report.micro_batches, 20);
            check_eq!(report.hand_offs, if a == b { 0 } else { 40 });
            check!(rt.live_mappings().is_empty());
            // A second run through the same pipe (its scratch kept mapped meanwhile).
            let mut p = StagePipeline::new(rt, three(a, b), 3)?;
            let mut again = vec![vec![0f32; 64]; 20];
            p.run(&x, &mut again)?;
            p.run(&x, &mut again)?;
            check!(again == y);
            check!(!rt.live_mappings().is_empty(), "the scratch stays mapped while the pipe lives");
            drop(p);
            check!(rt.live_mappings().is_empty());
            Ok(())
        },
    );
}

#[test]
fn hand_offs_by_peer_copy_and_staged_through_the_host_give_the_same() -> offload::Result<()> {
    for peer in [true, false] {
        let rt = Runtime::builder()
            .env(|_| None)
            .gpus(false)
            .host_devices(2)
            .peer_access(peer)
            .synchronous(synchronous())
            .build()?;
        let x = inputs(9);
        let mut y = vec![vec![0f32; 64]; 9];
        let report = StagePipeline::new(&rt, three(0, 1), 2)?.run(&x, &mut y)?;
        assert_eq!(report.hand_offs, 18, "peer access {peer}");
        assert!(
            x.iter().zip(&y).all(|(xb, yb)| xb.iter().zip(yb).all(|(x, y)| *y == expected(*x))),
            "peer {peer}"
        );
        let copies = rt.transfer_stats(1)?;
        // Into device 1: one hand-off per micro-batch, direct (peer) or staged.
        assert_eq!(if peer { copies.direct } else { copies.staged }, 9, "peer access {peer}: {copies:?}");
        assert!(rt.live_mappings().is_empty());
    }
    Ok(())
}

/// A runtime of two host devices, whatever the environment.
fn two() -> offload::Result<Runtime> {
    Runtime::builder().env(|_| None).gpus(false).host_devices(2).synchronous(synchronous()).build()
}

#[test]
fn the_first_failing_micro_batch_stops_the_pipe_and_names_its_stage() -> offload::Result<()> {
    let rt = two()?;
    let stages = vec![
        Stage::new(0, 64, |dev, _, x, y| plus::launch(dev, 64, 1.0, x, y)),
        Stage::new(1, 64, |dev, mb, x, y| {
            if mb == 5 {
                return Err(Error::InvalidArgument {
                    routine: "stage",
                    what: "micro-batch 5 refused".into(),
                });
            }
            times::launch(dev, 64, 2.0, x, y)
        }),
    ];
    let x = inputs(12);
    let mut y = vec![vec![-1f32; 64]; 12];
    let e = StagePipeline::new(&rt, stages, 2)?.run(&x, &mut y).expect_err("micro-batch 5 fails");
    match &e {
        Error::Batch { batch: 5, source } => match &**source {
            Error::Stage { stage: 1, device: 1, source } => {
                assert!(source.to_string().contains("micro-batch 5 refused"), "{e}")
            }
            other => panic!("expected stage 1's error, got {other:?}"),
        },
        other => panic!("expected micro-batch 5's error, got {other:?}"),
    }
    assert!(e.to_string().contains("batch 5 failed: stage 1 (device 1) failed"), "{e}");
    // Those before it came out; it did not, nor did any after the pipe stopped.
    for b in 0..5 {
        assert!(x[b].iter().zip(&y[b]).all(|(x, y)| *y == (x + 1.0) * 2.0), "micro-batch {b}");
    }
    assert!(y[5].iter().all(|&v| v == -1.0));
    assert!(y[8..].iter().all(|yb| yb.iter().all(|&v| v == -1.0)), "the pipe went on");
    assert!(rt.live_mappings().is_empty(), "{:?}", rt.live_mappings());
    Ok(())
}

#[test]
fn a_panicking_stage_is_an_error_and_leaves_nothing_mapped() -> offload::Result<()> {
    let rt = two()?;
    let stages = vec![
        Stage::new(0, 64, |dev, mb, x, y| {
            assert!(mb != 2, "stage 0 cannot take micro-batch 2");
            plus::launch(dev, 64, 1.0, x, y)
        }),
        Stage::new(1, 64, |dev, _, x, y| times::launch(dev, 64, 2.0, x, y)),
    ];
    let x = inputs(6);
    let mut y = vec![vec![0f32; 64]; 6];
    let e = StagePipeline::new(&rt, stages, 2)?.run(&x, &mut y).expect_err("micro-batch 2 panics");
    assert!(matches!(&e, Error::Batch { batch: 2, .. }), "{e}");
    assert!(matches!(e.cause(), Error::Panicked { .. }), "{e}");
    assert!(e.to_string().contains("cannot take micro-batch 2"), "{e}");
    assert!(rt.live_mappings().is_empty());
    Ok(())
}

#[test]
fn bad_input_is_refused_before_anything_runs() -> offload::Result<()> {
    let rt = two()?;
    let one = || vec![Stage::new(0, 64, |dev, _, x, y| plus::launch(dev, 64, 1.0, x, y))];
    let e = StagePipeline::<f32>::new(&rt, Vec::new(), 2).expect_err("no stages");
    assert!(e.to_string().contains("no stages"), "{e}");
    let e = StagePipeline::new(&rt, one(), 0).expect_err("nothing in flight");
    assert!(e.to_string().contains("0 micro-batches in flight"), "{e}");
    let empty = vec![Stage::new(0, 0, |dev, _, x, y| plus::launch(dev, 0, 1.0, x, y))];
    let e = StagePipeline::new(&rt, empty, 2).expect_err("an empty stage");
    assert!(e.to_string().contains("stage 0 makes 0 elements"), "{e}");
    let bad = vec![Stage::new(7, 64, |dev, _, x, y| plus::launch(dev, 64, 1.0, x, y))];
    assert!(matches!(StagePipeline::new(&rt, bad, 2), Err(Error::NoSuchDevice { device: 7, .. })));
    let mut p = StagePipeline::new(&rt, one(), 2)?;
    let x = inputs(2);
    let e = p.run(&x, &mut vec![vec![0f32; 64]; 3]).expect_err("3 outputs for 2 inputs");
    assert!(e.to_string().contains("2 input micro-batches but 3 outputs"), "{e}");
    let e = p.run(&x, &mut [vec![0f32; 64], vec![0f32; 63]]).expect_err("a short output");
    assert!(e.to_string().contains("output 1 has 63 elements; the last stage makes 64"), "{e}");
    assert!(rt.live_mappings().is_empty());
    Ok(())
}

/// A pipeline whose boundaries do not fit fails to build and leaves nothing mapped (it once
/// left the boundaries mapped so far, keyed by freed memory).
#[test]
fn a_pipeline_that_cannot_map_its_boundaries_leaves_nothing_mapped() -> offload::Result<()> {
    let rt = Runtime::builder()
        .env(|_| None)
        .gpus(false)
        .host_devices(2)
        .host_device_memory(3 * 4096)
        .synchronous(synchronous())
        .build()?;
    let stages = vec![
        Stage::new(0, 1024, |dev, _, x, y| plus::launch(dev, 1024, 1.0, x, y)),
        Stage::new(1, 1024, |dev, _, x, y| times::launch(dev, 1024, 2.0, x, y)),
    ];
    let r = StagePipeline::new(&rt, stages, 4);
    check!(
        matches!(&r, Err(e) if offload_tests::cause(e.clone()).to_string().contains("out of memory")),
        "{:?}",
        r.as_ref().err()
    );
    drop(r);
    check!(rt.live_mappings().is_empty(), "left mapped: {:?}", rt.live_mappings());
    for d in 0..2 {
        check_eq!(rt.pool_usage(d)?.live_allocations, 0);
    }
    Ok(())
}

#[offload::kernel]
fn to_bf16_plus(i: usize, v: f32, x: &[f32], y: &mut [bf16]) {
    y[i] = bf16::from_f32(x[i] + v);
}

#[offload::kernel]
fn bf16_times(i: usize, v: f32, x: &[bf16], y: &mut [bf16]) {
    y[i] = bf16::from_f32(x[i].to_f32() * v);
}

/// Each micro-batch's 64 values: their share of the sum (f32) and the index of the largest
/// (u32), from bf16.
#[offload::kernel]
fn shares_and_best(_i: usize, x: &[bf16], share: &mut [f32], best: &mut [u32]) {
    let mut sum = 0.0f32;
    let mut b = 0usize;
    for j in 0usize..64 {
        sum += x[j].to_f32();
        if x[j].to_f32() > x[b].to_f32() {
            b = j;
        }
    }
    for j in 0usize..64 {
        share[j] = x[j].to_f32() / sum;
    }
    best[0] = b as u32;
}

/// f32 in, bf16 between stages (which the compiler checks link up), f32 shares and a u32
/// class out of the last stage, on two devices where there are: each micro-batch's
/// outputs as the host computes them, in order, with the hand-offs counted.
#[test]
fn stages_of_different_types_and_a_last_stage_of_several_outputs_on_every_backend() {
    on_every_backend(
        "mixed-type stage pipeline",
        1,
        |b| b,
        |rt| {
            let (a, b) = (0, 1 % rt.num_devices());
            let mut pipe =
                StageChain::new(Stage::new(a, 64, |dev, _, x, y| to_bf16_plus::launch(dev, 64, 0.5, x, y)))
                    .then(Stage::new(b, 64, |dev, _, x, y| bf16_times::launch(dev, 64, 2.0, x, y)))
                    .build_outputs::<(f32, u32)>(rt, 3, a, (64, 1), |dev, _, x, (share, best)| {
                        shares_and_best::launch(dev, 1, x, share, best)
                    })?;
            let x = inputs(9);
            let mut y: Vec<(Vec<f32>, Vec<u32>)> = vec![(vec![0.0; 64], vec![99]); 9];
            let report = pipe.run(&x, &mut y)?;
            for (xb, (share, best)) in x.iter().zip(&y) {
                let h: Vec<f32> = xb
                    .iter()
                    .map(|&v| bf16::from_f32(bf16::from_f32(v + 0.5).to_f32() * 2.0).to_f32())
                    .collect();
                let sum: f32 = h.iter().sum();
                // The same sum in the same order; the quotients within an ulp.
                check!(
                    share.iter().zip(&h).all(|(s, v)| (s - v / sum).abs() <= f32::EPSILON * (v / sum).abs()),
                    "{share:?}"
                );
                let want = (0..64).fold(0, |b, j| if h[j] > h[b] { j } else { b });
                check_eq!(*best, vec![want as u32]);
            }
            check_eq!(report.micro_batches, 9);
            check_eq!(report.hand_offs, if a == b { 0 } else { 18 });
            drop(pipe);
            check!(rt.live_mappings().is_empty());

            // One output: `build`, bf16 out.
            let mut pipe =
                StageChain::new(Stage::new(b, 64, |dev, _, x, y| to_bf16_plus::launch(dev, 64, 1.0, x, y)))
                    .build(rt, 2)?;
            let mut out = vec![vec![bf16::ZERO; 64]; 3];
            pipe.run(&x[..3], &mut out)?;
            for (xb, yb) in x.iter().zip(&out) {
                check_eq!(*yb, xb.iter().map(|&v| bf16::from_f32(v + 1.0)).collect::<Vec<_>>());
            }
            Ok(())
        },
    );
}

/// A last stage of several outputs: an output of the wrong length is named by micro-batch
/// and position, one of no elements refused when the pipe is built.
#[test]
fn several_outputs_are_checked_by_position() -> offload::Result<()> {
    let rt = two()?;
    let chain =
        || StageChain::new(Stage::new(0, 64, |dev, _, x, y| to_bf16_plus::launch(dev, 64, 0.5, x, y)));
    fn last(
        dev: &offload::Device<'_>,
        _: usize,
        x: offload::DeviceSlice<'_, bf16>,
        (share, best): (offload::DeviceSlice<'_, f32>, offload::DeviceSlice<'_, u32>),
    ) -> offload::Result<()> {
        shares_and_best::launch(dev, 1, x, share, best)
    }
    let e = chain().build_outputs::<(f32, u32)>(&rt, 2, 1, (64, 0), last).expect_err("an empty output");
    assert!(e.to_string().contains("stage 1's output 1 makes 0 elements"), "{e}");
    let mut pipe = chain().build_outputs::<(f32, u32)>(&rt, 2, 1, (64, 1), last)?;
    let x = inputs(2);
    let mut y = vec![(vec![0f32; 64], vec![0u32; 1]), (vec![0f32; 64], vec![0u32; 2])];
    let e = pipe.run(&x, &mut y).expect_err("a long second output");
    assert!(e.to_string().contains("output 1.1 has 2 elements; the last stage makes 1"), "{e}");
    drop(pipe);
    assert!(rt.live_mappings().is_empty());
    Ok(())
}

/// Requests of one to four rows of 16 served through a stage chain (f32 in, bf16 between,
/// f32 shares and a u32 class out) from three threads, the intake bounded: every request
/// gets its own rows, and the report counts every request.
#[test]
fn a_stage_pipeline_serves_requests_of_many_rows_on_every_backend() {
    on_every_backend(
        "serving a stage pipeline",
        1,
        |b| b,
        |rt| {
            let (a, b) = (0, 1 % rt.num_devices());
            let (rows, row) = (4, 16);
            let n = rows * row;
            let mut pipe = StageChain::new(Stage::new(a, n, move |dev, _, x, y| {
                to_bf16_plus::launch(dev, n, 0.0, x, y)
            }))
            .then(Stage::new(b, n, move |dev, _, x, y| bf16_times::launch(dev, n, 1.0, x, y)))
            .build_outputs::<(f32, u32)>(
                rt,
                2,
                a,
                (row * rows, rows),
                move |dev, _, x, (share, best)| row_stats::launch(dev, rows, x, share, best),
            )?;
            let config = ServeConfig {
                in_row: row,
                out_row: (row, 1),
                max_rows: rows,
                deadline: std::time::Duration::from_millis(1),
                max_queued: Some(4),
            };
            let request = |c: usize, i: usize| -> Vec<f32> {
                let k = 1 + (c + i) % rows;
                (0..k * row).map(|j| ((c * 1000 + i * 50 + j) % 97) as f32).collect()
            };
            let (answers, report) = pipe.serve(config, |intake: &Intake<'_, f32, (f32, u32)>| {
                std::thread::scope(|t| {
                    let clients: Vec<_> = (0..3)
                        .map(|c| {
                            t.spawn(move || {
                                let tickets = (0..8)
                                    .map(|i| intake.submit_rows(request(c, i)))
                                    .collect::<offload::Result<Vec<_>>>()?;
                                tickets.into_iter().map(|t| t.wait()).collect::<offload::Result<Vec<_>>>()
                            })
                        })
                        .collect();
                    clients.into_iter().map(|c| c.join().expect("a client")).collect::<Vec<_>>()
                })
            })?;
            for (c, answers) in answers.into_iter().enumerate() {
                for (i, (share, best)) in answers?.into_iter().enumerate() {
                    let x = request(c, i);
                    check_eq!(best.len(), x.len() / row);
                    for (r, xr) in x.chunks(row).enumerate() {
                        let h: Vec<f32> = xr.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
                        let sum: f32 = h.iter().sum();
                        let want = (0..row).fold(0, |b, j| if h[j] > h[b] { j } else { b });
                        check_eq!(best[r], want as u32);
                        let s = &share[r * row..(r + 1) * row];
                        check!(s
                            .iter()
                            .zip(&h)
                            .all(|(s, v)| (s - v / sum).abs() <= f32::EPSILON * (v / sum).abs()));
                    }
                }
            }
            check_eq!(report.requests, 24);
            check_eq!(report.batches_per_device, vec![report.batches()]);
            check!(report.batch_rows.iter().all(|&r| (1..=rows).contains(&r)));
            drop(pipe);
            check!(rt.live_mappings().is_empty());
            Ok(())
        },
    );
}

/// Each row of 16 of `x`: its share of the row's sum (f32) and the index of its largest
/// (u32).
#[offload::kernel]
fn row_stats(r: usize, x: &[bf16], share: &mut [f32], best: &mut [u32]) {
    let mut sum = 0.0f32;
    let mut b = 0usize;
    for j in 0usize..16 {
        sum += x[r * 16 + j].to_f32();
        if x[r * 16 + j].to_f32() > x[r * 16 + b].to_f32() {
            b = j;
        }
    }
    for j in 0usize..16 {
        share[r * 16 + j] = x[r * 16 + j].to_f32() / sum;
    }
    best[r] = b as u32;
}

/// A failing micro-batch fails its own batch's requests alone: the first batch through the
/// pipe fails, every request of the others is answered, and the server goes on.
#[test]
fn a_failing_micro_batch_fails_only_its_requests() -> offload::Result<()> {
    let rt = two()?;
    let failed_once = std::sync::atomic::AtomicBool::new(false);
    let stages = vec![
        Stage::new(0, 64, |dev, _, x, y| plus::launch(dev, 64, 1.0, x, y)),
        Stage::new(1, 64, |dev, _, x, y| {
            if !failed_once.swap(true, std::sync::atomic::Ordering::AcqRel) {
                return Err(Error::InvalidArgument {
                    routine: "stage",
                    what: "the first batch refused".into(),
                });
            }
            times::launch(dev, 64, 2.0, x, y)
        }),
    ];
    let config = ServeConfig {
        in_row: 16,
        out_row: 16,
        max_rows: 4,
        deadline: std::time::Duration::from_millis(1),
        max_queued: None,
    };
    let (answers, report) =
        StagePipeline::new(&rt, stages, 2)?.serve(config, |intake: &Intake<'_, f32, f32>| {
            let tickets: Vec<_> =
                (0..10).map(|i| intake.submit(vec![i as f32; 16])).collect::<offload::Result<_>>()?;
            Ok::<_, Error>(tickets.into_iter().map(|t| t.answer()).collect::<Vec<_>>())
        })?;
    let answers = answers?;
    assert_eq!(report.failed_batches.len(), 1, "{report:?}");
    let failed = report.failed_batches[0];
    for (i, a) in answers.iter().enumerate() {
        match a {
            Ok(a) => assert_eq!(a.row, vec![(i as f32 + 1.0) * 2.0; 16], "request {i}"),
            Err(e) => {
                assert!(matches!(e, Error::Batch { batch, .. } if *batch == failed), "{e}");
                assert!(e.to_string().contains("the first batch refused"), "{e}");
            }
        }
    }
    assert!(answers.iter().any(|a| a.is_ok()) && answers.iter().any(|a| a.is_err()));
    assert_eq!(report.requests, 10);
    assert!(rt.live_mappings().is_empty());
    Ok(())
}
