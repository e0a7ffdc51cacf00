//! The launches a thread is recording for a device ([`crate::Recording`]): while a
//! body is recorded, the constructs of that thread on that device consult this instead of
//! running (launches are kept; everything else is refused).

use std::cell::RefCell;
use std::panic::Location;

use super::Runtime;
use crate::backend::{Graph, Queue, RecordedLaunch};
use crate::data_env::plan::Short;
use crate::device::{BlocksInUse, DeviceState};
use crate::error::{Error, Result};
use crate::info::{InfoFields, InfoFlags};
use crate::origin::Origin;

/// The recording this thread is making: its runtime (by address), device, launches and
/// the blocks they pinned.
struct Active {
    runtime: usize,
    device: usize,
    launches: Vec<RecordedLaunch>,
    pins: Short<u64>,
}

thread_local! {
    static RECORDING: RefCell<Option<Active>> = const { RefCell::new(None) };
}

/// Whether this thread is recording for device `device` of the runtime whose identity is
/// `runtime`.
pub(crate) fn recording(runtime: usize, device: usize) -> bool {
    RECORDING.with_borrow(|r| r.as_ref().is_some_and(|a| a.runtime == runtime && a.device == device))
}

/// Starts recording on this thread; `false` when it records already.
pub(crate) fn start(runtime: usize, device: usize) -> bool {
    RECORDING.with_borrow_mut(|r| {
        if r.is_some() {
            return false;
        }
        *r = Some(Active { runtime, device, launches: Vec::new(), pins: Short::new() });
        true
    })
}

/// Ends this thread's recording: its launches and the blocks they pinned.
pub(crate) fn finish() -> Option<(Vec<RecordedLaunch>, Short<u64>)> {
    RECORDING.with_borrow_mut(Option::take).map(|a| (a.launches, a.pins))
}

/// Runs `f` with this thread's recording, if any, set aside: for the drops of values whose
/// memory is about to go (a guard's exit, a buffer's free), which must end their mappings
/// and allocations even inside a recorded body. Nothing of a body runs until it has been
/// recorded, so these take effect at once, as they would outside; what they end stays
/// allocated while recorded launches use it (their blocks are pinned). The recording is
/// put back afterwards, also when `f` unwinds.
pub(crate) fn outside<R>(f: impl FnOnce() -> R) -> R {
    struct PutBack(Option<Active>);
    impl Drop for PutBack {
        fn drop(&mut self) {
            if let Some(a) = self.0.take() {
                RECORDING.with_borrow_mut(|r| *r = Some(a));
            }
        }
    }
    let _back = PutBack(RECORDING.with_borrow_mut(Option::take));
    f()
}

/// The error for a construct that a recorded body cannot hold.
pub(crate) fn refused(device: usize, what: &str) -> Error {
    Error::InvalidArgument {
        routine: "Device::record",
        what: format!(
            "device {device}: {what} inside a recorded body; only launches can be recorded (maps, updates, \
             copies back, reductions and checked launches synchronise or change the present table, which a \
             replay cannot repeat, and a gemm is a library's call, not a launch): make them outside the body"
        ),
    }
}

/// Adds a launch, its arguments translated and their blocks pinned, to this thread's
/// recording.
pub(crate) fn push(launch: RecordedLaunch, pins: Short<u64>) {
    RECORDING.with_borrow_mut(|r| {
        if let Some(a) = r.as_mut() {
            a.launches.push(launch);
            a.pins.extend(pins);
        }
    });
}

/// A recorded body's launches, ready to replay: as one graph where the backend makes them
/// (CUDA), else the list; the device blocks their views name stay pinned while it lives
/// ([`Runtime::end_recording`] releases them).
#[derive(Debug)]
pub(crate) struct RecordedBody {
    launches: Vec<RecordedLaunch>,
    graph: Option<Graph>,
    pins: Short<u64>,
}

impl RecordedBody {
    /// The launches recorded.
    pub(crate) fn launches(&self) -> usize {
        self.launches.len()
    }

    /// Whether replays enqueue one graph.
    pub(crate) fn is_graph(&self) -> bool {
        self.graph.is_some()
    }
}

/// Ends this thread's recording when a body returns or unwinds: the blocks it pinned are
/// unpinned unless they were handed to a [`RecordedBody`].
struct Armed<'a>(&'a DeviceState);

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        if let Some((_, pins)) = finish() {
            drop(BlocksInUse::adopt(self.0, pins));
        }
    }
}

impl Runtime {
    /// Records the launches `body` makes on offload device `device` on this thread,
    /// without running them, and makes them one graph where the backend can.
    pub(crate) fn record(&self, device: usize, body: impl FnOnce() -> Result<()>) -> Result<RecordedBody> {
        let d = self.device_state(device)?;
        if !start(self.identity(), device) {
            return Err(refused(device, "a recording"));
        }
        let armed = Armed(d);
        body()?;
        let Some((launches, pins)) = finish() else {
            return Err(refused(device, "a recording"));
        };
        drop(armed);
        let graph = match d.capture_graph(&launches) {
            Ok(g) => g,
            Err(e) => {
                drop(BlocksInUse::adopt(d, pins));
                return Err(e);
            }
        };
        Ok(RecordedBody { launches, graph, pins })
    }

    /// Enqueues `body`'s launches once more on device `device`'s compute queue (one graph
    /// where it has one) and returns without waiting (`OFFLOAD_SYNC=1`: it waits); a
    /// failure is reported by the next synchronising call, naming `at`. `recorded_at` is
    /// where the body was recorded (for the trace).
    pub(crate) fn replay(
        &self,
        device: usize,
        body: &RecordedBody,
        recorded_at: &'static Location<'static>,
        at: &'static Location<'static>,
    ) -> Result<()> {
        let d = self.device_state(device)?;
        if recording(self.identity(), device) {
            return Err(refused(device, "a replay"));
        }
        d.poll()?;
        let n = body.launches.len();
        let fields = || InfoFields {
            kind: "replay",
            device: Some(device),
            at: Some(at),
            n: Some(n),
            ..InfoFields::default()
        };
        d.trace().event(InfoFlags::KERNEL_ARGS, fields, || {
            format!(
                "device {device}: replay of {n} launches{} recorded at {}:{}, at {}:{}",
                if body.graph.is_some() { " (one graph)" } else { "" },
                recorded_at.file(),
                recorded_at.line(),
                at.file(),
                at.line()
            )
        });
        let what = || InfoFields { kind: "replay", n: Some(n), ..InfoFields::default() };
        d.timed(Queue::Compute, what, || match &body.graph {
            Some(g) => d.enqueue_graph(g),
            None => body.launches.iter().try_for_each(|l| d.enqueue_kernel(&l.kernel, l.n, &l.args)),
        })?;
        let origin = Origin::new("replay of a recorded body", at);
        if d.ordered() {
            d.queued(origin, BlocksInUse::new(d), Short::new())
        } else {
            d.sync_compute()
        }
    }

    /// Releases the device blocks `body` pinned on device `device`, once the replays
    /// queued so far have run (`at`: where it was recorded).
    pub(crate) fn end_recording(
        &self,
        device: usize,
        body: &mut RecordedBody,
        at: &'static Location<'static>,
    ) {
        let Ok(d) = self.device_state(device) else { return };
        let pins = BlocksInUse::adopt(d, std::mem::take(&mut body.pins));
        let _ = d.queued(Origin::new("end of a recorded body", at), pins, Short::new());
    }
}
