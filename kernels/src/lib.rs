//! Ready kernels for `offload`, in two forms.
//!
//! * [`generated`]: each kernel written once, in Rust, with `#[offload::kernel]`, which
//!   makes its CUDA C source (compiled at run time for the device's architecture by NVRTC)
//!   and its host twin (a `rayon` loop) from the one body. The typed launchers of this crate
//!   ([`fill_f32`], [`saxpy`], [`sum`], [`bias_act`], ...) run these.
//! * [`nn`]: inference building blocks in f32, bf16 and f16 (softmax, log-softmax, layer
//!   and RMS norm, argmax, GELU, SiLU, the residual add, casts), also written once;
//!   [`ops`]: the same, and [`linear`], over `offload::tensor::Tensor`s, their shapes
//!   taken from the tensors and checked by name.
//! * The expert path, kept beside them: [`Kernel`] values built by hand with
//!   `Kernel::new(..).with_cuda(..).with_host(..)` ([`FILL_F32`], [`SAXPY`], [`SUM_F32`], the
//!   tuned stencils of [`stencil`], ...). Their CUDA signature is the plain OpenMP one (the
//!   arguments, then the work-item count `n` as `unsigned long long`), which the raw
//!   `Runtime::target_launch` and ports of C programs use, and the benches measure the
//!   generated kernels against them (docs/PERFORMANCE.md, "Generated and hand-written kernels").
//!
//! A kernel of your own is a function:
//!
//! ```
//! use offload::{map, Runtime};
//!
//! #[offload::kernel]
//! fn axpby(i: usize, a: f32, x: &[f32], b: f32, y: &mut [f32]) {
//!     y[i] = a * x[i] + b * y[i];
//! }
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let gpu = rt.device(0)?;
//! let x = vec![1.0f32; 256];
//! let mut y = vec![2.0f32; 256];
//! gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| axpby::launch(&gpu, 256, 3.0, x, 0.5, y))?;
//! assert!(y.iter().all(|&v| v == 4.0));
//! # Ok::<(), offload::Error>(())
//! ```
//!
//! The ready launchers:
//!
//! ```
//! use offload::{map, Runtime};
//! use offload_kernels as k;
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let gpu = rt.device(0)?;
//! let x = vec![1.0f32; 1024];
//! let mut y = vec![1.0f32; 1024];
//! let mut total = [0.0f32];
//! gpu.data((map::to(&x), map::tofrom(&mut y), map::tofrom(&mut total)), |(x, y, t)| {
//!     k::saxpy(&gpu, 2.0, x, y)?;        // y = 2x + y = 3
//!     k::sum(&gpu, y, t)                 // t += sum(y)
//! })?;
//! assert_eq!(total[0], 3.0 * 1024.0);
//! # Ok::<(), offload::Error>(())
//! ```

pub mod generated;
mod layers;
pub mod nn;
pub mod ops;
pub mod stencil;

pub use layers::{linear, Activation, Linear};

use offload::{Device, DeviceSlice, Error, HostLaunch, Kernel, Result};
use rayon::prelude::*;

/// An error unless `view`, output `name` of `routine`, may be written by the device: a
/// writable map's view or device scratch (a GEMM would otherwise refuse it as "operand 2
/// (C)", not by the caller's name).
pub(crate) fn check_writable<T>(routine: &'static str, name: &str, view: &DeviceSlice<'_, T>) -> Result<()> {
    if view.device_writable() {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        routine,
        what: format!(
            "`{name}` is written, but its view {} comes from a shared borrow; pass a writable view \
             (map::from, map::tofrom, map::to_mut, map::alloc_mut, HostBuffer::view) or device scratch",
            view.host_range()
        ),
    })
}

fn check_len(kernel: &Kernel, index: usize, got: usize, want: usize) -> Result<()> {
    if got < want {
        return Err(Error::KernelArgument {
            kernel: kernel.name(),
            index,
            what: format!("view of {got} elements, the launch needs {want}"),
        });
    }
    Ok(())
}

// ---- fill ----------------------------------------------------------------------------

/// Refuses pointer arguments `i` (`ni` elements of `T`) and `j` (`nj` of `U`) that
/// overlap: a host twin borrows them as slices, one of them `&mut`, which must not alias
/// (a safe launch can pass one view twice).
pub(crate) fn distinct<T, U>(
    l: &HostLaunch<'_>,
    i: usize,
    ni: usize,
    j: usize,
    nj: usize,
) -> Result<(), String> {
    let (p, _) = l.ptr::<T>(i)?;
    let (q, _) = l.ptr::<U>(j)?;
    let end = |at: usize, n: usize, size: usize| at.saturating_add(n.saturating_mul(size));
    let (p, q) = (p as usize, q as usize);
    let (pe, qe) = (end(p, ni, std::mem::size_of::<T>()), end(q, nj, std::mem::size_of::<U>()));
    if p < qe && q < pe && ni > 0 && nj > 0 {
        return Err(format!(
            "arguments {i} ({p:#x}..{pe:#x}) and {j} ({q:#x}..{qe:#x}) overlap; expected distinct ranges"
        ));
    }
    Ok(())
}

fn fill_f32_host(l: &HostLaunch<'_>) -> Result<(), String> {
    let v: f32 = l.scalar(0)?;
    // SAFETY: argument 1 is a mapped range of n f32 used by nothing else during the launch.
    let x = unsafe { l.slice_mut::<f32>(1, l.n())? };
    x.par_iter_mut().for_each(|e| *e = v);
    Ok(())
}

/// `x[i] = v` for `i < n` (f32).
pub static FILL_F32: Kernel = Kernel::new("fill_f32")
    .with_cuda(
        r#"extern "C" __global__ void fill_f32(float v, float* x, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) x[i] = v;
}"#,
    )
    .with_host(fill_f32_host);

fn fill_i32_host(l: &HostLaunch<'_>) -> Result<(), String> {
    let v: i32 = l.scalar(0)?;
    // SAFETY: argument 1 is a mapped range of n i32 used by nothing else during the launch.
    let x = unsafe { l.slice_mut::<i32>(1, l.n())? };
    x.par_iter_mut().for_each(|e| *e = v);
    Ok(())
}

/// `x[i] = v` for `i < n` (i32).
pub static FILL_I32: Kernel = Kernel::new("fill_i32")
    .with_cuda(
        r#"extern "C" __global__ void fill_i32(int v, int* x, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) x[i] = v;
}"#,
    )
    .with_host(fill_i32_host);

/// Sets every element of `x` to `v` ([`mod@generated::fill_f32`]).
#[track_caller]
pub fn fill_f32(dev: &Device<'_>, v: f32, x: DeviceSlice<'_, f32>) -> Result<()> {
    generated::fill_f32::launch(dev, x.len(), v, x)
}

/// Sets every element of `x` to `v` ([`mod@generated::fill_i32`]).
#[track_caller]
pub fn fill_i32(dev: &Device<'_>, v: i32, x: DeviceSlice<'_, i32>) -> Result<()> {
    generated::fill_i32::launch(dev, x.len(), v, x)
}

// ---- add (i32) -------------------------------------------------------------------------

fn add_i32_host(l: &HostLaunch<'_>) -> Result<(), String> {
    let v: i32 = l.scalar(0)?;
    // SAFETY: argument 1 is a mapped range of n i32 used by nothing else during the launch.
    let x = unsafe { l.slice_mut::<i32>(1, l.n())? };
    x.par_iter_mut().for_each(|e| *e = e.wrapping_add(v));
    Ok(())
}

/// `x[i] += v` for `i < n` (i32).
pub static ADD_I32: Kernel = Kernel::new("add_i32")
    .with_cuda(
        r#"extern "C" __global__ void add_i32(int v, int* x, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) x[i] += v;
}"#,
    )
    .with_host(add_i32_host);

/// Adds `v` to every element of `x` ([`mod@generated::add_i32`]).
#[track_caller]
pub fn add_i32(dev: &Device<'_>, v: i32, x: DeviceSlice<'_, i32>) -> Result<()> {
    generated::add_i32::launch(dev, x.len(), v, x)
}

// ---- scale -------------------------------------------------------------------------------

fn scale_f32_host(l: &HostLaunch<'_>) -> Result<(), String> {
    let a: f32 = l.scalar(0)?;
    // SAFETY: argument 1 is a mapped range of n f32 used by nothing else during the launch.
    let x = unsafe { l.slice_mut::<f32>(1, l.n())? };
    x.par_iter_mut().for_each(|e| *e *= a);
    Ok(())
}

/// `x[i] *= a` for `i < n`.
pub static SCALE_F32: Kernel = Kernel::new("scale_f32")
    .with_cuda(
        r#"extern "C" __global__ void scale_f32(float a, float* x, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) x[i] *= a;
}"#,
    )
    .with_host(scale_f32_host);

/// Multiplies every element of `x` by `a` ([`mod@generated::scale_f32`]).
#[track_caller]
pub fn scale(dev: &Device<'_>, a: f32, x: DeviceSlice<'_, f32>) -> Result<()> {
    generated::scale_f32::launch(dev, x.len(), a, x)
}

// ---- saxpy -------------------------------------------------------------------------------

fn saxpy_host(l: &HostLaunch<'_>) -> Result<(), String> {
    let a: f32 = l.scalar(0)?;
    distinct::<f32, f32>(l, 1, l.n(), 2, l.n())?;
    // SAFETY: arguments 1 and 2 are distinct (checked) mapped ranges of n f32; only y is
    // written.
    let (x, y) = unsafe { (l.slice::<f32>(1, l.n())?, l.slice_mut::<f32>(2, l.n())?) };
    y.par_iter_mut().zip(x.par_iter()).for_each(|(y, x)| *y += a * x);
    Ok(())
}

/// `y[i] += a * x[i]` for `i < n`.
pub static SAXPY: Kernel = Kernel::new("saxpy")
    .with_cuda(
        r#"extern "C" __global__ void saxpy(float a, const float* __restrict__ x, float* __restrict__ y,
                                   unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) y[i] += a * x[i];
}"#,
    )
    .with_host(saxpy_host);

/// `y += a * x` over `y.len()` elements (`x` at least as long) ([`mod@generated::saxpy`]).
#[track_caller]
pub fn saxpy(dev: &Device<'_>, a: f32, x: DeviceSlice<'_, f32>, y: DeviceSlice<'_, f32>) -> Result<()> {
    check_len(&generated::saxpy::KERNEL, 1, x.len(), y.len())?;
    generated::saxpy::launch(dev, y.len(), a, x, y)
}

// ---- sum reduction -------------------------------------------------------------------------

fn sum_f32_host(l: &HostLaunch<'_>) -> Result<(), String> {
    distinct::<f32, f32>(l, 0, l.n(), 1, 1)?;
    // SAFETY: argument 0 holds n f32 and argument 1 one f32, distinct ranges (checked).
    let (x, out) = unsafe { (l.slice::<f32>(0, l.n())?, l.slice_mut::<f32>(1, 1)?) };
    // Summed in f64 so the host twin is at least as accurate as the GPU's tree.
    out[0] += x.par_iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
    Ok(())
}

/// `out[0] += sum(x[0..n])`: a warp-shuffle tree per block and one atomic add per block.
pub static SUM_F32: Kernel = Kernel::new("sum_f32")
    .with_cuda(
        r#"extern "C" __global__ void sum_f32(const float* __restrict__ x, float* out, unsigned long long n) {
    float acc = 0.0f;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) acc += x[i];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    __shared__ float warp_sums[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < (blockDim.x + 31) / 32 ? warp_sums[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
        if (lane == 0) atomicAdd(out, acc);
    }
}"#,
    )
    .with_host(sum_f32_host);

/// Adds the sum of `x` to `out[0]` ([`mod@generated::sum_f32`]).
#[track_caller]
pub fn sum(dev: &Device<'_>, x: DeviceSlice<'_, f32>, out: DeviceSlice<'_, f32>) -> Result<()> {
    check_len(&generated::sum_f32::KERNEL, 1, out.len(), 1)?;
    generated::sum_f32::launch(dev, x.len(), x, out)
}

// ---- bias + activation -------------------------------------------------------------------

fn bias_act_host(l: &HostLaunch<'_>) -> Result<(), String> {
    let features = l.scalar::<u64>(2)? as usize;
    let relu = l.scalar::<u32>(3)? != 0;
    if features == 0 || l.n() % features != 0 {
        return Err(format!("bias_act: {} elements are not rows of {features}", l.n()));
    }
    distinct::<f32, f32>(l, 0, l.n(), 1, features)?;
    // SAFETY: argument 0 holds n f32 (rows of `features`), argument 1 `features` f32,
    // distinct (checked).
    let (y, bias) = unsafe { (l.slice_mut::<f32>(0, l.n())?, l.slice::<f32>(1, features)?) };
    y.par_chunks_mut(features).for_each(|row| {
        for (v, b) in row.iter_mut().zip(bias) {
            let s = *v + b;
            *v = if relu { s.max(0.0) } else { s };
        }
    });
    Ok(())
}

/// `y[r][j] = act(y[r][j] + bias[j])` over rows of `features` (row-major), `act` = ReLU when
/// `relu != 0`, identity otherwise: the epilogue of a dense layer after its GEMM.
pub static BIAS_ACT: Kernel = Kernel::new("bias_act")
    .with_cuda(
        r#"extern "C" __global__ void bias_act(float* __restrict__ y, const float* __restrict__ bias,
                                      unsigned long long features, unsigned int relu, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float s = y[i] + bias[i % features];
        y[i] = relu ? fmaxf(s, 0.0f) : s;
    }
}"#,
    )
    .with_host(bias_act_host);

/// Adds `bias` to every row of `y` (rows of `bias.len()`), then ReLU when `relu`
/// ([`mod@generated::bias_act`]).
#[track_caller]
pub fn bias_act(
    dev: &Device<'_>,
    y: DeviceSlice<'_, f32>,
    bias: DeviceSlice<'_, f32>,
    relu: bool,
) -> Result<()> {
    if bias.is_empty() || y.len() % bias.len() != 0 {
        return Err(Error::KernelArgument {
            kernel: "bias_act",
            index: 0,
            what: format!("{} elements are not rows of {}", y.len(), bias.len()),
        });
    }
    generated::bias_act::launch(dev, y.len(), bias.len(), relu, y, bias)
}

/// Every hand-written kernel of this crate, e.g. to compile them all ahead of a timed run
/// (the generated ones: [`generated::all`]).
pub fn all() -> [&'static Kernel; 9] {
    [
        &FILL_F32,
        &FILL_I32,
        &ADD_I32,
        &SCALE_F32,
        &SAXPY,
        &SUM_F32,
        &BIAS_ACT,
        &stencil::JACOBI_STEP,
        &stencil::STENCIL7_STEP,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use offload::{map, Runtime};

    #[test]
    fn host_twins_compute_what_the_cuda_sources_say() {
        let rt = Runtime::builder().host_devices(1).build().unwrap();
        let gpu = rt.device(0).unwrap();
        let mut x = vec![0.0f32; 1000];
        let mut i = vec![0i32; 10];
        let mut out = [0.5f32];
        gpu.data((map::tofrom(&mut x), map::tofrom(&mut i), map::tofrom(&mut out)), |(x, i, out)| {
            fill_f32(&gpu, 2.0, x)?;
            scale(&gpu, 3.0, x)?;
            fill_i32(&gpu, 4, i)?;
            add_i32(&gpu, -1, i)?;
            sum(&gpu, x, out)
        })
        .unwrap();
        assert!(x.iter().all(|&v| v == 6.0));
        assert!(i.iter().all(|&v| v == 3));
        assert_eq!(out[0], 6000.5);
    }

    #[test]
    fn launchers_check_lengths() {
        let rt = Runtime::builder().host_devices(1).build().unwrap();
        let gpu = rt.device(0).unwrap();
        let x = vec![0.0f32; 10];
        let mut y = vec![0.0f32; 20];
        let e = gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| saxpy(&gpu, 1.0, x, y)).unwrap_err();
        assert!(e.to_string().contains("view of 10 elements, the launch needs 20"), "{e}");
    }

    #[test]
    fn every_kernel_has_both_implementations() {
        for k in all() {
            assert!(k.host_fn().is_some() && k.cuda_source().is_some(), "{}", k.name());
            assert!(k.cuda_source().unwrap().contains(k.name()), "{}", k.name());
        }
    }
}
