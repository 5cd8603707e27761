"""Issue 17 hole 5: a URL printed by the CLI (or logged) shows no part of a secret: not the tail of
a password that holds ``@``, not ``?password=`` or any other secret-looking query parameter."""

from __future__ import annotations

import pytest

from db.config import redact_url
from ingest.cli import main


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("mysql://root:p@ss@db:3306/ingest", "mysql://root:***@db:3306/ingest"),
        ("mysql://root:a:b@c@db/ingest", "mysql://root:***@db/ingest"),
        ("redis://:s3cret@redis:6379/0", "redis://:***@redis:6379/0"),
        ("redis://redis:6379/0?password=s3cret&db=1", "redis://redis:6379/0?password=***&db=1"),
        (
            "rediss://u@redis/0?ssl_ca_certs=/ca.pem&PWD=x&passwd=y&api_key=z&auth_token=t&client_secret=s",
            "rediss://u@redis/0?ssl_ca_certs=/ca.pem&PWD=***&passwd=***&api_key=***&auth_token=***&client_secret=***",
        ),
        ("mysql://root@127.0.0.1:3306/ingest", "mysql://root@127.0.0.1:3306/ingest"),
        ("sqlite:////var/lib/ingest.db", "sqlite:////var/lib/ingest.db"),
        ("file:///srv/store", "file:///srv/store"),
        ("redis://u:pa%40ss@h:notaport/0", "redis://u:***@h:notaport/0"),
        ("", ""),
    ],
)
def test_redact_url_hides_every_secret_part(url, shown):
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:se@cr@et@h/0#password=frag", "redis://:***@h/0#password=***"),
        ("mysql://u:secret@[::1]:3306/x?token=secret", "mysql://u:***@[::1]:3306/x?token=***"),
        ("redis://:pa?ss@h/0", "redis://:***@h/0"),  # an unencoded ? in a password
        ("mysql://u:pa/ss@h/db", "mysql://u:***@h/db"),  # an unencoded / in a password
        ("redis://h/0?password=a@b", "redis://h/0?password=***"),
        ("file:///srv/user@x/store", "file:///srv/user@x/store"),
    ],
)
def test_redact_url_never_shows_a_secret_in_odd_urls(url, shown):
    assert redact_url(url) == shown


def test_cli_errors_show_the_url_without_the_password(settings, capsys):
    port_closed = "mysql://root:hunter2@tail@127.0.0.1:1/nodb"
    redis_closed = "redis://:hunter3@tail@127.0.0.1:1/0?password=hunter4"
    assert main(["status", "--db-url", port_closed, "--redis-url", redis_closed]) == 3  # unreachable
    _, err = capsys.readouterr()
    assert "127.0.0.1:1" in err
    for secret in ("hunter2", "hunter3", "hunter4", "tail@"):
        assert secret not in err, err
    assert main(["fleet", "--db-url", settings.db_url, "--redis-url", redis_closed]) == 3  # unreachable
    _, err = capsys.readouterr()
    assert "Redis unreachable at redis://:***@127.0.0.1:1/0?password=***" in err
