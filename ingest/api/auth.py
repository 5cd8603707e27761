"""Who is calling: the tenant from its header, checked against the API keys (``INGEST_API_KEYS``).

Without tenant keys, the tenant header chooses (``default`` when absent). With them, every
request carries ``Authorization: Bearer KEY``: a tenant's key fixes its tenant (a header naming
another is 403), the admin key (``INGEST_API_ADMIN_KEY``) may act for any tenant the header
names and is the only key admin routes take. Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import HTTPException, Request

from db.config import Settings
from db.keys import DEFAULT_TENANT, check_tenant


@dataclass(frozen=True)
class Caller:
    """The tenant a request acts for, and whether it came with the admin key."""

    tenant_id: str
    admin: bool = False


def parse_keys(text: str) -> dict[str, str]:
    """``TENANT=KEY,TENANT2=KEY2`` → {key: tenant}; ValueError for a malformed entry."""
    out: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        tenant, sep, key = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"INGEST_API_KEYS: {item!r} is not TENANT=KEY")
        out[key.strip()] = check_tenant(tenant.strip())
    return out


def _same(a: str, b: str) -> bool:
    # compare_digest takes str only when ASCII: compare the bytes of what a client sent
    return hmac.compare_digest(a.encode("utf-8", "surrogateescape"), b.encode("utf-8", "surrogateescape"))


class KeyRing:
    """The configured keys, and the checks each request goes through."""

    def __init__(self, settings: Settings) -> None:
        self.header = settings.api_tenant_header
        self.tenant_keys = parse_keys(settings.api_keys)
        self.admin_key = settings.api_admin_key

    @property
    def required(self) -> bool:
        return bool(self.tenant_keys)

    def _key_of(self, request: Request) -> str | None:
        value = request.headers.get("authorization")
        if value is None:
            return None
        scheme, _, key = value.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise HTTPException(401, "the Authorization header is not 'Bearer KEY'", _CHALLENGE)
        return key.strip()

    def identify(self, key: str) -> tuple[str | None, bool]:
        """(tenant of the key or None, is the admin key); every key is compared."""
        admin = bool(self.admin_key) and _same(key, self.admin_key)
        tenant = None
        for known, owner in self.tenant_keys.items():
            if _same(key, known):
                tenant = owner
        return tenant, admin

    def caller(self, request: Request) -> Caller:
        key = self._key_of(request)
        named = request.headers.get(self.header)
        if key is None:
            if self.required:
                raise HTTPException(401, "an API key is required: Authorization: Bearer KEY", _CHALLENGE)
            return Caller(_tenant(named or DEFAULT_TENANT))
        tenant, admin = self.identify(key)
        if admin:
            return Caller(_tenant(named or DEFAULT_TENANT), admin=True)
        if tenant is None:
            raise HTTPException(401, "unknown API key", _CHALLENGE)
        if named is not None and _tenant(named) != tenant:
            raise HTTPException(403, f"this key acts for its own tenant only, not {named!r}")
        return Caller(tenant)

    def admin(self, request: Request) -> Caller:
        if not self.admin_key:
            raise HTTPException(403, "admin routes are off (INGEST_API_ADMIN_KEY is not set)")
        key = self._key_of(request)
        if key is None:
            raise HTTPException(401, "the admin key is required: Authorization: Bearer KEY", _CHALLENGE)
        caller = self.caller(request)
        if not caller.admin:
            raise HTTPException(403, "this route takes the admin key only")
        return caller


_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _tenant(value: str) -> str:
    try:
        return check_tenant(value)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None


async def caller(request: Request) -> Caller:
    """FastAPI dependency: the caller of a tenant route."""
    ring: KeyRing = request.app.state.keyring
    return ring.caller(request)


async def admin(request: Request) -> Caller:
    """FastAPI dependency: the caller of an admin route (the admin key only)."""
    ring: KeyRing = request.app.state.keyring
    return ring.admin(request)
