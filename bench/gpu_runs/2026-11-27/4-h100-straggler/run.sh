# Device run 4 of 2026-11-27: main with the retry timer (3cbefdb), and a straggler on the GPU path.
set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=$PWD/.gpu/build
G=$OUT/gc
mkdir -p $G
export NCCL_NET_PLUGIN=$B/plugin/libnccl-net-optireduce.so
nvidia-smi -L
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout $limit "$@" > $G/$name.log 2>&1; echo "== $name rc=$? in $((SECONDS-t0)) s"; }
step coll_gpu_nccl 150 $B/tests/collectives/coll_gpu_nccl
step stall500 90 $B/tests/collectives/coll_gpu_nccl STALL_MS=500
step stall500_ag_bounded 90 $B/tests/collectives/coll_gpu_nccl STALL_MS=500 OPTIREDUCE_ALLGATHER_MODE=bounded
grep -E "OK|FAIL|failed|mean lost" $G/coll_gpu_nccl.log
for v in stall500 stall500_ag_bounded; do echo "-- $v"; grep -E "stalled|mean lost|over the bound|rror|FORKED|cost" $G/$v.log | head -8; done
