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
use crate::error::{Error, Result};
use crate::rt::{RecordedBody, Runtime};

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
    body: RecordedBody,
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
        let body = rt.record(number, || body(device))?;
        Ok(Self { rt, device: number, body, at })
    }

    /// Enqueues the recorded launches once more, in order, on the device's compute queue
    /// (as one CUDA graph on GPUs), and returns without waiting, as a launch does
    /// (`OFFLOAD_SYNC=1`: it waits). A failure of the replayed work is reported by the next
    /// synchronising call, naming this call's location.
    #[track_caller]
    pub fn replay(&self) -> Result<()> {
        self.rt.replay(self.device, &self.body, self.at, Location::caller())
    }

    /// The launches recorded.
    pub fn launches(&self) -> usize {
        self.body.launches()
    }

    /// Whether replays run as one graph (GPUs) rather than launch by launch (host devices).
    pub fn is_graph(&self) -> bool {
        self.body.is_graph()
    }

    /// The device it replays on.
    pub fn device(&self) -> usize {
        self.device
    }
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        self.rt.end_recording(self.device, &mut self.body, self.at);
    }
}
