#!/usr/bin/env bash
# Issue 29's GPU call on the lent H200, after ../shared/gpu/bundle: the whole test suite,
# then the MLP pipeline (4 x 4096, 48 batches of 4096 rows from pageable memory) in each
# precision beside PyTorch's expert version (benches/pytorch/mlp_pipeline.py) in the same
# call, ours then theirs per precision, and the two-stage pipeline on one GPU. Logs under
# $OUT; a summary last. The machine's memory is touched first (see below). `SUITE=0` leaves
# the tests out, `PRECISIONS="fp32 bf16"` picks, `AB_STREAMING=N` or `AB_ROUNDS=N` add rounds (at the end),
# `MAIN=0` leaves out all but those. `AB_REUSE=N`: N rounds of fresh outputs against outputs
# reused from the first run, on both sides.
cd "$(dirname "$0")/../.."
set -o pipefail
nvidia-smi -L; nproc
if [ "${SUITE:-1}" = 1 ]; then
  echo "== tests"
  OUT= bash .gpu/run-tests > $OUT/tests.log 2>&1
  grep -E "^(ok|FAILED)" $OUT/tests.log | sed 's/: test result//' | awk '{print $1, $2, $4, $5}' | tr '\n' ';'; echo
  grep -B2 -A25 "panicked" $OUT/tests.log | head -60
fi
# The machine's memory grows as it is first used (a microVM): touch 32 GB once, so that
# neither side's fresh output pages pay for that growth and the order does not matter.
python3 -c "import torch; torch.ones(8 << 30, dtype=torch.int32)" && echo "32 GB touched"
REPEAT=${REPEAT:-3}
for p in ${PRECISIONS:-fp32 tf32 bf16 fp16}; do
  [ "${MAIN:-1}" = 1 ] || break
  echo "== $p"
  .gpu/examples/inference -batches 48 -precision $p -repeat $REPEAT 2>/dev/null | grep -E "batches in|median|checked" | tee -a $OUT/inference.log
  if [ "$p" = fp32 ] || [ "$p" = bf16 ]; then
    .gpu/examples/inference -batches 48 -precision $p -stages 2 -repeat $REPEAT 2>/dev/null | grep -E "median|checked" | tee -a $OUT/inference.log
  fi
  python3 benches/pytorch/mlp_pipeline.py --precision $p --repeat $REPEAT 2>&1 | grep -E "pytorch|torch " | tee -a $OUT/torch.log
done
# `AB_STREAMING=N`: afterwards, N alternating rounds per precision of the staging ring's
# device->host copies with ordinary stores (OFFLOAD_STREAMING_STORES=0), with streaming
# stores (the default) and PyTorch's expert version, one median of REPEAT runs each.
# `AB_ROUNDS=N AB_VAR=OFFLOAD_POPULATE_THREADS AB_VALUES="1024 4 0"`: the same for any
# setting and its values. With `AB_VAR` empty, each of `AB_VALUES` is a comma-separated list
# of settings taken together: `AB_VALUES="OFFLOAD_POPULATE_THREADS=1024
# OFFLOAD_POPULATE_THREADS=0,OFFLOAD_SPLIT_CREWS=0"` sets the default against every copy thread
# faulting its own pages in (one crew, no populate).
if [ -n "${AB_STREAMING:-}" ]; then AB_ROUNDS=$AB_STREAMING; AB_VAR=OFFLOAD_STREAMING_STORES; AB_VALUES="0 1"; fi
for r in $(seq 1 "${AB_ROUNDS:-0}"); do
  for p in ${PRECISIONS:-fp32 tf32 bf16 fp16}; do
    for s in $AB_VALUES; do
      # The median, the output check against the f64 reference, and the exit status.
      if [ -n "${AB_VAR:-}" ]; then set_=("$AB_VAR=$s"); else IFS=, read -ra set_ <<<"$s"; fi
      out=$(env "${set_[@]}" .gpu/examples/inference -batches 48 -precision $p -repeat $REPEAT 2>&1); rc=$?
      echo "round $r $p ${set_[*]}: $(echo "$out" | grep -E "median|checked|differ" | tr '\n' ' ')exit $rc" | tee -a $OUT/ab.log
    done
    echo "round $r $p torch: $(python3 benches/pytorch/mlp_pipeline.py --precision $p --repeat $REPEAT 2>&1 | grep -E "pytorch|torch " | tr '\n' ' ')" | tee -a $OUT/ab.log
  done
done
# `AB_REUSE=N`: N alternating rounds per precision of ours and PyTorch's expert version, each
# into fresh output pages and into the first run's outputs (`-reuse-outputs 1`,
# `--reuse-outputs`), so that what the fresh pages cost is seen on both sides. Reused runs
# take REUSE_REPEAT (5) runs, so that their median is a reused one.
for r in $(seq 1 "${AB_REUSE:-0}"); do
  for p in ${PRECISIONS:-fp32 tf32 bf16 fp16}; do
    for reuse in 0 1; do
      n=$REPEAT; [ $reuse = 1 ] && n=${REUSE_REPEAT:-5}
      out=$(.gpu/examples/inference -batches 48 -precision $p -repeat $n -reuse-outputs $reuse 2>&1); rc=$?
      echo "round $r $p reuse=$reuse ours: $(echo "$out" | grep -E "median|checked|differ" | tr '\n' ' ')exit $rc" | tee -a $OUT/ab-reuse.log
      flag=; [ $reuse = 1 ] && flag=--reuse-outputs
      echo "round $r $p reuse=$reuse torch: $(python3 benches/pytorch/mlp_pipeline.py --precision $p --repeat $n $flag 2>&1 | grep -E "pytorch|torch " | tr '\n' ' ')" | tee -a $OUT/ab-reuse.log
    done
  done
done
