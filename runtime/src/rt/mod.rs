//! The runtime: its devices, their present tables, and the OpenMP routines in Rust shape,
//! one file per concern: building it (`builder`), the constructs (`constructs`), device
//! memory (`memory`, `memcpy`), and what it says about itself (`queries`); this file holds
//! the runtime itself and the process-wide one.

mod builder;
mod constructs;
/// Device blocks held allocated while a front end uses their memory (a halo row, say).
pub(crate) use crate::device::BlocksInUse as DevicePin;
/// Makes the constructs of this thread wait for their work while it lives (a task's body).
pub(crate) use crate::device::ConstructsWait;
pub(crate) use crate::device::PendingRead;
pub(crate) use constructs::{ArgShape, GemmOperand};
pub(crate) use recorder::RecordedBody;
pub mod memcpy;
mod memory;
pub(crate) mod nccl;
mod queries;
pub(crate) mod recorder;

pub use builder::RuntimeBuilder;
pub(crate) use constructs::MapConstruct;
pub(crate) use memory::Caller;

use std::alloc::Layout;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::backend::platform::PeerMatrix;
use crate::backend::{DeviceDescription, MemInfo};
use crate::config::{OffloadPolicy, Settings};
use crate::data_env::{Construct, Entry, MapItem, UpdateDirection};
use crate::device::{DeviceState, PinnedRanges, Target, TransferStats};
use crate::error::{Error, Result};
use crate::info::Trace;
use crate::kernel::{run_host_kernel, Kernel, KernelArg, LaunchArg};
use crate::range::HostRange;
use crate::services::pinned_memory::PinnedMemory;
use crate::services::validate;
use crate::topology::{Placement, Topology};

/// What a device's memory pool holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    /// Allocations handed out and not freed (entries' device copies and `target_alloc`s).
    pub live_allocations: usize,
    /// Bytes of freed blocks kept for reuse.
    pub cached_bytes: usize,
}

/// What a runtime has: its devices and the state shared by all of them (made by
/// [`RuntimeBuilder::build`](crate::RuntimeBuilder::build)).
pub(crate) struct Inner {
    pub(crate) devices: Vec<DeviceState>,
    pub(crate) settings: Settings,
    pub(crate) report: String,
    pub(crate) trace: Arc<Trace>,
    pub(crate) kernel_pool: Arc<rayon::ThreadPool>,
    /// The initial device's memory is host memory: each of its kernels holds this
    /// exclusively, and the safe API's host-side reads and writes of memory kernels there
    /// may use ([`crate::HostMut`]'s copies, [`crate::DeviceBuffer`]'s reads) hold it
    /// shared, so none overlaps a kernel (views and buffers are `Send`). Taken only
    /// through [`Runtime::hold_initial_device`].
    pub(crate) initial_device_lock: parking_lot::RwLock<()>,
    pub(crate) host_allocs: Mutex<HashMap<usize, Layout>>,
    /// Which devices copy from which others' memory directly (empty when the builder
    /// turned peer access off).
    pub(crate) peers: PeerMatrix,
    pub(crate) pinned: Arc<PinnedRanges>,
    pub(crate) topology: Arc<Topology>,
    /// This runtime among the process's (the key of per-thread settings).
    pub(crate) id: u64,
}

/// A hold on the initial device's memory, from [`Runtime::hold_initial_device`].
#[allow(dead_code)] // held for its drop
pub(crate) enum InitialDeviceHold<'a> {
    /// A kernel's: exclusive.
    Kernel(parking_lot::RwLockWriteGuard<'a, ()>),
    /// A host-side access's: shared with other host-side accesses.
    Host(parking_lot::RwLockReadGuard<'a, ()>),
}

/// The next runtime's [`Inner::id`].
pub(crate) static NEXT_RUNTIME_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

std::thread_local! {
    /// `omp_set_default_device` per thread: (runtime id, device) pairs.
    pub(crate) static DEFAULT_DEVICE: std::cell::RefCell<Vec<(u64, usize)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An offload runtime: devices, one present table per device, and every OpenMP mapping
/// routine. Cheap to clone (shared).
///
/// ```
/// use offload::{MapItem, MapType, Runtime};
/// let rt = Runtime::builder().host_devices(2).build()?;
/// let x = [1.0f32; 8];
/// unsafe { rt.enter_data(0, &[MapItem::slice(&x, MapType::TO)])? };
/// assert!(rt.is_present(x.as_ptr() as usize, 0)?);
/// assert!(!rt.is_present(x.as_ptr() as usize, 1)?);
/// unsafe { rt.exit_data(0, &[MapItem::slice(&x, MapType::RELEASE)])? };
/// # Ok::<(), offload::Error>(())
/// ```
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("devices", &self.inner.devices.len())
            .field("policy", &self.inner.settings.policy)
            .finish()
    }
}

/// A host slice page-locked in place by [`Runtime::pin`], used through this guard (it
/// dereferences to the slice) and unpinned when dropped. While it lives, copies to and from
/// the slice skip staging and run at the link's speed.
#[derive(Debug)]
#[must_use = "the slice is unpinned when this guard drops"]
pub struct Pinned<'a, T> {
    rt: Runtime,
    data: &'a mut [T],
    by: Option<usize>,
}

impl<T> Pinned<'_, T> {
    /// Whether a driver page-locked the slice (false without GPUs).
    pub fn is_pinned(&self) -> bool {
        self.by.is_some()
    }
}

impl<T> std::ops::Deref for Pinned<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T> std::ops::DerefMut for Pinned<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.data
    }
}

impl<T> Drop for Pinned<'_, T> {
    fn drop(&mut self) {
        // Inside a recorded body too (see `recorder::outside`).
        crate::rt::recorder::outside(|| {
            if let Some(d) = self.by {
                // SAFETY: pinned by `Runtime::pin` with device `d`; every copy has completed.
                unsafe { self.rt.unpin_host(self.data.as_mut_ptr().cast(), d) };
            }
        })
    }
}

/// The process-wide runtime of [`Runtime::global`] (and `offload::omp`).
static GLOBAL: OnceLock<Result<Runtime>> = OnceLock::new();

/// Writes the process-wide runtime's trace file when the process exits (a return from
/// `main`, `std::process::exit`, a panic that unwinds out of `main`): that runtime lives in
/// a static and is never dropped, so without this a program of `offload::omp` routines that
/// does not call [`Runtime::flush_trace`] would leave an empty file. The flush does not
/// wait for queued work (the exit may come from inside it): spans not yet reached are left
/// out. Registered once, with the C library's `atexit`.
fn flush_trace_at_exit() {
    extern "C" fn flush() {
        // Nothing may unwind out of an `extern "C"` function.
        let _ = std::panic::catch_unwind(|| {
            if let Some(rt) = Runtime::global_if_started() {
                if let Err(e) = rt.flush_trace_waiting(false) {
                    eprintln!("offload: {e}");
                }
            }
        });
    }
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `flush` is a plain function that lives as long as the program and touches
        // only the static runtime (its trace under its own locks).
        if unsafe { libc::atexit(flush) } != 0 {
            eprintln!("offload: could not register the trace file's flush at exit");
        }
    });
}

impl Runtime {
    /// A runtime configured from the environment alone: the GPUs and
    /// `OFFLOAD_HOST_DEVICES` host devices; with that unset and no GPU, one host device, so
    /// a program always has a device (its [`Runtime::device_report`] says it was the
    /// default; `OFFLOAD_HOST_DEVICES=0` gives none, as a C program built without an
    /// offload target for the host has).
    pub fn new() -> Result<Self> {
        Self::builder().build()
    }

    /// A builder; unset settings come from the environment.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// The process-wide runtime the [`crate::omp`] routines use, built from the environment
    /// on first use. If that failed (e.g. a malformed `OMP_TARGET_OFFLOAD`), every call
    /// returns the same error.
    pub fn global() -> Result<&'static Runtime> {
        GLOBAL
            .get_or_init(|| {
                let rt = Runtime::new();
                flush_trace_at_exit();
                rt
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The process-wide runtime if it was started (or chosen) already; never starts one.
    pub(crate) fn global_if_started() -> Option<&'static Runtime> {
        GLOBAL.get().and_then(|r| r.as_ref().ok())
    }

    /// Makes `self` the process-wide runtime unless one exists already; returns the one in
    /// use.
    pub fn install_global(self) -> Result<&'static Runtime> {
        let mut mine = Some(self);
        let r = GLOBAL.get_or_init(|| {
            flush_trace_at_exit();
            Ok(mine.take().expect("initialiser runs once"))
        });
        r.as_ref().map_err(Clone::clone)
    }

    /// Device `device` or the initial device, for the device memory routines and queries
    /// (which work on the initial device under `mandatory` too, as libomptarget's do).
    pub(crate) fn target(&self, device: usize) -> Result<Target<'_>> {
        match self.inner.devices.get(device) {
            Some(d) => Ok(Target::Device(d)),
            None if device == self.initial_device() => Ok(Target::Initial),
            None => Err(self.no_such_device(device)),
        }
    }

    /// As [`Runtime::target`], for a device construct (a data construct, `update`, a launch,
    /// a safe-API [`crate::Device`]): under `OMP_TARGET_OFFLOAD=mandatory` with no device,
    /// every one fails, on the initial device too, since the default device is then the
    /// initial device and the region would silently run on the host (libomptarget 19 fails
    /// them all the same way).
    pub(crate) fn construct_target(&self, device: usize) -> Result<Target<'_>> {
        self.offload_available()?;
        self.target(device)
    }

    /// [`Error::OffloadMandatory`] (naming what each backend found) when
    /// `OMP_TARGET_OFFLOAD=mandatory` and there is no device.
    pub(crate) fn offload_available(&self) -> Result<()> {
        if self.inner.devices.is_empty() && self.inner.settings.policy == OffloadPolicy::Mandatory {
            return Err(Error::OffloadMandatory { reason: self.inner.report.trim_end().replace('\n', "; ") });
        }
        Ok(())
    }

    /// The error for device number `device`, which is neither a device nor the initial
    /// device: [`Error::OffloadMandatory`] when that is why there is no such device.
    pub(crate) fn no_such_device(&self, device: usize) -> Error {
        match self.offload_available() {
            Err(e) => e,
            Ok(()) => Error::NoSuchDevice { device: device as i64, available: self.num_devices() },
        }
    }

    /// The runtime's identity (its clones share it), for thread-local state keyed by it.
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Whether `other` is this runtime or a clone of it.
    pub(crate) fn same_as(&self, other: &Runtime) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Holds the initial device's memory, for a kernel (`kernel`) or a host-side access of
    /// `what`. Refused on the initial device's own kernel threads: the launch that runs
    /// them holds it already, and waiting there would wait for ever.
    pub(crate) fn hold_initial_device(
        &self,
        kernel: bool,
        what: &'static str,
    ) -> Result<InitialDeviceHold<'_>> {
        if self.inner.kernel_pool.current_thread_index().is_some() {
            return Err(Error::InvalidArgument {
                routine: what,
                what: format!(
                    "initial device {}: called from one of its own kernels, which hold its memory; expected a call from outside a kernel of the initial device",
                    self.initial_device()
                ),
            });
        }
        let lock = &self.inner.initial_device_lock;
        Ok(if kernel {
            InitialDeviceHold::Kernel(lock.write())
        } else {
            InitialDeviceHold::Host(lock.read())
        })
    }

    /// `Ok` for an offload device or the initial device, else the error naming `device`.
    pub(crate) fn check_target(&self, device: usize) -> Result<()> {
        self.target(device).map(drop)
    }

    /// `Ok` for an offload device (not the initial device), else the error naming `device`.
    pub(crate) fn check_offload_device(&self, device: usize) -> Result<()> {
        self.device_state(device).map(drop)
    }

    /// An offload device (not the initial device).
    pub(crate) fn device_state(&self, device: usize) -> Result<&DeviceState> {
        self.inner.devices.get(device).ok_or_else(|| self.no_such_device(device))
    }

    /// Whether device `dst` copies from device `src`'s memory directly (the same device, or
    /// peer access enabled at discovery and allowed by the builder).
    pub(crate) fn reaches(&self, dst: usize, src: usize) -> bool {
        self.inner.peers.reaches(dst, src)
    }

    /// Page-locks `[ptr, ptr+bytes)` in place with the first device that can; returns
    /// which one.
    ///
    /// # Safety
    /// The memory stays allocated until [`Runtime::unpin_host`] with the returned device.
    pub(crate) unsafe fn pin_host(&self, ptr: *mut u8, bytes: usize) -> Option<usize> {
        // SAFETY: forwarded from the caller.
        self.inner.devices.iter().find(|d| unsafe { d.lock_host(ptr, bytes) }).map(|d| d.number)
    }

    /// Undoes [`Runtime::pin_host`].
    ///
    /// # Safety
    /// No copy on the memory is in flight (every construct waits for its copies).
    pub(crate) unsafe fn unpin_host(&self, ptr: *mut u8, device: usize) {
        if let Some(d) = self.inner.devices.get(device) {
            // SAFETY: forwarded from the caller.
            unsafe { d.unlock_host(ptr) };
        }
    }

    /// `bytes` zeroed bytes of host memory the program will see (aligned to a page or to
    /// `align` if larger), page-locked by the first device whose driver can; unlocked and
    /// freed when dropped.
    pub(crate) fn pinned_memory(&self, bytes: usize, align: usize) -> Result<PinnedMemory> {
        let mut m = PinnedMemory::allocate(self.initial_device(), bytes, align, None)?;
        let _ = self.inner.devices.iter().any(|d| d.lock_memory(&mut m));
        Ok(m)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for d in &mut self.devices {
            // Queued work first: it may still use the memory released below.
            d.shut_down(&self.trace);
        }
        // After the shutdown's copies and reports, so that the file holds them; a drop
        // cannot return the error (`Runtime::flush_trace` does).
        if let Err(e) = self.trace.flush_file() {
            eprintln!("offload: {e}");
        }
        for (p, layout) in self.host_allocs.get_mut().drain() {
            // SAFETY: allocated by `target_alloc` on the initial device with this layout.
            unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        }
    }
}
