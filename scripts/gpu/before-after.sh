#!/usr/bin/env bash
# Before/after on the lent GPU machine, in one call: the Jacobi example, the 3-D stencil
# and the overlap bench, from .gpu/old/ (built from an earlier commit, stripped) and from
# the current bundle, alternating, three rounds. Logs under $OUT/before-after.log.
#   scripts/gpu/before-after.sh [rounds]
cd "$(dirname "$0")/../.."
rounds=${1:-3}
log="$OUT/before-after.log"
for r in $(seq "$rounds"); do
  for side in old new; do
    if [ $side = old ]; then j=.gpu/old/jacobi; s=.gpu/old/stencil3d; o=.gpu/old/overlap;
    else j=.gpu/examples/jacobi; s=.gpu/examples/stencil3d; o=.gpu/benches/overlap; fi
    echo "round $r $side jacobi: $($j -nx 16384 -ny 16384 -niter 1000 2>&1 | grep -E 'devices?:' | tail -1)" | tee -a "$log"
    echo "round $r $side stencil3d: $($s -n 512 -niter 100 2>&1 | grep -E 'devices?:' | tail -1)" | tee -a "$log"
    echo "round $r $side overlap: $(timeout 120 $o --bench 2>&1 | grep -E 'pipeline, 1 GPU|pipeline /' | tr '\n' ' ')" | tee -a "$log"
  done
done
