"""The MySQL pool's round trips: a connection given back moments ago is handed out again without
a ping; one idle longer is pinged (and replaced when the server dropped it); one whose socket
pymysql closed is never handed out."""

from __future__ import annotations

import pymysql
import pytest

import db.database as database_module
from db.database import DbUrl, _mysql_kwargs, connection, database, unit


@pytest.fixture
def pings(monkeypatch):
    counted = []
    real = pymysql.connections.Connection.ping

    def ping(self, *args, **kwargs):
        counted.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pymysql.connections.Connection, "ping", ping)
    return counted


def _thread_id() -> int:
    with unit() as db:
        return int(db.execute_sql("SELECT CONNECTION_ID()").fetchone()[0])


def test_a_connection_given_back_moments_ago_is_reused_without_a_ping(db, pings):
    first = _thread_id()
    pings.clear()
    for _ in range(5):
        assert _thread_id() == first
    assert pings == []


def test_a_connection_idle_longer_is_pinged_and_a_dropped_one_replaced(settings, db, pings, monkeypatch):
    first = _thread_id()
    monkeypatch.setattr(database_module, "PING_AFTER_IDLE_S", 0.0)
    pings.clear()
    assert _thread_id() == first
    assert len(pings) == 1
    killer = pymysql.connect(**_mysql_kwargs(DbUrl.parse(settings.db_url)))
    try:  # the server drops the pooled connection while it is idle
        killer.cursor().execute(f"KILL {first}")
    finally:
        killer.close()
    pings.clear()
    assert _thread_id() != first  # the ping found it dead: a new connection instead
    assert pings


def test_a_connection_whose_socket_pymysql_closed_is_never_handed_out(db, pings):
    first = _thread_id()
    with connection():
        raw = database.obj.connection()
    raw.close()  # as pymysql does when a statement's socket breaks
    assert not raw.open
    assert _thread_id() != first
