"""The one database object: MySQL/MariaDB through a pymysql pool, or SQLite, chosen by URL.

Models bind to :data:`database`, a proxy initialised once by :func:`init_database`. Connections
are per thread (peewee), so one unit of work runs inside one :func:`unit` call:
``with unit(): ...`` opens a pooled connection and a transaction and gives both back at the end;
a transaction never spans two thread hops.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import peewee
from playhouse.pool import PooledMySQLDatabase, PooledSqliteDatabase
from pymysql.constants import CLIENT, SERVER_STATUS

database = peewee.DatabaseProxy()
_init_lock = threading.Lock()
_current_url: str | None = None

# Errors that mean "the database was unreachable or the connection broke": retry, don't fail.
RETRYABLE_DB_ERRORS: tuple[type[Exception], ...] = (peewee.OperationalError, peewee.InterfaceError)

# A database name from a URL: these characters only, at most 64 (MySQL's limit); always backquoted.
_DATABASE_NAME = re.compile(r"[A-Za-z0-9_$-]{1,64}")


def quote_name(name: str) -> str:
    """``name`` as a backquoted MySQL identifier, after checking it against the allowed set."""
    if not _DATABASE_NAME.fullmatch(name):
        raise ValueError(
            f"database name {name!r}: use at most 64 of the letters A-Z a-z, the digits, '_', '$' and '-'"
        )
    return f"`{name}`"


@dataclass(frozen=True)
class DbUrl:
    kind: str  # "mysql" | "sqlite"
    name: str  # database name, or the SQLite path
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, url: str) -> DbUrl:
        parsed = urlsplit(url)  # not urlparse: it would cut a ';…' off the path unseen
        if parsed.scheme == "sqlite":
            # The usual rule: what follows "sqlite:///" is the path, so sqlite:///data.db is
            # relative (to the working directory) and sqlite:////var/lib/ingest.db absolute.
            if not url.startswith("sqlite:///"):
                raise ValueError(
                    f"a sqlite URL is sqlite:///relative/path or sqlite:////absolute/path: {url!r}"
                )
            path = unquote(url[len("sqlite:///") :])
            if not path:
                raise ValueError(f"sqlite URL needs a path: {url!r}")
            return cls(kind="sqlite", name=path)
        if parsed.scheme in ("mysql", "mariadb", "mysql+pymysql"):
            name = parsed.path.lstrip("/")
            if not name:
                raise ValueError(f"database URL names no database: {url!r}")
            quote_name(name)  # refuse what could not be a plain identifier
            opts = tuple((k, v[-1]) for k, v in parse_qs(parsed.query).items())
            return cls(
                kind="mysql",
                name=name,
                host=parsed.hostname or "127.0.0.1",
                port=parsed.port or 3306,
                user=unquote(parsed.username or "root"),
                password=unquote(parsed.password or ""),
                options=opts,
            )
        raise ValueError(f"unsupported database URL {url!r}: use mysql://… or sqlite:///PATH")


def _mysql_kwargs(url: DbUrl) -> dict[str, Any]:
    opts = dict(url.options)
    return {
        "host": url.host,
        "port": url.port,
        "user": url.user,
        "password": url.password,
        "charset": "utf8mb4",
        # A fenced UPDATE must tell whether it matched, not only whether it changed a row. No
        # MULTI_STATEMENTS: one query is one statement, whatever text reaches it.
        "client_flag": CLIENT.FOUND_ROWS,
        "connect_timeout": float(opts.get("connect_timeout", 5)),
        "read_timeout": float(opts.get("read_timeout", 60)),
        "write_timeout": float(opts.get("write_timeout", 60)),
    }


class _MySQLPool(PooledMySQLDatabase):
    """The pool, minus a ROLLBACK round trip each time a connection goes back: pymysql keeps the
    server's status flags, so roll back only where a transaction was really left open."""

    def _can_reuse(self, conn: Any) -> bool:
        status = getattr(conn, "server_status", None)
        if status is None:
            return bool(super()._can_reuse(conn))
        if status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
            try:
                conn.rollback()
            except Exception:
                return False
        return True


def make_database(url: str, *, max_connections: int = 32) -> peewee.Database:
    parsed = DbUrl.parse(url)
    if parsed.kind == "sqlite":
        if parsed.name != ":memory:":
            os.makedirs(os.path.dirname(parsed.name) or ".", exist_ok=True)
        return PooledSqliteDatabase(
            parsed.name,
            max_connections=max_connections,
            stale_timeout=300,
            timeout=30,
            autoconnect=False,
            pragmas={"journal_mode": "wal", "busy_timeout": 30000, "synchronous": "normal"},
            check_same_thread=False,
            # Every transaction takes the write lock when it begins. A DEFERRED one that read and
            # then writes fails at once ("database is locked", the busy timeout does not apply)
            # when another connection committed after its read; IMMEDIATE waits its turn.
            lock_type="IMMEDIATE",
        )
    return _MySQLPool(
        parsed.name,
        max_connections=max_connections,
        stale_timeout=300,
        timeout=30,
        autoconnect=False,
        **_mysql_kwargs(parsed),
    )


def create_database_if_missing(url: str) -> bool:
    """Create the MySQL database named in ``url``; True when it did not exist."""
    parsed = DbUrl.parse(url)
    if parsed.kind != "mysql":
        return False
    import pymysql

    conn = pymysql.connect(**_mysql_kwargs(parsed))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (parsed.name,))
            if cur.fetchone():
                return False
            cur.execute(
                f"CREATE DATABASE IF NOT EXISTS {quote_name(parsed.name)} "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            )
            return True
    finally:
        conn.close()


def init_database(url: str, *, max_connections: int = 32) -> peewee.Database:
    """Bind the models to the database at ``url`` (once per URL; a new URL rebinds)."""
    global _current_url
    with _init_lock:
        if _current_url == url and database.obj is not None:
            return database.obj
        if database.obj is not None:
            close_database()
        database.initialize(make_database(url, max_connections=max_connections))
        _current_url = url
        return database.obj


def close_database() -> None:
    global _current_url
    obj = database.obj
    if obj is not None:
        with contextlib.suppress(Exception):
            obj.close_all() if hasattr(obj, "close_all") else obj.close()
    _current_url = None


def is_mysql() -> bool:
    return isinstance(database.obj, peewee.MySQLDatabase)


@contextlib.contextmanager
def unit() -> Iterator[peewee.Database]:
    """One pooled connection and one transaction, for one thread hop.

    On SQLite the transaction begins IMMEDIATE (see :func:`make_database`): units are serialised
    like writers; a read that needs no transaction can use :func:`connection`.
    """
    db = database.obj
    if db is None:
        raise RuntimeError("database not initialised: call db.database.init_database(url)")
    with db.connection_context(), db.atomic():
        yield db


@contextlib.contextmanager
def connection() -> Iterator[peewee.Database]:
    """A pooled connection without a transaction (autocommit statements)."""
    db = database.obj
    if db is None:
        raise RuntimeError("database not initialised: call db.database.init_database(url)")
    with db.connection_context():
        yield db


def lock_for_update(query: peewee.Select) -> peewee.Select:
    """``SELECT … FOR UPDATE`` where the database has it (SQLite locks the whole file anyway)."""
    return query.for_update() if is_mysql() else query
