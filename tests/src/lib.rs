//! The test bed: runs each test on every device of every backend present.
//!
//! Host devices are always there (two of them, so that multi-device cases run in CI);
//! GPU backends join when the machine has GPUs. A case that needs more devices than a
//! backend has is skipped with a printed reason, never passed silently.

use std::sync::OnceLock;

use offload::{Error, HostRange, MapItem, MapType, Result, Runtime, RuntimeBuilder};

/// One backend to test, and how to build a runtime that holds only its devices.
#[derive(Clone, Copy, Debug)]
pub struct BackendUnderTest {
    /// Name printed with every case.
    pub name: &'static str,
    make: fn() -> RuntimeBuilder,
}

impl BackendUnderTest {
    /// A builder for a runtime with this backend's devices only, ignoring the process
    /// environment (tests set what they need).
    pub fn builder(&self) -> RuntimeBuilder {
        (self.make)()
    }

    /// A runtime with this backend's devices.
    pub fn runtime(&self) -> Runtime {
        self.builder().build().unwrap_or_else(|e| panic!("[{}] runtime failed to start: {e}", self.name))
    }
}

/// Host devices in every test runtime.
pub const HOST_DEVICES: usize = 2;

fn host_builder() -> RuntimeBuilder {
    Runtime::builder().env(|_| None).gpus(false).host_devices(HOST_DEVICES).host_device_memory(4 << 30)
}

fn gpu_builder() -> RuntimeBuilder {
    Runtime::builder().env(|_| None).gpus(true).host_devices(0)
}

/// Whether this machine has GPUs the runtime can use; says once why not.
fn gpus_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| match gpu_builder().build() {
        Ok(rt) if rt.num_devices() > 0 => true,
        Ok(rt) => {
            println!("SKIP gpu backends: {}", rt.device_report().trim_end().replace('\n', "; "));
            false
        }
        Err(e) => {
            println!("SKIP gpu backends: {e}");
            false
        }
    })
}

/// Every backend present on this machine: host devices always, GPUs when there are any.
pub fn backends() -> Vec<BackendUnderTest> {
    let mut v = vec![BackendUnderTest { name: "host", make: host_builder }];
    if gpus_present() {
        v.push(BackendUnderTest { name: "gpu", make: gpu_builder });
    }
    v
}

fn run_case(what: &str, backend: &str, device: Option<usize>, r: Result<()>) {
    if let Err(e) = r {
        match device {
            Some(d) => panic!("{what} failed on {backend} device {d}: {e}"),
            None => panic!("{what} failed on {backend}: {e}"),
        }
    }
}

/// Runs `case` on every device of every backend, each backend with a fresh runtime.
pub fn on_every_device(what: &str, case: impl Fn(&Runtime, usize) -> Result<()>) {
    on_every_device_with(what, |b| b, case)
}

/// As [`on_every_device`], with the runtime's builder adjusted by `configure`.
pub fn on_every_device_with(
    what: &str,
    configure: impl Fn(RuntimeBuilder) -> RuntimeBuilder,
    case: impl Fn(&Runtime, usize) -> Result<()>,
) {
    for b in backends() {
        let rt = configure(b.builder()).build().unwrap_or_else(|e| panic!("[{}] start: {e}", b.name));
        for d in 0..rt.num_devices() {
            run_case(what, b.name, Some(d), case(&rt, d));
        }
    }
}

/// Runs `case` once per backend that has at least `min_devices` devices; prints why a
/// backend was skipped.
pub fn on_every_backend(
    what: &str,
    min_devices: usize,
    configure: impl Fn(RuntimeBuilder) -> RuntimeBuilder,
    case: impl Fn(&Runtime) -> Result<()>,
) {
    for b in backends() {
        let rt = configure(b.builder()).build().unwrap_or_else(|e| panic!("[{}] start: {e}", b.name));
        if rt.num_devices() < min_devices {
            println!(
                "SKIP {what} on {}: needs {min_devices} devices, this backend has {}",
                b.name,
                rt.num_devices()
            );
            continue;
        }
        run_case(what, b.name, None, case(&rt));
    }
}

/// Asserts inside a case, returning an error (with the location) instead of panicking, so
/// that the harness names the backend and device.
#[macro_export]
macro_rules! check {
    ($cond:expr) => {
        if !$cond {
            return Err(offload::Error::InvalidArgument {
                routine: "check",
                what: format!("{}:{}: check failed: {}", file!(), line!(), stringify!($cond)),
            });
        }
    };
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(offload::Error::InvalidArgument {
                routine: "check",
                what: format!("{}:{}: {}", file!(), line!(), format!($($fmt)+)),
            });
        }
    };
}

/// Asserts two values are equal inside a case (see [`check!`]).
#[macro_export]
macro_rules! check_eq {
    ($a:expr, $b:expr) => {{
        let (a, b) = (&$a, &$b);
        $crate::check!(a == b, "{} == {} failed: {:?} != {:?}", stringify!($a), stringify!($b), a, b);
    }};
}

/// Reads `n` values of `T` at device address `addr` of `device` into a vector.
pub fn read_device<T: offload::DeviceCopy + Default>(
    rt: &Runtime,
    addr: u64,
    n: usize,
    device: usize,
) -> Result<Vec<T>> {
    let mut v = vec![T::default(); n];
    let bytes = std::mem::size_of_val(&v[..]);
    // SAFETY: `v` holds `bytes` bytes; the caller names device memory of that size.
    unsafe { rt.target_memcpy(v.as_mut_ptr() as u64, addr, bytes, 0, 0, rt.initial_device(), device)? };
    Ok(v)
}

/// Reads the device copy of host range `host` on `device` (through the present table),
/// without changing any count.
pub fn device_copy_of<T: offload::DeviceCopy + Default>(
    rt: &Runtime,
    host: &[T],
    device: usize,
) -> Result<Vec<T>> {
    let addr = rt.mapped_ptr(host.as_ptr() as usize, device)?.ok_or(offload::Error::NotPresent {
        device,
        range: offload::HostRange::of(host),
        what: "device_copy_of",
    })?;
    read_device(rt, addr, host.len(), device)
}

/// Asserts that the device has no mapping left and no allocation beyond `expected_live`.
pub fn assert_clean(rt: &Runtime, device: usize) -> Result<()> {
    let live: Vec<_> = rt.live_mappings().into_iter().filter(|(d, _)| *d == device).collect();
    check!(live.is_empty(), "device {device} still has mappings: {live:?}");
    let usage = rt.pool_usage(device)?;
    check!(usage.live_allocations == 0, "device {device} leaked {} allocations", usage.live_allocations);
    Ok(())
}

/// The error of `r`; a check failure naming `what` when `r` succeeded.
pub fn fails<T: std::fmt::Debug>(r: Result<T>, what: &str) -> Result<Error> {
    match r {
        Ok(v) => Err(Error::InvalidArgument {
            routine: "check",
            what: format!("{what}: expected an error, got Ok({v:?})"),
        }),
        Err(e) => Ok(e),
    }
}

/// A map item over a slice the runtime may write into (`from` kinds): the pointer comes
/// from an exclusive borrow.
pub fn mut_item<T>(s: &mut [T], t: MapType) -> MapItem {
    MapItem::raw(s.as_mut_ptr(), std::mem::size_of_val(s), t)
}

/// The host range of a slice the runtime may write into (`update from`).
pub fn mut_range<T>(s: &mut [T]) -> HostRange {
    HostRange::new(s.as_mut_ptr() as usize, std::mem::size_of_val(s))
}

/// Writes `host` to device address `dst` of `device`.
pub fn write_device(rt: &Runtime, dst: u64, host: &[i32], device: usize) -> Result<()> {
    let bytes = std::mem::size_of_val(host);
    // SAFETY: `host` is readable for `bytes`; the caller names device memory of that size.
    unsafe { rt.target_memcpy(dst, host.as_ptr() as u64, bytes, 0, 0, device, rt.initial_device()) }
}

/// Sets every element of the device copy of `x` to `v` with a launch that maps nothing (so
/// `x` must already be mapped on `device`).
pub fn fill_device(rt: &Runtime, device: usize, x: &[i32], v: i32) -> Result<()> {
    use offload::{LaunchArg, Scalar};
    // SAFETY: no map list; `x` is translated through the present table (the launch fails
    // when it is not mapped), and the kernel writes x.len() i32 of its device copy.
    unsafe {
        rt.target_launch(
            device,
            &offload_kernels::FILL_I32,
            x.len(),
            &[],
            &[LaunchArg::Value(Scalar::I32(v)), LaunchArg::mapped(x.as_ptr())],
        )
    }
}
