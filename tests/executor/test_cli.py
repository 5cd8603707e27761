"""``ingest-executor``: every setting is a flag named after its variable, and a flag wins."""

from __future__ import annotations

import dataclasses
import random
import subprocess
import sys
from pathlib import Path

import pytest

from db.config import Settings
from executor.cli import EXIT_USAGE, main, parse_args, stagger_delay_s
from ingest.allocator import JEMALLOC_CONF, find_jemalloc, loaded_jemalloc, preload_env
from tests.procs import ROOT, ExecutorProcess


def test_flags_override_the_environment_and_take_durations():
    env = {
        "INGEST_MAX_CONCURRENT_TASKS": "3",
        "INGEST_REDELIVERY_TIMEOUT_S": "20",
        "INGEST_SHUTDOWN_GRACE_S": "12",
    }
    argv = [
        "host_3",
        "--max-concurrent-tasks",
        "7",
        "--redelivery-timeout",
        "10m",
        "--task-timeout-s",
        "1.5h",
        "--progress-interval",
        "100ms",
        "--log-format",
        "json",
    ]
    consumer, settings = parse_args(argv, env)
    assert consumer == "host_3"
    assert settings.max_concurrent_tasks == 7 and settings.redelivery_timeout_s == 600.0
    assert settings.task_timeout_s == 5400.0 and settings.progress_interval_s == 0.1
    assert settings.shutdown_grace_s == 12.0 and settings.heartbeat_s == Settings().heartbeat_s
    assert settings.log_format == "json"


def test_help_lists_every_setting_with_its_variable_and_default():
    out = subprocess.run(
        [sys.executable, "-m", "executor", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    text = " ".join(out.stdout.split())
    for f in dataclasses.fields(Settings):
        assert Settings.env_name(f.name) in text, f.name
    assert "--redelivery-timeout DURATION" in text and "default 300.0" in text


def test_a_bad_flag_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["host_1", "--task-timeout", "soon"])
    assert exit_.value.code == EXIT_USAGE
    assert "invalid duration value: 'soon'" in capsys.readouterr().err
    assert main(["host_1", "--max-concurrent-tasks", "0"]) == EXIT_USAGE
    assert "max_concurrent_tasks must be at least 1" in capsys.readouterr().err
    assert main(["host_1", "--embedding-batch-tokens", "-1"]) == EXIT_USAGE
    assert "embedding_batch_tokens must be 0 (no cap)" in capsys.readouterr().err
    assert main(["host_1", "--embedding-batch", "0"]) == EXIT_USAGE
    assert "embedding_batch must be at least 1" in capsys.readouterr().err
    assert main(["host_1", "--task-timeout", "0"]) == EXIT_USAGE  # every task would time out at once
    assert "task_timeout_s must be positive" in capsys.readouterr().err
    assert main(["host_1", "--heartbeat", "30", "--heartbeat-ttl", "20"]) == EXIT_USAGE
    assert "heartbeat_ttl_s must be longer than heartbeat_s" in capsys.readouterr().err


def test_the_start_is_staggered_by_consumer_number_with_jitter():
    rng = random.Random(7)
    assert 6.0 <= stagger_delay_s("myhost_3", 2.0, rng) <= 6.5
    assert 0.0 <= stagger_delay_s("myhost", 2.0, rng) <= 0.5
    assert stagger_delay_s("myhost_3", 0.0, rng) == 0.0


def test_a_flag_reaches_a_real_executor_over_its_environment(xsettings, db, tmp_path):
    settings = xsettings.replace(max_concurrent_tasks=3)
    with ExecutorProcess(settings, "host_1", tmp_path / "x.log", "--max-concurrent-tasks", "6") as proc:
        assert proc.wait_ready()["max_concurrent_tasks"] == 6
        assert proc.stop() == 0


def test_an_executor_logs_its_allocator_and_warns_when_it_runs_slower_than_entrypoint_sh_would(
    xsettings, db, tmp_path
):
    jemalloc = find_jemalloc()
    if jemalloc is None:
        pytest.skip("libjemalloc is not installed: every executor runs on the system's malloc")
    with ExecutorProcess(xsettings, "host_1", tmp_path / "je.log", **preload_env({"LD_PRELOAD": ""})) as proc:
        proc.wait_ready()
        assert loaded_jemalloc(Path(f"/proc/{proc.pid}/maps")) is not None
        assert proc.stop() == 0
    line = next(ln for ln in proc.log_lines() if "allocator:" in ln)
    assert f"allocator: jemalloc ({jemalloc}, MALLOC_CONF={JEMALLOC_CONF})" in line and "WARNING" not in line

    with ExecutorProcess(xsettings, "host_2", tmp_path / "glibc.log", LD_PRELOAD="", MALLOC_CONF="") as proc:
        proc.wait_ready()
        assert loaded_jemalloc(Path(f"/proc/{proc.pid}/maps")) is None
        assert proc.stop() == 0
    line = next(ln for ln in proc.log_lines() if "allocator:" in ln)
    assert "WARNING" in line and f"the system's malloc, though {jemalloc} is installed" in line
    assert f"entrypoint.sh preloads jemalloc with MALLOC_CONF={JEMALLOC_CONF}" in line
