#!/usr/bin/env bash
# The GPU report on a lent device machine, whose commands end after 10 minutes while the report
# takes up to MINUTES (default 18: the machine's start and the transfers fit in the 30 minutes a
# session has). Run in the repository root there, through the device tool:
#   start  install the carried wheels (.whl/, from scripts/gpu_wheels.sh) into /tmp/site, start the
#          report in its own process session (it outlives the call), then wait as `wait` does
#   wait   print the report's progress until it ends or this call nears its limit; when it has
#          ended, copy the report folder to $OUT/report (the files the tool brings back)
# Call `wait` again at once (a machine left idle 30 s is given back) until it prints "report done".
set -uo pipefail
MINUTES="${MINUTES:-18}"
PYTHON="${PYTHON:-python3}"  # the device machines' python3 holds their CUDA torch
DEVICE="${DEVICE:-cuda}"     # cpu: the dry run, to try this script on a machine without a GPU
REPORT=/tmp/tdiag-gpu-report
LOG=/tmp/tdiag-gpu-report.log
WAIT_SECONDS="${WAIT_SECONDS:-560}"

start() {
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  rm -rf "$REPORT"
  setsid nohup "$PYTHON" -m tdiag.gpu_report --device "$DEVICE" --minutes "$MINUTES" --out "$REPORT" \
    >"$LOG" 2>&1 </dev/null &
  echo $! >/tmp/tdiag-gpu-report.pid
  wait_for_report
}

wait_for_report() {
  local waited=0
  while kill -0 "$(cat /tmp/tdiag-gpu-report.pid)" 2>/dev/null && [ "$waited" -lt "$WAIT_SECONDS" ]; do
    sleep 10
    waited=$((waited + 10))
  done
  tail -n 40 "$LOG"
  if kill -0 "$(cat /tmp/tdiag-gpu-report.pid)" 2>/dev/null; then
    echo "report still running: call 'bash scripts/gpu_device.sh wait' again now"
  elif [ -f "$REPORT/README.md" ]; then
    mkdir -p "${OUT:?}/report" && cp "$REPORT"/* "$OUT/report/" && cp "$LOG" "$OUT/report/progress.log"
    echo "report done: $(ls "$OUT/report" | tr '\n' ' ')"
  else
    echo "report ended without its README: see the log above"
    exit 1
  fi
}

case "${1:-}" in
  start) start ;;
  wait) wait_for_report ;;
  *) echo "usage: bash scripts/gpu_device.sh start|wait" >&2; exit 2 ;;
esac
