//! Replayable loop bodies: the launches of one iteration recorded once, replayed each
//! iteration at the cost of one enqueue.
//!
//! [`Device::record`] runs a body that launches kernels on the device; the launches are
//! not run but kept, their arguments translated through the present table as they would
//! be at a launch (scalars by value, views as device addresses). On a GPU the list becomes
//! one CUDA graph; on a host device it stays a list. [`Recording::replay`] enqueues it on
//! the device's compute queue in one step, ordered with everything else, and returns
//! without waiting, as a queued launch does.
//!
//! What a recording holds is fixed when it is made: its views name the device memory the
//! entries had then (which stays allocated, even if the program unmaps them, until the
//! recording is dropped and its last replay has run), and its scalars their values. A body
//! whose arguments alternate between iterations (Jacobi's swapped grids) is recorded
//! twice and the two recordings replayed in turn:
//!
//! ```
//! use offload::{map, HostLaunch, Kernel, Runtime};
//!
//! fn smooth(l: &HostLaunch<'_>) -> Result<(), String> {
//!     // SAFETY: argument 0 (input) and 1 (output) are distinct mapped ranges of n f32.
//!     let (a, b) = unsafe { (l.slice::<f32>(0, l.n())?, l.slice_mut::<f32>(1, l.n())?) };
//!     for i in 0..a.len() {
//!         let (l, r) = (a[i.saturating_sub(1)], a[(i + 1).min(a.len() - 1)]);
//!         b[i] = (l + a[i] + r) / 3.0;
//!     }
//!     Ok(())
//! }
//! static SMOOTH: Kernel = Kernel::new("smooth").with_host(smooth);
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let gpu = rt.device(0)?;
//! let (mut a, mut b) = (vec![0f32; 64], vec![0f32; 64]);
//! a[32] = 3.0;
//! gpu.data((map::tofrom(&mut a), map::tofrom(&mut b)), |(a, b)| {
//!     let even = gpu.record(|g| g.launch(&SMOOTH, 64, (a, b)))?;   // a -> b
//!     let odd = gpu.record(|g| g.launch(&SMOOTH, 64, (b, a)))?;    // b -> a
//!     for _ in 0..10 {
//!         even.replay()?;
//!         odd.replay()?;
//!     }
//!     Ok(())
//! })?;
//! assert!((a.iter().sum::<f32>() - 3.0).abs() < 1e-4);
//! # Ok::<(), offload::Error>(())
//! ```
//!
//! Only launches can be recorded: a map, update, copy back or reduction inside the body is
//! refused (they synchronise or change the present table, which a replay cannot repeat), as
//! are a [`Device::gemm`] (a library's call, not a launch) and a checked launch of a
//! generated kernel (it maps its report): record unchecked kernels (`checked = false`, or a
//! release build). What the body drops is ended at once, as outside a body: a guard's exit,
//! a buffer's free, a distributed array's unmap (their memory is going; none of them is
//! recorded). A launch recorded before such a drop keeps the device memory it names.

use std::panic::Location;

use crate::api::Device;
use crate::backend::{Graph, Queue, RecordedLaunch};
use crate::data_env::plan::Short;
use crate::device::{BlocksInUse, DeviceState};
use crate::error::{Error, Result};
use crate::info::{InfoFields, InfoFlags};
use crate::origin::Origin;
use crate::runtime::recorder::{self, refused};
use crate::runtime::Runtime;

/// Ends this thread's recording when a body returns or unwinds: the blocks it pinned are
/// unpinned unless they were handed to a [`Recording`].
struct Armed<'a>(&'a DeviceState);

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        if let Some((_, pins)) = recorder::finish() {
            drop(BlocksInUse::adopt(self.0, pins));
        }
    }
}

impl<'rt> Device<'rt> {
    /// Records the launches `body` makes on this device (through the `&Device` it is
    /// given, or any handle of this device, on this thread) without running them, for
    /// [`Recording::replay`] to run them each iteration at the
    /// cost of one enqueue: a CUDA graph on GPUs, the list on host devices. Only launches
    /// can be recorded. See the [module docs](self).
    #[track_caller]
    pub fn record(&self, body: impl FnOnce(&Device<'rt>) -> Result<()>) -> Result<crate::Recording<'rt>> {
        Recording::make(self, body, Location::caller())
    }
}

/// A recorded loop body: replay it with [`Recording::replay`] (see the [module
/// docs](self)). Dropping it releases the device memory its views held, after its last
/// replay has run.
#[derive(Debug)]
pub struct Recording<'rt> {
    rt: &'rt Runtime,
    device: usize,
    launches: Vec<RecordedLaunch>,
    graph: Option<Graph>,
    pins: Short<u64>,
    at: &'static Location<'static>,
}

impl<'rt> Recording<'rt> {
    /// Records `body`'s launches on `device` (see [`Device::record`]).
    pub(crate) fn make(
        device: &Device<'rt>,
        body: impl FnOnce(&Device<'rt>) -> Result<()>,
        at: &'static Location<'static>,
    ) -> Result<Self> {
        let rt = device.runtime();
        let number = device.number();
        if number == rt.initial_device() {
            return Err(Error::InvalidArgument {
                routine: "Device::record",
                what: format!(
                    "initial device {number}: it runs each kernel as it is launched and has nothing to record; \
                     record on an offload device"
                ),
            });
        }
        let d = rt.device_state(number)?;
        if !recorder::start(rt.identity(), number) {
            return Err(refused(number, "a recording"));
        }
        let armed = Armed(d);
        body(device)?;
        let Some((launches, pins)) = recorder::finish() else {
            return Err(refused(number, "a recording"));
        };
        drop(armed);
        let graph = match d.backend.capture_graph(&launches) {
            Ok(g) => g,
            Err(e) => {
                drop(BlocksInUse::adopt(d, pins));
                return Err(e);
            }
        };
        Ok(Self { rt, device: number, launches, graph, pins, at })
    }

    /// Enqueues the recorded launches once more, in order, on the device's compute queue
    /// (as one CUDA graph on GPUs), and returns without waiting, as a launch does
    /// (`OFFLOAD_SYNC=1`: it waits). A failure of the replayed work is reported by the next
    /// synchronising call, naming this call's location.
    #[track_caller]
    pub fn replay(&self) -> Result<()> {
        let at = Location::caller();
        let d = self.rt.device_state(self.device)?;
        if recorder::recording(self.rt.identity(), self.device) {
            return Err(refused(self.device, "a replay"));
        }
        d.poll()?;
        let fields = || InfoFields {
            kind: "replay",
            device: Some(self.device),
            at: Some(at),
            n: Some(self.launches.len()),
            ..InfoFields::default()
        };
        d.trace().event(InfoFlags::KERNEL_ARGS, fields, || {
            format!(
                "device {}: replay of {} launches{} recorded at {}:{}, at {}:{}",
                self.device,
                self.launches.len(),
                if self.graph.is_some() { " (one graph)" } else { "" },
                self.at.file(),
                self.at.line(),
                at.file(),
                at.line()
            )
        });
        let what = || InfoFields { kind: "replay", n: Some(self.launches.len()), ..InfoFields::default() };
        d.timed(Queue::Compute, what, || match &self.graph {
            Some(g) => d.backend.enqueue_graph(g),
            None => self
                .launches
                .iter()
                .try_for_each(|l| d.backend.enqueue_launch(Queue::Compute, &l.kernel, l.n, &l.args)),
        })?;
        let origin = Origin::new("replay of a recorded body", at);
        if d.ordered() {
            d.queued(origin, BlocksInUse::new(d), Short::new())
        } else {
            d.backend.sync_queue(Queue::Compute)
        }
    }

    /// The launches recorded.
    pub fn launches(&self) -> usize {
        self.launches.len()
    }

    /// Whether replays run as one graph (GPUs) rather than launch by launch (host devices).
    pub fn is_graph(&self) -> bool {
        self.graph.is_some()
    }

    /// The device it replays on.
    pub fn device(&self) -> usize {
        self.device
    }
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        let Ok(d) = self.rt.device_state(self.device) else { return };
        let pins = BlocksInUse::adopt(d, std::mem::take(&mut self.pins));
        // The blocks stay pinned until the replays queued so far have run.
        let _ = d.queued(Origin::new("end of a recorded body", self.at), pins, Short::new());
    }
}
