#!/bin/bash
# Benchmark, not a test: bench/p2p_bench and bench/allreduce_bench inside the rxe VM over the
# UD verbs datapath (rxe0) and the UDP datapath (lo), in one boot, then the verbs/UDP ratios.

# rxe is software and the guest runs under TCG, so the ratios show our datapath's overheads
# next to UDP's on the same CPU, not what an RDMA NIC would do. Both ranks of a run share one
# device (rxe0, or lo): the same kind of in-host path. Three datapaths:
#   verbs  UD QPs on rxe0, netdev MTU RXE_BENCH_MTU (default 9000: rxe MTU 4096, 4 KiB datagrams)
#   udp4k  UDP on lo with OPTIREDUCE_MAX_DATAGRAM=4096: the same datagram size as verbs
#   udp    UDP on lo with its default datagrams (up to 64 KiB): what UDP users get
# Usage (host; boots the VM once, ~2-3 min under TCG):
#   tests/verbs/rxe-bench.sh build/bench/p2p_bench build/bench/allreduce_bench
# Knobs: RXE_BENCH_P2P_ARGS, RXE_BENCH_AR_ARGS (passed to the benches), RXE_BENCH_MTU,
# RXE_BENCH_ROUNDS (default 1): rounds of all three datapaths, each figure the median over the
# rounds; on a shared host, whose load swings the guest's speed by 10x, take 3 or more.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd -P)
P2P=$1
AR=$2

if [ "${RXE_TEST_BENCH_GUEST:-0}" != 1 ]; then
  # ---- Host: stage the shared libraries the guest image lacks (Gloo, which allreduce_bench
  # links, and its dependencies) under the build tree, which the guest sees; mount the CUDA
  # toolkit that liboptireduce links when built with CUDA; boot the VM on this script.
  P2P=$(cd "$(dirname "$P2P")" && pwd -P)/$(basename "$P2P")
  AR=$(cd "$(dirname "$AR")" && pwd -P)/$(basename "$AR")
  LIBS=$(dirname "$AR")/rxe-bench-libs
  ROOTFS=${RXE_LAB:-/tmp/optireduce-rxe-lab}/rootfs
  BUILD=$(cd "$(dirname "$AR")/.." && pwd -P)
  CUDA=
  rm -rf "$LIBS"
  mkdir -p "$LIBS"
  for lib in $(ldd "$P2P" "$AR" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
    real=$(readlink -f "$lib")
    case "$real" in "$BUILD"/*) continue ;; esac
    # the folder as the runpath names it (/usr/local/cuda/lib64), which the guest recreates
    case "$lib" in */cuda*/*) CUDA=$(dirname "$lib"); continue ;; esac
    name=$(basename "$lib")
    if [ -d "$ROOTFS" ]; then
      [ -e "$ROOTFS/lib/x86_64-linux-gnu/$name" ] || [ -e "$ROOTFS/usr/lib/x86_64-linux-gnu/$name" ] && continue
    else
      case "$name" in libc.so* | libm.so* | libstdc++* | libgcc_s* | ld-linux* | libdl.so* | libpthread* | librt.so*) continue ;; esac
    fi
    cp "$real" "$LIBS/$name"
  done
  export RXE_TEST_BENCH_GUEST=1 RXE_TEST_BENCH_LIBS=$LIBS
  if [ -n "$CUDA" ]; then export RXE_HOST_DIRS=${RXE_HOST_DIRS:+$RXE_HOST_DIRS:}$CUDA; fi
  export RXE_TEST_P2P_ARGS=${RXE_BENCH_P2P_ARGS:-} RXE_TEST_AR_ARGS=${RXE_BENCH_AR_ARGS:-}
  export RXE_TEST_MTU=${RXE_BENCH_MTU:-9000} RXE_TEST_ROUNDS=${RXE_BENCH_ROUNDS:-1}
  exec "$HERE/run-in-rxe-vm.sh" "$HERE/rxe-bench.sh" "$P2P" "$AR"
fi

# ---- Guest.
P2P_ARGS=${RXE_TEST_P2P_ARGS:-"--min 4096 --max 1048576 --bytes 8388608"}
AR_ARGS=${RXE_TEST_AR_ARGS:-"--ranks 2 --min 65536 --max 1048576 --iters 20 --modes exact,bounded"}
OUT=$(mktemp -d)
MTU=${RXE_TEST_MTU:-9000}
ip link set rxeveth0 mtu "$MTU" 2>/dev/null || true
ip link set rxeveth1 mtu "$MTU" 2>/dev/null || true
sleep 1  # rxe picks the new netdev MTU up asynchronously
echo "== $(nproc) vCPUs; rxe0 active_mtu $(ibv_devinfo -d rxe0 | sed -n 's/.*active_mtu:[[:space:]]*//p')"

# The datapaths run back to back within a round, so that a change in the host's load between
# rounds hits all three; every round appends to the same files.
round=1
while [ "$round" -le "${RXE_TEST_ROUNDS:-1}" ]; do
  for dp in verbs udp4k udp; do
    case $dp in
      verbs) set -- OPTIREDUCE_DATAPATH=verbs OPTIREDUCE_IB_HCA=rxe0 ;;
      udp4k) set -- OPTIREDUCE_DATAPATH=udp OPTIREDUCE_IFNAME=lo OPTIREDUCE_MAX_DATAGRAM=4096 ;;
      udp) set -- OPTIREDUCE_DATAPATH=udp OPTIREDUCE_IFNAME=lo ;;
    esac
    echo "== round $round: p2p_bench over $dp"
    # shellcheck disable=SC2086
    env "$@" "$P2P" $P2P_ARGS | tee -a "$OUT/p2p.$dp"
    echo "== round $round: allreduce_bench over $dp"
    # shellcheck disable=SC2086
    env "$@" LD_LIBRARY_PATH="${RXE_TEST_BENCH_LIBS:-}" "$AR" $AR_ARGS | tee -a "$OUT/ar.$dp"
  done
  round=$((round + 1))
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "-" }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }

echo
echo "== point-to-point throughput (GB/s) and p50 RTT (us): verbs on rxe0 against UDP on lo"
# p2p rows: bytes plugin_GB/s tcp_GB/s ratio plugin_rtt_us tcp_rtt_us
printf "%9s %7s %7s %7s %9s %9s %9s %9s %9s\n" bytes verbs udp4k udp "v/udp4k" "v/udp" \
  "rtt_v" "rtt_u4k" "rtt_v/u4k"
for b in $(awk '$1 ~ /^[0-9]+$/ && NF == 6 && !seen[$1]++ {print $1}' "$OUT/p2p.verbs"); do
  get() { awk -v b="$b" -v c="$2" '$1 == b && NF == 6 {print $c}' "$OUT/p2p.$1" | median; }
  v=$(get verbs 2) u4=$(get udp4k 2) u=$(get udp 2)
  rv=$(get verbs 5) ru4=$(get udp4k 5)
  printf "%9s %7s %7s %7s %9s %9s %9s %9s %9s\n" "$b" "$v" "$u4" "$u" "$(ratio "$v" "$u4")" \
    "$(ratio "$v" "$u")" "$rv" "$ru4" "$(ratio "$rv" "$ru4")"
done

echo
echo "== allreduce, 2 ranks: p50 (ms) and busbw (GB/s), verbs on rxe0 against UDP on lo"
# allreduce rows: mode N bytes iters p50 p99 p999 mean algbw busbw delivered rel_err dl_hits
printf "%-8s %8s %8s %8s %8s %8s %8s %8s %8s %9s %9s\n" mode bytes p50_v p50_u4k p50_u \
  bw_v bw_u4k bw_u "bw v/u4k" "bw v/udp"
awk '($1 == "exact" || $1 == "bounded") && NF == 13 && !seen[$1, $3]++ {print $1, $3}' "$OUT/ar.verbs" |
  while read -r mode b; do
    get() { awk -v m="$mode" -v b="$b" -v c="$2" '$1 == m && $3 == b && NF == 13 {print $c}' "$OUT/ar.$1" | median; }
    pv=$(get verbs 5) pu4=$(get udp4k 5) pu=$(get udp 5)
    bv=$(get verbs 10) bu4=$(get udp4k 10) bu=$(get udp 10)
    printf "%-8s %8s %8s %8s %8s %8s %8s %8s %8s %9s %9s\n" "$mode" "$b" "$pv" "$pu4" "$pu" \
      "$bv" "$bu4" "$bu" "$(ratio "$bv" "$bu4")" "$(ratio "$bv" "$bu")"
  done
