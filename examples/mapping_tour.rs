//! A tour of the device data environment: maps arrays on every device, runs kernels whose
//! arguments are found through the present table, and prints what moved.
//!
//! ```text
//! cargo run --release -p offload-examples --example mapping_tour [-- -n ELEMENTS]
//! ```
//!
//! With GPUs it uses them; without, it runs on host devices (`OFFLOAD_HOST_DEVICES`,
//! two unless set). Set `OFFLOAD_INFO=0x28` to see every entry and transfer as it happens.

use offload::{map, HostBuffer, InfoFlags, MapType, Runtime};
use offload_kernels as k;

/// `y += a * x`, written once: CUDA C on GPUs, a `rayon` loop on host devices.
#[offload::kernel]
fn axpy(i: usize, a: f32, x: &[f32], y: &mut [f32]) {
    y[i] += a * x[i];
}

/// `total += sum(y)`: OpenMP's `reduction(+: total)`.
#[offload::kernel(reduction(+: total))]
fn sum_of(i: usize, y: &[f32], total: &mut f32) {
    *total += y[i];
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = parse_n()?;
    let mut b = Runtime::builder();
    if std::env::var_os("OFFLOAD_HOST_DEVICES").is_none() {
        b = b.host_devices(2);
    }
    if std::env::var_os("OFFLOAD_INFO").is_none() {
        b = b.info(InfoFlags::NONE);
    }
    let rt = b.build()?;
    print!("{}", rt.device_report());
    println!("{} device(s); initial device is {}\n", rt.num_devices(), rt.initial_device());

    // One slice of x per device, each mapped on its own device: the present table of
    // device d holds only slice d.
    let devices = rt.num_devices().max(1);
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut y = vec![1.0f32; n];
    let per = n.div_ceil(devices);
    let mut sums = vec![[0.0f32]; devices];
    std::thread::scope(|s| -> Result<(), offload::Error> {
        let mut handles = Vec::new();
        for (d, ((xs, ys), sum)) in x.chunks(per).zip(y.chunks_mut(per)).zip(sums.iter_mut()).enumerate() {
            let rt = &rt;
            let number = if rt.num_devices() == 0 { rt.initial_device() } else { d };
            handles.push(s.spawn(move || {
                let dev = rt.device(number)?;
                dev.data((map::to(xs), map::tofrom(ys), map::tofrom(sum)), |(xv, yv, sv)| {
                    // 10 launches, no copy in between: the mapping is found each time.
                    for _ in 0..10 {
                        axpy::launch(&dev, yv.len(), 0.5, xv, yv)?;
                    }
                    sum_of::launch(&dev, yv.len(), yv, sv)?;
                    if rt.num_devices() > 0 {
                        println!("device {number} while mapped:\n{}", rt.dump_present_table(number)?);
                    }
                    Ok(())
                })
            }));
        }
        handles.into_iter().try_for_each(|h| h.join().expect("device thread panicked"))
    })?;

    // Check against the host.
    let expect: f64 = (0..n).map(|i| 1.0 + 5.0 * i as f64).sum();
    let got: f64 = sums.iter().map(|s| f64::from(s[0])).sum();
    let max_err = y.iter().enumerate().map(|(i, &v)| (v - (1.0 + 5.0 * i as f32)).abs()).fold(0.0, f32::max);
    println!("sum of y: {got:.6e} (expected {expect:.6e}); max |y - y_ref| = {max_err}");

    // A long-lived mapping: a runtime-owned buffer entered once, used, exited later.
    if rt.num_devices() > 0 {
        let mut z = HostBuffer::from_slice(&rt, &[3i32; 8])?;
        z.enter(0, MapType::TO)?;
        rt.device(0)?.launch(&k::ADD_I32, z.len(), (4i32, z.view(0)))?;
        z.exit(0, MapType::FROM)?;
        if z.iter().any(|&v| v != 7) {
            return Err("enter/launch/exit gave a wrong z".into());
        }
        println!("enter data to(z) / kernel z += 4 / exit data from(z): z = {:?}", &z[..4]);
    }

    println!("\nwhat moved:");
    for d in 0..rt.num_devices() {
        let s = rt.transfer_stats(d)?;
        println!(
            "  device {d} ({}): {} copies host->device ({} bytes), {} copies device->host ({} bytes)",
            rt.describe(d)?.name,
            s.to_device,
            s.to_device_bytes,
            s.from_device,
            s.from_device_bytes
        );
    }
    if max_err > 1e-3 * n as f32 {
        return Err("results differ from the host reference".into());
    }
    Ok(())
}

fn parse_n() -> Result<usize, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(1 << 20),
        [flag, v] if flag == "-n" => v.parse().map_err(|_| format!("-n wants a number, got {v:?}")),
        _ => Err("usage: mapping_tour [-n ELEMENTS]".into()),
    }
}
