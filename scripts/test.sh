#!/usr/bin/env bash
# The whole test suite: sets up, then runs every unit, integration, conformance and doc
# test of the workspace (on host devices, and on GPUs when the machine has them).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
cargo test --workspace --all-targets
cargo test --workspace --doc
