#!/usr/bin/env bash
# Supervises WS executor processes on this host: starts executor n as "{host_id}_{n}",
# restarts any that exits (backoff 1 s doubling to 30 s, reset after a healthy minute),
# preloads jemalloc where the system has it, gives executor n the metrics and health ports
# plus n, and on SIGTERM/SIGINT forwards SIGTERM to every executor and waits for them.
#
#   entrypoint.sh [--workers N] [--host-id ID] [--consumer-no-beg B] [--consumer-no-end E]
#
# Environment: WS (workers, default 1), INGEST_HOST_ID (default: hostname),
# INGEST_METRICS_PORT / INGEST_HEALTHCHECK_PORT (base ports; unset or 0 = off),
# RESTART_BACKOFF_MIN_S (1), RESTART_BACKOFF_MAX_S (30), RESTART_HEALTHY_S (60),
# INGEST_EXECUTOR_CMD (default: ingest-executor if on PATH, else "python3 -m executor").
set -uo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }

WORKERS=${WS:-1}
HOST_ID=${INGEST_HOST_ID:-$(hostname)}
BEG=""
END=""
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) WORKERS=$2; shift 2 ;;
    --workers=*) WORKERS=${1#*=}; shift ;;
    --host-id) HOST_ID=$2; shift 2 ;;
    --host-id=*) HOST_ID=${1#*=}; shift ;;
    --consumer-no-beg) BEG=$2; shift 2 ;;
    --consumer-no-beg=*) BEG=${1#*=}; shift ;;
    --consumer-no-end) END=$2; shift 2 ;;
    --consumer-no-end=*) END=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "entrypoint: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
BEG=${BEG:-0}
END=${END:-$((BEG + WORKERS))}
MIN_S=${RESTART_BACKOFF_MIN_S:-1}
MAX_S=${RESTART_BACKOFF_MAX_S:-30}
HEALTHY_S=${RESTART_HEALTHY_S:-60}

if [ -n "${INGEST_EXECUTOR_CMD:-}" ]; then
  read -r -a EXE <<<"$INGEST_EXECUTOR_CMD"
elif command -v ingest-executor >/dev/null 2>&1; then
  EXE=(ingest-executor)
else
  EXE=(python3 -m executor)
fi

log() { echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) entrypoint: $*" >&2; }

find_jemalloc() {
  local dir
  if command -v pkg-config >/dev/null 2>&1 && dir=$(pkg-config --variable=libdir jemalloc 2>/dev/null); then
    [ -f "$dir/libjemalloc.so" ] && { echo "$dir/libjemalloc.so"; return; }
  fi
  for f in /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 /usr/lib/aarch64-linux-gnu/libjemalloc.so.2 \
           /usr/lib/libjemalloc.so.2 /usr/lib64/libjemalloc.so.2 /usr/local/lib/libjemalloc.so.2; do
    [ -f "$f" ] && { echo "$f"; return; }
  done
}
JEMALLOC=$(find_jemalloc)
if [ -n "$JEMALLOC" ]; then log "preloading $JEMALLOC"; else log "no libjemalloc on this system: using the default allocator"; fi
# jemalloc's default purging hands freed pages back to the kernel a few at a time, and every
# encode batch then faults them in again: torch's encode cost 15-25 % more CPU a text than under
# glibc. Never purging dirty pages is 1.2x glibc's speed; one arena keeps the pages the encode
# threads leave from being held once per thread (bench/README.md, "the allocator was the cause").
# An operator's own MALLOC_CONF wins. ingest/allocator.py holds the same default for the
# executors Python starts (ingest demo, the benches); a test keeps the two the same.
JEMALLOC_CONF=${MALLOC_CONF:-dirty_decay_ms:-1,narenas:1}

calc() { awk "BEGIN { print $* }"; }

# One supervisor per executor number: run it, and start it again whenever it exits.
supervise() {
  local n=$1 name="${HOST_ID}_$1" backoff=$MIN_S child="" stopping=0 rc started ran
  # Its own handler first (bash gave this subshell the default one, not the main shell's): until
  # here a TERM just ends the supervisor, which has started nothing yet.
  trap 'stopping=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
  while [ "$stopping" = 0 ]; do
    started=$(date +%s)
    (
      [ -n "$JEMALLOC" ] && export LD_PRELOAD="$JEMALLOC${LD_PRELOAD:+:$LD_PRELOAD}" MALLOC_CONF="$JEMALLOC_CONF"
      [ "${INGEST_METRICS_PORT:-0}" != 0 ] && export INGEST_METRICS_PORT=$((INGEST_METRICS_PORT + n))
      [ "${INGEST_HEALTHCHECK_PORT:-0}" != 0 ] && export INGEST_HEALTHCHECK_PORT=$((INGEST_HEALTHCHECK_PORT + n))
      exec "${EXE[@]}" "$name"
    ) &
    child=$!
    # A TERM between the loop's check and here found no child to forward to: forward it now,
    # or this executor would run until the container's SIGKILL.
    [ "$stopping" = 1 ] && kill -TERM "$child" 2>/dev/null
    log "started executor $name (pid $child)"
    # wait until the child is gone, not while kill -0 finds it: bash reaps a child that exits
    # at once (an exec failure, 126 or 127) before any kill -0, which then read as a clean exit.
    # A wait that a trapped TERM interrupts returns early with the child still running.
    while :; do
      wait "$child"
      rc=$?
      kill -0 "$child" 2>/dev/null || break
    done
    child=""
    [ "$stopping" = 1 ] && { log "executor $name stopped (exit $rc)"; break; }
    ran=$(( $(date +%s) - started ))
    [ "$ran" -ge "$HEALTHY_S" ] && backoff=$MIN_S
    if [ "$rc" = 0 ]; then
      # A clean exit (recycled after its share of tasks or memory, drained): no crash backoff.
      backoff=$MIN_S
      log "executor $name exited cleanly after ${ran}s; starting a fresh one in ${MIN_S}s"
      sleep "$MIN_S" & wait $! 2>/dev/null
      continue
    fi
    log "executor $name exited with status $rc after ${ran}s; restarting in ${backoff}s"
    sleep "$backoff" & wait $! 2>/dev/null
    backoff=$(calc "($backoff * 2 > $MAX_S) ? $MAX_S : $backoff * 2")
  done
}

# A stop that comes while the supervisors are being started is noted, and acted on once their
# pids are known: ending this shell then would leave them restarting executors for ever.
stop=0
trap 'stop=1' TERM INT
pids=()
for ((n = BEG; n < END; n++)); do
  supervise "$n" &
  pids+=($!)
done
log "supervising executors ${BEG}..$((END - 1)) of host $HOST_ID"

shutdown() {
  log "stopping: forwarding SIGTERM to every executor"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
}
trap shutdown TERM INT
[ "$stop" = 1 ] && shutdown

for p in "${pids[@]}"; do
  while kill -0 "$p" 2>/dev/null; do wait "$p"; done
done
log "all executors stopped"
exit 0
