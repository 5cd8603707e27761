"""The domain: the producer API (what application services call to enqueue), document parsers,
chunking, embedding, the knowledge-base store and search; its interfaces sit in sub-packages
(:mod:`ingest.cli`, the command line) and the domain imports none of them.

``import ingest`` stays light: no torch, no sentence-transformers, no parser library until used.
"""
