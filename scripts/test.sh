#!/usr/bin/env bash
# The test command: installs what it needs, makes sure MariaDB and Redis answer, then runs
# the lint, the layer contract, the type check (mypy --strict) and the test suite under
# coverage, the processes it starts included; prints the combined total and the 15
# lowest-covered files. Extra arguments go to pytest. The whole suite fails below the floor
# in pyproject.toml ([tool.coverage.report] fail_under); a part (a path given) is not held to
# it. NO_COVERAGE=1 runs pytest alone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/ruff check db ingest executor tests bench
.venv/bin/lint-imports --no-cache
.venv/bin/mypy  # strict, over the packages named in pyproject.toml
if [ "${NO_COVERAGE:-0}" = 1 ]; then
  exec .venv/bin/python -m pytest "$@"
fi

floor=()
for arg in "$@"; do
  case $arg in -*) ;; *) floor=(--fail-under=0) ;; esac
done
rm -f .coverage .coverage.*
status=0 report_status=0
# [tool.coverage.run] patch = subprocess: every Python process the tests start (executors,
# parse workers, `ingest` commands) records its own data file, combined below.
.venv/bin/coverage run -m pytest "$@" || status=$?
.venv/bin/coverage combine -q
report=$(.venv/bin/coverage report --sort=cover "${floor[@]}") || report_status=$?
echo "coverage (branches counted, the processes the tests start included), the 15 lowest files:"
echo "$report" | sed -n '1,17p'
echo "$report" | grep -A3 '^TOTAL'
[ "$status" != 0 ] || status=$report_status
exit "$status"
