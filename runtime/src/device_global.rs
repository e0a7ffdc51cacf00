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
//! device the variable is the host copy itself.
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

use crate::data_env::UpdateDirection;
use crate::error::{HostRange, Result};
use crate::kernel::{DeviceCopy, Kernel, LaunchArg};
use crate::mapping::{Device, KernelArgument, SharedView};

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

    /// A global whose host copy starts as `value`.
    pub const fn new(value: T) -> Self {
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
    fn device_copy(&self, device: &Device<'_>, _host: &MutexGuard<'_, T>) -> Result<u64> {
        let (rt, d) = (device.runtime(), device.number());
        let host = self.host_ptr() as usize;
        if d == rt.initial_device() {
            return Ok(host as u64);
        }
        if let Some(addr) = rt.mapped_ptr(host, d)? {
            return Ok(addr);
        }
        let addr = rt.target_alloc(Self::BYTES.max(1), d)?;
        let init = rt.initial_device();
        // SAFETY: `addr` holds `BYTES` fresh bytes of `d`; the host copy is locked by the
        // caller, so nothing writes it meanwhile. The allocation is never freed, so the
        // association (made while the lock is still held, so once per device) stays valid
        // for the runtime's lifetime.
        let made = unsafe {
            rt.target_memcpy(addr, host as u64, Self::BYTES, 0, 0, d, init)
                .and_then(|()| rt.associate_ptr(host, addr, Self::BYTES.max(1), 0, d))
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
    pub fn device_addr(&self, device: &Device<'_>) -> Result<u64> {
        let host = self.host.lock();
        self.device_copy(device, &host)
    }

    /// The global as a kernel argument on `device`. On the initial device it holds the
    /// host lock until dropped (the kernel then writes the host copy itself), so
    /// [`DeviceGlobal::host`] must not be called on this thread meanwhile.
    pub fn arg<'g>(&'g self, device: &Device<'_>) -> Result<GlobalArg<'g, T>> {
        let host = self.host.lock();
        let addr = self.device_copy(device, &host)?;
        let on_host = device.number() == device.runtime().initial_device();
        Ok(GlobalArg { device: device.number(), addr, _host: on_host.then_some(host) })
    }

    /// `#pragma omp target update to(x)`: the host copy into `device`'s copy.
    pub fn update_to(&self, device: &Device<'_>) -> Result<()> {
        self.update(device, UpdateDirection::To)
    }

    /// `#pragma omp target update from(x)`: `device`'s copy into the host copy.
    pub fn update_from(&self, device: &Device<'_>) -> Result<()> {
        self.update(device, UpdateDirection::From)
    }

    fn update(&self, device: &Device<'_>, dir: UpdateDirection) -> Result<()> {
        let host = self.host.lock();
        self.device_copy(device, &host)?;
        // SAFETY: the host copy is locked for the call; any bits are a valid `T`.
        unsafe { device.runtime().update(device.number(), dir, &[(self.range(), true)]) }
    }
}

/// A [`DeviceGlobal`] as a kernel argument on one device, from [`DeviceGlobal::arg`].
pub struct GlobalArg<'g, T> {
    device: usize,
    addr: u64,
    /// On the initial device: the host lock, held while the kernel may use the variable.
    _host: Option<MutexGuard<'g, T>>,
}

impl<T> std::fmt::Debug for GlobalArg<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalArg")
            .field("device", &self.device)
            .field("addr", &format_args!("{:#x}", self.addr))
            .finish()
    }
}

impl<T> KernelArgument for GlobalArg<'_, T> {
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

impl<T> SharedView for GlobalArg<'_, T> {
    fn shared_range(&self) -> Option<HostRange> {
        None
    }
}
