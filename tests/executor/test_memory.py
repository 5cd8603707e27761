"""Memory on a real executor: messages saved with ``save_message`` (or ``ingest memory save``) are
stored once per source id, returned in conversation order and found by meaning."""

from __future__ import annotations

import json

import pytest
import trio

from db.database import unit
from db.models import MemoryMessage
from ingest import ids
from ingest.cli import main
from ingest.errors import PermanentError
from ingest.ids import embedding_identity
from ingest.memory import conversation, save_message, search_memory
from tests.executor.support import all_in, running_daemon
from tests.fixtures_docs import embedder  # noqa: F401 - the model, loaded once per session
from tests.helpers import await_until
from tests.ingest.factories import cli_args

CHAT = [
    ("user", "My bicycle chain keeps slipping when I climb hills."),
    ("assistant", "A slipping chain usually means a worn chain or cassette; measure the chain stretch."),
    ("user", "Also, what should I cook tonight? I have lentils and rice."),
    ("assistant", "Try mujaddara: lentils and rice with deeply caramelised onions."),
]


@pytest.mark.usefixtures("embedder")
async def test_messages_are_saved_once_kept_in_order_and_found_by_meaning(settings, capsys):
    task_ids = [
        save_message(settings, "chat-1", role, text, source_id=f"m{n}") for n, (role, text) in enumerate(CHAT)
    ]
    save_message(settings, "chat-2", "user", "Another conversation about chains of command.", source_id="m0")
    async with running_daemon(settings):
        await await_until(lambda: all_in(task_ids, "done"), 60)
        again = await trio.to_thread.run_sync(
            lambda: save_message(settings, "chat-1", "user", CHAT[0][1], source_id="m0")  # the same source id
        )
        assert again == task_ids[0]
        await await_until(lambda: all_in([again], "done"), 60)

    with unit():
        rows = list(MemoryMessage.select().where(MemoryMessage.memory_id == "chat-1"))
    assert len(rows) == len(CHAT)  # m0 saved twice, stored once (and once more in chat-2)
    with unit():
        assert MemoryMessage.select().where(MemoryMessage.memory_id == "chat-2").count() == 1
    assert {r.id for r in rows} == {ids.memory_message_id("chat-1", f"m{n}") for n in range(len(CHAT))}
    assert all(len(r.vector) == 384 * 4 for r in rows)

    talk = conversation(settings, "chat-1")
    assert [(m["role"], m["content"]) for m in talk] == CHAT

    hits = await trio.to_thread.run_sync(
        lambda: search_memory(settings, "chat-1", "what to have for dinner", k=2)
    )
    assert [h.source_id for h in hits] == ["m3", "m2"] or [h.source_id for h in hits] == ["m2", "m3"]
    assert hits[0].score >= hits[1].score
    (bike,) = await trio.to_thread.run_sync(
        lambda: search_memory(settings, "chat-1", "drivetrain repair", k=1)
    )
    assert bike.source_id in ("m0", "m1")

    # the model that embedded them is recorded; a memory of another model is not searched with this one
    identity = embedding_identity(settings.embedding_model, settings.embedding_backend)
    assert {r.embedding_model for r in rows} == {identity}
    with unit():
        MemoryMessage.update(embedding_model="another-model").where(
            MemoryMessage.memory_id == "chat-2"
        ).execute()
    with pytest.raises(PermanentError, match="embedded with another-model"):
        await trio.to_thread.run_sync(lambda: search_memory(settings, "chat-2", "chains", k=1))


@pytest.mark.usefixtures("embedder")
async def test_the_memory_verbs(settings, capsys):
    async with running_daemon(settings):
        for n, (role, text) in enumerate(CHAT):
            argv = [
                "memory",
                "save",
                "--memory",
                "c",
                "--role",
                role,
                "--content",
                text,
                "--source",
                f"s{n}",
                "--wait",
            ]
            code = await trio.to_thread.run_sync(main, [*argv, "--timeout", "60", *cli_args(settings)])
            assert code == 0, capsys.readouterr().err
    assert " done: saved message s3 (assistant) to memory c" in capsys.readouterr().out
    assert main(["memory", "show", "--memory", "c", "--json", *cli_args(settings)]) == 0
    assert [m["content"] for m in json.loads(capsys.readouterr().out)] == [text for _, text in CHAT]
    argv = ["memory", "search", "--memory", "c", "lentil dish", "-k", "1", "--json"]
    assert await trio.to_thread.run_sync(main, [*argv, *cli_args(settings)]) == 0
    (hit,) = json.loads(capsys.readouterr().out)
    assert hit["source_id"] in ("s2", "s3") and set(hit) == {
        "source_id",
        "role",
        "content",
        "position",
        "score",
    }
    assert main(["memory", "show", "--memory", "c", *cli_args(settings)]) == 0
    assert "user: My bicycle chain" in capsys.readouterr().out


async def test_hole17_5_memory_ids_are_each_tenant_s_own(xsettings, streams, rclient, keys, db):
    """Issue 17 hole 5: memory ids were global, so a memory task of one tenant could name (and
    overwrite, and read back) another tenant's memory."""
    from ingest.memory import conversation, save_message
    from tests.executor.support import all_in, running_daemon
    from tests.helpers import await_until

    mine = save_message(xsettings, "chat", "user", "the victim's words", source_id="m1", tenant_id="victim")
    theirs = save_message(xsettings, "chat", "user", "overwritten!", source_id="m1", tenant_id="attacker")
    async with running_daemon(xsettings):
        await await_until(lambda: all_in([mine, theirs], "done"), 30)
    assert [r["content"] for r in conversation(xsettings, "chat", tenant_id="victim")] == [
        "the victim's words"
    ]
    assert [r["content"] for r in conversation(xsettings, "chat", tenant_id="attacker")] == ["overwritten!"]
