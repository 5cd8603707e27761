"""Redis: the connection and every write to the task streams, each one atomic (Lua).

- ``publish``: XADD a task's message to its tenant's backlog (the fair gate of :mod:`db.gate`
  admits it into the priority stream) and set ``published:{task}`` only if that key is absent,
  so a task has at most one live entry (``queue_product`` is the one-message form).
- ``ack``: for each finished entry, only if this consumer still owns it (XPENDING), XACK, XDEL,
  DEL of the published key and the end of its tenant slot; optionally XADD the original to the
  dead-letter stream first.
- ``hand_back``: only if the entry is still ours, ack and delete it, free its slot and publish
  a fresh one into the backlog.
- ``renew``: XCLAIM JUSTID (idle 0) of the entries this consumer still owns; their slots'
  deadlines move on. A running task's entry that Redis lost takes its slot again.
- ``reclaim``: XAUTOCLAIM (without JUSTID: the delivery count rises) of entries idle too long,
  with each one's delivery count from XPENDING, in one call; each keeps its slot.
- ``remove_consumers``: XGROUP DELCONSUMER, only of consumers with no pending entry and no
  heartbeat (DELCONSUMER would drop a consumer's pending entries for good).

Every script declares at least one key of the prefix (``KEYS[1]``), even one that builds the
rest of its keys from the prefix in ARGV: on a Redis Cluster the client routes a script by its
declared keys, and every key of a prefix shares one hash tag (``db.redis_client.cluster_prefix``),
so the script runs on the node that holds them all.

Messages are JSON in the single field ``message`` (see DESIGN.md, "Stream message").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
import redis
from redis.commands.core import Script

from db.gate import GATE_LIB
from db.keys import DEFAULT_TENANT, REQUEUE_TTL_S, Keys, check_tenant
from db.redis_client import connect as connect  # re-exported: callers import it from here

# Errors that mean "Redis is unreachable, restarting or refusing writes for now": back off and
# retry, don't fail. A refusal (OOM: full under ``noeviction``; READONLY: the server behind the URL
# became a replica) ran nothing, and ends without us (memory freed, a failover followed), so it is
# an outage like a lost connection (executor.outage says which). Every other ``ResponseError``
# (WRONGTYPE, a script's own error, NOSCRIPT left unhandled) is a bug, and raised.
RETRYABLE_REDIS_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    ConnectionResetError,
    BrokenPipeError,
)

BLOCK_MS_MAX = 2000
DEFAULT_SLOT_MS = 600_000  # 2 × the default redelivery timeout


def slot_ms_for(settings: Any) -> int:
    """A tenant slot lives 2 × the redelivery timeout past its last renewal (``db.gate``)."""
    return max(1000, int(2 * settings.redelivery_timeout_s * 1000))


def tenant_of(message: Mapping[str, Any]) -> str:
    """The tenant a message is gated under: its ``tenant_id`` when it is a valid one, else
    the default tenant (a message outside the contract is still delivered, and judged)."""
    tenant = message.get("tenant_id")
    try:
        return check_tenant(tenant) if tenant is not None else DEFAULT_TENANT
    except ValueError:
        return DEFAULT_TENANT


def encode_message(message: Mapping[str, Any]) -> str:
    return orjson.dumps(message).decode()


_PUBLISH = (
    GATE_LIB
    + """
-- KEYS: the task's published key (routes the call on a Cluster)
-- ARGV: prefix, priority, tenant, task id, message json, wake (1/0), requeue (1/0), requeue ttl
-- The entry goes into the tenant's backlog; the fair gate admits it (db.gate). A task with a
-- live entry gets none (false); with ``requeue``, if that entry is being processed (pending),
-- the message waits in ``requeue:{task}`` for its ack, which publishes it ('deferred').
local prefix, task = ARGV[1], ARGV[4]
local pub = k_published(prefix, task)
local live = redis.call('GET', pub)
if live then
  if ARGV[7] == '1' then
    local stream, id = string.match(live, '^(%S+) (%S+)$')
    if stream and not string.find(stream, ':t:', 1, true) then
      local p = redis.pcall('XPENDING', stream, prefix .. ':executors', id, id, 1)
      if type(p) == 'table' and p[1] then
        redis.call('SET', k_requeue(prefix, task), ARGV[5], 'EX', ARGV[8])
        return 'deferred'
      end
    end
  end
  return false
end
local key, id = backlog_add(prefix, ARGV[2], ARGV[3], task, ARGV[5])
redis.call('SET', pub, key .. ' ' .. id)
if ARGV[6] == '1' then wake(prefix) end
return id
"""
)

_WAKE = GATE_LIB + "-- KEYS: the wake-up stream\nwake(ARGV[1]) return 1"

_ACK = (
    GATE_LIB
    + """
-- KEYS: one stream per entry, then the dead-letter stream last
-- ARGV: group, consumer, prefix, requeue ttl, then per entry: entry id, dead reason ('' = no
--       dead letter), raw message, delivery count, now (ms), task id, once (1: dead-letter only
--       if the task has no dead letter yet), slot tenant ('' = none known)
-- Frees the entry's tenant slot (a tenant parked at its cap is put back, the fleet woken);
-- deletes the published key naming this entry, and publishes a re-queue that waited for it.
-- An entry Redis lost (pending nowhere, its group maybe gone too) is not acked, but the slot
-- its renewals took again under the slot tenant ends.
local group, consumer, prefix = ARGV[1], ARGV[2], ARGV[3]
local n = #KEYS - 1
local acked, woke = {}, false
for i = 1, n do
  local stream = KEYS[i]
  local base = 5 + (i - 1) * 8
  local id, reason, task = ARGV[base], ARGV[base + 1], ARGV[base + 5]
  local p = redis.pcall('XPENDING', stream, group, id, id, 1)
  if p['err'] then p = {} end  -- NOGROUP: Redis lost the group
  if p[1] and p[1][2] == consumer then
    if reason ~= '' then
      local index = k_dead_tasks(prefix)
      if not (ARGV[base + 6] == '1' and task ~= '' and redis.call('HEXISTS', index, task) == 1) then
        local dead = redis.call('XADD', KEYS[#KEYS], '*', 'message', ARGV[base + 2], 'reason', reason,
          'deliveries', ARGV[base + 3], 'time', ARGV[base + 4], 'stream', stream,
          'entry', id, 'task_id', task, 'consumer', consumer)
        if task ~= '' then redis.call('HSET', index, task, dead) end
      end
    end
    local t = entry_tenant(stream, id)
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
    if t and free_slot(prefix, stream, id, t) then woke = true end
    if task ~= '' then
      local pub = k_published(prefix, task)
      if redis.call('GET', pub) == stream .. ' ' .. id then
        redis.call('DEL', pub)
        local rq = k_requeue(prefix, task)
        local msg = redis.call('GET', rq)
        if msg then
          redis.call('DEL', rq)
          local key, nid = backlog_add(prefix, prio_of(stream), t or 'default', task, msg)
          redis.call('SET', pub, key .. ' ' .. nid)
          woke = true
        end
      end
    end
    acked[#acked + 1] = 1
  else
    local t = ARGV[base + 7]
    if not p[1] and t ~= '' and end_lost_slot(prefix, stream, id, t) then woke = true end
    acked[#acked + 1] = 0
  end
end
if woke then wake(prefix) end
return acked
"""
)

_HAND_BACK = (
    GATE_LIB
    + """
-- KEYS: stream, published key; ARGV: group, consumer, entry id, new message json, slot tenant
--       ('' = none known), prefix, tenant, task id
-- The slot is freed and the task goes to the back of its tenant's backlog (a re-queue that
-- waited for this entry is served by it). An entry Redis lost is not handed back (the row,
-- queued again, is re-published by the reconciler), but its re-armed slot ends (as in ack).
local prefix = ARGV[6]
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if p['err'] then p = {} end  -- NOGROUP: Redis lost the group
if not (p[1] and p[1][2] == ARGV[2]) then
  if not p[1] and ARGV[5] ~= '' and end_lost_slot(prefix, KEYS[1], ARGV[3], ARGV[5]) then wake(prefix) end
  return false
end
local t = entry_tenant(KEYS[1], ARGV[3])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
if t then free_slot(prefix, KEYS[1], ARGV[3], t) end
local key, id = backlog_add(prefix, prio_of(KEYS[1]), ARGV[7], ARGV[8], ARGV[4])
redis.call('SET', KEYS[2], key .. ' ' .. id)
redis.call('DEL', k_requeue(prefix, ARGV[8]))
wake(prefix)
return id
"""
)

_RENEW = (
    GATE_LIB
    + """
-- KEYS: streams (one per entry); ARGV: group, consumer, prefix, slot ms, then per entry (one
--       per key): entry id, slot tenant ('' = none: the entry's task is not running here)
-- returns per entry: 1 renewed, 0 owned by another consumer, -1 gone (its stream or group too)
-- A renewed entry's tenant slot gets a new deadline. A gone one's slot is taken again under
-- its slot tenant (Redis lost the entry and the slot with it; its task still runs), unless the
-- entry's ack has ended it meanwhile.
local out = {}
local deadline = now_ms() + tonumber(ARGV[4])
for i = 1, #KEYS do
  local id, slot_t = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  local p = redis.pcall('XPENDING', KEYS[i], ARGV[1], id, id, 1)
  if p['err'] or not p[1] then
    out[i] = -1
    if slot_t ~= '' then rearm_lost_slot(ARGV[3], KEYS[i], id, slot_t, deadline) end
  elseif p[1][2] ~= ARGV[2] then out[i] = 0
  else
    redis.call('XCLAIM', KEYS[i], ARGV[1], ARGV[2], 0, id, 'JUSTID')
    local t = entry_tenant(KEYS[i], id)
    if t then arm_slot(ARGV[3], KEYS[i], id, t, deadline) end
    out[i] = 1
  end
end
return out
"""
)


_RECLAIM = (
    GATE_LIB
    + """
-- KEYS: stream; ARGV: group, consumer, min idle ms, cursor, count, prefix, slot ms
-- returns {next cursor, {{id, delivery count, fields}, ...}}; a reclaimed entry keeps its
-- tenant slot (re-armed, or taken again if it had expired), never a second one
local res = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local out = {}
local deadline = now_ms() + tonumber(ARGV[7])
for i, e in ipairs(res[2]) do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
  local n = 0
  if p[1] then n = p[1][4] end
  local t = field_of(e[2], 'tenant')
  if t then arm_slot(ARGV[6], KEYS[1], e[1], t, deadline) end
  out[i] = {e[1], n, e[2] or false}
end
return {res[1], out}
"""
)

_LIVE_ENTRIES = """
-- KEYS: the tasks' published keys (route the call on a Cluster); ARGV: prefix, task ids.
-- Per task: 1 when its published key names an entry that exists; a key whose entry is gone
-- (trimmed, lost in a partial restore or a failover) is deleted: 0.
local out = {}
for i = 2, #ARGV do
  local pub = ARGV[1] .. ':published:' .. ARGV[i]
  local live = redis.call('GET', pub)
  local found = 0
  if live then
    local stream, id = string.match(live, '^(%S+) (%S+)$')
    if stream and redis.call('XRANGE', stream, id, id)[1] then found = 1 else redis.call('DEL', pub) end
  end
  out[#out + 1] = found
end
return out
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
    reclaimed: bool = False  # came by XAUTOCLAIM (its owner stopped renewing): takes the task over
    published: str | None = None  # its backlog entry's id (the publish time), set by the gate
    tenant: str | None = None  # the tenant whose slot it holds, set by the gate (None: no slot)

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
    outcome: Mapping[str, Any] | None = None  # the task's result, when this step ended it (db.results)
    dead_once: bool = False  # dead-letter only if the task has none yet (its row is dead already)
    tenant: str = ""  # its slot's tenant: ends the slot a renewal took again if Redis lost the entry


class Streams:
    """The task streams of one key prefix: publish, read helpers, ack, hand back, renew."""

    def __init__(self, client: redis.Redis, keys: Keys, *, slot_ms: int = DEFAULT_SLOT_MS) -> None:
        self.client = client
        self.keys = keys
        self.slot_ms = slot_ms  # a tenant slot's life without renewal (2 × redelivery timeout)
        self._publish = client.register_script(_PUBLISH)
        self._wake = client.register_script(_WAKE)
        self._ack = client.register_script(_ACK)
        self._hand_back = client.register_script(_HAND_BACK)
        self._renew = client.register_script(_RENEW)
        self._reclaim = client.register_script(_RECLAIM)
        self._remove_consumers = client.register_script(_REMOVE_CONSUMERS)
        self._live_entries = client.register_script(_LIVE_ENTRIES)
        self._loaded: set[str] = set()  # scripts loaded on every master (a Cluster's pipelines)

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
    def publish_many(
        self, messages: Sequence[Mapping[str, Any]], *, chunk: int = 1000, requeue: bool = False
    ) -> list[str | None]:
        """Publish each message into its tenant's backlog at its priority; None where the task
        already has a live entry ("deferred" with ``requeue`` where that entry is being
        processed: its ack publishes this message). The fleet is woken once per chunk.

        Pipelined: one round trip per ``chunk`` messages. Raises a Redis error if Redis refuses.
        """
        out: list[str | None] = []
        for start in range(0, len(messages), chunk):
            batch = messages[start : start + chunk]
            calls = [self._publish_call(msg, wake=False, requeue=requeue) for msg in batch]
            calls.append((self._wake, [self.keys.notify], [self.keys.prefix]))
            out.extend(self._pipelined(calls)[:-1])
        return out

    def _pipelined(self, calls: Sequence[tuple[Script, list[str], list[Any]]]) -> list[Any]:
        """Run script calls in one pipelined round trip; their replies in order.

        A Cluster pipeline takes no ``Script`` (its EVALSHA method is refused there): each call
        goes as an EVALSHA command to the node of its first key (told, or redis-py asks the
        server for a pipelined EVALSHA's keys, one COMMAND GETKEYS round trip each), the scripts
        loaded first on every master (once per instance); a call refused NOSCRIPT (a master
        restarted or failed over since) did not run, so it is run again on its own (the
        ``Script`` loads itself)."""
        pipe = self.client.pipeline(transaction=False)
        if not isinstance(self.client, redis.RedisCluster):
            for script, keys, args in calls:
                script(keys=keys, args=args, client=pipe)
            return list(pipe.execute())
        for script in {id(s): s for s, _, _ in calls}.values():
            if script.sha not in self._loaded:
                self._loaded.add(self.client.script_load(script.script))
        for script, keys, args in calls:
            node = self.client.get_node_from_key(keys[0])
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, target_nodes=node)
        replies = list(pipe.execute(raise_on_error=False))
        for i, reply in enumerate(replies):
            if isinstance(reply, redis.exceptions.NoScriptError):
                script, keys, args = calls[i]
                replies[i] = script(keys=keys, args=args)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def queue_product(self, message: Mapping[str, Any]) -> str | None:
        """Publish one message (guarded by the task's published key) and wake the fleet."""
        script, keys, args = self._publish_call(message, wake=True)
        return cast("str | None", script(keys=keys, args=args))

    def _publish_call(
        self, msg: Mapping[str, Any], *, wake: bool, requeue: bool = False
    ) -> tuple[Script, list[str], list[Any]]:
        """The publish script with its keys and arguments for one message."""
        priority = int(msg.get("priority", 0))
        self.keys.queue(priority)  # refuses a priority outside the contract
        task_id = str(msg["id"])
        args: list[Any] = [
            self.keys.prefix,
            priority,
            tenant_of(msg),
            task_id,
            encode_message(msg),
            1 if wake else 0,
            1 if requeue else 0,
            REQUEUE_TTL_S,
        ]
        return self._publish, [self.keys.published(task_id)], args

    # -- ack / dead letter ---------------------------------------------------------------
    def ack(self, consumer: str, items: Sequence[AckItem]) -> list[bool]:
        """Ack (and dead-letter where due) entries this consumer still owns; one round trip."""
        if not items:
            return []
        keys: list[str] = []
        args: list[Any] = [self.keys.group, consumer, self.keys.prefix, REQUEUE_TTL_S]
        now = int(time.time() * 1000)
        for item in items:
            keys.append(item.stream)
            args += [
                item.entry_id,
                item.dead_reason,
                item.raw,
                item.deliveries,
                now,
                item.task_id,
                1 if item.dead_once else 0,
                item.tenant,
            ]
        keys.append(self.keys.dead)
        return [bool(x) for x in self._ack(keys=keys, args=args)]

    def hand_back(
        self, consumer: str, stream: str, entry_id: str, message: Mapping[str, Any], slot_tenant: str = ""
    ) -> str | None:
        """If the entry is still ours: ack it, delete it, free its slot and publish ``message``
        afresh at the back of its tenant's backlog. If Redis lost the entry: end the slot that
        renewals took again under ``slot_tenant`` (:meth:`renew`)."""
        task_id = str(message["id"])
        return self._hand_back(  # type: ignore[no-any-return]  # a Lua script: the entry id or nil
            keys=[stream, self.keys.published(task_id)],
            args=[
                self.keys.group,
                consumer,
                entry_id,
                encode_message(message),
                slot_tenant,
                self.keys.prefix,
                tenant_of(message),
                task_id,
            ],
        )

    def renew(
        self,
        consumer: str,
        entries: Sequence[tuple[str, str]],
        running: Mapping[tuple[str, str], str] | None = None,
    ) -> list[int]:
        """Renew the lease (idle 0) of ``(stream, entry id)`` pairs still owned by ``consumer``.

        Per entry: 1 renewed, 0 taken by another consumer, -1 gone from the stream. ``running``
        maps the entries whose tasks run here to their slots' tenants: a gone one's slot (Redis
        lost it with the entry) is taken again, so its tenant's cap still counts the task; its
        ack (``AckItem.tenant``) or hand-back ends it.
        """
        if not entries:
            return []
        running = running or {}
        args: list[Any] = [self.keys.group, consumer, self.keys.prefix, self.slot_ms]
        for key in entries:
            args += [key[1], running.get(key, "")]
        return [int(x) for x in self._renew(keys=[s for s, _ in entries], args=args)]

    def reclaim(
        self, consumer: str, stream: str, min_idle_ms: int, cursor: str, count: int
    ) -> tuple[str, list[Entry]]:
        """XAUTOCLAIM up to ``count`` entries of ``stream`` idle at least ``min_idle_ms``, from
        ``cursor``; returns the next cursor ("0-0" once the pending list is walked) and the
        entries, each with its delivery count (this claim included) and ``reclaimed`` set."""
        cursor, found = self._reclaim(
            keys=[stream],
            args=[self.keys.group, consumer, min_idle_ms, cursor, count, self.keys.prefix, self.slot_ms],
        )
        entries = [
            decode_entry(stream, eid, _pairs(fields), deliveries=int(n), reclaimed=True)
            for eid, n, fields in found
        ]
        return str(cursor), entries

    def live_entries(self, task_ids: Sequence[str]) -> list[bool]:
        """Per task: whether its published key names an entry that still exists (a key whose
        entry is gone is deleted, so the reconciler can publish the task again)."""
        out: list[bool] = []
        for start in range(0, len(task_ids), 1000):
            chunk = list(task_ids[start : start + 1000])
            if chunk:
                found = self._live_entries(
                    keys=[self.keys.published(t) for t in chunk], args=[self.keys.prefix, *chunk]
                )
                out += [bool(x) for x in found]
        return out

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
    if not fields:
        return Entry(stream=stream, entry_id=entry_id, raw=None, **kw)
    return Entry(
        stream=stream,
        entry_id=entry_id,
        raw=fields.get("message"),
        published=fields.get("published"),
        tenant=fields.get("tenant"),
        **kw,
    )
