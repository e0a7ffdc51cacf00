//! Library halves of the examples, shared with tests and benches: the Jacobi and 3-D
//! stencil solvers, the inference model, the command-line parser, and the trace renderer of `offload-trace`. The runnable programs are the `[[example]]` targets of this package.

pub mod gpt;
pub mod inference;
pub mod jacobi;
pub mod options;
pub mod ranks;
pub mod spin_barrier;
pub mod stencil3d;
pub mod trace_svg;
pub mod weights;

use offload::Runtime;

/// The runtime the examples run on: with `OFFLOAD_HOST_DEVICES` set, what the environment
/// says; otherwise the GPUs when there are any, else two host devices.
pub fn example_runtime() -> offload::Result<Runtime> {
    if std::env::var_os("OFFLOAD_HOST_DEVICES").is_some() {
        return Runtime::new();
    }
    let gpus = Runtime::builder().host_devices(0).build()?;
    if gpus.num_devices() > 0 {
        return Ok(gpus);
    }
    Runtime::builder().host_devices(2).build()
}

/// The builder a rank of an MPI job starts from: what the environment says with
/// `OFFLOAD_HOST_DEVICES` set, else two host devices (which the rank's GPUs replace when it
/// takes any: `offload::cluster::Cluster::runtime`).
pub fn example_builder() -> offload::RuntimeBuilder {
    if std::env::var_os("OFFLOAD_HOST_DEVICES").is_some() {
        Runtime::builder()
    } else {
        Runtime::builder().host_devices(2)
    }
}

/// The first `ndev` devices of `rt` (all when `None`), or the initial device when it has
/// none.
pub fn example_devices(rt: &Runtime, ndev: Option<usize>) -> Vec<usize> {
    if rt.num_devices() == 0 {
        return vec![rt.initial_device()];
    }
    (0..ndev.unwrap_or(rt.num_devices()).clamp(1, rt.num_devices())).collect()
}

/// The seconds since `start` once `devices` have run what was queued on them: launches
/// return once queued (docs/SEMANTICS.md R11), so a solver's clock stops when the devices
/// are done.
pub fn seconds_when_done(rt: &Runtime, devices: &[usize], start: std::time::Instant) -> offload::Result<f64> {
    for &d in devices {
        rt.synchronize(d)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Of two grids that `steps` steps alternate between (step `i` reads `grids[i % 2]`), the
/// one holding the newest values (the first after an even number); the other is dropped.
pub fn newest<G>(grids: [G; 2], steps: usize) -> G {
    let [g0, g1] = grids;
    if steps.is_multiple_of(2) {
        g0
    } else {
        g1
    }
}
