"""The strike rules this executor applies, reloaded from the database whenever they change.

At most every :data:`CHECK_S` the book reads the mirrored version (one HGET of
``keys.strikes``); when it moves, after every Redis outage (a reconnect), and every
:data:`RELOAD_S` in any case, it reloads the active rules from the database, the truth. The claim
applies ``book.rules`` to every batch it validates (``ingest.strikes``, ``executor.claim``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import peewee
import redis
import trio

from db.database import RETRYABLE_DB_ERRORS
from db.keys import Keys
from db.streams import RETRYABLE_REDIS_ERRORS
from executor.context import Limiters
from executor.outage import Outage
from ingest.strikes import Rule, load_active, mirrored_version, non_finite

log = logging.getLogger("executor.strikes")

CHECK_S = 0.5  # how often the mirrored version is read: rules reach every executor within a second
RELOAD_S = 30.0  # reload from the database this often even if the version never moved


def _table_missing(exc: BaseException) -> bool:
    text = str(exc)
    return "1146" in text or "no such table" in text or "doesn't exist" in text


class StrikeBook:
    """``rules``: the active strike rules, oldest first; replaced whole on each reload."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        limiters: Limiters,
        outages: tuple[Outage, Outage],
        on_change: Any = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.limiters = limiters
        self.redis_outage, self.db_outage = outages
        self.on_change = on_change  # called with the number of rules after each reload
        self.rules: tuple[Rule, ...] = ()
        self.version: int | None = None  # the mirror's version the rules were loaded for
        self.loaded_at = 0.0
        self._outages_seen = 0
        self._warned_missing = False

    def _load_rules(self) -> list[Rule]:
        """Active rules (blocking; on a pooled connection)."""
        try:
            return load_active()
        except (peewee.ProgrammingError, peewee.OperationalError) as exc:
            if not _table_missing(exc):
                raise
            if not self._warned_missing:
                log.warning("no strike table: run `ingest init`; no strike rules apply meanwhile")
                self._warned_missing = True
            return []

    async def _reload(self, version: int | None) -> float:
        """Load the rules; returns 0, or how long to back off when the database did not answer."""
        began = time.monotonic()
        try:
            # a read: abandoned on a cancel (a stop while the database stalls, at start-up too)
            rules = await self.limiters.db_connection(self._load_rules, abandon_on_cancel=True)
        except RETRYABLE_DB_ERRORS as exc:
            return self.db_outage.failed(exc)
        self.db_outage.ok(since=began)
        changed = tuple(rules) != self.rules
        self.rules, self.version, self.loaded_at = tuple(rules), version, time.monotonic()
        if changed:
            text = "; ".join(r.describe() for r in rules) or "none"
            log.info("strike rules now in effect (version %s): %s", version, text)
            for rule in rules:
                if rule.field and non_finite(rule.value):  # stored by an older release, or by hand
                    log.warning(
                        "%s holds nothing: %r is not a finite number and is never compared",
                        rule.describe(),
                        rule.value,
                    )
        if self.on_change is not None:
            self.on_change(len(rules))
        return 0.0

    async def start(self) -> None:
        """Before the first read: the version, then the rules (waiting out an outage of either)."""
        version: int | None = None
        while True:
            try:
                version = await self.limiters.redis(mirrored_version, self.client, self.keys)
            except RETRYABLE_REDIS_ERRORS as exc:
                await self.redis_outage.backoff(exc)
                continue
            self.redis_outage.ok()
            break
        self._outages_seen = self.redis_outage.outages
        while delay := await self._reload(version):
            await trio.sleep(delay)

    async def _read_version(self) -> int:
        try:
            return await self.limiters.redis(mirrored_version, self.client, self.keys)
        except RETRYABLE_REDIS_ERRORS:  # a pooled connection that died with a Redis restart:
            return await self.limiters.redis(mirrored_version, self.client, self.keys)  # once more

    async def run(self) -> None:
        """Check the mirrored version every :data:`CHECK_S`; reload when it moves, after a Redis
        reconnect, or every :data:`RELOAD_S`."""
        while True:
            await trio.sleep(CHECK_S)
            try:
                version: int | None = await self._read_version()
            except RETRYABLE_REDIS_ERRORS as exc:
                self.redis_outage.failed(exc)
                continue
            except redis.ResponseError as exc:  # e.g. the key holds another type
                log.warning("cannot read the strike mirror %s: %s", self.keys.strikes, exc)
                version = self.version
            else:
                self.redis_outage.ok()
            reconnected = self.redis_outage.outages != self._outages_seen
            stale = time.monotonic() - self.loaded_at >= RELOAD_S
            if (version != self.version or reconnected or stale) and not await self._reload(version):
                self._outages_seen = self.redis_outage.outages
