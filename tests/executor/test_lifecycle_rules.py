"""Rules of shared/LIFECYCLE.md that no other test file proves under its own name: the progress
of each state, a held row's entry, one query per read batch, watchers that need no event, and
which keys expire."""

from __future__ import annotations

import re
import threading

import orjson
import trio

from db.database import connection, database, unit
from db.models import CANCELLED, DEAD, DONE, FAILED, HELD, QUEUED, RUNNING, Document, Task
from db.streams import Entry
from executor.claim import ClaimRules, validate_and_claim
from ingest.cli.wait import wait_for_documents
from ingest.control import cancel
from ingest.strikes import strike
from ingest.task_wait import wait_for_task
from tests import handlers
from tests.executor.support import all_in, enqueue, make_document, rows, running_daemon, statuses, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule
from tests.procs import free_port


@rule("states.progress")
async def test_progress_is_1_when_done_and_minus_1_when_failed_cancelled_or_dead(xsettings, streams, db):
    done, failed, long = enqueue(
        streams, [task_spec("noop"), task_spec("permanent"), task_spec("sleep", seconds=30)]
    )
    (dead,) = enqueue(streams, [task_spec("no_such_type")])
    (queued,) = enqueue(streams, [task_spec("noop")], publish=False)
    async with running_daemon(xsettings):
        await await_until(lambda: statuses([long]) == {long: RUNNING}, 10)
        assert 0.0 <= rows([long])[long]["progress"] < 1.0
        await trio.to_thread.run_sync(lambda: cancel(xsettings, long))
        await await_until(lambda: all_in([done, failed, long, dead], DONE, FAILED, CANCELLED, DEAD), 10)
    got = {t: (r["status"], r["progress"]) for t, r in rows([done, failed, long, dead, queued]).items()}
    assert got == {
        done: (DONE, 1.0),
        failed: (FAILED, -1.0),
        long: (CANCELLED, -1.0),
        dead: (DEAD, -1.0),
        queued: (QUEUED, 0.0),
    }


@rule("validate.drop-rules")
async def test_the_entry_of_a_held_row_is_acked_and_the_task_does_not_run(xsettings, streams, db):
    (held,) = enqueue(streams, [task_spec("noop", status=HELD)])
    (ran,) = enqueue(streams, [task_spec("noop")])
    handlers.CALLS.clear()
    async with running_daemon(xsettings):
        await await_until(lambda: all_in([ran], DONE), 10)
        await await_until(lambda: streams.client.xlen(streams.keys.queue(0)) == 0, 10)
    assert statuses([held]) == {held: HELD} and [ran] == handlers.CALLS  # restore publishes it again


def _status_counters() -> dict[str, int]:
    cursor = database.obj.execute_sql(
        "SHOW SESSION STATUS WHERE Variable_name IN ('Com_select', 'Com_update')"
    )
    return {name: int(value) for name, value in cursor.fetchall()}


@rule("validate.one-query")
def test_one_select_validates_a_mixed_batch_and_one_update_claims_it(xsettings, streams, db):
    queued = enqueue(streams, [task_spec("noop") for _ in range(5)], publish=False)
    (done,) = enqueue(streams, [task_spec("noop", status=DONE)], publish=False)
    (held,) = enqueue(streams, [task_spec("noop", status=HELD)], publish=False)
    missing = "0" * 32
    stream = streams.keys.queue(0)
    entries = [
        Entry(stream, f"{n + 1}-0", orjson.dumps({"id": tid, "task_type": "noop"}).decode())
        for n, tid in enumerate([*queued, done, held, missing])
    ]
    rules = ClaimRules("host_1", {"noop"}, 3, (), lambda owners: set())
    with connection():
        before = _status_counters()
        plan = validate_and_claim(entries, rules)
        after = _status_counters()
    # one SELECT reads every row of the batch with its document and knowledge base, one UPDATE
    # claims the rest under a token (it matched every row: no SELECT to find which it won)
    assert {k: after[k] - before[k] for k in after} == {"Com_select": 1, "Com_update": 1}
    assert sorted(c.task_id for c in plan.claimed) == sorted(queued)
    assert sorted(a.task_id for a in plan.acks) == sorted([done, held, missing])
    assert all(r["status"] == RUNNING and r["attempt"] == 1 for r in rows(queued).values())


@rule("finish.watchers-read-db")
def test_waiters_see_a_row_end_with_no_event_and_no_redis(xsettings, streams, db):
    kb_id, doc_id = make_document()
    (tid,) = enqueue(streams, [task_spec("noop", doc_id=doc_id, kb_id=kb_id)], publish=False)
    no_redis = xsettings.replace(redis_url=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
    ended: dict[str, object] = {}

    def wait() -> None:
        ended["documents"] = wait_for_documents(no_redis, [doc_id], timeout_s=20, poll_s=0.1, show=False)
        ended["task"] = wait_for_task(no_redis, tid, timeout_s=20)

    waiter = threading.Thread(target=wait)
    waiter.start()
    with unit():  # the row changes in the database only: no event is published anywhere
        Task.update(status=DONE, progress=1.0).where(Task.id == tid).execute()
        Document.update(run=DONE, progress=1.0).where(Document.id == doc_id).execute()
    waiter.join(30)
    assert not waiter.is_alive()
    docs, all_ended = ended["documents"]
    assert all_ended and docs[doc_id]["run"] == DONE
    assert ended["task"][1] is True and ended["task"][0]["status"] == DONE


# Every key under the prefix, by the part after it: (pattern, must it expire?). A key that matches
# none is a new kind of key: add it here, and give it a TTL if it belongs to a task or an executor.
_KINDS = [
    (r"queue:[01]", False),  # the priority streams
    (r"queue:[01]:t:[^:]+", False),  # each tenant's backlog stream (the fair gate)
    (r"ready:[01]|parked|rr|notify|tenants:mirrored", False),  # the gate's fleet-wide state
    (r"tenant:[^:]+:(running|limits)", False),  # a tenant's slots and its limits mirror
    (r"dead|dead:replayed|dead:tasks", False),  # dead letters: only `ingest dead purge` removes them
    (r"strikes", False),  # the strike mirror
    (r"stats", False),
    (r"published:[0-9a-f]+", False),  # lives exactly as long as its entry (checked below)
    (r"executor:[^:]+", True),  # heartbeats
    (r"(cancel|result|requeue):[0-9a-f]+", True),  # per task
    (r"lock:[a-z]+", True),  # the fleet's sweep and reconcile locks
    (r"slot:ended:[01]:[0-9]+-[0-9]+", True),  # the slot of an entry Redis lost, ended by its ack
    (r"reconcile:orphans", True),  # the reconcile passes' first sightings of orphaned rows
]


def _check_keys(streams) -> set[str]:
    client, prefix = streams.client, streams.keys.prefix
    kinds, published = set(), []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        name = key[len(prefix) + 1 :]
        matched = [(pattern, expires) for pattern, expires in _KINDS if re.fullmatch(pattern, name)]
        assert matched, f"key {key} is of no known kind"
        pattern, expires = matched[0]
        ttl = client.pttl(key)
        if ttl == -2:  # gone since the scan (a tenant's last slot freed, an entry acked)
            continue
        if expires:
            assert ttl > 0, f"{key} must expire (pttl {ttl})"
        else:
            assert ttl == -1, f"{key} must not expire (pttl {ttl})"
        if name.startswith("published:"):
            published.append(name.split(":", 1)[1])
        kinds.add(pattern)
    # The scan and the check are two moments: an ack in between deletes the key with its entry
    # (one script), so only a key that still exists and names no entry breaks the rule. Checked
    # read-only (live_entries would delete such a key, hiding what the next check should see).
    states = _published_states(streams, published)  # one per key
    dangling = [t for t, state in zip(published, states, strict=True) if state == 0]
    assert not dangling, f"published keys name no live entry: {dangling}"
    return kinds


_PUBLISHED_STATE = """
-- KEYS: published keys. Per key: -1 gone, 1 names an entry that exists, 0 names none.
local out = {}
for i = 1, #KEYS do
  local live = redis.call('GET', KEYS[i])
  local state = -1
  if live then
    local stream, id = string.match(live, '^(%S+) (%S+)$')
    state = (stream and redis.call('XRANGE', stream, id, id)[1]) and 1 or 0
  end
  out[i] = state
end
return out
"""


def _published_states(streams, task_ids: list[str]) -> list[int]:
    if not task_ids:
        return []
    keys = [streams.keys.published(t) for t in task_ids]
    return list(streams.client.eval(_PUBLISHED_STATE, len(keys), *keys))


@rule("keys.ttl")
async def test_keys_of_tasks_and_executors_expire_and_streams_and_mirrors_do_not(
    xsettings, streams, rclient, keys, db
):
    await trio.to_thread.run_sync(lambda: strike(xsettings, "fail"))  # the strike mirror
    settings = xsettings.replace(results_ttl_s=600.0)
    (long,) = enqueue(streams, [task_spec("sleep", seconds=30)])
    finished = enqueue(streams, [task_spec("noop"), task_spec("fail")])
    rclient.xadd(keys.queue(0), {"message": "not json"})  # a dead letter
    async with running_daemon(settings):
        await await_until(lambda: statuses([long]) == {long: RUNNING} and all_in(finished, DONE, HELD), 10)
        await trio.to_thread.run_sync(lambda: cancel(settings, long))  # a cancel key
        during = await trio.to_thread.run_sync(_check_keys, streams)
        await await_until(lambda: all_in([long], CANCELLED) and rclient.xlen(keys.dead) == 1, 10)
    after = await trio.to_thread.run_sync(_check_keys, streams)
    assert {r"executor:[^:]+", r"(cancel|result|requeue):[0-9a-f]+", r"strikes"} <= during
    assert {r"dead|dead:replayed|dead:tasks", r"strikes"} <= after
    assert not any(rclient.exists(keys.published(t)) for t in [long, *finished])
