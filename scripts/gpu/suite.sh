#!/usr/bin/env bash
# The whole test suite on a lent GPU, NCCL's library linked as nccl.sh does (so the NCCL
# cases run), every test requiring its devices (OFFLOAD_REQUIRE_DEVICES=1); then the
# scaling model's fixed per-step cost (step-cost.sh). After the test executables and the
# examples are packed into .gpupack/gpu.tar.xz (.gpu/tests, .gpu/examples, .gpu/run-tests).
#   carry: [".gpupack"]; command: bash scripts/gpu/suite.sh      (logs under $OUT)
cd "$(dirname "$0")/../.."
set -o pipefail
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
lib=$(find / -name 'libnccl.so.2' -path '*nvidia*' 2>/dev/null | head -1)
mkdir -p /tmp/nccl-lib && ln -sf "$lib" /tmp/nccl-lib/libnccl.so
export LD_LIBRARY_PATH=/tmp/nccl-lib:${LD_LIBRARY_PATH:-}
echo "NCCL library: $lib"
echo "== tests"
OFFLOAD_REQUIRE_DEVICES=1 timeout 420 bash .gpu/run-tests 2>&1 | tee "$OUT/tests.log" | grep -E "^FAILED|passed" | tail -4
grep -A30 "^FAILED" "$OUT/tests.log" | head -60
echo "== step cost"
bash scripts/gpu/step-cost.sh
