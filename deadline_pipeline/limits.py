"""Limits that make the parsers safe on hostile payloads, by construction rather than by timeout.

Each limit is stated in ``docs/source-formats.md``; a payload over a limit raises
:class:`ParseError` naming the source, the position and the
limit — never a ``RecursionError`` without a file, never minutes of CPU or gigabytes of memory:

* YAML (:func:`load_yaml`): YAML 1.2 scalars (no sexagesimal ``-12:00`` = -720, no implicit
  timestamps), nesting at most :data:`MAX_DEPTH` levels, and aliases allowed only while the document
  with every alias expanded stays under :data:`MAX_EXPANDED_NODES` nodes (a 416-byte "billion
  laughs" file expands to ~10^9 nodes and is refused at once);
* JSON (:func:`check_json_depth`): nesting at most :data:`MAX_DEPTH` levels, checked by a linear
  scan before ``json.loads`` recurses;
* CSV: at most :data:`MAX_CSV_ROWS` data rows.

:func:`repeated_keys` finds the keys a YAML mapping writes twice (which the loader would collapse
silently), for the configuration and the YAML sources alike.

A leaf module (it imports only PyYAML): the configuration reads its own file and the subscriber file
with these limits, and the ingest parsers theirs (:mod:`deadline_pipeline.ingest.parsers.limits`
re-exports this module for them), without the configuration importing the ingest stage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml


class ParseError(ValueError):
    """The whole payload is unusable. The message names the source and the line/position.

    Defined here, beside the limits that raise it, and re-exported by
    :mod:`deadline_pipeline.ingest.parsers.base`, where every parser takes it from."""

#: Deepest nesting of YAML/JSON collections (real deadline files use fewer than 6 levels).
MAX_DEPTH = 64
#: Largest YAML document, counted with every alias expanded (the largest real file has ~20,000 nodes).
MAX_EXPANDED_NODES = 1_000_000
#: Most data rows of one CSV payload or subscriber file.
MAX_CSV_ROWS = 200_000


class SafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 scalar rules and the nesting limit.

    * No implicit timestamps: ``2024-06-15 23:59`` stays the string as written (one code path).
    * No sexagesimal (base 60) numbers, a YAML 1.1 rule that YAML 1.2 dropped: unquoted
      ``timezone: -12:00`` was the integer -720, then read as UTC-07:20 — a deadline 4 h 40 min
      early, silently. Now it is the string ``"-12:00"``.
    """

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"nesting deeper than {MAX_DEPTH} levels (limit of this reader)", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_SEXAGESIMAL = re.compile(r"\d+(?::[0-5]?\d)+")  # the base-60 forms of YAML 1.1 ints and floats


def _core_resolvers(resolvers):
    out = {}
    for key, items in resolvers.items():
        kept = []
        for tag, rx in items:
            if tag == "tag:yaml.org,2002:timestamp":
                continue
            if tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
                rx = _without_base60(rx)
            kept.append((tag, rx))
        out[key] = kept
    return out


def _without_base60(rx: re.Pattern) -> re.Pattern:
    """The same resolver pattern, refusing any value that is a base-60 number."""
    return re.compile(rf"^(?!(?:[-+]?{_SEXAGESIMAL.pattern}(?:\.[0-9_]*)?)$)(?:{rx.pattern})", rx.flags)


SafeLoader.yaml_implicit_resolvers = _core_resolvers(yaml.SafeLoader.yaml_implicit_resolvers)


def _expanded_size(node, memo: dict[int, int], active: set[int]) -> int:
    key = id(node)
    if key in memo:
        return memo[key]
    if key in active:  # a recursive alias (&a [*a]) expands without end
        return MAX_EXPANDED_NODES + 1
    active.add(key)
    size = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            size += _expanded_size(child, memo, active)
            if size > MAX_EXPANDED_NODES:
                break
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            size += _expanded_size(k, memo, active) + _expanded_size(v, memo, active)
            if size > MAX_EXPANDED_NODES:
                break
    active.discard(key)
    memo[key] = size
    return size


def load_yaml(text: str, *, source: str, loader: type[SafeLoader] = SafeLoader):
    """Compose and construct one YAML document safely: ``(data, root node)``; ``(None, None)`` if empty.

    Raises :class:`ParseError` naming ``source`` with line and column for invalid YAML, nesting over
    :data:`MAX_DEPTH` and, at the root's position, a document over :data:`MAX_EXPANDED_NODES` nodes
    once its aliases are expanded. ``yaml.reader.ReaderError`` (a forbidden character) is left to the
    caller, which knows how to position it.
    """
    instance = loader(text)
    try:
        node = instance.get_single_node()
        if node is None:
            return None, None
        size = _expanded_size(node, {}, set())
        if size > MAX_EXPANDED_NODES:
            mark = node.start_mark
            raise ParseError(
                f"source {source!r}: line {mark.line + 1}, column {mark.column + 1}: YAML aliases expand this "
                f"document past {MAX_EXPANDED_NODES:,} nodes (an alias bomb?); refused")
        return instance.construct_document(node), node
    except yaml.reader.ReaderError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "position unknown"
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise ParseError(f"source {source!r}: {where}: invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ParseError(f"source {source!r}: position unknown: invalid YAML: {exc}") from None
    finally:
        instance.dispose()


@dataclass(frozen=True)
class RepeatedKey:
    """A key written twice in one YAML mapping.

    ``path``: the key path from the walked node to the repeated key (``("deadlines", 0, "date")``);
    ``line``/``column``: 1-based position of the second writing; ``first_line``: 1-based line of the
    first; ``index``: character offset of the second writing (document order).
    """

    path: tuple
    line: int
    column: int
    first_line: int
    index: int


def repeated_keys(node, path: tuple = (), seen: set[int] | None = None) -> list[RepeatedKey]:
    """Every key written twice in one mapping under the composed YAML ``node``, in document order.

    The loader keeps the last of two equal keys and drops the first without a word: a second
    ``subscriptions:`` block in the configuration, or a deadline item's ``date:`` written twice in a
    source, silently lost the first. A key brought in by a merge (``<<: *defaults``) and set again
    beside it is YAML's override, not a repetition: the loader has copied the merged pairs into the
    mapping, but their keys are written elsewhere (at the anchor), so only keys written within the
    mapping's own text are compared. ``seen``: aliased nodes already walked (each is walked once).
    """
    seen = set() if seen is None else seen
    if node is None or id(node) in seen:
        return []
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        return [r for i, item in enumerate(node.value) for r in repeated_keys(item, (*path, i), seen)]
    if not isinstance(node, yaml.MappingNode):
        return []
    out: list[RepeatedKey] = []
    first: dict[str, int] = {}
    start, end = node.start_mark.index, node.end_mark.index
    for key, value in node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else "?"
        if isinstance(key, yaml.ScalarNode) and start <= key.start_mark.index <= end:
            mark = key.start_mark
            if name in first:
                out.append(RepeatedKey((*path, name), mark.line + 1, mark.column + 1, first[name], mark.index))
            else:
                first[name] = mark.line + 1
        out += repeated_keys(key, (*path, name), seen) + repeated_keys(value, (*path, name), seen)
    return out


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def check_json_depth(text: str, *, source: str) -> None:
    """Raise :class:`ParseError` (line, column) when JSON ``text`` nests deeper than :data:`MAX_DEPTH`.

    One linear scan (strings skipped); ``json.loads`` would otherwise recurse and end in a
    ``RecursionError`` without a position.
    """
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        token = m.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                before = text[: m.start()]
                line = before.count("\n") + 1
                column = m.start() - (before.rfind("\n") + 1) + 1
                raise ParseError(f"source {source!r}: line {line}, column {column}: JSON nests deeper than "
                                 f"{MAX_DEPTH} levels (limit of this reader)")
        elif token in "]}":
            depth -= 1
