//! Batches streamed through devices: copy-in, compute and copy-out overlapped.
//!
//! A [`Pipeline`] runs each batch through `enter (to) -> compute -> exit (from)` on the
//! three lanes of a device (see [`crate::nowait`]), with up to `slots` batches in flight per
//! device, so that while batch *i* computes, batch *i+1* arrives and batch *i-1* leaves.
//! Batches are taken from one work-stealing queue (`crossbeam`'s injector) by every device
//! as its slots free up, so a slower device takes fewer. Outputs land in the caller's
//! slices by batch index (order preserved). The first failing batch stops the pipeline:
//! no new batch starts, those in flight finish or are unmapped without copying back, and
//! the error names the batch; nothing is left mapped. A `compute` that panics fails its
//! batch in the same way, with [`Error::Panicked`] (inside [`Error::Batch`]) naming the
//! panic; the panic does not resume, since `compute` ran on a device's lane thread.
//!
//! [`Pipeline::run_with`] adds what a model needs around it: per-device state made once
//! per device (its scratch) and handed to `compute` by `&mut`, and batches of several
//! outputs ([`BatchOutputs`]: probabilities and classes). [`Pipeline::serve`] keeps the
//! devices busy with requests that arrive over time from other threads, batched by size
//! and deadline, each answered to its submitter.
//!
//! ```
//! use offload::pipeline::Pipeline;
//! use offload::Runtime;
//!
//! #[offload::kernel]
//! fn twice(i: usize, x: &[f32], y: &mut [f32]) {
//!     y[i] = 2.0 * x[i];
//! }
//!
//! let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
//! let inputs: Vec<Vec<f32>> = (0..10).map(|b| vec![b as f32; 256]).collect();
//! let mut outputs = vec![vec![0f32; 256]; 10];
//! let report = Pipeline::new(&rt, &[0, 1], 2)?.run(&inputs, &mut outputs, |dev, _batch, x, y| {
//!     twice::launch(dev, 256, x, y)
//! })?;
//! assert!(outputs.iter().enumerate().all(|(b, o)| o.iter().all(|&v| v == 2.0 * b as f32)));
//! assert_eq!(report.batches_per_device.iter().sum::<usize>(), 10);
//! # Ok::<(), offload::Error>(())
//! ```

mod outputs;
mod serve;
mod stages;
mod state;

pub use outputs::{BatchOutput, BatchOutputs, One, OutputShape, OutputViews, RowOutputs};
pub use serve::{Answer, Intake, Latency, ServeConfig, ServeReport, Submitted, Ticket};
pub use stages::{Stage, StageChain, StagePipeline, StageReport};

use state::DeviceStates;

use std::collections::VecDeque;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_deque::{Injector, Steal};
use parking_lot::Mutex;

use crate::api::{view_of, Device, DeviceSlice, Map, MapList};
use crate::data_env::{MapItem, MapType};
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;
use crate::nowait::{ExitList, NowaitScope, Task};
use crate::rt::{MapConstruct, Runtime};

/// Streams batches through devices; see the module documentation.
#[derive(Debug)]
pub struct Pipeline<'rt> {
    rt: &'rt Runtime,
    devices: Vec<usize>,
    slots: usize,
}

/// What a pipeline run did.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineReport {
    /// Batches each device processed, in the order of the devices given.
    pub batches_per_device: Vec<usize>,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl<'rt> Pipeline<'rt> {
    /// A pipeline over `devices` with `slots >= 2` batches in flight per device.
    pub fn new(rt: &'rt Runtime, devices: &[usize], slots: usize) -> Result<Self> {
        if devices.is_empty() || slots < 2 {
            return Err(Error::InvalidArgument {
                routine: "Pipeline::new",
                what: format!(
                    "needs at least one device and two slots, got {} devices and {slots} slots",
                    devices.len()
                ),
            });
        }
        for &d in devices {
            rt.check_offload_device(d)?;
        }
        Ok(Self { rt, devices: devices.to_vec(), slots })
    }

    /// Runs every batch: `inputs[i]` is copied in, `compute(device, i, input, output)` runs
    /// on the device's compute lane, and the output view is copied back into `outputs[i]`.
    /// Each batch's constructs are traced at the caller's location.
    #[track_caller]
    pub fn run<In, Out, I, O, F>(&self, inputs: &[I], outputs: &mut [O], compute: F) -> Result<PipelineReport>
    where
        In: DeviceCopy,
        Out: DeviceCopy,
        I: AsRef<[In]> + Sync,
        O: AsMut<[Out]> + Send,
        F: Fn(&Device<'_>, usize, DeviceSlice<'_, In>, DeviceSlice<'_, Out>) -> Result<()> + Sync,
    {
        check_batches("Pipeline::run", inputs.len(), outputs.len())?;
        let mut outs: Vec<&mut [Out]> = outputs.iter_mut().map(AsMut::as_mut).collect();
        self.run_with(inputs, &mut outs, |_| Ok(()), |dev, _: &mut (), batch, x, y| compute(dev, batch, x, y))
    }

    /// [`Pipeline::run`] with per-device state and any [`BatchOutputs`]: `init(device)`
    /// makes a device's state (its scratch, say) on its compute lane before its first batch,
    /// and `compute(device, state, i, input, outputs)` gets it by `&mut` (computes of one
    /// device run in order, so no two at once); `outputs[i]` is one output or a tuple of
    /// them, whose views `compute` receives in the same shape, each copied back on the
    /// copy-out lane. The states are dropped when the run ends, whatever happened, so what
    /// they mapped is released. A failing `init` fails its batch like `compute`.
    ///
    /// ```
    /// use offload::pipeline::Pipeline;
    /// use offload::{HostBuffer, MapType, Runtime};
    ///
    /// #[offload::kernel]
    /// fn plus_one(i: usize, x: &[f32], h: &mut [f32]) {
    ///     h[i] = x[i] + 1.0;
    /// }
    ///
    /// #[offload::kernel]
    /// fn split(i: usize, h: &[f32], y: &mut [f32], big: &mut [u32]) {
    ///     y[i] = 2.0 * h[i];
    ///     big[i] = if h[i] > 4.0 { 1 } else { 0 };
    /// }
    ///
    /// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
    /// let inputs: Vec<Vec<f32>> = (0..8).map(|b| vec![b as f32; 64]).collect();
    /// let mut outputs: Vec<(Vec<f32>, Vec<u32>)> = vec![(vec![0.0; 64], vec![0; 64]); 8];
    /// let scratch = |dev: &offload::Device<'_>| {
    ///     let h = HostBuffer::<f32>::new(&rt, 64)?;
    ///     h.enter(dev.number(), MapType::ALLOC)?; // device scratch, never copied
    ///     Ok(h)
    /// };
    /// Pipeline::new(&rt, &[0, 1], 2)?.run_with(&inputs, &mut outputs, scratch, |dev, h, _b, x, (y, big)| {
    ///     let h = h.shared_view(dev.number());
    ///     plus_one::launch(dev, 64, x, h)?;
    ///     split::launch(dev, 64, h, y, big)
    /// })?;
    /// for (b, (y, big)) in outputs.iter().enumerate() {
    ///     assert!(y.iter().all(|&v| v == 2.0 * (b as f32 + 1.0)));
    ///     assert!(big.iter().all(|&v| v == u32::from(b >= 4)));
    /// }
    /// assert!(rt.live_mappings().is_empty()); // the scratch went with the run
    /// # Ok::<(), offload::Error>(())
    /// ```
    #[track_caller]
    pub fn run_with<S, In, I, O, Init, F>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
        init: Init,
        compute: F,
    ) -> Result<PipelineReport>
    where
        S: Send,
        In: DeviceCopy,
        I: AsRef<[In]> + Sync,
        O: BatchOutputs,
        Init: Fn(&Device<'rt>) -> Result<S> + Sync,
        F: Fn(&Device<'_>, &mut S, usize, DeviceSlice<'_, In>, OutputViews<'_, O>) -> Result<()> + Sync,
    {
        check_batches("Pipeline::run_with", inputs.len(), outputs.len())?;
        let (start, at) = (Instant::now(), Location::caller());
        let queue = Injector::new();
        (0..inputs.len()).for_each(|i| queue.push(i));
        // Each output is handed out once, by batch index.
        let outs: Vec<Mutex<Option<&mut O>>> = outputs.iter_mut().map(|o| Mutex::new(Some(o))).collect();
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<(usize, Error)>> = Mutex::new(None);
        let counts: Vec<Mutex<usize>> = self.devices.iter().map(|_| Mutex::new(0)).collect();
        // Made before the scope, so that the tasks may borrow them; dropped after it.
        let states = DeviceStates::new(self.devices.len());
        let rt = self.rt;
        // References made here, outside the scopes, so that what the tasks borrow outlives them.
        let (queue, outs, failed, first_error, counts, states, init, compute) =
            (&queue, &outs, &failed, &first_error, &counts, &states, &init, &compute);
        let scope_result = rt.nowait(move |s| {
            std::thread::scope(move |threads| {
                for (slot_owner, &device) in self.devices.iter().enumerate() {
                    threads.spawn(move || {
                        let mut in_flight: VecDeque<(usize, Task, Task)> = VecDeque::new();
                        let record = |batch: usize, e: Error| {
                            failed.store(true, Ordering::Release);
                            let mut f = first_error.lock();
                            if f.as_ref().is_none_or(|(b, _)| batch < *b) {
                                *f = Some((batch, e));
                            }
                        };
                        let settle = |(batch, work, done): (usize, Task, Task)| {
                            let r = work.wait().and(done.wait());
                            if let Err(e) = r {
                                record(batch, e);
                            }
                        };
                        loop {
                            if failed.load(Ordering::Acquire) {
                                break;
                            }
                            let batch = match queue.steal() {
                                Steal::Success(b) => b,
                                Steal::Retry => continue,
                                Steal::Empty => break,
                            };
                            if in_flight.len() >= self.slots {
                                if let Some(oldest) = in_flight.pop_front() {
                                    settle(oldest);
                                }
                            }
                            let Some(out) = outs[batch].lock().take() else { continue };
                            let maps = (Map::shared(inputs[batch].as_ref(), MapType::TO), out.maps());
                            let queued = queue_batch(s, device, maps, at, move |dev, (x, y)| {
                                let make = || init(&rt.device(device)?);
                                states.with(slot_owner, make, |state| compute(dev, state, batch, x, y))
                            });
                            match queued {
                                Ok((work, done)) => {
                                    *counts[slot_owner].lock() += 1;
                                    in_flight.push_back((batch, work, done));
                                }
                                Err(e) => record(batch, e),
                            }
                        }
                        in_flight.into_iter().for_each(settle);
                    });
                }
            });
        });
        if let Some((batch, e)) = first_error.lock().take() {
            return Err(Error::Batch { batch, source: Box::new(e) });
        }
        scope_result?;
        Ok(PipelineReport {
            batches_per_device: counts.iter().map(|c| *c.lock()).collect(),
            elapsed: start.elapsed(),
        })
    }

    /// The same batches without overlap, for comparison: each batch is mapped, computed and
    /// unmapped before the next starts, on the first device.
    #[track_caller]
    pub fn run_serially<In, Out, I, O, F>(
        &self,
        inputs: &[I],
        outputs: &mut [O],
        compute: F,
    ) -> Result<Duration>
    where
        In: DeviceCopy,
        Out: DeviceCopy,
        I: AsRef<[In]>,
        O: AsMut<[Out]>,
        F: Fn(&Device<'_>, usize, DeviceSlice<'_, In>, DeviceSlice<'_, Out>) -> Result<()>,
    {
        let (start, at) = (Instant::now(), Location::caller());
        let dev = self.rt.device(self.devices[0])?;
        for (batch, (input, output)) in inputs.iter().zip(outputs.iter_mut()).enumerate() {
            let (x, y) = (input.as_ref(), output.as_mut());
            let items = [MapItem::slice(x, MapType::TO), MapItem::slice(y, MapType::ALLOC)];
            // SAFETY: `x` and `y` are borrowed (shared, exclusive) until the exit below.
            unsafe { self.rt.map_construct_at(MapConstruct::EnterData, dev.number(), &items, at)? };
            let views = (view_of(x, dev.number(), false), view_of(y, dev.number(), true));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                compute(&dev, batch, views.0, views.1)
            }));
            let r = r.unwrap_or_else(|payload| {
                // Unmapped before the panic goes on: the borrows of `x` and `y` end with it.
                let release = [MapItem::slice(y, MapType::RELEASE), MapItem::slice(x, MapType::RELEASE)];
                // SAFETY: release copies nothing.
                let _ =
                    unsafe { self.rt.map_construct_at(MapConstruct::ExitData, dev.number(), &release, at) };
                std::panic::resume_unwind(payload)
            });
            let kind = if r.is_ok() { MapType::FROM } else { MapType::RELEASE };
            let exit = [MapItem::slice_mut(y, kind), MapItem::slice(x, MapType::RELEASE)];
            // SAFETY: as above; `y` is exclusively borrowed for the copy back.
            unsafe { self.rt.map_construct_at(MapConstruct::ExitData, dev.number(), &exit, at)? };
            r.map_err(|e| Error::Batch { batch, source: Box::new(e) })?;
        }
        Ok(start.elapsed())
    }
}

/// As many output batches as input batches, or an error naming `routine`.
fn check_batches(routine: &'static str, inputs: usize, outputs: usize) -> Result<()> {
    if inputs == outputs {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        routine,
        what: format!("{inputs} input batches but {outputs} output batches"),
    })
}

/// Queues one batch on `device`: `maps` entered on the copy-in lane, `compute` on the
/// compute lane once they are, and the views unmapped on the copy-out lane whatever
/// happened (copied back only after a successful compute). Returns the compute and unmap
/// tasks; an error when a task could not be queued (what was entered is still unmapped).
fn queue_batch<'scope, 'env, L>(
    s: &'scope NowaitScope<'scope, 'env>,
    device: usize,
    maps: L,
    at: &'static Location<'static>,
    compute: impl FnOnce(&Device<'env>, L::Views) -> Result<()> + Send + 'scope,
) -> Result<(Task, Task)>
where
    L: MapList<'scope> + Send + 'scope,
    L::Views: ExitList + Copy + Send + 'scope,
{
    let (t_in, views) = s.enter_at(device, maps, &[], at)?;
    let (work, not_queued) = match s.compute(device, &[&t_in], move |dev| compute(dev, views)) {
        Ok(t) => (t, None),
        Err(e) => (t_in, Some(e)),
    };
    // Runs even if the computation failed: then it only unmaps.
    let done = s.unmap(device, views, &[&work], true, at)?;
    not_queued.map_or(Ok((work, done)), Err)
}
