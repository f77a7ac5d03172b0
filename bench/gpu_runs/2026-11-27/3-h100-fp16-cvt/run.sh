# Device run 3 of 2026-11-27: fp16 through the hardware's conversions (NaNs excepted).
set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=$PWD/.gpu/build
G=$OUT/gc
mkdir -p $G
nvidia-smi -L
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout $limit "$@" > $G/$name.log 2>&1; echo "== $name rc=$? in $((SECONDS-t0)) s"; }
step coll_gpu 60 $B/tests/collectives/coll_gpu
step kernel_check 60 $B/bench/gpu_kernel_bench --check --min 16 --max 16 --reps 2
step kernel_bench 120 $B/bench/gpu_kernel_bench
NCCL_NET_PLUGIN=$B/plugin/libnccl-net-optireduce.so step coll_gpu_nccl 150 $B/tests/collectives/coll_gpu_nccl
tail -3 $G/coll_gpu.log; grep -i "differ" $G/kernel_check.log
grep -E "fp16|bf16" $G/kernel_bench.log
grep -E "OK|FAIL|failed" $G/coll_gpu_nccl.log
