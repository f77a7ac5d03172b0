#!/bin/bash
# optireduce-bench end to end on loopback, no namespaces: two ranks time TAR exact and Gloo ring
# with --interleave and must each write every iteration of both algorithms, with the exact
# result checked (-c 1: a relative L2 error of fp32 rounding, against the sum in double).
# Usage: bench-smoke.sh PATH/TO/optireduce-bench
set -eu
BENCH=$1
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
ITERS=4
pids=()
for r in 0 1; do
  OPTIREDUCE_IFNAME=lo timeout 60 "$BENCH" -b 64K -e 64K -n "$ITERS" -w 1 -c 1 \
    -g tar-exact,gloo-ring --interleave --rank "$r" --world 2 --iface 127.0.0.1 --store "$DIR/st" \
    --csv "$DIR/r.csv" --samples "$DIR/s.csv" >"$DIR/out$r.txt" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do
  wait "$p" || {
    cat "$DIR"/out*.txt
    echo "bench-smoke: a rank failed" >&2
    exit 1
  }
done
fail() {
  echo "bench-smoke: $*" >&2
  cat "$DIR/out0.txt" "$DIR/s.csv" >&2
  exit 1
}
for a in tar-exact gloo-ring; do
  n=$(awk -F, -v a="$a" '$2 == a' "$DIR/s.csv" | wc -l)
  [[ $n == "$ITERS" ]] || fail "$a: $n samples, expected $ITERS"
  # Iterations 0..ITERS-1, once each.
  seq=$(awk -F, -v a="$a" '$2 == a { print $4 }' "$DIR/s.csv" | sort -n | tr '\n' ' ')
  [[ $seq == "0 1 2 3 " ]] || fail "$a: iterations $seq"
  err=$(awk -F, -v a="$a" '$2 == a { print $15 }' "$DIR/r.csv")
  awk -v e="$err" 'BEGIN { exit !(e + 0 < 1e-6) }' || fail "$a: relative error $err"
done
echo "bench-smoke: ok"
