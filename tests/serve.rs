//! `Pipeline::serve`: requests from several threads batched by size and deadline (and a
//! ready batch growing while every slot is busy), each request's result back to its
//! submitter, a failing (or panicking) batch failing only its own requests, shutdown
//! draining what is pending, the report's counts, and nothing left mapped, on every
//! backend; requests of many rows, each run whole in one batch, and a bounded intake that
//! refuses or waits. Batch counts are asserted where they are determined (submit,
//! then wait), not speeds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use offload::pipeline::{Answer, Intake, Pipeline, ServeConfig, ServeReport, Submitted};
use offload::{Device, DeviceSlice, Error, HostBuffer, MapType, Result, Runtime};
use offload_tests::{assert_clean, check, check_eq, on_every_backend};

#[offload::kernel]
fn affine(i: usize, a: f32, b: f32, x: &[f32], y: &mut [f32]) {
    y[i] = a * x[i] + b;
}

const ROW: usize = 16;
const LONG: Duration = Duration::from_secs(60);

fn config(max_rows: usize, deadline: Duration) -> ServeConfig {
    ServeConfig { in_row: ROW, out_row: ROW, max_rows, deadline, max_queued: None }
}

fn row(client: usize, i: usize) -> Vec<f32> {
    (0..ROW).map(|j| (client * 10_000 + i * ROW + j) as f32).collect()
}

fn expected(x: &[f32]) -> Vec<f32> {
    x.iter().map(|x| 2.0 * (x + 1.0)).collect()
}

/// Serves `clients` on up to two devices of `rt`: each batch `x -> +1 -> scratch -> x2 ->
/// y`, the scratch per device; batches in `failing` fail, those in `panicking` panic.
fn serve<R>(
    rt: &Runtime,
    config: ServeConfig,
    failing: &[usize],
    panicking: &[usize],
    clients: impl FnOnce(&Intake<'_, f32, f32>) -> R,
) -> Result<(R, ServeReport)> {
    let devices: Vec<usize> = (0..rt.num_devices().min(2)).collect();
    let max = config.max_rows;
    let scratch = |dev: &Device<'_>| {
        let h = HostBuffer::<f32>::new(dev.runtime(), max * ROW)?;
        h.enter(dev.number(), MapType::ALLOC)?;
        Ok(h)
    };
    let served = Pipeline::new(rt, &devices, 2)?.serve(
        config,
        scratch,
        |dev, h, batch, rows, x, y| {
            if failing.contains(&batch) {
                return Err(Error::InvalidArgument {
                    routine: "compute",
                    what: format!("batch {batch} is bad"),
                });
            }
            assert!(!panicking.contains(&batch), "compute gave up on batch {batch}");
            let h = h.shared_view(dev.number()).slice(..rows * ROW)?;
            affine::launch(dev, rows * ROW, 1.0, 1.0, x, h)?;
            affine::launch(dev, rows * ROW, 2.0, 0.0, h, y)
        },
        clients,
    )?;
    for d in devices {
        assert_clean(rt, d)?;
    }
    Ok(served)
}

/// Submits every row, then waits for each answer, in order.
fn submit_then_wait(intake: &Intake<'_, f32, f32>, rows: &[Vec<f32>]) -> Result<Vec<Answer<f32>>> {
    let tickets = rows.iter().map(|r| intake.submit(r.clone())).collect::<Result<Vec<_>>>()?;
    tickets.into_iter().map(|t| t.answer()).collect()
}

#[test]
fn requests_from_several_threads_get_their_own_results_on_every_backend() {
    on_every_backend(
        "serving several threads",
        1,
        |b| b,
        |rt| {
            let (per_client, report) = serve(rt, config(8, Duration::from_millis(2)), &[], &[], |intake| {
                std::thread::scope(|t| {
                    let clients: Vec<_> = (0..4)
                        .map(|c| {
                            t.spawn(move || -> Result<Vec<(Vec<f32>, Answer<f32>)>> {
                                let mut got = Vec::new();
                                for round in 0..5 {
                                    let rows: Vec<Vec<f32>> = (0..5).map(|i| row(c, round * 5 + i)).collect();
                                    got.extend(
                                        rows.clone().into_iter().zip(submit_then_wait(intake, &rows)?),
                                    );
                                }
                                Ok(got)
                            })
                        })
                        .collect();
                    let joined: Vec<_> = clients.into_iter().map(|c| c.join()).collect();
                    joined
                })
            })?;
            let mut per_batch: BTreeMap<usize, usize> = BTreeMap::new();
            for client in per_client {
                let answers = client.unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                check_eq!(answers.len(), 25);
                for (x, a) in answers {
                    check!(a.row == expected(&x), "request {x:?} got {:?}", a.row);
                    *per_batch.entry(a.batch).or_default() += 1;
                }
            }
            check_eq!(report.requests, 100);
            check_eq!(report.batch_rows.iter().sum::<usize>(), 100);
            check!(report.batch_rows.iter().all(|&r| (1..=8).contains(&r)), "{:?}", report.batch_rows);
            // Every answer names its batch, and every batch had the rows the report says.
            let from_answers: Vec<usize> =
                (0..report.batches()).map(|b| per_batch.remove(&b).unwrap_or(0)).collect();
            check_eq!(from_answers, report.batch_rows);
            check!(per_batch.is_empty(), "answers name batches never formed: {per_batch:?}");
            check!(report.failed_batches.is_empty(), "{:?}", report.failed_batches);
            check_eq!(report.batches_per_device.iter().sum::<usize>(), report.batches());
            let l = report.latency;
            check!(l.median <= l.p99 && l.p99 <= l.max && l.max > Duration::ZERO, "{l:?}");
            Ok(())
        },
    );
}

#[test]
fn a_deadline_runs_a_partial_batch() {
    on_every_backend(
        "serving a partial batch",
        1,
        |b| b,
        |rt| {
            // Long enough that the three requests below reach the batch before it closes,
            // however a loaded machine schedules the submitting thread.
            let deadline = Duration::from_secs(1);
            let (waited, report) = serve(rt, config(8, deadline), &[], &[], |intake| -> Result<_> {
                // A first batch of one, so that what is timed below runs compiled kernels.
                submit_then_wait(intake, &[row(0, 0)])?;
                let rows: Vec<Vec<f32>> = (1..4).map(|i| row(0, i)).collect();
                let start = Instant::now();
                let answers = submit_then_wait(intake, &rows)?;
                Ok((start.elapsed(), answers))
            })?;
            let (waited, answers) = waited?;
            check!(answers.iter().all(|a| a.batch == 1), "{answers:?}");
            check_eq!(report.batch_rows, vec![1, 3]);
            // The batch started at its deadline: not before (nothing else starts it), and
            // without waiting to be full (it never would be: it would wait until shutdown).
            check!(answers[0].latency >= deadline, "{:?}", answers[0].latency);
            check!(waited < LONG / 2, "3 requests took {waited:?}");
            for (i, a) in answers.iter().enumerate() {
                check!(a.row == expected(&row(0, i + 1)), "request {i}: {:?}", a.row);
            }
            Ok(())
        },
    );
}

#[test]
fn full_batches_start_without_waiting_for_the_deadline() {
    on_every_backend(
        "serving full batches",
        1,
        |b| b,
        |rt| {
            // `Duration::MAX`: no deadline at all (it cannot be added to an instant).
            for deadline in [LONG, Duration::MAX] {
                let start = Instant::now();
                let rows: Vec<Vec<f32>> = (0..8).map(|i| row(1, i)).collect();
                let (answers, report) =
                    serve(rt, config(4, deadline), &[], &[], |intake| submit_then_wait(intake, &rows))?;
                let answers = answers?;
                check_eq!(report.batch_rows, vec![4, 4]);
                let batches: Vec<usize> = answers.iter().map(|a| a.batch).collect();
                check_eq!(batches, vec![0, 0, 0, 0, 1, 1, 1, 1]);
                check!(answers.iter().zip(&rows).all(|(a, x)| a.row == expected(x)));
                check!(start.elapsed() < LONG / 2, "full batches waited for their deadline {deadline:?}");
            }
            Ok(())
        },
    );
}

#[test]
fn shutdown_runs_the_pending_requests_at_once() {
    on_every_backend(
        "serving until shutdown",
        1,
        |b| b,
        |rt| {
            for deadline in [LONG, Duration::MAX] {
                let start = Instant::now();
                let rows: Vec<Vec<f32>> = (0..3).map(|i| row(2, i)).collect();
                // The tickets outlive the server: `serve` returns once they are answered.
                let (tickets, report) = serve(rt, config(8, deadline), &[], &[], |intake| {
                    rows.iter().map(|r| intake.submit(r.clone())).collect::<Result<Vec<_>>>()
                })?;
                check!(start.elapsed() < LONG / 2, "shutdown waited for the batch's deadline {deadline:?}");
                check_eq!(report.batch_rows, vec![3]);
                check_eq!(report.requests, 3);
                for (t, x) in tickets?.into_iter().zip(&rows) {
                    check!(t.wait()? == expected(x));
                }
            }
            Ok(())
        },
    );
}

/// Holds batch 0's compute until `open` (saying in `computing` that it has started); every
/// batch computes `2x + 2`.
#[derive(Default)]
struct Gate {
    computing: AtomicBool,
    open: AtomicBool,
}

impl Gate {
    /// Serves `clients` on device 0 of `rt`, two slots, batch 0 held until the gate opens
    /// (when `clients` returns at the latest).
    fn serve<R>(
        &self,
        rt: &Runtime,
        config: ServeConfig,
        clients: impl FnOnce(&Intake<'_, f32, f32>) -> R,
    ) -> Result<(R, ServeReport)> {
        let compute = |dev: &Device<'_>,
                       _: &mut (),
                       batch: usize,
                       rows: usize,
                       x: DeviceSlice<'_, f32>,
                       y: DeviceSlice<'_, f32>| {
            if batch == 0 {
                self.computing.store(true, Ordering::Release);
                while !self.open.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            affine::launch(dev, rows * ROW, 2.0, 2.0, x, y)
        };
        Pipeline::new(rt, &[0], 2)?.serve(
            config,
            |_| Ok(()),
            compute,
            |intake| {
                let _open = OpenOnDrop(&self.open);
                clients(intake)
            },
        )
    }

    /// Submits `row` (batch 0), its answer awaited on a thread of `t`, and waits until its
    /// compute holds (or it has ended: an injected fault).
    fn hold<'s>(
        &self,
        t: &'s std::thread::Scope<'s, '_>,
        rt: &Runtime,
        intake: &Intake<'_, f32, f32>,
        row: Vec<f32>,
    ) -> Result<std::thread::ScopedJoinHandle<'s, Result<Answer<f32>>>> {
        let first = intake.submit(row)?;
        let first = t.spawn(move || first.answer());
        wait_until(
            "batch 0 computing",
            || self.computing.load(Ordering::Acquire),
            || first.is_finished() || fault_fired(rt),
        )?;
        Ok(first)
    }
}

/// Opens a gate when dropped, so that a case that stops early never leaves a compute
/// waiting on it.
struct OpenOnDrop<'a>(&'a AtomicBool);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Waits until `ready()` or `given_up()`; `Err` after a minute (a case that hangs).
fn wait_until(what: &str, ready: impl Fn() -> bool, given_up: impl Fn() -> bool) -> Result<()> {
    let start = Instant::now();
    while !ready() && !given_up() {
        if start.elapsed() > LONG {
            return Err(Error::InvalidArgument {
                routine: "wait_until",
                what: format!("{what}: never happened"),
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Whether a fault was injected on device 0 (`OFFLOAD_TEST_FAULTS=1`): what the case waits
/// for may then never come (a failed entry's batch ends only after the gate opens).
fn fault_fired(rt: &Runtime) -> bool {
    rt.fault_counts(0).ok().flatten().is_some_and(|c| c.injected.iter().any(|&n| n > 0))
}

#[test]
fn a_ready_batch_grows_while_every_slot_is_busy() {
    on_every_backend(
        "serving under load",
        1,
        |b| b,
        |rt| {
            // One device of two slots; batch 0's compute waits for the gate, batch 1's
            // behind it on the compute lane, so both slots are busy until it opens.
            let gate = Gate::default();
            let config = config(8, Duration::from_millis(1));
            let rows: Vec<Vec<f32>> = (0..12).map(|i| row(5, i)).collect();
            let (answers, report) = gate.serve(rt, config, |intake| {
                std::thread::scope(|t| -> Result<Vec<Answer<f32>>> {
                    let first = gate.hold(t, rt, intake, rows[0].clone())?;
                    // Batch 1 is in its slot once its two maps are entered.
                    let before = rt.live_mappings().len();
                    let second = intake.submit(rows[1].clone())?;
                    let second = t.spawn(move || second.answer());
                    wait_until(
                        "batch 1 entered",
                        || rt.live_mappings().len() >= before + 2,
                        || second.is_finished() || fault_fired(rt),
                    )?;
                    let rest =
                        rows[2..].iter().map(|r| intake.submit(r.clone())).collect::<Result<Vec<_>>>()?;
                    gate.open.store(true, Ordering::Release);
                    let mut answers = Vec::new();
                    for a in [first, second] {
                        answers.push(a.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?);
                    }
                    for t in rest {
                        answers.push(t.answer()?);
                    }
                    Ok(answers)
                })
            })?;
            let answers = answers?;
            // The ten that came while both slots were busy: a full batch, then the rest.
            check_eq!(report.batch_rows, vec![1, 1, 8, 2]);
            let batches: Vec<usize> = answers.iter().map(|a| a.batch).collect();
            check_eq!(batches, [vec![0, 1], vec![2; 8], vec![3; 2]].concat());
            check!(answers
                .iter()
                .zip(&rows)
                .all(|(a, x)| a.row == x.iter().map(|x| 2.0 * x + 2.0).collect::<Vec<_>>()));
            assert_clean(rt, 0)
        },
    );
}

#[test]
fn a_failing_batch_fails_only_its_requests_and_the_server_goes_on() {
    on_every_backend(
        "serving through failures",
        1,
        |b| b,
        |rt| {
            let pairs: Vec<Vec<Vec<f32>>> = (0..5).map(|p| vec![row(3, 2 * p), row(3, 2 * p + 1)]).collect();
            // Batches of two, each submitted and waited for: batch p is pair p.
            let (results, report) = serve(rt, config(2, LONG), &[1], &[3], |intake| {
                pairs
                    .iter()
                    .map(|pair| {
                        let tickets =
                            pair.iter().map(|r| intake.submit(r.clone())).collect::<Result<Vec<_>>>()?;
                        Ok(tickets.into_iter().map(|t| t.answer()).collect::<Vec<_>>())
                    })
                    .collect::<Result<Vec<_>>>()
            })?;
            for (p, answers) in results?.into_iter().enumerate() {
                for (answer, x) in answers.into_iter().zip(&pairs[p]) {
                    match (p, answer) {
                        (1, Err(e @ Error::Batch { batch: 1, .. })) => {
                            check!(
                                e.to_string().contains("batch 1 failed")
                                    && e.to_string().contains("batch 1 is bad"),
                                "{e}"
                            )
                        }
                        (3, Err(e @ Error::Batch { batch: 3, .. })) => {
                            check!(matches!(e.cause(), Error::Panicked { .. }), "{e}");
                            check!(e.to_string().contains("compute gave up on batch 3"), "{e}");
                        }
                        (0 | 2 | 4, Ok(a)) => {
                            check_eq!(a.batch, p);
                            check!(a.row == expected(x), "batch {p}: {:?}", a.row);
                        }
                        (p, other) => check!(false, "pair {p}: unexpected {other:?}"),
                    }
                }
            }
            check_eq!(report.failed_batches, vec![1, 3]);
            check_eq!(report.batch_rows, vec![2; 5]);
            check_eq!(report.requests, 10);
            Ok(())
        },
    );
}

#[test]
fn bad_configurations_and_rows_are_refused() -> Result<()> {
    let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build()?;
    let zero = "expected each at least 1";
    let cases =
        [(0, 1, 1, zero), (1, 0, 1, zero), (1, 1, 0, zero), (1, usize::MAX / 2, 3, "max_rows 3 x out_row")];
    for (in_row, out_row, max_rows, why) in cases {
        let config = ServeConfig { in_row, out_row, max_rows, deadline: LONG, max_queued: None };
        let r = Pipeline::new(&rt, &[0], 2)?.serve(
            config,
            |_| Ok(()),
            |_, _: &mut (), _, _, _, _| Ok(()),
            |_: &Intake<'_, f32, f32>| (),
        );
        match r {
            Err(e) => assert!(e.to_string().contains(why), "{e}"),
            Ok(_) => panic!("{config:?} was accepted"),
        }
    }
    let (refused, report) =
        serve(&rt, config(4, LONG), &[], &[], |intake| intake.submit(vec![1.0; ROW + 1]).err())?;
    let e = refused.expect("a row too long is refused");
    assert!(e.to_string().contains("a row of 17 elements; the server takes rows of 16"), "{e}");
    assert_eq!(report.batches(), 0);
    // Many-row requests: none, not whole rows, or more than a batch holds.
    let (refused, report) = serve(&rt, config(4, LONG), &[], &[], |intake| {
        [0, ROW + 1, 5 * ROW]
            .map(|n| (n, intake.submit_rows(vec![1.0; n]).err(), intake.try_submit(vec![1.0; n]).err()))
    })?;
    for (n, rows, try_rows) in refused {
        for e in [rows, try_rows] {
            let e = e.unwrap_or_else(|| panic!("a request of {n} elements was accepted"));
            let want = format!(
                "a request of {n} elements; expected 1 to 4 rows of 16 (a request never spans two batches"
            );
            assert!(e.to_string().contains(&want), "{e}");
        }
    }
    assert_eq!(report.batches(), 0);
    Ok(())
}

#[test]
fn a_panicking_client_closes_the_server_and_the_panic_resumes() -> Result<()> {
    let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        serve(&rt, config(8, LONG), &[], &[], |intake| {
            let _ticket = intake.submit(row(4, 0));
            panic!("the client gave up");
        })
    }));
    let payload = r.expect_err("the client's panic resumes");
    assert_eq!(offload::error::panic_message(&*payload), "the client gave up");
    assert!(rt.live_mappings().is_empty(), "{:?}", rt.live_mappings());
    Ok(())
}

/// Per request of `ROW` scores: each score's share of the row's sum (`p`), and the index of
/// the largest (`class`) twice over, as a `u32` and as an `i64` (`tag`).
#[offload::kernel]
fn shares(r: usize, x: &[f32], p: &mut [f32], class: &mut [u32], tag: &mut [i64]) {
    let mut best = 0u32;
    let mut sum = 0.0f32;
    for j in 0usize..16 {
        sum += x[16 * r + j];
        if x[16 * r + j] > x[16 * r + best as usize] {
            best = j as u32;
        }
    }
    for j in 0usize..16 {
        p[16 * r + j] = x[16 * r + j] / sum;
    }
    class[r] = best;
    tag[r] = best as i64;
}

/// A request's row whose largest score is at `(c + i) % ROW`.
fn scores(c: usize, i: usize) -> Vec<f32> {
    (0..ROW).map(|j| if j == (c + i) % ROW { 100.0 } else { 1.0 + j as f32 }).collect()
}

fn expected_shares(x: &[f32]) -> Vec<f32> {
    let sum: f32 = x.iter().sum();
    x.iter().map(|v| v / sum).collect()
}

#[test]
fn requests_get_a_row_of_each_of_several_outputs_on_every_backend() {
    on_every_backend(
        "serving two and three outputs",
        1,
        |b| b,
        |rt| {
            let devices: Vec<usize> = (0..rt.num_devices().min(2)).collect();
            let pipeline = Pipeline::new(rt, &devices, 2)?;
            let deadline = Duration::from_millis(2);
            // Two outputs of their own types and row lengths; the batches of 6, 2 and 1
            // rows leave the reused buffers cut shorter and grown again. Batch 1 fails.
            // The partial batches start at a deadline long enough that the six rows
            // submitted back to back are never split, even on a loaded machine (a thread
            // held off the CPU for a moment must not cut the full batch).
            let partial = Duration::from_secs(2);
            let two = ServeConfig {
                in_row: ROW,
                out_row: (ROW, 1),
                max_rows: 6,
                deadline: partial,
                max_queued: None,
            };
            let (answers, report) = pipeline.serve_outputs(
                two,
                |_| Ok(()),
                |dev, _: &mut (), batch, rows, x, (p, class)| {
                    if batch == 1 {
                        return Err(Error::InvalidArgument { routine: "compute", what: "batch 1".into() });
                    }
                    let tag = HostBuffer::<i64>::new(dev.runtime(), rows)?;
                    tag.enter(dev.number(), MapType::ALLOC)?;
                    shares::launch(dev, rows, x, p, class, tag.shared_view(dev.number()))
                },
                |intake: &Intake<'_, f32, (f32, u32)>| -> Result<Vec<_>> {
                    let mut answers = Vec::new();
                    for (batch, n) in [6, 2, 1].into_iter().enumerate() {
                        let rows: Vec<Vec<f32>> = (0..n).map(|i| scores(batch, i)).collect();
                        let tickets =
                            rows.iter().map(|r| intake.submit(r.clone())).collect::<Result<Vec<_>>>()?;
                        answers.extend(rows.into_iter().zip(tickets.into_iter().map(|t| t.answer())));
                    }
                    Ok(answers)
                },
            )?;
            for (x, a) in answers? {
                match a {
                    Ok(Answer { row: (p, class), batch, .. }) => {
                        check!(batch != 1, "batch 1 answered {p:?}");
                        let largest = x.iter().position(|&v| v == 100.0);
                        check_eq!(class, vec![largest.map_or(99, |l| l as u32)]);
                        let want = expected_shares(&x);
                        check!(p.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6), "{p:?} for {x:?}");
                    }
                    Err(Error::Batch { batch, .. }) => check_eq!(batch, 1),
                    Err(e) => return Err(e),
                }
            }
            check_eq!(report.batch_rows, vec![6, 2, 1]);
            check_eq!(report.failed_batches, vec![1]);
            // Three outputs: the third an i64 of its own, and an answer's whole shape.
            let three =
                ServeConfig { in_row: ROW, out_row: (ROW, 1, 1), max_rows: 4, deadline, max_queued: None };
            let (answer, _) = pipeline.serve_outputs(
                three,
                |_| Ok(()),
                |dev, _: &mut (), _, rows, x, (p, class, tag)| shares::launch(dev, rows, x, p, class, tag),
                |intake: &Intake<'_, f32, (f32, u32, i64)>| intake.submit(scores(0, 3))?.wait(),
            )?;
            check_eq!(answer?, (expected_shares(&scores(0, 3)), vec![3u32], vec![3i64]));
            for d in devices {
                assert_clean(rt, d)?;
            }
            Ok(())
        },
    );
}

#[test]
fn an_output_row_of_zero_or_too_many_elements_is_refused() -> Result<()> {
    let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build()?;
    let cases = [
        ((4, 0), 2, "out_row (4, 0), max_rows 2; expected each at least 1"),
        ((4, usize::MAX / 2), 3, "Pipeline::serve_outputs: a batch's elements, max_rows 3 x out_row"),
    ];
    for (out_row, max_rows, why) in cases {
        let config = ServeConfig { in_row: 4, out_row, max_rows, deadline: LONG, max_queued: None };
        let r = Pipeline::new(&rt, &[0], 2)?.serve_outputs(
            config,
            |_| Ok(()),
            |_, _: &mut (), _, _, _, _| Ok(()),
            |_: &Intake<'_, f32, (f32, u32)>| (),
        );
        match r {
            Err(e) => assert!(e.to_string().contains(why), "{e}"),
            Ok(_) => panic!("{config:?} was accepted"),
        }
    }
    Ok(())
}

/// A server started inside a pipeline's compute is refused: its batches would queue on
/// lanes that the compute occupies, behind work that waits for it.
#[test]
fn a_server_inside_a_task_is_refused() {
    on_every_backend(
        "serve inside a task",
        1,
        |b| b,
        |rt| {
            let inputs = vec![vec![1f32; 4]];
            let mut outputs = vec![vec![0f32; 4]];
            let r = Pipeline::new(rt, &[0], 2)?.run(&inputs, &mut outputs, |dev, _, x, y| {
                let config = ServeConfig { in_row: 4, out_row: 4, max_rows: 2, deadline: Duration::from_millis(1), max_queued: None };
                let served = Pipeline::new(dev.runtime(), &[0], 2)?.serve(
                    config,
                    |_: &Device<'_>| Ok(()),
                    |d, _, _, rows, x, y| affine::launch(d, rows * 4, 2.0, 0.0, x, y),
                    |intake| intake.submit(vec![1.0; 4]).and_then(|t| t.wait()).map(drop),
                );
                check!(
                    matches!(&served, Err(Error::InvalidArgument { routine: "Pipeline::serve", what }) if what.contains("inside a nowait task")),
                    "{:?}",
                    served.as_ref().err()
                );
                // So is one over a stage pipeline.
                let stages = vec![offload::pipeline::Stage::new(0, 8, |d, _, x, y| affine::launch(d, 8, 2.0, 0.0, x, y))];
                let config = ServeConfig { in_row: 4, out_row: 4, max_rows: 2, deadline: Duration::from_millis(1), max_queued: None };
                let staged = offload::pipeline::StagePipeline::new(dev.runtime(), stages, 2)?
                    .serve(config, |intake: &Intake<'_, f32, f32>| intake.submit(vec![1.0; 4]).and_then(|t| t.wait()).map(drop));
                check!(
                    matches!(&staged, Err(Error::InvalidArgument { routine: "StagePipeline::serve", what }) if what.contains("inside a nowait task")),
                    "{:?}",
                    staged.as_ref().err()
                );
                affine::launch(dev, 4, 2.0, 0.0, x, y)
            });
            check!(r.is_ok(), "{r:?}");
            check_eq!(outputs[0][0], 2.0);
            assert_clean(rt, 0)?;
            Ok(())
        },
    );
}

/// Each row's input back, and the index of the batch it ran in (every row of a request
/// alike when it is never split).
#[offload::kernel]
fn echo_batch(r: usize, batch: u32, x: &[f32], y: &mut [f32], ran_in: &mut [u32]) {
    for j in 0usize..16 {
        y[r * 16 + j] = x[r * 16 + j];
    }
    ran_in[r] = batch;
}

/// Requests of 1 to `max_rows` rows, from several threads: each runs whole in one batch
/// (every row's batch index is its answer's), gets its own rows back with one latency, no
/// batch holds more than `max_rows` rows, and the report counts rows, requests and fill.
#[test]
fn a_request_of_many_rows_runs_whole_in_one_batch() {
    on_every_backend(
        "many-row requests",
        1,
        |b| b,
        |rt| {
            let max_rows = 8;
            let config = ServeConfig {
                in_row: ROW,
                out_row: (ROW, 1),
                max_rows,
                deadline: Duration::from_millis(1),
                max_queued: None,
            };
            let devices: Vec<usize> = (0..rt.num_devices().min(2)).collect();
            let sizes = |c: usize| (0..12).map(move |i| 1 + (c * 5 + i * 3) % max_rows);
            let rows_of =
                |c: usize, i: usize, k: usize| (0..k).flat_map(|r| row(c, i * max_rows + r)).collect();
            let (answers, report) = Pipeline::new(rt, &devices, 2)?.serve_outputs(
                config,
                |_| Ok(()),
                |dev, _, batch, rows, x, (y, ran_in)| {
                    echo_batch::launch(dev, rows, batch as u32, x, y, ran_in)
                },
                |intake: &Intake<'_, f32, (f32, u32)>| {
                    std::thread::scope(|t| {
                        let clients: Vec<_> = (0..3)
                            .map(|c| {
                                t.spawn(move || {
                                    let tickets = sizes(c)
                                        .enumerate()
                                        .map(|(i, k)| intake.submit_rows(rows_of(c, i, k)))
                                        .collect::<Result<Vec<_>>>()?;
                                    tickets.into_iter().map(|t| t.answer()).collect::<Result<Vec<_>>>()
                                })
                            })
                            .collect();
                        clients.into_iter().map(|c| c.join().expect("a client thread")).collect::<Vec<_>>()
                    })
                },
            )?;
            let mut total_rows = 0;
            for (c, answers) in answers.into_iter().enumerate() {
                for ((i, k), answer) in sizes(c).enumerate().zip(answers?) {
                    let (y, ran_in) = &answer.row;
                    check_eq!(*y, rows_of(c, i, k));
                    check_eq!(*ran_in, vec![answer.batch as u32; k]);
                    check!(report.batch_rows[answer.batch] >= k);
                    total_rows += k;
                }
            }
            check_eq!(report.requests, 36);
            check_eq!(report.batch_requests.iter().sum::<usize>(), 36);
            check_eq!(report.rows(), total_rows);
            check!(report.batch_rows.iter().all(|&r| (1..=max_rows).contains(&r)), "{:?}", report.batch_rows);
            check_eq!(report.fill(), total_rows as f64 / (report.batches() * max_rows) as f64);
            for d in devices {
                assert_clean(rt, d)?;
            }
            Ok(())
        },
    );
}

/// A request that does not fit the batch being formed starts the next one: with the
/// server closed after four submissions, batches are formed from what waits, in order.
#[test]
fn a_request_that_does_not_fit_starts_the_next_batch() {
    on_every_backend(
        "many-row requests in order",
        1,
        |b| b,
        |rt| {
            let config =
                ServeConfig { in_row: ROW, out_row: ROW, max_rows: 8, deadline: LONG, max_queued: None };
            let sizes = [3, 6, 2, 8];
            let (tickets, report) = serve(rt, config, &[], &[], |intake| {
                let rows = |k: usize| (0..k).flat_map(|r| row(7, r)).collect::<Vec<f32>>();
                sizes.iter().map(|&k| intake.submit_rows(rows(k))).collect::<Result<Vec<_>>>()
            })?;
            let answers = tickets?.into_iter().map(|t| t.answer()).collect::<Result<Vec<_>>>()?;
            // 3 + 6 > 8: the 6 starts batch 1, which the 2 joins; the 8 fills batch 2.
            check_eq!(report.batch_rows, vec![3, 8, 8]);
            check_eq!(report.batch_requests, vec![1, 2, 1]);
            check_eq!(answers.iter().map(|a| a.batch).collect::<Vec<_>>(), vec![0, 1, 1, 2]);
            for (a, k) in answers.iter().zip(sizes) {
                check_eq!(a.row, expected(&(0..k).flat_map(|r| row(7, r)).collect::<Vec<_>>()));
            }
            Ok(())
        },
    );
}

/// A bounded intake: with the device's two slots held (batch 0 computing behind a gate,
/// batch 1 behind it) and the next batch waiting for a slot, the queue fills; then `try_submit` refuses and gives the rows back, `submit` waits for
/// room, and every request queued is answered once the slot frees.
#[test]
fn a_full_intake_refuses_or_waits_as_the_caller_chooses() {
    on_every_backend(
        "serving with backpressure",
        1,
        |b| b,
        |rt| {
            let gate = Gate::default();
            let config =
                ServeConfig { in_row: ROW, out_row: ROW, max_rows: 1, deadline: LONG, max_queued: Some(1) };
            let rows: Vec<Vec<f32>> = (0..5).map(|i| row(9, i)).collect();
            let (answers, report) = gate.serve(rt, config, |intake| {
                std::thread::scope(|t| -> Result<Vec<Answer<f32>>> {
                    let first = gate.hold(t, rt, intake, rows[0].clone())?;
                    if first.is_finished() {
                        // A fault ended batch 0 early: nothing is held to fill up behind.
                        return Ok(Vec::new());
                    }
                    // Batch 1 (a full batch of one row) takes the second slot; batch 2
                    // waits for one in the batcher (which takes no more meanwhile); the
                    // next request waits in the intake, which is then full.
                    let tickets =
                        rows[1..4].iter().map(|r| intake.submit(r.clone())).collect::<Result<Vec<_>>>()?;
                    let refused = match intake.try_submit(rows[4].clone())? {
                        Submitted::Full(back) => back,
                        // An injected fault may end batch 1 early and free its slot.
                        Submitted::Queued(_) if fault_fired(rt) => return Ok(Vec::new()),
                        Submitted::Queued(_) => {
                            return Err(Error::InvalidArgument {
                                routine: "try_submit",
                                what: "queued into a full intake".into(),
                            })
                        }
                    };
                    check_eq!(refused, rows[4]);
                    // A blocking submit waits for room: it returns once the gate opens.
                    let opener = t.spawn(|| {
                        std::thread::sleep(Duration::from_millis(20));
                        gate.open.store(true, Ordering::Release);
                    });
                    let last = intake.submit(refused)?;
                    check!(
                        gate.open.load(Ordering::Acquire),
                        "a submit into a full intake returned before room was made"
                    );
                    opener.join().expect("the opener");
                    let mut answers = vec![first.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?];
                    for t in tickets.into_iter().chain([last]) {
                        answers.push(t.answer()?);
                    }
                    Ok(answers)
                })
            })?;
            let answers = answers?;
            if answers.is_empty() {
                return Ok(());
            }
            check_eq!(report.batch_rows, vec![1; 5]);
            for (a, x) in answers.iter().zip(&rows) {
                check_eq!(a.row, x.iter().map(|x| 2.0 * x + 2.0).collect::<Vec<_>>());
            }
            assert_clean(rt, 0)
        },
    );
}
