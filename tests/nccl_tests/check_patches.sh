#!/usr/bin/env bash
# Checks that nccl-tests-patches/ applies to the nccl-tests checkout named by
# OPTIREDUCE_NCCL_TESTS_DIR and that optireduce_all_reduce_perf compiles and links against this
# build's liboptireduce; skipped (exit 77) when the variable is unset. Works on a copy: the
# checkout is left as it is. Uses no network. Its tag v2.19.6, when the checkout has it, is what
# the series is checked against (OPTIREDUCE_NCCL_TESTS_REF picks another revision); otherwise
# its HEAD, or its files as they are when it is not a git checkout.
#
#   check_patches.sh SOURCE_ROOT LIBOPTIREDUCE CUDA_HOME NCCL_HOME
#
# CUDA_HOME and NCCL_HOME from the environment win over the arguments (meson's cudadir and
# nccl_include). NVCC_GENCODE defaults to one architecture (sm_90) to keep the build short;
# OPTIREDUCE_NCCL_TESTS_JOBS sets make's -j (default: the number of CPUs).
set -euo pipefail

if [ -z "${OPTIREDUCE_NCCL_TESTS_DIR:-}" ]; then
  echo "skipped: set OPTIREDUCE_NCCL_TESTS_DIR to an nccl-tests checkout to check that nccl-tests-patches/ applies and compiles"
  exit 77
fi
if [ -n "${OPTIREDUCE_NCCL_TESTS_SKIP:-}" ]; then
  echo "skipped: $OPTIREDUCE_NCCL_TESTS_SKIP"
  exit 77
fi

src_root=$(realpath "$1") lib=$(realpath "$2")
export CUDA_HOME=${CUDA_HOME:-$3}
export NCCL_HOME=${NCCL_HOME:-$4}
export NVCC_GENCODE=${NVCC_GENCODE:-"-gencode=arch=compute_90,code=sm_90"}
export JOBS=${OPTIREDUCE_NCCL_TESTS_JOBS:-$(nproc)}
checkout=$OPTIREDUCE_NCCL_TESTS_DIR
[ -d "$checkout" ] || { echo "OPTIREDUCE_NCCL_TESTS_DIR=$checkout is not a folder" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/optireduce-nccl-tests.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# A copy of the checkout at the revision the series is made for.
if [ -e "$checkout/.git" ]; then
  git clone -q --shared --no-checkout "$checkout" "$tmp/nccl-tests"
  ref=${OPTIREDUCE_NCCL_TESTS_REF:-}
  if [ -z "$ref" ]; then
    if git -C "$tmp/nccl-tests" rev-parse -q --verify refs/tags/v2.19.6 >/dev/null; then
      ref=v2.19.6
    else
      ref=HEAD
    fi
  fi
  git -C "$tmp/nccl-tests" -c advice.detachedHead=false checkout -q "$ref"
  echo "nccl-tests at $ref ($(git -C "$tmp/nccl-tests" describe --tags --always))"
else
  mkdir "$tmp/nccl-tests"
  tar -C "$checkout" --exclude=./build -cf - . | tar -C "$tmp/nccl-tests" -xf -
  echo "nccl-tests: a copy of $checkout (not a git checkout)"
fi

# liboptireduce as an install prefix would lay it out, pointing at this build.
mkdir -p "$tmp/prefix/include" "$tmp/prefix/lib"
ln -s "$src_root/collectives/optireduce.h" "$tmp/prefix/include/optireduce.h"
ln -s "$lib" "$tmp/prefix/lib/liboptireduce.so"
ln -s "$lib" "$tmp/prefix/lib/liboptireduce.so.0"
export OPTIREDUCE_HOME=$tmp/prefix
unset NCCL_TESTS_DIR BUILDDIR MPI NAME_SUFFIX

bash "$src_root/nccl-tests-patches/apply-and-build.sh" "$tmp/nccl-tests"

# The binary loads (every library resolves) and the engine's flags reach nccl-tests' option
# checks; neither needs a GPU.
bin=$tmp/nccl-tests/build/optireduce_all_reduce_perf
export LD_LIBRARY_PATH="$NCCL_HOME/lib:$CUDA_HOME/lib64:$CUDA_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nm -D --undefined-only "$bin" | grep -qw optiAllReduce ||
  { echo "optireduce_all_reduce_perf does not call optiAllReduce" >&2; exit 1; }
"$bin" -h | grep -q USAGE || { echo "optireduce_all_reduce_perf -h printed no usage" >&2; exit 1; }
if out=$("$bin" -m 2 2>&1); then
  echo "optireduce_all_reduce_perf accepted -m 2 (it must refuse it: host-driven)" >&2
  exit 1
fi
grep -q -- "-m > 1" <<<"$out" || { echo "unexpected answer to -m 2: $out" >&2; exit 1; }
echo "ok: the series applies, optireduce_all_reduce_perf and all_reduce_perf build, the binary loads and refuses -m 2"
