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
use std::marker::PhantomData;
use std::panic::Location;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use parking_lot::Mutex;

use super::outputs::{BatchOutputs, One, OutputShape, RowOutputs};
use super::serve::{
    refuse_inside_a_task, reply, serve_batches, Formed, Intake, ServeConfig, ServeReport, Served,
};
use crate::api::{scratch_view_of, Device, DeviceSlice, ErasedView, Map};
use crate::data_env::MapItem;
use crate::data_env::MapType;
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;
use crate::nowait::Task;
use crate::rt::Runtime;

/// What a stage computes: `(device, micro-batch, input, output)`.
type StageFn<'f, In, Out> =
    dyn Fn(&Device<'_>, usize, DeviceSlice<'_, In>, DeviceSlice<'_, Out>) -> Result<()> + Send + Sync + 'f;

/// A stage before the last, its types erased (its views typed back inside).
type InnerFn<'f> =
    dyn Fn(&Device<'_>, usize, ErasedView<'_>, ErasedView<'_>) -> Result<()> + Send + Sync + 'f;

/// The last stage, its input's type erased, writing the pipe's outputs.
type LastFn<'f, Out> = dyn Fn(&Device<'_>, usize, ErasedView<'_>, <Out as OutputShape>::Views<'_>) -> Result<()>
    + Send
    + Sync
    + 'f;

/// One stage of a [`StagePipeline`]: its device, the length of its output per micro-batch
/// (the next stage's input, or the pipe's output), and what it computes, from elements
/// `In` to elements `Out` (the same type unless said otherwise).
pub struct Stage<'f, In, Out = In> {
    device: usize,
    out_len: usize,
    compute: Box<StageFn<'f, In, Out>>,
}

impl<In, Out> std::fmt::Debug for Stage<'_, In, Out> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("device", &self.device)
            .field("out_len", &self.out_len)
            .finish_non_exhaustive()
    }
}

impl<'f, In: DeviceCopy, Out: DeviceCopy> Stage<'f, In, Out> {
    /// A stage on `device` whose output has `out_len` elements per micro-batch, computing
    /// `compute(device, micro_batch, input, output)` (the output view is writable by
    /// kernels: device scratch, or the pipe's output mapping).
    pub fn new(
        device: usize,
        out_len: usize,
        compute: impl Fn(&Device<'_>, usize, DeviceSlice<'_, In>, DeviceSlice<'_, Out>) -> Result<()>
            + Send
            + Sync
            + 'f,
    ) -> Self {
        Self { device, out_len, compute: Box::new(compute) }
    }

    /// The stage's device.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The stage with its types erased, and how to make the activation it writes.
    fn erase(self) -> Inner<'f> {
        let compute = self.compute;
        Inner {
            device: self.device,
            out_len: self.out_len,
            compute: Box::new(move |dev, mb, x, y| compute(dev, mb, x.typed(ROUTINE)?, y.typed(ROUTINE)?)),
            boundary: |len| Box::new(Boundary::<Out>::new(len)),
        }
    }
}

/// What names a stage pipeline's internal errors (a view of an unexpected type).
const ROUTINE: &str = "StagePipeline::run";

/// A stage before the last, types erased.
struct Inner<'f> {
    device: usize,
    out_len: usize,
    compute: Box<InnerFn<'f>>,
    /// An activation of this stage's output type, of `len` elements.
    boundary: fn(usize) -> Box<dyn Handoff>,
}

/// The last stage: its device, its outputs' lengths per micro-batch, what it computes.
struct Last<'f, Out: OutputShape> {
    device: usize,
    out_lens: Vec<usize>,
    compute: Box<LastFn<'f, Out>>,
}

/// Stages whose element types change from one to the next (f32 in, bf16 between stages,
/// f32 probabilities and u32 classes out), checked by the compiler: each stage's input
/// type is the one before's output type. [`StageChain::build`] makes the pipe with the
/// last stage's one output, [`StageChain::build_outputs`] with a last stage of several.
///
/// ```
/// use offload::half::bf16;
/// use offload::pipeline::{Stage, StageChain};
/// use offload::Runtime;
///
/// #[offload::kernel]
/// fn narrow(i: usize, x: &[f32], y: &mut [bf16]) {
///     y[i] = bf16::from_f32(x[i]);
/// }
///
/// #[offload::kernel]
/// fn widen_twice(i: usize, x: &[bf16], y: &mut [f32]) {
///     y[i] = 2.0 * x[i].to_f32();
/// }
///
/// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
/// let mut pipe = StageChain::new(Stage::new(0, 8, |dev, _mb, x, y| narrow::launch(dev, 8, x, y)))
///     .then(Stage::new(1, 8, |dev, _mb, x, y| widen_twice::launch(dev, 8, x, y)))
///     .build(&rt, 2)?;
/// let inputs = vec![vec![1.5f32; 8], vec![-3.0; 8]];
/// let mut outputs = vec![vec![0f32; 8]; 2];
/// pipe.run(&inputs, &mut outputs)?;
/// assert_eq!(outputs, vec![vec![3.0f32; 8], vec![-6.0; 8]]);
/// # Ok::<(), offload::Error>(())
/// ```
pub struct StageChain<'f, In, T> {
    /// Every stage so far, in order; the newest writes `T`.
    stages: Vec<Inner<'f>>,
    _types: PhantomData<fn(In) -> T>,
}

impl<In, T> std::fmt::Debug for StageChain<'_, In, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices: Vec<usize> = self.stages.iter().map(|s| s.device).collect();
        f.debug_struct("StageChain").field("devices", &devices).finish_non_exhaustive()
    }
}

impl<'f, In: DeviceCopy, T: DeviceCopy> StageChain<'f, In, T> {
    /// A chain of one stage, from `In` to `T`.
    pub fn new(first: Stage<'f, In, T>) -> Self {
        Self { stages: vec![first.erase()], _types: PhantomData }
    }

    /// The chain with `next` after its stages, taking their output type `T`.
    pub fn then<U: DeviceCopy>(mut self, next: Stage<'f, T, U>) -> StageChain<'f, In, U> {
        self.stages.push(next.erase());
        StageChain { stages: self.stages, _types: PhantomData }
    }

    /// The pipe of these stages, the last one's output (`T`) its output, with up to
    /// `in_flight` micro-batches in it at once.
    ///
    /// # Errors
    /// As [`StagePipeline::new`].
    pub fn build<'rt>(
        mut self,
        rt: &'rt Runtime,
        in_flight: usize,
    ) -> Result<StagePipeline<'rt, 'f, In, One<T>>> {
        let last = self.stages.pop().map(Inner::into_last::<T>);
        StagePipeline::assemble(rt, self.stages, last, in_flight)
    }

    /// The pipe of these stages and then a last stage on `device` that writes several
    /// outputs per micro-batch from the chain's `T`: `O` is `(A, B)` or `(A, B, C)` of
    /// their element types (as [`Pipeline::serve_outputs`](super::Pipeline::serve_outputs)
    /// takes), `lens` their lengths per micro-batch, and `compute(device, micro_batch,
    /// input, (a, b))` gets their views in the same order.
    ///
    /// ```
    /// use offload::pipeline::{Stage, StageChain};
    /// use offload::Runtime;
    ///
    /// #[offload::kernel]
    /// fn square(i: usize, x: &[f32], y: &mut [f32]) {
    ///     y[i] = x[i] * x[i];
    /// }
    ///
    /// // Each micro-batch's 4 values: their sum and the index of the largest.
    /// #[offload::kernel]
    /// fn summarise(_i: usize, x: &[f32], sum: &mut [f32], best: &mut [u32]) {
    ///     let mut s = 0.0f32;
    ///     let mut b = 0u32;
    ///     for j in 0usize..4 {
    ///         s += x[j];
    ///         if x[j] > x[b as usize] {
    ///             b = j as u32;
    ///         }
    ///     }
    ///     sum[0] = s;
    ///     best[0] = b;
    /// }
    ///
    /// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
    /// let mut pipe = StageChain::new(Stage::new(0, 4, |dev, _, x, y| square::launch(dev, 4, x, y)))
    ///     .build_outputs::<(f32, u32)>(&rt, 2, 1, (1, 1), |dev, _, x, (sum, best)| {
    ///         summarise::launch(dev, 1, x, sum, best)
    ///     })?;
    /// let inputs = vec![vec![1f32, -3.0, 2.0, 0.0]];
    /// let mut outputs = vec![(vec![0f32], vec![0u32])];
    /// pipe.run(&inputs, &mut outputs)?;
    /// assert_eq!(outputs, vec![(vec![14.0f32], vec![1u32])]);
    /// # Ok::<(), offload::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`StagePipeline::new`], and [`Error::InvalidArgument`] for an output of length 0.
    pub fn build_outputs<'rt, O: RowOutputs>(
        self,
        rt: &'rt Runtime,
        in_flight: usize,
        device: usize,
        lens: O::RowLens,
        compute: impl Fn(&Device<'_>, usize, DeviceSlice<'_, T>, <O::Shape as OutputShape>::Views<'_>) -> Result<()>
            + Send
            + Sync
            + 'f,
    ) -> Result<StagePipeline<'rt, 'f, In, O::Shape>> {
        let last = Last {
            device,
            out_lens: O::lens(lens),
            compute: Box::new(move |dev, mb, x: ErasedView<'_>, y| compute(dev, mb, x.typed(ROUTINE)?, y)),
        };
        StagePipeline::assemble(rt, self.stages, Some(last), in_flight)
    }
}

impl<'f> Inner<'f> {
    /// The stage as a pipe's last, writing its one output of `T` (its output type).
    fn into_last<T: DeviceCopy>(self) -> Last<'f, One<T>> {
        let compute = self.compute;
        Last {
            device: self.device,
            out_lens: vec![self.out_len],
            compute: Box::new(move |dev, mb, x, y: DeviceSlice<'_, T>| {
                compute(dev, mb, x, ErasedView::of(y))
            }),
        }
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

/// Micro-batches through stages on devices; see the module documentation. `In` is the
/// first stage's input element type; `Out` the last stage's outputs' shape: [`One<T>`] for
/// one output of `T` (the default: `T = In`), a tuple of them for several
/// ([`StageChain::build_outputs`]).
pub struct StagePipeline<'rt, 'f, In: DeviceCopy, Out: OutputShape = One<In>> {
    rt: &'rt Runtime,
    /// Every stage but the last, in order.
    inner: Vec<Inner<'f>>,
    last: Last<'f, Out>,
    in_flight: usize,
    /// After each inner stage `s` (between it and the next), one per micro-batch in flight.
    boundaries: Vec<Vec<Box<dyn Handoff>>>,
    _input: PhantomData<fn(&In)>,
}

impl<In: DeviceCopy, Out: OutputShape> std::fmt::Debug for StagePipeline<'_, '_, In, Out> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices: Vec<usize> = self.inner.iter().map(|s| s.device).chain([self.last.device]).collect();
        f.debug_struct("StagePipeline")
            .field("devices", &devices)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl<'rt, 'f, T: DeviceCopy> StagePipeline<'rt, 'f, T> {
    /// A pipe of `stages` of one element type, in order, with up to `in_flight`
    /// micro-batches in it at once (at least the number of stages keeps every stage busy).
    /// Stages whose types change: [`StageChain`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no stages or `in_flight` 0; [`Error::NoSuchDevice`]
    /// for a stage's device the runtime does not have.
    pub fn new(rt: &'rt Runtime, stages: Vec<Stage<'f, T>>, in_flight: usize) -> Result<Self> {
        let mut inner: Vec<Inner<'f>> = stages.into_iter().map(Stage::erase).collect();
        let last = inner.pop().map(Inner::into_last::<T>);
        Self::assemble(rt, inner, last, in_flight)
    }
}

impl<'rt, 'f, In: DeviceCopy, Out: OutputShape> StagePipeline<'rt, 'f, In, Out> {
    /// The pipe of `inner` stages then `last` (`None`: no stage at all), checked.
    fn assemble(
        rt: &'rt Runtime,
        inner: Vec<Inner<'f>>,
        last: Option<Last<'f, Out>>,
        in_flight: usize,
    ) -> Result<Self> {
        let bad = |what: String| Error::InvalidArgument { routine: "StagePipeline::new", what };
        let Some(last) = last else {
            return Err(bad("no stages; expected at least one".into()));
        };
        if in_flight == 0 {
            return Err(bad("0 micro-batches in flight; expected at least 1".into()));
        }
        let out_lens = inner.iter().map(|s| s.out_len).chain(last.out_lens.iter().copied());
        if let Some(i) = out_lens.clone().position(|len| len == 0) {
            let which = match i.checked_sub(inner.len()) {
                Some(k) if last.out_lens.len() > 1 => format!("stage {}'s output {k}", inner.len()),
                _ => format!("stage {i}"),
            };
            return Err(bad(format!("{which} makes 0 elements per micro-batch; expected at least 1")));
        }
        for d in inner.iter().map(|s| s.device).chain([last.device]) {
            rt.device(d)?;
        }
        let mut me = Self { rt, inner, last, in_flight, boundaries: Vec::new(), _input: PhantomData };
        me.map_boundaries()?;
        Ok(me)
    }

    /// The device of stage `s` (the last being `inner.len()`).
    fn device_of(&self, s: usize) -> usize {
        self.inner.get(s).map_or(self.last.device, |st| st.device)
    }

    /// Runs every micro-batch: `inputs[i]` into the first stage, the last stage's
    /// output(s) into `outputs[i]` (a `Vec`, slice or [`crate::HostBuffer`] of the last
    /// stage's `out_len`; a tuple of them for several outputs). A run takes the pipeline
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
        I: AsRef<[In]> + Sync,
        O: BatchOutputs<Shape = Out>,
    {
        let at = Location::caller();
        let bad = |what: String| Error::InvalidArgument { routine: "StagePipeline::run", what };
        if inputs.len() != outputs.len() {
            return Err(bad(format!("{} input micro-batches but {} outputs", inputs.len(), outputs.len())));
        }
        for (i, o) in outputs.iter_mut().enumerate() {
            for (k, (len, want)) in o.lens().into_iter().zip(&self.last.out_lens).enumerate() {
                if len != *want {
                    let which = if self.last.out_lens.len() == 1 {
                        format!("output {i}")
                    } else {
                        format!("output {i}.{k}")
                    };
                    return Err(bad(format!("{which} has {len} elements; the last stage makes {want}")));
                }
            }
        }
        let start = Instant::now();
        let (rt, boundaries) = (self.rt, &self.boundaries);
        let (first_device, last) = (self.device_of(0), self.inner.len());
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
                    s.enter_at(first_device, Map::shared(input.as_ref(), MapType::TO), &[], at)?;
                let (t_out, y) = s.enter_at(self.last.device, output.maps(), &[], at)?;
                tasks.extend([t_in.clone(), t_out.clone()]);
                let (mut ready, mut input_view) = (t_in, ErasedView::of(x));
                let mut first_compute = None;
                for st in 0..=last {
                    let device = self.device_of(st);
                    let stage_error = move |e| Error::Stage { stage: st, device, source: Box::new(e) };
                    // The activation this stage writes; none after the last.
                    let boundary = boundaries.get(st).map(|slots| &*slots[slot]);
                    let task = match (boundary, self.inner.get(st)) {
                        (Some(boundary), Some(stage)) => {
                            let (compute, out_view) = (&stage.compute, boundary.view(device));
                            s.compute(device, &[&ready], move |dev| {
                                compute(dev, b, input_view, out_view).map_err(stage_error)
                            })?
                        }
                        _ => {
                            let compute = &self.last.compute;
                            s.compute(device, &[&ready, &t_out], move |dev| {
                                compute(dev, b, input_view, y).map_err(stage_error)
                            })?
                        }
                    };
                    tasks.push(task.clone());
                    first_compute.get_or_insert_with(|| task.clone());
                    ready = task;
                    if let Some(boundary) = boundary {
                        let next = self.device_of(st + 1);
                        if let Some((dst, src)) = boundary.copy() {
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
                let released = s.unmap(first_device, x, &[&first], true, at)?;
                let done = s.unmap(self.last.device, y, &[&ready], true, at)?;
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

    /// Serves requests through the pipe, as [`Pipeline::serve_outputs`](super::Pipeline::serve_outputs)
    /// does over devices (the same [`Intake`], [`ServeConfig`] and [`ServeReport`]; `O` is
    /// the output element type, or a tuple of them, that the last stage writes): each batch
    /// formed is one micro-batch of `max_rows` rows, for stages compute on fixed sizes (the
    /// first stage's input `max_rows * in_row` elements, the last stage's outputs `max_rows`
    /// rows of `out_row`), a partial batch padded with copies of its last element and the
    /// padding's results dropped. The batches ready together go through the pipe together,
    /// up to `in_flight` at once (the stages' `micro_batch` numbers count each group from
    /// 0). A failing micro-batch fails its own requests; the batches after it in its group
    /// run again. The report counts the pipe as one device.
    ///
    /// ```
    /// use std::time::Duration;
    /// use offload::pipeline::{Intake, ServeConfig, Stage, StagePipeline};
    /// use offload::Runtime;
    ///
    /// #[offload::kernel]
    /// fn add_one(i: usize, x: &[f32], y: &mut [f32]) {
    ///     y[i] = x[i] + 1.0;
    /// }
    ///
    /// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
    /// // Batches of 4 rows of 2: 8 elements through each stage.
    /// let stages = vec![
    ///     Stage::new(0, 8, |dev, _, x, y| add_one::launch(dev, 8, x, y)),
    ///     Stage::new(1, 8, |dev, _, x, y| add_one::launch(dev, 8, x, y)),
    /// ];
    /// let config = ServeConfig { in_row: 2, out_row: 2, max_rows: 4, deadline: Duration::from_millis(1), max_queued: None };
    /// let (answer, report) = StagePipeline::new(&rt, stages, 2)?
    ///     .serve(config, |intake: &Intake<'_, f32, f32>| intake.submit_rows(vec![1.0, 2.0, 3.0, 4.0])?.wait())?;
    /// assert_eq!(answer?, vec![3.0, 4.0, 5.0, 6.0]);
    /// assert_eq!(report.requests, 1);
    /// # Ok::<(), offload::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero in `config`, or a first stage or last stage
    /// whose sizes are not `max_rows` rows of the configuration's; a failing batch is
    /// reported to its requests.
    pub fn serve<O, C, R>(&mut self, config: ServeConfig<O::RowLens>, clients: C) -> Result<(R, ServeReport)>
    where
        O: RowOutputs<Shape = Out>,
        C: FnOnce(&Intake<'_, In, O>) -> R,
    {
        refuse_inside_a_task("StagePipeline::serve")?;
        let ServeConfig { in_row, out_row, max_rows, .. } = config;
        let want: Vec<usize> = O::lens(out_row).into_iter().map(|l| l.saturating_mul(max_rows)).collect();
        if in_row == 0 || max_rows == 0 || want.contains(&0) || want != self.last.out_lens {
            return Err(Error::InvalidArgument {
                routine: "StagePipeline::serve",
                what: format!(
                    "in_row {in_row}, out_row {out_row:?}, max_rows {max_rows} for a last stage making {:?} \
                     elements per micro-batch; expected each at least 1, and max_rows rows of out_row",
                    self.last.out_lens
                ),
            });
        }
        let len = in_row.checked_mul(max_rows).ok_or(Error::Overflow {
            routine: "StagePipeline::serve",
            what: format!("a batch's elements, max_rows {max_rows} x in_row {in_row},"),
        })?;
        let in_flight = self.in_flight;
        let consume = |formed: Receiver<Formed<In, O>>, served: &Mutex<Served>| {
            while let Ok(first) = formed.recv() {
                // What is ready goes through the pipe together.
                let mut group: VecDeque<Formed<In, O>> = VecDeque::from([first]);
                while group.len() < in_flight {
                    match formed.try_recv() {
                        Ok(b) => group.push_back(b),
                        Err(_) => break,
                    }
                }
                while !group.is_empty() {
                    let inputs: Vec<Vec<In>> = group
                        .iter()
                        .map(|(_, requests)| {
                            let mut x: Vec<In> =
                                requests.iter().flat_map(|r| r.row.iter().copied()).collect();
                            if let Some(&pad) = x.last() {
                                x.resize(len, pad);
                            }
                            x
                        })
                        .collect();
                    let mut outputs: Vec<O::Buffers> =
                        group.iter().map(|_| O::buffers(max_rows, out_row)).collect();
                    let result = self.run(&inputs, &mut outputs);
                    // The micro-batches up to a failing one ran; those after it go again.
                    let ran = match &result {
                        Err(Error::Batch { batch, .. }) => batch + 1,
                        _ => group.len(),
                    };
                    for (i, ((batch, requests), output)) in group.drain(..ran).zip(&outputs).enumerate() {
                        let run = match &result {
                            Err(Error::Batch { batch: failed, source }) if *failed == i => {
                                Err((**source).clone())
                            }
                            Err(Error::Batch { .. }) | Ok(_) => Ok(()),
                            Err(e) => Err(e.clone()),
                        };
                        served.lock().record(0, batch, reply::<In, O>(run, batch, requests, output, out_row));
                    }
                }
            }
        };
        Ok(serve_batches(config, 1, consume, clients))
    }

    /// The device scratch after every stage but the last: `in_flight` activations of the
    /// stage's output type and length, each mapped `alloc` on its device and the next
    /// stage's (once when they share one), with the device addresses of a hand-off when the
    /// devices differ.
    fn map_boundaries(&mut self) -> Result<()> {
        let rt = self.rt;
        for s in 0..self.inner.len() {
            let (from, to) = (self.inner[s].device, self.device_of(s + 1));
            let mut slots = Vec::new();
            for _ in 0..self.in_flight {
                let mut b = (self.inner[s].boundary)(self.inner[s].out_len);
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

impl<In: DeviceCopy, Out: OutputShape> Drop for StagePipeline<'_, '_, In, Out> {
    fn drop(&mut self) {
        // Inside a recorded body too (see `recorder::outside`).
        crate::rt::recorder::outside(|| {
            for b in self.boundaries.iter().flatten() {
                b.release(self.rt);
            }
        })
    }
}

/// An activation between two stages, its element type erased: what the pipe does with it.
trait Handoff: Send + Sync {
    /// Maps it `alloc` on `from` and `to` (once when they are one).
    fn map(&mut self, rt: &Runtime, from: usize, to: usize) -> Result<()>;
    /// Its view on `device`, writable by kernels.
    fn view(&self, device: usize) -> ErasedView<'_>;
    /// (destination, source) device addresses of the hand-off; `None` within one device.
    fn copy(&self) -> Option<(u64, u64)>;
    /// Its size in bytes.
    fn bytes(&self) -> usize;
    /// Unmaps it from every device it was mapped on.
    fn release(&self, rt: &Runtime);
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

impl<T: DeviceCopy> Boundary<T> {
    /// An activation of `len` elements, not yet mapped.
    fn new(len: usize) -> Self {
        // Host memory no copy ever reads or writes (alloc maps, device-to-device
        // hand-offs): it only names the device copies, and is not pinned.
        // SAFETY: a `DeviceCopy` type accepts every bit pattern, zero included.
        let anchor: Vec<T> = vec![unsafe { std::mem::zeroed() }; len];
        Self { anchor, devices: Vec::new(), copy: None }
    }
}

impl<T: DeviceCopy> Handoff for Boundary<T> {
    /// Each device is listed in `devices` once mapped, and the hand-off's addresses taken.
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

    fn view(&self, device: usize) -> ErasedView<'_> {
        ErasedView::of(scratch_view_of(&self.anchor, device))
    }

    fn copy(&self) -> Option<(u64, u64)> {
        self.copy
    }

    fn bytes(&self) -> usize {
        std::mem::size_of_val(self.anchor.as_slice())
    }

    fn release(&self, rt: &Runtime) {
        for &d in &self.devices {
            // SAFETY: release copies nothing; the anchor is still alive.
            let _ = unsafe { rt.exit_data(d, &[MapItem::slice(&self.anchor, MapType::RELEASE)]) };
        }
    }
}
