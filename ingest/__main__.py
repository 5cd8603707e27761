"""``python -m ingest``: the ``ingest`` command line."""

from ingest.cli import main

raise SystemExit(main())
