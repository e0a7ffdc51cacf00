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
    /// runs instead when it fits the variant's bounds; otherwise, or with
    /// `OFFLOAD_NARROW_INDICES=0`, this one runs. The variant takes the same arguments and
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

/// A scalar kernel argument.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Scalar {
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
}

impl Scalar {
    /// The value's bytes, as a GPU kernel receives them.
    pub fn to_ne_bytes(self) -> ([u8; 8], usize) {
        let mut b = [0u8; 8];
        let n = match self {
            Scalar::I32(v) => {
                b[..4].copy_from_slice(&v.to_ne_bytes());
                4
            }
            Scalar::U32(v) => {
                b[..4].copy_from_slice(&v.to_ne_bytes());
                4
            }
            Scalar::F32(v) => {
                b[..4].copy_from_slice(&v.to_ne_bytes());
                4
            }
            Scalar::I64(v) => {
                b = v.to_ne_bytes();
                8
            }
            Scalar::U64(v) => {
                b = v.to_ne_bytes();
                8
            }
            Scalar::F64(v) => {
                b = v.to_ne_bytes();
                8
            }
        };
        (b, n)
    }

    fn type_name(self) -> &'static str {
        match self {
            Scalar::I32(_) => "i32",
            Scalar::U32(_) => "u32",
            Scalar::I64(_) => "i64",
            Scalar::U64(_) => "u64",
            Scalar::F32(_) => "f32",
            Scalar::F64(_) => "f64",
        }
    }
}

/// A kernel argument as a backend receives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A value passed by copy.
    Scalar(Scalar),
    /// A device address, and how many bytes from it the argument may touch (`None` when
    /// the runtime cannot know, e.g. memory the user allocated behind its back).
    Ptr {
        /// Device address.
        addr: u64,
        /// Bytes valid from `addr`, when known.
        bytes: Option<usize>,
    },
}

/// Types a kernel can take by value.
pub trait KernelScalar: Copy {
    /// Wraps the value.
    fn into_scalar(self) -> Scalar;
    /// Unwraps a value of exactly this type.
    fn from_scalar(s: Scalar) -> Option<Self>;
}

macro_rules! kernel_scalar {
    ($($t:ty => $v:ident),*) => {$(
        impl KernelScalar for $t {
            fn into_scalar(self) -> Scalar { Scalar::$v(self) }
            fn from_scalar(s: Scalar) -> Option<Self> {
                match s { Scalar::$v(v) => Some(v), _ => None }
            }
        }
    )*};
}
kernel_scalar!(i32 => I32, u32 => U32, i64 => I64, u64 => U64, f32 => F32, f64 => F64);

/// Plain data that may be copied to a device and back bit for bit.
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes must be a valid value (a device may write
/// anything), and the type must hold no pointers or references into host memory.
pub unsafe trait DeviceCopy: Copy + Send + Sync + 'static {}

macro_rules! device_copy {
    ($($t:ty),*) => {$(
        // SAFETY: primitive numbers accept every bit pattern.
        unsafe impl DeviceCopy for $t {}
    )*};
}
device_copy!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64);
// SAFETY: `half`'s types are `repr(transparent)` over `u16`: every bit pattern is a value.
unsafe impl DeviceCopy for half::f16 {}
// SAFETY: as above.
unsafe impl DeviceCopy for half::bf16 {}
// SAFETY: arrays of such types accept every bit pattern too.
unsafe impl<T: DeviceCopy, const N: usize> DeviceCopy for [T; N] {}

/// `len` zeroed elements straight from the allocator, as C's `calloc` gives them: large
/// ones are fresh pages, faulted in by whoever first writes them (for a pipeline's
/// outputs, its copy-out threads, in parallel) rather than all here. `vec![0.0f32; n]` does
/// the same for primitive numbers; this does it for every [`DeviceCopy`] type (`bf16`,
/// `f16`, structs), whose all-zero bits are a value.
///
/// # Panics
/// As `vec!` does, when `len` elements overflow `isize::MAX` bytes; aborts (as `Vec` does)
/// when the allocator has no memory.
///
/// ```
/// let v: Vec<offload::half::bf16> = offload::zeroed_vec(1 << 20);
/// assert!(v.iter().all(|x| x.to_f32() == 0.0));
/// ```
pub fn zeroed_vec<T: DeviceCopy>(len: usize) -> Vec<T> {
    let layout = match std::alloc::Layout::array::<T>(len) {
        Ok(l) if l.size() > 0 => l,
        Ok(_) => return std::iter::repeat_n(zeroed_value(), len).collect(),
        Err(_) => panic!("zeroed_vec: {len} elements of {} bytes overflow", std::mem::size_of::<T>()),
    };
    // SAFETY: a non-zero-sized layout.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `ptr` holds `len` elements of `T` from the global allocator with `T`'s array
    // layout, as `Vec` allocates them; all-zero bits are a valid `T` (`DeviceCopy`).
    unsafe { Vec::from_raw_parts(ptr, len, len) }
}

/// A zero-sized (or any) `T` of all-zero bits.
fn zeroed_value<T: DeviceCopy>() -> T {
    // SAFETY: every bit pattern, all-zero among them, is a valid `T` (`DeviceCopy`).
    unsafe { std::mem::zeroed() }
}

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

/// What a launch in the OpenMP shape runs ([`crate::omp::target`], [`crate::omp::target_loops`],
/// [`crate::omp::target_teams`], [`crate::Runtime::target_launch_space`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OmpSpace {
    /// `for (i = 0; i < n; i++)`: a loop of `n` iterations from 0 (a 1-D kernel, or any
    /// kernel written by hand, over `n` work items).
    Items(usize),
    /// `collapse(d)` loops, outermost first: `dims` (1 to 3) loops, loop `k` over
    /// `starts[k]..ends[k]` (a 1-D, 2-D or 3-D generated kernel of as many indices).
    Loops {
        /// How many loops.
        dims: usize,
        /// Each loop's first value.
        starts: [usize; 3],
        /// Each loop's end (excluded).
        ends: [usize; 3],
    },
    /// `target teams num_teams(t) thread_limit(l)`: a teams kernel's teams; the team size is
    /// the kernel's, and a `thread_limit` below it is refused.
    Teams {
        /// `num_teams`.
        num_teams: usize,
        /// `thread_limit`, when given.
        thread_limit: Option<usize>,
    },
}

impl OmpSpace {
    /// `collapse(loops.len())` loops over `loops`, outermost first (1 to 3).
    ///
    /// ```
    /// use offload::OmpSpace;
    /// let s = OmpSpace::loops(&[1..63, 1..127])?;
    /// assert_eq!(s, OmpSpace::Loops { dims: 2, starts: [1, 1, 0], ends: [63, 127, 0] });
    /// assert!(OmpSpace::loops(&[]).is_err());
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn loops(loops: &[std::ops::Range<usize>]) -> crate::Result<Self> {
        if !(1..=3).contains(&loops.len()) {
            return Err(crate::Error::InvalidArgument {
                routine: "target_loops",
                what: format!("collapse({}): 1 to 3 loops, outermost first", loops.len()),
            });
        }
        let (mut starts, mut ends) = ([0; 3], [0; 3]);
        for (k, r) in loops.iter().enumerate() {
            starts[k] = r.start;
            ends[k] = r.end.max(r.start);
        }
        Ok(OmpSpace::Loops { dims: loops.len(), starts, ends })
    }
}

/// The work items of `kernel` launched in the OpenMP shape over `space`, with the values its
/// argument block starts with (the loops' starts and inner lengths; a teams kernel's first
/// team, 0), or why `space` does not fit the kernel. A kernel without a [`KernelShape`]
/// takes [`OmpSpace::Items`] only, and nothing before its arguments.
pub(crate) fn omp_space(
    kernel: &Kernel,
    device: usize,
    space: OmpSpace,
) -> crate::Result<(usize, Vec<KernelArg>)> {
    omp_launch(kernel, device, space).map(|(n, lead, _)| (n, lead))
}

/// [`omp_space`], with the GPU block the launch needs when it is not the kernel's own (a
/// team size given at launch: `thread_limit`, at most the kernel's `..=MAX`, rounded down
/// to whole warps when the kernel reduces over its teams; `MAX` without one).
pub(crate) fn omp_launch(
    kernel: &Kernel,
    device: usize,
    space: OmpSpace,
) -> crate::Result<(usize, Vec<KernelArg>, Option<u32>)> {
    let fail = |what: String| crate::Error::KernelArgument { kernel: kernel.name(), index: 0, what };
    if let (Some(shape), OmpSpace::Teams { num_teams, thread_limit }) = (kernel.shape(), space) {
        if shape.dims == 0 && shape.team_size_at_launch {
            let mut size = thread_limit.unwrap_or(shape.threads).min(shape.threads);
            if shape.team_warps {
                size -= size % 32;
            }
            if size == 0 {
                return Err(fail(format!(
                    "device {device}: thread_limit({}) leaves no team: this kernel's teams are 1 to {} threads{}",
                    thread_limit.unwrap_or(0),
                    shape.threads,
                    if shape.team_warps { ", whole warps (it reduces over its teams)" } else { "" }
                )));
            }
            let n = num_teams
                .checked_mul(size)
                .ok_or_else(|| fail(format!("device {device}: the launch's work items overflow a usize")))?;
            let lead = vec![KernelArg::Scalar(Scalar::U64(0)), KernelArg::Scalar(Scalar::U64(size as u64))];
            return Ok((n, lead, Some(size as u32)));
        }
    }
    omp_fixed(kernel, device, space).map(|(n, lead)| (n, lead, None))
}

/// [`omp_space`] for every kernel but those whose team size is the launch's.
fn omp_fixed(kernel: &Kernel, device: usize, space: OmpSpace) -> crate::Result<(usize, Vec<KernelArg>)> {
    let fail = |what: String| crate::Error::KernelArgument { kernel: kernel.name(), index: 0, what };
    let Some(shape) = kernel.shape() else {
        return match space {
            OmpSpace::Items(n) => Ok((n, Vec::new())),
            _ => Err(fail(format!(
                "device {device}: a kernel written by hand takes `n` work items (`omp::target`): loops and teams are \
                 for generated kernels, whose launch shape the runtime knows"
            ))),
        };
    };
    let loops_of = |d: usize| match d {
        0 => "a teams kernel".to_string(),
        d => format!("a {d}-D generated kernel"),
    };
    let overflow = || fail(format!("device {device}: the launch's work items overflow a usize"));
    match (shape.dims, space) {
        (1, OmpSpace::Items(n)) => Ok((n, vec![KernelArg::Scalar(Scalar::U64(0))])),
        (d, OmpSpace::Loops { dims, starts, ends }) if d == dims => {
            let lens: Vec<usize> = (0..d).map(|k| ends[k].saturating_sub(starts[k])).collect();
            let n = lens.iter().try_fold(1usize, |a, &l| a.checked_mul(l)).ok_or_else(overflow)?;
            let block = (0..d)
                .map(|k| KernelArg::Scalar(Scalar::U64(starts[k] as u64)))
                .chain((1..d).map(|k| KernelArg::Scalar(Scalar::U64(lens[k] as u64))))
                .collect();
            Ok((n, block))
        }
        (0, OmpSpace::Teams { num_teams, thread_limit }) => {
            if let Some(limit) = thread_limit.filter(|&l| l < shape.threads) {
                return Err(fail(format!(
                    "device {device}: thread_limit({limit}) is below the kernel's {} threads per team (its `teams = ...`)",
                    shape.threads
                )));
            }
            let n = num_teams.checked_mul(shape.threads).ok_or_else(overflow)?;
            Ok((n, vec![KernelArg::Scalar(Scalar::U64(0))]))
        }
        (0, _) => Err(fail(format!(
            "a teams kernel launches as teams in the OpenMP shape: `omp::target_teams` with num_teams (or `{}::launch`)",
            kernel.name()
        ))),
        (d, OmpSpace::Loops { dims, .. }) => {
            Err(fail(format!("{} launches over {d} loops, not collapse({dims})", loops_of(d))))
        }
        (d, OmpSpace::Items(_)) => Err(fail(format!(
            "{} takes its loops in the OpenMP shape from `omp::target_loops` (collapse({d})), not from `n`",
            loops_of(d)
        ))),
        (d, OmpSpace::Teams { .. }) => {
            Err(fail(format!("{} is a loop kernel: `omp::target_loops`, not teams", loops_of(d))))
        }
    }
}

/// `args`, one per parameter of `kernel` (translated, in the OpenMP shape), as the full
/// argument block of a kernel with a [`KernelShape`] launched over `space` (see
/// [`omp_space`]), then each view's length (its extent in elements). Kernels without a
/// shape take `args` as they are.
pub(crate) fn expand_c_shaped(
    kernel: &Kernel,
    device: usize,
    args: Vec<KernelArg>,
    space: OmpSpace,
) -> crate::Result<Vec<KernelArg>> {
    let fail =
        |index: usize, what: String| crate::Error::KernelArgument { kernel: kernel.name(), index, what };
    let Some(shape) = kernel.shape() else { return Ok(args) };
    let (_, mut full) = omp_space(kernel, device, space)?;
    if args.len() != shape.params.len() {
        return Err(fail(
            args.len().min(shape.params.len()),
            format!("device {device}: the kernel takes {} arguments, got {}", shape.params.len(), args.len()),
        ));
    }
    let mut lens = Vec::new();
    for (k, (a, p)) in args.iter().zip(shape.params).enumerate() {
        match (p, a) {
            (ShapeParam::Value, KernelArg::Scalar(_)) => {}
            (ShapeParam::View { elem_bytes }, KernelArg::Ptr { bytes: Some(b), .. }) => {
                lens.push(KernelArg::Scalar(Scalar::U64((b / (*elem_bytes).max(1)) as u64)));
            }
            (ShapeParam::View { .. }, KernelArg::Ptr { bytes: None, addr }) => {
                return Err(fail(
                    k,
                    format!(
                        "device {device}: the extent of {addr:#x} is unknown (not inside a mapped range or a \
                         target_alloc block): a generated kernel's views need their lengths"
                    ),
                ))
            }
            (ShapeParam::Struct, _) => {
                return Err(fail(
                    k,
                    format!(
                        "a struct by value is not expressible in the OpenMP shape: use `{}::launch`",
                        kernel.name()
                    ),
                ))
            }
            (ShapeParam::Value, KernelArg::Ptr { .. }) => {
                return Err(fail(k, format!("device {device}: a scalar parameter was given a pointer")))
            }
            (ShapeParam::View { .. }, KernelArg::Scalar(_)) => {
                return Err(fail(k, format!("device {device}: a view parameter was given a value")))
            }
        }
        full.push(*a);
    }
    full.extend(lens);
    Ok(full)
}

/// A `#[repr(C)]` struct that generated kernels take by value and as the element of views:
/// `#[derive(offload::DeviceCopy)]` implements it (with [`DeviceCopy`]).
///
/// ```
/// #[derive(Clone, Copy, offload::DeviceCopy)]
/// #[repr(C)]
/// struct Particle {
///     x: f32,
///     v: f32,
/// }
/// use offload::KernelStruct;
/// assert!(Particle::C_SOURCE.contains("struct Particle {"));
/// ```
///
/// # Safety
/// `C_SOURCE` must define (guarded by `#ifndef`) a C struct of the type's name with the
/// same layout: the same fields, of the same sizes, at the same offsets; the type has no
/// padding, and its size is a multiple of 4 bytes.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kernel struct, but a kernel or device function uses it as one",
    label = "a type name the kernel macro does not know is read as a `#[derive(offload::DeviceCopy)]` struct",
    note = "if the name is an alias of a scalar type (`type Real = f32;`), tell the macro: \
            `#[offload::kernel(types(Real = f32))]` or `#[offload::device(types(Real = f32))]`, or write the \
            scalar type; deriving DeviceCopy is for structs"
)]
pub unsafe trait KernelStruct: DeviceCopy {
    /// The C definition (with those of the structs it holds, first).
    const C_SOURCE: &'static str;
}

/// Runs host kernel `f` (named `kernel`) over `n` work items on `pool`, for `device`: its
/// error, or its panic with the panic's message, becomes [`Error::KernelFailed`]. A panic
/// is not resumed: as on a GPU, a failed kernel is the launch's error, and the pool and
/// the calling thread (a device's worker) go on.
///
/// [`Error::KernelFailed`]: crate::Error::KernelFailed
pub(crate) fn run_host_kernel(
    pool: &rayon::ThreadPool,
    device: usize,
    kernel: &'static str,
    f: HostKernelFn,
    n: usize,
    args: &[KernelArg],
) -> crate::error::Result<()> {
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.install(|| f(&HostLaunch::new(kernel, n, args)))
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
}

impl<'a> HostLaunch<'a> {
    pub(crate) fn new(kernel: &'static str, n: usize, args: &'a [KernelArg]) -> Self {
        Self { kernel, n, args }
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

/// An argument of a target launch in the OpenMP shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LaunchArg {
    /// A host address inside a mapped range: the kernel gets its device address. In C's
    /// `target` ([`crate::Runtime::target_launch`], [`crate::omp::target`]) it is a pointer
    /// the region captured, initialised as OpenMP 5.2's 5.8.6 says: one inside no mapped
    /// range gets the device address through the entry whose map named it as the
    /// section's base (`map(to: A[64:128])`, then `A`), and one pointing to no mapped
    /// storage keeps its value where that is the device's memory (`omp_target_alloc`). A
    /// host address that is neither is refused (C would pass it to a device that cannot
    /// read it; [`LaunchArg::Device`] passes any value unchanged). Elsewhere (the safe API)
    /// a host address inside no mapped range is an error.
    Mapped(usize),
    /// C's base pointer of an array section (libomptarget's base/begin pair): the kernel
    /// gets the device address of host address `base`, translated through the mapped
    /// range that holds `section` (the section's first byte), so a kernel written against
    /// the array's base (`arr[i + ioff]` with only `arr[ioff:n]` mapped) needs no rebasing.
    MappedBase {
        /// The array's base, host address (need not be mapped).
        base: usize,
        /// A host address inside the mapped section.
        section: usize,
    },
    /// A device address used as is (e.g. from `target_alloc`).
    Device(u64),
    /// A value.
    Value(Scalar),
}

impl LaunchArg {
    /// A host pointer to translate through the present table.
    pub fn mapped<T>(p: *const T) -> Self {
        LaunchArg::Mapped(p as usize)
    }

    /// The base pointer `base` of an array whose section at `section` is mapped (see
    /// [`LaunchArg::MappedBase`]).
    pub fn mapped_base<T>(base: *const T, section: *const T) -> Self {
        LaunchArg::MappedBase { base: base as usize, section: section as usize }
    }
}

/// What every HIP source translated from CUDA starts with: the CUDA spellings kernels
/// use, in HIP.
///
/// CUDA's `__shfl_*_sync` become `__shfl_*` with a width of 32, so the 32-lane reductions and
/// neighbour exchanges of the kernels keep their meaning on AMD's 64-lane wavefronts (each
/// wavefront acts as two 32-lane groups, exactly as two CUDA warps). The names are the
/// translation's own: a generated kernel's header defines `offload_shfl_down(v, o)` (two
/// arguments, no mask) over `__shfl_down_sync`, which becomes this prelude's.
pub const HIP_PRELUDE: &str = "\
// offload: CUDA spellings in HIP (32-lane groups on 64-lane wavefronts)
#define offload_hip_shfl_down(mask, var, delta) __shfl_down((var), (delta), 32)
#define offload_hip_shfl_up(mask, var, delta) __shfl_up((var), (delta), 32)
#define offload_hip_shfl(mask, var, lane) __shfl((var), (lane), 32)
";

/// A kernel's CUDA C source as HIP C for `hiprtc`: the prelude, then the source with the
/// warp intrinsics renamed to the prelude's (renaming rather than redefining leaves any
/// HIP header that declares `__shfl_*_sync` itself untouched). The one way a kernel gets
/// HIP from CUDA, generated or hand-written.
pub fn hip_translation(cuda: &str) -> String {
    let body = cuda
        .replace("__shfl_down_sync(", "offload_hip_shfl_down(")
        .replace("__shfl_up_sync(", "offload_hip_shfl_up(")
        .replace("__shfl_sync(", "offload_hip_shfl(");
    format!("{HIP_PRELUDE}{body}")
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
