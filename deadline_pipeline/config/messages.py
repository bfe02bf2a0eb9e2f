"""How a pydantic error is worded for the user: the key path as written in the file, the wording
of each kind of error (:data:`WORDING`, keyed by pydantic's error type) and the did-you-mean of a
misspelt key.

Pydantic's own messages name one bound ("Input should be greater than 0") and know no key; the
wording here names the whole range of the setting ("must be between 0 (exclusive) and 600"), read
from the field's own constraints, so the type is the one place a range is written.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from typing import Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from deadline_pipeline.config.sections import DeadlinesConfig
from deadline_pipeline.wording import near_name


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Annotated, Optional, list, dict, unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out.extend(_models_in(arg))
    return out


def keys_at(loc: tuple) -> set[str]:
    """The keys allowed in the mapping that holds the last part of ``loc`` (a pydantic error path),
    e.g. ``("subscriptions", 0, "ofsets")`` → the fields of a subscription. Empty when unknown."""
    return {name for m in _models_at(loc) for name in m.model_fields}


def _models_at(loc: tuple) -> list[type[BaseModel]]:
    """The models one of which holds the last part of ``loc`` (see :func:`keys_at`)."""
    models: list[type[BaseModel]] = [DeadlinesConfig]
    for part in loc[:-1]:
        if not isinstance(part, str):
            continue  # a list index: the item's models are already in ``models``
        nested = [m for model in models if part in model.model_fields
                  for m in _models_in(model.model_fields[part].annotation)]
        if nested:
            models = nested
            continue
        # A dict key (a channel's name) or a union tag (the channel's type): narrow by the tag.
        tagged = [m for m in models if "type" in m.model_fields
                  and part in typing_args(m.model_fields["type"].annotation)]
        if tagged:
            models = tagged
    return models


def typing_args(annotation) -> tuple:
    """``Literal["smtp"]`` → ``("smtp",)``; anything else → ``()``."""
    return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else ()


def did_you_mean(key: str, loc: tuple) -> str:
    """``" (did you mean `offsets`?)"`` for a misspelt key at ``loc``, else ``""`` (difflib ratio ≥ 0.6,
    the standard library's own "close match"). A misspelt optional key would otherwise leave a
    default in force that the author believes they changed."""
    # 0.6, difflib's own default: a configuration key is short and the keys at one place are few.
    close = near_name(str(key), keys_at(loc), cutoff=0.6)
    return f"; did you mean `{close}`?" if close else ""


# Pydantic puts the channel type it tried into an error's location (channels.hook.webhook.x);
# the file has no such key, so the path names channels.hook.x.
_CHANNEL_TYPES = frozenset({"maildir", "smtp", "webhook", "slack", "caldav", "apprise"})


def format_loc(loc: tuple) -> str:
    """The key path of pydantic location ``loc`` as the file writes it: ``("subscriptions", 0,
    "offsets")`` → ``subscriptions[0].offsets``; ``()`` → ``(top level)``. A channel's type, which
    pydantic puts after the channel's name, is left out."""
    if len(loc) >= 3 and loc[0] == "channels" and loc[2] in _CHANNEL_TYPES:
        loc = loc[:2] + loc[3:]
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def constraints_of(annotation, info: FieldInfo | None = None) -> dict[str, float]:
    """The numeric bounds a field declares, as ``{"gt"|"ge"|"lt"|"le": bound}``: those of its
    ``FieldInfo`` ``info`` and those inside its annotation (an ``Annotated`` type, also within
    ``X | None``). Empty for a field without bounds."""
    found: dict[str, float] = {}
    items = list(info.metadata) if info is not None else []
    for arg in typing.get_args(annotation):
        found |= constraints_of(arg)
    if typing.get_origin(annotation) is typing.Annotated:
        items += list(annotation.__metadata__)
    for item in items:
        if isinstance(item, FieldInfo):
            items += item.metadata
        elif isinstance(item, annotated_types.Gt | annotated_types.Ge | annotated_types.Lt | annotated_types.Le):
            kind = type(item).__name__.lower()
            found[kind] = getattr(item, kind)
    return found


def describe_range(bounds: dict[str, float]) -> str | None:
    """``{"gt": 0, "le": 600}`` → ``"must be between 0 (exclusive) and 600"``; a one-sided bound reads
    ``"must be at least 1"`` / ``"must be greater than 0"``; ``None`` without a lower bound."""
    if "gt" in bounds:
        low = f"{bounds['gt']:g} (exclusive)"
    elif "ge" in bounds:
        low = f"{bounds['ge']:g}"
    else:
        return None
    if "le" in bounds:
        return f"must be between {low} and {bounds['le']:g}"
    return f"must be greater than {bounds['gt']:g}" if "gt" in bounds else f"must be at least {bounds['ge']:g}"


def bounds_at(loc: tuple) -> dict[str, float]:
    """The numeric bounds of the field at pydantic location ``loc`` (:func:`constraints_of`);
    empty when no model along ``loc`` has that field."""
    name = loc[-1] if loc else None
    for model in _models_at(loc):
        info = model.model_fields.get(name) if isinstance(name, str) else None
        if info is not None:
            return constraints_of(info.annotation, info)
    return {}


def _range(err: dict) -> str:
    # Pydantic names the one bound it checked; the setting's whole range says what to write instead.
    return describe_range(bounds_at(tuple(err["loc"]))) or err["msg"]


def _unknown_key(err: dict) -> str:
    # A misspelt optional key would otherwise leave a default in force that the author believes changed.
    loc = tuple(err["loc"])
    return "unknown key" + did_you_mean(loc[-1], loc) if loc else err["msg"]


def _integer(err: dict) -> str:
    """A count setting (a strict integer) given something else. Strict mode words every refusal as
    "Input should be a valid integer", which read as nonsense for ``.inf`` and hid why ``"3"`` (a
    quoted number, text in YAML) was refused."""
    got = err.get("input")
    if isinstance(got, float) and not math.isfinite(got):
        return "must be a finite whole number"
    if isinstance(got, float) and not got.is_integer():
        return "must be a whole number, not a fraction"
    if isinstance(got, str):
        # Text: a quoted "3", or what this YAML reader keeps as text although it looks like a number
        # (1e3, 0587); "without quotes" alone misled the author of an unquoted 1e3.
        return "must be a whole number in plain digits, without quotes"
    return "must be a whole number"


#: YAML 1.1's other spellings of a boolean, which this file (YAML 1.2) reads as text.
_YAML_1_1_BOOLEANS = frozenset({"yes", "no", "on", "off", "y", "n"})


def _boolean(err: dict) -> str:
    """A switch (:data:`~deadline_pipeline.config.quantities.Switch`) given something else: a quoted
    ``'true'`` is told to drop the quotes, a ``yes``/``no``/``on``/``off`` (quoted or not) that it is
    text here. Only the text ``true``/``false`` can be meant as a quoted switch: an unquoted one is
    already a boolean, so "without quotes" would mislead the author of an unquoted ``yes``."""
    got = err.get("input")
    if isinstance(got, str) and got.strip().lower() in ("true", "false"):
        return "must be true or false, written without quotes"
    if isinstance(got, str) and got.strip().lower() in _YAML_1_1_BOOLEANS:
        return (f"must be true or false; {got.strip()!r} is text in this file (YAML 1.2), not a boolean: "
                f"write {'true' if got.strip().lower() in ('yes', 'on', 'y') else 'false'}")
    return "must be true or false"


def _unknown_tag(err: dict) -> str:
    """A channel whose ``type`` is not one of the channel types (pydantic names its discriminator)."""
    ctx = err.get("ctx") or {}
    key = ctx.get("discriminator", "type").strip("'")
    return f"unknown {key} {ctx.get('tag')!r}; one of: {ctx.get('expected_tags')}"


def _missing_tag(err: dict) -> str:
    """A channel without a ``type``: the settings cannot be read without knowing which channel."""
    ctx = err.get("ctx") or {}
    key = ctx.get("discriminator", "type").strip("'")
    return f"needs a {key} (one of: {', '.join(sorted(_CHANNEL_TYPES))})"


#: Pydantic error type → the message shown after the key path (``err`` is one item of
#: ``ValidationError.errors()``). Types not listed keep pydantic's message, without the
#: "Value error, " prefix of a validator's own ``ValueError``.
WORDING: dict[str, Callable[[dict], str]] = {
    "extra_forbidden": _unknown_key,
    "finite_number": lambda err: "must be a finite number",
    "int_type": _integer,
    "bool_type": _boolean,
    # Pydantic's own words name its internals ("a valid dictionary or object to extract fields
    # from", "instance of SubscriberConfig"); a reader of the file thinks in mappings and lists.
    "model_type": lambda err: "expected a mapping of settings",
    "model_attributes_type": lambda err: "expected a mapping of settings",
    "dict_type": lambda err: "expected a mapping",
    "list_type": lambda err: "expected a list",
    "string_type": lambda err: "expected text",
    "union_tag_invalid": _unknown_tag,
    "union_tag_not_found": _missing_tag,
    "greater_than": _range,
    "greater_than_equal": _range,
    "less_than": _range,
    "less_than_equal": _range,
}


def wording(err: dict) -> str:
    """The message for one pydantic error ``err`` (an item of ``ValidationError.errors()``), without
    its key path: :data:`WORDING`'s for its type, else pydantic's own."""
    translate = WORDING.get(err["type"])
    return translate(err) if translate else err["msg"].removeprefix("Value error, ")


_RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def shown_input(err: dict):
    """The rejected value of ``err`` as the message shows it: a value out of a float setting's range
    as the float it was read as (``-5.0`` for ``-5``, ``1e-300`` for PyYAML's text ``'1e-300'``),
    any other as written."""
    got = err.get("input")
    if err["type"] in _RANGE_ERRORS and not isinstance(got, bool):
        if any(isinstance(b, float) for b in bounds_at(tuple(err["loc"])).values()):
            try:
                return float(got)
            except (TypeError, ValueError):
                return got
    return got
