"""A dataflow whose Extractor gives a chunk more metadata than ``chunk.meta`` holds (a regex
matching every character of a 20,000-character chunk) fails its task at the Extractor, on a real
executor: at once (not retried), with the component and the limit in the reason, before the
Embedder runs, and nothing written. It failed at the Indexer, after the embedding, with MariaDB's
raw ``DataError (1406, "Data too long for column 'meta'")``."""

from __future__ import annotations

import pytest
import trio

from db.database import unit
from db.models import DONE, FAILED
from db.models import Chunk as ChunkRow
from ingest.dataflow.catalog import create_dataflow
from ingest.producer import submit_documents
from ingest.store import MAX_META_BYTES
from tests.executor.support import row, running_daemon
from tests.fixtures_docs import embedder  # noqa: F401 - the model, loaded once per session

DSL = {
    "components": [
        {"id": "file", "type": "File"},
        {"id": "parse", "type": "Parser", "inputs": ["file"]},
        {"id": "split", "type": "Splitter", "inputs": ["parse"]},
        {
            "id": "grab",
            "type": "Extractor",
            "inputs": ["split"],
            "params": {"method": "regex", "pattern": "\\w", "all": True},
        },
        {"id": "embed", "type": "Embedder", "inputs": ["grab"]},
        {"id": "index", "type": "Indexer", "inputs": ["embed"]},
    ]
}


@pytest.mark.usefixtures("embedder")
async def test_metadata_over_the_limit_fails_the_task_at_its_extractor(settings):
    flow = create_dataflow(settings, "every-letter", DSL)
    word = b"a" * settings.max_chunk_chars  # one word: one chunk of max_chunk_chars
    (task,) = submit_documents(settings, [("word.txt", word)], "kb", dataflow_id=flow.id).task_ids
    async with running_daemon(settings):
        with trio.fail_after(120):
            while row(task)["status"] not in (DONE, FAILED):
                await trio.sleep(0.2)
    ended = row(task)
    log = ended["progress_msg"]
    assert ended["status"] == FAILED and ended["retry_count"] == 0, log
    assert "component 'grab' (Extractor): chunk 0's metadata is " in log
    assert f"over the limit of {MAX_META_BYTES} bytes" in log
    assert "Data too long" not in log and "embed (Embedder)" not in log  # failed before embedding
    with unit():
        assert ChunkRow.select().where(ChunkRow.task_id == task).count() == 0
