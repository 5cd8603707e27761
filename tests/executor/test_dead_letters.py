"""Garbage on the streams is dead-lettered with a reason while the executor keeps working."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from db.models import DEAD, DONE
from executor.claim import MAX_MESSAGE_BYTES, parse_message
from ingest.errors import BadMessage
from tests.executor.support import all_in, enqueue, row, running_daemon, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule

GARBAGE = {
    "not JSON": ({"message": "{not json"}, "not JSON"),
    "JSON array": ({"message": "[1, 2, 3]"}, "not a JSON object"),
    "no id": ({"message": '{"task_type": "noop"}'}, "no id"),
    "id not a string": ({"message": '{"id": 42}'}, "id must be a string"),
    "bad priority": ({"message": '{"id": "abc", "priority": 7}'}, "priority must be one of"),
    "bad task_type": ({"message": '{"id": "abc", "task_type": 3}'}, "task_type must be"),
    "no message field": ({"payload": "{}"}, "no message field"),
    "huge junk": ({"message": "x" * (MAX_MESSAGE_BYTES + 10)}, "message too large"),
}


@rule("validate.bad-messages")
async def test_garbage_of_every_kind_is_dead_lettered_while_good_tasks_finish(
    xsettings, streams, rclient, keys, db
):
    before = enqueue(streams, [task_spec("noop") for _ in range(3)])
    for fields, _ in GARBAGE.values():
        rclient.xadd(keys.queue(0), fields)
    (unknown,) = enqueue(streams, [task_spec("no_such_type")])
    after = enqueue(streams, [task_spec("noop") for _ in range(3)])
    async with running_daemon(xsettings) as daemon:
        await await_until(
            lambda: all_in(before + after, DONE) and rclient.xlen(keys.dead) == len(GARBAGE) + 1, 15
        )
        assert daemon.statistics().dead_lettered == len(GARBAGE) + 1
    reasons = [fields["reason"] for _, fields in rclient.xrange(keys.dead)]
    for _, expected in GARBAGE.values():
        assert sum(expected in r for r in reasons) == 1, (expected, reasons)
    assert (
        row(unknown)["status"] == DEAD and "unknown task_type 'no_such_type'" in row(unknown)["progress_msg"]
    )
    assert any("unknown task_type" in r for r in reasons)
    assert rclient.xlen(keys.queue(0)) == 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
messages = st.fixed_dictionaries(
    {}, optional={"id": json_values | st.text(max_size=70), "priority": json_values, "task_type": json_values}
)


@given(st.none() | st.text(max_size=200) | json_values.map(json.dumps) | messages.map(json.dumps))
@rule("validate.bad-messages")
def test_any_input_is_either_a_message_of_the_contract_or_bad(raw):
    try:
        msg = parse_message(raw)
    except BadMessage as exc:
        assert str(exc)
        return
    assert isinstance(msg, dict) and isinstance(msg["id"], str) and 0 < len(msg["id"]) <= 64
    assert msg.get("priority", 0) in (0, 1) and not isinstance(msg.get("priority"), bool)
    assert msg.get("task_type") is None or isinstance(msg["task_type"], str)


@pytest.mark.parametrize("raw", ['{"id": "a", "priority": true}', '{"id": ""}', '{"id": "a", "doc_id": 5}'])
def test_near_misses_are_bad(raw):
    with pytest.raises(BadMessage):
        parse_message(raw)


def test_a_row_that_finished_while_its_entry_was_buried_gets_no_dead_letter(streams, db):
    """A sweep takes an entry past the delivery cap and reads its row running under its old
    owner; that owner commits ``done`` before the bury's UPDATE. The fenced UPDATE changes
    nothing: the entry is acked (its owner's own ack can no longer), with no dead letter for a
    task that finished."""
    from db.database import unit
    from db.models import Task
    from db.streams import Entry
    from executor.claim import ClaimPlan, _bury

    (tid,) = enqueue(streams, [task_spec("noop")], publish=False)
    seen = row(tid) | {"status": "running", "attempt": 1}
    with unit():
        Task.update(status=DONE, progress=1.0, attempt=1).where(Task.id == tid).execute()
    entry = Entry("s", "1-1", json.dumps({"id": tid}), deliveries=4, reclaimed=True)
    plan = ClaimPlan()
    with unit():
        _bury([(entry, {"id": tid}, "gave up after 4 deliveries")], {tid: (seen, None, None)}, plan)
    assert [(a.entry_id, a.dead_reason) for a in plan.acks] == [("1-1", "")]
    assert row(tid)["status"] == DONE


def test_every_message_the_producer_makes_is_one_the_executor_reads(settings, db):
    """A payload at the producer's limit (its JSON bytes), written as escapes take the most
    characters (a memory message of quotes and newlines: 1.33 characters each): the message
    the executor reads stays within what it accepts. It once refused them as "too large",
    without their id, and the reconciler published the queued row again every pass."""
    from ingest.memory import save_message
    from ingest.producer import enqueue_tasks
    from ingest.publish import MAX_PAYLOAD_BYTES, task_message

    content = 'say "hi"\n' * 110_000  # 990,000 characters: under the memory message's cap
    tid = save_message(settings, "m1", "user", content, source_id="s1")
    msg = parse_message(json.dumps(task_message(row(tid))))
    assert msg["id"] == tid
    big = {"blob": "x" * (MAX_PAYLOAD_BYTES - 20)}
    (tid,) = enqueue_tasks(settings, [{"task_type": "noop", "payload": big}])
    assert parse_message(json.dumps(task_message(row(tid))))["id"] == tid
