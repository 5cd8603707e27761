"""``python -m ingest.api [--host H] [--port P] [--workers N]``: run the HTTP API server."""

from ingest.api.server import main

main()
