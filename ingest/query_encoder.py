"""Query encoding: a search's query turned into a vector without importing torch.

A knowledge base's chunks are embedded by the executor with sentence-transformers (torch); a
search embeds one query, and importing sentence-transformers costs a cold process 8 s against
milliseconds for the search itself. So the query side runs the same weights through ONNX
Runtime and the ``tokenizers`` package instead, over an fp32 ONNX export of the model's
transformer made on this machine by ``ingest model export`` (:mod:`ingest.model_export`). The
steps around the transformer are read from the model's own sentence-transformers files, never
hard-coded: the module pipeline (``modules.json``: Transformer, Pooling, an optional
Normalize), the truncation length (``sentence_bert_config.json``'s ``max_seq_length``, else the
smaller of the model's positions and the tokenizer's ``model_max_length``), lower-casing, the
pooling modes (``1_Pooling/config.json``) and the tokenizer (``tokenizer.json``, whose own
truncation and padding are replaced by those). Stored vectors do not change.

Exports live under ``INGEST_HOME/models/{key}/`` where ``key`` is an xxh128 of the model
directory's files (names and bytes; hidden files and ``onnx/``, ``openvino/`` folders left
out): ``model.onnx`` and ``export.json`` once accepted, ``refused.json`` (with the reason) when
its vectors did not agree with sentence-transformers'. Hashing 90 MB costs ~0.2 s, so each
export records the paths, sizes and mtimes of the files it was made from, and a lookup whose
files still match one of those takes it without hashing.

:func:`query_encoder` picks the encoder by ``INGEST_QUERY_ENCODER``: ``auto`` (ONNX when the
export is there and accepted, else torch with one warning line saying why and how to make
it), ``onnx`` (the export or an error) or ``torch`` (the executor's encoder). Both encoders
have ``identity``, ``dim`` and ``encode(texts)`` (normalised float32 rows).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import xxhash

from db.config import Settings
from ingest.batches import forward_batches
from ingest.errors import PermanentError
from ingest.ids import embedding_identity, model_identity

log = logging.getLogger(__name__)

ONNX_NAME = "model.onnx"
EXPORT_RECORD = "export.json"
REFUSED_RECORD = "refused.json"
MIN_COSINE = 0.9999  # an export whose vectors agree less with sentence-transformers' is refused
INT8_NAME = "model.int8.onnx"  # its int8 quantization (ingest model export --int8)
INT8_RECORD = "int8.json"
INT8_MIN_COSINE = 0.97  # a quantization agreeing less than this on the check set is refused
SKIPPED_DIRS = ("onnx", "openvino")  # other formats of the same weights: not what we export
SUPPORTED_MODULES = {
    "sentence_transformers.models.Transformer": "transformer",
    "sentence_transformers.models.Pooling": "pooling",
    "sentence_transformers.models.Normalize": "normalize",
}
POOLING_MODES = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens", "lasttoken")
EXPORT_HINT = "run `ingest model export` for a search without torch"
# The fixed query set each export is checked on (:mod:`ingest.model_export`): short, long (far
# past 256 word pieces: truncated), non-ASCII, code identifiers, and padded together in a batch.
AGREEMENT_QUERIES: tuple[tuple[str, str], ...] = (
    ("short", "queen bee"),
    ("question", "How do honeybees tell each other how far away the flowers are?"),
    (
        "long",
        " ".join(
            f"Paragraph {i}: the beekeeper inspects frame {i} for brood, pollen and capped honey, "
            "then checks the hive for varroa mites before winter."
            for i in range(40)
        ),
    ),
    ("non-ascii", "Über die Brücke zum Café: naïve façade, 東京の灯台, Ελληνικά, Привет мир, emoji 🐝"),
    ("code", "def load_embedder(model: str) -> Embedder: snake_case_name CamelCaseName kb_id__v2 0x1F"),
    ("symbols", "C++ && std::vector<int> ; SELECT * FROM chunk WHERE kb_id = ? -- 3.14e-5 % $HOME"),
)


class Encoder(Protocol):
    """What search needs of a query encoder (:class:`OnnxQueryEncoder` or the torch Embedder)."""

    identity: str
    dim: int

    def encode(self, texts: Sequence[str], batch_size: int = 32, *, max_tokens: int = 0) -> np.ndarray: ...


# -- the model directory and its export ------------------------------------------------------


def model_dir(model: str) -> Path | None:
    """The local directory of ``model`` (a path, or a hub name found in the local cache)."""
    path = Path(os.path.expanduser(model))
    if path.is_dir():
        return path.resolve()
    try:  # a hub name: only what the local cache already holds, never a download
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True)).resolve()
    except Exception:  # noqa: BLE001 - not installed, not cached, not a hub name: no directory
        return None


def model_files(directory: Path) -> list[Path]:
    """The files an export's key covers, sorted: all but hidden ones and other formats' folders."""
    found = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if any(p.startswith(".") for p in rel.parts) or rel.parts[0] in SKIPPED_DIRS:
            continue
        if path.is_file():
            found.append(path)
    return found


def files_signature(directory: Path) -> list[list[Any]]:
    """``[relative path, size, mtime_ns]`` of each of :func:`model_files`: cheap to compare."""
    rows = []
    for path in model_files(directory):
        st = path.stat()
        rows.append([str(path.relative_to(directory)), st.st_size, st.st_mtime_ns])
    return rows


def files_key(directory: Path) -> str:
    """xxh128 over the names and bytes of :func:`model_files` (reads them all)."""
    digest = xxhash.xxh3_128()
    for path in model_files(directory):
        digest.update(str(path.relative_to(directory)).encode() + b"\0")
        with path.open("rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def exports_root(settings: Settings) -> Path:
    return Path(os.path.expanduser(settings.home)) / "models"


@dataclass(frozen=True)
class ExportLookup:
    """Where ``model``'s export is, and what is there: ``ready``, ``refused`` or ``missing``."""

    model: str
    directory: Path | None  # the model's files (None: no local copy)
    export_dir: Path | None  # INGEST_HOME/models/{key} (None: no local copy to key)
    state: str
    reason: str = ""

    @property
    def onnx_path(self) -> Path | None:
        return self.export_dir / ONNX_NAME if self.export_dir else None

    @property
    def int8_path(self) -> Path | None:
        return self.export_dir / INT8_NAME if self.export_dir else None

    def int8_ready(self) -> bool:
        """The int8 quantization is there, made from this export and accepted."""
        if self.state != "ready" or self.export_dir is None:
            return False
        record = read_json(self.export_dir / INT8_RECORD)
        return bool(record and record.get("accepted")) and (self.export_dir / INT8_NAME).is_file()


def find_export(settings: Settings, model: str | None = None) -> ExportLookup:
    """The export of ``model`` (default: the settings' model) under ``INGEST_HOME``."""
    model = model or settings.embedding_model
    directory = model_dir(model)
    if directory is None:
        return ExportLookup(model, None, None, "missing", f"{model!r} is no local model directory")
    root = exports_root(settings)
    signature = files_signature(directory)
    export_dir = _by_signature(root, str(directory), signature)
    if export_dir is None:  # not seen with these files: key by their bytes
        export_dir = root / files_key(directory)
        if (export_dir / EXPORT_RECORD).is_file():
            _remember_source(export_dir, str(directory), signature)
    return _state(model, directory, export_dir)


def _state(model: str, directory: Path, export_dir: Path) -> ExportLookup:
    record = read_json(export_dir / EXPORT_RECORD)
    if record is not None and (export_dir / ONNX_NAME).is_file():
        return ExportLookup(model, directory, export_dir, "ready")
    refused = read_json(export_dir / REFUSED_RECORD)
    if refused is not None:
        return ExportLookup(model, directory, export_dir, "refused", str(refused.get("reason", "")))
    return ExportLookup(model, directory, export_dir, "missing", f"no ONNX export under {export_dir}")


def _records(root: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    if not root.is_dir():
        return
    for export_dir in root.iterdir():
        for name in (EXPORT_RECORD, REFUSED_RECORD):
            record = read_json(export_dir / name)
            if record is not None:
                yield export_dir, record


def _by_signature(root: Path, directory: str, signature: list[list[Any]]) -> Path | None:
    for export_dir, record in _records(root):
        for source in record.get("sources", []):
            if source.get("path") == directory and source.get("files") == signature:
                return export_dir
    return None


def _remember_source(export_dir: Path, directory: str, signature: list[list[Any]]) -> None:
    """Add this copy's file signature to the export's record (the last 8 copies are kept)."""
    record = read_json(export_dir / EXPORT_RECORD)
    if record is None:
        return
    sources = [s for s in record.get("sources", []) if s.get("path") != directory]
    record["sources"] = [*sources[-7:], {"path": directory, "files": signature}]
    try:
        write_json_atomically(export_dir / EXPORT_RECORD, record)
    except OSError as exc:  # a read-only home: the next lookup hashes again, nothing else
        log.debug("cannot update %s: %s", export_dir / EXPORT_RECORD, exc)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_atomically(path: Path, write: Any) -> None:
    """``write(file)`` into a temporary file beside ``path``, then rename it over ``path``: a
    reader sees the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the export from the host's other users
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    write_atomically(path, lambda f: f.write(json.dumps(data, indent=2, sort_keys=True).encode()))


# -- the model's sentence-transformers pipeline, from its files ------------------------------


@dataclass(frozen=True)
class Pipeline:
    """What sentence-transformers does around the transformer, as the model's files say."""

    max_seq_length: int
    do_lower_case: bool
    pooling_modes: tuple[str, ...]  # in sentence-transformers' order of concatenation
    dim: int
    normalize: bool
    tokenizer_path: Path


def read_pipeline(directory: Path) -> Pipeline:
    """The model's pipeline; :class:`PermanentError` for one this encoder cannot run."""
    modules = _json_list(directory / "modules.json")
    kinds = [SUPPORTED_MODULES.get(m.get("type", "")) for m in modules]
    if None in kinds or kinds[:2] != ["transformer", "pooling"] or kinds[2:] not in ([], ["normalize"]):
        types = [m.get("type") for m in modules]
        raise PermanentError(
            f"modules {types} are not Transformer, Pooling[, Normalize]: no ONNX query encoder"
        )
    transformer_dir = directory / (modules[0].get("path") or "")
    st_config = read_json(transformer_dir / "sentence_bert_config.json") or {}
    tokenizer_path = transformer_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise PermanentError(f"no tokenizer.json in {transformer_dir}: no ONNX query encoder")
    max_len = st_config.get("max_seq_length")
    if not max_len:
        positions = (read_json(transformer_dir / "config.json") or {}).get("max_position_embeddings")
        model_max = (read_json(transformer_dir / "tokenizer_config.json") or {}).get("model_max_length")
        max_len = min(int(n) for n in (positions, model_max, 10**9) if n)
    pooling = read_json(directory / (modules[1].get("path") or "") / "config.json") or {}
    modes = tuple(m for m in POOLING_MODES if pooling.get(f"pooling_mode_{m}"))
    if not modes or pooling.get("pooling_mode_weightedmean_tokens"):
        raise PermanentError(
            f"pooling {pooling} is not one this encoder runs (cls, max, mean, mean_sqrt_len, last)"
        )
    return Pipeline(
        max_seq_length=int(max_len),
        do_lower_case=bool(st_config.get("do_lower_case", False)),
        pooling_modes=modes,
        dim=int(pooling["word_embedding_dimension"]) * len(modes),
        normalize=kinds[-1] == "normalize",
        tokenizer_path=tokenizer_path,
    )


def _json_list(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PermanentError(f"cannot read {path}: {exc}") from None
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []


def pool(hidden: np.ndarray, mask: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """Token vectors ``hidden`` (batch, tokens, width) pooled as sentence-transformers' Pooling."""
    weights = mask[..., None].astype(np.float32)
    counts = np.clip(weights.sum(axis=1), 1e-9, None)
    parts = []
    for mode in modes:
        if mode == "cls_token":
            parts.append(hidden[:, 0])
        elif mode == "max_tokens":
            parts.append(np.where(weights > 0, hidden, -1e9).max(axis=1))
        elif mode == "mean_tokens":
            parts.append((hidden * weights).sum(axis=1) / counts)
        elif mode == "mean_sqrt_len_tokens":
            parts.append((hidden * weights).sum(axis=1) / np.sqrt(counts))
        elif mode == "lasttoken":
            last = np.maximum(mask.sum(axis=1) - 1, 0)
            parts.append(hidden[np.arange(len(hidden)), last])
    return np.concatenate(parts, axis=1)


def _normalized(vectors: np.ndarray) -> np.ndarray:
    norms: np.ndarray = np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
    out: np.ndarray = vectors / norms
    return out


class OnnxQueryEncoder:
    """The model's transformer in ONNX Runtime, the rest of its pipeline in numpy."""

    def __init__(
        self, model: str, directory: Path, onnx_path: Path, *, threads: int = 0, identity: str = ""
    ) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        self.model = model
        self.identity = identity or model_identity(model)  # the int8 graph's vectors have their own
        self.pipeline = read_pipeline(directory)
        self.dim = self.pipeline.dim
        self.max_seq_length = self.pipeline.max_seq_length
        tokenizer = Tokenizer.from_file(str(self.pipeline.tokenizer_path))
        # tokenizer.json's own truncation (128 for all-MiniLM-L6-v2) and fixed padding are not
        # what sentence-transformers uses: its max_seq_length, padding to the longest text
        tokenizer.enable_truncation(max_length=self.max_seq_length, strategy="longest_first")
        pad_id = tokenizer.token_to_id("[PAD]")
        padding = tokenizer.padding or {}
        direction = str(padding.get("direction", "right")).lower()
        tokenizer.enable_padding(
            pad_id=int(padding.get("pad_id", pad_id or 0)),
            pad_type_id=int(padding.get("pad_type_id", 0)),
            pad_token=str(padding.get("pad_token", "[PAD]")),
            direction=direction,
        )
        self._padded_left = direction == "left"
        self._tokenizer = tokenizer
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads or _cpu_threads()
        options.log_severity_level = 3
        self._session = onnxruntime.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name for i in self._session.get_inputs()}

    def encode(self, texts: Sequence[str], batch_size: int = 32, *, max_tokens: int = 0) -> np.ndarray:
        """Normalised float32 rows, as the torch Embedder's ``encode`` gives them, batched as it
        batches: tokenized once, longest first, each forward batch at most ``batch_size`` texts
        and ``max_tokens`` tokens (0: no cap), cut to its longest text
        (:func:`ingest.batches.forward_batches`)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        texts = [t.lower() for t in texts] if self.pipeline.do_lower_case else list(texts)
        encodings = self._tokenizer.encode_batch(texts)  # padded to the longest text, on its tokenizer's side
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        lengths = [int(n) for n in mask.sum(axis=1)]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        seq = mask.shape[1]
        for rows in forward_batches(lengths, batch_size, max_tokens):
            width = lengths[rows[0]]  # the batch's real tokens are its first (or last) columns
            cut = slice(seq - width, seq) if self._padded_left else slice(0, width)
            out[rows] = self._encode_batch(ids[rows, cut], mask[rows, cut], types[rows, cut])
        return out

    def _encode_batch(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        hidden = self._session.run(None, {k: v for k, v in feed.items() if k in self._inputs})[0]
        vectors = pool(hidden.astype(np.float32), mask, self.pipeline.pooling_modes)
        if self.pipeline.normalize:
            vectors = _normalized(vectors)
        return _normalized(vectors)  # as sentence-transformers' normalize_embeddings=True


def _cpu_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


# -- which encoder a search uses --------------------------------------------------------------

_encoders: dict[tuple[str, ...], Encoder] = {}
_lock = threading.RLock()  # query_encoder -> _choose -> backend_encoder re-enters it


def query_encoder(settings: Settings) -> Encoder:
    """The process's query encoder for the settings' model (loaded once; blocking)."""
    key = (
        "query",
        settings.embedding_model,
        settings.home,
        settings.query_encoder,
        settings.embedding_backend,
    )
    with _lock:
        encoder = _encoders.get(key)
        if encoder is None:
            encoder = _encoders[key] = _choose(settings)
        return encoder


def encode_query(settings: Settings, query: str) -> np.ndarray:
    """``query``'s vector (normalised float32) by the settings' model."""
    vectors: np.ndarray = query_encoder(settings).encode([query])
    return vectors[0]  # type: ignore[no-any-return]  # numpy types an ndarray's row as Any


def backend_encoder(settings: Settings) -> Encoder:
    """The encoder ``INGEST_EMBEDDING_BACKEND`` names, for the executor's chunks (loaded once
    per process; blocking): torch, the fp32 export (``onnx``) or its int8 quantization
    (``onnx-int8``, identity ``{model}#onnx-int8``). An export that is not there is a
    :class:`PermanentError` saying which ``ingest model export`` makes it: never a silent
    fallback, since the backend decides what the vectors are."""
    backend = settings.embedding_backend
    if backend == "torch":
        return _torch(settings.embedding_model)
    key = ("backend", settings.embedding_model, settings.home, backend)
    with _lock:
        encoder = _encoders.get(key)
        if encoder is None:
            encoder = _encoders[key] = _load_backend(settings)
        return encoder


def _load_backend(settings: Settings) -> Encoder:
    model, backend = settings.embedding_model, settings.embedding_backend
    lookup = find_export(settings, model)
    int8 = backend == "onnx-int8"
    verb = "ingest model export --int8" if int8 else "ingest model export"
    if lookup.state != "ready" or lookup.directory is None or lookup.onnx_path is None:
        why = lookup.reason or f"the export of {model_identity(model)} is {lookup.state}"
        raise PermanentError(f"INGEST_EMBEDDING_BACKEND={backend} but {why}: run `{verb}` on this host")
    if not int8:
        return OnnxQueryEncoder(model, lookup.directory, lookup.onnx_path)
    if not lookup.int8_ready() or lookup.int8_path is None:
        record = read_json(lookup.export_dir / INT8_RECORD) if lookup.export_dir else None
        why = str(record.get("reason")) if record else f"no int8 quantization in {lookup.export_dir}"
        raise PermanentError(f"INGEST_EMBEDDING_BACKEND=onnx-int8 but {why}: run `{verb}` on this host")
    return OnnxQueryEncoder(
        model, lookup.directory, lookup.int8_path, identity=embedding_identity(model, backend)
    )


def _choose(settings: Settings) -> Encoder:
    model = settings.embedding_model
    if settings.embedding_backend == "onnx-int8":  # its vectors are their own: queries too
        return backend_encoder(settings)
    if settings.query_encoder == "torch":
        return _torch(model)
    lookup = find_export(settings, model)
    if lookup.state == "ready" and lookup.directory and lookup.onnx_path:
        try:
            return OnnxQueryEncoder(model, lookup.directory, lookup.onnx_path)
        except Exception as exc:  # noqa: BLE001 - a broken export must not break search in auto
            why = f"the ONNX export {lookup.onnx_path} cannot be loaded ({type(exc).__name__}: {exc})"
            if settings.query_encoder == "onnx":
                raise PermanentError(why) from None
            log.warning("%s; searching through torch (remake it: ingest model export --force)", why)
            return _torch(model)
    if lookup.state == "refused":
        why = f"the ONNX export of {lookup.model} was refused: {lookup.reason}"
        hint = "searching through torch"
    else:
        why = f"no ONNX export of {model_identity(model)} ({lookup.reason})"
        hint = f"{EXPORT_HINT}; searching through torch"
    if settings.query_encoder == "onnx":
        raise PermanentError(f"{why} and INGEST_QUERY_ENCODER=onnx: {EXPORT_HINT}")
    log.warning("%s: %s", why, hint)
    return _torch(model)


def _torch(model: str) -> Encoder:
    from ingest.embedding import load_embedder

    return load_embedder(model)
