//! The trial's MLP (issue 49: 512 -> 1024 -> 1024 -> 16, tanh GELU fused into the first two
//! layers, then softmax and argmax) on one batch of 64 device-resident rows, in f32 and
//! bf16: the time per batch, the median of criterion's samples, each sample batches
//! queued back to back and one synchronize. One host device on every core unless
//! `MLP_DEVICE=gpu`; print the table of docs/PERFORMANCE.md beside
//! `benches/pytorch/mlp_batch.py` run on the same machine.
//!
//! `cargo bench -p offload-benches --bench mlp_batch`

use offload::half::bf16;
use offload::tensor::DeviceTensor;
use offload::{Activation, Runtime};
use offload_benches::{measuring, Bench, Budget};
use offload_kernels::nn::NnFloat;
use offload_kernels::ops;

const DIMS: [usize; 4] = [512, 1024, 1024, 16];
const ROWS: usize = 64;

/// Milliseconds per batch in `T`.
fn batch<T: NnFloat + Copy>(bench: &mut Bench, dev: &offload::Device<'_>) -> offload::Result<f64> {
    let fill = |name: String, dims: &[usize], scale: f32| -> offload::Result<DeviceTensor<'_, T>> {
        let n: usize = dims.iter().product();
        let v: Vec<T> =
            (0..n).map(|k| T::from_f32((((k * 7919) % 10_007) as f32 / 10_007.0 - 0.5) * scale)).collect();
        DeviceTensor::from_host(dev, &offload::tensor::HostTensor::new(name, dims, v)?)
    };
    let mut layers = Vec::new();
    for (l, d) in DIMS.windows(2).enumerate() {
        let bound = 2.0 / (d[0] as f32).sqrt();
        layers.push((fill(format!("w{l}"), &[d[1], d[0]], bound)?, fill(format!("b{l}"), &[d[1]], bound)?));
    }
    let acts: Vec<DeviceTensor<'_, T>> = DIMS
        .iter()
        .enumerate()
        .map(|(i, &d)| fill(format!("h{i}"), &[ROWS, d], 2.0))
        .collect::<offload::Result<_>>()?;
    let probs = DeviceTensor::<T>::new(dev, "probs", &[ROWS, 16])?;
    let classes = DeviceTensor::<u32>::new(dev, "classes", &[ROWS])?;
    let forward = || -> offload::Result<()> {
        for (l, (w, b)) in layers.iter().enumerate() {
            let act = if l < 2 { Activation::Gelu } else { Activation::Identity };
            ops::linear(dev, &acts[l], w, Some(b), &acts[l + 1], act)?;
        }
        ops::softmax(dev, &acts[3], &probs)?;
        ops::argmax(dev, &acts[3], &classes)
    };
    forward()?;
    let mut failed = None;
    let secs = bench.custom(&format!("mlp batch {}", T::NAME), Budget::SLOW, |iters| {
        let t = std::time::Instant::now();
        for _ in 0..iters {
            if let Err(e) = forward() {
                failed.get_or_insert(e);
            }
        }
        if let Err(e) = dev.runtime().synchronize(dev.number()) {
            failed.get_or_insert(e);
        }
        t.elapsed()
    });
    failed.map_or(Ok(secs * 1e3), Err)
}

fn main() -> offload::Result<()> {
    if !measuring() {
        return Ok(());
    }
    let gpu = std::env::var("MLP_DEVICE").is_ok_and(|v| v == "gpu");
    let rt = if gpu {
        Runtime::builder().gpus(true).host_devices(0).build()?
    } else {
        Runtime::builder().gpus(false).host_devices(1).build()?
    };
    if rt.num_devices() == 0 {
        println!("mlp_batch: no GPU ({}); nothing to measure", rt.device_report().trim_end());
        return Ok(());
    }
    print!("{}", rt.device_report());
    let dev = rt.device(0)?;
    let mut bench = Bench::new("mlp_batch");
    let (f, b) = (batch::<f32>(&mut bench, &dev)?, batch::<bf16>(&mut bench, &dev)?);
    println!(
        "\n| {ROWS} rows, {} device | f32 | bf16 |\n| --- | --- | --- |",
        if gpu { "GPU" } else { "host" }
    );
    println!("| ms per batch | {f:.3} | {b:.3} |");
    Ok(())
}
