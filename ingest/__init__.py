"""The domain: the producer API (what application services call to enqueue) and the CLI,
document parsers, chunking, embedding, the knowledge-base store and search.

``import ingest`` stays light: no torch, no sentence-transformers, no parser library until used.
"""
