"""bench.observe_cost measures the executor's own metrics and tracing code, and bench.dispatch
pairs each run's drains: the figures its closing notes quote."""

from __future__ import annotations

import pytest

from bench.dispatch import paired_ratios
from bench.observe_cost import Costs, measure, tracing_cost


def test_per_task_cost_shares_a_scrape_among_the_seconds_tasks():
    costs = Costs(metrics_us=2.0, scrape_ms=3.0, trace_us=5.0, traced_us=45.0, ratio=0.1)
    assert costs.per_task_us("metrics", 1000.0) == pytest.approx(2.0 + 3.0)
    assert costs.per_task_us("tracing", 1000.0) == pytest.approx(5.0)
    assert costs.per_task_us("both", 3000.0) == pytest.approx(2.0 + 1.0 + 5.0)


def test_tracing_cost_grows_with_the_ratio():
    sampled, every = tracing_cost(0.0001, n=2000)
    assert every > 0 and sampled < every / 2  # nothing of the SDK runs for the tasks left out


def test_measure_prints_each_part():
    lines = measure("both", 0.1).lines()
    assert lines[0].startswith("in-process cost: metrics") and "ratio 0.1" in lines[1]
    assert measure("metrics", 0.1).trace_us is None


def test_paired_ratios_divide_each_run_by_its_own_baseline():
    assert paired_ratios([90.0, 200.0], [100.0, 200.0]) == [0.9, 1.0]
    with pytest.raises(ValueError):
        paired_ratios([1.0], [1.0, 2.0])
