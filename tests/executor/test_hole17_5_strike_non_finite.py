"""Issue 17 hole 5: a strike whose value is a non-finite number (``nan``, ``inf``) is refused at
``ingest strike`` with the reason, and one stored anyway (an older release, a hand-written row)
never holds a task: it is never compared, as a number or as text."""

from __future__ import annotations

import pytest
import trio

from db.bulk import bulk_insert_into_db
from db.database import unit
from db.models import DONE, Document, KnowledgeBase, Strike
from ingest.cli import main
from ingest.strikes import Rule, compare, mirror, strike
from tests.executor.support import all_in, enqueue, new_id, running_daemon, task_spec
from tests.helpers import await_until
from tests.ingest.factories import cli_args

NON_FINITE = ["nan", "NaN", "inf", "-inf", "+Infinity", "1e999", " inf "]


@pytest.mark.parametrize("value", NON_FINITE)
def test_ingest_strike_refuses_a_non_finite_number_with_the_reason(settings, value, capsys):
    code = main([*cli_args(settings), "strike", "--", "parse", "size", "<", value])  # -- for "-inf"
    _, err = capsys.readouterr()
    assert code == 1
    assert "not a finite number" in err and repr(value) in err
    with unit():
        assert Strike.select().count() == 0


def test_the_domain_refuses_it_too(settings):
    with pytest.raises(ValueError, match="not a finite number"):
        strike(settings, "parse", "size", ">=", "-inf")


@pytest.mark.parametrize(("op", "value"), [("<", "inf"), (">", "-inf"), ("!=", "nan"), ("<", "nan")])
def test_a_stored_non_finite_rule_never_matches(op, value):
    assert not Rule(1, "", "size", op, value).matches("parse", {}, {"size": 5_000_000})
    assert not compare(5_000_000, op, value)
    assert not compare("nan", op, "5")  # a non-finite field against a number is not compared either


def test_text_still_compares_as_text():
    assert compare("pdf", "==", "pdf") and compare("inf-manual", "!=", "x")


async def test_an_executor_runs_what_a_stored_non_finite_rule_would_hold(xsettings, streams, db):
    kb_id = new_id()
    bulk_insert_into_db(KnowledgeBase, [{"id": kb_id, "name": "kb"}])
    doc = new_id()
    bulk_insert_into_db(
        Document, [{"id": doc, "kb_id": kb_id, "name": "a.pdf", "doc_type": "pdf", "size": 10}]
    )
    with unit():
        Strike.create(task_type="noop", field="size", op="<", value="inf", active=True, version=1)
    await trio.to_thread.run_sync(mirror, xsettings)
    async with running_daemon(xsettings, "host_1") as daemon:
        assert len(daemon.strikes.rules) <= 1
        ids = enqueue(streams, [task_spec("noop", doc_id=doc, kb_id=kb_id)])
        await await_until(lambda: all_in(ids, DONE), 15)
