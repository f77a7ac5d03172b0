#!/bin/sh
# Runs inside the rxe VM (veth mode), in one boot: rxe_pair_test (plugin) across rxe0 and rxe1
# without loss, then with netem loss on the veth, and rxe_coll_test (liboptireduce) with netem
# loss only: it asserts nothing more without loss (bounded mode repairs what it can, so a lossy
# run may lose nothing too), and its run without loss took 26 s of the suite's 95.
# Usage (host): run-in-rxe-vm.sh rxe-loss-suite.sh RXE_PAIR_TEST RXE_COLL_TEST

# Loss: RXE_LOSS percent (default 5) of each direction. After each lossy run netem's own drop
# counters must show that it dropped something, so a test cannot pass with netem silently off.
set -eu
P=$1
C=$2
LOSS=${RXE_LOSS:-5}
[ -e /sys/class/net/rxeveth0 ] || { echo "needs RXE_NETDEV=veth (rxe0 and rxe1 over a veth pair)" >&2; exit 1; }
# rxe's active MTU follows the netdev: 1024 at 1500, the datagram size the tests pin.
ip link set rxeveth0 mtu 1500
ip link set rxeveth1 mtu 1500
echo "== rxe devices: $(ls /sys/class/infiniband | tr '\n' ' ')"

now() { cut -d' ' -f1 /proc/uptime; }
run() {  # run LABEL CMD...: times one binary (guest clock)
  label=$1; shift
  t0=$(now)
  echo "== $label"
  "$@" --gtest_brief=1
  echo "== $label: $(awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}') s"
}
netem_on() {
  for d in rxeveth0 rxeveth1; do tc qdisc add dev $d root netem loss "$LOSS%"; done
}
netem_off() {  # also checks that netem dropped datagrams while it was on
  drops=0
  for d in rxeveth0 rxeveth1; do
    n=$(tc -s qdisc show dev $d | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
    drops=$((drops + ${n:-0}))
    tc qdisc del dev $d root
  done
  echo "== netem dropped $drops datagrams"
  [ "$drops" -gt 0 ] || { echo "netem loss $LOSS% was on but dropped nothing" >&2; exit 1; }
}

run "plugin rxe0<->rxe1, no loss" "$P"

netem_on
RXE_TEST_LOSS=$LOSS run "plugin rxe0<->rxe1, netem loss $LOSS% each way" "$P"
netem_off
netem_on
RXE_TEST_LOSS=$LOSS run "collectives rxe0/rxe1, netem loss $LOSS% each way" "$C"
netem_off
