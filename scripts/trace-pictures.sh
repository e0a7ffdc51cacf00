#!/usr/bin/env bash
# Timeline pictures for the docs: runs the mapping tour on two host devices with
# OFFLOAD_TRACE set and draws its trace with offload-trace into docs/pictures/
# (docs/GUIDE.md, "Timeline traces"). Host devices only, so any machine gives the same
# picture up to timings; pictures of GPU runs are made from their own traces the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
out=docs/pictures
mkdir -p "$out"
trace="${TMPDIR:-/tmp}/offload-mapping-tour-$$.json"
trap 'rm -f "$trace"' EXIT
cargo build --release -p offload-examples --example mapping_tour --bin offload-trace
target="${CARGO_TARGET_DIR:-target}/release"
OFFLOAD_TRACE="$trace" OFFLOAD_HOST_DEVICES=2 "$target/examples/mapping_tour" >/dev/null
"$target/offload-trace" "$trace" --svg "$out/mapping-tour.svg" \
  --title "mapping tour (examples/mapping_tour.rs) on two host devices"
"$target/offload-trace" "$trace" --summary
echo "wrote $out/mapping-tour.svg"
