//! The fault-injecting device (`RuntimeBuilder::inject_faults`): host devices whose chosen
//! operations fail as a driver's would, and what the runtime does then. Each case checks
//! the error names what failed, that nothing is left mapped or allocated, and that the
//! device still works for the next construct.

use offload::backend::{FaultKind, FaultPlan};
use offload::{map, Error, Runtime};
use offload_tests::{assert_clean, cause, check, check_eq};

use offload_tests::faulty_runtime as faulty;

/// The device works after a failure: a round trip gives back what went in.
fn still_works(rt: &Runtime) -> offload::Result<()> {
    let gpu = rt.device(0)?;
    let mut x: Vec<u32> = (0..1000).collect();
    gpu.data(map::tofrom(&mut x), |_| Ok(()))?;
    check!(x.iter().enumerate().all(|(i, &v)| v == i as u32), "the round trip after a failure");
    assert_clean(rt, 0)
}

#[test]
fn an_allocation_failing_halfway_through_a_map_list_leaves_nothing_mapped() -> offload::Result<()> {
    let rt = faulty(FaultPlan::default().fail_nth(FaultKind::Alloc, 2), true)?;
    let gpu = rt.device(0)?;
    let (a, mut b) = (vec![1.0f32; 4096], vec![2.0f32; 4096]);
    let e =
        gpu.data((map::to(&a), map::tofrom(&mut b)), |_| Ok(())).expect_err("the second allocation fails");
    check!(matches!(cause(e.clone()), Error::OutOfMemory { device: 0, .. }), "{e:?}");
    assert_clean(&rt, 0)?;
    check_eq!(rt.fault_counts(0)?.map(|c| c.injected[0]), Some(1));
    still_works(&rt)
}

#[test]
fn a_failing_copy_in_leaves_no_entry() -> offload::Result<()> {
    let rt = faulty(FaultPlan::default().fail_nth(FaultKind::CopyIn, 1), true)?;
    let gpu = rt.device(0)?;
    let a = vec![3u32; 1 << 16];
    let e = gpu.enter_data(map::to(&a)).map(drop).expect_err("the copy fails");
    check!(
        matches!(cause(e.clone()), Error::Driver { device: 0, call, .. } if call.contains("copy to device")),
        "{e:?}"
    );
    check!(rt.live_mappings().is_empty(), "no entry stays: {:?}", rt.live_mappings());
    assert_clean(&rt, 0)?;
    still_works(&rt)
}

#[test]
fn a_failing_copy_out_still_ends_the_mapping() -> offload::Result<()> {
    let rt = faulty(FaultPlan::default().fail_nth(FaultKind::CopyOut, 1), true)?;
    let gpu = rt.device(0)?;
    let mut b = vec![5u32; 1 << 16];
    let e = gpu.data(map::from(&mut b), |_| Ok(())).expect_err("the copy back fails");
    check!(
        matches!(cause(e.clone()), Error::Driver { call, .. } if call.contains("copy from device")),
        "{e:?}"
    );
    assert_clean(&rt, 0)?;
    still_works(&rt)
}

#[offload::kernel]
fn twice(i: usize, x: &mut [u32]) {
    x[i] *= 2;
}

#[test]
fn a_failing_launch_is_the_launchs_error_when_synchronous_and_the_next_synchronisations_when_queued(
) -> offload::Result<()> {
    for synchronous in [true, false] {
        let rt = faulty(FaultPlan::default().fail_nth(FaultKind::Launch, 1), synchronous)?;
        let gpu = rt.device(0)?;
        let mut x = vec![1u32; 100];
        let e = gpu.data(map::tofrom(&mut x), |x| twice::launch(&gpu, 100, x)).expect_err("the launch fails");
        check!(
            matches!(cause(e.clone()), Error::Driver { call, .. } if call.contains("launch")),
            "synchronous {synchronous}: {e:?}"
        );
        check!(x.iter().all(|&v| v == 1), "nothing ran");
        assert_clean(&rt, 0)?;
        // The next launch runs.
        gpu.data(map::tofrom(&mut x), |x| twice::launch(&gpu, 100, x))?;
        check!(x.iter().all(|&v| v == 2));
        still_works(&rt)?;
    }
    Ok(())
}

#[test]
fn random_faults_follow_their_seed_and_probability() -> offload::Result<()> {
    let run = |seed: u64| -> offload::Result<([u64; 7], [u64; 7])> {
        let rt =
            faulty(FaultPlan::default().random(seed, 0.25, &[FaultKind::CopyIn, FaultKind::CopyOut]), true)?;
        let gpu = rt.device(0)?;
        let mut x = vec![7u8; 256];
        for _ in 0..200 {
            let _ = gpu.data(map::tofrom(&mut x), |_| Ok(()));
        }
        assert_clean(&rt, 0)?;
        let c = rt
            .fault_counts(0)?
            .ok_or_else(|| Error::InvalidArgument { routine: "test", what: "no counts".into() })?;
        Ok((c.seen, c.injected))
    };
    let (seen, injected) = run(42)?;
    check_eq!(run(42)?, (seen, injected));
    let (copies, failed) = (seen[1] + seen[2], injected[1] + injected[2]);
    check!(copies >= 200, "{seen:?}");
    let rate = failed as f64 / copies as f64;
    check!((0.15..0.35).contains(&rate), "about a quarter fail: {failed} of {copies}");
    check_eq!(injected[0] + injected[3] + injected[4] + injected[5] + injected[6], 0);
    Ok(())
}

/// Out of memory made real on every backend (the H200 included) by a pool limit: a map list
/// whose second item does not fit fails whole (the first item's entry and block are gone),
/// a `target_alloc` past the limit fails, kept blocks are given back to make room, and once
/// memory is freed the same maps succeed.
#[test]
fn a_pool_limit_runs_every_backend_out_of_memory_and_leaves_nothing() {
    const LIMIT: usize = 1 << 20;
    let limited = |b: offload::RuntimeBuilder| {
        b.memory_pool(offload::PoolConfig { limit: LIMIT, ..Default::default() })
    };
    offload_tests::on_every_device_with("pool limit", limited, |rt, dev| {
        let gpu = rt.device(dev)?;
        let mut held = vec![1u32; (LIMIT / 2) / 4];
        let (a, mut b) = (vec![2u32; (LIMIT / 4) / 4], vec![3u32; (LIMIT / 2) / 4]);
        let m = gpu.enter_data(map::tofrom(&mut held))?;
        let live = rt.pool_usage(dev)?.live_allocations;
        // Half held: a quarter fits, the half after it does not.
        let e = gpu.data((map::to(&a), map::tofrom(&mut b)), |_| Ok(())).expect_err("past the limit");
        check!(
            matches!(e.cause(), Error::OutOfMemory { device, total, .. } if *device == dev && *total == LIMIT),
            "{e:?}"
        );
        check!(matches!(e, Error::Construct { .. }), "the error names the construct: {e}");
        check_eq!(rt.live_mappings().len(), 1);
        check_eq!(rt.pool_usage(dev)?.live_allocations, live);
        let e = rt.target_alloc(LIMIT, dev).expect_err("past the limit");
        check!(matches!(e, Error::OutOfMemory { .. }), "{e:?}");
        // With the held array unmapped (its block kept by the pool), three quarters fit once
        // the kept block is given back to make room; then both maps of before.
        m.exit()?;
        let mut big = vec![4u32; (3 * LIMIT / 4) / 4];
        gpu.data(map::tofrom(&mut big), |_| Ok(()))?;
        check_eq!(rt.pool_usage(dev)?.cached_bytes, 3 * LIMIT / 4);
        gpu.data((map::to(&a), map::tofrom(&mut b)), |_| Ok(()))?;
        check!(
            held.iter().all(|&v| v == 1) && b.iter().all(|&v| v == 3) && big.iter().all(|&v| v == 4),
            "data after the round trips"
        );
        assert_clean(rt, dev)
    });
}

/// A guard dropped without `exit` whose copy back fails: the drop cannot return the error,
/// so the device keeps it, refuses the next construct, and the next synchronising call
/// reports it, naming the guard's drop; then the device works again.
#[test]
fn a_guards_drop_keeps_its_failure_for_the_next_synchronisation() -> offload::Result<()> {
    let rt = faulty(FaultPlan::default().fail_nth(FaultKind::CopyOut, 1), true)?;
    let gpu = rt.device(0)?;
    let mut x = vec![1u32; 256];
    drop(gpu.enter_data(map::tofrom(&mut x))?);
    check!(rt.live_mappings().is_empty(), "the drop still ends the mapping");
    let refused = gpu.data(map::to(&x), |_| Ok(())).expect_err("refused until reported");
    check!(matches!(refused, Error::EarlierFailure { .. }), "{refused:?}");
    let e = rt.synchronize(0).expect_err("the drop's failure is reported");
    check!(matches!(&e, Error::Queued { construct, .. } if construct.contains("a guard's drop")), "{e:?}");
    check!(matches!(e.cause(), Error::Driver { call, .. } if call.contains("copy from device")), "{e:?}");
    rt.synchronize(0)?;
    still_works(&rt)
}
