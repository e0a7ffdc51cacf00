//! The multilayer perceptron of `examples/inference.rs`, as a library so that tests and the
//! `overlap` bench run the same code: `layers` dense layers of `width` features (ReLU
//! between them, none after the last), in any precision the devices' GEMMs take (fp32,
//! TF32, fp16, bf16 with f32 accumulation; the bias and ReLU fused into each GEMM's
//! epilogue), weights placed once per device (through the runtime's pinned staging) and
//! kept resident, input batches streamed from pageable host memory through a
//! [`Pipeline`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use offload::pipeline::{Pipeline, PipelineReport, Stage, StagePipeline, StageReport};
use offload::{Activation, Device, DeviceBuffer, DeviceSlice, ElementType, Gemm, Precision, Result, Runtime};
use offload_kernels::nn::NnFloat;
use offload_kernels::{linear, Linear};

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

/// Per-device state: the resident weights of some layers (device memory, placed once from
/// the host through the runtime's pinned staging) and two activation buffers.
struct DeviceModel<'rt, T: NnFloat> {
    weights: Vec<DeviceBuffer<'rt, T>>,
    biases: Vec<DeviceBuffer<'rt, T>>,
    scratch: [DeviceBuffer<'rt, T>; 2],
    tf32: bool,
}

impl<'rt, T: NnFloat> DeviceModel<'rt, T> {
    /// Layers `layers` of `model` in `T` on device `d` (kept resident), with scratch for
    /// `batch` rows; first-use costs (the BLAS handle, its plans and their timing, staging
    /// buffers) paid now, so that a run measures the steady state.
    fn new(
        rt: &'rt Runtime,
        model: &Mlp,
        layers: std::ops::Range<usize>,
        d: usize,
        batch: usize,
        tf32: bool,
    ) -> Result<Self> {
        let dev = rt.device(d)?;
        let up = |v: &[f32]| {
            DeviceBuffer::from_slice(&dev, &v.iter().map(|&v| T::from_f32(v)).collect::<Vec<T>>())
        };
        let weights = model.weights[layers.clone()].iter().map(|w| up(w)).collect::<Result<Vec<_>>>()?;
        let biases = model.biases[layers].iter().map(|b| up(b)).collect::<Result<Vec<_>>>()?;
        let scratch = || -> Result<DeviceBuffer<'rt, T>> {
            let mut b = DeviceBuffer::new(&dev, batch * model.width)?;
            b.fill_bytes(0)?;
            Ok(b)
        };
        let m = DeviceModel { weights, biases, scratch: [scratch()?, scratch()?], tf32 };
        rt.staging_report(d)?;
        // Every product a batch runs, once: ReLU after hidden layers, none after the last.
        let layer = m.layer(model.width, batch);
        let (x, y) = (m.scratch[0].view(), m.scratch[1].view());
        for act in [Activation::Relu, Activation::Identity] {
            linear(&dev, layer, x, m.weights[0].view(), Some(m.biases[0].view()), y, act)?;
        }
        Ok(m)
    }

    fn layer(&self, width: usize, rows: usize) -> Linear {
        Linear { rows, in_features: width, out_features: width, tf32: self.tf32 }
    }

    /// This device's layers over one batch on `dev`: `x` (rows of `width`) in, `y` out;
    /// ReLU after every layer but the model's last (`last_is_models`), fused into each
    /// layer's GEMM.
    fn forward(
        &self,
        dev: &Device<'_>,
        width: usize,
        x: DeviceSlice<'_, T>,
        y: DeviceSlice<'_, T>,
        last_is_models: bool,
    ) -> Result<()> {
        let rows = x.len() / width;
        let (layer, layers) = (self.layer(width, rows), self.weights.len());
        let mut input = x;
        for l in 0..layers {
            let out = if l + 1 == layers { y } else { self.scratch[l % 2].view().slice(..rows * width)? };
            let act = if l + 1 < layers || !last_is_models { Activation::Relu } else { Activation::Identity };
            linear(dev, layer, input, self.weights[l].view(), Some(self.biases[l].view()), out, act)?;
            input = out;
        }
        Ok(())
    }
}

/// An error unless `precision` is one that elements `T` hold (TF32 and fp32 for `f32`).
fn tf32_for<T: NnFloat>(precision: Precision) -> Result<bool> {
    // The GEMM's own rule decides which precision elements `T` run in, with TF32 or not.
    let tf32 = precision == Precision::Tf32;
    if (Gemm { tf32, ..Gemm::default() }).precision::<T>() != precision {
        return Err(offload::Error::InvalidArgument {
            routine: "inference",
            what: format!("precision {} for {} tensors", precision.name(), T::TYPE.name()),
        });
    }
    Ok(tf32)
}

/// The model on a set of devices, ready to stream batches of `batch` rows of `T`.
pub struct Deployment<'rt, T: NnFloat> {
    rt: &'rt Runtime,
    model: &'rt Mlp,
    batch: usize,
    devices: Vec<usize>,
    per_device: Vec<DeviceModel<'rt, T>>,
}

impl<T: NnFloat> std::fmt::Debug for Deployment<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployment").field("devices", &self.devices).field("batch", &self.batch).finish()
    }
}

impl<'rt, T: NnFloat> Deployment<'rt, T> {
    /// Places the weights in `T` on every device (once: they stay resident) and the
    /// activation buffers (device memory), in `T`'s own precision (fp32 for `f32`).
    pub fn new(rt: &'rt Runtime, model: &'rt Mlp, devices: &[usize], batch: usize) -> Result<Self> {
        let own = match T::TYPE {
            ElementType::F32 => Precision::Fp32,
            ElementType::F16 => Precision::Fp16,
            ElementType::Bf16 => Precision::Bf16,
        };
        Self::in_precision(rt, model, devices, batch, own)
    }

    /// As [`Deployment::new`], in `precision` (which `T` must hold: TF32 takes `f32`).
    pub fn in_precision(
        rt: &'rt Runtime,
        model: &'rt Mlp,
        devices: &[usize],
        batch: usize,
        precision: Precision,
    ) -> Result<Self> {
        let tf32 = tf32_for::<T>(precision)?;
        let per_device = devices
            .iter()
            .map(|&d| DeviceModel::new(rt, model, 0..model.weights.len(), d, batch, tf32))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { rt, model, batch, devices: devices.to_vec(), per_device })
    }

    /// The forward pass of one batch on `dev`: `x` (rows of `width`) in, `y` out.
    pub fn forward(&self, dev: &Device<'_>, x: DeviceSlice<'_, T>, y: DeviceSlice<'_, T>) -> Result<()> {
        self.on(dev)?.forward(dev, self.model.width, x, y, true)
    }

    /// The layers resident on `dev`.
    fn on(&self, dev: &Device<'_>) -> Result<&DeviceModel<'rt, T>> {
        let p = self.devices.iter().position(|&d| d == dev.number()).ok_or(offload::Error::NoSuchDevice {
            device: dev.number() as i64,
            available: self.devices.len(),
        })?;
        Ok(&self.per_device[p])
    }

    /// Streams `inputs` through every device with `slots` batches in flight per device;
    /// `progress` is called with the number of batches done.
    pub fn run(
        &self,
        inputs: &[Vec<T>],
        outputs: &mut [Vec<T>],
        slots: usize,
        progress: impl Fn(usize) + Sync,
    ) -> Result<PipelineReport> {
        let done = AtomicUsize::new(0);
        // Each device's state is its resident layers, handed to every batch it computes.
        let state = |dev: &Device<'_>| self.on(dev);
        Pipeline::new(self.rt, &self.devices, slots)?.run_with(inputs, outputs, state, |dev, m, _, x, y| {
            m.forward(dev, self.model.width, x, y, true)?;
            progress(done.fetch_add(1, Ordering::Relaxed) + 1);
            Ok(())
        })
    }

    /// The compute alone, the pipeline's floor: `input` (one batch) placed on the first
    /// device once, then `batches` forward passes over it there, nothing copied.
    pub fn compute_alone(&self, input: &[T], batches: usize) -> Result<Duration> {
        let dev = self.rt.device(self.devices[0])?;
        let x = DeviceBuffer::from_slice(&dev, input)?;
        let y = DeviceBuffer::<T>::new(&dev, input.len())?;
        self.forward(&dev, x.view(), y.view())?;
        self.rt.synchronize(dev.number())?;
        let start = std::time::Instant::now();
        for _ in 0..batches {
            self.forward(&dev, x.view(), y.view())?;
        }
        self.rt.synchronize(dev.number())?;
        Ok(start.elapsed())
    }

    /// The same batches without overlap: map, compute, unmap, one batch after another on
    /// the first device.
    pub fn run_serially(&self, inputs: &[Vec<T>], outputs: &mut [Vec<T>]) -> Result<Duration> {
        Pipeline::new(self.rt, &self.devices[..1], 2)?
            .run_serially(inputs, outputs, |dev, _, x, y| self.forward(dev, x, y))
    }
}

/// The model split into stages (pipeline parallelism): consecutive layers on each stage's
/// device, micro-batches flowing stage to stage ([`StagePipeline`]).
pub struct StagedDeployment<'rt, T: NnFloat> {
    rt: &'rt Runtime,
    width: usize,
    /// Each stage's device and its layers' resident state.
    stages: Vec<(usize, DeviceModel<'rt, T>)>,
}

impl<T: NnFloat> std::fmt::Debug for StagedDeployment<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices: Vec<usize> = self.stages.iter().map(|(d, _)| *d).collect();
        f.debug_struct("StagedDeployment").field("stage_devices", &devices).finish()
    }
}

impl<'rt, T: NnFloat> StagedDeployment<'rt, T> {
    /// `model`'s layers split as evenly as they go over `stage_devices.len()` stages, stage
    /// `s` on `stage_devices[s]` (a device may take several), each with its weights
    /// resident in `precision` (which `T` must hold) and scratch for `batch` rows.
    pub fn new(
        rt: &'rt Runtime,
        model: &Mlp,
        stage_devices: &[usize],
        batch: usize,
        precision: Precision,
    ) -> Result<Self> {
        let tf32 = tf32_for::<T>(precision)?;
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
                Ok((d, DeviceModel::new(rt, model, s * layers / n..(s + 1) * layers / n, d, batch, tf32)?))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { rt, width: model.width, stages })
    }

    /// Streams `inputs` through the stages with `in_flight` micro-batches in the pipe.
    pub fn run(&self, inputs: &[Vec<T>], outputs: &mut [Vec<T>], in_flight: usize) -> Result<StageReport> {
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
                    move |dev: &Device<'_>, _: usize, x: DeviceSlice<'_, T>, y: DeviceSlice<'_, T>| {
                        m.forward(dev, self.width, x, y, s == last)
                    },
                )
            })
            .collect();
        StagePipeline::new(self.rt, stages, in_flight)?.run(inputs, outputs)
    }
}

/// Largest relative difference between `got` and the reference, over sampled rows of each
/// checked batch: `(max relative error, rows checked)`.
pub fn check<T: NnFloat>(
    model: &Mlp,
    inputs: &[Vec<T>],
    outputs: &[Vec<T>],
    batches: &[usize],
    rows: &[usize],
) -> (f64, usize) {
    let w = model.width;
    let mut worst = 0f64;
    let mut n = 0;
    for &b in batches {
        for &r in rows {
            let row: Vec<f32> = inputs[b][r * w..(r + 1) * w].iter().map(|v| v.to_f32()).collect();
            let want = model.reference_row(&row);
            let got: Vec<f32> = outputs[b][r * w..(r + 1) * w].iter().map(|v| v.to_f32()).collect();
            let norm = want.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt().max(1e-30);
            let diff = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
                .sum::<f64>()
                .sqrt();
            worst = worst.max(diff / norm);
            n += 1;
        }
    }
    (worst, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use offload::half::{bf16, f16};

    #[test]
    fn a_precision_is_taken_only_for_the_tensors_that_hold_it() {
        assert!(!tf32_for::<f32>(Precision::Fp32).unwrap());
        assert!(tf32_for::<f32>(Precision::Tf32).unwrap());
        assert!(!tf32_for::<f16>(Precision::Fp16).unwrap());
        assert!(!tf32_for::<bf16>(Precision::Bf16).unwrap());
        for e in [
            tf32_for::<bf16>(Precision::Tf32).unwrap_err(),
            tf32_for::<f16>(Precision::Bf16).unwrap_err(),
            tf32_for::<f32>(Precision::Fp16).unwrap_err(),
        ] {
            assert!(e.to_string().contains("tensors"), "{e}");
        }
    }
}
