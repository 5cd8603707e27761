"""Tests against Redis deployments a test starts itself (TLS, passwords, ACL users, Sentinel,
Cluster): settings on such a server, with a database of the test's own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from db.config import Settings
from db.database import close_database
from db.keys import Keys
from db.schema import init_schema
from db.streams import Streams, connect
from tests.conftest import _drop_database, make_settings
from tests.handlers import EXTRA_HANDLERS


@contextlib.contextmanager
def settings_on(test_name: str, **overrides: object) -> Iterator[Settings]:
    """Settings for a server the test runs (``redis_url`` and its TLS or password fields in
    ``overrides``): the test task types, schema and consumer group created; the database
    dropped after (the server goes with the test)."""
    s = make_settings(test_name, extra_handlers=EXTRA_HANDLERS, shutdown_grace_s=0.3, **overrides)
    init_schema(s.db_url)
    client = connect(s)
    try:
        Streams(client, Keys(s.key_prefix)).ensure_group()
        yield s
    finally:
        client.close()
        close_database()
        _drop_database(s.db_url)
