"""bench.claim_statements claims real task rows three ways on a database of its own: the figures
behind the closing note's "one round trip instead of two saves nothing" are real claims."""

from __future__ import annotations

from bench.claim_statements import WAYS, measure
from tests.conftest import MYSQL_BASE


def test_each_way_claims_its_rows_and_times_each_step():
    p50 = measure(MYSQL_BASE, rounds=3, gap_ms=1)
    assert set(p50) == set(WAYS)
    assert set(p50["separate"]) == {"begin", "select", "update", "commit", "total"}
    assert set(p50["multi"]) == set(p50["compound"]) == {"update+select", "total"}
    for steps in p50.values():
        assert all(v > 0 for v in steps.values())
        assert steps["total"] >= max(v for k, v in steps.items() if k != "total")
