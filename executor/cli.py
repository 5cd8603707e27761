"""``ingest-executor CONSUMER_NAME``: one executor process; every setting is also a flag."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import random
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from db.config import Settings, parse_bool, parse_duration
from executor.logs import setup_logging
from ingest.allocator import JEMALLOC_CONF
from ingest.allocator import describe as describe_allocator

log = logging.getLogger("executor.cli")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NAME_IN_USE = 0, 1, 2, 3
STAGGER_JITTER_S = 0.5


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _flag_names(name: str) -> list[str]:
    """``redelivery_timeout_s`` → ``--redelivery-timeout`` and ``--redelivery-timeout-s``."""
    full = "--" + name.replace("_", "-")
    return [full[: -len("-s")], full] if name.endswith("_s") else [full]


def duration(text: str) -> float:
    """A flag's duration: ``100ms``, ``5s``, ``10m``, ``3h`` or plain seconds."""
    return parse_duration(text)


def _flag_type(f: dataclasses.Field[Any]) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if kind == "int":
        return int
    if kind == "bool":
        return parse_bool
    if kind == "float":
        return duration if f.name.endswith("_s") else float
    return str


def _metavar(f: dataclasses.Field[Any]) -> str:
    kind = _flag_type(f)
    return "DURATION" if kind is duration else "N" if kind is int else "VALUE"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ingest-executor",
        description="Run one executor: read the task streams, validate, claim, run and finish tasks. "
        "Each flag overrides its environment variable; durations take 100ms, 5s, 10m, 3h.",
    )
    parser.add_argument("consumer", metavar="CONSUMER_NAME", help="{host_id}_{n}; n staggers the start")
    for f in dataclasses.fields(Settings):
        text = f"{f.metadata.get('help', '')} [env {Settings.env_name(f.name)}, default {_default(f)!s}]"
        parser.add_argument(
            *_flag_names(f.name),
            dest=f.name,
            type=_flag_type(f),
            default=None,
            metavar=_metavar(f),
            help=text.replace("%", "%%"),
        )
    return parser


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str, Settings]:
    """The consumer name and the settings: flags win over ``environ``, which wins over defaults."""
    args = vars(build_parser().parse_args(list(argv)))
    consumer = args.pop("consumer")
    return consumer, Settings.from_env(environ, **args)


def consumer_number(consumer: str) -> int:
    match = re.search(r"_(\d+)$", consumer)
    return int(match.group(1)) if match else 0


def stagger_delay_s(consumer: str, stagger_s: float, rng: random.Random | None = None) -> float:
    """``n × stagger_s`` plus up to 0.5 s of jitter for consumer ``{host}_{n}``; 0 when off."""
    if stagger_s <= 0:
        return 0.0
    return consumer_number(consumer) * stagger_s + (rng or random).uniform(0, STAGGER_JITTER_S)


class StartUpStopped(Exception):
    """A SIGTERM or SIGINT during the staggered start: :func:`main` returns ``EXIT_OK``."""


class StartUpSignals:
    """SIGTERM and SIGINT from the start of :func:`main` until the daemon's own handlers take
    over: each logs ``SIGTERM during start-up: stopping (…)`` and the process exits 0 at once
    (README, Crashes). The staggered sleep is ended by :class:`StartUpStopped`; later (attaching
    the embedded Redis, building the daemon) a signal is noted and acted on at the next step, or
    handed to the daemon as a stop request once it exists, so no attachment is left half made."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.phase = "nothing was being waited for"
        self.stopped = False
        self.sleeping = False
        self.daemon: Any = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if not self.stopped:
            log.info("%s during start-up: stopping (%s)", signal.Signals(signum).name, self.phase)
        self.stopped = True
        if self.daemon is not None:
            self.daemon.request_stop()  # before its handlers: it stops as soon as it starts
        elif self.sleeping:
            raise StartUpStopped

    def sleep(self, delay_s: float) -> None:
        self.phase = f"staggered start: waiting {delay_s:.2f} s"
        self.sleeping = True
        try:
            if self.stopped:  # it came just before
                raise StartUpStopped
            time.sleep(delay_s)
        finally:
            self.sleeping = False
            self.phase = "nothing was being waited for"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        consumer, settings = parse_args(sys.argv[1:] if argv is None else argv, os.environ)
    except ValueError as exc:
        print(f"ingest-executor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(settings, consumer)
    allocator, best = describe_allocator(os.environ)
    if best:
        log.info("allocator: %s", allocator)
    else:  # started outside entrypoint.sh (bench/README.md, "the allocator was the cause")
        log.warning(
            "allocator: %s; entrypoint.sh preloads jemalloc with MALLOC_CONF=%s", allocator, JEMALLOC_CONF
        )
    signals = StartUpSignals()
    signals.install()
    try:
        return _run(consumer, settings, signals)
    except StartUpStopped:
        return EXIT_OK
    finally:
        signals.restore()


def _run(consumer: str, settings: Settings, signals: StartUpSignals) -> int:
    """The staggered start, then the daemon under the embedded Redis (when it is the one)."""
    delay = stagger_delay_s(consumer, settings.stagger_s)
    if delay:
        log.info("staggered start: waiting %.2f s", delay)
        signals.sleep(delay)
    from db.embedded import held
    from executor.daemon import Daemon
    from executor.heartbeat import NameInUse

    if signals.stopped:
        return EXIT_OK
    try:
        with held(settings.redis_url, settings.home):  # the embedded Redis lives while this runs
            signals.daemon = Daemon(settings, consumer, handle_signals=True)
            if signals.stopped:  # a signal came before the daemon could take it
                return EXIT_OK
            trio.run(signals.daemon.run)
    except NameInUse as exc:
        log.error("refusing to start: %s", exc)
        return EXIT_NAME_IN_USE
    except Exception:  # a bug or a bad setting: its traceback as one record, in the log format
        log.exception("executor %s stopped by an error", consumer)
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
