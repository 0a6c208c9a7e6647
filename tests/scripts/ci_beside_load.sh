#!/usr/bin/env bash
# `.ci/run` RUNS times in a row, each on a fresh clean clone of this repository's HEAD, beside two
# busy processes (#25's "done when": three passing runs in a row, each under 15 minutes):
#
#   tests/scripts/ci_beside_load.sh [RUNS [LOGDIR]]     # default: 3, /tmp/outbox-ci-beside-load
#
# Each run's output in LOGDIR/run-N.log (its last lines: `.ci/run`'s verdict and elapsed time);
# one line per run in LOGDIR/summary (exit code, seconds, pytest's counts).  About 12 to 13 min
# a run on 2 cores with warm download caches.
set -uo pipefail
runs=${1:-3}
dir=${2:-/tmp/outbox-ci-beside-load}
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
clone=/tmp/outbox-ci-beside-load-clone
mkdir -p "$dir"
# The clone does not stand beside ../shared: hand .ci/run the Marquez peer scripts that stand
# beside this repository (unless MARQUEZ_PEER_DIR or MARQUEZ_URL says otherwise).
if [ -z "${MARQUEZ_PEER_DIR:-}${MARQUEZ_URL:-}" ] && [ -f "$repo/../shared/peers/marquez/start.sh" ]; then
  MARQUEZ_PEER_DIR=$(cd "$repo/../shared/peers/marquez" && pwd)
  export MARQUEZ_PEER_DIR
fi
echo "$(git -C "$repo" rev-parse --short HEAD): $runs runs of .ci/run beside two busy processes" >>"$dir/summary"
for i in $(seq "$runs"); do
  log="$dir/run-$i.log"
  rm -rf "$clone" && git clone -q "$repo" "$clone" || exit 1
  python3 -c 'while True: pass' & b1=$!
  python3 -c 'while True: pass' & b2=$!
  start=$SECONDS
  (cd "$clone" && .ci/run) >"$log" 2>&1
  rc=$?
  kill "$b1" "$b2"
  echo "rc=$rc elapsed=$((SECONDS - start))s" >>"$log"
  echo "run $i: rc=$rc elapsed=$((SECONDS - start))s $(grep -E '^[0-9]+ (passed|failed)|^[0-9]+ failed' "$log" | tr '\n' ' ')" >>"$dir/summary"
done
