//! Multi-GPU inference: a multilayer perceptron (4 layers of 4096 by default) whose weights
//! are mapped once per device and stay resident, with input batches streamed from pageable
//! host memory through a pipeline (copy-in, compute and copy-out overlapped, at least two
//! batches in flight per device, batches spread over all devices). Each layer one GEMM
//! (`offload_kernels::linear`: cuBLASLt on GPUs, the bias and ReLU fused into its
//! epilogue), in fp32, TF32, fp16 or bf16 (inputs, weights and outputs in that type, f32
//! accumulation); outputs checked against a CPU reference (f64) on sampled rows of sampled
//! batches, within the precision's tolerance.
//!
//! ```text
//! cargo run --release -p offload-examples --example inference -- -batches 48
//! ```
//! Options: `-layers N` (4), `-width N` (4096), `-batch N` (rows per batch, 4096),
//! `-batches N` (48), `-ndev N` (all), `-slots N` (4), `-check N` (batches checked, 2),
//! `-weights FILE` (the model from a safetensors file, `layers.{l}.weight` and
//! `layers.{l}.bias` in F32, instead of generated weights; its layers and width then
//! replace `-layers` and `-width`), `-save-weights FILE` (writes the generated model so),
//! `-stages N` (pipeline parallelism instead: the layers split into N stages, stage `s`
//! on device `s mod ndev`, micro-batches flowing stage to stage with
//! `max(slots, N + 1)` in the pipe; `-stages 0`, the default, streams whole batches to
//! devices each holding the whole model), `-precision fp32|tf32|fp16|bf16` (fp32),
//! `-repeat N` (runs, each into fresh output pages; the median printed; 1),
//! `-reuse-outputs 1` (later runs into the first run's outputs, already faulted in). The
//! compute alone (the same forward passes over a device-resident batch) is printed after.
//! Without GPUs it runs on host devices (`OFFLOAD_HOST_DEVICES`, two by default); pick small
//! sizes there, e.g.
//! `-width 64 -batch 32 -batches 8`.

use std::io::Write;
use std::time::Instant;

use offload::half::{bf16, f16};
use offload::{Precision, Runtime};
use offload_examples::inference::{check, uniform, Deployment, Mlp, StagedDeployment};
use offload_examples::options::Options;
use offload_examples::{example_devices, example_runtime};
use offload_kernels::nn::NnFloat;

struct Args {
    layers: usize,
    width: usize,
    batch: usize,
    batches: usize,
    ndev: Option<usize>,
    slots: usize,
    check: usize,
    weights: Option<String>,
    save_weights: Option<String>,
    stages: usize,
    precision: Precision,
    repeat: usize,
    reuse_outputs: bool,
}

const OPTIONS: &[&str] = &[
    "layers",
    "width",
    "batch",
    "batches",
    "ndev",
    "slots",
    "check",
    "weights",
    "save-weights",
    "stages",
    "precision",
    "repeat",
    "reuse-outputs",
];

fn parse() -> Result<Args, String> {
    let o = Options::parse(&[])?;
    o.only(OPTIONS, "see the file's header for the options")?;
    let precision = match o.value("precision") {
        Some(p) => p.parse().map_err(|e: offload::Error| e.to_string())?,
        None => Precision::Fp32,
    };
    Ok(Args {
        layers: o.num("layers", 4usize)?.max(1),
        width: o.num("width", 4096usize)?.max(1),
        batch: o.num("batch", 4096usize)?.max(1),
        batches: o.num("batches", 48)?,
        ndev: o.num_opt("ndev")?,
        slots: o.num("slots", 4)?,
        check: o.num("check", 2)?,
        weights: o.value("weights").map(String::from),
        save_weights: o.value("save-weights").map(String::from),
        stages: o.num("stages", 0)?,
        precision,
        repeat: o.num("repeat", 1usize)?.max(1),
        reuse_outputs: o.num("reuse-outputs", 0usize)? != 0,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let rt = example_runtime()?;
    let devices = example_devices(&rt, args.ndev);
    print!("{}", rt.device_report());
    let model = match &args.weights {
        Some(path) => Mlp::from_safetensors(path)?,
        None => Mlp::new(args.layers, args.width),
    };
    if let Some(path) = &args.save_weights {
        std::fs::write(path, model.to_safetensors()?)?;
    }
    match args.precision {
        Precision::Fp32 | Precision::Tf32 => run::<f32>(&args, &rt, &devices, &model),
        Precision::Fp16 => run::<f16>(&args, &rt, &devices, &model),
        Precision::Bf16 => run::<bf16>(&args, &rt, &devices, &model),
    }
}

/// The run in elements of `T` (inputs, weights, outputs).
fn run<T: NnFloat>(
    args: &Args,
    rt: &Runtime,
    devices: &[usize],
    model: &Mlp,
) -> Result<(), Box<dyn std::error::Error>> {
    let (w, rows, layers) = (model.width, args.batch, model.weights.len());
    println!(
        "MLP {layers} x {w}{} in {}, {} batches of {rows} rows ({:.0} MiB each), {} devices, {} slots each",
        args.weights.as_deref().map(|p| format!(" from {p}")).unwrap_or_default(),
        args.precision.name(),
        args.batches,
        (rows * w * std::mem::size_of::<T>()) as f64 / (1 << 20) as f64,
        devices.len(),
        args.slots
    );
    let inputs: Vec<Vec<T>> = (0..args.batches)
        .map(|b| uniform(1000 + b as u64, rows * w).into_iter().map(T::from_f32).collect())
        .collect();
    // Fresh pages, as a program's new outputs are: the copy-out lane faults them in.
    let mut outputs: Vec<Vec<T>> = (0..args.batches).map(|_| offload::zeroed_vec(rows * w)).collect();
    let flops = 2.0 * (layers * w * w * rows * args.batches) as f64;
    let per_batch = |secs: f64| {
        format!(
            "{} batches in {secs:.3} s: {:.1} ms per batch, {:.1} TFLOP/s",
            args.batches,
            secs * 1e3 / args.batches as f64,
            flops / secs / 1e12
        )
    };
    let mut times = Vec::new();
    if args.stages > 0 {
        let stage_devices: Vec<usize> = (0..args.stages).map(|s| devices[s % devices.len()]).collect();
        let staged = StagedDeployment::new(rt, model, &stage_devices, rows, args.precision)?;
        for r in 0..args.repeat {
            if r > 0 && !args.reuse_outputs {
                outputs = (0..args.batches).map(|_| offload::zeroed_vec(rows * w)).collect();
            }
            let report = staged.run(&inputs, &mut outputs, args.slots.max(args.stages + 1))?;
            println!(
                "{}; {} stages on devices {stage_devices:?}, {} hand-offs between devices",
                per_batch(report.elapsed.as_secs_f64()),
                args.stages,
                report.hand_offs
            );
            times.push(report.elapsed.as_secs_f64());
        }
    } else {
        let deployment = Deployment::in_precision(rt, model, devices, rows, args.precision)?;
        for r in 0..args.repeat {
            if r > 0 && !args.reuse_outputs {
                outputs = (0..args.batches).map(|_| offload::zeroed_vec(rows * w)).collect();
            }
            let start = Instant::now();
            let total = args.batches;
            let report = deployment.run(&inputs, &mut outputs, args.slots, |done| {
                if done % 4 == 0 || done == total {
                    eprint!("\r  {done}/{total} batches, {:.1} s", start.elapsed().as_secs_f64());
                    let _ = std::io::stderr().flush();
                }
            })?;
            eprintln!();
            println!(
                "{}; batches per device {:?}",
                per_batch(report.elapsed.as_secs_f64()),
                report.batches_per_device
            );
            times.push(report.elapsed.as_secs_f64());
        }
        if let Some(first) = inputs.first() {
            let t = deployment.compute_alone(first, args.batches)?.as_secs_f64();
            println!("compute alone ({}, device-resident batches): {}", args.precision.name(), per_batch(t));
        }
    }
    if times.len() > 1 {
        times.sort_by(f64::total_cmp);
        println!(
            "median of {} runs ({}): {}",
            times.len(),
            args.precision.name(),
            per_batch(times[times.len() / 2])
        );
    }
    let sampled: Vec<usize> =
        (0..args.check.min(args.batches)).map(|i| i * args.batches / args.check.max(1)).collect();
    let rows_checked = [0, rows / 2, rows - 1];
    let (err, n) = check(model, &inputs, &outputs, &sampled, &rows_checked);
    let tol = args.precision.tolerance();
    println!(
        "checked {n} rows of batches {sampled:?} against the CPU (f64): max relative error {err:.2e} \
         (tolerance for {}: {tol:.0e})",
        args.precision.name()
    );
    if err.is_nan() || err > tol {
        return Err(format!("outputs differ from the reference: relative error {err:.2e}").into());
    }
    Ok(())
}
