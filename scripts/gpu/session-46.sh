#!/usr/bin/env bash
# Issue 46's kernel-language and timer work on the lent GPU, after
# ../shared/gpu/bundle -p offload-tests (stripped and packed into .gpupack/gpu.tar.xz), in
# one call: the whole suite once, queued, with OFFLOAD_REQUIRE_DEVICES=1 (a case that would
# skip for lack of a GPU fails): kernel_language runs the new loop walks (.rev, .step_by),
# aliases, constant team-local lengths and team sizes on the GPU, stream_order and omp_api
# the wtime timers and the ping-pong, trace the kernel dump; then the trace tests' binary
# TRACE_RUNS times (one unexplained death in about 111 runs earlier); then the team
# reductions and uniform barriers under compute-sanitizer racecheck and memcheck. Logs under
# $OUT.
#   carry: [".gpupack"]; command: bash scripts/gpu/session-46.sh
cd "$(dirname "$0")/../.."
set -o pipefail
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
export OFFLOAD_REQUIRE_DEVICES=1
nvidia-smi -L
t=.gpu/tests
pass=0; fail=0; failed=""
for b in $t/*; do
  name=$(basename "$b")
  case "$name" in *compile_fail*|*build*) continue ;; esac
  if "$b" > "$OUT/$name.log" 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed $name"; fi
done
echo "suite (queued): $pass binaries passed, $fail failed:$failed"
for f in $failed; do echo "== $f"; grep -E "panicked|FAILED|error" "$OUT/$f.log" | head -20; done
grep -h "^nvrtc:\|SKIP" "$OUT"/*.log | sort | uniq -c | head -20
runs=${TRACE_RUNS:-20}
tp=0
for i in $(seq "$runs"); do
  if $t/tests--test-trace > /tmp/trace.log 2>&1; then tp=$((tp+1)); else
    echo "trace run $i: exit $?" >> "$OUT/trace-deaths.log"; tail -30 /tmp/trace.log >> "$OUT/trace-deaths.log"; fi
done
echo "trace: $tp of $runs runs passed"
# The team reductions' shuffles and shared partials, and barriers under uniform conditions,
# under compute-sanitizer's racecheck (shared-memory hazards) and memcheck.
k=$t/tests--test-kernel_language
for tool in racecheck memcheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 9 "$k" team_reductions barriers_stand team_size \
    > "$OUT/sanitizer-$tool.log" 2>&1
  echo "compute-sanitizer $tool: exit $? ($(grep -c 'ERROR SUMMARY: 0 errors' "$OUT/sanitizer-$tool.log") clean summaries)"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$OUT/sanitizer-$tool.log" | head -6
done
