//! Single-source kernels for `offload`: write a loop body once, in Rust, and run it on GPUs
//! (as generated CUDA C and HIP C) and on host devices (as a generated Rust twin). Use the
//! macros through the runtime: `#[offload::kernel]`, `#[offload::device]`,
//! `#[derive(offload::DeviceCopy)]`. The language is documented in one place,
//! `docs/KERNELS.md` (what a body may contain, indices and `dims`, views and which maps make
//! them writable, reductions, structs, constants, device functions, teams kernels, thread
//! mapping, checked mode, and every compile error with its fix).
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
//! # How it is built
//!
//! A small compiler: `signature.rs` reads the kernel's shape (its indices, declared by `dims`
//! or the one leading `usize`, and its parameters, whose argument-block layout is written
//! once as `Slot`s); `lower.rs` checks the body and lowers it to the typed IR of `ir.rs`
//! (every compile error about a body comes from there, with its span); `access.rs` finds the
//! unit-stride index of a 2-D or 3-D kernel, which becomes the fastest-varying thread
//! dimension; `emit_c.rs` writes the CUDA C and the HIP C from the one IR (the dialects
//! differ only in a header before `prelude.cuh`); `emit_host.rs` writes the host twin's
//! statements, whose views are bounds-checked atomic loads and stores, and `twin.rs` its
//! launch function around them (arguments read, tasks of whole rows, plain views where a
//! launch's check allows); `launcher.rs` writes the typed launchers (`Args`, `launch`,
//! `reduce`); `expand.rs` assembles the generated module (what rustc must fill in,
//! constants' values, structs' and device functions' sources, is left as parts joined at
//! compile time); `derive.rs` is `DeviceCopy`.
//!
//! # Reductions
//!
//! `#[offload::kernel(reduction(+: total), reduction(max: peak))]`, as OpenMP's `reduction`
//! clause, over `&mut T` arguments updated as `*total += v;` and `*peak = (*peak).max(v);`.
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
//! // `reduce` provides the variables and returns their values.
//! let (total, peak) = gpu.data(map::to(&x), |x| stats::reduce(&gpu, x.len(), x))?;
//! assert_eq!((total, peak), (499_500.0, 999.0));
//! # Ok::<(), offload::Error>(())
//! ```
//!
//! # Device functions, structs, constants, teams
//!
//! What a kernel names outside its body (constants, structs, device functions) are items
//! of a module, which the generated module reaches through `super::` (not items declared
//! inside a function body: hence the module in this example).
//!
//! ```
//! use offload::{map, Runtime};
//!
//! mod physics {
//!     /// A constant: its exact value reaches the C code.
//!     pub const DAMPING: f32 = 0.5;
//!
//!     #[derive(Clone, Copy, Debug, PartialEq, offload::DeviceCopy)]
//!     #[repr(C)]
//!     pub struct Particle {
//!         pub x: f32,
//!         pub v: f32,
//!     }
//!
//!     /// A device function taking a view, called by name from kernels.
//!     #[offload::device]
//!     pub fn mean(x: &[f32]) -> f32 {
//!         (x[0] + x[1]) / 2.0
//!     }
//!
//!     #[offload::kernel]
//!     pub fn step(i: usize, w: &[f32], ps: &mut [Particle]) {
//!         ps[i].x += ps[i].v * DAMPING * mean(&w[2 * i..2 * i + 2]);
//!     }
//!
//!     /// A teams kernel: a team of 32 threads reverses its block through team-local memory.
//!     #[offload::kernel(teams = 32)]
//!     pub fn reverse(team: usize, thread: usize, x: &[u32], y: &mut [u32]) {
//!         let mut tile: [u32; 32] = offload::team_local();
//!         tile[thread] = x[team * 32 + thread];
//!         offload::barrier();
//!         y[team * 32 + thread] = tile[31 - thread];
//!     }
//! }
//! use physics::{reverse, step, Particle};
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let gpu = rt.device(0)?;
//! let w = vec![2.0f32; 8];
//! let mut ps = vec![Particle { x: 1.0, v: 2.0 }; 4];
//! gpu.data((map::to(&w), map::tofrom(&mut ps)), |(w, ps)| step::launch(&gpu, 4, w, ps))?;
//! assert!(ps.iter().all(|p| p.x == 3.0));
//! let x: Vec<u32> = (0..64).collect();
//! let mut y = vec![0u32; 64];
//! gpu.data((map::to(&x), map::from(&mut y)), |(x, y)| reverse::launch(&gpu, 2, x, y))?;
//! assert_eq!((y[0], y[31], y[32]), (31, 0, 63));
//! # Ok::<(), offload::Error>(())
//! ```

use proc_macro::TokenStream;

mod access;
mod aliases;
mod derive;
mod emit_c;
mod emit_host;
mod emit_teams;
mod expand;
mod fast_rows;
mod ir;
mod launcher;
mod lower;
mod narrow;
mod options;
mod signature;
mod twin;
mod ty;
mod uniform;

/// Makes a loop body a kernel for every backend: see the crate docs and `docs/KERNELS.md`.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::kernel(attr.into(), item.into()).into()
}

/// Makes a function callable from kernels (and from other device functions) by name: see
/// `docs/KERNELS.md`.
#[proc_macro_attribute]
pub fn device(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::device(attr.into(), item.into()).into()
}

/// Makes a `#[repr(C)]` struct of the kernel language's scalars (and of such structs), with
/// no padding and at most 512 bytes, a kernel parameter by value and the element of views:
/// see `docs/KERNELS.md`.
#[proc_macro_derive(DeviceCopy)]
pub fn derive_device_copy(item: TokenStream) -> TokenStream {
    derive::device_copy(item.into()).unwrap_or_else(syn::Error::into_compile_error).into()
}

#[cfg(test)]
mod tests;
