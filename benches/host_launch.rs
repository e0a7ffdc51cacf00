//! What one launch costs on a host device, beside libomptarget's host plugin
//! (`benches/c/host_launch.c`, run by `scripts/host-launch.sh`): a saxpy-like kernel
//! (`y[i] += a * x[i]`) over n = 1, 1 024 and 65 536 floats already mapped by a `data`
//! region, on `host_devices(1)`: the generated `offload_kernels::generated::saxpy`
//! (`#[offload::kernel]`: one item per call, relaxed-atomic loads and stores) and the
//! hand-written `offload_kernels::SAXPY` (a `rayon` zip over the slices, vectorised), so
//! that the launch's own cost shows apart from the body's.
//!
//! Two figures per size, each the median of criterion's samples:
//! - *launch + synchronize*: one launch and a wait for it, as a synchronous OpenMP target
//!   region costs its encountering thread;
//! - *batch of 64, per launch*: 64 launches and one synchronize, divided by 64 (the same as
//!   the first while launches wait for their kernel; less once they only enqueue).
//!
//! Then `enter(to)` + `exit(from)` of a new 4 KiB range (allocate, copy in, copy back,
//! free), as the C twin's `target enter data` / `target exit data`.
//!
//! `cargo bench -p offload-benches --bench host_launch` (prints the rows of docs/PERFORMANCE.md).

use offload::{map, MapItem, Runtime};
use offload::{DeviceSlice, Kernel};
use offload_benches::{Bench, Budget};
use offload_kernels::generated::saxpy;

/// The largest size; the smaller ones use the front of the same mapped arrays.
const N: usize = 65_536;

/// Launches per batch of the second figure.
const BATCH: usize = 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !offload_benches::measuring() {
        return Ok(());
    }
    let rt = Runtime::builder().host_devices(1).build()?;
    let dev = rt.device(0)?;
    let mut b = Bench::new("host_launch");
    let x: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let mut y = vec![1f32; N];
    let mut rows = Vec::new();
    dev.data((map::to(&x), map::tofrom(&mut y)), |(xv, yv)| {
        type Launch<'a> = Box<dyn Fn(usize, DeviceSlice<'_, f32>, DeviceSlice<'_, f32>) + 'a>;
        let hand: &Kernel = &offload_kernels::SAXPY;
        let kernels: [(&str, Launch<'_>); 2] = [
            ("generated", Box::new(|n, xv, yv| saxpy::launch(&dev, n, 0.5, xv, yv).expect("launch"))),
            ("hand-written", Box::new(|n, xv, yv| dev.launch(hand, n, (0.5f32, xv, yv)).expect("launch"))),
        ];
        for (name, launch) in &kernels {
            for n in [1usize, 1024, N] {
                let one = b.wall(&format!("{name}/launch+sync/{n}"), Budget::FAST, || {
                    launch(n, xv, yv);
                    rt.synchronize(dev.number()).expect("synchronize");
                });
                let batch = b.wall(&format!("{name}/batch{BATCH}/{n}"), Budget::FAST, || {
                    for _ in 0..BATCH {
                        launch(n, xv, yv);
                    }
                    rt.synchronize(dev.number()).expect("synchronize");
                }) / BATCH as f64;
                rows.push((*name, n, one, batch));
            }
        }
        Ok(())
    })?;
    let mut z = vec![1f32; 1024];
    let zp = z.as_mut_ptr();
    let (to, from) = ([MapItem::to(zp, 4096)], [MapItem::from(zp, 4096)]);
    let pair = b.wall("enter_exit_new_4KiB", Budget::FAST, || {
        // SAFETY: `z` outlives the mapping, which each iteration makes and ends, and is not
        // touched meanwhile.
        unsafe {
            rt.enter_data(0, std::hint::black_box(&to)).expect("enter");
            rt.exit_data(0, std::hint::black_box(&from)).expect("exit");
        }
    });
    println!("\nhost device, saxpy on mapped data, median per launch\n");
    println!("| kernel | n | launch + synchronize | batch of {BATCH}, per launch |\n|---|---|---|---|");
    for (name, n, one, batch) in rows {
        println!("| {name} | {n} | {:.2} us | {:.2} us |", one * 1e6, batch * 1e6);
    }
    println!("\nenter(to) + exit(from) of a new 4 KiB range: {:.2} us per pair", pair * 1e6);
    Ok(())
}
