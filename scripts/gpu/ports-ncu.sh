#!/usr/bin/env bash
# Kernel time per iteration of the ports and of their CUDA versions, by ncu (clock control
# off), on the GPU machine: with the iteration times of scripts/gpu/ports.sh, the time an
# iteration spends outside kernels. Profiles 60 launches after 300, and prints each
# kernel's median duration.
#   scripts/gpu/ports-ncu.sh ORIGINALS [NAME...]     # jacobi laplace
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
orig=$(realpath "${1:?usage: scripts/gpu/ports-ncu.sh ORIGINALS [NAME...]}"); shift
. "$root/scripts/ports-prepare.sh"
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(jacobi laplace)
work=$(mktemp -d /tmp/ncu.XXXXXX)
medians() { # ncu CSV on stdin -> "kernel: median us (count)"
  python3 -c '
import csv, sys, statistics, collections
rows = [r for r in csv.reader(l for l in sys.stdin if l.startswith("\""))]
if not rows: sys.exit("no ncu rows")
h = rows[0]; k = h.index("Kernel Name"); v = h.index("Metric Value"); u = h.index("Metric Unit")
d = collections.defaultdict(list)
for r in rows[1:]:
    x = float(r[v].replace(",", "")); unit = r[u].strip().lower()
    x = x / 1000 if unit in ("nsecond", "ns") else (x * 1000 if unit in ("msecond", "ms") else x)
    d[r[k].split("(")[0]].append(x)
for name, xs in d.items(): print("  %-40s median %9.2f us over %d launches" % (name[:40], statistics.median(xs), len(xs)))
'
}
for p in "${names[@]}"; do
  src=$work/$p-cuda; ports_prepare "$orig" "$p-cuda" "$src" || continue
  (cd "$src" && nvcc -O3 -std=c++17 -arch=sm_90 main.cu -o "$work/$p-cuda.bin") > "$work/$p-build.log" 2>&1 \
    || { echo "$p-cuda: build failed"; tail -5 "$work/$p-build.log"; continue; }
  case $p in
    jacobi) port_args=(-reps 1 -warmup 0 -max_iters 400) ;;
    laplace) port_args=(-reps 1 -warmup 0 -it_max 400 -out -) ;;
  esac
  for v in cuda port; do
    if [ $v = cuda ]; then cmd=("$work/$p-cuda.bin"); else cmd=("$root/.gpu/examples/port_$p" "${port_args[@]}"); fi
    echo "== $p $v"
    (cd "$work" && timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip 300 \
      --launch-count 60 --csv "${cmd[@]}" 2>/dev/null) | medians
  done
done
