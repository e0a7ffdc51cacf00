#!/usr/bin/env bash
# Issue 49's inference work proved on the lent GPU, after
#   ../shared/gpu/bundle   (stripped and packed into .gpupack/gpu.tar.xz)
# PART picks what one call runs:
#   suite  the whole suite with OFFLOAD_REQUIRE_DEVICES=1 (a case that would skip for lack
#          of a GPU fails), queued and then with OFFLOAD_SYNC=1;
#   nn     tests/nn.rs, half_floats.rs and weights.rs; compute-sanitizer memcheck over nn
#          (attention included) and half_floats, racecheck over nn; then benches/nn.rs on
#          the GPU beside benches/pytorch/nn_ops.py on the same GPU, and both on the CPU;
#   gpt    examples/tests/gpt.rs (PyTorch's tokens and logits) and its memcheck, then a
#          GPT-2-small-shaped decoder (benches/pytorch/gpt_bench.py writes it and times
#          PyTorch eager on it) through examples/gpt.rs on one GPU, f32 and bf16;
#   service tests/tensors.rs and the mlp_service example's test (and tensors' memcheck),
#          then the service beside benches/pytorch/mlp_service.py on the GPU, and
#          benches/mlp_batch.rs beside benches/pytorch/mlp_batch.py on the GPU.
# Logs under $OUT.   carry: [".gpupack"]; command: PART=nn bash scripts/gpu/session-49.sh
cd "$(dirname "$0")/../.."
set -o pipefail
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
export OFFLOAD_REQUIRE_DEVICES=1
nvidia-smi -L; date -u +%FT%TZ
t=.gpu/tests
suite() { # $1: label; runs every test binary, one line each
  local pass=0 fail=0 failed="" start=$SECONDS
  for b in $t/*; do
    name=$(basename "$b")
    case "$name" in *compile_fail*|*build*) continue ;; esac
    if timeout "${EACH:-240}" "$b" > "$OUT/$1-$name.log" 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); failed="$failed $name"; fi
  done
  echo "suite ($1): $pass binaries passed, $fail failed:$failed ($((SECONDS-start)) s)"
  for f in $failed; do echo "== $f"; grep -E "panicked|FAILED|error|^test .* \.\.\. FAILED" "$OUT/$1-$f.log" | head -20; done
}
case "${PART:-suite}" in
suite)
  suite queued
  OFFLOAD_SYNC=1 suite sync
  ;;
nn)
  for b in nn half_floats weights; do
    timeout 200 $t/tests--test-$b > "$OUT/test-$b.log" 2>&1
    echo "test $b: exit $? $(grep 'test result' "$OUT/test-$b.log" | tail -1)"
  done
  for b in nn half_floats; do
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $t/tests--test-$b \
      > "$OUT/memcheck-$b.log" 2>&1
    echo "memcheck $b: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-$b.log" | tail -1) $(grep 'test result' "$OUT/memcheck-$b.log" | tail -1)"
  done
  timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 $t/tests--test-nn \
    > "$OUT/racecheck-nn.log" 2>&1
  echo "racecheck nn: exit $? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck-nn.log" | tail -1) $(grep 'test result' "$OUT/racecheck-nn.log" | tail -1)"
  echo "== nn bench, GPU"; NN_DEVICE=gpu timeout 150 .gpu/benches/nn --bench 2>&1 | tee "$OUT/nn-gpu.log" | grep -E "^\|"
  echo "== PyTorch, GPU"; timeout 150 python3 benches/pytorch/nn_ops.py cuda 2>&1 | tee "$OUT/torch-gpu.log"
  echo "== nn bench, host device (16 cores)"; NN_DEVICE=host timeout 150 .gpu/benches/nn --bench 2>&1 | tee "$OUT/nn-host.log" | grep -E "^\|"
  echo "== PyTorch, CPU"; CUDA_VISIBLE_DEVICES= timeout 150 python3 benches/pytorch/nn_ops.py cpu 2>&1 | tee "$OUT/torch-cpu.log"
  ;;
gpt)
  timeout 200 $t/examples--test-gpt > "$OUT/test-gpt.log" 2>&1
  echo "test gpt: exit $? $(grep 'test result' "$OUT/test-gpt.log" | tail -1)"; grep -E "^(fp32|bf16):" "$OUT/test-gpt.log"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $t/examples--test-gpt > "$OUT/memcheck-gpt.log" 2>&1
  echo "memcheck gpt: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-gpt.log" | tail -1)"
  model=/tmp/gpt2s.safetensors
  timeout 300 python3 benches/pytorch/gpt_bench.py cuda $model 2>&1 | tee "$OUT/torch-gpt.log"
  for d in f32 bf16; do
    timeout 200 .gpu/examples/gpt -weights $model -heads 12 -batch 8 -prompt 128 -new 32 -dtype $d -ndev 1 -repeat 5 \
      2>&1 | tee "$OUT/gpt-$d.log" | grep -E "^GPT|prefill|rror"
  done
  ;;
service)
  for b in tests--test-tensors examples--example-mlp_service; do
    timeout 200 $t/$b > "$OUT/test-$b.log" 2>&1
    echo "test $b: exit $? $(grep 'test result' "$OUT/test-$b.log" | tail -1)"
  done
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $t/tests--test-tensors > "$OUT/memcheck-tensors.log" 2>&1
  echo "memcheck tensors: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-tensors.log" | tail -1)"
  model=/tmp/mlp.safetensors
  for r in 1 2 3; do
    echo "== round $r"; timeout 100 python3 benches/pytorch/mlp_service.py $model cuda 2>&1 | tee -a "$OUT/torch-service.log"
    timeout 100 .gpu/examples/mlp_service $model 2>&1 | tee -a "$OUT/service.log" | tail -1
  done
  MLP_DEVICE=gpu timeout 150 .gpu/benches/mlp_batch --bench 2>&1 | tee "$OUT/mlp-batch-gpu.log" | grep -E "^\|"
  timeout 100 python3 benches/pytorch/mlp_batch.py cuda 2>&1 | tee "$OUT/torch-mlp-batch.log"
  ;;
esac
