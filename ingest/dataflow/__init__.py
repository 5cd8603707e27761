"""Dataflows: pipelines described as data.

A dataflow is a named DSL document (JSON) stored in the ``dataflow`` table: a graph of
components, each with an ``id``, a ``type``, ``params`` and ``inputs`` (the ids of the
components whose output it takes). :mod:`ingest.dataflow.dsl` validates a DSL into a graph,
:mod:`ingest.dataflow.components` holds the component types (plain functions in a registry),
:mod:`ingest.dataflow.runner` runs a graph on one document, :mod:`ingest.dataflow.catalog`
stores and finds dataflows, and :mod:`ingest.dataflow.debug` runs one through the fleet without
indexing anything.

Importing this package is light: no model, no parser library.
"""
