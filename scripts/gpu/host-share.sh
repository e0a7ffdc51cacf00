#!/usr/bin/env bash
# Host devices sharing the cores (issue 45, item 3) on the lent machine's CPUs, its GPU
# hidden: the Jacobi demo on two host devices (one device alone, then both; the speedup it
# prints) from builds carried in .gpuab/ (jacobi-SIDE for each of SIDES, by default
# "before after", stripped), alternating, ROUNDS times, at SIZE x SIZE for NITER steps,
# generated kernel unless KERNEL says otherwise; ARGS are added to each run (-halo memcpy).
#   carry: [".gpuab"]; command: ROUNDS=6 bash scripts/gpu/host-share.sh
cd "$(dirname "$0")/../.."
echo "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for r in $(seq "${ROUNDS:-6}"); do
  for side in ${SIDES:-before after}; do
    line=$(CUDA_VISIBLE_DEVICES= OFFLOAD_HOST_DEVICES=2 ".gpuab/jacobi-$side" -nx "${SIZE:-4096}" \
      -ny "${SIZE:-4096}" -niter "${NITER:-200}" -kernel "${KERNEL:-generated}" ${ARGS:-} 2>&1 | grep speedup)
    echo "$side $r $(cut -d' ' -f1 /proc/loadavg) $line"
  done
done
