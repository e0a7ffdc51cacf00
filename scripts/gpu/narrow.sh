#!/usr/bin/env bash
# Issue 46 item 10 on the lent GPU: kernels' variants with 32-bit index arithmetic
# (KERNEL_NARROW, chosen at launch) against the 64-bit kernels, in one call, after
#   ../shared/gpu/bundle -p offload-tests -p offload-examples -p offload-benches
# (stripped and packed into .gpupack/gpu.tar.xz, as scripts/gpu/session-46.sh says).
# 1. Correctness: the kernel-language suite with OFFLOAD_REQUIRE_DEVICES=1 (its
#    index-arithmetic test runs both variants and compares them with the 64-bit values), and
#    the same suite with OFFLOAD_NARROW_INDICES=0; compute-sanitizer memcheck on that test.
# 2. The figures to move: the laplace port (1.21x CUDA) and the jacobi and ace ports, each
#    with OFFLOAD_NARROW_INDICES=1 and =0 alternating, RUNS times (medians by ports_table.py's
#    reading of their "per iteration" lines); the kernels bench (raw: the generated Jacobi
#    step and its narrow variant side by side; through the runtime: the solver rows) once
#    with each setting.
#   carry: [".gpupack"]; command: bash scripts/gpu/narrow.sh
cd "$(dirname "$0")/../.."
set -o pipefail
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
export OFFLOAD_REQUIRE_DEVICES=1
nvidia-smi -L; date -u +%FT%TZ
k=.gpu/tests/tests--test-kernel_language
# CHECKS=0 skips the correctness part (already run on a GPU) when device time is short.
[ "${CHECKS:-1}" = 0 ] || for narrow in 1 0; do
  OFFLOAD_NARROW_INDICES=$narrow "$k" > "$OUT/kernel_language-narrow$narrow.log" 2>&1
  echo "kernel_language, OFFLOAD_NARROW_INDICES=$narrow: exit $? $(grep 'test result' "$OUT/kernel_language-narrow$narrow.log")"
done
if [ "${CHECKS:-1}" != 0 ]; then
  compute-sanitizer --tool memcheck --error-exitcode 9 "$k" index_arithmetic > "$OUT/sanitizer-narrow.log" 2>&1
  echo "memcheck on index_arithmetic: exit $?"; grep -E "ERROR SUMMARY" "$OUT/sanitizer-narrow.log" | head -2
fi
runs=${RUNS:-5}
for p in laplace jacobi ace; do
  args=(); [ $p = ace ] && args=(100)
  for r in $(seq "$runs"); do
    for narrow in 1 0; do
      d=/tmp/narrow-run/$p-$narrow; mkdir -p "$d"
      (cd "$d" && OFFLOAD_NARROW_INDICES=$narrow "$OLDPWD/.gpu/examples/port_$p" "${args[@]}") \
        > "$OUT/port-$p-narrow$narrow-$r.log" 2>&1
      echo "$p narrow=$narrow run $r: exit $? $(grep -E 'per iteration|per run|Total time|total' "$OUT/port-$p-narrow$narrow-$r.log" | tail -1)"
    done
  done
done
# The teams port (team size at launch, team sums) on the GPU, each block size.
for bs in 32 64 256 1024; do
  .gpu/examples/port_layernorm 4096 128 "$bs" 20 > "$OUT/port-layernorm-$bs.log" 2>&1
  echo "layernorm bs=$bs: exit $? $(tr '\n' ' ' < "$OUT/port-layernorm-$bs.log" | cut -c1-160)"
done
for narrow in 1 0; do
  OFFLOAD_NARROW_INDICES=$narrow timeout "${BENCH_TIMEOUT:-240}" .gpu/benches/kernels --bench > "$OUT/bench-kernels-narrow$narrow.log" 2>&1
  echo "kernels bench, OFFLOAD_NARROW_INDICES=$narrow: exit $?"
  grep -E "^\| (generated|hand-written|solver)|jacobi" "$OUT/bench-kernels-narrow$narrow.log" | head -24
done
