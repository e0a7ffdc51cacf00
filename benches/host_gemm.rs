//! The host devices' GEMM (`Device::sgemm` on a host device: `matrixmultiply`'s packed
//! kernel, one block of C's columns per thread of the device's kernel pool) beside the
//! product it replaced (one column of C per task, each element a dot product read through
//! the operands' strides) and a one-thread `i-p-j` loop, on square fp32 matrices of random
//! values; GFLOP/s from the median of criterion's samples, the same pool size for the
//! first two.
//!
//! `cargo bench -p offload-benches --bench host_gemm` (prints the table of
//! docs/PERFORMANCE.md).

use offload::Gemm;
use offload::{map, Runtime};
use offload_benches::{Bench, Budget};
use rayon::prelude::*;

/// The product the host devices used before, as it was: one column of C per task.
fn column_tasks(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    let at = |i: usize, p: usize| if g.transa { a[p + i * g.lda] } else { a[i + p * g.lda] };
    let bt = |p: usize, j: usize| if g.transb { b[j + p * g.ldb] } else { b[p + j * g.ldb] };
    c.par_chunks_mut(g.ldc).take(g.n).enumerate().for_each(|(j, col)| {
        for (i, out) in col.iter_mut().take(g.m).enumerate() {
            let dot: f32 = (0..g.k).map(|p| at(i, p) * bt(p, j)).sum();
            *out = g.alpha * dot;
        }
    });
}

/// One thread, the loop order a C programmer writes first for column-major data.
fn one_thread(n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    c.fill(0.0);
    for j in 0..n {
        for p in 0..n {
            let bpj = b[p + j * n];
            for i in 0..n {
                c[i + j * n] += a[i + p * n] * bpj;
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !offload_benches::measuring() {
        return Ok(());
    }
    let rt = Runtime::builder().gpus(false).host_devices(1).build()?;
    let dev = rt.device(0)?;
    let threads = rayon::current_num_threads();
    let mut bench = Bench::new("host_gemm");
    let mut rows = Vec::new();
    let budget = Budget { samples: 10, flat: true, ..Budget::SLOW };
    for n in [256usize, 512, 1024, 2048] {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let a: Vec<f32> = (0..n * n).map(|_| random()).collect();
        let b: Vec<f32> = (0..n * n).map(|_| random()).collect();
        let mut c = vec![0f32; n * n];
        let g = Gemm {
            transa: false,
            transb: false,
            m: n,
            n,
            k: n,
            alpha: 1.0,
            lda: n,
            ldb: n,
            beta: 0.0,
            ldc: n,
            tf32: false,
            activation: offload::Activation::Identity,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
        };
        let flops = 2.0 * (n as f64).powi(3);
        let ours = dev.data((map::to(&a), map::to(&b), map::alloc_mut(&mut c)), |(va, vb, vc)| {
            Ok(bench.wall(&format!("sgemm/{n}"), budget, || dev.sgemm(&g, va, vb, vc).expect("sgemm")))
        })?;
        // The slow ones at the sizes where a sample takes seconds at most.
        let before = (n <= 1024)
            .then(|| bench.wall(&format!("column_tasks/{n}"), budget, || column_tasks(&g, &a, &b, &mut c)));
        let single = (n <= 512)
            .then(|| bench.wall(&format!("one_thread/{n}"), budget, || one_thread(n, &a, &b, &mut c)));
        let rate = |s: Option<f64>| s.map(|s| flops / s / 1e9);
        rows.push((n, flops / ours / 1e9, rate(before), rate(single)));
    }
    let layers = layer_shapes(&rt, &mut bench)?;
    println!("\n| n | host device sgemm | before (column tasks, {threads} threads) | one thread, i-p-j |\n|---|---|---|---|");
    let shown = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} GFLOP/s"));
    for (n, ours, before, single) in rows {
        println!("| {n} | {ours:.1} GFLOP/s | {} | {} |", shown(before), shown(single));
    }
    println!("\n| layer (out x rows x in) | f32 | bf16 |\n|---|---|---|");
    for ((m, n, k), f32_rate, bf16_rate) in layers {
        println!("| {m} x {n} x {k} | {f32_rate:.1} GFLOP/s | {bf16_rate:.1} GFLOP/s |");
    }
    Ok(())
}

/// A layer's products as `nn.Linear` lays them out (`op(A) = W^T` with W `[out, in]`
/// row-major, B the rows `[rows, in]`, C `[rows, out]`), bias added, on the inference
/// examples' shapes; device-resident operands, each sample's products queued back to back
/// and synchronized once. `benches/pytorch/layer_gemm.py` times `torch.addmm` on the same.
#[allow(clippy::type_complexity)]
fn layer_shapes(rt: &Runtime, bench: &mut Bench) -> offload::Result<Vec<((usize, usize, usize), f64, f64)>> {
    use offload::half::bf16;
    use offload::DeviceBuffer;
    let dev = rt.device(0)?;
    let shapes = [
        (1024, 64, 512),
        (1024, 64, 1024),
        (768, 256, 256),
        (1024, 256, 256),
        (256, 256, 1024),
        (4096, 4, 256),
    ];
    let mut rows = Vec::new();
    for (m, n, k) in shapes {
        let g = Gemm { transa: true, m, n, k, lda: k, ldb: k, ldc: m, ..Gemm::default() };
        let flops = 2.0 * (m * n * k) as f64;
        let mut time = |name: &str, run: &mut dyn FnMut() -> offload::Result<()>| {
            bench.custom(&format!("layer {m}x{n}x{k} {name}"), Budget::SLOW, |iters| {
                let t = std::time::Instant::now();
                for _ in 0..iters {
                    run().expect("gemm");
                }
                rt.synchronize(0).expect("synchronize");
                t.elapsed()
            })
        };
        let value = |i: usize| ((i * 7919) % 10_007) as f32 / 10_007.0 - 0.5;
        let v32 = |len: usize| (0..len).map(value).collect::<Vec<f32>>();
        let (a, b, bias) = (v32(m * k), v32(k * n), v32(m));
        let (da, db, dbias) = (
            DeviceBuffer::from_slice(&dev, &a)?,
            DeviceBuffer::from_slice(&dev, &b)?,
            DeviceBuffer::from_slice(&dev, &bias)?,
        );
        let dc = DeviceBuffer::<f32>::new(&dev, m * n)?;
        let f32_secs = time("f32", &mut || dev.gemm(&g, da.view(), db.view(), dc.view(), Some(dbias.view())));
        let v16 = |x: &[f32]| x.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<bf16>>();
        let (da, db, dbias) = (
            DeviceBuffer::from_slice(&dev, &v16(&a))?,
            DeviceBuffer::from_slice(&dev, &v16(&b))?,
            DeviceBuffer::from_slice(&dev, &v16(&bias))?,
        );
        let dc = DeviceBuffer::<bf16>::new(&dev, m * n)?;
        let bf16_secs =
            time("bf16", &mut || dev.gemm(&g, da.view(), db.view(), dc.view(), Some(dbias.view())));
        rows.push(((m, n, k), flops / f32_secs / 1e9, flops / bf16_secs / 1e9));
    }
    Ok(rows)
}
