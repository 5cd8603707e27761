"""A dataflow end to end on a real executor: ``ingest dataflow create``, ``ingest submit --dataflow``,
the executor runs the graph (progress per component), and the chunks are searchable like a
parsed document's, with deterministic ids and the Extractor's metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from db.database import unit
from db.models import Chunk, Task
from ingest.cli import main
from ingest.search import search
from ingest.store import chunk_id
from tests.executor.support import running_daemon
from tests.fixtures_docs import embedder  # noqa: F401 - the model, loaded once per session
from tests.ingest.factories import cli_args

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DSL = {
    "description": "Markdown cut at its headings; keywords and years onto each chunk",
    "components": [
        {"id": "file", "type": "File"},
        {"id": "parse", "type": "Parser", "inputs": ["file"]},
        {
            "id": "split",
            "type": "Splitter",
            "inputs": ["parse"],
            "params": {"method": "headings", "chunk_token_num": 128},
        },
        {"id": "keywords", "type": "Extractor", "inputs": ["split"], "params": {"top_n": 4}},
        {
            "id": "years",
            "type": "Extractor",
            "inputs": ["keywords"],
            "params": {"method": "regex", "pattern": r"\b(1[89]\d\d)\b", "field": "years", "all": True},
        },
        {"id": "embed", "type": "Embedder", "inputs": ["years"]},
        {"id": "index", "type": "Indexer", "inputs": ["embed"]},
    ],
}


@pytest.mark.usefixtures("embedder")
async def test_a_dataflow_runs_end_to_end_and_its_chunks_are_searchable(settings, tmp_path, capsys):
    path = tmp_path / "bees.json"
    path.write_text(json.dumps(DSL))
    assert main(["dataflow", "create", "bees", "--dsl", str(path), "--json", *cli_args(settings)]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["outcome"] == "created" and created["components"] == 7

    argv = [
        "submit",
        str(EXAMPLES / "beekeeping.md"),
        "--kb",
        "hives",
        "--dataflow",
        "bees",
        "--wait",
        "--json",
    ]
    async with running_daemon(settings):
        code = await trio.to_thread.run_sync(main, [*argv, "--timeout", "60", *cli_args(settings)])
    out, err = capsys.readouterr()
    assert code == 0, err
    (task_id,) = json.loads(out)["documents"][0]["task_ids"]

    with unit():
        task = Task.get_by_id(task_id)
        chunks = list(Chunk.select().where(Chunk.task_id == task_id).order_by(Chunk.position))
    assert task.task_type == "dataflow" and task.payload == {"dataflow_id": created["id"]}
    assert task.status == "done" and task.result["components"]["index"] == f"indexed {len(chunks)} chunks"
    for cid in ("file", "parse", "split", "keywords", "years", "embed", "index"):
        assert f" {cid} (" in task.progress_msg  # a progress line per component
    assert [c.id for c in chunks] == [chunk_id(task_id, i) for i in range(len(chunks))]
    assert task.chunk_ids.split() == [c.id for c in chunks]
    assert all(c.meta["headings"][0] == "Keeping Honeybees" and len(c.meta["keywords"]) == 4 for c in chunks)
    assert any(c.meta.get("years") == ["1973"] for c in chunks)

    (hit,) = await trio.to_thread.run_sync(
        lambda: search(settings, "hives", "a dance that encodes the direction and distance of food", k=1)
    )
    assert hit.doc_name == "beekeeping.md" and "waggle" in hit.content
    assert hit.chunk_id in task.chunk_ids.split()
