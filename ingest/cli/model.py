"""``ingest model export``: the ONNX export searches embed queries with (``ingest.model_export``).

Also what ``ingest init`` runs when the export is missing, and :func:`warnings_to_stderr`,
which makes the query encoder's one fallback line an ``ingest:`` line on stderr.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from db.config import Settings
from ingest.cli.common import EXIT_FAILED, EXIT_OK, GlobalOptions, err, json_out, out
from ingest.ids import INT8_SUFFIX


def cmd_export(settings: Settings, args: argparse.Namespace) -> int:
    from ingest.model_export import export_int8, export_model

    result = (export_int8 if args.int8 else export_model)(settings, force=args.force)
    if args.json:
        json_out(result.to_dict())
    else:
        out(describe(result))
    return EXIT_FAILED if result.state == "refused" else EXIT_OK


def describe(result: Any) -> str:
    if result.state == "present":
        return f"model export: present for {result.model} in {result.export_dir} (--force remakes it)"
    if result.state == "refused":
        if result.model.endswith(INT8_SUFFIX):
            return f"model export refused for {result.model}: {result.reason}; use INGEST_EMBEDDING_BACKEND=onnx or torch"
        return f"model export refused for {result.model}: {result.reason}; searches go through torch"
    return (
        f"model export: made for {result.model} in {result.export_dir} in {result.seconds:.1f} s, "
        f"minimum cosine {result.min_cosine:.6f} against sentence-transformers"
    )


def ensure_export(settings: Settings) -> dict[str, Any]:
    """For ``ingest init``: make the export when it is missing; never fails init (a search
    without it still answers, through torch), but says why on stderr."""
    from ingest.query_encoder import find_export

    lookup = find_export(settings)
    if lookup.state == "ready":
        return {"state": "present", "export_dir": str(lookup.export_dir)}
    from ingest.errors import IngestError
    from ingest.model_export import export_model

    try:
        result = export_model(settings)
    except (IngestError, OSError) as exc:
        err(f"model export failed: {exc}; searches go through torch")
        return {"state": "failed", "reason": str(exc)}
    if result.state == "refused":
        err(describe(result))
    return result.to_dict()


class _ErrLine(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        err(record.getMessage())


def warnings_to_stderr() -> None:
    """The query encoder's warnings (why a search goes through torch) as ``ingest:`` lines."""
    logger = logging.getLogger("ingest.query_encoder")
    if not any(isinstance(h, _ErrLine) for h in logger.handlers):
        logger.addHandler(_ErrLine(logging.WARNING))


def add_verbs(verbs: Any, global_options: GlobalOptions) -> None:
    """``ingest model export``."""
    text = "The embedding model's ONNX export, which searches use to embed queries without torch."
    parser = verbs.add_parser("model", help=text, description=text)
    global_options(parser, in_verb=True)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    text = (
        "Export the model's transformer to ONNX under INGEST_HOME/models/, keyed by a hash of its "
        "files, and keep it only if its vectors agree with sentence-transformers' (cosine >= 0.9999 "
        "on a fixed query set); exit 1 when refused."
    )
    sub = actions.add_parser("export", help=text, description=text)
    sub.set_defaults(func=cmd_export)
    sub.add_argument("--force", action="store_true", help="make it again even when one is present")
    sub.add_argument(
        "--int8",
        action="store_true",
        help="also its int8 quantization, for INGEST_EMBEDDING_BACKEND=onnx-int8 (refused below "
        "cosine 0.97 against torch; its vectors are a model of their own: {model}#onnx-int8)",
    )
    sub.add_argument("--json", action="store_true", help="print JSON on stdout")
    global_options(sub, in_verb=True)
