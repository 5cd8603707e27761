"""Executor tests: settings with the test task types, and a check that nothing is left pending."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from db.config import Settings
from db.keys import Keys
from db.streams import connect
from tests.handlers import EXTRA_HANDLERS


@pytest.fixture
def xsettings(settings: Settings) -> Settings:
    """The test database and prefix, the test task types, short grace and quick timings."""
    return settings.replace(extra_handlers=EXTRA_HANDLERS, shutdown_grace_s=0.3, max_concurrent_tasks=4)


@pytest.fixture(autouse=True)
def nothing_left_pending(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that used the streams, no entry is pending in the group."""
    if "settings" not in request.fixturenames:
        yield
        return
    settings: Settings = request.getfixturevalue("settings")  # set up first, so torn down after
    yield
    keys = Keys(settings.key_prefix)
    client = connect(settings)
    try:
        for stream in keys.queues:
            pending = client.xpending(stream, keys.group)["pending"]
            assert pending == 0, f"{pending} entries left pending on {stream}"
    finally:
        client.close()
