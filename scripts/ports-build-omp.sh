#!/usr/bin/env bash
# Builds the OpenMP originals of the ports bench (examples/ports/README.md) with clang-22 for
# sm_90, here, into .omp22/bin/<name>-omp, for scripts/gpu/ports.sh to run on the GPU machine
# (which has no OpenMP offload compiler):
#   scripts/ports-build-omp.sh ORIGINALS [NAME...]     # ORIGINALS holds jacobi-omp, laplace-omp, ace-omp, ...
# Builds the toolchain first when .omp22/cxx is missing (../shared/omp22/build.sh, minutes).
# Plain builds (no device LTO), as users get by default.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
orig=$(realpath "${1:?usage: scripts/ports-build-omp.sh ORIGINALS [NAME...]}")
shift
. "$root/scripts/ports-prepare.sh"
names=("$@"); [ ${#names[@]} -gt 0 ] || names=("${PORTS_PROGRAMS[@]}")
T=$root/.omp22
[ -x "$T/cxx" ] || "$root/../shared/omp22/build.sh" "$T"
mkdir -p "$T/bin" "$T/ports-src"
for p in "${names[@]}"; do
  src=$T/ports-src/$p-omp
  ports_prepare "$orig" "$p-omp" "$src"
  # laplace-omp includes laplace-cuda's reference.h (its Makefile's -I../laplace-cuda)
  inc=(); [ -d "$orig/$p-cuda" ] && inc=(-I"$orig/$p-cuda")
  main=$src/main.cpp
  echo "building $p-omp: .omp22/cxx -std=c++17 ${main#$root/} -o .omp22/bin/$p-omp"
  "$T/cxx" -std=c++17 -I"$src" "${inc[@]}" "$main" -o "$T/bin/$p-omp" -lm
done
ls -la "$T/bin"
