"""``ingest dataflow run`` goes through the queue and a real executor like any task, returns every
component's output (truncated) from the task's ``result``, and writes nothing to a knowledge
base: no chunk, no knowledge base, no document row; the stored bytes are removed after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from db.database import unit
from db.models import Chunk, Document, DocumentBlob, KnowledgeBase, Task
from ingest.cli import main
from ingest.dataflow.catalog import create_dataflow
from tests.executor.support import running_daemon
from tests.fixtures_docs import embedder  # noqa: F401 - the model, loaded once per session
from tests.ingest.factories import cli_args

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DSL = {
    "components": [
        {"id": "file", "type": "File"},
        {"id": "parse", "type": "Parser", "inputs": ["file"], "params": {"mark_headings": True}},
        {
            "id": "split",
            "type": "Splitter",
            "inputs": ["parse"],
            "params": {"method": "headings", "chunk_token_num": 32},
        },
        {"id": "terms", "type": "Extractor", "inputs": ["split"], "params": {"top_n": 3, "field": "terms"}},
        {"id": "embed", "type": "Embedder", "inputs": ["terms"]},
        {"id": "index", "type": "Indexer", "inputs": ["embed"]},
    ]
}


@pytest.mark.usefixtures("embedder")
async def test_a_debug_run_returns_every_components_output_and_writes_nothing(settings, capsys):
    create_dataflow(settings, "coffee", DSL)
    argv = ["dataflow", "run", "coffee", str(EXAMPLES / "coffee.html"), "--json", "--timeout", "60"]
    async with running_daemon(settings):
        code = await trio.to_thread.run_sync(main, [*argv, *cli_args(settings)])
    out, err = capsys.readouterr()
    assert code == 0, err
    run = json.loads(out)
    outputs = run["outputs"]
    assert run["status"] == "done" and list(outputs) == ["file", "parse", "split", "terms", "embed", "index"]
    assert outputs["file"]["name"] == "coffee.html" and outputs["file"]["bytes"] > 2000
    assert outputs["parse"]["kind"] == "sections" and "## Processing" in [
        s["text"] for s in outputs["parse"]["items"]
    ]
    split = outputs["split"]
    assert split["count"] > len(split["items"]) == 10 and split["truncated"]  # shown truncated
    assert all(len(item["text"]) <= 301 and item["token_num"] <= 32 for item in split["items"])
    assert ["From Green Bean to Espresso"] in [
        item.get("meta", {}).get("headings") for item in split["items"]
    ]
    assert all(len(item["meta"]["terms"]) == 3 for item in outputs["terms"]["items"])
    assert outputs["embed"]["dim"] == 384 and len(outputs["embed"]["items"][0]["vector_head"]) == 4
    assert outputs["index"] == {
        "type": "Indexer",
        "kind": "indexed",
        "chunks": split["count"],
        "written": False,
        "chunk_ids": [],
    }

    with unit():
        task = Task.get_by_id(run["task_id"])
        assert task.result["outputs"] == outputs and task.payload["debug"] is True
        assert "nothing indexed" in task.progress_msg
        assert Chunk.select().count() == 0 and KnowledgeBase.select().count() == 0
        assert Document.select().count() == 0 and DocumentBlob.select().count() == 0  # bytes removed


@pytest.mark.usefixtures("embedder")
async def test_the_debug_run_prints_outputs_for_a_person(settings, capsys):
    create_dataflow(settings, "coffee", DSL)
    argv = ["dataflow", "run", "coffee", str(EXAMPLES / "coffee.html"), "--timeout", "60"]
    async with running_daemon(settings):
        code = await trio.to_thread.run_sync(main, [*argv, *cli_args(settings)])
    out = capsys.readouterr().out
    assert code == 0
    assert (
        "── split (Splitter)" in out and '"written": false' in out and " done: debug run of 'coffee'" in out
    )
