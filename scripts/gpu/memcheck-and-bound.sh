#!/usr/bin/env bash
# The two-host-device bound on the lent machine's CPUs (GPU
# hidden): the Jacobi demo from .gpuab/jacobi-base (the bundle's) against
# .gpuab/jacobi-nohalo (a lab build that skips the halo exchange when LAB_NOHALO is set:
# wrong results, the speedup two independent devices would reach), alternating, ROUNDS
# times, 4096^2 x 200; then one run of .gpuab/jacobi-joblog (a lab build whose device
# workers log each job when OFFLOAD_LAB is set) read by scripts/gpu/job_gaps.py: where each
# device's time between kernels goes, alone and beside the other; then compute-sanitizer
# memcheck (leak check on) over the kernel and queue-order tests of the bundle in
# .gpupack, MEMCHECK_S seconds each at most (100). The lab builds come from
# scripts/gpu/lab/two-devices.patch (its header says how).
#   carry: [".gpupack", ".gpuab"]; command: bash scripts/gpu/memcheck-and-bound.sh
cd "$(dirname "$0")/../.."
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
nvidia-smi -L; date -u +%FT%TZ
echo "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for r in $(seq "${ROUNDS:-5}"); do
  for side in base nohalo; do
    env=(); [ "$side" = nohalo ] && env=(LAB_NOHALO=1)
    line=$(env "${env[@]}" CUDA_VISIBLE_DEVICES= OFFLOAD_HOST_DEVICES=2 ".gpuab/jacobi-$side" -nx 4096 -ny 4096 \
      -niter 200 -kernel "${KERNEL:-generated}" 2>&1 | grep speedup)
    echo "$side $r $(cut -d' ' -f1 /proc/loadavg) $line"
  done
done
OFFLOAD_LAB=1 CUDA_VISIBLE_DEVICES= OFFLOAD_HOST_DEVICES=2 .gpuab/jacobi-joblog -nx 4096 -ny 4096 -niter 100 \
  -kernel "${KERNEL:-generated}" 2> "$OUT/joblog.log" | grep speedup
python3 scripts/gpu/job_gaps.py "$OUT/joblog.log"
export OFFLOAD_REQUIRE_DEVICES=1
for t in stream_order kernel_macro ready_kernels reduce; do
  timeout "${MEMCHECK_S:-100}" compute-sanitizer --tool memcheck --leak-check full .gpu/tests/tests--test-$t > "$OUT/memcheck-$t.log" 2>&1
  echo "$t: exit $? | $(grep -E '^test result' "$OUT/memcheck-$t.log" | tail -1) | $(grep -E 'LEAK SUMMARY|ERROR SUMMARY' "$OUT/memcheck-$t.log" | tr '\n' ' ')"
done
unset OFFLOAD_REQUIRE_DEVICES
