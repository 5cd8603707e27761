"""Finished tasks' results in Redis: written once, fetched (once, by default), expiring on their own.

The task row is the durable record; a result is what an application fetches and forgets
(docling-serve's lifecycle). On a task's first terminal state one script call writes
``result:{task}`` with ``SET NX EX INGEST_RESULTS_TTL_S`` and, only if that SET won, publishes
the completion event on the updates channel, so a task announces its end once. With single use
on, the first fetch sets the key to expire ``INGEST_RESULT_REMOVAL_DELAY_S`` later (in Redis,
so a crash of the fetching process changes nothing) and later fetches never extend it. A
publish of the task again (retry, replay, resubmit) removes its old result.

A result: ``{"task_id", "tenant_id", "doc_id", "task_type", "status", "kind": "success" |
"failure", "chunk_count", "error", "finished_at" (ms)}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from db.keys import Keys

SUCCESS, FAILURE = "success", "failure"

# KEYS[1]: the updates channel; ARGV[1]: ttl (s); then per event: result key ('' = an event
# without a result), result json, event json.
_ANNOUNCE = """
local n = 0
for i = 2, #ARGV, 3 do
  local key = ARGV[i]
  if key == '' or redis.call('SET', key, ARGV[i + 1], 'NX', 'EX', ARGV[1]) then
    redis.call('PUBLISH', KEYS[1], ARGV[i + 2])
    n = n + 1
  end
end
return n
"""

# KEYS[1]: result key; ARGV: tenant ('' = any: admin), single use (1/0), removal delay (ms).
# Another tenant's result reads as absent and is left as it is.
_FETCH = """
local v = redis.call('GET', KEYS[1])
if not v then return false end
if ARGV[1] ~= '' then
  local ok, r = pcall(cjson.decode, v)
  if not ok or type(r) ~= 'table' or r['tenant_id'] ~= ARGV[1] then return false end
end
if ARGV[2] == '1' then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 or ttl > tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
end
return v
"""


def result_record(
    row: Mapping[str, Any], status: str, *, chunk_count: int = 0, error: str = "", finished_at: int
) -> dict[str, Any]:
    """The result of a task row that just reached terminal ``status``."""
    return {
        "task_id": str(row["id"]),
        "tenant_id": str(row.get("tenant_id") or "default"),
        "doc_id": str(row.get("doc_id") or ""),
        "task_type": str(row.get("task_type") or "parse"),
        "status": status,
        "kind": SUCCESS if status == "done" else FAILURE,
        "chunk_count": int(chunk_count),
        "error": error,
        "finished_at": int(finished_at),
    }


@dataclass(frozen=True)
class Announcement:
    """One event for the updates channel; with ``result`` it is a task's end, sent once."""

    event: Mapping[str, Any]
    result: Mapping[str, Any] | None = None


class Results:
    """Write, fetch and clear the results of one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._announce = client.register_script(_ANNOUNCE)
        self._fetch = client.register_script(_FETCH)

    def announce(self, items: Sequence[Announcement], *, ttl_s: float) -> int:
        """Publish each event; one with a result only if its result was not written before.
        Returns how many events went out."""
        if not items:
            return 0
        args: list[Any] = [max(1, int(ttl_s))]
        for item in items:
            if item.result is None:
                args += ["", "", orjson.dumps(item.event)]
            else:
                key = self.keys.result(str(item.result["task_id"]))
                event = {**item.event, "result_key": key}
                args += [key, orjson.dumps(item.result), orjson.dumps(event)]
        return int(self._announce(keys=[self.keys.updates], args=args))

    def fetch(
        self, task_id: str, *, tenant_id: str | None, single_use: bool, removal_delay_s: float
    ) -> dict[str, Any] | None:
        """The result, or None (not finished, expired, or another tenant's). ``tenant_id`` None
        reads any tenant's (admin). A single-use result expires ``removal_delay_s`` after its
        first fetch; later fetches do not extend it."""
        raw = self._fetch(
            keys=[self.keys.result(task_id)],
            args=[tenant_id or "", 1 if single_use else 0, max(1, int(removal_delay_s * 1000))],
        )
        return orjson.loads(raw) if raw else None

    def clear(self, *, older_than_ms: int | None, now_ms: int, tenant_id: str | None = None) -> int:
        """Remove results (finished more than ``older_than_ms`` ago, when given; of one tenant,
        when given); returns how many were removed."""
        removed = 0
        batch: list[str] = []
        for key in self.client.scan_iter(match=self.keys.result_pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                removed += self._clear_batch(batch, older_than_ms, now_ms, tenant_id)
                batch = []
        if batch:
            removed += self._clear_batch(batch, older_than_ms, now_ms, tenant_id)
        return removed

    def _clear_batch(
        self, keys: list[str], older_than_ms: int | None, now_ms: int, tenant_id: str | None
    ) -> int:
        if older_than_ms is None and tenant_id is None:
            return int(self.client.delete(*keys))
        doomed = []
        for key, raw in zip(keys, self.client.mget(keys), strict=True):
            if raw is None:
                continue
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                doomed.append(key)  # not ours to keep: a result is JSON
                continue
            if tenant_id is not None and record.get("tenant_id") != tenant_id:
                continue
            finished = int(record.get("finished_at") or 0)
            if older_than_ms is None or now_ms - finished >= older_than_ms:
                doomed.append(key)
        return int(self.client.delete(*doomed)) if doomed else 0
