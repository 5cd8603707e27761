"""The HTTP interface: the producer, status, control and search over HTTP (``ingest serve``)."""
