#!/usr/bin/env bash
# Kernels on one host device beside the C they replace, in one run: builds the C twin
# (benches/c/host_kernels.c) with gcc -O3 -fopenmp (`parallel for`) and with clang-19 -O3
# offloading to libomptarget's host plugin (`target teams distribute parallel for`), then
# runs the three sides in turn ROUNDS times (default 3; each side prints medians over its
# samples) and prints, per case, the median over the rounds of each side's figure, with
# the machine and its load. docs/PERFORMANCE.md's "Host devices beside C" table comes
# from it. An argument picks one case: saxpy, jacobi, layernorm or softmax.
#   ROUNDS=5 scripts/host-kernels.sh jacobi
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/llvm19.sh
. scripts/llvm19.sh
install_llvm19
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O3 -fopenmp -Wall -Werror -o "$work/gcc" benches/c/host_kernels.c -lm
clang-19 -O3 -fopenmp -fopenmp-targets=x86_64-unknown-linux-gnu -DTARGET -Wall -Werror \
  -o "$work/clang" benches/c/host_kernels.c -lm
cargo bench -q -p offload-benches --bench host_kernels --no-run 2>/dev/null
echo "== $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "${ROUNDS:-3}"); do
  "$work/gcc" "$@" >> "$work/lines"
  cargo bench -q -p offload-benches --bench host_kernels -- "$@" 2>/dev/null | grep -P '^offload-' >> "$work/lines"
  LD_LIBRARY_PATH=$LLVM19_LIB OMP_TARGET_OFFLOAD=mandatory "$work/clang" "$@" >> "$work/lines"
  echo "round $round done, load $(cut -d' ' -f1 /proc/loadavg)" >&2
done
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$work/lines" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, case, size, secs = line.split("\t")
    runs[(case, int(size), side)].append(float(secs))
print("| case | size | side | median | rounds |")
print("|---|---|---|---|---|")
for (case, size, side), v in sorted(runs.items()):
    m = statistics.median(v)
    shown = f"{m * 1e6:.1f} us" if m < 1e-2 else f"{m * 1e3:.2f} ms"
    print(f"| {case} | {size} | {side} | {shown} | {len(v)} |")
EOF
