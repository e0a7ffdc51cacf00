//! Single-source kernels for `offload`: write a loop body once, in Rust, and run it on GPUs
//! (as generated CUDA C) and on host devices (as a generated `rayon` twin). Use the macros
//! through the runtime: `#[offload::kernel]`, `#[offload::device]`.
//!
//! ```
//! use offload::{map, Runtime};
//!
//! #[offload::kernel]
//! fn saxpy(i: usize, a: f32, x: &[f32], y: &mut [f32]) {
//!     y[i] = a * x[i] + y[i];
//! }
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let gpu = rt.device(0)?;
//! let (n, x) = (1000, vec![1.0f32; 1000]);
//! let mut y = vec![1.0f32; 1000];
//! gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| saxpy::launch(&gpu, n, 2.0, x, y))?;
//! assert!(y.iter().all(|&v| v == 3.0));
//! # Ok::<(), offload::Error>(())
//! ```
//!
//! # What a kernel is
//!
//! `#[offload::kernel] fn NAME(i: usize, [j: usize, [k: usize,]] args...) { body }`. The
//! leading `usize` parameters (1, 2 or 3; `#[offload::kernel(dims = 1)]` says how many when
//! a `usize` argument follows the indices) are the indices of the loop nest, outermost
//! first. The other parameters are the arguments: scalars (`f32`, `f64`, `i32`, `u32`,
//! `i64`, `u64`, `usize`, `bool`) and slices `&[T]` / `&mut [T]` of them (not of `bool`).
//!
//! The function stays as written (ordinary Rust, type-checked and callable on the host);
//! beside it a module of the same name holds:
//! * `KERNEL`, a `static offload::Kernel` named `NAME` with the CUDA C source and the host
//!   twin;
//! * `launch(&device, space, args...)`: runs the kernel over `space`, with a
//!   `DeviceSlice<'_, T>` for each slice argument and the declared type for each scalar;
//! * `args(space, args...) -> Result<(n, Args)>`: the same checks, giving the work-item
//!   count and the argument list for `NowaitScope::launch(device, &NAME::KERNEL, n, args,
//!   after)` (a pipeline's compute stage launches the same way);
//! * `KERNEL_CHECKED` and `CHECKED`: the bounds-checked variant and whether `launch` runs
//!   it (see "Checked launches");
//! * for a kernel with reduction variables, `reduce(&device, space, args...)`: runs it with
//!   the runtime providing the reduction variables and returns their values (see
//!   "Reductions").
//!
//! Views a launch writes (`&mut [T]`, reduction variables) may not overlap its other views
//! (`Error::KernelArgument` names both), so the generated C marks its pointers
//! `__restrict__`.
//!
//! # Reductions
//!
//! `#[offload::kernel(reduction(+: sum), reduction(min: lo, ..), reduction(max: hi))]`, as
//! OpenMP's `reduction` clause, for `&mut T` arguments with `T` one of `f32`, `f64`, `i32`,
//! `u32`, `i64`, `u64`. The body updates them only as `*sum += value;`,
//! `*lo = (*lo).min(value);` and `*hi = (*hi).max(value);` (for floats `lo.min(value)`
//! works too); any other use is a compile error. The launcher takes a writable view of at
//! least one element for each; every iteration's contribution and element 0's value are
//! combined into element 0. On GPUs each thread keeps a partial, a warp combines partials
//! by shuffles, a block by shared memory, and one atomic per block combines into the view
//! (float `min`/`max` by compare-and-swap); the launch is one wave of blocks looping over
//! the items. On host devices each `rayon` task folds up to 4096 items, and the tasks'
//! partials are combined in a tree. Float sums are thus added in an unspecified order
//! (as in OpenMP); float `min`/`max` ignore NaN, as Rust's `f32::min` and C's `fminf` do.
//!
//! ```
//! use offload::{map, Runtime};
//!
//! #[offload::kernel(reduction(+: total), reduction(max: peak))]
//! fn stats(i: usize, x: &[f64], total: &mut f64, peak: &mut f64) {
//!     *total += x[i];
//!     *peak = (*peak).max(x[i]);
//! }
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let gpu = rt.device(0)?;
//! let x: Vec<f64> = (0..1000).map(f64::from).collect();
//! let (mut total, mut peak) = ([0.0], [f64::NEG_INFINITY]);
//! gpu.data((map::to(&x), map::tofrom(&mut total), map::tofrom(&mut peak)), |(x, t, p)| {
//!     stats::launch(&gpu, x.len(), x, t, p)
//! })?;
//! assert_eq!((total[0], peak[0]), (499_500.0, 999.0));
//! # Ok::<(), offload::Error>(())
//! ```
//!
//! `NAME::reduce(&device, space, args...)` returns the reduced values instead: its
//! arguments are `launch`'s without the reduction variables (which may sit anywhere in the
//! list), and it gives `Result<T>` for one reduction, `Result<(T1, T2, ..)>` for several, in
//! declaration order. The runtime provides each variable, set to its operator's identity
//! (0 for `+`, the type's largest value for `min` and smallest for `max`, infinities for
//! floats), so the value is that of the items alone; an empty space launches nothing and
//! gives the identities. On an offload device the variables are one device allocation, set
//! by one copy and read back by one (the read is where the host waits for the launch); on
//! the initial device they are host memory. A checked `reduce` (`CHECKED`) checks every
//! access on GPUs as `launch` does, its report read back with the values. A launch error
//! about an argument (e.g. a view that is not mapped) names it.
//!
//! ```
//! use offload::{map, Runtime};
//!
//! # #[offload::kernel(reduction(+: total), reduction(max: peak))]
//! # fn stats(i: usize, x: &[f64], total: &mut f64, peak: &mut f64) {
//! #     *total += x[i];
//! #     *peak = (*peak).max(x[i]);
//! # }
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let gpu = rt.device(0)?;
//! let x: Vec<f64> = (0..1000).map(f64::from).collect();
//! let (total, peak) = gpu.data(map::to(&x), |x| stats::reduce(&gpu, x.len(), x))?;
//! assert_eq!((total, peak), (499_500.0, 999.0));
//! # Ok::<(), offload::Error>(())
//! ```
//!
//! # Checked launches
//!
//! `#[offload::kernel(checked = true)]` (or `false`; by default, whether the crate using
//! the macro is built with debug assertions) makes `launch` run `KERNEL_CHECKED` on GPUs:
//! every element access is compared with its view's length; an access out of range is not
//! made (a load reads a scratch word, a store writes one) and the first is reported after
//! the launch as `Error::KernelFailed` naming the argument, the index and the length. The
//! launch then waits for a 48-byte report (mapped `tofrom`, so it shows in traces and
//! transfer counts). Launches made from `args` (nowait scopes, pipelines) run `KERNEL`,
//! unchecked on GPUs. Host devices are always checked (the twin's accesses are).
//!
//! # Index spaces
//!
//! `space` is written like C loop bounds (`offload::IndexSpace`): `n` or `a..b` in 1-D, a
//! tuple of ranges in 2-D and 3-D (`(1..ny - 1, 1..nx - 1)`, as OpenMP's `collapse(2)`), or
//! a tuple of counts. An empty dimension launches nothing. The last index varies fastest.
//!
//! The kernel receives, before its arguments, the start of each dimension and the length
//! of each inner one (all `unsigned long long`), and after its arguments the length of
//! each view argument (`unsigned long long`); the checked variant then the report's
//! address; the runtime appends the work-item count. The launch is at most one wave of
//! 256-thread blocks (the driver's occupancy for the kernel) looping with a grid stride.
//! In 2-D and 3-D a GPU thread takes one point of the inner dimensions and a strip of
//! consecutive outer indices (`#[offload::kernel(rows = N)]`, 1 to 64, default 4): a whole
//! strip is an unrolled loop, so what one row loads of its neighbours along the outer
//! index is reused by the next from registers (the Jacobi step of `offload-kernels` is
//! fastest with 4; one point per thread, `rows = 1`, was 1.8x slower, and 8 1.3x).
//!
//! # Semantics: OpenMP's `parallel for`
//!
//! Iterations run in any order and at once; each must write only elements no other
//! iteration touches, and read no element another writes. `return;` ends the iteration.
//! On host devices the twin is safe Rust: each slice element access is a bounds-checked
//! relaxed atomic load or store (never a `&mut [T]`), so even a kernel that breaks the
//! contract has no undefined behaviour, and an index out of range fails the launch
//! (`Error::KernelFailed`) naming the kernel, the argument and the index. On GPUs indices
//! are checked only in a checked launch (below). A `&mut [T]` argument must get a writable view (from `map::from`,
//! `map::tofrom`, a `HostBuffer`); a shared one is an `Error::KernelArgument` naming the
//! argument. Scalars and view lengths are checked by rustc through the launcher's types.
//!
//! # The subset
//!
//! * `let` with a type (`let x: f32 = ...`) or inferred from typed operands (parameters,
//!   locals, casts, suffixed literals); an unsuffixed literal alone needs an annotation;
//!   `const N: T = ...;` inside the body;
//! * `=` and compound assignment to `let mut` locals and to elements of `&mut` slices;
//! * `+ - * / %`, `& | ^ << >>`, `== != < <= > >=`, `&& ||`, unary `-` and `!`, `as`
//!   between the scalar types, indexing of slice parameters;
//! * `if` / `else if` / `else`, `if c { a } else { b }` as a value, `for x in a..b` and
//!   `a..=b` (integers; a literal-only range needs a suffix: `0usize..4`), `while`, `loop`,
//!   `break`, `continue`, `return;`;
//! * `x.len()` of a slice argument (its view's length);
//! * float methods `sqrt abs exp ln sin cos tan powi powf mul_add floor ceil min max`
//!   (`sqrtf` etc. for `f32`), integer `min`, `max` and `abs` (signed);
//! * numeric literals (with suffixes), `true`, `false`;
//! * calls to `#[offload::device]` functions listed with their signature:
//!   `#[offload::kernel(device_fns = [lerp(f32, f32, f32) -> f32])]` (the macro cannot see
//!   another item's body; rustc checks the listed signature against the function).
//!
//! Anything else (closures, other methods, macros, `Vec`, references to items outside the
//! kernel, struct literals, `match`, ...) is a compile error pointing at the construct.
//! Differences from Rust on GPUs: integer overflow wraps or is undefined as in C, float to
//! integer casts saturate (NVIDIA's conversions do), `a..=b` with `b` the type's maximum
//! does not end.
//!
//! # Device functions
//!
//! `#[offload::device] fn f(x: f32, ...) -> f32 { ... }` (scalars in and out, the same body
//! subset, `return e` and a tail expression) keeps `f` and adds a hidden constant with its
//! `__device__` source, which kernels listing `f` in `device_fns` include. A device function
//! calls others it lists the same way, `#[offload::device(device_fns = [g(f32) -> f32])]`:
//! its source then carries theirs (each definition guarded, so a kernel that lists both gets
//! one), and rustc checks the listed signatures. A kernel that calls device functions, and
//! the functions, are items of a module (the generated module reaches them through
//! `super::`), not items declared inside a function body.
//!
//! # Safety of the host twin
//!
//! The twin refuses a slice argument whose extent the runtime does not know (a raw
//! pointer) or whose view is longer than its mapping, so a hand-built argument list for
//! `NAME::KERNEL` cannot make it read or write outside the memory a launch names.

use proc_macro::TokenStream;

mod access;
mod derive;
mod emit_c;
mod emit_host;
mod expand;
mod ir;
mod lower;
mod options;
mod signature;
mod ty;

/// Makes a loop body a kernel for every backend: see the crate docs.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::kernel(attr.into(), item.into()).into()
}

/// Makes a function callable from kernels (and from other device functions): see the
/// crate docs.
#[proc_macro_attribute]
pub fn device(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::device(attr.into(), item.into()).into()
}

/// Makes a `#[repr(C)]` struct of the kernel language's scalars (and of such structs) a
/// kernel parameter by value and the element of views: see the crate docs.
#[proc_macro_derive(DeviceCopy)]
pub fn derive_device_copy(item: TokenStream) -> TokenStream {
    derive::device_copy(item.into()).unwrap_or_else(syn::Error::into_compile_error).into()
}

#[cfg(test)]
mod tests;
