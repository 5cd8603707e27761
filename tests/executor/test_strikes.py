"""Strikes on a running executor: a rule reaches it within a second; the tasks it matches (and only
those) are held on their rows with the rule named, acked, counted; restore runs them. A rule lifted
after the executor loaded it holds nothing (the hold is fenced on the rule being active)."""

from __future__ import annotations

import time

import orjson
import trio

from db.bulk import bulk_insert_into_db
from db.database import connection, unit
from db.models import DONE, HELD, RUNNING, Document, KnowledgeBase, Strike
from db.streams import Entry
from executor.claim import ClaimRules, validate_and_claim
from ingest.strikes import Rule, list_strikes, read_mirror, restore, strike
from tests.executor.support import all_in, enqueue, new_id, rows, running_daemon, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule
from tests.observe import scrape, total
from tests.procs import PrivateRedis, free_port


def _documents(kb_id: str, doc_type: str, n: int) -> list[str]:
    ids = [new_id() for _ in range(n)]
    bulk_insert_into_db(
        Document,
        [
            {"id": d, "kb_id": kb_id, "name": f"{d[:8]}.{doc_type}", "doc_type": doc_type, "size": 10}
            for d in ids
        ],
    )
    return ids


async def _until_rules(daemon, count: int, within_s: float) -> float:
    began = time.monotonic()
    with trio.fail_after(within_s):
        while len(daemon.strikes.rules) != count:
            await trio.sleep(0.02)
    return time.monotonic() - began


@rule("validate.strike-holds")
async def test_a_strike_holds_matching_tasks_only_and_restore_runs_them(
    xsettings, streams, rclient, keys, db
):
    port = free_port()
    settings = xsettings.replace(metrics_port=port)
    kb_id = new_id()
    bulk_insert_into_db(KnowledgeBase, [{"id": kb_id, "name": "kb"}])
    pdfs, txts = _documents(kb_id, "pdf", 3), _documents(kb_id, "txt", 3)
    async with running_daemon(settings, "host_1") as daemon:
        made = await trio.to_thread.run_sync(lambda: strike(settings, "noop", "doc_type", "==", "pdf"))
        assert made.created and made.mirrored
        assert await _until_rules(daemon, 1, within_s=1.0) < 1.0  # within a second, no restart
        held_ids = enqueue(streams, [task_spec("noop", doc_id=d, kb_id=kb_id) for d in pdfs])
        run_ids = enqueue(streams, [task_spec("noop", doc_id=d, kb_id=kb_id) for d in txts])
        other = enqueue(streams, [task_spec("sleep", seconds=0, doc_id=pdfs[0], kb_id=kb_id)])  # another type
        await await_until(lambda: all_in(run_ids + other, DONE) and all_in(held_ids, HELD), 15)
        await await_until(lambda: not daemon.finisher.backlog, 5)
        rule_id = made.rule["id"]
        for r in rows(held_ids).values():
            assert r["strike_id"] == rule_id and r["attempt"] == 0 and r["owner"] == ""
            assert f"held by strike #{rule_id}: noop doc_type == pdf" in r["progress_msg"]
        assert rclient.xlen(keys.queue(0)) == 0  # held entries were acked, not left to redeliver
        text = scrape(port)
        assert total(text, "ingest_tasks_stricken_total", task_type="noop") == 3
        assert total(text, "ingest_strikes_in_effect") == 1
        (listed,) = await trio.to_thread.run_sync(lambda: list_strikes(settings))
        assert listed["held"] == 3 and listed["rule"] == "noop doc_type == pdf"

        released = await trio.to_thread.run_sync(lambda: restore(settings, "noop", "doc_type", "==", "pdf"))
        assert sorted(released.task_ids) == sorted(held_ids) and released.published == 3
        await await_until(lambda: all_in(held_ids, DONE), 15)
        await _until_rules(daemon, 0, within_s=1.0)
        assert await trio.to_thread.run_sync(lambda: list_strikes(settings)) == []
    mirror = read_mirror(rclient, keys)
    assert mirror.version == 2 and mirror.rules == []
    assert all(
        r["strike_id"] == 0 and "released: strike #" in r["progress_msg"] for r in rows(held_ids).values()
    )


async def test_a_task_type_strike_holds_every_task_of_that_type(xsettings, streams, db):
    await trio.to_thread.run_sync(lambda: strike(xsettings, "noop"))
    async with running_daemon(xsettings, "host_1"):  # loaded at start, before the first read
        held = enqueue(streams, [task_spec("noop") for _ in range(3)])
        ran = enqueue(streams, [task_spec("sleep", seconds=0)])
        await await_until(lambda: all_in(ran, DONE) and all_in(held, HELD), 10)
        await trio.to_thread.run_sync(lambda: restore(xsettings, "noop"))
        await await_until(lambda: all_in(held, DONE), 10)


@rule("validate.strike-holds")
def test_a_rule_lifted_after_the_executor_loaded_it_holds_nothing(xsettings, streams, db):
    made = strike(xsettings, "noop")
    restore(xsettings, "noop")  # the executor below still has the rule cached
    stale = Rule(made.rule["id"], "noop")
    (tid,) = enqueue(streams, [task_spec("noop")], publish=False)
    entry = Entry(
        f"{xsettings.key_prefix}:queue:0", "1-0", orjson.dumps({"id": tid, "task_type": "noop"}).decode()
    )
    rules = ClaimRules("host_1", {"noop"}, 3, (), lambda owners: set(), strikes=(stale,))
    with connection():
        plan = validate_and_claim([entry], rules)
    assert [c.task_id for c in plan.claimed] == [tid] and plan.held == []
    assert rows([tid])[tid]["status"] == RUNNING


@rule("strikes.mirror-and-restore")
async def test_rules_are_reloaded_after_a_redis_reconnect_and_the_outage_is_counted(xsettings, db, tmp_path):
    with PrivateRedis(tmp_path) as server:
        port = free_port()
        settings = xsettings.replace(redis_url=server.url, metrics_port=port)
        async with running_daemon(settings, "host_1") as daemon:
            with unit():  # a rule written while the mirror could not be told (its version never moved)
                Strike.create(task_type="noop", version=1)
            await trio.sleep(1.0)
            assert daemon.strikes.rules == ()  # the version did not move: nothing to reload yet
            server.kill()
            await trio.sleep(0.5)
            server.start()
            await _until_rules(daemon, 1, within_s=10.0)
            assert total(scrape(port), "ingest_redis_disruptions_total") > 0
