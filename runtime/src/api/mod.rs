//! The safe Rust API, a file per concern: map clauses over borrowed slices (`clauses`),
//! device views (`views`), kernel arguments (`arguments`), the [`Device`] handle
//! (`device`), runtime-owned host memory (`host_buffer`), mappings that end themselves
//! (`guards`), device memory (`device_buffer`) and `declare target` variables
//! (`device_global`).
//!
//! A [`Map`] borrows its host slice (shared for `to`/`alloc`, exclusive for `from`/`tofrom`)
//! for as long as any view made from it lives, so host memory cannot be freed or touched
//! while it is mapped, and a `from` copy-back never races a host access: the borrow
//! checker rejects it. A [`DeviceSlice`] names a mapped host range on one device; a launch
//! translates it through the present table at the time of the launch, so a view used after
//! its region ended is an error, never a dangling device pointer.
//!
//! ```
//! use offload::{map, HostLaunch, Kernel, Runtime};
//!
//! fn axpy(l: &HostLaunch<'_>) -> Result<(), String> {
//!     let a: f32 = l.scalar(0)?;
//!     // SAFETY: arguments 1 and 2 are distinct mapped ranges of n f32.
//!     let (x, y) = unsafe { (l.slice::<f32>(1, l.n())?, l.slice_mut::<f32>(2, l.n())?) };
//!     y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
//!     Ok(())
//! }
//! static AXPY: Kernel = Kernel::new("axpy").with_host(axpy);
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let gpu = rt.device(0)?;
//! let x = vec![1.0f32; 1000];
//! let mut y = vec![0.0f32; 1000];
//! gpu.data((map::to(&x), map::tofrom(&mut y)), |(x, y)| {
//!     for _ in 0..100 {
//!         gpu.launch(&AXPY, 1000, (2.0f32, x, y))?;
//!     }
//!     Ok(())
//! })?;
//! assert!(y.iter().all(|&v| v == 200.0));
//! # Ok::<(), offload::Error>(())
//! ```

mod arguments;
mod clauses;
mod device;
pub mod device_buffer;
pub mod device_global;
pub mod guards;
mod host_buffer;
mod views;

pub use arguments::{DevicePtr, KernelArgs, KernelArgument, SharedView};
pub(crate) use clauses::entry_items;
pub use clauses::{Map, MapList};
pub use device::Device;
pub use device_buffer::{Association, DeviceBuffer};
pub use device_global::{DeviceGlobal, GlobalArg};
pub use guards::{HostMut, Mapped};
pub use host_buffer::{HostBuffer, QueuedRead};
pub(crate) use views::{scratch_view_of, view_of, ErasedView, ViewExit};
pub use views::{BasedSlice, DeviceSlice};
