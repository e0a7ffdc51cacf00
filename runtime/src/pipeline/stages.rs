//! A model split into stages across devices (pipeline parallelism): each stage runs its
//! part of every micro-batch on its own device, and the activations go device to device
//! between stages (a peer copy where the devices can, staged through the host where not;
//! nothing at all when two stages share a device), with several micro-batches in flight so
//! that every stage is busy once the pipe is full.
//!
//! Each micro-batch is `enter (to) -> stage 0 -> hand-off -> stage 1 -> ... -> exit (from)`
//! as `nowait` tasks on the stages' lanes; an activation between stages `s` and `s + 1`
//! lives in device scratch mapped `alloc` on both devices, one per micro-batch in flight,
//! made when the pipeline is and kept until it is dropped (so runs after the first start
//! at once). Outputs land by micro-batch index. The first failing micro-batch
//! stops the pipe: no new one starts, those in flight finish or are unmapped without
//! copying back, and the error names the micro-batch and the stage
//! ([`Error::Batch`] around [`Error::Stage`]); nothing is left mapped. A stage that panics
//! fails its micro-batch the same way ([`Error::Panicked`] inside).
//!
//! Two replicas of a two-stage pipe on four devices are two `StagePipeline`s, each over
//! its own devices, run on two threads (each over its half of the micro-batches).
//!
//! ```
//! use offload::pipeline::{Stage, StagePipeline};
//! use offload::Runtime;
//!
//! #[offload::kernel]
//! fn add_one(i: usize, x: &[f32], y: &mut [f32]) {
//!     y[i] = x[i] + 1.0;
//! }
//!
//! #[offload::kernel]
//! fn twice(i: usize, x: &[f32], y: &mut [f32]) {
//!     y[i] = 2.0 * x[i];
//! }
//!
//! let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
//! let stages = vec![
//!     Stage::new(0, 64, |dev, _mb, x, y| add_one::launch(dev, 64, x, y)),
//!     Stage::new(1, 64, |dev, _mb, x, y| twice::launch(dev, 64, x, y)),
//! ];
//! let inputs: Vec<Vec<f32>> = (0..6).map(|b| vec![b as f32; 64]).collect();
//! let mut outputs = vec![vec![0f32; 64]; 6];
//! StagePipeline::new(&rt, stages, 3)?.run(&inputs, &mut outputs)?;
//! assert!(outputs.iter().enumerate().all(|(b, y)| y.iter().all(|&v| v == 2.0 * (b as f32 + 1.0))));
//! # Ok::<(), offload::Error>(())
//! ```

use std::collections::VecDeque;
use std::panic::Location;
use std::time::{Duration, Instant};

use crate::api::{scratch_view_of, Device, DeviceSlice, Map};
use crate::data_env::MapItem;
use crate::data_env::MapType;
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;
use crate::nowait::Task;
use crate::rt::Runtime;

/// What a stage computes: `(device, micro-batch, input, output)`.
type StageFn<'f, T> =
    dyn Fn(&Device<'_>, usize, DeviceSlice<'_, T>, DeviceSlice<'_, T>) -> Result<()> + Sync + 'f;

/// One stage of a [`StagePipeline`]: its device, the length of its output per micro-batch
/// (the next stage's input, or the pipe's output), and what it computes.
pub struct Stage<'f, T> {
    device: usize,
    out_len: usize,
    compute: Box<StageFn<'f, T>>,
}

impl<T> std::fmt::Debug for Stage<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("device", &self.device)
            .field("out_len", &self.out_len)
            .finish_non_exhaustive()
    }
}

impl<'f, T> Stage<'f, T> {
    /// A stage on `device` whose output has `out_len` elements per micro-batch, computing
    /// `compute(device, micro_batch, input, output)` (the output view is writable by
    /// kernels: device scratch, or the pipe's output mapping).
    pub fn new(
        device: usize,
        out_len: usize,
        compute: impl Fn(&Device<'_>, usize, DeviceSlice<'_, T>, DeviceSlice<'_, T>) -> Result<()> + Sync + 'f,
    ) -> Self {
        Self { device, out_len, compute: Box::new(compute) }
    }

    /// The stage's device.
    pub fn device(&self) -> usize {
        self.device
    }
}

/// What a run of a [`StagePipeline`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct StageReport {
    /// Micro-batches through the pipe.
    pub micro_batches: usize,
    /// Hand-offs between two devices (device-to-device copies) made.
    pub hand_offs: usize,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

/// Micro-batches through stages on devices; see the module documentation.
#[derive(Debug)]
pub struct StagePipeline<'rt, 'f, T: DeviceCopy> {
    rt: &'rt Runtime,
    stages: Vec<Stage<'f, T>>,
    in_flight: usize,
    /// Between stages `s` and `s + 1`, one per micro-batch in flight.
    boundaries: Vec<Vec<Boundary<T>>>,
}

impl<'rt, 'f, T: DeviceCopy> StagePipeline<'rt, 'f, T> {
    /// A pipe of `stages`, in order, with up to `in_flight` micro-batches in it at once (at
    /// least the number of stages keeps every stage busy).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no stages or `in_flight` 0; [`Error::NoSuchDevice`]
    /// for a stage's device the runtime does not have.
    pub fn new(rt: &'rt Runtime, stages: Vec<Stage<'f, T>>, in_flight: usize) -> Result<Self> {
        let bad = |what: String| Error::InvalidArgument { routine: "StagePipeline::new", what };
        if stages.is_empty() {
            return Err(bad("no stages; expected at least one".into()));
        }
        if in_flight == 0 {
            return Err(bad("0 micro-batches in flight; expected at least 1".into()));
        }
        if let Some(i) = stages.iter().position(|s| s.out_len == 0) {
            return Err(bad(format!("stage {i} makes 0 elements per micro-batch; expected at least 1")));
        }
        for s in &stages {
            rt.device(s.device)?;
        }
        let mut me = Self { rt, stages, in_flight, boundaries: Vec::new() };
        me.map_boundaries()?;
        Ok(me)
    }

    /// Runs every micro-batch: `inputs[i]` into the first stage, the last stage's output
    /// into `outputs[i]` (each of the last stage's `out_len`). A run takes the pipeline
    /// exclusively: its activations' scratch, one per micro-batch in flight, is no two
    /// runs' at once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the counts or an output's length do not match; the
    /// first failing micro-batch's error, [`Error::Batch`] around [`Error::Stage`] for a
    /// stage's failure.
    #[track_caller]
    pub fn run<I, O>(&mut self, inputs: &[I], outputs: &mut [O]) -> Result<StageReport>
    where
        I: AsRef<[T]> + Sync,
        O: AsMut<[T]> + Send,
    {
        let at = Location::caller();
        let bad = |what: String| Error::InvalidArgument { routine: "StagePipeline::run", what };
        if inputs.len() != outputs.len() {
            return Err(bad(format!("{} input micro-batches but {} outputs", inputs.len(), outputs.len())));
        }
        let last = self.stages.len() - 1;
        let out_len = self.stages[last].out_len;
        for (i, o) in outputs.iter_mut().enumerate() {
            let len = o.as_mut().len();
            if len != out_len {
                return Err(bad(format!("output {i} has {len} elements; the last stage makes {out_len}")));
            }
        }
        let start = Instant::now();
        let (rt, boundaries) = (self.rt, &self.boundaries);
        // The tasks of each micro-batch submitted, in order, for its error.
        let mut batches: Vec<Vec<Task>> = Vec::new();
        let mut hand_offs = 0;
        let scope = rt.nowait(|s| -> Result<()> {
            let mut pending: VecDeque<Task> = VecDeque::new();
            for (b, (input, output)) in inputs.iter().zip(outputs.iter_mut()).enumerate() {
                // At most `in_flight` micro-batches in the pipe: the oldest must be out, which
                // also frees its slot of every boundary buffer for this one.
                if pending.len() >= self.in_flight {
                    if let Some(oldest) = pending.pop_front() {
                        if oldest.wait().is_err() {
                            break;
                        }
                    }
                }
                let slot = b % self.in_flight;
                let mut tasks = Vec::new();
                let (t_in, x) =
                    s.enter_at(self.stages[0].device, Map::shared(input.as_ref(), MapType::TO), &[], at)?;
                let (t_out, y) = s.enter_at(
                    self.stages[last].device,
                    Map::exclusive(output.as_mut(), MapType::FROM),
                    &[],
                    at,
                )?;
                tasks.extend([t_in.clone(), t_out.clone()]);
                let (mut ready, mut input_view) = (t_in, x);
                let mut first_compute = None;
                for (st, stage) in self.stages.iter().enumerate() {
                    let out_view = if st == last { y } else { boundaries[st][slot].view(stage.device) };
                    let mut after = vec![&ready];
                    if st == last {
                        after.push(&t_out);
                    }
                    let (compute, device) = (&stage.compute, stage.device);
                    let task = s.compute(device, &after, move |dev| {
                        compute(dev, b, input_view, out_view).map_err(|e| Error::Stage {
                            stage: st,
                            device,
                            source: Box::new(e),
                        })
                    })?;
                    tasks.push(task.clone());
                    first_compute.get_or_insert_with(|| task.clone());
                    ready = task;
                    if st < last {
                        let boundary = &boundaries[st][slot];
                        let next = self.stages[st + 1].device;
                        if let Some((dst, src)) = boundary.copy {
                            // SAFETY: `dst` and `src` are the device copies of the same live,
                            // mapped boundary buffer on `next` and on `device`, of `bytes`
                            // each; the buffers outlive the scope.
                            let copy = unsafe {
                                s.memcpy(dst, src, boundary.bytes(), 0, 0, next, device, &[&ready])?
                            };
                            tasks.push(copy.clone());
                            ready = copy;
                            hand_offs += 1;
                        }
                        input_view = boundary.view(next);
                    }
                }
                // Whatever happened, both mappings end; the output is copied back only when
                // every stage succeeded.
                let first = first_compute.unwrap_or_else(|| ready.clone());
                let released = s.unmap(self.stages[0].device, x, &[&first], true, at)?;
                let done = s.unmap(self.stages[last].device, y, &[&ready], true, at)?;
                tasks.extend([released, done.clone()]);
                pending.push_back(done);
                batches.push(tasks);
            }
            Ok(())
        });
        // The first micro-batch that failed, with its own error (not a dependency's).
        for (b, tasks) in batches.iter().enumerate() {
            let errors: Vec<Error> = tasks.iter().filter_map(|t| t.wait().err()).collect();
            if let Some(e) = errors.iter().find(|e| !matches!(e, Error::Dependency { .. })).or(errors.first())
            {
                return Err(Error::Batch { batch: b, source: Box::new(e.clone()) });
            }
        }
        scope??;
        Ok(StageReport { micro_batches: inputs.len(), hand_offs, elapsed: start.elapsed() })
    }

    /// The device scratch between every two stages: `in_flight` anchors of the first
    /// stage's output length, each mapped `alloc` on both stages' devices (once when they
    /// share one), with the device addresses of a hand-off when the devices differ.
    fn map_boundaries(&mut self) -> Result<()> {
        let rt = self.rt;
        for pair in self.stages.windows(2) {
            let (from, to) = (pair[0].device, pair[1].device);
            let mut slots = Vec::new();
            for _ in 0..self.in_flight {
                // Host memory no copy ever reads or writes (alloc maps, device-to-device
                // hand-offs): it only names the device copies, and is not pinned.
                // SAFETY: a `DeviceCopy` type accepts every bit pattern, zero included.
                let anchor: Vec<T> = vec![unsafe { std::mem::zeroed() }; pair[0].out_len];
                let mut b = Boundary { anchor, devices: Vec::new(), copy: None };
                let mapped = b.map(rt, from, to);
                // Kept also when it failed part-way: `Drop` unmaps what it mapped before the
                // anchor is freed.
                slots.push(b);
                if let Err(e) = mapped {
                    self.boundaries.push(slots);
                    return Err(e);
                }
            }
            self.boundaries.push(slots);
        }
        Ok(())
    }
}

impl<T: DeviceCopy> Drop for StagePipeline<'_, '_, T> {
    fn drop(&mut self) {
        // Inside a recorded body too (see `recorder::outside`).
        crate::rt::recorder::outside(|| {
            for b in self.boundaries.iter().flatten() {
                for &d in &b.devices {
                    // SAFETY: release copies nothing; the anchor is still alive.
                    let _ = unsafe { self.rt.exit_data(d, &[MapItem::slice(&b.anchor, MapType::RELEASE)]) };
                }
            }
        })
    }
}

/// An activation between two stages, for one micro-batch in flight: device scratch behind
/// a host anchor, mapped on the devices listed.
#[derive(Debug)]
struct Boundary<T> {
    anchor: Vec<T>,
    devices: Vec<usize>,
    /// (destination, source) device addresses of the hand-off; `None` when both stages
    /// share a device.
    copy: Option<(u64, u64)>,
}

impl<T> Boundary<T> {
    /// Maps the anchor `alloc` on the stages' devices `from` and `to` (once when they are
    /// one), each listed in `devices` once mapped, and takes the hand-off's addresses.
    fn map(&mut self, rt: &Runtime, from: usize, to: usize) -> Result<()> {
        for d in if from == to { vec![from] } else { vec![from, to] } {
            // SAFETY: the anchor lives in the boundary, which is unmapped from every device
            // in `devices` before the anchor is freed (`StagePipeline`'s drop, which every
            // boundary reaches, mapped in full or not); alloc copies nothing.
            unsafe { rt.enter_data(d, &[MapItem::slice(&self.anchor, MapType::ALLOC)])? };
            self.devices.push(d);
        }
        if from != to {
            let host = self.anchor.as_ptr() as usize;
            let addr = |d: usize| -> Result<u64> {
                rt.mapped_ptr(host, d)?.ok_or(Error::InvalidArgument {
                    routine: "StagePipeline::new",
                    what: format!("device {d}: a boundary buffer just mapped is not present"),
                })
            };
            self.copy = Some((addr(to)?, addr(from)?));
        }
        Ok(())
    }

    /// The activation's view on `device`, writable by kernels.
    fn view(&self, device: usize) -> DeviceSlice<'_, T> {
        scratch_view_of(&self.anchor, device)
    }

    /// Its size in bytes.
    fn bytes(&self) -> usize {
        std::mem::size_of_val(self.anchor.as_slice())
    }
}
