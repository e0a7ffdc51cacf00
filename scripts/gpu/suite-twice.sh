#!/usr/bin/env bash
# The whole test suite on a lent GPU twice: queued as usual, then with OFFLOAD_SYNC=1 (each
# construct waits), NCCL linked as nccl.sh does, every test requiring its devices. Each
# executable's log under $OUT/queued and $OUT/sync; failures and totals printed last.
#   carry: [".gpupack"]; command: bash scripts/gpu/suite-twice.sh
cd "$(dirname "$0")/../.."
[ -d .gpu ] || tar -xJf .gpupack/gpu.tar.xz
lib=$(find / -name 'libnccl.so.2' -path '*nvidia*' 2>/dev/null | head -1)
mkdir -p /tmp/nccl-lib && ln -sf "$lib" /tmp/nccl-lib/libnccl.so
export LD_LIBRARY_PATH=/tmp/nccl-lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date -u +%FT%TZ; echo "NCCL library: $lib"
mkdir -p "$OUT/queued" "$OUT/sync"
OUT="$OUT/queued" OFFLOAD_REQUIRE_DEVICES=1 timeout 280 bash .gpu/run-tests > "$OUT/queued.log" 2>&1
OUT="$OUT/sync" OFFLOAD_SYNC=1 OFFLOAD_REQUIRE_DEVICES=1 timeout 250 bash .gpu/run-tests > "$OUT/sync.log" 2>&1
for run in queued sync; do
  echo "== $run: failures, then the total"
  grep -E "^FAILED|^---- | FAILED$|panicked" "$OUT/$run.log" | head -20
  tail -1 "$OUT/$run.log"
done
