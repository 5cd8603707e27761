"""The dashboard's Jinja2 environment: autoescape on everything, a few formatting filters, and
the security headers every dashboard answer carries (a strict Content-Security-Policy: scripts
and styles from this server's static files only, nothing inline)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
)


def _ago(ms: Any) -> str:
    if not isinstance(ms, (int, float)) or ms <= 0:
        return ""
    return _seconds(time.time() - ms / 1000.0) + " ago"


def _seconds(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "?"
    s = max(0.0, float(value))
    if s < 60:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def _when(ms: Any) -> str:
    if not isinstance(ms, (int, float)) or ms <= 0:
        return ""
    return datetime.fromtimestamp(ms / 1000.0, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _percent(progress: Any) -> str:
    if not isinstance(progress, (int, float)):
        return ""
    return "" if progress < 0 else f"{100 * min(1.0, progress):.0f}%"


def _bar(progress: Any) -> float:
    """The value of a ``<progress max=1>``: failed rows (-1) show empty."""
    return max(0.0, min(1.0, float(progress))) if isinstance(progress, (int, float)) else 0.0


ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    autoescape=True,  # every template, every value: user text never reaches the page raw
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters.update(ago=_ago, seconds=_seconds, when=_when, percent=_percent, bar=_bar)
ENV.globals.update(urlencode=urlencode)


def render(name: str, context: dict[str, Any]) -> str:
    return ENV.get_template(name).render(context)


class SecurityHeaders:
    """Adds :data:`HEADERS` to every answer under ``/dashboard``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith("/dashboard"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)
