//! Stream-ordered constructs: a construct whose effect the host cannot observe returns
//! once its work is queued, and nothing the program can observe differs (docs/SEMANTICS.md,
//! "Stream-ordered constructs"). Every case runs on every backend present, in the mode the
//! suite runs in (`OFFLOAD_SYNC=1` or not); the failure cases also build a runtime of
//! each mode explicitly.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;

use offload::{map, Error, HostLaunch, Kernel, MapItem, MapType};
use offload_tests::{check, check_eq, on_every_backend, on_every_device, synchronous};

fn spin(l: &HostLaunch<'_>) -> Result<(), String> {
    std::thread::sleep(Duration::from_millis(l.scalar::<u64>(0)?));
    Ok(())
}

/// Keeps the device's queue busy for about `ms` milliseconds, so that work queued after it
/// runs after the host has gone on.
static SPIN: Kernel = Kernel::new("spin_ms").with_host(spin).with_cuda(
    r#"extern "C" __global__ void spin_ms(unsigned long long ms, unsigned long long n) {
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            long long start = clock64();
            while (clock64() - start < (long long)ms * 2000000ll) { }
        } }"#,
);

fn copy(l: &HostLaunch<'_>) -> Result<(), String> {
    // SAFETY: argument 0 (input) and 1 (output) are distinct mapped ranges of n u32.
    let (x, y) = unsafe { (l.slice::<u32>(0, l.n())?, l.slice_mut::<u32>(1, l.n())?) };
    y.copy_from_slice(x);
    Ok(())
}

/// `y = x`.
static COPY: Kernel = Kernel::new("copy_u32").with_host(copy).with_cuda(
    r#"extern "C" __global__ void copy_u32(const unsigned* x, unsigned* y, unsigned long long n) {
        unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i]; }"#,
);

fn add_one(l: &HostLaunch<'_>) -> Result<(), String> {
    // SAFETY: argument 0 is a mapped range of at least one u32.
    let x = unsafe { l.slice_mut::<u32>(0, 1)? };
    x[0] += 1;
    Ok(())
}

/// `x[0] += 1`.
static ADD_ONE: Kernel = Kernel::new("add_one_u32").with_host(add_one).with_cuda(
    r#"extern "C" __global__ void add_one_u32(unsigned* x, unsigned long long n) {
        if (blockIdx.x == 0 && threadIdx.x == 0) x[0] += 1u; }"#,
);

/// `s += x[i]`.
#[offload::kernel(reduction(+: s))]
fn total(i: usize, x: &[u32], s: &mut u32) {
    *s += x[i];
}

fn fail(_: &HostLaunch<'_>) -> Result<(), String> {
    Err("the kernel says no".into())
}

/// [`fail`], counting its runs in [`QUEUED_FAILS`].
fn fail_counted(l: &HostLaunch<'_>) -> Result<(), String> {
    QUEUED_FAILS.fetch_add(1, SeqCst);
    fail(l)
}

/// Runs of [`FAIL_COUNTED`]: the queued case checks that its kernel has run once the
/// queue's work is done.
static QUEUED_FAILS: AtomicUsize = AtomicUsize::new(0);

/// Fails when it runs (host devices only: a GPU kernel that faults would end the process's
/// context for every later case).
static FAIL: Kernel = Kernel::new("always_fails").with_host(fail);

/// [`FAIL`], counted (the queued failure case's alone).
static FAIL_COUNTED: Kernel = Kernel::new("always_fails").with_host(fail_counted);

#[test]
fn a_to_source_changed_after_its_construct_returned_is_not_seen() {
    on_every_device("to source changed after return", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 1000;
        let mut x = vec![1u32; n];
        let mut y = vec![0u32; n];
        // Through the safe API: the host copy of a `to_mut` map changed at once.
        gpu.launch(&SPIN, 1, (50u64,))?;
        let mut m = gpu.enter_data(map::to_mut(&mut x))?;
        let xv = m.views();
        m.host_mut(&xv)?.fill(2);
        gpu.data(map::from(&mut y), |yv| gpu.launch(&COPY, n, (xv, yv)))?;
        m.exit()?;
        check!(
            y.iter().all(|&v| v == 1),
            "the device saw a host write made after its `to` map: {:?}",
            &y[..4]
        );
        // Through the C-shaped routines, as a port writes it.
        let (mut a, mut b) = (vec![7u32; n], vec![0u32; n]);
        let items = [MapItem::to(a.as_ptr(), n * 4), MapItem::raw(b.as_mut_ptr(), n * 4, MapType::ALLOC)];
        let exits =
            [MapItem::raw(a.as_mut_ptr(), n * 4, MapType::RELEASE), MapItem::from(b.as_mut_ptr(), n * 4)];
        gpu.launch(&SPIN, 1, (50u64,))?;
        // SAFETY: both vectors outlive the exit below and are not otherwise used meanwhile
        // (`a` is written by the host only after the construct returned).
        unsafe { rt.enter_data(d, &items)? };
        a.fill(8);
        let args = [offload::LaunchArg::mapped(a.as_ptr()), offload::LaunchArg::mapped(b.as_ptr())];
        // SAFETY: both arguments are mapped ranges of `n` u32 on device `d`.
        unsafe { rt.target_launch(d, &COPY, n, &[], &args)? };
        // SAFETY: as above.
        unsafe { rt.exit_data(d, &exits)? };
        check!(
            b.iter().all(|&v| v == 7),
            "the device saw a host write made after `enter data`: {:?}",
            &b[..4]
        );
        check!(rt.live_mappings().is_empty());
        Ok(())
    });
}

#[test]
fn a_reduction_variable_mapped_each_iteration_round_trips() {
    on_every_device("tofrom per iteration", |rt, d| {
        let gpu = rt.device(d)?;
        let mut count = [0u32; 1];
        for i in 0..200u32 {
            gpu.data(map::tofrom(&mut count[..]), |c| gpu.launch(&ADD_ONE, 1, (c,)))?;
            check_eq!(count[0], i + 1);
        }
        // `update to` between launches is ordered with them, and `update from` waits.
        let mut m = gpu.enter_data(map::to_mut(&mut count[..]))?;
        let c = m.views();
        for i in 0..50u32 {
            m.host_mut(&c)?[0] = 1000 * i;
            m.update_to(&c)?;
            gpu.launch(&ADD_ONE, 1, (c,))?;
            gpu.launch(&ADD_ONE, 1, (c,))?;
            m.update_from(&c)?;
            check_eq!(m.host_mut(&c)?[0], 1000 * i + 2);
        }
        m.exit()?;
        Ok(())
    });
}

#[test]
fn an_exit_does_not_free_memory_a_queued_kernel_uses() {
    on_every_device("exit under a queued kernel", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 4096;
        let x: Vec<u32> = (0..n as u32).collect();
        let mut y = vec![0u32; n];
        let out = gpu.enter_data(map::from(&mut y))?;
        let yv = out.views();
        for _ in 0..20 {
            gpu.launch(&SPIN, 1, (2u64,))?;
            // `x` is mapped, used by a queued kernel and unmapped at once; new maps that
            // may reuse its memory follow.
            gpu.data(map::to(&x), |xv| gpu.launch(&COPY, n, (xv, yv)))?;
            let junk = vec![u32::MAX; n];
            gpu.data(map::to(&junk), |_| Ok(()))?;
        }
        out.exit()?;
        check!(y == x, "y differs from x");
        Ok(())
    });
}

/// The runtime's first host device, if it has one.
fn first_host_device(rt: &offload::Runtime) -> Option<usize> {
    (0..rt.num_devices()).find(|&d| rt.describe(d).is_ok_and(|x| x.kind == offload::BackendKind::Host))
}

/// The failure of a queued kernel, on host devices (see [`FAIL`]), in the mode asked for.
fn failing_kernel_case(sync: bool) {
    on_every_backend(
        if sync { "failure, synchronous" } else { "failure, queued" },
        1,
        |b| b.synchronous(sync),
        |rt| {
            let Some(d) = first_host_device(rt) else {
                println!("SKIP failing kernel: no host device in this runtime (GPU kernels that fail end the context)");
                return Ok(());
            };
            let gpu = rt.device(d)?;
            let runs = QUEUED_FAILS.load(SeqCst);
            let line = line!() + 1;
            let launched = gpu.launch(if sync { &FAIL } else { &FAIL_COUNTED }, 16, ());
            if sync {
                check!(
                    matches!(&launched, Err(Error::KernelFailed { kernel: "always_fails", .. })),
                    "a synchronous launch reports its own failure: {launched:?}"
                );
                return Ok(());
            }
            check!(launched.is_ok(), "a queued launch returns before its kernel runs: {launched:?}");
            let at = format!("{}:{line}", file!());
            // Later constructs refuse to run until the failure is reported, once the queue
            // has recorded it: `pool_usage` waits for the queued work and leaves a failure
            // of it unreported, so no timing decides what follows...
            rt.pool_usage(d)?;
            check!(QUEUED_FAILS.load(SeqCst) > runs, "the queued kernel has run");
            let mut one = [0u32; 1];
            let refused = gpu.data(map::tofrom(&mut one[..]), |c| gpu.launch(&ADD_ONE, 1, (c,)));
            check!(rt.live_mappings().is_empty(), "a refused construct maps nothing");
            match &refused {
                Err(Error::EarlierFailure { construct, at: where_, .. }) => {
                    check!(construct.contains("always_fails") && *where_ == at, "{refused:?}")
                }
                other => check!(false, "expected EarlierFailure naming {at}, got {other:?}"),
            }
            // ...and the next synchronising call reports it, once, naming the construct.
            match rt.synchronize(d) {
                Err(Error::Queued { construct, at: where_, source, .. }) => {
                    check!(construct.contains("target") && construct.contains("always_fails"), "{construct}");
                    check_eq!(where_, at);
                    check!(matches!(*source, Error::KernelFailed { kernel: "always_fails", .. }), "{source}");
                }
                other => check!(false, "expected Queued naming {at}, got {other:?}"),
            }
            rt.synchronize(d)?;
            // A copy back is a synchronising call too.
            gpu.launch(&FAIL, 16, ())?;
            let r = gpu.data(map::from(&mut one[..]), |_| Ok(()));
            check!(matches!(r, Err(Error::EarlierFailure { .. }) | Err(Error::Queued { .. })), "{r:?}");
            rt.synchronize(d).ok();
            // Exits are never refused: the mappings whose host memory is about to be freed
            // end, and the failure is reported by the exit (it waits for its copy back).
            let mut v = vec![1u32; 64];
            let m = gpu.enter_data(map::tofrom(&mut v))?;
            gpu.launch(&FAIL, 16, ())?;
            std::thread::sleep(Duration::from_millis(20));
            let r = m.exit();
            check!(matches!(&r, Err(Error::Queued { .. })), "exit after a failure: {r:?}");
            check!(rt.live_mappings().is_empty(), "an exit after a failure left {:?}", rt.live_mappings());
            let r = gpu.data(map::tofrom(&mut v), |_| gpu.launch(&FAIL, 16, ()));
            check!(matches!(r.map_err(offload_tests::cause), Err(Error::KernelFailed { .. })), "region");
            check!(rt.live_mappings().is_empty());
            // A buffer dropped after a failure frees its memory; the failure is not lost.
            let buf = offload::DeviceBuffer::<u32>::new(&gpu, 64)?;
            gpu.launch(&FAIL, 16, ())?;
            std::thread::sleep(Duration::from_millis(20));
            drop(buf);
            check!(matches!(rt.synchronize(d), Err(Error::Queued { .. })), "the failure was lost");
            check_eq!(rt.pool_usage(d)?.live_allocations, 0);
            // A queued read dropped unwaited after a failure does not swallow it either.
            gpu.launch(&FAIL, 16, ())?;
            let late = offload::HostBuffer::<u32>::new(rt, 1)?;
            let xs = [0u32; 1];
            let r = gpu.data(map::to(&xs[..]), |v| late.read_queued(v).map(drop));
            let reported = matches!(r, Err(Error::Queued { .. }))
                || matches!(rt.synchronize(d), Err(Error::Queued { .. }));
            check!(reported, "a dropped queued read lost the failure: {r:?}");
            let mut count = [5u32; 1];
            gpu.data(map::tofrom(&mut count[..]), |c| gpu.launch(&ADD_ONE, 1, (c,)))?;
            check_eq!(count[0], 6);
            check!(rt.live_mappings().is_empty());
            Ok(())
        },
    );
}

#[test]
fn a_failing_queued_kernel_is_reported_at_the_next_synchronisation_with_its_location() {
    failing_kernel_case(false);
}

#[test]
fn under_offload_sync_a_failing_kernel_fails_its_own_launch() {
    failing_kernel_case(true);
}

/// A gate a host kernel waits at: the kernel sets `started`, waits until `open` (an error
/// after a minute, so that a broken case fails rather than hangs), then sets `done`.
struct Gate {
    started: AtomicBool,
    open: AtomicBool,
    done: AtomicBool,
}

impl Gate {
    const fn new() -> Self {
        Self { started: AtomicBool::new(false), open: AtomicBool::new(false), done: AtomicBool::new(false) }
    }

    /// Closed again, for a new case.
    fn reset(&self) {
        for flag in [&self.started, &self.open, &self.done] {
            flag.store(false, SeqCst);
        }
    }

    fn pass(&self) -> Result<(), String> {
        self.started.store(true, SeqCst);
        let start = std::time::Instant::now();
        while !self.open.load(SeqCst) {
            if start.elapsed() > Duration::from_secs(60) {
                return Err("the gate was never opened".into());
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        self.done.store(true, SeqCst);
        Ok(())
    }
}

/// One gate per test that uses one (the tests of a file run at once).
static GATES: [Gate; 2] = [Gate::new(), Gate::new()];

fn gate<const G: usize>(_: &HostLaunch<'_>) -> Result<(), String> {
    GATES[G].pass()
}

/// Host kernels that finish only once the test opens their gate: whether a call returned
/// before such a kernel finished is then a fact, not a clock reading.
static GATE: Kernel = Kernel::new("gate").with_host(gate::<0>);
static GRID_GATE: Kernel = Kernel::new("grid_gate").with_host(gate::<1>);

#[test]
fn the_suite_mode_is_the_runtime_mode() {
    // What `OFFLOAD_SYNC` says is what the suite's runtimes do: a launch returns before its
    // kernel has finished when queued, after it when synchronous. (The fault runs set the
    // mode themselves, both in turn.)
    if offload_tests::every_step::faults_mode() {
        println!("SKIP the suite's mode: OFFLOAD_TEST_FAULTS=1 runs every case in both modes");
        return;
    }
    on_every_device("mode", |rt, d| {
        let gpu = rt.device(d)?;
        if rt.describe(d)?.kind == offload::BackendKind::Host {
            // On a host device, order alone: queued, the launch returns while the kernel
            // waits at its closed gate; synchronous, a helper opens the gate once the kernel
            // has started, and the launch returns after the kernel has finished.
            let g = &GATES[0];
            g.reset();
            let opener = (synchronous()).then(|| {
                std::thread::spawn(|| {
                    while !GATES[0].started.load(SeqCst) {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    GATES[0].open.store(true, SeqCst);
                })
            });
            let launched = gpu.launch(&GATE, 1, ());
            let done_at_return = g.done.load(SeqCst);
            g.open.store(true, SeqCst);
            launched?;
            rt.synchronize(d)?;
            if let Some(h) = opener {
                h.join().map_err(|_| Error::InvalidArgument {
                    routine: "check",
                    what: "the opener panicked".into(),
                })?;
            }
            check!(g.done.load(SeqCst), "the kernel never finished");
            check_eq!(done_at_return, synchronous());
            return Ok(());
        }
        // On a GPU the kernel spins on the device's clock, and only time tells: compiled and
        // run once first (a first launch compiles, and CUDA's lazy loading loads on the
        // first run), then a 2 s kernel whose queued launch must return well before it ends
        // (tried three times: on a cold machine the driver can hold a launch while other
        // tests load their modules; a synchronous runtime never returns early, so a retry
        // cannot pass one). No GPU runs in CI.
        gpu.prepare(&SPIN)?;
        gpu.launch(&SPIN, 1, (0u64,))?;
        rt.synchronize(d)?;
        let mut tries = Vec::new();
        for _ in 0..3 {
            let start = std::time::Instant::now();
            gpu.launch(&SPIN, 1, (2000u64,))?;
            let took = start.elapsed();
            rt.synchronize(d)?;
            tries.push(took);
            if synchronous() || took < Duration::from_millis(1000) {
                break;
            }
        }
        if synchronous() {
            check!(tries[0] >= Duration::from_millis(1000), "a synchronous launch returned after {tries:?}");
        } else {
            check!(
                tries.iter().any(|t| *t < Duration::from_millis(1000)),
                "queued launches waited {tries:?}"
            );
        }
        Ok(())
    });
}

#[test]
fn a_recorded_body_replays_its_launches_in_order() {
    on_every_device("record and replay", |rt, d| {
        let gpu = rt.device(d)?;
        let mut count = [0u32; 1];
        let n = 2048;
        let (mut a, mut b) = ((0..n as u32).collect::<Vec<_>>(), vec![0u32; n]);
        gpu.data((map::tofrom(&mut count[..]), map::tofrom(&mut a), map::tofrom(&mut b)), |(c, a, b)| {
            let three = gpu.record(|g| {
                for _ in 0..3 {
                    g.launch(&ADD_ONE, 1, (c,))?;
                }
                Ok(())
            })?;
            check_eq!(three.launches(), 3);
            check_eq!(three.device(), d);
            let gpu_backend = rt.describe(d)?.kind != offload::BackendKind::Host;
            check_eq!(three.is_graph(), gpu_backend);
            // Recording ran nothing (else the count below would be 303).
            for _ in 0..100 {
                three.replay()?;
            }
            // The double-buffered pattern: two recordings replayed in turn.
            let even = gpu.record(|g| g.launch(&COPY, n, (a, b)))?;
            let odd = gpu.record(|g| g.launch(&COPY, n, (b, a)))?;
            for _ in 0..10 {
                even.replay()?;
                odd.replay()?;
            }
            Ok(())
        })?;
        check_eq!(count[0], 300);
        check!(a.iter().zip(&b).enumerate().all(|(i, (&x, &y))| x == i as u32 && y == i as u32), "a, b");
        check!(rt.live_mappings().is_empty());
        offload_tests::assert_clean(rt, d)
    });
}

#[test]
fn a_recorded_body_holds_only_launches() {
    on_every_device("record refusals", |rt, d| {
        let gpu = rt.device(d)?;
        let x = vec![1u32; 16];
        let mut y = vec![0u32; 16];
        let refused = |r: offload::Result<offload::Recording<'_>>, what: &str| -> offload::Result<()> {
            match r {
                Err(Error::InvalidArgument { routine: "Device::record", what: w }) => {
                    check!(w.contains("only launches can be recorded"), "{what}: {w}");
                    Ok(())
                }
                other => {
                    check!(false, "{what}: expected a refusal, got {:?}", other.map(|r| r.launches()));
                    Ok(())
                }
            }
        };
        refused(gpu.record(|g| g.data(map::to(&x), |_| Ok(()))), "a map")?;
        let mut m = gpu.enter_data(map::to_mut(&mut y))?;
        let yv = m.views();
        refused(gpu.record(|_| m.update_to(&yv)), "an update")?;
        refused(gpu.record(|g| g.record(|_| Ok(())).map(drop)), "a nested recording")?;
        let p = rt.target_alloc(64, d)?;
        // SAFETY: `p` holds 64 bytes of device `d`.
        refused(gpu.record(|_| unsafe { rt.target_memset(p, 0, 64, d) }), "a memset")?;
        // Device memory that nothing would keep allocated for the replays (finding: a
        // dropped buffer's block reused under a replay), and a reduction's value.
        let buf = offload::DeviceBuffer::<u32>::new(&gpu, 1)?;
        refused(gpu.record(|g| g.launch(&ADD_ONE, 1, (&buf,))), "a DeviceBuffer argument")?;
        drop(buf);
        let xs = vec![1u32; 8];
        gpu.data(map::to(&xs), |xv| {
            refused(gpu.record(|g| total::reduce(g, 8, xv).map(drop)), "a reduce")?;
            check_eq!(total::reduce(&gpu, 8, xv)?, 8);
            Ok(())
        })?;
        // A product (device BLAS settles the device), here with a bias at an odd element,
        // which cuBLASLt would first copy to an aligned buffer: a recording never holds one,
        // so nothing is allocated or captured for it.
        let (a, b) = (vec![1f32; 16], vec![1f32; 16]);
        let (bias, mut c) = (vec![0.5f32; 5], vec![0f32; 16]);
        let g = offload::Gemm { m: 4, n: 4, k: 4, lda: 4, ldb: 4, ldc: 4, ..offload::Gemm::default() };
        gpu.data((map::to(&a), map::to(&b), map::to(&bias), map::tofrom(&mut c)), |(av, bv, biasv, cv)| {
            let r = gpu.record(|g2| g2.gemm(&g, av, bv, cv, Some(biasv.slice(1..)?)));
            if let Err(Error::InvalidArgument { what, .. }) = &r {
                check!(what.contains("a gemm inside a recorded body"), "{what}");
            }
            refused(r, "a gemm")
        })?;
        check!(c.iter().all(|&v| v == 0.0), "a refused product wrote C: {c:?}");
        let body = gpu.record(|g| g.launch(&ADD_ONE, 1, (yv,)))?;
        refused(gpu.record(|_| body.replay()), "a replay")?;
        let late = offload::HostBuffer::<u32>::new(rt, 16)?;
        refused(gpu.record(|_| late.read_queued(yv).map(drop)), "a queued read")?;
        // A panicking body ends the recording: the next one works.
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = gpu.record(|g| -> offload::Result<()> {
                g.launch(&ADD_ONE, 1, (yv,))?;
                panic!("body gave up")
            });
        }));
        check!(caught.is_err());
        body.replay()?;
        m.update_from(&yv)?;
        check_eq!(m.host_mut(&yv)?[0], 1);
        // The recording outlives the mapping: its memory stays until it is dropped.
        m.exit()?;
        body.replay()?;
        drop(body);
        // SAFETY: allocated above, no work uses it.
        unsafe { rt.target_free(p, d)? };
        rt.synchronize(d)?;
        offload_tests::assert_clean(rt, d)
    });
}

/// What is dropped inside a recorded body still ends its mappings and frees its memory, as
/// outside (the drops were once refused as constructs, which left mappings keyed by freed
/// host memory and leaked device memory). A launch recorded over a mapping that the body
/// then ends replays on memory the recording keeps.
#[test]
fn values_dropped_inside_a_recorded_body_end_their_mappings() {
    use offload::partition::{DistributedArray, RowPartition};
    use offload::{DeviceBuffer, HostBuffer};
    on_every_device("drops in a recorded body", |rt, d| {
        let gpu = rt.device(d)?;
        let before = rt.pool_usage(d)?.live_allocations;
        let mut a = vec![7u32; 256];
        let guard = gpu.enter_data(map::tofrom(&mut a))?;
        let av = guard.views();
        let buf = DeviceBuffer::<u32>::new(&gpu, 64)?;
        let host = HostBuffer::<u32>::new(rt, 64)?;
        host.enter(d, MapType::TO)?;
        let mut grid = vec![1f32; 6 * 4];
        let part = RowPartition::new(6, 4, 1, 1)?;
        let spread = DistributedArray::map(rt, &[d], &mut grid, part, MapType::TO)?;
        let body = gpu.record(move |g| {
            g.launch(&ADD_ONE, 1, (av,))?;
            drop(guard); // copies back `a` as it was: nothing recorded has run
            drop(buf);
            drop(host);
            drop(spread);
            Ok(())
        })?;
        check!(rt.live_mappings().is_empty(), "left mapped: {:?}", rt.live_mappings());
        check!(a.iter().all(|&v| v == 7), "the recorded launch ran while recording");
        body.replay()?;
        rt.synchronize(d)?;
        check!(a.iter().all(|&v| v == 7), "a replay reached host memory no longer mapped");
        drop(body);
        check_eq!(rt.pool_usage(d)?.live_allocations, before);
        Ok(())
    });
}

#[test]
fn a_queued_read_sees_the_work_before_it_and_not_after() {
    on_every_device("queued read", |rt, d| {
        let gpu = rt.device(d)?;
        let mut count = [0u32; 1];
        let late = offload::HostBuffer::<u32>::new(rt, 1)?;
        let late = gpu.data(map::tofrom(&mut count[..]), |c| {
            gpu.launch(&ADD_ONE, 1, (c,))?;
            let read = late.read_queued(c)?;
            // Queued after the read: not in what it gives.
            gpu.launch(&SPIN, 1, (20u64,))?;
            gpu.launch(&ADD_ONE, 1, (c,))?;
            let late = read.wait()?;
            check_eq!(late[0], 1);
            // Dropped unwaited: the drop waits, nothing is left queued into the buffer.
            drop(late.read_queued(c)?);
            offload::HostBuffer::<u32>::new(rt, 1)
        })?;
        check_eq!(count[0], 2);
        // A view longer than the buffer, and one not mapped, are refused.
        let big = vec![0u32; 4];
        let r = gpu.data(map::to(&big), |v| late.read_queued(v).map(drop));
        check!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
        let small = [0u32; 1];
        let view = gpu.data(map::to(&small[..]), Ok)?;
        let late = offload::HostBuffer::<u32>::new(rt, 1)?;
        let r = late.read_queued(view);
        check!(matches!(r, Err(Error::NotPresent { .. })), "{:?}", r.map(drop));
        offload_tests::assert_clean(rt, d)
    });
}

#[test]
fn more_small_copies_than_bounce_slots_still_copy_what_the_host_had() {
    // 40 items of one construct: the first take the device's 32 bounce slots, the rest are
    // copied at once; either way a host write right after the construct is not seen.
    on_every_device("more copies than slots", |rt, d| {
        let gpu = rt.device(d)?;
        let mut x: Vec<u32> = (0..40 * 4).collect();
        let enter: Vec<MapItem> = x.chunks(4).map(|c| MapItem::to(c.as_ptr(), 16)).collect();
        gpu.launch(&SPIN, 1, (20u64,))?;
        // SAFETY: `x` outlives the mappings (exited below) and is written only between the
        // constructs.
        unsafe { rt.enter_data(d, &enter)? };
        x.iter_mut().for_each(|v| *v = u32::MAX);
        let exit: Vec<MapItem> = x.chunks_mut(4).map(|c| MapItem::from(c.as_mut_ptr(), 16)).collect();
        // SAFETY: as above.
        unsafe { rt.exit_data(d, &exit)? };
        check!(x.iter().enumerate().all(|(i, &v)| v == i as u32), "{:?}", &x[..8]);
        offload_tests::assert_clean(rt, d)
    });
}

/// A timer read with `Runtime::wtime` spans the work queued between its two reads, as a C
/// program's `omp_get_wtime` spans its (synchronous) target regions: the queued 50 ms
/// kernel has run before the second read. (A lower bound: a loaded machine only lengthens
/// it.) Without the wait the two reads are microseconds apart.
#[test]
fn a_wtime_timer_spans_the_queued_work_between_its_reads() {
    on_every_device("wtime spans queued work", |rt, d| {
        let gpu = rt.device(d)?;
        let start = rt.wtime()?;
        gpu.launch(&SPIN, 1, (50u64,))?;
        let seconds = rt.wtime()? - start;
        // The GPU's spin counts 2e6 clock cycles a millisecond: 40 ms leaves room for a
        // clock above 2 GHz.
        check!(seconds >= 0.040, "the timer read {seconds} s across a 50 ms kernel");
        check!(rt.wtime()? >= start + seconds, "the clock goes forward");
        Ok(())
    });
}

/// `wtime` is a synchronising call: it reports the failure of queued work (host devices:
/// see [`FAIL`]), naming the construct, as `Runtime::synchronize` does.
#[test]
fn wtime_reports_a_failure_of_queued_work() {
    on_every_backend(
        "wtime reports failures",
        1,
        |b| b.synchronous(false),
        |rt| {
            let Some(d) = first_host_device(rt) else {
                println!("SKIP wtime failure: no host device in this runtime (GPU kernels that fail end the context)");
                return Ok(());
            };
            rt.device(d)?.launch(&FAIL, 16, ())?;
            let read = rt.wtime();
            check!(
                matches!(&read, Err(Error::Queued { construct, .. }) if construct.contains("always_fails")),
                "the failure of the queued kernel: {read:?}"
            );
            check!(rt.wtime().is_ok(), "reported once");
            Ok(())
        },
    );
}

/// `x[i] += 1`.
#[offload::kernel]
fn add_one_each(i: usize, x: &mut [u32]) {
    x[i] += 1;
}

/// Halos between two devices are queued in order, neither thread waiting: a copy runs
/// after the kernels that wrote its rows on the source device, and the source's later
/// kernels run after the copy (they cannot change what it reads). A spin first holds up
/// one device's queue, so that a copy out of order would carry other values.
#[test]
fn halos_between_devices_wait_for_their_writers_and_hold_the_next_writes() {
    use offload::partition::{DistributedArray, RowPartition};
    on_every_backend(
        "halos between devices in queue order",
        2,
        |b| b,
        |rt| {
            let (rows, w) = (6, 4);
            let mut grid = vec![1u32; rows * w];
            // Part 0 owns rows 1..3 and maps 0..4; part 1 owns 3..5 and maps 2..6.
            let part = RowPartition::new(rows, w, 2, 1)?;
            let (d0, d1) = (0, 1);
            let halo_of_part_1 = |a: &DistributedArray<'_, u32>| -> offload::Result<Vec<u32>> {
                offload_tests::read_device(rt, a.row_addr(1, 2)?, w, d1)
            };
            {
                let a = DistributedArray::map(rt, &[d0, d1], &mut grid, part, MapType::TO)?;
                let (g0, g1) = (rt.device(d0)?, rt.device(d1)?);
                let n = part.mapped(0).len() * w;
                // Read after write: the copy waits for device 0's spin and its kernel.
                g0.launch(&SPIN, 1, (30u64,))?;
                add_one_each::launch(&g0, n, a.view(0))?;
                a.send_halos(0, false)?;
                check_eq!(halo_of_part_1(&a)?, vec![2u32; w]);
                // Write after read: device 1 runs the copy late (behind its spin), and device
                // 0's next kernel waits for it.
                g1.launch(&SPIN, 1, (30u64,))?;
                add_one_each::launch(&g0, n, a.view(0))?;
                a.send_halos(0, false)?;
                add_one_each::launch(&g0, n, a.view(0))?;
                check_eq!(halo_of_part_1(&a)?, vec![3u32; w]);
                a.gather()?;
            }
            // Owned rows come back from their owners: part 0's kernels ran three times.
            let expect: Vec<u32> =
                (0..rows).flat_map(|r| vec![if (1..3).contains(&r) { 4 } else { 1 }; w]).collect();
            check_eq!(grid, expect);
            offload_tests::assert_clean(rt, d0)?;
            offload_tests::assert_clean(rt, d1)
        },
    );
}

#[offload::kernel]
fn add_one_f32(i: usize, x: &mut [f32]) {
    x[i] += 1.0;
}

/// A grid's regions between two devices are queued behind the sender's work, not waited
/// for: with the sending device held at a closed gate, `DistributedGrid::send_halos`
/// returns while the gate is still closed (a copy that waited for the sender's queue would
/// wait for ever), and once the gate opens the receiver's halo holds what the sender's
/// kernel, queued behind the gate, wrote. Host devices (the gate is a host kernel); under
/// `OFFLOAD_SYNC=1` the copies wait by design, so the case says it skips.
#[test]
fn grid_halos_between_devices_are_queued_not_waited_for() {
    use offload::partition::{DistributedGrid, GridPartition, Reach};
    if offload_tests::every_step::faults_mode() {
        println!("SKIP queued grid halos: OFFLOAD_TEST_FAULTS=1 fails the steps this case holds at a gate");
        return;
    }
    on_every_backend(
        "grid halos queued",
        2,
        |b| b,
        |rt| {
            if rt.describe(0)?.kind != offload::BackendKind::Host {
                println!("SKIP queued grid halos on this backend: the gate is a host kernel");
                return Ok(());
            }
            if synchronous() {
                println!("SKIP queued grid halos: OFFLOAD_SYNC=1 copies before send_halos returns");
                return Ok(());
            }
            // Two parts side by side: part 0 owns columns 1..3, part 1 columns 3..5 and
            // holds column 2 as its halo.
            let (rows, cols) = (4, 6);
            let part = GridPartition::new(&[rows, cols], &[1, 2], 1)?;
            let start: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
            let mut host = start.clone();
            let g = &GATES[1];
            g.reset();
            let grid = DistributedGrid::map(rt, &[0, 1], &mut host, part.clone(), Reach::Faces, MapType::TO)?;
            let g0 = rt.device(0)?;
            g0.launch(&GRID_GATE, 1, ())?;
            add_one_f32::launch(&g0, part.mapped(0).len(), grid.view(0))?;
            let sent = grid.send_halos(0);
            let done_at_return = g.done.load(SeqCst);
            g.open.store(true, SeqCst);
            sent?;
            check!(!done_at_return, "send_halos waited for the sending device's queued kernel");
            let [r, c] = <[std::ops::Range<usize>; 2]>::try_from(part.mapped(1).ranges().to_vec())
                .map_err(|_| Error::InvalidArgument { routine: "check", what: "a 2-D box".into() })?;
            // The halo column gets part 0's points in the rows it owns (the grid's edge
            // rows are nobody's).
            let (start, owned) = (&start, part.owned(0).ranges()[0].clone());
            let expect: Vec<f32> = r
                .flat_map(|y| {
                    let sent = owned.contains(&y);
                    c.clone().map(move |x| start[y * cols + x] + if sent && x < 3 { 1.0 } else { 0.0 })
                })
                .collect();
            check_eq!(grid.to_vec(1)?, expect);
            Ok(())
        },
    );
}

fn store_into(l: &HostLaunch<'_>) -> Result<(), String> {
    // SAFETY: argument 0 is device memory of at least one u32 (a peer's, reachable).
    let x = unsafe { l.slice_mut::<u32>(0, 1)? };
    x[0] = l.scalar::<u32>(1)?;
    Ok(())
}

/// `x[0] = value` (through a device pointer: a peer's memory too).
static STORE: Kernel = Kernel::new("store_u32").with_host(store_into).with_cuda(
    r#"extern "C" __global__ void store_u32(unsigned* x, unsigned value, unsigned long long n) {
        if (blockIdx.x == 0 && threadIdx.x == 0) x[0] = value; }"#,
);

/// A kernel storing into another device's memory (peer access) runs after the work queued
/// there before it (held up by a spin), and that device's later work runs after the
/// kernel: as if one device ran both.
#[test]
fn a_kernel_storing_into_a_peer_is_ordered_with_the_peers_work() {
    on_every_backend(
        "a peer store in queue order",
        2,
        |b| b,
        |rt| {
            let (d0, d1) = (0, 1);
            if !rt.can_access_peer(d0, d1)? {
                println!("SKIP peer store order: device {d0} has no peer access to device {d1}");
                return Ok(());
            }
            let mut x = [0u32; 1];
            let (g0, g1) = (rt.device(d0)?, rt.device(d1)?);
            g1.data(map::tofrom(&mut x[..]), |xv| {
                let p = rt.mapped_ptr(xv.host_range().begin, d1)?.ok_or(Error::InvalidArgument {
                    routine: "check",
                    what: "x is not mapped on device 1".into(),
                })?;
                // SAFETY: `p` is x's copy on device 1, mapped until the region ends.
                let peer = unsafe { offload::DevicePtr::new(p) };
                // Device 1's spin and increment come before the store; its next increment after.
                g1.launch(&SPIN, 1, (30u64,))?;
                g1.launch(&ADD_ONE, 1, (xv,))?;
                g0.launch(&STORE, 1, (peer, 10u32))?;
                check_eq!(offload_tests::read_device::<u32>(rt, p, 1, d1)?, vec![10]);
                g1.launch(&ADD_ONE, 1, (xv,))?;
                Ok(())
            })?;
            check_eq!(x[0], 11);
            offload_tests::assert_clean(rt, d0)?;
            offload_tests::assert_clean(rt, d1)
        },
    );
}
