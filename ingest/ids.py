"""Deterministic ids and digests (xxh128, 32 hex characters): the same inputs name the same row.

- a knowledge base's id comes from (tenant, :func:`kb_key` of its name): names compare
  case-insensitively and without trailing spaces, on every backend, because the id (the primary
  key) is the only place two names are compared;
- a document's id from (knowledge base id, document name), so submitting the same file again
  re-parses that document instead of adding a second one;
- a task's id from (document id, its incarnation, page range, generation), so each submission
  is new work, and a document removed and submitted again under the same name (a new
  incarnation, generation 1 again) never gets the task ids of the removed one's runs;
- a task's digest from what its result depends on (content, model identity, chunking config,
  page range), so a finished task with the same digest can hand over its chunks;
- a dataflow's id from (tenant, name, DSL), so replacing its DSL gives it a new id (and new
  digests: chunks of the old pipeline are never taken over by the new one);
- a memory message's id (and the id of the task that saves it) from (memory id, source id),
  so saving the same message twice stores it once.
"""

from __future__ import annotations

import os
import unicodedata
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
import xxhash

DEFAULT_MAX_CHUNK_CHARS = 20_000  # Settings.max_chunk_chars's default (ingest.chunking.DEFAULT_MAX_CHARS)


def _hash(*parts: Any) -> str:
    # Canonical JSON keeps parts apart ("a", "bc" != "ab", "c") and dict order out of it.
    return xxhash.xxh128_hexdigest(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS))


def kb_key(kb_name: str) -> str:
    """What identifies a knowledge base's name: trailing spaces dropped, case folded
    (``str.casefold``, Unicode NFC before and after); accents and inner spaces are kept.

    The one rule for names: every lookup by name goes through :func:`kb_id`, so "Manuals",
    "manuals" and "MANUALS " are one knowledge base on MySQL and on SQLite alike (the
    database's collation never decides; its row keeps the display name first given).
    Raises ``ValueError`` for a name that is empty once its trailing spaces are gone."""
    key = unicodedata.normalize("NFC", unicodedata.normalize("NFC", kb_name).rstrip(" ").casefold())
    if not key:
        raise ValueError(f"a knowledge base name needs a character other than a space: {kb_name!r}")
    return key


def kb_id(tenant_id: str, kb_name: str) -> str:
    """The id of knowledge base ``kb_name`` of ``tenant_id`` (by :func:`kb_key`)."""
    return _hash("kb", tenant_id, kb_key(kb_name))


def doc_id(kb_id: str, name: str) -> str:
    """The id of the document called ``name`` in knowledge base ``kb_id``."""
    return _hash("doc", kb_id, name)


def task_id(doc_id: str, from_page: int, to_page: int, generation: int, incarnation: str = "") -> str:
    """The id of one page-range task of one generation of one incarnation of a document (a
    random id the document's row keeps from its first submit until it is removed; "" for a
    document written before incarnations, whose ids stay as they were)."""
    if not incarnation:
        return _hash("task", doc_id, int(from_page), int(to_page), int(generation))
    return _hash("task", doc_id, incarnation, int(from_page), int(to_page), int(generation))


def content_hash(data: bytes) -> str:
    """xxh128 of a document's bytes."""
    return xxhash.xxh128_hexdigest(data)


def model_identity(model: str) -> str:
    """How a knowledge base (and a task's digest) records its model: a hub name as is, a local
    copy by its last two path parts (the same model installed at another path on another host
    is the same model)."""
    path = os.path.expanduser(model)
    if not os.path.isdir(path):
        return model
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    return "/".join(p for p in parts[-2:] if p)


INT8_SUFFIX = "#onnx-int8"


def embedding_identity(model: str, backend: str = "torch") -> str:
    """The identity of the vectors ``backend`` (``INGEST_EMBEDDING_BACKEND``) makes of ``model``.
    torch and onnx share the model's: the fp32 export is kept only when its vectors agree with
    sentence-transformers' at cosine >= 0.9999. The int8 quantization's do not (minimum cosine
    0.990, mean 0.994 against torch on the demo chunks, under the 0.99 a shared identity would
    need with room to spare): they are a model of their own, ``{model}#onnx-int8``, and a
    knowledge base embedded by one is never searched with the other's query vectors."""
    identity = model_identity(model)
    return identity + INT8_SUFFIX if backend == "onnx-int8" else identity


def digest(
    content_hash: str,
    embedding_model: str,
    parser_config: Mapping[str, Any],
    from_page: int,
    to_page: int,
    *,
    task_type: str = "parse",
    dataflow_id: str | None = None,
    max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS,
) -> str:
    """What a task's chunks depend on; equal digests mean equal chunks.

    ``embedding_model`` is the model's identity (:func:`model_identity`), not where it is
    installed, so the same content submitted from another host or venv takes over the chunks.
    The task type and dataflow are part of it too: a dataflow's chunks are not a parse's; so is
    the character cap a chunk is cut at (``INGEST_MAX_CHUNK_CHARS``), only when it is not the
    default (digests made before it counted stay what they were).
    """
    cap = () if int(max_chunk_chars) == DEFAULT_MAX_CHUNK_CHARS else (int(max_chunk_chars),)
    return _hash(
        "digest",
        content_hash,
        embedding_model,
        dict(parser_config),
        int(from_page),
        int(to_page),
        task_type,
        dataflow_id or "",
        *cap,
    )


def dataflow_id(tenant_id: str, name: str, dsl: Mapping[str, Any]) -> str:
    """The id of dataflow ``name`` of ``tenant_id`` with this DSL."""
    return _hash("dataflow", tenant_id, name, dict(dsl))


def memory_message_id(memory_id: str, source_id: str, tenant_id: str = "default") -> str:
    """The row of message ``source_id`` in tenant ``tenant_id``'s memory ``memory_id`` (memory
    ids are the tenant's own: two tenants' memories of one name never share a row). The default
    tenant keeps the ids it had before tenants."""
    if tenant_id == "default":
        return _hash("memory", memory_id, source_id)
    return _hash("memory", tenant_id, memory_id, source_id)


def memory_task_id(memory_id: str, source_id: str, tenant_id: str = "default") -> str:
    """The task that saves message ``source_id`` into tenant ``tenant_id``'s memory ``memory_id``."""
    if tenant_id == "default":
        return _hash("memory-task", memory_id, source_id)
    return _hash("memory-task", tenant_id, memory_id, source_id)


def new_id() -> str:
    """A random 32-hex id, for tasks that name no input of their own."""
    return uuid.uuid4().hex
