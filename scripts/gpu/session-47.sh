#!/usr/bin/env bash
# Issue 47's restructure (and issue 46's kernel work) proved on the lent GPU, after
#   ../shared/gpu/bundle -p offload-tests -p offload-examples -p offload-benches
# (stripped and packed into .gpupack/gpu.tar.xz). PART picks what one call runs:
#   suite     the whole suite with OFFLOAD_REQUIRE_DEVICES=1 (a case that would skip for
#             lack of a GPU fails), queued and then with OFFLOAD_SYNC=1;
#   sanitizer compute-sanitizer memcheck over kernel_language, omp_api, stream_order and
#             nowait, racecheck over the team kernels (reductions, barriers, team sizes);
#   final     the suite queued, then issue 46 item 10's ports with OFFLOAD_NARROW_INDICES=1
#             and =0 alternating (RUNS times; their ports-result lines), then issue 47's
#             before/after on the GPU: the mapping bench ROUNDS times and the kernels bench
#             once, before (.gpu/before/, benches built at 380afc7) and after (.gpu/benches/)
#             alternating; every figure printed, since only a few files come back.
# Logs under $OUT.   carry: [".gpupack"]; command: PART=suite bash scripts/gpu/session-47.sh
cd "$(dirname "$0")/../.."
set -o pipefail
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
export OFFLOAD_REQUIRE_DEVICES=1
nvidia-smi -L; date -u +%FT%TZ
t=.gpu/tests
suite() { # $1: label; runs every test binary, one line each
  local pass=0 fail=0 failed="" start=$SECONDS
  for b in $t/*; do
    name=$(basename "$b")
    case "$name" in *compile_fail*|*build*) continue ;; esac
    if timeout "${EACH:-240}" "$b" > "$OUT/$1-$name.log" 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed $name"; fi
  done
  echo "suite ($1): $pass binaries passed, $fail failed:$failed ($((SECONDS-start)) s)"
  for f in $failed; do echo "== $f"; grep -E "panicked|FAILED|error|^test .* \.\.\. FAILED" "$OUT/$1-$f.log" | head -20; done
}
case "${PART:-suite}" in
suite)
  suite queued
  OFFLOAD_SYNC=1 suite sync
  grep -h "SKIP" "$OUT"/*.log | sort | uniq -c | head -10 || true
  ;;
sanitizer)
  for b in kernel_language omp_api stream_order nowait; do
    timeout "${EACH:-150}" compute-sanitizer --tool memcheck --error-exitcode 9 $t/tests--test-$b \
      > "$OUT/memcheck-$b.log" 2>&1
    echo "memcheck $b: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-$b.log" | tail -1) $(grep 'test result' "$OUT/memcheck-$b.log" | tail -1)"
  done
  timeout "${EACH:-150}" compute-sanitizer --tool racecheck --error-exitcode 9 $t/tests--test-kernel_language \
    team_reductions barriers_stand team_size > "$OUT/racecheck.log" 2>&1
  echo "racecheck team kernels: exit $? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1) $(grep 'test result' "$OUT/racecheck.log" | tail -1)"
  ;;
final)
  suite queued
  for p in laplace jacobi ace; do
    args=(); [ $p = ace ] && args=(100)
    for r in $(seq "${RUNS:-2}"); do
      for narrow in 1 0; do
        d=/tmp/narrow-run/$p-$narrow; mkdir -p "$d"
        line=$(cd "$d" && OFFLOAD_NARROW_INDICES=$narrow timeout 60 "$OLDPWD/.gpu/examples/port_$p" "${args[@]}" 2>&1 | grep ports-result)
        echo "port $p narrow=$narrow run $r: $line"
      done
    done
  done
  for r in $(seq "${ROUNDS:-2}"); do
    for side in before after; do
      dir=.gpu/benches; [ $side = before ] && dir=.gpu/before
      echo "== mapping round $r $side"
      timeout 90 $dir/mapping --bench 2>&1 | grep -E "^\| [a-z]" | grep -v "^| what"
    done
  done
  for side in before after; do
    dir=.gpu/benches; [ $side = before ] && dir=.gpu/before
    echo "== kernels $side"
    timeout "${BENCH_TIMEOUT:-110}" $dir/kernels --bench 2>&1 | grep -E "^\| (generated|hand-written|solver|fill|saxpy|sum|jacobi)" | head -12
  done
  ;;
esac
