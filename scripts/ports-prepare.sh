# Sourced by scripts/ports-build-omp.sh and scripts/gpu/ports.sh: the programs the ports
# bench runs and how their originals are prepared for building.
#
#   ports_prepare ORIGINALS NAME-VARIANT DEST    # copies ORIGINALS/NAME-VARIANT to DEST
#
# The originals are HeCBench's (see examples/ports/README.md), kept outside the repository.
# One change is made, to ace only: ace prints no result, so a line that prints the sums of
# the final phi and u (as the port does) is added before its first `free(phi_host);`, in
# both the CUDA and the OpenMP version. Nothing else is touched.
PORTS_PROGRAMS=(jacobi laplace ace)

ports_prepare() {
  local orig=$1 nv=$2 dest=$3
  [ -d "$orig/$nv" ] || { echo "no $orig/$nv: give the folder that holds jacobi-cuda, jacobi-omp, ..." >&2; return 1; }
  rm -rf "$dest" && mkdir -p "$dest" && cp -r "$orig/$nv/." "$dest/"
  case $nv in
    ace-*)
      local f=$dest/main.cpp; [ -f "$f" ] || f=$dest/main.cu
      grep -q '^  free(phi_host);' "$f" || { echo "$f: no 'free(phi_host);' line to print the checksum before" >&2; return 1; }
      sed -i '0,/^  free(phi_host);/s//  { double s_phi = 0, s_u = 0; for (int i = 0; i < vol; i++) { s_phi += ((double*)phi_host)[i]; s_u += ((double*)u_host)[i]; } printf("checksum: phi %.9e u %.9e\\n", s_phi, s_u); }\n  free(phi_host);/' "$f"
      ;;
  esac
}

# The command line each program's originals and port run with (the originals' Makefile `run`).
ports_args() {
  case $1 in
    ace) echo 100 ;;
    *) echo ;;
  esac
}
