//! Per-device state of a pipeline (device scratch, a workspace): made once per device, on
//! its compute lane, before its first batch, handed to each of its computes by `&mut`, and
//! dropped with the run (so what it mapped is released, on error and panic too).

use parking_lot::Mutex;

use crate::error::Result;

/// One state per device of a run, by the device's position in the pipeline's list.
///
/// Computes of one device run one after another on its compute lane, so its lock is never
/// contended: it only makes the `&mut` the compute receives sound across lane tasks.
#[derive(Debug)]
pub(super) struct DeviceStates<S> {
    states: Vec<Mutex<Option<S>>>,
}

impl<S> DeviceStates<S> {
    /// No state yet for any of `devices` devices.
    pub(super) fn new(devices: usize) -> Self {
        Self { states: (0..devices).map(|_| Mutex::new(None)).collect() }
    }

    /// Runs `f` with the state of the device at position `k`, made by `make` first when it
    /// has none. A failed `make` leaves none, so the device's next batch tries again.
    pub(super) fn with<R>(
        &self,
        k: usize,
        make: impl FnOnce() -> Result<S>,
        f: impl FnOnce(&mut S) -> Result<R>,
    ) -> Result<R> {
        let mut slot = self.states[k].lock();
        let state = match slot.take() {
            Some(s) => s,
            None => make()?,
        };
        f(slot.insert(state))
    }
}
