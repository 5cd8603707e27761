"""``ingest dead list|replay|purge``: dead letters made by a real executor are listed with their
reason and delivery count; a replay re-queues the dead row and publishes it afresh (the entry
stays, marked replayed) and the task then runs; only purge removes entries."""

from __future__ import annotations

import orjson
import pytest

from db.models import DEAD, DONE, QUEUED
from ingest.cli import main
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule


def _cli(settings, capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(
        [
            "--db-url",
            settings.db_url,
            "--redis-url",
            settings.redis_url,
            "--key-prefix",
            settings.key_prefix,
            *args,
        ]
    )
    out = capsys.readouterr()
    return code, out.out, out.err


async def _make_dead_letters(xsettings, streams, rclient, keys):
    """A malformed message, an unknown task type and a task handed back too often."""
    rclient.xadd(keys.queue(0), {"message": "{not json"})
    unknown, capped = enqueue(streams, [task_spec("no_such_type"), task_spec("noop", handback_count=5)])
    async with running_daemon(xsettings.replace(max_deliveries=3), "host_1"):
        await await_until(lambda: rclient.xlen(keys.dead) == 3, 15)
    return unknown, capped


@rule("errors.dead-letters")
async def test_list_shows_each_dead_letter_with_its_reason_and_deliveries(
    xsettings, streams, rclient, keys, db, capsys
):
    unknown, capped = await _make_dead_letters(xsettings, streams, rclient, keys)
    code, out, _ = _cli(xsettings, capsys, "dead", "list", "--json")
    assert code == 0
    letters = {d["task_id"]: d for d in orjson.loads(out)}
    assert set(letters) == {"", unknown, capped}
    assert letters[""]["reason"].startswith("not JSON") and letters[""]["message"] == "{not json"
    assert letters[unknown]["reason"] == "unknown task_type 'no_such_type'"
    assert (
        letters[capped]["reason"].startswith("gave up after 5 deliveries")
        and letters[capped]["deliveries"] == 5
    )
    assert all(d["time"] > 0 and d["id"] and d["replayed_at"] is None for d in letters.values())
    code, out, _ = _cli(xsettings, capsys, "dead", "list")
    assert code == 0 and "gave up after 5 deliveries" in out and "3 dead letter(s)" in out


@rule("errors.dead-letters")
async def test_replay_requeues_the_dead_row_publishes_it_and_the_task_runs(
    xsettings, streams, rclient, keys, db, capsys
):
    _, capped = await _make_dead_letters(xsettings, streams, rclient, keys)
    letters = {d["task_id"]: d for d in orjson.loads(_cli(xsettings, capsys, "dead", "list", "--json")[1])}
    entry = letters[capped]["id"]
    dead_row = row(capped)
    assert dead_row["status"] == DEAD
    code, out, _ = _cli(xsettings, capsys, "dead", "replay", entry, "--json")
    assert code == 0
    result = orjson.loads(out)
    assert result["replayed"] == [[entry, capped]] and result["published"] == 1
    queued = row(capped)
    assert (
        queued["status"] == QUEUED
        and queued["attempt"] == dead_row["attempt"]
        and queued["handback_count"] == 0
    )
    assert f"re-queued by dead replay of entry {entry}" in queued["progress_msg"]
    assert rclient.exists(keys.published(capped)) and rclient.xlen(keys.dead) == 3  # the entry stays
    replayed = {d["id"]: d for d in orjson.loads(_cli(xsettings, capsys, "dead", "list", "--json")[1])}
    assert replayed[entry]["replayed_at"] > 0
    code, _, err = _cli(xsettings, capsys, "dead", "replay", entry)
    assert code == 1 and "task" in err and "is queued; only dead tasks are replayed" in err
    async with running_daemon(xsettings.replace(max_deliveries=3), "host_1"):
        await await_until(lambda: row(capped)["status"] == DONE, 15)


async def test_replay_all_skips_what_cannot_be_replayed_and_an_unknown_entry_fails(
    xsettings, streams, rclient, keys, db, capsys
):
    unknown, capped = await _make_dead_letters(xsettings, streams, rclient, keys)
    code, out, err = _cli(xsettings, capsys, "dead", "replay", "--all", "--json")
    assert code == 0
    result = orjson.loads(out)
    assert sorted(t for _, t in result["replayed"]) == sorted([unknown, capped])
    assert len(result["skipped"]) == 1 and "names no task" in result["skipped"][0][1]
    assert "not replayed" in err
    code, _, err = _cli(xsettings, capsys, "dead", "replay", "1-1")
    assert code == 1 and "no dead letter '1-1'" in err
    code, _, err = _cli(xsettings, capsys, "dead", "replay")
    assert code == 2
    # no executor runs here: clear what the replay published
    rclient.xtrim(keys.queue(0), maxlen=0)


@rule("errors.dead-letters")
async def test_only_purge_removes_dead_letters_and_only_older_ones(
    xsettings, streams, rclient, keys, db, capsys
):
    await _make_dead_letters(xsettings, streams, rclient, keys)
    _cli(xsettings, capsys, "dead", "replay", "--all")
    rclient.xtrim(keys.queue(0), maxlen=0)
    assert rclient.hlen(keys.dead_replayed) == 2
    code, out, _ = _cli(xsettings, capsys, "dead", "purge", "--older-than", "1h", "--json")
    assert code == 0 and orjson.loads(out)["removed"] == 0 and rclient.xlen(keys.dead) == 3
    code, out, _ = _cli(xsettings, capsys, "dead", "purge", "--older-than", "0s")
    assert code == 0 and "removed 3 dead letter(s)" in out
    assert rclient.xlen(keys.dead) == 0 and rclient.hlen(keys.dead_replayed) == 0
    with pytest.raises(SystemExit) as usage:
        _cli(xsettings, capsys, "dead", "purge", "--older-than", "soon")
    assert usage.value.code == 2
