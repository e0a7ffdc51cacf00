//! The trial's MLP service (issue 49), beside `benches/pytorch/mlp_service.py`, the same
//! service in PyTorch (docs/INFERENCE.md compares their lines): a 512 -> 1024 -> 1024 ->
//! 16 MLP with exact GELU from a safetensors file as PyTorch saves an `nn.Sequential`'s
//! state, in bf16 on every device (GPUs, else one host device), served from a bounded
//! intake in batches of up to 64 rows or a 5 ms deadline (a request never split); each
//! request is answered with its rows' softmax (bf16) and argmax. 500 requests of 1-8
//! rows from 4 client threads; prints the latency median and p99 and the batches' fill.
//!
//! ```text
//! cargo run --release -p offload-examples --example mlp_service -- mlp.safetensors
//! ```
//! A missing file is written first, with random weights.

use std::time::Duration;

use offload::half::bf16;
use offload::pipeline::{Intake, Pipeline, ServeConfig, ServeReport};
use offload::tensor::{DeviceTensor, Tensor};
use offload::weights::Weights;
use offload::{Activation, Device, DeviceSlice, Result, Runtime};
use offload_examples::inference::uniform;
use offload_kernels::ops;

const DIMS: [usize; 4] = [512, 1024, 1024, 16];
const MAX_ROWS: usize = 64;

/// One device's copy of the layers' weights and biases, and its activations' scratch.
struct Model<'rt> {
    layers: Vec<(DeviceTensor<'rt, bf16>, DeviceTensor<'rt, bf16>)>,
    acts: Vec<DeviceTensor<'rt, bf16>>,
}

fn load<'rt>(dev: &Device<'rt>, file: &Weights) -> Result<Model<'rt>> {
    let mut m = Model { layers: Vec::new(), acts: Vec::new() };
    for (l, d) in DIMS.windows(2).enumerate() {
        let w = file.device_tensor(dev, &format!("{}.weight", 2 * l), &[d[1], d[0]])?;
        m.layers.push((w, file.device_tensor(dev, &format!("{}.bias", 2 * l), &[d[1]])?));
    }
    for d in DIMS {
        m.acts.push(DeviceTensor::new(dev, format!("h{}", m.acts.len()), &[MAX_ROWS, d])?);
    }
    Ok(m)
}

/// `rows` rows of `x` through the model into their probabilities and classes.
fn forward(dev: &Device, m: &Model, rows: usize, x: DeviceSlice<f32>, out: Outputs) -> Result<()> {
    let act = |i: usize| m.acts[i].view().rows_range(0..rows);
    ops::from_f32(dev, &Tensor::new("x", x, &[rows, DIMS[0]])?, &act(0)?)?;
    for (l, (w, b)) in m.layers.iter().enumerate() {
        let f = if l < 2 { Activation::GeluExact } else { Activation::Identity };
        ops::linear(dev, &act(l)?, w, Some(b), &act(l + 1)?, f)?;
    }
    ops::softmax(dev, &act(3)?, &Tensor::new("probs", out.0, &[rows, DIMS[3]])?)?;
    ops::argmax(dev, &act(3)?, &Tensor::new("classes", out.1, &[rows])?)
}
type Outputs<'a> = (DeviceSlice<'a, bf16>, DeviceSlice<'a, u32>);
type Requests<'a> = Intake<'a, f32, (bf16, u32)>;

/// Serves the model of `path` on every device to what `clients` submits.
fn serve<R>(rt: &Runtime, path: &str, clients: impl FnOnce(&Requests) -> R) -> Result<(R, ServeReport)> {
    let file = Weights::open(path)?;
    let deadline = Duration::from_millis(5);
    let config =
        ServeConfig { in_row: 512, out_row: (16, 1), max_rows: MAX_ROWS, deadline, max_queued: Some(256) };
    let devices: Vec<usize> = (0..rt.num_devices()).collect();
    let pipeline = Pipeline::new(rt, &devices, 2)?;
    pipeline.serve_outputs(
        config,
        |dev| load(dev, &file),
        |dev, m, _, rows, x, out| forward(dev, m, rows, x, out),
        clients,
    )
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "mlp.safetensors".into());
    if !std::path::Path::new(&path).exists() {
        offload_examples::weights::write_sequential(&path, &DIMS, 7)?;
    }
    let rt = Runtime::new()?;
    let (answered, report) = serve(&rt, &path, |intake| {
        std::thread::scope(|s| {
            let client = |c: u64| {
                move || -> Result<usize> {
                    for r in 0..125 {
                        let rows = 1 + (c + 3 * r) as usize % 8;
                        intake.submit_rows(uniform(c * 1000 + r, rows * DIMS[0]))?.wait()?;
                    }
                    Ok(125)
                }
            };
            let threads: Vec<_> = (0..4).map(|c| s.spawn(client(c))).collect();
            threads.into_iter().map(|t| t.join().expect("a client thread")).sum::<Result<usize>>()
        })
    })?;
    let l = report.latency;
    println!("{} requests, p50 {:.2?}, p99 {:.2?}, fill {:.2}", answered?, l.median, l.p99, report.fill());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use offload::DeviceBuffer;
    use offload_tests::{check, on_every_backend};

    /// Every request is answered with its own rows run through the model alone on the
    /// same device: probabilities within two bf16 steps (the batch's GEMM may sum in
    /// another order), classes equal where the top two are apart; no batch over 64 rows.
    #[test]
    fn each_request_is_answered_with_the_models_output() {
        let path =
            std::env::temp_dir().join(format!("offload-mlp-service-{}.safetensors", std::process::id()));
        offload_examples::weights::write_sequential(&path, &DIMS, 11).expect("a model file");
        let path = path.to_str().expect("a UTF-8 path").to_string();
        on_every_backend(
            "mlp service",
            1,
            |b| b,
            |rt| {
                let (requests, report) = serve(rt, &path, |intake| {
                    let ask = |c: u64, r: u64| -> Result<_> {
                        let x = uniform(c * 100 + r, (1 + (c + r) as usize % 8) * DIMS[0]);
                        Ok((x.clone(), intake.submit_rows(x)?.answer()?))
                    };
                    std::thread::scope(|s| {
                        let threads: Vec<_> = (0..3)
                            .map(|c| s.spawn(move || (0..6).map(|r| ask(c, r)).collect::<Vec<_>>()))
                            .collect();
                        threads
                            .into_iter()
                            .flat_map(|t| t.join().expect("a client"))
                            .collect::<Result<Vec<_>>>()
                    })
                })?;
                let requests = requests?;
                check!(
                    report.requests == 18 && report.batch_rows.iter().all(|&r| r <= MAX_ROWS),
                    "{report:?}"
                );
                let dev = rt.device(0)?;
                let model = load(&dev, &Weights::open(&path)?)?;
                for (x, answer) in requests {
                    let rows = x.len() / DIMS[0];
                    let (probs, classes) =
                        (DeviceBuffer::<bf16>::new(&dev, rows * 16)?, DeviceBuffer::<u32>::new(&dev, rows)?);
                    let xs = DeviceBuffer::from_slice(&dev, &x)?;
                    forward(&dev, &model, rows, xs.view(), (probs.view(), classes.view()))?;
                    let (p, c) = (probs.to_vec()?, classes.to_vec()?);
                    let (got_p, got_c) = answer.row;
                    for (g, w) in got_p.iter().zip(&p) {
                        check!(
                            (g.to_f32() - w.to_f32()).abs() <= 2.0 * w.to_f32().max(1e-3) / 256.0,
                            "{got_p:?} != {p:?}"
                        );
                    }
                    for r in 0..rows {
                        let mut row: Vec<f32> = p[r * 16..(r + 1) * 16].iter().map(|v| v.to_f32()).collect();
                        row.sort_by(|a, b| b.total_cmp(a));
                        check!(
                            got_c[r] == c[r] || row[0] - row[1] <= 2.0 * row[0] / 256.0,
                            "row {r}: {got_c:?} != {c:?}"
                        );
                    }
                }
                Ok(())
            },
        );
        let _ = std::fs::remove_file(&path);
    }
}
