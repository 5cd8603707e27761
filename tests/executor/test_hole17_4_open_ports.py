"""Issue 17 hole 4: the health and metrics ports bind 127.0.0.1 unless set, time out slow
clients, never hold a thread per connection, and still answer a normal client while a thousand
half-sent requests sit on them."""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.request

import orjson

from ingest.cli.render import health_text
from tests.helpers import wait_until
from tests.observe import wait_health
from tests.procs import ExecutorProcess, free_port

HALF_SENT = 500  # per port: 1,000 in all
SLOW_CLIENT_S = 5.0  # the servers' socket timeout


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line")


def _half_sent(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # the blank line never comes
        socks.append(sock)
    return socks


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:  # noqa: S310 - a test's own URL
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def _outward_address() -> str | None:
    """An address of this host that is not loopback (none on a machine without a network)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            addr = probe.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def test_half_sent_requests_hold_no_threads_and_normal_clients_are_still_answered(xsettings, db, tmp_path):
    health_port, metrics_port = free_port(), free_port()
    settings = xsettings.replace(healthcheck_port=health_port, metrics_port=metrics_port)
    with ExecutorProcess(settings, "host_1", tmp_path / "x.log") as proc:
        proc.wait_ready()
        wait_health(health_port, 200)
        assert _get(f"http://127.0.0.1:{metrics_port}/metrics")[0] == 200
        before = _threads(proc.pid)
        socks = _half_sent(health_port, HALF_SENT) + _half_sent(metrics_port, HALF_SENT)
        try:
            time.sleep(0.5)
            during = _threads(proc.pid)
            assert during <= before + 4, f"threads {before} -> {during} with {len(socks)} half-sent requests"
            began = time.monotonic()
            status, body = _get(f"http://127.0.0.1:{health_port}/")
            assert time.monotonic() - began < 2
            assert status in (200, 503)
            health = orjson.loads(body)
            serving = health["checks"]["serving"]  # it says what its ports cannot serve
            assert serving["health"]["open"] <= serving["health"]["max_connections"]
            assert serving["health"]["shed"] > 0 and serving["metrics"]["shed"] > 0
            assert any("shedding" in w for w in health["warnings"]), health
            # and the heartbeat says so, for `ingest fleet` (without calling the executor unhealthy)
            beat = wait_until(lambda: (b := proc.heartbeat()) and b["health"].get("warnings") and b, 5)
            assert beat["health"]["ok"] and "ok (warning: " in health_text(beat["health"])
            status, body = _get(f"http://127.0.0.1:{metrics_port}/metrics")
            assert status == 200 and b"ingest_tasks_running" in body
            # the slow clients are let go after the socket timeout
            wait_until(lambda: all(_closed_by_server(s) for s in socks[:20] + socks[-20:]), SLOW_CLIENT_S + 5)
        finally:
            for sock in socks:
                sock.close()
        wait_health(health_port, 200)
        assert _threads(proc.pid) <= before + 4


def test_both_ports_bind_loopback_unless_set(xsettings, db, tmp_path):
    health_port, metrics_port = free_port(), free_port()
    settings = xsettings.replace(healthcheck_port=health_port, metrics_port=metrics_port)
    with ExecutorProcess(settings, "host_1", tmp_path / "x.log") as proc:
        proc.wait_ready()
        wait_health(health_port, 200)
        log = proc.log()
        assert f"health check on http://127.0.0.1:{health_port}/" in log
        assert f"metrics on http://127.0.0.1:{metrics_port}/metrics" in log
        outward = _outward_address()
        if outward is not None:
            for port in (health_port, metrics_port):
                with contextlib.suppress(OSError), socket.create_connection((outward, port), timeout=1):
                    raise AssertionError(f"port {port} answers on {outward}")


def test_the_bind_address_is_a_setting(xsettings, db, tmp_path):
    health_port = free_port()
    settings = xsettings.replace(healthcheck_port=health_port, healthcheck_host="0.0.0.0")
    with ExecutorProcess(settings, "host_1", tmp_path / "x.log") as proc:
        proc.wait_ready()
        wait_health(health_port, 200)
        assert f"health check on http://0.0.0.0:{health_port}/" in proc.log()
