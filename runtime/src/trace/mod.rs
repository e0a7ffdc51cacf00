//! What the runtime says about itself: `OFFLOAD_INFO`'s lines and counters ([`info`]), and
//! the timeline written for `chrome://tracing` and Perfetto ([`chrome`]), both fed by the
//! same `tracing` events.

pub(crate) mod chrome;
pub mod info;
