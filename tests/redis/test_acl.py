"""Least privilege: the fleet and the CLI as a Redis ACL user limited to ``~PREFIX:* &PREFIX:*`` and
the command categories of :data:`ACL_RULES` (the README's ``ACL SETUSER`` line). The whole task
path runs under it (submit, parse, cancel, retry, dead letters, strikes, results, fleet,
status) and the server's ``ACL LOG`` records no refusal of that user; a key and a channel
outside the prefix are refused."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import redis
import trio

from db.keys import Keys
from db.models import CANCELLED, DONE, RUNNING
from db.results import Results
from db.streams import connect
from ingest.cli import main
from tests.executor.support import enqueue, rows, running_daemon, statuses, task_spec
from tests.fixtures_docs import embedder  # noqa: F401 - the model, loaded once per session
from tests.helpers import await_until
from tests.redis.conftest import settings_on
from tests.redis_servers import plain_redis, require

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# The README's line, PREFIX and PASSWORD aside: keys and channels of the prefix only; reads,
# writes, streams, scripts, pub/sub, key space, connection commands; nothing dangerous but
# CLIENT UNBLOCK (an executor interrupts its own blocked read on stop), INFO (the memory
# figures of ``ingest status``) and TIME (the gate's scripts read the server's clock).
ACL_RULES = (
    "resetkeys ~{prefix}:* resetchannels &{prefix}:* -@all +@read +@write +@stream +@scripting "
    "+@pubsub +@keyspace +@connection +@transaction -@dangerous +client|unblock +info +time"
)


def acl_setuser(client: redis.Redis, user: str, password: str, prefix: str) -> None:
    client.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", *ACL_RULES.format(prefix=prefix).split()
    )


@pytest.fixture
def server(tmp_path):
    require("redis-server")
    s = plain_redis(tmp_path / "redis")
    yield s
    s.close()


@pytest.mark.usefixtures("embedder")
async def test_the_whole_task_path_runs_as_a_user_confined_to_the_prefix(
    server, test_name, tmp_path, monkeypatch, capsys
):
    password = f"acl-{uuid.uuid4().hex}"
    admin = redis.Redis(port=server.port, decode_responses=True)
    prefix = f"t:{test_name}"
    acl_setuser(admin, "ingest", password, prefix)
    admin.execute_command("ACL", "LOG", "RESET")
    url = f"redis://ingest@127.0.0.1:{server.port}/0"
    monkeypatch.setenv("INGEST_REDIS_PASSWORD", password)
    with settings_on(test_name, redis_url=url, redis_password=password) as s:
        cli = ["--db-url", s.db_url, "--redis-url", url, "--key-prefix", s.key_prefix]

        def run(*argv: str) -> str:
            code = main([*argv, *cli])
            out, err = capsys.readouterr()
            assert code == 0, f"{argv}: {err}"
            return out

        client = connect(s)
        keys = Keys(s.key_prefix)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set("outside:the:prefix", "x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.publish("outside:channel", "x")
        run("init")
        async with running_daemon(s) as daemon:
            # submit and parse (the real parse handler, embedded and stored)
            out = await trio.to_thread.run_sync(
                run,
                "submit",
                str(EXAMPLES / "sourdough.txt"),
                "--kb",
                "bread",
                "--wait",
                "--timeout",
                "90",
                "--json",
            )
            (parsed,) = json.loads(out)["documents"][0]["task_ids"]
            result = Results(client, keys).fetch(parsed, tenant_id=None, single_use=True, removal_delay_s=60)
            assert result and result["kind"] == "success"
            # cancel, then retry (the second attempt is instant)
            (slow,) = enqueue(daemon.streams, [task_spec("sleep_first_attempt", seconds=60)])
            await await_until(lambda: statuses([slow])[slow] == RUNNING, 20)
            await trio.to_thread.run_sync(run, "cancel", slow)
            await await_until(lambda: statuses([slow])[slow] == CANCELLED, 20)
            await trio.to_thread.run_sync(run, "retry", slow)
            try:
                await await_until(lambda: statuses([slow])[slow] == DONE, 30)
            except (AssertionError, trio.TooSlowError):
                row = rows([slow])[slow]
                raise AssertionError(
                    f"{row['status']} {row['progress_msg']!r} {admin.execute_command('ACL', 'LOG')}"
                ) from None
            # a dead letter: a message that is not JSON
            admin.xadd(keys.queue(0), {"message": "not json"})
            await await_until(lambda: client.xlen(keys.dead) == 1, 20)
            dead = json.loads(await trio.to_thread.run_sync(run, "dead", "list", "--json"))
            assert len(dead) == 1
            await trio.to_thread.run_sync(run, "dead", "purge", "--older-than", "0s")
            # strike, list, restore (their Redis side under the ACL; holding is tested on plain Redis)
            await trio.to_thread.run_sync(run, "strike", "noop")
            (held,) = enqueue(daemon.streams, [task_spec("noop")])
            assert "noop" in await trio.to_thread.run_sync(run, "strikes")
            await trio.to_thread.run_sync(run, "restore", "noop")
            await await_until(lambda: statuses([held])[held] == DONE, 20)
            fleet = json.loads(await trio.to_thread.run_sync(run, "fleet", "--json"))
            assert [b["consumer"] for b in fleet] == ["host_1"]
            status = json.loads(await trio.to_thread.run_sync(run, "status", "--json"))
            assert "error" not in status["redis"], status["redis"]
            await trio.to_thread.run_sync(run, "results", "clear")
        client.close()
    provoked = {"outside:the:prefix", "outside:channel"}  # the test's own probes of the limit
    refused = [
        e
        for e in admin.execute_command("ACL", "LOG")
        if _field(e, "username") == "ingest" and _field(e, "object") not in provoked
    ]
    admin.close()
    assert not refused, f"the ACL user was refused: {refused}"


def _field(entry: object, name: str) -> object:
    if isinstance(entry, dict):
        return entry.get(name)
    assert isinstance(entry, list)
    return dict(zip(entry[::2], entry[1::2], strict=True)).get(name)
