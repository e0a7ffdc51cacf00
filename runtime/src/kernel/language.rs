//! The functions a kernel body may call besides Rust's own: the error function, team-local
//! arrays, barriers, the team's size and team reductions (on GPUs the kernel compiler
//! writes them in C; here they are the host's meaning, for the function run as written).

use super::*;

/// The float types, for [`erf`] and [`erfc`] (CUDA has them, Rust's standard library not on
/// stable).
pub trait ErrorFunction: Copy {
    /// The error function.
    fn error_function(self) -> Self;
    /// The complementary error function.
    fn complementary_error_function(self) -> Self;
}

impl ErrorFunction for f64 {
    fn error_function(self) -> Self {
        libm::erf(self)
    }
    fn complementary_error_function(self) -> Self {
        libm::erfc(self)
    }
}

impl ErrorFunction for f32 {
    fn error_function(self) -> Self {
        libm::erff(self)
    }
    fn complementary_error_function(self) -> Self {
        libm::erfcf(self)
    }
}

/// The error function of `x`, in kernels and out: CUDA's `erf`/`erff` on GPUs (2 ulp at
/// most in `f64`), `libm`'s on host devices and as ordinary Rust.
///
/// ```
/// assert!((offload::erf(1.0f64) - 0.842_700_792_949_714_9).abs() < 1e-15);
/// assert!((offload::erfc(0.5f32) - 0.479_500_12).abs() < 1e-6);
/// ```
pub fn erf<T: ErrorFunction>(x: T) -> T {
    x.error_function()
}

/// The complementary error function of `x`, `1 - erf(x)` without its cancellation (as
/// [`erf`]: CUDA's `erfc`/`erfcf` on GPUs, `libm`'s elsewhere).
pub fn erfc<T: ErrorFunction>(x: T) -> T {
    x.complementary_error_function()
}

/// A team-local array of a teams kernel (`#[offload::kernel(teams = THREADS)]`), written
/// `let mut tile: [f32; N] = offload::team_local();` at the top of its body: one array per
/// team, shared by its threads (`__shared__` on GPUs, uninitialized there: write before
/// reading, and read what another thread wrote after an [`barrier`]). Called as ordinary
/// Rust (the function as written), it is an array of zeros.
pub fn team_local<T: Copy + Default, const N: usize>() -> [T; N] {
    [T::default(); N]
}

/// The barrier of a teams kernel: every thread of the team waits until all have reached
/// it (`__syncthreads()` on GPUs). It must be reached by all of them or by none: under an
/// `if`, a `while`, a `loop` or a `for` only when the conditions and loop bounds around it
/// are the same for every thread (the macro refuses the others, naming the value that can
/// differ). Called as ordinary Rust, it does nothing.
pub fn barrier() {}

/// The number of threads in each team of a teams kernel: its `teams = T`, or the size the
/// launch gave (`teams = ..=MAX`). The same for every thread: loop bounds and strides may
/// use it around barriers (`c += offload::team_size()` walks a row in rounds on host
/// devices). Called as ordinary Rust (a team of one thread), it is 1.
pub fn team_size() -> usize {
    1
}

/// A team reduction of a teams kernel: every thread of the team gets the sum of every
/// thread's `v` (OpenMP's `parallel for reduction(+: x)` inside a team, its value shared).
/// Written as a `let`'s value where a [`barrier`] may stand (`let s =
/// offload::team_sum(v);`); on GPUs warp shuffles and shared memory, on host devices a
/// loop over the team's threads; the team's threads are whole warps (`teams = T`, `T` a
/// multiple of 32). Float sums are in tree order on GPUs, thread order on host devices.
/// Called as ordinary Rust (a team of one thread), it is `v`.
pub fn team_sum<T: KernelScalar>(v: T) -> T {
    v
}

/// The product over the team's threads of their `v`, as [`team_sum`].
pub fn team_product<T: KernelScalar>(v: T) -> T {
    v
}

/// The smallest `v` of the team's threads, as [`team_sum`] (floats: NaN ignored, as `fmin`).
pub fn team_min<T: KernelScalar>(v: T) -> T {
    v
}

/// The largest `v` of the team's threads, as [`team_sum`] (floats: NaN ignored, as `fmax`).
pub fn team_max<T: KernelScalar>(v: T) -> T {
    v
}
