#!/bin/sh
# Runs inside the rxe VM: the plugin harness (tests/plugin) with OPTIREDUCE_DATAPATH=verbs,
# i.e. the whole transport over UD queue pairs on rxe0, then the same groups over UDP in the
# same guest for comparison. Both harness ranks open device 0, so their traffic stays inside
# rxe0 and netem on the veth cannot touch it; loss here comes from the transport's own fault
# injector (the FaultInjection group).
# Usage (host): run-in-rxe-vm.sh rxe-plugin-suite.sh PLUGIN_HARNESS
set -u
H=$1
FILTER='Transfer.*:Lifecycle.*:Concurrency.*:EveryVersion/MiniProxy.*:FaultInjection.*:Bounded.*'
rc=0
echo "== plugin harness over verbs (rxe0)"
OPTIREDUCE_DATAPATH=verbs OPTIREDUCE_IB_HCA=rxe0 "$H" --gtest_brief=1 --gtest_filter="$FILTER" || rc=1
echo "== plugin harness over udp (lo), same guest"
OPTIREDUCE_DATAPATH=udp "$H" --gtest_brief=1 --gtest_filter="$FILTER" || rc=1
exit $rc
