#!/usr/bin/env bash
# Issue 44 on the lent GPU machine, after ../shared/gpu/bundle -p offload-tests, in one call:
# the atomicity race tests (tests/atomic_constructs.rs: 4 threads x 2048 regions on one
# variable, four paths, queued and OFFLOAD_SYNC=1, on the host devices and the GPU) 30 times
# in a loop, the model test's many-thread programs 5 times, the captured-pointer, implicit-map and host-task
# tests, and
# then the whole suite queued and with OFFLOAD_SYNC=1 (OFFLOAD_REQUIRE_DEVICES=1: a case that
# would skip for lack of a GPU fails). Logs under $OUT.
#   carry: [".gpu"]; command: bash scripts/gpu/atomic.sh
# ATOMIC_RUNS (default 30) and SUITE_MODES (OFFLOAD_SYNC values, default "0 1") shorten it.
# A bundle over the 64 MiB a call carries can travel stripped and packed instead
# (strip .gpu/tests/*; tar -cf - .gpu | xz > .gpupack/gpu.tar.xz; carry [".gpupack"]).
cd "$(dirname "$0")/../.."
set -o pipefail
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
export OFFLOAD_REQUIRE_DEVICES=1
nvidia-smi -L
t=.gpu/tests
pass=0; fail=0
runs=${ATOMIC_RUNS:-30}
for i in $(seq "$runs"); do
  if $t/tests--test-atomic_constructs > /tmp/atomic.log 2>&1; then pass=$((pass+1)); else
    fail=$((fail+1)); cat /tmp/atomic.log >> "$OUT/atomic-failures.log"; fi
done
echo "atomic_constructs: $pass of $runs runs passed, $fail failed"
grep -E "^test result" /tmp/atomic.log
pass=0
for i in $(seq 5); do
  $t/tests--test-model many_threads --nocapture > /tmp/model.log 2>&1 && pass=$((pass+1))
done
echo "model many_threads: $pass of 5 runs passed"; grep -E "agree|panicked" /tmp/model.log | head -4
$t/tests--test-clauses captured implicit --nocapture 2>&1 | grep -E "^test |test result"
$t/tests--test-omp_api host_tasks --nocapture 2>&1 | grep -E "^test |test result|check failed"
for sync in ${SUITE_MODES:-0 1}; do
  echo "== whole suite, OFFLOAD_SYNC=$sync"
  OFFLOAD_SYNC=$sync OUT= bash .gpu/run-tests > "$OUT/suite-sync$sync.log" 2>&1
  echo "exit $?: $(tail -1 "$OUT/suite-sync$sync.log")"
  grep -E "^FAILED" -A3 "$OUT/suite-sync$sync.log" | head -30
done
