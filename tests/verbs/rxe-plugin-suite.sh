#!/bin/sh
# Runs inside the rxe VM: the plugin harness (tests/plugin) with OPTIREDUCE_DATAPATH=verbs,
# i.e. the whole transport over UD queue pairs on rxe0. Both harness ranks open device 0, so
# their traffic stays inside rxe0 and netem on the veth cannot touch it; loss here comes from
# the transport's own fault injector (the FaultInjection group); rxe-loss-suite.sh runs two
# processes on rxe0 and rxe1 under real netem loss. The guest runs under software
# emulation (10-50x slower than native), so the groups are those that exercise every path of
# the transport without the 64 MiB sweeps, which the host runs over UDP, and each child's time
# limit is tripled (HARNESS_TIME_SCALE, tests/plugin/two_procs.h) and the longest tests move an
# eighth of their messages (HARNESS_VOLUME_DIVISOR).
# Then the dead-peer tests over verbs, where no ICMP reports a dead process: only the
# keepalive finds it (bound, slack and the early margin raised for the emulated guest). A clean close, and a
# killed peer found from each side of a transfer, exact and bounded; on the host (UDP) every
# case runs, and the keepalive alone is what PeerStopped checks there (a stopped process sends
# no ICMP either). Not PeerAlive (a live peer idle or briefly stopped is never declared dead):
# no datapath reports a live peer, so it runs the same keepalive code over UDP on the host as
# here, and at the guest's 3 s bound its two cases took about 25 of the suite's 130 s; nor the
# other four PeerKilled cases and PeerStopped/Bounded, about 4.5 s each here, whose waits
# differ in the transport's state, not in the datapath.
# Usage (host): run-in-rxe-vm.sh rxe-plugin-suite.sh PLUGIN_HARNESS PLUGIN_PEER_DEATH
set -eu
H=$1
D=$2
FILTER='Transfer.ThirtyTwoInFlight*:Lifecycle.*:Concurrency.*:EveryVersion/MiniProxy.*/v11:FaultInjection.MiniProxy*:Bounded.UnderLoss*'
echo "== plugin harness over verbs (rxe0)"
OPTIREDUCE_DATAPATH=verbs OPTIREDUCE_IB_HCA=rxe0 HARNESS_TIME_SCALE=3 HARNESS_VOLUME_DIVISOR=8 \
  "$H" --gtest_brief=1 --gtest_filter="$FILTER"
echo "== dead peers over verbs (rxe0)"
OPTIREDUCE_DATAPATH=verbs OPTIREDUCE_IB_HCA=rxe0 PEER_DEATH_TEST_TIMEOUT_MS=3000 \
  PEER_DEATH_TEST_SLACK_MS=5000 PEER_DEATH_TEST_EARLY_MS=250 "$D" --gtest_brief=1 \
  --gtest_filter='PeerCloses.*:*/PeerKilled.*/ExactWaitingInReceive:*/PeerKilled.*/BoundedWaitingInSendMidTransfer:*/PeerStopped.*/Exact'
