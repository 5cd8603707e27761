"""Issue 17 #3: dataflow fan-in. A component with several inputs takes them concatenated, so a
DSL of 45 Splitters over one Parser, all feeding one Extractor, held 45 copies of the document
(layered, 45 × 45), and reached a 4.5 GB MemoryError: the DSL checked only the number of
components. Now the DSL check counts the copies of the document each component would hold
(the paths from the File to it) and refuses more than ``MAX_COPIES``, and at run time every
component's output is held to a character budget (``Runtime.max_chars``, from the worker's
memory cap), failing the task with the component named."""

from __future__ import annotations

import pytest

from ingest.dataflow.components import FileInput, Runtime, run_worker_stage
from ingest.dataflow.dsl import MAX_COPIES, DslError, parse_dsl
from ingest.dataflow.runner import run_graph
from ingest.errors import BadDocument


def _fan_in(width: int, layers: int = 1) -> dict:
    components = [{"id": "file", "type": "File"}, {"id": "parse", "type": "Parser", "inputs": ["file"]}]
    below = ["parse"]
    splits = [f"split{i}" for i in range(width)]
    components += [{"id": s, "type": "Splitter", "inputs": below} for s in splits]
    below = splits
    for layer in range(layers):
        names = [f"x{layer}_{i}" for i in range(width if layer < layers - 1 else 1)]
        components += [{"id": n, "type": "Extractor", "inputs": below} for n in names]
        below = names
    components += [
        {"id": "embed", "type": "Embedder", "inputs": below},
        {"id": "index", "type": "Indexer", "inputs": ["embed"]},
    ]
    return {"components": components}


def test_a_fan_in_of_45_is_refused_at_validation_naming_the_component():
    with pytest.raises(DslError) as caught:
        parse_dsl(_fan_in(45))
    assert any(
        p.startswith("component 'x0_0' (Extractor) would hold 45 copies of the document")
        for p in caught.value.problems
    ), caught.value.problems


def test_layered_fan_in_is_counted_by_paths_not_by_inputs():
    with pytest.raises(DslError, match=r"'x1_0' \(Extractor\) would hold 9 copies"):
        parse_dsl(_fan_in(3, layers=2))  # 3 inputs each, 3 × 3 paths


def test_a_modest_fan_in_is_still_valid():
    graph = parse_dsl(_fan_in(MAX_COPIES))
    assert "x0_0" in graph.order


class _NoService:
    async def embed(self, texts, on_progress=None):  # pragma: no cover - never reached
        raise AssertionError("the budget stops the run before the Embedder")


async def _in_process(fn, *args, steps=1):
    return fn(*args)


async def test_at_run_time_a_component_past_the_character_budget_fails_naming_it():
    graph = parse_dsl(_fan_in(4))
    text = ("A line of text about beekeeping and hives. " * 20 + "\n\n") * 30  # ~26,000 characters
    file = FileInput("doc.txt", "txt", text.encode())
    rt = Runtime("unused-model", _NoService(), None, None, max_chars=60_000)  # type: ignore[arg-type]
    with pytest.raises(BadDocument, match=r"component 'x0_0' \(Extractor\).*more than 60000 characters"):
        await run_graph(graph, file, rt, lambda f, m: None, run_worker=_in_process)


def test_the_worker_stage_checks_each_output_against_the_budget():
    file = FileInput("doc.txt", "txt", b"word " * 5000)
    steps = [("parse", "Parser", {"format": "auto", "mark_headings": False}, ("file",))]
    assert run_worker_stage(steps, {"file": file}, "unused", {}, 0)["parse"]
    with pytest.raises(BadDocument, match=r"component 'parse' \(Parser\).*more than 1000 characters"):
        run_worker_stage(steps, {"file": file}, "unused", {}, 1000)
