"""The request bodies the API accepts, as pydantic models (their problems read as 422)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_TASKS_PER_CALL = 10_000
TaskId = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_-]+$")]
RowId = Annotated[str, Field(max_length=32, pattern=r"^[A-Za-z0-9_-]*$")]


class TaskIn(BaseModel):
    """One task to enqueue; fields beyond the row's columns are the type's message context."""

    model_config = ConfigDict(extra="allow")

    id: TaskId | None = None
    doc_id: RowId = ""
    kb_id: RowId = ""
    tenant_id: str | None = Field(None, description="ignored: a task is always the caller's tenant's")
    task_type: Annotated[str, Field(min_length=1, max_length=32)] = "parse"
    priority: Literal[0, 1] = 0
    from_page: Annotated[int, Field(ge=0, le=100_000_000)] = 0
    to_page: Annotated[int, Field(ge=0, le=100_000_000)] = 100_000_000
    generation: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    digest: Annotated[str, Field(max_length=32)] = ""
    payload: dict[str, Any] | None = None


class TasksIn(BaseModel):
    tasks: Annotated[list[TaskIn], Field(min_length=1, max_length=MAX_TASKS_PER_CALL)]


class SearchIn(BaseModel):
    kb: Annotated[str, Field(min_length=1, max_length=128)]
    q: Annotated[str, Field(min_length=1, max_length=10_000)]
    k: Annotated[int, Field(ge=1, le=1000)] = 5
    mode: Literal["dense", "keyword", "hybrid"] = "hybrid"
