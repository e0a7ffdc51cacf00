//! What an iteration costs now that constructs wait only where the host observes device
//! work (docs/SEMANTICS.md R11), in one run: each row queued (the default), with
//! `OFFLOAD_SYNC=1` (every construct waits, as before), and by raw cudarc on GPUs.
//!
//! Rows, per device: launches of a one-argument kernel with one synchronize per 100; an
//! iteration of a kernel with a `+` reduction mapped `tofrom` (map, launch, copy back: what
//! a port of `reduction(+: err) map(tofrom: err)` does); the same through the generated
//! `reduce`, which returns the value; and a recorded body of 1 and 7 kernels replayed (the
//! host's time in `replay`, and 7 separate launches for comparison).
//!
//! `cargo bench -p offload-benches --bench queued`

use std::hint::black_box;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use offload::{map, BackendKind, Kernel, Runtime};
use offload_benches::{Bench, Budget};

const INC_SRC: &str = r#"extern "C" __global__ void inc1(float* x, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}"#;

fn inc_host(l: &offload::HostLaunch<'_>) -> Result<(), String> {
    // SAFETY: argument 0 is a mapped range of n f32.
    let x = unsafe { l.slice_mut::<f32>(0, l.n())? };
    x.iter_mut().for_each(|v| *v += 1.0);
    Ok(())
}

/// `x[i] += 1`.
static INC: Kernel = Kernel::new("inc1").with_cuda(INC_SRC).with_host(inc_host);

/// `s += x[i]^2`, as a port writes a norm.
#[offload::kernel(reduction(+: s), checked = false)]
fn sum_sq(i: usize, x: &[f32], s: &mut f32) {
    *s += x[i] * x[i];
}

const SUM_SRC: &str = r#"extern "C" __global__ void sumsq(const float* x, float* s, unsigned long long n) {
    __shared__ float part[256];
    float v = 0.0f;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) v += x[i] * x[i];
    part[threadIdx.x] = v;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) { if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w]; __syncthreads(); }
    if (threadIdx.x == 0) atomicAdd(s, part[0]);
}"#;

/// Elements of the reduced vector (512 x 512, the SOR port's grid).
const N: usize = 512 * 512;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !offload_benches::measuring() {
        return Ok(());
    }
    let queued = Runtime::builder().gpus(true).host_devices(1).build()?;
    let waiting = Runtime::builder().gpus(true).host_devices(1).synchronous(true).build()?;
    print!("{}", queued.device_report());
    let mut b = Bench::new("queued");
    let mut table: Vec<(String, String, f64, f64, Option<f64>)> = Vec::new();
    for d in 0..queued.num_devices() {
        let desc = queued.describe(d)?;
        let label = format!("{d} ({})", desc.name);
        let gpu = desc.kind != BackendKind::Host;
        let raw = if gpu { Some(Raw::new(d)?) } else { None };

        let mut per = |rt: &Runtime, mode: &str| -> Result<[f64; 5], offload::Error> {
            let dev = rt.device(d)?;
            dev.prepare(&INC)?;
            let x: Vec<f32> = (0..N).map(|i| (i % 7) as f32 * 0.25).collect();
            let mut y = vec![0f32; 1024];
            let mut out = [0f64; 5];
            dev.data((map::to(&x), map::tofrom(&mut y)), |(xv, yv)| {
                out[0] = b.custom(&format!("launch_100_per_sync/{mode}/{d}"), Budget::FAST, |iters| {
                    let t = Instant::now();
                    for i in 0..iters {
                        dev.launch(&INC, 1024, (yv,)).expect("launch");
                        if i % 100 == 99 {
                            rt.synchronize(d).expect("sync");
                        }
                    }
                    rt.synchronize(d).expect("sync");
                    t.elapsed()
                });
                let mut err = [0f32; 1];
                out[1] = b.wall(&format!("tofrom_reduction_iteration/{mode}/{d}"), Budget::FAST, || {
                    err[0] = 0.0;
                    dev.data(map::tofrom(&mut err[..]), |e| sum_sq::launch(&dev, N, xv, e))
                        .expect("iteration");
                    black_box(err[0]);
                });
                out[2] = b.wall(&format!("reduce_iteration/{mode}/{d}"), Budget::FAST, || {
                    black_box(sum_sq::reduce(&dev, N, xv).expect("reduce"));
                });
                for (k, slot) in [(1usize, 3usize), (7, 4)] {
                    let body = dev.record(|g| (0..k).try_for_each(|_| g.launch(&INC, 1024, (yv,))))?;
                    out[slot] =
                        replay_host_time(&mut b, &format!("replay_{k}/{mode}/{d}"), || body.replay(), rt, d);
                }
                Ok(())
            })?;
            Ok(out)
        };
        let q = per(&queued, "queued")?;
        let w = per(&waiting, "sync")?;
        let r = raw.as_ref().map(|r| r.measure(&mut b, d)).transpose()?;
        let rows = [
            "launch, 1 argument (100 per synchronize)",
            "iteration: launch with a `+` reduction mapped tofrom, value read",
            "iteration: `reduce` returning the value",
            "replay of a recorded body of 1 kernel (host time)",
            "replay of a recorded body of 7 kernels (host time)",
        ];
        for (i, what) in rows.iter().enumerate() {
            table.push((what.to_string(), label.clone(), q[i], w[i], r.map(|r| r[i]).filter(|v| *v > 0.0)));
        }
        // Seven separate launches, host time, for the replay rows' comparison.
        let dev = queued.device(d)?;
        let mut y = vec![0f32; 1024];
        let seven = dev.data(map::tofrom(&mut y), |yv| {
            Ok(replay_host_time(
                &mut b,
                &format!("seven_launches/queued/{d}"),
                || (0..7).try_for_each(|_| dev.launch(&INC, 1024, (yv,))),
                &queued,
                d,
            ))
        })?;
        table.push(("7 separate launches (host time)".into(), label.clone(), seven, f64::NAN, None));
    }
    println!(
        "\n| per call | device | queued (default) | OFFLOAD_SYNC=1 | raw cudarc |\n|---|---|---|---|---|"
    );
    for (what, dev, q, w, r) in &table {
        let us = |s: f64| if s.is_nan() { "-".to_string() } else { format!("{:.2} us", s * 1e6) };
        println!("| {what} | {dev} | {} | {} | {} |", us(*q), us(*w), r.map_or("-".into(), us));
    }
    Ok(())
}

/// The host's time per call of `f` (enqueue only): batches of 50 timed calls, each batch
/// followed by an untimed synchronize so that the queue never fills.
fn replay_host_time(
    b: &mut Bench,
    id: &str,
    mut f: impl FnMut() -> offload::Result<()>,
    rt: &Runtime,
    d: usize,
) -> f64 {
    b.custom(id, Budget::FAST, |iters| {
        let mut spent = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let batch = left.min(50);
            let t = Instant::now();
            for _ in 0..batch {
                f().expect("call");
            }
            spent += t.elapsed();
            rt.synchronize(d).expect("sync");
            left -= batch;
        }
        spent
    })
}

/// The same work by raw cudarc on CUDA device `d` (the runtime lists GPUs first, in the
/// driver's order).
struct Raw {
    s: std::sync::Arc<cudarc::driver::CudaStream>,
    inc: cudarc::driver::CudaFunction,
    sum: cudarc::driver::CudaFunction,
}

impl Raw {
    fn new(d: usize) -> Result<Self, Box<dyn std::error::Error>> {
        let ctx = CudaContext::new(d)?;
        let inc = ctx.load_module(cudarc::nvrtc::compile_ptx(INC_SRC)?)?.load_function("inc1")?;
        let sum = ctx.load_module(cudarc::nvrtc::compile_ptx(SUM_SRC)?)?.load_function("sumsq")?;
        Ok(Self { s: ctx.new_stream()?, inc, sum })
    }

    /// Rows as the runtime's: launches (100 per sync), a reduction iteration (zero the
    /// sum, launch, copy it back to pageable memory); no reduce or replay rows (0).
    fn measure(&self, b: &mut Bench, d: usize) -> Result<[f64; 5], Box<dyn std::error::Error>> {
        let s = &self.s;
        let mut y = s.alloc_zeros::<f32>(1024)?;
        let x = s.clone_htod(&(0..N).map(|i| (i % 7) as f32 * 0.25).collect::<Vec<f32>>())?;
        let mut acc = s.alloc_zeros::<f32>(1)?;
        let (n1, nn) = (1024u64, N as u64);
        let launches = b.custom(&format!("launch_100_per_sync/raw/{d}"), Budget::FAST, |iters| {
            let t = Instant::now();
            for i in 0..iters {
                let mut l = s.launch_builder(&self.inc);
                l.arg(&mut y).arg(&n1);
                // SAFETY: the arguments match the kernel; `y` holds 1024 floats.
                unsafe { l.launch(LaunchConfig::for_num_elems(1024)) }.expect("launch");
                if i % 100 == 99 {
                    s.synchronize().expect("sync");
                }
            }
            s.synchronize().expect("sync");
            t.elapsed()
        });
        let mut host = [0f32; 1];
        let reduction = b.wall(&format!("tofrom_reduction_iteration/raw/{d}"), Budget::FAST, || {
            s.memset_zeros(&mut acc).expect("memset");
            let mut l = s.launch_builder(&self.sum);
            l.arg(&x).arg(&mut acc).arg(&nn);
            let cfg = LaunchConfig { grid_dim: (264, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the arguments match the kernel; `x` holds N floats, `acc` one.
            unsafe { l.launch(cfg) }.expect("launch");
            s.memcpy_dtoh(&acc, &mut host).expect("read");
            s.synchronize().expect("sync");
            black_box(host[0]);
        });
        Ok([launches, reduction, 0.0, 0.0, 0.0])
    }
}
