"""``ingest``: the command line of the producer side (``python -m ingest`` too).

Verbs: ``init``, ``submit``, ``status``, ``cancel``, ``retry``, ``rm``, ``fleet``, ``search``;
``dataflow`` (:mod:`ingest.cli.dataflow`), ``memory`` (:mod:`ingest.cli.memory`), ``dead``
(:mod:`ingest.cli.dead`) and ``strike``, ``restore``, ``strikes`` (:mod:`ingest.cli.strikes`).
Settings come from the environment once (``Settings.from_env``); ``--db-url``, ``--redis-url``
and ``--key-prefix`` override it, before or after the verb. Exit status (README, "Exit
status"): 0 when everything asked was done, 1 when something was not (a refused file, a failed
document, an unknown id, a limit: one line on stderr, no traceback), 2 for a usage error, 3 when
the database or Redis cannot be reached (try again later), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from db.config import Settings, redact_url
from ingest.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    err,
    global_overrides,
    json_out,
    new_console,
    out,
)

_MYSQL_UNREACHABLE = {2002, 2003, 2005, 2006, 2013, 2055}


# -- verbs ---------------------------------------------------------------------------------


def cmd_init(settings: Settings, args: argparse.Namespace) -> int:
    from db.keys import Keys
    from db.schema import init_schema
    from db.streams import Streams, connect

    report = init_schema(settings.db_url)
    client = connect(settings)
    try:
        keys = Keys(settings.key_prefix)
        missing = [s for s in keys.queues if not _has_group(client, s, keys.group)]
        Streams(client, keys).ensure_group()
    finally:
        client.close()
    data = {
        "database": redact_url(settings.db_url),
        "created_database": report.created_database,
        "created_tables": report.created_tables,
        "added_columns": report.added_columns,
        "added_indexes": report.added_indexes,
        "dropped_indexes": report.dropped_indexes,
        "widened_columns": report.widened_columns,
        "collated_columns": report.collated_columns,
        "created_groups": missing,
        "changed": report.changed or bool(missing),
    }
    if not args.skip_model_export:
        from ingest.cli.model import ensure_export

        data["model_export"] = export = ensure_export(settings)
        data["changed"] = data["changed"] or export["state"] == "made"
    if args.json:
        json_out(data)
        return EXIT_OK
    from ingest.cli import render

    render.init_report(new_console(), data, group=Keys(settings.key_prefix).group)
    return EXIT_OK


def _has_group(client: Any, stream: str, group: str) -> bool:
    import redis

    try:
        return any(g["name"] == group for g in client.xinfo_groups(stream))
    except redis.ResponseError:  # no such stream
        return False


def cmd_submit(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.errors import PublishError
    from ingest.producer import submit_documents

    dataflow_id = None
    if args.dataflow:
        from ingest.dataflow.catalog import get_dataflow

        dataflow_id = get_dataflow(settings, args.dataflow, tenant_id=args.tenant)["id"]
    try:
        result = submit_documents(
            settings,
            args.paths,
            args.kb,
            tenant_id=args.tenant,
            priority=args.priority,
            dataflow_id=dataflow_id,
            follow_links=args.follow_links,
        )
    except PublishError as exc:
        partial = getattr(exc, "result", None)
        for origin, reason in partial.refused if partial else []:
            err(f"refused {origin}: {reason}")
        raise
    for origin, reason in result.refused:
        err(f"refused {origin}: {reason}")
    status = EXIT_FAILED if result.refused else EXIT_OK
    data: dict[str, Any] = result.to_dict()
    if not args.json:
        from ingest.cli import render

        render.submitted(new_console(), result)
    if args.wait and result.documents:
        from ingest.cli.wait import ENDED, wait_for_documents

        doc_ids = [d.id for d in result.documents]
        rows, ended = wait_for_documents(settings, doc_ids, timeout_s=args.timeout, show=not args.json)
        data["final"] = {d: rows.get(d) for d in doc_ids}
        bad = [r for r in rows.values() if r["run"] in ENDED and r["run"] != "done"]
        gone = [d for d in doc_ids if d not in rows]
        for row in bad:
            err(f"document {row['name']} ({row['id']}) {row['run']}: {row['progress_msg']}")
        for d in gone:
            err(f"document {d} was removed while waiting")
        if not ended:
            left = sum(1 for r in rows.values() if r["run"] not in ENDED)
            err(f"timed out after {args.timeout:g} s with {left} document(s) unfinished")
        if bad or gone or not ended:
            status = EXIT_FAILED
    if args.json:
        json_out(data)
    return status


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    import redis

    from ingest import status as st

    if args.id:
        data = st.describe(settings, args.id)
        if args.json:
            json_out(data)
        else:
            from ingest.cli import render

            render.described(new_console(), data)
        return EXIT_OK
    from ingest.tenants import standings

    data = st.summary(settings)
    code = EXIT_OK
    from ingest.errors import RetryableError
    from ingest.reindex import engine_counts

    try:
        data["vector_store"] = engine_counts(settings)
    except RetryableError as exc:
        data["vector_store"] = {"error": str(exc)}
        err(str(exc))
        code = EXIT_FAILED
    if data["vector_store"].get("differs"):
        code = EXIT_FAILED
    try:
        data["redis"] = st.redis_summary(settings)
        data["tenants"] = [s.to_dict() for s in standings(settings)]
    except redis.RedisError as exc:
        data["redis"] = {"error": f"Redis unreachable at {redact_url(settings.redis_url)}: {exc}"}
        err(data["redis"]["error"])
        code = EXIT_UNAVAILABLE
    if args.json:
        json_out(data)
    else:
        from ingest.cli import render
        from ingest.cli.tenants import render_standings

        console = new_console()
        render.summary(console, data)
        if "tenants" in data:
            render_standings(console, data["tenants"])
    return code


def cmd_cancel(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.control import cancel

    result = cancel(settings, args.id)
    if args.json:
        json_out(result.to_dict())
    elif result.task_ids:
        out(f"cancelled {len(result.task_ids)} task(s) of {result.target} {args.id}")
    if not result.task_ids:
        err(f"nothing to cancel: {result.target} {args.id} has no queued, running or held task")
        return EXIT_FAILED
    return EXIT_OK


def cmd_retry(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.control import retry

    result = retry(settings, args.id, failed=args.failed) if args.id else retry(settings, failed=True)
    for id_, why in result.skipped:
        err(f"not retried {id_}: {why}")
    if args.json:
        json_out(result.to_dict())
    else:
        live = len(result.task_ids) - result.published
        out(
            f"re-queued {len(result.task_ids)} task(s): {result.published} published, {live} still had a stream entry"
        )
    return EXIT_FAILED if result.skipped else EXIT_OK


def cmd_rm(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.control import remove_document, remove_kb

    if args.kb:
        result = remove_kb(settings, args.kb, tenant_id=args.tenant)
        what = f"knowledge base {args.kb}"
    else:
        result = remove_document(settings, args.doc_id)
        what = f"document {args.doc_id}"
    if args.json:
        json_out(result.to_dict())
    else:
        out(
            f"removed {what}: {len(result.doc_ids)} document(s), {result.tasks_removed} task(s), "
            f"{result.chunks_removed} chunk(s); {len(result.cancelled)} unfinished task(s) cancelled"
        )
    return EXIT_OK


def cmd_fleet(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.status import fleet
    from ingest.tenants import standings

    beats = fleet(settings)
    tenants = [s.to_dict() for s in standings(settings)]
    if args.json:
        json_out({"executors": beats, "tenants": tenants} if args.tenants else beats)
    else:
        from ingest.cli import render
        from ingest.cli.tenants import render_standings

        console = new_console()
        render.fleet(console, beats)
        render_standings(console, tenants)
    return EXIT_OK


def cmd_search(settings: Settings, args: argparse.Namespace) -> int:
    from db.database import connection, init_database
    from db.models import KnowledgeBase
    from ingest import ids
    from ingest.errors import NotFound

    if args.k > settings.search_max_k:
        err(f"-k {args.k} is more than the cap of {settings.search_max_k} hits (INGEST_SEARCH_MAX_K)")
        return EXIT_USAGE
    init_database(settings.db_url)
    with connection():
        if KnowledgeBase.get_or_none(KnowledgeBase.id == ids.kb_id(args.tenant, args.kb)) is None:
            raise NotFound(f"no knowledge base {args.kb!r} (tenant {args.tenant!r})")
    try:
        from ingest.search import search
    except ImportError as exc:
        err(f"search is not available here: {exc}")
        return EXIT_FAILED
    from ingest.cli.model import warnings_to_stderr

    warnings_to_stderr()
    hits = search(settings, args.kb, args.query, k=args.k, tenant_id=args.tenant, mode=args.mode)
    rows = [_hit_dict(h) for h in hits]
    if args.json:
        json_out(rows)
    else:
        from ingest.cli import render

        render.hits(new_console(), rows)
    return EXIT_OK


def cmd_reindex(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.reindex import reindex

    if args.json:
        done = reindex(settings, args.kb, tenant_id=args.tenant)
    else:
        from rich.progress import Progress

        with Progress(console=new_console(stderr=True), transient=True) as bar:
            tasks: dict[str, Any] = {}

            def show(name: str, written: int, total: int) -> None:
                if name not in tasks:
                    tasks[name] = bar.add_task(f"reindex {name}", total=max(total, 1))
                bar.update(tasks[name], completed=written)

            done = reindex(settings, args.kb, tenant_id=args.tenant, on_progress=show)
    if args.json:
        json_out([c.to_dict() for c in done])
    else:
        for c in done:
            out(
                f"reindexed {c.name} (tenant {c.tenant_id}): {c.rows} vectors written, {c.engine} in the engine"
            )
    return EXIT_OK if all(c.rows == c.engine for c in done) else EXIT_FAILED


def _hit_dict(hit: Any) -> dict[str, Any]:
    fields = ("doc_id", "doc_name", "page", "last_page", "score", "content", "chunk_id")
    return {f: (hit.get(f) if isinstance(hit, dict) else getattr(hit, f, None)) for f in fields}


# -- parser --------------------------------------------------------------------------------


def _global_options(parser: argparse.ArgumentParser, *, in_verb: bool) -> None:
    # On a verb the default is SUPPRESS, so an option given before the verb is not undone.
    default = argparse.SUPPRESS if in_verb else None
    group = parser.add_argument_group(
        "connection (override INGEST_DB_URL, INGEST_REDIS_URL, INGEST_KEY_PREFIX)"
    )
    group.add_argument(
        "--db-url",
        default=default,
        help="database URL (mysql://…, sqlite:///relative.db or sqlite:////absolute.db)",
    )
    group.add_argument("--redis-url", default=default, help="Redis URL")
    group.add_argument("--key-prefix", default=default, help="prefix of every Redis key")
    group.add_argument(
        "--vector-store",
        default=default,
        help="where vectors are searched (INGEST_VECTOR_STORE): mysql, milvus:///PATH.db or http(s)://HOST:19530",
    )
    group.add_argument("--traceback", action="store_true", default=default, help="show a traceback on errors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ingest",
        description="Enqueue documents for the executor fleet, follow them, search the result.",
    )
    _global_options(parser, in_verb=False)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    def verb(
        name: str, func: Callable[[Settings, argparse.Namespace], int], text: str, *, json: bool = True
    ) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=text, description=text)
        sub.set_defaults(func=func)
        if json:
            sub.add_argument("--json", action="store_true", help="print JSON on stdout")
        _global_options(sub, in_verb=True)
        return sub

    sub = verb(
        "init",
        cmd_init,
        "Create the database if missing, the tables (bringing an older schema up to date) and the "
        "consumer group, and the model's ONNX export for searches when missing (`ingest model "
        "export`); on a current setup it changes nothing.",
    )
    sub.add_argument(
        "--skip-model-export", action="store_true", help="do not make the model's ONNX export when missing"
    )
    sub = verb("submit", cmd_submit, "Store files' bytes, write their rows and publish one message per task.")
    sub.add_argument("paths", nargs="+", metavar="PATH", help="a file, or a folder (the files under it)")
    sub.add_argument("--kb", required=True, metavar="NAME", help="knowledge base (created when missing)")
    sub.add_argument("--tenant", default="default", metavar="ID", help="tenant of the knowledge base")
    sub.add_argument("--priority", type=int, choices=(0, 1), default=0, help="1 is read before 0")
    sub.add_argument("--wait", action="store_true", help="show progress until every document ends")
    sub.add_argument(
        "--timeout", type=float, default=None, metavar="S", help="with --wait: give up after S s"
    )
    sub.add_argument("--dataflow", metavar="NAME", help="run this dataflow on each file instead of parse")
    sub.add_argument(
        "--follow-links",
        action="store_true",
        help="read symbolic links wherever they point (default: a link out of a submitted folder, "
        "or a link named directly, is refused)",
    )
    sub = verb("status", cmd_status, "Counts of tasks and documents, or one task or document.")
    sub.add_argument("id", nargs="?", metavar="TASK_OR_DOC_ID")
    sub = verb("cancel", cmd_cancel, "Cancel a task, or every unfinished task of a document.")
    sub.add_argument("id", metavar="TASK_OR_DOC_ID")
    sub = verb("retry", cmd_retry, "Re-queue failed, dead or cancelled tasks and publish them afresh.")
    which = sub.add_mutually_exclusive_group(required=True)
    which.add_argument("id", nargs="?", metavar="TASK_OR_DOC_ID")
    which.add_argument(
        "--failed", action="store_true", help="every failed or dead task of a current generation"
    )
    sub = verb("rm", cmd_rm, "Remove a document, or a whole knowledge base: rows, chunks and bytes.")
    which = sub.add_mutually_exclusive_group(required=True)
    which.add_argument("doc_id", nargs="?", metavar="DOC_ID")
    which.add_argument("--kb", metavar="NAME", help="remove this knowledge base")
    sub.add_argument("--tenant", default="default", metavar="ID", help="tenant of the knowledge base")
    sub = verb("fleet", cmd_fleet, "Live executors and their heartbeats, and each tenant's standing.")
    sub.add_argument(
        "--tenants",
        action="store_true",
        help='with --json: {"executors": [...], "tenants": [...]} instead of the executors alone',
    )
    sub = verb("search", cmd_search, "The chunks of a knowledge base closest to a query.")
    sub.add_argument("query", metavar="QUERY")
    sub.add_argument("--kb", required=True, metavar="NAME")
    sub.add_argument("--tenant", default="default", metavar="ID")
    sub.add_argument(
        "-k",
        type=int,
        default=5,
        metavar="N",
        help="how many chunks (default 5, at most INGEST_SEARCH_MAX_K)",
    )
    sub.add_argument(
        "--mode",
        choices=("dense", "keyword", "hybrid"),
        default="hybrid",
        help="dense (vectors), keyword (full-text) or hybrid (both, rank-fused; the default)",
    )
    sub = verb(
        "reindex",
        cmd_reindex,
        "Rebuild the vector engine (INGEST_VECTOR_STORE) from the chunk rows: one knowledge base or all.",
    )
    sub.add_argument("--kb", metavar="NAME", help="only this knowledge base")
    sub.add_argument("--tenant", default="default", metavar="ID")
    from ingest.cli import admin, dataflow, dead, demo, memory, model, prune, strikes, tenants

    tenants.add_verbs(verbs, _global_options)
    prune.add_verbs(verbs, _global_options)
    dataflow.add_verbs(verbs, _global_options)
    memory.add_verbs(verbs, _global_options)
    model.add_verbs(verbs, _global_options)
    dead.add_verbs(verbs, _global_options)
    strikes.add_verbs(verbs, _global_options)
    admin.add_verbs(verbs, _global_options)
    demo.add_verbs(verbs, _global_options)
    return parser


# -- errors --------------------------------------------------------------------------------


def _db_code(exc: BaseException) -> int | None:
    for candidate in (exc, exc.__cause__, exc.__context__):
        args = getattr(candidate, "args", ())
        if args and isinstance(args[0], int):
            return args[0]
    return None


def explain(exc: BaseException, settings: Settings | None) -> str | None:
    """One line for an error a person can act on; None for a bug (shown with its traceback)."""
    import peewee
    import pymysql
    import redis

    from ingest.errors import IngestError

    db_url = redact_url(settings.db_url) if settings else "the database"
    redis_url = redact_url(settings.redis_url) if settings else "Redis"
    if isinstance(exc, (IngestError, LookupError)):
        return str(exc).strip("'\"") if isinstance(exc, KeyError) else str(exc)
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return f"Redis unreachable at {redis_url}: {exc}"
    if isinstance(exc, redis.RedisError):
        return f"Redis error at {redis_url}: {exc}"
    if isinstance(exc, (peewee.DatabaseError, peewee.InterfaceError, pymysql.err.MySQLError)):
        code = _db_code(exc)
        if code in _MYSQL_UNREACHABLE:
            return f"database unreachable at {db_url}: {exc}"
        if code == 1049:
            return f"database missing at {db_url}: run `ingest init`"
        if code == 1146 or "no such table" in str(exc):
            return f"tables missing in {db_url}: run `ingest init` ({exc})"
        if code == 1045:
            return f"database refused the credentials for {db_url}: {exc}"
        return f"database error at {db_url}: {exc}"
    if isinstance(exc, (ValueError, OSError)):
        return str(exc)
    return None


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database or Redis cannot be reached (exit status 3)."""
    import peewee
    import pymysql
    import redis

    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return True
    if isinstance(exc, (peewee.DatabaseError, peewee.InterfaceError, pymysql.err.MySQLError)):
        return _db_code(exc) in _MYSQL_UNREACHABLE
    return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings: Settings | None = None
    try:
        settings = Settings.from_env(os.environ, **global_overrides(args))
        from ingest import vectors

        vectors.use(settings)
        if not getattr(args, "needs_services", True):
            return int(args.func(settings, args))
        from db.embedded import held

        with held(settings.redis_url, settings.home):  # the embedded Redis, while the verb runs
            return int(args.func(settings, args))
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    except Exception as exc:
        line = explain(exc, settings)
        if line is None or args.traceback:
            raise
        err(line)
        return EXIT_UNAVAILABLE if unavailable(exc) else EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
