#!/usr/bin/env bash
# The tail lab's network: N rank namespaces joined by shaped veths to a switch namespace, plus the
# environments layered on it (background traffic, receiver loss). Owns only namespaces named
# $OLAB_PREFIX-*; all traffic stays on 10.213.7.0/24 inside them. Usage: lab.sh help
set -euo pipefail

P=${OLAB_PREFIX:-olab}
SUBNET=10.213.7
RATE=${OLAB_RATE:-1gbit}
# About 1 MB of queue at 1 Gbit/s: deeper queues only add standing delay under cubic (lab.md).
QLIMIT=${OLAB_QLIMIT:-1mb}
BURST=${OLAB_BURST:-128kb}
MTU=${OLAB_MTU:-9000}
STATE=${OLAB_STATE:-/run/$P}
SW=$P-sw
# Background senders and receivers run at the lowest CPU priority: in a cloud they are other
# tenants on other machines, and here their CPU cost on the 2 shared cores would otherwise stand
# in for network contention (every algorithm, baselines included, sees the same rule).
# A command prefix, split into words where used (hence the SC2086 exceptions below).
BGNICE=${OLAB_BGNICE-nice -n 19}
# Background TCP (iperf3) uses only these ports, as servers: flows at 5300+f, jobs at
# 5400+16s+d. Nothing else in the lab listens here (Gloo, Open MPI and optireduce bind ephemeral
# ports, 32768 and up), so a counter on them measures the background's bytes and only those.
BGPORTS=5300:5599

die() {
  echo "lab.sh: $*" >&2
  exit 1
}
need_root() { [[ $(id -u) == 0 ]] || die "must run as root (network namespaces, tc, iptables)"; }
rank_ns() { echo "$P-r$1"; }
rank_ip() { echo "$SUBNET.$(($1 + 1))"; }
# The harness's own control traffic (optireduce-bench's barrier and result reductions) binds a
# second address on the same interface, which the loss environment leaves alone: a lost
# segment of the per-iteration barrier costs TCP a 200 ms RTO and made one rank start a call
# that late, a straggler the harness made, not the network under test.
CTL_SUBNET=10.213.8
ctl_ip() { echo "$CTL_SUBNET.$(($1 + 1))"; }
nranks() { cat "$STATE/nranks" 2>/dev/null || echo 0; }
in_ns() {
  local ns=$1
  shift
  ip netns exec "$ns" "$@"
}

usage() {
  cat <<EOF
lab.sh up N            build N (2..4) rank namespaces $P-r0.. + switch $SW (tears down first)
lab.sh down            kill what runs in the lab namespaces and delete them (idempotent)
lab.sh check           verify the tools the lab needs
lab.sh bg start FLOWS BURST_KB OFF_MS [SEED [SECONDS]]
                       FLOWS background TCP flows (iperf3, cubic) between random rank pairs
                       (seeded): bursts of BURST_KB at full speed, random pauses around OFF_MS;
                       FLOWS "all": every rank bursts to every other at once (background jobs)
lab.sh bg stop         stop the background flows
lab.sh bg bytes        print "EPOCH BYTES": now, and the TCP bytes delivered so far to the
                       background's servers, all ranks together (iptables counters)
lab.sh bg active T0 T1 print the seconds of [T0, T1] (epoch) in which background bursts ran
lab.sh loss P          drop each packet arriving at a rank with probability P (0 removes), except
                       the harness's control traffic (from the LAB_CTL_IP addresses)
lab.sh ranks SECS CMD  run CMD in every rank namespace at once (RANK, WORLD_SIZE, LAB_IP, LAB_CTL_IP set),
                       kill all after SECS; fails if any rank fails
lab.sh exec R CMD      run CMD in rank R's namespace
Environment: OLAB_PREFIX=$P OLAB_RATE=$RATE OLAB_QLIMIT=$QLIMIT OLAB_MTU=$MTU OLAB_BGNICE="$BGNICE"
EOF
}

check() {
  local missing=()
  for t in ip tc iptables iperf3 ethtool timeout; do
    command -v "$t" >/dev/null || missing+=("$t")
  done
  ((${#missing[@]} == 0)) || die "missing tools: ${missing[*]} (apt-get install iproute2 iptables iperf3 ethtool)"
}

# Kills processes living in our namespaces, by pid (ip netns pids lists exactly those).
kill_ns_procs() {
  local ns=$1 sig=${2:-TERM} pids
  mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
  if ((${#pids[@]})); then kill "-$sig" "${pids[@]}" 2>/dev/null || true; fi
}

down() {
  need_root
  local ns
  # The background loops run in the root namespace (they enter the ranks' per burst): stop them
  # first, or an interrupted run would leave them retrying until their SECONDS ran out.
  bg_stop
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P-(r[0-9]+|sw)$" || true); do
    kill_ns_procs "$ns" TERM
  done
  sleep 0.2
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P-(r[0-9]+|sw)$" || true); do
    kill_ns_procs "$ns" KILL
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$STATE"
}

# Offloads off so that tbf and iptables see real packets; RPS so that 2 cores do not reorder the
# veth -> bridge -> shaper path (spurious TCP retransmits otherwise; lab.md).
tune_dev() {
  local ns=$1 dev=$2
  in_ns "$ns" ip link set "$dev" mtu "$MTU"
  in_ns "$ns" ethtool -K "$dev" tso off gso off gro off >/dev/null 2>&1 || true
  in_ns "$ns" sh -c "echo 3 > /sys/class/net/$dev/queues/rx-0/rps_cpus" 2>/dev/null || true
  in_ns "$ns" tc qdisc replace dev "$dev" root tbf rate "$RATE" burst "$BURST" limit "$QLIMIT"
}

up() {
  need_root
  check
  local n=${1:-4}
  [[ $n =~ ^[2-4]$ ]] || die "N must be 2, 3 or 4"
  down
  mkdir -p "$STATE"
  echo "$n" >"$STATE/nranks"
  ip netns add "$SW"
  in_ns "$SW" ip link set lo up
  in_ns "$SW" ip link add br0 type bridge
  in_ns "$SW" ip link set br0 mtu "$MTU"
  in_ns "$SW" ip link set br0 up
  local r ns
  for ((r = 0; r < n; r++)); do
    ns=$(rank_ns "$r")
    ip netns add "$ns"
    in_ns "$ns" ip link set lo up
    # Create the pair inside the switch namespace, then move one end: nothing touches the root
    # namespace's links.
    in_ns "$SW" ip link add "p$r" type veth peer name lab0 netns "$ns"
    in_ns "$SW" ip link set "p$r" master br0
    tune_dev "$SW" "p$r"
    tune_dev "$ns" lab0
    in_ns "$SW" ip link set "p$r" up
    in_ns "$ns" ip addr add "$(rank_ip "$r")/24" dev lab0
    # After the rank's address, so that it stays lab0's first one (the transport's choice).
    in_ns "$ns" ip addr add "$(ctl_ip "$r")/24" dev lab0
    in_ns "$ns" ip link set lab0 up
    # BBR's RTT probing alone gives an idle P99/P50 of ~1.4 here; cubic per route and per netns.
    in_ns "$ns" sysctl -qw net.ipv4.tcp_congestion_control=cubic 2>/dev/null || true
    in_ns "$ns" ip route replace "$SUBNET.0/24" dev lab0 src "$(rank_ip "$r")" congctl cubic
    # Counts what the background delivers to this rank (lab.sh bg bytes): mangle, not filter, so
    # that the loss environment's flush of filter INPUT leaves it alone; no target, count only.
    in_ns "$ns" iptables -t mangle -A INPUT -i lab0 -p tcp --dport "$BGPORTS"
  done
  # Wait for the bridge ports to forward, then prove every pair talks.
  for ((r = 1; r < n; r++)); do
    local ok=0 out
    for _ in $(seq 50); do
      # A refused TCP connect proves the path both ways without needing ping installed.
      out=$(in_ns "$(rank_ns 0)" timeout 1 bash -c "exec 3<>/dev/tcp/$(rank_ip "$r")/9" 2>&1 || true)
      if [[ $out == *refused* ]]; then
        ok=1
        break
      fi
      sleep 0.1
    done
    ((ok)) || die "rank 0 cannot reach rank $r"
  done
  echo "lab up: $n ranks, $RATE tbf (limit $QLIMIT), MTU $MTU, namespaces $P-r0..$P-r$((n - 1)) + $SW"
}

loss() {
  need_root
  local p=$1 n r ns
  n=$(nranks)
  ((n > 0)) || die "lab is not up"
  for ((r = 0; r < n; r++)); do
    ns=$(rank_ns "$r")
    in_ns "$ns" iptables -F INPUT
    if [[ $p != 0 ]]; then
      # At the receiver: a drop at the sender's own qdisc would be reported to the sender.
      in_ns "$ns" iptables -A INPUT -i lab0 ! -s "$CTL_SUBNET.0/24" -m statistic --mode random \
        --probability "$p" -j DROP
    fi
  done
}

bg_stop() {
  need_root
  [[ -f $STATE/bg.pids ]] || return 0
  local pid
  while read -r pid; do
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done <"$STATE/bg.pids"
  rm -f "$STATE/bg.pids"
  # iperf3 servers and clients are the only other things we start in rank namespaces.
  local n r
  n=$(nranks)
  for ((r = 0; r < n; r++)); do
    for pid in $(ip netns pids "$(rank_ns "$r")" 2>/dev/null); do
      if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == iperf3 ]]; then
        kill "$pid" 2>/dev/null || true
      fi
    done
  done
}

# One background flow: bursts of BURST_KB sent as fast as TCP (cubic) can, each after a random
# pause of OFF_MS/2 .. 3*OFF_MS/2 (seeded). Bursts, not a constant rate: a constant rate only
# shifts the median, colliding bursts make the tail (as background allreduce jobs do).
bg_flow() {
  local src=$1 dst=$2 burst_kb=$3 off_ms=$4 seed=$5 secs=$6 port=$7
  RANDOM=$seed
  local end=$((SECONDS + secs)) off
  while ((SECONDS < end)); do
    off=$((off_ms / 2 + (RANDOM * 32768 + RANDOM) % (off_ms + 1)))
    sleep "$(printf '%d.%03d' $((off / 1000)) $((off % 1000)))"
    echo "$EPOCHREALTIME,1" >>"$ACT"
    # shellcheck disable=SC2086
    timeout 10 ip netns exec "$(rank_ns "$src")" $BGNICE iperf3 -c "$(rank_ip "$dst")" -p "$port" \
      -n "${burst_kb}K" -C cubic >/dev/null 2>&1 || true
    echo "$EPOCHREALTIME,-1" >>"$ACT"
  done
}

bg_start() {
  need_root
  local flows=$1 burst_kb=$2 off_ms=$3 seed=$4 secs=$5 n r f src dst
  n=$(nranks)
  ((n > 0)) || die "lab is not up"
  bg_stop
  : >"$STATE/bg.activity"
  ((flows > 0)) || return 0
  RANDOM=$seed
  for ((f = 0; f < flows; f++)); do
    src=$((RANDOM % n))
    dst=$(((src + 1 + RANDOM % (n - 1)) % n))
    # One server per flow (an iperf3 server serves one test at a time), on its destination.
    # shellcheck disable=SC2086
    timeout $((secs + 15)) ip netns exec "$(rank_ns "$dst")" $BGNICE iperf3 -s -p $((5300 + f)) \
      >/dev/null 2>&1 &
    echo $! >>"$STATE/bg.pids"
    setsid bash -c "$(declare -f bg_flow rank_ns rank_ip); P=$P SUBNET=$SUBNET BGNICE=\"$BGNICE\" \
      ACT=$STATE/bg.activity; \
      bg_flow $src $dst $burst_kb $off_ms $((seed * 1000 + f)) $secs $((5300 + f))" &
    echo $! >>"$STATE/bg.pids"
  done
  sleep 0.5
}

# Background jobs: after each random pause of OFF_MS/2 .. 3*OFF_MS/2 (seeded), every rank sends
# BURST_KB to every other rank at once (one cubic flow per ordered pair), as a background
# collective job does; the next pause starts when the last flow ends. Every link then carries
# N-1 competing flows together, so the iterations that overlap a job slow down by up to that
# factor while the others run alone: the duty cycle sets how many, which makes P99/P50 of 3
# reachable (independent flows between random pairs rarely pile up on one link on 2 cores).
bg_jobs_loop() {
  local n=$1 burst_kb=$2 off_ms=$3 seed=$4 secs=$5 s d off
  RANDOM=$seed
  local end=$((SECONDS + secs))
  while ((SECONDS < end)); do
    off=$((off_ms / 2 + (RANDOM * 32768 + RANDOM) % (off_ms + 1)))
    sleep "$(printf '%d.%03d' $((off / 1000)) $((off % 1000)))"
    echo "$EPOCHREALTIME,1" >>"$ACT"
    for ((s = 0; s < n; s++)); do
      for ((d = 0; d < n; d++)); do
        ((s == d)) && continue
        # shellcheck disable=SC2086
        timeout 10 ip netns exec "$(rank_ns "$s")" $BGNICE iperf3 -c "$(rank_ip "$d")" \
          -p $((5400 + s * 16 + d)) -n "${burst_kb}K" -C cubic >/dev/null 2>&1 &
      done
    done
    wait
    echo "$EPOCHREALTIME,-1" >>"$ACT"
  done
}

bg_jobs() {
  need_root
  local burst_kb=$1 off_ms=$2 seed=$3 secs=$4 n s d
  n=$(nranks)
  ((n > 0)) || die "lab is not up"
  bg_stop
  : >"$STATE/bg.activity"
  for ((s = 0; s < n; s++)); do
    for ((d = 0; d < n; d++)); do
      ((s == d)) && continue
      # shellcheck disable=SC2086
      timeout $((secs + 15)) ip netns exec "$(rank_ns "$d")" $BGNICE iperf3 -s -p $((5400 + s * 16 + d)) \
        >/dev/null 2>&1 &
      echo $! >>"$STATE/bg.pids"
    done
  done
  setsid bash -c "$(declare -f bg_jobs_loop rank_ns rank_ip); P=$P SUBNET=$SUBNET BGNICE=\"$BGNICE\" \
    ACT=$STATE/bg.activity; bg_jobs_loop $n $burst_kb $off_ms $seed $secs" &
  echo $! >>"$STATE/bg.pids"
  sleep 0.5
}

# "EPOCH BYTES": the time, then the bytes of TCP delivered to the background's server ports
# (BGPORTS) in all rank namespaces since the lab came up: IP packets with headers, counted at the
# receiver's INPUT, so after every shaper drop (what the background actually moved).
bg_bytes() {
  need_root
  local n r t sum=0 b
  n=$(nranks)
  ((n > 0)) || die "lab is not up"
  t=$EPOCHREALTIME
  for ((r = 0; r < n; r++)); do
    b=$(in_ns "$(rank_ns "$r")" iptables -t mangle -nvxL INPUT |
      awk -v p="dpts:$BGPORTS" '$0 ~ p { s += $2 } END { printf "%.0f\n", s }')
    sum=$((sum + b))
  done
  echo "$t $sum"
}

# Seconds of [T0, T1] in which at least one background burst ran (a round of jobs, or a flow's
# burst), from the +1/-1 events the background loops log: bytes over these seconds is the rate the
# background got while it was sending, which the pauses between bursts do not dilute. A burst
# counts from the launch of its iperf3 clients to the exit of the last one, start-up and control
# exchange included (at nice 19 that start-up stretches when the benchmark keeps the CPUs busy).
bg_active() {
  local t0=$1 t1=$2
  [[ -s $STATE/bg.activity ]] || {
    echo 0
    return 0
  }
  sort -t, -k1,1g "$STATE/bg.activity" | awk -F, -v t0="$t0" -v t1="$t1" '
    { if ($1 <= t0) { lv += $2; next }
      if ($1 >= t1) exit
      if (lv > 0) act += $1 - prev
      prev = $1; lv += $2 }
    BEGIN { prev = t0 }
    END { if (lv > 0) act += t1 - prev; printf "%.3f\n", act }'
}

run_ranks() {
  need_root
  local secs=$1
  shift
  local n r pids=() rc=0
  n=$(nranks)
  ((n > 0)) || die "lab is not up"
  for ((r = 0; r < n; r++)); do
    # No OPTIREDUCE_* here: the figures are the defaults a new user gets, and the transport's
    # default interface, the first one up that is not loopback, is lab0 (the only one).
    timeout -k 5 "$secs" ip netns exec "$(rank_ns "$r")" env RANK="$r" WORLD_SIZE="$n" \
      LAB_IP="$(rank_ip "$r")" LAB_CTL_IP="$(ctl_ip "$r")" "$@" &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait "${pids[$r]}" || {
      echo "lab.sh: rank $r exited with $?" >&2
      rc=1
    }
  done
  return $rc
}

cmd=${1:-help}
shift || true
case $cmd in
  up) up "$@" ;;
  down) down ;;
  check) check ;;
  loss) loss "${1:?probability}" ;;
  bg)
    case ${1:-} in
      start)
        # FLOWS "all": synchronized all-pairs bursts (bg_jobs), else independent flows.
        if [[ ${2:?flows} == all ]]; then
          bg_jobs "${3:?burst_kb}" "${4:?off_ms}" "${5:-1}" "${6:-600}"
        else
          bg_start "$2" "${3:?burst_kb}" "${4:?off_ms}" "${5:-1}" "${6:-600}"
        fi
        ;;
      stop) bg_stop ;;
      bytes) bg_bytes ;;
      active) bg_active "${2:?t0}" "${3:?t1}" ;;
      *) die "bg start|stop|bytes|active" ;;
    esac
    ;;
  ranks) run_ranks "$@" ;;
  exec)
    r=${1:?rank}
    shift
    in_ns "$(rank_ns "$r")" env RANK="$r" WORLD_SIZE="$(nranks)" LAB_IP="$(rank_ip "$r")" \
      LAB_CTL_IP="$(ctl_ip "$r")" "$@"
    ;;
  ip) rank_ip "${1:?rank}" ;;
  ns) rank_ns "${1:?rank}" ;;
  help | -h | --help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
