"""An outage is one line when it begins and one when it ends, whatever the calls running side
by side do: a call that began before the outage's first failure and returns after it (it was
past the server when the server went) does not end it, so the outage is not said twice."""

from __future__ import annotations

import logging
import time

from executor.outage import Outage


def test_a_call_begun_before_the_first_failure_does_not_end_the_outage(caplog):
    outage = Outage("database")
    caplog.set_level(logging.WARNING, logger="executor.outage")
    before = time.monotonic()
    outage.failed(ConnectionRefusedError("refused"))  # one call fails: the server went
    outage.ok(since=before)  # another, begun before, returns: says nothing of now
    assert outage.active and outage.failures == 1
    outage.failed(ConnectionRefusedError("refused"))
    after = time.monotonic()
    outage.ok(since=after)  # a call begun since: the server is back
    assert not outage.active
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "unreachable" in lines[0] and "back after 2 failed call(s)" in lines[1]
    outage.ok()  # a call that says nothing of when it began ends nothing, and says nothing
    assert len(caplog.records) == 2
