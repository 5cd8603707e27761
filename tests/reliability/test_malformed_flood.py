"""2,000 malformed messages mixed into 200 good ones: every good task finishes, every bad
message is in the dead-letter stream with its reason, and no executor exits or restarts."""

from __future__ import annotations

import random
import time

from db.keys import Keys
from executor.claim import MAX_MESSAGE_BYTES
from tests.helpers import wait_until
from tests.reliability.support import (
    Fleet,
    count_ended,
    create_completion_table,
    enqueue_recorded,
    exactly_once,
    fleet_settings,
    stream_state,
)

BAD = 2000
GOOD = 200
LONG_ID = "x" * 65

# (kind, fields of the stream entry, the reason the dead letter must give)
KINDS: list[tuple[str, dict[str, bytes | str], str]] = [
    ("not json", {"message": "{not json"}, "not JSON"),
    ("empty", {"message": ""}, "not JSON"),
    ("array", {"message": "[1, 2, 3]"}, "not a JSON object but list"),
    ("number", {"message": "42"}, "not a JSON object but int"),
    ("string", {"message": '"id"'}, "not a JSON object but str"),
    ("no id", {"message": '{"doc_id": "d"}'}, "no id"),
    ("id not a string", {"message": '{"id": 5}'}, "id must be a string"),
    ("id empty", {"message": '{"id": ""}'}, "id must be a string"),
    ("id too long", {"message": f'{{"id": "{LONG_ID}"}}'}, "id must be a string"),
    ("bad priority", {"message": '{"id": "abc", "priority": 7}'}, "priority must be one of"),
    ("bool priority", {"message": '{"id": "abc", "priority": true}'}, "priority must be one of"),
    ("bad task_type", {"message": '{"id": "abc", "task_type": 3}'}, "task_type must be a non-empty string"),
    ("bad doc_id", {"message": '{"id": "abc", "doc_id": 1}'}, "doc_id must be a string"),
    ("no message field", {"payload": "x"}, "no message field"),
    ("not utf-8", {"message": b"\xff\xfe\x00{garbage"}, "not JSON"),
]
HUGE = ("too large", {"message": "x" * (MAX_MESSAGE_BYTES + 1)}, "message too large")


def test_malformed_messages_are_dead_lettered_with_their_reason_while_good_tasks_finish(
    settings, streams, rclient, db, tmp_path
):
    began = time.monotonic()
    s = fleet_settings(settings, max_concurrent_tasks=8)
    keys = Keys(s.key_prefix)
    create_completion_table()
    rng = random.Random(2000)
    with Fleet(s, tmp_path) as fleet:
        for name in ("host_1", "host_2", "host_3"):
            fleet.start(name)
        pids = {n: p.pid for n, p in fleet.procs.items()}
        good = enqueue_recorded(streams, GOOD)  # published first; the bad ones land among them
        expected: dict[tuple[str, str], tuple[str, str]] = {}
        pipe = rclient.pipeline(transaction=False)
        bad = [HUGE, HUGE] + [rng.choice(KINDS) for _ in range(BAD - 2)]
        queues = [keys.queue(rng.choice((0, 1))) for _ in bad]
        for (_kind, fields, _), queue in zip(bad, queues, strict=True):
            pipe.xadd(queue, fields)
        for (kind, _, reason), queue, entry_id in zip(bad, queues, pipe.execute(), strict=True):
            expected[(queue, entry_id)] = (kind, reason)
        wait_until(lambda: rclient.xlen(keys.dead) == BAD and count_ended(good) == GOOD, 120)
        wait_until(lambda: stream_state(rclient, keys)["pending"] == 0, 30)
        fleet.assert_alive()
        assert {n: p.pid for n, p in fleet.procs.items()} == pids
        counts = exactly_once(good, crashed=set())
        counts.update(stream_state(rclient, keys))
        letters = rclient.xrange(keys.dead)
        codes = fleet.stop()
    wrong = []
    for _, letter in letters:
        kind, reason = expected.pop((letter["stream"], letter["entry"]))
        if reason not in letter["reason"]:
            wrong.append((kind, letter["reason"]))
    counts["kinds"] = len({k for k, _, _ in bad})
    counts["seconds"] = round(time.monotonic() - began, 1)
    print(f"\nmalformed flood: counts {counts}")
    assert not wrong, wrong[:5]
    assert not expected  # every bad message has its dead letter
    assert counts["dead_letters"] == BAD and counts["pending"] == 0 and counts["stream_entries"] == 0
    assert codes == {"host_1": 0, "host_2": 0, "host_3": 0}
