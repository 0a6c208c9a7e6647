#!/usr/bin/env bash
# The whole suite, ROUNDS rounds on each Python (3.11, 3.12, 3.13), beside two busy processes,
# in a clean clone of this repository's HEAD (#25: "passes every time beside load"):
#
#   tests/scripts/load_loop.sh [LOG [ROUNDS]]     # default: /tmp/outbox-load-loop.log, 5
#
# One line per run in LOG (PASS/FAIL, seconds, pytest's last line); each run's output in
# /tmp/outbox-load-loop/run-<round><venv>.log.  About 4.5 to 7.5 min a run on 2 cores.
set -uo pipefail
log=${1:-/tmp/outbox-load-loop.log}
rounds=${2:-5}
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
clone=/tmp/outbox-load-loop
cache=${LINEAGE_OUTBOX_PEERS_CACHE:-$HOME/.cache/lineage-outbox}
rm -rf "$clone" && git clone -q "$repo" "$clone" && cd "$clone" || exit 1
python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' || exit 1
uv="$cache/uv/bin/uv"
"$uv" --version >/dev/null 2>&1 || { python3 -m venv "$cache/uv" && "$cache/uv/bin/pip" install -q 'uv>=0.8,<1'; } || exit 1
for v in 3.12 3.13; do
  p=$(ls -d "$(pyenv root)/versions/$v".*/bin/python$v | sort -V | tail -1)
  "$uv" venv -q --python "$p" ".venv-$v" && "$uv" pip install -q --python ".venv-$v/bin/python" -e '.[test]' || exit 1
done
python3 -c 'while True: pass' & b1=$!
python3 -c 'while True: pass' & b2=$!
trap 'kill $b1 $b2' EXIT
export LINEAGE_OUTBOX_TEST_MYPY_CACHE="$cache/mypy-tests"
echo "$(git rev-parse --short HEAD): $rounds rounds beside two busy processes" >>"$log"
passed=0
failed=0
for round in $(seq "$rounds"); do
  for env in .venv .venv-3.12 .venv-3.13; do
    started=$SECONDS
    out="$clone/run-$round$env.log"
    if $env/bin/python -m pytest -q -n 4 --dist loadgroup --durations=5 --durations-min=15 -p no:cacheprovider >"$out" 2>&1; then
      passed=$((passed + 1)) result=PASS
    else
      failed=$((failed + 1)) result=FAIL
    fi
    echo "round $round $env $result $((SECONDS - started))s $(tail -1 "$out")" >>"$log"
  done
done
echo "passed $passed, failed $failed" >>"$log"
[ "$failed" -eq 0 ]
