//! Kernels: one name, a CUDA C source for GPUs and a Rust function for host devices.
//!
//! A [`Kernel`] is a `static` value. Its arguments are [`KernelArg`]s: scalars, or device
//! addresses that the runtime found by translating mapped host ranges through the present
//! table (as libomptarget translates a target region's arguments).
//!
//! ```
//! use offload::kernel::{HostLaunch, Kernel};
//!
//! /// `x[i] *= a` for `i < n`.
//! fn scale_host(l: &HostLaunch<'_>) -> Result<(), String> {
//!     let a: f32 = l.scalar(0)?;
//!     // SAFETY: argument 1 is a device range of at least `n` f32 that nothing else uses.
//!     let x = unsafe { l.slice_mut::<f32>(1, l.n())? };
//!     x.iter_mut().for_each(|v| *v *= a);
//!     Ok(())
//! }
//! pub static SCALE: Kernel = Kernel::new("scale")
//!     .with_cuda(r#"extern "C" __global__ void scale(float a, float* x, unsigned long long n) {
//!         unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
//!         if (i < n) x[i] *= a; }"#)
//!     .with_host(scale_host);
//! assert_eq!(SCALE.name(), "scale");
//! ```
//!
//! One file per concern: the [`Kernel`] itself here, launch arguments (`args`), the kernel
//! language's functions (`language`), the argument block and the OpenMP shape (`abi`), host launches
//! (`host`), HIP from CUDA (`hip`), and the sources written for `OFFLOAD_DUMP_KERNELS`
//! (`dump`).

mod abi;
mod args;
pub(crate) mod dump;
mod hip;
mod host;
mod language;

pub use abi::*;
pub use args::*;
pub use hip::*;
pub use host::*;
pub use language::*;

use std::borrow::Cow;
use std::fmt;

/// A host device's implementation of a kernel: a Rust function that reads its arguments
/// from a [`HostLaunch`] and runs on the runtime's `rayon` pool.
pub type HostKernelFn = fn(&HostLaunch<'_>) -> Result<(), String>;

/// How many work items one GPU thread block covers unless a kernel says otherwise.
pub const DEFAULT_BLOCK: u32 = 256;

/// A kernel that can run on every backend it has an implementation for.
///
/// GPU backends append the work-item count `n` (as `unsigned long long`) as the last
/// argument of the CUDA C function, pass the arguments as one block laid out as C lays out
/// the function's parameters (each at its natural alignment; at most 4 KiB), and launch `ceil(n / block)` blocks of `block` threads
/// (at most one full wave of the device for a [grid-stride](Kernel::with_grid_stride)
/// kernel).
#[derive(Clone, Copy)]
pub struct Kernel {
    name: &'static str,
    symbol: &'static str,
    cuda: Option<&'static str>,
    hip: Option<&'static str>,
    host: Option<HostKernelFn>,
    block: u32,
    grid_stride: bool,
    thread_map: Option<&'static str>,
    host_path: Option<&'static str>,
    shape: Option<&'static KernelShape>,
    /// A variant with 32-bit index arithmetic, which launches run when they fit it.
    narrow: Option<&'static Kernel>,
    /// This kernel's index arithmetic is 32-bit: the argument positions whose values must
    /// be at most [`NARROW_LIMIT`] (with the work-item count) for a launch to run it.
    bounds: Option<&'static [usize]>,
}

/// The most work items, and the largest value at a bounded argument, with which a launch
/// runs a kernel's narrow variant ([`Kernel::with_narrow`]): every index (a start plus
/// fewer items than this) then stays under 2^31.
pub const NARROW_LIMIT: u64 = 1 << 30;

/// How a generated kernel's parameters sit in its argument block, so that a launch in the
/// OpenMP shape ([`crate::omp::target`], [`crate::Runtime::target_launch`]), which gives one
/// argument per parameter, can add what the runtime owes the kernel: the index space's
/// start and each view's length (from its mapped extent). `#[offload::kernel]` writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelShape {
    /// Dimensions of the index space: 1 to 3 for a loop kernel (`collapse(d)`), 0 for a
    /// teams kernel (whose space is its teams).
    pub dims: usize,
    /// A teams kernel's threads per team, the most with `team_size_at_launch` (0 for a
    /// loop kernel).
    pub threads: usize,
    /// `teams = ..=MAX`: the team size is the launch's (a slot after the start; in the
    /// OpenMP shape, `thread_limit`), whole warps when `team_warps`.
    pub team_size_at_launch: bool,
    /// The kernel reduces over its teams: a team size given at launch is a multiple of 32.
    pub team_warps: bool,
    /// The parameters, in order.
    pub params: &'static [ShapeParam],
}

/// A parameter of a [`KernelShape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeParam {
    /// A scalar, passed as it is.
    Value,
    /// A view (or a reduction variable's one-element view) of elements of this many
    /// bytes: a pointer, its length added after the parameters.
    View {
        /// Bytes per element.
        elem_bytes: usize,
        /// Whether the kernel may write it (a `&mut [T]`, a reduction's variable); a `&[T]`
        /// is only read.
        writes: bool,
    },
    /// A struct by value (not expressible in the OpenMP shape).
    Struct,
}

impl Kernel {
    /// A kernel named `name` with no implementations yet. For CUDA the name is the
    /// `extern "C" __global__` function's name.
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            symbol: name,
            cuda: None,
            hip: None,
            host: None,
            block: DEFAULT_BLOCK,
            grid_stride: false,
            thread_map: None,
            host_path: None,
            shape: None,
            narrow: None,
            bounds: None,
        }
    }

    /// A kernel from CUDA C source text known only at run time (read from a file, built
    /// by a program). Kernels live as long as the program, so the strings are leaked once;
    /// make each kernel once and keep it.
    ///
    /// ```
    /// let k = offload::Kernel::from_cuda_source(
    ///     "twice".to_string(),
    ///     r#"extern "C" __global__ void twice(float* x, unsigned long long n) {
    ///         unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    ///         if (i < n) x[i] *= 2.0f; }"#.to_string(),
    /// );
    /// assert!(k.host_fn().is_none() && k.cuda_source().is_some());
    /// ```
    pub fn from_cuda_source(name: String, source: String) -> Self {
        Self::new(Box::leak(name.into_boxed_str())).with_cuda(Box::leak(source.into_boxed_str()))
    }

    /// Adds the CUDA C source (compiled at run time for the device's architecture).
    pub const fn with_cuda(mut self, source: &'static str) -> Self {
        self.cuda = Some(source);
        self
    }

    /// Adds the HIP C source for AMD GPUs. Without one, the HIP backend compiles the CUDA
    /// source with the CUDA spellings it uses (`__shfl_*_sync`) renamed to HIP's
    /// ([`hip_translation`]), as it does for every generated kernel.
    pub const fn with_hip(mut self, source: &'static str) -> Self {
        self.hip = Some(source);
        self
    }

    /// Says how the kernel's indices are mapped to GPU threads (the launch trace shows it;
    /// `#[offload::kernel]` writes it).
    pub const fn with_thread_map(mut self, note: &'static str) -> Self {
        self.thread_map = Some(note);
        self
    }

    /// Says how the host twin runs the kernel on host devices: which views it reads and
    /// writes as plain memory (vectorisable) and which through relaxed atomics, and why
    /// (the launch trace shows it; `#[offload::kernel]` writes it).
    pub const fn with_host_path(mut self, note: &'static str) -> Self {
        self.host_path = Some(note);
        self
    }

    /// Says how a generated kernel's parameters sit in its argument block (see
    /// [`KernelShape`]).
    pub const fn with_shape(mut self, shape: &'static KernelShape) -> Self {
        self.shape = Some(shape);
        self
    }

    /// Adds a variant of this kernel whose index arithmetic is 32-bit (`#[offload::kernel]`
    /// writes one: its `KERNEL_NARROW`, made [`Kernel::with_bounds`]), which a GPU launch
    /// runs instead when it fits the variant's bounds and `OFFLOAD_NARROW_INDICES=1`;
    /// otherwise (and by default) this one runs. The variant takes the same arguments and
    /// computes the same values.
    pub const fn with_narrow(mut self, variant: &'static Kernel) -> Self {
        self.narrow = Some(variant);
        self
    }

    /// Says that this kernel's index arithmetic is 32-bit: a launch runs it only when the
    /// work-item count is 1 to [`NARROW_LIMIT`] and the `u64` argument at each position of
    /// `bounded` is at most [`NARROW_LIMIT`]; any other launch of it is refused
    /// ([`crate::Error::KernelArgument`]), since its indices would wrap.
    pub const fn with_bounds(mut self, bounded: &'static [usize]) -> Self {
        self.bounds = Some(bounded);
        self
    }

    /// The variant with 32-bit index arithmetic, when the kernel has one (see
    /// [`Kernel::with_narrow`]).
    pub const fn narrow_variant(&self) -> Option<&'static Kernel> {
        self.narrow
    }

    /// Whether a launch over `n` items with `args` fits this kernel's bounds
    /// ([`Kernel::with_bounds`]); always, for a kernel without.
    pub fn fits(&self, n: usize, args: &[KernelArg]) -> bool {
        let Some(bounded) = self.bounds else { return true };
        let fits = |a: Option<&KernelArg>| matches!(a, Some(KernelArg::Scalar(Scalar::U64(v))) if *v <= NARROW_LIMIT);
        // No items: the inner lengths' product is not bounded by the count (0).
        (1..=NARROW_LIMIT).contains(&(n as u64)) && bounded.iter().all(|&p| fits(args.get(p)))
    }

    /// What a GPU launch of this kernel over `n` items with `args` (translated, in the
    /// argument block's order) runs: the [narrow variant](Kernel::with_narrow) when the
    /// launch fits it, with this kernel's block size; otherwise this kernel.
    ///
    /// ```
    /// use offload::kernel::{Kernel, KernelArg, Scalar, NARROW_LIMIT};
    /// static NARROW: Kernel = Kernel::new("scale").with_symbol("scale_narrow").with_bounds(&[0]);
    /// static SCALE: Kernel = Kernel::new("scale").with_narrow(&NARROW);
    /// let args = |len: u64| [KernelArg::Scalar(Scalar::U64(len))];
    /// assert_eq!(SCALE.for_launch(1000, &args(1000)).symbol(), "scale_narrow");
    /// assert_eq!(SCALE.for_launch(1000, &args(NARROW_LIMIT + 1)).symbol(), "scale");
    /// assert_eq!(SCALE.for_launch(0, &args(0)).symbol(), "scale");
    /// ```
    pub fn for_launch(&self, n: usize, args: &[KernelArg]) -> Kernel {
        match self.narrow {
            Some(v) if v.fits(n, args) => Kernel { block: self.block, ..*v },
            _ => *self,
        }
    }

    /// Adds the host-device implementation.
    pub const fn with_host(mut self, f: HostKernelFn) -> Self {
        self.host = Some(f);
        self
    }

    /// Sets the threads per block for GPU launches.
    pub const fn with_block(mut self, block: u32) -> Self {
        self.block = block;
        self
    }

    /// Names the `extern "C"` function of the CUDA source when it differs from the
    /// kernel's name (two variants of one kernel, e.g. a bounds-checked one, share the
    /// name that errors and traces show).
    pub const fn with_symbol(mut self, symbol: &'static str) -> Self {
        self.symbol = symbol;
        self
    }

    /// Says that the CUDA function loops over its work items with a grid stride
    /// (`for (t = global id; t < n; t += gridDim.x * blockDim.x)`), so GPU backends launch
    /// at most as many blocks as the device holds at once (one full wave) and each thread
    /// amortizes its setup, and a reduction its one atomic per block, over many items.
    pub const fn with_grid_stride(mut self) -> Self {
        self.grid_stride = true;
        self
    }

    /// The kernel's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The CUDA C source, if it has one.
    pub const fn cuda_source(&self) -> Option<&'static str> {
        self.cuda
    }

    /// The HIP C source the HIP backend compiles: the kernel's own ([`Kernel::with_hip`]),
    /// else its CUDA source translated ([`hip_translation`]); `None` without either.
    pub fn hip_source(&self) -> Option<Cow<'static, str>> {
        match (self.hip, self.cuda) {
            (Some(hip), _) => Some(Cow::Borrowed(hip)),
            (None, Some(cuda)) => Some(Cow::Owned(hip_translation(cuda))),
            (None, None) => None,
        }
    }

    /// How the kernel's indices are mapped to GPU threads, when it says.
    pub const fn thread_map(&self) -> Option<&'static str> {
        self.thread_map
    }

    /// How the host twin runs the kernel on host devices, when it says (see
    /// [`Kernel::with_host_path`]).
    pub const fn host_path(&self) -> Option<&'static str> {
        self.host_path
    }

    /// A generated kernel's parameter shape, when it says.
    pub const fn shape(&self) -> Option<&'static KernelShape> {
        self.shape
    }

    /// The host implementation, if it has one.
    pub const fn host_fn(&self) -> Option<HostKernelFn> {
        self.host
    }

    /// Threads per block for GPU launches.
    pub const fn block(&self) -> u32 {
        self.block
    }

    /// The CUDA function's name: [`Kernel::name`] unless [`Kernel::with_symbol`] said otherwise.
    pub const fn symbol(&self) -> &'static str {
        self.symbol
    }

    /// Whether the CUDA function loops with a grid stride (see [`Kernel::with_grid_stride`]).
    pub const fn is_grid_stride(&self) -> bool {
        self.grid_stride
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("cuda", &self.cuda.is_some())
            .field("hip", &self.hip.is_some())
            .field("host", &self.host.is_some())
            .field("symbol", &self.symbol)
            .field("block", &self.block)
            .field("grid_stride", &self.grid_stride)
            .field("thread_map", &self.thread_map)
            .field("host_path", &self.host_path)
            .field("narrow", &self.narrow.map(|n| n.symbol))
            .field("bounds", &self.bounds)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_sources_translate_for_hip() {
        for k in [
            "__shfl_down_sync(0xffffffffu, acc, o)",
            "__shfl_up_sync(0xffffffffu, center, 1)",
            "__shfl_sync(0xffffffffu, v, 0)",
        ] {
            let h = hip_translation(k);
            assert!(h.starts_with(HIP_PRELUDE));
            assert!(!h[HIP_PRELUDE.len()..].contains("_sync("), "{h}");
        }
        let h = hip_translation("float s = __shfl_down_sync(0xffffffffu, acc, o);");
        assert!(h.ends_with("float s = offload_hip_shfl_down(0xffffffffu, acc, o);"), "{h}");
        // A generated kernel's own two-argument `offload_shfl_down` is left as it is.
        let generated = "#define offload_shfl_down(v, o) __shfl_down_sync(0xffffffffu, (v), (o))\nx = offload_shfl_down(x, 1);";
        let h = hip_translation(generated);
        assert!(h.ends_with("#define offload_shfl_down(v, o) offload_hip_shfl_down(0xffffffffu, (v), (o))\nx = offload_shfl_down(x, 1);"), "{h}");
        // The macro takes the mask and drops it, keeping 32-lane groups.
        assert!(HIP_PRELUDE.contains("__shfl_down((var), (delta), 32)"));
        // Sources without warp intrinsics are unchanged after the prelude.
        assert_eq!(hip_translation("x[i] *= a;"), format!("{HIP_PRELUDE}x[i] *= a;"));
    }

    #[test]
    fn a_kernel_without_hip_of_its_own_compiles_its_translated_cuda() {
        static CUDA_ONLY: Kernel = Kernel::new("k").with_cuda("x = __shfl_down_sync(0xffffffffu, x, 1);");
        static BOTH: Kernel = Kernel::new("k").with_cuda("// cuda").with_hip("// hip");
        static NEITHER: Kernel = Kernel::new("k");
        let hip = CUDA_ONLY.hip_source().expect("translated");
        assert!(
            hip.starts_with(HIP_PRELUDE) && hip.ends_with("x = offload_hip_shfl_down(0xffffffffu, x, 1);")
        );
        assert_eq!(BOTH.hip_source().as_deref(), Some("// hip"));
        assert!(NEITHER.hip_source().is_none());
    }

    #[test]
    fn scalar_arguments_are_typed() {
        let args = [KernelArg::Scalar(Scalar::F32(2.0)), KernelArg::Scalar(Scalar::I32(3))];
        let l = HostLaunch::new("k", 1, &args);
        assert_eq!(l.scalar::<f32>(0), Ok(2.0));
        assert!(l.scalar::<i32>(0).unwrap_err().contains("expected i32, got f32"));
        assert!(l.scalar::<i32>(2).unwrap_err().contains("given 2"));
        assert!(l.ptr::<f32>(1).unwrap_err().contains("expected a pointer"));
    }

    #[test]
    fn slices_are_bounds_checked_when_the_extent_is_known() {
        let mut v = [1.0f32; 4];
        let args = [KernelArg::Ptr { addr: v.as_mut_ptr() as u64, bytes: Some(16) }];
        let l = HostLaunch::new("k", 4, &args);
        // SAFETY: `v` holds 4 f32 and nothing else borrows it.
        assert_eq!(unsafe { l.slice::<f32>(0, 4) }.map(|s| s.len()), Ok(4));
        // SAFETY: the call fails before building a slice.
        assert!(unsafe { l.slice::<f32>(0, 5) }.unwrap_err().contains("only 4"));
    }
}
