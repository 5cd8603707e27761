"""The dataflow DSL: a JSON document checked into a :class:`Graph` before it is stored or run.

A DSL is ``{"components": [...], "description": "..."}``; each component is
``{"id": "split", "type": "Splitter", "params": {...}, "inputs": ["parse"]}``. The rules:

- every ``type`` is a registered component type and every parameter one it has, with a valid
  value (``ingest.dataflow.components.REGISTRY``);
- exactly one ``File`` (the input document), with no inputs; every other component has inputs,
  each the id of a component of the graph, of a kind it takes (a Splitter takes sections, an
  Indexer embedded chunks, …);
- no cycle;
- exactly one sink, an ``Indexer``: every component's output is consumed, except the Indexer's;
- no component holds more than ``MAX_COPIES`` copies of the document: a component with several
  inputs takes them concatenated, so its copies are the paths from the File to it (fan-in
  multiplies: 45 Splitters into one Extractor is 45 copies, two such layers 2,025).

:func:`parse_dsl` reports every problem it finds in one :class:`DslError`, each naming its
component.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingest.dataflow.components import KIND_NAMES, REGISTRY, ComponentType
from ingest.errors import PermanentError

TOP_KEYS = ("components", "description")
COMPONENT_KEYS = ("id", "type", "params", "inputs")
MAX_COMPONENTS = 100
MAX_COPIES = 8  # copies of the document's text one component may hold (paths from the File)
_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


class DslError(PermanentError):
    """A DSL that is not a valid dataflow; ``problems`` lists what is wrong, one line each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid dataflow: " + "; ".join(self.problems))


@dataclass(frozen=True)
class Component:
    id: str
    type: str
    params: dict[str, Any]  # every parameter of its type, defaults filled in
    inputs: tuple[str, ...]

    @property
    def kind(self) -> ComponentType:
        return REGISTRY[self.type]

    def label(self) -> str:
        return f"component {self.id!r} ({self.type})"


@dataclass(frozen=True)
class Graph:
    """A valid dataflow: its components in a topological order (inputs before consumers)."""

    components: dict[str, Component]
    order: tuple[str, ...]
    source: str  # the File component
    sink: str  # the Indexer
    consumers: dict[str, tuple[str, ...]]
    gives: dict[str, str]  # component id → the kind of value it gives


def parse_dsl(dsl: Any) -> Graph:
    """The graph of ``dsl``, or :class:`DslError` with every problem found."""
    problems: list[str] = []
    raw = _components(dsl, problems)
    named: dict[str, list[Any]] = {}  # id → inputs of every component, also those with problems
    components = _check_components(raw, named, problems)
    _check_inputs(components, named, problems)
    order = _order(components, problems)
    source, sink, consumers = _check_ends(components, named, problems)
    gives = _check_kinds(components, order, problems) if len(order) == len(components) else {}
    if len(order) == len(components):
        _check_copies(components, order, problems)
    if problems:
        raise DslError(problems)
    return Graph({cid: components[cid] for cid in order}, tuple(order), source, sink, consumers, gives)


def _components(dsl: Any, problems: list[str]) -> list[Any]:
    if not isinstance(dsl, Mapping):
        problems.append(f"a DSL is a JSON object with a components list, not {type(dsl).__name__}")
        return []
    problems.extend(
        f"unknown top-level key {key!r} (allowed: {', '.join(TOP_KEYS)})"
        for key in dsl
        if key not in TOP_KEYS
    )
    if "description" in dsl and not isinstance(dsl["description"], str):
        problems.append("description must be a string")
    components = dsl.get("components")
    if not isinstance(components, list) or not components:
        problems.append("components must be a non-empty list")
        return []
    if len(components) > MAX_COMPONENTS:
        problems.append(f"at most {MAX_COMPONENTS} components, not {len(components)}")
        return []
    return components


def _check_components(
    raw: list[Any], named: dict[str, list[Any]], problems: list[str]
) -> dict[str, Component]:
    components: dict[str, Component] = {}
    for n, item in enumerate(raw, 1):
        where = f"component #{n}"
        if not isinstance(item, Mapping):
            problems.append(f"{where} must be an object, not {type(item).__name__}")
            continue
        cid = item.get("id")
        if not isinstance(cid, str) or not _ID.fullmatch(cid):
            problems.append(f"{where}: id must be 1 to 64 letters, digits, _ . or -, not {cid!r}")
            continue
        where = f"component {cid!r}"
        if cid in named:
            problems.append(f"{where}: duplicate id")
            continue
        named[cid] = list(item.get("inputs") or []) if isinstance(item.get("inputs"), list) else []
        extra = [k for k in item if k not in COMPONENT_KEYS]
        problems.extend(f"{where}: unknown key {k!r} (allowed: {', '.join(COMPONENT_KEYS)})" for k in extra)
        type_name = item.get("type")
        kind = REGISTRY.get(type_name) if isinstance(type_name, str) else None
        if kind is None:
            problems.append(f"{where}: unknown component type {type_name!r} (known: {', '.join(REGISTRY)})")
            continue
        where = f"component {cid!r} ({kind.name})"
        params = _check_params(where, kind, item.get("params", {}), problems)
        inputs = item.get("inputs", [])
        if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
            problems.append(f"{where}: inputs must be a list of component ids")
            inputs = []
        if len(set(inputs)) != len(inputs):
            problems.append(f"{where}: the same input is named twice")
        components[cid] = Component(cid, kind.name, params, tuple(inputs))
    return components


def _check_params(where: str, kind: ComponentType, given: Any, problems: list[str]) -> dict[str, Any]:
    if not isinstance(given, Mapping):
        problems.append(f"{where}: params must be an object")
        return {name: p.default for name, p in kind.params.items()}
    known = ", ".join(kind.params) or "none"
    params: dict[str, Any] = {}
    for name, value in given.items():
        spec = kind.params.get(name)
        if spec is None:
            problems.append(f"{where}: unknown parameter {name!r} (parameters: {known})")
            continue
        problem = spec.check(value) if spec.check is not None else None
        if problem:
            problems.append(f"{where}: parameter {name!r} {problem}")
            continue
        params[name] = value
    for name, spec in kind.params.items():
        params.setdefault(name, spec.default)
    method = params.get("method")
    for name, spec in kind.params.items():
        if name in given and spec.methods and method not in spec.methods:
            problems.append(
                f"{where}: parameter {name!r} is for method {' or '.join(spec.methods)}, not {method!r}"
            )
    for name in kind.requires.get(str(method), ()):
        if params.get(name) is None and name not in given:
            problems.append(f"{where}: method {method!r} needs parameter {name!r}")
    return params


def _check_inputs(components: dict[str, Component], named: dict[str, list[Any]], problems: list[str]) -> None:
    for c in components.values():
        limit = c.kind.max_inputs
        if limit == 0 and c.inputs:
            problems.append(f"{c.label()} takes no inputs (it is the input document)")
        elif limit != 0 and not c.inputs:
            problems.append(f"{c.label()} has no inputs")
        elif limit is not None and len(c.inputs) > limit:
            problems.append(f"{c.label()} takes {limit} input, not {len(c.inputs)}")
        for name in c.inputs:
            if name not in named:
                problems.append(f"{c.label()}: its input {name!r} is produced by no component")


def _order(components: dict[str, Component], problems: list[str]) -> list[str]:
    """A topological order (Kahn, stable in DSL order); a cycle is reported with its path."""
    waiting = {cid: {i for i in c.inputs if i in components} for cid, c in components.items()}
    order: list[str] = []
    ready = [cid for cid, ins in waiting.items() if not ins]
    while ready:
        cid = ready.pop(0)
        order.append(cid)
        for other, ins in waiting.items():
            if cid in ins:
                ins.discard(cid)
                if not ins and other not in order and other not in ready:
                    ready.append(other)
    left = [cid for cid in components if cid not in order]
    if left:
        path = _cycle(components, left)
        problems.append(
            f"cycle: {' → '.join(repr(p) for p in path)} (component {path[0]!r} would take its own output)"
        )
    return order


def _cycle(components: dict[str, Component], left: list[str]) -> list[str]:
    """One cycle among ``left`` (components that never became ready), as a closed path."""
    cid, seen = left[0], []
    while cid not in seen:
        seen.append(cid)
        cid = next(i for i in components[cid].inputs if i in left)
    path = seen[seen.index(cid) :]
    path.reverse()  # upstream first: a → b means a feeds b
    return [*path, path[0]]


def _check_kinds(components: dict[str, Component], order: list[str], problems: list[str]) -> dict[str, str]:
    gives: dict[str, str] = {}
    for cid in order:
        c = components[cid]
        kinds = [gives[i] for i in c.inputs if i in gives]
        for name in c.inputs:
            if name in gives and gives[name] not in c.kind.takes:
                problems.append(
                    f"{c.label()} takes {' or '.join(KIND_NAMES[k] for k in c.kind.takes)}, but its input "
                    f"{name!r} ({components[name].type}) gives {KIND_NAMES[gives[name]]}"
                )
        if len(set(kinds)) > 1:
            problems.append(f"{c.label()}: its inputs give different kinds ({', '.join(sorted(set(kinds)))})")
        gives[cid] = c.kind.gives or (kinds[0] if kinds else c.kind.takes[0])
    return gives


def _check_copies(components: dict[str, Component], order: list[str], problems: list[str]) -> None:
    """Refuse a component whose inputs would hold more than MAX_COPIES copies of the document."""
    copies: dict[str, int] = {}
    for cid in order:
        c = components[cid]
        copies[cid] = 1 if not c.inputs else sum(copies.get(i, 0) for i in c.inputs)
        if copies[cid] > MAX_COPIES and all(copies.get(i, 0) <= MAX_COPIES for i in c.inputs):
            problems.append(
                f"{c.label()} would hold {copies[cid]} copies of the document (its inputs' paths from the "
                f"File; at most {MAX_COPIES}): take fewer inputs"
            )


def _check_ends(
    components: dict[str, Component], named: dict[str, list[Any]], problems: list[str]
) -> tuple[str, str, dict[str, tuple[str, ...]]]:
    consumers: dict[str, list[str]] = {cid: [] for cid in components}
    for c in components.values():
        for name in c.inputs:
            if name in consumers:
                consumers[name].append(c.id)
    files = [cid for cid, c in components.items() if c.type == "File"]
    sinks = [cid for cid, c in components.items() if c.type == "Indexer"]
    if not files:
        problems.append("no File component: a dataflow starts from the input document (add {'type': 'File'})")
    elif len(files) > 1:
        problems.append(
            f"more than one File component ({', '.join(map(repr, files))}): a task has one document"
        )
    if not sinks:
        problems.append("no sink: the graph has no Indexer (a dataflow ends by indexing its chunks)")
    elif len(sinks) > 1:
        problems.append(
            f"more than one Indexer ({', '.join(map(repr, sinks))}): give one Indexer all their inputs"
        )
    taken = {i for inputs in named.values() for i in inputs if isinstance(i, str)}
    for cid, c in components.items():
        if c.type != "Indexer" and cid not in taken:
            problems.append(
                f"{c.label()} is a dead end: no component takes its output (only the Indexer ends a graph)"
            )
    source = files[0] if files else ""
    sink = sinks[0] if sinks else ""
    return source, sink, {cid: tuple(v) for cid, v in consumers.items()}


def describe(graph: Graph) -> list[dict[str, Any]]:
    """One line per component for ``dataflow show``: id, type, inputs, parameters in effect."""
    return [
        {
            "id": c.id,
            "type": c.type,
            "inputs": list(c.inputs),
            "params": {
                name: value
                for name, value in c.params.items()
                if not c.kind.params[name].methods or c.params.get("method") in c.kind.params[name].methods
            },
            "gives": graph.gives[c.id],
        }
        for c in graph.components.values()
    ]
