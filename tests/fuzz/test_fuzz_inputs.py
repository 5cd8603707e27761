"""Fuzz (issue 17, "Kept so"): file bytes of every type and dataflow DSL documents drawn by
hypothesis. A parser either gives sections or refuses the bytes with a reason (``BadDocument``;
a library's own error is what the worker reports as "parser failed: …"); never a crash, a
hang or another kind of exception. A DSL is a graph or a ``DslError`` listing its problems.
The counts of each outcome are printed."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.dataflow.dsl import DslError, parse_dsl
from ingest.errors import BadDocument
from ingest.parsers import parse_document
from tests.fuzz.strategies import KINDS, dsl_documents, file_bytes

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))  # per type; more for a manual run
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@pytest.mark.parametrize("kind", KINDS)
def test_every_parser_gives_sections_or_a_reason(kind):
    outcomes: Counter[str] = Counter()

    @FUZZ
    @given(data=file_bytes(kind))
    def check(data: bytes) -> None:
        try:
            sections = parse_document(data, kind)
        except BadDocument as exc:
            assert str(exc), "a refusal without a reason"
            outcomes["refused (BadDocument)"] += 1
        except RecursionError:
            outcomes["nested too deeply (the worker's reason)"] += 1
        except Exception as exc:  # the worker reports these as "parser failed: Type: message"
            assert not isinstance(exc, (SystemExit, KeyboardInterrupt))
            outcomes[f"library error ({type(exc).__name__})"] += 1
        else:
            assert all(isinstance(s.text, str) and s.text.strip() for s in sections)
            outcomes["sections" if sections else "no text"] += 1

    check()
    print(f"\nfuzz {kind}: {sum(outcomes.values())} cases: {dict(outcomes)}")
    assert sum(outcomes.values()) >= min(EXAMPLES, 50)


def test_every_dsl_is_a_graph_or_a_list_of_problems():
    outcomes: Counter[str] = Counter()

    @FUZZ
    @given(dsl=st.one_of(dsl_documents(), dsl_documents()))
    def check(dsl) -> None:
        try:
            graph = parse_dsl(dsl)
        except DslError as exc:
            assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
            outcomes["refused"] += 1
        else:
            assert graph.components[graph.source].type == "File"
            assert graph.components[graph.sink].type == "Indexer"
            outcomes["valid"] += 1

    check()
    print(f"\nfuzz dsl: {sum(outcomes.values())} cases: {dict(outcomes)}")
    assert outcomes["refused"] and outcomes["valid"]
