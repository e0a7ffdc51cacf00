//! Copy/compute overlap, side by side in one run: the inference pipeline (weights resident,
//! batches streamed from pageable memory, two slots per device) against the same batches
//! mapped, computed and unmapped one after another, with the three stage totals (copy-in,
//! compute, copy-out) measured in that serial run; then the pipeline on every GPU.
//!
//! `cargo bench -p offload-benches --bench overlap` (needs a GPU; says so without one).
//! `OVERLAP_BATCHES`, `OVERLAP_WIDTH`, `OVERLAP_ROWS`, `OVERLAP_LAYERS` change the size
//! (48 batches, 4096, 4096, 4 by default: DESIGN.md's PyTorch comparison).

use std::time::{Duration, Instant};

use offload::map;
use offload_benches::{Bench, Budget};
use offload_examples::inference::{check, uniform, Deployment, Mlp};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(rt) = offload_benches::gpu_bench("overlap")? else { return Ok(()) };
    let (batches, width, rows, layers) = (
        env("OVERLAP_BATCHES", 48),
        env("OVERLAP_WIDTH", 4096),
        env("OVERLAP_ROWS", 4096),
        env("OVERLAP_LAYERS", 4),
    );
    println!(
        "MLP {layers} x {width}, {batches} batches of {rows} rows ({} MiB each way)",
        (rows * width * 4) >> 20
    );
    let model = Mlp::new(layers, width);
    let inputs: Vec<Vec<f32>> = (0..batches).map(|b| uniform(1000 + b as u64, rows * width)).collect();
    let mut outputs = vec![vec![1f32; rows * width]; batches];

    let one = Deployment::new(&rt, &model, &[0], rows)?;
    one.run(&inputs[..2], &mut outputs[..2], 2, |_| {})?; // warm-up: cuBLAS, kernels, pool, staging

    // The serial run, timing each stage (the stage totals are the last run's); both runs
    // whole, as criterion samples (medians).
    let mut bench = Bench::new("overlap");
    let dev = rt.device(0)?;
    let mut stages = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut serial_run = || -> offload::Result<Duration> {
        let (mut t_in, mut t_compute, mut t_out) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let start = Instant::now();
        for b in 0..batches {
            let t = Instant::now();
            let x = dev.enter_data(map::to(&inputs[b]))?;
            t_in += t.elapsed();
            let y = dev.enter_data(map::from(&mut outputs[b]))?;
            let t = Instant::now();
            one.forward(&dev, x.views(), y.views())?;
            t_compute += t.elapsed();
            let t = Instant::now();
            y.exit()?;
            t_out += t.elapsed();
            x.exit()?;
        }
        stages = (t_in, t_compute, t_out);
        Ok(start.elapsed())
    };
    let serial = bench.custom("serial_1gpu", Budget::SLOW, |iters| {
        (0..iters).map(|_| serial_run().expect("serial run")).sum()
    });
    let (t_in, t_compute, t_out) = stages;
    let (err, n) = check(&model, &inputs, &outputs, &[0, batches - 1], &[0, rows - 1]);
    outputs.iter_mut().for_each(|o| o.fill(1.0));
    let piped = bench.custom("pipeline_1gpu_2slots", Budget::SLOW, |iters| {
        (0..iters).map(|_| one.run(&inputs, &mut outputs, 2, |_| {}).expect("pipeline run").elapsed).sum()
    });
    let (err1, _) = check(&model, &inputs, &outputs, &[0, batches - 1], &[0, rows - 1]);
    let s = |d: Duration| d.as_secs_f64();
    let bound = s(t_in).max(s(t_compute)).max(s(t_out));
    println!("\n| run | seconds | ms per batch |\n|---|---|---|");
    for (what, t) in [
        ("copy-in total (serial run)", s(t_in)),
        ("compute total (serial run)", s(t_compute)),
        ("copy-out total (serial run)", s(t_out)),
        ("serial: map -> compute -> unmap per batch, 1 GPU (median)", serial),
        ("pipeline, 1 GPU, 2 slots (median)", piped),
    ] {
        println!("| {what} | {t:.3} | {:.2} |", t * 1e3 / batches as f64);
    }
    println!(
        "pipeline / largest stage = {:.3} (goal <= 1.15); serial / pipeline = {:.2}",
        piped / bound,
        serial / piped
    );
    if rt.num_devices() > 1 {
        let all: Vec<usize> = (0..rt.num_devices()).collect();
        let many = Deployment::new(&rt, &model, &all, rows)?;
        many.run(&inputs[..2 * all.len()], &mut outputs[..2 * all.len()], 2, |_| {})?;
        outputs.iter_mut().for_each(|o| o.fill(1.0));
        let report = many.run(&inputs, &mut outputs, 2, |_| {})?;
        let t = s(report.elapsed);
        println!(
            "| pipeline, {} GPUs, 2 slots each | {t:.3} | {:.2} |\nthroughput {:.2}x one GPU (goal >= 1.85); batches per GPU {:?}",
            all.len(),
            t * 1e3 / batches as f64,
            piped / t,
            report.batches_per_device
        );
    }
    let (err2, _) = check(&model, &inputs, &outputs, &[0, batches - 1], &[0, rows - 1]);
    println!(
        "checked {n} rows per run against the CPU (f64): max relative error {:.2e}",
        err.max(err1).max(err2)
    );
    Ok(())
}
