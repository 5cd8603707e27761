"""Tenants: their limits, the checks a submit makes against them, and how each stands now.

Three limits, each a fleet-wide default from the settings with per-tenant overrides stored in
the ``tenant`` table (only the overrides: a changed default reaches every tenant without one):

- ``max_running`` (``INGEST_TENANT_MAX_RUNNING``, 5): tasks of the tenant running at once across
  the fleet, enforced by the fair gate (:mod:`db.gate`); 0 pauses the tenant;
- ``max_queued`` (``INGEST_TENANT_MAX_QUEUED``, 0 = no cap): unfinished tasks (queued, running,
  held); a submit that would go over it is refused before anything is written
  (:class:`~ingest.errors.TenantQueueFull`);
- ``max_docs`` (``INGEST_TENANT_MAX_DOCS``, 0 = no cap): documents in one submission
  (:class:`~ingest.errors.SubmissionTooLarge`).

The running cap is read by the gate's Lua from ``tenant:{t}:limits``, a mirror of the row,
trusted only while ``tenants:mirrored`` marks the mirror complete (:mod:`db.gate` admits nothing
without it). Only a complete copy of the table sets that mark (:func:`copy_limits`): executors
make one at start and whenever the mark is gone (a fresh Redis, one that lost its data), and
the reconciler's pass makes one every time (repairing whatever a failed copy left behind).
:func:`set_limits` copies its own tenant only, never the mark: after a loss, one tenant's
copy says nothing of the others'.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import peewee
import redis

from db.config import Settings
from db.database import init_database, lock_for_update, unit
from db.gate import Gate
from db.keys import Keys, check_tenant
from db.models import HELD, QUEUED, RUNNING, UNFINISHED_STATES, Task, Tenant, now_ms
from db.streams import connect
from ingest.errors import RetryableError, SubmissionTooLarge, TenantQueueFull

LIMITS = ("max_running", "max_queued", "max_docs")
COPY_ROUNDS = 3  # reads of the table a complete copy makes while set_limits keeps changing it


class MirrorError(RetryableError):
    """The limits are stored, but their copy into Redis failed (the gate may still apply the
    old ones); the message says what repairs it. Setting the same limits again is harmless."""


@dataclass(frozen=True)
class Limits:
    """A tenant's limits in effect, and which of them are its own overrides."""

    tenant_id: str
    max_running: int
    max_queued: int
    max_docs: int
    overrides: dict[str, int]

    @property
    def paused(self) -> bool:
        return self.max_running == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "paused": self.paused}


def defaults(settings: Settings) -> dict[str, int]:
    return {
        "max_running": settings.tenant_max_running,
        "max_queued": settings.tenant_max_queued,
        "max_docs": settings.tenant_max_docs,
    }


def _overrides(row: Tenant | None) -> dict[str, int]:
    if row is None:
        return {}
    return {name: int(getattr(row, name)) for name in LIMITS if getattr(row, name) is not None}


def _limits(settings: Settings, tenant_id: str, row: Tenant | None) -> Limits:
    own = _overrides(row)
    values = {**defaults(settings), **own}
    return Limits(tenant_id, values["max_running"], values["max_queued"], values["max_docs"], own)


def limits_of(settings: Settings, tenant_id: str) -> Limits:
    check_tenant(tenant_id)
    init_database(settings.db_url)
    with unit():
        return _limits(settings, tenant_id, Tenant.get_or_none(Tenant.id == tenant_id))


def set_limits(
    settings: Settings,
    tenant_id: str,
    changes: Mapping[str, int | None],
) -> Limits:
    """Store overrides (a value) or drop them (None: back to the default), then mirror the
    running cap into Redis and let the gate look at the tenant again. A copy that fails
    raises :class:`MirrorError` (the row is changed all the same): the mirror is marked
    incomplete where Redis lets it be, so that executors copy every tenant again at once."""
    check_tenant(tenant_id)
    for name, value in changes.items():
        if name not in LIMITS:
            raise ValueError(f"unknown limit {name!r}; limits are {', '.join(LIMITS)}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be a whole number, 0 or more, not {value!r}")
    init_database(settings.db_url)
    now = now_ms()
    with unit():
        Tenant.insert(id=tenant_id, create_time=now, update_time=now).on_conflict_ignore().execute()
        if changes:
            Tenant.update(**dict(changes), update_time=now).where(Tenant.id == tenant_id).execute()
        row = Tenant.get(Tenant.id == tenant_id)
    limits = _limits(settings, tenant_id, row)
    keys = Keys(settings.key_prefix)
    client = None
    try:
        client = connect(settings)
        mirror_limits(client, keys, [(tenant_id, limits.overrides)])
        Gate(client, keys).unpark([tenant_id])
    except redis.RedisError as exc:
        raise MirrorError(_not_mirrored(client, keys, tenant_id, exc)) from exc
    finally:
        if client is not None:
            client.close()
    return limits


def _not_mirrored(client: Any, keys: Keys, tenant_id: str, exc: Exception) -> str:
    """After a failed copy of one tenant's limits: drop the mark of a complete mirror, so that
    executors copy every tenant again (the gate admits nothing until one has); what to say."""
    stored = f"limits of tenant {tenant_id} stored, but not copied into Redis ({exc})"
    if client is not None:
        with contextlib.suppress(redis.RedisError):
            client.delete(keys.limits_mirrored)
            with contextlib.suppress(redis.RedisError):  # idle executors dispatch now, find the
                Gate(client, keys).wake()  # mark missing and copy (else within their 2 s block)
            return (
                f"{stored}; the mirror is marked incomplete: the gate admits no tenant's work "
                "until an executor has copied every tenant's limits again (at once while one runs)"
            )
    return (
        f"{stored}; the reconciler's next pass copies every tenant's limits again "
        "(or set these again once Redis answers)"
    )


def mirror_limits(client: Any, keys: Keys, rows: Sequence[tuple[str, Mapping[str, int]]]) -> None:
    """Write each tenant's overrides into ``tenant:{t}:limits`` (only what it overrides). It
    never marks the mirror complete: only :func:`copy_limits` does."""
    if not rows:
        return
    pipe = client.pipeline(transaction=True)
    for tenant_id, overrides in rows:
        pipe.delete(keys.limits(tenant_id))
        if overrides:
            pipe.hset(keys.limits(tenant_id), mapping={k: str(v) for k, v in overrides.items()})
    pipe.execute()


def copy_limits(client: Any, keys: Keys) -> list[str]:
    """A complete copy: every stored tenant's overrides into Redis where its copy differs, then
    the mark that the mirror is complete, and a wake-up of the fleet (the gate admitted nothing
    without it). Returns the tenants whose copy was written.

    Call on a connection *without* a transaction (``connection()``): the table is read again
    after the write and must show what committed since. A :func:`set_limits` that committed
    after the first read and wrote its copy before this one would otherwise be overwritten with
    the older value, for good; so while the second read differs the copy is made again, and the
    mark is set only after a read that matched. Still changing after :data:`COPY_ROUNDS` reads,
    the mark is dropped instead: the next pass copies again."""
    rows = all_overrides()
    written: dict[str, None] = {}  # in order, once each
    for _ in range(COPY_ROUNDS):
        stale = _differing(client, keys, rows)
        mirror_limits(client, keys, stale)
        written.update(dict.fromkeys(t for t, _ in stale))
        again = all_overrides()
        if again == rows:
            gate = Gate(client, keys)
            if not client.exists(keys.limits_mirrored):
                client.set(keys.limits_mirrored, "1")
                gate.wake()  # idle executors dispatch again now, not after their ≤ 2 s block
            gate.unpark(list(written))
            return list(written)
        rows = again
    client.delete(keys.limits_mirrored)  # still changing: the next look copies again
    return list(written)


def _differing(
    client: Any, keys: Keys, rows: Sequence[tuple[str, dict[str, int]]]
) -> list[tuple[str, dict[str, int]]]:
    """Those of ``rows`` whose copy in Redis is not exactly their overrides."""
    pipe = client.pipeline(transaction=False)
    for tenant_id, _ in rows:
        pipe.hgetall(keys.limits(tenant_id))
    copies = pipe.execute() if rows else []
    return [
        (tenant_id, overrides)
        for (tenant_id, overrides), copy in zip(rows, copies, strict=True)
        if copy != {k: str(v) for k, v in overrides.items()}
    ]


def all_overrides() -> list[tuple[str, dict[str, int]]]:
    """Every stored tenant with its overrides (call on a connection)."""
    return [(row.id, _overrides(row)) for row in Tenant.select().order_by(Tenant.id)]


# -- the checks a submit makes ---------------------------------------------------------------


def check_documents(settings: Settings, tenant_id: str, count: int) -> None:
    """Refuse a submission of more documents than the tenant's ``max_docs``, before any write."""
    limits = limits_of(settings, tenant_id)
    if limits.max_docs and count > limits.max_docs:
        raise SubmissionTooLarge("max_docs", limits.max_docs, count, tenant_id)


def unfinished_count(tenant_id: str) -> int:
    """The tenant's queued, running and held tasks (through the (tenant_id, status) index)."""
    return int(
        Task.select(peewee.fn.COUNT(Task.id))
        .where((Task.tenant_id == tenant_id) & Task.status.in_(UNFINISHED_STATES))
        .scalar()
        or 0
    )


def precheck_queue(settings: Settings, tenant_id: str, adding: Callable[[], int]) -> Limits:
    """Before anything is stored: refuse when even ``adding()`` more tasks (a lower bound,
    counted only when there is a cap) would go over ``max_queued``. Not a guarantee (no lock):
    :func:`check_queue` is, in the write."""
    limits = limits_of(settings, tenant_id)
    if limits.max_queued:
        with unit():
            queued = unfinished_count(tenant_id)
            adding_n = adding()
        if queued + adding_n > limits.max_queued:
            raise TenantQueueFull("max_queued", limits.max_queued, queued, tenant_id, adding_n)
    return limits


def lock_queue(tenant_id: str, limits: Limits) -> None:
    """Inside the submit's transaction, first: serialise the tenant's submits (its row,
    ``FOR UPDATE``) while it has a queued cap, so two submits cannot both pass the count."""
    if limits.max_queued:
        lock_for_update(Tenant.select(Tenant.id).where(Tenant.id == tenant_id)).execute()


def ensure_row(tenant_id: str) -> None:
    """The tenant's row, for :func:`lock_queue` (its own short transaction: inserting it inside
    the submit would take a lock that other submits then wait to upgrade)."""
    with unit():
        now = now_ms()
        Tenant.insert(id=tenant_id, create_time=now, update_time=now).on_conflict_ignore().execute()


def check_queue(tenant_id: str, limits: Limits, added: int) -> None:
    """Inside the submit's transaction, after its rows are written: over ``max_queued`` now
    (and this submission added unfinished tasks) → :class:`TenantQueueFull`; the caller's
    transaction rolls back."""
    if not limits.max_queued or added <= 0:
        return
    queued = unfinished_count(tenant_id)
    if queued > limits.max_queued:
        raise TenantQueueFull("max_queued", limits.max_queued, queued - added, tenant_id, added)


# -- how tenants stand ------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantStanding:
    """One tenant now: rows by state, live slots, waiting at the gate, its limits."""

    tenant_id: str
    queued: int
    running: int
    held: int
    slots: int  # live running slots at the gate
    backlog: int  # messages waiting at the gate
    parked: bool  # at its running cap (or paused), waiting for a slot
    max_running: int
    max_queued: int
    paused: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def standings(settings: Settings, tenant_ids: Sequence[str] | None = None) -> list[TenantStanding]:
    """Every tenant with unfinished tasks, stored limits or a place at the gate (or those given)."""
    init_database(settings.db_url)
    counts: dict[str, dict[str, int]] = {}
    with unit():
        query = Task.select(Task.tenant_id, Task.status, peewee.fn.COUNT(Task.id)).where(
            Task.status.in_(UNFINISHED_STATES)
        )
        if tenant_ids is not None:
            query = query.where(Task.tenant_id.in_(list(tenant_ids)))
        for tenant, status, n in query.group_by(Task.tenant_id, Task.status).tuples():
            counts.setdefault(tenant, {})[status] = int(n)
        rows = {r.id: r for r in Tenant.select()}
    client = connect(settings)
    try:
        gate = Gate(client, Keys(settings.key_prefix))
        names = set(tenant_ids) if tenant_ids is not None else {*counts, *rows, *gate.tenants_at_gate()}
        now = int(client.time()[0]) * 1000
        out = []
        for tenant in sorted(names):
            limits = _limits(settings, tenant, rows.get(tenant))
            at_gate = gate.tenant(tenant, now)
            c = counts.get(tenant, {})
            out.append(
                TenantStanding(
                    tenant_id=tenant,
                    queued=c.get(QUEUED, 0),
                    running=c.get(RUNNING, 0),
                    held=c.get(HELD, 0),
                    slots=at_gate.running,
                    backlog=at_gate.backlog,
                    parked=at_gate.parked,
                    max_running=limits.max_running,
                    max_queued=limits.max_queued,
                    paused=limits.paused,
                )
            )
    finally:
        client.close()
    return out
