#!/usr/bin/env bash
# The device side alone, where `dvc repro` has run (models, the promoted gate file, the registry):
#  1. a fresh virtual environment with only `speccap[edge]` (and torch first, as the set-up does)
#     holds none of the pipeline's or the server's packages;
#  2. its `speccap edge --gate models/champion.gate.json`, against a `speccap serve-cloud` of the
#     full install on loopback, captions test clips exactly as the full install's `--gate champion`
#     (the same gate read from the MLflow registry) does.
# Used by .ci/run; run it by hand the same way: bash scripts/check_edge_install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
SERVER_PID=""
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

GATE=models/champion.gate.json
[ -f "$GATE" ] || { echo "check_edge_install: $GATE is missing: run the pipeline first (dvc repro promote)" >&2; exit 1; }

echo "check_edge_install: a fresh virtual environment with speccap[edge] only"
$PY -m venv "$WORK/edge"
"$WORK/edge/bin/pip" install -q torch==2.13.0
"$WORK/edge/bin/pip" install -q ".[edge]"
installed=$("$WORK/edge/bin/pip" list --format=freeze | cut -d= -f1 | tr 'A-Z_' 'a-z-')
for p in dvc mlflow mlflow-skinny prefect dask distributed dask-jobqueue prefect-dask psycopg selenium pytest ruff \
         fastapi uvicorn; do
  if grep -qx "$p" <<<"$installed"; then echo "check_edge_install: the edge install holds $p" >&2; exit 1; fi
done
echo "check_edge_install: none of the pipeline's, the cluster's, the tests' or the server's packages"

SPECCAP_TOKEN=$($PY -c 'import secrets; print(secrets.token_urlsafe(32))')
export SPECCAP_TOKEN
PORT=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
speccap serve-cloud --port "$PORT" --threads 1 >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
$PY - "$PORT" "$SERVER_PID" "$WORK/server.log" <<'EOF'
import os, sys, time, urllib.request
port, pid, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for _ in range(300):
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/health",
                                     headers={"Authorization": f"Bearer {os.environ['SPECCAP_TOKEN']}"})
        urllib.request.urlopen(req, timeout=2)
        sys.exit(0)
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit(f"check_edge_install: the verifier ended:\n{open(log).read()[-2000:]}")
        time.sleep(0.5)
sys.exit("check_edge_install: the verifier did not answer in 150 s")
EOF

FAIL=0
for lang in en zh; do
  mapfile -t clips < <($PY -c "
import json, sys
from speccap.config import load_params
from speccap.data.manifest import manifest_path, read_manifest
p = load_params()
for r in read_manifest(manifest_path(p.data.processed_dir, 'test', '$lang'))[:3]:
    print(r['path'])")
  args=("${clips[@]}" --server "http://127.0.0.1:$PORT" --language "$lang" --json)
  "$WORK/edge/bin/speccap" edge "${args[@]}" --gate "$GATE" >"$WORK/file.$lang.jsonl"
  speccap edge "${args[@]}" --gate champion >"$WORK/registry.$lang.jsonl"
  $PY - "$WORK/file.$lang.jsonl" "$WORK/registry.$lang.jsonl" <<'EOF' || FAIL=1
import json, sys
a, b = ([json.loads(x) for x in open(f) if x.strip()] for f in sys.argv[1:])
assert len(a) == len(b) > 0, (len(a), len(b))
for x, y in zip(a, b):
    assert x["caption"] == y["caption"], f"{x['file']}: edge install {x['caption']!r} vs full install {y['caption']!r}"
    print(f"check_edge_install: {x['file']}: same caption ({x['tokens']} tokens, rho {x['rho']:.2f}): {x['caption'][:60]}")
EOF
done
[ "$FAIL" = 0 ] || { echo "check_edge_install: the edge install's captions differ" >&2; exit 1; }
echo "check_edge_install: ok"
