#!/usr/bin/env bash
# Everything that needs a CUDA device, in one run, on a GPU machine: the kernels against their
# host twins (coll_gpu), the GPU path through the real NCCL and the plugin (coll_gpu_nccl), the
# kernels' bandwidth against device-to-device memcpy (gpu_kernel_bench; issue 13's goals) and the
# PyTorch hook on CUDA tensors (tests/python/ddp_cuda_test.py). CI has no GPU, where each of these
# skips; this is how a GPU machine runs them from a build made elsewhere.
#
#   bench/gpu_checks.sh [BUILD=build] [OUTDIR=gpu-checks]
#
# BUILD is a meson build of this tree with CUDA (meson's summary: nvcc and nccl.h True), or a copy
# holding at least tests/collectives/coll_gpu{,_nccl}, bench/gpu_kernel_bench,
# collectives/liboptireduce.so and plugin/libnccl-net-optireduce.so at those paths. libnccl.so.2
# is taken from the system, else from the Python interpreter's PyTorch (pip's nvidia-nccl).
# Each check's output goes to OUTDIR/<check>.log; the summary says which passed.
set -u
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  source "$(dirname "$0")/script_args.sh"
  script_header "$0"
  exit 0
fi
BUILD=$(realpath "${1:-build}")
OUTDIR=$(realpath -m "${2:-gpu-checks}")
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no GPU (nvidia-smi lists none)"
  exit 77
fi

{
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", torch.cuda.nccl.version())' 2>&1
} >"$OUTDIR/machine.log"

# libnccl.so.2: the system's, else PyTorch's wheel's.
if ! ldconfig -p | grep -q 'libnccl.so.2 ' && [ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]; then
  site=$("$PY" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
  lib=$(find $site -name 'libnccl.so.2' 2>/dev/null | head -1)
  [ -n "$lib" ] && export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" >>"$OUTDIR/machine.log"
ldd "$BUILD/tests/collectives/coll_gpu_nccl" | grep -E 'nccl|cudart' >>"$OUTDIR/machine.log"

status=0
check() {  # check NAME TIMEOUT_S COMMAND...: runs it, logs it, records pass/fail/skip
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS rc
  timeout "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
  rc=$?
  case $rc in
    0) echo "PASS $name ($((SECONDS - t0)) s)" ;;
    77) echo "SKIP $name" ;;
    124) echo "FAIL $name: timed out after $limit s"; status=1 ;;
    *) echo "FAIL $name: exit $rc ($OUTDIR/$name.log)"; status=1 ;;
  esac
}

# The bandwidth first, alone on the device.
check kernel_bench 90 "$BUILD/bench/gpu_kernel_bench"
check coll_gpu 90 "$BUILD/tests/collectives/coll_gpu"
NCCL_NET_PLUGIN="$BUILD/plugin/libnccl-net-optireduce.so" \
  check coll_gpu_nccl 200 "$BUILD/tests/collectives/coll_gpu_nccl"
PYTHONUNBUFFERED=1 check ddp_cuda 200 "$PY" "$HERE/tests/python/ddp_cuda_test.py" \
  "$BUILD/collectives/liboptireduce.so" "$BUILD/plugin/libnccl-net-optireduce.so" -v
exit $status
