#!/usr/bin/env bash
# Host-side before/after: the host benches (launch, mapping, the Jacobi kernels) from two
# builds, run alternately, ROUNDS rounds (3), each line of criterion's output kept with the
# round, side, time and load, for docs/PERFORMANCE.md's before/after tables.
#   scripts/host-before-after.sh BEFORE_TARGET_DIR AFTER_TARGET_DIR [LOG]
# where each target dir holds `cargo bench -p offload-benches --no-run` output, e.g.
#   git worktree add /tmp/before <commit>
#   (cd /tmp/before && CARGO_TARGET_DIR=/tmp/ba-before cargo bench -p offload-benches \
#     --bench host_launch --bench mapping --bench host_kernels --no-run)
# and the same for the current tree into /tmp/ba-after.
set -euo pipefail
before=$1 after=$2 log=${3:-/dev/stdout}
rounds=${ROUNDS:-3}
bench() { # newest bench executable NAME under target dir $1
  ls -t "$1"/release/deps/"$2"-* 2>/dev/null | grep -v '\.d$' | head -1
}
for r in $(seq "$rounds"); do
  for side in before after; do
    dir=$before; [ $side = after ] && dir=$after
    for b in host_launch mapping host_kernels; do
      exe=$(bench "$dir" $b)
      [ -n "$exe" ] || { echo "no $b bench under $dir" >&2; exit 1; }
      echo "== round $r $side $b $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" >>"$log"
      # host_kernels: its Jacobi case (the generated, teams and tuned kernels), one line
      # per kernel; the others: criterion's name and time lines.
      if [ $b = host_kernels ]; then
        "$exe" --bench jacobi 2>&1 | grep -P "\t" >>"$log"
      else
        "$exe" --bench 2>&1 | grep -E "time:|^[a-z_]+/" >>"$log"
      fi
    done
  done
done
