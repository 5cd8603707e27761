"""Task type → handler: the registry the executor routes every claimed task through."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Union

from executor.context import TaskContext, TaskResult

Handler = Callable[[TaskContext], Awaitable[Union[TaskResult, None]]]
# A factory gets the executor's shared environment once and returns the handler.
HandlerFactory = Callable[[Any], Handler]

BUILTIN_HANDLERS = {
    "parse": "executor.handlers.parse:make_handler",
    "dataflow": "executor.handlers.dataflow:make_handler",
    "memory": "executor.handlers.memory:make_handler",
}


class Router:
    """Maps task types to handlers. Unknown types are the caller's to dead-letter."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, task_type: str, handler: Handler) -> None:
        if not callable(handler):
            raise TypeError(f"handler for {task_type!r} must be callable")
        self._handlers[task_type] = handler

    @property
    def task_types(self) -> list[str]:
        return sorted(self._handlers)

    async def route(self, ctx: TaskContext) -> TaskResult | None:
        handler = self._handlers.get(ctx.task_type)
        if handler is None:
            raise LookupError(f"no handler for task_type {ctx.task_type!r}")
        return await handler(ctx)


def load_object(spec: str) -> Any:
    """``module:attribute`` → the object."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"handler spec must be module:function, not {spec!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def parse_extra_handlers(text: str) -> dict[str, str]:
    """``"sleep=tests.handlers:sleep, noop=bench.dispatch:noop"`` → {type: spec}."""
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        task_type, sep, spec = item.partition("=")
        if not sep or not task_type.strip() or not spec.strip():
            raise ValueError(f"extra handler must be TYPE=module:function, not {item!r}")
        out[task_type.strip()] = spec.strip()
    return out


def build_router(env: Any, extra_handlers: str = "") -> Router:
    """The built-in handlers that are installed, plus ``INGEST_EXTRA_HANDLERS``.

    An entry is either an async handler (called with the task context) or a factory that
    takes the executor environment and returns one.
    """
    router = Router()
    specs = dict(BUILTIN_HANDLERS)
    specs.update(parse_extra_handlers(extra_handlers))
    for task_type, spec in specs.items():
        try:
            obj = load_object(spec)
        except ModuleNotFoundError as exc:
            if task_type in BUILTIN_HANDLERS and exc.name and exc.name.startswith("executor.handlers"):
                continue  # that handler is not part of this build
            raise
        handler = obj if inspect.iscoroutinefunction(obj) else obj(env)
        router.register(task_type, handler)
    return router
