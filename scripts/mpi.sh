#!/usr/bin/env bash
# Feature `mpi` on host devices: installs Open MPI, runs the tests of the code it adds (the crates' unit tests, the cluster test as one
# process, then under mpirun -np 3; the rest of the suite does not change with it and runs
# in scripts/test.sh), then runs Jacobi and the 3-D stencil under mpirun -np 2 and -np 3
# and compares each run's result line (final norm within 1e-5, grid digest bit for bit)
# with the single-process run's; then both on grids of parts split in 2-D and 3-D over
# 3, 4 and 8 ranks, compared the same way. Each MPI run also checks its gathered grid against a
# single-process run itself (-check). Then a traced run: one timeline file per rank. The
# examples run in the dev profile the tests built (small grids: seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh --mpi
features=offload-examples/mpi,offload-tests/mpi
cargo test --workspace --features "$features" --lib --test cluster
cargo build --workspace --features "$features" --examples
examples=${CARGO_TARGET_DIR:-target}/debug/examples
mpirun=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
cluster=$(cargo test --workspace --features "$features" --test cluster --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*cluster-[^"]*\)".*/\1/p' | head -1)
"${mpirun[@]}" -np 3 "$cluster"
failed=0
compare() { # name, reference result line, run's result line
  python3 - "$@" <<'PY' || failed=$((failed + 1))
import re, sys
name, want, got = sys.argv[1:]
num = lambda s: [float(x) for x in re.findall(r"norm ([0-9.]+)", s)]
dig = lambda s: re.findall(r"digest (0x[0-9a-f]+)", s)
ok = dig(want) == dig(got) and dig(got) and all(abs(a - b) <= 1e-5 * max(abs(a), 1e-30) for a, b in zip(num(want), num(got)))
print(("agree: " if ok else "DIFFER: ") + f"{name}: {got.strip()} (single process: {want.strip()})")
sys.exit(0 if ok else 1)
PY
}
export OFFLOAD_HOST_DEVICES=2
runs=("jacobi -nx 256 -ny 203 -niter 60" "jacobi -nx 190 -ny 67 -niter 41 -kernel generated" "stencil3d -nx 40 -ny 33 -nz 29 -niter 17")
for run in "${runs[@]}"; do
  read -r -a cmd <<<"$run"
  want=$("$examples/${cmd[0]}" "${cmd[@]:1}" | grep '^result:')
  for np in 2 3; do
    got=$("${mpirun[@]}" -np "$np" "$examples/${cmd[0]}" "${cmd[@]:1}" -check | grep '^result:') || {
      echo "FAILED: mpirun -np $np $run"; failed=$((failed + 1)); continue; }
    compare "mpirun -np $np $run" "$want" "$got"
  done
done
# Grids split in 2-D and 3-D over the ranks (-grid): Jacobi as 2 x 2 parts on 4 ranks and
# 2 x 3 on 3, the stencil as 2 x 2 x 2 boxes on 8 ranks and 1 x 2 x 2 on 4, each rank's
# grid gathered to rank 0 and compared with the single-process run (one host device a
# rank: 8 ranks on 2 cores).
grid_runs=("4 jacobi -nx 190 -ny 67 -niter 41 -kernel generated -grid 2x2"
  "3 jacobi -nx 130 -ny 67 -niter 21 -grid 2x3"
  "8 stencil3d -nx 40 -ny 33 -nz 29 -niter 17 -grid 2x2x2"
  "4 stencil3d -nx 40 -ny 33 -nz 29 -niter 17 -grid 1x2x2")
for run in "${grid_runs[@]}"; do
  read -r -a cmd <<<"$run"
  np=${cmd[0]}; cmd=("${cmd[@]:1}")
  plain=("${cmd[@]:0:${#cmd[@]}-2}")
  want=$(OFFLOAD_HOST_DEVICES=1 "$examples/${plain[0]}" "${plain[@]:1}" | grep '^result:')
  got=$(OFFLOAD_HOST_DEVICES=1 "${mpirun[@]}" -np "$np" "$examples/${cmd[0]}" "${cmd[@]:1}" -check | grep '^result:') || {
    echo "FAILED: mpirun -np $np ${cmd[*]}"; failed=$((failed + 1)); continue; }
  compare "mpirun -np $np ${cmd[*]}" "$want" "$got"
done
# OFFLOAD_HALO=nccl on host devices: every rank falls back to staging and says why; the
# grid is the one the other engines give.
want=$(OFFLOAD_HOST_DEVICES=1 "$examples/jacobi" -nx 190 -ny 67 -niter 41 -kernel generated | grep '^result:')
out=$(OFFLOAD_HOST_DEVICES=1 "${mpirun[@]}" -np 4 env OFFLOAD_HALO=nccl "$examples/jacobi" -nx 190 -ny 67 \
  -niter 41 -kernel generated -grid 2x2 -check) || { echo "FAILED: the nccl fallback run"; failed=$((failed + 1)); }
if ! grep -q "OFFLOAD_HALO=nccl, but" <<<"$out"; then
  echo "FAILED: the nccl fallback gave no reason: $(grep -i engine <<<"$out")"; failed=$((failed + 1))
fi
compare "mpirun -np 4 OFFLOAD_HALO=nccl jacobi -grid 2x2" "$want" "$(grep '^result:' <<<"$out")"
# A timeline per rank: OFFLOAD_TRACE=x.json under mpirun -np 2 writes x.rank0.json and
# x.rank1.json, each a whole trace whose processes carry the rank.
trace=$(mktemp -d)
"${mpirun[@]}" -np 2 env OFFLOAD_TRACE="$trace/jacobi.json" "$examples/jacobi" -nx 128 -ny 96 -niter 5 >/dev/null || {
  echo "FAILED: the traced mpirun"; failed=$((failed + 1)); }
python3 - "$trace" <<'PY' || failed=$((failed + 1))
import json, os, sys
d = sys.argv[1]
for r in (0, 1):
    ev = json.load(open(os.path.join(d, f"jacobi.rank{r}.json")))["traceEvents"]
    names = {e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    kernels = sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel")
    assert f"rank {r}: device 0" in names and kernels > 0, (r, names, kernels)
    print(f"rank {r}: a trace of {len(ev)} events, {kernels} kernels, processes {sorted(names)}")
assert not os.path.exists(os.path.join(d, "jacobi.json")), "one file for all ranks"
PY
rm -rf "$trace"
echo "mpi runs: $failed failed"
[ "$failed" -eq 0 ]
