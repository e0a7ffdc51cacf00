//! Every step fails once (issue 25, item 2) for the constructs in their safe forms: a data
//! region with a launch, enter/update/exit, a reduction's `reduce` and nested regions, each
//! run once per device operation it makes with that operation failing, synchronous and
//! queued, through [`offload_tests::every_step`] (which checks what each failure left).
//! The conformance cases and the other suites run the same way with
//! `OFFLOAD_TEST_FAULTS=1` (scripts/test.sh).

use offload::{map, Runtime};
use offload_tests::check;

/// A construct: runs on `rt`'s device 0 and checks its own results when it succeeds.
type Construct = fn(&Runtime) -> offload::Result<()>;

#[offload::kernel]
fn add_one(i: usize, x: &mut [u32]) {
    x[i] += 1;
}

#[offload::kernel(reduction(+: total))]
fn total_of(i: usize, x: &[u32], total: &mut u64) {
    *total += x[i] as u64;
}

/// `target data map(to: a) map(tofrom: b)` around a launch.
fn data_region_with_a_launch(rt: &Runtime) -> offload::Result<()> {
    let gpu = rt.device(0)?;
    let a = vec![1u32; 5000];
    let mut b = vec![10u32; 5000];
    gpu.data((map::to(&a), map::tofrom(&mut b)), |(_, b)| add_one::launch(&gpu, 5000, b))?;
    rt.synchronize(0)?;
    check!(b.iter().all(|&v| v == 11), "b after the region");
    Ok(())
}

/// `target enter data`, `update to`, a launch, `update from`, `target exit data`.
fn enter_update_exit(rt: &Runtime) -> offload::Result<()> {
    let gpu = rt.device(0)?;
    let mut x = vec![3u32; 3000];
    let mut m = gpu.enter_data(map::to_mut(&mut x))?;
    let v = m.views();
    m.host_mut(&v)?.fill(4);
    m.update_to(&v)?;
    add_one::launch(&gpu, 3000, v)?;
    m.update_from(&v)?;
    m.exit()?;
    rt.synchronize(0)?;
    check!(x.iter().all(|&e| e == 5), "x after the updates");
    Ok(())
}

/// A reduction's `reduce` (its slots set by one copy, read back by one).
fn a_reduce(rt: &Runtime) -> offload::Result<()> {
    let gpu = rt.device(0)?;
    let x: Vec<u32> = (0..4000).collect();
    let total = gpu.data(map::to(&x), |x| total_of::reduce(&gpu, 4000, x))?;
    rt.synchronize(0)?;
    check!(total == 4000 * 3999 / 2, "total {total}");
    Ok(())
}

/// Nested regions: an inner `data` over what the outer mapped (reference counts).
fn nested_regions(rt: &Runtime) -> offload::Result<()> {
    let gpu = rt.device(0)?;
    let mut x = vec![1u32; 2048];
    let mut y = vec![2u32; 1024];
    gpu.data(map::tofrom(&mut x), |xv| {
        gpu.data(map::tofrom(&mut y), |yv| {
            add_one::launch(&gpu, 2048, xv)?;
            add_one::launch(&gpu, 1024, yv)
        })
    })?;
    rt.synchronize(0)?;
    check!(x.iter().all(|&v| v == 2) && y.iter().all(|&v| v == 3), "x and y after the regions");
    Ok(())
}

/// Runs `construct` with each of its device operations failing once, in turn (the
/// shared harness, [`offload_tests::every_step`]), and checks that failures were injected.
fn every_step_fails_once(name: &str, construct: Construct) -> offload::Result<()> {
    let sweep = offload_tests::every_step::every_step_fails_once(name, |b| b, construct)?;
    check!(sweep.failed > 0, "{name}: no failure was injected ({sweep:?})");
    Ok(())
}

#[test]
fn a_data_region_with_a_launch_survives_every_failure() -> offload::Result<()> {
    every_step_fails_once("data region", data_region_with_a_launch)
}

#[test]
fn enter_update_and_exit_survive_every_failure() -> offload::Result<()> {
    every_step_fails_once("enter/update/exit", enter_update_exit)
}

#[test]
fn a_reduce_survives_every_failure() -> offload::Result<()> {
    every_step_fails_once("reduce", a_reduce)
}

#[test]
fn nested_regions_survive_every_failure() -> offload::Result<()> {
    every_step_fails_once("nested regions", nested_regions)
}
