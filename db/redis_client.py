"""Redis clients: every client of the project is made here (:func:`connect`), from the URL and
the password and TLS settings, whatever the URL's form.

- ``redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]``: plain TCP.
- ``rediss://…``: TLS. ``INGEST_REDIS_TLS_CA_FILE`` names the CA to trust (the system's when
  empty), ``INGEST_REDIS_TLS_CERT_FILE`` and ``INGEST_REDIS_TLS_KEY_FILE`` a client certificate;
  the server's certificate must name the host (``INGEST_REDIS_TLS_CHECK_HOSTNAME``, on).
- ``unix:///PATH/redis.sock[?db=N]``: a local socket.
- ``redis+sentinel://[USER[:PASSWORD]@]HOST:PORT,HOST:PORT/MASTER[/DB]`` (``rediss+sentinel://``
  for TLS to the Sentinels and the master): the master's address is asked of the Sentinels at
  each connection, so a client follows a failover on its next reconnect.
  ``INGEST_REDIS_SENTINEL_PASSWORD`` is the Sentinels' own password (``requirepass`` of
  ``sentinel.conf``), apart from the master's.
- ``redis+cluster://[USER[:PASSWORD]@]HOST:PORT,HOST:PORT`` (``rediss+cluster://``): a Redis
  Cluster; every key of one prefix carries one hash tag (:func:`cluster_prefix`).

``INGEST_REDIS_PASSWORD`` (or ``INGEST_REDIS_PASSWORD_FILE``) wins over a password in the URL.

A plain URL's connection that Redis answers ``READONLY`` (the server it reached is a replica now:
a failover behind a DNS name or a virtual address) is dialled again before its next command, so a
client follows the failover as a Sentinel URL's does; the error itself is raised (an outage).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import AbstractConnection, Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import MaxConnectionsError, ReadOnlyError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

# Every client of the project (executors, CLI, the HTTP API's pool): timeouts longer than the
# longest blocking read; bytes that are not UTF-8 (a producer outside the contract) decode as
# U+FFFD instead of failing the whole reply, so such a message is dead-lettered as not JSON.
CLIENT_OPTIONS: dict[str, Any] = {
    "decode_responses": True,
    "encoding_errors": "replace",
    "socket_timeout": 10,
    "socket_connect_timeout": 5,
    "socket_keepalive": True,
    "health_check_interval": 30,
}

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
PLAIN_SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is and how to sign in: the URL and the settings that go with it."""

    url: str
    password: str = ""
    sentinel_password: str = ""
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_check_hostname: bool = True

    @classmethod
    def of(cls, target: Any) -> RedisTarget:
        """From a :class:`~db.config.Settings` (anything with its ``redis_*`` fields) or a URL."""
        if isinstance(target, RedisTarget):
            return target
        if isinstance(target, str):
            return cls(url=target)
        return cls(
            url=target.redis_url,
            password=target.redis_password,
            sentinel_password=target.redis_sentinel_password,
            tls_ca_file=target.redis_tls_ca_file,
            tls_cert_file=target.redis_tls_cert_file,
            tls_key_file=target.redis_tls_key_file,
            tls_check_hostname=target.redis_tls_check_hostname,
        )

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme.lower()

    @property
    def tls(self) -> bool:
        return self.scheme.startswith("rediss")

    def check(self) -> None:
        """``ValueError`` naming the forms when the URL is none of them."""
        if self.scheme not in PLAIN_SCHEMES + SENTINEL_SCHEMES + CLUSTER_SCHEMES:
            raise ValueError(
                f"INGEST_REDIS_URL: unsupported scheme {self.scheme!r}: use redis://, rediss://, unix://, "
                "redis+sentinel://HOST:PORT,…/MASTER/DB or redis+cluster://HOST:PORT,…"
            )
        if self.scheme in SENTINEL_SCHEMES and len(_path_parts(self.url)) < 1:
            raise ValueError(
                "INGEST_REDIS_URL: a Sentinel URL names its master: redis+sentinel://HOST:PORT,…/MASTER/DB"
            )

    def auth_options(self) -> dict[str, Any]:
        """Username and password of the master (or server, or cluster nodes)."""
        user, password = _userinfo(self.url)
        out: dict[str, Any] = {}
        if user:
            out["username"] = user
        if self.password or password:
            out["password"] = self.password or password
        return out

    def tls_options(self) -> dict[str, Any]:
        if not self.tls:
            return {}
        out: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": self.tls_check_hostname}
        if self.tls_ca_file:
            out["ssl_ca_certs"] = self.tls_ca_file
        if self.tls_cert_file:
            out["ssl_certfile"] = self.tls_cert_file
        if self.tls_key_file:
            out["ssl_keyfile"] = self.tls_key_file
        return out


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


def cluster_prefix(prefix: str) -> str:
    """The key prefix on a Cluster: wrapped as a hash tag (``{ingest}``) unless it holds one, so
    every key of the prefix (streams, groups, the keys Lua builds) lives on one slot."""
    return prefix if "{" in prefix and "}" in prefix.split("{", 1)[1] else "{" + prefix + "}"


def on_node_of(client: Any, key: str) -> dict[str, Any]:
    """Options that send a command without a key (``CLIENT ID``, ``CLIENT UNBLOCK``, ``INFO``)
    to the node that holds ``key`` on a Cluster (there ``client`` picks a node of its own);
    nothing elsewhere."""
    if isinstance(client, redis.RedisCluster):
        return {"target_nodes": client.get_node_from_key(key)}
    return {}


def _userinfo(url: str) -> tuple[str, str]:
    netloc = urlsplit(url).netloc
    if "@" not in netloc:
        return "", ""
    info = netloc.rsplit("@", 1)[0]
    user, _, password = info.partition(":")
    return unquote(user), unquote(password)


def _hosts(url: str) -> list[tuple[str, int]]:
    """``HOST:PORT,HOST:PORT`` of a Sentinel or Cluster URL."""
    netloc = urlsplit(url).netloc.rsplit("@", 1)[-1]
    out = []
    for part in netloc.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host:
            host, port = port, ""
        out.append((host.strip("[]"), int(port) if port else 26379 if "sentinel" in url else 6379))
    return out


def _path_parts(url: str) -> list[str]:
    return [p for p in urlsplit(url).path.split("/") if p]


def connect(
    target: Any,
    *,
    max_connections: int | None = None,
    pool_timeout_s: float = 10.0,
    single_connection: bool = False,
    retries: bool = True,
    **options: Any,
) -> redis.Redis:
    """A client for ``target`` (a Settings or a URL): :data:`CLIENT_OPTIONS`, then ``options``.

    ``max_connections``: a pool of that size whose callers wait up to ``pool_timeout_s`` for a
    free connection (the HTTP API). ``single_connection``: one connection of its own (a
    blocking reader). ``retries=False``: no hidden retry of a command (a retried read could
    take entries whose first reply was lost)."""
    spec = RedisTarget.of(target)
    spec.check()
    kwargs: dict[str, Any] = {**CLIENT_OPTIONS, "retry_on_timeout": False, **options}
    if spec.scheme == "unix":
        kwargs.pop("socket_keepalive", None)  # a unix socket takes no TCP keepalive
    if not retries:
        kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs.update(spec.auth_options())
    kwargs.update(spec.tls_options())
    if spec.scheme in CLUSTER_SCHEMES:
        return _cluster(spec, kwargs)  # type: ignore[return-value]  # same commands, routed
    if spec.scheme in SENTINEL_SCHEMES:
        pool: redis.ConnectionPool = _sentinel_pool(spec, kwargs, max_connections, pool_timeout_s)
    elif max_connections:
        pool = redis.BlockingConnectionPool.from_url(
            _plain_url(spec.url),
            max_connections=max_connections,
            timeout=pool_timeout_s,
            connection_class=_REDIALLING[spec.scheme],
            **kwargs,
        )
    else:
        pool = redis.ConnectionPool.from_url(
            _plain_url(spec.url), connection_class=_REDIALLING[spec.scheme], **kwargs
        )
    return redis.Redis(connection_pool=pool, single_connection_client=single_connection)


# What a master that turns into a replica (FAILOVER, a Sentinel's) answers a blocked read.
DEMOTED_UNBLOCKED = "UNBLOCKED force unblock from blocking operation, instance state changed"


class _RedialsAfterReadOnly(AbstractConnection):
    """A connection that hangs up before its next command once Redis answered it ``READONLY``:
    the next command dials the URL again, and finds the master it names now. Not at once: the
    replies a pipeline still has on the socket are read first (the error raised is the first).
    A blocked read that the demotion ended is answered as a write would be: ``READONLY``."""

    _demoted = False

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except ReadOnlyError:
            self._demoted = True
            raise
        except redis.ResponseError as exc:
            if not str(exc).startswith(DEMOTED_UNBLOCKED):
                raise
            self._demoted = True
            raise ReadOnlyError(f"the server became a replica: {exc}") from exc

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self._demoted:
            self._demoted = False
            self.disconnect()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        super().send_packed_command(command, check_health=check_health)  # type: ignore[no-untyped-call]


class _PlainConnection(_RedialsAfterReadOnly, Connection):
    pass


class _TlsConnection(_RedialsAfterReadOnly, SSLConnection):
    pass


class _UnixConnection(_RedialsAfterReadOnly, UnixDomainSocketConnection):
    pass


_REDIALLING: dict[str, type[Connection] | type[UnixDomainSocketConnection]] = {
    "redis": _PlainConnection,
    "rediss": _TlsConnection,
    "unix": _UnixConnection,
}


def _plain_url(url: str) -> str:
    """The URL without its password: the password goes as an option (the setting wins)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    info, host = parts.netloc.rsplit("@", 1)
    user = info.partition(":")[0]
    return parts._replace(netloc=f"{user}@{host}" if user else host).geturl()


def _sentinel_pool(
    spec: RedisTarget, kwargs: dict[str, Any], max_connections: int | None, pool_timeout_s: float
) -> SentinelConnectionPool:
    parts = _path_parts(spec.url)
    master = unquote(parts[0])
    db = int(parts[1]) if len(parts) > 1 else 0
    sentinel_kwargs: dict[str, Any] = {
        k: v for k, v in kwargs.items() if k.startswith(("socket_", "ssl")) or k in ("decode_responses",)
    }
    if spec.sentinel_password:
        sentinel_kwargs["password"] = spec.sentinel_password
    if spec.tls:
        sentinel_kwargs["ssl"] = True
    manager = Sentinel(_hosts(spec.url), sentinel_kwargs=sentinel_kwargs)
    conn: dict[str, Any] = {**kwargs, "db": db}
    if spec.tls:
        conn["ssl"] = True
    # redis-py's pool drops ``ssl`` when it is given a class: the class is what makes it TLS
    following = _FollowingTlsConnection if spec.tls else _FollowingConnection
    if max_connections:
        conn["max_connections"] = max_connections
        return _BoundedSentinelPool(
            master,
            manager,
            is_master=True,
            connection_class=following,
            wait_s=pool_timeout_s,
            **conn,
        )
    return SentinelConnectionPool(master, manager, is_master=True, connection_class=following, **conn)


class _BoundedSentinelPool(SentinelConnectionPool):
    """At ``max_connections``, a caller waits up to ``wait_s`` for a connection to come back,
    as a plain URL's ``BlockingConnectionPool`` does (redis-py's Sentinel pool raises "Too many
    connections" at once); then the same error."""

    def __init__(self, *args: Any, wait_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        self._wait_s = wait_s
        self._returned = threading.Condition()

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + self._wait_s
        while True:
            try:
                return super().get_connection(*args, **kwargs)
            except MaxConnectionsError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
            with self._returned:  # woken by a release; 50 ms at most, so a missed wake costs little
                self._returned.wait(min(left, 0.05))

    def release(self, connection: Any) -> None:
        super().release(connection)
        with self._returned:
            self._returned.notify()


class _FollowingConnection(SentinelManagedConnection):
    """A Sentinel-managed connection that asks for the master on every (re)connect.

    redis-py 8 reconnects a broken connection inside ``send_packed_command`` through
    ``connect_check_health``, which dials the address the connection last had, not the one the
    Sentinels name: a client holding one connection (the collector's blocking reader) dialled a
    SIGKILLed master for ever after a failover while the pool's other connections had moved on
    (tests/redis/test_sentinel_failover.py)."""

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if not self._sock and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)

    def _connect_retry(self) -> None:
        if self._sock:
            return
        if self.connection_pool.is_master:  # connect_check_health asks for the master itself
            self.connect_check_health(
                check_health=self.connection_pool.check_connection, retry_socket_connect=False
            )
            return
        super()._connect_retry()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped


class _FollowingTlsConnection(_FollowingConnection, SSLConnection):
    """The same over TLS (``rediss+sentinel://``), as redis-py's ``SentinelManagedSSLConnection``."""


def _cluster(spec: RedisTarget, kwargs: dict[str, Any]) -> redis.RedisCluster:
    from redis.cluster import ClusterNode

    kwargs = {k: v for k, v in kwargs.items() if k not in ("health_check_interval",)}
    if spec.tls:
        kwargs["ssl"] = True
    nodes = [ClusterNode(host, port) for host, port in _hosts(spec.url)]
    return redis.RedisCluster(startup_nodes=nodes, **kwargs)
