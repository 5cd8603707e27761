"""What the claim's statements cost MariaDB at an idle start, and whether sending the claim as
one round trip instead of two would save anything: the measurement behind issue 13's idle
start latency (goal p50 ≤ 2 ms).

    .venv/bin/python -m bench.claim_statements [--rounds 300] [--gap-ms 20]

One task row is claimed per round, after ``--gap-ms`` of idle (as a task reaching an idle
executor finds the server), three ways in turn, each on its own connection:

- ``separate``: what the executor sends (``executor.claim``): BEGIN, the validating SELECT
  (``_SELECT_ROWS``: the row with its document and knowledge base), the fenced claim UPDATE
  (``_CLAIM``), COMMIT; each statement timed;
- ``multi``: the UPDATE (fenced by status only) and the SELECT as one query of two statements
  (``CLIENT.MULTI_STATEMENTS``, which the executor's pool does not enable);
- ``compound``: the same two in one MariaDB ``BEGIN NOT ATOMIC … END`` block (one statement).

Prints the p50 of each statement and of the whole claim per way, and each merged way over the
separate one. A benchmark, not a test: the machine is shared; read the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import pymysql
from pymysql.constants import CLIENT

from db.database import DbUrl, close_database, init_database, unit
from db.models import QUEUED, RUNNING, Task, now_ms
from db.schema import init_schema
from executor.claim import _CLAIM, _SELECT_ROWS

_TABLE = Task._meta.table_name
_MERGED_UPDATE = (  # the table name is the model's; every value is a parameter
    f"UPDATE {_TABLE} FORCE INDEX (PRIMARY) SET status = %s, owner = %s, attempt = attempt + 1,"  # noqa: S608
    " claim_token = %s, begin_at = %s, update_time = %s WHERE id IN (%s) AND status = %s"
)
WAYS = ("separate", "multi", "compound")


def _connect(url: DbUrl, flags: int = 0) -> Any:
    return pymysql.connect(
        host=url.host,
        port=url.port,
        user=url.user,
        password=url.password,
        database=url.name,
        autocommit=True,
        client_flag=CLIENT.FOUND_ROWS | flags,
    )


def _separate(cur: Any, tid: str, steps: dict[str, list[float]]) -> None:
    marks = [time.perf_counter()]
    cur.execute("BEGIN")
    marks.append(time.perf_counter())
    cur.execute(_SELECT_ROWS.format("%s"), [tid])
    assert cur.fetchall()  # noqa: S101  the row is there: a claim that found nothing measures nothing
    marks.append(time.perf_counter())
    now = now_ms()
    claim = _CLAIM.format(p="%s", marks="%s", case="CASE id WHEN %s THEN %s END")
    cur.execute(claim, [RUNNING, "bench", uuid.uuid4().hex, now, now, tid, QUEUED, RUNNING, tid, 0])
    assert cur.rowcount == 1  # noqa: S101  the claim won its row
    marks.append(time.perf_counter())
    cur.execute("COMMIT")
    marks.append(time.perf_counter())
    for name, a, b in zip(("begin", "select", "update", "commit"), marks, marks[1:], strict=False):
        steps[name].append((b - a) * 1e3)


def _merged_params(tid: str) -> list[Any]:
    now = now_ms()
    return [RUNNING, "bench", uuid.uuid4().hex, now, now, tid, QUEUED, tid]


def _claimed(rows: Any) -> bool:
    """The SELECT after the UPDATE sees the row claimed (its status in the task's JSON)."""
    return len(rows) == 1 and f'"status": "{RUNNING}"' in rows[0][0]


def _multi(cur: Any, tid: str, steps: dict[str, list[float]]) -> None:
    cur.execute("BEGIN")
    started = time.perf_counter()
    cur.execute(f"{_MERGED_UPDATE}; {_SELECT_ROWS.format('%s')}", _merged_params(tid))
    assert cur.rowcount == 1  # noqa: S101  the UPDATE's result comes first
    assert cur.nextset() and _claimed(cur.fetchall())  # noqa: S101
    while cur.nextset():
        pass
    steps["update+select"].append((time.perf_counter() - started) * 1e3)
    cur.execute("COMMIT")


def _compound(cur: Any, tid: str, steps: dict[str, list[float]]) -> None:
    cur.execute("BEGIN")
    started = time.perf_counter()
    cur.execute(f"BEGIN NOT ATOMIC {_MERGED_UPDATE}; {_SELECT_ROWS.format('%s')}; END", _merged_params(tid))
    assert _claimed(cur.fetchall())  # noqa: S101  the block's only result set: the SELECT
    while cur.nextset():
        pass
    steps["update+select"].append((time.perf_counter() - started) * 1e3)
    cur.execute("COMMIT")


def measure(base_url: str, rounds: int, gap_ms: float) -> dict[str, dict[str, float]]:
    """way → {step: p50 ms, "total": p50 ms of the claim from BEGIN to COMMIT}."""
    name = f"bench_claim_{uuid.uuid4().hex[:8]}"
    admin = _connect(DbUrl.parse(f"{base_url}/mysql"))
    admin.cursor().execute(f"CREATE DATABASE `{name}`")
    url = DbUrl.parse(f"{base_url}/{name}")
    try:
        init_schema(f"{base_url}/{name}")
        ids = [uuid.uuid4().hex for _ in range(rounds * len(WAYS))]
        init_database(f"{base_url}/{name}")
        with unit():  # the model's defaults, as the producer writes a row
            Task.insert_many([{"id": i, "task_type": "noop", "create_time": now_ms()} for i in ids]).execute()
        close_database()
        runs: dict[str, Callable[[Any, str, dict[str, list[float]]], None]] = {
            "separate": _separate,
            "multi": _multi,
            "compound": _compound,
        }
        cursors = {
            way: _connect(url, CLIENT.MULTI_STATEMENTS if way == "multi" else 0).cursor() for way in WAYS
        }
        steps: dict[str, dict[str, list[float]]] = {way: {} for way in WAYS}
        for way in WAYS:
            for step in ("begin", "select", "update", "commit") if way == "separate" else ("update+select",):
                steps[way][step] = []
            steps[way]["total"] = []
        for r in range(rounds):
            for k in range(len(WAYS)):
                way = WAYS[(r + k) % len(WAYS)]  # each way first in turn
                time.sleep(gap_ms / 1000)
                started = time.perf_counter()
                runs[way](cursors[way], ids[r * len(WAYS) + k], steps[way])
                steps[way]["total"].append((time.perf_counter() - started) * 1e3)
        for cur in cursors.values():
            cur.connection.close()
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()
    return {way: {step: statistics.median(v) for step, v in s.items()} for way, s in steps.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=20.0, help="idle before each claim")
    args = parser.parse_args()
    base = os.environ.get("BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306")
    p50 = measure(base, args.rounds, args.gap_ms)
    for way, steps in p50.items():
        parts = ", ".join(f"{k} {v:.3f}" for k, v in steps.items() if k != "total")
        print(f"{way:9s}: claim p50 {steps['total']:.3f} ms   ({parts})")
    for way in ("multi", "compound"):
        print(f"{way} / separate: {p50[way]['total'] / p50['separate']['total']:.2f}")
    print(
        f"{args.rounds} rounds each, {args.gap_ms:g} ms idle before each claim, load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
