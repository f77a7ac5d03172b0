#!/usr/bin/env bash
# The main demonstration (README command 1 ends here): two processes move data through the
# plugin exactly as NCCL's proxy would, on loopback, next to a TCP stream; then the same with
# 5% injected loss (still byte-exact, retransmissions visible in the counters).
#   bash bench/demo.sh [BUILD_DIR]
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  source "$(dirname "$0")/script_args.sh"
  script_header "$0"
  exit 0
fi
build=${1:-build}
[[ -x $build/bench/p2p_bench ]] || {
  echo "demo.sh: no $build/bench/p2p_bench: build first (bash .ci/setup, or ninja -C $build)" >&2
  exit 2
}
export OPTIREDUCE_IFNAME=lo
echo "== plugin vs TCP on loopback, 4 KiB .. 64 MiB =="
"$build/bench/p2p_bench" --bytes $((256 << 20))
echo
echo "== the same through 5% loss, 1% duplication, 5% reordering (1472-byte datagrams) =="
echo "   (the plugin's fault injector: TCP beside it sees none; what this shows is that every byte"
echo "   still arrives intact, and what the repair costs: retx in the counters)"
OPTIREDUCE_FAULT_DROP=0.05 OPTIREDUCE_FAULT_DUP=0.01 OPTIREDUCE_FAULT_REORDER=0.05 \
  OPTIREDUCE_MAX_DATAGRAM=1472 "$build/bench/p2p_bench" --min $((1 << 20)) --max $((16 << 20)) \
  --bytes $((64 << 20))
