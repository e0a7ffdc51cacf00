#!/usr/bin/env bash
# Compiles every kernel's CUDA C source with NVRTC for sm_80 and sm_90 on a machine with no
# GPU (CI): fetches NVRTC 13.0 from PyPI (the wheel `nvidia-cuda-nvrtc`, which carries
# libnvrtc.so.13 and its builtins), points the loader at it, and runs the NVRTC tests of the
# hand-written kernels (kernels crate) and of the generated ones (tests/kernel_macro.rs)
# with OFFLOAD_NVRTC_REQUIRED=1, so a missing library or any compile error fails.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
dir=target/nvrtc
lib="$dir/nvidia/cu13/lib"
if [ ! -f "$lib/libnvrtc.so.13" ]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-pip
  fi
  mkdir -p "$dir/wheel"
  python3 -m pip download -q --no-deps nvidia-cuda-nvrtc==13.0.88 -d "$dir/wheel"
  python3 -c "import glob, sys, zipfile; zipfile.ZipFile(glob.glob(sys.argv[1] + '/*.whl')[0]).extractall(sys.argv[2])" \
    "$dir/wheel" "$dir"
fi
export LD_LIBRARY_PATH="$PWD/$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OFFLOAD_NVRTC_REQUIRED=1
cargo test -p offload-kernels --test nvrtc -- --nocapture
# The kernels `#[offload::kernel]` generates in the tests.
cargo test -p offload-tests --test kernel_macro every_generated_kernel_compiles_with_nvrtc -- --nocapture
cargo test -p offload-tests --test kernel_language every_kernel_of_this_file_compiles_with_nvrtc -- --nocapture
cargo test -p offload-tests --test kernel_reduce every_reduction_kernel_compiles_with_nvrtc -- --nocapture
cargo test -p offload-tests --test reduce every_reduce_kernel_compiles_with_nvrtc -- --nocapture
# NVRTC straight to a cubin (the kernel cache's entries) for a real architecture.
cargo test -p offload --lib device::cuda::tests::nvrtc_gives_a_cubin -- --nocapture
