# Device run 5 of 2026-11-27: one 500 ms stall, then 19 calls: do the ranks fall back into step?
set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=$PWD/.gpu/build
G=$OUT/gc
mkdir -p $G
export NCCL_NET_PLUGIN=$B/plugin/libnccl-net-optireduce.so
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout $limit "$@" > $G/$name.log 2>&1; echo "== $name rc=$? in $((SECONDS-t0)) s"; }
step stall500_once 90 $B/tests/collectives/coll_gpu_nccl STALL_MS=500 STALL_ONCE=1
step stall100_every5 90 $B/tests/collectives/coll_gpu_nccl STALL_MS=100
for v in stall500_once stall100_every5; do echo "-- $v"; grep -E "stalled|mean lost|calls:|rror|cost" $G/$v.log | head -8; done
