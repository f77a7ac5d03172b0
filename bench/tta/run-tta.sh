#!/usr/bin/env bash
# Time to accuracy in the tail lab. One command regenerates everything (runs, plots, table, goals):
#
#   sudo bench/tta/run-tta.sh            # full matrix: 5 environments x 4 exchanges x 3 seeds
#                                        # + the loss sweep; writes bench/results/tta/
#   sudo ENVS="idle bg30" SEEDS=1 bench/tta/run-tta.sh       # a reduced matrix
#   bench/tta/report.py bench/results/tta                      # the report alone, from the JSONs
#
# Needs: root (network namespaces), /usr/bin/python3 with python3-torch and python3-matplotlib,
# dataset-fashion-mnist, and for the opti-* exchanges a release build in build/ (liboptireduce.so,
# found by python/optireduce) : source .ci/build.sh && optireduce_build build release.
#
# Four rank namespaces behind 1 Gbit/s shaped links (bench/lab/lab.sh, as run-lab.sh builds them);
# train.py (MLP 784-1024-1024-10 on Fashion-MNIST, DDP over Gloo) runs in each environment with
# every exchange, interleaved per seed (seed 1: ddp-gloo, opti-exact, opti-bounded,
# opti-bounded-ht; then seed 2 ...), so that the exchanges of one seed see the same minutes.
# Environments: idle; bg15 / bg30 (background jobs calibrated on Gloo's allreduce of the model's
# gradient size to a P99/P50 near 1.5 / 3, run-lab.sh's levels and rule); loss (LOSS random
# drops at every receiver, iptables); straggler (rank N-1 sleeps STRAG_MS before a step with
# probability STRAG_PROB, seeded). Then the loss sweep: the bounded exchanges, with and without
# Hadamard, at injected loss SWEEP in the idle lab, injected by the transport's fault injector
# (OPTIREDUCE_FAULT_DROP: an environment, not a tuning knob; see report).
#
# Every figure is with the library's defaults: no OPTIREDUCE_* is set here except the sweep's
# fault injector, and one set by the caller stops the run unless ALLOW_KNOBS=1. Always tears the
# lab down.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
source "$HERE/../script_args.sh"
script_args "$0" "$@"
LAB=$ROOT/bench/lab/lab.sh
PY=${PYTHON:-/usr/bin/python3}
N=${N:-4}
SEEDS=${SEEDS:-"1 2 3"}
ENVS=${ENVS:-"idle bg15 bg30 loss straggler"}
EXCHANGES=${EXCHANGES:-"ddp-gloo opti-exact opti-bounded opti-bounded-ht"}
SWEEP=${SWEEP-"0 0.01 0.05 0.1"}           # empty: no loss sweep
SWEEP_EXCHANGES=${SWEEP_EXCHANGES:-"opti-bounded opti-bounded-ht"}
# The workload (the same for every exchange and environment).
STEPS=${STEPS:-300}        # step budget: the final accuracy is after it
BATCH=${BATCH:-16}         # samples per rank per step
LR=${LR:-0.1}
EVAL_EVERY=${EVAL_EVERY:-20}
EVAL_FROM=${EVAL_FROM:-140}  # before it, every 4th interval only (evaluations cost seconds)
EVAL_LIMIT=${EVAL_LIMIT:-2000}
TARGET=${TARGET:-0.85}     # fixed in advance
LOSS=${LOSS:-0.01}
STRAG_MS=${STRAG_MS:-500}
STRAG_PROB=${STRAG_PROB:-0.05}
CAL_ITERS=${CAL_ITERS:-100}
# Background levels "FLOWS:BURST_KB:OFF_MS" (lab.sh bg start), run-lab.sh's list; the calibration
# picks the one whose Gloo P99/P50 is nearest 1.5 (bg15) and 3.0 (bg30). BG15 / BG30 set: no
# calibration for that one.
LEVELS=${LEVELS:-"all:1024:1500 all:2048:1500 all:4096:2000 all:8192:3000 all:8192:2000"}
BG15=${BG15:-}
BG30=${BG30:-}
CAL_ONLY=${CAL_ONLY:-0}   # 1: calibrate, write calibration.csv, stop (then pass BG15/BG30)
ALLOW_KNOBS=${ALLOW_KNOBS:-0}
OUT=${OUT:-$ROOT/bench/results/tta}
export OLAB_RATE=${OLAB_RATE:-1gbit}

[[ $(id -u) == 0 ]] || {
  echo "run-tta.sh: run as root" >&2
  exit 1
}
"$PY" -c 'import torch' 2>/dev/null || {
  echo "run-tta.sh: $PY cannot import torch (apt-get install python3-torch)" >&2
  exit 1
}
mapfile -t KNOBS < <(compgen -e | grep '^OPTIREDUCE_' || true)
if ((${#KNOBS[@]})) && [[ $ALLOW_KNOBS != 1 ]]; then
  echo "run-tta.sh: ${KNOBS[*]} set in the environment; the lab measures the defaults: unset" \
    "them, or set ALLOW_KNOBS=1 (not the defaults then)" >&2
  exit 1
fi
if [[ $CAL_ONLY != 1 && "$EXCHANGES ${SWEEP:+$SWEEP_EXCHANGES}" == *opti-* ]]; then
  [[ -f $ROOT/python/optireduce/torch.py || -d $ROOT/python/optireduce/torch ]] || {
    echo "run-tta.sh: $ROOT/python/optireduce missing: EXCHANGES=ddp-gloo SWEEP= only" >&2
    exit 1
  }
  [[ -f $ROOT/build/collectives/liboptireduce.so ]] || {
    echo "run-tta.sh: build/collectives/liboptireduce.so missing:" \
      "source .ci/build.sh && optireduce_build build release" >&2
    exit 1
  }
fi
"$LAB" check

cleanup() { "$LAB" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$OUT/runs" "$OUT/logs"
# calibration.csv stays: a run given BG15/BG30 from a CAL_ONLY=1 run keeps its record.
rm -rf "$OUT"/runs/* "$OUT"/logs/[!c]* "$OUT"/*.png "$OUT"/*.md "$OUT"/knobs.txt
START=$SECONDS
log() { printf '[%5ds] %s\n' $((SECONDS - START)) "$*" | tee -a "$OUT/logs/run-tta.log"; }
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "seeds: $SEEDS; envs: $ENVS; exchanges: $EXCHANGES; sweep: ${SWEEP:-none} ($SWEEP_EXCHANGES)"
  echo "steps $STEPS, batch $BATCH/rank x $N ranks, lr $LR (cosine), eval every $EVAL_EVERY on" \
    "$EVAL_LIMIT test images, target $TARGET; loss $LOSS; straggler $STRAG_MS ms p $STRAG_PROB"
  echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/setup.txt"
if ((${#KNOBS[@]})); then
  for k in "${KNOBS[@]}"; do echo "$k=${!k}"; done >"$OUT/knobs.txt"
  log "NOT the defaults (ALLOW_KNOBS=1): $(tr '\n' ' ' <"$OUT/knobs.txt")"
fi

"$LAB" up "$N" | tee -a "$OUT/logs/run-tta.log"
MASTER=$("$LAB" ip 0)
PORT=29500

# ranks LIMIT_S LOGFILE CMD...: CMD in every rank namespace with the rendezvous on rank 0's lab
# address. Gloo binds the lab interface (GLOO_SOCKET_IFNAME: a namespace's hostname resolves to
# nothing useful); a fresh port per launch (no TIME_WAIT collisions).
ranks() {
  local limit=$1 logf=$2
  shift 2
  PORT=$((PORT >= 29900 ? 29501 : PORT + 1))
  timeout -k 5 $((limit + 10)) "$LAB" ranks "$limit" env MASTER_ADDR="$MASTER" MASTER_PORT="$PORT" \
    GLOO_SOCKET_IFNAME=lab0 PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" "$@" >>"$logf" 2>&1
}

# train ENV EXCHANGE SEED [train.py args]: one run; its JSON lands in runs/ENV/EXCHANGE-sSEED.json.
train() {
  local env=$1 ex=$2 seed=$3
  shift 3
  mkdir -p "$OUT/runs/$env"
  local out=$OUT/runs/$env/$ex-s$seed.json
  # Generous: set-up, then up to 2 s a step (a straggler's sleeps on top).
  if ! ranks $((120 + STEPS * 2)) "$OUT/logs/$env.log" "$PY" "$HERE/train.py" --exchange "$ex" \
    --steps "$STEPS" --batch "$BATCH" --lr "$LR" --eval-every "$EVAL_EVERY" --eval-from "$EVAL_FROM" \
    --eval-limit "$EVAL_LIMIT" --target "$TARGET" --seed "$seed" --env "$env" --out "$out" "$@"; then
    log "WARNING: $env $ex seed $seed failed (logs/$env.log)"
  fi
  if [[ -f $out ]]; then
    grep -h "\[$ex $env\] done" "$OUT/logs/$env.log" | tail -n 1 | sed 's/^/  /' |
      tee -a "$OUT/logs/run-tta.log" || true
  fi
}

run_env() {
  local env=$1 seed ex
  shift
  for seed in $SEEDS; do
    for ex in $EXCHANGES; do
      train "$env" "$ex" "$seed" "$@"
    done
  done
}

bg_secs() { echo $((600 + ${1:-1} * (180 + STEPS * 2))); }

# --- calibration: Gloo's allreduce of the gradient size under each level (run-lab.sh's rule).
if [[ $CAL_ONLY == 1 || (" $ENVS " == *" bg15 "* && -z $BG15) ||
  (" $ENVS " == *" bg30 "* && -z $BG30) ]]; then
  echo "level,background,p50_ms,p99_ms,p99_p50" >"$OUT/calibration.csv"
  k=0
  seed1=${SEEDS%% *}
  for lv in $LEVELS; do
    IFS=: read -r flows burst off <<<"$lv"
    "$LAB" bg start "$flows" "$burst" "$off" "$seed1" 300
    : >"$OUT/logs/cal$k.log"
    ranks 300 "$OUT/logs/cal$k.log" "$PY" "$HERE/calib.py" "$CAL_ITERS" ||
      log "WARNING: calibration level $k failed (logs/cal$k.log)"
    "$LAB" bg stop
    line=$(grep -E '^[0-9.]+,[0-9.]+,[0-9.]+$' "$OUT/logs/cal$k.log" | tail -n 1 || true)
    if [[ -n $line ]]; then
      echo "$k,$lv,$line" >>"$OUT/calibration.csv"
      log "calibration level $k ($lv): Gloo allreduce P50,P99,P99/P50 = $line"
    fi
    k=$((k + 1))
  done
  pick() {
    awk -F, -v t="$1" 'NR > 1 { d = log($5 / t); if (d < 0) d = -d;
      if (best == "" || d < bd) { best = $2; bd = d } } END { print best }' "$OUT/calibration.csv"
  }
  [[ -n $BG15 ]] || BG15=$(pick 1.5)
  [[ -n $BG30 ]] || BG30=$(pick 3.0)
  log "calibrated: bg15 = $BG15, bg30 = $BG30 (flows:burst_kb:off_ms)"
fi
echo "bg15=$BG15 bg30=$BG30" >>"$OUT/setup.txt"
if [[ $CAL_ONLY == 1 ]]; then
  log "CAL_ONLY=1: calibration only; next: BG15=$BG15 BG30=$BG30 $0"
  exit 0
fi

# --- the matrix.
nruns=$(($(wc -w <<<"$SEEDS") * $(wc -w <<<"$EXCHANGES")))
for env in $ENVS; do
  extra=()
  case $env in
    idle) ;;
    bg15 | bg30)
      lv=$([[ $env == bg15 ]] && echo "$BG15" || echo "$BG30")
      [[ -n $lv ]] || {
        log "no level for $env (calibration failed?): skipped"
        continue
      }
      IFS=: read -r flows burst off <<<"$lv"
      "$LAB" bg start "$flows" "$burst" "$off" "${SEEDS%% *}" "$(bg_secs "$nruns")"
      ;;
    loss) "$LAB" loss "$LOSS" ;;
    straggler) extra=(--straggler-rank $((N - 1)) --straggler-ms "$STRAG_MS" --straggler-prob "$STRAG_PROB") ;;
    *)
      log "unknown environment $env"
      continue
      ;;
  esac
  log "environment $env"
  run_env "$env" "${extra[@]}"
  case $env in
    bg15 | bg30) "$LAB" bg stop ;;
    loss) "$LAB" loss 0 ;;
  esac
done

# --- the loss sweep: in the idle lab, datagrams dropped by the transport's own fault injector
# (seeded, per datagram at the sender, only the optireduce transport's: DDP's Gloo traffic for
# evaluation and the rendezvous stay whole, which iptables loss at 5-10% would not leave them).
for p in $SWEEP; do
  env=sweep-$p
  log "environment $env (OPTIREDUCE_FAULT_DROP=$p)"
  for seed in $SEEDS; do
    for ex in $SWEEP_EXCHANGES; do
      if [[ $p == 0 ]]; then
        train "$env" "$ex" "$seed"
      else
        OPTIREDUCE_FAULT_DROP=$p OPTIREDUCE_FAULT_SEED=$seed train "$env" "$ex" "$seed"
      fi
    done
  done
done

log "matrix done; load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$LAB" down >/dev/null 2>&1 || true
"$PY" "$HERE/report.py" "$OUT" | tee -a "$OUT/logs/run-tta.log" ||
  log "WARNING: report failed (python3-matplotlib installed?)"
log "wrote $OUT/{runs/*/*.json,*.png,tta.md}"
