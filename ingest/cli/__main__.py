"""``python -m ingest.cli``: the ``ingest`` command line, as before it became a package."""

from ingest.cli import main

raise SystemExit(main())
