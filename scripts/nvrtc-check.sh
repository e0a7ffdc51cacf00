#!/usr/bin/env bash
# Compiles every kernel's CUDA C source with NVRTC for sm_80 and sm_90 on a machine with no
# GPU (CI): fetches NVRTC 13.0 from PyPI (the wheel `nvidia-cuda-nvrtc`, which carries
# libnvrtc.so.13 and its builtins), points the loader at it, and runs the NVRTC tests of the
# hand-written kernels (kernels crate), of the generated ones (tests/) and of the runtime's
# compile step with OFFLOAD_NVRTC_REQUIRED=1, so a missing library, any compile error or a
# test that did not run fails.
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
# One cargo call over the workspace (its features, the binaries scripts/test.sh built): the
# NVRTC tests of the hand-written kernels, the generated ones and the runtime's own; then
# each must be seen passing (a filter that matched nothing would pass silently).
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --lib --test nvrtc --test kernel_macro --test kernel_language --test kernel_reduce \
  --test reduce --test half_floats --test nn --test gpt --test ready_kernels -- nvrtc every_kernel_compiles_for_sm_80_and_sm_90 2>&1 | tee "$log"
for t in every_kernel_compiles_for_sm_80_and_sm_90 every_generated_kernel_compiles_with_nvrtc \
  every_kernel_of_this_file_compiles_with_nvrtc every_reduction_kernel_compiles_with_nvrtc \
  every_half_float_kernel_compiles_with_nvrtc every_nn_kernel_compiles_with_nvrtc \
  every_gpt_kernel_compiles_with_nvrtc every_halo_kernel_compiles_with_nvrtc \
  every_reduce_kernel_compiles_with_nvrtc \
  backend::cuda::nvrtc::tests::nvrtc_gives_a_cubin_for_a_real_architecture_and_ptx_for_a_virtual_one; do
  grep -q "^test $t \.\.\. ok$" "$log" || { echo "nvrtc-check: $t did not run and pass" >&2; exit 1; }
done
echo "nvrtc-check: every kernel compiled for sm_80 and sm_90"
