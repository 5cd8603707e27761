"""``GET|POST /v1/search``: the top chunks of a knowledge base for a query.

The first search loads the query encoder in this process (``ingest.query_encoder``: the model's
ONNX export, under a second, or sentence-transformers when there is none); every search runs
in a thread under the ``search_limiter`` (a few at once, their query encodes one at a time). It
is loaded there, never when the app is imported.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from ingest.api.auth import Caller, caller
from ingest.api.models import SearchIn
from ingest.api.runtime import Runtime

router = APIRouter(prefix="/v1", tags=["search"])


async def run_search(
    runtime: Runtime, kb: str, q: str, k: int, tenant_id: str, mode: str = "hybrid"
) -> list[dict[str, Any]]:
    """The hits of ``ingest.search.search`` as dicts, under the search limiter (the dashboard's
    retrieval box calls this too)."""

    def work() -> list[dict[str, Any]]:
        from ingest.search import search

        return [asdict(h) for h in search(runtime.settings, kb, q, k, tenant_id=tenant_id, mode=mode)]

    return await runtime.in_search(work)


async def _search(
    request: Request, kb: str, q: str, k: int, who: Caller, mode: str = "hybrid"
) -> dict[str, Any]:
    runtime: Runtime = request.app.state.runtime
    return {
        "kb": kb,
        "query": q,
        "k": k,
        "mode": mode,
        "hits": await run_search(runtime, kb, q, k, who.tenant_id, mode),
    }


@router.get("/search", responses={404: {"description": "no such knowledge base"}})
async def get_search(
    request: Request,
    kb: Annotated[str, Query(min_length=1, max_length=128)],
    q: Annotated[str, Query(min_length=1, max_length=10_000)],
    k: Annotated[int, Query(ge=1, le=1000)] = 5,
    mode: Annotated[Literal["dense", "keyword", "hybrid"], Query()] = "hybrid",
    who: Caller = Depends(caller),
) -> dict[str, Any]:
    """Hits (chunk_id, doc_id, doc_name, page, last_page, score, content), best first."""
    return await _search(request, kb, q, k, who, mode)


@router.post("/search", responses={404: {"description": "no such knowledge base"}})
async def post_search(request: Request, body: SearchIn, who: Caller = Depends(caller)) -> dict[str, Any]:
    """The same search with a JSON body ``{"kb", "q", "k", "mode"}``."""
    return await _search(request, body.kb, body.q, body.k, who, body.mode)
