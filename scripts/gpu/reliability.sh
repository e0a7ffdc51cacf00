#!/usr/bin/env bash
# The reliability run on the lent H200 machine, after ../shared/gpu/bundle, in two calls
# (each under the 10-minute limit):
#   scripts/gpu/reliability.sh tests     # the whole suite with OFFLOAD_REQUIRE_DEVICES=1
#                                        # (a case that would skip for lack of a GPU fails),
#                                        # then the Jacobi main job and the overlap bench
#                                        # (nothing slowed down, stages still overlap)
#   scripts/gpu/reliability.sh memcheck  # compute-sanitizer memcheck (leak check on) on the
#                                        # conformance, nowait, unwind, bad-input and model
#                                        # tests; the bad-input tests once per test, since
#                                        # the omp one uses the process-wide runtime, which
#                                        # lives until exit
#   scripts/gpu/reliability.sh faults    # issue 25: the soak (normal and long), the pool
#                                        # limit's out-of-memory cases and the fault tests,
#                                        # queued and OFFLOAD_SYNC=1, then the soak and the
#                                        # out-of-memory cases under memcheck (leak check on)
# Logs go under $OUT (at most 8 files come back, so each step writes one).
cd "$(dirname "$0")/../.."
set -o pipefail
export OFFLOAD_REQUIRE_DEVICES=1
nvidia-smi -L
if [ "${1:-tests}" = faults ]; then
for sync in 0 1; do
  echo "== OFFLOAD_SYNC=$sync"
  for t in soak faults faults_every_step; do
    OFFLOAD_SYNC=$sync timeout 120 .gpu/tests/tests--test-$t --nocapture > /tmp/$t.log 2>&1
    echo "$t: exit $? | $(grep -E '^test result' /tmp/$t.log | tail -1)"
    grep -hE "soak:|panicked" /tmp/$t.log | head -5
    { echo "#### $t"; cat /tmp/$t.log; } >> "$OUT/faults-sync$sync.log"
  done
done
echo "== soak_long (queued)"
timeout 150 .gpu/tests/tests--test-soak --ignored --nocapture soak_long > "$OUT/soak-long.log" 2>&1
echo "soak_long: exit $? | $(grep -E '^test result|soak:' "$OUT/soak-long.log" | tr '\n' ' ')"
echo "== compute-sanitizer memcheck: the soak and the pool limit's out-of-memory cases"
for t in soak faults; do
  timeout 140 compute-sanitizer --tool memcheck --leak-check full .gpu/tests/tests--test-$t > "$OUT/memcheck-$t.log" 2>&1
  echo "$t: exit $? | $(grep -E '^test result' "$OUT/memcheck-$t.log" | tail -1) | $(grep -E 'LEAK SUMMARY|ERROR SUMMARY' "$OUT/memcheck-$t.log" | tr '\n' ' ')"
done
elif [ "${1:-tests}" = tests ]; then
echo "== tests (OFFLOAD_REQUIRE_DEVICES=1)"
pass=0; fail=0
for t in .gpu/tests/*; do
  [ -x "$t" ] || continue
  # Host-only: the proc-macro's unit tests link the toolchain's libstd, trybuild runs cargo.
  case "$t" in *macros--proc-macro-*|*compile_fail) echo "skip  $(basename "$t"): needs the Rust toolchain (runs in CI)"; continue ;; esac
  args=(); case "$t" in *model) args=(--nocapture) ;; esac  # its operation counts
  if out=$(timeout 300 "$t" "${args[@]}" 2>&1); then pass=$((pass+1)); s=ok; else fail=$((fail+1)); s=FAILED; fi
  { echo "#### $s $(basename "$t")"; echo "$out"; } >> "$OUT/tests.log"
  echo "$s  $(basename "$t"): $(echo "$out" | grep -E '^test result:' | tail -1)"
  [ "$s" = ok ] || echo "$out" | grep -E "panicked|failed|FAILED|Error" | head -20
done
echo "$pass passed, $fail failed"
grep -h "operations on" "$OUT/tests.log"
echo "== jacobi"
.gpu/examples/jacobi -nx 16384 -ny 16384 -niter 1000 2>&1 | tail -8 | tee "$OUT/jacobi.log"
echo "== overlap (the pipeline still overlaps its stages)"
timeout 200 .gpu/benches/overlap --bench 2>&1 | tail -12 | tee "$OUT/overlap.log"
else
echo "== compute-sanitizer memcheck"
check() { # name, executable, test-name filter
  timeout 130 compute-sanitizer --tool memcheck --leak-check full "$2" $3 > "$OUT/memcheck-$1.log" 2>&1
  echo "$1: exit $? | $(grep -E '^test result' "$OUT/memcheck-$1.log" | tail -1) | $(grep -E 'LEAK SUMMARY|ERROR SUMMARY' "$OUT/memcheck-$1.log" | tr '\n' ' ')"
  grep -E "Program hit" "$OUT/memcheck-$1.log" | sort | uniq -c
}
for t in conformance nowait unwind model; do
  check $t .gpu/tests/tests--test-$t
done
check bad_input-runtime .gpu/tests/tests--test-bad_input runtime_and_safe_api
check bad_input-omp .gpu/tests/tests--test-bad_input omp_api
fi
