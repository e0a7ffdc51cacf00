//! The HIP runtime and hiprtc, loaded at run time as `cudarc` loads the CUDA driver: no
//! ROCm is needed to build the backend, and a machine without it has zero AMD devices, the
//! device report saying why. Every raw HIP call of the backend goes through [`HipApi`]'s
//! function pointers; beside them are the few C types and constants those calls take,
//! written from ROCm's `hip_runtime_api.h`. The one structure read, `hipDeviceProp_t`, is
//! read in its ROCm 5 layout, which ROCm 6 and later keep as `hipDeviceProp_tR0000` for
//! `hipGetDevicePropertiesR0000`; only three fields are read, at their offsets.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use libloading::Library;

/// `hipError_t`: 0 is success.
pub(crate) type HipError = c_int;
pub(crate) const HIP_SUCCESS: HipError = 0;
pub(crate) const HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED: HipError = 704;

/// `hipStream_t`, `hipEvent_t`, `hipModule_t`, `hipFunction_t`, `hiprtcProgram`: opaque.
pub(crate) type RawStream = *mut c_void;
pub(crate) type RawEvent = *mut c_void;
pub(crate) type RawModule = *mut c_void;
pub(crate) type RawFunction = *mut c_void;
pub(crate) type RawProgram = *mut c_void;

/// `hipMemcpyKind`.
pub(crate) type MemcpyKind = c_uint;
pub(crate) const HOST_TO_DEVICE: MemcpyKind = 1;
pub(crate) const DEVICE_TO_HOST: MemcpyKind = 2;
pub(crate) const DEVICE_TO_DEVICE: MemcpyKind = 3;

/// `hipStreamNonBlocking`, `hipEventDisableTiming`, `hipHostRegisterPortable`.
pub(crate) const STREAM_NON_BLOCKING: c_uint = 1;
pub(crate) const EVENT_DISABLE_TIMING: c_uint = 2;
pub(crate) const HOST_REGISTER_PORTABLE: c_uint = 1;

/// `hipDeviceProp_t` in its ROCm 5 (R0000) layout, as bytes: 792 of them, 8-aligned; room
/// is left past the end. The fields read and their offsets (`offsetof` against ROCm 5.2's
/// header; `tests::the_property_offsets_are_the_headers` checks them where it is installed).
#[repr(C, align(8))]
pub(crate) struct DeviceProps(pub(crate) [u8; 1024]);
pub(crate) const PROPS_SIZE: usize = 792;
const _: () = assert!(PROPS_SIZE <= std::mem::size_of::<DeviceProps>());
pub(crate) const PROP_NAME: usize = 0;
pub(crate) const PROP_MULTIPROCESSORS: usize = 336;
pub(crate) const PROP_THREADS_PER_MULTIPROCESSOR: usize = 344;
pub(crate) const PROP_ARCH_NAME: usize = 396;

impl DeviceProps {
    /// The C string of at most `len` bytes at `at`.
    pub(crate) fn text(&self, at: usize, len: usize) -> String {
        let bytes = &self.0[at..at + len];
        let end = bytes.iter().position(|&c| c == 0).unwrap_or(len);
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    /// The `int` at `at`.
    pub(crate) fn int(&self, at: usize) -> i32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.0[at..at + 4]);
        i32::from_ne_bytes(b)
    }
}

/// Declares [`HipApi`]: each function's C name and type, looked up in the library at load.
macro_rules! hip_functions {
    ($( $name:ident : fn($($arg:ty),* $(,)?) -> $ret:ty; )*) => {
        /// The HIP runtime's functions the backend calls, from `libamdhip64` (and hiprtc's
        /// from it or from `libhiprtc`, where ROCm 6 moved them). The libraries stay loaded
        /// as long as this value, which lives for the process ([`api`]).
        pub(crate) struct HipApi {
            $( pub(crate) $name: unsafe extern "C" fn($($arg),*) -> $ret, )*
            /// `hipGetDevicePropertiesR0000` (ROCm 6 and later) or, before it,
            /// `hipGetDeviceProperties`: both fill the ROCm 5 layout ([`DeviceProps`]).
            pub(crate) hipGetDeviceProperties: unsafe extern "C" fn(*mut DeviceProps, c_int) -> HipError,
            /// `hipDeviceGetUuid`, absent from older runtimes.
            pub(crate) hipDeviceGetUuid: Option<unsafe extern "C" fn(*mut [u8; 16], c_int) -> HipError>,
            _hip: Library,
            _rtc: Option<Library>,
        }

        impl HipApi {
            /// Looks every function up in `hip` (hiprtc's also in `rtc`).
            fn resolve(hip: Library, rtc: Option<Library>) -> Result<Self, String> {
                fn find<T: Copy>(libs: [Option<&Library>; 2], name: &str) -> Result<T, String> {
                    let symbol = format!("{name}\0");
                    for lib in libs.into_iter().flatten() {
                        // SAFETY: `T` is the function's C type as the header declares it;
                        // the pointer is kept only beside the library it came from.
                        if let Ok(f) = unsafe { lib.get::<T>(symbol.as_bytes()) } {
                            return Ok(*f);
                        }
                    }
                    Err(format!("the HIP runtime has no `{name}`"))
                }
                let libs = [Some(&hip), rtc.as_ref()];
                Ok(Self {
                    $( $name: find(libs, stringify!($name))?, )*
                    hipGetDeviceProperties: find(libs, "hipGetDevicePropertiesR0000")
                        .or_else(|_| find(libs, "hipGetDeviceProperties"))?,
                    hipDeviceGetUuid: find(libs, "hipDeviceGetUuid").ok(),
                    _hip: hip,
                    _rtc: rtc,
                })
            }
        }
    };
}

hip_functions! {
    hipGetErrorName: fn(HipError) -> *const c_char;
    hipGetDeviceCount: fn(*mut c_int) -> HipError;
    hipSetDevice: fn(c_int) -> HipError;
    hipDeviceGetPCIBusId: fn(*mut c_char, c_int, c_int) -> HipError;
    hipDeviceCanAccessPeer: fn(*mut c_int, c_int, c_int) -> HipError;
    hipDeviceEnablePeerAccess: fn(c_int, c_uint) -> HipError;
    hipDeviceSynchronize: fn() -> HipError;
    hipMemGetInfo: fn(*mut usize, *mut usize) -> HipError;
    hipMalloc: fn(*mut *mut c_void, usize) -> HipError;
    hipFree: fn(*mut c_void) -> HipError;
    hipHostRegister: fn(*mut c_void, usize, c_uint) -> HipError;
    hipHostUnregister: fn(*mut c_void) -> HipError;
    hipMemcpyAsync: fn(*mut c_void, *const c_void, usize, MemcpyKind, RawStream) -> HipError;
    hipMemcpyPeerAsync: fn(*mut c_void, c_int, *const c_void, c_int, usize, RawStream) -> HipError;
    hipMemsetD8Async: fn(*mut c_void, u8, usize, RawStream) -> HipError;
    hipStreamCreateWithFlags: fn(*mut RawStream, c_uint) -> HipError;
    hipStreamSynchronize: fn(RawStream) -> HipError;
    hipStreamDestroy: fn(RawStream) -> HipError;
    hipEventCreateWithFlags: fn(*mut RawEvent, c_uint) -> HipError;
    hipEventRecord: fn(RawEvent, RawStream) -> HipError;
    hipEventSynchronize: fn(RawEvent) -> HipError;
    hipEventDestroy: fn(RawEvent) -> HipError;
    hipModuleLoadData: fn(*mut RawModule, *const c_void) -> HipError;
    hipModuleGetFunction: fn(*mut RawFunction, RawModule, *const c_char) -> HipError;
    hipModuleLaunchKernel: fn(
        RawFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, RawStream,
        *mut *mut c_void, *mut *mut c_void,
    ) -> HipError;
    hiprtcCreateProgram: fn(
        *mut RawProgram, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char,
    ) -> c_int;
    hiprtcCompileProgram: fn(RawProgram, c_int, *const *const c_char) -> c_int;
    hiprtcGetProgramLogSize: fn(RawProgram, *mut usize) -> c_int;
    hiprtcGetProgramLog: fn(RawProgram, *mut c_char) -> c_int;
    hiprtcGetCodeSize: fn(RawProgram, *mut usize) -> c_int;
    hiprtcGetCode: fn(RawProgram, *mut c_char) -> c_int;
    hiprtcDestroyProgram: fn(*mut RawProgram) -> c_int;
}

/// Where the HIP runtime is looked for: the loader's path first, then ROCm's usual home
/// (`$ROCM_PATH`, `/opt/rocm`); each major version ROCm 5 to 7 ships.
const HIP_LIBRARIES: &[&str] =
    &["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"];
const RTC_LIBRARIES: &[&str] = &["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6"];

/// The first of `names` that loads, from the loader's path or from `dirs`; else why not.
fn open_first(names: &[&str], dirs: &[String]) -> Result<Library, String> {
    let in_dirs = dirs.iter().flat_map(|d| names.iter().map(move |n| format!("{d}/{n}")));
    for path in names.iter().map(|n| n.to_string()).chain(in_dirs) {
        // SAFETY: loading ROCm's runtime runs its initialisers, which are the vendor's and
        // expect no more than a process (they start no device work until called).
        if let Ok(lib) = unsafe { Library::new(&path) } {
            return Ok(lib);
        }
    }
    Err(format!("{} not found on the loader's path nor in {}", names.join(", "), dirs.join(", ")))
}

/// Loads the HIP runtime from `names` (hiprtc from the same library or `libhiprtc`).
fn load(names: &[&str]) -> Result<HipApi, String> {
    let dirs: Vec<String> = std::env::var("ROCM_PATH")
        .ok()
        .into_iter()
        .chain(["/opt/rocm".to_string()])
        .map(|root| format!("{root}/lib"))
        .collect();
    let hip = open_first(names, &dirs)?;
    // ROCm 5 keeps hiprtc in libamdhip64; ROCm 6 and later ship it apart.
    // SAFETY: a lookup of a plain C function's address.
    let rtc_inside = unsafe { hip.get::<unsafe extern "C" fn()>(b"hiprtcCreateProgram\0") }.is_ok();
    let rtc = if rtc_inside { None } else { open_first(RTC_LIBRARIES, &dirs).ok() };
    HipApi::resolve(hip, rtc)
}

/// The HIP runtime, loaded on first use; why it could not be (no ROCm: no AMD devices).
pub(crate) fn api() -> Result<&'static HipApi, &'static str> {
    static API: OnceLock<Result<HipApi, String>> = OnceLock::new();
    API.get_or_init(|| load(HIP_LIBRARIES)).as_ref().map_err(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_runtime_is_a_reason_not_a_failure() {
        let e = load(&["libofload-no-such-hip.so"]).err().unwrap_or_default();
        assert!(e.starts_with("libofload-no-such-hip.so not found") && e.ends_with("/opt/rocm/lib"), "{e}");
    }

    /// Where a HIP runtime can be opened (CI installs ROCm 5.2's), every function resolves
    /// and a query answers: a count, or "no device".
    #[test]
    fn an_installed_runtime_loads_with_every_function() {
        match api() {
            Ok(api) => {
                let mut n = -1;
                // SAFETY: a plain query with a valid out-pointer.
                let r = unsafe { (api.hipGetDeviceCount)(&mut n) };
                println!("hipGetDeviceCount: {r}, {n} devices");
                assert!(
                    r == HIP_SUCCESS && n >= 0 || r == crate::backend::hip::support::HIP_ERROR_NO_DEVICE,
                    "{r}"
                );
            }
            Err(why) => {
                println!("no HIP runtime here: {why}");
                assert!(open_first(HIP_LIBRARIES, &[]).is_err(), "a runtime opens but did not load: {why}");
            }
        }
    }

    /// The offsets above against the installed header, where one is (CI installs ROCm 5.2's).
    #[test]
    fn the_property_offsets_are_the_headers() {
        if !std::path::Path::new("/usr/include/hip/hip_runtime_api.h").exists() {
            println!("SKIP: no HIP header to check the offsets against");
            return;
        }
        let dir = std::env::temp_dir().join(format!("offload-hip-props-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let c = dir.join("props.c");
        std::fs::write(
            &c,
            "#define __HIP_PLATFORM_AMD__ 1\n#include <hip/hip_runtime_api.h>\n#include <stdio.h>\n\
             #include <stddef.h>\nint main(void) { printf(\"%zu %zu %zu %zu %zu %d %d\", \
             sizeof(hipDeviceProp_t), offsetof(hipDeviceProp_t, name), \
             offsetof(hipDeviceProp_t, multiProcessorCount), \
             offsetof(hipDeviceProp_t, maxThreadsPerMultiProcessor), \
             offsetof(hipDeviceProp_t, gcnArchName), (int)hipErrorPeerAccessAlreadyEnabled, \
             (int)hipMemcpyDeviceToDevice); return 0; }\n",
        )
        .expect("write");
        let exe = dir.join("props");
        let built = std::process::Command::new("cc").arg(&c).arg("-o").arg(&exe).status();
        if !built.is_ok_and(|s| s.success()) {
            println!("SKIP: no C compiler to check the offsets with");
            return;
        }
        let out = std::process::Command::new(&exe).output().expect("run");
        let _ = std::fs::remove_dir_all(&dir);
        let ours = format!(
            "{PROPS_SIZE} {PROP_NAME} {PROP_MULTIPROCESSORS} {PROP_THREADS_PER_MULTIPROCESSOR} \
             {PROP_ARCH_NAME} {HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED} {DEVICE_TO_DEVICE}"
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), ours);
    }
}
