#!/usr/bin/env bash
# A short GPU check for little device time: the Jacobi demo on two host devices on the lent
# machine's cores (builds in .gpuab/, see host-share.sh; tuned kernel, ROUNDS rounds), the
# whole suite queued (NCCL linked as nccl.sh does), then the stream-order tests with
# OFFLOAD_SYNC=1. Logs under $OUT; failures and totals printed last.
#   carry: [".gpupack", ".gpuab"]; command: bash scripts/gpu/suite-short.sh
cd "$(dirname "$0")/../.."
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
ROUNDS=${ROUNDS:-4} KERNEL=tuned bash scripts/gpu/host-share.sh 2>&1 | tail -9
lib=$(find / -name 'libnccl.so.2' -path '*nvidia*' 2>/dev/null | head -1)
mkdir -p /tmp/nccl-lib && ln -sf "$lib" /tmp/nccl-lib/libnccl.so
export LD_LIBRARY_PATH=/tmp/nccl-lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date -u +%FT%TZ; echo "NCCL library: $lib"
mkdir -p "$OUT/queued"
OUT="$OUT/queued" OFFLOAD_REQUIRE_DEVICES=1 timeout 300 bash .gpu/run-tests > "$OUT/queued.log" 2>&1
OFFLOAD_SYNC=1 OFFLOAD_REQUIRE_DEVICES=1 timeout 60 .gpu/tests/tests--test-stream_order > "$OUT/sync-stream-order.log" 2>&1
echo "== queued: failures, then the total"
grep -E "^FAILED|^---- | FAILED$|panicked" "$OUT/queued.log" | head -20
tail -1 "$OUT/queued.log"
echo "== stream_order with OFFLOAD_SYNC=1"
grep -E "^test result|FAILED|panicked" "$OUT/sync-stream-order.log" | head -5
