#!/bin/bash
# Runs a command inside the Soft-RoCE test VM (run-rxe-test.sh beside this file: a QEMU guest
# with rdma_rxe) and returns its exit status; meant for `meson test` and for running any test
# binary of the build over rxe by hand:
#   tests/verbs/run-in-rxe-vm.sh build/tests/verbs/verbs_rxe_test
#   RXE_NETDEV=lo tests/verbs/run-in-rxe-vm.sh 'ibv_devinfo; ./some_test --flag'
# Builds the VM image on first use (root and apt needed, ~60 s, cached in RXE_LAB) and exits
# 77, meson's "skipped", with the reason where the VM cannot be built or started.
# Environment: RXE_LAB (default /tmp/optireduce-rxe-lab), RXE_NETDEV (default veth: rxe0 and
# rxe1 over a veth pair, so netem works), RXE_PASS_ENV (extra variables for the guest; every
# OPTIREDUCE_*, NCCL_* and RXE_TEST_* variable is passed anyway), RXE_HOST_DIRS (host folders,
# ':'-separated, shared read-only and mounted at the same path in the guest: e.g. the CUDA
# toolkit whose libcudart/libnccl liboptireduce links when built with CUDA), RXE_TEST_LIBS (a
# folder inside the share put on the guest's library path), the rest as run-rxe-test.sh.
set -u
HERE=$(cd "$(dirname "$0")" && pwd -P)
ROOT=$(cd "$HERE/../.." && pwd -P)
export RXE_LAB=${RXE_LAB:-/tmp/optireduce-rxe-lab}
export RXE_NETDEV=${RXE_NETDEV:-veth}

skip() { echo "SKIP: the Soft-RoCE VM is unavailable: $*" >&2; exit 77; }
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
[ "$(uname -m)" = x86_64 ] || skip "the VM image is x86_64 only"

# The guest sees the host through one 9p share mounted at the same absolute path, so the share
# must contain the project, the current directory and every absolute path in the command.
common() {  # common ancestor of two absolute paths
  local a=$1/ b=$2/ p=
  while [ -n "$a" ] && [ "${a%%/*}" = "${b%%/*}" ]; do
    p=$p${a%%/*}/; a=${a#*/}; b=${b#*/}
  done
  p=${p%/}; echo "${p:-/}"
}
SHARE=$(common "$ROOT" "$(pwd -P)")
for arg in "$@"; do
  case "$arg" in /*) [ -e "$arg" ] && SHARE=$(common "$SHARE" "$(cd "$(dirname "$arg")" && pwd -P)") ;; esac
done
export RXE_SHARE=$SHARE
PASS=$(env | sed -n 's/^\(OPTIREDUCE_[A-Za-z0-9_]*\|NCCL_[A-Za-z0-9_]*\|RXE_TEST_[A-Za-z0-9_]*\|GTEST_[A-Za-z0-9_]*\)=.*/\1/p' | tr '\n' ' ')
export RXE_PASS_ENV="${RXE_PASS_ENV:-} $PASS"

# What the guest runs before the command (the guest's /init, and with it the cached image, stays
# as it is): mounts of extra shares, the library path.
pro=

# Extra read-only shares: one virtio-9p device each, mounted by the prologue. A symlinked
# folder (e.g. /usr/local/cuda -> cuda-13.0) is mounted at its real path and linked from the
# given one.
if [ -n "${RXE_HOST_DIRS:-}" ]; then
  i=0
  IFS=: read -r -a dirs <<< "$RXE_HOST_DIRS"
  for d in "${dirs[@]}"; do
    [ -d "$d" ] || continue
    real=$(cd "$d" && pwd -P)
    RXE_QEMU_ARGS="${RXE_QEMU_ARGS:-} -virtfs local,path=$real,mount_tag=rxehost$i,security_model=none,readonly=on,id=rxehost$i"
    pro+="mkdir -p $(printf %q "$real") && mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 rxehost$i $(printf %q "$real") || { echo \"cannot mount host folder $real\" >&2; exit 126; }; "
    [ "$real" = "$d" ] || pro+="mkdir -p $(printf %q "$(dirname "$d")") && ln -sfn $(printf %q "$real") $(printf %q "${d%/}"); "
    i=$((i + 1))
  done
  export RXE_QEMU_ARGS
fi

# Libraries the guest lacks (a sanitizer's runtime: .ci/run stages libtsan for its TSan build),
# on the library path of whatever the command runs. The folder must be inside the share.
if [ -n "${RXE_TEST_LIBS:-}" ]; then
  pro+="export LD_LIBRARY_PATH=$(printf %q "$RXE_TEST_LIBS")\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}; "
fi

if [ -n "$pro" ]; then
  if [ $# -eq 1 ]; then set -- "$pro$1"; else set -- "$pro exec $(printf '%q ' "$@")"; fi
fi

if [ ! -f "$RXE_LAB/initrd.img" ] && [ "$(id -u)" != 0 ]; then
  skip "no VM image in $RXE_LAB and building one needs root"
fi
LOG=${TMPDIR:-/tmp}/optireduce-rxe-build.$$.log
t0=$(date +%s.%N)
if ! "$HERE/run-rxe-test.sh" --build-only > "$LOG" 2>&1; then
  tail -5 "$LOG" >&2; rm -f "$LOG"
  skip "building the VM image failed (qemu, debootstrap or the kernel package unavailable?)"
fi
rm -f "$LOG"
"$HERE/run-rxe-test.sh" "$@"
rc=$?
t1=$(date +%s.%N)
echo "[rxe] VM run took $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s (rc $rc, share $SHARE)" >&2
case $rc in
  125) skip "the VM did not start or returned no result (harness error)" ;;
esac
exit $rc
