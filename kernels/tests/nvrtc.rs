//! Every kernel's CUDA C source compiles with NVRTC for the architectures we run on, on a
//! machine with no GPU. Without `libnvrtc` on the loader's path the test says so and passes,
//! unless `OFFLOAD_NVRTC_REQUIRED=1` (set by `scripts/nvrtc-check.sh`, which fetches NVRTC
//! from PyPI), when it fails instead.

/// The architectures every kernel must compile for: Ampere (A100) and Hopper (H100/H200).
const ARCHES: [&str; 2] = ["sm_80", "sm_90"];

#[test]
fn every_kernel_compiles_for_sm_80_and_sm_90() {
    let required = match std::env::var("OFFLOAD_NVRTC_REQUIRED") {
        Ok(v) if v == "1" => true,
        Ok(v) if v.is_empty() || v == "0" => false,
        Ok(v) => panic!("OFFLOAD_NVRTC_REQUIRED={v:?}: expected 1 or 0"),
        Err(_) => false,
    };
    if !offload::backend::nvrtc_present() {
        assert!(!required, "OFFLOAD_NVRTC_REQUIRED=1 but libnvrtc cannot be loaded (LD_LIBRARY_PATH?)");
        println!("SKIP nvrtc: libnvrtc not found");
        return;
    }
    let mut failures = Vec::new();
    let mut compiled = 0;
    // Every kernel, and each generated one's variant with 32-bit index arithmetic.
    let generated = offload_kernels::generated::all();
    let narrow: Vec<&offload::Kernel> = generated.iter().filter_map(|k| k.narrow_variant()).collect();
    assert!(!narrow.is_empty(), "the generated kernels have narrow variants");
    for k in offload_kernels::all().into_iter().chain(generated).chain(narrow) {
        if k.cuda_source().is_none() {
            continue;
        }
        // As CUDA, and as the HIP source the HIP backend compiles (its own, or its CUDA
        // translated), HIP's shuffles spelled back in CUDA (no hiprtc here: everything but
        // HIP's own headers is checked).
        for arch in ARCHES {
            for (dialect, r) in [
                ("CUDA", offload::backend::compile_cuda(k, arch)),
                ("HIP", offload::backend::compile_hip_with_nvrtc(k, arch)),
            ] {
                match r {
                    Ok(bytes) => {
                        assert!(bytes > 0, "`{}` ({dialect}) for {arch}: empty PTX", k.name());
                        compiled += 1;
                    }
                    Err(e) => failures.push(format!("`{}` ({dialect}) for {arch}: {e}", k.name())),
                }
            }
        }
    }
    assert!(failures.is_empty(), "NVRTC failed:\n{}", failures.join("\n"));
    assert!(
        compiled >= 2 * (9 + 2 * 20),
        "only {compiled} compilations: a kernel lost its CUDA or HIP source?"
    );
    println!("nvrtc: {compiled} kernel compilations ({} arches) succeeded", ARCHES.len());
}
