"""A real Prometheus server scrapes a fleet of two executor processes: its query API returns the
fleet's ``ingest_tasks_succeeded_total`` sum, and both targets are up."""

from __future__ import annotations

from db.models import DONE
from tests.executor.support import all_in, enqueue, task_spec
from tests.helpers import wait_until
from tests.observe import PrometheusServer, require_binary, scrape, total
from tests.procs import ExecutorProcess, free_port

N = 40


def test_prometheus_scrapes_a_fleet_of_two_and_sums_its_successes(xsettings, streams, db, tmp_path):
    require_binary("prometheus")
    ports = [free_port(), free_port()]
    procs = [
        ExecutorProcess(xsettings.replace(metrics_port=port), f"host_{n}", tmp_path / f"x{n}.log")
        for n, port in enumerate(ports)
    ]
    try:
        for proc in procs:
            proc.wait_ready()
        ids = enqueue(streams, [task_spec("sleep", seconds=0.05) for _ in range(N)])
        wait_until(lambda: all_in(ids, DONE), 60)
        per_executor = [total(scrape(port), "ingest_tasks_succeeded_total") for port in ports]
        assert sum(per_executor) == N
        with PrometheusServer(tmp_path, [f"127.0.0.1:{p}" for p in ports]) as prom:
            prom.wait_value("count(up == 1)", 2)
            assert prom.wait_value("sum(ingest_tasks_succeeded_total)", N) == N
            by_executor = {
                r["metric"]["executor"]: float(r["value"][1])
                for r in prom.query("sum by (executor) (ingest_tasks_succeeded_total)")
            }
            assert by_executor == {"host_0": per_executor[0], "host_1": per_executor[1]}
    finally:
        for proc in procs:
            assert proc.stop() == 0, proc.log()
