#!/usr/bin/env bash
# Lays out a relocatable Open MPI 4.1.4 runtime, taken from this machine's Debian 12
# packages (libopenmpi-dev openmpi-bin, installed by `scripts/setup.sh --mpi`), under
# .gpu/mpi-kit (or $1), for a GPU machine that has no MPI: launchers, libraries, the MCA
# and PMIx plugins whose dependencies are in the kit or in glibc (no UCX, libfabric,
# verbs or OpenSHMEM), help files and an env.sh that points Open MPI at the kit wherever
# it is copied (`. .gpu/mpi-kit/env.sh; mpirun -np 2 ./prog`). About 11 MB. Needs glibc
# 2.36 or later there (libevent uses arc4random).
set -euo pipefail
cd "$(dirname "$0")/../.."
K=${1:-.gpu/mpi-kit}
SYS=/usr/lib/x86_64-linux-gnu
OMPI=$SYS/openmpi/lib/openmpi3
rm -rf "$K"; mkdir -p "$K"/{bin,lib/openmpi3,lib/fallback,pmix/lib/pmix,pmix/share/pmix,share/openmpi,etc}
# launchers
cp -L /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info "$K/bin/"
ln -s orterun "$K/bin/mpirun"; ln -s orterun "$K/bin/mpiexec"
# core libs (copied under their SONAME)
for l in libmpi.so.40 libopen-rte.so.40 libopen-pal.so.40 libmca_common_sm.so.40 \
         libmca_common_monitoring.so.50 libmca_common_ompio.so.41 libpmix.so.2 \
         libevent_core-2.1.so.7 libevent_pthreads-2.1.so.7 libmunge.so.2; do
  cp -L "$SYS/$l" "$K/lib/$l"
done
# libs the GPU machine (Ubuntu 24.04) already has; only used if missing there
for l in libhwloc.so.15 libudev.so.1; do cp -L "$SYS/$l" "$K/lib/fallback/$l"; done
# MCA plugins: keep those whose deps are all in the kit or glibc
HAVE=" $(ls "$K/lib" "$K/lib/fallback" | tr '\n' ' ') libc.so.6 libm.so.6 libz.so.1 libgcc_s.so.1 libatomic.so.1 "
for f in "$OMPI"/*.so; do
  ok=1
  for d in $(ldd "$f" | awk '/=>/{print $1}'); do case "$HAVE" in *" $d "*) ;; *) ok=0;; esac; done
  if [ $ok = 1 ]; then cp "$f" "$K/lib/openmpi3/"; else echo "drop $(basename "$f")"; fi
done
# drop components we never want (OpenSHMEM, profiling/monitoring)
rm -f "$K"/lib/openmpi3/mca_{pml_monitoring,coll_monitoring,osc_monitoring}.so
cp "$SYS"/pmix2/lib/pmix/*.so "$K/pmix/lib/pmix/"
cp "$SYS"/pmix2/share/pmix/help-*.txt "$K/pmix/share/pmix/"
grep -v '^mca_base_component_path' "$SYS/pmix2/share/pmix-mca-params.conf" > "$K/pmix/share/pmix-mca-params.conf"
cp /usr/share/openmpi/help-*.txt "$K/share/openmpi/"
cp -r /usr/share/openmpi/amca-param-sets "$K/share/openmpi/"
cp /etc/openmpi/openmpi-mca-params.conf /etc/openmpi/openmpi-default-hostfile "$K/etc/"
cat > "$K/env.sh" <<'ENV'
# Source me (bash/zsh):  . /path/to/mpi-carry/env.sh
# Relocatable Open MPI 4.1.4 (Debian 12 build, external PMIx 4.2.2). Sets everything relative
# to this file's directory. In plain sh, set MPI_KIT=/path/to/mpi-carry before sourcing.
if [ -n "${BASH_SOURCE:-}" ]; then _k=${BASH_SOURCE[0]}
elif [ -n "${ZSH_VERSION:-}" ]; then _k=${(%):-%x}
else _k=${MPI_KIT:?set MPI_KIT to the kit directory}/env.sh; fi
MPI_KIT=$(cd "$(dirname "$_k")" && pwd -P); export MPI_KIT; unset _k

# Open MPI install dirs (Debian's layout is non-standard, so set each one explicitly)
export OPAL_PREFIX="$MPI_KIT"
export OPAL_EXEC_PREFIX="$MPI_KIT"
export OPAL_BINDIR="$MPI_KIT/bin"
export OPAL_LIBDIR="$MPI_KIT/lib"
export OPAL_PKGLIBDIR="$MPI_KIT/lib/openmpi3"
export OPAL_DATAROOTDIR="$MPI_KIT/share"
export OPAL_DATADIR="$MPI_KIT/share"
export OPAL_PKGDATADIR="$MPI_KIT/share/openmpi"
export OPAL_SYSCONFDIR="$MPI_KIT/etc"
export OMPI_MCA_mca_base_component_path="$MPI_KIT/lib/openmpi3"
# external PMIx
export PMIX_PREFIX="$MPI_KIT/pmix"
export PMIX_EXEC_PREFIX="$MPI_KIT/pmix"
export PMIX_LIBDIR="$MPI_KIT/pmix/lib"
export PMIX_PKGLIBDIR="$MPI_KIT/pmix/lib/pmix"
export PMIX_DATAROOTDIR="$MPI_KIT/pmix/share"
export PMIX_DATADIR="$MPI_KIT/pmix/share"
export PMIX_PKGDATADIR="$MPI_KIT/pmix/share/pmix"
export PMIX_SYSCONFDIR="$MPI_KIT/pmix/share"
export PMIX_MCA_mca_base_component_path="$MPI_KIT/pmix/lib/pmix"

# Single host, no ssh/rsh needed (without this mpirun AND singleton MPI_Init fail when ssh is absent)
export OMPI_MCA_plm=isolated
# mpirun binds each rank to ONE core by default when np <= 2 (to socket/NUMA when np > 2), which
# starves a multi-threaded runtime: do not bind unless the caller chose a policy (== --bind-to none)
export OMPI_MCA_hwloc_base_binding_policy="${OMPI_MCA_hwloc_base_binding_policy:-none}"
# Running as root (containers): same as --allow-run-as-root, only when root
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

export PATH="$MPI_KIT/bin:$PATH"
_ll="$MPI_KIT/lib"
# libhwloc.so.15 / libudev.so.1: use the system's when present, else the kit's copies
# (MPI_KIT_FALLBACK=1 forces the kit's copies)
for _l in libhwloc.so.15 libudev.so.1; do
  _p=$(/sbin/ldconfig -p 2>/dev/null | awk -v l="$_l" '$1==l && /x86-64/ {print $NF; exit}')
  if [ "${MPI_KIT_FALLBACK:-0}" = 1 ] || [ -z "$_p" ] || [ ! -s "$_p" ]; then
    _ll="$_ll:$MPI_KIT/lib/fallback"; break
  fi
done
export LD_LIBRARY_PATH="$_ll${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _l _ll _p
ENV
echo "MPI kit in $K: $(du -sh "$K" | cut -f1)"
