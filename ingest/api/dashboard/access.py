"""Who looks at the dashboard: the key a browser logged in with (an HttpOnly cookie), what it may
see and do, and the CSRF token of its actions.

A browser logs in once by posting its key to ``/dashboard/login``; the answer sets the cookie
``ingest_dashboard`` (HttpOnly, SameSite=Strict, path ``/dashboard``, Secure over HTTPS) holding
that key, checked on every request like a bearer key (``Authorization: Bearer`` works too).

- a tenant's key (``INGEST_API_KEYS``): read-only, its own documents, tasks, knowledge bases
  and standing only;
- the admin key (``INGEST_API_ADMIN_KEY``): every tenant, and the actions (replay, strike,
  restore, cancel, retry), each a POST carrying the CSRF token;
- no tenant keys configured: anyone who reaches the server reads every tenant (as the API lets
  anyone act for any tenant then); actions still need the admin key.

The CSRF token is an HMAC of a fixed label under the admin key: only pages shown to the admin
hold it, every worker process computes the same one, and a POST without it (or from another
origin) is refused. The login and the logout hold no token, so another site could post them (log
a browser in under the attacker's own tenant key, or out); they are refused from another origin
too (:func:`check_origin`), and there ``Origin: null`` (what a page that sends no referrer
gives) counts as another origin.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import HTTPException, Request

from ingest.api.auth import KeyRing

COOKIE = "ingest_dashboard"
COOKIE_PATH = "/dashboard"
COOKIE_MAX_AGE_S = 12 * 3600
CSRF_FIELD = "csrf"
_CSRF_LABEL = b"ingest dashboard csrf v1"


@dataclass(frozen=True)
class Viewer:
    """What one browser may see: ``tenant_id`` None means every tenant."""

    tenant_id: str | None
    admin: bool
    key: str | None  # the key it came with (None: no key, open server)

    def sees(self, tenant_id: str) -> bool:
        return self.tenant_id is None or self.tenant_id == tenant_id


class NeedsLogin(Exception):
    """No key (or a wrong one) where keys are required: the login page answers."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _ring(request: Request) -> KeyRing:
    ring: KeyRing = request.app.state.keyring
    return ring


def key_of(request: Request) -> str | None:
    value = request.headers.get("authorization", "")
    scheme, _, bearer = value.partition(" ")
    if scheme.lower() == "bearer" and bearer.strip():
        return bearer.strip()
    cookie = request.cookies.get(COOKIE)
    return cookie or None


def identify(ring: KeyRing, key: str | None) -> Viewer | None:
    """The viewer of ``key``; None when the key is unknown (or missing where keys are needed)."""
    if key is None:
        return None if ring.required else Viewer(None, False, None)
    tenant, admin = ring.identify(key)
    if admin:
        return Viewer(None, True, key)
    if tenant is not None:
        return Viewer(tenant, False, key)
    return None


def viewer(request: Request) -> Viewer:
    """FastAPI dependency of the dashboard's pages; :class:`NeedsLogin` when not allowed."""
    key = key_of(request)
    found = identify(_ring(request), key)
    if found is None:
        raise NeedsLogin("unknown key: log in again" if key else "log in with your API key")
    return found


def csrf_token(ring: KeyRing) -> str:
    if not ring.admin_key:
        return ""
    return hmac.new(ring.admin_key.encode(), _CSRF_LABEL, hashlib.sha256).hexdigest()


def check_action(request: Request, who: Viewer, token: str) -> None:
    """An action's checks: the admin key, the CSRF token, and (when the browser says) the same
    origin. 403 otherwise."""
    ring = _ring(request)
    if not who.admin:
        raise HTTPException(403, "actions need the admin key (log in with INGEST_API_ADMIN_KEY)")
    expected = csrf_token(ring)
    if not expected or not hmac.compare_digest(token.encode(), expected.encode()):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
    check_origin(request, opaque_ok=True)


def check_origin(request: Request, *, opaque_ok: bool = False) -> None:
    """403 when the browser says the request comes from another origin: its ``Origin`` header,
    or without one its ``Referer``'s. A request with neither (not a browser) passes.
    ``Origin: null`` (an opaque origin: a sandboxed frame, or a page whose referrer policy is
    ``no-referrer``, which an attacker's page can set) passes only where ``opaque_ok`` (an
    action, which its CSRF token guards). The host and port are compared with the ``Host``
    header, not the scheme: behind a proxy that ends TLS the browser says ``https://HOST`` while
    this server sees http (the proxy must pass ``Host`` on)."""
    origin = request.headers.get("origin")
    if not origin:
        referer = request.headers.get("referer")
        if not referer:
            return
        parts = urlsplit(referer)
        origin = f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else "null"
    if origin == "null" and opaque_ok:
        return
    if origin == "null" or urlsplit(origin).netloc != request.headers.get("host", ""):
        raise HTTPException(403, f"a request from another origin ({origin}) is refused")
