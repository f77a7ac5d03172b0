#!/usr/bin/env bash
# tests/tta: bench/tta/train.py for a few steps with 2 ranks on loopback, then bench/tta/report.py
# on what they wrote; checks the outputs exist and the accuracy rose above chance (10%).
# Usage: tta_smoke.sh SOURCE_ROOT [LIBOPTIREDUCE]. Exit 77 (skip) without torch.
set -euo pipefail
SRC=$(cd "${1:?source root}" && pwd)
LIB=${2:-}
PY=/usr/bin/python3
if ! [[ -x $PY ]] || ! "$PY" -c 'import torch, torch.distributed' 2>/dev/null; then
  echo "SKIP: $PY cannot import torch (apt-get install python3-torch)"
  exit 77
fi
[[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || {
  echo "SKIP: dataset-fashion-mnist is not installed"
  exit 77
}
W=$(mktemp -d /tmp/tta-smoke.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup EXIT

exchanges=(ddp-gloo)
if [[ -d $SRC/python/optireduce && -n $LIB && -f $LIB ]]; then
  exchanges+=(opti-exact)
else
  echo "opti-exact skipped: no python/optireduce or no liboptireduce"
fi

for ex in "${exchanges[@]}"; do
  mkdir -p "$W/runs/smoke"
  # A free port for each run's rendezvous, from the kernel (the one after the last run's may be
  # any other test's by now).
  port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  pids=()
  for r in 0 1; do
    # --lib: this build's library (build-san/, a CI build dir), not the package's default build/.
    env RANK="$r" WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" GLOO_SOCKET_IFNAME=lo \
      PYTHONPATH="$SRC/python" \
      timeout 120 "$PY" "$SRC/bench/tta/train.py" --exchange "$ex" --steps 30 --batch 16 \
      --lr 0.05 --eval-every 10 --eval-limit 400 --test-limit 1000 --train-limit 6000 \
      --target 0.5 ${LIB:+--lib "$LIB"} --seed 1 --env smoke --timeout-s 60 \
      --out "$W/runs/smoke/$ex-s1.json" >"$W/$ex-r$r.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  r=0
  for p in "${pids[@]}"; do
    st=0
    wait "$p" || st=$?
    # timeout(1) exits 124 when it killed the rank; its log's last "[rank N]" line says where it
    # stood.
    ((st == 124)) && echo "rank $r of $ex: killed after 120 s"
    ((st)) && rc=1
    r=$((r + 1))
  done
  pids=()
  if ((rc)); then
    echo "FAIL: train.py --exchange $ex"
    tail -n 30 "$W/$ex-r0.log" "$W/$ex-r1.log"
    exit 1
  fi
  "$PY" - "$W/runs/smoke/$ex-s1.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["summary"]
assert s["steps_run"] == 30, s
assert len(r["steps"]) == 30 and all(x["t"] > 0 for x in r["steps"])
assert len(r["evals"]) >= 4, r["evals"]
assert s["final_acc"] > 0.3, f"accuracy {s['final_acc']} not above chance"
assert r["evals"][-1]["acc"] > r["evals"][0]["acc"] + 0.1, r["evals"]
if s["exchange"] != "ddp-gloo":
    assert all("elements_lost" in x for x in r["steps"]), r["steps"][0]
print(f"{s['exchange']}: final accuracy {s['final_acc']:.3f} after {s['steps_run']} steps, "
      f"step P50 {s['step_p50_ms']:.1f} ms")
PYEOF
done

"$PY" "$SRC/bench/tta/report.py" "$W" >"$W/report.log" 2>&1 || {
  cat "$W/report.log"
  echo "FAIL: report.py"
  exit 1
}
for f in tta.md tta-curves.png; do
  [[ -s $W/$f ]] || {
    echo "FAIL: report.py wrote no $f"
    exit 1
  }
done
grep -q "| smoke | ddp-gloo |" "$W/tta.md" || {
  cat "$W/tta.md"
  echo "FAIL: tta.md has no ddp-gloo row"
  exit 1
}
echo "PASS"
