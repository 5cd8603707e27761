"""Storage layer: peewee models and the database connection, Redis connection and key names.

The bottom layer: it imports nothing from ``ingest`` or ``executor``.
"""
