"""The dataflow DSL is checked before it is stored: an unknown component type, an unknown
parameter, a cycle, an input nobody produces, no File, no sink: each rejected with a message
naming the component, by ``parse_dsl`` and by ``ingest dataflow create`` (which then stores
nothing)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from db.database import unit
from db.models import Dataflow
from ingest.cli import main
from ingest.dataflow.dsl import DslError, parse_dsl
from tests.ingest.factories import cli_args

VALID = {
    "description": "Markdown by headings, with keywords",
    "components": [
        {"id": "file", "type": "File"},
        {"id": "parse", "type": "Parser", "inputs": ["file"]},
        {"id": "split", "type": "Splitter", "inputs": ["parse"], "params": {"method": "headings"}},
        {"id": "keywords", "type": "Extractor", "inputs": ["split"], "params": {"top_n": 3}},
        {"id": "embed", "type": "Embedder", "inputs": ["keywords"]},
        {"id": "index", "type": "Indexer", "inputs": ["embed"]},
    ],
}


def changed(edit) -> dict:
    dsl = copy.deepcopy(VALID)
    edit(dsl["components"])
    return dsl


def component(components: list[dict], cid: str) -> dict:
    return next(c for c in components if c["id"] == cid)


INVALID = {
    "unknown type": (
        changed(lambda cs: component(cs, "split").update(type="Chunker")),
        "component 'split': unknown component type 'Chunker' (known: File, Parser, Splitter, Extractor, Embedder, Indexer)",
    ),
    "unknown parameter": (
        changed(lambda cs: component(cs, "split")["params"].update(size=100)),
        "component 'split' (Splitter): unknown parameter 'size' (parameters: method, chunk_token_num, "
        "overlap_percent, delimiter, max_heading_level)",
    ),
    "bad parameter value": (
        changed(lambda cs: component(cs, "split")["params"].update(overlap_percent=95)),
        "component 'split' (Splitter): parameter 'overlap_percent' must be an integer 0…90, not 95",
    ),
    "cycle": (
        changed(lambda cs: component(cs, "keywords").update(inputs=["split", "embed"])),
        "cycle: 'embed' → 'keywords' → 'embed' (component 'embed' would take its own output)",
    ),
    "input nobody produces": (
        changed(lambda cs: component(cs, "embed").update(inputs=["chunks"])),
        "component 'embed' (Embedder): its input 'chunks' is produced by no component",
    ),
    "no File": (
        changed(lambda cs: cs.pop(0)),
        "no File component: a dataflow starts from the input document",
    ),
    "no sink": (
        changed(lambda cs: cs.pop()),
        "no sink: the graph has no Indexer (a dataflow ends by indexing its chunks)",
    ),
    "dead end": (
        changed(lambda cs: cs.append({"id": "extra", "type": "Embedder", "inputs": ["split"]})),
        "component 'extra' (Embedder) is a dead end: no component takes its output",
    ),
    "wrong kind of input": (
        changed(lambda cs: component(cs, "index").update(inputs=["keywords"])),
        "component 'index' (Indexer) takes embedded chunks, but its input 'keywords' (Extractor) gives chunks",
    ),
    "method needs a parameter": (
        changed(lambda cs: component(cs, "keywords").update(params={"method": "regex"})),
        "component 'keywords' (Extractor): method 'regex' needs parameter 'pattern'",
    ),
}


def test_a_valid_dsl_becomes_a_graph_in_topological_order():
    graph = parse_dsl(VALID)
    assert graph.order == ("file", "parse", "split", "keywords", "embed", "index")
    assert (graph.source, graph.sink) == ("file", "index")
    assert graph.components["split"].params["chunk_token_num"] == 192  # defaults filled in
    assert graph.gives["keywords"] == "chunks" and graph.gives["embed"] == "embedded"


@pytest.mark.parametrize("case", sorted(INVALID))
def test_an_invalid_dsl_is_rejected_with_a_message_naming_the_component(case):
    dsl, message = INVALID[case]
    with pytest.raises(DslError) as caught:
        parse_dsl(dsl)
    assert any(p.startswith(message) for p in caught.value.problems), caught.value.problems


def test_every_problem_is_reported_at_once():
    def edit(cs: list[dict]) -> None:
        component(cs, "split")["type"] = "Chunker"
        component(cs, "parse")["params"] = {"speed": 1}

    dsl = changed(edit)
    with pytest.raises(DslError) as caught:
        parse_dsl(dsl)
    assert len(caught.value.problems) == 2 and str(caught.value).startswith("invalid dataflow: ")


@pytest.mark.parametrize("case", ["cycle", "no File", "unknown parameter"])
def test_create_refuses_an_invalid_dsl_and_stores_nothing(settings, tmp_path, capsys, case):
    dsl, message = INVALID[case]
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(dsl))
    code = main(["dataflow", "create", "flow", "--dsl", str(path), *cli_args(settings)])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("ingest: invalid dataflow: ") and message in err
    with unit():
        assert Dataflow.select().count() == 0


def test_the_readme_example_is_a_valid_dataflow():
    root = Path(__file__).resolve().parents[2]
    example = (root / "docs" / "dataflow-example.json").read_text()
    assert parse_dsl(json.loads(example)).order[-1] == "index"
    assert example.strip() in (root / "README.md").read_text()
