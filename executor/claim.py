"""Validate a read batch against the task rows in one query, and claim the tasks it may run."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Container, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from db.database import database, is_mysql
from db.keys import PRIORITIES
from db.models import (
    DEAD,
    HELD,
    QUEUED,
    RUNNING,
    TERMINAL_STATES,
    BaseModel,
    Document,
    JSONField,
    KnowledgeBase,
    Strike,
    Task,
    now_ms,
)
from db.results import result_record
from db.streams import AckItem, Entry
from executor import sql
from executor.book import Claimed
from executor.progress import append_line
from ingest.documents import lock_documents, recompute_documents
from ingest.errors import BadMessage
from ingest.publish import MAX_MESSAGE_CHARS, task_message
from ingest.strikes import Rule, first_match

# A message larger than any the producer makes is junk (it refuses a bigger payload: a task
# whose message the executor refused would be dead-lettered without its id, its row left queued
# and published again by every reconcile pass); a dead letter keeps the head of one.
MAX_MESSAGE_BYTES = MAX_MESSAGE_CHARS  # characters: Redis replies are decoded
MAX_DEAD_RAW_CHARS = 1 << 20
MAX_ID_CHARS = 64
DEFAULT_TASK_TYPE = "parse"

_JSON_FIELDS = {
    model: [f.name for f in model._meta.sorted_fields if isinstance(f, JSONField)]
    for model in (Task, Document, KnowledgeBase)
}


def _object(alias: str, model: type[BaseModel]) -> str:
    """One row as a JSON object: one column instead of one per field (the driver's cost)."""
    pairs = ", ".join(f"'{f.name}', {alias}.{f.column_name}" for f in model._meta.sorted_fields)
    return f"JSON_OBJECT({pairs})"


_SELECT_ROWS = (
    f"SELECT {_object('t', Task)},"
    f" CASE WHEN d.id IS NULL THEN NULL ELSE {_object('d', Document)} END,"
    f" CASE WHEN k.id IS NULL THEN NULL ELSE {_object('k', KnowledgeBase)} END"
    f" FROM {Task._meta.table_name} t"
    f" LEFT JOIN {Document._meta.table_name} d ON d.id = t.doc_id"
    f" LEFT JOIN {KnowledgeBase._meta.table_name} k"
    " ON k.id = CASE WHEN t.kb_id <> '' THEN t.kb_id ELSE d.kb_id END"
    " WHERE t.id IN ({})"
)


def _decode(text: str | None, model: type[BaseModel]) -> dict[str, Any] | None:
    if text is None:
        return None
    row: dict[str, Any] = orjson.loads(text)
    for name in _JSON_FIELDS[model]:
        value = row.get(name)
        row[name] = orjson.loads(value) if isinstance(value, str) and value else None
    return row


@dataclass
class Note:
    """Something the trio side should log once (the claim itself runs in a thread)."""

    level: str  # "info" | "warning"
    text: str
    extra: dict[str, Any]


@dataclass
class ClaimPlan:
    """The verdict on one read batch."""

    claimed: list[Claimed] = field(default_factory=list)
    acks: list[AckItem] = field(default_factory=list)  # plain acks and dead letters
    notes: list[Note] = field(default_factory=list)
    deferred: list[Entry] = field(default_factory=list)  # left pending, looked at again soon
    held: list[str] = field(default_factory=list)  # task types of the tasks a strike held
    read_rows: bool = False  # a statement ran (False: every message malformed, no row looked at)

    def ack(self, entry: Entry, task_id: str, why: str, extra: dict[str, Any]) -> None:
        self.acks.append(AckItem(entry.stream, entry.entry_id, task_id))
        self.notes.append(Note("info", f"dropped: {why}", {"task_id": task_id, **extra}))

    def hold(self, entry: Entry, task_id: str, task_type: str, rule: Rule, extra: dict[str, Any]) -> None:
        self.acks.append(AckItem(entry.stream, entry.entry_id, task_id))
        self.held.append(task_type)
        self.notes.append(
            Note("info", f"held by {rule.describe()}", {"task_id": task_id, "task_type": task_type, **extra})
        )

    def dead(
        self,
        entry: Entry,
        task_id: str,
        reason: str,
        deliveries: int = 0,
        outcome: dict[str, Any] | None = None,
        *,
        once: bool = False,
    ) -> None:
        raw = entry.raw or ""
        if len(raw) > MAX_DEAD_RAW_CHARS:
            raw = raw[:MAX_DEAD_RAW_CHARS]
        item = AckItem(
            entry.stream, entry.entry_id, task_id, reason, raw, deliveries or entry.deliveries, outcome, once
        )
        self.acks.append(item)
        self.notes.append(
            Note("warning", f"dead letter: {reason}", {"task_id": task_id, "entry": entry.entry_id})
        )


@dataclass(frozen=True)
class ClaimRules:
    """What the claim needs to know about this executor."""

    consumer: str
    task_types: Collection[str]
    max_deliveries: int
    running_ids: Container[str]  # tasks this process is running now (only asked "in")
    live_owners: Callable[[list[str]], set[str]]  # consumers among these whose heartbeat lives
    strikes: Sequence[Rule] = ()  # active strike rules: a queued task one matches is held


def parse_message(raw: str | None) -> dict[str, Any]:
    """The message as a dict, or :class:`BadMessage` saying why it is not one of the contract."""
    if raw is None:
        raise BadMessage("no message field")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise BadMessage(f"message too large ({len(raw)} characters, at most {MAX_MESSAGE_BYTES})")
    try:
        msg = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadMessage(f"not JSON: {exc}") from None
    if not isinstance(msg, dict):
        raise BadMessage(f"not a JSON object but {type(msg).__name__}")
    if "id" not in msg:
        raise BadMessage("no id")
    tid = msg["id"]
    if not isinstance(tid, str) or not tid or len(tid) > MAX_ID_CHARS:
        raise BadMessage(f"id must be a string of 1 to {MAX_ID_CHARS} characters")
    task_type = msg.get("task_type")
    if task_type is not None and (not isinstance(task_type, str) or not task_type):
        raise BadMessage("task_type must be a non-empty string")
    if "priority" in msg:
        prio = msg["priority"]
        if isinstance(prio, bool) or not isinstance(prio, int) or prio not in PRIORITIES:
            raise BadMessage(f"priority must be one of {sorted(PRIORITIES)}, not {prio!r}")
    doc_id = msg.get("doc_id")
    if doc_id is not None and not isinstance(doc_id, str):
        raise BadMessage("doc_id must be a string")
    return msg


def fetch_rows(
    ids: Sequence[str],
) -> dict[str, tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]]:
    """Task rows with their document and knowledge base, in one query."""
    if not ids:
        return {}
    out = {}
    for t, d, k in sql.execute(_SELECT_ROWS.format(sql.marks(len(ids))), ids).fetchall():
        task = _decode(t, Task)
        assert task is not None
        out[task["id"]] = (task, _decode(d, Document), _decode(k, KnowledgeBase))
    return out


class OwnTransactionNeeded(Exception):
    """A batch holds a task to bury: the caller validates it again outside its transaction."""


def validate_and_claim(entries: Sequence[Entry], rules: ClaimRules, *, nested: bool = False) -> ClaimPlan:
    """Decide every entry of a batch on one connection: one SELECT validates, one UPDATE claims
    (fenced by the attempt each row had in the SELECT, so a change in between makes it miss,
    never overwrite); rows made ``dead`` are written in a transaction (or savepoint) of their
    own. The collector's hot path calls it inside a transaction it commits itself (see
    ``Collector.read_and_claim``) with ``nested``: a batch with a task to bury raises
    :class:`OwnTransactionNeeded` there; elsewhere it runs with autocommit."""
    plan = ClaimPlan()
    good: list[tuple[Entry, dict[str, Any]]] = []
    for entry in entries:
        try:
            good.append((entry, parse_message(entry.raw)))
        except BadMessage as exc:
            plan.dead(entry, _loose_id(entry.raw), str(exc))
    rows = fetch_rows(sorted({m["id"] for _, m in good}))
    plan.read_rows = bool(good)
    live = _live_owners(good, rows, rules)
    newest: dict[str, Entry] = {}  # a task's newest entry carries its current message
    for entry, m in good:
        if m["id"] not in newest or _age(entry) > _age(newest[m["id"]]):
            newest[m["id"]] = entry
    to_claim: list[tuple[Entry, dict[str, Any], str]] = []
    to_bury: list[tuple[Entry, dict[str, Any], str]] = []
    to_hold: list[tuple[Entry, dict[str, Any], str, Rule]] = []
    for entry, msg in good:
        tid = msg["id"]
        kind, text = _judge(entry, msg, rows.get(tid), rules, live, newest[tid] is not entry)
        extra = {"doc_id": msg.get("doc_id") or "", "entry": entry.entry_id}
        if kind == "ack":
            plan.ack(entry, tid, text, extra)
        elif kind == "dead":
            plan.dead(
                entry,
                tid,
                text,
                max(entry.deliveries, int(rows[tid][0].get("handback_count") or 0)),
                once=True,
            )
        elif kind == "bury":
            to_bury.append((entry, msg, text))
        elif kind == "defer":
            plan.deferred.append(entry)
            plan.notes.append(Note("info", f"deferred: {text}", {"task_id": tid, **extra}))
        elif rules.strikes and (rule := _stricken(rules.strikes, text, msg, rows[tid])):
            to_hold.append((entry, msg, text, rule))
        else:
            to_claim.append((entry, msg, text))
    if to_bury and nested:
        # A bury locks documents, then recomputes them: inside the caller's transaction its
        # reads would see the snapshot the validation read took (LIFECYCLE "Finish": lock
        # first). The caller rolls back and validates this batch again on a fresh connection.
        raise OwnTransactionNeeded
    _bury(to_bury, rows, plan)
    to_claim += _hold(to_hold, rows, plan)
    _claim(to_claim, rows, rules.consumer, plan)
    return plan


def _judge(
    entry: Entry,
    msg: dict[str, Any],
    found: tuple[dict[str, Any], Any, Any] | None,
    rules: ClaimRules,
    live: set[str],
    superseded: bool,
) -> tuple[str, str]:
    """("ack"|"defer"|"bury"|"claim", reason or task type) for one well-formed message."""
    tid = msg["id"]
    if superseded:
        return "ack", "superseded by a newer entry of the task in this batch"
    if tid in rules.running_ids:
        row = found[0] if found else {}
        if row.get("status") == RUNNING and row.get("owner") == rules.consumer:
            return "ack", "duplicate of a task this executor is running"
        return "defer", "task re-queued while its run here ends"
    if found is None:
        return "ack", "no task row with this id"
    row = found[0]
    status = row["status"]
    if status == DEAD:  # a dead row always has its dead letter: this entry's, unless one exists
        return "dead", _last_line(row.get("progress_msg") or "") or "task is dead"
    if status in TERMINAL_STATES:
        return "ack", f"task already {status}"
    if status == HELD:
        return "ack", "task is held by a strike"
    if status == RUNNING and row["owner"] in live and not entry.reclaimed:
        return "ack", f"duplicate: running under live executor {row['owner']}"
    deliveries = max(entry.deliveries, int(row.get("handback_count") or 0))
    if deliveries > rules.max_deliveries:
        last = _last_line(row.get("progress_msg") or "")
        return "bury", f"gave up after {deliveries} deliveries" + (f": {last}" if last else "")
    # The row is the durable record: the message only says which task to look at; the type (and
    # every field a handler reads) comes from the row, so a forged message changes nothing.
    task_type = row.get("task_type") or DEFAULT_TASK_TYPE
    if task_type not in rules.task_types:
        return "bury", f"unknown task_type {task_type!r}"
    return "claim", task_type


def _live_owners(
    good: list[tuple[Entry, dict[str, Any]]], rows: dict[str, Any], rules: ClaimRules
) -> set[str]:
    owners = set()
    for entry, msg in good:
        found = rows.get(msg["id"])
        if found and not entry.reclaimed:
            row = found[0]
            if row["status"] == RUNNING and row["owner"] and row["owner"] != rules.consumer:
                owners.add(row["owner"])
    return rules.live_owners(sorted(owners)) if owners else set()


def _bury(items: list[tuple[Entry, dict[str, Any], str]], rows: dict[str, Any], plan: ClaimPlan) -> None:
    """Row ``dead`` (only from queued or running, fenced by the attempt seen) and a dead letter."""
    if not items:
        return
    with database.obj.atomic():
        _bury_rows(items, rows, plan)


def _bury_rows(items: list[tuple[Entry, dict[str, Any], str]], rows: dict[str, Any], plan: ClaimPlan) -> None:
    doc_ids = [rows[m["id"]][0]["doc_id"] for _, m, _ in items if rows[m["id"]][0]["doc_id"]]
    lock_documents(doc_ids)
    now = now_ms()
    for entry, msg, reason in items:
        row = rows[msg["id"]][0]
        buried = (
            Task.update(
                status=DEAD,
                progress=-1.0,
                owner="",
                progress_msg=append_line(row.get("progress_msg") or "", f"dead letter: {reason}"),
                update_time=now,
            )
            .where(
                (Task.id == row["id"])
                & (Task.status.in_([QUEUED, RUNNING]))
                & (Task.attempt == row["attempt"])
            )
            .execute()
        )
        if not buried:  # the row moved on since it was read (its owner finished it, or a new
            # attempt began): nothing of this task died; the entry goes (its owner's ack cannot)
            plan.ack(entry, row["id"], f"not buried ({reason}): its row moved on", {})
            continue
        outcome = result_record(row, DEAD, error=reason, finished_at=now)
        deliveries = max(entry.deliveries, int(row.get("handback_count") or 0))
        plan.dead(entry, row["id"], reason, deliveries, outcome)
    recompute_documents(doc_ids)


def _stricken(strikes: Sequence[Rule], task_type: str, msg: dict[str, Any], found: Any) -> Rule | None:
    """The first active rule matching a queued task (a running row, come by reclaim, runs on)."""
    row, doc, _ = found
    return first_match(strikes, task_type, row, doc, task_message(row)) if row["status"] == QUEUED else None


def _hold(
    items: list[tuple[Entry, dict[str, Any], str, Rule]], rows: dict[str, Any], plan: ClaimPlan
) -> list[tuple[Entry, dict[str, Any], str]]:
    """Rows a strike matches → ``held`` with the rule on the row, and their entries acked; only
    from ``queued`` and only while the rule is still active (read with a shared lock, so a
    restore's deactivation waits for this transaction, or this sees it). Returns the items to
    claim instead (the rule was lifted meanwhile)."""
    if not items:
        return []
    leftover: list[tuple[Entry, dict[str, Any], str]] = []
    with database.obj.atomic():
        ids = sorted({rule.id for _, _, _, rule in items})
        lock = " LOCK IN SHARE MODE" if is_mysql() else ""
        active = {
            int(r[0])
            for r in sql.execute(
                f"SELECT id FROM {Strike._meta.table_name} WHERE id IN ({sql.marks(len(ids))})"
                f" AND active = {sql.param()}{lock}",
                [*ids, True],
            ).fetchall()
        }
        now, p = now_ms(), sql.param()
        # by the primary key only: through the status index MariaDB would lock the gap after the
        # row, and a producer's insert of a queued task would wait for this transaction
        hint = " FORCE INDEX (PRIMARY)" if is_mysql() else ""
        update = (
            f"UPDATE {Task._meta.table_name}{hint} SET status = {p}, owner = {p}, strike_id = {p},"
            f" progress_msg = {p}, update_time = {p} WHERE id = {p} AND status = {p} AND attempt = {p}"
        )
        for entry, msg, task_type, rule in items:
            row = rows[msg["id"]][0]
            line = append_line(row.get("progress_msg") or "", f"held by {rule.describe()}")
            params = [HELD, "", rule.id, line, now, row["id"], QUEUED, row["attempt"]]
            held = rule.id in active and sql.execute(update, params).rowcount
            if held:
                plan.hold(entry, row["id"], task_type, rule, {"doc_id": row.get("doc_id") or ""})
            else:
                leftover.append((entry, msg, task_type))
    return leftover


def _claim(
    items: list[tuple[Entry, dict[str, Any], str]], rows: dict[str, Any], consumer: str, plan: ClaimPlan
) -> None:
    """One UPDATE claims the batch under a token; one SELECT tells which rows it won."""
    if not items:
        return
    token = uuid.uuid4().hex
    seen = {m["id"]: rows[m["id"]][0]["attempt"] for _, m, _ in items}
    now = now_ms()
    ids = sorted(seen)
    matched = sql.execute(
        _CLAIM.format(p=sql.param(), marks=sql.marks(len(ids)), case=sql.case_by_id(len(ids))),
        [RUNNING, consumer, token, now, now, *ids, QUEUED, RUNNING, *sql.pairs(ids, [seen[i] for i in ids])],
    ).rowcount
    if matched == len(ids):  # every row won (FOUND_ROWS): the attempts are the ones seen plus one
        won = {i: int(seen[i]) + 1 for i in ids}
    else:
        won = dict(sql.execute(_WON.format(p=sql.param()), [token]).fetchall())
    for entry, msg, task_type in items:
        tid = msg["id"]
        if tid not in won:
            plan.ack(entry, tid, "claim lost: the row changed meanwhile", {"entry": entry.entry_id})
            continue
        row, doc, kb = rows[tid]
        row = {
            **row,
            "status": RUNNING,
            "owner": consumer,
            "attempt": won[tid],
            "claim_token": token,
            "begin_at": now,
        }
        # what the handler reads is the row's message, rebuilt as a publish builds it, never the
        # stream's: a message forged into a stream can only name a task, not change it
        plan.claimed.append(Claimed(entry, task_message(row), task_type, row, doc, kb, won[tid]))


_CLAIM = (
    f"UPDATE {Task._meta.table_name} SET status = {{p}}, owner = {{p}}, attempt = attempt + 1, claim_token = {{p}},"
    " begin_at = {p}, update_time = {p} WHERE id IN ({marks}) AND status IN ({p}, {p}) AND attempt = {case}"
)
_WON = f"SELECT id, attempt FROM {Task._meta.table_name} WHERE claim_token = {{p}}"


def _age(entry: Entry) -> tuple[int, ...]:
    """An entry id ``ms-seq`` as numbers: later entries compare greater."""
    return tuple(int(part) for part in entry.entry_id.split("-"))


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _loose_id(raw: str | None) -> str:
    """The id of a malformed message where one can be seen (for the dead letter), else ''."""
    if not raw or len(raw) > MAX_MESSAGE_BYTES:
        return ""
    try:
        msg = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ""
    tid = msg.get("id") if isinstance(msg, dict) else None
    return tid if isinstance(tid, str) and 0 < len(tid) <= MAX_ID_CHARS else ""
