"""Issue 17 hole 5 (database part): a MySQL connection runs one statement per query (no
MULTI_STATEMENTS), and a database name from a URL is letters, digits, ``_``, ``$`` and ``-`` (at
most 64), always backquoted, so no name can carry a second statement."""

from __future__ import annotations

import uuid

import peewee
import pymysql
import pytest

from db.database import DbUrl, create_database_if_missing, make_database
from tests.conftest import MYSQL_BASE


def _server() -> pymysql.Connection:
    parsed = DbUrl.parse(f"{MYSQL_BASE}/mysql")
    return pymysql.connect(host=parsed.host, port=parsed.port, user=parsed.user, password=parsed.password)


def _exists(cur, name: str) -> bool:
    cur.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (name,))
    return cur.fetchone() is not None


def test_a_second_statement_in_a_database_name_never_runs():
    first, second = f"it_{uuid.uuid4().hex[:12]}", f"it_{uuid.uuid4().hex[:12]}"
    # the ';' sits before the last '/', so the URL parser leaves it in the path
    url = f"{MYSQL_BASE}/{first}`;CREATE DATABASE `{second}/x"
    conn = _server()
    try:
        with pytest.raises(ValueError, match="database name"):
            create_database_if_missing(url)
        with conn.cursor() as cur:
            assert not _exists(cur, first) and not _exists(cur, f"{second}/x")
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{first}`")
            cur.execute(f"DROP DATABASE IF EXISTS `{second}/x`")
        conn.close()


@pytest.mark.parametrize(
    "name",
    ["a`b", "a b", "a;b", "a/b", "a%3Bb", "é", "x" * 65],
)
def test_a_database_name_outside_the_allowed_characters_is_refused(name):
    with pytest.raises(ValueError, match="database name"):
        DbUrl.parse(f"mysql://root@127.0.0.1:3306/{name}")


def test_a_name_with_a_dash_and_a_dollar_is_created_backquoted():
    name = f"it-{uuid.uuid4().hex[:12]}$x"
    conn = _server()
    try:
        assert create_database_if_missing(f"{MYSQL_BASE}/{name}")
        assert not create_database_if_missing(f"{MYSQL_BASE}/{name}")
        with conn.cursor() as cur:
            assert _exists(cur, name)
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


def test_a_mysql_connection_runs_one_statement_per_query(settings):
    db = make_database(settings.db_url, max_connections=1)
    try:
        with db.connection_context():
            assert db.execute_sql("SELECT 1").fetchone() == (1,)
            with pytest.raises(peewee.ProgrammingError):
                db.execute_sql("SELECT 1; SELECT 2")
    finally:
        db.close_all()
