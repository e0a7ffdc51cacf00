//! The multilayer perceptron of `examples/inference.rs`, as a library so that tests and the
//! `overlap` bench run the same code: `layers` dense layers of `width` features (ReLU
//! between them, none after the last), weights mapped once per device and kept resident,
//! input batches streamed from pageable host memory through a [`Pipeline`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use offload::pipeline::{Pipeline, PipelineReport};
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

/// Per-device state: the resident weights and two activation buffers.
struct DeviceModel {
    weights: Vec<HostBuffer<f32>>,
    biases: Vec<HostBuffer<f32>>,
    scratch: [HostBuffer<f32>; 2],
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
        let mut per_device = Vec::new();
        for &d in devices {
            let up = |v: &[f32]| -> Result<HostBuffer<f32>> {
                let b = HostBuffer::from_slice(rt, v)?;
                b.enter(d, MapType::TO)?;
                Ok(b)
            };
            let weights = model.weights.iter().map(|w| up(w)).collect::<Result<Vec<_>>>()?;
            let biases = model.biases.iter().map(|b| up(b)).collect::<Result<Vec<_>>>()?;
            let scratch = |_| -> Result<HostBuffer<f32>> {
                let b = HostBuffer::new(rt, batch * model.width)?;
                b.enter(d, MapType::ALLOC)?;
                Ok(b)
            };
            per_device.push(DeviceModel { weights, biases, scratch: [scratch(0)?, scratch(1)?] });
        }
        let me = Self { rt, model, batch, devices: devices.to_vec(), per_device };
        // First-use costs (kernel compilation, the BLAS handle, staging buffers) are paid
        // here, so a run measures the steady state.
        for (&d, m) in me.devices.iter().zip(&me.per_device) {
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
        }
        Ok(me)
    }

    /// The forward pass of one batch on `dev`: `x` (rows of `width`) in, `y` out.
    pub fn forward(&self, dev: &Device<'_>, x: DeviceSlice<'_, f32>, y: DeviceSlice<'_, f32>) -> Result<()> {
        let p = self.devices.iter().position(|&d| d == dev.number()).ok_or(offload::Error::NoSuchDevice {
            device: dev.number() as i64,
            available: self.devices.len(),
        })?;
        let m = &self.per_device[p];
        let (w, rows) = (self.model.width, x.len() / self.model.width);
        let layers = m.weights.len();
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
        let scratch =
            [view(&m.scratch[0], dev.number(), rows * w), view(&m.scratch[1], dev.number(), rows * w)];
        let mut input = x;
        for l in 0..layers {
            let out = if l + 1 == layers { y } else { scratch[l % 2] };
            dev.sgemm(&g, view(&m.weights[l], dev.number(), w * w), input, out)?;
            // The hand-written epilogue, the one the figures measured (the generated
            // `offload_kernels::bias_act` takes these scratch views too: a HostBuffer's
            // shared view is device scratch, which `&mut` kernel arguments accept).
            let relu = u32::from(l + 1 < layers);
            dev.launch(&BIAS_ACT, rows * w, (out, view(&m.biases[l], dev.number(), w), w as u64, relu))?;
            input = out;
        }
        Ok(())
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
