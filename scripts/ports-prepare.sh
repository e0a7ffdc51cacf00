# Sourced by scripts/ports-build-omp.sh and scripts/gpu/ports.sh: the programs the ports
# bench runs and how their originals are prepared for building.
#
#   ports_prepare ORIGINALS NAME-VARIANT DEST    # copies ORIGINALS/NAME-VARIANT to DEST
#
# The originals are HeCBench's (see examples/ports/README.md), kept outside the repository.
# Two changes are made: ace prints no result, so a line that prints the sums of the final
# phi and u (as the port does) is added before its first `free(phi_host);`, in both the
# CUDA and the OpenMP version; laplace's serial CPU reference (minutes, after the timed
# loop) is cut to no iteration. Nothing else is touched.
PORTS_PROGRAMS=(jacobi laplace ace)

ports_prepare() {
  local orig=$1 nv=$2 dest=$3
  [ -d "$orig/$nv" ] || { echo "no $orig/$nv: give the folder that holds jacobi-cuda, jacobi-omp, ..." >&2; return 1; }
  rm -rf "$dest" && mkdir -p "$dest" && cp -r "$orig/$nv/." "$dest/"
  case $nv in
    laplace-*)
      # Its serial CPU reference runs to convergence after the timed loop (minutes at
      # 1024^2): cut to no iteration for the bench (its PASS/FAIL line then means nothing;
      # the table compares temperature.dat cell by cell instead).
      local f=$dest/main.cpp; [ -f "$f" ] || f=$dest/main.cu
      awk '/iter <= it_max/ { n++; if (n == 2) sub(/iter <= it_max/, "iter <= 0") } { print }' "$f" > "$f.tmp" && mv "$f.tmp" "$f"
      [ "$(grep -c 'iter <= 0' "$f")" = 1 ] || { echo "$f: no reference loop to cut" >&2; return 1; }
      ;;
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
