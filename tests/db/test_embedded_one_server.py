"""Never two servers on one home's append-only file: a server that still runs but does not
answer is waited for (loading, busy: here stopped by SIGSTOP), never doubled; one whose socket
file was removed (a /tmp cleaner) is stopped cleanly, its data written out, and started again."""

from __future__ import annotations

import os
import signal

import pytest
import redis

import db.embedded
from db.embedded import EmbeddedRedis
from tests.db.embedded_support import own_home, servers_on

__all__ = ["own_home"]


def test_a_server_whose_socket_was_removed_is_stopped_before_one_starts_again(own_home):
    server = EmbeddedRedis(own_home)
    server.attach(pid=1)
    (first,) = servers_on(own_home)
    client = redis.Redis.from_url(server.url)
    client.set("kept", "1")
    client.close()
    server.socket.unlink()  # the server runs on, unreachable
    assert not server.answers()
    EmbeddedRedis(own_home).attach(pid=1)  # the next process to need it
    (now,) = servers_on(own_home)  # one server, not two on one append-only file
    assert now != first and server.answers()
    client = redis.Redis.from_url(server.url)
    assert client.get("kept") == b"1"  # the first wrote its append-only file out as it stopped
    client.close()
    assert server.detach(pid=1) is False and server.detach(pid=1) is True
    assert servers_on(own_home) == []


def test_a_server_that_runs_but_does_not_answer_is_waited_for_never_doubled(own_home, monkeypatch):
    server = EmbeddedRedis(own_home)
    server.attach(pid=1)
    (first,) = servers_on(own_home)
    monkeypatch.setattr(db.embedded, "START_TIMEOUT_S", 3.0)
    os.kill(first, signal.SIGSTOP)  # stands in for an append-only file that loads for long, a busy server
    try:
        with pytest.raises(RuntimeError, match="not starting a second one"):
            EmbeddedRedis(own_home).attach(pid=1)
        assert servers_on(own_home) == [first] and server.socket.exists()
    finally:
        os.kill(first, signal.SIGCONT)
    EmbeddedRedis(own_home).attach(pid=1)
    assert servers_on(own_home) == [first] and server.answers()
    assert server.detach(pid=1) is False and server.detach(pid=1) is True
    assert servers_on(own_home) == []
