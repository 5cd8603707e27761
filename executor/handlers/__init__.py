"""Task handlers, one module per task type, and what they share within one executor.

Each module's ``make_handler(env)`` is called once per executor process (see
``executor.router``); objects every handler may use, such as the embedding service, are made
once and kept in ``env.resources``.
"""

from __future__ import annotations

from executor.context import ExecutorEnv
from ingest.embedding import EmbeddingService

EMBEDDING_SERVICE = "embedding_service"


def shared_embedding_service(env: ExecutorEnv) -> EmbeddingService:
    """The executor's one embedding service (made on first use, kept in ``env.resources``)."""
    service = env.resources.get(EMBEDDING_SERVICE)
    if service is None:
        service = EmbeddingService(
            env.settings.embedding_model,
            env.settings.embedding_batch,
            env.limiters.embed_limiter,
            on_encoded=env.metrics.embedded if env.metrics is not None else None,
        )
        env.resources[EMBEDDING_SERVICE] = service
    return service
