"""Issue 17, what held and must keep holding: TLS to Redis with a CA of one's own, a Redis ACL user
limited to the key prefix (a submit and a real executor task end to end), no credentials in logs,
heartbeats, ``ingest fleet`` or ``/metrics``, no pickle (or eval) of data from outside the process,
XXE never resolved, JSON nested 10,000 deep dead-lettered, floods of submits held to the limits."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import threading
import traceback
import uuid
import zipfile
from pathlib import Path

import pytest
import redis
import trio

from db.database import unit
from db.keys import Keys
from db.models import Task
from db.streams import Streams, connect
from ingest.cli import main
from ingest.dead import list_dead
from ingest.errors import TenantQueueFull
from ingest.parsers import parse_document
from ingest.producer import submit_documents
from scripts.make_samples import docx_bytes
from tests.executor.support import running_daemon
from tests.helpers import await_until, wait_until
from tests.procs import ExecutorProcess, free_port

ROOT = Path(__file__).resolve().parent.parent


def _redis_server(*args: str, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(timeout=10)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


# -- rediss:// with a CA --------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA of the test's own and a server certificate for 127.0.0.1 that it signs."""
    d = directory / name
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name} CA",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
             "-out", "server.csr", cwd=d)  # fmt: skip
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "san.cnf", "-out", "server.crt", cwd=d)  # fmt: skip
    return d / "ca.crt", d / "server.crt", d / "server.key"


@pytest.fixture
def tls_redis(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificates to test TLS with")
    ca, cert, key = _certificates(tmp_path, "good")
    other_ca, _, _ = _certificates(tmp_path, "other")
    port = free_port()
    proc = _redis_server("--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                         "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                         "--tls-auth-clients", "no", cwd=tmp_path)  # fmt: skip
    try:
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}"
        client = connect(url)
        try:
            wait_until(lambda: proc.poll() is not None or _answers(client), 10)
        finally:
            client.close()
        if proc.poll() is not None:
            output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            pytest.skip(f"this redis-server has no TLS (built without it): {output[-300:]}")
        yield url, f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={other_ca}"
    finally:
        _stop(proc)


def test_rediss_with_a_ca_carries_a_submit_and_refuses_a_server_the_ca_did_not_sign(settings, tls_redis):
    url, wrong_ca_url = tls_redis
    s = settings.replace(redis_url=url)
    client = connect(url)
    try:
        Streams(client, Keys(s.key_prefix)).ensure_group()
        result = submit_documents(s, [("a.txt", b"over TLS")], "kb1")
        assert result.published == 1
        assert client.xlen(Keys(s.key_prefix).backlog(0, "default")) == 1
    finally:
        client.close()
    bad = connect(wrong_ca_url)
    try:
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            bad.ping()
    finally:
        bad.close()


# -- a Redis ACL user limited to the prefix; no credentials anywhere ----------------------------


@pytest.fixture
def acl_redis(tmp_path, settings):
    """A private redis-server whose only user may touch the test's prefix, keys and channels."""
    password = f"pw-{uuid.uuid4().hex}"
    prefix = settings.key_prefix
    (tmp_path / "users.acl").write_text(
        f"user default off\nuser ingest on >{password} ~{prefix}:* &{prefix}:* +@all -@dangerous\n"
    )
    port = free_port()
    proc = _redis_server("--port", str(port), "--aclfile", str(tmp_path / "users.acl"), cwd=tmp_path)
    url = f"redis://ingest:{password}@127.0.0.1:{port}/0"
    client = connect(url)
    try:
        wait_until(lambda: _answers(client), 10)
        with pytest.raises(redis.ResponseError, match="no permissions"):
            client.set("outside:the:prefix", "x")  # the limit is real
        yield url, password, port
    finally:
        client.close()
        _stop(proc)


def test_an_acl_user_runs_a_submit_and_a_real_task_and_its_password_is_shown_nowhere(
    settings, acl_redis, tmp_path, capsys
):
    url, password, port = acl_redis
    metrics_port, health_port = free_port(), free_port()
    s = settings.replace(
        redis_url=url, metrics_port=metrics_port, healthcheck_port=health_port, log_format="json"
    )
    args = ["--db-url", s.db_url, "--redis-url", url, "--key-prefix", s.key_prefix]
    assert main(["init", "--skip-model-export", *args]) == 0
    (tmp_path / "bees.txt").write_text("The queen bee lays the eggs of the hive. " * 20)
    with ExecutorProcess(s, "host_1", tmp_path / "x.log") as proc:
        proc.wait_ready(60)
        code = main(["submit", str(tmp_path / "bees.txt"), "--kb", "kb1", "--wait", "--timeout", "60", *args])
        assert code == 0, f"{capsys.readouterr()}\n{proc.log()[-4000:]}"
        assert main(["fleet", "--json", "--tenants", *args]) == 0
        assert main(["status", "--json", *args]) == 0
        # an error line names the URL too: redacted
        assert (
            main(["status", "--redis-url", url.replace(str(port), "1"), "--db-url", s.db_url]) == 3
        )  # unreachable
        printed = capsys.readouterr()
        client = connect(url)
        try:
            beat = client.get(Keys(s.key_prefix).executor("host_1"))
        finally:
            client.close()
        with urllib_get(f"http://127.0.0.1:{metrics_port}/metrics") as metrics:
            scraped = metrics.read().decode()
        with urllib_get(f"http://127.0.0.1:{health_port}/") as health:
            body = health.read().decode()
        assert proc.stop() == 0
        log = proc.log()
    with unit():
        assert [t.status for t in Task.select()] == ["done"]
    assert "ingest_tasks_succeeded_total" in scraped and beat
    for where, text in {
        "executor log": log,
        "heartbeat": beat,
        "ingest fleet/status output": printed.out + printed.err,
        "/metrics": scraped,
        "health": body,
    }.items():
        assert password not in text, f"the password is in the {where}"
    assert "***@127.0.0.1:1" in printed.err


def urllib_get(url: str):
    import urllib.request

    return urllib.request.urlopen(url, timeout=5)  # noqa: S310 - a test's own http:// URL


# -- no pickle, eval or exec of data from outside the process ----------------------------------

FORBIDDEN = re.compile(
    r"(?<![\w.])(pickle\.loads?|cloudpickle\.loads?|dill\.loads?|marshal\.loads?|shelve\.open|jsonpickle"
    r"|yaml\.load\(|yaml\.unsafe_load|eval\(|exec\(|os\.system\(|os\.popen\()|shell\s*=\s*True"
)


def test_no_pickle_eval_exec_or_shell_in_the_packages():
    """trio-parallel pickles the parse worker's jobs within the process boundary (our own
    processes, over their own pipes): it is not called here by name, and nothing here loads a
    pickle, evaluates text or runs a shell, least of all on bytes read from Redis."""
    for planted in ("pickle.loads(raw)", "eval(text)", "run(cmd, shell=True)", "yaml.load(f)"):
        assert FORBIDDEN.search(planted), planted  # the pattern would see one
    assert not FORBIDDEN.search("model.eval()")
    found = []
    for package in ("db", "ingest", "executor"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if FORBIDDEN.search(code):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


# -- XXE ------------------------------------------------------------------------------------


def _entity(secret: Path) -> str:
    return f'<!DOCTYPE d [<!ENTITY xxe SYSTEM "file://{secret}">]>'


def test_an_external_entity_in_html_or_docx_is_never_read(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-XXE")
    html = f'<?xml version="1.0"?>{_entity(secret)}<html><body><p>before &xxe; after</p></body></html>'
    text = " ".join(s.text for s in parse_document(html.encode(), "html"))
    assert "TOP-SECRET-XXE" not in text and "before" in text

    plain = docx_bytes([("p", "before XXE after")])
    with zipfile.ZipFile(io.BytesIO(plain)) as src:
        members = {i.filename: src.read(i.filename) for i in src.infolist()}
    xml = members["word/document.xml"].decode()
    head, _, rest = xml.partition("?>")
    xml = f"{head}?>{_entity(secret)}{rest}".replace("before XXE after", "before &xxe; after")
    members["word/document.xml"] = xml.encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for name, data in members.items():
            dst.writestr(name, data)
    try:
        sections = parse_document(out.getvalue(), "docx")
    except Exception as exc:  # noqa: BLE001 - refusing the document is as good as ignoring the entity
        assert "TOP-SECRET-XXE" not in str(exc)
    else:
        assert "TOP-SECRET-XXE" not in " ".join(s.text for s in sections)


# -- JSON depth -------------------------------------------------------------------------------


async def test_a_message_nested_10000_deep_is_dead_lettered_and_the_executor_goes_on(
    settings, rclient, keys, db
):
    from tests.executor.support import all_in, enqueue, task_spec
    from tests.handlers import EXTRA_HANDLERS

    s = settings.replace(extra_handlers=EXTRA_HANDLERS, shutdown_grace_s=0.3)
    deep = '{"id": "deep", "x": ' + "[" * 10_000 + "]" * 10_000 + "}"
    async with running_daemon(s, "host_1"):
        rclient.xadd(keys.queue(0), {"message": deep})
        streams = Streams(rclient, keys)
        ids = enqueue(streams, [task_spec("noop")])
        await await_until(lambda: all_in(ids, "done"), 15)
        letters = await await_until(lambda: list_dead(s), 15)
    (letter,) = letters
    assert "not JSON" in letter.reason
    await trio.sleep(0)


# -- floods of submits --------------------------------------------------------------------------


def test_a_flood_of_parallel_submits_never_passes_the_tenants_queue_cap(settings):
    cap, threads, each = 40, 8, 10
    s = settings.replace(tenant_max_queued=cap)
    accepted, refused, errors = [], [], []

    def flood(n: int) -> None:
        for i in range(each):
            try:
                result = submit_documents(s, [(f"t{n}-{i}.txt", b"flood")], "kb1", tenant_id="acme")
                accepted.append(result)
            except TenantQueueFull:
                refused.append((n, i))
            except Exception:  # noqa: BLE001 - reported below
                errors.append(traceback.format_exc())

    workers = [threading.Thread(target=flood, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert errors == [], "\n".join(errors)
    with unit():
        rows = Task.select().where(Task.tenant_id == "acme").count()
    assert rows == len(accepted) <= cap
    assert len(accepted) + len(refused) == threads * each and refused
