"""The dashboard's history: task ends counted per minute from the updates channel's events,
the queue depth's largest sample, never more than an hour of buckets."""

from __future__ import annotations

import time

from ingest.api.dashboard.history import MINUTES, History, chart


def test_ends_are_counted_per_minute_and_hand_backs_are_not():
    history = History()
    for status in ("done", "done", "failed", "dead", "cancelled"):
        history.on_event({"task_id": "t", "status": status, "result_key": "k"})
    history.on_event({"task_id": "t", "status": "queued"})  # a hand-back: no result
    now = history.series()[-1]
    assert (now.finished, now.failed) == (2, 2)


def test_memory_stays_an_hour_of_buckets_however_long_it_runs():
    history = History()
    start = time.time() - 10 * 3600
    for minute in range(10 * 60):
        history.sample_depth(minute, now_s=start + minute * 60)
    assert len(history._buckets) == MINUTES
    series = history.series(now_s=start + (10 * 60 - 1) * 60)
    assert len(series) == MINUTES and series[-1].depth == 10 * 60 - 1 and series[0].depth == 9 * 60


def test_a_chart_scales_its_bars_to_the_largest_value():
    drawn = chart("x", [0, 5, 10], "done")
    heights = [b["h"] for b in drawn["bars"]]
    assert heights[0] == 0 and heights[2] == drawn["height"] and heights[1] == drawn["height"] / 2
    assert drawn["top"] == 10 and drawn["now"] == 10 and drawn["total"] == 15
