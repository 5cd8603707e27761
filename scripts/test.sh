#!/usr/bin/env bash
# The test command: installs what it needs, makes sure MariaDB and Redis answer, then runs
# the lint, the layer contract and the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/ruff check db ingest executor tests bench
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest "$@"
