"""Redis: the connection and every write to the task streams, each one atomic (Lua).

- ``publish``: XADD a task's message and set ``published:{task}`` only if that key is absent,
  so a task has at most one live entry (``queue_product`` is the one-message form).
- ``ack``: for each finished entry, only if this consumer still owns it (XPENDING), XACK, XDEL
  and DEL of the published key; optionally XADD the original to the dead-letter stream first.
- ``hand_back``: only if the entry is still ours, ack and delete it and publish a fresh one.
- ``renew``: XCLAIM JUSTID (idle 0) of the entries this consumer still owns.
- ``reclaim``: XAUTOCLAIM (without JUSTID: the delivery count rises) of entries idle too long,
  with each one's delivery count from XPENDING, in one call.
- ``remove_consumers``: XGROUP DELCONSUMER, only of consumers with no pending entry and no
  heartbeat (DELCONSUMER would drop a consumer's pending entries for good).

Messages are JSON in the single field ``message`` (see DESIGN.md, "Stream message").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from db.keys import PUBLISHED_TTL_S, Keys

# Errors that mean "Redis is unreachable or restarting": back off and retry, don't fail.
RETRYABLE_REDIS_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    ConnectionResetError,
    BrokenPipeError,
)

BLOCK_MS_MAX = 2000


def connect(url: str) -> redis.Redis:
    """A client for ``INGEST_REDIS_URL`` with timeouts longer than the longest blocking read.
    Bytes that are not UTF-8 (a producer outside the contract) decode as U+FFFD instead of
    failing the whole reply: such a message is then dead-lettered as not JSON."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        encoding_errors="replace",
        socket_timeout=10,
        socket_connect_timeout=5,
        socket_keepalive=True,
        health_check_interval=30,
        retry_on_timeout=False,
    )


def encode_message(message: Mapping[str, Any]) -> str:
    return orjson.dumps(message).decode()


_PUBLISH = """
-- KEYS: stream, published key; ARGV: message json, ttl seconds
if redis.call('EXISTS', KEYS[2]) == 1 then return false end
local id = redis.call('XADD', KEYS[1], '*', 'message', ARGV[1])
redis.call('SET', KEYS[2], KEYS[1] .. ' ' .. id, 'EX', ARGV[2])
return id
"""

_ACK = """
-- KEYS: per entry (stream, published key) pairs, then the dead-letter stream last
-- ARGV: group, consumer, then per entry: entry id, dead reason ('' = no dead letter),
--       raw message, delivery count, now (ms), task id
local group, consumer = ARGV[1], ARGV[2]
local n = (#KEYS - 1) / 2
local acked = {}
for i = 1, n do
  local stream, pub = KEYS[2 * i - 1], KEYS[2 * i]
  local base = 3 + (i - 1) * 6
  local id, reason = ARGV[base], ARGV[base + 1]
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  if p[1] and p[1][2] == consumer then
    if reason ~= '' then
      redis.call('XADD', KEYS[#KEYS], '*', 'message', ARGV[base + 2], 'reason', reason,
        'deliveries', ARGV[base + 3], 'time', ARGV[base + 4], 'stream', stream,
        'entry', id, 'task_id', ARGV[base + 5], 'consumer', consumer)
    end
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
    if pub ~= '' and redis.call('GET', pub) == stream .. ' ' .. id then redis.call('DEL', pub) end
    acked[#acked + 1] = 1
  else
    acked[#acked + 1] = 0
  end
end
return acked
"""

_HAND_BACK = """
-- KEYS: stream, published key; ARGV: group, consumer, entry id, new message json, ttl
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if not (p[1] and p[1][2] == ARGV[2]) then return false end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
local id = redis.call('XADD', KEYS[1], '*', 'message', ARGV[4])
redis.call('SET', KEYS[2], KEYS[1] .. ' ' .. id, 'EX', ARGV[5])
return id
"""

_RENEW = """
-- KEYS: streams (one per entry); ARGV: group, consumer, entry ids (one per key)
-- returns per entry: 1 renewed, 0 owned by another consumer, -1 gone (its stream or group too)
local out = {}
for i = 1, #KEYS do
  local id = ARGV[i + 2]
  local p = redis.pcall('XPENDING', KEYS[i], ARGV[1], id, id, 1)
  if p['err'] or not p[1] then out[i] = -1
  elseif p[1][2] ~= ARGV[2] then out[i] = 0
  else
    redis.call('XCLAIM', KEYS[i], ARGV[1], ARGV[2], 0, id, 'JUSTID')
    out[i] = 1
  end
end
return out
"""


_RECLAIM = """
-- KEYS: stream; ARGV: group, consumer, min idle ms, cursor, count
-- returns {next cursor, {{id, delivery count, fields}, ...}}
local res = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local out = {}
for i, e in ipairs(res[2]) do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
  local n = 0
  if p[1] then n = p[1][4] end
  out[i] = {e[1], n, e[2] or false}
end
return {res[1], out}
"""

_REMOVE_CONSUMERS = """
-- KEYS: stream, then one heartbeat key per consumer; ARGV: group, then the consumer names
local removed = {}
for i = 2, #KEYS do
  local name = ARGV[i]
  if redis.call('EXISTS', KEYS[i]) == 0 then
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, name)
    if #p == 0 then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
      removed[#removed + 1] = name
    end
  end
end
return removed
"""


@dataclass(frozen=True)
class Entry:
    """One stream entry as read: where it lives, its raw JSON and how often it was delivered."""

    stream: str
    entry_id: str
    raw: str | None  # None when the entry has no ``message`` field
    deliveries: int = 1
    reclaimed: bool = False  # came by XAUTOCLAIM / start-up takeover, not as new

    @property
    def key(self) -> tuple[str, str]:
        return (self.stream, self.entry_id)


@dataclass(frozen=True)
class AckItem:
    """One entry to acknowledge; with ``dead_reason`` it is dead-lettered in the same step."""

    stream: str
    entry_id: str
    task_id: str = ""
    dead_reason: str = ""
    raw: str = ""
    deliveries: int = 0


class Streams:
    """The task streams of one key prefix: publish, read helpers, ack, hand back, renew."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._publish = client.register_script(_PUBLISH)
        self._ack = client.register_script(_ACK)
        self._hand_back = client.register_script(_HAND_BACK)
        self._renew = client.register_script(_RENEW)
        self._reclaim = client.register_script(_RECLAIM)
        self._remove_consumers = client.register_script(_REMOVE_CONSUMERS)

    # -- group -------------------------------------------------------------------------
    def ensure_group(self) -> None:
        """Create the consumer group on every priority stream (from id 0, MKSTREAM)."""
        for stream in self.keys.queues:
            try:
                self.client.xgroup_create(stream, self.keys.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    # -- publish -----------------------------------------------------------------------
    def publish_many(self, messages: Sequence[Mapping[str, Any]], *, chunk: int = 1000) -> list[str | None]:
        """Publish each message on its priority stream; None where the task already has a live entry.

        Pipelined: one round trip per ``chunk`` messages. Raises a Redis error if Redis refuses.
        """
        out: list[str | None] = []
        for start in range(0, len(messages), chunk):
            pipe = self.client.pipeline(transaction=False)
            for msg in messages[start : start + chunk]:
                stream = self.keys.queue(int(msg.get("priority", 0)))
                self._publish(
                    keys=[stream, self.keys.published(str(msg["id"]))],
                    args=[encode_message(msg), PUBLISHED_TTL_S],
                    client=pipe,
                )
            out.extend(pipe.execute())
        return out

    def queue_product(self, queue: str, message: Mapping[str, Any]) -> str | None:
        """Publish one message on ``queue`` (guarded by the task's published key)."""
        result = self._publish(
            keys=[queue, self.keys.published(str(message["id"]))],
            args=[encode_message(message), PUBLISHED_TTL_S],
        )
        return result

    # -- ack / dead letter ---------------------------------------------------------------
    def ack(self, consumer: str, items: Sequence[AckItem]) -> list[bool]:
        """Ack (and dead-letter where due) entries this consumer still owns; one round trip."""
        if not items:
            return []
        keys: list[str] = []
        args: list[Any] = [self.keys.group, consumer]
        now = int(time.time() * 1000)
        for item in items:
            keys += [item.stream, self.keys.published(item.task_id) if item.task_id else ""]
            args += [item.entry_id, item.dead_reason, item.raw, item.deliveries, now, item.task_id]
        keys.append(self.keys.dead)
        return [bool(x) for x in self._ack(keys=keys, args=args)]

    def hand_back(self, consumer: str, stream: str, entry_id: str, message: Mapping[str, Any]) -> str | None:
        """If the entry is still ours: ack it, delete it and publish ``message`` afresh."""
        return self._hand_back(
            keys=[stream, self.keys.published(str(message["id"]))],
            args=[self.keys.group, consumer, entry_id, encode_message(message), PUBLISHED_TTL_S],
        )

    def renew(self, consumer: str, entries: Sequence[tuple[str, str]]) -> list[int]:
        """Renew the lease (idle 0) of ``(stream, entry id)`` pairs still owned by ``consumer``.

        Per entry: 1 renewed, 0 taken by another consumer, -1 gone from the stream.
        """
        if not entries:
            return []
        return [
            int(x)
            for x in self._renew(
                keys=[s for s, _ in entries],
                args=[self.keys.group, consumer, *[e for _, e in entries]],
            )
        ]

    def reclaim(
        self, consumer: str, stream: str, min_idle_ms: int, cursor: str, count: int
    ) -> tuple[str, list[Entry]]:
        """XAUTOCLAIM up to ``count`` entries of ``stream`` idle at least ``min_idle_ms``, from
        ``cursor``; returns the next cursor ("0-0" once the pending list is walked) and the
        entries, each with its delivery count (this claim included) and ``reclaimed`` set."""
        cursor, found = self._reclaim(
            keys=[stream], args=[self.keys.group, consumer, min_idle_ms, cursor, count]
        )
        entries = [
            decode_entry(stream, eid, _pairs(fields), deliveries=int(n), reclaimed=True)
            for eid, n, fields in found
        ]
        return str(cursor), entries

    def remove_consumers(self, stream: str, names: Sequence[str]) -> list[str]:
        """Remove from the group those of ``names`` that have no pending entry on ``stream`` and
        no heartbeat (checked in the same script); returns the names removed."""
        if not names:
            return []
        return list(
            self._remove_consumers(
                keys=[stream, *[self.keys.executor(n) for n in names]], args=[self.keys.group, *names]
            )
        )


def _pairs(flat: Sequence[Any] | None) -> dict[str, Any] | None:
    return dict(zip(flat[::2], flat[1::2], strict=True)) if flat else None


def decode_entry(stream: str, entry_id: str, fields: Mapping[str, Any] | None, **kw: Any) -> Entry:
    raw = None if not fields else fields.get("message")
    return Entry(stream=stream, entry_id=entry_id, raw=raw, **kw)
