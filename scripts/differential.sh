#!/usr/bin/env bash
# Differential tests against LLVM's OpenMP runtime (and, at the end, the ports whose C
# original is ours: examples/ports/c/). Each C program in tests/differential/
# is compiled by Debian's clang-19 with OpenMP offloading to the host
# (-fopenmp-targets=x86_64-unknown-linux-gnu) and run on libomptarget's host plugin (four
# host devices) under OMP_TARGET_OFFLOAD=mandatory; its Rust twin (examples/differential.rs,
# the same steps through offload::omp on four host devices) runs beside it. Their printed
# lines are compared one by one; a line listed below as a known difference is reported, not
# failed, and every other line must agree. Ends with "N passed, M failed"; exits 1 if any
# line failed.
#
# A program may ask for runs of its own with comment lines `/* run NAME: WORDS */`, each run
# compared as family/NAME: a word VAR=value sets VAR for both sides (OMP_TARGET_OFFLOAD, say),
# and the word `no-devices` runs both without a device: the C program built with an offload
# image that no plugin here can run (nvptx64, JIT-compiled, so no CUDA toolkit is needed;
# the CUDA plugin finds no driver, so libomptarget has 0 devices), the twin with
# OFFLOAD_HOST_DEVICES=0.
set -euo pipefail
cd "$(dirname "$0")/.."

# Known differences: "family|llvm's line" -> "offload's line|why". Both lines must be the
# ones given, so that a change on either side shows.
declare -A known=(
  ["ordering|case 42: host 0"]="case 42: host 222|LLVM 19 decides copies item by item, not over the construct's list (OpenMP 5.x; docs/SEMANTICS.md R2): its from(x) between two alloc(x) never copies back"
  ["ordering|case 43: host 333"]="case 43: host 222|LLVM 19 decides item by item (R2): with alloc, from, to, alloc of one x in one launch it copies in and back as if the items were separate constructs"
  ["ordering|case 44: host 0"]="case 44: host 222|LLVM 19 decides item by item (R2): enter alloc(x) to(x) of an absent x skips the copy, and exit delete from delete never copies back"
  ["use_device|use_device_ptr of unmapped C: C itself 0, null 1"]="use_device_ptr of unmapped C: C itself 1, null 0|LLVM 19 nulls a use_device_ptr that points into nothing mapped; OpenMP 5.1 (and LLVM since, as its default 'preserve' fallback) keeps the host address, as offload does (docs/PORTING.md)"
  ["members|t.i present 1, t.pad present 1, t.j present 1"]="t.i present 1, t.pad present 0, t.j present 1|libomptarget gives struct members mapped by one construct one device block (the padding between them included); offload makes an entry per member (docs/PORTING.md: map the enclosing object to index across members)"
  ["initial_device|omp_initial_device: set_default_device, then the default is the initial device 0"]="omp_initial_device: set_default_device, then the default is the initial device 1|libomptarget 19 keeps -1 as the default device number; offload makes the initial device the default (omp_get_default_device() then gives its number)"
  ["initial_device|omp_initial_device: alloc: fails"]="omp_initial_device: alloc, host writes, free|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above"
  ["initial_device|omp_initial_device: is_present: fails"]="omp_initial_device: is_present 1|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above"
  ["initial_device|omp_initial_device: mapped_ptr: fails"]="omp_initial_device: mapped_ptr is the host address 1|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above"
  ["initial_device|omp_initial_device: associate_ptr: fails"]="omp_initial_device: associate_ptr returns -1|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above (an error there, as on the initial device number)"
  ["initial_device|omp_initial_device: disassociate_ptr: fails"]="omp_initial_device: disassociate_ptr returns -1|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above (an error there, as on the initial device number)"
  ["initial_device|omp_initial_device: memcpy: fails"]="omp_initial_device: memcpy 0 y 4|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above"
  ["initial_device|omp_initial_device: memcpy through device 0: fails"]="omp_initial_device: memcpy through device 0 y 3|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above"
  ["initial_device|omp_initial_device: memset: fails"]="omp_initial_device: memset returns the pointer 1 y 7070707|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above"
  ["initial_device|omp_initial_device: memcpy_rect: fails"]="omp_initial_device: memcpy_rect 0 y 2|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above"
  ["initial_device|omp_initial_device: memcpy_async: fails"]="omp_initial_device: memcpy_async 0 y 2|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above"
  ["initial_device|omp_initial_device: memcpy_rect_async: fails"]="omp_initial_device: memcpy_rect_async 0 y 3|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above"
  ["initial_device|omp_initial_device: memset_async: fails"]="omp_initial_device: memset_async returns the pointer 1 y 9090909|libomptarget 19 does not take omp_initial_device (OpenMP 5.1) in its memory routines (fatal: Device number -1 out of range); offload takes it for the initial device, as the line with omp_get_initial_device() above"
  ["initial_device|omp_initial_device: target ran on host memory 0"]="omp_initial_device: target ran on host memory 1|libomptarget 19 reads device(-1) as its default-device value (OFFLOAD_DEVICE_DEFAULT), so the construct runs on device 0; offload runs it on the initial device, as OpenMP 5.1 says"
  ["initial_device|omp_initial_device: enter data, present on device 0 1"]="omp_initial_device: enter data, present on device 0 0|libomptarget 19 reads device(-1) as its default-device value (OFFLOAD_DEVICE_DEFAULT), so the construct runs on device 0; offload runs it on the initial device, as OpenMP 5.1 says"
  ["initial_device|omp_initial_device: target data, present on device 0 1"]="omp_initial_device: target data, present on device 0 0|libomptarget 19 reads device(-1) as its default-device value (OFFLOAD_DEVICE_DEFAULT), so the construct runs on device 0; offload runs it on the initial device, as OpenMP 5.1 says"
  ["initial_device|omp_initial_device: enter data nowait, present on device 0 1"]="omp_initial_device: enter data nowait, present on device 0 0|libomptarget 19 reads device(-1) as its default-device value (OFFLOAD_DEVICE_DEFAULT), so the construct runs on device 0; offload runs it on the initial device, as OpenMP 5.1 says"
  ["initial_device|omp_initial_device: use_device_ptr is the host address 0"]="omp_initial_device: use_device_ptr is the host address 1|libomptarget 19 reads device(-1) as its default-device value (OFFLOAD_DEVICE_DEFAULT), so the construct runs on device 0; offload runs it on the initial device, as OpenMP 5.1 says"
  ["policy/mandatory-no-device|routine: set_default_device(2): returns, then the default is the initial device 0"]="routine: set_default_device(2): fails|libomptarget 19 takes any number in omp_set_default_device without a check; offload refuses a device that does not exist (R9)"
  ["policy/mandatory-no-device|construct: target if(0): ran on host memory 1"]="construct: target if(0): fails|open: C's if(0) makes no runtime call, so it runs on the host; offload's if_device(false, d) gives the initial device's number, and under mandatory with no device every construct fails there (R9)"
  ["policy/disabled|queries: devices 4 initial 4 default is initial 0 is_initial_device 1"]="queries: devices 0 initial 0 default is initial 1 is_initial_device 1|libomptarget 19 still counts its devices under disabled; offload has none then, so everything runs on the initial device (R9)"
  ["policy/disabled|routine: set_default_device(2): returns, then the default is the initial device 0"]="routine: set_default_device(2): returns, then the default is the initial device 1|both take any number under disabled; libomptarget 19 keeps it as the default, offload (no devices under disabled) keeps the initial device"
  ["policy/disabled|routine: alloc on device 1: not null 1"]="routine: alloc on device 1: fails|libomptarget 19 still has its devices under disabled (its memory routines use them); offload has none then (R9)"
)

# shellcheck source=scripts/llvm19.sh
. scripts/llvm19.sh
install_llvm19
lib=$LLVM19_LIB
cargo build -q -p offload-examples --example differential
twin=${CARGO_TARGET_DIR:-target}/debug/examples/differential
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
host_image=(-fopenmp-targets=x86_64-unknown-linux-gnu)
no_device_image=(-fopenmp-targets=nvptx64-nvidia-cuda --offload-arch=sm_80 -nocudalib -fopenmp-target-jit)

passed=0; failed=0; known_seen=0
# compare LABEL LLVM_OUTPUT OFFLOAD_OUTPUT: line by line, against the known differences.
compare() {
  local label=$1 l r entry i n
  mapfile -t a < "$2"
  mapfile -t b < "$3"
  n=${#a[@]}; [ ${#b[@]} -gt "$n" ] && n=${#b[@]}
  for ((i = 0; i < n; i++)); do
    l=${a[$i]:-<no line>}; r=${b[$i]:-<no line>}
    if [ "$l" = "$r" ]; then
      passed=$((passed + 1))
      continue
    fi
    entry=${known["$label|$l"]:-}
    if [ -n "$entry" ] && [ "${entry%%|*}" = "$r" ]; then
      known_seen=$((known_seen + 1))
      echo "known  $label: llvm '$l', offload '$r': ${entry#*|}"
    else
      failed=$((failed + 1))
      echo "FAILED $label line $((i + 1)): llvm '$l', offload '$r'"
    fi
  done
  echo "$label: ${#a[@]} lines compared"
}

for c in tests/differential/*.c; do
  family=$(basename "$c" .c)
  runs=$(sed -n 's|^/\* run \([A-Za-z0-9_-]*\): \(.*\) \*/$|\1 \2|p' "$c")
  [ -n "$runs" ] || runs="-"
  while read -r name words; do
    label=$family; [ "$name" = "-" ] || label="$family/$name"
    image=("${host_image[@]}")
    llvm_env=(LD_LIBRARY_PATH="$lib" OMP_TARGET_OFFLOAD=mandatory)
    twin_env=(OMP_TARGET_OFFLOAD=mandatory)
    for w in $words; do
      case $w in
        no-devices) image=("${no_device_image[@]}"); twin_env+=(OFFLOAD_HOST_DEVICES=0) ;;
        *=*) llvm_env+=("$w"); twin_env+=("$w") ;;
        *) echo "FAILED $label: unknown run word '$w'"; failed=$((failed + 1)); continue 2 ;;
      esac
    done
    exe="$work/$family.${image[0]##*=}"
    # A program that does not build or run to its end fails its run, and the run goes on.
    if [ ! -x "$exe" ] && ! clang-19 -fopenmp "${image[@]}" -Wall -Werror -o "$exe" "$c" < /dev/null; then
      echo "FAILED $label: does not compile"; failed=$((failed + 1)); continue
    fi
    # The C program's children that libomptarget ends (ATTEMPT in common.h) print its
    # fatal errors on stderr: kept in a file, shown if the program itself fails.
    if ! env "${llvm_env[@]}" "$exe" < /dev/null > "$work/out.llvm" 2> "$work/err.llvm"; then
      echo "FAILED $label: the libomptarget program ended with an error:"; cat "$work/err.llvm"
      failed=$((failed + 1))
    fi
    if ! env "${twin_env[@]}" "$twin" "$family" < /dev/null > "$work/out.offload"; then
      echo "FAILED $label: the offload twin ended with an error"; failed=$((failed + 1))
    fi
    compare "$label" "$work/out.llvm" "$work/out.offload"
  done <<< "$runs"
done
# Ports whose C original is our own (examples/ports/c/NAME.c, the port example port_NAME):
# each `port run: ARGS` line of the C file runs both with ARGS, the C program on
# libomptarget's host plugin, the port on host devices; their lines must be equal but for
# those starting with '#' (times).
for c in examples/ports/c/*.c; do
  name=$(basename "$c" .c)
  cargo build -q -p offload-examples --example "port_$name"
  port=${CARGO_TARGET_DIR:-target}/debug/examples/port_$name
  exe="$work/port-$name"
  if ! clang-19 -fopenmp "${host_image[@]}" -O2 -Wall -Werror -o "$exe" "$c" -lm < /dev/null; then
    echo "FAILED ports/$name: does not compile"; failed=$((failed + 1)); continue
  fi
  while read -r args; do
    label="ports/$name $args"
    # shellcheck disable=SC2086 # the run's arguments are words
    if ! LD_LIBRARY_PATH="$lib" OMP_TARGET_OFFLOAD=mandatory "$exe" $args < /dev/null 2> "$work/err.llvm" \
      | grep -v '^#' > "$work/out.llvm"; then
      echo "FAILED $label: the libomptarget program ended with an error:"; cat "$work/err.llvm"
      failed=$((failed + 1))
    fi
    # shellcheck disable=SC2086
    if ! OFFLOAD_HOST_DEVICES=1 "$port" $args < /dev/null | grep -v '^#' > "$work/out.offload"; then
      echo "FAILED $label: the port ended with an error"; failed=$((failed + 1))
    fi
    compare "$label" "$work/out.llvm" "$work/out.offload"
  done < <(sed -n 's|^ \* port run: \(.*\)$|\1|p' "$c")
done
echo "$known_seen known differences (listed above, with the reason)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
