//! [`DeviceGlobal`]: a `declare target` variable, a `static` with a copy on every device.
//!
//! OpenMP's `#pragma omp declare target` gives a global variable a device copy that
//! kernels use by name and that `target update to/from` moves. Here the host copy lives
//! in the static (behind a lock, since any thread may touch it), and each device's copy is
//! made on the global's first use on that device, from the host value at that moment (C's
//! is made at load time from the initializer: the same value unless the host changed it
//! first). The device copy is present in the device's data environment for the runtime's
//! lifetime, at the static's host address, with an infinite count, as OpenMP's are: maps
//! of it copy nothing, `omp_target_is_present` says yes, updates move it. On the initial
//! device the variable is the host copy itself (a kernel's writes reach it when its launch
//! returns).
//!
//! A global's device copies outlive any borrow (they are present until the runtime ends),
//! so the methods that make or use them take `&'static self`: a `DeviceGlobal` lives in a
//! `static`, as a `declare target` variable does. One in a local variable would leave its
//! device copies keyed by a stack address after it is gone; that does not compile:
//!
//! ```compile_fail
//! use offload::{DeviceGlobal, Runtime};
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let local = DeviceGlobal::new(5u32);
//! local.update_to(&rt.device(0)?)?; // `local` does not live for 'static
//! # Ok::<(), offload::Error>(())
//! ```
//!
//! ```
//! use offload::{DeviceGlobal, HostLaunch, Kernel, Runtime};
//!
//! // #pragma omp declare target
//! static TOTAL: DeviceGlobal<[u64; 2]> = DeviceGlobal::new([1, 2]);
//!
//! fn bump(l: &HostLaunch<'_>) -> Result<(), String> {
//!     // SAFETY: argument 0 is the global's two u64.
//!     unsafe { l.slice_mut::<u64>(0, 2)? }.iter_mut().for_each(|v| *v += 10);
//!     Ok(())
//! }
//! static BUMP: Kernel = Kernel::new("bump").with_host(bump);
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let dev = rt.device(0)?;
//! dev.launch(&BUMP, 1, (TOTAL.arg(&dev)?,))?;
//! assert_eq!(*TOTAL.host(), [1, 2]);      // only the device copy changed
//! TOTAL.update_from(&dev)?;               // #pragma omp target update from(TOTAL)
//! assert_eq!(*TOTAL.host(), [11, 12]);
//! # Ok::<(), offload::Error>(())
//! ```

use parking_lot::{Mutex, MutexGuard};

use crate::api::{Device, KernelArgument, SharedView};
use crate::data_env::UpdateDirection;
use crate::error::Result;
use crate::kernel::{DeviceCopy, Kernel, LaunchArg};
use crate::range::HostRange;

/// A `declare target` variable; see the [module documentation](self).
pub struct DeviceGlobal<T: DeviceCopy> {
    host: Mutex<T>,
}

impl<T: DeviceCopy + std::fmt::Debug> std::fmt::Debug for DeviceGlobal<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceGlobal").field("host", &*self.host.lock()).finish()
    }
}

impl<T: DeviceCopy> DeviceGlobal<T> {
    const BYTES: usize = std::mem::size_of::<T>();

    /// A global whose host copy starts as `value`. `T` must not be zero-sized (a device
    /// copy of nothing has no address of its own): that fails to compile.
    pub const fn new(value: T) -> Self {
        const { assert!(std::mem::size_of::<T>() > 0, "a DeviceGlobal of a zero-sized type") };
        Self { host: Mutex::new(value) }
    }

    /// The host copy, locked (kernels of the initial device and updates take the same lock).
    pub fn host(&self) -> MutexGuard<'_, T> {
        self.host.lock()
    }

    /// The host copy's address: the key of its device copies in every present table (for
    /// the raw API: `LaunchArg::mapped`, `omp_target_is_present`).
    pub fn host_ptr(&self) -> *mut T {
        self.host.data_ptr()
    }

    fn range(&self) -> HostRange {
        HostRange::new(self.host_ptr() as usize, Self::BYTES)
    }

    /// The device copy's address on `device`, made from the host copy on first use. The
    /// caller holds the host lock.
    fn device_copy(&'static self, device: &Device<'_>, _host: &MutexGuard<'_, T>) -> Result<u64> {
        let (rt, d) = (device.runtime(), device.number());
        let host = self.host_ptr() as usize;
        if d == rt.initial_device() {
            return Ok(host as u64);
        }
        if let Some(e) = rt.entry(host, d)? {
            // Only the association made here is the global's copy: a mapping the program
            // made of the host copy itself is refused (it would not last, nor fit).
            if e.associated && e.range == self.range() {
                return Ok(e.device_addr);
            }
            return Err(crate::Error::InvalidArgument {
                routine: "DeviceGlobal",
                what: format!(
                    "device {d}: the global's host copy ({}) is mapped by the program as {}; \
                     expected its device copy to come only from the global's own first use",
                    self.range(),
                    e.range
                ),
            });
        }
        let addr = rt.target_alloc(Self::BYTES, d)?;
        let init = rt.initial_device();
        // SAFETY: `addr` holds `BYTES` fresh bytes of `d`; the host copy is locked by the
        // caller, so nothing writes it meanwhile. The allocation is never freed, so the
        // association (made while the lock is still held, so once per device) stays valid
        // for the runtime's lifetime.
        let made = unsafe {
            rt.target_memcpy(addr, host as u64, Self::BYTES, 0, 0, d, init)
                .and_then(|()| rt.associate_ptr(host, addr, Self::BYTES, 0, d))
        };
        if let Err(e) = made {
            // SAFETY: nothing else knows of `addr` yet.
            let _ = unsafe { rt.target_free(addr, d) };
            return Err(e);
        }
        Ok(addr)
    }

    /// The device copy's address on `device` (C's `omp_get_mapped_ptr(&x, d)`), made on
    /// first use.
    pub fn device_addr(&'static self, device: &Device<'_>) -> Result<u64> {
        let host = self.host.lock();
        self.device_copy(device, &host)
    }

    /// The global as a kernel argument on `device`. On the initial device the kernel works
    /// on a copy of the host value that goes back into it when the argument drops (at the
    /// end of the launch it was given to), so no lock is held across the launch.
    pub fn arg(&'static self, device: &Device<'_>) -> Result<GlobalArg<'static, T>> {
        let host = self.host.lock();
        if device.number() == device.runtime().initial_device() {
            let copy = Box::into_raw(Box::new(*host));
            return Ok(GlobalArg { device: device.number(), addr: copy as u64, back: Some((copy, self)) });
        }
        let addr = self.device_copy(device, &host)?;
        Ok(GlobalArg { device: device.number(), addr, back: None })
    }

    /// `#pragma omp target update to(x)`: the host copy into `device`'s copy.
    #[track_caller]
    pub fn update_to(&'static self, device: &Device<'_>) -> Result<()> {
        self.update(device, UpdateDirection::To)
    }

    /// `#pragma omp target update from(x)`: `device`'s copy into the host copy.
    #[track_caller]
    pub fn update_from(&'static self, device: &Device<'_>) -> Result<()> {
        self.update(device, UpdateDirection::From)
    }

    #[track_caller]
    fn update(&'static self, device: &Device<'_>, dir: UpdateDirection) -> Result<()> {
        let host = self.host.lock();
        self.device_copy(device, &host)?;
        // SAFETY: the host copy is locked for the call; any bits are a valid `T`.
        unsafe { device.runtime().update(device.number(), dir, &[(self.range(), true)]) }
    }
}

/// A [`DeviceGlobal`] as a kernel argument on one device, from [`DeviceGlobal::arg`].
pub struct GlobalArg<'g, T: DeviceCopy> {
    device: usize,
    addr: u64,
    /// On the initial device: the kernel's copy (a leaked `Box`) and where it goes back.
    back: Option<(*mut T, &'g DeviceGlobal<T>)>,
}

// SAFETY: the pointer is a `Box<T>` the argument owns; `T: Send`, and the global is `Sync`.
unsafe impl<T: DeviceCopy> Send for GlobalArg<'_, T> {}

impl<T: DeviceCopy> Drop for GlobalArg<'_, T> {
    fn drop(&mut self) {
        if let Some((copy, global)) = self.back.take() {
            // SAFETY: `copy` came from `Box::into_raw` in `arg` and is taken back once; the
            // launch that used it has returned (it borrowed this argument).
            let value = unsafe { Box::from_raw(copy) };
            *global.host.lock() = *value;
        }
    }
}

impl<T: DeviceCopy> std::fmt::Debug for GlobalArg<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalArg")
            .field("device", &self.device)
            .field("addr", &format_args!("{:#x}", self.addr))
            .finish()
    }
}

// SAFETY: the argument names the global's device copy, which lives as long as the runtime,
// or on the initial device the argument's own copy, which lives as long as the argument.
unsafe impl<T: DeviceCopy> KernelArgument for GlobalArg<'_, T> {
    fn launch_arg(&self, device: usize, index: usize, kernel: &Kernel) -> Result<LaunchArg> {
        if device != self.device {
            return Err(crate::Error::KernelArgument {
                kernel: kernel.name(),
                index,
                what: format!(
                    "a global's copy on device {} passed to a launch on device {device}",
                    self.device
                ),
            });
        }
        Ok(LaunchArg::Device(self.addr))
    }

    fn view_range(&self) -> Option<HostRange> {
        Some(HostRange::new(self.addr as usize, std::mem::size_of::<T>()))
    }
}

// SAFETY: the argument names the global's device copy, which lives as long as the runtime,
// or on the initial device the argument's own copy, which lives as long as the argument.
unsafe impl<T: DeviceCopy> SharedView for GlobalArg<'_, T> {
    fn shared_range(&self) -> Option<HostRange> {
        None
    }
}
