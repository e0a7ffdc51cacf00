#!/usr/bin/env bash
# Installs what building and testing offload needs on a fresh Debian/Ubuntu machine:
# a C toolchain and pkg-config, hwloc and udev headers (topology), and a Rust toolchain
# (rustup) when cargo is missing. Source it (`. scripts/setup.sh`) to keep cargo on PATH.
# With `--mpi`, also Open MPI and libclang (bindgen) for feature `mpi`.
# With `--nccl`, NCCL's library for the NCCL halo engine (OFFLOAD_HALO=nccl), taken from
# the nvidia-nccl-cu13 wheel into $NCCL_HOME (default ~/.local/offload-nccl) with the
# libnccl.so link that cudarc loads; it prints the LD_LIBRARY_PATH line to use. (A machine
# with PyTorch has the library already: scripts/gpu/nccl-lib.sh links that one.)
set -euo pipefail
need=(build-essential pkg-config libhwloc-dev libudev-dev curl ca-certificates)
if [ "${1:-}" = "--mpi" ]; then need+=(libopenmpi-dev openmpi-bin libclang-dev); fi
if [ "${1:-}" = "--nccl" ]; then need+=(python3-pip unzip); fi
missing=()
for p in "${need[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  if [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy
  fi
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if [ "${1:-}" = "--nccl" ]; then
  home="${NCCL_HOME:-$HOME/.local/offload-nccl}"
  mkdir -p "$home/wheel" "$home/lib"
  python3 -m pip download -q --no-deps -d "$home/wheel" nvidia-nccl-cu13
  unzip -q -o "$home"/wheel/nvidia_nccl_cu13-*.whl -d "$home/wheel/x"
  lib=$(find "$home/wheel/x" -name 'libnccl.so*' | head -1)
  cp -f "$lib" "$home/lib/"
  ln -sf "$(basename "$lib")" "$home/lib/libnccl.so"
  echo "NCCL: $(basename "$lib") in $home/lib; use it with: export LD_LIBRARY_PATH=$home/lib:\${LD_LIBRARY_PATH:-}"
fi
