#!/usr/bin/env bash
# The suite must not flake on a busy machine: run scripts/test.sh N times in a row (default 3) while
# CPU-bound processes (default: one per core) compete for the machine. Stops at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
HOGS=${HOGS:-$(nproc)}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in $(seq "$HOGS"); do
  python3 -c "while True: pass" &
  pids+=($!)
done
for i in $(seq "$RUNS"); do
  echo "== run $i of $RUNS, with $HOGS CPU hog(s)"
  bash scripts/test.sh
done
echo "== $RUNS runs in a row passed under load"
