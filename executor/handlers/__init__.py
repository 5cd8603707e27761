"""Task handlers, one module per task type, and what they share within one executor.

Each module's ``make_handler(env)`` is called once per executor process (see
``executor.router``); objects every handler may use, such as the embedding service, are made
once and kept in ``env.resources``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from db.config import Settings
from executor.context import ExecutorEnv, TaskContext
from ingest.embedding import Embedder, EmbeddingService, load_embedder
from ingest.errors import PermanentError
from ingest.storage import location_for

EMBEDDING_SERVICE = "embedding_service"


def shared_embedding_service(env: ExecutorEnv) -> EmbeddingService:
    """The executor's one embedding service (made on first use, kept in ``env.resources``)."""
    service = env.resources.get(EMBEDDING_SERVICE)
    if service is None:
        settings = env.settings
        service = EmbeddingService(
            settings.embedding_model,
            settings.embedding_batch,
            env.limiters.embed_limiter,
            max_tokens=settings.embedding_batch_tokens,
            # torch by default; INGEST_EMBEDDING_BACKEND=onnx|onnx-int8: the model's export
            loader=load_embedder if settings.embedding_backend == "torch" else partial(_backend, settings),
            on_encoded=env.metrics.embedded if env.metrics is not None else None,
        )
        env.resources[EMBEDDING_SERVICE] = service
    return service


def _backend(settings: Settings, _model: str) -> Embedder:
    from ingest.query_encoder import backend_encoder

    return backend_encoder(settings)  # type: ignore[return-value]  # the same interface (Encoder)


def owned_document(ctx: TaskContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """The task's document and knowledge base, from their rows, checked to be the task's
    tenant's, with the storage location that document's own (derived from its knowledge base,
    id and content hash): a task row naming another tenant's document never reads a byte."""
    if not ctx.doc:
        raise PermanentError(f"task {ctx.task_id} has no document (removed after submit?)")
    if not ctx.kb:
        raise PermanentError(
            f"document {ctx.doc.get('name')!r} has no knowledge base (removed after submit?)"
        )
    tenant = ctx.row.get("tenant_id") or "default"
    if {ctx.doc.get("tenant_id") or "default", ctx.kb.get("tenant_id") or "default"} != {tenant}:
        raise PermanentError(f"task {ctx.task_id} of tenant {tenant!r} names another tenant's document")
    if ctx.doc.get("kb_id") != ctx.kb["id"] or ctx.doc.get("location") != location_for(
        ctx.kb["id"], ctx.doc["id"], ctx.doc.get("content_hash") or ""
    ):
        raise PermanentError(f"document {ctx.doc['id']} names a storage location that is not its own")
    return ctx.doc, ctx.kb
