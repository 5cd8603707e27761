"""Stored dataflows: create (validated first), list, show, and find by name or id.

A dataflow's id derives from its tenant, name and DSL (:func:`ingest.ids.dataflow_id`), so the
same DSL created again changes nothing, and replacing a DSL (``replace=True``) gives the
dataflow a new id: tasks queued for the old one fail with "unknown dataflow id", and a document
submitted again never takes over chunks that the old pipeline made.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import orjson

from db.config import Settings
from db.database import connection, init_database, unit
from db.models import UNFINISHED_STATES, Dataflow, Task, now_ms
from ingest import ids
from ingest.dataflow.dsl import Graph, parse_dsl
from ingest.errors import InUse, NotFound

MAX_NAME_CHARS = 128
MAX_DSL_BYTES = 60_000  # the dsl column is TEXT (64 KiB)


@dataclass(frozen=True)
class Created:
    id: str
    name: str
    tenant_id: str
    components: int
    outcome: str  # "created" | "replaced" | "unchanged"
    replaced_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS:
        raise ValueError(f"a dataflow name has 1 to {MAX_NAME_CHARS} characters: {name!r}")
    return name


def create_dataflow(
    settings: Settings, name: str, dsl: Any, *, tenant_id: str = "default", replace: bool = False
) -> Created:
    """Validate ``dsl`` (:class:`~ingest.dataflow.dsl.DslError` lists what is wrong) and store it
    as ``name``. A name that exists with another DSL is refused unless ``replace``."""
    check_name(name)
    graph = parse_dsl(dsl)
    if len(orjson.dumps(dsl)) > MAX_DSL_BYTES:
        raise ValueError(f"the DSL is larger than {MAX_DSL_BYTES} bytes")
    new_id = ids.dataflow_id(tenant_id, name, dsl)
    init_database(settings.db_url)
    with unit():
        old = Dataflow.get_or_none((Dataflow.tenant_id == tenant_id) & (Dataflow.name == name))
        if old is not None and old.id == new_id:
            return Created(new_id, name, tenant_id, len(graph.order), "unchanged")
        if old is not None and not replace:
            raise ValueError(
                f"dataflow {name!r} already exists with another DSL (id {old.id}); "
                "use --replace to replace it (tasks queued for the old one will fail)"
            )
        now = now_ms()
        if old is not None:
            Dataflow.delete().where(Dataflow.id == old.id).execute()
        Dataflow.insert(
            id=new_id,
            tenant_id=tenant_id,
            name=name,
            dsl=dsl,
            create_time=old.create_time if old is not None else now,
            update_time=now,
        ).execute()
    if old is None:
        return Created(new_id, name, tenant_id, len(graph.order), "created")
    return Created(new_id, name, tenant_id, len(graph.order), "replaced", replaced_id=old.id)


def list_dataflows(settings: Settings, tenant_id: str | None = None) -> list[dict[str, Any]]:
    """Every dataflow (of ``tenant_id``, or all tenants), by tenant and name."""
    init_database(settings.db_url)
    with connection():
        query = Dataflow.select().order_by(Dataflow.tenant_id, Dataflow.name)
        if tenant_id is not None:
            query = query.where(Dataflow.tenant_id == tenant_id)
        rows = [r.to_dict() for r in query]
    for row in rows:
        row["components"] = len((row.get("dsl") or {}).get("components") or [])
        row.pop("dsl")
    return rows


def get_dataflow(settings: Settings, name: str, *, tenant_id: str = "default") -> dict[str, Any]:
    """The dataflow called ``name`` (or with this id) of ``tenant_id``; :class:`NotFound` if none."""
    init_database(settings.db_url)
    with connection():
        row = Dataflow.get_or_none((Dataflow.tenant_id == tenant_id) & (Dataflow.name == name))
        if row is None:
            row = Dataflow.get_or_none((Dataflow.id == name) & (Dataflow.tenant_id == tenant_id))
    if row is None:
        raise NotFound(
            f"no dataflow named {name!r} (tenant {tenant_id!r}); `ingest dataflow list` shows them"
        )
    return dict(row.to_dict())


def remove_dataflow(
    settings: Settings, name: str, *, tenant_id: str = "default", force: bool = False
) -> dict[str, Any]:
    """Remove the dataflow called ``name`` (or with this id) of ``tenant_id``; :class:`NotFound`
    if none. While unfinished tasks (queued, running or held) of the tenant name it, the removal
    is refused with :class:`InUse` unless ``force``: forced, those tasks fail with "unknown
    dataflow id" (as after a replace). The chunks it made stay (they belong to their documents)."""
    row = get_dataflow(settings, name, tenant_id=tenant_id)
    with unit():
        users = tasks_using(row["id"], tenant_id)
        if users and not force:
            raise InUse(f"dataflow {row['name']!r} (id {row['id']})", users)
        removed = Dataflow.delete().where(Dataflow.id == row["id"]).execute()
    return {
        "id": row["id"],
        "name": row["name"],
        "tenant_id": tenant_id,
        "removed": int(removed),
        "unfinished_tasks": len(users),
    }


def tasks_using(dataflow_id: str, tenant_id: str) -> list[str]:
    """Blocking, on the caller's connection: ids of the tenant's unfinished dataflow tasks whose
    payload names ``dataflow_id`` (read through the ``(tenant_id, status)`` index)."""
    query = Task.select(Task.id, Task.payload).where(
        (Task.tenant_id == tenant_id) & Task.status.in_(UNFINISHED_STATES) & (Task.task_type == "dataflow")
    )
    return sorted(r.id for r in query if (r.payload or {}).get("dataflow_id") == dataflow_id)


def load_dataflow(dataflow_id: str) -> dict[str, Any] | None:
    """Blocking, on the caller's connection: the dataflow row with this id, or None."""
    row = Dataflow.get_or_none(Dataflow.id == dataflow_id)
    return None if row is None else dict(row.to_dict())


def graph_of(row: dict[str, Any]) -> Graph:
    """A stored dataflow's graph (checked again: the registry may have changed since)."""
    return parse_dsl(row["dsl"])
