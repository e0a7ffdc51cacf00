//! The test bed: runs each test on every device of every backend present.
//!
//! Host devices are always there (two of them, so that multi-device cases run in CI);
//! GPU backends join when the machine has GPUs. A case that needs more devices than a
//! backend has is skipped with a printed reason (see [`skip_for_devices`]); with
//! `OFFLOAD_REQUIRE_DEVICES=N` such a skip fails instead when the backend has fewer than
//! `N` devices, and so does a missing GPU backend, so that a machine that should have
//! devices cannot pass by skipping.

use std::ffi::OsStr;
use std::sync::OnceLock;

use offload::{Error, HostRange, Result, Runtime, RuntimeBuilder};

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

pub mod every_step;

fn host_builder() -> RuntimeBuilder {
    Runtime::builder()
        .env(|_| None)
        .gpus(false)
        .host_devices(HOST_DEVICES)
        .host_device_memory(4 << 30)
        .synchronous(synchronous())
}

fn gpu_builder() -> RuntimeBuilder {
    Runtime::builder().env(|_| None).gpus(true).host_devices(0).synchronous(synchronous())
}

/// Whether the suite runs with every construct waiting for its work: `OFFLOAD_SYNC=1` in
/// the process environment (the one variable the test runtimes take from it, so that the
/// whole suite can run in both modes). Anything but `1`, `0` or unset fails the case.
pub fn synchronous() -> bool {
    match std::env::var("OFFLOAD_SYNC").as_deref() {
        Err(_) | Ok("0") => false,
        Ok("1") => true,
        Ok(other) => panic!("OFFLOAD_SYNC={other:?} is not valid: expected 1 or 0"),
    }
}

/// The variable that says how many devices every backend must have (unset: none).
pub const REQUIRE_DEVICES: &str = "OFFLOAD_REQUIRE_DEVICES";

/// The value of [`REQUIRE_DEVICES`] given its raw text: unset is 0; anything but a decimal
/// count is an error naming the variable.
pub fn parse_required_devices(value: Option<&OsStr>) -> std::result::Result<usize, String> {
    let Some(raw) = value else { return Ok(0) };
    raw.to_str().and_then(|v| v.trim().parse::<usize>().ok()).ok_or_else(|| {
        format!("{REQUIRE_DEVICES}={raw:?} is not valid: expected a number of devices, e.g. 2")
    })
}

/// [`REQUIRE_DEVICES`] of this process; a bad value fails every case that asks.
pub fn required_devices() -> usize {
    static REQUIRED: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    match REQUIRED.get_or_init(|| parse_required_devices(std::env::var_os(REQUIRE_DEVICES).as_deref())) {
        Ok(n) => *n,
        Err(e) => panic!("{e}"),
    }
}

/// Whether a skip is allowed: `Ok` with the line to print, or `Err` with why it must fail
/// instead: `required` devices of every backend were asked for and `backend` has `has`.
pub fn skip_verdict(
    required: usize,
    backend: &str,
    has: usize,
    reason: &str,
) -> std::result::Result<String, String> {
    if has < required {
        Err(format!(
            "not skipping: {reason}, but {REQUIRE_DEVICES}={required} requires {required} devices of every backend and {backend} has {has}"
        ))
    } else {
        Ok(format!("SKIP {reason}"))
    }
}

/// The one way a case is skipped for lack of devices: prints why, or panics when
/// [`REQUIRE_DEVICES`] asks for more devices than `backend` has (`has`).
pub fn skip_for_devices(backend: &str, has: usize, reason: &str) {
    match skip_verdict(required_devices(), backend, has, reason) {
        Ok(line) => println!("{line}"),
        Err(e) => panic!("{e}"),
    }
}

/// Whether this machine has GPUs the runtime can use; `Err` says why not.
fn gpus_present() -> &'static std::result::Result<(), String> {
    static PRESENT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PRESENT.get_or_init(|| match gpu_builder().build() {
        Ok(rt) if rt.num_devices() > 0 => Ok(()),
        Ok(rt) => Err(rt.device_report().trim_end().replace('\n', "; ")),
        Err(e) => Err(e.to_string()),
    })
}

/// Every backend present on this machine: host devices always, GPUs when there are any
/// (their absence is a skip, see [`skip_for_devices`]).
pub fn backends() -> Vec<BackendUnderTest> {
    let mut v = vec![BackendUnderTest { name: "host", make: host_builder }];
    match gpus_present() {
        Ok(()) => v.push(BackendUnderTest { name: "gpu", make: gpu_builder }),
        Err(why) => skip_for_devices("gpu", 0, &format!("gpu backends: {why}")),
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

/// `normal`, or `under_faults` when the suite runs every case once per device operation with
/// that operation failing (`OFFLOAD_TEST_FAULTS=1`, [`every_step`]): there a case runs up to
/// a few hundred times, and more threads, rounds or elements repeat the same failures
/// rather than adding new ones.
pub fn sized<T>(normal: T, under_faults: T) -> T {
    if every_step::faults_mode() {
        under_faults
    } else {
        normal
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
    if every_step::faults_mode() {
        // Device 0 only: the host devices are alike, and faults are injected on each.
        let r = every_step::every_step_fails_once(what, &configure, |rt| case(rt, 0));
        run_case(what, "host", Some(0), r.map(drop));
        return;
    }
    for b in backends() {
        let rt = configure(b.builder()).build().unwrap_or_else(|e| panic!("[{}] start: {e}", b.name));
        if rt.num_devices() == 0 {
            skip_for_devices(b.name, 0, &format!("{what} on {}: this backend has no devices", b.name));
        }
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
    if every_step::faults_mode() {
        let devices = configure(host_builder()).build().map(|rt| rt.num_devices()).unwrap_or(0);
        if devices < min_devices {
            println!("SKIP {what}: needs {min_devices} devices, the fault runs have {devices}");
            return;
        }
        run_case(what, "host", None, every_step::every_step_fails_once(what, &configure, &case).map(drop));
        return;
    }
    for b in backends() {
        let rt = configure(b.builder()).build().unwrap_or_else(|e| panic!("[{}] start: {e}", b.name));
        if rt.num_devices() < min_devices {
            let reason = format!(
                "{what} on {}: needs {min_devices} devices, this backend has {}",
                b.name,
                rt.num_devices()
            );
            skip_for_devices(b.name, rt.num_devices(), &reason);
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
        name: None,
    })?;
    read_device(rt, addr, host.len(), device)
}

/// The cause of `e` ([`Error::cause`]): the device's own failure beneath the construct
/// that reports it, whether the construct waited for it ([`Error::Construct`]) or a later
/// synchronising call found it ([`Error::Queued`]). For cases that check what failed.
pub fn cause(e: Error) -> Error {
    e.cause().clone()
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

/// Ends every live mapping of every device, whatever its counts: `exit data` with
/// `delete`, or `disassociate_ptr` for an associated range (whose device memory stays the
/// caller's). For clean-ups after a case that stopped half way.
pub fn unmap_everything(rt: &Runtime) -> Result<()> {
    for (dev, e) in rt.live_mappings() {
        // SAFETY: delete copies nothing and no kernel runs; the host memory may be gone,
        // but only its address is used.
        unsafe {
            if e.associated {
                rt.disassociate_ptr(e.range.begin, dev)?;
            } else {
                rt.exit_data(dev, &[offload::MapItem::delete(e.range.begin as *const u8, e.range.bytes)])?;
            }
        }
    }
    Ok(())
}

/// A runtime of one host device failing operations as `plan` says (the fault-injection
/// tests'), synchronous (every construct waits) or queued.
pub fn faulty_runtime(plan: offload::backend::FaultPlan, synchronous: bool) -> Result<Runtime> {
    Runtime::builder()
        .env(|_| None)
        .gpus(false)
        .host_devices(1)
        .synchronous(synchronous)
        .inject_faults(plan)
        .build()
}

/// Compiles each kernel's CUDA source with NVRTC for `sm_80` and `sm_90` (and its variant with
/// 32-bit index arithmetic, where it has one), and its HIP source
/// (where it has one of its own) with the HIP shuffle it uses spelled in CUDA (no hiprtc
/// here: this checks everything but HIP's own headers), and fails naming every kernel that
/// does not compile (with its source). Without `libnvrtc` it says so and returns, unless
/// `OFFLOAD_NVRTC_REQUIRED=1` (as `scripts/nvrtc-check.sh` sets), when it fails instead.
pub fn compile_with_nvrtc(what: &str, kernels: &[&offload::Kernel]) {
    let required = std::env::var("OFFLOAD_NVRTC_REQUIRED").is_ok_and(|v| v == "1");
    if !offload::backend::nvrtc_present() {
        assert!(!required, "OFFLOAD_NVRTC_REQUIRED=1 but libnvrtc cannot be loaded");
        println!("SKIP nvrtc: libnvrtc not found");
        return;
    }
    let mut failures = Vec::new();
    // Each kernel's variant with 32-bit index arithmetic, where it has one, as well.
    let narrow: Vec<&offload::Kernel> = kernels.iter().filter_map(|k| k.narrow_variant()).collect();
    let kernels: Vec<&offload::Kernel> = kernels.iter().copied().chain(narrow).collect();
    for k in &kernels {
        for arch in ["sm_80", "sm_90"] {
            if let Err(e) = offload::backend::compile_cuda(k, arch) {
                failures.push(format!(
                    "`{}` (CUDA) for {arch}: {e}\n{}",
                    k.symbol(),
                    k.cuda_source().unwrap_or("")
                ));
            }
            if let Err(e) = offload::backend::compile_hip_with_nvrtc(k, arch) {
                let hip = k.hip_source().unwrap_or_default();
                failures.push(format!("`{}` (HIP) for {arch}: {e}\n{hip}", k.symbol()));
            }
        }
    }
    assert!(failures.is_empty(), "NVRTC failed:\n{}", failures.join("\n\n"));
    println!("nvrtc: {} {what} compiled for sm_80 and sm_90, as CUDA and as HIP", kernels.len());
}

/// `n` deterministic values in `[-0.5, 0.5)` from `seed` (xorshift): operands for the GEMM
/// and layer tests, the same on every run and machine.
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// `act` of `v` in f64 (GELU in its tanh form, as the GEMMs' epilogue computes it): the
/// references of the GEMM and layer tests.
pub fn activation_f64(act: offload::Activation, v: f64) -> f64 {
    match act {
        offload::Activation::Identity => v,
        offload::Activation::Relu => v.max(0.0),
        offload::Activation::Gelu => {
            0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
        }
        offload::Activation::GeluExact => 0.5 * v * (1.0 + offload::erf(v * std::f64::consts::FRAC_1_SQRT_2)),
    }
}

/// Runs `f(t)` on `n` threads at once; the first failure, naming its thread.
pub fn run_threads(n: usize, f: impl Fn(usize) -> offload::Result<()> + Sync) -> offload::Result<()> {
    let results: Vec<offload::Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                let f = &f;
                s.spawn(move || f(t))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(offload::Error::InvalidArgument {
                        routine: "thread",
                        what: "a test thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    for (t, r) in results.into_iter().enumerate() {
        r.map_err(|e| offload::Error::InvalidArgument {
            routine: "thread",
            what: format!("thread {t}: {e}"),
        })?;
    }
    Ok(())
}

fn nap(l: &offload::HostLaunch<'_>) -> std::result::Result<(), String> {
    std::thread::sleep(std::time::Duration::from_millis(l.scalar::<u64>(0)?));
    Ok(())
}

/// Keeps a host device's queue busy for the milliseconds it is given (argument 0, `u64`):
/// work queued after it runs after the host has gone on. Host devices only (the CUDA case
/// is `tests/stream_order.rs`'s `SPIN`).
pub static NAP: offload::Kernel = offload::Kernel::new("nap_ms").with_host(nap);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_required_count_parses_and_a_bad_value_is_an_error() {
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(parse_required_devices(None), Ok(0));
        assert_eq!(parse_required_devices(Some(OsStr::new("2"))), Ok(2));
        assert_eq!(parse_required_devices(Some(OsStr::new(" 8 "))), Ok(8));
        for bad in [OsStr::new(""), OsStr::new("two"), OsStr::new("-1"), OsStr::from_bytes(&[b'1', 0xff])] {
            let e = parse_required_devices(Some(bad)).unwrap_err();
            assert!(e.contains(REQUIRE_DEVICES) && e.contains("number of devices"), "{e}");
        }
    }

    #[test]
    fn a_skip_fails_when_the_backend_has_fewer_devices_than_required() {
        assert_eq!(skip_verdict(0, "gpu", 0, "why").as_deref(), Ok("SKIP why"));
        // The case needs more than the backend has, but the backend has what was promised.
        assert_eq!(skip_verdict(2, "host", 2, "needs 3").as_deref(), Ok("SKIP needs 3"));
        let e = skip_verdict(1, "gpu", 0, "gpu backends: none found").unwrap_err();
        assert!(e.contains("gpu backends: none found") && e.contains("OFFLOAD_REQUIRE_DEVICES=1"), "{e}");
        let e = skip_verdict(2, "gpu", 1, "case on gpu: needs 2 devices").unwrap_err();
        assert!(e.contains("gpu has 1") && e.contains("requires 2 devices"), "{e}");
    }
}
