#!/usr/bin/env bash
# Miri over the runtime's unit tests that need no driver, thread pool or FFI call: settings,
# the present table and map-list planning (data_env), errors, generated kernels' host-twin views
# (bounds-checked atomic accesses, structs word by word, the store log), trace flags, the nowait latch,
# the staging copy crew's claim protocol (its threads and atomics, on small copies),
# the memory pool's bookkeeping (on a counting fake device) and partitions. Installs Miri on
# the nightly toolchain when it is missing. Arguments are passed to the test harness.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly miri --version >/dev/null 2>&1; then
  rustup +nightly component add miri rust-src 2>/dev/null \
    || rustup toolchain install nightly --profile minimal --component miri,rust-src
fi
# Module paths, matched as substrings of test names: a module's tests run here only when
# they stay clear of devices' worker threads, rayon pools and hwloc.
modules=(config:: copy_crew:: data_env:: error:: generated:: info:: latch:: memory_pool:: partition::)
cargo +nightly miri test -p offload --lib --no-default-features -- "${modules[@]}" "$@"
