"""The domain: the producer API (what application services call to enqueue), document parsers,
chunking, embedding, the knowledge-base store and search; its interfaces sit in sub-packages
(:mod:`ingest.cli`, the command line) and the domain imports none of them.

``import ingest`` stays light: no torch, no sentence-transformers, no parser library until used.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ingest.client import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]


def __getattr__(name: str) -> Any:
    # ``ingest.Client`` without importing the producer (peewee, redis) at ``import ingest``
    if name in __all__:
        from ingest import client

        return getattr(client, name)
    raise AttributeError(f"module 'ingest' has no attribute {name!r}")
