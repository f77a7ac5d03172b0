#!/usr/bin/env bash
# Applies this folder's patch series (optireduce_all_reduce_perf, made against NVIDIA/nccl-tests
# v2.19.6) to an nccl-tests checkout and builds all_reduce_perf and optireduce_all_reduce_perf.
#
#   nccl-tests-patches/apply-and-build.sh [--all] [NCCL_TESTS_DIR]
#
# The checkout is the argument, else $NCCL_TESTS_DIR. A patch already applied is skipped, so the
# script can be run again (after a change to liboptireduce, say). --all builds every nccl-tests
# binary instead of the two.
#
# Environment:
#   OPTIREDUCE_HOME  (required) the prefix liboptireduce is installed to: include/optireduce.h and
#                    liboptireduce.so under lib/, lib64/ or lib/<multiarch>/ (what
#                    `meson install` writes for --prefix=OPTIREDUCE_HOME; with --destdir D, the
#                    prefix is D/usr/local unless configured otherwise)
#   CUDA_HOME        CUDA toolkit (default /usr/local/cuda): bin/nvcc, libcudart
#   NCCL_HOME        NCCL: include/nccl.h and libnccl.so (default: CUDA_HOME, /usr or /usr/local,
#                    whichever holds include/nccl.h)
#   MPI, MPI_HOME    MPI=1 builds the MPI variant (several processes; needs MPI_HOME); default 0
#   NVCC_GENCODE     GPU architectures (nccl-tests' default: every one this CUDA supports; one,
#                    e.g. "-gencode=arch=compute_90,code=sm_90", builds much faster)
#   BUILDDIR         where binaries go (default: <checkout>/build)
#   JOBS             parallel make jobs (default: the number of CPUs)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
base_tag=v2.19.6

die() {
  echo "apply-and-build: $*" >&2
  exit 1
}

all=0
dir=""
for a in "$@"; do
  case "$a" in
    --all) all=1 ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    -*) die "unknown option $a (see --help)" ;;
    *) [ -z "$dir" ] || die "one checkout at a time (got $dir and $a)"; dir=$a ;;
  esac
done
dir=${dir:-${NCCL_TESTS_DIR:-}}
[ -n "$dir" ] || die "no nccl-tests checkout: pass its path or set NCCL_TESTS_DIR (git clone https://github.com/NVIDIA/nccl-tests; git checkout $base_tag)"
if [ ! -f "$dir/src/common.cu" ] || [ ! -f "$dir/src/Makefile" ]; then
  die "$dir is not an nccl-tests checkout (no src/common.cu, src/Makefile)"
fi
dir=$(cd "$dir" && pwd)

# --- what the build needs ---------------------------------------------------------------------
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -x "$CUDA_HOME/bin/nvcc" ] || die "no nvcc in CUDA_HOME=$CUDA_HOME/bin: set CUDA_HOME to the CUDA toolkit"
cuda_lib=""
for d in lib64 lib; do
  if [ -e "$CUDA_HOME/$d/libcudart.so" ]; then cuda_lib=$CUDA_HOME/$d; break; fi
done
[ -n "$cuda_lib" ] || die "no libcudart.so in $CUDA_HOME/lib64 or $CUDA_HOME/lib"

if [ -z "${NCCL_HOME:-}" ]; then
  for d in "$CUDA_HOME" /usr /usr/local; do
    if [ -f "$d/include/nccl.h" ]; then NCCL_HOME=$d; break; fi
  done
  [ -n "${NCCL_HOME:-}" ] || die "no nccl.h in $CUDA_HOME/include, /usr/include or /usr/local/include: set NCCL_HOME to NCCL's prefix"
  echo "apply-and-build: NCCL_HOME=$NCCL_HOME (found include/nccl.h there)"
fi
[ -f "$NCCL_HOME/include/nccl.h" ] || die "no nccl.h in NCCL_HOME=$NCCL_HOME/include"
multiarch=$(gcc -print-multiarch 2>/dev/null || true)
nccl_lib=""
for d in lib lib64 ${multiarch:+lib/$multiarch}; do
  if [ -e "$NCCL_HOME/$d/libnccl.so" ]; then nccl_lib=$NCCL_HOME/$d; break; fi
done
[ -n "$nccl_lib" ] || die "no libnccl.so under NCCL_HOME=$NCCL_HOME (lib, lib64${multiarch:+, lib/$multiarch})"

[ -n "${OPTIREDUCE_HOME:-}" ] || die "OPTIREDUCE_HOME is not set: install liboptireduce (meson setup build --prefix=\$HOME/optireduce && meson install -C build) and set OPTIREDUCE_HOME to that prefix"
[ -f "$OPTIREDUCE_HOME/include/optireduce.h" ] ||
  die "no optireduce.h in OPTIREDUCE_HOME=$OPTIREDUCE_HOME/include: OPTIREDUCE_HOME must be the prefix liboptireduce was installed to"
opti_lib=""
for d in lib lib64 ${multiarch:+lib/$multiarch}; do
  if [ -e "$OPTIREDUCE_HOME/$d/liboptireduce.so" ]; then opti_lib=$OPTIREDUCE_HOME/$d; break; fi
done
[ -n "$opti_lib" ] || die "no liboptireduce.so under OPTIREDUCE_HOME=$OPTIREDUCE_HOME (lib, lib64${multiarch:+, lib/$multiarch})"

MPI=${MPI:-0}
if [ "$MPI" = 1 ]; then
  if [ -z "${MPI_HOME:-}" ] || [ ! -f "$MPI_HOME/include/mpi.h" ]; then
    die "MPI=1 needs MPI_HOME with include/mpi.h (e.g. /usr/lib/x86_64-linux-gnu/openmpi)"
  fi
fi
command -v make >/dev/null || die "make is not installed"

# --- apply ------------------------------------------------------------------------------------
patches=("$here"/0*.patch)
[ -e "${patches[0]}" ] || die "no patches in $here"
if [ -e "$dir/.git" ]; then
  can_apply() { git -C "$dir" apply --check "$1" 2>/dev/null; }
  applied() { git -C "$dir" apply --reverse --check "$1" 2>/dev/null; }
  apply() { git -C "$dir" apply "$1"; }
  where=$(git -C "$dir" describe --tags --always 2>/dev/null || echo "unknown revision")
else
  command -v patch >/dev/null || die "$dir is not a git checkout and patch(1) is not installed"
  can_apply() { patch -d "$dir" -p1 --forward --dry-run --silent <"$1" >/dev/null 2>&1; }
  applied() { patch -d "$dir" -p1 --reverse --dry-run --silent <"$1" >/dev/null 2>&1; }
  apply() { patch -d "$dir" -p1 --forward --silent <"$1"; }
  where="a tree without git"
fi
for p in "${patches[@]}"; do
  name=$(basename "$p")
  if can_apply "$p"; then
    apply "$p"
    echo "apply-and-build: applied $name"
  elif applied "$p"; then
    echo "apply-and-build: $name is already applied"
  else
    die "$name does not apply to $dir ($where); the series is made against nccl-tests $base_tag"
  fi
done

# --- build ------------------------------------------------------------------------------------
BUILDDIR=${BUILDDIR:-$dir/build}
mkdir -p "$BUILDDIR"
BUILDDIR=$(cd "$BUILDDIR" && pwd)
suffix=${NAME_SUFFIX:-}
make_args=(-C "$dir/src" -j"${JOBS:-$(nproc)}" MPI="$MPI" CUDA_HOME="$CUDA_HOME" CUDA_LIB="$cuda_lib"
  NCCL_HOME="$NCCL_HOME" OPTIREDUCE_HOME="$OPTIREDUCE_HOME" OPTIREDUCE_LIB="$opti_lib"
  BUILDDIR="$BUILDDIR")
if [ "$MPI" = 1 ]; then make_args+=(MPI_HOME="$MPI_HOME"); fi
if [ -n "${NVCC_GENCODE:-}" ]; then make_args+=(NVCC_GENCODE="$NVCC_GENCODE"); fi
if [ -n "$suffix" ]; then make_args+=(NAME_SUFFIX="$suffix"); fi
if [ "$all" = 1 ]; then
  targets=(build)
else
  targets=("$BUILDDIR/all_reduce_perf$suffix" "$BUILDDIR/optireduce_all_reduce_perf$suffix")
fi
# nccl-tests' Makefile links libnccl from NCCL_HOME/lib only.
if [ "$nccl_lib" != "$NCCL_HOME/lib" ]; then
  export LIBRARY_PATH="$nccl_lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
fi
echo "apply-and-build: make ${targets[*]}"
make "${make_args[@]}" "${targets[@]}"

for b in all_reduce_perf optireduce_all_reduce_perf; do
  [ -x "$BUILDDIR/$b$suffix" ] || die "the build did not produce $BUILDDIR/$b$suffix"
done
echo "apply-and-build: built $BUILDDIR/all_reduce_perf$suffix and $BUILDDIR/optireduce_all_reduce_perf$suffix"
echo "apply-and-build: at run time libnccl.so.2 must be found (LD_LIBRARY_PATH=$nccl_lib) and, for the plugin, libnccl-net-optireduce.so (NCCL_NET_PLUGIN=optireduce; see docs/gpu.md)"
