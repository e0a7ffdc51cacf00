#!/usr/bin/env bash
# On the GPU machine (no MPI installed there): the test suite, then the MPI runs with the
# Open MPI carried in .gpu/mpi-kit (scripts/gpu/mpi-kit.sh) and the binaries built with
# feature `mpi` in .gpu/mpi: the cluster test as one rank and as two, info's placement
# lines, Jacobi and the stencil on 1 rank and on 2 ranks sharing the GPU, checked against
# the single-process run (-check), then timed three times each. Logs go to $OUT (or .).
set -uo pipefail
out=${OUT:-.}
export OFFLOAD_REQUIRE_DEVICES=1
nvidia-smi -L | tee "$out/gpu.txt"
if [ "${SKIP_SUITE:-0}" != 1 ]; then
  bash .gpu/run-tests > "$out/suite.log" 2>&1; echo "suite rc=$?" | tee -a "$out/suite.log"
  grep -E "^test result|FAILED|panicked|executables" "$out/suite.log" | sort | uniq -c | tail -8
fi
. .gpu/mpi-kit/env.sh
mpi=(mpirun --oversubscribe --bind-to none)
{
  echo "== cluster test, 1 rank, then 2, then 3"; .gpu/mpi/cluster 2>&1 | tail -3
  "${mpi[@]}" -np 2 .gpu/mpi/cluster 2>&1 | grep -E "test result|panicked"
  "${mpi[@]}" -np 3 .gpu/mpi/cluster 2>&1 | grep -E "test result|panicked"
  echo "== info, 2 ranks"; "${mpi[@]}" -np 2 .gpu/mpi/info 2>&1 | head -6
  echo "== correctness: Jacobi 4096^2 x 200, stencil 256^3 x 50, 2 ranks, -check"
  .gpu/mpi/jacobi -nx 4096 -ny 4096 -niter 200 | grep -E "result|final"
  "${mpi[@]}" -np 2 .gpu/mpi/jacobi -nx 4096 -ny 4096 -niter 200 -check 2>&1 | tail -5
  .gpu/mpi/stencil3d -n 256 -niter 50 | grep -E "result"
  "${mpi[@]}" -np 2 .gpu/mpi/stencil3d -n 256 -niter 50 -check 2>&1 | tail -4
  for i in 1 2 3; do
    echo "== timing run $i: Jacobi 16384^2 x 1000, 1 rank (single process) then 2 ranks on the one GPU"
    .gpu/mpi/jacobi -nx 16384 -ny 16384 -niter 1000 | grep -E "devices:|result"
    "${mpi[@]}" -np 2 .gpu/mpi/jacobi -nx 16384 -ny 16384 -niter 1000 2>&1 | grep -E "ranks x|halos|result"
    echo "== timing run $i: stencil 512^3 x 100, 1 rank then 2 ranks"
    .gpu/mpi/stencil3d -n 512 -niter 100 | grep -E "devices:|result"
    "${mpi[@]}" -np 2 .gpu/mpi/stencil3d -n 512 -niter 100 2>&1 | grep -E "ranks x|halos|result"
  done
} 2>&1 | tee "$out/mpi.log"
