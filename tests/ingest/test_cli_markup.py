"""Users' text goes to the terminal as it is: brackets that look like rich markup (``[/etc/hosts]``
raised MarkupError, ``[word]`` vanished) and emoji codes are printed verbatim, through the CLI."""

from __future__ import annotations

from db.database import unit
from db.models import RUNNING, Task
from ingest.chunking import ChunkConfig, chunk_document
from ingest.cli import main
from ingest.memory import check_message, store_message
from ingest.parsers import parse_document
from ingest.store import record_embedding_model, store_chunks
from tests.fixtures_docs import add_document, embedder  # noqa: F401 - the session's one model
from tests.ingest.factories import cli_args

TRICKY = "see [/etc/hosts] and [word] or [bold]this[/bold] :thumbs_up: before [link=x]"


def _one_line(out: str) -> str:
    return " ".join(out.split())


def _save(memory_id: str, source_id: str, role: str, content: str, vector) -> None:
    with unit():  # the task the message is stored for: store_message is fenced on its row
        Task.insert(id="t" * 32, task_type="memory", status=RUNNING, attempt=1).on_conflict_ignore().execute()
    raw = {"memory_id": memory_id, "source_id": source_id, "message_dict": {"role": role, "content": content}}
    store_message(check_message(raw), vector, "t" * 32, default_position=1)


def test_memory_show_and_search_print_brackets_as_they_are(settings, db, embedder, capsys):  # noqa: F811
    _save("m1", "s1", "user", TRICKY, embedder.encode([TRICKY])[0])
    assert main(["memory", "show", "--memory", "m1", *cli_args(settings)]) == 0
    assert capsys.readouterr().out == f"user: {TRICKY}\n"
    assert main(["memory", "search", "--memory", "m1", "hosts file", *cli_args(settings)]) == 0
    assert TRICKY in _one_line(capsys.readouterr().out)


def test_search_prints_a_chunk_with_brackets_as_it_is(settings, db, embedder, capsys):  # noqa: F811
    data = f"Host names. {TRICKY}".encode()
    task, doc, kb = add_document(settings, "[draft] hosts.txt", data, kb_name="kb1")
    chunks = chunk_document(parse_document(data, "txt"), ChunkConfig(), embedder.model)
    record_embedding_model(kb["id"], embedder.identity, embedder.dim)
    store_chunks(
        kb_id=kb["id"],
        doc_id=doc["id"],
        task_id=task["id"],
        generation=1,
        chunks=chunks,
        vectors=embedder.encode([c.content for c in chunks]),
    )
    assert main(["search", "--kb", "kb1", "hosts", *cli_args(settings)]) == 0
    out = _one_line(capsys.readouterr().out)
    assert TRICKY in out and "[draft] hosts.txt" in out


def test_submit_and_status_print_bracketed_names_as_they_are(settings, tmp_path, capsys):
    (tmp_path / "docs" / "[").mkdir(parents=True)
    (tmp_path / "docs" / "[" / "x].txt").write_text("text")  # named "[/x].txt" in its folder
    (tmp_path / "docs" / "[draft] notes.txt").write_text("text")
    assert main(["submit", str(tmp_path / "docs"), "--kb", "kb1", *cli_args(settings)]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = sorted(" ".join(line.split()[1:-4]) for line in lines[1:])
    assert names == ["[/x].txt", "[draft] notes.txt"]
    for line in lines[1:]:
        assert main(["status", line.split()[0], *cli_args(settings)]) == 0
        assert "document [" in capsys.readouterr().out
