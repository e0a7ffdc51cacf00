#!/usr/bin/env bash
# The criterion benches on the lent GPU machine, after ../shared/gpu/bundle, in one call:
#   scripts/gpu/benches.sh [mapping cuda_paths transfer kernels overlap]   (default: all)
# Each bench prints its table of docs/PERFORMANCE.md after criterion's own report; the whole output of
# each goes to $OUT/bench-NAME.log (transfer runs with TRANSFER_QUICK=1: no chunk sweep).
cd "$(dirname "$0")/../.."
set -o pipefail
nvidia-smi -L
for b in "${@:-mapping cuda_paths transfer kernels overlap}"; do
  for name in $b; do
    echo "== $name"
    TRANSFER_QUICK=1 timeout 300 ".gpu/benches/$name" --bench > "$OUT/bench-$name.log" 2>&1
    echo "exit $?"
    # The tables: every markdown row, and the lines the benches print around them.
    grep -E '^\||GB/s|pipeline|memcpy|Jacobi|one GPU|host:|cuda:' "$OUT/bench-$name.log" | grep -v '^Benchmarking' | tail -60
  done
done
