"""The fair gate: per-tenant backlogs admitted into the priority streams, round robin, under caps.

Waiting work sits in a group-less stream per tenant and priority (``Keys.backlog``). The
priority streams ``queue:{p}`` and their consumer group hold only *admitted* work, so own
pending entries, leases, the reclaim sweep, the delivery cap and dead letters work on them as
before. One Lua call (:meth:`Gate.dispatch`) replaces the read of new entries: it admits work
round robin over the tenants that have backlog and a free slot (``ready:{p}``, scored by a
counter, lowest first), and reads what it admitted into the caller's pending list, never more
than the caller's free slots. An admitted entry keeps its backlog entry's id in the field
``published`` (the time of its publish; its own id holds the time of its admission).

A *slot* is a member ``{p}:{entry id}`` of ``tenant:{t}:running``, scored by its deadline
(now + 2 × the redelivery timeout). Lease renewals and reclaims re-arm it (the entry id
survives XCLAIM/XAUTOCLAIM, so a reclaimed message keeps its slot and never takes a second);
an ack, a dead letter or a hand-back frees it; a slot whose executor was SIGKILLed expires at
its deadline. When Redis loses its data, a task still running takes its slot again at its
executor's next renewal (``db.streams``, ``renew``), before that executor lets the gate admit
again (``executor.reconciler``). A tenant found at its cap leaves ``ready`` for ``parked`` (scored by its earliest
deadline); freeing one of its slots, or that deadline passing, puts it back. Idle executors
block on the wake-up stream ``notify`` (``XADD MAXLEN 1``) instead of polling.

The scripts build tenant keys from the names in :data:`db.keys.LUA_KEYS` (each declares one
key of the prefix, so a Cluster routes it to the slot of the prefix's hash tag); time is the
server's (``TIME``), so executors' clocks do not matter. See ``shared/FAIRNESS.md``.

A tenant's running cap is read from ``tenant:{t}:limits``, a mirror of its database row, and
the mirror is trusted only while ``tenants:mirrored`` (:attr:`Keys.limits_mirrored`) marks it
complete. A fresh Redis and one that lost its data look alike: no mark, no limits, and the
default cap would let a paused or capped tenant run. So while the mark is missing the gate
admits nothing (entries put on the priority streams directly are still read), and says so
(:attr:`Dispatched.limits_missing`). Only a complete copy of the table sets the mark
(:func:`ingest.tenants.copy_limits`); every executor makes one at start and at once when one
of its dispatches says the mark is gone (``executor.reconciler``), then wakes the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import redis

from db.keys import LUA_KEYS, PRIORITIES, SLOT_ENDED_TTL_S, Keys

PARK_RECHECK_MS = 5000  # a paused tenant (cap 0) is looked at again this often
UNPARK_DUE_MAX = 16  # parked tenants whose time came, moved back per dispatch

# Shared by every script that touches the gate (prepended to each).
GATE_LIB = (
    "pcall(redis.replicate_commands)  -- Redis 6.2: TIME before writes needs effects replication\n"
    + LUA_KEYS
    + f"local SLOT_ENDED_TTL_S = {SLOT_ENDED_TTL_S}\n"
    + """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function field_of(fields, name)
  if not fields then return nil end
  for i = 1, #fields, 2 do if fields[i] == name then return fields[i + 1] end end
  return nil
end
local function entry_tenant(stream, id)
  local e = redis.call('XRANGE', stream, id, id)
  if e[1] then return field_of(e[1][2], 'tenant') end
  return nil
end
local function prio_of(stream) return string.match(stream, '(%d+)$') end
local function ready_add(prefix, p, t)
  if not redis.call('ZSCORE', k_parked(prefix), t) then
    redis.call('ZADD', k_ready(prefix, p), 'NX', redis.call('INCR', k_rr(prefix)), t)
  end
end
local function unpark(prefix, t)
  if redis.call('ZREM', k_parked(prefix), t) == 0 then return false end
  for _, p in ipairs(PRIOS) do
    if redis.call('XLEN', k_backlog(prefix, p, t)) > 0 then
      redis.call('ZADD', k_ready(prefix, p), 'NX', redis.call('INCR', k_rr(prefix)), t)
    end
  end
  return true
end
local function free_slot(prefix, stream, id, t)
  redis.call('ZREM', k_running(prefix, t), prio_of(stream) .. ':' .. id)
  return unpark(prefix, t)
end
local function arm_slot(prefix, stream, id, t, deadline)
  redis.call('ZADD', k_running(prefix, t), 'GT', deadline, prio_of(stream) .. ':' .. id)
end
-- The slot of an entry Redis lost while its task ran (a renewal took it again, db.streams):
-- its ack or hand-back ends it, and marks it ended so that a renewal racing them does not
-- take it once more.
-- Under maxmemory Redis refuses a script's first write if it may grow memory (SET, ZADD),
-- never a later one: the ZREM goes first, and a refused re-arm leaves the rest of its call be.
local function end_lost_slot(prefix, stream, id, t)
  local woke = free_slot(prefix, stream, id, t)
  redis.call('SET', k_slot_ended(prefix, prio_of(stream), id), '1', 'EX', SLOT_ENDED_TTL_S)
  return woke
end
local function rearm_lost_slot(prefix, stream, id, t, deadline)
  if redis.call('EXISTS', k_slot_ended(prefix, prio_of(stream), id)) == 0 then
    redis.pcall('ZADD', k_running(prefix, t), 'GT', deadline, prio_of(stream) .. ':' .. id)
  end
end
local function backlog_add(prefix, p, t, task, message)
  local key = k_backlog(prefix, p, t)
  local id = redis.call('XADD', key, '*', 'message', message, 'tenant', t, 'task', task)
  ready_add(prefix, p, t)
  return key, id
end
local function wake(prefix)
  redis.call('XADD', k_notify(prefix), 'MAXLEN', '1', '*', 'w', '1')
end
"""
)

_DISPATCH = (
    GATE_LIB
    + """
-- KEYS: the wake-up stream (routes the call on a Cluster), the limits mirror's mark
-- ARGV: prefix, group, consumer, free slots, default max running, slot ms, park recheck ms,
--       unpark-due max
-- returns {{{stream, entries}, ...}, more (1: tenants left unscanned), last wake-up id,
--          limits missing (1: the mirror is not marked complete, nothing was admitted)}
local prefix, group, consumer = ARGV[1], ARGV[2], ARGV[3]
local free = tonumber(ARGV[4])
local default_max, slot_ms, recheck_ms = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local now = now_ms()
local parked = k_parked(prefix)
-- without a complete mirror a tenant's cap is unknown here (its row may pause it): admit nobody
local limits_known = redis.call('EXISTS', KEYS[2]) == 1
if limits_known then
  for _, t in ipairs(redis.call('ZRANGEBYSCORE', parked, '-inf', now, 'LIMIT', 0, tonumber(ARGV[8]))) do
    unpark(prefix, t)
  end
end
local out, more = {}, 0
local function read(q, n)
  local res = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', n, 'STREAMS', q, '>')
  if res and res[1] then
    out[#out + 1] = {q, res[1][2]}
    return #res[1][2]
  end
  return 0
end
local function park(t, running, lim)
  for _, p in ipairs(PRIOS) do redis.call('ZREM', k_ready(prefix, p), t) end
  local score = now + recheck_ms
  if lim > 0 then
    local first = redis.call('ZRANGE', running, 0, 0, 'WITHSCORES')
    if first[2] then score = tonumber(first[2]) end
  end
  redis.call('ZADD', parked, score, t)
end
for _, p in ipairs(PRIOS) do
  if free <= 0 then break end
  local q = k_queue(prefix, p)
  free = free - read(q, free)  -- entries put on the priority stream directly (outside the gate)
  local ready = k_ready(prefix, p)
  local admitted, scanned, budget = 0, 0, 2 * free + 8
  while limits_known and admitted < free and scanned < budget do
    local t = redis.call('ZRANGE', ready, 0, 0)[1]
    if not t then break end
    scanned = scanned + 1
    local running = k_running(prefix, t)
    redis.call('ZREMRANGEBYSCORE', running, '-inf', now)
    local lim = tonumber(redis.call('HGET', k_limits(prefix, t), 'max_running') or default_max)
    local room = lim - redis.call('ZCARD', running)
    local backlog = k_backlog(prefix, p, t)
    if room <= 0 then
      park(t, running, lim)
    else
      local take = free - admitted
      if take > room then take = room end
      if take > 1 and redis.call('ZCARD', ready) > 1 then take = 1 end  -- one task a turn
      local deadline = now + slot_ms
      local es = redis.call('XRANGE', backlog, '-', '+', 'COUNT', take)
      for _, e in ipairs(es) do
        local task = field_of(e[2], 'task')
        local id = redis.call('XADD', q, '*', 'message', field_of(e[2], 'message') or '', 'tenant', t,
          'published', e[1])  -- the backlog entry's id: its publish time (start latency)
        redis.call('XDEL', backlog, e[1])
        redis.call('ZADD', running, deadline, p .. ':' .. id)
        if task then  -- the published key follows its entry across the gate
          local pub = k_published(prefix, task)
          if redis.call('GET', pub) == backlog .. ' ' .. e[1] then
            redis.call('SET', pub, q .. ' ' .. id, 'KEEPTTL')
          end
        end
      end
      admitted = admitted + #es
      room = room - #es
      if redis.call('XLEN', backlog) == 0 then
        redis.call('ZREM', ready, t)
      elseif room <= 0 then
        park(t, running, lim)
      else
        redis.call('ZADD', ready, 'XX', redis.call('INCR', k_rr(prefix)), t)
      end
    end
  end
  if admitted > 0 then free = free - read(q, admitted) end
  if limits_known and free > 0 and redis.call('ZCARD', ready) > 0 then more = 1 end
end
local last = redis.call('XREVRANGE', k_notify(prefix), '+', '-', 'COUNT', 1)[1]
return {out, more, last and last[1] or '0-0', limits_known and 0 or 1}
"""
)

_UNPARK = (
    GATE_LIB
    + """
-- KEYS: the parked set (routes the call on a Cluster)
-- ARGV: prefix, tenants: each back into ready wherever it has backlog (a limit changed)
local woke = 0
for i = 2, #ARGV do
  local t = ARGV[i]
  unpark(ARGV[1], t)
  for _, p in ipairs(PRIOS) do
    if redis.call('XLEN', k_backlog(ARGV[1], p, t)) > 0 then ready_add(ARGV[1], p, t); woke = 1 end
  end
end
if woke == 1 then wake(ARGV[1]) end
return woke
"""
)


_WAKE = GATE_LIB + "-- KEYS: the wake-up stream; ARGV: prefix\nwake(ARGV[1]) return 1"


@dataclass(frozen=True)
class Dispatched:
    """What one dispatch call read: the entries (raw reply), whether tenants were left
    unscanned (call again before blocking), the last wake-up id (block after it) and whether
    the limits mirror was incomplete (nothing admitted: an executor copies it, then wakes)."""

    reply: list[Any]
    more: bool
    last_wake: str
    limits_missing: bool = False


@dataclass(frozen=True)
class TenantGate:
    """One tenant's state at the gate (``ingest fleet`` / ``status``)."""

    tenant_id: str
    backlog: int  # waiting, not admitted
    running: int  # live slots
    parked: bool


class Gate:
    """The Lua calls of the fair gate on one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._dispatch = client.register_script(_DISPATCH)
        self._unpark = client.register_script(_UNPARK)
        self._wake = client.register_script(_WAKE)

    def dispatch(
        self,
        group: str,
        consumer: str,
        free: int,
        *,
        default_max_running: int,
        slot_ms: int,
        client: redis.Redis | None = None,
    ) -> Dispatched:
        """Admit up to ``free`` tasks round robin and read them (and any entry put on the
        priority streams directly) into ``consumer``'s pending list, high priority first.
        Nothing is admitted while the limits mirror is not marked complete."""
        reply, more, last, missing = self._dispatch(
            keys=[self.keys.notify, self.keys.limits_mirrored],
            args=[
                self.keys.prefix,
                group,
                consumer,
                free,
                default_max_running,
                slot_ms,
                PARK_RECHECK_MS,
                UNPARK_DUE_MAX,
            ],
            client=client or self.client,
        )
        return Dispatched(reply or [], bool(more), str(last), bool(missing))

    def unpark(self, tenant_ids: list[str]) -> bool:
        """Put tenants back into ``ready`` (after their limits changed); wakes the fleet."""
        if not tenant_ids:
            return False
        return bool(self._unpark(keys=[self.keys.parked], args=[self.keys.prefix, *tenant_ids]))

    def wake(self) -> None:
        """Wake the fleet's idle executors (they dispatch again at once)."""
        self._wake(keys=[self.keys.notify], args=[self.keys.prefix])

    def tenant(self, tenant_id: str, now_ms: int) -> TenantGate:
        pipe = self.client.pipeline(transaction=False)
        for p in PRIORITIES:
            pipe.xlen(self.keys.backlog(p, tenant_id))
        pipe.zcount(self.keys.running(tenant_id), now_ms, "+inf")
        pipe.zscore(self.keys.parked, tenant_id)
        *lens, running, parked = pipe.execute()
        return TenantGate(tenant_id, sum(int(n) for n in lens), int(running), parked is not None)

    def tenants_at_gate(self) -> list[str]:
        """Tenants the gate knows now: ready at some priority or parked."""
        pipe = self.client.pipeline(transaction=False)  # one round trip
        pipe.zrange(self.keys.parked, 0, -1)
        for p in PRIORITIES:
            pipe.zrange(self.keys.ready(p), 0, -1)
        return sorted({name for names in cast("list[list[str]]", pipe.execute()) for name in names})
