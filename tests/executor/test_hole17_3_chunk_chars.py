"""Issue 17 #3: chunks get a character cap as well as a token cap, and a permanent error is
never retried. A 20 MB single line took 3 GB to chunk (a span object per token of one huge
text); one 20 MB "word" (one [UNK] token to the model's tokenizer) became one 20 MB chunk,
which MySQL refused as larger than ``max_allowed_packet`` ("server has gone away"), and the
task was retried until its timeout. Now text is cut into windows of at most
``max_chunk_chars`` before it is tokenized, no chunk is longer than that, and a row the server
refuses as too large fails its task at once."""

from __future__ import annotations

import subprocess
import sys

import peewee
import pytest
import trio
from peewee import fn

from db.config import Settings
from db.database import unit
from db.models import DONE, FAILED
from db.models import Chunk as ChunkRow
from executor.runner import retryable
from ingest.chunking import ChunkConfig, chunk_document
from ingest.parsers import Section
from ingest.producer import submit_documents
from tests.executor.support import row, running_daemon
from tests.fixtures_docs import embedder  # noqa: F401 - the model, loaded once per session
from tests.procs import ROOT

MODEL = Settings().embedding_model


def test_one_huge_word_becomes_chunks_of_at_most_max_chars():
    config = ChunkConfig(max_chars=1000, overlap_percent=0)
    chunks = chunk_document([Section("x" * 50_000), Section("then some words")], config, MODEL)
    assert max(len(c.content) for c in chunks) <= 1000 and len(chunks) >= 50
    assert "".join(c.content for c in chunks).replace("\n", "") == "x" * 50_000 + "then some words"


def test_many_long_words_are_not_merged_past_max_chars():
    words = " ".join(["y" * 500] * 200)  # 200 one-token words of 500 characters
    chunks = chunk_document([Section(words)], ChunkConfig(max_chars=2000, overlap_percent=0), MODEL)
    assert max(len(c.content) for c in chunks) <= 2000 and len(chunks) >= 50


def test_the_default_cap_is_the_setting():
    assert ChunkConfig().max_chars == Settings().max_chunk_chars == 20_000


PEAK = """
import re
from db.config import Settings
from ingest.chunking import ChunkConfig, chunk_document
from ingest.parsers import Section
text = "word " * 1_000_000  # a 5 MB single line
chunks = chunk_document([Section(text)], ChunkConfig(), Settings().embedding_model)
peak_kb = int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
print(peak_kb >> 10, max(len(c.content) for c in chunks))
"""  # VmHWM, not ru_maxrss: that one keeps the parent's peak across fork and exec


def test_a_long_single_line_is_chunked_in_bounded_memory():
    out = subprocess.run(
        [sys.executable, "-c", PEAK], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    peak_mb, longest = map(int, out.stdout.split())
    assert longest <= 20_000
    assert peak_mb < 300, f"peak RSS {peak_mb} MB for a 5 MB line"  # before: ~700 MB (3 GB at 20 MB)


@pytest.mark.usefixtures("embedder")
async def test_a_seventeen_megabyte_word_is_indexed_in_chunks_the_server_takes(settings):
    (task,) = submit_documents(settings, [("word.txt", b"w" * 17_000_000)], "kb").task_ids
    async with running_daemon(settings):
        with trio.fail_after(120):
            while row(task)["status"] not in (DONE, FAILED):
                await trio.sleep(0.2)
    ended = row(task)
    assert ended["status"] == DONE and ended["retry_count"] == 0, ended["progress_msg"]
    with unit():
        longest = (
            ChunkRow.select(fn.MAX(fn.LENGTH(ChunkRow.content))).where(ChunkRow.task_id == task).scalar()
        )
    assert longest <= settings.max_chunk_chars


def test_a_row_the_server_refused_as_too_large_is_not_retried():
    refused = peewee.OperationalError(1153, "Got a packet bigger than 'max_allowed_packet' bytes")
    try:
        try:
            raise refused
        except peewee.OperationalError:
            raise peewee.InterfaceError(0, "") from None  # the ROLLBACK on the closed connection
    except peewee.InterfaceError as exc:
        then = exc
    then.__context__ = refused
    assert not retryable(refused) and not retryable(then)
    assert retryable(peewee.OperationalError(2006, "MySQL server has gone away"))  # an outage still is


@pytest.mark.parametrize("method", ["tokens", "delimiter", "headings"])
def test_every_dataflow_splitter_holds_chunks_to_the_cap(method):
    from ingest.dataflow.components import REGISTRY, run_worker_stage

    params = {name: p.default for name, p in REGISTRY["Splitter"].params.items()}
    params["method"] = method
    steps = [("split", "Splitter", params, ("parse",))]
    sections = [Section("# Head\n" + "z" * 30_000 + " tail words " * 300)]
    out = run_worker_stage(steps, {"parse": sections}, MODEL, {}, 0, 1000)["split"]
    assert out.chunks and max(len(c.content) for c in out.chunks) <= 1000
