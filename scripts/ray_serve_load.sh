#!/usr/bin/env bash
# Issue #39's comparison: aggregate tokens/s of `specdec serve --ray` with 2 replicas x 1 thread
# against 1 replica x 2 threads, and one plain `specdec serve --threads 2` (no Ray) beside them;
# one server at a time on the same weights, `specdec bench-serve` as the load (closed-loop clients).
#
#   bash scripts/ray_serve_load.sh            # -> bench_out/ray_serve_<config>.json, tables on stdout
#
# Settings (environment): MODEL (default "--target smollm2 --dtype bfloat16 --method ngram"),
# MAX_BATCH (per server, default 1), CONCURRENCY (1,2,4,8), MAX_TOKENS (64), OUT (bench_out),
# PORT (8400; each server the next). Needs the `ray` and `bench` extras; stops the local Ray
# cluster each Ray server started (`ray stop`) before the next.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-"--target smollm2 --dtype bfloat16 --method ngram"}
MAX_BATCH=${MAX_BATCH:-1}
CONCURRENCY=${CONCURRENCY:-1,2,4,8}
MAX_TOKENS=${MAX_TOKENS:-64}
OUT=${OUT:-bench_out}
PORT=${PORT:-8400}
mkdir -p "$OUT"

wait_up() {
  for _ in $(seq 300); do
    curl -sf "localhost:$1/health" > /dev/null && return 0
    sleep 1
  done
  return 1
}

run() {
  local name=$1; shift
  PORT=$((PORT + 1))
  # its own session: stopping it (SIGTERM) must not reach this script
  # shellcheck disable=SC2086
  setsid specdec serve $MODEL --max-batch "$MAX_BATCH" --port "$PORT" "$@" > "$OUT/ray_serve_$name.log" 2>&1 &
  local pid=$!
  if ! wait_up "$PORT"; then
    echo "$name did not come up: $OUT/ray_serve_$name.log"; kill -TERM "$pid"; return 1
  fi
  echo "== $name: specdec serve $MODEL --max-batch $MAX_BATCH $*"
  specdec bench-serve --url "http://127.0.0.1:$PORT" --api completions --tasks code --prompts 4 \
    --temperature 0 --warmup 2 --concurrency "$CONCURRENCY" --max-tokens "$MAX_TOKENS" \
    --json "$OUT/ray_serve_$name.json" 2>/dev/null
  kill -TERM "$pid"; wait "$pid" || true
  ray stop --force > /dev/null 2>&1 || true
}

run ray-2x1 --ray --replicas 2 --threads 1
run ray-1x2 --ray --replicas 1 --threads 2
run plain-1x2 --threads 2
