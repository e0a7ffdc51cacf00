//! What a grid split in 2-D or 3-D pays to move one face, the inputs of
//! `scripts/scaling-model.py`'s remedies: packing a face of `n x n` f32 points (16 MiB at
//! n = 2048) out of a part's box and unpacking it, for each axis (across the slowest axis
//! the face is one contiguous run, across the middle one `n` runs of `n`, across the
//! fastest one point every few), by the generated box kernel
//! (`offload::partition::halo`); copying the packed face to a pinned host buffer and back
//! (the staged path's two copies a side); and `DistributedGrid::exchange_halos` of two
//! parts on the one device split across each axis (two faces: pack, unpack). Each figure is
//! the time per operation, the median of criterion's samples, each sample a run of
//! operations queued back to back and one synchronize.
//!
//! `GRID_DEVICE=gpu` (the first GPU; says so and stops without one) or `host` (one host
//! device, the default); `FACE_N` (2048) the face's side.
//!
//! `GRID_DEVICE=gpu cargo bench -p offload-benches --bench grid_faces`

use offload::partition::{halo, DistributedGrid, GridBox, GridPartition, Reach};
use offload::{DeviceBuffer, HostBuffer, MapType, Runtime};
use offload_benches::{measuring, Bench, Budget};

/// One sample's operations: enough that a launch's own cost is spread thin.
const BATCH: u64 = 10;

/// Median seconds per call of `f` on `rt`'s device `d` (see the module documentation).
fn per_call(
    bench: &mut Bench,
    rt: &Runtime,
    d: usize,
    id: &str,
    f: &mut dyn FnMut() -> offload::Result<()>,
) -> offload::Result<f64> {
    let mut failed = None;
    let secs = bench.custom(id, Budget::SLOW, |iters| {
        let t = std::time::Instant::now();
        for _ in 0..iters * BATCH {
            if let Err(e) = f() {
                failed.get_or_insert(e);
            }
        }
        if let Err(e) = rt.synchronize(d) {
            failed.get_or_insert(e);
        }
        t.elapsed() / BATCH as u32
    });
    failed.map_or(Ok(secs), Err)
}

fn main() -> offload::Result<()> {
    if !measuring() {
        return Ok(());
    }
    let gpu = std::env::var("GRID_DEVICE").is_ok_and(|v| v == "gpu");
    let n: usize = std::env::var("FACE_N").ok().and_then(|v| v.parse().ok()).unwrap_or(2048);
    let rt = if gpu {
        Runtime::builder().gpus(true).host_devices(0).build()?
    } else {
        Runtime::builder().gpus(false).host_devices(1).build()?
    };
    if rt.num_devices() == 0 {
        println!("grid_faces: no GPU ({}); nothing to measure", rt.device_report().trim_end());
        return Ok(());
    }
    print!("{}", rt.device_report());
    let dev = rt.device(0)?;
    let mut bench = Bench::new("grid_faces");
    let face_bytes = (n * n * 4) as f64;
    let mut rows: Vec<(String, f64)> = Vec::new();
    // A box 4 points deep across the face's axis: the face is its first layer.
    for (axis, name) in [(0, "slowest (contiguous)"), (1, "middle (runs of n)"), (2, "fastest (strided)")] {
        let mut extents = [n, n, n];
        extents[axis] = 4;
        let within = GridBox::new(&extents.map(|e| 0..e));
        let mut face = extents.map(|e| 0..e);
        face[axis] = 0..1;
        let face = GridBox::new(&face);
        let array = DeviceBuffer::<f32>::from_slice(&dev, &vec![1.0; within.len()])?;
        let packed = DeviceBuffer::<f32>::new(&dev, face.len())?;
        let t = per_call(&mut bench, &rt, 0, &format!("pack {name}"), &mut || {
            halo::pack(&dev, &face, &within, array.view(), packed.view())
        })?;
        rows.push((format!("pack a face across the {name} axis"), t));
        let t = per_call(&mut bench, &rt, 0, &format!("unpack {name}"), &mut || {
            halo::unpack(&dev, &face, &within, packed.view(), array.view())
        })?;
        rows.push((format!("unpack a face across the {name} axis"), t));
    }
    // The staged path's copies of a packed face.
    let packed = DeviceBuffer::<f32>::from_slice(&dev, &vec![1.0; n * n])?;
    let mut pinned = HostBuffer::<f32>::new(&rt, n * n)?;
    let (host, bytes) = (rt.initial_device(), n * n * 4);
    let to = pinned.as_mut_ptr() as u64;
    let t = per_call(&mut bench, &rt, 0, "device -> pinned", &mut || {
        // SAFETY: the whole packed buffer into the pinned one of as many bytes, both alive
        // for the loop, the pinned one touched by nothing else.
        unsafe { rt.target_memcpy(to, packed.addr(), bytes, 0, 0, host, 0) }
    })?;
    rows.push(("copy a packed face device -> pinned host".into(), t));
    let t = per_call(&mut bench, &rt, 0, "pinned -> device", &mut || {
        // SAFETY: as above, the other way.
        unsafe { rt.target_memcpy(packed.addr(), to, bytes, 0, 0, 0, host) }
    })?;
    rows.push(("copy a packed face pinned host -> device".into(), t));
    // Two parts on the device, split across each axis: an exchange moves two faces.
    for (axis, name) in [(0, "slowest"), (2, "fastest")] {
        let mut extents = [n + 2, n + 2, n + 2];
        extents[axis] = 2 * 4 + 2;
        let mut shape = [1, 1, 1];
        shape[axis] = 2;
        let part = GridPartition::new(&extents, &shape, 1)?;
        let mut grid = vec![1f32; extents.iter().product()];
        let d = DistributedGrid::map(&rt, &[0, 0], &mut grid, part, Reach::Faces, MapType::ALLOC)?;
        let t = per_call(&mut bench, &rt, 0, &format!("exchange across {name}"), &mut || d.exchange_halos())?;
        rows.push((
            format!("DistributedGrid::exchange_halos, 2 parts split across the {name} axis (2 faces)"),
            t,
        ));
    }
    let _ = &mut pinned;
    println!(
        "\nfaces of {n} x {n} f32 ({:.1} MiB), {} device, per operation (median of criterion's samples)\n",
        face_bytes / 1048576.0,
        if gpu { "GPU" } else { "host" }
    );
    println!("| operation | us | GB/s of one face |\n| --- | --- | --- |");
    for (what, t) in rows {
        println!("| {what} | {:.1} | {:.0} |", t * 1e6, face_bytes / t / 1e9);
    }
    Ok(())
}
