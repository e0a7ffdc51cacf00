#!/usr/bin/env bash
# Host-device inference beside PyTorch on the CPU, in alternating rounds on one machine: the
# GPT-2-shaped decoder (examples/gpt.rs against benches/pytorch/gpt_bench.py, on the model
# that script writes: 4 blocks x 256, 8 heads, vocabulary 4096, 4 prompts of 64 tokens, 16
# new) and the trial's MLP on a batch of 64 rows (benches/mlp_batch.rs against
# benches/pytorch/mlp_batch.py), each in f32 and bf16; ours in bf16 both ways, on the CPU's
# bf16 dot products (the default where it has AVX512-BF16) and widened to f32
# (OFFLOAD_HOST_BF16_DOT=0). One host device on every core; PyTorch on as many threads.
#
#   PYTHON=/path/to/venv/bin/python ROUNDS=3 bash scripts/host-inference.sh | tee log
#
# PYTHON must import torch, numpy and safetensors (python3 -m venv v && v/bin/pip install
# torch numpy safetensors). The figures of docs/PERFORMANCE.md came from this script.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
rounds=${ROUNDS:-3}
model=${GPT_MODEL:-${TMPDIR:-/tmp}/offload-gpt-host.safetensors}
cargo build -q --release -p offload-examples --example gpt
cargo bench -q -p offload-benches --bench mlp_batch --no-run 2>/dev/null
export OFFLOAD_HOST_DEVICES=1
echo "# $(date -u +%FT%TZ), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), code $(git rev-parse --short HEAD)$(git diff --quiet || echo +), load: $(cut -d' ' -f1-3 /proc/loadavg)"
gpt() { target/release/examples/gpt -weights "$model" -heads 8 -batch 4 -prompt 64 -new 16 -repeat 5 "$@" | grep prefill; }
for round in $(seq "$rounds"); do
  echo "## round $round, load $(cut -d' ' -f1 /proc/loadavg)"
  # PyTorch first: it writes the model the example reads.
  "$py" benches/pytorch/gpt_bench.py cpu "$model" 4 256 8 4096 256 4 64 16 | grep '^| [fb]'
  echo -n "ours f32: "; gpt -dtype f32
  echo -n "ours bf16 (dot products): "; gpt -dtype bf16
  echo -n "ours bf16 (widened): "; OFFLOAD_HOST_BF16_DOT=0 gpt -dtype bf16
  "$py" benches/pytorch/mlp_batch.py cpu | grep '^| [fb]'
  echo "ours MLP batch, bf16 on dot products:"
  cargo bench -q -p offload-benches --bench mlp_batch 2>/dev/null | grep '^|' | tail -n +3
  echo "ours MLP batch, bf16 widened:"
  OFFLOAD_HOST_BF16_DOT=0 cargo bench -q -p offload-benches --bench mlp_batch 2>/dev/null | grep '^|' | tail -n +3
done
