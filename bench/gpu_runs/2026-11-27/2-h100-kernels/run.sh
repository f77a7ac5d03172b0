# Device run 2 of 2026-11-27: the faster kernels (old ones kept as .gpu/old for a side-by-side
# bandwidth run), then the GPU checks with everything merged, the hook's resync on CUDA included.
set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=$PWD/.gpu/build
G=$OUT/gc
mkdir -p $G
export NCCL_NET_PLUGIN=$B/plugin/libnccl-net-optireduce.so
nvidia-smi -L
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout $limit "$@" > $G/$name.log 2>&1; echo "== $name rc=$? in $((SECONDS-t0)) s"; }
step coll_gpu 60 $B/tests/collectives/coll_gpu
step kernel_check 60 $B/bench/gpu_kernel_bench --check --min 16 --max 16 --reps 2
step kernel_bench 120 $B/bench/gpu_kernel_bench
[ -x .gpu/old/gpu_kernel_bench ] && step kernel_bench_old 120 .gpu/old/gpu_kernel_bench --min 256 --max 256
step coll_gpu_nccl 150 $B/tests/collectives/coll_gpu_nccl
PYTHONUNBUFFERED=1 step ddp_cuda 180 python3 tests/python/ddp_cuda_test.py $B/collectives/liboptireduce.so $NCCL_NET_PLUGIN -v
tail -4 $G/coll_gpu.log; tail -6 $G/kernel_check.log
grep "256 MiB\|262144 KiB" $G/kernel_bench.log; grep "256 MiB\|262144 KiB" $G/kernel_bench_old.log 2>/dev/null
grep -E "RUN|OK|FAIL|over the bound|mean lost|failed" $G/coll_gpu_nccl.log | grep -v "call [0-9]" | head -20
grep -E "ok$|FAIL|ERROR|Ran|lost|Error" $G/ddp_cuda.log | head -12
