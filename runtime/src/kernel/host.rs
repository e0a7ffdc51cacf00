//! Host devices' kernels: [`HostLaunch`], what a host implementation reads its arguments
//! from, and the run of one on the pool.

use super::*;

/// Runs host kernel `f` (named `kernel`) over `n` work items on `pool`, for `device`: its
/// error, or its panic with the panic's message, becomes [`Error::KernelFailed`]. A panic
/// is not resumed: as on a GPU, a failed kernel is the launch's error, and the pool and
/// the calling thread (a device's worker) go on. `avx512`: whether the kernel may run its
/// AVX-512 copy ([`HostLaunch::avx512`]): only where the CPU has it.
///
/// [`Error::KernelFailed`]: crate::Error::KernelFailed
pub(crate) fn run_host_kernel(
    pool: &rayon::ThreadPool,
    device: usize,
    kernel: &'static str,
    f: HostKernelFn,
    n: usize,
    args: &[KernelArg],
    avx512: bool,
) -> crate::error::Result<()> {
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.install(|| f(&HostLaunch::new(kernel, n, args).with_avx512(avx512)))
    }));
    let message = match ran {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(message)) => message,
        Err(payload) => format!("panicked: {}", crate::error::panic_message(&*payload)),
    };
    Err(crate::Error::KernelFailed { device, kernel, message })
}

/// What a host kernel sees of its launch: the work-item count and the arguments.
#[derive(Debug)]
pub struct HostLaunch<'a> {
    kernel: &'static str,
    n: usize,
    args: &'a [KernelArg],
    avx512: bool,
}

impl<'a> HostLaunch<'a> {
    pub(crate) fn new(kernel: &'static str, n: usize, args: &'a [KernelArg]) -> Self {
        Self { kernel, n, args, avx512: false }
    }

    /// The launch, allowed to run a copy compiled for AVX-512 where `on` (which the caller
    /// sets only where [`HostLaunch::cpu_has_avx512`] says so).
    pub(crate) fn with_avx512(mut self, on: bool) -> Self {
        self.avx512 = on;
        self
    }

    /// Whether this CPU runs x86-64-v4's instructions, which [`HostLaunch::avx512`] needs.
    pub fn cpu_has_avx512() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            has!("avx512f")
                && has!("avx512bw")
                && has!("avx512dq")
                && has!("avx512vl")
                && has!("avx2")
                && has!("fma")
                && has!("bmi1")
                && has!("bmi2")
                && has!("lzcnt")
                && has!("popcnt")
                && has!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Whether the kernel may run its copy compiled for AVX-512 (x86-64-v4: AVX512F, BW,
    /// DQ and VL with AVX2, FMA, BMI1/2, LZCNT, POPCNT and F16C): the CPU has it and the
    /// device's setting allows it (`RuntimeBuilder::host_avx512`). The generated twins of
    /// release builds check this before they call that copy.
    pub fn avx512(&self) -> bool {
        self.avx512
    }

    /// Number of work items of the launch.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// Whether the launch has no arguments.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    fn arg(&self, i: usize) -> Result<&KernelArg, String> {
        self.args.get(i).ok_or_else(|| {
            format!("kernel `{}` reads argument {i} but was given {}", self.kernel, self.args.len())
        })
    }

    /// Argument `i` as a scalar of type `T`.
    pub fn scalar<T: KernelScalar>(&self, i: usize) -> Result<T, String> {
        match *self.arg(i)? {
            KernelArg::Scalar(s) => T::from_scalar(s).ok_or_else(|| {
                format!(
                    "kernel `{}` argument {i}: expected {}, got {}",
                    self.kernel,
                    std::any::type_name::<T>(),
                    s.type_name()
                )
            }),
            KernelArg::Ptr { .. } => {
                Err(format!("kernel `{}` argument {i}: expected a scalar, got a pointer", self.kernel))
            }
        }
    }

    /// Argument `i` as a raw pointer to `T`, and how many `T` it may touch when known.
    pub fn ptr<T>(&self, i: usize) -> Result<(*mut T, Option<usize>), String> {
        match *self.arg(i)? {
            KernelArg::Ptr { addr, bytes } => {
                if addr % std::mem::align_of::<T>() as u64 != 0 {
                    return Err(format!(
                        "kernel `{}` argument {i}: {addr:#x} is not aligned for {}",
                        self.kernel,
                        std::any::type_name::<T>()
                    ));
                }
                Ok((addr as usize as *mut T, bytes.map(|b| b / std::mem::size_of::<T>().max(1))))
            }
            KernelArg::Scalar(s) => Err(format!(
                "kernel `{}` argument {i}: expected a pointer, got {}",
                self.kernel,
                s.type_name()
            )),
        }
    }

    fn checked_ptr<T>(&self, i: usize, len: usize) -> Result<*mut T, String> {
        let (p, known) = self.ptr::<T>(i)?;
        match known {
            Some(k) if k < len => Err(format!(
                "kernel `{}` argument {i}: wants {len} elements but only {k} are mapped",
                self.kernel
            )),
            _ => Ok(p),
        }
    }

    /// Argument `i` as a slice of `len` elements of `T`. Fails if the runtime knows the
    /// argument is shorter.
    ///
    /// # Safety
    /// The argument must point to `len` initialised `T`s on this host device that no
    /// argument borrowed mutably aliases while the slice lives.
    pub unsafe fn slice<T: DeviceCopy>(&self, i: usize, len: usize) -> Result<&'a [T], String> {
        let p = self.checked_ptr::<T>(i, len)?;
        // SAFETY: the caller guarantees validity and the absence of mutable aliases.
        Ok(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// Argument `i` as a mutable slice of `len` elements of `T`.
    ///
    /// # Safety
    /// As [`HostLaunch::slice`], and no other slice of the same memory may live meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut<T: DeviceCopy>(&self, i: usize, len: usize) -> Result<&'a mut [T], String> {
        let p = self.checked_ptr::<T>(i, len)?;
        // SAFETY: the caller guarantees validity and exclusivity.
        Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }
}
