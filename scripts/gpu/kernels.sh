#!/usr/bin/env bash
# Single-source kernels on the lent GPU machine, after ../shared/gpu/bundle: the kernels
# bench (generated vs hand-written: fill, saxpy, sum at 256 MiB, Jacobi 16384^2 x 1000),
# the Jacobi example with each kernel, and compute-sanitizer memcheck on the tests of the
# generated kernels. Logs under $OUT.
cd "$(dirname "$0")/../.."
set -o pipefail
export OFFLOAD_REQUIRE_DEVICES=1
nvidia-smi -L
echo "== kernels bench"
timeout 300 .gpu/benches/kernels --bench 2>&1 | tee "$OUT/kernels.log" | tail -30
for k in generated tuned; do
  echo "== jacobi -kernel $k"
  timeout 120 .gpu/examples/jacobi -nx 16384 -ny 16384 -niter 1000 -kernel $k 2>&1 | tail -3 | tee -a "$OUT/jacobi-kernels.log"
done
echo "== compute-sanitizer memcheck"
for t in kernel_macro kernel_reduce ready_kernels; do
  timeout 150 compute-sanitizer --tool memcheck --leak-check full .gpu/tests/tests--test-$t > "$OUT/memcheck-$t.log" 2>&1
  echo "$t: exit $? | $(grep -E '^test result' "$OUT/memcheck-$t.log" | tail -1) | $(grep -E 'LEAK SUMMARY|ERROR SUMMARY' "$OUT/memcheck-$t.log" | tr '\n' ' ')"
done
