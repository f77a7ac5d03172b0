#!/usr/bin/env bash
# The whole tail-lab matrix: builds the namespaces (lab.sh), calibrates the background levels on
# Gloo ring, runs every algorithm in every environment, then writes CSV + PNG + headline.md into
# $OUT and prints the headline ratios. Always tears the lab down. Knobs: see the defaults below.
# Every figure is measured with the library's defaults, as a new user gets them: no OPTIREDUCE_*
# variable is set here, and one set by the caller stops the run unless ALLOW_KNOBS=1.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
source "$HERE/../script_args.sh"
script_args "$0" "$@"
LAB=$HERE/lab.sh
N=${N:-4}
SIZE=${SIZE:-}              # one bucket size (-b and -e); unset: the sweep below
SIZE_MIN=${SIZE_MIN:-${SIZE:-4M}}
SIZE_MAX=${SIZE_MAX:-${SIZE:-16M}}
FACTOR=${FACTOR:-4}         # -f: sizes SIZE_MIN x FACTOR^k up to SIZE_MAX (4 and 16 MiB)
CAL_SIZE=${CAL_SIZE:-$SIZE_MIN} # the background is calibrated on Gloo ring at this one size
ITERS=${ITERS:-300}         # measured iterations per (environment, algorithm, size)
WARMUP=${WARMUP:-5}         # TAR bounded adds its calibration steps on top
CAL_ITERS=${CAL_ITERS:-200} # per calibration level
STRAG_ITERS=${STRAG_ITERS:-50}
STRAG_PROB=${STRAG_PROB:-0.1}
STRAG_MS=${STRAG_MS:-2000}
LOSS=${LOSS:-0.01}          # per-packet drop probability at every receiver, "loss" environment
SEED=${SEED:-1}
ENVS=${ENVS:-"idle bg15 bg30 loss straggler"}
ALGOS=${ALGOS:-tar-bounded-ht,tar-bounded,tar-exact,gloo-ring,gloo-bcube}
MPI=${MPI:-1}
# Opt-in, not a default: bg30 again for the bounded variants at each of these
# OPTIREDUCE_TIMEOUT_HEADROOM values (env "bg30-h<value>", marked non-default in the report): the
# trade between the P99 and the delivered fraction. Empty (the default): skip.
HEADROOMS=${HEADROOMS-}
ALLOW_KNOBS=${ALLOW_KNOBS:-0} # 1: run even with OPTIREDUCE_* set by the caller (not publishable)
BUILD=${BUILD:-$ROOT/build-lab}
OUT=${OUT:-$ROOT/bench/results}
LINK_GBPS=${LINK_GBPS:-1}
export OLAB_RATE=${OLAB_RATE:-${LINK_GBPS}gbit}
# Background levels tried by the calibration: "FLOWS:BURST_KB:OFF_MS" (lab.sh bg start); FLOWS
# "all" = background jobs (every rank bursts to every other at once). Independent flows between
# random pairs topped out at a Gloo ring P99/P50 of about 2 on 2 cores; jobs reach 3 (lab.md).
LEVELS=${LEVELS:-"all:1024:1500 all:2048:1500 all:4096:2000 all:8192:3000 all:8192:2000"}

BENCH=$BUILD/bench/optireduce-bench
MPIBENCH=$BUILD/bench/optireduce-mpi-bench
[[ -x $BENCH ]] || {
  echo "run-lab.sh: $BENCH missing: meson setup build-lab && ninja -C build-lab" >&2
  exit 1
}
[[ $(id -u) == 0 ]] || {
  echo "run-lab.sh: run as root" >&2
  exit 1
}
# The published figures must be the defaults: an OPTIREDUCE_* variable exported by the caller
# would reach every rank (lab.sh ranks and mpirun pass the environment on) and change them.
mapfile -t KNOBS < <(compgen -e | grep '^OPTIREDUCE_' || true)
if ((${#KNOBS[@]})) && [[ $ALLOW_KNOBS != 1 ]]; then
  echo "run-lab.sh: ${KNOBS[*]} set in the environment; the lab measures the defaults a new" \
    "user gets: unset them, or set ALLOW_KNOBS=1 to measure them anyway (not as defaults)" >&2
  exit 1
fi
"$LAB" check

WORK=$(mktemp -d /tmp/olab-run.XXXXXX)
cleanup() {
  "$LAB" down || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$OUT/logs"
rm -f "$OUT"/results.csv "$OUT"/samples.csv "$OUT"/calibration.csv "$OUT"/cal-raw.csv \
  "$OUT"/background.csv "$OUT"/knobs.txt "$OUT"/*.png "$OUT"/headline.md "$OUT"/logs/*
START=$SECONDS
log() { printf '[%4ds] %s\n' $((SECONDS - START)) "$*"; }

# Bytes, as the bench parses them (K, M, G binary), rounded down to whole fp32 elements.
to_bytes() {
  awk -v s="$1" 'BEGIN { m = 1; if (s ~ /[Kk]/) m = 1024; else if (s ~ /[Mm]/) m = 2 ^ 20;
    else if (s ~ /[Gg]/) m = 2 ^ 30; printf "%d\n", int(s * m / 4) * 4 }'
}
# The sizes the bench runs for -b/-e/-f (bench/lab_common.h size_list), one per line.
size_list() {
  local b e f
  b=$(to_bytes "$1")
  e=$(to_bytes "$2")
  f=$3
  if ((f < 2)); then
    echo "$b"
    if ((e != b)); then echo "$e"; fi
    return 0
  fi
  while ((b <= e)); do
    echo "$b"
    b=$((b * f))
  done
}
mapfile -t SIZES < <(size_list "$SIZE_MIN" "$SIZE_MAX" "$FACTOR")
((${#SIZES[@]})) || {
  echo "run-lab.sh: no sizes from SIZE_MIN=$SIZE_MIN SIZE_MAX=$SIZE_MAX FACTOR=$FACTOR" >&2
  exit 1
}

"$LAB" up "$N"
if ((${#KNOBS[@]})); then
  for k in "${KNOBS[@]}"; do echo "$k=${!k}"; done >"$OUT/knobs.txt"
  log "NOT the defaults (ALLOW_KNOBS=1): $(tr '\n' ' ' <"$OUT/knobs.txt")"
else
  log "all OPTIREDUCE_* settings at their defaults"
fi
log "$OLAB_RATE links, sizes $(awk -v s="${SIZES[*]}" 'BEGIN { n = split(s, a, " ");
  for (i = 1; i <= n; i++) printf "%s%g MiB", (i > 1 ? ", " : ""), a[i] / 2 ^ 20 }'), loss $LOSS"
uptime | sed 's/^/load: /'

# run_bench ENV ITERS CSV SAMPLES ALGOS [extra args]: every rank in its namespace.
run_bench() {
  local env=$1 iters=$2 csvf=$3 samp=$4 algos=$5
  shift 5
  local store seen
  store=$(mktemp -d "$WORK/store.XXXX")
  seen=$( (wc -l <"$OUT/logs/$env.log") 2>/dev/null || echo 0)
  # A generous bound: iterations at up to 1 s each (stragglers: plus their sleeps), plus set-up.
  local limit=$((120 + iters * 6))
  timeout -k 5 $((limit + 10)) "$LAB" ranks "$limit" "$BENCH" -b "$SIZE_MIN" -e "$SIZE_MAX" \
    -f "$FACTOR" -n "$iters" -w "$WARMUP" -c 1 -g "$algos" --store "$store" --env "$env" \
    --csv "$csvf" --samples "$samp" --seed "$SEED" "$@" >>"$OUT/logs/$env.log" 2>&1 ||
    log "WARNING: optireduce-bench failed in $env (see logs/$env.log)"
  tail -n +$((seen + 1)) "$OUT/logs/$env.log" | grep -E "^$env " | tail -n 20 || true
}

run_mpi() {
  local env=$1 iters=$2
  shift 2
  [[ $MPI == 1 && -x $MPIBENCH ]] || return 0
  local hosts r
  hosts=$WORK/hosts
  : >"$hosts"
  for ((r = 0; r < N; r++)); do echo "$("$LAB" ns "$r") slots=1" >>"$hosts"; done
  # mpirun runs inside rank 0's namespace so that its daemons reach it over the lab network;
  # yield_when_idle: 4 busy-polling ranks on 2 cores would otherwise measure the CPU. One retry:
  # Debian's orted now and then dies at start-up in hwloc's shared-memory topology export
  # (SIGSEGV in hwloc_shmem_topology_write) before any rank ran.
  local attempt
  for attempt in 1 2; do
    mpi_once "$env" "$iters" "$hosts" "$@" && break
    log "WARNING: MPI failed in $env, attempt $attempt (see logs/$env.log)"
  done
  grep -E "^$env +mpi " "$OUT/logs/$env.log" | tail -n 5 || true
}

mpi_once() {
  local env=$1 iters=$2 hosts=$3
  shift 3
  PMIX_MCA_gds="hash" timeout -k 5 $((120 + iters * 6)) ip netns exec "$("$LAB" ns 0)" \
    mpirun --allow-run-as-root --oversubscribe -np "$N" --hostfile "$hosts" \
    --mca plm_rsh_agent "$HERE/netns-agent.sh" --mca btl self,tcp \
    --mca btl_tcp_if_include lab0 --mca oob_tcp_if_include lab0 --mca mpi_yield_when_idle 1 \
    -x PMIX_MCA_gds=hash -x OLAB_PREFIX="${OLAB_PREFIX:-olab}" \
    "$MPIBENCH" -b "$SIZE_MIN" -e "$SIZE_MAX" -f "$FACTOR" -n "$iters" -w "$WARMUP" -c 1 \
    --env "$env" \
    --csv "$OUT/results.csv" --samples "$OUT/samples.csv" --seed "$SEED" "$@" \
    >>"$OUT/logs/$env.log" 2>&1
}

# How long a background runs: generous (2 s an iteration plus a minute of set-up per bench run,
# RUNS runs), since "lab.sh bg stop" (and "down", on any exit) ends it as soon as it is not needed.
bg_secs() { echo $((${1:-1} * (60 + 2 * ITERS) + 120)); }

# bg_measure ENV ALGO SIZE CMD...: runs CMD and appends to background.csv what the background
# moved meanwhile: its bytes (lab.sh bg bytes: TCP delivered to its own server ports, so none of
# the benchmark's traffic), the window's seconds, and the seconds of it in which bursts ran.
# report.py compares bytes per active second beside each algorithm with beside Gloo ring.
bg_measure() {
  local env=$1 algo=$2 size=$3 t0=0 b0=0 t1=0 b1=0 act secs
  shift 3
  read -r t0 b0 < <("$LAB" bg bytes) || true
  "$@"
  read -r t1 b1 < <("$LAB" bg bytes) || true
  act=$("$LAB" bg active "$t0" "$t1" || echo nan)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
  echo "$env,$algo,$size,$((b1 - b0)),$secs,$act" >>"$OUT/background.csv"
}

# run_env ENV ITERS ALGOS [extra args]: the bench (and MPI) in one environment. Under background
# traffic each (algorithm, size) is its own bench run, so that the background's bytes can be
# read at its start and end (one run would do them all back to back, out of sight); elsewhere
# one run does every algorithm and size.
run_env() {
  local env=$1 iters=$2 algos=$3 a b
  shift 3
  case $env in
    bg*) ;;
    *)
      run_bench "$env" "$iters" "$OUT/results.csv" "$OUT/samples.csv" "$algos" "$@"
      run_mpi "$env" "$iters" "$@"
      return 0
      ;;
  esac
  for a in ${algos//,/ }; do
    for b in "${SIZES[@]}"; do
      SIZE_MIN=$b SIZE_MAX=$b bg_measure "$env" "$a" "$b" \
        run_bench "$env" "$iters" "$OUT/results.csv" "$OUT/samples.csv" "$a" "$@"
    done
  done
  [[ $MPI == 1 && -x $MPIBENCH ]] || return 0
  for b in "${SIZES[@]}"; do
    SIZE_MIN=$b SIZE_MAX=$b bg_measure "$env" mpi "$b" run_mpi "$env" "$iters" "$@"
  done
}
# Bench runs in a background environment: one per (algorithm, size), MPI one per size.
bg_runs() {
  local algos=$1 n
  n=$(tr ',' '\n' <<<"$algos" | grep -c .)
  echo $(((n + 1) * ${#SIZES[@]}))
}

# --- calibration: Gloo ring P99/P50 at each background level; pick the nearest to 1.5 and 3.0.
if [[ " $ENVS " == *" bg15 "* || " $ENVS " == *" bg30 "* ]]; then
  echo "level,background,p50_ms,p99_ms,p99_p50" >"$OUT/calibration.csv"
  k=0
  for lv in $LEVELS; do
    IFS=: read -r flows burst off <<<"$lv"
    "$LAB" bg start "$flows" "$burst" "$off" "$SEED" "$(bg_secs 1)"
    log "calibrating level $k: $flows flows, ${burst} KiB bursts every ~${off} ms, at $CAL_SIZE"
    SIZE_MIN=$CAL_SIZE SIZE_MAX=$CAL_SIZE run_bench "cal$k" "$CAL_ITERS" "$OUT/cal-raw.csv" \
      /dev/null gloo-ring
    "$LAB" bg stop
    awk -F, -v k="$k" -v lv="$lv" -v env="cal$k" 'NR > 1 && $1 == env {
      printf "%d,%s,%s,%s,%s\n", k, lv, $6, $7, $11 }' "$OUT/cal-raw.csv" >>"$OUT/calibration.csv"
    k=$((k + 1))
  done
  pick() {
    awk -F, -v t="$1" 'NR > 1 { d = log($5 / t); if (d < 0) d = -d;
      if (best == "" || d < bd) { best = $2; bd = d } } END { print best }' "$OUT/calibration.csv"
  }
  BG15=$(pick 1.5)
  BG30=$(pick 3.0)
  log "calibrated: bg15 = $BG15, bg30 = $BG30 (flows:burst_kb:off_ms)"
fi

# --- the matrix.
if [[ " $ENVS " == *" bg"* ]]; then
  echo "env,algo,size,bytes,seconds,active_s" >"$OUT/background.csv"
fi
for env in $ENVS; do
  extra=()
  iters=$ITERS
  case $env in
    idle) ;;
    bg15 | bg30)
      lv=$([[ $env == bg15 ]] && echo "$BG15" || echo "$BG30")
      IFS=: read -r flows burst off <<<"$lv"
      runs=$(bg_runs "$ALGOS")
      if [[ $env == bg30 ]]; then runs=$((runs + $(wc -w <<<"$HEADROOMS") * 2 * ${#SIZES[@]})); fi
      "$LAB" bg start "$flows" "$burst" "$off" "$SEED" "$(bg_secs "$runs")"
      ;;
    loss) "$LAB" loss "$LOSS" ;;
    straggler)
      iters=$STRAG_ITERS
      extra=(--straggler-rank $((N - 1)) --straggler-ms "$STRAG_MS" --straggler-prob "$STRAG_PROB")
      ;;
    *)
      log "unknown environment $env"
      continue
      ;;
  esac
  log "environment $env"
  run_env "$env" "$iters" "$ALGOS" "${extra[@]}"
  if [[ $env == bg30 ]]; then
    for h in $HEADROOMS; do
      log "environment bg30-h$h: NOT the defaults, OPTIREDUCE_TIMEOUT_HEADROOM=$h (HEADROOMS)"
      MPI=0 OPTIREDUCE_TIMEOUT_HEADROOM=$h run_env "bg30-h$h" "$iters" tar-bounded-ht,tar-bounded
    done
  fi
  case $env in
    bg15 | bg30) "$LAB" bg stop ;;
    loss) "$LAB" loss 0 ;;
  esac
done

log "matrix done; load: $(cut -d' ' -f1-3 /proc/loadavg)"
# Debian's python3 carries python3-matplotlib; a python3 first on PATH (pyenv) may not.
PY=${PYTHON:-/usr/bin/python3}
[[ -x $PY ]] || PY=python3
"$PY" "$HERE/report.py" "$OUT" || log "WARNING: report failed (python3-matplotlib installed?)"
log "wrote $OUT/{results,samples,calibration,background}.csv, *.png, headline.md"
