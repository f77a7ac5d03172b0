#!/usr/bin/env bash
# GPU smoke test (docs/gpu.md): two ranks on this host, made two "nodes" by NCCL_HOSTID so that
# NCCL sends their traffic through the OptiReduce plugin, run
#   1. all_reduce_perf with NCCL_NET=OptiReduce (exact delivery, nccl-tests' #wrong check), and
#   2. optireduce_all_reduce_perf with OPTIREDUCE_ALLREDUCE_MODE=bounded (liboptireduce's sibling
#      communicator bounded, the test's own exact),
# and checks the log lines that show the plugin carried the traffic. Exits 0 when both pass, 1
# when one fails, 77 (skipped) when this host has no GPU.
#
#   nccl-tests-patches/gpu-smoke.sh
#
# Environment:
#   NCCL_TESTS_BUILD  nccl-tests' build folder, with both binaries built with MPI=1
#                     (apply-and-build.sh; default: $NCCL_TESTS_DIR/build)
#   OPTIREDUCE_BUILD  this repository's meson build folder, for the plugin (default: build)
#   NCCL_HOME         NCCL's prefix; its lib/ goes on LD_LIBRARY_PATH (default: /usr/local/cuda)
#   MPIRUN            Open MPI's mpirun (default: mpirun)
#   SMOKE_OUT         where the logs go (default: a new folder under /tmp)
#   SMOKE_ARGS        nccl-tests options for both runs (default: -b 8 -e 32M -f 4 -n 20 -w 5 -c 1)
set -euo pipefail
cd "$(dirname "$0")/.."

ngpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)
if [ "${ngpus:-0}" -lt 1 ]; then
  echo "gpu-smoke: skipped: no GPU on this host (nvidia-smi lists none)"
  exit 77
fi

fail() {
  echo "gpu-smoke: FAILED: $*" >&2
  exit 1
}

build=${NCCL_TESTS_BUILD:-${NCCL_TESTS_DIR:+$NCCL_TESTS_DIR/build}}
[ -n "$build" ] || fail "set NCCL_TESTS_BUILD (or NCCL_TESTS_DIR) to nccl-tests built by nccl-tests-patches/apply-and-build.sh with MPI=1"
for b in all_reduce_perf optireduce_all_reduce_perf; do
  [ -x "$build/$b" ] || fail "no $build/$b: build it with MPI=1 MPI_HOME=... nccl-tests-patches/apply-and-build.sh"
  ldd "$build/$b" | grep -q 'libmpi' ||
    fail "$build/$b was built without MPI: two processes need MPI=1 MPI_HOME=... nccl-tests-patches/apply-and-build.sh"
done
plugin=$(realpath "${OPTIREDUCE_BUILD:-build}/plugin/libnccl-net-optireduce.so" 2>/dev/null) ||
  fail "no ${OPTIREDUCE_BUILD:-build}/plugin/libnccl-net-optireduce.so: build this repository (bash .ci/setup) or set OPTIREDUCE_BUILD"
mpirun=${MPIRUN:-mpirun}
command -v "$mpirun" >/dev/null || fail "no $mpirun: two processes need Open MPI's mpirun (and nccl-tests built with MPI=1)"

out=${SMOKE_OUT:-$(mktemp -d /tmp/optireduce-gpu-smoke.XXXXXX)}
mkdir -p "$out"
read -r -a args <<<"${SMOKE_ARGS:--b 8 -e 32M -f 4 -n 20 -w 5 -c 1}"

export LD_LIBRARY_PATH="${NCCL_HOME:-/usr/local/cuda}/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NET_PLUGIN=$plugin
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
unset OPTIREDUCE_MODE  # the plugin's every-communicator switch: liboptireduce refuses it
# One GPU: both ranks on it (nccl-tests would give the second rank GPU 1).
if [ "$ngpus" -lt 2 ]; then export NCCL_TESTS_DEVICE=0; fi
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# Two ranks, one per host ID: NCCL then connects them through the network plugin.
run2() {
  local log=$1
  shift
  echo "gpu-smoke: $* > $log"
  "$mpirun" -np 1 -x NCCL_HOSTID=optireduce-smoke-a "$@" : \
    -np 1 -x NCCL_HOSTID=optireduce-smoke-b "$@" >"$log" 2>&1
}

expect() {
  local log=$1 pattern=$2 what=$3
  grep -Eq -- "$pattern" "$log" || fail "$what: no line matching '$pattern' in $log"
  echo "gpu-smoke:   ok: $what"
}

# 1. exact: NCCL's own allreduce over the plugin.
log=$out/exact.log
NCCL_NET=OptiReduce run2 "$log" "$build/all_reduce_perf" "${args[@]}" ||
  fail "all_reduce_perf exited with an error (see $log)"
expect "$log" "Loaded net plugin OptiReduce" "NCCL loaded the plugin"
expect "$log" "Using network OptiReduce" "the communicator uses it"
expect "$log" "via NET/OptiReduce/" "channels connect through it"
expect "$log" "NET/OptiReduce : context .*: exact delivery" "the plugin runs the communicator exact"
expect "$log" "Out of bounds values : 0 OK" "nccl-tests found no wrong element"

# 2. bounded: liboptireduce's TAR, its sibling communicator bounded, NCCL_NET unset.
log=$out/bounded.log
(unset NCCL_NET; OPTIREDUCE_ALLREDUCE_MODE=bounded run2 "$log" "$build/optireduce_all_reduce_perf" "${args[@]}") ||
  fail "optireduce_all_reduce_perf exited with an error (see $log)"
expect "$log" "Loaded net plugin OptiReduce" "NCCL loaded the plugin"
expect "$log" "via NET/OptiReduce/" "channels connect through it"
expect "$log" "NET/OptiReduce : context .*: exact delivery" "the test's own communicator is exact"
expect "$log" "NET/OptiReduce : context .*: bounded delivery, marker fill" "liboptireduce's sibling is bounded"
expect "$log" "# optireduce .*mode bounded" "the test ran TAR bounded"
expect "$log" "Out of bounds values : 0 OK" "no result was not finite"

echo "gpu-smoke: passed; logs in $out"
grep -E '^ +[0-9]+ ' "$out/bounded.log" | tail -3 | sed 's/^/gpu-smoke:   bounded: /'
