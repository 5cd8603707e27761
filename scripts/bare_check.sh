#!/usr/bin/env bash
# The zero-setup check (issue 15): the README's first command and the test command on a bare host.
# Run as root:
#   scripts/bare_check.sh [REF [REPO]]   REF: a branch, tag or commit of REPO (default: HEAD of
#                                        this checkout); REPO: a git repository (default: this one)
# It (re)creates a user with a fresh home (BARE_USER, default ingestbare), clones REPO at REF as
# that user with Debian's /usr/bin/python3, then runs, as that user and in new namespaces where
# nothing listens on 127.0.0.1:3306 or :6379 (a network namespace of its own), the MariaDB, Redis
# and sudo binaries are /dev/null, /tmp is empty and private, and whatever it leaves running is
# reported and then ended with the namespace:
#   1. python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/ingest demo
#   2. scripts/test.sh -q
# pip alone reaches PyPI, through a proxy that lets CONNECT through to pypi.org,
# files.pythonhosted.org and download.pytorch.org and nothing else (PIP_PROXY: only pip is told).
# torch's CPU wheel: from /opt/wheels when it lies there (this machine kind's wheel; root's pip
# settings name it, a fresh user's do not), else download.pytorch.org/whl/cpu; a CUDA build
# (any nvidia-* package) in the venv fails the check. It prints the demo's answers, the test
# summary and each step's exit code and time; the logs stay in the printed directory. The user
# and its files are removed at the end (BARE_KEEP=1 keeps them).
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "bare_check: run it as root (it creates a user and namespaces)" >&2; exit 2; }
for tool in unshare setpriv ip git useradd userdel /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "bare_check: needs $tool" >&2; exit 2; }
done
HERE=$(cd "$(dirname "$0")/.." && pwd)
REF=${1:-$(git -c safe.directory='*' -C "$HERE" rev-parse HEAD)}
REPO=${2:-$HERE}
BUSER=${BARE_USER:-ingestbare}
BHOME=/home/$BUSER
CLONE=$BHOME/ingest
WORK=$(mktemp -d /run/bare-check.XXXXXX)  # logs, the proxy's socket and helper (root only)
chmod 755 "$WORK"
PROXY_PID=

cleanup() {
  [ -n "$PROXY_PID" ] && kill "$PROXY_PID" 2>/dev/null || true
  rm -f "$WORK/proxy.sock"
  if [ "${BARE_KEEP:-0}" != 1 ] && id "$BUSER" >/dev/null 2>&1; then
    userdel -r "$BUSER" 2>/dev/null || true
  fi
}
trap cleanup EXIT

# The proxy: on the host, CONNECT to the allowed hosts only, served on a unix socket; in the
# namespaces, a forwarder from 127.0.0.1:3128 to that socket (a path socket crosses network
# namespaces). Refused requests are logged.
cat >"$WORK/proxy.py" <<'EOF'
import asyncio, sys

ALLOW = {"pypi.org:443", "files.pythonhosted.org:443", "download.pytorch.org:443"}


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


async def splice(a_reader, a_writer, b_reader, b_writer):
    await asyncio.gather(pipe(a_reader, b_writer), pipe(b_reader, a_writer))
    a_writer.close()
    b_writer.close()


async def connect(reader, writer):
    try:
        request = (await reader.readline()).decode("latin-1").split()
        if not request:  # a probe that only connected
            writer.close()
            return
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        if len(request) < 2 or request[0] != "CONNECT" or request[1] not in ALLOW:
            print(f"proxy: refused {' '.join(request[:2])}", file=sys.stderr, flush=True)
            writer.write(b"HTTP/1.1 403 Forbidden\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        host, port = request[1].rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await splice(reader, writer, up_reader, up_writer)
    except OSError as exc:
        print(f"proxy: {exc}", file=sys.stderr, flush=True)
        writer.close()


async def forward(reader, writer):
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(sys.argv[2])
    except OSError as exc:
        print(f"proxy (namespace side): {exc}", file=sys.stderr, flush=True)
        writer.close()
        return
    await splice(reader, writer, up_reader, up_writer)


async def main():
    if sys.argv[1] == "host":
        server = await asyncio.start_unix_server(connect, sys.argv[2])
    else:
        server = await asyncio.start_server(forward, "127.0.0.1", 3128)
    async with server:
        await server.serve_forever()


asyncio.run(main())
EOF
/usr/bin/python3 "$WORK/proxy.py" host "$WORK/proxy.sock" 2>"$WORK/proxy.log" &
PROXY_PID=$!
for _ in $(seq 1 50); do [ -S "$WORK/proxy.sock" ] && break; sleep 0.1; done

# what runs inside the namespaces, as root until it becomes the user
cat >"$WORK/ns.sh" <<'EOF'
#!/bin/bash
# ns.sh WORK USER CLONE CMD ENV...: in fresh mount, network and pid namespaces
set -u
work=$1 user=$2 clone=$3 cmd=$4
shift 4
ip link set lo up
mount -t tmpfs -o mode=1777 tmpfs /tmp
for b in /usr/sbin/mariadbd /usr/sbin/mysqld /usr/bin/mariadb /usr/bin/mysql /usr/bin/redis-server \
         /usr/bin/redis-cli /usr/bin/sudo /usr/bin/su /usr/bin/doas; do
  if [ -e "$b" ]; then mount --bind /dev/null "$b"; fi
done
/usr/bin/python3 "$work/proxy.py" ns "$work/proxy.sock" 2>>"$work/proxy.log" &
answers() { /usr/bin/python3 -c "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1)" "$1" 2>/dev/null; }
for _ in $(seq 1 50); do answers 3128 && break; sleep 0.1; done
for port in 3306 6379; do
  if answers "$port"; then echo "bare_check: 127.0.0.1:$port answers in the namespace" >&2; exit 2; fi
done
rc=0
setpriv --reuid="$user" --regid="$user" --init-groups --reset-env env "$@" \
  sh -c 'cd "$0" && eval "$1"' "$clone" "$cmd" || rc=$?
# what the command left running, after 5 s of grace (a multiprocessing resource tracker, say, ends
# once it reads its parent's end); zombies are orphans that ended and this pid 1 did not reap
for _ in $(seq 1 50); do
  left=$(ps -u "$user" -o pid=,stat=,args= | awk '$2 !~ /^Z/')
  [ -z "$left" ] && break
  sleep 0.1
done
if [ -n "$left" ]; then
  echo "$left" | sed 's/^ */bare_check: still running 5 s after the command ended (ended with the namespace): /'
fi
exit "$rc"
EOF
chmod 755 "$WORK/ns.sh"

# the user, fresh, and its clone
if id "$BUSER" >/dev/null 2>&1; then userdel -r "$BUSER" 2>/dev/null || true; fi
useradd -m -s /bin/bash "$BUSER"
PIP_ENV=(PIP_PROXY=http://127.0.0.1:3128 PIP_DISABLE_PIP_VERSION_CHECK=1)
if compgen -G "/opt/wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
  PIP_ENV+=(PIP_FIND_LINKS=/opt/wheels)
else
  PIP_ENV+=(PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)
fi
USER_ENV=(HOME="$BHOME" USER="$BUSER" LOGNAME="$BUSER" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 "${PIP_ENV[@]}")
printf '[safe]\n\tdirectory = *\n' >"$WORK/gitconfig"  # REPO belongs to another user
chmod 644 "$WORK/gitconfig"
setpriv --reuid="$BUSER" --regid="$BUSER" --init-groups --reset-env \
  env HOME="$BHOME" PATH=/usr/bin:/bin GIT_CONFIG_GLOBAL="$WORK/gitconfig" \
  sh -c 'git clone -q --no-checkout "$0" "$1" && cd "$1" && git checkout -q "$2" && git log -1 --format="%H %s" | cut -c1-120' \
  "$REPO" "$CLONE" "$REF" >"$WORK/clone.log" 2>&1 || { cat "$WORK/clone.log"; exit 1; }
echo "bare_check: $REPO at $REF, as $BUSER (no root, no sudo, no MariaDB, no Redis, no network but pip's)"
echo "  commit $(cat "$WORK/clone.log")"
echo "  logs: $WORK"

step() {  # step NAME CMD: CMD in the namespaces, its output in $WORK/NAME.log
  local start rc=0
  echo
  echo "== $2   (log: $WORK/$1.log)"
  start=$(date +%s)
  unshare --mount --net --pid --fork --mount-proc "$WORK/ns.sh" "$WORK" "$BUSER" "$CLONE" "$2" "${USER_ENV[@]}" \
    >"$WORK/$1.log" 2>&1 || rc=$?
  STEP_RC=$rc STEP_S=$(( $(date +%s) - start ))
}

failed=0
step quickstart 'python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/ingest demo'
sed -n '/^demo on /,$p' "$WORK/quickstart.log" | tail -n 60
grep -F 'bare_check:' "$WORK/quickstart.log" || true
echo "-- exit $STEP_RC, ${STEP_S} s"
[ "$STEP_RC" = 0 ] || { failed=1; tail -n 30 "$WORK/quickstart.log"; }
if grep -q '^bare_check: still running' "$WORK/quickstart.log"; then
  echo "bare_check: the demo did not stop everything it started"; failed=1
fi
if compgen -G "$CLONE/.venv/lib/python3*/site-packages/nvidia*" >/dev/null; then
  echo "bare_check: pip installed a CUDA build of torch (nvidia-* packages in the venv)"; failed=1
fi

step test 'scripts/test.sh -q'
grep -E '^(=+ .* =+|[0-9]+ (passed|failed).*)$' "$WORK/test.log" | tail -n 5 || true
sed -n '/^test summary:/,/^[^ ]/{/^test summary:/p;/^ /p}' "$WORK/test.log"
grep -F 'bare_check:' "$WORK/test.log" || true
echo "-- exit $STEP_RC, ${STEP_S} s"
[ "$STEP_RC" = 0 ] || { failed=1; tail -n 40 "$WORK/test.log"; }
if ! grep -q 'job 1, every test on MariaDB and Redis: NOT RUN: ' "$WORK/test.log"; then
  echo "bare_check: the test summary does not say that job 1 was not run and why"; failed=1
fi
if [ -s "$WORK/proxy.log" ]; then echo "proxy (only pip may go out):"; cat "$WORK/proxy.log"; fi
echo
if [ "$failed" = 0 ]; then echo "bare_check: passed"; else echo "bare_check: FAILED"; fi
exit "$failed"
