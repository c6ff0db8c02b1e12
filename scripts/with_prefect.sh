#!/usr/bin/env bash
# Run a command (e.g. `dvc repro`) with ONE local Prefect server shared by all its flows, instead of
# a temporary server per DVC stage (10-20 s each, and one SQLite file under concurrent starts).
# The server lives in .prefect/ (git-ignored) on a free loopback port and is stopped by its PID when
# the command ends. If PREFECT_API_URL is already set, or params name a shared server
# (tracking.prefect_api_url), the command just runs against that one. `with_prefect.sh --ui` only
# serves the UI over the runs kept in .prefect/ (after `make repro`, for instance).
set -euo pipefail
# output captured (a log file, CI): progress bars redraw at most every 30 s, not at every step, since
# each redraw is a line there (tqdm reads TQDM_MININTERVAL); on a terminal they redraw in place as usual
if [ ! -t 2 ]; then export TQDM_MININTERVAL="${TQDM_MININTERVAL:-30}"; fi
if [ "${1:-}" = "--ui" ] && [ -n "${PREFECT_API_URL:-}" ]; then echo "Prefect UI: ${PREFECT_API_URL%/api}"; exit 0; fi
if [ -n "${PREFECT_API_URL:-}" ]; then exec "$@"; fi
shared=$(python3 -c 'from speccap.config import load_params; print(load_params().tracking.prefect_api_url)' 2>/dev/null || true)
if [ -n "$shared" ]; then export PREFECT_API_URL="$shared"; exec "$@"; fi
root=$(cd "$(dirname "$0")/.." && pwd)
export PREFECT_HOME="$root/.prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false
mkdir -p "$PREFECT_HOME"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# the UI asks its server where the API is: without this it calls 127.0.0.1:4200 and finds nothing
export PREFECT_UI_API_URL="http://127.0.0.1:$port/api"
prefect server start --host 127.0.0.1 --port "$port" >"$PREFECT_HOME/server.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
export PREFECT_API_URL="http://127.0.0.1:$port/api"
python3 - "$PREFECT_API_URL" <<'PY'
import sys, time, urllib.request
for _ in range(120):
    try:
        urllib.request.urlopen(sys.argv[1] + "/health", timeout=2)
        sys.exit(0)
    except Exception:
        time.sleep(0.5)
sys.exit("Prefect server did not start: see .prefect/server.log")
PY
if [ "${1:-}" = "--ui" ]; then  # the runs of earlier commands stay in .prefect/: serve them until Ctrl-C
  echo "Prefect UI with the flow runs in $PREFECT_HOME: http://127.0.0.1:$port/runs (Ctrl-C stops it)"
  wait "$pid"
else
  "$@"
fi
