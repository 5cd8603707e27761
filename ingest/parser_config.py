"""Parser configs: a new knowledge base's, and a document's own (its knowledge base's plus what
the submission overrides). The chunking defaults live with the chunker that reads them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ingest.chunking import DEFAULT_PARSER_CONFIG

__all__ = ["DEFAULT_PARSER_CONFIG", "document_config", "new_kb_config"]


def new_kb_config(override: Mapping[str, Any] | None) -> dict[str, Any]:
    """The parser config a new knowledge base starts with: the defaults, then ``override``."""
    return {**DEFAULT_PARSER_CONFIG, **(override or {})}


def document_config(
    kb_config: Mapping[str, Any] | None, override: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A document's config: the defaults, its knowledge base's, then what this submission overrides."""
    return {**DEFAULT_PARSER_CONFIG, **(kb_config or {}), **(override or {})}
