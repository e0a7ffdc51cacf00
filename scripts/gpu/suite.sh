#!/usr/bin/env bash
# The whole test suite on a lent GPU, NCCL's library linked as nccl.sh does (so the NCCL
# cases run), every test requiring its devices (OFFLOAD_REQUIRE_DEVICES=1); then the
# scaling model's fixed per-step cost (step-cost.sh). After ../shared/gpu/bundle (or its
# test executables, examples and bins: .gpu/tests, .gpu/examples, .gpu/bin, where the
# trace tests find offload-trace, and .gpu/run-tests) is packed into .gpupack/gpu.tar.xz.
#   carry: [".gpupack"]; command: bash scripts/gpu/suite.sh      (logs under $OUT)
cd "$(dirname "$0")/../.."
set -o pipefail
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
lib=$(find / -name 'libnccl.so.2' -path '*nvidia*' 2>/dev/null | head -1)
mkdir -p /tmp/nccl-lib && ln -sf "$lib" /tmp/nccl-lib/libnccl.so
export LD_LIBRARY_PATH=/tmp/nccl-lib:${LD_LIBRARY_PATH:-}
echo "NCCL library: $lib"
echo "== tests"
OFFLOAD_REQUIRE_DEVICES=1 timeout 420 bash .gpu/run-tests > "$OUT/tests.log" 2>&1
echo "== step cost"
bash scripts/gpu/step-cost.sh 2>&1 | grep -E "step|duration"
# Last, so that a cut output keeps it: each failing executable's failures, then the total.
echo "== tests, failures and total"
grep -E "^FAILED|^---- | FAILED$|panicked" "$OUT/tests.log" | head -30
grep -E "passed, [0-9]+ failed" "$OUT/tests.log"
