"""Issue 17 hole 2: a submitted folder (or the file:// store) never reads through a symbolic
link to a place outside what was submitted, unless ``--follow-links`` / ``follow_links=True``."""

from __future__ import annotations

import os

import pytest

from db.database import unit
from db.models import Document
from ingest.cli import main
from ingest.producer import submit_documents
from ingest.storage import FileStorage, open_storage
from tests.ingest.factories import cli_args, stream_messages

SECRET = b"root:$6$not-for-the-knowledge-base\n"


def _planted(tmp_path):
    """An upload folder holding a file, a link to a secret outside it, and a link inside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "shadow").write_bytes(SECRET)
    folder = tmp_path / "upload"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("the beekeeper's notes")
    os.symlink(outside / "shadow", folder / "sub" / "secret.txt")
    os.symlink("../notes.txt", folder / "sub" / "alias.txt")  # stays inside the folder
    return folder, outside


def _stored_names() -> list[str]:
    with unit():
        return sorted(d.name for d in Document.select())


def test_a_link_in_a_folder_to_a_file_outside_it_is_refused_by_name(settings, tmp_path, rclient, keys):
    folder, _ = _planted(tmp_path)
    result = submit_documents(settings, [folder], "kb1")
    refused = dict(result.refused)
    reason = refused[str(folder / "sub" / "secret.txt")]
    assert "symbolic link" in reason and "outside the submitted folder" in reason
    assert "--follow-links" in reason
    assert sorted(d.name for d in result.documents) == ["notes.txt", "sub/alias.txt"]
    assert _stored_names() == ["notes.txt", "sub/alias.txt"]
    assert len(stream_messages(rclient, keys, 0)) == 2


def test_follow_links_reads_the_link_outside(settings, tmp_path):
    folder, _ = _planted(tmp_path)
    result = submit_documents(settings, [folder], "kb1", follow_links=True)
    assert result.refused == []
    assert "sub/secret.txt" in _stored_names()


def test_a_path_named_directly_that_is_a_link_is_refused_unless_following(settings, tmp_path):
    folder, outside = _planted(tmp_path)
    link = tmp_path / "direct.txt"
    os.symlink(outside / "shadow", link)
    result = submit_documents(settings, [link], "kb1")
    ((origin, reason),) = result.refused
    assert origin == str(link) and "is a symbolic link" in reason and "--follow-links" in reason
    assert result.documents == []
    assert submit_documents(settings, [link], "kb1", follow_links=True).refused == []


def test_a_folder_named_directly_that_is_a_link_is_refused_unless_following(settings, tmp_path):
    folder, _ = _planted(tmp_path)
    link = tmp_path / "upload-link"
    os.symlink(folder, link)
    result = submit_documents(settings, [link], "kb1")
    ((origin, reason),) = result.refused
    assert origin == str(link) and "is a symbolic link" in reason
    followed = submit_documents(settings, [link], "kb1", follow_links=True)
    assert sorted(d.name for d in followed.documents) == ["notes.txt", "sub/alias.txt", "sub/secret.txt"]


def test_cli_refuses_the_link_and_follow_links_allows_it(settings, tmp_path, capsys):
    folder, _ = _planted(tmp_path)
    assert main(["submit", str(folder), "--kb", "kb1", *cli_args(settings)]) == 1
    out, err = capsys.readouterr()
    assert f"refused {folder / 'sub' / 'secret.txt'}: is a symbolic link" in err
    assert main(["submit", str(folder), "--kb", "kb2", "--follow-links", *cli_args(settings)]) == 0


# -- the file:// store ---------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    (tmp_path / "secret").write_bytes(SECRET)
    return root, open_storage(f"file://{root}")


@pytest.mark.parametrize("key", ["../secret", "kb/../../secret", "/etc/passwd", "", ".", "kb/.."])
def test_a_storage_key_outside_the_root_is_refused(store, key):
    _, storage = store
    with pytest.raises(ValueError, match="storage"):
        storage.get(key)
    with pytest.raises(ValueError, match="storage"):
        storage.put(key, b"x")


def test_a_link_planted_in_the_storage_root_is_never_read_or_written_through(store, tmp_path):
    root, storage = store
    assert isinstance(storage, FileStorage)
    os.symlink(tmp_path / "secret", root / "leak")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root / "kb")  # a folder of the store that points out
    with pytest.raises(ValueError, match="outside the storage"):
        storage.get("leak")
    with pytest.raises(ValueError, match="outside the storage"):
        storage.get("kb/doc/hash")
    with pytest.raises(ValueError, match="outside the storage"):
        storage.put("kb/doc/hash", b"written outside")
    assert list((tmp_path / "elsewhere").iterdir()) == []
    with pytest.raises(ValueError, match="outside the storage"):
        storage.delete("leak")
    assert (tmp_path / "secret").read_bytes() == SECRET


def test_a_storage_root_that_is_itself_a_link_still_works(tmp_path):
    real = tmp_path / "real-store"
    real.mkdir()
    os.symlink(real, tmp_path / "mounted")
    storage = open_storage(f"file://{tmp_path / 'mounted'}")
    storage.put("kb/doc/hash", b"bytes")
    assert storage.get("kb/doc/hash") == b"bytes"
    assert (real / "kb" / "doc" / "hash").read_bytes() == b"bytes"
