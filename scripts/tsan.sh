#!/usr/bin/env bash
# ThreadSanitizer over the runtime crate's unit tests without default features (no CUDA, no
# hwloc: the small soak in runtime/src/soak.rs among them), then over the soak integration test
# (tests/soak.rs: 16 threads on 3 host devices, default features; GPUs are used when present, but
# their drivers are not instrumented) and the atomicity tests (tests/atomic_constructs.rs: threads
# on one shared variable, 256 regions a thread here). The standard library is rebuilt with the sanitizer
# (-Zbuild-std), so that its locks, channels and thread starts are seen; that needs nightly (the
# one pinned in scripts/nightly.sh) and rust-src, installed here when missing. A race report
# fails the run (TSan exits 66). Arguments are passed to the test harness of both runs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/nightly.sh
nightly_install
# -Zbuild-std needs an explicit target; RUSTFLAGS then reach only the target's crates, not
# build scripts and proc macros.
target=$(rustc "+$nightly" -vV | sed -n 's/^host: //p')
export RUSTFLAGS="${RUSTFLAGS:-} -Zsanitizer=thread"
export TSAN_OPTIONS="${TSAN_OPTIONS:-} halt_on_error=0 second_deadlock_stack=1"
cargo "+$nightly" test -Zbuild-std --target "$target" -p offload --lib --no-default-features -- "$@"
OFFLOAD_ATOMIC_ITERATIONS=256 cargo "+$nightly" test -Zbuild-std --target "$target" -p offload-tests \
  --test soak --test atomic_constructs -- "$@"
