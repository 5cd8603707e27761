"""The dashboard in a real headless Chromium against a real ``ingest serve``, Redis, MariaDB and
executor: live progress bars, replay, strike and restore from the page, the retrieval box,
tenant isolation, escaping under a strict CSP, reading with JavaScript off; and a screenshot of
each page."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from db.database import connection, init_database
from db.keys import Keys
from db.models import DEAD, DONE, HELD, Document, Task
from db.streams import Streams, connect
from ingest.ids import kb_id
from ingest.producer import submit_documents
from tests.executor.support import enqueue, task_spec
from tests.helpers import wait_until
from tests.web.conftest import ADMIN_KEY, TENANT_KEYS

pytestmark = pytest.mark.timeout(600)

WORDS = ["apple", "river", "mountain", "cloud", "stone", "window", "garden", "paper", "candle", "bridge"]
NEEDLE = "quokka marmalade lighthouse"


def long_text(paragraphs: int) -> bytes:
    lines = []
    for n in range(paragraphs):
        words = [WORDS[(n * 7 + i) % len(WORDS)] for i in range(120)]
        lines.append(f"Section {n}. " + " ".join(words) + ".")
    return "\n\n".join(lines).encode()


def row(task_id: str) -> dict[str, Any]:
    with connection():
        return Task.get_by_id(task_id).to_dict()


def tasks_of(doc_id: str) -> list[dict[str, Any]]:
    with connection():
        return list(Task.select().where(Task.doc_id == doc_id).dicts())


def submit(settings, name: str, data: bytes, kb: str, tenant: str) -> str:
    submit_documents(settings, [(name, data)], kb, tenant_id=tenant)
    init_database(settings.db_url)
    with connection():
        return str(Document.get(Document.name == name, Document.tenant_id == tenant).id)


def new_page(browser, server, key: str, **options: Any) -> Any:
    """A page of a fresh browser context logged in with ``key`` through the login form."""
    context = browser.new_context(**options)
    page = context.new_page()
    page.goto(server.base_url + "/dashboard/login")
    page.fill("input[name=key]", key)
    page.click("button:has-text('log in')")
    page.wait_for_url("**/dashboard/")
    return page


@pytest.fixture(scope="module")
def admin(browser, server, executor) -> Any:
    page = new_page(browser, server, ADMIN_KEY, viewport={"width": 1280, "height": 900})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.dialogs = dialogs
    yield page
    page.context.close()


def wait_live(page) -> None:
    page.wait_for_selector("#live.live", timeout=15_000)


def test_a_parse_tasks_bar_moves_while_it_runs_and_turns_done_without_reload(web_settings, server, admin):
    doc = submit(web_settings, "long.txt", long_text(400), "manuals", "alpha")
    (task,) = tasks_of(doc)
    admin.goto(f"{server.base_url}/dashboard/tasks?doc={doc}")
    wait_live(admin)
    admin.evaluate("window.notReloaded = true")
    bar = admin.locator(f"tr[data-row='{task['id']}'] progress")
    state = admin.locator(f"tr[data-row='{task['id']}'] td.state")
    seen: list[float] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        seen.append(float(bar.get_attribute("value") or 0))
        if state.inner_text().strip() == DONE:
            break
        admin.wait_for_timeout(100)
    assert state.inner_text().strip() == DONE, row(task["id"])
    assert float(bar.get_attribute("value") or 0) == 1.0
    between = sorted({v for v in seen if 0 < v < 1})
    assert len(between) >= 2, f"the bar did not move while running: {seen}"
    assert admin.evaluate("window.notReloaded") is True
    assert "indexed" in admin.locator(f"tr[data-row='{task['id']}'] td.msg").inner_text()


def test_the_retrieval_box_returns_the_document_that_holds_the_querys_words(web_settings, server, admin):
    doc = submit(
        web_settings, "needle.txt", f"The {NEEDLE} is kept on the shelf.".encode(), "manuals", "alpha"
    )
    wait_until(lambda: all(t["status"] == DONE for t in tasks_of(doc)) and tasks_of(doc), 120)
    admin.goto(f"{server.base_url}/dashboard/kbs/{kb_id('alpha', 'manuals')}")
    admin.fill("input[name=q]", NEEDLE)
    admin.fill("input[name=k]", "3")
    admin.click("button:has-text('search')")
    first = admin.locator("li.hit").first
    first.wait_for(timeout=60_000)
    assert first.locator(".doc").inner_text() == "needle.txt"
    assert NEEDLE in first.locator(".text").inner_text()
    # the default mode is hybrid: the score is a reciprocal-rank fusion (at most 2/61), not a cosine
    assert 0 < float(first.locator(".score").inner_text()) <= 2 / 61 + 1e-3
    assert admin.locator("li.hit").count() == 3


def test_a_dead_letter_replayed_from_the_page_runs(web_settings, server, admin):
    streams = Streams(connect(web_settings.redis_url), Keys(web_settings.key_prefix))
    (tid,) = enqueue(streams, [task_spec("noop", handback_count=5, tenant_id="alpha")])
    wait_until(lambda: row(tid)["status"] == DEAD, 60)
    admin.goto(f"{server.base_url}/dashboard/dead")
    line = admin.locator("#dead-rows tr", has_text=tid)
    assert "gave up after 5 deliveries" in line.inner_text()
    assert line.locator("td.n").inner_text() == "5"
    line.locator("button:has-text('replay')").click()
    admin.wait_for_url("**/dashboard/dead?**")
    assert "replayed" in admin.locator(".note").inner_text()
    wait_until(lambda: row(tid)["status"] == DONE, 60)
    assert "replayed" in admin.locator("#dead-rows tr", has_text=tid).inner_text()


def test_a_strike_set_from_the_page_holds_matching_tasks_and_restore_releases_them(
    web_settings, server, admin
):
    admin.goto(f"{server.base_url}/dashboard/strikes")
    admin.fill("input[name=task_type]", "noop")
    admin.select_option("select[name=field]", "tenant_id")
    admin.select_option("select[name=op]", "==")
    admin.fill("input[name=value]", "gamma")
    admin.click("button:has-text('strike')")
    admin.wait_for_url("**/dashboard/strikes?**")
    assert "added strike" in admin.locator(".note").inner_text()
    wait_live(admin)
    time.sleep(1.5)  # executors reload the rules within a second of the version moving
    streams = Streams(connect(web_settings.redis_url), Keys(web_settings.key_prefix))
    ids = enqueue(streams, [task_spec("noop", tenant_id="gamma") for _ in range(3)])
    wait_until(lambda: all(row(t)["status"] == HELD for t in ids), 60)
    rule = admin.locator("#strike-rows tr", has_text="tenant_id == gamma")
    admin.wait_for_function(
        "() => [...document.querySelectorAll('#strike-rows tr')].some("
        "r => r.textContent.includes('gamma') && r.querySelector('td.held').textContent.trim() === '3')",
        timeout=15_000,
    )  # the hold count arrived live
    rule.locator("button:has-text('restore')").click()
    admin.wait_for_url("**/dashboard/strikes?**")
    assert "3 task(s) released" in admin.locator(".note").inner_text()
    wait_until(lambda: all(row(t)["status"] == DONE for t in ids), 60)


def test_a_tenants_key_never_shows_another_tenants_rows(web_settings, server, browser, executor):
    submit(web_settings, "beta-secret.txt", b"beta's private words about herons", "beta-kb", "beta")
    submit(web_settings, "alpha-visible.txt", b"alpha's words about otters", "alpha-kb", "alpha")
    page = new_page(browser, server, TENANT_KEYS["alpha"])
    try:
        for path in (
            "fleet",
            "queues",
            "documents",
            "tasks",
            "kbs",
            "documents?tenant=beta",
            "tasks?tenant=beta",
        ):
            page.goto(f"{server.base_url}/dashboard/{path}")
            html = page.content()
            for secret in ("beta-secret.txt", "beta-kb", "herons", ">beta<", "beta)"):
                assert secret not in html, (path, secret)
        page.goto(f"{server.base_url}/dashboard/documents")
        assert "alpha-visible.txt" in page.content()
        for path in ("dead", "strikes"):
            assert page.goto(f"{server.base_url}/dashboard/{path}").status == 403
        assert page.goto(f"{server.base_url}/dashboard/kbs/{kb_id('beta', 'beta-kb')}").status == 404
        cookies = {c["name"]: c["value"] for c in page.context.cookies()}
        with httpx.Client(base_url=server.base_url, cookies=cookies) as client:
            replay = client.post("/dashboard/dead/replay", data={"entry": "0-1", "csrf": "x"})
            assert replay.status_code == 403
    finally:
        page.context.close()


def test_actions_need_the_csrf_token(server, web_settings):
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        refused = client.post("/dashboard/strikes", data={"task_type": "noop"})
        assert refused.status_code == 403 and "CSRF" in refused.text


def test_a_document_named_script_renders_as_text_and_no_script_runs(web_settings, server, admin):
    name = "<script>alert(1)</script>"
    submit(web_settings, name, b"a harmless body", "manuals", "alpha")
    submit(web_settings, '<img src=x onerror="alert(2)">.txt', b"another body", "manuals", "alpha")
    response = admin.goto(f"{server.base_url}/dashboard/documents")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    wait_live(admin)
    admin.wait_for_timeout(3000)  # live updates re-render the rows meanwhile
    cells = admin.locator("#doc-rows td:first-child a").all_inner_texts()
    assert name in cells and '<img src=x onerror="alert(2)">.txt' in cells
    assert admin.locator("#doc-rows script, #doc-rows img").count() == 0
    assert admin.dialogs == []


def test_pages_read_with_javascript_disabled(web_settings, server, browser):
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    try:
        page.goto(server.base_url + "/dashboard/login")
        page.fill("input[name=key]", ADMIN_KEY)
        page.click("button:has-text('log in')")
        page.wait_for_url("**/dashboard/")
        assert page.locator("#fleet-rows tr", has_text="web_1").count() == 1
        assert page.locator("#live").inner_text() == "static"
        page.goto(server.base_url + "/dashboard/documents")
        assert "long.txt" in page.locator("#doc-rows").inner_text()
        page.goto(server.base_url + "/dashboard/tasks?state=done")
        assert page.locator("#task-rows tr").count() >= 2
        page.goto(server.base_url + "/dashboard/queues")
        assert "0 (normal)" in page.locator("#queues-body").inner_text()
        page.goto(f"{server.base_url}/dashboard/kbs/{kb_id('alpha', 'manuals')}")
        page.fill("input[name=q]", NEEDLE)
        page.click("button:has-text('search')")
        assert page.locator("li.hit .doc").first.inner_text() == "needle.txt"
        page.goto(server.base_url + "/dashboard/strikes")  # actions are plain forms: no script needed
        page.fill("input[name=task_type]", "no_such_type")
        page.click("button:has-text('strike')")
        assert "added strike" in page.locator(".note").inner_text()
        page.locator("#strike-rows tr", has_text="no_such_type").locator("button:has-text('restore')").click()
        assert "restored strike" in page.locator(".note").inner_text()
        assert "no_such_type" not in page.locator("#strike-rows").inner_text()
    finally:
        context.close()


PAGES = ("fleet", "queues", "documents", "tasks", "dead", "strikes", "kbs")


def test_every_page_is_saved_as_a_screenshot(server, admin, browser, shots):
    for name in PAGES:
        admin.goto(f"{server.base_url}/dashboard/{name}")
        wait_live(admin)
        admin.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    admin.goto(f"{server.base_url}/dashboard/kbs/{kb_id('alpha', 'manuals')}?q={NEEDLE}&k=3")
    admin.screenshot(path=str(shots / "retrieval.png"), full_page=True)
    phone = new_page(browser, server, ADMIN_KEY, viewport={"width": 390, "height": 844}, color_scheme="dark")
    try:
        phone.goto(f"{server.base_url}/dashboard/documents")
        phone.screenshot(path=str(shots / "documents-phone-dark.png"), full_page=True)
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert width <= 400, f"the page is {width} px wide at a phone's 390"
    finally:
        phone.context.close()
    assert all((shots / f"{name}.png").stat().st_size > 0 for name in PAGES)
