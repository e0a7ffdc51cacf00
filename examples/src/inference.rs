//! The multilayer perceptron of `examples/inference.rs`, as a library so that tests and the
//! `overlap` bench run the same code: `layers` dense layers of `width` features (ReLU
//! between them, none after the last), weights mapped once per device and kept resident,
//! input batches streamed from pageable host memory through a [`Pipeline`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use offload::pipeline::{Pipeline, PipelineReport, Stage, StagePipeline, StageReport};
use offload::{Device, DeviceSlice, HostBuffer, MapType, Result, Runtime, Sgemm};
use offload_kernels::BIAS_ACT;

/// A model's shape and weights (row-major `[out][in]` per layer).
#[derive(Debug)]
pub struct Mlp {
    /// Features in and out of every layer.
    pub width: usize,
    /// Weights, one `width x width` matrix per layer.
    pub weights: Vec<Vec<f32>>,
    /// Biases, one `width` vector per layer.
    pub biases: Vec<Vec<f32>>,
}

/// A deterministic generator of uniform floats in `[0, 1)` (weights and inputs that are the
/// same on every run and every machine).
pub fn uniform(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect()
}

impl Mlp {
    /// A model with weights uniform in `[-1/sqrt(width), 1/sqrt(width))`, as a freshly
    /// initialised dense layer has them.
    pub fn new(layers: usize, width: usize) -> Self {
        let scale = 1.0 / (width as f32).sqrt();
        let weights = (0..layers)
            .map(|l| {
                uniform(100 + l as u64, width * width).into_iter().map(|v| (2.0 * v - 1.0) * scale).collect()
            })
            .collect();
        let biases = (0..layers)
            .map(|l| uniform(200 + l as u64, width).into_iter().map(|v| 0.1 * v).collect())
            .collect();
        Self { width, weights, biases }
    }

    /// One input row through every layer on the CPU, in f64 (the reference).
    pub fn reference_row(&self, x: &[f32]) -> Vec<f32> {
        let w = self.width;
        let mut cur: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        for (l, (wl, bl)) in self.weights.iter().zip(&self.biases).enumerate() {
            let last = l + 1 == self.weights.len();
            cur = (0..w)
                .map(|o| {
                    let s: f64 =
                        (0..w).map(|i| f64::from(wl[o * w + i]) * cur[i]).sum::<f64>() + f64::from(bl[o]);
                    if last {
                        s
                    } else {
                        s.max(0.0)
                    }
                })
                .collect();
        }
        cur.into_iter().map(|v| v as f32).collect()
    }
}

/// Per-device state: the resident weights of some layers and two activation buffers.
struct DeviceModel {
    weights: Vec<HostBuffer<f32>>,
    biases: Vec<HostBuffer<f32>>,
    scratch: [HostBuffer<f32>; 2],
}

impl DeviceModel {
    /// Layers `layers` of `model` mapped on device `d` (kept resident), with scratch for
    /// `batch` rows; first-use costs (the kernel's compilation, the BLAS handle, staging
    /// buffers) paid now, so that a run measures the steady state.
    fn new(
        rt: &Runtime,
        model: &Mlp,
        layers: std::ops::Range<usize>,
        d: usize,
        batch: usize,
    ) -> Result<Self> {
        let up = |v: &[f32]| -> Result<HostBuffer<f32>> {
            let b = HostBuffer::from_slice(rt, v)?;
            b.enter(d, MapType::TO)?;
            Ok(b)
        };
        let weights = model.weights[layers.clone()].iter().map(|w| up(w)).collect::<Result<Vec<_>>>()?;
        let biases = model.biases[layers].iter().map(|b| up(b)).collect::<Result<Vec<_>>>()?;
        let scratch = |_| -> Result<HostBuffer<f32>> {
            let b = HostBuffer::new(rt, batch * model.width)?;
            b.enter(d, MapType::ALLOC)?;
            Ok(b)
        };
        let m = DeviceModel { weights, biases, scratch: [scratch(0)?, scratch(1)?] };
        let dev = rt.device(d)?;
        dev.prepare(&BIAS_ACT)?;
        rt.staging_report(d)?;
        let one = Sgemm {
            transa: true,
            transb: false,
            m: 1,
            n: 1,
            k: 1,
            alpha: 1.0,
            lda: 1,
            ldb: 1,
            beta: 0.0,
            ldc: 1,
        };
        let (w, s) = (view(&m.weights[0], d, 1), view(&m.scratch[0], d, 1));
        dev.sgemm(&one, w, s, view(&m.scratch[1], d, 1))?;
        Ok(m)
    }

    /// This device's layers over one batch on `dev`: `x` (rows of `width`) in, `y` out;
    /// ReLU after every layer but the model's last (`last_is_models`).
    fn forward(
        &self,
        dev: &Device<'_>,
        width: usize,
        x: DeviceSlice<'_, f32>,
        y: DeviceSlice<'_, f32>,
        last_is_models: bool,
    ) -> Result<()> {
        let (w, rows) = (width, x.len() / width);
        let layers = self.weights.len();
        // Y^T (width x rows, column-major) = W (row-major, so transposed) * X^T.
        let g = Sgemm {
            transa: true,
            transb: false,
            m: w,
            n: rows,
            k: w,
            alpha: 1.0,
            lda: w,
            ldb: w,
            beta: 0.0,
            ldc: w,
        };
        let d = dev.number();
        let scratch = [view(&self.scratch[0], d, rows * w), view(&self.scratch[1], d, rows * w)];
        let mut input = x;
        for l in 0..layers {
            let out = if l + 1 == layers { y } else { scratch[l % 2] };
            dev.sgemm(&g, view(&self.weights[l], d, w * w), input, out)?;
            // The hand-written epilogue, the one the figures measured (the generated
            // `offload_kernels::bias_act` takes these scratch views too: a HostBuffer's
            // shared view is device scratch, which `&mut` kernel arguments accept).
            let relu = u32::from(l + 1 < layers || !last_is_models);
            dev.launch(&BIAS_ACT, rows * w, (out, view(&self.biases[l], d, w), w as u64, relu))?;
            input = out;
        }
        Ok(())
    }
}

/// The model on a set of devices, ready to stream batches of `batch` rows.
pub struct Deployment<'rt> {
    rt: &'rt Runtime,
    model: &'rt Mlp,
    batch: usize,
    devices: Vec<usize>,
    per_device: Vec<DeviceModel>,
}

impl std::fmt::Debug for Deployment<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployment").field("devices", &self.devices).field("batch", &self.batch).finish()
    }
}

impl<'rt> Deployment<'rt> {
    /// Maps the weights on every device (once: they stay resident) and the activation
    /// buffers (device-only: mapped `alloc`, never copied).
    pub fn new(rt: &'rt Runtime, model: &'rt Mlp, devices: &[usize], batch: usize) -> Result<Self> {
        let per_device = devices
            .iter()
            .map(|&d| DeviceModel::new(rt, model, 0..model.weights.len(), d, batch))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { rt, model, batch, devices: devices.to_vec(), per_device })
    }

    /// The forward pass of one batch on `dev`: `x` (rows of `width`) in, `y` out.
    pub fn forward(&self, dev: &Device<'_>, x: DeviceSlice<'_, f32>, y: DeviceSlice<'_, f32>) -> Result<()> {
        let p = self.devices.iter().position(|&d| d == dev.number()).ok_or(offload::Error::NoSuchDevice {
            device: dev.number() as i64,
            available: self.devices.len(),
        })?;
        self.per_device[p].forward(dev, self.model.width, x, y, true)
    }

    /// Streams `inputs` through every device with `slots` batches in flight per device;
    /// `progress` is called with the number of batches done.
    pub fn run(
        &self,
        inputs: &[Vec<f32>],
        outputs: &mut [Vec<f32>],
        slots: usize,
        progress: impl Fn(usize) + Sync,
    ) -> Result<PipelineReport> {
        let done = AtomicUsize::new(0);
        Pipeline::new(self.rt, &self.devices, slots)?.run(inputs, outputs, |dev, _, x, y| {
            self.forward(dev, x, y)?;
            progress(done.fetch_add(1, Ordering::Relaxed) + 1);
            Ok(())
        })
    }

    /// The same batches without overlap: map, compute, unmap, one batch after another on
    /// the first device.
    pub fn run_serially(&self, inputs: &[Vec<f32>], outputs: &mut [Vec<f32>]) -> Result<Duration> {
        Pipeline::new(self.rt, &self.devices[..1], 2)?
            .run_serially(inputs, outputs, |dev, _, x, y| self.forward(dev, x, y))
    }
}

/// The model split into stages (pipeline parallelism): consecutive layers on each stage's
/// device, micro-batches flowing stage to stage ([`StagePipeline`]).
pub struct StagedDeployment<'rt> {
    rt: &'rt Runtime,
    width: usize,
    /// Each stage's device and its layers' resident state.
    stages: Vec<(usize, DeviceModel)>,
}

impl std::fmt::Debug for StagedDeployment<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices: Vec<usize> = self.stages.iter().map(|(d, _)| *d).collect();
        f.debug_struct("StagedDeployment").field("stage_devices", &devices).finish()
    }
}

impl<'rt> StagedDeployment<'rt> {
    /// `model`'s layers split as evenly as they go over `stage_devices.len()` stages, stage
    /// `s` on `stage_devices[s]` (a device may take several), each with its weights
    /// resident and scratch for `batch` rows.
    pub fn new(rt: &'rt Runtime, model: &Mlp, stage_devices: &[usize], batch: usize) -> Result<Self> {
        let (layers, n) = (model.weights.len(), stage_devices.len());
        if n == 0 || n > layers {
            return Err(offload::Error::InvalidArgument {
                routine: "StagedDeployment::new",
                what: format!("{n} stages for {layers} layers; expected 1 to {layers}"),
            });
        }
        let stages = stage_devices
            .iter()
            .enumerate()
            .map(|(s, &d)| {
                Ok((d, DeviceModel::new(rt, model, s * layers / n..(s + 1) * layers / n, d, batch)?))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { rt, width: model.width, stages })
    }

    /// Streams `inputs` through the stages with `in_flight` micro-batches in the pipe.
    pub fn run(
        &self,
        inputs: &[Vec<f32>],
        outputs: &mut [Vec<f32>],
        in_flight: usize,
    ) -> Result<StageReport> {
        let last = self.stages.len() - 1;
        let len = inputs.first().map_or(0, Vec::len);
        let stages = self
            .stages
            .iter()
            .enumerate()
            .map(|(s, (d, m))| {
                Stage::new(
                    *d,
                    len,
                    move |dev: &Device<'_>, _: usize, x: DeviceSlice<'_, f32>, y: DeviceSlice<'_, f32>| {
                        m.forward(dev, self.width, x, y, s == last)
                    },
                )
            })
            .collect();
        StagePipeline::new(self.rt, stages, in_flight)?.run(inputs, outputs)
    }
}

/// A view of the first `len` elements of a runtime-owned buffer on `device`.
fn view(b: &HostBuffer<f32>, device: usize, len: usize) -> DeviceSlice<'_, f32> {
    let v = b.shared_view(device);
    v.slice(..len).unwrap_or(v)
}

/// Largest relative difference between `got` and the reference, over sampled rows of each
/// checked batch: `(max relative error, rows checked)`.
pub fn check(
    model: &Mlp,
    inputs: &[Vec<f32>],
    outputs: &[Vec<f32>],
    batches: &[usize],
    rows: &[usize],
) -> (f64, usize) {
    let w = model.width;
    let mut worst = 0f64;
    let mut n = 0;
    for &b in batches {
        for &r in rows {
            let want = model.reference_row(&inputs[b][r * w..(r + 1) * w]);
            let got = &outputs[b][r * w..(r + 1) * w];
            let norm = want.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt().max(1e-30);
            let diff = want
                .iter()
                .zip(got)
                .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
                .sum::<f64>()
                .sqrt();
            worst = worst.max(diff / norm);
            n += 1;
        }
    }
    (worst, n)
}
