#!/usr/bin/env bash
# The main job: sets up, then runs the mapping tour on GPUs when there are any, otherwise
# on host devices. Arguments go to the example.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
cargo run --release -p offload-examples --example mapping_tour -- "$@"
