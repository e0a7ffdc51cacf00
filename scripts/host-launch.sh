#!/usr/bin/env bash
# What one launch costs on a host device, beside libomptarget's host plugin: compiles the C
# twin (benches/c/host_launch.c) with clang-19 -O2 and OpenMP offloading to the host, runs
# it, then runs benches/host_launch.rs (criterion) on one host device. Both print medians
# per launch of a saxpy over n = 1, 1024 and 65536 floats already mapped; docs/PERFORMANCE.md's
# "Host devices: launch cost" table comes from them. Arguments go to the C twin (launches
# per sample, default 2000).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/llvm19.sh
. scripts/llvm19.sh
install_llvm19
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
clang-19 -O2 -fopenmp -fopenmp-targets=x86_64-unknown-linux-gnu -Wall -Werror \
  -o "$work/host_launch" benches/c/host_launch.c
echo "== libomptarget 19, host plugin ($(nproc) cores)"
LD_LIBRARY_PATH=$LLVM19_LIB OMP_TARGET_OFFLOAD=mandatory "$work/host_launch" "$@"
echo "== offload, one host device"
cargo bench -q -p offload-benches --bench host_launch 2>/dev/null | sed -n '/^host device/,$p'
