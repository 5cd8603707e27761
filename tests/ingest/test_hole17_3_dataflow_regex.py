"""Issue 17 #3: a catastrophic-backtracking dataflow regex. ``(a+)+$`` on a run of ``a`` that
ends otherwise took exponential time in Python's ``re`` and was bounded only by the task
timeout. The Extractor's patterns run on RE2, a linear-time engine: the same pattern on the
same text answers at once. What RE2 cannot run in linear time (backreferences, lookaround)
is refused when the DSL is checked, naming the component, as is an over-long pattern."""

from __future__ import annotations

import time

import pytest

from ingest.chunking import Chunk
from ingest.dataflow.components import REGISTRY, ChunkSet, extract
from ingest.dataflow.dsl import DslError, parse_dsl
from ingest.worker import WorkerBudget, run_in_worker

EVIL = r"(a+)+$"


def _chunks(*texts: str) -> ChunkSet:
    return ChunkSet([Chunk(t, 0, 1, i) for i, t in enumerate(texts)], [{} for _ in texts])


def _params(**given):
    params = {name: p.default for name, p in REGISTRY["Extractor"].params.items()}
    return {**params, "method": "regex", **given}


def _dsl(pattern: str) -> dict:
    return {
        "components": [
            {"id": "file", "type": "File"},
            {"id": "parse", "type": "Parser", "inputs": ["file"]},
            {"id": "split", "type": "Splitter", "inputs": ["parse"]},
            {
                "id": "grab",
                "type": "Extractor",
                "inputs": ["split"],
                "params": {"method": "regex", "pattern": pattern},
            },
            {"id": "embed", "type": "Embedder", "inputs": ["grab"]},
            {"id": "index", "type": "Indexer", "inputs": ["embed"]},
        ]
    }


async def test_a_backtracking_pattern_answers_at_once():
    chunks = _chunks("a" * 40 + "!", "b" * 10_000 + "aaa")
    began = time.monotonic()
    out = await run_in_worker(extract, _params(pattern=EVIL), [chunks], budget=WorkerBudget(timeout_s=10))
    assert time.monotonic() - began < 8
    assert out.meta == [{}, {"match": "aaa"}]


def test_patterns_re2_cannot_run_are_refused_at_validation_naming_the_component():
    for pattern, why in ((r"(a)\1", "backreference"), (r"(?<=x)y", "lookaround"), (r"a(?=b)", "lookaround")):
        with pytest.raises(DslError) as caught:
            parse_dsl(_dsl(pattern))
        (problem,) = caught.value.problems
        assert problem.startswith("component 'grab' (Extractor): parameter 'pattern'"), problem
        assert "linear time" in problem and why in problem


def test_an_over_long_pattern_is_refused():
    with pytest.raises(DslError, match="at most 1000 characters"):
        parse_dsl(_dsl("a" * 1001))


def test_named_groups_ignore_case_and_every_match_still_work():
    chunks = _chunks("Paid 12 EUR, then 30 eur", "nothing")
    named = extract(_params(pattern=r"(?P<amount>\d+) (?P<cur>EUR)", ignore_case=True, all=True), [chunks])
    assert named.meta == [{"amount": ["12", "30"], "cur": ["EUR", "eur"]}, {}]
    first = extract(_params(pattern=r"(\d+) EUR", field="price"), [chunks])
    assert first.meta == [{"price": "12"}, {}]
    parse_dsl(_dsl(r"\b(1[5-9]\d\d|20\d\d)\b"))  # the README's example is valid
