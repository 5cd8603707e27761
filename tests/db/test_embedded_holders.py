"""The embedded Redis counts every attachment, not every process: a service that opens a
``Client`` per request keeps the server while any of its clients is open, and the server stops
only when no attachment of any live process is left."""

from __future__ import annotations

from db.embedded import EmbeddedRedis
from db.streams import connect
from ingest import Client
from tests.db.embedded_support import own_home, servers_on

__all__ = ["own_home"]


def test_closing_one_client_keeps_the_server_for_another_client_of_the_process(own_home):
    env = {"INGEST_HOME": own_home}
    first, second = Client(environ=env), Client(environ=env)
    server = EmbeddedRedis(own_home)
    assert server.answers() and len(servers_on(own_home)) == 1
    first.close()
    assert server.answers()  # the second client still holds it
    client = connect(second.settings)
    try:
        assert client.ping()
    finally:
        client.close()
    second.close()  # the last attachment: stopped
    assert not server.answers() and servers_on(own_home) == []


def test_a_detach_removes_one_attachment_of_the_process(own_home):
    server = EmbeddedRedis(own_home)
    server.attach(pid=1)
    server.attach(pid=1)
    server.attach()
    assert server.live_holders().count(1) == 2
    assert server.detach(pid=1) is False and server.live_holders().count(1) == 1
    assert server.detach() is False  # pid 1 holds it once more
    assert server.answers()
    assert server.detach(pid=1) is True
    assert not server.answers()
