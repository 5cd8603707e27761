"""The ``ingest`` command line: one interface onto the domain in :mod:`ingest`.

:mod:`ingest.cli.command` holds the parser, the document verbs and :func:`main`; ``dataflow``,
``dead``, ``memory`` and ``strikes`` add their verbs; :mod:`ingest.cli.common` holds what they all
share (exit statuses, JSON out, error lines, the console); :mod:`ingest.cli.render` draws the
tables and :mod:`ingest.cli.wait` the ``--wait`` progress bars. Nothing outside this package
imports it except the entry points (``ingest = "ingest.cli:main"``, ``python -m ingest``).
"""

from ingest.cli.command import build_parser, explain, main

__all__ = ["build_parser", "explain", "main"]
