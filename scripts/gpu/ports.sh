#!/usr/bin/env bash
# The ports bench, on the GPU machine: each program's hand-written CUDA version (built here
# with nvcc), its OpenMP original (built beforehand with clang-22 by scripts/ports-build-omp.sh,
# run on libomptarget 22) and the Rust port (bundled by ../shared/gpu/bundle), side by side,
# RUNS times each (default 3, interleaved), then a table per program: time per iteration (or
# per run) of each, port / CUDA, OpenMP / port, and the outputs compared.
#
#   scripts/gpu/ports.sh ORIGINALS [NAME...]      # NAME: jacobi laplace ace (default: all three)
#
# Needs, from the repository root: ORIGINALS (the folder holding jacobi-cuda, jacobi-omp, ...;
# see examples/ports/README.md), .gpu/examples/port_<name>, .omp22/bin/<name>-omp,
# .omp22/rt.tar.xz and .omp22/env.sh. Logs, and the table, go to $OUT/ports when OUT is set.
# Environment: RUNS (3), NVCC (nvcc), NVCC_FLAGS (-O3 -std=c++17 -arch=sm_90).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
orig=$(realpath "${1:?usage: scripts/gpu/ports.sh ORIGINALS [NAME...]}")
shift
. "$root/scripts/ports-prepare.sh"
names=("$@"); [ ${#names[@]} -gt 0 ] || names=("${PORTS_PROGRAMS[@]}")
runs=${RUNS:-3}
nvcc=${NVCC:-nvcc}
read -r -a nvcc_flags <<< "${NVCC_FLAGS:--O3 -std=c++17 -arch=sm_90}"
work=$(mktemp -d /tmp/ports.XXXXXX)
logs=${OUT:+$OUT/ports}; logs=${logs:-$work/logs}; mkdir -p "$logs"
echo "ports bench: $(date -u +%FT%TZ), $(nvidia-smi -L 2>/dev/null | head -1), originals $orig, $runs runs each, work $work"
[ -f "$orig/COMMIT" ] && echo "originals' commit: $(cat "$orig/COMMIT")"
# libomptarget 22 for the OpenMP originals: unpacked once (to /tmp/omp22rt/rt), put on their
# LD_LIBRARY_PATH only (its libraries are Debian 12's: nothing else should load them)
( . "$root/.omp22/env.sh" "$root/.omp22" ) || echo "no .omp22/rt.tar.xz + env.sh: the OpenMP originals will not run"
nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sed 's/^/driver: /'
"$nvcc" --version | tail -1

for p in "${names[@]}"; do
  echo "== $p"
  port=$root/.gpu/examples/port_$p
  omp=$root/.omp22/bin/$p-omp
  [ -x "$port" ] || { echo "missing $port (run ../shared/gpu/bundle -p offload-examples here first)"; continue; }
  [ -x "$omp" ] || { echo "missing $omp (run scripts/ports-build-omp.sh ORIGINALS where clang-22 is)"; continue; }
  src=$work/src/$p-cuda
  ports_prepare "$orig" "$p-cuda" "$src" || continue
  echo "building $p-cuda: $nvcc ${nvcc_flags[*]} main.cu"
  (cd "$src" && "$nvcc" "${nvcc_flags[@]}" main.cu -o "$work/$p-cuda") > "$logs/$p-cuda-build.log" 2>&1 \
    || { tail -20 "$logs/$p-cuda-build.log"; continue; }
  read -r -a args <<< "$(ports_args "$p")"
  for r in $(seq 1 "$runs"); do
    for v in cuda omp port; do
      d=$work/run/$p-$v; mkdir -p "$d"
      case $v in
        cuda) cmd=("$work/$p-cuda") ;;
        omp) cmd=("$omp") ;;
        port) cmd=("$port") ;;
      esac
      t0=$(date +%s%N)
      if [ $v = omp ]; then
        (cd "$d" && export LD_LIBRARY_PATH=/tmp/omp22rt/rt:${LD_LIBRARY_PATH:-} OMP_TARGET_OFFLOAD=MANDATORY \
          && "${cmd[@]}" "${args[@]}") > "$logs/$p-$v-$r.log" 2>&1
      else
        (cd "$d" && "${cmd[@]}" "${args[@]}") > "$logs/$p-$v-$r.log" 2>&1
      fi
      rc=$?
      printf '  %-5s run %d: rc %d, %d ms wall\n' $v "$r" $rc $(( ($(date +%s%N) - t0) / 1000000 ))
      [ $rc -eq 0 ] || tail -5 "$logs/$p-$v-$r.log"
      # laplace writes temperature.dat: keep each version's last one for the comparison
      [ -f "$d/temperature.dat" ] && mv "$d/temperature.dat" "$work/$p-$v.dat"
    done
  done
  python3 "$root/scripts/gpu/ports_table.py" "$p" "$logs" "$work" "$runs" | tee -a "$logs/table.md"
done
echo "logs in $logs"
