# Device run 6 of 2026-11-27: a far-behind straggler's CTS answered, a far-ahead floor accepted.
set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=$PWD/.gpu/build
G=$OUT/gc
mkdir -p $G
export NCCL_NET_PLUGIN=$B/plugin/libnccl-net-optireduce.so
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout $limit "$@" > $G/$name.log 2>&1; echo "== $name rc=$? in $((SECONDS-t0)) s"; }
step stall500_once 90 $B/tests/collectives/coll_gpu_nccl STALL_MS=500 STALL_ONCE=1
step coll_gpu_nccl 120 $B/tests/collectives/coll_gpu_nccl
grep -E "stalled|mean lost|calls:|rror|cost" $G/stall500_once.log | head -8
grep -E "OK|FAIL|failed" $G/coll_gpu_nccl.log
