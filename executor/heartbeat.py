"""The executor's heartbeat key: written before the first read, then every ``heartbeat_s``."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson
import psutil
import redis
import trio

from db.config import Settings
from db.keys import Keys
from db.streams import RETRYABLE_REDIS_ERRORS
from executor.context import Limiters
from executor.outage import Outage

log = logging.getLogger("executor.heartbeat")

# Set the key only if it still holds what we last saw ('' = absent): a takeover races no one.
_SWAP = """
local cur = redis.call('GET', KEYS[1])
if (cur or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""

# A beat: set the key only while it is absent (expired) or this process's; another process
# that took the name meanwhile keeps it (0).
_BEAT = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, info = pcall(cjson.decode, cur)
  if not (ok and tostring(info['pid']) == ARGV[1] and tostring(info['instance']) == ARGV[2]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
return 1
"""

# Delete the key only if this process wrote it.
_RELEASE = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local ok, info = pcall(cjson.decode, cur)
if ok and tostring(info['pid']) == ARGV[1] and tostring(info['instance']) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


class NameInUse(RuntimeError):
    """Another live process holds this consumer name's heartbeat."""


def holder_is_alive(info: dict[str, Any], host: str) -> bool:
    """Whether the process named in a heartbeat still runs (on another host: assume it does)."""
    if info.get("host") != host:
        return True
    try:
        proc = psutil.Process(int(info.get("pid", -1)))
        return abs(proc.create_time() - float(info.get("boot_time", 0))) < 0.01
    except (psutil.Error, ValueError, TypeError):
        return False


class Heartbeat:
    """``SET keys.executor(consumer) JSON EX heartbeat_ttl_s``; refuses a live holder's name."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        consumer: str,
        settings: Settings,
        instance: str,
    ) -> None:
        self.client = client
        self.keys = keys
        self.key = keys.executor(consumer)
        self.consumer = consumer
        self.settings = settings
        self.instance = instance
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)  # prime: the next call measures since now
        self.boot_time = self.proc.create_time()
        self.started_at = time.time()
        self._swap = client.register_script(_SWAP)
        self._release = client.register_script(_RELEASE)
        self._beat = client.register_script(_BEAT)

    @property
    def ttl_ms(self) -> int:
        return max(1, int(self.settings.heartbeat_ttl_s * 1000))

    def payload(self, figures: dict[str, Any]) -> dict[str, Any]:
        """The heartbeat JSON; ``figures`` (running, done, failed, draining, task_types, pending,
        lag …) come from the daemon and the streams."""
        mem = self.proc.memory_info().rss
        body: dict[str, Any] = {
            "host": self.settings.host_id,
            "pid": os.getpid(),
            "instance": self.instance,
            "consumer": self.consumer,
            "boot_time": self.boot_time,
            "started_at": self.started_at,
            "now": time.time(),
            "rss_mb": round(mem / (1 << 20), 1),
            "cpu_percent": self.proc.cpu_percent(None),
            "pending": 0,
            "lag": 0,
        }
        body.update(figures)
        return body

    def claim_name(self, figures: dict[str, Any]) -> None:
        """Write the first heartbeat, or raise :class:`NameInUse` (blocking; call in a thread)."""
        for _ in range(5):
            current = self.client.get(self.key)
            if current:
                info = _loads(current)
                mine = info.get("pid") == os.getpid() and info.get("instance") == self.instance
                if not mine and holder_is_alive(info, self.settings.host_id):
                    raise NameInUse(
                        f"consumer name {self.consumer!r} is in use by pid {info.get('pid')} "
                        f"on {info.get('host')} (heartbeat {self.key})"
                    )
                if not mine:
                    log.warning("taking over the stale heartbeat of pid %s", info.get("pid"))
            body = orjson.dumps(self.payload(figures)).decode()
            if self._swap(keys=[self.key], args=[current or "", body, self.ttl_ms]):
                return
        raise NameInUse(f"consumer name {self.consumer!r}: heartbeat key keeps changing")

    def stream_figures(self) -> dict[str, int]:
        """The group's pending and lag over the priority streams (XINFO, once a heartbeat)."""
        pending = lag = 0
        for stream in self.keys.queues:
            for group in self.client.xinfo_groups(stream):
                if group.get("name") == self.keys.group:
                    pending += int(group.get("pending") or 0)
                    lag += int(group.get("lag") or 0)
        return {"pending": pending, "lag": lag}

    def beat(self, figures: dict[str, Any]) -> bool:
        """Renew the heartbeat; False when another process holds this name now (our key
        expired while this one stalled, and a new process of the same name took it)."""
        with contextlib.suppress(redis.ResponseError):  # no stream or group yet
            figures = {**figures, **self.stream_figures()}
        body = orjson.dumps(self.payload(figures)).decode()
        return bool(self._beat(keys=[self.key], args=[str(os.getpid()), self.instance, body, self.ttl_ms]))

    def release(self) -> None:
        self._release(keys=[self.key], args=[str(os.getpid()), self.instance])

    async def run(
        self,
        limiters: Limiters,
        outage: Outage,
        figures: Callable[[], dict[str, Any]],
        name_lost: Callable[[], None] = lambda: None,
    ) -> None:
        delay_s = self.settings.heartbeat_s
        while True:
            await trio.sleep(delay_s)
            delay_s = self.settings.heartbeat_s
            try:
                kept = await limiters.redis(self.beat, figures())
            except RETRYABLE_REDIS_ERRORS as exc:
                backoff_s = outage.failed(exc)
                if outage.refused:  # beat again soon: a write is what sees Redis take writes again
                    delay_s = min(delay_s, backoff_s)
                continue
            if outage.refused:  # a write ends a refusal; a lost connection's end is the read loop's
                outage.ok(wrote=True)
            if not kept:
                log.error(
                    "consumer name %r was taken by another process while this one stalled; "
                    "stopping (two processes must never share a name)",
                    self.consumer,
                )
                name_lost()
                return


def _loads(text: str | bytes) -> dict[str, Any]:
    try:
        info = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return info if isinstance(info, dict) else {}
