//! `offload_kernels::nn` at inference sizes (8192 rows x 768, GPT-2 small's width), in f32
//! and bf16: each op's time per launch, the median of criterion's samples, each sample a
//! run of launches queued back to back and one synchronize (so the time is the device's
//! for work larger than a launch). `NN_DEVICE=gpu` (the first GPU; says so and stops when
//! there is none) or `host` (one host device on every core, the default); print the table
//! of docs/PERFORMANCE.md beside `benches/pytorch/nn_ops.py` run on the same machine.
//!
//! `NN_DEVICE=gpu cargo bench -p offload-benches --bench nn`

use offload::half::bf16;
use offload::{DeviceBuffer, Runtime};
use offload_benches::{measuring, Bench, Budget};
use offload_kernels::nn::{self, NnFloat};

const ROWS: usize = 8192;
const COLS: usize = 768;

/// One sample's launches: enough that a launch's own cost is spread thin.
const BATCH: u64 = 20;

fn ops<T: NnFloat + Copy>(
    bench: &mut Bench,
    dev: &offload::Device<'_>,
    of: impl Fn(f32) -> T,
) -> offload::Result<Vec<(String, f64)>> {
    let n = ROWS * COLS;
    let host: Vec<T> = (0..n).map(|k| of(((k * 7919) % 10_007) as f32 / 10_007.0 * 8.0 - 4.0)).collect();
    let w: Vec<T> = (0..COLS).map(|k| of(1.0 + (k % 7) as f32 * 0.01)).collect();
    let x = DeviceBuffer::from_slice(dev, &host)?;
    let mut y = DeviceBuffer::<T>::new(dev, n)?;
    let (g, b) = (DeviceBuffer::from_slice(dev, &w)?, DeviceBuffer::from_slice(dev, &w)?);
    let mut out = Vec::new();
    let mut time = |name: &str, f: &mut dyn FnMut() -> offload::Result<()>| -> offload::Result<()> {
        let mut failed = None;
        let secs = bench.custom(&format!("{name} {}", T::NAME), Budget::SLOW, |iters| {
            let t = std::time::Instant::now();
            for _ in 0..iters * BATCH {
                if let Err(e) = f() {
                    failed.get_or_insert(e);
                }
            }
            if let Err(e) = dev.runtime().synchronize(dev.number()) {
                failed.get_or_insert(e);
            }
            t.elapsed() / BATCH as u32
        });
        if let Some(e) = failed {
            return Err(e);
        }
        out.push((name.to_string(), secs * 1e6));
        Ok(())
    };
    time("softmax", &mut || nn::softmax(dev, COLS, x.view(), y.view()))?;
    time("layer_norm", &mut || nn::layer_norm(dev, COLS, 1e-5, x.view(), g.view(), b.view(), y.view()))?;
    time("rms_norm", &mut || nn::rms_norm(dev, COLS, 1e-6, x.view(), g.view(), y.view()))?;
    time("gelu", &mut || nn::gelu(dev, x.view(), y.view()))?;
    time("gelu_tanh", &mut || nn::gelu_tanh(dev, x.view(), y.view()))?;
    time("silu", &mut || nn::silu(dev, x.view(), y.view()))?;
    time("add", &mut || nn::add(dev, x.view(), x.view(), y.view()))?;
    let _ = &mut y;
    Ok(out)
}

fn main() -> offload::Result<()> {
    if !measuring() {
        return Ok(());
    }
    let gpu = std::env::var("NN_DEVICE").is_ok_and(|v| v == "gpu");
    let rt = if gpu {
        Runtime::builder().gpus(true).host_devices(0).build()?
    } else {
        Runtime::builder().gpus(false).host_devices(1).build()?
    };
    if rt.num_devices() == 0 {
        println!("nn: no GPU ({}); nothing to measure", rt.device_report().trim_end());
        return Ok(());
    }
    print!("{}", rt.device_report());
    let dev = rt.device(0)?;
    let mut bench = Bench::new("nn");
    let f32s = ops::<f32>(&mut bench, &dev, |v| v)?;
    let bf16s = ops::<bf16>(&mut bench, &dev, bf16::from_f32)?;
    println!(
        "\n{ROWS} x {COLS}, {} device, us per op (median of criterion's samples)\n",
        if gpu { "GPU" } else { "host" }
    );
    println!("| op | f32 | bf16 |\n| --- | --- | --- |");
    for ((name, a), (_, b)) in f32s.iter().zip(&bf16s) {
        println!("| {name} | {a:.1} | {b:.1} |");
    }
    Ok(())
}
