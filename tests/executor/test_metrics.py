"""Prometheus metrics: after N tasks the scraped counters say N, per outcome and task type, and
``promtool check metrics`` accepts the exposition."""

from __future__ import annotations

from db.models import DONE, FAILED
from executor.metrics import NO_METRICS
from tests.executor.support import all_in, enqueue, running_daemon, task_spec
from tests.helpers import await_until
from tests.observe import promtool_check_metrics, samples, scrape, total
from tests.procs import free_port


async def test_scraped_counters_match_the_tasks_run(xsettings, streams, keys, db):
    port = free_port()
    settings = xsettings.replace(metrics_port=port)
    specs = (
        [task_spec("noop") for _ in range(6)]
        + [task_spec("fail", error="boom") for _ in range(2)]
        + [task_spec("permanent"), task_spec("flaky", failures=1)]
    )
    ids = enqueue(streams, specs)
    streams.client.xadd(keys.queue(0), {"message": "not json"})
    enqueue(streams, [task_spec("made-up")])  # an unknown type: its row dead, its message dead-lettered
    async with running_daemon(settings, "host_1") as daemon:
        await await_until(lambda: all_in(ids, DONE, FAILED), 20)
        await await_until(lambda: daemon.finisher.dead_lettered == 2 and not daemon.finisher.backlog, 10)
        text = scrape(port)
    n = len(ids)
    assert total(text, "ingest_tasks_started_total") == n
    assert total(text, "ingest_tasks_succeeded_total") == 7
    assert total(text, "ingest_tasks_succeeded_total", task_type="noop", executor="host_1") == 6
    assert total(text, "ingest_tasks_failed_total") == 3
    assert total(text, "ingest_tasks_failed_total", task_type="fail") == 2
    assert total(text, "ingest_tasks_retried_total", task_type="flaky") == 1
    assert (
        total(text, "ingest_tasks_dead_lettered_total", task_type="unknown") == 2
    )  # no series per junk type
    assert total(text, "ingest_task_duration_seconds_count") == n
    assert total(text, "ingest_task_start_latency_seconds_count") == n
    assert total(text, "ingest_tasks_running") == 0
    for name in ("stricken", "cancelled", "timed_out", "handed_back"):  # declared at 0 for each type
        assert total(text, f"ingest_tasks_{name}_total", task_type="noop") == 0
    assert total(text, "ingest_strikes_in_effect") == 0
    assert (
        total(text, "ingest_redis_disruptions_total") == 0 and total(text, "ingest_db_disruptions_total") == 0
    )
    labels = {dict(lab).get("priority") for (name, lab) in samples(text) if name == "ingest_queue_depth"}
    assert labels == {"0", "1"}
    assert all("task_id" not in dict(lab) for _, lab in samples(text))
    check = promtool_check_metrics(text)
    assert check.returncode == 0, check.stdout + check.stderr


async def test_without_a_port_nothing_is_counted_or_served(xsettings, streams, db):
    ids = enqueue(streams, [task_spec("noop")])
    async with running_daemon(xsettings, "host_1") as daemon:
        assert daemon.metrics is NO_METRICS
        await await_until(lambda: all_in(ids, DONE), 10)
