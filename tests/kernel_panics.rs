//! A host kernel's failing work items do not print their panics: the launch returns the
//! failure, message included, as its error. Other panics still reach the program's hook.
//! (A file of its own: the panic hook is the process's.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use offload::{map, Error, Runtime};

/// Reads one element past `x` for the last item (items fail in the last task only).
#[offload::kernel]
fn past_the_end(i: usize, x: &[f32], y: &mut [f32]) {
    y[i] = x[i + 1];
}

/// Every item fails, in every task of the launch.
#[offload::kernel(teams = 32)]
fn every_thread_fails(team: usize, thread: usize, y: &mut [f32]) {
    y[team * 32 + thread + 4000] = 1.0;
}

#[test]
fn failing_kernels_print_nothing_and_other_panics_reach_the_programs_hook() -> Result<(), Error> {
    let printed = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&printed);
    // The program's hook, in place before the runtime's first kernel: it counts, then
    // prints as the default hook does.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        seen.fetch_add(1, Ordering::SeqCst);
        default(info)
    }));
    let rt = Runtime::builder().gpus(false).host_devices(2).build()?;
    for d in 0..2 {
        let dev = rt.device(d)?;
        let x = vec![1f32; 4096];
        let mut y = vec![0f32; 4096];
        let r = dev.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| past_the_end::launch(&dev, 4096, x, y));
        match r.map_err(offload_tests::cause) {
            Err(Error::KernelFailed { message, .. }) => {
                assert!(message.contains("out of range"), "{message}")
            }
            other => panic!("expected KernelFailed, got {other:?}"),
        }
        let r = dev.data(map::tofrom(&mut y), |y| every_thread_fails::launch(&dev, 64, y));
        match r.map_err(offload_tests::cause) {
            Err(Error::KernelFailed { message, .. }) => {
                assert!(message.contains("out of range"), "{message}")
            }
            other => panic!("expected KernelFailed, got {other:?}"),
        }
    }
    assert_eq!(printed.load(Ordering::SeqCst), 0, "a kernel's panic reached the program's hook");
    // A panic elsewhere still does.
    let _ = std::thread::spawn(|| panic!("not a kernel's")).join();
    assert_eq!(printed.load(Ordering::SeqCst), 1);
    let _ = std::panic::take_hook();
    Ok(())
}
