//! The launches a thread is recording for a device ([`crate::Recording`]): while a
//! body is recorded, the constructs of that thread on that device consult this instead of
//! running (launches are kept; everything else is refused).

use std::cell::RefCell;

use crate::backend::RecordedLaunch;
use crate::data_env::plan::Short;
use crate::error::Error;

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
