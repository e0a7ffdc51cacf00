# Sourced by scripts/miri.sh and scripts/tsan.sh: the one nightly toolchain both run on. It is
# pinned because a newer nightly's Miri (from 2026-09-11, rust-lang/rust#161734) type-checks
# the variadic arguments of syscall(), and parking_lot_core 0.9.12 passes its futex word as
# `&AtomicI32` where `*mut u32` is expected: a report on every parked thread that is not about
# this crate. Move the pin forward when a parking_lot_core release casts the pointer.
# OFFLOAD_NIGHTLY overrides it.
nightly="${OFFLOAD_NIGHTLY:-nightly-2026-05-20}"

# Installs the pinned nightly, or the named components of it (rust-src always), when missing.
nightly_install() {
  local installed missing=() c
  installed=$(rustup "+$nightly" component list --installed 2>/dev/null || true)
  for c in rust-src "$@"; do
    grep -q "^$c" <<<"$installed" || missing+=("$c")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    rustup toolchain install "$nightly" --profile minimal --component "$(IFS=,; echo "${missing[*]}")"
  fi
}
