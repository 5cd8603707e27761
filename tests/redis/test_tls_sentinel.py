"""``rediss+sentinel://``: a TLS-only master found through a TLS-only Sentinel (certificates made
here, client certificates required by both). Every connection the client makes (to the Sentinel,
to the master it names) is TLS, and a task runs through it: redis-py's Sentinel pool drops
``ssl`` when it is given a connection class, so the class must be a TLS one (it was not: every
connection failed with a TypeError, and a plain-text one would have been refused)."""

from __future__ import annotations

import redis
from redis.connection import SSLConnection

from db.keys import Keys
from db.models import DONE
from db.redis_client import connect
from db.streams import Streams
from tests.executor.support import enqueue, row, running_daemon, task_spec
from tests.helpers import await_until
from tests.procs import free_port
from tests.redis.conftest import settings_on
from tests.redis_servers import RedisServer, make_certificates, require, tls_redis

MASTER = "ingest"


def _tls_sentinel(d, certs, master_port: int) -> RedisServer:
    port = free_port()
    d.mkdir(parents=True)
    conf = d / "sentinel.conf"
    conf.write_text(
        f"port 0\ntls-port {port}\nbind 127.0.0.1\n"
        f"tls-cert-file {certs.server_cert}\ntls-key-file {certs.server_key}\n"
        f"tls-client-cert-file {certs.client_cert}\ntls-client-key-file {certs.client_key}\n"
        f"tls-ca-cert-file {certs.ca}\ntls-auth-clients yes\ntls-replication yes\n"
        f"sentinel monitor {MASTER} 127.0.0.1 {master_port} 1\n"
    )
    ping = {"host": "127.0.0.1", "port": port, "ssl": True, "ssl_ca_certs": str(certs.ca),
            "ssl_certfile": str(certs.client_cert), "ssl_keyfile": str(certs.client_key)}  # fmt: skip
    return RedisServer(d, [str(conf), "--sentinel"], port=port, ping=ping)


async def test_a_task_runs_through_a_tls_sentinel_and_its_tls_master(tmp_path, test_name):
    require("redis-server", "openssl")
    certs = make_certificates(tmp_path / "certs")
    master = tls_redis(tmp_path / "master", certs)
    sentinel = _tls_sentinel(tmp_path / "sentinel", certs, master.port)
    tls = {
        "redis_tls_ca_file": str(certs.ca),
        "redis_tls_cert_file": str(certs.client_cert),
        "redis_tls_key_file": str(certs.client_key),
    }
    url = f"rediss+sentinel://127.0.0.1:{sentinel.port}/{MASTER}/0"
    try:
        with settings_on(test_name, redis_url=url, **tls) as s:
            for bounded in (None, 4):  # the plain pool and the bounded one (the HTTP API's)
                client = connect(s, max_connections=bounded)
                try:
                    assert issubclass(client.connection_pool.connection_class, SSLConnection)
                    client.set(f"{s.key_prefix}:probe", "over tls")
                    assert client.get(f"{s.key_prefix}:probe") == "over tls"
                finally:
                    client.close()
            streams = Streams(connect(s), Keys(s.key_prefix))
            (tid,) = enqueue(streams, [task_spec("noop")])
            async with running_daemon(s):
                await await_until(lambda: row(tid)["status"] == DONE, 30)
            plain = redis.Redis(port=master.port, socket_timeout=2)  # no TLS: refused
            try:
                plain.ping()
                raise AssertionError("the master answered a plain-text client")
            except redis.ConnectionError:
                pass
            finally:
                plain.close()
            streams.client.close()
    finally:
        sentinel.close()
        master.close()
