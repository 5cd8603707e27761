"""Run the API: ``serve(settings)`` on hypercorn's trio worker, one process or several.

One worker serves ``create_app(settings)`` in this process. More than one: hypercorn spawns
worker processes that import ``ingest.api.app:app``, which builds its settings from the
environment, so the settings go to them as ``INGEST_*`` variables.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Mapping
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config

from db.config import MYSQL_URL_SCHEMES, SECRET_FIELDS, Settings, secret_value, url_with_password

log = logging.getLogger(__name__)

GRACEFUL_TIMEOUT_S = 5.0


def settings_environ(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``INGEST_*`` variables that make ``Settings.from_env`` build exactly ``settings``, beside
    ``environ``: a secret that ``environ`` names a file for (``INGEST_X_FILE``), and that file
    still holds, is left out (the workers read the same file; the secret stays out of their
    environment)."""
    out = {}
    for f in dataclasses.fields(Settings):
        value = getattr(settings, f.name)
        name = Settings.env_name(f.name)
        if f.name in SECRET_FIELDS and environ and environ.get(name + "_FILE"):
            with contextlib.suppress(ValueError):
                if secret_value(environ, name) == value:
                    continue
        out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    if (
        settings.db_password
        and settings.db_url.startswith(MYSQL_URL_SCHEMES)
        and Settings.env_name("db_password") not in out
    ):
        # the URL holds the password too (Settings puts it there): each worker puts it back
        out[Settings.env_name("db_url")] = url_with_password(settings.db_url, "")
    return out


def hypercorn_config(host: str, port: int, workers: int) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.worker_class = "trio"
    config.workers = workers
    config.graceful_timeout = GRACEFUL_TIMEOUT_S
    config.application_path = "ingest.api.app:app"
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # through the root logger
    return config


async def _until_signalled() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal %s: shutting down", signal.Signals(signum).name)
            return


def serve(
    settings: Settings, *, host: str | None = None, port: int | None = None, workers: int | None = None
) -> None:
    """Serve until SIGTERM or SIGINT; blocking. ``host``/``port``/``workers`` default to
    ``settings.api_host``/``api_port``/``api_workers`` (127.0.0.1:8080, 1)."""
    host = host or settings.api_host
    port = settings.api_port if port is None else port
    workers = max(1, settings.api_workers if workers is None else workers)
    settings = settings.replace(api_host=host, api_port=port, api_workers=workers)
    config = hypercorn_config(host, port, workers)
    if workers == 1:
        from hypercorn.trio import serve as hypercorn_serve

        from ingest.api.app import create_app

        config.workers = 1
        # an ASGI app: hypercorn's ASGIFramework type does not admit FastAPI's signature
        app: Any = create_app(settings)
        trio.run(partial(hypercorn_serve, app, config, shutdown_trigger=_until_signalled))
        return
    from hypercorn.run import run

    # what the spawned workers build from: a secret given plainly replaces its file's variable
    # (Settings.from_env refuses both)
    environ = settings_environ(settings, os.environ)
    for name in SECRET_FIELDS:
        if Settings.env_name(name) in environ:
            os.environ.pop(Settings.env_name(name) + "_FILE", None)
    os.environ.update(environ)
    code = run(config)
    if code:
        raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    """``python -m ingest.api``: settings from the environment, a few flags over them."""
    parser = argparse.ArgumentParser(prog="python -m ingest.api", description="Run the HTTP API.")
    parser.add_argument("--host", help="address to bind (INGEST_API_HOST, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (INGEST_API_PORT, 8080)")
    parser.add_argument("--workers", type=int, help="worker processes (INGEST_API_WORKERS, 1)")
    args = parser.parse_args(argv)
    settings = Settings.from_env(os.environ)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(settings, host=args.host, port=args.port, workers=args.workers)
