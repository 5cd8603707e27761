"""``ingest model export``: the fp32 ONNX export of the embedding model's transformer, made here.

Never downloaded: :func:`export_model` loads the model with sentence-transformers (torch),
traces its transformer with ``torch.onnx.export`` (the TorchScript exporter, ``dynamo=False``:
the dynamo one needs onnxscript, and gives the same graph for a BERT), opset 17, dynamic batch
and sequence axes, into a temporary file beside its final place. It then encodes
:data:`~ingest.query_encoder.AGREEMENT_QUERIES` both ways, one at a time and padded in one
batch, with the very encoder a search uses (:class:`~ingest.query_encoder.OnnxQueryEncoder`),
and keeps the file only if every cosine is at least
:data:`~ingest.query_encoder.MIN_COSINE`: renamed into place with ``export.json`` (the model,
its files' signature, the cosines, the versions). Otherwise the file is removed and
``refused.json`` says why, so that every search says it too, and searches go through torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from db.config import Settings
from ingest import query_encoder as qe
from ingest.errors import PermanentError
from ingest.ids import embedding_identity, model_identity

OPSET = 17


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_model` did: ``made``, ``present`` or ``refused``, and where."""

    model: str
    state: str
    export_dir: str
    min_cosine: float | None = None
    cosines: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def export_model(
    settings: Settings, *, force: bool = False, min_cosine: float = qe.MIN_COSINE
) -> ExportResult:
    """Make the export of the settings' model unless an accepted one is there (``force``: remake).

    A refused export is tried again (a new onnxruntime may do better). Raises
    :class:`PermanentError` when the model has no local directory or a pipeline this encoder
    cannot run.
    """
    started = time.monotonic()
    model = settings.embedding_model
    lookup = qe.find_export(settings, model)
    if lookup.directory is None or lookup.export_dir is None:
        raise PermanentError(f"cannot export {model!r}: {lookup.reason}")
    if lookup.state == "ready" and not force:
        return ExportResult(model_identity(model), "present", str(lookup.export_dir))
    qe.read_pipeline(lookup.directory)  # refuse what the encoder cannot run before loading torch
    export_dir = lookup.export_dir
    export_dir.mkdir(parents=True, exist_ok=True)
    tmp = export_dir / f".{qe.ONNX_NAME}.{os.getpid()}.tmp"
    try:
        st_model = _load(model)
        _trace(st_model, tmp)
        cosines = _agreement(st_model, model, lookup.directory, tmp)
        worst = min(cosines.values())
        source = {"path": str(lookup.directory), "files": qe.files_signature(lookup.directory)}
        record = {
            "model": model_identity(model),
            "key": export_dir.name,
            "sources": [source],
            "cosines": cosines,
            "min_cosine": worst,
            "threshold": min_cosine,
            "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": _versions(),
        }
        if worst < min_cosine:
            query = min(cosines, key=cosines.__getitem__)
            reason = (
                f"minimum cosine {worst:.6f} < {min_cosine} (query {query!r}) against sentence-transformers"
            )
            (export_dir / qe.ONNX_NAME).unlink(missing_ok=True)
            (export_dir / qe.EXPORT_RECORD).unlink(missing_ok=True)
            qe.write_json_atomically(export_dir / qe.REFUSED_RECORD, {**record, "reason": reason})
            return ExportResult(
                model_identity(model), "refused", str(export_dir), worst, cosines, reason,
                time.monotonic() - started,
            )  # fmt: skip
        os.replace(tmp, export_dir / qe.ONNX_NAME)
        qe.write_json_atomically(export_dir / qe.EXPORT_RECORD, record)
        (export_dir / qe.REFUSED_RECORD).unlink(missing_ok=True)
        return ExportResult(
            model_identity(model), "made", str(export_dir), worst, cosines, "", time.monotonic() - started
        )
    finally:
        tmp.unlink(missing_ok=True)


def export_int8(settings: Settings, *, force: bool = False) -> ExportResult:
    """The int8 quantization of the settings' model's export (made first when missing), for
    ``INGEST_EMBEDDING_BACKEND=onnx-int8``: ONNX Runtime's dynamic quantization of the MatMul
    weights, per output channel (all ops per tensor: mean cosine 0.94 against torch on the demo
    chunks; MatMul per channel: 0.994, at 1.3x torch's encode speed on the demo chunks, 2x end to end). Checked on
    :data:`~ingest.query_encoder.AGREEMENT_QUERIES` like the export, and refused below
    :data:`~ingest.query_encoder.INT8_MIN_COSINE`; its vectors are ``{model}#onnx-int8``'s
    either way (see :func:`ingest.ids.embedding_identity`)."""
    started = time.monotonic()
    base = export_model(settings)
    if base.state == "refused":
        return base
    lookup = qe.find_export(settings)
    if lookup.export_dir is None or lookup.directory is None or lookup.onnx_path is None:
        raise PermanentError(f"cannot quantize {model_identity(settings.embedding_model)!r}: {lookup.reason}")
    export_dir, model = lookup.export_dir, settings.embedding_model
    identity = embedding_identity(model, "onnx-int8")
    if lookup.int8_ready() and not force:
        return ExportResult(identity, "present", str(export_dir))
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = export_dir / f".{qe.INT8_NAME}.{os.getpid()}.tmp"
    try:
        with _quiet(), _no_root_warnings():  # "consider pre-processing": a hint for CNNs
            quantize_dynamic(
                str(lookup.onnx_path),
                str(tmp),
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
            )
        cosines = _agreement(_load(model), model, lookup.directory, tmp)
        worst = min(cosines.values())
        record: dict[str, Any] = {
            "model": identity,
            "from": qe.ONNX_NAME,
            "quantization": "dynamic, int8 weights, per channel, MatMul only",
            "cosines": cosines,
            "min_cosine": worst,
            "threshold": qe.INT8_MIN_COSINE,
            "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": _versions(),
        }
        if worst < qe.INT8_MIN_COSINE:
            query = min(cosines, key=cosines.__getitem__)
            reason = f"int8 minimum cosine {worst:.4f} < {qe.INT8_MIN_COSINE} (query {query!r}) against torch"
            (export_dir / qe.INT8_NAME).unlink(missing_ok=True)
            qe.write_json_atomically(
                export_dir / qe.INT8_RECORD, {**record, "accepted": False, "reason": reason}
            )
            return ExportResult(
                identity, "refused", str(export_dir), worst, cosines, reason, time.monotonic() - started
            )
        os.replace(tmp, export_dir / qe.INT8_NAME)
        qe.write_json_atomically(export_dir / qe.INT8_RECORD, {**record, "accepted": True})
        return ExportResult(identity, "made", str(export_dir), worst, cosines, "", time.monotonic() - started)
    finally:
        tmp.unlink(missing_ok=True)


def _load(model: str) -> Any:
    from ingest.embedding import load_embedder

    return load_embedder(model)


def _trace(embedder: Any, path: Path) -> None:
    import torch

    transformer = embedder._st[0].auto_model

    class LastHidden(torch.nn.Module):
        """The transformer called by keyword (its positional order differs across versions)."""

        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.inner(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                return_dict=True,
            )
            return out.last_hidden_state

    # a padded batch, so no shortcut for an all-ones mask can be traced into the graph
    ids = torch.tensor([[101, 2000, 2001, 2002, 102], [101, 2003, 102, 0, 0]], dtype=torch.long)
    mask = (ids != 0).long()
    axes = {0: "batch", 1: "tokens"}
    with torch.no_grad(), _quiet():
        torch.onnx.export(
            LastHidden(transformer).eval(),
            (ids, mask, torch.zeros_like(ids)),
            str(path),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                "input_ids": axes,
                "attention_mask": axes,
                "token_type_ids": axes,
                "last_hidden_state": axes,
            },
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


class _quiet:
    """The TorchScript exporter's deprecation and tracer warnings are about its own future, not
    about this graph (the agreement check is what tells whether the graph is right)."""

    def __enter__(self) -> None:
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: Any) -> None:
        self._catch.__exit__(*exc)


@contextlib.contextmanager
def _no_root_warnings() -> Iterator[None]:
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _agreement(embedder: Any, model: str, directory: Path, onnx_path: Path) -> dict[str, float]:
    """Cosine of each check query's ONNX vector with sentence-transformers', alone and batched."""
    names = [name for name, _ in qe.AGREEMENT_QUERIES]
    texts = [text for _, text in qe.AGREEMENT_QUERIES]
    reference = embedder.encode(texts)
    onnx = qe.OnnxQueryEncoder(model, directory, onnx_path)
    if onnx.dim != reference.shape[1]:
        raise PermanentError(f"the ONNX encoder gives {onnx.dim} dimensions, the model {reference.shape[1]}")
    alone = np.stack([onnx.encode([t])[0] for t in texts])
    batched = onnx.encode(texts)
    cosines = {}
    for i, name in enumerate(names):
        cosines[name] = float(min(alone[i] @ reference[i], batched[i] @ reference[i]))
    return cosines


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "sentence-transformers", "transformers", "onnxruntime", "tokenizers", "onnx"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "absent"
    return found
