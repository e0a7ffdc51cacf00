#!/usr/bin/env bash
# The scaling model's "fixed per-step cost" (scripts/scaling-model.py, J_FIXED) on a lent
# GPU: the one-GPU Jacobi step at 16384^2 with the norm every step (the example's loop time
# over 1000 iterations, three runs of each kernel) against its kernel alone (ncu's
# gpu__time_duration of launches 20-24, clocks as the machine has them). After packing
# .gpu/examples/jacobi into .gpupack/gpu.tar.xz.
#   carry: [".gpupack"]; command: bash scripts/gpu/step-cost.sh
cd "$(dirname "$0")/../.."
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
export OFFLOAD_HOST_DEVICES=0
nvidia-smi -L; date -u +%FT%TZ
for kernel in tuned generated; do
  for r in 1 2 3; do
    .gpu/examples/jacobi -nx 16384 -ny 16384 -niter 1000 -ndev 1 -kernel "$kernel" | grep speedup \
      | awk -v k="$kernel" '{printf "%s: step %.1f us (1000 steps %s s), again %.1f us\n", k, $4 * 1000, $4, $8 * 1000}'
  done
  timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:jacobi --launch-skip 20 \
    --launch-count 5 .gpu/examples/jacobi -nx 16384 -ny 16384 -niter 30 -ndev 1 -kernel "$kernel" 2>&1 \
    | grep -E "jacobi|gpu__time_duration" | paste - - | awk -v k="$kernel" '{print k ": kernel " $0}'
done
