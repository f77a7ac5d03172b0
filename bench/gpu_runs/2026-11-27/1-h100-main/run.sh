# Device run 1 of 2026-11-27: main at b5c3bd7 (phase 2 on a second sibling communicator, not yet
# run on a real NCCL), plus the sibling communicators' device memory.
set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=$PWD/.gpu/build
G=$OUT/gc
mkdir -p $G
export NCCL_NET_PLUGIN=$B/plugin/libnccl-net-optireduce.so
nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.nccl.version())'
ls -la /lib/x86_64-linux-gnu/libnccl.so.2 /usr/local/cuda/lib64/libnccl* 2>&1 | head -3
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout $limit "$@" > $G/$name.log 2>&1; echo "== $name rc=$? in $((SECONDS-t0)) s"; }
peak() { local name=$1; shift
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 100 > $G/$name.mem 2>&1 &
  local smi=$!; step "$@"; kill $smi; wait $smi 2>/dev/null
  echo "   $name peak MiB per process: $(awk -F, '{m[$1]=($2>m[$1]?$2:m[$1])} END{for(p in m) printf "%s ", m[p]}' $G/$name.mem)"; }
step coll_gpu 60 $B/tests/collectives/coll_gpu
peak m_started started 60 $B/tests/collectives/coll_gpu_nccl OPTIREDUCE_FAULT_DROP=0
peak m_bounded bounded 60 $B/tests/collectives/coll_gpu_nccl OPTIREDUCE_FAULT_DROP=0 OPTIREDUCE_ALLGATHER_MODE=bounded
step coll_gpu_nccl 150 $B/tests/collectives/coll_gpu_nccl
PYTHONUNBUFFERED=1 step ddp_cuda 120 python3 tests/python/ddp_cuda_test.py $B/collectives/liboptireduce.so $NCCL_NET_PLUGIN -v
grep -E "RUN|OK|FAIL|over the bound|mean lost|plugin rx|failed" $G/coll_gpu_nccl.log | grep -v "call [0-9]" | head -30
for v in started bounded; do echo "-- $v"; grep -E "mean lost|plugin rx|FAIL|rror" $G/$v.log | head -6; done
grep -E "ok$|FAIL|ERROR|Ran|lost|Error" $G/ddp_cuda.log | head
tail -3 $G/coll_gpu.log
