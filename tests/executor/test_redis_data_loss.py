"""Redis loses every key (a restart without persistence) while an executor runs: the running
task finishes from its row, the group is created again, and the reconciler re-publishes the
queued rows whose entries were lost; the executor never stops."""

from __future__ import annotations

from db.models import DONE, RUNNING
from tests.conftest import _delete_prefix
from tests.executor.support import all_in, enqueue, running_daemon, statuses, task_spec
from tests.helpers import await_until


async def test_after_redis_lost_its_data_running_tasks_finish_and_lost_entries_are_published_again(
    xsettings, streams, rclient, keys, db
):
    s = xsettings.replace(max_concurrent_tasks=1, reconcile_grace_s=1.0, redelivery_timeout_s=1.0)
    first, *rest = enqueue(streams, [task_spec("sleep", seconds=1.5)] + [task_spec("noop") for _ in range(3)])
    async with running_daemon(s, "host_1") as daemon:
        await await_until(lambda: statuses([first])[first] == RUNNING, 10)
        _delete_prefix(rclient, s.key_prefix)  # streams, group, published keys, heartbeat: gone
        await await_until(lambda: all_in([first, *rest], DONE), 30)
        assert daemon.leases.statistics().gone >= 1
        later = enqueue(streams, [task_spec("noop")])
        await await_until(lambda: all_in(later, DONE), 10)
    assert int(rclient.hget(keys.stats, "republished")) == 3
