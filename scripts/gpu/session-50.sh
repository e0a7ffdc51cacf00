#!/usr/bin/env bash
# Issue 50's grids on the lent GPU, after
#   ../shared/gpu/bundle -p offload-benches -p offload-examples -p offload-tests
#   (packed into .gpupack/gpu.tar.xz)
# The grid tests (tests/grids.rs, the solvers' grid tests) with OFFLOAD_REQUIRE_DEVICES=1
# and under compute-sanitizer memcheck; Jacobi and the stencil on grids of parts on the one
# GPU against the single-device run; then benches/grid_faces.rs on the GPU (a 16 MiB face
# packed across each axis, its staged copies, a two-part exchange).
# PART=two (on nvidia-h100-x2 or nvidia-h200-x2): the stencil at 512^3 on both GPUs split
# by planes and as 2 x 1 x 1 and 1 x 1 x 2 boxes, and Jacobi 16384^2 as 2 slabs and 1 x 2
# parts, each beside the one-GPU run (issue 50's "two GPUs at or above 95% efficiency").
# Logs under $OUT.   carry: [".gpupack"]; command: [PART=two] bash scripts/gpu/session-50.sh
cd "$(dirname "$0")/../.."
set -o pipefail
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
export OFFLOAD_REQUIRE_DEVICES=1
nvidia-smi -L; date -u +%FT%TZ
if [ "${PART:-one}" = two ]; then
  for run in "stencil3d -n 512 -niter 100" "stencil3d -n 512 -niter 100 -grid 2x1x1" \
             "stencil3d -n 512 -niter 100 -grid 1x1x2" "jacobi -nx 16384 -ny 16384 -niter 200" \
             "jacobi -nx 16384 -ny 16384 -niter 200 -kernel generated -grid 1x2"; do
    read -r -a cmd <<<"$run"
    echo "== ${cmd[*]}"; timeout 250 .gpu/examples/${cmd[0]} "${cmd[@]:1}" 2>&1 | tee -a "$OUT/two.log" \
      | grep -E "devices:|halos|result|rror" | tail -4
  done
  exit 0
fi
t=.gpu/tests
for b in tests--test-grids examples--test-solvers tests--test-ready_kernels; do
  timeout 200 $t/$b > "$OUT/test-$b.log" 2>&1
  echo "test $b: exit $? $(grep 'test result' "$OUT/test-$b.log" | tail -1)"
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 $t/$b > "$OUT/memcheck-$b.log" 2>&1
  echo "memcheck $b: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-$b.log" | tail -1)"
done
for run in "jacobi -nx 4096 -ny 4096 -niter 200 -kernel generated -grid 2x2" \
           "jacobi -nx 4096 -ny 4096 -niter 200 -grid 1x1" \
           "stencil3d -n 256 -niter 50 -grid 2x2x2"; do
  read -r -a cmd <<<"$run"
  echo "== ${cmd[*]}"; timeout 200 .gpu/examples/${cmd[0]} "${cmd[@]:1}" 2>&1 | grep -E "devices|device:|max \||result|rror" | tail -4
done
echo "== grid_faces, GPU"; GRID_DEVICE=gpu timeout 300 .gpu/benches/grid_faces --bench 2>&1 | tee "$OUT/grid-faces-gpu.log" | grep -E "^\||faces of"
