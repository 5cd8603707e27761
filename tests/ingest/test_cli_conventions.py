"""What scripts and shells rely on: the documented exit statuses, no colour or bars off a terminal
or under NO_COLOR, shell completion, ``ingest config`` (sources, secrets redacted), ``ingest
doctor`` (each finding and its fix), and the verbs ``dataflow rm``, ``memory rm`` and a
``dataflow run`` that times out leaving no bytes."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest

from db.database import unit
from db.models import CANCELLED, DocumentBlob, MemoryMessage, Task
from db.schema import SCHEMA_VERSION
from ingest.cli import common, main
from ingest.dataflow.catalog import create_dataflow
from tests.executor.test_trust_the_row import _dsl
from tests.ingest.factories import cli_args, cli_env
from tests.ingest.test_cli_submit_wait import _play_executor
from tests.procs import ROOT, PrivateRedis

DSL = _dsl()


def _run(argv, settings, **env):
    """``python -m ingest ARGV`` in a fresh process, stdout and stderr piped (not a terminal)."""
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_") and k != "NO_COLOR"}
    return subprocess.run(
        [sys.executable, "-m", "ingest", *argv],
        cwd=ROOT,
        env={**environ, **cli_env(settings), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- exit statuses -----------------------------------------------------------------------------


def test_the_readme_documents_each_exit_status_the_cli_uses(settings, capsys):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Exit status") :]
    section = section[: section.index("\n## ")]
    documented = {int(code) for code in re.findall(r"^\| `(\d+)` \|", section, flags=re.M)}
    assert documented == {common.EXIT_OK, common.EXIT_FAILED, common.EXIT_USAGE, common.EXIT_UNAVAILABLE, 130}
    assert main(["fleet", "--json", *cli_args(settings)]) == 0
    assert main(["status", "no-such-id", *cli_args(settings)]) == 1
    with pytest.raises(SystemExit) as usage:
        main(["status", "--no-such-flag", *cli_args(settings)])
    assert usage.value.code == 2
    assert main(["fleet", *cli_args(settings), "--redis-url", "redis://127.0.0.1:1/0"]) == 3
    capsys.readouterr()


# -- colour and bars ---------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_and_never_under_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(sys, "stdout", _Terminal())
    assert common.new_console().color_system is not None
    monkeypatch.setenv("NO_COLOR", "1")
    assert common.new_console().no_color
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.delenv("NO_COLOR")
    assert common.new_console().color_system is None
    assert common.plain_output(io.StringIO()) and not common.plain_output(_Terminal())


def test_piped_output_has_no_escape_sequences(settings):
    done = _run(["doctor"], settings)
    assert done.stdout and "\x1b" not in done.stdout + done.stderr


def test_submit_wait_off_a_terminal_prints_a_line_per_document_not_bars(
    settings, tmp_path, rclient, keys, capsys
):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(name)
    thread = _play_executor(rclient, keys, expected=2)
    assert (
        main(["submit", str(tmp_path), "--kb", "kb1", "--wait", "--timeout", "30", *cli_args(settings)]) == 0
    )
    thread.join(5)
    err = capsys.readouterr().err
    assert sorted(line for line in err.splitlines() if line.startswith("ingest: done: ")) == [
        "ingest: done: a.txt",
        "ingest: done: b.txt",
    ]
    assert "\x1b" not in err and "━" not in err  # no bar


# -- completion --------------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_name_every_verb(settings, shell, tmp_path):
    done = _run(["completion", shell], settings)
    assert done.returncode == 0, done.stderr
    for word in ("submit", "doctor", "dataflow", "--kb", "--json"):
        assert word in done.stdout, word
    if shell == "bash":
        script = tmp_path / "ingest.bash"
        script.write_text(done.stdout)
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=30).returncode == 0


# -- config ------------------------------------------------------------------------------------


def test_config_says_where_each_setting_came_from_and_hides_secrets(settings, monkeypatch, capsys):
    monkeypatch.setenv("INGEST_HEARTBEAT_S", "7s")
    monkeypatch.setenv("INGEST_API_ADMIN_KEY", "s3cret-admin")
    monkeypatch.setenv("INGEST_REDIS_URL", "redis://:hunter2@127.0.0.1:6379/0")
    url = "mysql://root:pw-in-flag@127.0.0.1:3306/x"
    assert main(["config", "--json", "--db-url", url]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out)
    assert shown["db_url"] == {
        "value": "mysql://root:***@127.0.0.1:3306/x",
        "source": "flag",
        "env": "INGEST_DB_URL",
    }
    assert shown["heartbeat_s"]["value"] == 7.0 and shown["heartbeat_s"]["source"] == "environment"
    assert shown["redis_url"]["value"] == "redis://:***@127.0.0.1:6379/0"
    assert shown["api_admin_key"]["value"] == "***" and shown["api_keys"]["value"] == ""
    assert shown["max_deliveries"]["source"] == "default"
    for secret in ("s3cret-admin", "hunter2", "pw-in-flag"):
        assert secret not in out
    assert main(["config"]) == 0
    table = capsys.readouterr().out
    assert "heartbeat_s" in table and "environment" in table and "s3cret" not in table


def test_config_names_the_vector_store_flag_and_a_password_file(settings, monkeypatch, capsys, tmp_path):
    (tmp_path / "pw").write_text("from-a-file\n")
    monkeypatch.setenv("INGEST_DB_PASSWORD_FILE", str(tmp_path / "pw"))
    monkeypatch.delenv("INGEST_DB_PASSWORD", raising=False)
    store = f"milvus:///{tmp_path}/v.db"
    assert main(["--vector-store", store, "config", "--json"]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out)
    assert shown["vector_store"] == {"value": store, "source": "flag", "env": "INGEST_VECTOR_STORE"}
    assert shown["db_password"] == {"value": "***", "source": "file", "env": "INGEST_DB_PASSWORD_FILE"}
    assert "from-a-file" not in out


# -- doctor ------------------------------------------------------------------------------------


def _findings(capsys) -> dict[str, dict]:
    return {f["check"]: f for f in json.loads(capsys.readouterr().out)["findings"]}


def test_doctor_on_a_sound_redis_then_one_that_may_evict(settings, tmp_path, capsys):
    with PrivateRedis(tmp_path) as server:  # AOF on, noeviction (Redis's default)
        args = ["doctor", "--json", *cli_args(settings), "--redis-url", server.url]
        code = main(args)
        found = _findings(capsys)
        for check in ("redis version", "redis persistence", "redis maxmemory-policy", "database version"):
            assert found[check]["ok"], found[check]
        assert found["database schema"] == {
            "check": "database schema",
            "ok": True,
            "detail": f"version {SCHEMA_VERSION}",
            "fix": "",
        }
        assert found["embedding model"]["ok"] and found["parser pypdfium2"]["ok"]
        assert code == (0 if all(f["ok"] for f in found.values()) else 1)
        import redis

        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory-policy", "allkeys-lru")
        client.config_set("appendonly", "no")
        client.close()
        assert main(args) == 1
        found = _findings(capsys)
    assert not found["redis maxmemory-policy"]["ok"]
    assert found["redis maxmemory-policy"]["fix"].startswith("CONFIG SET maxmemory-policy noeviction")
    assert not found["redis persistence"]["ok"] and "appendonly yes" in found["redis persistence"]["fix"]


def test_doctor_says_run_init_for_a_missing_database(settings, capsys):
    assert main(["doctor", "--json", *cli_args(settings), "--db-url", settings.db_url + "_nothere"]) == 1
    found = _findings(capsys)
    assert not found["database"]["ok"] and found["database"]["fix"] == "run `ingest init`"


def test_doctor_reads_the_shared_redis_as_it_is(settings, rclient, capsys):
    main(["doctor", "--json", *cli_args(settings)])
    found = _findings(capsys)
    aof = rclient.config_get("appendonly")["appendonly"] == "yes"
    assert found["redis persistence"]["ok"] == aof
    assert found["redis maxmemory-policy"]["ok"] == (
        rclient.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    )


# -- verbs -------------------------------------------------------------------------------------


def test_dataflow_rm(settings, capsys):
    made = create_dataflow(settings, "flow", DSL)
    assert main(["dataflow", "rm", "flow", "--json", *cli_args(settings)]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "id": made.id,
        "name": "flow",
        "tenant_id": "default",
        "removed": 1,
        "unfinished_tasks": 0,
    }
    assert main(["dataflow", "show", "flow", *cli_args(settings)]) == 1
    assert main(["dataflow", "rm", "flow", *cli_args(settings)]) == 1
    assert "no dataflow named 'flow'" in capsys.readouterr().err


def test_dataflow_rm_is_refused_while_unfinished_tasks_use_it_unless_forced(settings, capsys):
    made = create_dataflow(settings, "flow", DSL)
    other = create_dataflow(settings, "flow", DSL, tenant_id="acme")  # same name, another tenant
    base = {"task_type": "dataflow", "payload": {"dataflow_id": made.id}}
    with unit():
        for tid, status, extra in [
            ("t-queued", "queued", {}),
            ("t-held", "held", {}),
            ("t-done", "done", {}),  # finished: no longer needs it
            ("t-other-flow", "queued", {"payload": {"dataflow_id": "another"}}),
            ("t-other-tenant", "queued", {"tenant_id": "acme", "payload": {"dataflow_id": other.id}}),
        ]:
            Task.insert(id=tid, status=status, **{**base, **extra}).execute()
    assert main(["dataflow", "rm", "flow", *cli_args(settings)]) == 1
    err = capsys.readouterr().err
    assert "used by 2 unfinished task(s) (t-held, t-queued)" in err and "--force" in err
    assert main(["dataflow", "show", "flow", *cli_args(settings)]) == 0  # nothing removed
    capsys.readouterr()
    assert main(["dataflow", "rm", "flow", "--force", "--json", *cli_args(settings)]) == 0
    assert json.loads(capsys.readouterr().out)["unfinished_tasks"] == 2
    assert main(["dataflow", "show", "flow", *cli_args(settings)]) == 1
    assert main(["dataflow", "show", "flow", "--tenant", "acme", *cli_args(settings)]) == 0


def test_memory_rm_one_message_then_the_memory(settings, capsys):
    with unit():
        for n, (memory, tenant) in enumerate([("m1", "default")] * 3 + [("m1", "acme"), ("m2", "default")]):
            MemoryMessage.insert(
                id=f"msg{n}",
                tenant_id=tenant,
                memory_id=memory,
                source_id=f"s{n}",
                role="user",
                content=f"c{n}",
            ).execute()
    assert main(["memory", "rm", "--memory", "m1", "--source", "s0", "--json", *cli_args(settings)]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 1
    assert main(["memory", "rm", "--memory", "m1", *cli_args(settings)]) == 0
    assert capsys.readouterr().out.strip() == "removed memory 'm1': 2 message(s)"
    with unit():
        left = sorted(r.id for r in MemoryMessage.select())
    assert left == ["msg3", "msg4"]  # another tenant's m1 and another memory stay


def test_a_timed_out_dataflow_run_leaves_no_bytes(settings, tmp_path, capsys):
    create_dataflow(settings, "flow", DSL)
    (tmp_path / "a.md").write_text("# title\n\nsome text")
    assert (
        main(["dataflow", "run", "flow", str(tmp_path / "a.md"), "--timeout", "0.5", *cli_args(settings)])
        == 1
    )
    assert "its stored bytes removed" in capsys.readouterr().err
    with unit():
        (task,) = Task.select()
        assert DocumentBlob.select().count() == 0
    assert task.status == CANCELLED
