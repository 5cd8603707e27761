#!/usr/bin/env bash
# The main job end to end: set up, create the schema, start a supervised fleet of executors,
# ingest the sample documents under examples/ with a progress bar, search them, stop the fleet.
#   scripts/demo.sh ["a question"]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export INGEST_DB_URL=${INGEST_DB_URL:-mysql://root@127.0.0.1:3306/ingest_demo}
export INGEST_KEY_PREFIX=${INGEST_KEY_PREFIX:-ingest_demo}
QUERY=${1:-"how do I keep bees healthy in winter?"}

ingest init   # also makes the model's ONNX export for searches when missing (ingest model export)
python scripts/make_samples.py >/dev/null
WS=${WS:-2} ./entrypoint.sh --host-id demo >/tmp/ingest-demo-fleet.log 2>&1 &
FLEET=$!
trap 'kill -TERM $FLEET 2>/dev/null; wait $FLEET 2>/dev/null' EXIT

ingest submit examples/ --kb demo --wait
ingest fleet
echo
echo "search: $QUERY"
ingest search --kb demo "$QUERY" -k 3
