//! Kernels compiled by NVRTC straight to a cubin for a device's architecture (so the
//! driver has no PTX to JIT), kept on disk per machine ([`crate::kernel_cache`]) under
//! NVRTC's version; NVRTC is loaded at run time, and a machine without it compiles nothing
//! (the error says so).

use std::ffi::CString;
use std::sync::OnceLock;

use cudarc::nvrtc::{CompileOptions, Ptx};

use crate::error::{Error, Result};
use crate::kernel_cache::{self, KernelSpec};

/// A kernel's code for one architecture: a cubin (or, where NVRTC made none, PTX), and
/// whether it came from the disk cache rather than from NVRTC in this process.
#[derive(Clone, Debug)]
pub(super) struct Compiled {
    pub(super) code: Ptx,
    pub(super) from_disk: bool,
}

/// The error for a kernel when NVRTC cannot be loaded, `None` when it can.
pub(super) fn nvrtc_missing(device: usize, name: &str) -> Option<Error> {
    // SAFETY: only probes whether the library can be loaded.
    let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    (!present).then(|| Error::Driver {
        device,
        call: "nvrtcCompileProgram",
        message: format!("NVRTC library not found: cannot compile kernel `{name}`"),
    })
}

/// The PTX of kernel `name` for `arch` (what [`crate::backend::compile_cuda`] checks).
pub(crate) fn compile(device: usize, name: &'static str, src: &str, arch: &'static str) -> Result<Ptx> {
    if let Some(e) = nvrtc_missing(device, name) {
        return Err(e);
    }
    let opts = CompileOptions { arch: Some(arch), name: Some(format!("{name}.cu")), ..Default::default() };
    cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| Error::Driver {
        device,
        call: "nvrtcCompileProgram",
        message: format!("kernel `{name}` for {arch}: {e}"),
    })
}

/// NVRTC's version, as a kernel cache key names the compiler; `None` if NVRTC cannot be
/// loaded or cannot say. The first call loads NVRTC for good (a large library: some 15 ms).
pub(super) fn nvrtc_version() -> Option<&'static str> {
    static VERSION: OnceLock<Option<String>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            if nvrtc_missing(0, "").is_some() {
                return None;
            }
            let (mut major, mut minor) = (0, 0);
            // SAFETY: two valid out-pointers; NVRTC can be loaded (checked above).
            unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }.result().ok()?;
            Some(format!("NVRTC {major}.{minor}"))
        })
        .as_deref()
}

/// The code of kernel `name` for `arch`: from the disk cache when `lookup` and it holds a
/// sound entry, else compiled by NVRTC to a cubin, which is then stored there.
pub(super) fn build(
    device: usize,
    name: &'static str,
    src: &str,
    arch: &'static str,
    lookup: bool,
) -> Result<Compiled> {
    let compiler = nvrtc_version();
    if compiler.is_none() {
        if let Some(e) = nvrtc_missing(device, name) {
            return Err(e);
        }
    }
    let options = [format!("--gpu-architecture={arch}")];
    // Without NVRTC's version there is no key, so no cache: compiled every time.
    let spec = compiler.map(|compiler| KernelSpec {
        backend: "cuda",
        compiler,
        arch,
        options: &options,
        name,
        source: src,
    });
    let key = spec.as_ref().map(kernel_cache::Key::new);
    if let (true, Some(spec), Some(key)) = (lookup, &spec, &key) {
        if let Some(cubin) = kernel_cache::fetch(device, spec, key) {
            return Ok(Compiled { code: Ptx::from_binary(cubin), from_disk: true });
        }
    }
    let code = match nvrtc(device, name, src, arch, &options)? {
        NvrtcOutput::Cubin(cubin) => {
            if let (Some(spec), Some(key)) = (&spec, &key) {
                kernel_cache::keep(device, spec, key, &cubin);
            }
            Ptx::from_binary(cubin)
        }
        NvrtcOutput::Ptx(ptx) => Ptx::from_src(ptx),
    };
    Ok(Compiled { code, from_disk: false })
}

/// What NVRTC made of a program.
#[derive(Debug)]
enum NvrtcOutput {
    /// Machine code for the architecture (a real one, `sm_XX`).
    Cubin(Vec<u8>),
    /// PTX, where NVRTC made no cubin (a virtual architecture, `compute_XX`).
    Ptx(String),
}

/// An NVRTC program, destroyed when dropped.
struct NvrtcProgram(cudarc::nvrtc::sys::nvrtcProgram);

impl Drop for NvrtcProgram {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed only here.
        let _ = unsafe { cudarc::nvrtc::result::destroy_program(self.0) };
    }
}

/// The text of a NUL-terminated C string in `raw` (the whole of it without a NUL).
fn c_text(raw: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles kernel `name` (source `src`) with NVRTC and `options`, and takes its cubin, or
/// its PTX where it made none. The caller checked that NVRTC is loaded.
fn nvrtc(device: usize, name: &str, src: &str, arch: &str, options: &[String]) -> Result<NvrtcOutput> {
    use cudarc::nvrtc::{result as nv, sys as nvs};
    let fail = |what: String| Error::Driver {
        device,
        call: "nvrtcCompileProgram",
        message: format!("kernel `{name}` for {arch}: {what}"),
    };
    let c_src = CString::new(src).map_err(|_| fail("the source has a NUL byte".into()))?;
    let c_name = CString::new(format!("{name}.cu")).map_err(|_| fail("the name has a NUL byte".into()))?;
    if options.iter().any(|o| o.contains('\0')) {
        return Err(fail("an option has a NUL byte".into()));
    }
    let prog = NvrtcProgram(nv::create_program(&c_src, Some(&c_name)).map_err(|e| fail(e.to_string()))?);
    // In this and each NVRTC call below, `prog.0` is a live program, destroyed only when
    // `prog` drops, and its source and name strings outlive it.
    // SAFETY: as just said; the options have no NUL byte (checked above).
    if let Err(e) = unsafe { nv::compile_program(prog.0, options) } {
        // SAFETY: as above.
        let log = unsafe { nv::get_program_log(prog.0) }.map(|l| c_text(&l)).unwrap_or_default();
        return Err(fail(format!("{e}\n{log}")));
    }
    let mut size = 0usize;
    // SAFETY: as above; `size` is a valid out-pointer.
    if unsafe { nvs::nvrtcGetCUBINSize(prog.0, &mut size) }.result().is_ok() && size > 0 {
        let mut cubin = vec![0u8; size];
        // SAFETY: as above; `cubin` has the `size` bytes NVRTC asked for.
        unsafe { nvs::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }
            .result()
            .map_err(|e| fail(format!("nvrtcGetCUBIN: {e}")))?;
        return Ok(NvrtcOutput::Cubin(cubin));
    }
    // SAFETY: as above.
    let ptx = unsafe { nv::get_ptx(prog.0) }.map_err(|e| fail(format!("nvrtcGetPTX: {e}")))?;
    Ok(NvrtcOutput::Ptx(c_text(&ptx)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "extern \"C\" __global__ void twice(float *x) { x[threadIdx.x] *= 2.0f; }";

    /// NVRTC compiles straight to a cubin (an ELF file) for a real architecture, to PTX
    /// for a virtual one, and a compile error carries the compiler's log. Needs libnvrtc
    /// (`scripts/nvrtc-check.sh` fetches it and sets `OFFLOAD_NVRTC_REQUIRED=1`), no GPU.
    #[test]
    fn nvrtc_gives_a_cubin_for_a_real_architecture_and_ptx_for_a_virtual_one() {
        if nvrtc_missing(0, "twice").is_some() {
            let required = std::env::var("OFFLOAD_NVRTC_REQUIRED").is_ok_and(|v| v == "1");
            assert!(!required, "OFFLOAD_NVRTC_REQUIRED=1 but libnvrtc cannot be loaded");
            println!("SKIP nvrtc: libnvrtc not found");
            return;
        }
        match nvrtc(0, "twice", SRC, "sm_90", &["--gpu-architecture=sm_90".into()]) {
            Ok(NvrtcOutput::Cubin(c)) => assert!(c.starts_with(b"\x7fELF"), "not an ELF file"),
            other => panic!("expected a cubin, got {other:?}"),
        }
        match nvrtc(0, "twice", SRC, "compute_90", &["--gpu-architecture=compute_90".into()]) {
            Ok(NvrtcOutput::Ptx(p)) => assert!(p.contains(".entry twice"), "{p}"),
            other => panic!("expected PTX, got {other:?}"),
        }
        let broken = "extern \"C\" __global__ void broken( { }";
        match nvrtc(0, "broken", broken, "sm_90", &["--gpu-architecture=sm_90".into()]) {
            Err(Error::Driver { call: "nvrtcCompileProgram", message, .. }) => {
                assert!(message.contains("broken") && message.contains("error"), "{message}")
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
        assert!(nvrtc_version().is_some_and(|v| v.starts_with("NVRTC ")));
    }
}
