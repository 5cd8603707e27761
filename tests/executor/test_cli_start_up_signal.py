"""A SIGTERM (or SIGINT) during an executor's staggered start, before the daemon listens for
signals, logs ``SIGTERM during start-up: stopping`` and exits 0 at once (README, Crashes); one
that comes later, before the daemon listens, is handed to the daemon as a stop request."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from tests.conftest import make_settings
from tests.helpers import wait_until
from tests.procs import ExecutorProcess


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_staggered_start_logs_and_exits_0_at_once(tmp_path, signum):
    s = make_settings("stagger_signal", stagger_s=30.0)  # host_9 would wait 270 s
    with ExecutorProcess(s, "host_9", tmp_path / "host_9.log") as proc:
        wait_until(lambda: "staggered start: waiting" in proc.log(), 60)
        sent = time.monotonic()
        proc.signal(signum)
        assert proc.wait(10) == 0, proc.log()
        assert time.monotonic() - sent < 5
    name = signal.Signals(signum).name
    lines = [line for line in proc.log_lines() if "during start-up" in line]
    assert len(lines) == 1 and f"{name} during start-up: stopping (staggered start: waiting" in lines[0], (
        proc.log()
    )
    assert "Traceback" not in proc.log()


class _Daemon:
    stops = 0

    def request_stop(self) -> None:
        self.stops += 1


def test_a_signal_after_the_stagger_is_noted_then_handed_to_the_daemon(caplog):
    from executor.cli import StartUpSignals

    caplog.set_level(logging.INFO, logger="executor.cli")
    before = signal.getsignal(signal.SIGTERM)
    signals = StartUpSignals()
    signals.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # attaching Redis, say: noted, nothing interrupted
        wait_until(lambda: signals.stopped, 5)
        daemon = signals.daemon = _Daemon()
        os.kill(os.getpid(), signal.SIGTERM)  # the daemon built, its handlers not yet listening
        wait_until(lambda: daemon.stops == 1, 5)
    finally:
        signals.restore()
    assert signal.getsignal(signal.SIGTERM) is before
    assert [r.getMessage() for r in caplog.records if "during start-up" in r.getMessage()] == [
        "SIGTERM during start-up: stopping (nothing was being waited for)"
    ]
