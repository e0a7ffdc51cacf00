#!/usr/bin/env bash
# Feature `mpi` on host devices: installs Open MPI, lints and tests with the feature (the
# cluster test as one process, then under mpirun -np 3), then runs Jacobi and the 3-D
# stencil under mpirun -np 2 and -np 3 and compares each run's result line (final norm
# within 1e-5, grid digest bit for bit) with the single-process run's. Each MPI run also
# checks its gathered grid against a single-process run itself (-check).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh --mpi
features=offload-examples/mpi,offload-tests/mpi
cargo clippy --workspace --all-targets --features "$features" -- -D warnings
cargo test --workspace --features "$features"
mpirun=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
cluster=$(cargo test -p offload-tests --features mpi --test cluster --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*cluster-[^"]*\)".*/\1/p' | head -1)
"${mpirun[@]}" -np 3 "$cluster"
cargo build --release -p offload-examples --features mpi --example jacobi --example stencil3d
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
  want=$(./target/release/examples/"${cmd[0]}" "${cmd[@]:1}" | grep '^result:')
  for np in 2 3; do
    got=$("${mpirun[@]}" -np "$np" ./target/release/examples/"${cmd[0]}" "${cmd[@]:1}" -check | grep '^result:') || {
      echo "FAILED: mpirun -np $np $run"; failed=$((failed + 1)); continue; }
    compare "mpirun -np $np $run" "$want" "$got"
  done
done
echo "mpi runs: $failed failed"
[ "$failed" -eq 0 ]
