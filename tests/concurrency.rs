//! Many threads mapping, launching and unmapping at once, on the same and on different
//! devices, over host ranges they share (read-only) and ranges of their own. Every result is
//! checked, and every device must be clean afterwards.

use std::sync::Barrier;

use offload::{map, LaunchArg, MapItem, MapType, Result, Runtime, Scalar};
use offload_kernels::{saxpy, ADD_I32, SAXPY};
use offload_tests::{assert_clean, check, check_eq, device_copy_of, on_every_backend, run_threads, sized};

const THREADS: usize = 24;

fn all_clean(rt: &Runtime) -> Result<()> {
    check!(rt.live_mappings().is_empty(), "{:?}", rt.live_mappings());
    (0..rt.num_devices()).try_for_each(|d| assert_clean(rt, d))
}

#[test]
fn threads_map_launch_and_unmap_shared_and_private_ranges() {
    on_every_backend(
        "concurrent maps and launches",
        1,
        |b| b,
        |rt| {
            const N: usize = 4096;
            let (threads, rounds) = (sized(THREADS, 6), sized(20, 4));
            let ndev = rt.num_devices();
            // Read by every thread on every device; never written.
            let shared: Vec<f32> = (0..N).map(|i| i as f32).collect();
            let start = Barrier::new(threads);
            run_threads(threads, |t| {
                let mut mine = vec![0f32; N];
                let mut counter = vec![t as i32; 64];
                start.wait();
                for r in 0..rounds {
                    let dev = (t + r) % ndev;
                    // The shared range, entered by many threads at once: whoever finds it present
                    // must find its data there already.
                    // SAFETY: `shared` outlives every construct and is only read.
                    unsafe { rt.enter_data(dev, &[MapItem::slice(&shared, MapType::TO)])? };
                    check!(rt.entry(shared.as_ptr() as usize, dev)?.is_some_and(|e| e.ref_count >= 1));
                    check!(
                        device_copy_of(rt, &shared, dev)? == shared,
                        "round {r}: shared data wrong on {dev}"
                    );

                    // A region over the shared range and this thread's own.
                    mine.fill(t as f32);
                    let region = [
                        MapItem::slice(&shared, MapType::TO),
                        MapItem::slice_mut(&mut mine, MapType::TOFROM),
                    ];
                    let a = (r + 1) as f32;
                    let args = [
                        LaunchArg::Value(Scalar::F32(a)),
                        LaunchArg::mapped(shared.as_ptr()),
                        LaunchArg::mapped(mine.as_ptr()),
                    ];
                    // SAFETY: `mine` is this thread's and untouched while mapped; `shared` is read.
                    unsafe {
                        rt.target_data_begin(dev, &region)?;
                        rt.target_launch(dev, &SAXPY, N, &[], &args)?;
                        rt.target_data_end(dev, &region)?;
                    }
                    for (i, &v) in mine.iter().enumerate() {
                        check_eq!(v, t as f32 + a * i as f32);
                    }
                    check!(!rt.is_present(mine.as_ptr() as usize, dev)?);

                    // A launch with its own map list, every thread on device 0.
                    let maps = [MapItem::slice_mut(&mut counter, MapType::TOFROM)];
                    let args = [LaunchArg::Value(Scalar::I32(1)), LaunchArg::mapped(counter.as_ptr())];
                    // SAFETY: `counter` is this thread's and untouched during the launch.
                    unsafe { rt.target_launch(0, &ADD_I32, 64, &maps, &args)? };
                    check!(
                        counter.iter().all(|&v| v == (t + r + 1) as i32),
                        "round {r}: {:?}",
                        &counter[..4]
                    );

                    // SAFETY: as for the enter.
                    unsafe { rt.exit_data(dev, &[MapItem::slice(&shared, MapType::RELEASE)])? };
                }
                Ok(())
            })?;
            check!(shared.iter().enumerate().all(|(i, &v)| v == i as f32));
            all_clean(rt)
        },
    );
}

#[test]
fn threads_count_one_shared_range_exactly() {
    on_every_backend(
        "concurrent reference counts",
        1,
        |b| b,
        |rt| {
            const K: u64 = 50;
            let ndev = rt.num_devices();
            let shared = vec![7u64; 1000];
            let sp = shared.as_ptr() as usize;
            let entered = Barrier::new(THREADS);
            let checked = Barrier::new(THREADS);
            run_threads(THREADS, |t| {
                let dev = t % ndev;
                let item = [MapItem::slice(&shared, MapType::TO)];
                let mut r = Ok(());
                for _ in 0..K {
                    // SAFETY: `shared` outlives the constructs and is only read.
                    r = r.and_then(|()| unsafe { rt.enter_data(dev, &item) });
                }
                // Every thread reaches the barriers, even after a failure, so none waits forever.
                entered.wait();
                let on_dev = (0..THREADS).filter(|u| u % ndev == dev).count() as u64;
                let count = rt.entry(sp, dev).map(|e| e.map(|e| e.ref_count));
                checked.wait();
                r?;
                check_eq!(count?, Some(on_dev * K));
                check_eq!(device_copy_of(rt, &shared, dev)?, shared);
                for _ in 0..K {
                    // SAFETY: as above.
                    unsafe { rt.exit_data(dev, &[MapItem::slice(&shared, MapType::RELEASE)])? };
                }
                Ok(())
            })?;
            for d in 0..ndev {
                check!(!rt.is_present(sp, d)?);
            }
            all_clean(rt)
        },
    );
}

#[test]
fn threads_use_the_safe_api_at_once() {
    on_every_backend(
        "concurrent safe API",
        1,
        |b| b,
        |rt| {
            const N: usize = 2048;
            // The initial device takes part too.
            let targets = rt.num_devices() + 1;
            let x: Vec<f32> = (0..N).map(|i| (i % 97) as f32).collect();
            run_threads(sized(THREADS, 6), |t| {
                let mut y = vec![t as f32; N];
                for r in 0..sized(10, 3) {
                    let d = (t + r) % targets;
                    let dev = rt.device(d)?;
                    let a = (r % 3 + 1) as f32;
                    let before = y.clone();
                    dev.data((map::to(&x), map::tofrom(&mut y)), |(xv, yv)| {
                        saxpy(&dev, a, xv, yv)?;
                        saxpy(&dev, a, xv, yv)
                    })?;
                    for i in 0..N {
                        check_eq!(y[i], before[i] + 2.0 * a * x[i]);
                    }
                    check!(d == rt.initial_device() || !rt.is_present(y.as_ptr() as usize, d)?);
                }
                Ok(())
            })?;
            check!(x.iter().enumerate().all(|(i, &v)| v == (i % 97) as f32));
            all_clean(rt)
        },
    );
}

/// Kernels that signal that they run, wait (at most 10 s) until their test lets them go on,
/// then write 7 into their first argument's `n` i32: so that a test can reach the argument
/// while the kernel runs. Gate `G` is one test's own (`RUNNING[G]`, `GO[G]`), as tests run at
/// once.
mod gate {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    pub static RUNNING: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
    pub static GO: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];

    pub fn gated_fill<const G: usize>(l: &offload::HostLaunch<'_>) -> std::result::Result<(), String> {
        RUNNING[G].store(true, SeqCst);
        let start = std::time::Instant::now();
        while !GO[G].load(SeqCst) && start.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::yield_now();
        }
        // SAFETY: argument 0 is a mapped range of at least n i32.
        unsafe { l.slice_mut::<i32>(0, l.n())? }.fill(7);
        Ok(())
    }

    /// Waits until gate `G`'s kernel runs.
    pub fn wait_running<const G: usize>() {
        while !RUNNING[G].load(SeqCst) {
            std::thread::yield_now();
        }
    }
}
static HELD_FILL: offload::Kernel = offload::Kernel::new("held_fill").with_host(gate::gated_fill::<0>);

/// One reference count lets any thread's `exit data delete` end a mapping that another
/// thread's launch uses; the entry's device block must outlive the launch all the same:
/// the exit leaves it to the kernel to free, so a new mapping cannot be given it (and be
/// overwritten by the kernel) meanwhile. (Host devices only: the kernel is a host function;
/// their in-order queue would hide the overwrite itself, which GPUs' streams would show.)
#[test]
fn a_block_an_exit_releases_under_a_running_kernel_outlives_the_kernel() {
    use std::sync::atomic::Ordering::SeqCst;
    let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build().expect("runtime");
    let gpu = rt.device(0).expect("device 0");
    let x = vec![0i32; 256];
    let y = vec![5i32; 256];
    let x_entered = gpu.enter_data(map::to(&x)).expect("enter x");
    let xv = x_entered.views();
    let x_block = rt.mapped_ptr(x.as_ptr() as usize, 0).expect("lookup").expect("x mapped");
    let y_block = std::thread::scope(|s| {
        let k = s.spawn(|| gpu.launch(&HELD_FILL, 256, (xv,)));
        gate::wait_running::<0>();
        // The kernel is running: delete x, then map y, of the same size class (`alloc`:
        // a copy would queue behind the kernel on the host device's worker).
        gpu.exit_data(map::delete(&x)).expect("delete x");
        let y_entered = gpu.enter_data(map::alloc(&y)).expect("enter y");
        let y_block = rt.mapped_ptr(y.as_ptr() as usize, 0).expect("lookup").expect("y mapped");
        gate::GO[0].store(true, SeqCst);
        k.join().expect("launch thread").expect("launch");
        (y_block, y_entered)
    });
    let (y_block, y_entered) = y_block;
    assert_ne!(y_block, x_block, "y was given x's device block while a kernel was still using it");
    gpu.update_to(&y).expect("update y");
    let dev_y = device_copy_of(&rt, &y, 0).expect("read y");
    assert!(dev_y.iter().all(|&v| v == 5), "the kernel wrote into y's device copy: {:?}", &dev_y[..4]);
    y_entered.exit().expect("exit y");
    drop(x_entered); // x was deleted: its release finds nothing
    assert_clean(&rt, 0).expect("clean");
}

static GATED_FILL: offload::Kernel = offload::Kernel::new("gated_fill").with_host(gate::gated_fill::<1>);

/// Runs `host_side` on another thread while `GATED_FILL` runs on the initial device over
/// `view`, and returns whether `host_side` finished while the kernel was still held (it
/// must not: on the initial device a view is host memory, and reading or writing it under
/// a running kernel is a data race), then the kernel's and `host_side`'s results.
fn runs_under_a_gated_kernel<R: Send>(
    init: &offload::Device<'_>,
    view: offload::DeviceSlice<'_, i32>,
    host_side: impl FnOnce() -> R + Send,
) -> (bool, Result<()>, R) {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    gate::RUNNING[1].store(false, SeqCst);
    gate::GO[1].store(false, SeqCst);
    let finished = AtomicBool::new(false);
    std::thread::scope(|s| {
        let k = s.spawn(|| init.launch(&GATED_FILL, view.len(), (view,)));
        gate::wait_running::<1>();
        let h = s.spawn(|| {
            let r = host_side();
            finished.store(true, SeqCst);
            r
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        let early = finished.load(SeqCst);
        gate::GO[1].store(true, SeqCst);
        let launched = k.join().expect("launch thread");
        (early, launched, h.join().expect("host-side thread"))
    })
}

/// `HostBuffer::read_queued` and `DistributedArray::send_halos` on the initial device wait
/// for its running kernels, as `DeviceBuffer::read` does (they once read and wrote the host
/// memory at once: a torn snapshot, and a data race). Initial device only: its kernels are
/// host functions.
#[test]
fn host_side_copies_on_the_initial_device_wait_for_its_running_kernel() {
    use offload::partition::{DistributedArray, RowPartition};
    let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build().expect("runtime");
    let init = rt.device(rt.initial_device()).expect("initial device");
    let n = 4096;
    let buf = offload::DeviceBuffer::<i32>::new(&init, n).expect("buffer");
    let (early, launched, read) = runs_under_a_gated_kernel(&init, buf.view(), || {
        offload::HostBuffer::<i32>::new(&rt, n)?.read_queued(buf.view())?.wait()
    });
    launched.expect("launch");
    assert!(!early, "read_queued returned while a kernel of the initial device was writing its view");
    let read = read.expect("read_queued");
    assert!(read.iter().all(|&v| v == 7), "read_queued read a torn snapshot: {:?}", &read[..4]);

    // One part, periodic: its halos come from its own first and last owned rows, through
    // the host grid, which the kernel is writing through the part's view.
    let part = RowPartition::new(8, 64, 1, 1).expect("partition");
    let mut grid = vec![0i32; 8 * 64];
    let d = DistributedArray::map(&rt, &[rt.initial_device()], &mut grid, part, MapType::TO).expect("map");
    let (early, launched, sent) = runs_under_a_gated_kernel(&init, d.view(0), || d.send_halos(0, true));
    launched.expect("launch");
    sent.expect("send_halos");
    assert!(!early, "send_halos copied rows while a kernel of the initial device was writing them");
    d.gather().expect("gather");
    assert!(grid.iter().all(|&v| v == 7));
    assert_clean(&rt, 0).expect("clean");
}
