"""Database URLs: a sqlite URL follows the usual rule (three slashes then the path: relative,
or absolute with a fourth); mysql URLs name host, port, user, password and database."""

from __future__ import annotations

import pytest

from db.database import DbUrl, close_database
from db.schema import init_schema


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///data.db", "data.db"),
        ("sqlite:///var/ingest.db", "var/ingest.db"),
        ("sqlite:////var/lib/ingest/ingest.db", "/var/lib/ingest/ingest.db"),
        ("sqlite:///:memory:", ":memory:"),
        ("sqlite:////tmp/with%20space.db", "/tmp/with space.db"),
    ],
)
def test_a_sqlite_url_is_relative_with_three_slashes_and_absolute_with_four(url, path):
    parsed = DbUrl.parse(url)
    assert (parsed.kind, parsed.name) == ("sqlite", path)


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://data.db", "sqlite:data.db"])
def test_a_sqlite_url_without_a_path_after_three_slashes_is_refused(url):
    with pytest.raises(ValueError, match="sqlite"):
        DbUrl.parse(url)


def test_a_mysql_url_names_its_server_and_database():
    parsed = DbUrl.parse("mysql://u:p%40ss@db.local:3307/ingest?read_timeout=5")
    assert (parsed.kind, parsed.host, parsed.port, parsed.user, parsed.password, parsed.name) == (
        "mysql",
        "db.local",
        3307,
        "u",
        "p@ss",
        "ingest",
    )
    assert dict(parsed.options) == {"read_timeout": "5"}


def test_a_relative_sqlite_database_is_made_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        assert init_schema("sqlite:///data/ingest.db").created_tables
    finally:
        close_database()
    assert (tmp_path / "data" / "ingest.db").is_file()
    absolute = tmp_path / "abs" / "ingest.db"
    try:
        init_schema(f"sqlite:///{absolute}")  # an absolute path: the fourth slash is its own
    finally:
        close_database()
    assert absolute.is_file()
