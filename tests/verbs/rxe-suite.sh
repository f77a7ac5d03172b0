#!/bin/sh
# Runs inside the rxe VM (veth mode: rxe0 on rxeveth0, rxe1 on rxeveth1), all in one boot:
# the verbs datapath test at a 1500-byte netdev MTU (rxe MTU 1024), again at 9000 (rxe MTU
# 4096), then with netem dropping 10% of each direction on the veth. RXE_TEST_ONE_MTU=1 leaves
# out the second MTU: .ci/run's ThreadSanitizer pass, where the larger packets go through the
# same threads as the smaller ones, and the guest runs 5-15x slower than without TSan.
# Usage (host): run-in-rxe-vm.sh rxe-suite.sh VERBS_RXE_TEST [UNIT_TEST]
set -eu
T=$1
echo "== rxe devices: $(ls /sys/class/infiniband | tr '\n' ' ')gid index ${RXE_GID_INDEX:-?}"
if [ $# -ge 2 ]; then echo "== unit tests inside the VM"; "$2" --gtest_brief=1; fi

mtu_is() {  # waits until rxe0's active MTU reads $1 (it follows the netdev MTU)
  i=0
  while [ $i -lt 50 ]; do
    case "$(ibv_devinfo -d rxe0 | sed -n 's/.*active_mtu:[[:space:]]*//p')" in "$1"*) return 0 ;; esac
    sleep 0.1; i=$((i + 1))
  done
  echo "rxe0 active_mtu did not become $1" >&2; return 1
}

echo "== netdev MTU 1500"
mtu_is 1024
"$T" --gtest_brief=1

if [ -e /sys/class/net/rxeveth0 ]; then
  if [ "${RXE_TEST_ONE_MTU:-0}" != 1 ]; then
    echo "== netdev MTU 9000"
    ip link set rxeveth0 mtu 9000
    ip link set rxeveth1 mtu 9000
    mtu_is 4096
    "$T" --gtest_brief=1
  fi

  echo "== netem loss 10% on both veth ends (each direction)"
  tc qdisc add dev rxeveth0 root netem loss 10%
  tc qdisc add dev rxeveth1 root netem loss 10%
  RXE_TEST_LOSS=10 "$T" --gtest_brief=1 --gtest_filter='*Loss*'
  tc qdisc del dev rxeveth0 root
  tc qdisc del dev rxeveth1 root
fi
