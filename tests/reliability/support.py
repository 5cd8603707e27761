"""Helpers for the reliability tests: a fleet of executor processes, and the checks that every
task ended exactly once (rows, completions, chunks, streams)."""

from __future__ import annotations

import random
import re
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from db.config import Settings
from db.database import database, unit
from db.keys import Keys
from db.models import DONE, RUNNING, TERMINAL_STATES, Chunk, Task
from db.streams import Streams
from tests.executor.support import enqueue, make_document, task_spec
from tests.procs import ExecutorProcess, PrivateRedis
from tests.reliability.handlers import CREATE_COMPLETION, EXTRA_HANDLERS


def fleet_settings(settings: Settings, **changes: Any) -> Settings:
    """Short timings: a 2 s redelivery timeout (leases every 0.5 s), quick heartbeats."""
    values: dict[str, Any] = {
        "extra_handlers": EXTRA_HANDLERS,
        "max_concurrent_tasks": 4,
        "redelivery_timeout_s": 2.0,
        "heartbeat_s": 0.5,
        "heartbeat_ttl_s": 3.0,
        "shutdown_grace_s": 3.0,
        "reconcile_grace_s": 5.0,
        "progress_interval_s": 0.3,
    }
    values.update(changes)
    return settings.replace(**values)


def create_completion_table() -> None:
    with unit():
        database.obj.execute_sql(CREATE_COMPLETION)


def enqueue_recorded(streams: Streams, n: int, *, docs: int = 20, seed: int = 6, **fields: Any) -> list[str]:
    """``n`` ``record`` tasks over ``docs`` documents, each sleeping 0.2 to 0.8 s."""
    rng = random.Random(seed)
    doc_ids = [make_document()[1] for _ in range(docs)]
    specs = [
        task_spec(
            "record", doc_id=doc_ids[i % docs], seconds=round(rng.uniform(0.2, 0.8), 3), chunks=2, **fields
        )
        for i in range(n)
    ]
    return enqueue(streams, specs)


class Fleet:
    """Executor processes by name; every one killed is remembered."""

    def __init__(self, settings: Settings, log_dir: Path, **env: str) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.env = env
        self.procs: dict[str, ExecutorProcess] = {}
        self.killed: list[str] = []

    def start(self, name: str, *, wait: bool = True) -> ExecutorProcess:
        proc = ExecutorProcess(self.settings, name, self.log_dir / f"{name}.log", **self.env)
        self.procs[name] = proc
        if wait:
            proc.wait_ready(60)
        return proc

    def kill(self, name: str) -> None:
        self.procs[name].kill()
        self.killed.append(name)

    def alive(self) -> dict[str, ExecutorProcess]:
        return {n: p for n, p in self.procs.items() if n not in self.killed}

    def assert_alive(self) -> None:
        for name, proc in self.alive().items():
            assert proc.proc.poll() is None, (
                f"executor {name} exited with {proc.proc.returncode}:\n{proc.log()}"
            )

    def stop(self) -> dict[str, int]:
        """SIGTERM every live executor at once, then the exit status of each."""
        live = self.alive()
        for proc in live.values():
            proc.signal(signal.SIGTERM)
        return {name: proc.wait(60) for name, proc in live.items()}

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.proc.poll() is None:
                proc.kill()

    def log_count(self, pattern: str) -> int:
        rx = re.compile(pattern)
        return sum(1 for p in self.procs.values() for line in p.log_lines() if rx.search(line))

    def reclaimed(self) -> int:
        total = 0
        for p in self.procs.values():
            for line in p.log_lines():
                m = re.search(r"reclaimed (\d+) entr", line)
                total += int(m.group(1)) if m else 0
        return total

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def running_under(consumer: str) -> int:
    with unit():
        return Task.select().where((Task.status == RUNNING) & (Task.owner == consumer)).count()


def count_ended(task_ids: list[str]) -> int:
    """Tasks in a terminal state (a test waits for this, then checks they are all done)."""
    with unit():
        return Task.select().where(Task.id.in_(task_ids) & Task.status.in_(TERMINAL_STATES)).count()


def count_done(task_ids: list[str]) -> int:
    with unit():
        return Task.select().where(Task.id.in_(task_ids) & (Task.status == DONE)).count()


def completions() -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = defaultdict(list)
    with unit():
        for tid, attempt, consumer in database.obj.execute_sql(
            "SELECT task_id, attempt, consumer FROM completion ORDER BY task_id, attempt"
        ).fetchall():
            out[tid].append((int(attempt), consumer))
    return out


def exactly_once(task_ids: list[str], crashed: set[str]) -> dict[str, int]:
    """Every task done once: its row done under one attempt, whose run completed once on the
    row's owner; any other completed run was on an executor that crashed before its terminal
    write landed. Chunks: exactly the row's own, none twice. Returns the counts seen."""
    with unit():
        rows = {r["id"]: r for r in Task.select().where(Task.id.in_(task_ids)).dicts()}
        chunk_rows = list(
            Chunk.select(Chunk.task_id, Chunk.position, Chunk.id).where(Chunk.task_id.in_(task_ids)).tuples()
        )
    done = completions()
    assert len(rows) == len(task_ids)
    not_done = {t: r["status"] for t, r in rows.items() if r["status"] != DONE}
    assert not not_done, f"{len(not_done)} task(s) not done: {dict(list(not_done.items())[:5])}"
    reruns = 0
    for tid, row in rows.items():
        runs = done.get(tid, [])
        final = [c for a, c in runs if a == row["attempt"]]
        assert final == [row["owner"]], (
            f"task {tid}: completions {runs}, row attempt {row['attempt']} owner {row['owner']}"
        )
        others = [(a, c) for a, c in runs if a != row["attempt"]]
        assert all(c in crashed for _, c in others), f"task {tid} completed on a live executor twice: {runs}"
        reruns += len(others)
    by_task: dict[str, set[str]] = defaultdict(set)
    for tid, _, cid in chunk_rows:
        by_task[tid].add(cid)
    for tid, row in rows.items():
        assert by_task[tid] == set(row["chunk_ids"].split()), (
            f"task {tid}: chunk rows differ from its chunk_ids"
        )
    assert len({(tid, pos) for tid, pos, _ in chunk_rows}) == len(chunk_rows), (
        "a chunk position written twice"
    )
    return {
        "tasks": len(rows),
        "done": len(rows) - len(not_done),
        "completed_runs": sum(len(v) for t, v in done.items() if t in rows),
        "reruns_after_crash": reruns,
        "max_attempt": max(r["attempt"] for r in rows.values()),
        "chunk_rows": len(chunk_rows),
    }


def stream_state(client: redis.Redis, keys: Keys) -> dict[str, int]:
    pending = sum(int(client.xpending(s, keys.group)["pending"]) for s in keys.queues)
    length = sum(int(client.xlen(s)) for s in keys.queues)
    return {"pending": pending, "stream_entries": length, "dead_letters": int(client.xlen(keys.dead))}


def restart_redis(server: PrivateRedis, *, graceful: bool, down_s: float = 1.0) -> None:
    """SHUTDOWN (AOF written, clients told) or SIGKILL, ``down_s`` of outage, then start again."""
    if graceful:
        client = redis.Redis.from_url(server.url)
        try:
            client.shutdown()
        except redis.ConnectionError:
            pass  # the server closes the connection as it exits
        finally:
            client.close()
        assert server.proc is not None
        server.proc.wait(timeout=30)
        server.proc = None
    else:
        server.kill()
    time.sleep(down_s)
    server.start()
