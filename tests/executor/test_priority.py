"""High priority entries are read before normal ones."""

from __future__ import annotations

from db.models import DONE
from tests import handlers
from tests.executor.support import all_in, enqueue, running_daemon, task_spec
from tests.helpers import await_until
from tests.lifecycle import rule


@rule("read.new-entries-free-slots")
async def test_high_priority_is_read_before_normal(xsettings, streams, db):
    normal = enqueue(streams, [task_spec("noop", priority=0) for _ in range(4)])
    high = enqueue(streams, [task_spec("noop", priority=1) for _ in range(4)])
    handlers.CALLS.clear()
    async with running_daemon(xsettings.replace(max_concurrent_tasks=1)):
        await await_until(lambda: all_in(normal + high, DONE), 15)
    assert high + normal == handlers.CALLS
