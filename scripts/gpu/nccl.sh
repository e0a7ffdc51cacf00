#!/usr/bin/env bash
# Issue 50's NCCL engine on a lent GPU, after
#   ../shared/gpu/bundle -p offload-examples -p offload-tests   (packed into .gpupack/gpu.tar.xz)
# NCCL's library comes from the machine's PyTorch (its nvidia-nccl wheel), linked as the
# libnccl.so that cudarc loads. Runs, with OFFLOAD_REQUIRE_DEVICES=1: the info example's NCCL
# line; tests/grids.rs (NCCL moving every region of 2-D and 3-D splits, bit for bit against
# the device copies, and a sum over the ranks) and the solvers' tests (Jacobi 2 x 2 and the
# stencil 2 x 2 x 2 over NCCL equal to one device), each also under compute-sanitizer
# memcheck; then Jacobi and the stencil on grids with OFFLOAD_HALO=nccl beside the default
# engine. One GPU: every region is a send of the GPU's rank to itself (two GPUs or ranks
# need a machine with several). Logs under $OUT.
# carry: [".gpupack"]; command: bash scripts/gpu/nccl.sh
cd "$(dirname "$0")/../.."
set -o pipefail
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
lib=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
for d in site.getsitepackages() + [site.getusersitepackages()]:
    for f in glob.glob(os.path.join(d, "nvidia", "nccl*", "lib", "libnccl.so*")) + glob.glob(os.path.join(d, "nvidia", "cu*", "lib", "libnccl.so*")):
        print(f); raise SystemExit
PY
)
[ -n "$lib" ] || lib=$(find / -name 'libnccl.so.2' 2>/dev/null | head -1)
mkdir -p /tmp/nccl-lib && ln -sf "$lib" /tmp/nccl-lib/libnccl.so
export LD_LIBRARY_PATH=/tmp/nccl-lib:${LD_LIBRARY_PATH:-}
echo "NCCL library: $lib"
export OFFLOAD_REQUIRE_DEVICES=1
nvidia-smi -L; date -u +%FT%TZ
.gpu/examples/info 2>&1 | grep -E "^NCCL|^cuda"
t=.gpu/tests
for b in tests--test-grids examples--test-solvers; do
  timeout 200 $t/$b --nocapture > "$OUT/test-$b.log" 2>&1
  echo "test $b: exit $? $(grep 'test result' "$OUT/test-$b.log" | tail -1) $(grep -c SKIP "$OUT/test-$b.log") skips"
  grep SKIP "$OUT/test-$b.log" | head -3
  # API errors not counted: NCCL's own initialisation probes kernels it has no image for.
  timeout 300 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $t/$b \
    > "$OUT/memcheck-$b.log" 2>&1
  echo "memcheck $b: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-$b.log" | tail -1)"
done
for run in "jacobi -nx 4096 -ny 4096 -niter 200 -kernel generated -grid 2x2" \
           "stencil3d -n 256 -niter 50 -grid 2x2x2"; do
  read -r -a cmd <<<"$run"
  for halo in auto nccl auto nccl; do
    echo "== OFFLOAD_HALO=$halo ${cmd[*]}"
    OFFLOAD_HALO=$halo timeout 200 .gpu/examples/${cmd[0]} "${cmd[@]:1}" 2>&1 | tee -a "$OUT/runs.log" \
      | grep -E "engine|devices:|max \||result|rror" | tail -4
  done
done
