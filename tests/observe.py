"""Helpers for the observability tests: scrape metrics, ask the health check, a TCP proxy that a
test can cut (a database that stops answering), a real Prometheus server, promtool."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import wait_until
from tests.procs import free_port

TASK_TYPES = "block_loop=tests.observe_handlers:block_loop,traced=tests.observe_handlers:traced"


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(port: int) -> str:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, body
    return body.decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``(sample name, sorted labels) → value`` of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(text: str, name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples(text).items() if n == name and want <= set(lab))


def health(port: int) -> tuple[int, dict[str, Any]]:
    status, body = http_get(f"http://127.0.0.1:{port}/", timeout_s=5)
    return status, orjson.loads(body)


def wait_health(port: int, code: int, contains: str = "", timeout_s: float = 20.0) -> dict[str, Any]:
    """Until the health check answers ``code`` with ``contains`` in one of its reasons."""

    def check() -> dict[str, Any] | None:
        try:
            status, body = health(port)
        except OSError:
            return None
        if status != code:
            return None
        if contains and not any(contains in r for r in body.get("reasons", [])):
            return None
        return body

    return wait_until(check, timeout_s, interval_s=0.1)


def require_binary(name: str) -> str:
    """The path of ``name``; a skip with the reason when it is not installed (scripts/setup.sh
    installs it: Debian's ``prometheus`` package gives prometheus and promtool)."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install -y prometheus; scripts/setup.sh does it)")
    return path


def promtool_check_metrics(text: str) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool")
    return subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; ``stop()`` closes the port and cuts every
    connection (a database that went away), ``start()`` opens the same port again.
    ``freeze()`` holds every byte, both ways, of old and new connections without closing any (a
    network that drops packets: no reset, no refusal, the peer waits for its timeouts);
    ``thaw()`` delivers what was held and forwards again."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self.start()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)  # the timeout was for the connect: a quiet connection lives
            with self._lock:
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._conns.difference_update((src, dst))

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the thread blocked in accept()
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._flowing.set()  # after the close: a held pipe wakes, and its bytes go nowhere

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PrometheusServer:
    """A real Prometheus (Debian's package) on a private port, scraping ``targets`` every second."""

    def __init__(self, directory: Path, targets: list[str]) -> None:
        binary = require_binary("prometheus")
        self.port = free_port()
        config = directory / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: ingest-executors\n    static_configs:\n"
            f"      - targets: [{', '.join(repr(t) for t in targets)}]\n"
        )
        self.log = directory / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        status, body = http_get(url)
        data = orjson.loads(body)
        assert status == 200 and data["status"] == "success", body
        return list(data["data"]["result"])

    def wait_value(self, expr: str, value: float, timeout_s: float = 60.0) -> float:
        """Until the instant query ``expr`` (one series) equals ``value``."""

        def check() -> float | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log.read_text()[-3000:]}")
            try:
                result = self.query(expr)
            except (OSError, AssertionError):
                return None
            if len(result) == 1 and float(result[0]["value"][1]) == value:
                return value
            return None

        return wait_until(check, timeout_s, interval_s=0.5)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
