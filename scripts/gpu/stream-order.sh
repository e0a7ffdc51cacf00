#!/usr/bin/env bash
# Issue 23 on the lent H200, after ../shared/gpu/bundle (and .gpu/old/ built from the commit
# before the stream-ordered constructs, stripped). Two phases, one call each:
#   scripts/gpu/stream-order.sh tests    # the suite queued and under OFFLOAD_SYNC=1, memcheck, kernel cache
#   scripts/gpu/stream-order.sh benches  # queued bench; mapping, overlap, transfer and Jacobi, old vs new
# Summaries go to standard output and $OUT (at most 8 files come back: one log per step).
cd "$(dirname "$0")/../.."
set -o pipefail
scratch=$(mktemp -d)
case "${1:-tests}" in
tests)
  for mode in queued sync; do
    if [ $mode = sync ]; then export OFFLOAD_SYNC=1; else unset OFFLOAD_SYNC; fi
    echo "== suite, $mode"
    OUT=$scratch bash .gpu/run-tests 2>&1 | tee "$OUT/suite-$mode.log" | grep -E "^(ok|FAILED)|passed" | grep -vE "^ok " | tail -40
  done
  unset OFFLOAD_SYNC
  echo "== compute-sanitizer memcheck"
  for t in conformance nowait unwind kernel_macro stream_order reduce; do
    echo "-- $t: $(timeout 170 compute-sanitizer --tool memcheck .gpu/tests/tests--test-$t 2>&1 | grep -E 'ERROR SUMMARY|^test result' | tr '\n' ' ')"
  done | tee "$OUT/memcheck.log"
  echo "== kernel cache"
  .gpu/tests/tests--test-kernel_cache --nocapture 2>&1 | tee "$OUT/kernel-cache.log" | grep -vE "^$" | tail -12
  ;;
benches)
  echo "== queued"
  timeout 200 .gpu/benches/queued --bench 2>&1 | tee "$OUT/queued.log" | grep -E "^\|"
  for r in 1 2 3; do
    for side in old new; do
      if [ $side = old ]; then j=.gpu/old/jacobi; else j=.gpu/examples/jacobi; fi
      for k in tuned generated; do
        echo "round $r $side jacobi $k: $($j -nx 16384 -ny 16384 -niter 1000 -kernel $k 2>&1 | grep -E 'devices?:' | tail -1)"
      done
    done
  done | tee "$OUT/jacobi.log"
  for side in old new; do
    if [ $side = old ]; then m=.gpu/old/mapping; o=.gpu/old/overlap; t=.gpu/old/transfer;
    else m=.gpu/benches/mapping; o=.gpu/benches/overlap; t=.gpu/benches/transfer; fi
    echo "== $side mapping"; timeout 120 $m --bench 2>&1 | grep -E "^\|" 
    echo "== $side overlap"; timeout 100 $o --bench 2>&1 | grep -E "pipeline|overlap|^\|" | tail -8
    echo "== $side transfer"; TRANSFER_QUICK=1 timeout 90 $t --bench 2>&1 | grep -E "^\| (4|8|16|64) MiB|memcpy" | head -8
  done 2>&1 | tee "$OUT/old-new.log"
  ;;
esac
