"""``ingest.Client``: what an application service calls instead of shelling out to the CLI.

One object holds the settings (from a :class:`~db.config.Settings`, URLs, or the environment)
and a tenant, and offers the producer side: ``submit`` (paths, or bytes with a name),
``submit_tasks``, ``status``, ``watch`` (progress events until the end), ``wait``, ``result``,
``cancel``, ``retry``, ``search``. Errors are typed (:mod:`ingest.errors`): :class:`NotFound`
for an unknown id or knowledge base (or another tenant's), :class:`LimitExceeded` when a
tenant's limit refuses a submission (nothing written), :class:`InvalidInput` for an argument
outside the contract (nothing written), :class:`PublishError` when rows were committed and
Redis refused their messages (the reconciler publishes them).

Every call blocks (database and Redis round trips): from trio or asyncio, call it in a worker
thread (``trio.to_thread.run_sync``, ``asyncio.to_thread``) or use :class:`AsyncClient`, which does
that through anyio. Importing this module loads no torch and no parser; ``search`` loads the
embedding model in this process on its first call.
"""

from __future__ import annotations

import collections
import contextlib
import os
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from db.config import Settings
from db.keys import Keys
from ingest.errors import IngestError, InvalidInput, NotFound

__all__ = ["AsyncClient", "Client"]

T = TypeVar("T")
MIN_READ_S = 0.1  # a busy fleet publishes many events: the row is read at most this often


def _invalid(call: Callable[[], T]) -> T:
    """``call()``, its plain ``ValueError`` (a bad argument: nothing was written) raised as
    :class:`InvalidInput`; the project's own errors pass as they are."""
    try:
        return call()
    except ValueError as exc:
        if isinstance(exc, IngestError):
            raise
        raise InvalidInput(str(exc)) from exc


class Client:
    """The producer side for one tenant.

    ``Client()`` reads the environment (``INGEST_*``, like the CLI); ``Client(settings)`` takes
    them as given; ``db_url``, ``redis_url`` and ``key_prefix`` override either. ``tenant`` is
    the tenant every call acts for (``default``): another tenant's ids read as not found.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        db_url: str | None = None,
        redis_url: str | None = None,
        key_prefix: str | None = None,
        tenant: str = "default",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        from db.keys import check_tenant

        overrides = {"db_url": db_url, "redis_url": redis_url, "key_prefix": key_prefix}
        if settings is None:
            settings = Settings.from_env(os.environ if environ is None else environ, **overrides)
        else:
            settings = settings.replace(**{k: v for k, v in overrides.items() if v is not None})
        _invalid(lambda: check_tenant(tenant))
        self.settings = settings
        self.tenant = tenant
        self.keys = Keys(settings.key_prefix)
        self._redis: Any = None
        self._embedded: Any = None
        if settings.embedded:  # the host's embedded Redis: started if needed, kept up until close
            from db.embedded import Hold

            self._embedded = Hold(settings.home)
            self._embedded.open()

    # -- lifetime ----------------------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close this client's Redis connection (the database connections are per call), and
        let the embedded Redis go if this client held it last."""
        if self._redis is not None:
            with contextlib.suppress(Exception):
                self._redis.close()
            self._redis = None
        if self._embedded is not None:
            self._embedded.close()
            self._embedded = None

    def _client(self) -> Any:
        if self._redis is None:
            from db.streams import connect

            self._redis = connect(self.settings)
        return self._redis

    # -- enqueue -----------------------------------------------------------------------------

    def submit(
        self,
        *sources: str | os.PathLike[str] | tuple[str, bytes],
        kb: str,
        priority: int = 0,
        dataflow: str | None = None,
        parser_config: Mapping[str, Any] | None = None,
        follow_links: bool = False,
    ) -> Any:
        """Enqueue documents into knowledge base ``kb`` (created when missing); returns the
        :class:`~ingest.producer.SubmitResult` (``documents`` with their ids and task ids,
        ``refused`` with each refused file and why).

        Each source is a path (a folder: the files under it) or a ``(name, bytes)`` pair.
        ``dataflow`` names a stored dataflow to run instead of ``parse``."""
        from ingest.producer import submit_documents

        items: list[Any] = []
        for source in sources:
            if isinstance(source, tuple):
                if len(source) != 2 or not isinstance(source[1], (bytes, bytearray, memoryview)):
                    raise InvalidInput("a source given as a tuple is (name, bytes)")
                items.append((str(source[0]), bytes(source[1])))
            elif isinstance(source, (str, os.PathLike)):
                items.append(Path(source))
            else:
                raise InvalidInput(f"a source is a path or a (name, bytes) pair, not {type(source).__name__}")
        if not items:
            raise InvalidInput("submit takes at least one path or (name, bytes) pair")
        dataflow_id = None
        if dataflow is not None:
            from ingest.dataflow.catalog import get_dataflow

            dataflow_id = _invalid(lambda: get_dataflow(self.settings, dataflow, tenant_id=self.tenant))["id"]
        return _invalid(
            lambda: submit_documents(
                self.settings,
                items,
                kb,
                tenant_id=self.tenant,
                priority=priority,
                parser_config=parser_config,
                dataflow_id=dataflow_id,
                follow_links=follow_links,
            )
        )

    def submit_bytes(self, name: str, data: bytes, *, kb: str, **options: Any) -> Any:
        """One document from memory: ``submit((name, data), kb=kb, ...)``."""
        return self.submit((name, data), kb=kb, **options)

    def submit_tasks(self, tasks: Iterable[Mapping[str, Any]]) -> list[str]:
        """Enqueue tasks of any type (``task_type`` and its message fields, e.g. a ``memory``
        task's ``memory_id``, ``source_id``, ``message_dict``) under this client's tenant;
        returns their ids. A task naming another tenant is refused."""
        from ingest.producer import enqueue_tasks

        given = []
        for task in tasks:
            if not isinstance(task, Mapping):
                raise InvalidInput(f"a task is a mapping of fields, not {type(task).__name__}")
            tenant = task.get("tenant_id", self.tenant)
            if tenant != self.tenant:
                raise InvalidInput(f"a task of tenant {tenant!r} given to a client of tenant {self.tenant!r}")
            given.append({**task, "tenant_id": self.tenant})
        return _invalid(lambda: enqueue_tasks(self.settings, given))

    # -- follow ------------------------------------------------------------------------------

    def status(self, id_: str) -> dict[str, Any]:
        """One task (``{"kind": "task", "task": {...}}``) or one document with its current
        generation's tasks (``{"kind": "document", "document": {...}, "tasks": [...]}``)."""
        from ingest.status import describe

        return describe(self.settings, id_, tenant_id=self.tenant)

    def watch(
        self, id_: str, *, timeout_s: float | None = None, poll_s: float = 0.5
    ) -> Generator[dict[str, Any], None, None]:
        """Events of one task or document until it ends, each a dict with ``event``:
        ``state`` (first, the row as it is), ``progress`` (each change of status, progress or
        message a read of the row sees) and ``end`` (last: ``status`` done, failed, cancelled,
        dead, or ``removed``); the described row is under ``state``.

        The rows are the truth: the watch subscribes to the updates channel before its first
        read and reads the row again on each event or every ``poll_s``, so it never misses the
        end (an event lost by Redis only delays it to the next poll). Raises
        :class:`NotFound` for an unknown id, ``TimeoutError`` when ``timeout_s`` runs out first.
        """
        from ingest.status import describe, end_status, fingerprint, is_terminal, slim
        from ingest.task_wait import Waker

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        waker = Waker(self.settings)
        try:
            state = describe(self.settings, id_, tenant_id=self.tenant)
            yield {"event": "state", "id": id_, "state": slim(state)}
            last = fingerprint(state)
            while not is_terminal(state):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{id_} had not ended after {timeout_s:g} s")
                read_at = time.monotonic()
                waker.sleep(poll_s if left is None else max(0.01, min(poll_s, left)))
                time.sleep(max(0.0, MIN_READ_S - (time.monotonic() - read_at)))
                try:
                    state = describe(self.settings, id_, tenant_id=self.tenant)
                except NotFound:
                    yield {"event": "end", "id": id_, "status": "removed", "state": None}
                    return
                now = fingerprint(state)
                if now != last:
                    last = now
                    yield {"event": "progress", "id": id_, "state": slim(state)}
            yield {"event": "end", "id": id_, "status": end_status(state), "state": slim(state)}
        finally:
            waker.close()

    def wait(self, id_: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """The last event of :meth:`watch` (``event`` ``end``): blocks until the task or
        document ends."""
        (last,) = collections.deque(self.watch(id_, timeout_s=timeout_s), maxlen=1)
        return last

    def result(self, task_id: str) -> dict[str, Any]:
        """A finished task's result (``status``, ``kind`` success|failure, ``chunk_count``,
        ``error``, ``finished_at``, ...). Single use by default: it expires
        ``result_removal_delay_s`` after the first fetch. :class:`NotFound` when the task has
        not finished, its result expired, or it is another tenant's."""
        from db.results import Results

        found = Results(self._client(), self.keys).fetch(
            task_id,
            tenant_id=self.tenant,
            single_use=self.settings.single_use_results,
            removal_delay_s=self.settings.result_removal_delay_s,
        )
        if found is None:
            raise NotFound(f"no result for task {task_id!r} (not finished, expired, or not yours)")
        return found

    # -- change ------------------------------------------------------------------------------

    def cancel(self, id_: str) -> Any:
        """Cancel a task, or every unfinished task of a document (rows first); returns the
        :class:`~ingest.control.CancelResult` (``task_ids`` empty: nothing was unfinished)."""
        from ingest.control import cancel

        return cancel(self.settings, id_, tenant_id=self.tenant)

    def retry(self, id_: str) -> Any:
        """Re-queue a task's or a document's failed, dead or cancelled tasks; returns the
        :class:`~ingest.control.RetryResult` (``skipped`` says why a task was not)."""
        from ingest.control import retry

        return retry(self.settings, id_, tenant_id=self.tenant)

    # -- read --------------------------------------------------------------------------------

    def search(self, kb: str, query: str, k: int = 5) -> list[Any]:
        """The ``k`` chunks of knowledge base ``kb`` closest to ``query``, best first (each a
        :class:`~ingest.search.Hit`: ``doc_name``, ``page``, ``score``, ``content``, ...)."""
        if not isinstance(k, int) or not 1 <= k <= 1000:
            raise InvalidInput(f"k is 1 to 1000, not {k!r}")
        from ingest.search import search

        return search(self.settings, kb, query, k=k, tenant_id=self.tenant)


class AsyncClient:
    """:class:`Client` for trio or asyncio callers (through anyio): each call runs the blocking
    one in a worker thread under one limiter of ``threads`` (4); ``watch`` is an async
    iterator."""

    def __init__(self, *args: Any, threads: int = 4, **kwargs: Any) -> None:
        self.sync = Client(*args, **kwargs)
        self._threads = threads
        self._limiter: Any = None

    async def _run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        import functools

        import anyio.to_thread

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._threads)
        return await anyio.to_thread.run_sync(functools.partial(func, *args, **kwargs), limiter=self._limiter)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._run(self.sync.close)

    async def submit(self, *sources: Any, **options: Any) -> Any:
        return await self._run(self.sync.submit, *sources, **options)

    async def submit_tasks(self, tasks: Sequence[Mapping[str, Any]]) -> list[str]:
        return await self._run(self.sync.submit_tasks, list(tasks))

    async def status(self, id_: str) -> dict[str, Any]:
        return await self._run(self.sync.status, id_)

    async def result(self, task_id: str) -> dict[str, Any]:
        return await self._run(self.sync.result, task_id)

    async def cancel(self, id_: str) -> Any:
        return await self._run(self.sync.cancel, id_)

    async def retry(self, id_: str) -> Any:
        return await self._run(self.sync.retry, id_)

    async def search(self, kb: str, query: str, k: int = 5) -> list[Any]:
        return await self._run(self.sync.search, kb, query, k)

    async def watch(self, id_: str, *, timeout_s: float | None = None, poll_s: float = 0.5) -> Any:
        """The events of :meth:`Client.watch`, each read in a worker thread."""
        events = self.sync.watch(id_, timeout_s=timeout_s, poll_s=poll_s)
        done = object()
        try:
            while True:
                event = await self._run(next, events, done)
                if event is done:
                    return
                yield event
        finally:
            await self._run(events.close)

    async def wait(self, id_: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        return await self._run(self.sync.wait, id_, timeout_s=timeout_s)
