#!/usr/bin/env bash
# The whole test suite: sets up, then runs every unit, integration, conformance and doc
# test of the workspace (on host devices, and on GPUs when the machine has them).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
cargo test --workspace --all-targets
cargo test --workspace --doc
# The atomicity race tests (docs/SEMANTICS.md, R13) 10 times more: each run is 4 threads x 2048
# regions on one variable, 4 paths, queued and synchronous (on GPUs too when present).
# (`--workspace` with `--test`: the binaries built above, with the workspace's features;
# `-p offload-tests` would resolve features for that package alone and build them again.)
for _ in $(seq 10); do cargo test -q --workspace --test atomic_constructs; done
# Every step fails once (docs/RELIABILITY.md): the conformance cases and the construct
# suites again on host devices, each case run once per device operation it makes with that
# operation failing, synchronous and queued, checking what every failure left. Each case
# prints what it failed (`--nocapture`): the figures in docs/RELIABILITY.md come from here.
OFFLOAD_TEST_FAULTS=1 cargo test --workspace --test conformance --test nowait --test clauses \
  --test reduce --test guards --test devices --test bad_input --test unwind --test kernel_reduce \
  --test kernel_macro --test kernel_language --test ready_kernels --test concurrency --test stream_order \
  -- --nocapture
