"""``ingest-executor``: every setting is a flag named after its variable, each flag wins over its
variable, durations take units, and ``--help`` shows each flag with its variable and default."""

from __future__ import annotations

import dataclasses

from db.config import Settings
from executor.cli import build_parser, parse_args

CHOICES = {
    "log_format": ("json", "plain"),
    "tracing": ("off", "auto"),
    "log_level": ("DEBUG", "INFO"),
    "vector_store": ("milvus:///env.db", "http://milvus:19530"),
    "query_encoder": ("torch", "onnx"),
    "embedding_backend": ("onnx", "onnx-int8"),
}


# Values a setting's checks accept where the generic ones would not (a heartbeat's TTL must be
# longer than its period, 250 ms)
SPECIAL = {"heartbeat_ttl_s": ("60", "750ms", 0.75)}


def _values(f: dataclasses.Field) -> tuple[str, str, object]:
    """(environment value, flag value, what the flag must give) for one field."""
    if f.name in SPECIAL:
        return SPECIAL[f.name]
    if f.name in CHOICES:
        env, flag = CHOICES[f.name]
        return env, flag, flag
    if f.type in (bool, "bool"):
        return "true", "false", False
    if f.type in (int, "int"):
        return "2", "7", 7
    if f.name.endswith("_s"):
        return "30", "250ms", 0.25
    if f.type in (float, "float"):
        return "0.5", "0.25", 0.25
    return "from-env", "from-flag", "from-flag"


def test_every_setting_is_a_flag_and_the_flag_wins_over_its_variable():
    fields = dataclasses.fields(Settings)
    env = {Settings.env_name(f.name): _values(f)[0] for f in fields}
    argv = ["host_1"]
    for f in fields:
        argv += ["--" + f.name.replace("_", "-"), _values(f)[1]]
    _, settings = parse_args(argv, env)
    for f in fields:
        assert getattr(settings, f.name) == _values(f)[2], f.name


def test_duration_flags_take_units_with_or_without_the_s_suffix():
    for flag in ("--shutdown-grace", "--shutdown-grace-s"):
        for text, seconds in (("100ms", 0.1), ("5s", 5.0), ("10m", 600.0), ("3h", 10800.0), ("2.5", 2.5)):
            _, settings = parse_args(["host_1", flag, text], {})
            assert settings.shutdown_grace_s == seconds


def test_help_shows_each_flag_with_its_variable_and_default():
    text = " ".join(build_parser().format_help().split())
    for f in dataclasses.fields(Settings):
        flag = "--" + f.name.replace("_", "-").removesuffix("-s")
        assert flag in text, f.name
        assert f"env {Settings.env_name(f.name)}, default" in text, f.name
    assert "--metrics-port N" in text and "env INGEST_METRICS_PORT, default 0" in text
    assert "--tracing VALUE" in text and "env INGEST_TRACING, default auto" in text
