"""``ingest demo``: the main job on this host in one command. Creates the schema, starts a fleet of
two executor processes, ingests ``examples/``, searches it, prints the answers and stops every
process it started. With nothing configured it runs on the embedded default (SQLite and the
embedded Redis under ``INGEST_HOME``): no service to install, no root."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from db.config import Settings
from ingest.allocator import preload_env
from ingest.cli.common import EXIT_FAILED, EXIT_OK, GlobalOptions, err, json_out, new_console, out

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUERIES = ("how do I keep bees healthy in winter?", "when is high tide?")
READY_TIMEOUT_S = 120.0


def _child_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
    for f in dataclasses.fields(Settings):
        env[Settings.env_name(f.name)] = str(getattr(settings, f.name))
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return preload_env(env)  # the allocator entrypoint.sh gives a fleet (ingest/allocator.py)


def _start_fleet(settings: Settings, n: int, log_path: Path) -> list[subprocess.Popen[bytes]]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    procs = []
    with open(log_path, "ab") as log:
        for i in range(1, n + 1):
            procs.append(
                subprocess.Popen(  # noqa: S603 - this interpreter, the project's own module
                    [sys.executable, "-m", "executor", f"demo_{i}"],
                    env=_child_env(settings),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs


def _stop_fleet(procs: list[subprocess.Popen[bytes]], grace_s: float = 30.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_ready(settings: Settings, procs: list[subprocess.Popen[bytes]], log_path: Path) -> None:
    from ingest.status import fleet

    names = {f"demo_{i}" for i in range(1, len(procs) + 1)}
    deadline = time.monotonic() + READY_TIMEOUT_S
    while {b.get("consumer") or b.get("name") for b in fleet(settings)} < names:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"an executor exited with {dead[0].returncode}: see {log_path}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the executors did not start in {READY_TIMEOUT_S:g} s: see {log_path}")
        time.sleep(0.2)


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from db.keys import Keys
    from db.schema import init_schema
    from db.streams import Streams, connect
    from ingest.cli.command import _hit_dict
    from ingest.cli.wait import ENDED, wait_for_documents
    from ingest.producer import submit_documents
    from ingest.search import search

    settings = settings.replace(stagger_s=0.0, tenant_max_running=max(settings.tenant_max_running, 10))
    init_schema(settings.db_url)
    client = connect(settings)
    try:
        Streams(client, Keys(settings.key_prefix)).ensure_group()
    finally:
        client.close()
    from ingest.cli.model import ensure_export

    ensure_export(settings)  # searches embed the query through the model's ONNX export, no torch
    log_path = Path(settings.home) / "demo-fleet.log"
    if not args.json:
        out(
            f"demo on {'the embedded default under ' + settings.home if settings.embedded else 'the configured services'}"
        )
        out(f"starting {args.workers} executors (log: {log_path})")
    procs = _start_fleet(settings, args.workers, log_path)
    try:
        _wait_ready(settings, procs, log_path)
        result = submit_documents(settings, [Path(args.path)], args.kb)
        doc_ids = [d.id for d in result.documents]
        rows, ended = wait_for_documents(settings, doc_ids, timeout_s=args.timeout, show=not args.json)
        failed = [r for r in rows.values() if r["run"] in ENDED and r["run"] != "done"]
        answers = {
            q: [_hit_dict(h) for h in search(settings, args.kb, q, k=3)] for q in args.query or QUERIES
        }
    finally:
        _stop_fleet(procs)
    if args.json:
        json_out({"documents": len(doc_ids), "ended": ended, "failed": len(failed), "answers": answers})
    else:
        from ingest.cli import render

        console = new_console()
        out(f"{len(doc_ids)} documents ingested, {len(failed)} failed; the executors are stopped")
        for query, hits in answers.items():
            out(f"\nsearch: {query}")
            render.hits(console, hits)
    for row in failed:
        err(f"document {row['name']} {row['run']}: {row['progress_msg']}")
    if not ended:
        err(f"timed out after {args.timeout:g} s")
    return EXIT_OK if ended and not failed else EXIT_FAILED


def add_verbs(verbs: Any, global_options: GlobalOptions) -> None:
    text = (
        "Start two executors, ingest examples/, search it, print the answers and stop the executors "
        "(with nothing configured: on SQLite and the embedded Redis, no service needed)."
    )
    sub = verbs.add_parser("demo", help=text, description=text)
    sub.set_defaults(func=cmd_demo)
    sub.add_argument("query", nargs="*", metavar="QUERY", help="questions to ask (two samples by default)")
    sub.add_argument("--path", default=str(EXAMPLES), help="what to ingest (default: the examples folder)")
    sub.add_argument("--kb", default="demo", metavar="NAME", help="knowledge base (demo)")
    sub.add_argument("--workers", type=int, default=2, metavar="N", help="executor processes (2)")
    sub.add_argument("--timeout", type=float, default=600.0, metavar="S", help="give up after S s (600)")
    sub.add_argument("--json", action="store_true", help="print JSON on stdout")
    global_options(sub, in_verb=True)
