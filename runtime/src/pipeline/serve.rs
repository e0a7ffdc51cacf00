//! A long-lived pipeline fed by requests over time (an inference server's batching loop):
//! [`Pipeline::serve`] (one output) and [`Pipeline::serve_outputs`] (several), their
//! [`Intake`], [`Ticket`]s and [`ServeReport`]. A request is one row or several
//! ([`Intake::submit_rows`]), never split across batches; the intake may be bounded
//! ([`ServeConfig::max_queued`]), a full one blocking ([`Intake::submit`]) or refusing
//! ([`Intake::try_submit`]) a submission.

use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender, TryRecvError, TrySendError};
use parking_lot::Mutex;

use super::{queue_batch, BatchOutputs, DeviceStates, OutputShape, Pipeline, RowOutputs};
use crate::api::{Device, DeviceSlice, Map};
use crate::data_env::MapType;
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;

/// The shape of a server's requests and batches; see the module documentation. `L` is
/// how the output rows are measured: a `usize` for one output ([`Pipeline::serve`]), a
/// tuple of them for several ([`Pipeline::serve_outputs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeConfig<L = usize> {
    /// Elements of each request's input row (at least 1).
    pub in_row: usize,
    /// Elements of each request's output row, or of its row of each output in order
    /// (each at least 1).
    pub out_row: L,
    /// Rows in a batch at most (at least 1); also the most rows one request may have.
    pub max_rows: usize,
    /// How long after its first request's submission a batch that is not full starts.
    /// A deadline too long to add to an instant (such as `Duration::MAX`) means none: a
    /// batch then starts only once full or when the server shuts down.
    pub deadline: Duration,
    /// Requests waiting in the intake at most, beside the batch being formed (backpressure:
    /// then [`Intake::submit`] waits for room and [`Intake::try_submit`] refuses); `None`
    /// for no bound. `Some(0)` takes a request only when the batcher is ready for it.
    pub max_queued: Option<usize>,
}

/// A request in flight: its rows (`rows` of `in_row` elements, one after another), when
/// it was submitted, and where its answer goes.
pub(super) struct Request<In, Out: RowOutputs> {
    pub(super) row: Vec<In>,
    pub(super) rows: usize,
    submitted: Instant,
    reply: Sender<Result<Answer<Out>>>,
}

/// What the intake carries to the batcher.
enum Message<In, Out: RowOutputs> {
    Request(Request<In, Out>),
    /// No more requests: run what is pending and stop.
    Close,
}

/// Where requests go into a server ([`Pipeline::serve`]); cheap to clone, and shared or
/// cloned into the threads that submit.
pub struct Intake<'s, In, Out: RowOutputs> {
    tx: Sender<Message<In, Out>>,
    closed: &'s AtomicBool,
    in_row: usize,
    max_rows: usize,
}

impl<In, Out: RowOutputs> Clone for Intake<'_, In, Out> {
    fn clone(&self) -> Self {
        Self { tx: self.tx.clone(), closed: self.closed, in_row: self.in_row, max_rows: self.max_rows }
    }
}

impl<In, Out: RowOutputs> std::fmt::Debug for Intake<'_, In, Out> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake")
            .field("in_row", &self.in_row)
            .field("max_rows", &self.max_rows)
            .field("queued", &self.tx.len())
            .finish()
    }
}

/// What [`Intake::try_submit`] did with a request.
#[derive(Debug)]
#[must_use = "a queued request's ticket is how its result comes back; a refused one's rows are given back"]
pub enum Submitted<In, Out: RowOutputs> {
    /// Queued: its ticket.
    Queued(Ticket<Out>),
    /// Refused, the intake being full ([`ServeConfig::max_queued`]): its rows, given back.
    Full(Vec<In>),
}

impl<In: DeviceCopy, Out: RowOutputs> Intake<'_, In, Out> {
    /// Submits a request of one row (the server's `in_row` elements), run in the next
    /// batch formed; the ticket gives its result. With a bounded intake
    /// ([`ServeConfig::max_queued`]) that is full, waits for room.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a row of another length; [`Error::ServerClosed`]
    /// once the intake has closed.
    pub fn submit(&self, row: Vec<In>) -> Result<Ticket<Out>> {
        if row.len() != self.in_row {
            return Err(Error::InvalidArgument {
                routine: "Intake::submit",
                what: format!("a row of {} elements; the server takes rows of {}", row.len(), self.in_row),
            });
        }
        self.send(row, true).map(|s| match s {
            Submitted::Queued(ticket) => ticket,
            Submitted::Full(_) => unreachable!("a blocking send waits for room"),
        })
    }

    /// Submits a request of several rows (`rows.len()` a multiple of `in_row`, at most
    /// `max_rows` rows), run as one unit: all its rows in the same batch, never split, its
    /// ticket giving its output rows one after another and one latency. With a bounded
    /// intake that is full, waits for room.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no rows, a length that is not a whole number of
    /// rows, or more rows than a batch holds (such a request could never run);
    /// [`Error::ServerClosed`] once the intake has closed.
    pub fn submit_rows(&self, rows: Vec<In>) -> Result<Ticket<Out>> {
        self.check_rows("Intake::submit_rows", &rows)?;
        self.send(rows, true).map(|s| match s {
            Submitted::Queued(ticket) => ticket,
            Submitted::Full(_) => unreachable!("a blocking send waits for room"),
        })
    }

    /// [`Intake::submit_rows`] that does not wait: with a bounded intake that is full, the
    /// request is refused and its rows given back ([`Submitted::Full`]), for the caller to
    /// retry, shed or answer "busy".
    ///
    /// # Errors
    /// As [`Intake::submit_rows`].
    pub fn try_submit(&self, rows: Vec<In>) -> Result<Submitted<In, Out>> {
        self.check_rows("Intake::try_submit", &rows)?;
        self.send(rows, false)
    }

    fn check_rows(&self, routine: &'static str, rows: &[In]) -> Result<()> {
        let (len, in_row) = (rows.len(), self.in_row);
        if len == 0 || len % in_row != 0 || len / in_row > self.max_rows {
            return Err(Error::InvalidArgument {
                routine,
                what: format!(
                    "a request of {len} elements; expected 1 to {} rows of {in_row} (a request never \
                     spans two batches, and a batch holds {} rows)",
                    self.max_rows, self.max_rows
                ),
            });
        }
        Ok(())
    }

    /// Queues `row` (checked), waiting for room when `wait`.
    fn send(&self, row: Vec<In>, wait: bool) -> Result<Submitted<In, Out>> {
        let closed = || Error::ServerClosed { what: "a request submitted after the intake closed" };
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        let (reply, answer) = crossbeam_channel::bounded(1);
        let rows = row.len() / self.in_row;
        let message = Message::Request(Request { row, rows, submitted: Instant::now(), reply });
        let sent = if wait {
            self.tx.send(message).map_err(|_| closed())
        } else {
            match self.tx.try_send(message) {
                Ok(()) => Ok(()),
                Err(TrySendError::Full(Message::Request(r))) => return Ok(Submitted::Full(r.row)),
                Err(_) => Err(closed()),
            }
        };
        sent.map(|()| Submitted::Queued(Ticket { answer }))
    }
}

/// Closes the intake when dropped: after `clients` returned, and while unwinding from its
/// panic (so the batcher and the device threads end, and the scope with them).
struct CloseOnDrop<'s, In, Out: RowOutputs> {
    tx: Sender<Message<In, Out>>,
    closed: &'s AtomicBool,
}

impl<In, Out: RowOutputs> Drop for CloseOnDrop<'_, In, Out> {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Release);
        // The batcher holds the receiver until it has seen this message.
        let _ = self.tx.send(Message::Close);
    }
}

/// A submitted request's result, to wait for.
#[derive(Debug)]
#[must_use = "a ticket is how the request's result comes back"]
pub struct Ticket<Out: RowOutputs> {
    answer: Receiver<Result<Answer<Out>>>,
}

impl<Out: RowOutputs> Ticket<Out> {
    /// Waits for the request's output rows (of each output for several), one after
    /// another.
    ///
    /// # Errors
    /// [`Error::Batch`] naming the request's batch when it failed; [`Error::ServerClosed`]
    /// for a request that came as the intake closed and was not run.
    pub fn wait(self) -> Result<Out::Rows> {
        self.answer().map(|a| a.row)
    }

    /// Waits for the request's whole answer: its row, batch and latency.
    ///
    /// # Errors
    /// As [`Ticket::wait`].
    pub fn answer(self) -> Result<Answer<Out>> {
        self.answer.recv().map_err(|_| Error::ServerClosed {
            what: "a request dropped unanswered: it came as the intake closed",
        })?
    }
}

/// A request's answer.
pub struct Answer<Out: RowOutputs> {
    /// Its output rows, one after another: a `Vec`, or a tuple of `Vec`s for several
    /// outputs.
    pub row: Out::Rows,
    /// The batch it ran in.
    pub batch: usize,
    /// From its submission to its result being available (the request's, whatever its
    /// number of rows).
    pub latency: Duration,
}

impl<Out: RowOutputs> Clone for Answer<Out>
where
    Out::Rows: Clone,
{
    fn clone(&self) -> Self {
        Self { row: self.row.clone(), batch: self.batch, latency: self.latency }
    }
}

impl<Out: RowOutputs> std::fmt::Debug for Answer<Out>
where
    Out::Rows: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("row", &self.row)
            .field("batch", &self.batch)
            .field("latency", &self.latency)
            .finish()
    }
}

impl<Out: RowOutputs> PartialEq for Answer<Out>
where
    Out::Rows: PartialEq,
{
    fn eq(&self, other: &Self) -> bool {
        (&self.row, self.batch, self.latency) == (&other.row, other.batch, other.latency)
    }
}

/// The spread of requests' latencies (submission to result available, one figure per
/// request whatever its rows); zero when there were none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    /// The median (the lower one for an even count).
    pub median: Duration,
    /// The 99th percentile (nearest rank).
    pub p99: Duration,
    /// The largest.
    pub max: Duration,
}

impl Latency {
    fn of(mut latencies: Vec<Duration>) -> Self {
        latencies.sort_unstable();
        let nearest_rank = |percent: usize| {
            let rank = (latencies.len() * percent).div_ceil(100).max(1);
            latencies.get(rank - 1).copied().unwrap_or_default()
        };
        Self { median: nearest_rank(50), p99: nearest_rank(99), max: nearest_rank(100) }
    }
}

/// What a server did, from its start to its shutdown.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeReport {
    /// Requests answered, with their rows or their batch's error.
    pub requests: usize,
    /// The rows of each batch formed, by batch index.
    pub batch_rows: Vec<usize>,
    /// The requests of each batch formed, by batch index.
    pub batch_requests: Vec<usize>,
    /// The configuration's `max_rows`: a full batch's rows.
    pub max_rows: usize,
    /// The batches that failed, in increasing order.
    pub failed_batches: Vec<usize>,
    /// Batches each device ran, in the order of the pipeline's devices.
    pub batches_per_device: Vec<usize>,
    /// Over every answered request.
    pub latency: Latency,
    /// From the start of `serve` to its shutdown.
    pub elapsed: Duration,
}

impl ServeReport {
    /// Batches formed.
    pub fn batches(&self) -> usize {
        self.batch_rows.len()
    }

    /// Rows run, over every batch.
    pub fn rows(&self) -> usize {
        self.batch_rows.iter().sum()
    }

    /// How full the batches were: rows run over the rows the batches could hold
    /// (`batches * max_rows`), from 0 to 1; 0 with no batch.
    ///
    /// ```
    /// # use offload::pipeline::{Latency, ServeReport};
    /// # use std::time::Duration;
    /// let r = ServeReport {
    ///     requests: 3,
    ///     batch_rows: vec![8, 4],
    ///     batch_requests: vec![2, 1],
    ///     max_rows: 8,
    ///     failed_batches: vec![],
    ///     batches_per_device: vec![2],
    ///     latency: Latency::default(),
    ///     elapsed: Duration::ZERO,
    /// };
    /// assert_eq!(r.fill(), 0.75);
    /// ```
    pub fn fill(&self) -> f64 {
        match self.batches() * self.max_rows {
            0 => 0.0,
            room => self.rows() as f64 / room as f64,
        }
    }
}

/// What the consumers (a server's device threads) have answered.
#[derive(Default)]
pub(super) struct Served {
    latencies: Vec<Duration>,
    failed: Vec<usize>,
    per_device: Vec<usize>,
}

impl Served {
    /// Batch `batch`, answered by consumer `k`.
    pub(super) fn record(&mut self, k: usize, batch: usize, answers: Answered) {
        self.per_device[k] += 1;
        if answers.failed {
            self.failed.push(batch);
        }
        self.latencies.extend(answers.latencies);
    }
}

/// A batch formed: its index and its requests, in submission order.
pub(super) type Formed<In, Out> = (usize, Vec<Request<In, Out>>);

/// The rows and requests of each batch formed, by batch index.
#[derive(Default)]
struct BatchLog {
    rows: Vec<usize>,
    requests: Vec<usize>,
}

/// What makes a device's state for a served pipeline ([`Pipeline::serve_outputs`]'s `init`).
type StateInit<'f, 'rt, S> = dyn Fn(&Device<'rt>) -> Result<S> + Sync + 'f;

/// A served pipeline's batch computation ([`Pipeline::serve_outputs`]'s `compute`).
type ServeCompute<'f, S, In, Out> = dyn Fn(
        &Device<'_>,
        &mut S,
        usize,
        usize,
        DeviceSlice<'_, In>,
        <<Out as RowOutputs>::Shape as OutputShape>::Views<'_>,
    ) -> Result<()>
    + Sync
    + 'f;

impl<'rt> Pipeline<'rt> {
    /// Serves requests until `clients` returns: requests (a row of `in_row` elements, or
    /// several: [`Intake::submit_rows`]) come from any thread through the [`Intake`] that
    /// `clients` gets, and are grouped into batches of up to `max_rows` rows, a request
    /// never split (one that does not fit starts the next batch), and each batch runs as in
    /// [`Pipeline::run_with`]: copy-in, compute and copy-out on a device's three lanes, up
    /// to `slots` batches in flight per device, each taken by a device with a free slot.
    /// A batch is ready when it is full, or `deadline` after its first request's
    /// submission, whichever comes first, and starts once a device has a free slot (taking
    /// more requests meanwhile, up to `max_rows`, so batches grow under load). With
    /// [`ServeConfig::max_queued`] the intake holds that many requests at most, and a full
    /// one blocks [`Intake::submit`] or refuses [`Intake::try_submit`].
    /// `compute(device, state, batch, rows, input, output)` runs a
    /// batch of `rows` rows (`rows * in_row` elements in, `rows * out_row` out) on the
    /// device's compute lane, with the device's state, made by `init` before its first
    /// batch. Each request's rows of results go back through its [`Ticket`], with its
    /// latency (submission to result available); the [`ServeReport`] gives the latencies'
    /// spread over requests and how full the batches were. Constructs are traced at the caller.
    ///
    /// A failing batch (an error or a panic of `compute` or `init`) fails the requests of
    /// that batch only, each with [`Error::Batch`] naming it; the server goes on with the
    /// next batches (so a device that fails for good fails every batch it takes). When
    /// `clients` returns (or panics), the intake closes: the requests already submitted run
    /// (a partial batch at once, without waiting for its deadline), later ones are refused
    /// with [`Error::ServerClosed`], and `serve` returns `clients`' value and a
    /// [`ServeReport`] (or resumes the panic). Nothing stays mapped: each batch is unmapped
    /// as it ends, and the per-device states are dropped before `serve` returns.
    ///
    /// ```
    /// use std::time::Duration;
    /// use offload::pipeline::{Pipeline, ServeConfig};
    /// use offload::Runtime;
    ///
    /// #[offload::kernel]
    /// fn twice(i: usize, x: &[f32], y: &mut [f32]) {
    ///     y[i] = 2.0 * x[i];
    /// }
    ///
    /// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
    /// let config = ServeConfig { in_row: 4, out_row: 4, max_rows: 8, deadline: Duration::from_millis(2), max_queued: None };
    /// let pipeline = Pipeline::new(&rt, &[0, 1], 2)?;
    /// let no_state = |_: &offload::Device<'_>| Ok(());
    /// let (answers, report) = pipeline.serve(config, no_state, |dev, _, _batch, rows, x, y| {
    ///     twice::launch(dev, rows * 4, x, y)
    /// }, |intake| {
    ///     std::thread::scope(|t| {
    ///         let clients: Vec<_> = (0..4)
    ///             .map(|c| t.spawn(move || intake.submit(vec![c as f32; 4])?.wait()))
    ///             .collect();
    ///         clients.into_iter().map(|c| c.join().expect("a client thread")).collect::<Vec<_>>()
    ///     })
    /// })?;
    /// for (c, answer) in answers.into_iter().enumerate() {
    ///     assert_eq!(answer?, vec![2.0 * c as f32; 4]);
    /// }
    /// assert_eq!(report.requests, 4);
    /// assert_eq!(report.batch_rows.iter().sum::<usize>(), 4);
    /// assert!(rt.live_mappings().is_empty());
    /// # Ok::<(), offload::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero in `config`, [`Error::Overflow`] for a batch
    /// whose size overflows (nothing runs then). A failing batch is reported to its
    /// requests, not here.
    #[track_caller]
    pub fn serve<In, Out, S, Init, F, C, R>(
        &self,
        config: ServeConfig,
        init: Init,
        compute: F,
        clients: C,
    ) -> Result<(R, ServeReport)>
    where
        In: DeviceCopy,
        Out: DeviceCopy + Default,
        S: Send,
        Init: Fn(&Device<'rt>) -> Result<S> + Sync,
        F: Fn(&Device<'_>, &mut S, usize, usize, DeviceSlice<'_, In>, DeviceSlice<'_, Out>) -> Result<()>
            + Sync,
        C: FnOnce(&Intake<'_, In, Out>) -> R,
    {
        self.serve_at::<In, Out, S, C, R>(
            "Pipeline::serve",
            Location::caller(),
            config,
            &init,
            &compute,
            clients,
        )
    }

    /// [`Pipeline::serve`] with a row of each of several outputs per request, of their own
    /// element types: `Out` is `(A, B)` or `(A, B, C)` (see [`RowOutputs`]), `config`'s
    /// `out_row` the tuple of their row lengths, `compute` gets the batch's views in the
    /// same shape (each `rows * len` elements, copied back on the copy-out lane), and each
    /// [`Ticket`] gives the request's tuple of rows. `Out` is named where the compiler
    /// cannot tell it, on the intake say.
    ///
    /// ```
    /// use std::time::Duration;
    /// use offload::pipeline::{Intake, Pipeline, ServeConfig};
    /// use offload::Runtime;
    ///
    /// // Each request a row of 4 scores: their softmax and the index of the largest.
    /// #[offload::kernel]
    /// fn classify(r: usize, x: &[f32], p: &mut [f32], class: &mut [u32]) {
    ///     let mut best = 0u32;
    ///     let mut max = x[4 * r];
    ///     for j in 1usize..4 {
    ///         if x[4 * r + j] > max {
    ///             best = j as u32;
    ///             max = x[4 * r + j];
    ///         }
    ///     }
    ///     let mut sum = 0.0f32;
    ///     for j in 0usize..4 {
    ///         p[4 * r + j] = (x[4 * r + j] - max).exp();
    ///         sum += p[4 * r + j];
    ///     }
    ///     for j in 0usize..4 {
    ///         p[4 * r + j] /= sum;
    ///     }
    ///     class[r] = best;
    /// }
    ///
    /// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build()?;
    /// let config = ServeConfig { in_row: 4, out_row: (4, 1), max_rows: 8, deadline: Duration::from_millis(2), max_queued: None };
    /// let no_state = |_: &offload::Device<'_>| Ok(());
    /// let (answer, report) = Pipeline::new(&rt, &[0], 2)?.serve_outputs(
    ///     config,
    ///     no_state,
    ///     |dev, _, _batch, rows, x, (p, class)| classify::launch(dev, rows, x, p, class),
    ///     |intake: &Intake<'_, f32, (f32, u32)>| intake.submit(vec![0.0, 3.0, 1.0, 3.0 - 1e-3])?.wait(),
    /// )?;
    /// let (probs, class) = answer?;
    /// assert_eq!(class, vec![1]);
    /// assert!((probs.iter().sum::<f32>() - 1.0).abs() < 1e-6 && probs[1] > probs[3]);
    /// assert_eq!(report.requests, 1);
    /// # Ok::<(), offload::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Pipeline::serve`]: [`Error::InvalidArgument`] for a zero in `config` (any
    /// output's row length among them), [`Error::Overflow`] for a batch whose size
    /// overflows.
    #[track_caller]
    pub fn serve_outputs<In, Out, S, Init, F, C, R>(
        &self,
        config: ServeConfig<Out::RowLens>,
        init: Init,
        compute: F,
        clients: C,
    ) -> Result<(R, ServeReport)>
    where
        In: DeviceCopy,
        Out: RowOutputs,
        S: Send,
        Init: Fn(&Device<'rt>) -> Result<S> + Sync,
        F: Fn(
                &Device<'_>,
                &mut S,
                usize,
                usize,
                DeviceSlice<'_, In>,
                <Out::Shape as OutputShape>::Views<'_>,
            ) -> Result<()>
            + Sync,
        C: FnOnce(&Intake<'_, In, Out>) -> R,
    {
        self.serve_at("Pipeline::serve_outputs", Location::caller(), config, &init, &compute, clients)
    }

    /// [`Pipeline::serve_outputs`], naming `routine` in its errors and tracing at `at`.
    fn serve_at<In, Out, S, C, R>(
        &self,
        routine: &'static str,
        at: &'static Location<'static>,
        config: ServeConfig<Out::RowLens>,
        init: &StateInit<'_, 'rt, S>,
        compute: &ServeCompute<'_, S, In, Out>,
        clients: C,
    ) -> Result<(R, ServeReport)>
    where
        In: DeviceCopy,
        Out: RowOutputs,
        S: Send,
        C: FnOnce(&Intake<'_, In, Out>) -> R,
    {
        refuse_inside_a_task(routine)?;
        let ServeConfig { in_row, out_row, max_rows, .. } = config;
        let out_lens = Out::lens(out_row);
        if in_row == 0 || out_lens.contains(&0) || max_rows == 0 {
            return Err(Error::InvalidArgument {
                routine,
                what: format!(
                    "in_row {in_row}, out_row {out_row:?}, max_rows {max_rows}; expected each at least 1"
                ),
            });
        }
        let rows = std::iter::once(("in_row", in_row)).chain(out_lens.into_iter().map(|l| ("out_row", l)));
        for (what, row) in rows {
            if max_rows.checked_mul(row).is_none() {
                return Err(Error::Overflow {
                    routine,
                    what: format!("a batch's elements, max_rows {max_rows} x {what} {row},"),
                });
            }
        }
        let rt = self.rt;
        let states = DeviceStates::new(self.devices.len());
        let consume = |formed: Receiver<Formed<In, Out>>, served: &Mutex<Served>| {
            // A receiver per slot of each device, and none besides: when every slot's thread
            // has gone, the batcher's hand-over fails and it stops.
            let mut slots = Vec::new();
            for (k, &device) in self.devices.iter().enumerate() {
                slots.extend((0..self.slots).map(|_| (k, device, formed.clone())));
            }
            drop(formed);
            std::thread::scope(|threads| {
                let states = &states;
                for (k, device, formed) in slots {
                    threads.spawn(move || {
                        // One batch's rows, kept for the thread's batches.
                        let mut input: Vec<In> = Vec::with_capacity(max_rows * in_row);
                        let mut output = Out::buffers(max_rows, out_row);
                        for (batch, requests) in formed.iter() {
                            let rows = requests.iter().map(|r| r.rows).sum();
                            input.clear();
                            requests.iter().for_each(|r| input.extend_from_slice(&r.row));
                            Out::resize(&mut output, rows, out_row);
                            let (x, y) = (&input[..], &mut output);
                            // One scope per batch: its borrows end with it, and the lanes
                            // overlap it with the batches of the device's other slots.
                            let run = rt.nowait(move |s| {
                                let maps = (Map::shared(x, MapType::TO), y.maps());
                                queue_batch(s, device, maps, at, move |dev, (x, y)| {
                                    let make = || init(&rt.device(device)?);
                                    states.with(k, make, |state| compute(dev, state, batch, rows, x, y))
                                })
                                .map(drop)
                            });
                            let answers =
                                reply::<In, Out>(run.and_then(|r| r), batch, requests, &output, out_row);
                            served.lock().record(k, batch, answers);
                        }
                    });
                }
            })
        };
        let served = serve_batches(config, self.devices.len(), consume, clients);
        // Every batch has ended; what the states mapped goes now.
        drop(states);
        Ok(served)
    }
}

/// An error unless called from an ordinary thread: a server's batches are queued from
/// threads of its own, on the devices' lanes; inside a task (a pipeline's compute, a
/// `nowait` task) they could wait behind the task that waits for them, for ever.
pub(super) fn refuse_inside_a_task(routine: &'static str) -> Result<()> {
    if crate::nowait::running_a_task() {
        return Err(Error::InvalidArgument {
            routine,
            what: "a server started inside a nowait task or a pipeline's compute, whose lanes would \
                   wait for it; expected a call from an ordinary thread"
                .into(),
        });
    }
    Ok(())
}

/// A server's batcher and intake around `consume`, which takes the batches formed
/// (answering their requests and recording them in the [`Served`] given) until the channel
/// closes; `consumers` of them in the report. Returns `clients`' value and the report.
pub(super) fn serve_batches<In, Out, C, R>(
    config: ServeConfig<Out::RowLens>,
    consumers: usize,
    consume: impl FnOnce(Receiver<Formed<In, Out>>, &Mutex<Served>) + Send,
    clients: C,
) -> (R, ServeReport)
where
    In: DeviceCopy,
    Out: RowOutputs,
    C: FnOnce(&Intake<'_, In, Out>) -> R,
{
    let ServeConfig { in_row, max_rows, deadline, max_queued, .. } = config;
    let start = Instant::now();
    let (tx, rx) = match max_queued {
        Some(n) => crossbeam_channel::bounded(n),
        None => crossbeam_channel::unbounded(),
    };
    let (formed_tx, formed_rx) = crossbeam_channel::bounded::<Formed<In, Out>>(0);
    let closed = AtomicBool::new(false);
    let batch_rows = Mutex::new(BatchLog::default());
    let served = Mutex::new(Served { per_device: vec![0; consumers], ..Served::default() });
    let r = std::thread::scope(|threads| {
        let (batch_rows, served) = (&batch_rows, &served);
        threads.spawn(move || form_batches(rx, formed_tx, max_rows, deadline, batch_rows));
        threads.spawn(move || consume(formed_rx, served));
        let _close = CloseOnDrop { tx: tx.clone(), closed: &closed };
        clients(&Intake { tx, closed: &closed, in_row, max_rows })
    });
    let Served { latencies, mut failed, per_device } = served.into_inner();
    failed.sort_unstable();
    let formed = batch_rows.into_inner();
    let report = ServeReport {
        requests: latencies.len(),
        batch_rows: formed.rows,
        batch_requests: formed.requests,
        max_rows,
        failed_batches: failed,
        batches_per_device: per_device,
        latency: Latency::of(latencies),
        elapsed: start.elapsed(),
    };
    (r, report)
}

/// What answering a batch's requests did.
pub(super) struct Answered {
    failed: bool,
    latencies: Vec<Duration>,
}

/// Sends each request of `batch` its rows of `output` (`out_row` elements each, in request
/// order), or the batch's error.
pub(super) fn reply<In, Out: RowOutputs>(
    run: Result<()>,
    batch: usize,
    requests: Vec<Request<In, Out>>,
    output: &Out::Buffers,
    out_row: Out::RowLens,
) -> Answered {
    let failed = run.is_err();
    let run = run.map_err(|e| Error::Batch { batch, source: Box::new(e) });
    let mut first = 0;
    let latencies = requests
        .into_iter()
        .map(|request| {
            let latency = request.submitted.elapsed();
            let rows = |()| Answer { row: Out::rows(output, first, request.rows, out_row), batch, latency };
            let answer = run.clone().map(rows);
            first += request.rows;
            // A submitter that dropped its ticket no longer wants the answer.
            let _ = request.reply.send(answer);
            latency
        })
        .collect();
    Answered { failed, latencies }
}

/// A batch being formed: its requests, their rows, and the request that did not fit (the
/// first of the next batch: a request is never split).
struct Forming<In, Out: RowOutputs> {
    requests: Vec<Request<In, Out>>,
    rows: usize,
    next: Option<Request<In, Out>>,
    max_rows: usize,
}

impl<In, Out: RowOutputs> Forming<In, Out> {
    /// Full: `max_rows` rows, or a request waiting that does not fit.
    fn full(&self) -> bool {
        self.rows >= self.max_rows || self.next.is_some()
    }

    fn take(&mut self, r: Request<In, Out>) {
        if self.rows + r.rows > self.max_rows {
            debug_assert!(self.next.is_none() && !self.requests.is_empty());
            self.next = Some(r);
        } else {
            self.rows += r.rows;
            self.requests.push(r);
        }
    }

    /// The batch's requests, the next one (if any) starting the batch after.
    fn hand_over(&mut self) -> Vec<Request<In, Out>> {
        self.rows = 0;
        let requests = std::mem::take(&mut self.requests);
        if let Some(r) = self.next.take() {
            self.take(r);
        }
        requests
    }
}

/// The batcher: takes requests from `intake` until it closes, and hands them to the
/// device threads (`devices`, a rendezvous: a send waits for a thread with a free slot) in
/// batches of up to `max_rows` rows, each once full or `deadline` after its first
/// request's submission, a request never split (one that does not fit starts the next
/// batch); records each batch in `log`. A ready batch first takes the requests already
/// waiting, and while every slot is busy it takes more as they come (up to `max_rows`), so
/// batches grow under load.
fn form_batches<In, Out: RowOutputs>(
    intake: Receiver<Message<In, Out>>,
    devices: Sender<Formed<In, Out>>,
    max_rows: usize,
    deadline: Duration,
    log: &Mutex<BatchLog>,
) {
    let mut pending = Forming { requests: Vec::new(), rows: 0, next: None, max_rows };
    let mut closing = false;
    loop {
        let due = pending.requests.first().and_then(|first| first.submitted.checked_add(deadline));
        let next = if closing || pending.full() || due.is_some_and(|d| Instant::now() >= d) {
            if pending.requests.is_empty() {
                return;
            }
            // What already waits joins the batch first.
            while !closing && !pending.full() {
                match intake.try_recv() {
                    Ok(Message::Request(r)) => pending.take(r),
                    Ok(Message::Close) | Err(TryRecvError::Disconnected) => closing = true,
                    Err(TryRecvError::Empty) => break,
                }
            }
            let mut ready = Select::new();
            let to_device = ready.send(&devices);
            let more = (!pending.full() && !closing).then(|| ready.recv(&intake));
            let op = ready.select();
            if op.index() == to_device {
                let batch = log.lock().rows.len();
                let rows = pending.rows;
                let requests = pending.hand_over();
                let n = requests.len();
                // With no device thread left the batch is dropped, and its tickets fail
                // (their reply senders go with it); so do those still in the intake.
                if op.send(&devices, (batch, requests)).is_err() {
                    return;
                }
                let mut log = log.lock();
                log.rows.push(rows);
                log.requests.push(n);
                continue;
            }
            match more {
                Some(_) => op.recv(&intake).map_err(|_| RecvTimeoutError::Disconnected),
                None => continue,
            }
        } else if let Some(due) = due {
            intake.recv_deadline(due)
        } else {
            intake.recv().map_err(|_| RecvTimeoutError::Disconnected)
        };
        match next {
            Ok(Message::Request(r)) => pending.take(r),
            // Due now: handed to a device on the next turn.
            Err(RecvTimeoutError::Timeout) => {}
            Ok(Message::Close) | Err(RecvTimeoutError::Disconnected) => closing = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_are_summarised_by_nearest_rank() {
        let ms = Duration::from_millis;
        assert_eq!(Latency::of(Vec::new()), Latency::default());
        let one = Latency::of(vec![ms(3)]);
        assert_eq!((one.median, one.p99, one.max), (ms(3), ms(3), ms(3)));
        let l = Latency::of((1..=100).rev().map(ms).collect());
        assert_eq!((l.median, l.p99, l.max), (ms(50), ms(99), ms(100)));
        let l = Latency::of(vec![ms(4), ms(1), ms(9), ms(2)]);
        assert_eq!((l.median, l.p99, l.max), (ms(2), ms(9), ms(9)));
    }
}
