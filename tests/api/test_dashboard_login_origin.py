"""The dashboard's login and logout hold no CSRF token, so another site's page could post them: log
a browser in under the attacker's own tenant key (login CSRF: what the victim then does is seen
by the attacker's tenant), or log it out. Both refuse a request whose Origin (or, without one,
Referer) is another site's, and ``Origin: null`` (which any page sets by sending no referrer);
a request that names no origin at all (not a browser) is let through, as the actions' check does."""

from __future__ import annotations

import httpx
import pytest

from ingest.api.dashboard.access import COOKIE
from tests.api.support import TENANT_KEYS, ApiServer

ALPHA = TENANT_KEYS["alpha"]
EVIL = "https://evil.example"


def _login(server: ApiServer, headers: dict[str, str]) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, headers=headers) as c:
        return c.post("/dashboard/login", data={"key": ALPHA})


def _logout(server: ApiServer, headers: dict[str, str]) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, headers=headers, cookies={COOKIE: ALPHA}) as c:
        return c.post("/dashboard/logout")


def _sets_cookie(response: httpx.Response) -> bool:
    return any(v.startswith(f"{COOKIE}=") for v in response.headers.get_list("set-cookie"))


@pytest.mark.parametrize(
    "headers",
    [{"Origin": EVIL}, {"Origin": "null"}, {"Referer": f"{EVIL}/login-csrf.html"}],
    ids=["origin", "null-origin", "referer"],
)
def test_a_cross_site_login_is_refused_and_sets_no_cookie(keyed: ApiServer, headers: dict[str, str]):
    r = _login(keyed, headers)
    assert r.status_code == 403, r.text
    assert "another origin" in r.text and r.headers["content-type"].startswith("text/html")
    assert not _sets_cookie(r)


@pytest.mark.parametrize("own", ["origin", "referer", "neither", "behind-tls-proxy"])
def test_a_login_from_the_dashboard_itself_or_a_client_without_an_origin_logs_in(keyed: ApiServer, own: str):
    headers = {
        "origin": {"Origin": keyed.base_url},
        "referer": {"Referer": f"{keyed.base_url}/dashboard/login"},
        "neither": {},
        # a proxy that ends TLS: the browser's origin is https, this server sees http
        "behind-tls-proxy": {"Origin": keyed.base_url.replace("http://", "https://")},
    }[own]
    r = _login(keyed, headers)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/"
    assert _sets_cookie(r)


@pytest.mark.parametrize(
    "headers",
    [{"Origin": EVIL}, {"Origin": "null"}, {"Referer": f"{EVIL}/"}],
    ids=["origin", "null-origin", "referer"],
)
def test_a_cross_site_logout_is_refused_and_keeps_the_cookie(keyed: ApiServer, headers: dict[str, str]):
    r = _logout(keyed, headers)
    assert r.status_code == 403, r.text
    assert not _sets_cookie(r)  # no deletion of the session cookie


def test_a_logout_from_the_dashboard_clears_the_cookie(keyed: ApiServer):
    for headers in ({"Origin": keyed.base_url}, {}):
        r = _logout(keyed, headers)
        assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
        assert _sets_cookie(r)  # the deletion: an expired, empty cookie
