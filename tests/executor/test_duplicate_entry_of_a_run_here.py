"""A second entry of a task this executor holds is acked as a duplicate, never claimed again
under a new attempt beside the run: also while the run's outcome waits for its terminal write
(the run has left the book, its row is still running here), which a snapshot of the book taken
before the claim's read did not see."""

from __future__ import annotations

import orjson

from db.database import connection
from db.models import DONE, RUNNING
from db.streams import Entry
from executor.book import Book
from executor.claim import ClaimRules, validate_and_claim
from executor.context import Limiters
from executor.daemon import _RunningHere
from executor.finisher import Finisher, Outcome
from executor.outage import Outage
from tests.executor.support import enqueue, rows, task_spec


def _entry(streams, n: int, tid: str) -> Entry:
    return Entry(streams.keys.queue(0), f"{n}-0", orjson.dumps({"id": tid, "task_type": "noop"}).decode())


def test_an_entry_of_a_task_whose_outcome_waits_here_is_a_duplicate(xsettings, streams, db):
    (tid,) = enqueue(streams, [task_spec("noop")], publish=False)
    book = Book(2)
    finisher = Finisher(
        streams, "host_1", Limiters.for_settings(xsettings), book, Outage("database"), Outage("Redis")
    )
    here = _RunningHere(book, finisher)
    rules = ClaimRules("host_1", {"noop"}, 3, here, lambda owners: set())
    with connection():
        (claimed,) = validate_and_claim([_entry(streams, 1, tid)], rules).claimed
    book.start(claimed)
    assert tid in here
    book.finish(tid)  # the run ended; its outcome goes to the finisher, not yet written
    finisher.submit(Outcome(claimed, DONE, "done", 0.0))
    assert tid in here and tid not in book.running
    with connection():
        plan = validate_and_claim([_entry(streams, 2, tid)], rules)
    assert plan.claimed == [] and [a.task_id for a in plan.acks] == [tid]
    assert "duplicate of a task this executor is running" in plan.notes[-1].text
    assert (rows([tid])[tid]["status"], rows([tid])[tid]["attempt"]) == (RUNNING, 1)  # not claimed again
