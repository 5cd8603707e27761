"""The query encoder without torch: the ONNX export agrees with sentence-transformers, searches
through it find what searches through torch find, and without it (missing or refused) a search
still answers, through torch, saying why in one line."""

# ruff: noqa: F811 - fixtures imported from their modules are parameters of the tests
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from db.config import Settings
from db.database import init_database
from ingest import query_encoder as qe
from ingest.batches import forward_batches
from ingest.errors import PermanentError
from ingest.model_export import export_model
from ingest.search import search
from tests.fixtures_docs import embedder, onnx_export  # noqa: F401 - the session's model and export
from tests.ingest.factories import cli_args, cli_env
from tests.ingest.test_search import corpus  # noqa: F401 - the demo documents, indexed once

ROOT = Path(__file__).resolve().parents[2]
MORE_TEXTS = [
    "",
    "   leading and trailing spaces   ",
    "ÉCOLE NORMALE SUPÉRIEURE",
    "x" * 3000,
    "\t\nnew\nlines\tand tabs",
]


def _ingest(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest", *args, *cli_args(settings)],
        cwd=ROOT,
        env={**os.environ, **cli_env(settings), "HF_HUB_OFFLINE": "1", **env},
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_export_agrees_with_sentence_transformers_on_the_fixed_queries(onnx_export, embedder):
    assert onnx_export["state"] in ("made", "present"), onnx_export  # present: made by an earlier init
    assert set(onnx_export["cosines"]) == {name for name, _ in qe.AGREEMENT_QUERIES}
    assert onnx_export["min_cosine"] >= qe.MIN_COSINE
    export_dir = Path(onnx_export["export_dir"])
    assert (
        export_dir.parent == Path(Settings.from_env(os.environ).home) / "models"
    )  # the session's INGEST_HOME
    made = {p.name for p in export_dir.iterdir()} - {qe.INT8_NAME, qe.INT8_RECORD}  # --int8's, if made first
    assert sorted(made) == [qe.EXPORT_RECORD, qe.ONNX_NAME]  # nothing half-written left beside them
    # checked again here, independently of the export's own record, on other texts as well
    lookup = qe.find_export(Settings.from_env(os.environ))
    assert lookup.state == "ready" and lookup.export_dir == export_dir
    onnx = qe.OnnxQueryEncoder(embedder.model, lookup.directory, lookup.onnx_path)
    texts = [t for _, t in qe.AGREEMENT_QUERIES] + MORE_TEXTS
    cosines = np.sum(onnx.encode(texts, batch_size=4) * embedder.encode(texts), axis=1)
    assert cosines.min() >= qe.MIN_COSINE, cosines
    assert (onnx.identity, onnx.dim, onnx.max_seq_length) == (embedder.identity, embedder.dim, 256)


def test_the_export_batches_longest_first_under_the_token_cap_each_row_its_own_text(onnx_export, embedder):
    lookup = qe.find_export(Settings.from_env(os.environ))
    onnx = qe.OnnxQueryEncoder(embedder.model, lookup.directory, lookup.onnx_path)
    texts = [t for _, t in qe.AGREEMENT_QUERIES] + MORE_TEXTS
    shapes: list[tuple[int, ...]] = []
    forward = onnx._encode_batch
    onnx._encode_batch = lambda ids, mask, types: (shapes.append(ids.shape), forward(ids, mask, types))[1]  # type: ignore[method-assign]
    batched = onnx.encode(texts, batch_size=4, max_tokens=64)
    lengths = [
        len(onnx._tokenizer.encode(t.lower() if onnx.pipeline.do_lower_case else t).ids) for t in texts
    ]
    assert shapes == [(len(b), lengths[b[0]]) for b in forward_batches(lengths, 4, 64)]
    long_alone, rest = shapes[0], shapes[1:]
    assert long_alone == (1, 256) and all(rows * width <= 64 for rows, width in rest)
    alone = np.concatenate([onnx.encode([t]) for t in texts])
    assert float(np.sum(batched * alone, axis=1).min()) > 0.99999  # in the call's order, unpadded


def test_a_batch_of_a_left_padding_tokenizer_keeps_every_real_token(onnx_export, embedder):
    lookup = qe.find_export(Settings.from_env(os.environ))
    onnx = qe.OnnxQueryEncoder(embedder.model, lookup.directory, lookup.onnx_path)
    onnx._tokenizer.enable_padding(direction="left", pad_id=0, pad_token="[PAD]")  # noqa: S106 - a token
    onnx._padded_left = True
    texts = ["short", "a somewhat longer text than the first one", "x", "mid length text here"]
    masks: list[np.ndarray] = []
    forward = onnx._encode_batch
    onnx._encode_batch = lambda ids, mask, types: (masks.append(mask), forward(ids, mask, types))[1]  # type: ignore[method-assign]
    onnx.encode(texts, batch_size=2)
    lengths = [len(onnx._tokenizer.encode(t.lower()).ids) for t in texts]
    assert [sorted(m.sum(axis=1).tolist(), reverse=True) for m in masks] == [
        [lengths[i] for i in b] for b in forward_batches(lengths, 2)
    ]  # each row's tokens all inside its batch's columns: the cut took the right end
    assert all(bool(m[:, -1].all()) for m in masks)


def test_the_pipeline_is_read_from_the_models_files(tmp_path, embedder):
    copy = tmp_path / "model"
    shutil.copytree(qe.model_dir(embedder.model), copy)
    pipeline = qe.read_pipeline(copy)
    assert (pipeline.max_seq_length, pipeline.pooling_modes, pipeline.dim, pipeline.normalize) == (
        256, ("mean_tokens",), 384, True
    )  # fmt: skip
    key = qe.files_key(copy)
    (copy / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 32, "do_lower_case": False})
    )
    (copy / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 384,
                "pooling_mode_cls_token": True,
                "pooling_mode_mean_tokens": True,
            }
        )
    )
    modules = json.loads((copy / "modules.json").read_text())
    (copy / "modules.json").write_text(json.dumps(modules[:2]))
    pipeline = qe.read_pipeline(copy)
    assert (pipeline.max_seq_length, pipeline.pooling_modes, pipeline.dim, pipeline.normalize) == (
        32, ("cls_token", "mean_tokens"), 768, False
    )  # fmt: skip
    assert qe.files_key(copy) != key  # another export for changed files
    (copy / "modules.json").write_text(json.dumps([*modules, {"type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(PermanentError, match="not Transformer, Pooling"):
        qe.read_pipeline(copy)


def test_search_finds_the_same_top_chunks_through_onnx_and_torch(corpus, onnx_export):
    from bench.chunk_size import QUESTIONS

    init_database(corpus.db_url)
    onnx, torch = corpus.replace(query_encoder="onnx"), corpus.replace(query_encoder="torch")
    assert isinstance(qe.query_encoder(onnx), qe.OnnxQueryEncoder)
    assert not isinstance(qe.query_encoder(torch), qe.OnnxQueryEncoder)
    for question, _, _ in QUESTIONS:
        by_onnx, by_torch = search(onnx, "kb", question, k=5), search(torch, "kb", question, k=5)
        assert [h.chunk_id for h in by_onnx] == [h.chunk_id for h in by_torch], question
        assert np.allclose([h.score for h in by_onnx], [h.score for h in by_torch], atol=1e-4)


def test_the_cli_search_answers_through_onnx_in_a_process_without_torch(corpus, onnx_export):
    code = (
        "import sys; from ingest.cli import main; rc = main(sys.argv[1:]); "
        "heavy = [m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules]; "
        "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "search", "--kb", "kb", "What is a senbazuru?", "--json", *cli_args(corpus)],
        cwd=ROOT, env={**os.environ, "INGEST_QUERY_ENCODER": "onnx"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "HEAVY []"
    assert json.loads(result.stdout)[0]["doc_name"] == "origami_basics.docx"


def test_without_an_export_the_cli_search_says_how_to_make_it_and_answers_through_torch(corpus, tmp_path):
    result = _ingest(
        corpus.replace(home=str(tmp_path)), "search", "--kb", "kb", "What is a senbazuru?", "--json"
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "Loading weights" not in line]
    assert len(lines) == 1 and "run `ingest model export`" in lines[0] and "through torch" in lines[0], lines
    assert json.loads(result.stdout)[0]["doc_name"] == "origami_basics.docx"
    forced = _ingest(
        corpus.replace(home=str(tmp_path)), "search", "--kb", "kb", "x", INGEST_QUERY_ENCODER="onnx"
    )
    assert forced.returncode == 1 and "INGEST_QUERY_ENCODER=onnx" in forced.stderr


def test_a_refused_export_is_not_kept_and_searches_say_why_and_answer_through_torch(
    corpus, tmp_path, embedder
):
    settings = corpus.replace(home=str(tmp_path))
    result = export_model(settings, min_cosine=1.5)  # no export can pass: the refusal path, for real
    assert result.state == "refused" and "minimum cosine" in result.reason and "< 1.5" in result.reason
    export_dir = Path(result.export_dir)
    assert sorted(p.name for p in export_dir.iterdir()) == [qe.REFUSED_RECORD]  # no model.onnx, no temp file
    lookup = qe.find_export(settings)
    assert (lookup.state, lookup.export_dir) == ("refused", export_dir)
    searched = _ingest(settings, "search", "--kb", "kb", "What is a senbazuru?", "--json")
    assert searched.returncode == 0, searched.stderr
    lines = [line for line in searched.stderr.splitlines() if "Loading weights" not in line]
    assert len(lines) == 1 and "was refused: minimum cosine" in lines[0] and "through torch" in lines[0], (
        lines
    )
    assert json.loads(searched.stdout)[0]["doc_name"] == "origami_basics.docx"


def test_an_export_present_is_found_by_its_files_and_kept(onnx_export, tmp_path):
    settings = Settings(home=str(Path(onnx_export["export_dir"]).parents[1]))
    again = export_model(settings)
    assert (again.state, again.export_dir) == ("present", onnx_export["export_dir"])
    assert qe.find_export(settings.replace(home=str(tmp_path))).state == "missing"


def test_init_finds_the_export_present_and_leaves_it(settings, onnx_export, capsys):
    from ingest.cli import main

    assert main(["init", "--json", *cli_args(settings)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model_export"] == {"state": "present", "export_dir": onnx_export["export_dir"]}
    assert data["changed"] is False
