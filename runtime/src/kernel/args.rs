//! What a launch passes: [`Scalar`] values, [`KernelArg`]s as the backends see them,
//! [`LaunchArg`]s before translation, and the types kernels take ([`KernelScalar`],
//! [`DeviceCopy`], [`KernelStruct`]).

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

    pub(crate) fn type_name(self) -> &'static str {
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
