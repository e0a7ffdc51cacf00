#!/usr/bin/env bash
# One GPU session on the lent H200 machine, after ../shared/gpu/bundle: the whole test
# suite, the sanitizer on the asynchronous tests, then the inference example and the
# overlap and transfer benches. Logs go under $OUT.
cd "$(dirname "$0")/../.."
set -o pipefail
echo "== tests"; bash .gpu/run-tests 2>&1 | tee $OUT/tests.log | grep -E "^FAILED|passed" | tail -4
grep -A30 "FAILED" $OUT/tests.log | head -40
compute-sanitizer --tool memcheck .gpu/tests/tests--test-nowait 2>&1 | grep -E "ERROR SUMMARY|test result"
echo "== inference"; .gpu/examples/inference -batches 48 2>&1 | tail -4 | tee $OUT/inference.log
echo "== overlap"; timeout 300 .gpu/benches/overlap --bench 2>&1 | tee $OUT/overlap.log | tail -14
echo "== transfer"; TRANSFER_QUICK=1 timeout 150 .gpu/benches/transfer --bench 2>&1 | tee $OUT/transfer.log | grep -E "^\| (4|8|16) MiB|memcpy"
