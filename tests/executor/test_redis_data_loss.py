"""Redis loses every key (a restart without persistence) while an executor runs: the running
task finishes from its row, the group is created again, and the reconciler re-publishes the
queued rows whose entries were lost; the executor never stops."""

from __future__ import annotations

import trio

from db.models import DONE, QUEUED, RUNNING
from ingest.tenants import set_limits
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


async def test_a_task_running_through_a_loss_of_redis_keeps_its_tenant_slot(
    xsettings, streams, rclient, keys, db
):
    """The loss takes the tenant's slot set with it; the task still runs. Its lease renewal
    takes the slot again (the entry is gone, the run is not), so the re-published tasks of a
    tenant at its cap wait for it, and the slot ends with the task's ack."""
    s = xsettings.replace(max_concurrent_tasks=3, reconcile_grace_s=0.5, redelivery_timeout_s=1.0)
    set_limits(s, "capped", {"max_running": 1})
    first, *rest = enqueue(
        streams,
        [task_spec("sleep", seconds=3.0, tenant_id="capped")]
        + [task_spec("noop", tenant_id="capped") for _ in range(2)],
    )
    async with running_daemon(s, "host_1") as daemon:
        await await_until(lambda: statuses([first])[first] == RUNNING, 10)
        _delete_prefix(rclient, s.key_prefix)
        # the rest are re-published and their tenant's limits copied: while the first runs,
        # the gate holds them back (its slot is taken again)
        await await_until(lambda: int(rclient.hget(keys.stats, "republished") or 0) >= 2, 10)
        while statuses([first])[first] == RUNNING:
            now = int(rclient.time()[0]) * 1000
            assert all(st == QUEUED for st in statuses(rest).values()), statuses(rest)
            assert int(rclient.zcount(keys.running("capped"), now, "+inf")) <= 1
            await trio.sleep(0.02)
        await await_until(lambda: all_in([first, *rest], DONE), 20)
        assert daemon.leases.statistics().gone >= 1
        # every slot ended with its task's ack, the re-armed one too
        await await_until(lambda: rclient.zcard(keys.running("capped")) == 0, 5)
