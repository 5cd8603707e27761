"""What the submitting process sees at once is refused by name; the other files still go in."""

from __future__ import annotations

import os

from db.database import unit
from db.models import Document
from ingest.cli import main
from ingest.producer import submit_documents
from tests.ingest.factories import cli_args, stream_messages
from tests.lifecycle import rule


def _tree(tmp_path):
    (tmp_path / "good.txt").write_text("good")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "big.txt").write_bytes(b"x" * 101)
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.txt")  # cannot be read, even by root
    os.mkfifo(tmp_path / "pipe.txt")  # not a regular file: must not hang the submit
    return tmp_path


@rule("publish.refusals")
def test_unreadable_empty_and_too_large_files_are_refused_by_name_and_the_rest_enqueued(
    settings, tmp_path, rclient, keys
):
    folder = _tree(tmp_path)
    s = settings.replace(max_doc_bytes=100)
    missing = folder / "missing.txt"
    result = submit_documents(s, [folder, missing, ("pair.txt", b""), ("ok-pair.txt", b"fine")], "kb1")
    refused = dict(result.refused)
    assert "is empty" in refused[str(folder / "empty.txt")]
    assert "larger than the limit" in refused[str(folder / "big.txt")]
    assert "broken symbolic link" in refused[str(folder / "dangling.txt")]
    assert "not a regular file" in refused[str(folder / "pipe.txt")]
    assert "does not exist" in refused[str(missing)]
    assert "is empty" in refused["pair.txt"]
    assert len(refused) == 6
    assert sorted(d.name for d in result.documents) == ["good.txt", "ok-pair.txt"]
    assert len(stream_messages(rclient, keys, 0)) == 2
    with unit():
        assert sorted(d.name for d in Document.select()) == ["good.txt", "ok-pair.txt"]


def test_the_same_document_name_twice_in_one_call_is_refused_the_second_time(settings):
    result = submit_documents(settings, [("a.txt", b"one"), ("a.txt", b"two")], "kb1")
    assert len(result.documents) == 1
    assert result.refused == [("a.txt", "same document name 'a.txt' as a.txt")]


def test_an_empty_folder_is_refused(settings, tmp_path):
    (tmp_path / "empty-dir.pdf").mkdir()
    result = submit_documents(settings, [tmp_path / "empty-dir.pdf"], "kb1")
    assert result.documents == [] and result.refused == [
        (str(tmp_path / "empty-dir.pdf"), "folder holds no files")
    ]


@rule("publish.refusals")
def test_cli_names_each_refused_file_on_stderr_and_exits_1(
    settings, tmp_path, capsys, monkeypatch, rclient, keys
):
    folder = _tree(tmp_path)
    monkeypatch.setenv("INGEST_MAX_DOC_BYTES", "100")
    code = main(["submit", str(folder), "--kb", "kb1", "--json", *cli_args(settings)])
    out, err = capsys.readouterr()
    assert code == 1
    for name in ("empty.txt", "big.txt", "dangling.txt", "pipe.txt"):
        assert f"refused {folder / name}:" in err
    assert "good.txt" not in err
    assert len(stream_messages(rclient, keys, 0)) == 1


def test_cli_exits_0_when_nothing_was_refused(settings, tmp_path, capsys):
    (tmp_path / "a.txt").write_text("a")
    assert main(["submit", str(tmp_path / "a.txt"), "--kb", "kb1", *cli_args(settings)]) == 0
    out, err = capsys.readouterr()
    assert "1 document(s), 1 task(s), 1 published" in out and err == ""


def test_a_file_name_that_is_not_utf8_is_refused_by_name_and_the_rest_enqueued(settings, tmp_path, capsys):
    """A Latin-1 name from another system (os.walk hands it over with surrogates): it failed
    the whole submit with a traceback (the document id hashes the name as JSON)."""
    (tmp_path / "ok.txt").write_text("fine")
    with open(os.fsencode(tmp_path) + b"/caf\xe9.txt", "wb") as fh:
        fh.write(b"latin-1 name")
    result = submit_documents(settings, [tmp_path], "kb1")
    assert [d.name for d in result.documents] == ["ok.txt"]
    [(origin, why)] = result.refused
    assert why == "name is not valid UTF-8 (rename the file)" and origin.endswith("caf\\xe9.txt")
    assert main(["submit", str(tmp_path), "--kb", "kb2", *cli_args(settings)]) in (0, 1)
    assert "caf\\xe9.txt" in capsys.readouterr().err
