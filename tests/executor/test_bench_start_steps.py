"""bench.start_steps splits each idle start into the executor's steps from wall-clock stamps:
the split telescopes (its steps add up to the whole latency), a hop that started two runs is
left out, and a real stamped executor stamps every step of every task."""

from __future__ import annotations

import pytest

from bench.start_steps import STEPS, measure, split


def _hop(t0: float, runs: int = 1) -> list[tuple[str, float, float]]:
    """One hop's stamps from ``t0`` (ms): dispatch, select, update, the trio hop, its runs."""
    out = [
        ("dispatch", t0 + 0.1, t0 + 0.6),
        ("select", t0 + 0.7, t0 + 1.5),
        ("update", t0 + 1.6, t0 + 2.2),
        ("trio_start", t0 + 2.5, t0 + 2.6),
    ]
    out += [("runner", t0 + 2.8 + 0.01 * i, t0 + 2.8 + 0.01 * i) for i in range(runs)]
    return out


def test_the_steps_of_a_task_add_up_to_its_latency():
    stamps = _hop(1000.0) + _hop(1040.0)
    returned = {"a": 1000.0, "b": 1040.0}
    first = {"a": 1003.0, "b": 1043.2}
    steps, whole, skipped = split(stamps, returned, first)
    assert skipped == 0
    assert whole == pytest.approx([3.0, 3.2])
    assert steps["dispatch"] == pytest.approx([0.5, 0.5])
    assert steps["select"] == pytest.approx([0.8, 0.8])
    assert steps["hop to trio"] == pytest.approx([0.3, 0.3])
    assert steps["to handler"] == pytest.approx([0.2, 0.4])
    for i in range(2):
        assert sum(steps[s][i] for s in STEPS) == pytest.approx(whole[i])


def test_a_task_not_alone_in_its_hop_or_without_stamps_is_left_out():
    stamps = _hop(1000.0, runs=2)
    steps, whole, skipped = split(stamps, {"a": 1000.0, "b": 900.0}, {"a": 1003.0, "b": 901.0})
    assert (whole, skipped) == ([], 2)
    assert all(v == [] for v in steps.values())


def test_a_stamped_executor_stamps_every_step_of_every_task():
    steps, whole, skipped = measure(n=6, rate=20)
    assert skipped == 0 and len(whole) == 6
    for step in STEPS:
        assert len(steps[step]) == 6, step
    for step in ("dispatch", "select", "update", "hop to trio", "runner starts"):
        assert all(v >= 0 for v in steps[step]), step
    assert all(0 < w < 1000 for w in whole)
