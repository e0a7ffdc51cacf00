# Sourced by scripts that run C programs on libomptarget's host plugin (differential.sh,
# host-launch.sh): Debian's clang-19 with OpenMP offloading to the host.

# Where libomptarget 19 and its host plugin live (LD_LIBRARY_PATH for the programs).
LLVM19_LIB=/usr/lib/llvm-19/lib

# Installs clang-19, clang-tools-19 (clang-linker-wrapper, which offloading links through)
# and libomp-19-dev (libomptarget and its host plugin) unless they are there already.
install_llvm19() {
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  if ! command -v clang-19 >/dev/null 2>&1 || [ ! -e "$LLVM19_LIB/libomptarget.so" ] ||
    [ ! -x /usr/lib/llvm-19/bin/clang-linker-wrapper ]; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang-19 clang-tools-19 libomp-19-dev >/dev/null
  fi
}
