"""Reading the configuration file's YAML: the bounded loader, and the problems it would pass silently."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from deadline_pipeline.config.errors import ConfigError
from deadline_pipeline.config.messages import format_loc
from deadline_pipeline.limits import ParseError, SafeLoader, load_yaml

_BOOLEAN_1_2 = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")


class ConfigLoader(SafeLoader):
    """The configuration's YAML loader: the sources' safe loader
    (:class:`deadline_pipeline.limits.SafeLoader`: YAML 1.2 numbers, no implicit timestamps, the
    nesting limit) with YAML 1.2's booleans as well: ``true`` and ``false`` (also ``True``/``TRUE``,
    ``False``/``FALSE``) are booleans, YAML 1.1's ``yes``, ``no``, ``on``, ``off`` are text."""


# YAML 1.1 read `allow_private: yes` as true and `starttls: off` as false, while a switch is
# documented as `true` or `false` only and the quoted 'yes' was refused: the unquoted spelling opened
# the outbound guard to private addresses without a word. As text, it is refused by the switch
# (config.quantities.Switch) with file, line, key and value. (A subscriber id or tenant `no` is the
# text "no" too, where YAML 1.1 made it the boolean false, refused as "expected text".)
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, _BOOLEAN_1_2 if tag == "tag:yaml.org,2002:bool" else rx) for tag, rx in items]
    for first, items in SafeLoader.yaml_implicit_resolvers.items()}


def parse_yaml(text: str, path: Path):
    """``(data, root node)`` of the configuration document, read by the sources' safe YAML reader
    (:func:`deadline_pipeline.limits.load_yaml`) with YAML 1.2 scalars throughout
    (:class:`ConfigLoader`): an unquoted ``timezone: -12:00`` is the offset as written, not the
    YAML 1.1 sexagesimal integer -720, and ``yes``/``no``/``on``/``off`` are text, not booleans;
    nesting at most ``MAX_DEPTH`` levels and no alias bomb. Raises :class:`ConfigError` naming the
    file, line and column — a 900-level nested list once ended in ``RecursionError`` without a file."""
    label = str(path)
    try:
        data, root = load_yaml(text, source=label, loader=ConfigLoader)
    except ParseError as exc:
        # The reader names a "source"; here the input is the configuration file.
        raise ConfigError(f"{path}: {str(exc).removeprefix(f'source {label!r}: ')}") from None
    except yaml.reader.ReaderError as exc:  # a forbidden character: the reader gives an offset only
        before = text[: exc.position]
        line, column = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "\0")
        raise ConfigError(f"{path}: line {line}, column {column}: invalid YAML: character U+{char:04X} "
                          "is not allowed in YAML") from None
    problems = _yaml_problems(root)
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems[:20])
                          + (f"\n… and {len(problems) - 20} more" if len(problems) > 20 else ""))
    return data, root


def line_of(root, loc: tuple) -> int | None:
    """The 1-based line in the file of the value at pydantic location ``loc`` (e.g.
    ``("subscriptions", 0, "offsets")``), given the composed YAML ``root`` node; for a key the file
    lacks (a required one), the line of the deepest mapping that holds it. ``None`` when ``loc``
    leaves the file (a subscriber appended from the CSV, which names its own lines) or ``root`` is
    ``None``. Parts the file does not write (the channel type pydantic puts in a location, a key a
    ``<<:`` merge brought in) are stepped over."""
    node, line = root, None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)), None)
            if found is None:
                continue
            node = found
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return None
            node = node.value[part]
        else:
            break
        line = node.start_mark.line + 1
    return line if line is not None or root is None else root.start_mark.line + 1


def _yaml_problems(root) -> list[str]:
    """``line L, column C: KEY.PATH: …`` for every problem under the YAML ``root`` that the loader
    would pass without a word, in document order. Empty when there is none. Two kinds:

    * a scalar (key or value) that is not storable text (:func:`_text_problems`);
    * a key written twice in one mapping
      (:func:`~deadline_pipeline.limits.repeated_keys`, shared with the YAML sources):
      the loader keeps the last and drops the first, so a second ``subscriptions:`` block, or
      ``offsets`` written twice in one subscription, made every reminder of the first disappear while
      the run and all its checks stayed green. A key set again beside a merge (``<<: *defaults``) is
      YAML's override and accepted.
    """
    from deadline_pipeline.limits import repeated_keys

    found = [(r.index, f"line {r.line}, column {r.column}: {format_loc(r.path)}: written twice in one mapping "
                       f"(first at line {r.first_line}); YAML would keep only this one and drop the first without "
                       "a word - merge them into one") for r in repeated_keys(root)]
    found += _text_problems(root, (), set())
    return [message for _index, message in sorted(found, key=lambda item: item[0])]


def _text_problems(node, loc: tuple, seen: set[int]) -> list[tuple[int, str]]:
    """``(offset, message)`` for every scalar (key or value) under the YAML ``node`` that is not
    storable text: a NUL character (YAML's escape ``"\\0"``) or an unpaired UTF-16 surrogate
    (``"\\ud800"``, not a character at all). The values reach the store, file paths, headers and
    URLs: PostgreSQL refuses NUL, no UTF-8 encoder takes a surrogate, and one such subscriber tenant,
    subscription name, channel name or rule pattern failed planning for every subscriber (a channel's
    sender or path failed every send). ``loc``: the key path of ``node``; ``seen``: aliased nodes
    already visited, so each is walked once."""
    if node is None or id(node) in seen:
        return []
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        return [(node.start_mark.index, p) for p in _not_text(node, loc)]
    if isinstance(node, yaml.SequenceNode):
        return [p for i, item in enumerate(node.value) for p in _text_problems(item, (*loc, i), seen)]
    if not isinstance(node, yaml.MappingNode):
        return []
    out = []
    for key, value in node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else "?"
        out += _text_problems(key, (*loc, name), seen) + _text_problems(value, (*loc, name), seen)
    return out


def _not_text(node: yaml.ScalarNode, loc: tuple) -> list[str]:
    """The problem of the scalar ``node`` at key path ``loc`` when it holds a NUL or an unpaired
    surrogate (see :func:`_text_problems`), as a one-item list; else an empty one."""
    value, why = node.value, None
    if "\0" in value:
        why = "a NUL character (U+0000)"
    else:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # the codec finds the surrogate and its position
            why = f"the unpaired UTF-16 surrogate U+{ord(value[exc.start]):04X}"
    if why is None:
        return []
    mark = node.start_mark
    # The key path may hold the bad text itself (a channel's name): shown escaped, as repr shows the value.
    where = (format_loc(loc) if loc else "(top level)").encode("utf-8", "backslashreplace").decode()
    return [f"line {mark.line + 1}, column {mark.column + 1}: {where.replace(chr(0), chr(92) + 'x00')}: "
            f"{why} is not text; remove it (got {value!r})"]
