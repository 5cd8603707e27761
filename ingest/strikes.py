"""Strikes: rules that hold matching tasks instead of running them, and restore, which releases them.

A rule is a task type (empty: every type) and optionally a condition ``FIELD OP VALUE`` over a
task's fields (``tenant_id``, ``kb_id``, ``priority`` …) or its document's (``doc_type``,
``size`` …), with ``OP`` one of ``== != < <= > >=``. Any one active rule holds a task: the
executor that reads it sets its row ``held`` (only from ``queued``, and only while the rule is
still active) with the rule named on the row, and acks the entry. Not run, not lost.

Rules live in the ``strike`` table and are mirrored in the Redis hash ``keys.strikes`` with a
version number that every change moves; executors reload the rules from the database whenever
that version moves (they look at most every half second), on every Redis reconnect and at start.
``restore`` first deactivates the rule, then sets the rows it held ``queued`` (in batches, each
its own transaction) and publishes them (as a re-queue: a row whose hold is not yet acked gets
its message published by that ack). A restore that stopped partway (rows still ``held``
under a rule no longer active) is finished by running it again: restore also releases what
matching inactive rules still hold, and ``ingest strikes`` lists such rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
import peewee
import redis

from db.config import Settings
from db.database import init_database, lock_for_update, unit
from db.keys import Keys
from db.models import HELD, QUEUED, Strike, Task, now_ms
from db.streams import connect
from ingest.errors import IngestError, NotFound
from ingest.lines import appended
from ingest.publish import publish_messages, task_message

OPERATORS = ("==", "!=", "<", "<=", ">", ">=")
TASK_FIELDS = (
    "id",
    "doc_id",
    "kb_id",
    "tenant_id",
    "task_type",
    "priority",
    "from_page",
    "to_page",
    "generation",
)
DOCUMENT_FIELDS = ("doc_type", "size", "name", "page_count")
MESSAGE_FIELDS = ("dataflow_id", "memory_id", "source_id")
FIELDS = TASK_FIELDS + DOCUMENT_FIELDS + MESSAGE_FIELDS
VERSION_FIELD, RULES_FIELD = "version", "rules"
BATCH = 1000


class MirrorError(IngestError):
    """The rule is stored, but its Redis mirror could not be updated."""


@dataclass(frozen=True)
class Rule:
    """One strike rule, as executors apply it."""

    id: int
    task_type: str = ""  # '' = every type
    field: str = ""  # '' = every task of the type
    op: str = ""
    value: str = ""
    version: int = 0

    def describe(self) -> str:
        """``strike #3: parse doc_type == pdf``."""
        what = self.task_type or "any type"
        cond = f" {self.field} {self.op} {self.value}" if self.field else ""
        return f"strike #{self.id}: {what}{cond}"

    def matches(
        self,
        task_type: str,
        row: Mapping[str, Any],
        doc: Mapping[str, Any] | None = None,
        message: Mapping[str, Any] | None = None,
    ) -> bool:
        if self.task_type and self.task_type != task_type:
            return False
        if not self.field:
            return True
        actual = field_value(self.field, task_type, row, doc, message)
        return actual is not None and compare(actual, self.op, self.value)

    @classmethod
    def of(cls, strike: Strike) -> Rule:
        return cls(strike.id, strike.task_type, strike.field, strike.op, strike.value, strike.version)


def first_match(
    rules: Sequence[Rule],
    task_type: str,
    row: Mapping[str, Any],
    doc: Mapping[str, Any] | None = None,
    message: Mapping[str, Any] | None = None,
) -> Rule | None:
    for rule in rules:
        if rule.matches(task_type, row, doc, message):
            return rule
    return None


def field_value(
    name: str,
    task_type: str,
    row: Mapping[str, Any],
    doc: Mapping[str, Any] | None,
    message: Mapping[str, Any] | None,
) -> Any:
    """A field of the task (its row, else its document's row, else its message); None if none has it."""
    if name == "task_type":
        return task_type
    for source in (row, doc, message):
        if source is not None:
            value = source.get(name)
            if value not in (None, ""):
                return value
    return None


def _number(value: Any) -> float | None:
    """``value`` as a number; None for text. Non-finite numbers (``nan``, ``inf``, ``1e999``)
    read as :data:`NON_FINITE`: nothing compares with them (``nan`` is unordered, and as text
    ``"inf"`` sorts after every digit)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        try:
            number = float(str(value))
        except ValueError:
            return None
    return number if math.isfinite(number) else NON_FINITE


NON_FINITE = math.nan  # the marker _number returns; tested with math.isnan


def non_finite(value: Any) -> bool:
    """True when ``value`` reads as a number that is not finite."""
    number = _number(value)
    return number is not None and math.isnan(number)


def compare(actual: Any, op: str, expected: str) -> bool:
    """``actual OP expected``: as numbers when both read as numbers, else as text; never when
    ``expected`` is a non-finite number, or ``actual`` is one and ``expected`` a number."""
    a, b = _number(actual), _number(expected)
    if b is not None and (math.isnan(b) or (a is not None and math.isnan(a))):
        return False
    left: Any
    right: Any
    if a is not None and b is not None:
        left, right = a, b
    else:
        left, right = str(actual), str(expected)
    if op == "==":
        return bool(left == right)
    if op == "!=":
        return bool(left != right)
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    if op == ">=":
        return bool(left >= right)
    raise ValueError(f"unknown operator {op!r}")


def check_rule(
    task_type: str | None, field_: str | None, op: str | None, value: Any
) -> tuple[str, str, str, str]:
    """The rule's parts, normalised; ValueError naming what is wrong."""
    task_type = (task_type or "").strip()
    parts = (field_, op, value)
    if any(p not in (None, "") for p in parts) and any(p in (None, "") for p in parts):
        raise ValueError("a condition needs all of FIELD, OP and VALUE")
    if field_ in (None, ""):
        if not task_type:
            raise ValueError("a strike needs a task type, a condition FIELD OP VALUE, or both")
        return task_type, "", "", ""
    if field_ not in FIELDS:
        raise ValueError(f"unknown field {field_!r}: use one of {', '.join(FIELDS)}")
    if op not in OPERATORS:
        raise ValueError(f"unknown operator {op!r}: use one of {' '.join(OPERATORS)}")
    text = str(value)
    if len(text) > 255:
        raise ValueError("a strike's value is at most 255 characters")
    return task_type, str(field_), str(op), text


# -- the table ------------------------------------------------------------------------------


def load_active() -> list[Rule]:
    """The active rules, oldest first (call on a connection: ``connection()`` or ``unit()``)."""
    return [Rule.of(s) for s in Strike.select().where(Strike.active == True).order_by(Strike.id)]  # noqa: E712


def _next_version() -> int:
    current = Strike.select(peewee.fn.MAX(Strike.version)).scalar()
    return int(current or 0) + 1


def _same(task_type: str, field_: str, op: str, value: str) -> peewee.Expression:
    return (
        (Strike.task_type == task_type)
        & (Strike.field == field_)
        & (Strike.op == op)
        & (Strike.value == value)
    )


@dataclass(frozen=True)
class StrikeResult:
    rule: dict[str, Any]
    created: bool  # False: the same rule was already active
    mirrored: bool  # the Redis mirror's version moved (executors apply it within a second)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RestoreResult:
    rules: list[dict[str, Any]]  # the rules deactivated, and inactive ones that still held tasks
    task_ids: list[str]  # held tasks set queued again
    published: int  # new stream entries
    mirrored: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def strike(
    settings: Settings,
    task_type: str | None = None,
    field: str | None = None,
    op: str | None = None,
    value: Any = None,
) -> StrikeResult:
    """Add an active rule (or find the same one already active), then move the mirror's version.
    A value that is a non-finite number is refused: such a rule would never hold anything."""
    parts = check_rule(task_type, field, op, value)
    if parts[1] and non_finite(parts[3]):
        raise ValueError(
            f"{parts[3]!r} is not a finite number: a strike compares numbers only when they are "
            "finite (nan and inf match nothing); give a finite bound such as 1e12"
        )
    init_database(settings.db_url)
    with unit():
        existing = Strike.get_or_none(_same(*parts) & (Strike.active == True))  # noqa: E712
        if existing is not None:
            row, created = existing, False
        else:
            t, f, o, v = parts
            row = Strike.create(task_type=t, field=f, op=o, value=v, active=True, version=_next_version())
            created = True
    return StrikeResult(rule=_rule_dict(row), created=created, mirrored=_try_mirror(settings))


def restore(
    settings: Settings,
    task_type: str | None = None,
    field: str | None = None,
    op: str | None = None,
    value: Any = None,
    *,
    strike_id: int | None = None,
) -> RestoreResult:
    """Deactivate the active rule(s) given (by their parts or by id), then set the rows they held
    ``queued`` and publish them. Rules given that are already inactive but still hold rows (a
    restore that stopped partway) have their rows released too. NotFound when no such rule is
    active and none holds a row."""
    init_database(settings.db_url)
    with unit():
        if strike_id is not None:
            where = Strike.id == strike_id
        else:
            where = _same(*check_rule(task_type, field, op, value))
        rules = list(lock_for_update(Strike.select().where(where & (Strike.active == True))))  # noqa: E712
        unfinished = list(
            Strike.select().where(
                where
                & (Strike.active == False)  # noqa: E712
                & Strike.id.in_(Task.select(Task.strike_id).where(Task.status == HELD))
            )
        )
        if not rules and not unfinished:
            raise NotFound("no active strike " + (f"#{strike_id}" if strike_id is not None else "like that"))
        version = _next_version() if rules else 0
        if rules:
            Strike.update(active=False, version=version, update_time=now_ms()).where(
                Strike.id.in_([r.id for r in rules])
            ).execute()
    mirrored = _try_mirror(settings)
    ids = sorted(r.id for r in rules + unfinished)
    rows = _release_rows(ids, ", ".join(f"#{i}" for i in ids))
    # requeue: an executor that held a row of these rules acks its entry after its commit, so
    # the published key may still name that entry here; its ack publishes the task then
    published = publish_messages(settings, [task_message(r) for r in rows], requeue=True).sent if rows else 0
    return RestoreResult(
        rules=[{**_rule_dict(r), "active": False, "version": version} for r in rules]
        + [_rule_dict(r) for r in unfinished],
        task_ids=[r["id"] for r in rows],
        published=published,
        mirrored=mirrored,
    )


def _release_rows(strike_ids: list[int], names: str) -> list[dict[str, Any]]:
    """Rows held by these (inactive) rules → queued, :data:`BATCH` rows a transaction (rows
    first; the caller publishes). Stopped partway, the rest stay held: restore again."""
    out: list[dict[str, Any]] = []
    while True:
        with unit():
            held = list(
                lock_for_update(
                    Task.select()
                    .where((Task.status == HELD) & Task.strike_id.in_(strike_ids))
                    .order_by(Task.id)
                    .limit(BATCH)
                ).dicts()
            )
            if not held:
                return out
            Task.update(
                status=QUEUED,
                strike_id=0,
                progress_msg=appended(Task.progress_msg, f"released: strike {names} restored"),
                update_time=now_ms(),
            ).where(Task.id.in_([r["id"] for r in held]) & (Task.status == HELD)).execute()
        out += [{**r, "status": QUEUED, "strike_id": 0} for r in held]


def list_strikes(settings: Settings, *, include_inactive: bool = False) -> list[dict[str, Any]]:
    """Rules (active ones, and inactive ones still holding tasks, unless ``include_inactive``:
    all), each with how many tasks it holds now."""
    init_database(settings.db_url)
    with unit():
        held = dict(
            Task.select(Task.strike_id, peewee.fn.COUNT(Task.id))
            .where(Task.status == HELD)
            .group_by(Task.strike_id)
            .tuples()
        )
        query = Strike.select().order_by(Strike.id)
        if not include_inactive:
            query = query.where((Strike.active == True) | Strike.id.in_(list(held) or [0]))  # noqa: E712
        rules = [_rule_dict(s) for s in query]
    for rule in rules:
        rule["held"] = int(held.get(rule["id"], 0))
    return rules


def _rule_dict(s: Strike) -> dict[str, Any]:
    rule = Rule.of(s)
    return {
        "id": s.id,
        "task_type": s.task_type,
        "field": s.field,
        "op": s.op,
        "value": s.value,
        "active": bool(s.active),
        "version": s.version,
        "rule": rule.describe().split(": ", 1)[1],
        "create_time": s.create_time,
        "update_time": s.update_time,
    }


# -- the Redis mirror -------------------------------------------------------------------------


@dataclass(frozen=True)
class Mirror:
    version: int
    rules: list[dict[str, Any]] = field(default_factory=list)


def mirror(settings: Settings) -> int:
    """Write the active rules to ``keys.strikes`` and move its version; returns the new version.

    The database is the truth: two changes racing may leave ``rules`` a step behind, but each
    moves ``version``, and executors reload from the database whenever it moves."""
    init_database(settings.db_url)
    with unit():
        rules = [asdict(r) for r in load_active()]
    client = connect(settings)
    try:
        key = Keys(settings.key_prefix).strikes
        pipe = client.pipeline(transaction=True)
        pipe.hset(key, RULES_FIELD, orjson.dumps(rules).decode())
        pipe.hincrby(key, VERSION_FIELD, 1)
        return int(pipe.execute()[-1])
    finally:
        client.close()


def _try_mirror(settings: Settings) -> bool:
    try:
        mirror(settings)
    except redis.RedisError:
        return False
    return True


def read_mirror(client: redis.Redis, keys: Keys) -> Mirror:
    raw = client.hgetall(keys.strikes)
    rules = orjson.loads(raw[RULES_FIELD]) if raw.get(RULES_FIELD) else []
    return Mirror(int(raw.get(VERSION_FIELD) or 0), rules)


def mirrored_version(client: redis.Redis, keys: Keys) -> int:
    """The mirror's version (0 when no rule was ever changed); one HGET."""
    return int(client.hget(keys.strikes, VERSION_FIELD) or 0)
