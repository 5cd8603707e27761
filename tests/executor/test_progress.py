"""Progress: in memory, written by one flusher, throttled, monotonic, with capped timestamped lines."""

from __future__ import annotations

import re

import trio

from db.models import DONE
from executor.progress import MAX_BYTES, MAX_LINES, Lines
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.lifecycle import rule


@rule("claim.progress-monotonic")
async def test_progress_only_rises_and_its_writes_are_throttled(xsettings, streams, db):
    steps = [0.1, 0.5, 0.3, 0.6, 0.2, 0.8, 0.4] * 5  # 35 reports over about 0.9 s, up and down
    (tid,) = enqueue(streams, [task_spec("progress", steps=steps, pause=0.025)])
    seen: list[float] = []
    async with running_daemon(xsettings.replace(progress_interval_s=0.25)) as daemon:
        with trio.fail_after(15):
            while (current := row(tid))["status"] != DONE:
                seen.append(current["progress"])
                await trio.sleep(0.02)
        flushes = daemon.flusher.statistics().flushes
    assert seen == sorted(seen) and max(seen) == 0.8
    assert 2 <= flushes <= 8  # ≈ one per interval, not one per report
    lines = row(tid)["progress_msg"].splitlines()
    assert sum("step " in line for line in lines) == len(steps)
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", line) for line in lines)
    assert row(tid)["progress"] == 1.0


def test_progress_lines_keep_the_tail_within_the_caps():
    lines = Lines("\n".join(f"old {i}" for i in range(10)))
    for i in range(MAX_LINES + 20):
        lines.add(f"line {i}")
    kept = lines.text().splitlines()
    assert len(kept) == MAX_LINES and kept[-1].endswith(f"line {MAX_LINES + 19}")
    big = Lines()
    for _ in range(30):
        big.add("x" * 900)
    assert len(big.text().encode()) <= MAX_BYTES and big.text().splitlines()[-1].endswith("x")


def test_a_progress_line_with_a_lone_surrogate_is_kept_with_a_question_mark():
    lines = Lines()
    lines.add("page 3: caf\u00e9 \ud800 end")
    assert lines.text().endswith("page 3: caf\u00e9 ? end\n")
    lines.text().encode("utf-8")  # storable
