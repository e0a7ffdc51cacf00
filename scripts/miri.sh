#!/usr/bin/env bash
# Miri over the runtime's unit tests that need no driver, thread pool or FFI call: settings,
# the present table and map-list planning (data_env), errors, generated kernels' host-twin views
# (bounds-checked atomic accesses, structs word by word, the store log), trace flags, the nowait latch,
# the fork-join team of host devices' generated kernels (its helpers, a waiting thread, the
# erased task body), the staging copy crew's claim protocol (its threads and atomics, on small copies) and its
# streaming copies' head, lines and tail (the stores themselves are inline assembly: ordinary ones here;
# populating, a system call, is a no-op),
# the memory pool's bookkeeping (on a counting fake device) and partitions. Then the small soak
# (runtime/src/soak.rs): a whole runtime on three host devices, with its device workers, nowait
# lanes and rayon kernel pools, under threads (a few minutes). Runs on the nightly pinned in
# scripts/nightly.sh, installed with Miri when missing. Arguments are passed to the test harness
# of both runs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/nightly.sh
nightly_install miri
# Module paths, matched as substrings of test names: a module's tests run here only when
# they stay clear of devices' worker threads, rayon pools and hwloc.
modules=(config:: copy_crew:: data_env:: error:: range:: macro_support:: info:: fork_join:: latch:: memory_pool:: partition::)
cargo "+$nightly" miri test -p offload --lib --no-default-features -- "${modules[@]}" "$@"

# The soak needs three flags:
# - Tree Borrows: crossbeam-epoch (under rayon's deques) breaks Stacked Borrows' rules
#   (crossbeam-rs/crossbeam#545) but not Tree Borrows', which crossbeam's own CI uses;
# - reading /sys and /proc (CPUs, NUMA nodes, memory size) fails, as on a machine without
#   them, and the runtime falls back to its defaults (isolation stays on: time is virtual);
# - host-device addresses travel as integers (kernel arguments, the present table) and are
#   cast back to pointers: permitted, without a warning on each.
# Miri's leak check stays on, but two kinds of leak are not ours and are allowed: the pool a
# host device's worker joins (rayon's `use_current_thread` leaks its WorkerThread and so the
# registry, about 10 KiB a host device, with the start handler the registry keeps: see
# KernelPool in backend/host.rs), and
# crossbeam-epoch's global collector, reachable from its static only through pointers kept
# as integers. Any other leak, or any other error, fails the run.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-tree-borrows -Zmiri-isolation-error=warn-nobacktrace -Zmiri-permissive-provenance" \
  cargo "+$nightly" miri test -p offload --lib --no-default-features -- soak:: "$@" >"$log" 2>&1 || status=$?
if [ "$status" -eq 0 ]; then
  cat "$log"
  exit 0
fi
# Every error must be a leak allocated by a rayon pool's build (or its start handler) or by
# crossbeam-epoch.
if awk '
  /^error: memory leaked/ { if (inleak && !known) bad++; inleak = 1; known = 0; leaks++; next }
  /^error: aborting due to/ { if (inleak && !known) bad++; inleak = 0; errors = $5 + 0; next }
  /^error/ { if (inleak && !known) bad++; inleak = 0; next }
  inleak && /rayon::ThreadPoolBuilder::(build|start_handler)|crossbeam_epoch::/ { known = 1 }
  /^test result: ok\./ { ok = 1 }
  END { exit !(ok && leaks > 0 && errors == leaks && !bad) }' "$log"; then
  # What ran, without the allowed leaks' backtraces.
  sed '/^error: memory leaked/,$d' "$log"
  echo "miri.sh: the soak passed; its $(grep -c '^error: memory leaked' "$log") leaks are rayon pools joined by workers and crossbeam-epoch state"
else
  cat "$log"
  echo "miri.sh: the soak failed: an error other than the allowed leaks (see above)" >&2
  exit 1
fi
