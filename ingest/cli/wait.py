"""``ingest submit --wait``: follow documents in the database until each ends, with progress bars.

The database is the truth (``LIFECYCLE.md``, "Finish"); a subscription to ``ingest:updates``
only wakes the loop early. Without Redis it polls.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from db.config import Settings
from db.database import connection, init_database
from db.models import CANCELLED, DONE, Document
from ingest.cli.common import err, new_console, plain_output
from ingest.task_wait import Waker

ENDED = (DONE, "failed", CANCELLED, "dead")
BARS_SHOWN = 30  # more documents than this: one overall bar
BATCH = 1000
MIN_POLL_S = 0.1


def read_documents(doc_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    with connection():
        for start in range(0, len(doc_ids), BATCH):
            query = Document.select(
                Document.id, Document.name, Document.run, Document.progress, Document.progress_msg
            ).where(Document.id.in_(doc_ids[start : start + BATCH]))
            for row in query.dicts():
                found[row["id"]] = row
    return found


def wait_for_documents(
    settings: Settings,
    doc_ids: Sequence[str],
    *,
    timeout_s: float | None = None,
    poll_s: float = 0.5,
    show: bool = True,
) -> tuple[dict[str, dict[str, Any]], bool]:
    """Follow ``doc_ids`` until every one has ended; returns their last rows and whether all
    ended (False when ``timeout_s`` ran out first). Progress bars go to stderr on a terminal;
    elsewhere (a pipe, a CI log, ``TERM=dumb``) one plain line per document as it ends."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    init_database(settings.db_url)
    ids = list(dict.fromkeys(doc_ids))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    columns = (
        TextColumn("{task.description}", style="bold", markup=False),  # a document's name
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[state]}", markup=False),
        TimeElapsedColumn(),
    )
    waker = Waker(settings)
    lines = show and plain_output()
    progress = Progress(
        *columns, console=new_console(stderr=True), disable=not show or lines, transient=False
    )
    rows: dict[str, dict[str, Any]] = {}
    told: set[str] = set()
    try:
        with progress:
            bars = _make_bars(progress, ids)
            while True:
                rows = read_documents(ids)
                _update_bars(progress, bars, ids, rows)
                if lines:
                    _tell_ended(ids, rows, told)
                if all(rows.get(d, {}).get("run") in ENDED or d not in rows for d in ids):
                    return rows, True
                if deadline is not None and time.monotonic() >= deadline:
                    return rows, False
                polled = time.monotonic()
                waker.sleep(poll_s if deadline is None else max(0.01, min(poll_s, deadline - polled)))
                # a busy fleet publishes many events: read the database at most every MIN_POLL_S
                time.sleep(max(0.0, MIN_POLL_S - (time.monotonic() - polled)))
    finally:
        waker.close()


def _tell_ended(ids: list[str], rows: dict[str, dict[str, Any]], told: set[str]) -> None:
    for d in ids:
        row = rows.get(d)
        if d not in told and (row is None or row["run"] in ENDED):
            told.add(d)
            err(f"{row['run'] if row else 'removed'}: {row['name'] if row else d}")


def _make_bars(progress: Any, ids: list[str]) -> dict[str, Any]:
    if len(ids) > BARS_SHOWN:
        return {"*": progress.add_task(f"{len(ids)} documents", total=len(ids), state="")}
    return {d: progress.add_task(d[:12], total=100, state="queued") for d in ids}


def _update_bars(
    progress: Any, bars: dict[str, Any], ids: list[str], rows: dict[str, dict[str, Any]]
) -> None:
    if "*" in bars:
        ended = [rows[d]["run"] for d in ids if d in rows and rows[d]["run"] in ENDED]
        counts = {run: ended.count(run) for run in sorted(set(ended))}
        state = ", ".join(f"{n} {run}" for run, n in counts.items())
        progress.update(bars["*"], completed=len(ended), state=state)
        return
    for d in ids:
        row = rows.get(d)
        if row is None:
            progress.update(bars[d], state="removed")
            continue
        done = 100.0 if row["run"] == DONE else max(0.0, float(row["progress"] or 0.0)) * 100
        progress.update(bars[d], description=row["name"][:40], completed=done, state=row["run"])
