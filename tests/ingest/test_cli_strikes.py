"""``ingest strike``, ``ingest strikes``, ``ingest restore``: rules stored, mirrored with a moving
version, listed with what they hold, restored; bad rules refused with the reason."""

from __future__ import annotations

import json

import peewee

from db.database import unit
from db.models import HELD, QUEUED, Task
from ingest.cli import main
from ingest.strikes import read_mirror
from tests.executor.support import enqueue, rows, task_spec
from tests.helpers import waiting
from tests.ingest.factories import cli_args
from tests.lifecycle import rule


def _json(capsys):
    return json.loads(capsys.readouterr().out)


def test_strike_list_and_restore_from_the_command_line(settings, streams, rclient, keys, db, capsys):
    args = cli_args(settings)
    assert main(["strike", "parse", "doc_type", "==", "pdf", "--json", *args]) == 0
    made = _json(capsys)
    assert made["created"] and made["mirrored"] and made["rule"]["rule"] == "parse doc_type == pdf"
    assert main(["strike", "parse", "doc_type", "==", "pdf", *args]) == 0
    assert "already in effect" in capsys.readouterr().out
    assert main(["strike", "tenant_id", "==", "acme", *args]) == 0
    assert "struck #" in capsys.readouterr().out
    mirror = read_mirror(rclient, keys)
    assert mirror.version == 3 and [r["field"] for r in mirror.rules] == ["doc_type", "tenant_id"]

    # a held row, as an executor leaves it
    (tid,) = enqueue(streams, [task_spec("parse", status=HELD)], publish=False)
    with unit():
        Task.update(strike_id=made["rule"]["id"]).where(Task.id == tid).execute()
    assert main(["strikes", "--json", *args]) == 0
    listed = _json(capsys)
    assert [(r["rule"], r["held"]) for r in listed] == [
        ("parse doc_type == pdf", 1),
        ("any type tenant_id == acme", 0),
    ]
    assert main(["strikes", *args]) == 0
    table = capsys.readouterr().out
    assert "doc_type == pdf" in table and "tenant_id == acme" in table

    assert main(["restore", "parse", "doc_type", "==", "pdf", "--json", *args]) == 0
    released = _json(capsys)
    assert released["task_ids"] == [tid] and released["published"] == 1
    assert rows([tid])[tid]["status"] == QUEUED and waiting(rclient, keys) == 1
    assert main(["restore", "--id", str(listed[1]["id"]), *args]) == 0
    assert "released 0 held task(s)" in capsys.readouterr().out
    assert main(["strikes", "--all", "--json", *args]) == 0
    assert [r["active"] for r in _json(capsys)] == [False, False]
    rclient.delete(keys.queue(0))  # the re-published entry: nobody reads it in this test


def test_bad_rules_and_unknown_strikes_fail_with_the_reason(settings, db, capsys):
    args = cli_args(settings)
    assert main(["strike", "parse", "doc_type", *args]) == 1
    assert "a rule is TASK_TYPE" in capsys.readouterr().err
    assert main(["strike", "colour", "==", "red", *args]) == 1
    assert "unknown field 'colour'" in capsys.readouterr().err
    assert main(["strike", "size", "=~", "1", *args]) == 1
    assert "unknown operator" in capsys.readouterr().err
    assert main(["restore", "--id", "999", *args]) == 1
    assert "no active strike #999" in capsys.readouterr().err
    assert main(["strikes", *args]) == 0
    assert "no strikes in effect" in capsys.readouterr().out


@rule("strikes.mirror-and-restore")
def test_a_restore_that_stopped_partway_is_finished_by_running_it_again(
    settings, streams, rclient, keys, db, capsys, monkeypatch
):
    args = cli_args(settings)
    assert main(["strike", "parse", "--json", *args]) == 0
    rule_id = _json(capsys)["rule"]["id"]
    held = enqueue(streams, [task_spec("parse", status=HELD) for _ in range(3)], publish=False)
    with unit():
        Task.update(strike_id=rule_id).where(Task.id.in_(held)).execute()

    # the database connection breaks after the first batch of releases
    import ingest.strikes as strikes_module

    real_appended, calls = strikes_module.appended, []

    def breaks_on_the_second_batch(*a):
        calls.append(a)
        if len(calls) == 2:
            raise peewee.OperationalError(2013, "Lost connection to MySQL server during query")
        return real_appended(*a)

    monkeypatch.setattr(strikes_module, "BATCH", 1)
    monkeypatch.setattr(strikes_module, "appended", breaks_on_the_second_batch)
    assert main(["restore", "parse", *args]) != 0
    capsys.readouterr()
    monkeypatch.setattr(strikes_module, "appended", real_appended)
    statuses = [rows(held)[t]["status"] for t in held]
    assert sorted(statuses) == [HELD, HELD, QUEUED]

    # the rule is inactive, yet listed (it still holds two), and restoring it again finishes
    assert main(["strikes", "--json", *args]) == 0
    (listed,) = _json(capsys)
    assert (listed["id"], listed["active"], listed["held"]) == (rule_id, False, 2)
    assert main(["strikes", *args]) == 0
    assert "run it again" in capsys.readouterr().out
    assert main(["restore", "parse", "--json", *args]) == 0
    released = _json(capsys)
    assert len(released["task_ids"]) == 2 and released["published"] == 2
    assert released["rules"][0]["id"] == rule_id
    assert {r["status"] for r in rows(held).values()} == {QUEUED}
    with unit():
        assert Task.select().where(Task.status == HELD).count() == 0
    assert main(["restore", "--id", str(rule_id), *args]) == 1  # nothing left to restore
    assert f"no active strike #{rule_id}" in capsys.readouterr().err
    assert main(["strikes", *args]) == 0
    assert "no strikes in effect" in capsys.readouterr().out
    rclient.delete(keys.queue(0))
