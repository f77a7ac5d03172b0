#!/bin/bash
# Benchmark, not a test: zero-copy sends (issue 16) inside the rxe VM, in one boot, before and
# after side by side. verbs_bench_proxy (NCCL's proxy pattern through the plugin, regMr'ed slots
# "reg" against none "copy") over verbs (rxe0, both ranks) and UDP (lo), for each plugin .so
# given; then idle_bench over verbs: memory per idle connection (heap, RSS) beside the bytes
# the datapath registered. A plugin that predates regMr registration is the "before".
# rxe is software and the guest runs under TCG: the figures compare datapaths and builds on
# one emulated CPU, not what an RDMA NIC does.
# Usage (host):
#   tests/verbs/rxe-bench-zc.sh build/bench/verbs_bench_proxy build/bench/idle_bench \
#       build/plugin/libnccl-net-optireduce.so [BEFORE.so]
# Knobs: RXE_ZC_ROUNDS (2), RXE_ZC_ARGS (verbs_bench_proxy's, default 1-4 MiB, 48 MiB each),
# RXE_ZC_IDLE (idle_bench's, default --idle 500 --bytes 33554432 --repeat 1), RXE_ZC_MTU (9000).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd -P)

if [ "${RXE_TEST_ZC_GUEST:-0}" != 1 ]; then
  args=()
  for a in "$@"; do args+=("$(cd "$(dirname "$a")" && pwd -P)/$(basename "$a")"); done
  export RXE_TEST_ZC_GUEST=1 RXE_TEST_ZC_ROUNDS=${RXE_ZC_ROUNDS:-2}
  export RXE_TEST_ZC_ARGS=${RXE_ZC_ARGS:-"--min 1048576 --max 4194304 --bytes 50331648"}
  export RXE_TEST_ZC_IDLE=${RXE_ZC_IDLE:-"--idle 500 --bytes 33554432 --repeat 1"}
  export RXE_TEST_MTU=${RXE_ZC_MTU:-9000}
  exec "$HERE/run-in-rxe-vm.sh" "$HERE/rxe-bench-zc.sh" "${args[@]}"
fi

# ---- Guest.
BENCH=$1
IDLE=$2
shift 2
MTU=${RXE_TEST_MTU:-9000}
ip link set rxeveth0 mtu "$MTU" 2>/dev/null || true
ip link set rxeveth1 mtu "$MTU" 2>/dev/null || true
sleep 1  # rxe picks the new netdev MTU up asynchronously
echo "== $(nproc) vCPUs; rxe0 active_mtu $(ibv_devinfo -d rxe0 | sed -n 's/.*active_mtu:[[:space:]]*//p')"
OUT=$(mktemp -d)

PLUGINS=("$@")
AFTER=$1
name() { if [ "$1" = "$AFTER" ]; then echo after; else echo before; fi; }
round=1
while [ "$round" -le "${RXE_TEST_ZC_ROUNDS:-2}" ]; do
  for so in "${PLUGINS[@]}"; do
    who=$(name "$so")
    for dp in verbs udp; do
      case $dp in
        verbs) envs="OPTIREDUCE_DATAPATH=verbs OPTIREDUCE_IB_HCA=rxe0 NCCL_DEBUG=INFO" ;;
        udp) envs="OPTIREDUCE_DATAPATH=udp OPTIREDUCE_IFNAME=lo" ;;
      esac
      echo "== round $round: $who over $dp"
      # shellcheck disable=SC2086
      env $envs "$BENCH" --plugin "$so" $RXE_TEST_ZC_ARGS | tee -a "$OUT/$who.$dp"
    done
  done
  round=$((round + 1))
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "-" }'; }
echo
echo "== medians: GB/s and CPU s/GB (both processes), verbs on rxe0 against UDP on lo"
printf "%-7s %9s %5s %8s %8s %8s %9s %9s\n" build bytes mode "GB/s v" "GB/s u" "v/u" "cpu/GB v" "cpu/GB u"
for who in before after; do
  [ -f "$OUT/$who.verbs" ] || continue
  for b in $(awk '$1 ~ /^[0-9]+$/ && NF == 4 && !s[$1]++ {print $1}' "$OUT/$who.verbs"); do
    for mode in copy reg; do
      get() { awk -v b="$b" -v m="$mode" -v c="$2" '$1 == b && $2 == m && NF == 4 {print $c}' "$OUT/$who.$1" | median; }
      gv=$(get verbs 3) gu=$(get udp 3) cv=$(get verbs 4) cu=$(get udp 4)
      printf "%-7s %9s %5s %8s %8s %8s %9s %9s\n" "$who" "$b" "$mode" "$gv" "$gu" "$(ratio "$gv" "$gu")" "$cv" "$cu"
    done
  done
done

echo
for so in "${PLUGINS[@]}"; do
  who=$(name "$so")
  echo "== idle_bench over verbs (rxe0), $who"
  # shellcheck disable=SC2086
  OPTIREDUCE_DATAPATH=verbs OPTIREDUCE_IB_HCA=rxe0 "$IDLE" --plugin "$so" $RXE_TEST_ZC_IDLE || true
done
