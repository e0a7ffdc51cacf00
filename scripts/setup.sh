#!/usr/bin/env bash
# Installs what building and testing offload needs on a fresh Debian/Ubuntu machine:
# a C toolchain and pkg-config, hwloc and udev headers (topology), and a Rust toolchain
# (rustup) when cargo is missing. Source it (`. scripts/setup.sh`) to keep cargo on PATH.
# With `--mpi`, also Open MPI and libclang (bindgen) for feature `mpi`.
set -euo pipefail
need=(build-essential pkg-config libhwloc-dev libudev-dev curl ca-certificates)
if [ "${1:-}" = "--mpi" ]; then need+=(libopenmpi-dev openmpi-bin libclang-dev); fi
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
